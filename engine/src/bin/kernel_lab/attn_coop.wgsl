// Encoder self-attention (head_dim 64) on cooperative matrices, operands loaded straight
// from the f16 hi/lo planes split_f16.wgsl's main_heads writes ([6][heads][t_pad][64]:
// q hi, q lo, k hi, k lo, v hi, v lo; q already scaled). Products are exact to f32 as in
// gemm_coop.wgsl: a·b = hi·hi + (hi·lo + lo·hi) 2^-12, the lo terms in their own
// accumulators.
//
// Workgroup (x, y = head * n_splits + split): 2 subgroups of 16 queries, keys
// [split * split_keys, +split_keys) in blocks of 64 with an online softmax. Per block a
// subgroup computes its 16x64 scores (tensor cores), stores them to workgroup memory,
// two lanes per query take the max, the probabilities (written as f16 hi/lo) and the sum,
// then P·V goes into fresh accumulators that are stored and added, rescaled, to the
// query's output held as scalars in the lanes' registers (cooperative matrices cannot be
// scaled row by row). Output: the partials [tq][heads][n_splits][66] = (m, l, Σ p v) of
// attention.wgsl's main_merge.

struct Params {
    tq: u32, tk: u32, heads: u32, t_pad: u32,
    split_keys: u32, n_splits: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> pl: array<f16>;
@group(0) @binding(2) var<storage, read_write> part: array<f32>;

const SS: u32 = 68u; // floats per score row
const PS: u32 = 72u; // halves per probability row
const NEG: f32 = -3.0e38;
const LO_SCALE: f32 = 4096.0;

// (2 subgroups, not 4: the H200 offers 48 KiB of workgroup memory through wgpu)
var<workgroup> s_hi: array<f32, 2176>; // [2 subgroups][16][SS]
var<workgroup> s_lo: array<f32, 2176>;
var<workgroup> p_hi: array<f16, 2304>; // [2 subgroups][16][PS]
var<workgroup> p_lo: array<f16, 2304>;

fn split_hi(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
}

// S (16 queries x 16 keys) += q (dims db..) · k^T; `kt` indexes k hi at (key, db); k lo is
// one plane on. k is key-major, so k^T's block is read column-major.
fn qk(sh: ptr<function, coop_mat16x16<f32, C>>, sl: ptr<function, coop_mat16x16<f32, C>>,
      qh: coop_mat16x16<f16, A>, ql: coop_mat16x16<f16, A>, kt: u32, plane: u32) {
    let kh = coopLoad<coop_mat16x16<f16, B>>(&pl[kt], 64u);
    let kl = coopLoad<coop_mat16x16<f16, B>>(&pl[kt + plane], 64u);
    *sh = coopMultiplyAdd(qh, kh, *sh);
    *sl = coopMultiplyAdd(qh, kl, *sl);
    *sl = coopMultiplyAdd(ql, kh, *sl);
}

// O (16 queries x dims) += P (16 keys) · V; `vt` indexes v hi at (key, dim).
fn pv(oh: ptr<function, coop_mat16x16<f32, C>>, ol: ptr<function, coop_mat16x16<f32, C>>,
      ah: coop_mat16x16<f16, A>, al: coop_mat16x16<f16, A>, vt: u32, plane: u32) {
    let vh = coopLoadT<coop_mat16x16<f16, B>>(&pl[vt], 64u);
    let vl = coopLoadT<coop_mat16x16<f16, B>>(&pl[vt + plane], 64u);
    *oh = coopMultiplyAdd(ah, vh, *oh);
    *ol = coopMultiplyAdd(ah, vl, *ol);
    *ol = coopMultiplyAdd(al, vh, *ol);
}

fn s_at(i: u32) -> f32 {
    return s_hi[i] + s_lo[i] * (1.0 / LO_SCALE);
}

fn s4(i: u32) -> vec4<f32> {
    return vec4<f32>(s_at(i), s_at(i + 1u), s_at(i + 2u), s_at(i + 3u));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let h = wg.y / p.n_splits;
    let split = wg.y % p.n_splits;
    let q0 = wg.x * 32u + sg * 16u;
    let plane = p.heads * p.t_pad * 64u;
    let hb = h * p.t_pad * 64u;
    let qb = hb + q0 * 64u;
    let qh0 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb], 64u);
    let qh1 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 16u], 64u);
    let qh2 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 32u], 64u);
    let qh3 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 48u], 64u);
    let ql0 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane + qb], 64u);
    let ql1 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane + qb + 16u], 64u);
    let ql2 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane + qb + 32u], 64u);
    let ql3 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane + qb + 48u], 64u);
    let kbase = 2u * plane + hb;
    let vbase = 4u * plane + hb;
    let j_begin = split * p.split_keys;
    let j_end = min(p.tk, j_begin + p.split_keys);
    let r = lane / 2u; // this lane's query row in the subgroup's 16
    let half_ = lane % 2u; // and which 32 of a block's 64 keys / 64 dims it takes
    let sb = sg * 16u * SS;
    let pb = sg * 16u * PS;
    let rb = sb + r * SS + half_ * 32u;
    let prow = pb + r * PS + half_ * 32u;
    var m = NEG;
    var l = 0.0;
    var o0 = vec4<f32>(0.0);
    var o1 = vec4<f32>(0.0);
    var o2 = vec4<f32>(0.0);
    var o3 = vec4<f32>(0.0);
    var o4 = vec4<f32>(0.0);
    var o5 = vec4<f32>(0.0);
    var o6 = vec4<f32>(0.0);
    var o7 = vec4<f32>(0.0);
    for (var j0 = j_begin; j0 < j_end; j0 += 64u) {
        // Scores of the block, 16 keys at a time.
        for (var t = 0u; t < 64u; t += 16u) {
            var sh = coop_mat16x16<f32, C>();
            var sl = coop_mat16x16<f32, C>();
            let kt = kbase + (j0 + t) * 64u;
            qk(&sh, &sl, qh0, ql0, kt, plane);
            qk(&sh, &sl, qh1, ql1, kt + 16u, plane);
            qk(&sh, &sl, qh2, ql2, kt + 32u, plane);
            qk(&sh, &sl, qh3, ql3, kt + 48u, plane);
            coopStoreT(sh, &s_hi[sb + t], SS);
            coopStoreT(sl, &s_lo[sb + t], SS);
        }
        workgroupBarrier();
        // Softmax over the block: this lane's 32 keys, its partner lane's other 32.
        let jb = j0 + half_ * 32u;
        var bm = NEG;
        for (var c = 0u; c < 32u; c++) {
            if (jb + c < j_end) {
                bm = max(bm, s_at(rb + c));
            }
        }
        bm = max(bm, subgroupShuffleXor(bm, 1u));
        let mn = max(m, bm);
        let alpha = exp(m - mn);
        m = mn;
        var ps = 0.0;
        for (var c = 0u; c < 32u; c++) {
            var pr = 0.0;
            if (jb + c < j_end) {
                pr = exp(s_at(rb + c) - mn);
            }
            ps += pr;
            let ph = split_hi(pr);
            p_hi[prow + c] = f16(ph);
            p_lo[prow + c] = f16((pr - ph) * LO_SCALE);
        }
        l = l * alpha + ps;
        workgroupBarrier();
        // P · V into fresh accumulators, 16 keys at a time.
        var oh0 = coop_mat16x16<f32, C>();
        var oh1 = coop_mat16x16<f32, C>();
        var oh2 = coop_mat16x16<f32, C>();
        var oh3 = coop_mat16x16<f32, C>();
        var ol0 = coop_mat16x16<f32, C>();
        var ol1 = coop_mat16x16<f32, C>();
        var ol2 = coop_mat16x16<f32, C>();
        var ol3 = coop_mat16x16<f32, C>();
        for (var t = 0u; t < 64u; t += 16u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&p_hi[pb + t], PS);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&p_lo[pb + t], PS);
            let vt = vbase + (j0 + t) * 64u;
            pv(&oh0, &ol0, ah, al, vt, plane);
            pv(&oh1, &ol1, ah, al, vt + 16u, plane);
            pv(&oh2, &ol2, ah, al, vt + 32u, plane);
            pv(&oh3, &ol3, ah, al, vt + 48u, plane);
        }
        // Through the score rows (all read above) into the lanes' running output.
        coopStoreT(oh0, &s_hi[sb], SS);
        coopStoreT(oh1, &s_hi[sb + 16u], SS);
        coopStoreT(oh2, &s_hi[sb + 32u], SS);
        coopStoreT(oh3, &s_hi[sb + 48u], SS);
        coopStoreT(ol0, &s_lo[sb], SS);
        coopStoreT(ol1, &s_lo[sb + 16u], SS);
        coopStoreT(ol2, &s_lo[sb + 32u], SS);
        coopStoreT(ol3, &s_lo[sb + 48u], SS);
        workgroupBarrier();
        o0 = fma(o0, vec4<f32>(alpha), s4(rb));
        o1 = fma(o1, vec4<f32>(alpha), s4(rb + 4u));
        o2 = fma(o2, vec4<f32>(alpha), s4(rb + 8u));
        o3 = fma(o3, vec4<f32>(alpha), s4(rb + 12u));
        o4 = fma(o4, vec4<f32>(alpha), s4(rb + 16u));
        o5 = fma(o5, vec4<f32>(alpha), s4(rb + 20u));
        o6 = fma(o6, vec4<f32>(alpha), s4(rb + 24u));
        o7 = fma(o7, vec4<f32>(alpha), s4(rb + 28u));
        workgroupBarrier();
    }
    let lt = l + subgroupShuffleXor(l, 1u);
    let qi = q0 + r;
    if (qi < p.tq) {
        let b = ((qi * p.heads + h) * p.n_splits + split) * 66u;
        if (half_ == 0u) {
            part[b] = m;
            part[b + 1u] = lt;
        }
        let ob = b + 2u + half_ * 32u;
        part[ob] = o0.x; part[ob + 1u] = o0.y; part[ob + 2u] = o0.z; part[ob + 3u] = o0.w;
        part[ob + 4u] = o1.x; part[ob + 5u] = o1.y; part[ob + 6u] = o1.z; part[ob + 7u] = o1.w;
        part[ob + 8u] = o2.x; part[ob + 9u] = o2.y; part[ob + 10u] = o2.z; part[ob + 11u] = o2.w;
        part[ob + 12u] = o3.x; part[ob + 13u] = o3.y; part[ob + 14u] = o3.z; part[ob + 15u] = o3.w;
        part[ob + 16u] = o4.x; part[ob + 17u] = o4.y; part[ob + 18u] = o4.z; part[ob + 19u] = o4.w;
        part[ob + 20u] = o5.x; part[ob + 21u] = o5.y; part[ob + 22u] = o5.z; part[ob + 23u] = o5.w;
        part[ob + 24u] = o6.x; part[ob + 25u] = o6.y; part[ob + 26u] = o6.z; part[ob + 27u] = o6.w;
        part[ob + 28u] = o7.x; part[ob + 29u] = o7.y; part[ob + 30u] = o7.z; part[ob + 31u] = o7.w;
    }
}
