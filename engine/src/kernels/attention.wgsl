// Multi-head attention, softmax(q k^T * scale) v, for one (query, head) per workgroup.
//
// Keys are visited in chunks of 64 with an online softmax (running max m, running sum l,
// output rescaled when the max grows), so any number of keys fits in a fixed amount of
// workgroup memory: 1500 encoder frames, or a decoder KV cache of any length. Thread j of
// a chunk scores key j; thread c then owns output dimensions c and c + 64 (head_dim <= 128).
// Q, K and V are read through offsets and row strides so a fused QKV buffer [T][3d], a KV
// cache [T][d] or the fused cross-attention K|V [1500][2d] serve directly, without copies.
// causal != 0: query i sees keys j <= i + causal_offset (positions already in the cache).

// Params and bindings: attention_io.wgsl (prepended).

const WG: u32 = 64u;
const MAXD: u32 = 128u;
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, MAXD>;
var<workgroup> ps: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let qi = wg.x + wg.z * 32768u;
    let h = wg.y;
    if (qi >= p.tq) {
        return;
    }
    let d = p.d;
    let qb = p.q_off + qi * p.q_stride + h * d;
    for (var c = lid; c < d; c += WG) {
        qs[c] = q[qb + c] * p.scale;
    }
    var kmax = p.tk;
    if (p.causal != 0u) {
        kmax = min(p.tk, qi + p.causal_offset + 1u);
    }
    var m = NEG;
    var l = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    workgroupBarrier();
    for (var j0 = 0u; j0 < kmax; j0 += WG) {
        let j = j0 + lid;
        var s = NEG;
        if (j < kmax) {
            let kb = p.k_off + j * p.k_stride + h * d;
            var dot_ = 0.0;
            for (var c = 0u; c < d; c++) {
                dot_ = fma(qs[c], k[kb + c], dot_);
            }
            s = dot_;
        }
        red[lid] = s;
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st = st / 2u) {
            if (lid < st) {
                red[lid] = max(red[lid], red[lid + st]);
            }
            workgroupBarrier();
        }
        let mnew = max(m, red[0]);
        workgroupBarrier();
        var pj = 0.0;
        if (j < kmax) {
            pj = exp(s - mnew);
        }
        ps[lid] = pj;
        red[lid] = pj;
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st = st / 2u) {
            if (lid < st) {
                red[lid] += red[lid + st];
            }
            workgroupBarrier();
        }
        let corr = exp(m - mnew);
        l = l * corr + red[0];
        acc0 *= corr;
        acc1 *= corr;
        let cnt = min(WG, kmax - j0);
        for (var jj = 0u; jj < cnt; jj++) {
            let vb = p.v_off + (j0 + jj) * p.v_stride + h * d;
            let pw = ps[jj];
            if (lid < d) {
                acc0 = fma(pw, v[vb + lid], acc0);
            }
            if (lid + WG < d) {
                acc1 = fma(pw, v[vb + lid + WG], acc1);
            }
        }
        m = mnew;
        workgroupBarrier();
    }
    let ob = p.o_off + qi * p.o_stride + h * d;
    if (lid < d) {
        o[ob + lid] = acc0 / l;
    }
    if (lid + WG < d) {
        o[ob + lid + WG] = acc1 / l;
    }
}

// ---------------------------------------------------------------------------------------
// Tiled variant for many queries (the encoder's 1500, a long prefill; where its grid is
// small, tiny.en's encoder, Kernels::attention runs attention_blocked.wgsl instead, and
// VERBATIM_ATTENTION_TILED=1 sends that back here). A workgroup takes TQ
// queries of one head and SPLITS key splits: thread (query q, split s) keeps its own online
// softmax over keys s, s+SPLITS, ... of each staged chunk of CH keys (KPT of them), with q
// and its output accumulator in registers (16 vec4 each; head_dim <= 64, zero-padded), and
// the splits of a query are merged at the end through workgroup memory, halving each
// round. The splits exist for a big GPU: one thread per (query, head) gave 9000 threads
// for a whole encoder layer, ~2 warps per H200 multiprocessor, 5.2 ms per layer; 4 splits
// 665 us. K and V are staged once per chunk for all threads and read as broadcasts (all
// threads of a split read the same key). The kernel lab times other shapes by rewriting
// the constants (TSH = max(2 CH TD4, SPLITS / 2 TQ TD4): staging, then the merge, share it):
// on the H200 (1500 x 6 heads x 64) chunks of 32 keys were 8 % faster than 16, and 8 or 16
// splits (twice or four times the warps) no faster: not bound by parallelism.
// The unrolled vec4 code is written out: lavapipe caps any loop at 65535 iterations per
// invocation (DEVELOPERS.md), and private arrays indexed in loops can land in local memory.

const TQ: u32 = 32u;
const SPLITS: u32 = 4u;
const LOG_SPLITS: u32 = 2u;
const CH: u32 = 32u;
const KPT: u32 = 8u; // CH / SPLITS
const TD4: u32 = 16u;
const KV: u32 = 512u; // CH * TD4: where V starts in `tsh`
const TSH: u32 = 1024u;
const TWG: u32 = 128u; // TQ * SPLITS threads
const MLN: u32 = 64u; // SPLITS / 2 * TQ

// Keys [CH][TD4] then values while the keys are walked; the merge's accumulators
// [SPLITS / 2][TQ][TD4] after.
var<workgroup> tsh: array<vec4<f32>, TSH>;
var<workgroup> mrg_ml: array<vec2<f32>, MLN>; // [SPLITS / 2][TQ] (m, l)

fn kv4(is_k: bool, base: u32, c: u32, d4: u32) -> vec4<f32> {
    if (c >= d4) {
        return vec4<f32>(0.0);
    }
    let b = base + 4u * c;
    if (is_k) {
        return vec4<f32>(k[b], k[b + 1u], k[b + 2u], k[b + 3u]);
    }
    return vec4<f32>(v[b], v[b + 1u], v[b + 2u], v[b + 3u]);
}

fn load_q4(base: u32, c: u32, d4: u32) -> vec4<f32> {
    if (c >= d4) {
        return vec4<f32>(0.0);
    }
    let b = base + 4u * c;
    return vec4<f32>(q[b], q[b + 1u], q[b + 2u], q[b + 3u]) * p.scale;
}

@compute @workgroup_size(TWG)
fn main_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.y;
    let ql = lid % TQ;
    let split = lid / TQ;
    let q_first = wg.x * TQ;
    let qi = q_first + ql;
    let live = qi < p.tq;
    let d4 = p.d / 4u;
    let qb = p.q_off + min(qi, p.tq - 1u) * p.q_stride + h * p.d;
    let q0 = load_q4(qb, 0u, d4);
    let q1 = load_q4(qb, 1u, d4);
    let q2 = load_q4(qb, 2u, d4);
    let q3 = load_q4(qb, 3u, d4);
    let q4 = load_q4(qb, 4u, d4);
    let q5 = load_q4(qb, 5u, d4);
    let q6 = load_q4(qb, 6u, d4);
    let q7 = load_q4(qb, 7u, d4);
    let q8 = load_q4(qb, 8u, d4);
    let q9 = load_q4(qb, 9u, d4);
    let q10 = load_q4(qb, 10u, d4);
    let q11 = load_q4(qb, 11u, d4);
    let q12 = load_q4(qb, 12u, d4);
    let q13 = load_q4(qb, 13u, d4);
    let q14 = load_q4(qb, 14u, d4);
    let q15 = load_q4(qb, 15u, d4);
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    var a8 = vec4<f32>(0.0);
    var a9 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0);
    var a11 = vec4<f32>(0.0);
    var a12 = vec4<f32>(0.0);
    var a13 = vec4<f32>(0.0);
    var a14 = vec4<f32>(0.0);
    var a15 = vec4<f32>(0.0);
    // Keys this query may see, and (uniform) the keys any query of the workgroup may see.
    var kmax = p.tk;
    var kend = p.tk;
    if (p.causal != 0u) {
        kmax = min(p.tk, qi + p.causal_offset + 1u);
        kend = min(p.tk, min(q_first + TQ, p.tq) + p.causal_offset);
    }
    var m = NEG;
    var l = 0.0;
    for (var j0 = 0u; j0 < kend; j0 += CH) {
        let cnt = min(CH, kend - j0);
        for (var e = lid; e < CH * TD4; e += TQ * SPLITS) {
            let jj = e / TD4;
            let c = e % TD4;
            var kk = vec4<f32>(0.0);
            var vv = vec4<f32>(0.0);
            if (jj < cnt) {
                kk = kv4(true, p.k_off + (j0 + jj) * p.k_stride + h * p.d, c, d4);
                vv = kv4(false, p.v_off + (j0 + jj) * p.v_stride + h * p.d, c, d4);
            }
            tsh[e] = kk;
            tsh[KV + e] = vv;
        }
        workgroupBarrier();
        if (live) {
            var s: array<f32, KPT>;
            var cmax = NEG;
            for (var t = 0u; t < KPT; t++) {
                let jj = split + SPLITS * t;
                if (jj < cnt && j0 + jj < kmax) {
                    let kb = jj * TD4;
                    var acc = vec4<f32>(0.0);
                    acc = fma(q0, tsh[kb + 0u], acc);
                    acc = fma(q1, tsh[kb + 1u], acc);
                    acc = fma(q2, tsh[kb + 2u], acc);
                    acc = fma(q3, tsh[kb + 3u], acc);
                    acc = fma(q4, tsh[kb + 4u], acc);
                    acc = fma(q5, tsh[kb + 5u], acc);
                    acc = fma(q6, tsh[kb + 6u], acc);
                    acc = fma(q7, tsh[kb + 7u], acc);
                    acc = fma(q8, tsh[kb + 8u], acc);
                    acc = fma(q9, tsh[kb + 9u], acc);
                    acc = fma(q10, tsh[kb + 10u], acc);
                    acc = fma(q11, tsh[kb + 11u], acc);
                    acc = fma(q12, tsh[kb + 12u], acc);
                    acc = fma(q13, tsh[kb + 13u], acc);
                    acc = fma(q14, tsh[kb + 14u], acc);
                    acc = fma(q15, tsh[kb + 15u], acc);
                    let sc = acc.x + acc.y + acc.z + acc.w;
                    s[t] = sc;
                    cmax = max(cmax, sc);
                }
            }
            if (cmax > NEG) {
                let mnew = max(m, cmax);
                let corr = exp(max(m - mnew, -80.0));
                l *= corr;
                a0 *= corr;
                a1 *= corr;
                a2 *= corr;
                a3 *= corr;
                a4 *= corr;
                a5 *= corr;
                a6 *= corr;
                a7 *= corr;
                a8 *= corr;
                a9 *= corr;
                a10 *= corr;
                a11 *= corr;
                a12 *= corr;
                a13 *= corr;
                a14 *= corr;
                a15 *= corr;
                for (var t = 0u; t < KPT; t++) {
                    let jj = split + SPLITS * t;
                    if (jj < cnt && j0 + jj < kmax) {
                        let pj = exp(s[t] - mnew);
                        l += pj;
                        let vb = jj * TD4;
                        a0 = fma(vec4<f32>(pj), tsh[KV + vb + 0u], a0);
                        a1 = fma(vec4<f32>(pj), tsh[KV + vb + 1u], a1);
                        a2 = fma(vec4<f32>(pj), tsh[KV + vb + 2u], a2);
                        a3 = fma(vec4<f32>(pj), tsh[KV + vb + 3u], a3);
                        a4 = fma(vec4<f32>(pj), tsh[KV + vb + 4u], a4);
                        a5 = fma(vec4<f32>(pj), tsh[KV + vb + 5u], a5);
                        a6 = fma(vec4<f32>(pj), tsh[KV + vb + 6u], a6);
                        a7 = fma(vec4<f32>(pj), tsh[KV + vb + 7u], a7);
                        a8 = fma(vec4<f32>(pj), tsh[KV + vb + 8u], a8);
                        a9 = fma(vec4<f32>(pj), tsh[KV + vb + 9u], a9);
                        a10 = fma(vec4<f32>(pj), tsh[KV + vb + 10u], a10);
                        a11 = fma(vec4<f32>(pj), tsh[KV + vb + 11u], a11);
                        a12 = fma(vec4<f32>(pj), tsh[KV + vb + 12u], a12);
                        a13 = fma(vec4<f32>(pj), tsh[KV + vb + 13u], a13);
                        a14 = fma(vec4<f32>(pj), tsh[KV + vb + 14u], a14);
                        a15 = fma(vec4<f32>(pj), tsh[KV + vb + 15u], a15);
                    }
                }
                m = mnew;
            }
        }
        workgroupBarrier();
    }
    // Merge the splits of each query: the upper half hands over to the lower, SPLITS / 2,
    // then SPLITS / 4, ... (with 4: splits 2 and 3 to 0 and 1, then 1 to 0).
    for (var round = 0u; round < LOG_SPLITS; round++) {
        let half_ = SPLITS >> (round + 1u);
        if (split >= half_ && split < 2u * half_) {
            let slot = (split - half_) * TQ + ql;
            mrg_ml[slot] = vec2<f32>(m, l);
            tsh[slot * TD4 + 0u] = a0;
            tsh[slot * TD4 + 1u] = a1;
            tsh[slot * TD4 + 2u] = a2;
            tsh[slot * TD4 + 3u] = a3;
            tsh[slot * TD4 + 4u] = a4;
            tsh[slot * TD4 + 5u] = a5;
            tsh[slot * TD4 + 6u] = a6;
            tsh[slot * TD4 + 7u] = a7;
            tsh[slot * TD4 + 8u] = a8;
            tsh[slot * TD4 + 9u] = a9;
            tsh[slot * TD4 + 10u] = a10;
            tsh[slot * TD4 + 11u] = a11;
            tsh[slot * TD4 + 12u] = a12;
            tsh[slot * TD4 + 13u] = a13;
            tsh[slot * TD4 + 14u] = a14;
            tsh[slot * TD4 + 15u] = a15;
        }
        workgroupBarrier();
        if (split < half_) {
            let slot = split * TQ + ql;
            let o2 = mrg_ml[slot];
            let mnew = max(m, o2.x);
            let c_self = exp(max(m - mnew, -80.0));
            let c_other = exp(max(o2.x - mnew, -80.0));
            l = l * c_self + o2.y * c_other;
            a0 = a0 * c_self + tsh[slot * TD4 + 0u] * c_other;
            a1 = a1 * c_self + tsh[slot * TD4 + 1u] * c_other;
            a2 = a2 * c_self + tsh[slot * TD4 + 2u] * c_other;
            a3 = a3 * c_self + tsh[slot * TD4 + 3u] * c_other;
            a4 = a4 * c_self + tsh[slot * TD4 + 4u] * c_other;
            a5 = a5 * c_self + tsh[slot * TD4 + 5u] * c_other;
            a6 = a6 * c_self + tsh[slot * TD4 + 6u] * c_other;
            a7 = a7 * c_self + tsh[slot * TD4 + 7u] * c_other;
            a8 = a8 * c_self + tsh[slot * TD4 + 8u] * c_other;
            a9 = a9 * c_self + tsh[slot * TD4 + 9u] * c_other;
            a10 = a10 * c_self + tsh[slot * TD4 + 10u] * c_other;
            a11 = a11 * c_self + tsh[slot * TD4 + 11u] * c_other;
            a12 = a12 * c_self + tsh[slot * TD4 + 12u] * c_other;
            a13 = a13 * c_self + tsh[slot * TD4 + 13u] * c_other;
            a14 = a14 * c_self + tsh[slot * TD4 + 14u] * c_other;
            a15 = a15 * c_self + tsh[slot * TD4 + 15u] * c_other;
            m = mnew;
        }
        workgroupBarrier();
    }
    if (live && split == 0u) {
        let ob = p.o_off + qi * p.o_stride + h * p.d;
        let inv = 1.0 / l;
        if (0u < d4) { let r = a0 * inv; o[ob + 0u] = r.x; o[ob + 0u + 1u] = r.y; o[ob + 0u + 2u] = r.z; o[ob + 0u + 3u] = r.w; }
        if (1u < d4) { let r = a1 * inv; o[ob + 4u] = r.x; o[ob + 4u + 1u] = r.y; o[ob + 4u + 2u] = r.z; o[ob + 4u + 3u] = r.w; }
        if (2u < d4) { let r = a2 * inv; o[ob + 8u] = r.x; o[ob + 8u + 1u] = r.y; o[ob + 8u + 2u] = r.z; o[ob + 8u + 3u] = r.w; }
        if (3u < d4) { let r = a3 * inv; o[ob + 12u] = r.x; o[ob + 12u + 1u] = r.y; o[ob + 12u + 2u] = r.z; o[ob + 12u + 3u] = r.w; }
        if (4u < d4) { let r = a4 * inv; o[ob + 16u] = r.x; o[ob + 16u + 1u] = r.y; o[ob + 16u + 2u] = r.z; o[ob + 16u + 3u] = r.w; }
        if (5u < d4) { let r = a5 * inv; o[ob + 20u] = r.x; o[ob + 20u + 1u] = r.y; o[ob + 20u + 2u] = r.z; o[ob + 20u + 3u] = r.w; }
        if (6u < d4) { let r = a6 * inv; o[ob + 24u] = r.x; o[ob + 24u + 1u] = r.y; o[ob + 24u + 2u] = r.z; o[ob + 24u + 3u] = r.w; }
        if (7u < d4) { let r = a7 * inv; o[ob + 28u] = r.x; o[ob + 28u + 1u] = r.y; o[ob + 28u + 2u] = r.z; o[ob + 28u + 3u] = r.w; }
        if (8u < d4) { let r = a8 * inv; o[ob + 32u] = r.x; o[ob + 32u + 1u] = r.y; o[ob + 32u + 2u] = r.z; o[ob + 32u + 3u] = r.w; }
        if (9u < d4) { let r = a9 * inv; o[ob + 36u] = r.x; o[ob + 36u + 1u] = r.y; o[ob + 36u + 2u] = r.z; o[ob + 36u + 3u] = r.w; }
        if (10u < d4) { let r = a10 * inv; o[ob + 40u] = r.x; o[ob + 40u + 1u] = r.y; o[ob + 40u + 2u] = r.z; o[ob + 40u + 3u] = r.w; }
        if (11u < d4) { let r = a11 * inv; o[ob + 44u] = r.x; o[ob + 44u + 1u] = r.y; o[ob + 44u + 2u] = r.z; o[ob + 44u + 3u] = r.w; }
        if (12u < d4) { let r = a12 * inv; o[ob + 48u] = r.x; o[ob + 48u + 1u] = r.y; o[ob + 48u + 2u] = r.z; o[ob + 48u + 3u] = r.w; }
        if (13u < d4) { let r = a13 * inv; o[ob + 52u] = r.x; o[ob + 52u + 1u] = r.y; o[ob + 52u + 2u] = r.z; o[ob + 52u + 3u] = r.w; }
        if (14u < d4) { let r = a14 * inv; o[ob + 56u] = r.x; o[ob + 56u + 1u] = r.y; o[ob + 56u + 2u] = r.z; o[ob + 56u + 3u] = r.w; }
        if (15u < d4) { let r = a15 * inv; o[ob + 60u] = r.x; o[ob + 60u + 1u] = r.y; o[ob + 60u + 2u] = r.z; o[ob + 60u + 3u] = r.w; }
    }
}

// ---------------------------------------------------------------------------------------
// Decode variant for a few queries (a decoder step: self-attention over the cache,
// cross-attention over the window's 1500 frames), flash-decoding style, in two dispatches.
// `main_split`: one workgroup of 256 threads per (query, head, split of SK keys): each thread
// scores one key, one max and one sum reduction, then four groups of 64 threads sum
// p_j · v_j over every fourth key (a thread per output dimension: contiguous reads of v),
// and the split writes its unnormalised partial (m, l, acc[d]) to the buffer bound as `o`.
// `main_merge`: one workgroup of 64 per (query, head) rescales the splits' partials to their
// common maximum and writes the output; the partials are bound as `q`.
// One workgroup per (query, head) over all keys was 110 us per dispatch on the H200 (6
// workgroups for 6 heads); splitting the keys multiplies the workgroups in flight.
// `_split_keys` is SK; partial (qi, h, s) sits at ((qi * heads + h) * n_splits + s) * (d + 2).

const AW: u32 = 256u;

var<workgroup> sc: array<f32, 256>;
var<workgroup> red2: array<f32, 256>;
var<workgroup> part0: array<f32, 256>;
var<workgroup> part1: array<f32, 256>;
var<workgroup> kpart: array<f32, 1024>; // head_dim 64: [key][quarter] partial scores

// Dimensions c..c+3 of key row j (zero for a key past the split).
fn key4(j: u32, c: u32, ok: bool) -> vec4<f32> {
    if (!ok) {
        return vec4<f32>(0.0);
    }
    let b = p.k_off + j * p.k_stride + c;
    return vec4<f32>(k[b], k[b + 1u], k[b + 2u], k[b + 3u]);
}

// Values of this thread's keys g + 4 i, i = 4 r .. 4 r + 3 (zero past the split's n keys),
// in dimension lid % 64 (`vb` addresses key g's).
fn val4(vb: u32, vs4: u32, r: u32, g: u32, n: u32) -> vec4<f32> {
    let i = 4u * r;
    var a = vec4<f32>(0.0);
    if (g + 4u * i < n) {
        a.x = v[vb + i * vs4];
    }
    if (g + 4u * (i + 1u) < n) {
        a.y = v[vb + (i + 1u) * vs4];
    }
    if (g + 4u * (i + 2u) < n) {
        a.z = v[vb + (i + 2u) * vs4];
    }
    if (g + 4u * (i + 3u) < n) {
        a.w = v[vb + (i + 3u) * vs4];
    }
    return a;
}

// acc += p_j v_j for the four keys of `val4(.., r, ..)` that exist, in key order.
fn acc_pre(acc0: f32, vr: vec4<f32>, r: u32, g: u32, n: u32) -> f32 {
    let j = g + 16u * r;
    var acc = acc0;
    if (j < n) {
        acc = fma(sc[j], vr.x, acc);
    }
    if (j + 4u < n) {
        acc = fma(sc[j + 4u], vr.y, acc);
    }
    if (j + 8u < n) {
        acc = fma(sc[j + 8u], vr.z, acc);
    }
    if (j + 12u < n) {
        acc = fma(sc[j + 12u], vr.w, acc);
    }
    return acc;
}

// The keys a thread of the head_dim-64 split paths scores from (main_split, main_split_rows):
// thread (key kq = lid / 4 + 64 r, quarter lid % 4) holds dimensions 4 quarter + 16 i
// (i < 4) of key j_lo + kq as a{r}, b{r}, e{r}, f{r}, so that four neighbouring threads read
// 64 contiguous bytes of a key. One thread per key reading its own 64 floats made every
// load of a warp touch 32 cache lines (keys are a row stride apart): cross-attention over
// 1500 frames cost ~20 us a split in a decode step. All 16 loads are issued together,
// before q's barrier.
struct SplitKeys {
    a0: vec4<f32>, b0: vec4<f32>, e0: vec4<f32>, f0: vec4<f32>,
    a1: vec4<f32>, b1: vec4<f32>, e1: vec4<f32>, f1: vec4<f32>,
    a2: vec4<f32>, b2: vec4<f32>, e2: vec4<f32>, f2: vec4<f32>,
    a3: vec4<f32>, b3: vec4<f32>, e3: vec4<f32>, f3: vec4<f32>,
}

fn split_keys64(j_lo: u32, j_hi: u32, sk: u32, h: u32, lid: u32) -> SplitKeys {
    let part = lid % 4u;
    let kq = lid / 4u;
    let ok0 = kq < sk && j_lo + kq < j_hi;
    let ok1 = kq + 64u < sk && j_lo + kq + 64u < j_hi;
    let ok2 = kq + 128u < sk && j_lo + kq + 128u < j_hi;
    let ok3 = kq + 192u < sk && j_lo + kq + 192u < j_hi;
    let c0 = h * 64u + 4u * part;
    var r: SplitKeys;
    r.a0 = key4(j_lo + kq, c0, ok0);
    r.b0 = key4(j_lo + kq, c0 + 16u, ok0);
    r.e0 = key4(j_lo + kq, c0 + 32u, ok0);
    r.f0 = key4(j_lo + kq, c0 + 48u, ok0);
    r.a1 = key4(j_lo + kq + 64u, c0, ok1);
    r.b1 = key4(j_lo + kq + 64u, c0 + 16u, ok1);
    r.e1 = key4(j_lo + kq + 64u, c0 + 32u, ok1);
    r.f1 = key4(j_lo + kq + 64u, c0 + 48u, ok1);
    r.a2 = key4(j_lo + kq + 128u, c0, ok2);
    r.b2 = key4(j_lo + kq + 128u, c0 + 16u, ok2);
    r.e2 = key4(j_lo + kq + 128u, c0 + 32u, ok2);
    r.f2 = key4(j_lo + kq + 128u, c0 + 48u, ok2);
    r.a3 = key4(j_lo + kq + 192u, c0, ok3);
    r.b3 = key4(j_lo + kq + 192u, c0 + 16u, ok3);
    r.e3 = key4(j_lo + kq + 192u, c0 + 32u, ok3);
    r.f3 = key4(j_lo + kq + 192u, c0 + 48u, ok3);
    return r;
}

// The values too: thread (dimension lid % 64, group g = lid / 64) sums p v over keys g,
// g + 4, ... (as `attend` does), so it needs at most 64 values (`val4`'s rounds r < 16),
// loaded with the keys. Loaded after the softmax, they cost four more trips to memory
// (rounds of 16 keys) at the end of every split.
struct SplitVals {
    v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>,
    v4: vec4<f32>, v5: vec4<f32>, v6: vec4<f32>, v7: vec4<f32>,
    v8: vec4<f32>, v9: vec4<f32>, v10: vec4<f32>, v11: vec4<f32>,
    v12: vec4<f32>, v13: vec4<f32>, v14: vec4<f32>, v15: vec4<f32>,
}

fn split_vals64(j_lo: u32, n: u32, h: u32, lid: u32) -> SplitVals {
    let g = lid / 64u;
    let vb = p.v_off + (j_lo + g) * p.v_stride + h * 64u + lid % 64u;
    let vs4 = 4u * p.v_stride;
    var r: SplitVals;
    r.v0 = val4(vb, vs4, 0u, g, n);
    r.v1 = val4(vb, vs4, 1u, g, n);
    r.v2 = val4(vb, vs4, 2u, g, n);
    r.v3 = val4(vb, vs4, 3u, g, n);
    r.v4 = val4(vb, vs4, 4u, g, n);
    r.v5 = val4(vb, vs4, 5u, g, n);
    r.v6 = val4(vb, vs4, 6u, g, n);
    r.v7 = val4(vb, vs4, 7u, g, n);
    r.v8 = val4(vb, vs4, 8u, g, n);
    r.v9 = val4(vb, vs4, 9u, g, n);
    r.v10 = val4(vb, vs4, 10u, g, n);
    r.v11 = val4(vb, vs4, 11u, g, n);
    r.v12 = val4(vb, vs4, 12u, g, n);
    r.v13 = val4(vb, vs4, 13u, g, n);
    r.v14 = val4(vb, vs4, 14u, g, n);
    r.v15 = val4(vb, vs4, 15u, g, n);
    return r;
}

// Query rows of head_dim 64, scaled, for the head_dim-64 paths: [row][16] vec4s (main_split
// uses row 0, main_split_rows one per query of its group), read a vec4 at a time.
var<workgroup> qsr: array<vec4<f32>, 64>;

// Dimensions c..c+3 of the rows in qsr (c a multiple of 4).
fn qr4(c: u32) -> vec4<f32> {
    return qsr[c / 4u];
}

// Element i of qsr's rows (dimension i % 64 of row i / 64).
fn stage_q(i: u32, value: f32) {
    qsr[i / 4u][i % 4u] = value;
}

// One round's partial score: dimensions 4 part + 16 i (i < 4) of a key against query row
// `row` of `qsr`. main_split and main_split_rows both score through this one function, so a
// row scored in a group is scored as it is alone.
fn kdot_row(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, e: vec4<f32>, part: u32, row: u32) -> f32 {
    let qb = 64u * row + 4u * part;
    let t = fma(qr4(qb), a, fma(qr4(qb + 16u), b, fma(qr4(qb + 32u), c, qr4(qb + 48u) * e)));
    return t.x + t.y + t.z + t.w;
}

fn op2(a: f32, b: f32, is_max: bool) -> f32 {
    if (is_max) {
        return max(a, b);
    }
    return a + b;
}

// Max or sum of v over the 256 threads (every thread gets it). Two levels of the binary
// tree per barrier: (r[l] + r[l + 2s]) + (r[l + s] + r[l + 3s]) is exactly what the
// levels 2s and s compute, so the sums keep their bits with 4 barriers instead of 8.
fn reduce2(v: f32, lid: u32, is_max: bool) -> f32 {
    red2[lid] = v;
    workgroupBarrier();
    for (var st = AW / 4u; st > 0u; st = st / 4u) {
        if (lid < st) {
            red2[lid] = op2(op2(red2[lid], red2[lid + 2u * st], is_max), op2(red2[lid + st], red2[lid + 3u * st], is_max), is_max);
        }
        workgroupBarrier();
    }
    let r = red2[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main_split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let qi = wg.x;
    let h = wg.y;
    let split = wg.z;
    let d = p.d;
    let sk = p.split_keys;
    let n_splits = (p.tk + sk - 1u) / sk;
    var kmax = p.tk;
    if (p.causal != 0u) {
        kmax = min(kmax, qi + p.causal_offset + 1u);
    }
    let j_lo = split * sk;
    let j_hi = min(kmax, j_lo + sk);
    // Score key j_lo + lid (sk <= 256: one key per thread). The first 32 dimensions of the
    // key are loaded before q is staged (their latency overlaps the barrier) and the rest
    // 32 at a time: a loop that waits for each group of loads pays the latency per group.
    // The sums keep the order of the plain loop below (two vec4 accumulators per 8).
    let j = j_lo + lid;
    let valid = lid < sk && j < j_hi;
    if (d == 64u && sk <= AW) {
        // head_dim 64 (every Whisper): four threads per key (split_keys64), the values
        // loaded with the keys (split_vals64).
        let part = lid % 4u;
        let ks = split_keys64(j_lo, j_hi, sk, h, lid);
        let g = lid / 64u;
        let n = select(0u, j_hi - j_lo, j_hi > j_lo);
        let vs = split_vals64(j_lo, n, h, lid);
        let qb = p.q_off + qi * p.q_stride + h * d;
        if (lid < 64u) {
            stage_q(lid, q[qb + lid] * p.scale);
        }
        workgroupBarrier();
        // partial of (key kk, quarter) at kpart[4 kk + quarter] = kpart[256 r + lid]
        kpart[lid] = kdot_row(ks.a0, ks.b0, ks.e0, ks.f0, part, 0u);
        kpart[256u + lid] = kdot_row(ks.a1, ks.b1, ks.e1, ks.f1, part, 0u);
        kpart[512u + lid] = kdot_row(ks.a2, ks.b2, ks.e2, ks.f2, part, 0u);
        kpart[768u + lid] = kdot_row(ks.a3, ks.b3, ks.e3, ks.f3, part, 0u);
        workgroupBarrier();
        var s64 = NEG;
        if (valid) {
            s64 = kpart[4u * lid] + kpart[4u * lid + 1u] + kpart[4u * lid + 2u] + kpart[4u * lid + 3u];
        }
        let sm = split_softmax(s64, lid);
        // The same fmas in the same key order as `attend`'s rounds: the same bits.
        var acc = 0.0;
        acc = acc_pre(acc, vs.v0, 0u, g, n);
        acc = acc_pre(acc, vs.v1, 1u, g, n);
        acc = acc_pre(acc, vs.v2, 2u, g, n);
        acc = acc_pre(acc, vs.v3, 3u, g, n);
        acc = acc_pre(acc, vs.v4, 4u, g, n);
        acc = acc_pre(acc, vs.v5, 5u, g, n);
        acc = acc_pre(acc, vs.v6, 6u, g, n);
        acc = acc_pre(acc, vs.v7, 7u, g, n);
        acc = acc_pre(acc, vs.v8, 8u, g, n);
        acc = acc_pre(acc, vs.v9, 9u, g, n);
        acc = acc_pre(acc, vs.v10, 10u, g, n);
        acc = acc_pre(acc, vs.v11, 11u, g, n);
        acc = acc_pre(acc, vs.v12, 12u, g, n);
        acc = acc_pre(acc, vs.v13, 13u, g, n);
        acc = acc_pre(acc, vs.v14, 14u, g, n);
        acc = acc_pre(acc, vs.v15, 15u, g, n);
        split_write(acc, 0.0, sm.x, sm.y, qi, h, split, n_splits, lid);
        return;
    }
    let kb = select(0u, p.k_off + j * p.k_stride + h * d, valid);
    let pre = valid && d >= 32u;
    var k0 = vec4<f32>(0.0);
    var k1 = vec4<f32>(0.0);
    var k2 = vec4<f32>(0.0);
    var k3 = vec4<f32>(0.0);
    var k4 = vec4<f32>(0.0);
    var k5 = vec4<f32>(0.0);
    var k6 = vec4<f32>(0.0);
    var k7 = vec4<f32>(0.0);
    if (pre) {
        k0 = vec4<f32>(k[kb], k[kb + 1u], k[kb + 2u], k[kb + 3u]);
        k1 = vec4<f32>(k[kb + 4u], k[kb + 5u], k[kb + 6u], k[kb + 7u]);
        k2 = vec4<f32>(k[kb + 8u], k[kb + 9u], k[kb + 10u], k[kb + 11u]);
        k3 = vec4<f32>(k[kb + 12u], k[kb + 13u], k[kb + 14u], k[kb + 15u]);
        k4 = vec4<f32>(k[kb + 16u], k[kb + 17u], k[kb + 18u], k[kb + 19u]);
        k5 = vec4<f32>(k[kb + 20u], k[kb + 21u], k[kb + 22u], k[kb + 23u]);
        k6 = vec4<f32>(k[kb + 24u], k[kb + 25u], k[kb + 26u], k[kb + 27u]);
        k7 = vec4<f32>(k[kb + 28u], k[kb + 29u], k[kb + 30u], k[kb + 31u]);
    }
    let qb = p.q_off + qi * p.q_stride + h * d;
    for (var c = lid; c < d; c += AW) {
        qs[c] = q[qb + c] * p.scale;
    }
    workgroupBarrier();
    var s = NEG;
    if (valid) {
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        var c = 0u;
        if (pre) {
            loop {
                a = fma(vec4<f32>(qs[c], qs[c + 1u], qs[c + 2u], qs[c + 3u]), k0, a);
                b = fma(vec4<f32>(qs[c + 4u], qs[c + 5u], qs[c + 6u], qs[c + 7u]), k1, b);
                a = fma(vec4<f32>(qs[c + 8u], qs[c + 9u], qs[c + 10u], qs[c + 11u]), k2, a);
                b = fma(vec4<f32>(qs[c + 12u], qs[c + 13u], qs[c + 14u], qs[c + 15u]), k3, b);
                a = fma(vec4<f32>(qs[c + 16u], qs[c + 17u], qs[c + 18u], qs[c + 19u]), k4, a);
                b = fma(vec4<f32>(qs[c + 20u], qs[c + 21u], qs[c + 22u], qs[c + 23u]), k5, b);
                a = fma(vec4<f32>(qs[c + 24u], qs[c + 25u], qs[c + 26u], qs[c + 27u]), k6, a);
                b = fma(vec4<f32>(qs[c + 28u], qs[c + 29u], qs[c + 30u], qs[c + 31u]), k7, b);
                c += 32u;
                if (c + 32u > d) {
                    break;
                }
                let kc = kb + c;
                k0 = vec4<f32>(k[kc], k[kc + 1u], k[kc + 2u], k[kc + 3u]);
                k1 = vec4<f32>(k[kc + 4u], k[kc + 5u], k[kc + 6u], k[kc + 7u]);
                k2 = vec4<f32>(k[kc + 8u], k[kc + 9u], k[kc + 10u], k[kc + 11u]);
                k3 = vec4<f32>(k[kc + 12u], k[kc + 13u], k[kc + 14u], k[kc + 15u]);
                k4 = vec4<f32>(k[kc + 16u], k[kc + 17u], k[kc + 18u], k[kc + 19u]);
                k5 = vec4<f32>(k[kc + 20u], k[kc + 21u], k[kc + 22u], k[kc + 23u]);
                k6 = vec4<f32>(k[kc + 24u], k[kc + 25u], k[kc + 26u], k[kc + 27u]);
                k7 = vec4<f32>(k[kc + 28u], k[kc + 29u], k[kc + 30u], k[kc + 31u]);
            }
        }
        for (; c + 8u <= d; c += 8u) {
            let c0 = vec4<f32>(k[kb + c], k[kb + c + 1u], k[kb + c + 2u], k[kb + c + 3u]);
            let c1 = vec4<f32>(k[kb + c + 4u], k[kb + c + 5u], k[kb + c + 6u], k[kb + c + 7u]);
            a = fma(vec4<f32>(qs[c], qs[c + 1u], qs[c + 2u], qs[c + 3u]), c0, a);
            b = fma(vec4<f32>(qs[c + 4u], qs[c + 5u], qs[c + 6u], qs[c + 7u]), c1, b);
        }
        var dot_ = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
        for (; c < d; c++) {
            dot_ = fma(qs[c], k[kb + c], dot_);
        }
        s = dot_;
    }
    attend(s, qi, h, split, n_splits, j_lo, j_hi, lid);
}

// The rest of a split once thread lid holds its key's score s (NEG for none): softmax
// over the split, p · v, and the partial (or, with `direct`, the output).
// The split's softmax: thread lid's exp(s - max) into sc[lid]; returns (max, sum).
fn split_softmax(s: f32, lid: u32) -> vec2<f32> {
    let mx = reduce2(s, lid, true);
    var e = 0.0;
    if (s > NEG) {
        e = exp(s - mx);
    }
    sc[lid] = e;
    return vec2<f32>(mx, reduce2(e, lid, false));
}

fn attend(s: f32, qi: u32, h: u32, split: u32, n_splits: u32, j_lo: u32, j_hi: u32, lid: u32) {
    let d = p.d;
    let sm = split_softmax(s, lid);
    let cd = lid % 64u;
    let g = lid / 64u;
    var acc0 = 0.0;
    var acc1 = 0.0;
    let n = select(0u, j_hi - j_lo, j_hi > j_lo);
    // Sixteen, eight, then four keys per round with their loads issued together (a plain
    // loop waits for each v load in turn); the sums keep the key order, as the loop below.
    var jj = g;
    let vs4 = 4u * p.v_stride;
    for (; jj + 60u < n; jj += 64u) {
        let vb0 = p.v_off + (j_lo + jj) * p.v_stride + h * d + cd;
        if (cd < d) {
            let v0 = v[vb0 + 0u * vs4];
            let v1 = v[vb0 + 1u * vs4];
            let v2 = v[vb0 + 2u * vs4];
            let v3 = v[vb0 + 3u * vs4];
            let v4 = v[vb0 + 4u * vs4];
            let v5 = v[vb0 + 5u * vs4];
            let v6 = v[vb0 + 6u * vs4];
            let v7 = v[vb0 + 7u * vs4];
            let v8 = v[vb0 + 8u * vs4];
            let v9 = v[vb0 + 9u * vs4];
            let v10 = v[vb0 + 10u * vs4];
            let v11 = v[vb0 + 11u * vs4];
            let v12 = v[vb0 + 12u * vs4];
            let v13 = v[vb0 + 13u * vs4];
            let v14 = v[vb0 + 14u * vs4];
            let v15 = v[vb0 + 15u * vs4];
            acc0 = fma(sc[jj + 0u], v0, acc0);
            acc0 = fma(sc[jj + 4u], v1, acc0);
            acc0 = fma(sc[jj + 8u], v2, acc0);
            acc0 = fma(sc[jj + 12u], v3, acc0);
            acc0 = fma(sc[jj + 16u], v4, acc0);
            acc0 = fma(sc[jj + 20u], v5, acc0);
            acc0 = fma(sc[jj + 24u], v6, acc0);
            acc0 = fma(sc[jj + 28u], v7, acc0);
            acc0 = fma(sc[jj + 32u], v8, acc0);
            acc0 = fma(sc[jj + 36u], v9, acc0);
            acc0 = fma(sc[jj + 40u], v10, acc0);
            acc0 = fma(sc[jj + 44u], v11, acc0);
            acc0 = fma(sc[jj + 48u], v12, acc0);
            acc0 = fma(sc[jj + 52u], v13, acc0);
            acc0 = fma(sc[jj + 56u], v14, acc0);
            acc0 = fma(sc[jj + 60u], v15, acc0);
        }
        if (cd + 64u < d) {
            let v0 = v[vb0 + 0u * vs4 + 64u];
            let v1 = v[vb0 + 1u * vs4 + 64u];
            let v2 = v[vb0 + 2u * vs4 + 64u];
            let v3 = v[vb0 + 3u * vs4 + 64u];
            let v4 = v[vb0 + 4u * vs4 + 64u];
            let v5 = v[vb0 + 5u * vs4 + 64u];
            let v6 = v[vb0 + 6u * vs4 + 64u];
            let v7 = v[vb0 + 7u * vs4 + 64u];
            let v8 = v[vb0 + 8u * vs4 + 64u];
            let v9 = v[vb0 + 9u * vs4 + 64u];
            let v10 = v[vb0 + 10u * vs4 + 64u];
            let v11 = v[vb0 + 11u * vs4 + 64u];
            let v12 = v[vb0 + 12u * vs4 + 64u];
            let v13 = v[vb0 + 13u * vs4 + 64u];
            let v14 = v[vb0 + 14u * vs4 + 64u];
            let v15 = v[vb0 + 15u * vs4 + 64u];
            acc1 = fma(sc[jj + 0u], v0, acc1);
            acc1 = fma(sc[jj + 4u], v1, acc1);
            acc1 = fma(sc[jj + 8u], v2, acc1);
            acc1 = fma(sc[jj + 12u], v3, acc1);
            acc1 = fma(sc[jj + 16u], v4, acc1);
            acc1 = fma(sc[jj + 20u], v5, acc1);
            acc1 = fma(sc[jj + 24u], v6, acc1);
            acc1 = fma(sc[jj + 28u], v7, acc1);
            acc1 = fma(sc[jj + 32u], v8, acc1);
            acc1 = fma(sc[jj + 36u], v9, acc1);
            acc1 = fma(sc[jj + 40u], v10, acc1);
            acc1 = fma(sc[jj + 44u], v11, acc1);
            acc1 = fma(sc[jj + 48u], v12, acc1);
            acc1 = fma(sc[jj + 52u], v13, acc1);
            acc1 = fma(sc[jj + 56u], v14, acc1);
            acc1 = fma(sc[jj + 60u], v15, acc1);
        }
    }
    for (; jj + 28u < n; jj += 32u) {
        let vb0 = p.v_off + (j_lo + jj) * p.v_stride + h * d + cd;
        if (cd < d) {
            let v0 = v[vb0];
            let v1 = v[vb0 + vs4];
            let v2 = v[vb0 + 2u * vs4];
            let v3 = v[vb0 + 3u * vs4];
            let v4 = v[vb0 + 4u * vs4];
            let v5 = v[vb0 + 5u * vs4];
            let v6 = v[vb0 + 6u * vs4];
            let v7 = v[vb0 + 7u * vs4];
            acc0 = fma(sc[jj], v0, acc0);
            acc0 = fma(sc[jj + 4u], v1, acc0);
            acc0 = fma(sc[jj + 8u], v2, acc0);
            acc0 = fma(sc[jj + 12u], v3, acc0);
            acc0 = fma(sc[jj + 16u], v4, acc0);
            acc0 = fma(sc[jj + 20u], v5, acc0);
            acc0 = fma(sc[jj + 24u], v6, acc0);
            acc0 = fma(sc[jj + 28u], v7, acc0);
        }
        if (cd + 64u < d) {
            let v0 = v[vb0 + 64u];
            let v1 = v[vb0 + vs4 + 64u];
            let v2 = v[vb0 + 2u * vs4 + 64u];
            let v3 = v[vb0 + 3u * vs4 + 64u];
            let v4 = v[vb0 + 4u * vs4 + 64u];
            let v5 = v[vb0 + 5u * vs4 + 64u];
            let v6 = v[vb0 + 6u * vs4 + 64u];
            let v7 = v[vb0 + 7u * vs4 + 64u];
            acc1 = fma(sc[jj], v0, acc1);
            acc1 = fma(sc[jj + 4u], v1, acc1);
            acc1 = fma(sc[jj + 8u], v2, acc1);
            acc1 = fma(sc[jj + 12u], v3, acc1);
            acc1 = fma(sc[jj + 16u], v4, acc1);
            acc1 = fma(sc[jj + 20u], v5, acc1);
            acc1 = fma(sc[jj + 24u], v6, acc1);
            acc1 = fma(sc[jj + 28u], v7, acc1);
        }
    }
    for (; jj + 12u < n; jj += 16u) {
        let vb0 = p.v_off + (j_lo + jj) * p.v_stride + h * d;
        let p0 = sc[jj];
        let p1 = sc[jj + 4u];
        let p2 = sc[jj + 8u];
        let p3 = sc[jj + 12u];
        if (cd < d) {
            let v0 = v[vb0 + cd];
            let v1 = v[vb0 + vs4 + cd];
            let v2 = v[vb0 + 2u * vs4 + cd];
            let v3 = v[vb0 + 3u * vs4 + cd];
            acc0 = fma(p0, v0, acc0);
            acc0 = fma(p1, v1, acc0);
            acc0 = fma(p2, v2, acc0);
            acc0 = fma(p3, v3, acc0);
        }
        if (cd + 64u < d) {
            let v0 = v[vb0 + cd + 64u];
            let v1 = v[vb0 + vs4 + cd + 64u];
            let v2 = v[vb0 + 2u * vs4 + cd + 64u];
            let v3 = v[vb0 + 3u * vs4 + cd + 64u];
            acc1 = fma(p0, v0, acc1);
            acc1 = fma(p1, v1, acc1);
            acc1 = fma(p2, v2, acc1);
            acc1 = fma(p3, v3, acc1);
        }
    }
    for (; jj < n; jj += 4u) {
        let vb = p.v_off + (j_lo + jj) * p.v_stride + h * d;
        let pj = sc[jj];
        if (cd < d) {
            acc0 = fma(pj, v[vb + cd], acc0);
        }
        if (cd + 64u < d) {
            acc1 = fma(pj, v[vb + cd + 64u], acc1);
        }
    }
    split_write(acc0, acc1, sm.x, sm.y, qi, h, split, n_splits, lid);
}

// The split's output: the four groups' sums of p v (acc0: dimension lid % 64, acc1: + 64)
// added, then the normalised row (`direct`: one split) or the partial (max, sum, acc[d]).
fn split_write(acc0: f32, acc1: f32, mx: f32, total: f32, qi: u32, h: u32, split: u32, n_splits: u32, lid: u32) {
    let d = p.d;
    let cd = lid % 64u;
    part0[lid] = acc0;
    part1[lid] = acc1;
    workgroupBarrier();
    if (p.direct != 0u) {
        // One split: this is the whole softmax, normalise and write the output here.
        let ob = p.o_off + qi * p.o_stride + h * d;
        if (lid < 64u) {
            if (cd < d) {
                o[ob + cd] = (part0[cd] + part0[64u + cd] + part0[128u + cd] + part0[192u + cd]) / total;
            }
            if (cd + 64u < d) {
                o[ob + cd + 64u] = (part1[cd] + part1[64u + cd] + part1[128u + cd] + part1[192u + cd]) / total;
            }
        }
        return;
    }
    let pb = ((qi * p.heads + h) * n_splits + split) * (d + 2u);
    if (lid == 0u) {
        o[pb] = mx;
        o[pb + 1u] = total;
    }
    if (lid < 64u) {
        if (cd < d) {
            o[pb + 2u + cd] = part0[cd] + part0[64u + cd] + part0[128u + cd] + part0[192u + cd];
        }
        if (cd + 64u < d) {
            o[pb + 2u + cd + 64u] = part1[cd] + part1[64u + cd] + part1[128u + cd] + part1[192u + cd];
        }
    }
}

// `main_split_rows`: main_split's head_dim-64 path for RQ = 4 query rows at once (a verify
// pass's cross-attention: no mask, every row over the same keys), grid [ceil(tq / 4),
// heads, splits]. A verify pass of 16 rows ran main_split once per row, each reading the
// split's 64 KB of keys and values again (74 MB for tiny.en's 1500 frames, 6 heads):
// here they are read once per group of four. The rows ride in the four components of
// vec4s through the softmax, the reductions and p v, each component taking exactly the
// operations main_split's scalar takes (the same kdot_row, tree order, exp and fmas in key
// order), so every row's partial is bit for bit the one its query gets alone; rows past tq
// are not scored (a one-row pass cost 10-30 us more on the H100 while they were) and write
// nothing. Partials as main_split's, for main_merge or the merging GEMV.
const RQ: u32 = 4u;

var<workgroup> kpart4: array<vec4<f32>, 1024>; // kpart, a query row a component
var<workgroup> red4: array<vec4<f32>, 256>;
var<workgroup> sc4: array<vec4<f32>, 256>;
var<workgroup> part4: array<vec4<f32>, 256>;

fn op4(a: vec4<f32>, b: vec4<f32>, is_max: bool) -> vec4<f32> {
    if (is_max) {
        return max(a, b);
    }
    return a + b;
}

// reduce2 for four rows: the same tree, a row a component.
fn reduce4(v: vec4<f32>, lid: u32, is_max: bool) -> vec4<f32> {
    red4[lid] = v;
    workgroupBarrier();
    for (var st = AW / 4u; st > 0u; st = st / 4u) {
        if (lid < st) {
            red4[lid] = op4(op4(red4[lid], red4[lid + 2u * st], is_max), op4(red4[lid + st], red4[lid + 3u * st], is_max), is_max);
        }
        workgroupBarrier();
    }
    let r = red4[0];
    workgroupBarrier();
    return r;
}

// exp(s - mx) where a key was scored, as split_softmax takes it per row.
fn exp_scored(s: f32, mx: f32) -> f32 {
    if (s > NEG) {
        return exp(s - mx);
    }
    return 0.0;
}

// acc_pre for four rows: sc4 holds each key's p for the four rows.
fn acc_pre4(acc0: vec4<f32>, vr: vec4<f32>, r: u32, g: u32, n: u32) -> vec4<f32> {
    let j = g + 16u * r;
    var acc = acc0;
    if (j < n) {
        acc = fma(sc4[j], vec4<f32>(vr.x), acc);
    }
    if (j + 4u < n) {
        acc = fma(sc4[j + 4u], vec4<f32>(vr.y), acc);
    }
    if (j + 8u < n) {
        acc = fma(sc4[j + 8u], vec4<f32>(vr.z), acc);
    }
    if (j + 12u < n) {
        acc = fma(sc4[j + 12u], vec4<f32>(vr.w), acc);
    }
    return acc;
}

// Keys a quarter of the group's rows, scored by kdot_row for each row there is (a verify
// pass of one to three rows skips the rest: uniform branches around arithmetic only).
fn kdot4(a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, e: vec4<f32>, part: u32, rows: u32) -> vec4<f32> {
    var t = vec4<f32>(kdot_row(a, b, c, e, part, 0u), 0.0, 0.0, 0.0);
    if (rows > 1u) {
        t.y = kdot_row(a, b, c, e, part, 1u);
    }
    if (rows > 2u) {
        t.z = kdot_row(a, b, c, e, part, 2u);
    }
    if (rows > 3u) {
        t.w = kdot_row(a, b, c, e, part, 3u);
    }
    return t;
}

@compute @workgroup_size(256)
fn main_split_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let q0 = wg.x * RQ;
    let rows = min(RQ, p.tq - q0);
    let h = wg.y;
    let split = wg.z;
    let sk = p.split_keys;
    let n_splits = (p.tk + sk - 1u) / sk;
    let j_lo = split * sk;
    let j_hi = min(p.tk, j_lo + sk);
    let valid = lid < sk && j_lo + lid < j_hi;
    let part = lid % 4u;
    let ks = split_keys64(j_lo, j_hi, sk, h, lid);
    let g = lid / 64u;
    let n = select(0u, j_hi - j_lo, j_hi > j_lo);
    // The values are loaded with the keys on purpose: loaded after the softmax instead, the
    // kernel takes 96 registers, not 166, and two workgroups an SM, yet on an H100 it ran
    // slower at every pass length (tiny.en 57 -> 69 µs up to 12 rows, 81 -> 105 at 13-16;
    // RESULTS.md 2026-12-06): the load's round trip after the softmax costs more than the wave.
    let vs = split_vals64(j_lo, n, h, lid);
    // Row lid / 64's dimension lid % 64 (a zero query past tq).
    let qr = lid / 64u;
    var qv = 0.0;
    if (qr < rows) {
        qv = q[p.q_off + (q0 + qr) * p.q_stride + h * 64u + lid % 64u] * p.scale;
    }
    stage_q(lid, qv);
    workgroupBarrier();
    kpart4[lid] = kdot4(ks.a0, ks.b0, ks.e0, ks.f0, part, rows);
    kpart4[256u + lid] = kdot4(ks.a1, ks.b1, ks.e1, ks.f1, part, rows);
    kpart4[512u + lid] = kdot4(ks.a2, ks.b2, ks.e2, ks.f2, part, rows);
    kpart4[768u + lid] = kdot4(ks.a3, ks.b3, ks.e3, ks.f3, part, rows);
    workgroupBarrier();
    var s4 = vec4<f32>(NEG);
    if (valid) {
        s4 = kpart4[4u * lid] + kpart4[4u * lid + 1u] + kpart4[4u * lid + 2u] + kpart4[4u * lid + 3u];
    }
    let mx = reduce4(s4, lid, true);
    let e = vec4<f32>(exp_scored(s4.x, mx.x), exp_scored(s4.y, mx.y), exp_scored(s4.z, mx.z), exp_scored(s4.w, mx.w));
    sc4[lid] = e;
    let total = reduce4(e, lid, false);
    var acc = vec4<f32>(0.0);
    acc = acc_pre4(acc, vs.v0, 0u, g, n);
    acc = acc_pre4(acc, vs.v1, 1u, g, n);
    acc = acc_pre4(acc, vs.v2, 2u, g, n);
    acc = acc_pre4(acc, vs.v3, 3u, g, n);
    acc = acc_pre4(acc, vs.v4, 4u, g, n);
    acc = acc_pre4(acc, vs.v5, 5u, g, n);
    acc = acc_pre4(acc, vs.v6, 6u, g, n);
    acc = acc_pre4(acc, vs.v7, 7u, g, n);
    acc = acc_pre4(acc, vs.v8, 8u, g, n);
    acc = acc_pre4(acc, vs.v9, 9u, g, n);
    acc = acc_pre4(acc, vs.v10, 10u, g, n);
    acc = acc_pre4(acc, vs.v11, 11u, g, n);
    acc = acc_pre4(acc, vs.v12, 12u, g, n);
    acc = acc_pre4(acc, vs.v13, 13u, g, n);
    acc = acc_pre4(acc, vs.v14, 14u, g, n);
    acc = acc_pre4(acc, vs.v15, 15u, g, n);
    // split_write's partial for each row: (max, sum, the four groups' sums in order).
    part4[lid] = acc;
    workgroupBarrier();
    let cd = lid % 64u;
    if (qr < rows) {
        let pb = (((q0 + qr) * p.heads + h) * n_splits + split) * 66u;
        let sum = part4[cd][qr] + part4[64u + cd][qr] + part4[128u + cd][qr] + part4[192u + cd][qr];
        o[pb + 2u + cd] = sum;
        if (cd == 0u) {
            o[pb] = mx[qr];
            o[pb + 1u] = total[qr];
        }
    }
}

// Up to four splits (the encoder's attention_coop takes four): every split's m, l and this
// thread's values loaded at once (split indices clamped to the last: a copy of a split
// leaves the max as it is and is not added), then the loops' arithmetic below. The loops
// load the maxima, then the rest: two round trips. MERGE_ONE_TRIP = false (kernels/mod.rs,
// VERBATIM_MERGE_ONE_TRIP=0) keeps them, to compare; the same words.
const MERGE_ONE_TRIP: bool = true;

// One split (max m, sum ls, four values a of its sum of p v) into the merge's running sum
// and accumulator, where it is one (`on`) and holds keys.
fn merge_split4(on: bool, m: f32, ls: f32, a: vec4<f32>, mx: f32, l: ptr<function, f32>, acc: ptr<function, vec4<f32>>) {
    if (on && ls > 0.0) {
        let w = exp(m - mx);
        *l += ls * w;
        *acc = fma(a, vec4<f32>(w), *acc);
    }
}

// Split s's four values at offsets `cols` of its partial (from pb).
fn split_cols(pb: u32, cols: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(q[pb + cols.x], q[pb + cols.y], q[pb + cols.z], q[pb + cols.w]);
}

// The first `n` (up to four) of the splits whose partials start at `pb`, added in order,
// their loads issued together (a loop of single loads waits for each).
fn merge_four(pb: vec4<u32>, n: u32, cols: vec4<u32>, mx: f32, l: ptr<function, f32>, acc: ptr<function, vec4<f32>>) {
    let m = vec4<f32>(q[pb.x], q[pb.y], q[pb.z], q[pb.w]);
    let ls = vec4<f32>(q[pb.x + 1u], q[pb.y + 1u], q[pb.z + 1u], q[pb.w + 1u]);
    let a0 = split_cols(pb.x, cols);
    let a1 = split_cols(pb.y, cols);
    let a2 = split_cols(pb.z, cols);
    let a3 = split_cols(pb.w, cols);
    merge_split4(true, m.x, ls.x, a0, mx, l, acc);
    merge_split4(1u < n, m.y, ls.y, a1, mx, l, acc);
    merge_split4(2u < n, m.z, ls.z, a2, mx, l, acc);
    merge_split4(3u < n, m.w, ls.w, a3, mx, l, acc);
}

// The partials of one (query, head) from `base` (`n_splits` of `ps` floats: m, l, Σ p v)
// merged at the four offsets `cols` of each: Σ_s exp(m_s - max) (Σ p v)_s / Σ_s exp(m_s -
// max) l_s, the splits added in order (main_merge and main_merge_planes both take it).
fn merge_cols(base: u32, n_splits: u32, ps: u32, cols: vec4<u32>) -> vec4<f32> {
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    if (MERGE_ONE_TRIP && n_splits <= 4u) {
        let last = n_splits - 1u;
        let pb = vec4<u32>(base, base + min(1u, last) * ps, base + min(2u, last) * ps, base + min(3u, last) * ps);
        let mx = max(max(max(max(NEG, q[pb.x]), q[pb.y]), q[pb.z]), q[pb.w]);
        merge_four(pb, n_splits, cols, mx, &l, &acc);
        return acc / vec4<f32>(l);
    }
    // Four maxima per round, their loads issued together; max is exact in any order.
    var mx = NEG;
    var s = 0u;
    for (; s + 4u <= n_splits; s += 4u) {
        let m0 = q[base + s * ps];
        let m1 = q[base + (s + 1u) * ps];
        let m2 = q[base + (s + 2u) * ps];
        let m3 = q[base + (s + 3u) * ps];
        mx = max(max(max(max(mx, m0), m1), m2), m3);
    }
    for (; s < n_splits; s++) {
        mx = max(mx, q[base + s * ps]);
    }
    for (s = 0u; s + 4u <= n_splits; s += 4u) {
        merge_four(vec4<u32>(base + s * ps) + vec4<u32>(0u, ps, 2u * ps, 3u * ps), 4u, cols, mx, &l, &acc);
    }
    for (; s < n_splits; s++) {
        merge_four(vec4<u32>(base + s * ps), 1u, cols, mx, &l, &acc);
    }
    return acc / vec4<f32>(l);
}

// Query qi, head h merged over its splits: output dimensions lid and lid + 64 (lanes past d
// read dimension d - 1 and drop it).
fn merged(qi: u32, h: u32, lid: u32) -> vec2<f32> {
    let d = p.d;
    let n_splits = (p.tk + p.split_keys - 1u) / p.split_keys;
    let ps = d + 2u;
    let c0 = min(lid, d - 1u) + 2u;
    let c1 = min(lid + 64u, d - 1u) + 2u;
    return merge_cols((qi * p.heads + h) * n_splits * ps, n_splits, ps, vec4<u32>(c0, c1, c1, c1)).xy;
}

@compute @workgroup_size(64)
fn main_merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let qi = wg.x;
    let h = wg.y;
    let d = p.d;
    let r = merged(qi, h, lid);
    let ob = p.o_off + qi * p.o_stride + h * d;
    if (lid < d) {
        o[ob + lid] = r.x;
    }
    if (lid + 64u < d) {
        o[ob + lid + 64u] = r.y;
    }
}

// main_merge_planes' output: the GEMM planes.
@group(0) @binding(5) var<storage, read_write> o_planes: array<u32>;

// `main_merge_planes`: main_merge writing the output rows ([tq][heads d], head_dim 64) as
// the f16 hi/lo planes the next GEMM reads (split_f16.wgsl main_rows' layout: [2][rows_pad]
// [heads d], rows from tq to rows_pad zero), so the split between the attention and the out
// projection goes. A thread per four dimensions of a (row, head): 16 threads a pair, 16 pairs
// a workgroup of 256 (grid: ceil(rows_pad heads / 16)). A workgroup of 64 a pair (1504 x 6
// of them a tiny.en layer, the row through workgroup memory) took 12.1 us a tiny.en layer
// and 18.1 a small.en one; this 8.5 and 12.3 (H100, RESULTS 2026-12-07). Each dimension
// takes main_merge's arithmetic (merge_cols), so the words are main_merge's split as
// main_rows splits them.
@compute @workgroup_size(256)
fn main_merge_planes(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let pair = wg.x * 16u + lid / 16u;
    let qi = pair / p.heads;
    let h = pair % p.heads;
    if (qi >= p.rows_pad) {
        return;
    }
    let c = 4u * (lid % 16u);
    var r = vec4<f32>(0.0);
    if (qi < p.tq) {
        let n_splits = (p.tk + p.split_keys - 1u) / p.split_keys;
        let cols = vec4<u32>(2u + c, 3u + c, 4u + c, 5u + c);
        r = merge_cols((qi * p.heads + h) * n_splits * 66u, n_splits, 66u, cols);
    }
    let half_row = p.heads * 32u;
    let plane = p.rows_pad * half_row;
    let at = qi * half_row + h * 32u + c / 2u;
    let w0 = split_pair(r.x, r.y);
    let w1 = split_pair(r.z, r.w);
    o_planes[at] = w0.x;
    o_planes[at + 1u] = w1.x;
    o_planes[plane + at] = w0.y;
    o_planes[plane + at + 1u] = w1.y;
}
