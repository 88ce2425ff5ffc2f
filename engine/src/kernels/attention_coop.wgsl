// The encoder's self-attention (head_dim 64, no mask) on cooperative matrices (tensor
// cores), where the device has them. Q, K and V come as the f16 hi/lo head planes that
// split_f16.wgsl's main_heads writes ([6][heads][t_pad][64]: q hi, q lo, k hi, k lo, v hi,
// v lo; q already scaled); products exact to f32 as in gemm_coop.wgsl (hi·hi and hi·lo +
// lo·hi in separate accumulators, joined as hi + lo / LO_SCALE on the matrices themselves
// before they are stored, so one f32 tile carries them). A workgroup takes QW = 16 NSG
// queries of one head (NSG = 4 subgroups of 16) and one key split, walks its keys in blocks
// of 32 with an online softmax, and writes the partial (m, l, Σ p v) that attention.wgsl's
// main_merge reads (as attention_blocked.wgsl's splits do). Scores go through workgroup
// memory (a cooperative matrix cannot be read element by element): two lanes per query read
// their 16 scores of the block once into four vec4 registers, take the block's max, write P
// as f16 hi/lo four at a time and keep the running output in registers, adding each block's
// P·V (stored from fresh accumulators) rescaled. (Reading the scores twice from workgroup
// memory, once for the max and once for the exponentials, cost 290 against 203 us a layer
// in the lab.)
//
// K and V are staged in workgroup memory as vec4<f16> words, the way gemm_planes.wgsl feeds
// the encoder GEMMs: kernel lab (H200, tiny.en layer, 4 key splits) 290 us against 525 with
// the fragments loaded straight from memory (the lab's former attn_coop.wgsl, in history at
// 02b980c) and 345 for the CUDA-core attention_blocked.wgsl. Blocks of 32 keys. Four
// subgroups share one staging of K|V (18 KiB) and each keeps a 16 x 36 f32 score tile (the
// block's P·V leaves through it in two rounds of 32 dims) and its P tile: 37 KiB. Workgroup
// memory is what limits how many workgroups an SM holds (DEVELOPERS.md): with the hi and lo
// scores in tiles of their own this was 46 KiB. H200, engine, per tiny.en layer: 131 us
// (146 at 46 KiB; 139 for 4 x 64, one round through a 45 KiB tile set) against 218 with 2
// subgroups and one 64-dim round; small.en 238 (261 at 46 KiB) against 428.
// `attention_coop_source` builds the other shapes (2 x 64, 2 x 32, 4 x 64) for the tests
// and `VERBATIM_ATTENTION_COOP_SHAPE`.
//
// Per block: [S = Q K^T, stored] (1) [softmax, P stored] (2) [P V, stored] (3) [lanes add
// the block to their output; the next block's K|V staged] (4). `main_held` (below, off by
// default until timed: kernels/mod.rs attention_coop_held) keeps P·V's accumulators over
// the whole split and has two barriers a block.

struct Params {
    tq: u32, tk: u32, heads: u32, t_pad: u32,
    split_keys: u32, n_splits: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> pl: array<vec4<f16>>; // [6][heads][t_pad][16]
@group(0) @binding(2) var<storage, read_write> part: array<f32>;

const NSG: u32 = 4u; // subgroups of 16 queries per workgroup (the workgroup is 32 NSG threads)
const QW: u32 = 16u * NSG; // queries per workgroup (kernels/mod.rs ATTENTION_COOP_QUERIES)
const OD: u32 = 32u; // output dims per P·V store round: 64 (one round) or 32 (two)
const SS: u32 = OD + 4u; // floats per score / output row (a block's 32 scores fit either way)
const PS: u32 = 40u; // halves per probability row
const KS: u32 = 18u; // vec4 per staged key row (16 + 2)
const BK: u32 = 32u; // keys per block
const NEG: f32 = -3.0e38;
const LO_SCALE: f32 = 4096.0;

var<workgroup> kv: array<vec4<f16>, 2304>; // [4: k hi, k lo, v hi, v lo][32 keys][KS]
var<workgroup> scores: array<f32, NSG * 16u * SS>; // [NSG subgroups][16][SS]
var<workgroup> p_hi: array<f16, NSG * 16u * PS>; // [NSG subgroups][16][PS]
var<workgroup> p_lo: array<f16, NSG * 16u * PS>;

fn split_hi(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
}

// Keys j0..j0+31 of head h (k hi, k lo, v hi, v lo) into `kv`: 2048 words, 2048 / (32 NSG)
// a thread.
fn stage(j0: u32, hb4: u32, plane4: u32, lid: u32) {
    for (var i = 0u; i < 64u / NSG; i++) {
        let e = lid + 32u * NSG * i; // [which 4][key 32][16 words]
        let which = e / 512u;
        let key = (e / 16u) % 32u;
        let w = e % 16u;
        kv[(which * 32u + key) * KS + w] = pl[(2u + which) * plane4 + hb4 + (j0 + key) * 16u + w];
    }
}

fn s4(i: u32) -> vec4<f32> {
    return vec4<f32>(scores[i], scores[i + 1u], scores[i + 2u], scores[i + 3u]);
}

// A 16x16 block of products as one f32 matrix: hi + lo / LO_SCALE, the arithmetic a lane
// would do on the two stored tiles.
fn joined(hi: coop_mat16x16<f32, C>, lo: coop_mat16x16<f32, C>) -> coop_mat16x16<f32, C> {
    return hi + lo * (1.0 / LO_SCALE);
}

// S (16 queries x 16 keys from key t of the block) += q (dims 16 d..) · k^T.
fn qk(sh: ptr<function, coop_mat16x16<f32, C>>, sl: ptr<function, coop_mat16x16<f32, C>>,
      qh: coop_mat16x16<f16, A>, ql: coop_mat16x16<f16, A>, t: u32, d: u32) {
    let kh = coopLoad<coop_mat16x16<f16, B>>(&kv[t * KS + 4u * d], KS);
    let kl = coopLoad<coop_mat16x16<f16, B>>(&kv[(32u + t) * KS + 4u * d], KS);
    *sh = coopMultiplyAdd(qh, kh, *sh);
    *sl = coopMultiplyAdd(qh, kl, *sl);
    *sl = coopMultiplyAdd(ql, kh, *sl);
}

// O (16 queries x 16 dims from 16 dt) += P (keys t..t+15 of the block) · V.
fn pv(oh: ptr<function, coop_mat16x16<f32, C>>, ol: ptr<function, coop_mat16x16<f32, C>>,
      ah: coop_mat16x16<f16, A>, al: coop_mat16x16<f16, A>, t: u32, dt: u32) {
    let vh = coopLoadT<coop_mat16x16<f16, B>>(&kv[(64u + t) * KS + 4u * dt], KS);
    let vl = coopLoadT<coop_mat16x16<f16, B>>(&kv[(96u + t) * KS + 4u * dt], KS);
    *oh = coopMultiplyAdd(ah, vh, *oh);
    *ol = coopMultiplyAdd(ah, vl, *ol);
    *ol = coopMultiplyAdd(al, vh, *ol);
}

// Four probabilities into the subgroup's P tile as f16 hi/lo.
fn put_p4(e: vec4<f32>, i: u32) {
    let h = vec4<f32>(split_hi(e.x), split_hi(e.y), split_hi(e.z), split_hi(e.w));
    let lo = (e - h) * LO_SCALE;
    p_hi[i] = f16(h.x); p_hi[i + 1u] = f16(h.y); p_hi[i + 2u] = f16(h.z); p_hi[i + 3u] = f16(h.w);
    p_lo[i] = f16(lo.x); p_lo[i + 1u] = f16(lo.y); p_lo[i + 2u] = f16(lo.z); p_lo[i + 3u] = f16(lo.w);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let h = wg.y / p.n_splits;
    let split = wg.y % p.n_splits;
    let q0 = wg.x * QW + sg * 16u;
    let plane4 = p.heads * p.t_pad * 16u;
    let hb4 = h * p.t_pad * 16u;
    let qb = hb4 + q0 * 16u;
    let qh0 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb], 16u);
    let qh1 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 4u], 16u);
    let qh2 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 8u], 16u);
    let qh3 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 12u], 16u);
    let ql0 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb], 16u);
    let ql1 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb + 4u], 16u);
    let ql2 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb + 8u], 16u);
    let ql3 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb + 12u], 16u);
    let j_begin = split * p.split_keys;
    let j_end = min(p.tk, j_begin + p.split_keys);
    let r = lane / 2u; // this lane's query row in the subgroup's 16
    let half_ = lane % 2u; // which 16 of a block's 32 keys, which 32 of the 64 dims
    let sb = sg * 16u * SS;
    let pb = sg * 16u * PS;
    let rb = sb + r * SS;
    let prow = pb + r * PS + half_ * 16u;
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
    if (j_begin < j_end) {
        stage(j_begin, hb4, plane4, lid);
    }
    workgroupBarrier();
    for (var j0 = j_begin; j0 < j_end; j0 += BK) {
        for (var t = 0u; t < BK; t += 16u) {
            var sh = coop_mat16x16<f32, C>();
            var sl = coop_mat16x16<f32, C>();
            qk(&sh, &sl, qh0, ql0, t, 0u);
            qk(&sh, &sl, qh1, ql1, t, 1u);
            qk(&sh, &sl, qh2, ql2, t, 2u);
            qk(&sh, &sl, qh3, ql3, t, 3u);
            coopStoreT(joined(sh, sl), &scores[sb + t], SS);
        }
        workgroupBarrier();
        // Softmax over the block: this lane's 16 keys, its partner lane's other 16.
        let jb = j0 + half_ * 16u;
        let sr = rb + half_ * 16u;
        let lim = vec4<u32>(j_end);
        let k0 = vec4<u32>(jb) + vec4<u32>(0u, 1u, 2u, 3u);
        let in0 = k0 < lim;
        let in1 = k0 + vec4<u32>(4u) < lim;
        let in2 = k0 + vec4<u32>(8u) < lim;
        let in3 = k0 + vec4<u32>(12u) < lim;
        let v0 = select(vec4<f32>(NEG), s4(sr), in0);
        let v1 = select(vec4<f32>(NEG), s4(sr + 4u), in1);
        let v2 = select(vec4<f32>(NEG), s4(sr + 8u), in2);
        let v3 = select(vec4<f32>(NEG), s4(sr + 12u), in3);
        let mx = max(max(v0, v1), max(v2, v3));
        var bm = max(max(mx.x, mx.y), max(mx.z, mx.w));
        bm = max(bm, subgroupShuffleXor(bm, 1u));
        let mn = max(m, bm);
        let alpha = exp(m - mn);
        m = mn;
        let e0 = select(vec4<f32>(0.0), exp(v0 - vec4<f32>(mn)), in0);
        let e1 = select(vec4<f32>(0.0), exp(v1 - vec4<f32>(mn)), in1);
        let e2 = select(vec4<f32>(0.0), exp(v2 - vec4<f32>(mn)), in2);
        let e3 = select(vec4<f32>(0.0), exp(v3 - vec4<f32>(mn)), in3);
        let es = (e0 + e1) + (e2 + e3);
        l = l * alpha + ((es.x + es.y) + (es.z + es.w));
        put_p4(e0, prow);
        put_p4(e1, prow + 4u);
        put_p4(e2, prow + 8u);
        put_p4(e3, prow + 12u);
        workgroupBarrier();
        var oh0 = coop_mat16x16<f32, C>();
        var oh1 = coop_mat16x16<f32, C>();
        var oh2 = coop_mat16x16<f32, C>();
        var oh3 = coop_mat16x16<f32, C>();
        var ol0 = coop_mat16x16<f32, C>();
        var ol1 = coop_mat16x16<f32, C>();
        var ol2 = coop_mat16x16<f32, C>();
        var ol3 = coop_mat16x16<f32, C>();
        for (var t = 0u; t < BK; t += 16u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&p_hi[pb + t], PS);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&p_lo[pb + t], PS);
            pv(&oh0, &ol0, ah, al, t, 0u);
            pv(&oh1, &ol1, ah, al, t, 1u);
            pv(&oh2, &ol2, ah, al, t, 2u);
            pv(&oh3, &ol3, ah, al, t, 3u);
        }
        if (OD == 64u) {
            // One round: lane half h adds dims 32 h .. 32 h + 31.
            coopStoreT(joined(oh0, ol0), &scores[sb], SS);
            coopStoreT(joined(oh1, ol1), &scores[sb + 16u], SS);
            coopStoreT(joined(oh2, ol2), &scores[sb + 32u], SS);
            coopStoreT(joined(oh3, ol3), &scores[sb + 48u], SS);
            workgroupBarrier();
            let ob = rb + half_ * 32u;
            o0 = fma(o0, vec4<f32>(alpha), s4(ob));
            o1 = fma(o1, vec4<f32>(alpha), s4(ob + 4u));
            o2 = fma(o2, vec4<f32>(alpha), s4(ob + 8u));
            o3 = fma(o3, vec4<f32>(alpha), s4(ob + 12u));
            o4 = fma(o4, vec4<f32>(alpha), s4(ob + 16u));
            o5 = fma(o5, vec4<f32>(alpha), s4(ob + 20u));
            o6 = fma(o6, vec4<f32>(alpha), s4(ob + 24u));
            o7 = fma(o7, vec4<f32>(alpha), s4(ob + 28u));
        } else {
            // Two rounds of 32 dims (half the tile): lane half h adds dims 16 h .. 16 h + 15,
            // then 32 + 16 h .. 32 + 16 h + 15.
            coopStoreT(joined(oh0, ol0), &scores[sb], SS);
            coopStoreT(joined(oh1, ol1), &scores[sb + 16u], SS);
            workgroupBarrier();
            let ob = rb + half_ * 16u;
            o0 = fma(o0, vec4<f32>(alpha), s4(ob));
            o1 = fma(o1, vec4<f32>(alpha), s4(ob + 4u));
            o2 = fma(o2, vec4<f32>(alpha), s4(ob + 8u));
            o3 = fma(o3, vec4<f32>(alpha), s4(ob + 12u));
            workgroupBarrier();
            coopStoreT(joined(oh2, ol2), &scores[sb], SS);
            coopStoreT(joined(oh3, ol3), &scores[sb + 16u], SS);
            workgroupBarrier();
            o4 = fma(o4, vec4<f32>(alpha), s4(ob));
            o5 = fma(o5, vec4<f32>(alpha), s4(ob + 4u));
            o6 = fma(o6, vec4<f32>(alpha), s4(ob + 8u));
            o7 = fma(o7, vec4<f32>(alpha), s4(ob + 12u));
        }
        // (every K|V read of this block is behind the barrier above)
        if (j0 + BK < j_end) {
            stage(j0 + BK, hb4, plane4, lid);
        }
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
        // o0..o3: dims d0 ..; o4..o7: dims d1 .. (see the P·V rounds above)
        let ob = b + 2u + select(half_ * 32u, half_ * 16u, OD == 32u);
        part[ob] = o0.x; part[ob + 1u] = o0.y; part[ob + 2u] = o0.z; part[ob + 3u] = o0.w;
        part[ob + 4u] = o1.x; part[ob + 5u] = o1.y; part[ob + 6u] = o1.z; part[ob + 7u] = o1.w;
        part[ob + 8u] = o2.x; part[ob + 9u] = o2.y; part[ob + 10u] = o2.z; part[ob + 11u] = o2.w;
        part[ob + 12u] = o3.x; part[ob + 13u] = o3.y; part[ob + 14u] = o3.z; part[ob + 15u] = o3.w;
        let oc = b + 2u + select(half_ * 32u + 16u, 32u + half_ * 16u, OD == 32u);
        part[oc] = o4.x; part[oc + 1u] = o4.y; part[oc + 2u] = o4.z; part[oc + 3u] = o4.w;
        part[oc + 4u] = o5.x; part[oc + 5u] = o5.y; part[oc + 6u] = o5.z; part[oc + 7u] = o5.w;
        part[oc + 8u] = o6.x; part[oc + 9u] = o6.y; part[oc + 10u] = o6.z; part[oc + 11u] = o6.w;
        part[oc + 12u] = o7.x; part[oc + 13u] = o7.y; part[oc + 14u] = o7.z; part[oc + 15u] = o7.w;
    }
}

// main_held: the same partials with P·V's accumulators held across key blocks. main stores
// each block's P·V through the score tile so that lanes can rescale the running output by
// exp(m_old - m_new) (a cooperative matrix has no elements to scale): four tile stores,
// four barriers and 32 scalar reads a lane each block. Here a row's probabilities are
// exp(s - m) against a scale m that only moves when a block's max passes it by more than
// HEADROOM, so P stays below e^HEADROOM (P's lo half, (p - hi) 2^12, below 2^15: f16) and
// most blocks add into the held accumulators as they are. When any row of the workgroup
// must move its scale, the workgroup stops once: the accumulators go through the score tile,
// lanes scale their rows, and they come back as f32 matrices (the hi + lo / LO_SCALE join
// made on the way). K of the next block and V of this one are staged together after the
// scores are stored (nothing reads that K or the last V then), so a block has two barriers
// where main has six.
//
// Per block: [S = Q K^T, stored] (1) [next K and this V staged; softmax, P stored; rescale
// flag] (2, a uniform load) [rare: the rescale] [P V into the held accumulators].
//
// It repeats main's prologue and score reads line for line on purpose: it is a probe beside
// main until a device times the two, and whichever loses is deleted whole.

const HEADROOM: f32 = 8.0;

var<workgroup> rescale_at: u32; // j0 + 1 of the last block where a row moved its scale

// Keys jk..jk+31 of K (hi, lo) and jv..jv+31 of V (hi, lo) into `kv`, as `stage` (no
// branch: every thread's 16 / (NSG / 4) loads issue before the first store).
fn stage_kv(jk: u32, jv: u32, hb4: u32, plane4: u32, lid: u32) {
    for (var i = 0u; i < 64u / NSG; i++) {
        let e = lid + 32u * NSG * i;
        let which = e / 512u;
        let key = (e / 16u) % 32u;
        let w = e % 16u;
        let j = select(jv, jk, which < 2u);
        kv[(which * 32u + key) * KS + w] = pl[(2u + which) * plane4 + hb4 + (j + key) * 16u + w];
    }
}

// The held accumulators of OD dims at `d` (16-dim tiles d / 16 ..) through the score tile:
// stored joined, each lane's row scaled by `alpha` (its half of the OD columns), loaded back
// as hi with lo zero. Called by the whole workgroup (barriers).
fn scale_round(a_h: ptr<function, coop_mat16x16<f32, C>>, a_l: ptr<function, coop_mat16x16<f32, C>>,
               b_h: ptr<function, coop_mat16x16<f32, C>>, b_l: ptr<function, coop_mat16x16<f32, C>>,
               sb: u32, rb: u32, half_: u32, alpha: f32) {
    coopStoreT(joined(*a_h, *a_l), &scores[sb], SS);
    coopStoreT(joined(*b_h, *b_l), &scores[sb + 16u], SS);
    workgroupBarrier();
    let ob = rb + half_ * 16u;
    for (var c = 0u; c < 16u; c++) {
        scores[ob + c] *= alpha;
    }
    workgroupBarrier();
    *a_h = coopLoadT<coop_mat16x16<f32, C>>(&scores[sb], SS);
    *b_h = coopLoadT<coop_mat16x16<f32, C>>(&scores[sb + 16u], SS);
    *a_l = coop_mat16x16<f32, C>();
    *b_l = coop_mat16x16<f32, C>();
    workgroupBarrier();
}

// Two tiles (32 dims from `d`) of the held accumulators out through the score tile into
// this lane's part of row `b` of the partials.
fn emit_round(a_h: coop_mat16x16<f32, C>, a_l: coop_mat16x16<f32, C>,
              b_h: coop_mat16x16<f32, C>, b_l: coop_mat16x16<f32, C>,
              sb: u32, rb: u32, half_: u32, live: bool, out: u32) {
    coopStoreT(joined(a_h, a_l), &scores[sb], SS);
    coopStoreT(joined(b_h, b_l), &scores[sb + 16u], SS);
    workgroupBarrier();
    if (live) {
        let ob = rb + half_ * 16u;
        for (var c = 0u; c < 16u; c++) {
            part[out + half_ * 16u + c] = scores[ob + c];
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(32u * NSG) // (main's literal 128 is what the shapes rewrite)
fn main_held(@builtin(workgroup_id) wg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32,
             @builtin(subgroup_id) sg: u32,
             @builtin(subgroup_invocation_id) lane: u32) {
    let h = wg.y / p.n_splits;
    let split = wg.y % p.n_splits;
    let q0 = wg.x * QW + sg * 16u;
    let plane4 = p.heads * p.t_pad * 16u;
    let hb4 = h * p.t_pad * 16u;
    let qb = hb4 + q0 * 16u;
    let qh0 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb], 16u);
    let qh1 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 4u], 16u);
    let qh2 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 8u], 16u);
    let qh3 = coopLoadT<coop_mat16x16<f16, A>>(&pl[qb + 12u], 16u);
    let ql0 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb], 16u);
    let ql1 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb + 4u], 16u);
    let ql2 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb + 8u], 16u);
    let ql3 = coopLoadT<coop_mat16x16<f16, A>>(&pl[plane4 + qb + 12u], 16u);
    let j_begin = split * p.split_keys;
    let j_end = min(p.tk, j_begin + p.split_keys);
    let r = lane / 2u;
    let half_ = lane % 2u;
    let sb = sg * 16u * SS;
    let pb = sg * 16u * PS;
    let rb = sb + r * SS;
    let prow = pb + r * PS + half_ * 16u;
    var m = NEG; // the row's scale: P, l and the accumulators are all against it
    var l = 0.0;
    var oh0 = coop_mat16x16<f32, C>();
    var oh1 = coop_mat16x16<f32, C>();
    var oh2 = coop_mat16x16<f32, C>();
    var oh3 = coop_mat16x16<f32, C>();
    var ol0 = coop_mat16x16<f32, C>();
    var ol1 = coop_mat16x16<f32, C>();
    var ol2 = coop_mat16x16<f32, C>();
    var ol3 = coop_mat16x16<f32, C>();
    if (lid == 0u) {
        rescale_at = 0u;
    }
    if (j_begin < j_end) {
        stage_kv(j_begin, j_begin, hb4, plane4, lid);
    }
    workgroupBarrier();
    for (var j0 = j_begin; j0 < j_end; j0 += BK) {
        for (var t = 0u; t < BK; t += 16u) {
            var sh = coop_mat16x16<f32, C>();
            var sl = coop_mat16x16<f32, C>();
            qk(&sh, &sl, qh0, ql0, t, 0u);
            qk(&sh, &sl, qh1, ql1, t, 1u);
            qk(&sh, &sl, qh2, ql2, t, 2u);
            qk(&sh, &sl, qh3, ql3, t, 3u);
            coopStoreT(joined(sh, sl), &scores[sb + t], SS);
        }
        workgroupBarrier();
        // Every read of this block's K and of the last block's V is behind that barrier.
        // (After the last block nothing reads K: it takes this block's keys again, which
        // are inside the planes. Block 0's V was staged with its K, and is again here.)
        stage_kv(select(j0, j0 + BK, j0 + BK < j_end), j0, hb4, plane4, lid);
        let jb = j0 + half_ * 16u;
        let sr = rb + half_ * 16u;
        let lim = vec4<u32>(j_end);
        let k0 = vec4<u32>(jb) + vec4<u32>(0u, 1u, 2u, 3u);
        let in0 = k0 < lim;
        let in1 = k0 + vec4<u32>(4u) < lim;
        let in2 = k0 + vec4<u32>(8u) < lim;
        let in3 = k0 + vec4<u32>(12u) < lim;
        let v0 = select(vec4<f32>(NEG), s4(sr), in0);
        let v1 = select(vec4<f32>(NEG), s4(sr + 4u), in1);
        let v2 = select(vec4<f32>(NEG), s4(sr + 8u), in2);
        let v3 = select(vec4<f32>(NEG), s4(sr + 12u), in3);
        let mx = max(max(v0, v1), max(v2, v3));
        var bm = max(max(mx.x, mx.y), max(mx.z, mx.w));
        bm = max(bm, subgroupShuffleXor(bm, 1u));
        // The first block sets the scale with nothing held yet; later a move is a rescale.
        var mn = m;
        if (j0 == j_begin) {
            mn = bm;
        } else if (bm > m + HEADROOM) {
            mn = bm;
            rescale_at = j0 + 1u; // the same value from every lane that writes it
        }
        let alpha = exp(m - mn);
        m = mn;
        let e0 = select(vec4<f32>(0.0), exp(v0 - vec4<f32>(mn)), in0);
        let e1 = select(vec4<f32>(0.0), exp(v1 - vec4<f32>(mn)), in1);
        let e2 = select(vec4<f32>(0.0), exp(v2 - vec4<f32>(mn)), in2);
        let e3 = select(vec4<f32>(0.0), exp(v3 - vec4<f32>(mn)), in3);
        let es = (e0 + e1) + (e2 + e3);
        l = l * alpha + ((es.x + es.y) + (es.z + es.w));
        put_p4(e0, prow);
        put_p4(e1, prow + 4u);
        put_p4(e2, prow + 8u);
        put_p4(e3, prow + 12u);
        if (workgroupUniformLoad(&rescale_at) == j0 + 1u) {
            // (rows that kept their scale scale by exp(0) = 1)
            scale_round(&oh0, &ol0, &oh1, &ol1, sb, rb, half_, alpha);
            scale_round(&oh2, &ol2, &oh3, &ol3, sb, rb, half_, alpha);
        }
        for (var t = 0u; t < BK; t += 16u) {
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&p_hi[pb + t], PS);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&p_lo[pb + t], PS);
            pv(&oh0, &ol0, ah, al, t, 0u);
            pv(&oh1, &ol1, ah, al, t, 1u);
            pv(&oh2, &ol2, ah, al, t, 2u);
            pv(&oh3, &ol3, ah, al, t, 3u);
        }
    }
    let lt = l + subgroupShuffleXor(l, 1u);
    let qi = q0 + r;
    let live = qi < p.tq;
    let b = ((qi * p.heads + h) * p.n_splits + split) * 66u;
    if (live && half_ == 0u) {
        part[b] = m;
        part[b + 1u] = lt;
    }
    // (the score tile's last reads are behind the last uniform load)
    emit_round(oh0, ol0, oh1, ol1, sb, rb, half_, live, b + 2u);
    emit_round(oh2, ol2, oh3, ol3, sb, rb, half_, live, b + 34u);
}
