// The decoder's feed-forward block for a few rows (a decode step's row, a verify pass's
// rows): x[r] += GELU(LayerNorm(x[r]) W1 + b1) W2 + b2, the residual updated in place, in
// two dispatches. W1 is [d][ffn] and W2 [ffn][d], k-major with f16 pairs along N (F16Matrix).
//
// Why not fc1 and fc2 as two GEMVs: fc2's long K starves main_m1 of workgroups (small.en's
// fc2, K = 3072, N = 768: 48 workgroups each walking 3072 weight rows, 16 us a GEMV in the
// decode stream on the H200, 0.19 ms of a 0.88 ms step).
//
// `main`: workgroup j takes the hidden units [16 j, 16 j + 16): it normalises the row
// itself, computes its 16 hidden values (fc1's 16 columns as 8 column pairs x 32 K slices,
// as main_m1: each weight word is read once per pass) and multiplies them by W2's 16 rows
// into a partial of all d outputs: [rows][chunks][d] in `part`. `main_sum` adds each
// output's partials in chunk order, then b2 and the residual. The order is fixed, so a
// row's bits are the row's alone: a verify pass's rows equal single decode steps bit for
// bit, which keeps speculative output identical to greedy.
//
// `main_sum_norm` is main_sum for the decoder's last layer: it also writes LayerNorm(x[r])
// with the final norm's gamma and beta (the logits' input), so a step needs no dispatch
// for the final norm. The last of a row's workgroups to arrive (an atomic counter) reads
// the finished row back and normalises it with layernorm.wgsl's arithmetic (row_stats.wgsl,
// appended): the same bits as the final-norm dispatch it replaces.
//
// Not one dispatch: the last workgroup to arrive (atomic counters, the partials as atomics,
// storageBarrier) summing them in the same dispatch read 18-22 us in the per-kernel table
// on the H200 against 10-12 without the sum (commit 0c24cf9): its chain of L2 round trips
// cost more than a dispatch boundary.

struct Params {
    d: u32, ffn: u32, chunks: u32, x_off: u32,
    x_stride: u32, eps: f32,
    fin_eps: f32, // main_sum_norm: the final norm's epsilon
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w1: array<u32>;
@group(0) @binding(3) var<storage, read> b1: array<f32>;
@group(0) @binding(4) var<storage, read> w2: array<u32>;
@group(0) @binding(5) var<storage, read> b2: array<f32>;
@group(0) @binding(6) var<storage, read> gamma: array<f32>;
@group(0) @binding(7) var<storage, read> beta: array<f32>;
@group(0) @binding(8) var<storage, read_write> part: array<f32>;
// main_sum_norm only: the rows' arrival counters (FIN_ROWS words, zero between dispatches)
// then a copy of each finished row (the last workgroup reads it as atomics: an SM's L1 may
// hold stale lines of x that it read before the other workgroups wrote them), the final
// norm's gamma and beta, and the normalised rows (row r at r d).
@group(0) @binding(9) var<storage, read_write> fin: array<atomic<u32>>;
@group(0) @binding(10) var<storage, read> fin_gamma: array<f32>;
@group(0) @binding(11) var<storage, read> fin_beta: array<f32>;
@group(0) @binding(12) var<storage, read_write> xn_out: array<f32>;

const WG: u32 = 256u;
const CP: u32 = 8u; // hidden column pairs a workgroup (FFN_CHUNK = 2 CP hidden units in mod.rs)
const CH: u32 = 16u; // hidden units a workgroup
const KG: u32 = 32u; // K slices of the fc1 part (CP x KG = WG)
const SLICES: u32 = 16u; // main_sum: chunk slices a workgroup, each output's 16 in a tree
const MAXD: u32 = 1280u; // d_model (FFN_MAX_D in mod.rs)
// b1 issued with fc1's first words rather than after fc1's slice tree, where it was a round
// trip to L2 at the end of the chain: ffn_decode 10.22 -> 10.0 us a tiny.en step (H200),
// 10.35 -> 10.2 (H100). (main_sum's residual and b2 issued before its chunk tree as well
// made it 0.15 us slower on the H100: not done.) EARLY_BIAS = false (kernels/mod.rs,
// VERBATIM_FFN_EARLY_BIAS=0) loads b1 where it is used, to compare; the same bits.
const EARLY_BIAS: bool = true;
const FIN_ROWS: u32 = 32u; // rows a dispatch takes (VERIFY_MAX_ROWS in mod.rs)

var<workgroup> xn: array<f32, MAXD>; // LayerNorm(row)
var<workgroup> tree: array<f32, WG>;
var<workgroup> red: array<vec2<f32>, WG>; // [KG][CP] fc1 slices
var<workgroup> hs: array<f32, CH>; // this chunk's hidden values
var<workgroup> sums: array<f32, WG>; // main_sum: [SLICES][16 outputs]
var<workgroup> arrived_last: u32; // main_sum_norm

// Sum of v over the workgroup, a 4-ary tree (256 = 4^4: four barriers), every thread gets it.
fn wg_total(v: f32, lid: u32) -> f32 {
    tree[lid] = v;
    workgroupBarrier();
    for (var st = WG / 4u; st > 0u; st = st / 4u) {
        if (lid < st) {
            tree[lid] = tree[lid] + tree[lid + st] + tree[lid + 2u * st] + tree[lid + 3u * st];
        }
        workgroupBarrier();
    }
    let t = tree[0];
    workgroupBarrier();
    return t;
}

// fc1's word (k, column pair hp), 0 past the row's end.
fn w1_word(k: u32, hp: u32, k1: u32) -> u32 {
    if (k >= k1) {
        return 0u;
    }
    return w1[k * (p.ffn / 2u) + hp];
}

// fc2's words of output pair t for the chunk's 16 rows from h0, all issued before any is
// used (a loop over a runtime row count issued one load per round trip); rows past the
// chunk's `nh` read its last row and are not added.
fn fc2_words(h0: u32, nh: u32, t: u32, dw: u32) -> array<u32, CH> {
    let r = h0 * dw + t;
    let last = nh - 1u;
    return array<u32, CH>(
        w2[r + min(0u, last) * dw],
        w2[r + min(1u, last) * dw],
        w2[r + min(2u, last) * dw],
        w2[r + min(3u, last) * dw],
        w2[r + min(4u, last) * dw],
        w2[r + min(5u, last) * dw],
        w2[r + min(6u, last) * dw],
        w2[r + min(7u, last) * dw],
        w2[r + min(8u, last) * dw],
        w2[r + min(9u, last) * dw],
        w2[r + min(10u, last) * dw],
        w2[r + min(11u, last) * dw],
        w2[r + min(12u, last) * dw],
        w2[r + min(13u, last) * dw],
        w2[r + min(14u, last) * dw],
        w2[r + min(15u, last) * dw],
    );
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = wg.x;
    let row = wg.z;
    let d = p.d;
    let dw = d / 2u;
    let h0 = j * CH;
    let nh = min(CH, p.ffn - h0); // hidden units of this chunk (even)
    let xb = p.x_off + row * p.x_stride;

    // fc2's words of this thread's first two output pairs depend on nothing: issued first.
    // (Verify passes take `ffn_decode_late_source` in kernels/mod.rs, which moves these three
    // statements after the hidden values: 64 registers, not 109, so three workgroups an SM
    // instead of two, the same bits. A step's one row fits one wave either way, and keeps
    // them here, where their latency overlaps fc1.)
    let v2a = fc2_words(h0, nh, min(lid, dw - 1u), dw);
    var v2b = v2a;
    if (dw > WG) {
        v2b = fc2_words(h0, nh, min(lid + WG, dw - 1u), dw);
    }
    // fc1's first words of this thread's slice, then the LayerNorm statistics.
    let cp = lid % CP;
    let kg = lid / CP;
    let hp = j * CP + cp;
    let live = 2u * cp < nh;
    let kc = (d + KG - 1u) / KG;
    let k0 = min(d, kg * kc);
    let k1 = select(k0, min(d, k0 + kc), live);
    // This thread's b1 pair (used by kg == 0 only; clamped where the chunk has no pair).
    var b1e = vec2<f32>(0.0, 0.0);
    if (EARLY_BIAS) {
        b1e = vec2<f32>(b1[min(2u * hp, p.ffn - 2u)], b1[min(2u * hp + 1u, p.ffn - 1u)]);
    }
    // (Sixteen: all of a slice for d up to 512, two thirds of small.en's 24.)
    let r0 = w1_word(k0, hp, k1);
    let r1 = w1_word(k0 + 1u, hp, k1);
    let r2 = w1_word(k0 + 2u, hp, k1);
    let r3 = w1_word(k0 + 3u, hp, k1);
    let r4 = w1_word(k0 + 4u, hp, k1);
    let r5 = w1_word(k0 + 5u, hp, k1);
    let r6 = w1_word(k0 + 6u, hp, k1);
    let r7 = w1_word(k0 + 7u, hp, k1);
    let r8 = w1_word(k0 + 8u, hp, k1);
    let r9 = w1_word(k0 + 9u, hp, k1);
    let r10 = w1_word(k0 + 10u, hp, k1);
    let r11 = w1_word(k0 + 11u, hp, k1);
    let r12 = w1_word(k0 + 12u, hp, k1);
    let r13 = w1_word(k0 + 13u, hp, k1);
    let r14 = w1_word(k0 + 14u, hp, k1);
    let r15 = w1_word(k0 + 15u, hp, k1);

    // The row's elements lid + 256 i (i < 5: d <= 1280) with their gamma and beta, all
    // loaded before any is used (a loop over them waited on each load in turn).
    let lastc = d - 1u;
    let xr = array<f32, 5>(
        x[xb + min(lid, lastc)],
        x[xb + min(lid + WG, lastc)],
        x[xb + min(lid + 2u * WG, lastc)],
        x[xb + min(lid + 3u * WG, lastc)],
        x[xb + min(lid + 4u * WG, lastc)],
    );
    let gr = array<f32, 5>(
        gamma[min(lid, lastc)],
        gamma[min(lid + WG, lastc)],
        gamma[min(lid + 2u * WG, lastc)],
        gamma[min(lid + 3u * WG, lastc)],
        gamma[min(lid + 4u * WG, lastc)],
    );
    let br = array<f32, 5>(
        beta[min(lid, lastc)],
        beta[min(lid + WG, lastc)],
        beta[min(lid + 2u * WG, lastc)],
        beta[min(lid + 3u * WG, lastc)],
        beta[min(lid + 4u * WG, lastc)],
    );
    var s = 0.0;
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            s += xr[i];
        }
    }
    let mean = wg_total(s, lid) / f32(d);
    var q = 0.0;
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            let e = xr[i] - mean;
            q += e * e;
        }
    }
    let inv = inverseSqrt(wg_total(q, lid) / f32(d) + p.eps);
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            xn[lid + i * WG] = (xr[i] - mean) * inv * gr[i] + br[i];
        }
    }
    workgroupBarrier();

    // fc1: this slice's part of the chunk's 16 hidden values (words past k1 are 0).
    var a = vec2<f32>(0.0, 0.0);
    var b = vec2<f32>(0.0, 0.0);
    a = fma(vec2<f32>(xn[min(k0, d - 1u)]), unpack2x16float(r0), a);
    b = fma(vec2<f32>(xn[min(k0 + 1u, d - 1u)]), unpack2x16float(r1), b);
    a = fma(vec2<f32>(xn[min(k0 + 2u, d - 1u)]), unpack2x16float(r2), a);
    b = fma(vec2<f32>(xn[min(k0 + 3u, d - 1u)]), unpack2x16float(r3), b);
    a = fma(vec2<f32>(xn[min(k0 + 4u, d - 1u)]), unpack2x16float(r4), a);
    b = fma(vec2<f32>(xn[min(k0 + 5u, d - 1u)]), unpack2x16float(r5), b);
    a = fma(vec2<f32>(xn[min(k0 + 6u, d - 1u)]), unpack2x16float(r6), a);
    b = fma(vec2<f32>(xn[min(k0 + 7u, d - 1u)]), unpack2x16float(r7), b);
    a = fma(vec2<f32>(xn[min(k0 + 8u, d - 1u)]), unpack2x16float(r8), a);
    b = fma(vec2<f32>(xn[min(k0 + 9u, d - 1u)]), unpack2x16float(r9), b);
    a = fma(vec2<f32>(xn[min(k0 + 10u, d - 1u)]), unpack2x16float(r10), a);
    b = fma(vec2<f32>(xn[min(k0 + 11u, d - 1u)]), unpack2x16float(r11), b);
    a = fma(vec2<f32>(xn[min(k0 + 12u, d - 1u)]), unpack2x16float(r12), a);
    b = fma(vec2<f32>(xn[min(k0 + 13u, d - 1u)]), unpack2x16float(r13), b);
    a = fma(vec2<f32>(xn[min(k0 + 14u, d - 1u)]), unpack2x16float(r14), a);
    b = fma(vec2<f32>(xn[min(k0 + 15u, d - 1u)]), unpack2x16float(r15), b);
    for (var k = k0 + 16u; k < k1; k += 8u) {
        let u0 = w1_word(k, hp, k1);
        let u1 = w1_word(k + 1u, hp, k1);
        let u2 = w1_word(k + 2u, hp, k1);
        let u3 = w1_word(k + 3u, hp, k1);
        let u4 = w1_word(k + 4u, hp, k1);
        let u5 = w1_word(k + 5u, hp, k1);
        let u6 = w1_word(k + 6u, hp, k1);
        let u7 = w1_word(k + 7u, hp, k1);
        a = fma(vec2<f32>(xn[min(k, d - 1u)]), unpack2x16float(u0), a);
        b = fma(vec2<f32>(xn[min(k + 1u, d - 1u)]), unpack2x16float(u1), b);
        a = fma(vec2<f32>(xn[min(k + 2u, d - 1u)]), unpack2x16float(u2), a);
        b = fma(vec2<f32>(xn[min(k + 3u, d - 1u)]), unpack2x16float(u3), b);
        a = fma(vec2<f32>(xn[min(k + 4u, d - 1u)]), unpack2x16float(u4), a);
        b = fma(vec2<f32>(xn[min(k + 5u, d - 1u)]), unpack2x16float(u5), b);
        a = fma(vec2<f32>(xn[min(k + 6u, d - 1u)]), unpack2x16float(u6), a);
        b = fma(vec2<f32>(xn[min(k + 7u, d - 1u)]), unpack2x16float(u7), b);
    }
    red[lid] = a + b;
    workgroupBarrier();
    // The 32 slices, four at a time (32 -> 8 -> 2), then the last two with the bias, GELU.
    for (var st = KG / 4u; st >= 2u; st = st / 4u) {
        if (kg < st) {
            red[lid] = red[lid] + red[lid + st * CP] + red[lid + 2u * st * CP] + red[lid + 3u * st * CP];
        }
        workgroupBarrier();
    }
    if (kg == 0u) {
        var h = vec2<f32>(0.0, 0.0);
        if (live) {
            let z = red[cp] + red[cp + CP];
            var bb = b1e;
            if (!EARLY_BIAS) {
                bb = vec2<f32>(b1[2u * hp], b1[2u * hp + 1u]);
            }
            h = vec2<f32>(gelu(z.x + bb.x), gelu(z.y + bb.y));
        }
        hs[2u * cp] = h.x;
        hs[2u * cp + 1u] = h.y;
    }
    workgroupBarrier();

    // fc2: the chunk's partial of every output pair, summed over its hidden units in order.
    for (var t = lid; t < dw; t += WG) {
        var u = v2a;
        if (t == lid + WG) {
            u = v2b;
        } else if (t > lid + WG) {
            u = fc2_words(h0, nh, t, dw);
        }
        var acc = vec2<f32>(0.0, 0.0);
        for (var c = 0u; c < CH; c++) {
            if (c < nh) {
                acc = fma(vec2<f32>(hs[c]), unpack2x16float(u[c]), acc);
            }
        }
        let o = (row * p.chunks + j) * d + 2u * t;
        part[o] = acc.x;
        part[o + 1u] = acc.y;
    }
}

// x[r][n] += sum over chunks of part[r][.][n] (in chunk order) + b2[n]. Workgroup (b, r)
// takes outputs 16 b .. 16 b + 16 of row r: thread (o, sl) = (lid % 16, lid / 16) adds
// chunks sl * per .. (sl + 1) * per, its loads issued sixteen at a time before any is added,
// and a fixed tree joins the 16 slices.
// Returns the output's new value in the threads that wrote one (sl == 0, n < d).
fn sum_chunks(wg: vec3<u32>, lid: u32) -> f32 {
    let row = wg.z;
    let d = p.d;
    let o = lid % 16u;
    let sl = lid / 16u;
    let n = min(wg.x * 16u + o, d - 1u);
    let per = (p.chunks + SLICES - 1u) / SLICES;
    let c0 = min(p.chunks, sl * per);
    let c1 = min(p.chunks, c0 + per);
    let at = row * p.chunks * d + n;
    var v = 0.0;
    for (var c = c0; c < c1; c += 16u) {
        let last = c1 - 1u;
        let u = array<f32, 16>(
            part[at + min(c, last) * d],
            part[at + min(c + 1u, last) * d],
            part[at + min(c + 2u, last) * d],
            part[at + min(c + 3u, last) * d],
            part[at + min(c + 4u, last) * d],
            part[at + min(c + 5u, last) * d],
            part[at + min(c + 6u, last) * d],
            part[at + min(c + 7u, last) * d],
            part[at + min(c + 8u, last) * d],
            part[at + min(c + 9u, last) * d],
            part[at + min(c + 10u, last) * d],
            part[at + min(c + 11u, last) * d],
            part[at + min(c + 12u, last) * d],
            part[at + min(c + 13u, last) * d],
            part[at + min(c + 14u, last) * d],
            part[at + min(c + 15u, last) * d],
        );
        for (var i = 0u; i < 16u; i++) {
            if (c + i < c1) {
                v += u[i];
            }
        }
    }
    sums[lid] = v;
    workgroupBarrier();
    // 16 slices -> 4 -> 1, four at a time.
    if (sl < 4u) {
        sums[lid] = sums[lid] + sums[lid + 64u] + sums[lid + 128u] + sums[lid + 192u];
    }
    workgroupBarrier();
    if (sl == 0u && wg.x * 16u + o < d) {
        let t = sums[lid] + sums[lid + 16u] + sums[lid + 32u] + sums[lid + 48u];
        let xi = p.x_off + row * p.x_stride + n;
        let v = x[xi] + (t + b2[n]);
        x[xi] = v;
        return v;
    }
    return 0.0;
}

@compute @workgroup_size(WG)
fn main_sum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    sum_chunks(wg, lid);
}

// Element i of the finished row, for row_stats.wgsl (main_sum_norm's last workgroup).
fn row_x(i: u32) -> f32 {
    return xn[i];
}

// main_sum_norm's last workgroup: element c of the finished row (its bits as loaded) into
// `xn`, and its normalised value out (layernorm.wgsl's expression), where c < d.
fn put_row(c: u32, d: u32, bits: u32) {
    if (c < d) {
        xn[c] = bitcast<f32>(bits);
    }
}

fn put_norm(yb: u32, c: u32, d: u32, st: vec2<f32>, g: f32, b: f32) {
    if (c < d) {
        xn_out[yb + c] = (xn[c] - st.x) * st.y * g + b;
    }
}

@compute @workgroup_size(WG)
fn main_sum_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.z;
    let d = p.d;
    let n = wg.x * 16u + lid % 16u;
    let v = sum_chunks(wg, lid);
    let copy = FIN_ROWS + row * d;
    if (lid / 16u == 0u && n < d) {
        atomicStore(&fin[copy + n], bitcast<u32>(v));
    }
    // storageBarrier is a device-scope acquire-release in SPIR-V: this workgroup's copy is
    // visible before its arrival is counted, and the last one reads the others' after it.
    storageBarrier();
    if (lid == 0u) {
        arrived_last = u32(atomicAdd(&fin[row], 1u) + 1u == (d + 15u) / 16u);
    }
    if (workgroupUniformLoad(&arrived_last) == 0u) {
        return;
    }
    storageBarrier();
    // The row's elements lid + WG i (i < 5: MAXD = 5 WG) and their gamma and beta, every
    // load issued before any is used (addresses clamped to the last element, the values of
    // elements past d never stored): a loop of loads waits on a round trip to L2 per
    // iteration, and gamma and beta would wait behind the statistics' trees.
    let last = d - 1u;
    let i0 = min(lid, last);
    let i1 = min(lid + WG, last);
    let i2 = min(lid + 2u * WG, last);
    let i3 = min(lid + 3u * WG, last);
    let i4 = min(lid + 4u * WG, last);
    let e0 = atomicLoad(&fin[copy + i0]);
    let e1 = atomicLoad(&fin[copy + i1]);
    let e2 = atomicLoad(&fin[copy + i2]);
    let e3 = atomicLoad(&fin[copy + i3]);
    let e4 = atomicLoad(&fin[copy + i4]);
    let fg0 = fin_gamma[i0];
    let fg1 = fin_gamma[i1];
    let fg2 = fin_gamma[i2];
    let fg3 = fin_gamma[i3];
    let fg4 = fin_gamma[i4];
    let fb0 = fin_beta[i0];
    let fb1 = fin_beta[i1];
    let fb2 = fin_beta[i2];
    let fb3 = fin_beta[i3];
    let fb4 = fin_beta[i4];
    // (Written out: a private array indexed in a loop can land in local memory.)
    put_row(lid, d, e0);
    put_row(lid + WG, d, e1);
    put_row(lid + 2u * WG, d, e2);
    put_row(lid + 3u * WG, d, e3);
    put_row(lid + 4u * WG, d, e4);
    workgroupBarrier();
    let st = row_stats(0u, d, p.fin_eps, lid);
    let yb = row * d;
    put_norm(yb, lid, d, st, fg0, fb0);
    put_norm(yb, lid + WG, d, st, fg1, fb1);
    put_norm(yb, lid + 2u * WG, d, st, fg2, fb2);
    put_norm(yb, lid + 3u * WG, d, st, fg3, fb3);
    put_norm(yb, lid + 4u * WG, d, st, fg4, fb4);
    if (lid == 0u) {
        atomicStore(&fin[row], 0u);
    }
}
