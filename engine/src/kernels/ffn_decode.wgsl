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
    rows: u32, // main_rows: the rows of the pass
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
const FIN_ROWS: u32 = 16u; // rows a dispatch takes (VERIFY_MAX_ROWS in mod.rs)

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

// The per-row arithmetic `main` and `main_rows` share (the latter calls it once per row
// component), so that a row computed in a group of four has the bits it has alone.
fn ln_mean(total: f32, d: u32) -> f32 {
    return total / f32(d);
}

fn ln_sq(q: f32, x: f32, mean: f32) -> f32 {
    let e = x - mean;
    return q + e * e;
}

fn ln_inv(total_sq: f32, d: u32) -> f32 {
    return inverseSqrt(total_sq / f32(d) + p.eps);
}

fn ln_val(x: f32, mean: f32, inv: f32, g: f32, b: f32) -> f32 {
    return (x - mean) * inv * g + b;
}

// Hidden unit u from fc1's sum z: GELU(z + b1[u]).
fn hidden(z: f32, u: u32) -> f32 {
    return gelu(z + b1[u]);
}

// fc1's word (k, column pair hp), 0 past the row's end.
fn w1_word(k: u32, hp: u32, k1: u32) -> u32 {
    if (k >= k1) {
        return 0u;
    }
    return w1[k * (p.ffn / 2u) + hp];
}

// fc1's first sixteen words of a thread's slice (k0 .. k0 + 16, 0 past k1), all issued
// before any is used. (Sixteen: all of a slice for d up to 512, two thirds of small.en's 24.)
fn fc1_words(k0: u32, hp: u32, k1: u32) -> array<u32, 16> {
    return array<u32, 16>(
        w1_word(k0, hp, k1),
        w1_word(k0 + 1u, hp, k1),
        w1_word(k0 + 2u, hp, k1),
        w1_word(k0 + 3u, hp, k1),
        w1_word(k0 + 4u, hp, k1),
        w1_word(k0 + 5u, hp, k1),
        w1_word(k0 + 6u, hp, k1),
        w1_word(k0 + 7u, hp, k1),
        w1_word(k0 + 8u, hp, k1),
        w1_word(k0 + 9u, hp, k1),
        w1_word(k0 + 10u, hp, k1),
        w1_word(k0 + 11u, hp, k1),
        w1_word(k0 + 12u, hp, k1),
        w1_word(k0 + 13u, hp, k1),
        w1_word(k0 + 14u, hp, k1),
        w1_word(k0 + 15u, hp, k1),
    );
}

// gamma and beta of elements lid + 256 i (i < 5: d <= 1280), clamped to the last.
fn gamma5(lid: u32, lastc: u32) -> array<f32, 5> {
    return array<f32, 5>(
        gamma[min(lid, lastc)],
        gamma[min(lid + WG, lastc)],
        gamma[min(lid + 2u * WG, lastc)],
        gamma[min(lid + 3u * WG, lastc)],
        gamma[min(lid + 4u * WG, lastc)],
    );
}

fn beta5(lid: u32, lastc: u32) -> array<f32, 5> {
    return array<f32, 5>(
        beta[min(lid, lastc)],
        beta[min(lid + WG, lastc)],
        beta[min(lid + 2u * WG, lastc)],
        beta[min(lid + 3u * WG, lastc)],
        beta[min(lid + 4u * WG, lastc)],
    );
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
    let v2a = fc2_words(h0, nh, min(lid, dw - 1u), dw);
    var v2b = v2a;
    if (dw > WG) {
        v2b = fc2_words(h0, nh, min(lid + WG, dw - 1u), dw);
    }
    // fc1's first words of this thread's slice (fc1_words), then the LayerNorm statistics.
    let cp = lid % CP;
    let kg = lid / CP;
    let hp = j * CP + cp;
    let live = 2u * cp < nh;
    let kc = (d + KG - 1u) / KG;
    let k0 = min(d, kg * kc);
    let k1 = select(k0, min(d, k0 + kc), live);
    let r = fc1_words(k0, hp, k1);

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
    let gr = gamma5(lid, lastc);
    let br = beta5(lid, lastc);
    var s = 0.0;
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            s += xr[i];
        }
    }
    let mean = ln_mean(wg_total(s, lid), d);
    var q = 0.0;
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            q = ln_sq(q, xr[i], mean);
        }
    }
    let inv = ln_inv(wg_total(q, lid), d);
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            xn[lid + i * WG] = ln_val(xr[i], mean, inv, gr[i], br[i]);
        }
    }
    workgroupBarrier();

    // fc1: this slice's part of the chunk's 16 hidden values (words past k1 are 0).
    var a = vec2<f32>(0.0, 0.0);
    var b = vec2<f32>(0.0, 0.0);
    a = fma(vec2<f32>(xn[min(k0, d - 1u)]), unpack2x16float(r[0u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 1u, d - 1u)]), unpack2x16float(r[1u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 2u, d - 1u)]), unpack2x16float(r[2u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 3u, d - 1u)]), unpack2x16float(r[3u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 4u, d - 1u)]), unpack2x16float(r[4u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 5u, d - 1u)]), unpack2x16float(r[5u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 6u, d - 1u)]), unpack2x16float(r[6u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 7u, d - 1u)]), unpack2x16float(r[7u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 8u, d - 1u)]), unpack2x16float(r[8u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 9u, d - 1u)]), unpack2x16float(r[9u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 10u, d - 1u)]), unpack2x16float(r[10u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 11u, d - 1u)]), unpack2x16float(r[11u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 12u, d - 1u)]), unpack2x16float(r[12u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 13u, d - 1u)]), unpack2x16float(r[13u]), b);
    a = fma(vec2<f32>(xn[min(k0 + 14u, d - 1u)]), unpack2x16float(r[14u]), a);
    b = fma(vec2<f32>(xn[min(k0 + 15u, d - 1u)]), unpack2x16float(r[15u]), b);
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
            h = vec2<f32>(hidden(z.x, 2u * hp), hidden(z.y, 2u * hp + 1u));
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

// `main_rows`: `main` for RQ = 4 rows of a verify pass a workgroup, grid [chunks, 1,
// ceil(m / 4)]. `main` takes a workgroup per (chunk, row), each reading the chunk's 24 KB of
// fc1 and fc2 words again (tiny.en: 37 MB for a 16-row pass from L2, 25 us in the
// per-kernel table against 10 for a step's row); here they are read once for four rows.
// The rows ride in the components of vec4s through the LayerNorm, fc1's slices and tree,
// the hidden values and fc2, each component taking the operations main's scalars take (the
// shared helpers, the same trees, fmas in the same order), so each row's partial has the
// bits it has alone. A group's rows past m repeat its last row and write nothing.
const RQ: u32 = 4u;

var<workgroup> xn4: array<vec4<f32>, MAXD>; // LayerNorm of the group's rows, a row a component
var<workgroup> tree4: array<vec4<f32>, WG>;
var<workgroup> red4x: array<vec4<f32>, WG>; // fc1 slices [KG][CP]: the pair's first column
var<workgroup> red4y: array<vec4<f32>, WG>; // and its second
var<workgroup> hs4: array<vec4<f32>, CH>;

// wg_total for four rows: the same tree, a row a component.
fn wg_total4(v: vec4<f32>, lid: u32) -> vec4<f32> {
    tree4[lid] = v;
    workgroupBarrier();
    for (var st = WG / 4u; st > 0u; st = st / 4u) {
        if (lid < st) {
            tree4[lid] = tree4[lid] + tree4[lid + st] + tree4[lid + 2u * st] + tree4[lid + 3u * st];
        }
        workgroupBarrier();
    }
    let t = tree4[0];
    workgroupBarrier();
    return t;
}

// Element c of the group's rows from the one at xb (rows past the group's `rows` repeat
// its last: every load issued, none behind a branch).
fn x4(xb: u32, c: u32, rows: u32) -> vec4<f32> {
    let last = rows - 1u;
    let st = p.x_stride;
    return vec4<f32>(x[xb + c], x[xb + min(1u, last) * st + c], x[xb + min(2u, last) * st + c], x[xb + min(3u, last) * st + c]);
}

// The group's elements c of fc1's pair sums: main's fma(vec2(xn[k]), w, a) per row.
fn fc1_pair(acc: mat2x4<f32>, k: u32, d: u32, w: vec2<f32>) -> mat2x4<f32> {
    let xk = xn4[min(k, d - 1u)];
    return mat2x4<f32>(fma(xk, vec4<f32>(w.x), acc[0]), fma(xk, vec4<f32>(w.y), acc[1]));
}

fn ln_val4(xv: vec4<f32>, mean: vec4<f32>, inv: vec4<f32>, g: f32, b: f32) -> vec4<f32> {
    return vec4<f32>(ln_val(xv.x, mean.x, inv.x, g, b), ln_val(xv.y, mean.y, inv.y, g, b), ln_val(xv.z, mean.z, inv.z, g, b), ln_val(xv.w, mean.w, inv.w, g, b));
}

fn ln_sq4(q: vec4<f32>, xv: vec4<f32>, mean: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(ln_sq(q.x, xv.x, mean.x), ln_sq(q.y, xv.y, mean.y), ln_sq(q.z, xv.z, mean.z), ln_sq(q.w, xv.w, mean.w));
}

fn hidden4(z: vec4<f32>, u: u32) -> vec4<f32> {
    return vec4<f32>(hidden(z.x, u), hidden(z.y, u), hidden(z.z, u), hidden(z.w, u));
}

@compute @workgroup_size(WG)
fn main_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let j = wg.x;
    let q0 = wg.z * RQ;
    let m = p.rows;
    let rows = min(RQ, m - q0);
    let d = p.d;
    let dw = d / 2u;
    let h0 = j * CH;
    let nh = min(CH, p.ffn - h0);
    let xb = p.x_off + q0 * p.x_stride;

    // As main: fc2's first words, fc1's, then the rows and the LayerNorm statistics.
    let v2a = fc2_words(h0, nh, min(lid, dw - 1u), dw);
    var v2b = v2a;
    if (dw > WG) {
        v2b = fc2_words(h0, nh, min(lid + WG, dw - 1u), dw);
    }
    let cp = lid % CP;
    let kg = lid / CP;
    let hp = j * CP + cp;
    let live = 2u * cp < nh;
    let kc = (d + KG - 1u) / KG;
    let k0 = min(d, kg * kc);
    let k1 = select(k0, min(d, k0 + kc), live);
    let r = fc1_words(k0, hp, k1);
    let lastc = d - 1u;
    let xr = array<vec4<f32>, 5>(
        x4(xb, min(lid, lastc), rows),
        x4(xb, min(lid + WG, lastc), rows),
        x4(xb, min(lid + 2u * WG, lastc), rows),
        x4(xb, min(lid + 3u * WG, lastc), rows),
        x4(xb, min(lid + 4u * WG, lastc), rows),
    );
    let gr = gamma5(lid, lastc);
    let br = beta5(lid, lastc);
    var s = vec4<f32>(0.0);
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            s += xr[i];
        }
    }
    let tot = wg_total4(s, lid);
    let mean = vec4<f32>(ln_mean(tot.x, d), ln_mean(tot.y, d), ln_mean(tot.z, d), ln_mean(tot.w, d));
    var q = vec4<f32>(0.0);
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            q = ln_sq4(q, xr[i], mean);
        }
    }
    let tq = wg_total4(q, lid);
    let inv = vec4<f32>(ln_inv(tq.x, d), ln_inv(tq.y, d), ln_inv(tq.z, d), ln_inv(tq.w, d));
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * WG < d) {
            xn4[lid + i * WG] = ln_val4(xr[i], mean, inv, gr[i], br[i]);
        }
    }
    workgroupBarrier();

    // fc1: main's a and b (words alternately), each a pair of columns x four rows.
    var aa = mat2x4<f32>(vec4<f32>(0.0), vec4<f32>(0.0));
    var ab = aa;
    aa = fc1_pair(aa, k0, d, unpack2x16float(r[0u]));
    ab = fc1_pair(ab, k0 + 1u, d, unpack2x16float(r[1u]));
    aa = fc1_pair(aa, k0 + 2u, d, unpack2x16float(r[2u]));
    ab = fc1_pair(ab, k0 + 3u, d, unpack2x16float(r[3u]));
    aa = fc1_pair(aa, k0 + 4u, d, unpack2x16float(r[4u]));
    ab = fc1_pair(ab, k0 + 5u, d, unpack2x16float(r[5u]));
    aa = fc1_pair(aa, k0 + 6u, d, unpack2x16float(r[6u]));
    ab = fc1_pair(ab, k0 + 7u, d, unpack2x16float(r[7u]));
    aa = fc1_pair(aa, k0 + 8u, d, unpack2x16float(r[8u]));
    ab = fc1_pair(ab, k0 + 9u, d, unpack2x16float(r[9u]));
    aa = fc1_pair(aa, k0 + 10u, d, unpack2x16float(r[10u]));
    ab = fc1_pair(ab, k0 + 11u, d, unpack2x16float(r[11u]));
    aa = fc1_pair(aa, k0 + 12u, d, unpack2x16float(r[12u]));
    ab = fc1_pair(ab, k0 + 13u, d, unpack2x16float(r[13u]));
    aa = fc1_pair(aa, k0 + 14u, d, unpack2x16float(r[14u]));
    ab = fc1_pair(ab, k0 + 15u, d, unpack2x16float(r[15u]));
    for (var k = k0 + 16u; k < k1; k += 8u) {
        // The eight words issued before any is used, as main's loop.
        let uw = array<u32, 8>(
            w1_word(k, hp, k1),
            w1_word(k + 1u, hp, k1),
            w1_word(k + 2u, hp, k1),
            w1_word(k + 3u, hp, k1),
            w1_word(k + 4u, hp, k1),
            w1_word(k + 5u, hp, k1),
            w1_word(k + 6u, hp, k1),
            w1_word(k + 7u, hp, k1),
        );
        aa = fc1_pair(aa, k, d, unpack2x16float(uw[0u]));
        ab = fc1_pair(ab, k + 1u, d, unpack2x16float(uw[1u]));
        aa = fc1_pair(aa, k + 2u, d, unpack2x16float(uw[2u]));
        ab = fc1_pair(ab, k + 3u, d, unpack2x16float(uw[3u]));
        aa = fc1_pair(aa, k + 4u, d, unpack2x16float(uw[4u]));
        ab = fc1_pair(ab, k + 5u, d, unpack2x16float(uw[5u]));
        aa = fc1_pair(aa, k + 6u, d, unpack2x16float(uw[6u]));
        ab = fc1_pair(ab, k + 7u, d, unpack2x16float(uw[7u]));
    }
    red4x[lid] = aa[0] + ab[0];
    red4y[lid] = aa[1] + ab[1];
    workgroupBarrier();
    for (var st = KG / 4u; st >= 2u; st = st / 4u) {
        if (kg < st) {
            red4x[lid] = red4x[lid] + red4x[lid + st * CP] + red4x[lid + 2u * st * CP] + red4x[lid + 3u * st * CP];
            red4y[lid] = red4y[lid] + red4y[lid + st * CP] + red4y[lid + 2u * st * CP] + red4y[lid + 3u * st * CP];
        }
        workgroupBarrier();
    }
    if (kg == 0u) {
        var hx = vec4<f32>(0.0);
        var hy = vec4<f32>(0.0);
        if (live) {
            hx = hidden4(red4x[cp] + red4x[cp + CP], 2u * hp);
            hy = hidden4(red4y[cp] + red4y[cp + CP], 2u * hp + 1u);
        }
        hs4[2u * cp] = hx;
        hs4[2u * cp + 1u] = hy;
    }
    workgroupBarrier();

    // fc2: each row's partial of every output pair, summed over the hidden units in order.
    for (var t = lid; t < dw; t += WG) {
        var w = v2a;
        if (t == lid + WG) {
            w = v2b;
        } else if (t > lid + WG) {
            w = fc2_words(h0, nh, t, dw);
        }
        var ax = vec4<f32>(0.0);
        var ay = vec4<f32>(0.0);
        for (var c = 0u; c < CH; c++) {
            if (c < nh) {
                let wc = unpack2x16float(w[c]);
                ax = fma(hs4[c], vec4<f32>(wc.x), ax);
                ay = fma(hs4[c], vec4<f32>(wc.y), ay);
            }
        }
        for (var i = 0u; i < rows; i++) {
            let o = ((q0 + i) * p.chunks + j) * d + 2u * t;
            part[o] = ax[i];
            part[o + 1u] = ay[i];
        }
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
