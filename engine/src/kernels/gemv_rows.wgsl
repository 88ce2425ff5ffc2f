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
// Several activation rows: a workgroup takes RG = 4 of them (a row group) and multiplies
// each word it loads into every row of its group, so a verify pass of 8 positions reads the
// table twice, not 8 times. Each row's sums are the lone row's in the same order (its own
// accumulator, its parts summed in lane order), so the bits do not depend on m. The
// workgroups of one block of outputs for the row groups are neighbours in the grid (group =
// index % groups): they run side by side and the block's weights come from memory once and
// from L2 for the other groups. With one row a workgroup (RG = 1; kernels/mod.rs rewrites it
// for `VERBATIM_ROWS_GROUP=1`) the 8 rows' logits read the table from L2 8 times: 81 us of
// a verify pass on the H200 against 22 for one row. With the row as grid layer z (each row a
// whole sweep of the 40 MB table, one after the other) they cost 8 single rows, 234 us.

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
const RG: u32 = 4u; // activation rows per workgroup (kernels/mod.rs GEMV_ROWS_ROW_GROUP; <= MAXM)
const PS: u32 = 33u; // floats per output's 32 parts (+1: the summing threads hit distinct banks)

var<workgroup> parts: array<f32, RG * 1056u>; // [RG rows][GROUPS (<= 8) x RPG outputs][PS]

// Word wi of the group's 4 rows (rows past N read row N - 1; words past K/2 read 0).
fn fetch(n0: u32, wi: u32, kw: u32) -> vec4<u32> {
    if (wi >= kw) {
        return vec4<u32>(0u);
    }
    let last = p.n - 1u;
    return vec4<u32>(
        w[min(n0, last) * kw + wi],
        w[min(n0 + 1u, last) * kw + wi],
        w[min(n0 + 2u, last) * kw + wi],
        w[min(n0 + 3u, last) * kw + wi],
    );
}

// acc[r] += x'[2 wi] w_r.lo + x'[2 wi + 1] w_r.hi for the 4 outputs' words `ws`, x' the
// activation row at `xb` (LayerNorm statistics in slot `slot`).
fn accum(acc: vec4<f32>, ws: vec4<u32>, wi: u32, kw: u32, xb: u32, slot: u32) -> vec4<f32> {
    if (wi >= kw) {
        return acc;
    }
    let x0 = ln_apply(x[xb + 2u * wi], slot, 2u * wi);
    let x1 = ln_apply(x[xb + 2u * wi + 1u], slot, 2u * wi + 1u);
    let a = unpack2x16float(ws.x);
    let b = unpack2x16float(ws.y);
    let c = unpack2x16float(ws.z);
    let d = unpack2x16float(ws.w);
    return vec4<f32>(
        fma(x1, a.y, fma(x0, a.x, acc.x)),
        fma(x1, b.y, fma(x0, b.x, acc.y)),
        fma(x1, c.y, fma(x0, c.x, acc.z)),
        fma(x1, d.y, fma(x0, d.x, acc.w)),
    );
}

// One round of eight words (w0 + l + 32 i) into one row's accumulator.
fn round8(acc0: vec4<f32>, f: array<vec4<u32>, 8>, w0: u32, l: u32, kw: u32, xb: u32, slot: u32) -> vec4<f32> {
    var acc = acc0;
    acc = accum(acc, f[0], w0 + l, kw, xb, slot);
    acc = accum(acc, f[1], w0 + l + 32u, kw, xb, slot);
    acc = accum(acc, f[2], w0 + l + 64u, kw, xb, slot);
    acc = accum(acc, f[3], w0 + l + 96u, kw, xb, slot);
    acc = accum(acc, f[4], w0 + l + 128u, kw, xb, slot);
    acc = accum(acc, f[5], w0 + l + 160u, kw, xb, slot);
    acc = accum(acc, f[6], w0 + l + 192u, kw, xb, slot);
    acc = accum(acc, f[7], w0 + l + 224u, kw, xb, slot);
    return acc;
}

fn fetch8(n0: u32, w0: u32, l: u32, kw: u32) -> array<vec4<u32>, 8> {
    return array<vec4<u32>, 8>(
        fetch(n0, w0 + l, kw),
        fetch(n0, w0 + l + 32u, kw),
        fetch(n0, w0 + l + 64u, kw),
        fetch(n0, w0 + l + 96u, kw),
        fetch(n0, w0 + l + 128u, kw),
        fetch(n0, w0 + l + 160u, kw),
        fetch(n0, w0 + l + 192u, kw),
        fetch(n0, w0 + l + 224u, kw),
    );
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = lid / 32u;
    let l = lid % 32u;
    let idx = wg.x + wg.y * 32768u;
    let groups = (p.m + RG - 1u) / RG;
    let r0 = (idx % groups) * RG; // the group's first row
    let nr = min(RG, p.m - r0); // its rows (uniform over the workgroup)
    let block = (idx / groups) * GROUPS * RPG; // first output of the workgroup
    let n0 = block + g * RPG;
    let kw = p.k / 2u;
    let xb = p.x_off + r0 * p.x_stride;
    // The first round (words l + 32 i, i < 8: all of K up to 512) before the statistics.
    var f = fetch8(n0, 0u, l, kw);
    if (ln_on()) {
        for (var r = 0u; r < nr; r++) {
            ln_stats(xb + r * p.x_stride, r, lid);
        }
        workgroupBarrier();
    }
    // One accumulator a row (named: constant indices keep them in registers).
    var a0 = round8(vec4<f32>(0.0), f, 0u, l, kw, xb, 0u);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    if (nr > 1u) {
        a1 = round8(a1, f, 0u, l, kw, xb + p.x_stride, 1u);
    }
    if (nr > 2u) {
        a2 = round8(a2, f, 0u, l, kw, xb + 2u * p.x_stride, 2u);
    }
    if (nr > 3u) {
        a3 = round8(a3, f, 0u, l, kw, xb + 3u * p.x_stride, 3u);
    }
    // Longer rows (K > 512), eight words per round.
    for (var w0 = 256u; w0 < kw; w0 += 256u) {
        f = fetch8(n0, w0, l, kw);
        a0 = round8(a0, f, w0, l, kw, xb, 0u);
        if (nr > 1u) {
            a1 = round8(a1, f, w0, l, kw, xb + p.x_stride, 1u);
        }
        if (nr > 2u) {
            a2 = round8(a2, f, w0, l, kw, xb + 2u * p.x_stride, 2u);
        }
        if (nr > 3u) {
            a3 = round8(a3, f, w0, l, kw, xb + 3u * p.x_stride, 3u);
        }
    }
    let pb = g * RPG * PS + l;
    put_parts(pb, a0);
    if (nr > 1u) {
        put_parts(1056u + pb, a1);
    }
    if (nr > 2u) {
        put_parts(2u * 1056u + pb, a2);
    }
    if (nr > 3u) {
        put_parts(3u * 1056u + pb, a3);
    }
    workgroupBarrier();
    // Thread t sums output t % 32 of row t / 32 (of the group).
    let r = lid / (GROUPS * RPG);
    let n = block + lid % (GROUPS * RPG);
    if (r < nr && n < p.n) {
        let pr = r * 1056u + (lid % (GROUPS * RPG)) * PS;
        var s = 0.0;
        for (var i = 0u; i < 32u; i++) {
            s += parts[pr + i];
        }
        let o = p.y_off + (r0 + r) * p.y_stride + n;
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
}

fn put_parts(pb: u32, acc: vec4<f32>) {
    parts[pb] = acc.x;
    parts[pb + PS] = acc.y;
    parts[pb + 2u * PS] = acc.z;
    parts[pb + 3u * PS] = acc.w;
}
