// Multi-head attention softmax(q k^T * scale) v for many queries, head_dim 64, no causal
// mask: the encoder's self-attention (1500 x 1500, every Whisper size has head_dim 64),
// register-blocked like a GEMM micro-kernel.
//
// Why: attention.wgsl's main_tiled gives each thread one query and reads every staged key
// and value as a broadcast vec4, one 16-byte workgroup-memory load per 4 FMAs; that bound it
// (461 us per tiny.en layer on the H200, 11 % of FP32 peak; more warps or independent FMA
// chains did not help). Here a workgroup takes BQ = 32 queries of one head (64 threads) and
// walks the keys in blocks of BK = 32, each block as two small GEMMs on tiles staged in
// workgroup memory, thread (g = lid / 8, t = lid % 8) owning queries 4g..4g+3 in both:
//   S = Q K^T: keys 4t..4t+3 of the block, four vec4 accumulators (one per key, across the
//     four queries). Q^T and K^T are staged dimension-major, so a step over dimension c is
//     two vec4 loads (four queries' q[c], four keys' k[c]) and an outer product of 16 FMAs:
//     1 load per 8 FMAs.
//   O += P V: output dimensions 4t..4t+3 and 32+4t..32+4t+3, eight vec4 accumulators; a key
//     is one vec4 of P^T (four queries) and two vec4 of V for 32 FMAs: 1 load per 10.7.
// Between them the online softmax: each thread writes its 4x4 block's max per query, the
// eight threads of a query group read all eight (the same values in the same order, so the
// same running max m in each), rescale their accumulators by exp(m - m_new) and write
// p = exp(s - m_new) as P^T. The row sums l come free in the P V loop (a thread adds the
// P^T vec4s it reads anyway). The next block's K and V are loaded into registers while this
// one is computed. Three barriers per block: K^T stored, (1), V stored, S, partial maxima
// stored, (2), maxima read, P^T stored, (3), P V. The next block's K^T may be stored once
// (2) has passed (S is done), its V and P^T once its own (1) has (P V is done); the partial
// maxima are read between (2) and (3) and written again after the next (1).
// Workgroup memory: Q^T 8 KiB + K^T 9 KiB (dimension rows padded by a vec4: the staging
// stores, a dimension per thread, would otherwise all hit the same banks) + V 8 KiB + P^T
// 4.1 KiB + partial maxima 1.1 KiB = 30976 bytes: lavapipe offers 32 KiB (the H200 48), which
// is what keeps the tiles at 32 x 32 (64 queries or 64 keys per block would need 40-48).
// Rows past tq are zero queries, never written; keys past the split's end (tk for the last)
// are zero, their scores kept out of the max and their p zero. Named vec4 registers and
// hand-unrolled steps throughout: private arrays indexed in loops land in local memory on
// NVIDIA, and lavapipe stops any loop past 65535 iterations per invocation (the longest
// here: 16 per 32 keys).
//
// Key splits: 47 x 6 workgroups of two warps for a tiny.en layer are ~4 warps per H200
// multiprocessor, too few to hide the workgroup-memory and barrier latency (main_tiled gets
// its warps from four key splits per query merged inside the workgroup). So the keys may be
// split across workgroups, as attention.wgsl's main_split does for a decode step: split s of
// n_splits = ceil(tk / split_keys) walks keys [s split_keys, (s + 1) split_keys) (the host
// makes split_keys a multiple of the 32-key block; any value works) and writes its
// unnormalised partial (m, l, acc[64]) where attention.wgsl's main_merge reads it: partial
// (query, head, s) at ((query heads + head) n_splits + s) (d + 2) of the buffer bound as
// `o` (o_off and o_stride not applied), m first, then l, then the 64 sums. A split without
// keys would write m = NEG, l = 0 and zero sums (main_split's empty split, which the merge
// skips); with n_splits = ceil(tk / split_keys) none is empty. One split (split_keys >= tk,
// or 0) writes the normalised output itself, at o_off + query o_stride + head d. The
// splits are folded into the grid's y: workgroup (x, y) is query tile x, head y % heads,
// split y / heads.
//
// Measured on the H200 (kernel lab, 1500 x 1500 x 6 heads; main_tiled 452 us): one split
// 493 us, two 419 + 9 (merge), four 393 + 11, eight 418 + 17; in the encoder bench 463 ->
// 410 us a layer. It loses where main_tiled has warps enough (8 heads 471 -> 540, 12 heads
// 715 -> 799), so Kernels::attention runs it only where the tiled grid is small. It still
// does less work per warp than main_tiled: ~8 FMAs per workgroup-memory load on paper,
// but three barriers and a softmax exchange per 32 keys.

// Params and bindings: attention_io.wgsl (prepended), as attention.wgsl's.

const BQ: u32 = 32u;
const BK: u32 = 32u;
const KTS: u32 = 9u; // vec4 per dimension row of k_t: 8 key quads + 1 of padding
const NEG: f32 = -3.0e38;

var<workgroup> q_t: array<vec4<f32>, 512>; // [64 dims][8 query quads], scaled
var<workgroup> k_t: array<vec4<f32>, 576>; // [64 dims][KTS]: keys 4i..4i+3 in vec4 i
var<workgroup> v_s: array<vec4<f32>, 512>; // [32 keys][16 dimension quads]
// P^T: key j, query quad i at 8 j + j / 4 + i (a vec4 of padding per 4 keys: the 8 threads
// of a query group store keys 4t.. without bank conflicts).
var<workgroup> p_t: array<vec4<f32>, 264>;
var<workgroup> p_max: array<vec4<f32>, 72>; // key quad t, query quad i at 9 t + i

// q[row][c] of head offset hb, scaled; zero past tq.
fn q_at(row: u32, c: u32, hb: u32) -> f32 {
    let x = q[p.q_off + min(row, p.tq - 1u) * p.q_stride + hb + c];
    return select(0.0, x * p.scale, row < p.tq);
}

// Key j's dimension c; zero from key `end` (the end of the split) on.
fn k_at(j: u32, c: u32, hb: u32, end: u32) -> f32 {
    let x = k[p.k_off + min(j, p.tk - 1u) * p.k_stride + hb + c];
    return select(0.0, x, j < end);
}

// Dimension c of keys j..j+3.
fn k_quad(j: u32, c: u32, hb: u32, end: u32) -> vec4<f32> {
    return vec4<f32>(k_at(j, c, hb, end), k_at(j + 1u, c, hb, end), k_at(j + 2u, c, hb, end), k_at(j + 3u, c, hb, end));
}

// Dimensions 4 c4..4 c4+3 of value row j; zero from `end` on.
fn v_quad(j: u32, c4: u32, hb: u32, end: u32) -> vec4<f32> {
    let b = p.v_off + min(j, p.tk - 1u) * p.v_stride + hb + 4u * c4;
    return select(vec4<f32>(0.0), vec4<f32>(v[b], v[b + 1u], v[b + 2u], v[b + 3u]), j < end);
}

// Eight values of one row at o[ob + ca..] and o[ob + cb..].
fn put8(ob: u32, ca: u32, cb: u32, a: vec4<f32>, b: vec4<f32>) {
    o[ob + ca] = a.x;
    o[ob + ca + 1u] = a.y;
    o[ob + ca + 2u] = a.z;
    o[ob + ca + 3u] = a.w;
    o[ob + cb] = b.x;
    o[ob + cb + 1u] = b.y;
    o[ob + cb + 2u] = b.z;
    o[ob + cb + 3u] = b.w;
}

// Query `row`'s 8 dimensions of this thread (dimensions 4t.. and 32+4t.. of head h), if
// the row exists: normalised into the output with one split, else its split's partial
// (the thread with t = 0 also writes the partial's m and l).
fn put(row: u32, h: u32, t: u32, split: u32, n_splits: u32, a: vec4<f32>, b: vec4<f32>, m: f32, l: f32) {
    if (row >= p.tq) {
        return;
    }
    if (n_splits == 1u) {
        let inv = 1.0 / l;
        put8(p.o_off + row * p.o_stride + h * p.d, 4u * t, 4u * t + 32u, a * inv, b * inv);
        return;
    }
    let pb = ((row * p.heads + h) * n_splits + split) * (p.d + 2u);
    if (t == 0u) {
        o[pb] = m;
        o[pb + 1u] = l;
    }
    put8(pb + 2u, 4u * t, 4u * t + 32u, a, b);
}

@compute @workgroup_size(64)
fn main_blocked(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.y % p.heads;
    let split = wg.y / p.heads;
    let hb = h * p.d;
    let q0 = wg.x * BQ;
    // This split's keys [j_lo, j_hi) (split_keys 0: all of them, one split).
    let sk = select(p.tk, p.split_keys, p.split_keys != 0u);
    let n_splits = (p.tk + sk - 1u) / sk;
    let j_lo = split * sk;
    let j_hi = min(p.tk, j_lo + sk);
    let g = lid / 8u; // query quad: queries q0 + 4g .. q0 + 4g + 3
    let t = lid % 8u; // key quad in S; dimension quads t and 8 + t in P V
    // Staging: K^T a dimension per thread (reads of a key row contiguous across threads),
    // V a dimension quad c4 of keys jr, jr + 4, ... per thread.
    let c4 = lid % 16u;
    let jr = lid / 16u;

    // Q^T, scaled (thread lid stages dimension lid).
    for (var i = 0u; i < 8u; i++) {
        let r = q0 + 4u * i;
        q_t[lid * 8u + i] = vec4<f32>(q_at(r, lid, hb), q_at(r + 1u, lid, hb), q_at(r + 2u, lid, hb), q_at(r + 3u, lid, hb));
    }

    // The first block's K and V.
    var kp0 = k_quad(j_lo, lid, hb, j_hi);
    var kp1 = k_quad(j_lo + 4u, lid, hb, j_hi);
    var kp2 = k_quad(j_lo + 8u, lid, hb, j_hi);
    var kp3 = k_quad(j_lo + 12u, lid, hb, j_hi);
    var kp4 = k_quad(j_lo + 16u, lid, hb, j_hi);
    var kp5 = k_quad(j_lo + 20u, lid, hb, j_hi);
    var kp6 = k_quad(j_lo + 24u, lid, hb, j_hi);
    var kp7 = k_quad(j_lo + 28u, lid, hb, j_hi);
    var vp0 = v_quad(j_lo + jr, c4, hb, j_hi);
    var vp1 = v_quad(j_lo + jr + 4u, c4, hb, j_hi);
    var vp2 = v_quad(j_lo + jr + 8u, c4, hb, j_hi);
    var vp3 = v_quad(j_lo + jr + 12u, c4, hb, j_hi);
    var vp4 = v_quad(j_lo + jr + 16u, c4, hb, j_hi);
    var vp5 = v_quad(j_lo + jr + 20u, c4, hb, j_hi);
    var vp6 = v_quad(j_lo + jr + 24u, c4, hb, j_hi);
    var vp7 = v_quad(j_lo + jr + 28u, c4, hb, j_hi);

    // Running max and sum of the four queries; o<query><a: dims 4t.., b: dims 32+4t..>.
    var m = vec4<f32>(NEG);
    var l = vec4<f32>(0.0);
    var o0a = vec4<f32>(0.0);
    var o0b = vec4<f32>(0.0);
    var o1a = vec4<f32>(0.0);
    var o1b = vec4<f32>(0.0);
    var o2a = vec4<f32>(0.0);
    var o2b = vec4<f32>(0.0);
    var o3a = vec4<f32>(0.0);
    var o3b = vec4<f32>(0.0);

    for (var j0 = j_lo; j0 < j_hi; j0 += BK) {
        // K^T of this block (the last block's S reads ended before its second barrier).
        let kb = lid * KTS;
        k_t[kb] = kp0;
        k_t[kb + 1u] = kp1;
        k_t[kb + 2u] = kp2;
        k_t[kb + 3u] = kp3;
        k_t[kb + 4u] = kp4;
        k_t[kb + 5u] = kp5;
        k_t[kb + 6u] = kp6;
        k_t[kb + 7u] = kp7;
        workgroupBarrier();
        // V of this block (the last block's P V reads ended before the barrier above).
        let vb = jr * 16u + c4;
        v_s[vb] = vp0;
        v_s[vb + 64u] = vp1;
        v_s[vb + 128u] = vp2;
        v_s[vb + 192u] = vp3;
        v_s[vb + 256u] = vp4;
        v_s[vb + 320u] = vp5;
        v_s[vb + 384u] = vp6;
        v_s[vb + 448u] = vp7;
        // The next block's K and V into registers while this one is computed.
        let jn = j0 + BK;
        if (jn < j_hi) {
            kp0 = k_quad(jn, lid, hb, j_hi);
            kp1 = k_quad(jn + 4u, lid, hb, j_hi);
            kp2 = k_quad(jn + 8u, lid, hb, j_hi);
            kp3 = k_quad(jn + 12u, lid, hb, j_hi);
            kp4 = k_quad(jn + 16u, lid, hb, j_hi);
            kp5 = k_quad(jn + 20u, lid, hb, j_hi);
            kp6 = k_quad(jn + 24u, lid, hb, j_hi);
            kp7 = k_quad(jn + 28u, lid, hb, j_hi);
            vp0 = v_quad(jn + jr, c4, hb, j_hi);
            vp1 = v_quad(jn + jr + 4u, c4, hb, j_hi);
            vp2 = v_quad(jn + jr + 8u, c4, hb, j_hi);
            vp3 = v_quad(jn + jr + 12u, c4, hb, j_hi);
            vp4 = v_quad(jn + jr + 16u, c4, hb, j_hi);
            vp5 = v_quad(jn + jr + 20u, c4, hb, j_hi);
            vp6 = v_quad(jn + jr + 24u, c4, hb, j_hi);
            vp7 = v_quad(jn + jr + 28u, c4, hb, j_hi);
        }

        // S: s<kk> = scores of key j0 + 4t + kk for the four queries, four dimensions a step.
        var s0 = vec4<f32>(0.0);
        var s1 = vec4<f32>(0.0);
        var s2 = vec4<f32>(0.0);
        var s3 = vec4<f32>(0.0);
        for (var c = 0u; c < 64u; c += 4u) {
            let qa = c * 8u + g;
            let ka = c * KTS + t;
            let a0 = q_t[qa];
            let a1 = q_t[qa + 8u];
            let a2 = q_t[qa + 16u];
            let a3 = q_t[qa + 24u];
            let b0 = k_t[ka];
            let b1 = k_t[ka + KTS];
            let b2 = k_t[ka + 2u * KTS];
            let b3 = k_t[ka + 3u * KTS];
            s0 = fma(a0, vec4<f32>(b0.x), s0);
            s1 = fma(a0, vec4<f32>(b0.y), s1);
            s2 = fma(a0, vec4<f32>(b0.z), s2);
            s3 = fma(a0, vec4<f32>(b0.w), s3);
            s0 = fma(a1, vec4<f32>(b1.x), s0);
            s1 = fma(a1, vec4<f32>(b1.y), s1);
            s2 = fma(a1, vec4<f32>(b1.z), s2);
            s3 = fma(a1, vec4<f32>(b1.w), s3);
            s0 = fma(a2, vec4<f32>(b2.x), s0);
            s1 = fma(a2, vec4<f32>(b2.y), s1);
            s2 = fma(a2, vec4<f32>(b2.z), s2);
            s3 = fma(a2, vec4<f32>(b2.w), s3);
            s0 = fma(a3, vec4<f32>(b3.x), s0);
            s1 = fma(a3, vec4<f32>(b3.y), s1);
            s2 = fma(a3, vec4<f32>(b3.z), s2);
            s3 = fma(a3, vec4<f32>(b3.w), s3);
        }
        // Keys past the split out of the max; this thread's max per query to the others.
        let kj = j0 + 4u * t;
        let ok0 = kj < j_hi;
        let ok1 = kj + 1u < j_hi;
        let ok2 = kj + 2u < j_hi;
        let ok3 = kj + 3u < j_hi;
        s0 = select(vec4<f32>(NEG), s0, ok0);
        s1 = select(vec4<f32>(NEG), s1, ok1);
        s2 = select(vec4<f32>(NEG), s2, ok2);
        s3 = select(vec4<f32>(NEG), s3, ok3);
        p_max[t * 9u + g] = max(max(s0, s1), max(s2, s3));
        workgroupBarrier();
        var bm = max(p_max[g], p_max[9u + g]);
        bm = max(bm, p_max[18u + g]);
        bm = max(bm, p_max[27u + g]);
        bm = max(bm, p_max[36u + g]);
        bm = max(bm, p_max[45u + g]);
        bm = max(bm, p_max[54u + g]);
        bm = max(bm, p_max[63u + g]);
        let mnew = max(m, bm);
        let corr = exp(max(m - mnew, vec4<f32>(-80.0)));
        m = mnew;
        // P^T: key 4t + kk at 8 (4t + kk) + t + g.
        let pb = t * 33u + g;
        p_t[pb] = select(vec4<f32>(0.0), exp(s0 - mnew), ok0);
        p_t[pb + 8u] = select(vec4<f32>(0.0), exp(s1 - mnew), ok1);
        p_t[pb + 16u] = select(vec4<f32>(0.0), exp(s2 - mnew), ok2);
        p_t[pb + 24u] = select(vec4<f32>(0.0), exp(s3 - mnew), ok3);
        workgroupBarrier();

        // O += P V over the block's keys, four a step (keys past the split: p and v zero).
        l *= corr;
        o0a *= corr.x;
        o0b *= corr.x;
        o1a *= corr.y;
        o1b *= corr.y;
        o2a *= corr.z;
        o2b *= corr.z;
        o3a *= corr.w;
        o3b *= corr.w;
        for (var j = 0u; j < BK; j += 4u) {
            let pa = j * 8u + j / 4u + g;
            let va = j * 16u + t;
            let p0 = p_t[pa];
            let p1 = p_t[pa + 8u];
            let p2 = p_t[pa + 16u];
            let p3 = p_t[pa + 24u];
            let x0 = v_s[va];
            let y0 = v_s[va + 8u];
            let x1 = v_s[va + 16u];
            let y1 = v_s[va + 24u];
            let x2 = v_s[va + 32u];
            let y2 = v_s[va + 40u];
            let x3 = v_s[va + 48u];
            let y3 = v_s[va + 56u];
            l += p0 + p1 + p2 + p3;
            o0a = fma(vec4<f32>(p0.x), x0, o0a);
            o0b = fma(vec4<f32>(p0.x), y0, o0b);
            o1a = fma(vec4<f32>(p0.y), x0, o1a);
            o1b = fma(vec4<f32>(p0.y), y0, o1b);
            o2a = fma(vec4<f32>(p0.z), x0, o2a);
            o2b = fma(vec4<f32>(p0.z), y0, o2b);
            o3a = fma(vec4<f32>(p0.w), x0, o3a);
            o3b = fma(vec4<f32>(p0.w), y0, o3b);
            o0a = fma(vec4<f32>(p1.x), x1, o0a);
            o0b = fma(vec4<f32>(p1.x), y1, o0b);
            o1a = fma(vec4<f32>(p1.y), x1, o1a);
            o1b = fma(vec4<f32>(p1.y), y1, o1b);
            o2a = fma(vec4<f32>(p1.z), x1, o2a);
            o2b = fma(vec4<f32>(p1.z), y1, o2b);
            o3a = fma(vec4<f32>(p1.w), x1, o3a);
            o3b = fma(vec4<f32>(p1.w), y1, o3b);
            o0a = fma(vec4<f32>(p2.x), x2, o0a);
            o0b = fma(vec4<f32>(p2.x), y2, o0b);
            o1a = fma(vec4<f32>(p2.y), x2, o1a);
            o1b = fma(vec4<f32>(p2.y), y2, o1b);
            o2a = fma(vec4<f32>(p2.z), x2, o2a);
            o2b = fma(vec4<f32>(p2.z), y2, o2b);
            o3a = fma(vec4<f32>(p2.w), x2, o3a);
            o3b = fma(vec4<f32>(p2.w), y2, o3b);
            o0a = fma(vec4<f32>(p3.x), x3, o0a);
            o0b = fma(vec4<f32>(p3.x), y3, o0b);
            o1a = fma(vec4<f32>(p3.y), x3, o1a);
            o1b = fma(vec4<f32>(p3.y), y3, o1b);
            o2a = fma(vec4<f32>(p3.z), x3, o2a);
            o2b = fma(vec4<f32>(p3.z), y3, o2b);
            o3a = fma(vec4<f32>(p3.w), x3, o3a);
            o3b = fma(vec4<f32>(p3.w), y3, o3b);
        }
    }

    let r = q0 + 4u * g;
    put(r, h, t, split, n_splits, o0a, o0b, m.x, l.x);
    put(r + 1u, h, t, split, n_splits, o1a, o1b, m.y, l.y);
    put(r + 2u, h, t, split, n_splits, o2a, o2b, m.z, l.z);
    put(r + 3u, h, t, split, n_splits, o3a, o3b, m.w, l.w);
}
