// The decoder's feed-forward block for a few rows in one dispatch (a decode step's row, a
// verify pass's rows): x[r] += GELU(LayerNorm(x[r]) W1 + b1) W2 + b2, the residual updated
// in place. W1 is [d][ffn] and W2 [ffn][d], k-major with f16 pairs along N (F16Matrix).
//
// Why one kernel: as two GEMVs (fc1 with the LayerNorm and GELU folded in, then fc2
// accumulating) the hidden row crosses the grid once, and fc2's long K starves it: small.en's
// fc2 (K = 3072, N = 768) gets 48 workgroups of main_m1 each walking 3072 weight rows, 16 us
// a GEMV in the decode stream on the H200, 0.19 ms of a 0.88 ms step.
//
// Here workgroup j takes the hidden units [16 j, 16 j + 16): it normalises the row itself,
// computes its 16 hidden values (fc1's 16 columns, 8 column pairs x 32 K slices as main_m1,
// so each weight word is read once per pass), and multiplies them by W2's 16 rows into a
// partial of all d outputs. The partials are then summed in a fixed order with no
// dependence on which workgroup finishes when: the last of each group of 16 chunks to
// arrive (an atomic counter) sums the group's partials in chunk order, and the last group
// to arrive sums the groups' sums in group order, adds b2 and the residual, and writes the
// row. So a row's bits depend only on the row and the weights: a verify pass's rows equal
// single decode steps bit for bit, which keeps speculative output identical to greedy.
//
// Visibility between workgroups: partials and counters are atomics (they live in L2, never
// in an SM's incoherent L1), and storageBarrier() (a device-scope acquire-release in SPIR-V)
// orders a workgroup's partial stores before its counter increment and the last
// workgroup's loads after it. No workgroup waits for another (no spinning): the last to
// arrive does the next stage, so any schedule finishes. The counters are reset by the
// workgroup that consumed them, ready for the next dispatch; wgpu zeroes new buffers.
//
// Scratch layout (u32 words, `ffn_scratch_words` in mod.rs): counters [MAXROWS][CSTRIDE]
// (group g at g, the final one at CSTRIDE - 1), then partials [MAXROWS][chunks][d], then
// group sums [MAXROWS][groups][d].

struct Params {
    d: u32, ffn: u32, chunks: u32, groups: u32,
    x_off: u32, x_stride: u32, eps: f32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read> w1: array<u32>;
@group(0) @binding(3) var<storage, read> b1: array<f32>;
@group(0) @binding(4) var<storage, read> w2: array<u32>;
@group(0) @binding(5) var<storage, read> b2: array<f32>;
@group(0) @binding(6) var<storage, read> gamma: array<f32>;
@group(0) @binding(7) var<storage, read> beta: array<f32>;
@group(0) @binding(8) var<storage, read_write> sc: array<atomic<u32>>;

const WG: u32 = 256u;
const CP: u32 = 8u; // hidden column pairs a workgroup (FFN_CHUNK = 2 CP hidden units in mod.rs)
const CH: u32 = 16u; // hidden units a workgroup
const KG: u32 = 32u; // K slices of the fc1 part (CP x KG = WG)
const GROUP: u32 = 16u; // chunks a group sum covers (FFN_GROUP in mod.rs)
const MAXROWS: u32 = 8u;
const CSTRIDE: u32 = 64u; // counter words a row (FFN_COUNTERS in mod.rs)
const MAXD: u32 = 1280u; // d_model (FFN_MAX_D in mod.rs)

var<workgroup> xn: array<f32, MAXD>; // LayerNorm(row)
var<workgroup> tree: array<f32, WG>;
var<workgroup> red: array<vec2<f32>, WG>; // [KG][CP] fc1 slices
var<workgroup> hs: array<f32, CH>; // this chunk's hidden values
var<workgroup> group_last: u32;
var<workgroup> row_last: u32;

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

// sc[at + i * step] as floats summed in order for i < count, sixteen loads issued before
// any is added: the chain waits on one round trip to L2 per sixteen words, not per word (a
// loop of `v += atomicLoad(..)` issues each load after the previous add).
fn sum_words(at: u32, step: u32, count: u32) -> f32 {
    var v = 0.0;
    let last = count - 1u;
    for (var i0 = 0u; i0 < count; i0 += 16u) {
        let u = array<u32, 16>(
            atomicLoad(&sc[at + min(i0 + 0u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 1u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 2u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 3u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 4u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 5u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 6u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 7u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 8u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 9u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 10u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 11u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 12u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 13u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 14u, last) * step]),
            atomicLoad(&sc[at + min(i0 + 15u, last) * step]),
        );
        for (var i = 0u; i < 16u; i++) {
            if (i0 + i < count) {
                v += bitcast<f32>(u[i]);
            }
        }
    }
    return v;
}

// sum_words for the outputs lid + 256 i (i < 5: d <= 1280) of a row at `at`, each block of
// 256 outputs issued whole; the blocks past d are skipped (a uniform condition) and the
// outputs past d are d - 1's.
fn sum_outputs(at: u32, count: u32, lid: u32) -> array<f32, 5> {
    let d = p.d;
    let lastc = d - 1u;
    var s = array<f32, 5>(0.0, 0.0, 0.0, 0.0, 0.0);
    s[0] = sum_words(at + min(lid, lastc), d, count);
    if (d > WG) {
        s[1] = sum_words(at + min(lid + WG, lastc), d, count);
    }
    if (d > 2u * WG) {
        s[2] = sum_words(at + min(lid + 2u * WG, lastc), d, count);
    }
    if (d > 3u * WG) {
        s[3] = sum_words(at + min(lid + 3u * WG, lastc), d, count);
    }
    if (d > 4u * WG) {
        s[4] = sum_words(at + min(lid + 4u * WG, lastc), d, count);
    }
    return s;
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
    let pbase = MAXROWS * CSTRIDE;
    let gbase = pbase + MAXROWS * p.chunks * d;

    // fc2's words of this thread's first two output pairs depend on nothing: issued first.
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
            h = vec2<f32>(gelu(z.x + b1[2u * hp]), gelu(z.y + b1[2u * hp + 1u]));
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
        let o = pbase + (row * p.chunks + j) * d + 2u * t;
        atomicStore(&sc[o], bitcast<u32>(acc.x));
        atomicStore(&sc[o + 1u], bitcast<u32>(acc.y));
    }

    // The last of the group's chunks to arrive sums the group's partials.
    storageBarrier();
    let g = j / GROUP;
    let j0 = g * GROUP;
    let in_group = min(GROUP, p.chunks - j0);
    let counters = row * CSTRIDE;
    if (lid == 0u) {
        group_last = u32(atomicAdd(&sc[counters + g], 1u) + 1u == in_group);
    }
    if (workgroupUniformLoad(&group_last) == 0u) {
        return;
    }
    storageBarrier();
    let gsum = sum_outputs(pbase + (row * p.chunks + j0) * d, in_group, lid);
    for (var i = 0u; i < 5u; i++) {
        let n = lid + i * WG;
        if (n < d) {
            atomicStore(&sc[gbase + (row * p.groups + g) * d + n], bitcast<u32>(gsum[i]));
        }
    }
    if (lid == 0u) {
        atomicStore(&sc[counters + g], 0u);
    }
    // The last group to arrive finishes the row.
    storageBarrier();
    if (lid == 0u) {
        row_last = u32(atomicAdd(&sc[counters + CSTRIDE - 1u], 1u) + 1u == p.groups);
    }
    if (workgroupUniformLoad(&row_last) == 0u) {
        return;
    }
    storageBarrier();
    let rsum = sum_outputs(gbase + row * p.groups * d, p.groups, lid);
    for (var i = 0u; i < 5u; i++) {
        let n = lid + i * WG;
        if (n < d) {
            x[xb + n] = xr[i] + (rsum[i] + b2[n]);
        }
    }
    if (lid == 0u) {
        atomicStore(&sc[counters + CSTRIDE - 1u], 0u);
    }
}
