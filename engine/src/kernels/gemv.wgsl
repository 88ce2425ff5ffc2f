// GEMV for a few rows of activations (decode steps, the last prefill position):
// Y[m][n] (=|+=) act(sum_k X'[m][k] * W[n][k] + b[n]) for m < M <= 8, where X' is X or,
// with flag 16, LayerNorm(X) with gamma, beta and eps (the norm folded into the product:
// a decode step then needs no LayerNorm dispatch and no round trip of the normed row).
//
// Memory-bound: every weight word is read exactly once per dispatch and used for all M
// rows. W is k-major ([K][N], f16 pairs packed along N, as gemm.wgsl). A workgroup is
// 8 column pairs x 32 slices of K (CP must match GEMV_COLUMN_PAIRS in mod.rs): the threads
// of a slice read neighbouring words of one weight row (32-byte sectors on a GPU), X is the
// same address across them (a broadcast), and a tree in workgroup memory merges the slices.
// Splitting K matters on a big GPU: with one thread walking all of K per column pair, a
// 384x1152 matrix gave 576 threads each with 384 loads in a row, 285 us per dispatch on
// the H200; 8 slices gave 19.6 us, and the kernel lab favoured 32 slices on large matrices.
// `main_m1` is the decode step's kernel (M = 1; with more rows, workgroup z is the row and
// the weights are read once per row, from L2 after the first): its accumulators are named registers and
// eight weight words are in flight per thread (a private array indexed by a runtime row
// count lives in slow local memory on NVIDIA's compiler). Matrices of 8 MiB and more take
// gemv_stream.wgsl instead (this kernel reshaped to 32 column pairs x 8 slices read the
// lab's 128 MiB matrix at 53-61 % of copy, the streaming one at 90 %).
// Each row of `main_m1` is computed exactly as a lone row would be, bit for bit: a
// speculative verify pass over k+1 positions must reproduce k+1 single decode steps, or a
// near tie could choose another token than plain greedy decoding. (`main` sums in another
// order and is only for prompts.)
// flags as gemm.wgsl: 1 bias, 2 GELU (gelu.wgsl is prepended), 4 accumulate; 16 LayerNorm
// (gemv_common.wgsl, prepended too, has the folded norm and the epilogue); 32 (main_m1
// only) X is attention.wgsl's split partials of this row, merged here as main_merge would
// (the cross-attention's output projection: one dispatch less per layer and step).
// Flags 64 and 128 (main_m1 only): the self-attention's output projection as partials, one
// row of width d per head (attention.wgsl main_split_proj / main_merge_proj, head 0 with the
// bias), added to the residual by the GEMVs that read it next instead of by a GEMV of its
// own. 64: the input row is X plus the partials (the cross-attention's query, its LayerNorm
// over that sum); 128: the accumulated residual is Y plus the partials (the cross-attention's
// out projection writes x + self-attention + cross-attention back). Both add them by
// `add_parts`, in head order: the same bits in both places. The partials are read from the
// buffer bound as X (64) or Y (128), from float (p.head_parts >> 8) * 256 on, [row][head][d].

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> gamma: array<f32>;
@group(0) @binding(5) var<storage, read> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const MAXM: u32 = 8u;
const LN_AHEAD: bool = true;
const CP: u32 = 8u;
const KG: u32 = 32u;
const WG: u32 = 256u; // CP * KG

var<workgroup> red: array<vec2<f32>, 2048>; // [KG][MAXM][CP]
// Flag 32: each (head, split)'s weight exp(m_s - max) / l, and the merged row.
const MAXK_MERGE: u32 = 1280u; // d_model (GEMV_MERGE_MAX_K in mod.rs)
const NEG: f32 = -3.0e38;
var<workgroup> mw: array<f32, 128>; // [heads][splits] (GEMV_MERGE_MAX_PARTS)
var<workgroup> xm: array<f32, MAXK_MERGE>;

fn merge_on() -> bool {
    return (p.flags & 32u) != 0u;
}

fn parts_in() -> bool {
    return (p.flags & 64u) != 0u;
}

fn parts_out() -> bool {
    return (p.flags & 128u) != 0u;
}

// Float index of the partials of (row, head 0, column c) and the head count; rows of width wd.
fn parts_at(row: u32, c: u32, wd: u32) -> vec2<u32> {
    let heads = p.head_parts & 255u;
    return vec2<u32>((p.head_parts >> 8u) * 256u + row * heads * wd + c, heads);
}

// Heads h0..h0+7 of column c's partials of `row` from X (flag 64), the loads issued
// together (clamped past the last head; add_parts leaves those out).
fn parts8_x(row: u32, c: u32, h0: u32) -> array<f32, 8> {
    let at = parts_at(row, c, p.k);
    let last = at.y - 1u;
    let w = p.k;
    return array<f32, 8>(x[at.x + min(h0, last) * w], x[at.x + min(h0 + 1u, last) * w], x[at.x + min(h0 + 2u, last) * w],
        x[at.x + min(h0 + 3u, last) * w], x[at.x + min(h0 + 4u, last) * w], x[at.x + min(h0 + 5u, last) * w],
        x[at.x + min(h0 + 6u, last) * w], x[at.x + min(h0 + 7u, last) * w]);
}

// ... and from Y (flag 128).
fn parts8_y(row: u32, c: u32, h0: u32) -> array<f32, 8> {
    let at = parts_at(row, c, p.n);
    let last = at.y - 1u;
    let w = p.n;
    return array<f32, 8>(y[at.x + min(h0, last) * w], y[at.x + min(h0 + 1u, last) * w], y[at.x + min(h0 + 2u, last) * w],
        y[at.x + min(h0 + 3u, last) * w], y[at.x + min(h0 + 4u, last) * w], y[at.x + min(h0 + 5u, last) * w],
        y[at.x + min(h0 + 6u, last) * w], y[at.x + min(h0 + 7u, last) * w]);
}

// s plus the partials u of heads h..h+7 that exist, in head order.
fn add8(s0: f32, h: u32, heads: u32, u: array<f32, 8>) -> f32 {
    var s = s0;
    if (h < heads) { s += u[0]; }
    if (h + 1u < heads) { s += u[1]; }
    if (h + 2u < heads) { s += u[2]; }
    if (h + 3u < heads) { s += u[3]; }
    if (h + 4u < heads) { s += u[4]; }
    if (h + 5u < heads) { s += u[5]; }
    if (h + 6u < heads) { s += u[6]; }
    if (h + 7u < heads) { s += u[7]; }
    return s;
}

// The sum of a column's partials (in head order, from 0) with the first 16 heads' values
// already loaded (a: heads 0-7, b: 8-15) and the rest read here: both flags add by this.
fn parts_sum_x(row: u32, c: u32, a: array<f32, 8>, b: array<f32, 8>) -> f32 {
    let heads = p.head_parts & 255u;
    var s = add8(add8(0.0, 0u, heads, a), 8u, heads, b);
    for (var h = 16u; h < heads; h += 8u) {
        s = add8(s, h, heads, parts8_x(row, c, h));
    }
    return s;
}

fn parts_sum_y(row: u32, c: u32, a: array<f32, 8>, b: array<f32, 8>) -> f32 {
    let heads = p.head_parts & 255u;
    var s = add8(add8(0.0, 0u, heads, a), 8u, heads, b);
    for (var h = 16u; h < heads; h += 8u) {
        s = add8(s, h, heads, parts8_y(row, c, h));
    }
    return s;
}

// Flag 64: row `row` of X plus its partials into `xm` (the caller puts a barrier after):
// two columns a thread at a time, the first 16 heads' loads of both issued together.
fn parts_row(row: u32, lid: u32) {
    let xb = p.x_off + row * p.x_stride;
    let heads = p.head_parts & 255u;
    for (var c0 = lid; c0 < p.k; c0 += 2u * WG) {
        let c1 = min(c0 + WG, p.k - 1u);
        let a0 = parts8_x(row, c0, 0u);
        let a1 = parts8_x(row, c1, 0u);
        var b0 = array<f32, 8>();
        var b1 = array<f32, 8>();
        if (heads > 8u) {
            b0 = parts8_x(row, c0, 8u);
            b1 = parts8_x(row, c1, 8u);
        }
        let x0 = x[xb + c0];
        let x1 = x[xb + c1];
        xm[c0] = x0 + parts_sum_x(row, c0, a0, b0);
        if (c0 + WG < p.k) {
            xm[c1] = x1 + parts_sum_x(row, c1, a1, b1);
        }
    }
}

// The LayerNorm statistics' reads (gemv_common.wgsl): with flag 64 the row in `xm`.
fn ln_x(xb: u32, c: u32) -> f32 {
    if (parts_in()) {
        return xm[c];
    }
    return x[xb + c];
}

// Flag 32: the attention output row `row` (K = heads x merge_hd values) from the partials
// (m, l, sum of p v) at ((row heads + h) splits + s) (merge_hd + 2), into `xm`: the
// splits' weights first (one thread per head), then the weighted sums, four splits' loads
// issued together.
fn merge_row(row: u32, lid: u32) {
    let ns = p.merge_splits;
    let hd = p.merge_hd;
    let ps = hd + 2u;
    let heads = p.k / hd;
    if (lid < heads) {
        let base = p.x_off + (row * heads + lid) * ns * ps;
        var mx = NEG;
        for (var s = 0u; s < ns; s++) {
            mx = max(mx, x[base + s * ps]);
        }
        var l = 0.0;
        for (var s = 0u; s < ns; s++) {
            let ls = x[base + s * ps + 1u];
            if (ls > 0.0) {
                l += ls * exp(x[base + s * ps] - mx);
            }
        }
        for (var s = 0u; s < ns; s++) {
            var wgt = 0.0;
            if (x[base + s * ps + 1u] > 0.0) {
                wgt = exp(x[base + s * ps] - mx) / l;
            }
            mw[lid * ns + s] = wgt;
        }
    }
    workgroupBarrier();
    for (var k = lid; k < p.k; k += WG) {
        let h = k / hd;
        let b = p.x_off + (row * heads + h) * ns * ps + 2u + k % hd;
        let wb = h * ns;
        var v = 0.0;
        var s = 0u;
        for (; s + 4u <= ns; s += 4u) {
            let a0 = x[b + s * ps];
            let a1 = x[b + (s + 1u) * ps];
            let a2 = x[b + (s + 2u) * ps];
            let a3 = x[b + (s + 3u) * ps];
            v = fma(mw[wb + s], a0, v);
            v = fma(mw[wb + s + 1u], a1, v);
            v = fma(mw[wb + s + 2u], a2, v);
            v = fma(mw[wb + s + 3u], a3, v);
        }
        for (; s < ns; s++) {
            v = fma(mw[wb + s], x[b + s * ps], v);
        }
        xm[k] = v;
    }
    workgroupBarrier();
}

fn finish(v0: f32, n: u32, mi: u32) {
    var v = v0;
    if ((p.flags & 1u) != 0u) {
        v += bias[n];
    }
    if ((p.flags & 2u) != 0u) {
        v = gelu(v);
    }
    let o = p.y_off + mi * p.y_stride + n;
    if ((p.flags & 4u) != 0u) {
        v += y[o];
    }
    y[o] = v;
}

// LayerNorm statistics of rows [m0, m1) of X into `stat` (slot = row).
fn row_stats(m0: u32, m1: u32, lid: u32) {
    for (var mi = m0; mi < m1; mi++) {
        ln_stats(p.x_off + mi * p.x_stride, mi, lid);
    }
    workgroupBarrier();
}

// Element k of row mi of X' (normalised when flag 16 is set; main_m1's merged row with 32).
fn xv(mi: u32, k: u32) -> f32 {
    if (merge_on()) {
        return xm[k];
    }
    if (parts_in()) {
        return ln_apply(xm[k], mi, k);
    }
    return ln_apply(x[p.x_off + mi * p.x_stride + k], mi, k);
}

@compute @workgroup_size(CP, KG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let nw = p.n / 2u;
    let cw = (wg.x + wg.y * 32768u) * CP + li.x;
    let kg = li.y;
    let m = min(p.m, MAXM);
    if (ln_on()) {
        row_stats(0u, m, kg * CP + li.x);
    }
    let kc = (p.k + KG - 1u) / KG;
    let k0 = kg * kc;
    let k1 = min(p.k, k0 + kc);
    var acc: array<vec2<f32>, 8>;
    for (var i = 0u; i < MAXM; i++) {
        acc[i] = vec2<f32>(0.0, 0.0);
    }
    if (cw < nw) {
        // Four weight words issued back to back before they are used: a GPU thread stalls
        // at the first use of a load, so a plain loop pays the memory latency per word.
        var k = k0;
        for (; k + 4u <= k1; k += 4u) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            for (var mi = 0u; mi < m; mi++) {
                var a = acc[mi];
                a = fma(vec2<f32>(xv(mi, k)), w0, a);
                a = fma(vec2<f32>(xv(mi, k + 1u)), w1, a);
                a = fma(vec2<f32>(xv(mi, k + 2u)), w2, a);
                a = fma(vec2<f32>(xv(mi, k + 3u)), w3, a);
                acc[mi] = a;
            }
        }
        for (; k < k1; k++) {
            let wv = unpack2x16float(w[k * nw + cw]);
            for (var mi = 0u; mi < m; mi++) {
                acc[mi] = fma(vec2<f32>(xv(mi, k)), wv, acc[mi]);
            }
        }
    }
    for (var mi = 0u; mi < m; mi++) {
        red[(kg * MAXM + mi) * CP + li.x] = acc[mi];
    }
    workgroupBarrier();
    if (kg == 0u && cw < nw) {
        for (var mi = 0u; mi < m; mi++) {
            var s = vec2<f32>(0.0, 0.0);
            for (var g = 0u; g < KG; g++) {
                s += red[(g * MAXM + mi) * CP + li.x];
            }
            finish(s.x, 2u * cw, mi);
            finish(s.y, 2u * cw + 1u, mi);
        }
    }
}

@compute @workgroup_size(8, 32)
fn main_m1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let nw = p.n / 2u;
    let cw = (wg.x + wg.y * 32768u) * CP + li.x;
    let kg = li.y;
    let row = wg.z;
    let yb = p.y_off + row * p.y_stride;
    let kc = (p.k + KG - 1u) / KG;
    let k0 = kg * kc;
    let k1 = min(p.k, k0 + kc);
    // The first eight weight words are issued before the LayerNorm statistics (kept as raw
    // words: unpacking them here would wait for them), so their latency overlaps it.
    let pre = cw < nw && k0 + 8u <= k1;
    var r0 = 0u;
    var r1 = 0u;
    var r2 = 0u;
    var r3 = 0u;
    var r4 = 0u;
    var r5 = 0u;
    var r6 = 0u;
    var r7 = 0u;
    if (pre) {
        r0 = w[k0 * nw + cw];
        r1 = w[(k0 + 1u) * nw + cw];
        r2 = w[(k0 + 2u) * nw + cw];
        r3 = w[(k0 + 3u) * nw + cw];
        r4 = w[(k0 + 4u) * nw + cw];
        r5 = w[(k0 + 5u) * nw + cw];
        r6 = w[(k0 + 6u) * nw + cw];
        r7 = w[(k0 + 7u) * nw + cw];
    }
    // With the LayerNorm folded in, the pre-issued words' x, gamma and beta too: after the
    // statistics the first eight products then wait on nothing (LN_AHEAD; the kernel lab
    // rewrites it to false: 5.9 -> 5.2 us per 1536 x 384 dispatch on the H200, against 4.3
    // without a LayerNorm).
    // (Flag 64: gamma and beta ahead, x from the row built in workgroup memory.)
    let ahead = pre && LN_AHEAD && ln_on() && !merge_on();
    var x0 = 0.0;
    var x1 = 0.0;
    var x2 = 0.0;
    var x3 = 0.0;
    var x4 = 0.0;
    var x5 = 0.0;
    var x6 = 0.0;
    var x7 = 0.0;
    var g0 = 0.0;
    var g1 = 0.0;
    var g2 = 0.0;
    var g3 = 0.0;
    var g4 = 0.0;
    var g5 = 0.0;
    var g6 = 0.0;
    var g7 = 0.0;
    var e0 = 0.0;
    var e1 = 0.0;
    var e2 = 0.0;
    var e3 = 0.0;
    var e4 = 0.0;
    var e5 = 0.0;
    var e6 = 0.0;
    var e7 = 0.0;
    if (ahead && !parts_in()) {
        let xb = p.x_off + row * p.x_stride + k0;
        x0 = x[xb];
        x1 = x[xb + 1u];
        x2 = x[xb + 2u];
        x3 = x[xb + 3u];
        x4 = x[xb + 4u];
        x5 = x[xb + 5u];
        x6 = x[xb + 6u];
        x7 = x[xb + 7u];
    }
    if (ahead) {
        g0 = gamma[k0];
        g1 = gamma[k0 + 1u];
        g2 = gamma[k0 + 2u];
        g3 = gamma[k0 + 3u];
        g4 = gamma[k0 + 4u];
        g5 = gamma[k0 + 5u];
        g6 = gamma[k0 + 6u];
        g7 = gamma[k0 + 7u];
        e0 = beta[k0];
        e1 = beta[k0 + 1u];
        e2 = beta[k0 + 2u];
        e3 = beta[k0 + 3u];
        e4 = beta[k0 + 4u];
        e5 = beta[k0 + 5u];
        e6 = beta[k0 + 6u];
        e7 = beta[k0 + 7u];
    }
    // The epilogue's bias and residual too (0 when the flags leave them out).
    var eb = vec2<f32>(0.0, 0.0);
    var ey = vec2<f32>(0.0, 0.0);
    if (kg == 0u && cw < nw) {
        if ((p.flags & 1u) != 0u) {
            eb = vec2<f32>(bias[2u * cw], bias[2u * cw + 1u]);
        }
        if ((p.flags & 4u) != 0u) {
            ey = vec2<f32>(y[yb + 2u * cw], y[yb + 2u * cw + 1u]);
        }
    }
    // Flag 128: the first 16 heads' partials of this pair's outputs issued here and added
    // after the merge (adding them here waited a round trip before the merge began).
    var pa = array<f32, 8>();
    var pb = array<f32, 8>();
    var pc = array<f32, 8>();
    var pd = array<f32, 8>();
    let po = parts_out() && kg == 0u && cw < nw;
    if (po) {
        pa = parts8_y(row, 2u * cw, 0u);
        pb = parts8_y(row, 2u * cw + 1u, 0u);
        if ((p.head_parts & 255u) > 8u) {
            pc = parts8_y(row, 2u * cw, 8u);
            pd = parts8_y(row, 2u * cw + 1u, 8u);
        }
    }
    if (parts_in()) {
        parts_row(row, kg * CP + li.x);
        workgroupBarrier();
        if (ahead) {
            x0 = xm[k0];
            x1 = xm[k0 + 1u];
            x2 = xm[k0 + 2u];
            x3 = xm[k0 + 3u];
            x4 = xm[k0 + 4u];
            x5 = xm[k0 + 5u];
            x6 = xm[k0 + 6u];
            x7 = xm[k0 + 7u];
        }
    }
    if (ln_on()) {
        row_stats(row, row + 1u, kg * CP + li.x);
    }
    if (merge_on()) {
        merge_row(row, kg * CP + li.x);
    }
    if (po) {
        // Added here, after the merge, on the values issued at the start.
        ey = vec2<f32>(y[yb + 2u * cw] + parts_sum_y(row, 2u * cw, pa, pc), y[yb + 2u * cw + 1u] + parts_sum_y(row, 2u * cw + 1u, pb, pd));
    }
    var a = vec2<f32>(0.0, 0.0);
    var b = vec2<f32>(0.0, 0.0);
    if (cw < nw) {
        var k = k0;
        if (ahead) {
            a = fma(vec2<f32>(ln_with(x0, row, g0, e0)), unpack2x16float(r0), a);
            b = fma(vec2<f32>(ln_with(x1, row, g1, e1)), unpack2x16float(r1), b);
            a = fma(vec2<f32>(ln_with(x2, row, g2, e2)), unpack2x16float(r2), a);
            b = fma(vec2<f32>(ln_with(x3, row, g3, e3)), unpack2x16float(r3), b);
            a = fma(vec2<f32>(ln_with(x4, row, g4, e4)), unpack2x16float(r4), a);
            b = fma(vec2<f32>(ln_with(x5, row, g5, e5)), unpack2x16float(r5), b);
            a = fma(vec2<f32>(ln_with(x6, row, g6, e6)), unpack2x16float(r6), a);
            b = fma(vec2<f32>(ln_with(x7, row, g7, e7)), unpack2x16float(r7), b);
            k += 8u;
        } else if (pre) {
            a = fma(vec2<f32>(xv(row, k)), unpack2x16float(r0), a);
            b = fma(vec2<f32>(xv(row, k + 1u)), unpack2x16float(r1), b);
            a = fma(vec2<f32>(xv(row, k + 2u)), unpack2x16float(r2), a);
            b = fma(vec2<f32>(xv(row, k + 3u)), unpack2x16float(r3), b);
            a = fma(vec2<f32>(xv(row, k + 4u)), unpack2x16float(r4), a);
            b = fma(vec2<f32>(xv(row, k + 5u)), unpack2x16float(r5), b);
            a = fma(vec2<f32>(xv(row, k + 6u)), unpack2x16float(r6), a);
            b = fma(vec2<f32>(xv(row, k + 7u)), unpack2x16float(r7), b);
            k += 8u;
        }
        // Sixteen words per round while they last (long slices: fc2, the logits).
        for (; k + 16u <= k1; k += 16u) {
            let u0 = w[(k + 0u) * nw + cw];
            let u1 = w[(k + 1u) * nw + cw];
            let u2 = w[(k + 2u) * nw + cw];
            let u3 = w[(k + 3u) * nw + cw];
            let u4 = w[(k + 4u) * nw + cw];
            let u5 = w[(k + 5u) * nw + cw];
            let u6 = w[(k + 6u) * nw + cw];
            let u7 = w[(k + 7u) * nw + cw];
            let u8 = w[(k + 8u) * nw + cw];
            let u9 = w[(k + 9u) * nw + cw];
            let u10 = w[(k + 10u) * nw + cw];
            let u11 = w[(k + 11u) * nw + cw];
            let u12 = w[(k + 12u) * nw + cw];
            let u13 = w[(k + 13u) * nw + cw];
            let u14 = w[(k + 14u) * nw + cw];
            let u15 = w[(k + 15u) * nw + cw];
            a = fma(vec2<f32>(xv(row, k + 0u)), unpack2x16float(u0), a);
            b = fma(vec2<f32>(xv(row, k + 1u)), unpack2x16float(u1), b);
            a = fma(vec2<f32>(xv(row, k + 2u)), unpack2x16float(u2), a);
            b = fma(vec2<f32>(xv(row, k + 3u)), unpack2x16float(u3), b);
            a = fma(vec2<f32>(xv(row, k + 4u)), unpack2x16float(u4), a);
            b = fma(vec2<f32>(xv(row, k + 5u)), unpack2x16float(u5), b);
            a = fma(vec2<f32>(xv(row, k + 6u)), unpack2x16float(u6), a);
            b = fma(vec2<f32>(xv(row, k + 7u)), unpack2x16float(u7), b);
            a = fma(vec2<f32>(xv(row, k + 8u)), unpack2x16float(u8), a);
            b = fma(vec2<f32>(xv(row, k + 9u)), unpack2x16float(u9), b);
            a = fma(vec2<f32>(xv(row, k + 10u)), unpack2x16float(u10), a);
            b = fma(vec2<f32>(xv(row, k + 11u)), unpack2x16float(u11), b);
            a = fma(vec2<f32>(xv(row, k + 12u)), unpack2x16float(u12), a);
            b = fma(vec2<f32>(xv(row, k + 13u)), unpack2x16float(u13), b);
            a = fma(vec2<f32>(xv(row, k + 14u)), unpack2x16float(u14), a);
            b = fma(vec2<f32>(xv(row, k + 15u)), unpack2x16float(u15), b);
        }
        for (; k + 8u <= k1; k += 8u) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            let w4 = unpack2x16float(w[(k + 4u) * nw + cw]);
            let w5 = unpack2x16float(w[(k + 5u) * nw + cw]);
            let w6 = unpack2x16float(w[(k + 6u) * nw + cw]);
            let w7 = unpack2x16float(w[(k + 7u) * nw + cw]);
            a = fma(vec2<f32>(xv(row, k)), w0, a);
            b = fma(vec2<f32>(xv(row, k + 1u)), w1, b);
            a = fma(vec2<f32>(xv(row, k + 2u)), w2, a);
            b = fma(vec2<f32>(xv(row, k + 3u)), w3, b);
            a = fma(vec2<f32>(xv(row, k + 4u)), w4, a);
            b = fma(vec2<f32>(xv(row, k + 5u)), w5, b);
            a = fma(vec2<f32>(xv(row, k + 6u)), w6, a);
            b = fma(vec2<f32>(xv(row, k + 7u)), w7, b);
        }
        // The rest in a block of four (a loop of single loads would wait for each).
        if (k + 4u <= k1) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            a = fma(vec2<f32>(xv(row, k)), w0, a);
            b = fma(vec2<f32>(xv(row, k + 1u)), w1, b);
            a = fma(vec2<f32>(xv(row, k + 2u)), w2, a);
            b = fma(vec2<f32>(xv(row, k + 3u)), w3, b);
            k += 4u;
        }
        for (; k < k1; k++) {
            a = fma(vec2<f32>(xv(row, k)), unpack2x16float(w[k * nw + cw]), a);
        }
    }
    let slot = kg * CP + li.x;
    red[slot] = a + b;
    workgroupBarrier();
    // The K slices' tree, two levels per barrier (the same sums as level by level; see
    // wg_sum in gemv_common.wgsl).
    var st = KG / 2u;
    for (; st >= 2u; st = st / 4u) {
        let q = st / 2u;
        if (kg < q) {
            red[slot] = (red[slot] + red[slot + st * CP]) + (red[slot + q * CP] + red[slot + (st + q) * CP]);
        }
        workgroupBarrier();
    }
    if (st == 1u) {
        if (kg == 0u) {
            red[slot] += red[slot + CP];
        }
        workgroupBarrier();
    }
    if (kg == 0u && cw < nw) {
        let s = red[li.x];
        finish_pre(s.x, yb + 2u * cw, eb.x, ey.x);
        finish_pre(s.y, yb + 2u * cw + 1u, eb.y, ey.y);
    }
}
