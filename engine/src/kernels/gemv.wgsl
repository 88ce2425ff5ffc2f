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

// Flag 32: the attention output row `row` (K = heads x merge_hd values) from the partials
// (m, l, sum of p v) at ((row heads + h) splits + s) (merge_hd + 2), into `xm`: the
// splits' weights first (one thread per head), then the weighted sums, four splits' loads
// issued together.
fn merge_row(row: u32, lid: u32) {
    let ns = p.merge_splits;
    let hd = p.merge_hd;
    let ps = hd + 2u;
    let heads = p.k / hd;
    if (lid < heads && ns <= 8u) {
        // Up to eight splits (Whisper's 1500 frames are six): every split's m and l loaded
        // at once (split indices clamped to the last), then the loop's arithmetic below, the
        // same expressions in the same order. In the loop each load waited for the one
        // before it.
        let base = p.x_off + (row * heads + lid) * ns * ps;
        let last = ns - 1u;
        let m0 = x[base];
        let m1 = x[base + min(1u, last) * ps];
        let m2 = x[base + min(2u, last) * ps];
        let m3 = x[base + min(3u, last) * ps];
        let m4 = x[base + min(4u, last) * ps];
        let m5 = x[base + min(5u, last) * ps];
        let m6 = x[base + min(6u, last) * ps];
        let m7 = x[base + min(7u, last) * ps];
        let l0 = x[base + 1u];
        let l1 = x[base + min(1u, last) * ps + 1u];
        let l2 = x[base + min(2u, last) * ps + 1u];
        let l3 = x[base + min(3u, last) * ps + 1u];
        let l4 = x[base + min(4u, last) * ps + 1u];
        let l5 = x[base + min(5u, last) * ps + 1u];
        let l6 = x[base + min(6u, last) * ps + 1u];
        let l7 = x[base + min(7u, last) * ps + 1u];
        // (m of a split past ns is the last split's: max is unchanged by it)
        let mx = max(max(max(max(NEG, m0), max(m1, m2)), max(m3, m4)), max(max(m5, m6), m7));
        var l = 0.0;
        if (l0 > 0.0) { l += l0 * exp(m0 - mx); }
        if (1u < ns && l1 > 0.0) { l += l1 * exp(m1 - mx); }
        if (2u < ns && l2 > 0.0) { l += l2 * exp(m2 - mx); }
        if (3u < ns && l3 > 0.0) { l += l3 * exp(m3 - mx); }
        if (4u < ns && l4 > 0.0) { l += l4 * exp(m4 - mx); }
        if (5u < ns && l5 > 0.0) { l += l5 * exp(m5 - mx); }
        if (6u < ns && l6 > 0.0) { l += l6 * exp(m6 - mx); }
        if (7u < ns && l7 > 0.0) { l += l7 * exp(m7 - mx); }
        let wb = lid * ns;
        mw[wb] = select(0.0, exp(m0 - mx) / l, l0 > 0.0);
        if (1u < ns) { mw[wb + 1u] = select(0.0, exp(m1 - mx) / l, l1 > 0.0); }
        if (2u < ns) { mw[wb + 2u] = select(0.0, exp(m2 - mx) / l, l2 > 0.0); }
        if (3u < ns) { mw[wb + 3u] = select(0.0, exp(m3 - mx) / l, l3 > 0.0); }
        if (4u < ns) { mw[wb + 4u] = select(0.0, exp(m4 - mx) / l, l4 > 0.0); }
        if (5u < ns) { mw[wb + 5u] = select(0.0, exp(m5 - mx) / l, l5 > 0.0); }
        if (6u < ns) { mw[wb + 6u] = select(0.0, exp(m6 - mx) / l, l6 > 0.0); }
        if (7u < ns) { mw[wb + 7u] = select(0.0, exp(m7 - mx) / l, l7 > 0.0); }
    } else if (lid < heads) {
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
// (Rows m0 .. m1 into statistics slots 0 .. m1 - m0: main takes rows 0 .. m, main_m1 its
// one row, whichever of a verify pass's rows that is, into slot 0.)
fn row_stats(m0: u32, m1: u32, lid: u32) {
    for (var mi = m0; mi < m1; mi++) {
        ln_stats(p.x_off + mi * p.x_stride, mi - m0, lid);
    }
    workgroupBarrier();
}

// Element k of row mi of X' (normalised when flag 16 is set; main_m1's merged row with 32).
fn xv(mi: u32, k: u32) -> f32 {
    if (merge_on()) {
        return xm[k];
    }
    return ln_apply(x[p.x_off + mi * p.x_stride + k], mi, k);
}

// The same for main_m1's one row (its statistics in slot 0).
fn xv_m1(row: u32, k: u32) -> f32 {
    if (merge_on()) {
        return xm[k];
    }
    return ln_apply(x[p.x_off + row * p.x_stride + k], 0u, k);
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
    if (ahead) {
        let xb = p.x_off + row * p.x_stride + k0;
        x0 = x[xb];
        x1 = x[xb + 1u];
        x2 = x[xb + 2u];
        x3 = x[xb + 3u];
        x4 = x[xb + 4u];
        x5 = x[xb + 5u];
        x6 = x[xb + 6u];
        x7 = x[xb + 7u];
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
    if (ln_on()) {
        row_stats(row, row + 1u, kg * CP + li.x); // into slot 0
    }
    if (merge_on()) {
        merge_row(row, kg * CP + li.x);
    }
    var a = vec2<f32>(0.0, 0.0);
    var b = vec2<f32>(0.0, 0.0);
    if (cw < nw) {
        var k = k0;
        if (ahead) {
            a = fma(vec2<f32>(ln_with(x0, 0u, g0, e0)), unpack2x16float(r0), a);
            b = fma(vec2<f32>(ln_with(x1, 0u, g1, e1)), unpack2x16float(r1), b);
            a = fma(vec2<f32>(ln_with(x2, 0u, g2, e2)), unpack2x16float(r2), a);
            b = fma(vec2<f32>(ln_with(x3, 0u, g3, e3)), unpack2x16float(r3), b);
            a = fma(vec2<f32>(ln_with(x4, 0u, g4, e4)), unpack2x16float(r4), a);
            b = fma(vec2<f32>(ln_with(x5, 0u, g5, e5)), unpack2x16float(r5), b);
            a = fma(vec2<f32>(ln_with(x6, 0u, g6, e6)), unpack2x16float(r6), a);
            b = fma(vec2<f32>(ln_with(x7, 0u, g7, e7)), unpack2x16float(r7), b);
            k += 8u;
        } else if (pre) {
            a = fma(vec2<f32>(xv_m1(row, k)), unpack2x16float(r0), a);
            b = fma(vec2<f32>(xv_m1(row, k + 1u)), unpack2x16float(r1), b);
            a = fma(vec2<f32>(xv_m1(row, k + 2u)), unpack2x16float(r2), a);
            b = fma(vec2<f32>(xv_m1(row, k + 3u)), unpack2x16float(r3), b);
            a = fma(vec2<f32>(xv_m1(row, k + 4u)), unpack2x16float(r4), a);
            b = fma(vec2<f32>(xv_m1(row, k + 5u)), unpack2x16float(r5), b);
            a = fma(vec2<f32>(xv_m1(row, k + 6u)), unpack2x16float(r6), a);
            b = fma(vec2<f32>(xv_m1(row, k + 7u)), unpack2x16float(r7), b);
            k += 8u;
        }
        // Sixteen words per round while they last (long slices: fc2, the logits). (A verify
        // pass's LayerNorm variant, `gemv_m1_ln_source` in kernels/mod.rs, drops these rounds
        // and the loads ahead: 59 registers instead of 105, the same bits.)
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
            a = fma(vec2<f32>(xv_m1(row, k + 0u)), unpack2x16float(u0), a);
            b = fma(vec2<f32>(xv_m1(row, k + 1u)), unpack2x16float(u1), b);
            a = fma(vec2<f32>(xv_m1(row, k + 2u)), unpack2x16float(u2), a);
            b = fma(vec2<f32>(xv_m1(row, k + 3u)), unpack2x16float(u3), b);
            a = fma(vec2<f32>(xv_m1(row, k + 4u)), unpack2x16float(u4), a);
            b = fma(vec2<f32>(xv_m1(row, k + 5u)), unpack2x16float(u5), b);
            a = fma(vec2<f32>(xv_m1(row, k + 6u)), unpack2x16float(u6), a);
            b = fma(vec2<f32>(xv_m1(row, k + 7u)), unpack2x16float(u7), b);
            a = fma(vec2<f32>(xv_m1(row, k + 8u)), unpack2x16float(u8), a);
            b = fma(vec2<f32>(xv_m1(row, k + 9u)), unpack2x16float(u9), b);
            a = fma(vec2<f32>(xv_m1(row, k + 10u)), unpack2x16float(u10), a);
            b = fma(vec2<f32>(xv_m1(row, k + 11u)), unpack2x16float(u11), b);
            a = fma(vec2<f32>(xv_m1(row, k + 12u)), unpack2x16float(u12), a);
            b = fma(vec2<f32>(xv_m1(row, k + 13u)), unpack2x16float(u13), b);
            a = fma(vec2<f32>(xv_m1(row, k + 14u)), unpack2x16float(u14), a);
            b = fma(vec2<f32>(xv_m1(row, k + 15u)), unpack2x16float(u15), b);
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
            a = fma(vec2<f32>(xv_m1(row, k)), w0, a);
            b = fma(vec2<f32>(xv_m1(row, k + 1u)), w1, b);
            a = fma(vec2<f32>(xv_m1(row, k + 2u)), w2, a);
            b = fma(vec2<f32>(xv_m1(row, k + 3u)), w3, b);
            a = fma(vec2<f32>(xv_m1(row, k + 4u)), w4, a);
            b = fma(vec2<f32>(xv_m1(row, k + 5u)), w5, b);
            a = fma(vec2<f32>(xv_m1(row, k + 6u)), w6, a);
            b = fma(vec2<f32>(xv_m1(row, k + 7u)), w7, b);
        }
        // The rest in a block of four (a loop of single loads would wait for each).
        if (k + 4u <= k1) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            a = fma(vec2<f32>(xv_m1(row, k)), w0, a);
            b = fma(vec2<f32>(xv_m1(row, k + 1u)), w1, b);
            a = fma(vec2<f32>(xv_m1(row, k + 2u)), w2, a);
            b = fma(vec2<f32>(xv_m1(row, k + 3u)), w3, b);
            k += 4u;
        }
        for (; k < k1; k++) {
            a = fma(vec2<f32>(xv_m1(row, k)), unpack2x16float(w[k * nw + cw]), a);
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

// A verify pass's rows, RB to a workgroup (workgroup z is the group of rows): each weight
// word is loaded once for the group, where main_m1 loads it once a row (the later rows from
// L2). Every row is summed exactly as main_m1 sums it alone, so a pass reproduces single
// steps bit for bit: the same K slices; within a slice the products alternate between two
// accumulators while whole blocks of four remain and the rest go to the first (main_m1's
// rounds of 16, 8 and 4 and its tail), each in ascending k; the same tree over the slices;
// the LayerNorm statistics as `ln_stats` computes them, four rows at once as vec4 lanes
// (`ln_stats4`: the same loads, sums and trees a lane, a quarter of four calls' barriers).
// Without the merge (flag 32): the split attention's partials stay main_m1's.
// On NVIDIA the bits hold only because nothing is left to contract (gemv_common.wgsl's
// note on ln_stats): before that the bench's guard caught this kernel (RESULTS.md
// 2026-12-06). Passes take it from 9 rows with the norm, 13 plain (kernels/mod.rs
// GEMV_PASS_ROWS_MIN; `VERBATIM_GEMV_PASS_ROWS` to move or drop the thresholds).
const RB: u32 = 4u;
var<workgroup> rs4: array<vec4<f32>, WG>;

// wg_sum and ln_stats (gemv_common.wgsl) over four rows at once, a row a lane: twins, not
// shared code, because WGSL has no generics and the scalar pair is the decode step's hot
// path (a vec4 tree there would be four times its workgroup memory, untimed). They must
// stay the same operations in the same order lane by lane: `pass_rows_kernel_keeps_the_
// bits` compares every row with main_m1 on the same row alone, and the bench's guard does
// on each device. Four ln_stats calls instead: 105 against 87 us a tiny.en pass (RESULTS.md
// 2026-12-06, twelfth session).
fn wg_sum4(v: vec4<f32>, lid: u32) -> vec4<f32> {
    rs4[lid] = v;
    workgroupBarrier();
    var st = WG / 2u;
    for (; st >= 2u; st = st / 4u) {
        let q = st / 2u;
        if (lid < q) {
            rs4[lid] = (rs4[lid] + rs4[lid + st]) + (rs4[lid + q] + rs4[lid + st + q]);
        }
        workgroupBarrier();
    }
    if (st == 1u) {
        if (lid == 0u) {
            rs4[0] += rs4[1];
        }
        workgroupBarrier();
    }
    let t = rs4[0];
    workgroupBarrier();
    return t;
}

// Element c of each of the four rows starting at xb (clamped to the row's last element).
fn x4(xb: vec4<u32>, c: u32) -> vec4<f32> {
    let l = p.k - 1u;
    return vec4<f32>(x[xb.x + min(c, l)], x[xb.y + min(c, l)], x[xb.z + min(c, l)], x[xb.w + min(c, l)]);
}

// ln_stats for the four rows starting at xb into stat slots 0..3 (a barrier follows).
fn ln_stats4(xb: vec4<u32>, lid: u32) {
    let kf = f32(p.k);
    let v0 = x4(xb, lid);
    let v1 = x4(xb, lid + WG);
    let v2 = x4(xb, lid + 2u * WG);
    let v3 = x4(xb, lid + 3u * WG);
    let in0 = lid < p.k;
    let in1 = lid + WG < p.k;
    let in2 = lid + 2u * WG < p.k;
    let in3 = lid + 3u * WG < p.k;
    var s = vec4<f32>(0.0);
    if (in0) {
        s += v0;
    }
    if (in1) {
        s += v1;
    }
    if (in2) {
        s += v2;
    }
    if (in3) {
        s += v3;
    }
    for (var c = lid + 4u * WG; c < p.k; c += 4u * WG) {
        let u0 = x4(xb, c);
        let u1 = x4(xb, c + WG);
        let u2 = x4(xb, c + 2u * WG);
        let u3 = x4(xb, c + 3u * WG);
        s += u0;
        if (c + WG < p.k) {
            s += u1;
        }
        if (c + 2u * WG < p.k) {
            s += u2;
        }
        if (c + 3u * WG < p.k) {
            s += u3;
        }
    }
    // As ln_stats: every product inside an fma or feeding only a store.
    let rk = 1.0 / kf;
    let t = wg_sum4(s, lid);
    let mean = t * rk;
    var q = vec4<f32>(0.0);
    if (in0) {
        let d = fma(-t, vec4<f32>(rk), v0);
        q = fma(d, d, q);
    }
    if (in1) {
        let d = fma(-t, vec4<f32>(rk), v1);
        q = fma(d, d, q);
    }
    if (in2) {
        let d = fma(-t, vec4<f32>(rk), v2);
        q = fma(d, d, q);
    }
    if (in3) {
        let d = fma(-t, vec4<f32>(rk), v3);
        q = fma(d, d, q);
    }
    for (var c = lid + 4u * WG; c < p.k; c += WG) {
        let d = fma(-t, vec4<f32>(rk), x4(xb, c));
        q = fma(d, d, q);
    }
    let inv = inverseSqrt(fma(wg_sum4(q, lid), vec4<f32>(rk), vec4<f32>(p.eps)));
    if (lid == 0u) {
        stat[0] = mean.x;
        stat[1] = mean.y;
        stat[2] = mean.z;
        stat[3] = mean.w;
        stat[MAXM] = inv.x;
        stat[MAXM + 1u] = inv.y;
        stat[MAXM + 2u] = inv.z;
        stat[MAXM + 3u] = inv.w;
    }
}


// X'[row slot][k] for main_rows: normalised with slot's statistics under flag 16.
fn xr(xb: u32, slot: u32, k: u32, g: f32, e: f32) -> f32 {
    let v = x[xb + k];
    if (ln_on()) {
        return ln_with(v, slot, g, e);
    }
    return v;
}

// Four products of one row, alternating (a, b, a, b): its accumulators as (a, b) in .xy, .zw.
fn four(acc: vec4<f32>, xb: u32, slot: u32, k: u32, w0: vec2<f32>, w1: vec2<f32>, w2: vec2<f32>, w3: vec2<f32>, g: vec4<f32>, e: vec4<f32>) -> vec4<f32> {
    var a = acc.xy;
    var b = acc.zw;
    a = fma(vec2<f32>(xr(xb, slot, k, g.x, e.x)), w0, a);
    b = fma(vec2<f32>(xr(xb, slot, k + 1u, g.y, e.y)), w1, b);
    a = fma(vec2<f32>(xr(xb, slot, k + 2u, g.z, e.z)), w2, a);
    b = fma(vec2<f32>(xr(xb, slot, k + 3u, g.w, e.w)), w3, b);
    return vec4<f32>(a, b);
}

// gamma and beta at k..k+3 (0 without the norm: unused then).
fn g4(k: u32) -> vec4<f32> {
    if (ln_on()) {
        return vec4<f32>(gamma[k], gamma[k + 1u], gamma[k + 2u], gamma[k + 3u]);
    }
    return vec4<f32>(0.0);
}

fn e4(k: u32) -> vec4<f32> {
    if (ln_on()) {
        return vec4<f32>(beta[k], beta[k + 1u], beta[k + 2u], beta[k + 3u]);
    }
    return vec4<f32>(0.0);
}

@compute @workgroup_size(8, 32)
fn main_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let nw = p.n / 2u;
    let cw = (wg.x + wg.y * 32768u) * CP + li.x;
    let kg = li.y;
    let lid = kg * CP + li.x;
    let r0 = wg.z * RB;
    let nr = min(RB, p.m - r0);
    // Rows past the last repeat it (computed, never written).
    let last = p.m - 1u;
    let xb = vec4<u32>(
        p.x_off + min(r0, last) * p.x_stride,
        p.x_off + min(r0 + 1u, last) * p.x_stride,
        p.x_off + min(r0 + 2u, last) * p.x_stride,
        p.x_off + min(r0 + 3u, last) * p.x_stride,
    );
    let kc = (p.k + KG - 1u) / KG;
    let k0 = kg * kc;
    let k1 = min(p.k, k0 + kc);
    let len = select(0u, k1 - k0, k1 > k0);
    let kb = k0 + len / 4u * 4u; // the alternating blocks end here
    if (ln_on()) {
        ln_stats4(xb, lid);
        workgroupBarrier();
    }
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    if (cw < nw) {
        var k = k0;
        for (; k + 8u <= kb; k += 8u) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            let w4 = unpack2x16float(w[(k + 4u) * nw + cw]);
            let w5 = unpack2x16float(w[(k + 5u) * nw + cw]);
            let w6 = unpack2x16float(w[(k + 6u) * nw + cw]);
            let w7 = unpack2x16float(w[(k + 7u) * nw + cw]);
            let ga = g4(k);
            let gb = g4(k + 4u);
            let ea = e4(k);
            let eb = e4(k + 4u);
            c0 = four(four(c0, xb.x, 0u, k, w0, w1, w2, w3, ga, ea), xb.x, 0u, k + 4u, w4, w5, w6, w7, gb, eb);
            c1 = four(four(c1, xb.y, 1u, k, w0, w1, w2, w3, ga, ea), xb.y, 1u, k + 4u, w4, w5, w6, w7, gb, eb);
            c2 = four(four(c2, xb.z, 2u, k, w0, w1, w2, w3, ga, ea), xb.z, 2u, k + 4u, w4, w5, w6, w7, gb, eb);
            c3 = four(four(c3, xb.w, 3u, k, w0, w1, w2, w3, ga, ea), xb.w, 3u, k + 4u, w4, w5, w6, w7, gb, eb);
        }
        if (k + 4u <= kb) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            let ga = g4(k);
            let ea = e4(k);
            c0 = four(c0, xb.x, 0u, k, w0, w1, w2, w3, ga, ea);
            c1 = four(c1, xb.y, 1u, k, w0, w1, w2, w3, ga, ea);
            c2 = four(c2, xb.z, 2u, k, w0, w1, w2, w3, ga, ea);
            c3 = four(c3, xb.w, 3u, k, w0, w1, w2, w3, ga, ea);
            k += 4u;
        }
        // The tail into the first accumulator, as main_m1's.
        for (; k < k1; k++) {
            let wv = unpack2x16float(w[k * nw + cw]);
            var g = 0.0;
            var e = 0.0;
            if (ln_on()) {
                g = gamma[k];
                e = beta[k];
            }
            c0 = vec4<f32>(fma(vec2<f32>(xr(xb.x, 0u, k, g, e)), wv, c0.xy), c0.zw);
            c1 = vec4<f32>(fma(vec2<f32>(xr(xb.y, 1u, k, g, e)), wv, c1.xy), c1.zw);
            c2 = vec4<f32>(fma(vec2<f32>(xr(xb.z, 2u, k, g, e)), wv, c2.xy), c2.zw);
            c3 = vec4<f32>(fma(vec2<f32>(xr(xb.w, 3u, k, g, e)), wv, c3.xy), c3.zw);
        }
    }
    // The K slices' tree for each row ([KG][RB][CP] in red), as main_m1's.
    red[(kg * RB) * CP + li.x] = c0.xy + c0.zw;
    red[(kg * RB + 1u) * CP + li.x] = c1.xy + c1.zw;
    red[(kg * RB + 2u) * CP + li.x] = c2.xy + c2.zw;
    red[(kg * RB + 3u) * CP + li.x] = c3.xy + c3.zw;
    workgroupBarrier();
    var st = KG / 2u;
    for (; st >= 2u; st = st / 4u) {
        let q = st / 2u;
        if (kg < q) {
            for (var r = 0u; r < RB; r++) {
                let s = (kg * RB + r) * CP + li.x;
                let t = RB * CP;
                red[s] = (red[s] + red[s + st * t]) + (red[s + q * t] + red[s + (st + q) * t]);
            }
        }
        workgroupBarrier();
    }
    if (st == 1u) {
        if (kg == 0u) {
            for (var r = 0u; r < RB; r++) {
                red[r * CP + li.x] += red[(RB + r) * CP + li.x];
            }
        }
        workgroupBarrier();
    }
    if (kg == 0u && cw < nw) {
        var eb = vec2<f32>(0.0, 0.0);
        if ((p.flags & 1u) != 0u) {
            eb = vec2<f32>(bias[2u * cw], bias[2u * cw + 1u]);
        }
        for (var r = 0u; r < nr; r++) {
            let yb = p.y_off + (r0 + r) * p.y_stride + 2u * cw;
            var ey = vec2<f32>(0.0, 0.0);
            if ((p.flags & 4u) != 0u) {
                ey = vec2<f32>(y[yb], y[yb + 1u]);
            }
            let s = red[r * CP + li.x];
            finish_pre(s.x, yb, eb.x, ey.x);
            finish_pre(s.y, yb + 1u, eb.y, ey.y);
        }
    }
}
