// GEMV over a row-major matrix: Y[m][n] (=|+=) act(sum_k X'[m][k] * W[n][k] + b[n]), W kept
// as the checkpoint stores it, [N][K] with f16 pairs packed along K (K even). The decoder's
// logits over the tied embedding table (51864 x d), which the embedding lookup reads by
// row too (embed.wgsl). X' is X or, with flag 16, LayerNorm(X) (gemv_common.wgsl). The
// decoder no longer uses flag 16 here: each of the table's 1621 workgroups a row recomputed
// the row's statistics (two barrier trees), and the final LayerNorm as a dispatch of its own
// took a verify pass's 8 rows from 162 to 93 + 8 us on the H200 (a decode step's one row
// from 31 to 24 + 8).
//
// Why not the k-major GEMV (gemv.wgsl): there a workgroup reads a strip of 64 columns,
// 128-256 bytes from each of the K rows, 100 KB apart; with K = 384 the kernel lab's pure
// read of that pattern reached a third of the copy ceiling on the H200 (51864 x 384:
// 30 us, the GEMV 35 us in the lab and ~40-90 us inside a decode step). Here 32 threads
// read one weight row at a time, 32 neighbouring words per load, and the matrix is read
// front to back.
//
// A workgroup is GROUPS = 8 groups of 32 threads (the kernel lab rewrites GROUPS: 4 was as
// fast on the H200, 2 slower); group g takes RPG = 4 consecutive outputs. Thread
// l of a group holds x' for words l, l + 32, ... (the LayerNorm applied once per element)
// and accumulates its part of each of the 4 rows; the first round's weight words are
// issued before the LayerNorm statistics so their latency overlaps them (its x, gamma and
// beta too cost more than they saved: 48 more registers a thread, and the kernel lab's
// 51864 x 384 went 14.6 -> 27.4 us even without the LayerNorm). The 32 parts of an
// output are then summed in lane order by one thread through workgroup memory: the sum does
// not depend on the number of activation rows, so a verify pass over k positions reproduces
// k single decode steps bit for bit.
//
// Several activation rows: the workgroups of one block of outputs for rows 0..m are
// neighbours in the grid (row = index % m), so they run side by side and the block's weights
// come from memory once and from L2 for the other rows. With the row as grid layer z (each
// row a whole sweep of the 40 MB table, one after the other) the logits of a verify pass of
// 8 positions cost 8 single rows, 234 us of its ~660 in the H200's per-kernel profile.
// (A verify pass's logits now take `main_rows`, below; `main` serves decode steps, prompts
// and the LayerNorm variant.)

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> gamma: array<f32>;
@group(0) @binding(5) var<storage, read> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const GROUPS: u32 = 8u; // groups of 32 threads per workgroup (GEMV_ROWS_OUTPUTS = GROUPS x RPG)
const WG: u32 = 32u * GROUPS;
const MAXM: u32 = 8u;
const RPG: u32 = 4u; // outputs per group of 32 threads
const PS: u32 = 33u; // floats per output's 32 parts (+1: the summing threads hit distinct banks)

var<workgroup> parts: array<f32, 1056>; // [GROUPS (<= 8) x RPG outputs][PS]

// Word wi of the group's 4 rows (rows past N read row N - 1; words past K/2 read 0).
// With BRANCHLESS_LOADS the loads past the row's end are made anyway (the word index clamped
// into the row) and their words or sums dropped after; the same sums. Behind their bounds
// branches NVIDIA's compiler did not issue them with the loads before them: the logits of
// a decode step took 24.4 us (tiny.en) and 36.7 (small.en) that way in the per-kernel table
// on the H200, 18.2 and 28.7 branchless (bench/RESULTS.md 2026-12-04, fourth session). Not a
// rule: the decode attention's key and value loads and ffn_decode's fc1 words made the same
// way were slower (14.3 against 11.4 us, 11.1 against 10.4): there the branches skip most
// loads (a short self-attention's absent keys), here they skip at most a round's tail.
// (`kernels::gemv_rows_source` puts the branches back, and fixes the LayerNorm switch.)
const BRANCHLESS_LOADS: bool = true;

fn fetch(n0: u32, wi: u32, kw: u32) -> vec4<u32> {
    let last = p.n - 1u;
    if (BRANCHLESS_LOADS) {
        let wc = min(wi, kw - 1u);
        let v = vec4<u32>(
            w[min(n0, last) * kw + wc],
            w[min(n0 + 1u, last) * kw + wc],
            w[min(n0 + 2u, last) * kw + wc],
            w[min(n0 + 3u, last) * kw + wc],
        );
        return select(vec4<u32>(0u), v, wi < kw);
    }
    if (wi >= kw) {
        return vec4<u32>(0u);
    }
    return vec4<u32>(
        w[min(n0, last) * kw + wi],
        w[min(n0 + 1u, last) * kw + wi],
        w[min(n0 + 2u, last) * kw + wi],
        w[min(n0 + 3u, last) * kw + wi],
    );
}

// acc[r] += x'[2 wi] w_r.lo + x'[2 wi + 1] w_r.hi for the 4 rows' words `ws`.
fn accum(acc: vec4<f32>, ws: vec4<u32>, wi: u32, kw: u32, xb: u32) -> vec4<f32> {
    if (!BRANCHLESS_LOADS && wi >= kw) {
        return acc;
    }
    let wc = min(wi, kw - 1u);
    let x0 = ln_apply(x[xb + 2u * wc], 0u, 2u * wc);
    let x1 = ln_apply(x[xb + 2u * wc + 1u], 0u, 2u * wc + 1u);
    let a = unpack2x16float(ws.x);
    let b = unpack2x16float(ws.y);
    let c = unpack2x16float(ws.z);
    let d = unpack2x16float(ws.w);
    let r = vec4<f32>(
        fma(x1, a.y, fma(x0, a.x, acc.x)),
        fma(x1, b.y, fma(x0, b.x, acc.y)),
        fma(x1, c.y, fma(x0, c.x, acc.z)),
        fma(x1, d.y, fma(x0, d.x, acc.w)),
    );
    return select(acc, r, wi < kw);
}

// The first round's words of the group's 4 rows: words l + 32 i, i < 8 (all of K up to 512),
// in named fields (an indexed private array could land in local memory).
struct FirstRound {
    f0: vec4<u32>, f1: vec4<u32>, f2: vec4<u32>, f3: vec4<u32>,
    f4: vec4<u32>, f5: vec4<u32>, f6: vec4<u32>, f7: vec4<u32>,
}

fn first_round(n0: u32, l: u32, kw: u32) -> FirstRound {
    return FirstRound(
        fetch(n0, l, kw), fetch(n0, l + 32u, kw), fetch(n0, l + 64u, kw), fetch(n0, l + 96u, kw),
        fetch(n0, l + 128u, kw), fetch(n0, l + 160u, kw), fetch(n0, l + 192u, kw), fetch(n0, l + 224u, kw),
    );
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = lid / 32u;
    let l = lid % 32u;
    let idx = wg.x + wg.y * 32768u;
    let row = idx % p.m;
    let block = (idx / p.m) * GROUPS * RPG; // first output of the workgroup
    let n0 = block + g * RPG;
    let kw = p.k / 2u;
    let xb = p.x_off + row * p.x_stride;
    // The first round (words l + 32 i, i < 8: all of K up to 512) before the statistics.
    let f = first_round(n0, l, kw);
    if (ln_on()) {
        ln_stats(xb, 0u, lid);
        workgroupBarrier();
    }
    let acc = row_acc(f, n0, l, kw, xb);
    let pb = g * RPG * PS + l;
    parts[pb] = acc.x;
    parts[pb + PS] = acc.y;
    parts[pb + 2u * PS] = acc.z;
    parts[pb + 3u * PS] = acc.w;
    workgroupBarrier();
    let n = block + lid;
    if (lid < GROUPS * RPG && n < p.n) {
        var s = 0.0;
        for (var i = 0u; i < 32u; i++) {
            s += parts[lid * PS + i];
        }
        write_output(s, row, n);
    }
}

// Output n of activation row `row` from its sum s: + bias, GELU, + the old y (flags 1, 2, 4).
fn write_output(s: f32, row: u32, n: u32) {
    let o = p.y_off + row * p.y_stride + n;
    var b = 0.0;
    if ((p.flags & 1u) != 0u) {
        b = bias[n];
    }
    var yo = 0.0;
    if ((p.flags & 4u) != 0u) {
        yo = y[o];
    }
    finish_pre(s, o, b, yo);
}

// ---------------------------------------------------------------------------------------
// `main_rows`: the same outputs for up to RPW activation rows in one workgroup, each weight
// word loaded once. A verify pass of 16 positions swept the 40 MB table 16 times as grid
// layers (`main`), from L2 where the layers ran side by side and from memory where they did
// not: 107 us against 22 for one row in the per-kernel table (H100), a quarter of what the
// pass's 15 extra rows cost. Here the first round's words (all of K up to 512) stay in
// registers while each row takes its x through `row_acc`, as `main` does; rows leave RB at
// a time through `parts_rows`, one summing thread per (row, output) adding the 32 lanes'
// parts in lane order, as `main`'s summing threads do. Every verify pass
// takes this entry (one row too); a decode step stays on `main`, which is faster for one row
// (21.7 against 24.3 us on the H100). A verify row then equals a decode step because both
// compute the same explicit fmas and the same ordered sums, with nothing left for the
// compiler to contract (no multiply outside the fmas); `linear_rows_matches_reference_and_
// rows_equal_lone_rows` holds it here and `verbatim bench` on each device before it times.
// H100, 16 rows: 74 against 106 us in the per-kernel table. Longer rows
// (K > 512) fetch their later rounds again for each row (from L1: the workgroup's 32 rows
// of weights were just read). More than RPW rows go to further grid layers of RPW rows
// (chunk fastest in the grid, so one block's chunks run side by side, as `main`'s rows).
// No LayerNorm here (flag 16: `main`).

const RPW: u32 = 16u; // activation rows per workgroup
const RB: u32 = 4u; // rows per round through workgroup memory (RB x GROUPS x RPG summing threads)

var<workgroup> parts_rows: array<f32, 4224>; // [RB][GROUPS x RPG outputs][PS]

// One row's accumulation over the first round's words (all of K up to 512) and any
// later rounds, eight words a round (K > 512), for `main` and `main_rows` alike:
// straight-line, so that a row's x loads issue together. Two main_rows variants measured
// slower on the H100 (16 rows): the rounds wholly past K (6 and 7 at K = 384) skipped behind
// workgroup-uniform tests, 95 against 74 us (a load behind a branch waits for the loads
// before it); the first round's words unpacked to f32 once for all rows instead of at each
// row, 93 (64 more registers a thread).
fn row_acc(f: FirstRound, n0: u32, l: u32, kw: u32, xb: u32) -> vec4<f32> {
    var acc = vec4<f32>(0.0);
    acc = accum(acc, f.f0, l, kw, xb);
    acc = accum(acc, f.f1, l + 32u, kw, xb);
    acc = accum(acc, f.f2, l + 64u, kw, xb);
    acc = accum(acc, f.f3, l + 96u, kw, xb);
    acc = accum(acc, f.f4, l + 128u, kw, xb);
    acc = accum(acc, f.f5, l + 160u, kw, xb);
    acc = accum(acc, f.f6, l + 192u, kw, xb);
    acc = accum(acc, f.f7, l + 224u, kw, xb);
    for (var w0 = 256u; w0 < kw; w0 += 256u) {
        let h0 = fetch(n0, w0 + l, kw);
        let h1 = fetch(n0, w0 + l + 32u, kw);
        let h2 = fetch(n0, w0 + l + 64u, kw);
        let h3 = fetch(n0, w0 + l + 96u, kw);
        let h4 = fetch(n0, w0 + l + 128u, kw);
        let h5 = fetch(n0, w0 + l + 160u, kw);
        let h6 = fetch(n0, w0 + l + 192u, kw);
        let h7 = fetch(n0, w0 + l + 224u, kw);
        acc = accum(acc, h0, w0 + l, kw, xb);
        acc = accum(acc, h1, w0 + l + 32u, kw, xb);
        acc = accum(acc, h2, w0 + l + 64u, kw, xb);
        acc = accum(acc, h3, w0 + l + 96u, kw, xb);
        acc = accum(acc, h4, w0 + l + 128u, kw, xb);
        acc = accum(acc, h5, w0 + l + 160u, kw, xb);
        acc = accum(acc, h6, w0 + l + 192u, kw, xb);
        acc = accum(acc, h7, w0 + l + 224u, kw, xb);
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = lid / 32u;
    let l = lid % 32u;
    let idx = wg.x + wg.y * 32768u;
    let chunks = (p.m + RPW - 1u) / RPW;
    let row_begin = (idx % chunks) * RPW;
    let row_end = min(p.m, row_begin + RPW);
    let block = (idx / chunks) * GROUPS * RPG;
    let n0 = block + g * RPG;
    let kw = p.k / 2u;
    let f = first_round(n0, l, kw);
    // Thread lid sums output o of row r0 + rr of each round.
    let rr = lid / 32u;
    let o = lid % 32u;
    for (var r0 = row_begin; r0 < row_end; r0 += RB) {
        for (var j = 0u; j < RB; j++) {
            let row = r0 + j;
            if (row < row_end) {
                let acc = row_acc(f, n0, l, kw, p.x_off + row * p.x_stride);
                let pb = (j * GROUPS * RPG + g * RPG) * PS + l;
                parts_rows[pb] = acc.x;
                parts_rows[pb + PS] = acc.y;
                parts_rows[pb + 2u * PS] = acc.z;
                parts_rows[pb + 3u * PS] = acc.w;
            }
        }
        workgroupBarrier();
        let row = r0 + rr;
        let n = block + o;
        if (rr < RB && row < row_end && n < p.n) {
            var s = 0.0;
            let sb = (rr * GROUPS * RPG + o) * PS;
            for (var i = 0u; i < 32u; i++) {
                s += parts_rows[sb + i];
            }
            write_output(s, row, n);
        }
        workgroupBarrier();
    }
}
