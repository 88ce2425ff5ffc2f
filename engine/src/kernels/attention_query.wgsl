// Cross-attention for a few query rows (a decode step's row, a verify pass's rows) with the
// query projection folded in: q = LayerNorm(x) Wq + bq, then softmax(q k^T * scale) v over
// one split of the keys, as main_split (attention.wgsl) writes it. Appended to
// attention_io.wgsl + attention.wgsl + f16_split.wgsl (their helpers and workgroup arrays);
// the row of x is bound as `q`, addressed by q_off and q_stride.
//
// Why: the query projection was a GEMV dispatch of its own between the self-attention's
// output projection and this kernel, one more dependent dispatch a layer and step (6-7 us
// in the stream on the H200). Every (head, split) workgroup now computes its head's 64
// query values itself (the splits of a head repeat the same work: 64 x K weights, from L2
// after the first), with its keys' loads and the first weight rows already in flight while
// it normalises the row.
//
// Weights: Wq k-major as F16Matrix ([K][N], f16 pairs along N, N = heads x 64), read as
// vec4<u32> words (four column pairs): head h's 64 columns are words 8h .. 8h + 8 of a row.
// Thread lid takes word 8h + lid % 8 in K slice lid / 8 (32 slices; the threads of a slice
// read 128 contiguous bytes of a weight row), QB rows a block with their loads issued
// together. The slices are summed in a fixed order, so a row's bits are the row's alone:
// a verify pass's rows equal single decode steps.

@group(0) @binding(5) var<storage, read> wq: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> bq: array<f32>;
@group(0) @binding(7) var<storage, read> q_gamma: array<f32>;
@group(0) @binding(8) var<storage, read> q_beta: array<f32>;

const QMAXK: u32 = 1280u; // the row's width, d_model (ATTENTION_QUERY_MAX_K in mod.rs)
const QKG: u32 = 32u; // K slices
const QB: u32 = 12u; // weight rows of a block (all of a slice for d_model 384)

var<workgroup> qxn: array<f32, QMAXK>; // LayerNorm(row)
var<workgroup> qred: array<f32, 2048>; // [slice][64 outputs]

// Weight word (row k, word `word`) of a row of `nq` words, zero past the slice's end k1.
fn wq_word(k: u32, k1: u32, word: u32, nq: u32) -> vec4<u32> {
    if (k >= k1) {
        return vec4<u32>(0u);
    }
    return wq[k * nq + word];
}

// Rows k .. k + QB of the thread's word, all issued before any is used.
fn wq_block(k: u32, k1: u32, word: u32, nq: u32) -> array<vec4<u32>, 12> {
    return array<vec4<u32>, 12>(
        wq_word(k, k1, word, nq),
        wq_word(k + 1u, k1, word, nq),
        wq_word(k + 2u, k1, word, nq),
        wq_word(k + 3u, k1, word, nq),
        wq_word(k + 4u, k1, word, nq),
        wq_word(k + 5u, k1, word, nq),
        wq_word(k + 6u, k1, word, nq),
        wq_word(k + 7u, k1, word, nq),
        wq_word(k + 8u, k1, word, nq),
        wq_word(k + 9u, k1, word, nq),
        wq_word(k + 10u, k1, word, nq),
        wq_word(k + 11u, k1, word, nq),
    );
}

// Row k of the thread's word times x'[k] into its eight outputs (lo: column pairs 0-1 of
// the word, hi: 2-3).
fn wq_fma(lo: ptr<function, vec4<f32>>, hi: ptr<function, vec4<f32>>, u: vec4<u32>, k: u32, kmax: u32) {
    let xk = vec4<f32>(qxn[min(k, kmax - 1u)]);
    *lo = fma(xk, vec4<f32>(unpack2x16float(u.x), unpack2x16float(u.y)), *lo);
    *hi = fma(xk, vec4<f32>(unpack2x16float(u.z), unpack2x16float(u.w)), *hi);
}

// A block's products in row order, written out (an array indexed in a loop would live in
// local memory; rows past the slice carry zero words and add +0).
fn wq_block_fma(lo: ptr<function, vec4<f32>>, hi: ptr<function, vec4<f32>>, b: array<vec4<u32>, 12>, k: u32, kmax: u32) {
    wq_fma(lo, hi, b[0], k, kmax);
    wq_fma(lo, hi, b[1], k + 1u, kmax);
    wq_fma(lo, hi, b[2], k + 2u, kmax);
    wq_fma(lo, hi, b[3], k + 3u, kmax);
    wq_fma(lo, hi, b[4], k + 4u, kmax);
    wq_fma(lo, hi, b[5], k + 5u, kmax);
    wq_fma(lo, hi, b[6], k + 6u, kmax);
    wq_fma(lo, hi, b[7], k + 7u, kmax);
    wq_fma(lo, hi, b[8], k + 8u, kmax);
    wq_fma(lo, hi, b[9], k + 9u, kmax);
    wq_fma(lo, hi, b[10], k + 10u, kmax);
    wq_fma(lo, hi, b[11], k + 11u, kmax);
}

// Key rows kq + 64 r of the split (r < 4), dimensions 4 part + 16 i, as main_split loads
// them: [4 r + i].
fn keys64(j_lo: u32, j_hi: u32, sk: u32, c0: u32, kq: u32) -> array<vec4<f32>, 16> {
    let ok0 = kq < sk && j_lo + kq < j_hi;
    let ok1 = kq + 64u < sk && j_lo + kq + 64u < j_hi;
    let ok2 = kq + 128u < sk && j_lo + kq + 128u < j_hi;
    let ok3 = kq + 192u < sk && j_lo + kq + 192u < j_hi;
    return array<vec4<f32>, 16>(
        key4(j_lo + kq, c0, ok0),
        key4(j_lo + kq, c0 + 16u, ok0),
        key4(j_lo + kq, c0 + 32u, ok0),
        key4(j_lo + kq, c0 + 48u, ok0),
        key4(j_lo + kq + 64u, c0, ok1),
        key4(j_lo + kq + 64u, c0 + 16u, ok1),
        key4(j_lo + kq + 64u, c0 + 32u, ok1),
        key4(j_lo + kq + 64u, c0 + 48u, ok1),
        key4(j_lo + kq + 128u, c0, ok2),
        key4(j_lo + kq + 128u, c0 + 16u, ok2),
        key4(j_lo + kq + 128u, c0 + 32u, ok2),
        key4(j_lo + kq + 128u, c0 + 48u, ok2),
        key4(j_lo + kq + 192u, c0, ok3),
        key4(j_lo + kq + 192u, c0 + 16u, ok3),
        key4(j_lo + kq + 192u, c0 + 32u, ok3),
        key4(j_lo + kq + 192u, c0 + 48u, ok3),
    );
}

@compute @workgroup_size(256)
fn main_split_q(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let qi = wg.x;
    let h = wg.y;
    let split = wg.z;
    let sk = p.split_keys;
    let n_splits = (p.tk + sk - 1u) / sk;
    let j_lo = split * sk;
    let j_hi = min(p.tk, j_lo + sk);
    let kdim = p.q_k;
    let nq = p.heads * 8u;

    // The first block of this thread's weight rows depends on nothing: issued first.
    let word = h * 8u + lid % 8u;
    let slice = lid / 8u;
    let kc = (kdim + QKG - 1u) / QKG;
    let k0 = min(kdim, slice * kc);
    let k1 = min(kdim, k0 + kc);
    let blk0 = wq_block(k0, k1, word, nq);
    let bias = bq[h * 64u + lid % 64u];

    // The split's keys, four threads a key (main_split's layout and order).
    let part = lid % 4u;
    let keys = keys64(j_lo, j_hi, sk, h * 64u + 4u * part, lid / 4u);

    // The row's elements lid + 256 i (i < 5: K <= 1280) with gamma and beta, loaded
    // together, then the LayerNorm (two-pass statistics, as ffn_decode.wgsl).
    let xb = p.q_off + qi * p.q_stride;
    let lastc = kdim - 1u;
    let xr = array<f32, 5>(
        q[xb + min(lid, lastc)],
        q[xb + min(lid + AW, lastc)],
        q[xb + min(lid + 2u * AW, lastc)],
        q[xb + min(lid + 3u * AW, lastc)],
        q[xb + min(lid + 4u * AW, lastc)],
    );
    let gr = array<f32, 5>(
        q_gamma[min(lid, lastc)],
        q_gamma[min(lid + AW, lastc)],
        q_gamma[min(lid + 2u * AW, lastc)],
        q_gamma[min(lid + 3u * AW, lastc)],
        q_gamma[min(lid + 4u * AW, lastc)],
    );
    let br = array<f32, 5>(
        q_beta[min(lid, lastc)],
        q_beta[min(lid + AW, lastc)],
        q_beta[min(lid + 2u * AW, lastc)],
        q_beta[min(lid + 3u * AW, lastc)],
        q_beta[min(lid + 4u * AW, lastc)],
    );
    var s = 0.0;
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * AW < kdim) {
            s += xr[i];
        }
    }
    let mean = reduce2(s, lid, false) / f32(kdim);
    var sq = 0.0;
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * AW < kdim) {
            let e = xr[i] - mean;
            sq += e * e;
        }
    }
    let inv = inverseSqrt(reduce2(sq, lid, false) / f32(kdim) + p.eps);
    for (var i = 0u; i < 5u; i++) {
        if (lid + i * AW < kdim) {
            qxn[lid + i * AW] = (xr[i] - mean) * inv * gr[i] + br[i];
        }
    }
    workgroupBarrier();

    // q: this slice's products, block by block, then the 32 slices in a fixed tree.
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    wq_block_fma(&lo, &hi, blk0, k0, kdim);
    for (var k = k0 + QB; k < k1; k += QB) {
        wq_block_fma(&lo, &hi, wq_block(k, k1, word, nq), k, kdim);
    }
    // The split's values (main_split's layout), loaded while the slices are summed.
    let g = lid / 64u;
    let n = select(0u, j_hi - j_lo, j_hi > j_lo);
    let vb = p.v_off + (j_lo + g) * p.v_stride + h * 64u + lid % 64u;
    let vs4 = 4u * p.v_stride;
    let vals = array<vec4<f32>, 16>(
        val4(vb, vs4, 0u, g, n),
        val4(vb, vs4, 1u, g, n),
        val4(vb, vs4, 2u, g, n),
        val4(vb, vs4, 3u, g, n),
        val4(vb, vs4, 4u, g, n),
        val4(vb, vs4, 5u, g, n),
        val4(vb, vs4, 6u, g, n),
        val4(vb, vs4, 7u, g, n),
        val4(vb, vs4, 8u, g, n),
        val4(vb, vs4, 9u, g, n),
        val4(vb, vs4, 10u, g, n),
        val4(vb, vs4, 11u, g, n),
        val4(vb, vs4, 12u, g, n),
        val4(vb, vs4, 13u, g, n),
        val4(vb, vs4, 14u, g, n),
        val4(vb, vs4, 15u, g, n),
    );
    let ob = slice * 64u + 8u * (lid % 8u);
    qred[ob] = lo.x;
    qred[ob + 1u] = lo.y;
    qred[ob + 2u] = lo.z;
    qred[ob + 3u] = lo.w;
    qred[ob + 4u] = hi.x;
    qred[ob + 5u] = hi.y;
    qred[ob + 6u] = hi.z;
    qred[ob + 7u] = hi.w;
    workgroupBarrier();
    // Output o = lid % 64: slices 8 g' .. 8 g' + 8 (g' = lid / 64), then the four groups
    // (kpart as scratch: it is next written after the barrier that follows qs).
    let o = lid % 64u;
    let rb = (lid / 64u) * 512u + o;
    kpart[lid] = ((qred[rb] + qred[rb + 64u]) + (qred[rb + 128u] + qred[rb + 192u]))
        + ((qred[rb + 256u] + qred[rb + 320u]) + (qred[rb + 384u] + qred[rb + 448u]));
    workgroupBarrier();
    if (lid < 64u) {
        qs[lid] = (((kpart[lid] + kpart[64u + lid]) + (kpart[128u + lid] + kpart[192u + lid])) + bias) * p.scale;
    }
    workgroupBarrier();

    // The rest as main_split's head_dim-64 path: scores, the split's softmax, p v.
    kpart[lid] = kdot(keys[0], keys[1], keys[2], keys[3], part);
    kpart[256u + lid] = kdot(keys[4], keys[5], keys[6], keys[7], part);
    kpart[512u + lid] = kdot(keys[8], keys[9], keys[10], keys[11], part);
    kpart[768u + lid] = kdot(keys[12], keys[13], keys[14], keys[15], part);
    workgroupBarrier();
    var s64 = NEG;
    if (lid < sk && j_lo + lid < j_hi) {
        s64 = kpart[4u * lid] + kpart[4u * lid + 1u] + kpart[4u * lid + 2u] + kpart[4u * lid + 3u];
    }
    let sm = split_softmax(s64, lid);
    var acc = 0.0;
    acc = acc_pre(acc, vals[0], 0u, g, n);
    acc = acc_pre(acc, vals[1], 1u, g, n);
    acc = acc_pre(acc, vals[2], 2u, g, n);
    acc = acc_pre(acc, vals[3], 3u, g, n);
    acc = acc_pre(acc, vals[4], 4u, g, n);
    acc = acc_pre(acc, vals[5], 5u, g, n);
    acc = acc_pre(acc, vals[6], 6u, g, n);
    acc = acc_pre(acc, vals[7], 7u, g, n);
    acc = acc_pre(acc, vals[8], 8u, g, n);
    acc = acc_pre(acc, vals[9], 9u, g, n);
    acc = acc_pre(acc, vals[10], 10u, g, n);
    acc = acc_pre(acc, vals[11], 11u, g, n);
    acc = acc_pre(acc, vals[12], 12u, g, n);
    acc = acc_pre(acc, vals[13], 13u, g, n);
    acc = acc_pre(acc, vals[14], 14u, g, n);
    acc = acc_pre(acc, vals[15], 15u, g, n);
    split_write(acc, 0.0, sm.x, sm.y, qi, h, split, n_splits, lid);
}
