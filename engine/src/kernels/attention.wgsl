// Multi-head attention, softmax(q k^T * scale) v, for one (query, head) per workgroup.
//
// Keys are visited in chunks of 64 with an online softmax (running max m, running sum l,
// output rescaled when the max grows), so any number of keys fits in a fixed amount of
// workgroup memory: 1500 encoder frames, or a decoder KV cache of any length. Thread j of
// a chunk scores key j; thread c then owns output dimensions c and c + 64 (head_dim <= 128).
// Q, K and V are read through offsets and row strides so a fused QKV buffer [T][3d], a KV
// cache [T][d] or the fused cross-attention K|V [1500][2d] serve directly, without copies.
// causal != 0: query i sees keys j <= i + causal_offset (positions already in the cache).

struct Params {
    tq: u32, tk: u32, heads: u32, d: u32,
    q_off: u32, q_stride: u32, k_off: u32, k_stride: u32,
    v_off: u32, v_stride: u32, o_off: u32, o_stride: u32,
    causal: u32, causal_offset: u32, scale: f32, _p0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

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
// Tiled variant for many queries (the encoder's 1500, a long prefill): one thread owns one
// query of one head; a workgroup of 32 queries shares chunks of 16 keys and values staged
// in workgroup memory (read once per 32 queries instead of once per query; every thread
// reads the same staged element at once: a broadcast). Each thread keeps its own online
// softmax, so there is no cross-thread reduction and two barriers per chunk.
//
// The head is handled as 16 vec4s with the inner loops unrolled by 4: lavapipe (gallivm)
// caps every loop at 65535 iterations per invocation, counted over the whole dispatch, and
// silently stops there; a scalar loop over 64 dims per key hit that cap past ~500 keys.
// Per-query state (q, the accumulator) lives in workgroup memory, rows padded by one vec4.
// head_dim <= 64 and a multiple of 4 (zero-padded to 64).

const TQ: u32 = 32u;
const CH: u32 = 16u;
const TD4: u32 = 16u;
const RS4: u32 = 17u;

var<workgroup> ks: array<vec4<f32>, 256>; // [CH][TD4]
var<workgroup> vs: array<vec4<f32>, 256>;
var<workgroup> qsh: array<vec4<f32>, 544>; // [TQ][RS4]
var<workgroup> accs: array<vec4<f32>, 544>;
var<workgroup> ssh: array<f32, 512>; // [TQ][CH]

fn load4(buf_is_k: bool, base: u32) -> vec4<f32> {
    if (buf_is_k) {
        return vec4<f32>(k[base], k[base + 1u], k[base + 2u], k[base + 3u]);
    }
    return vec4<f32>(v[base], v[base + 1u], v[base + 2u], v[base + 3u]);
}

@compute @workgroup_size(32)
fn main_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.y;
    let q_first = wg.x * TQ;
    let qi = q_first + lid;
    let live = qi < p.tq;
    let d4 = p.d / 4u;
    let row = lid * RS4;
    for (var c = 0u; c < TD4; c++) {
        accs[row + c] = vec4<f32>(0.0);
        qsh[row + c] = vec4<f32>(0.0);
    }
    if (live) {
        let qb = p.q_off + qi * p.q_stride + h * p.d;
        for (var c = 0u; c < d4; c++) {
            qsh[row + c] = vec4<f32>(q[qb + 4u * c], q[qb + 4u * c + 1u], q[qb + 4u * c + 2u], q[qb + 4u * c + 3u]) * p.scale;
        }
    }
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
        for (var e = lid; e < CH * TD4; e += TQ) {
            let jj = e / TD4;
            let c = e % TD4;
            var kv_k = vec4<f32>(0.0);
            var kv_v = vec4<f32>(0.0);
            if (jj < cnt && c < d4) {
                kv_k = load4(true, p.k_off + (j0 + jj) * p.k_stride + h * p.d + 4u * c);
                kv_v = load4(false, p.v_off + (j0 + jj) * p.v_stride + h * p.d + 4u * c);
            }
            ks[e] = kv_k;
            vs[e] = kv_v;
        }
        workgroupBarrier();
        if (live && kmax > j0) {
            let lim = min(cnt, kmax - j0);
            var cmax = NEG;
            for (var jj = 0u; jj < lim; jj++) {
                var a = vec4<f32>(0.0);
                let kb = jj * TD4;
                for (var c = 0u; c < TD4; c += 4u) {
                    a = fma(qsh[row + c], ks[kb + c], a);
                    a = fma(qsh[row + c + 1u], ks[kb + c + 1u], a);
                    a = fma(qsh[row + c + 2u], ks[kb + c + 2u], a);
                    a = fma(qsh[row + c + 3u], ks[kb + c + 3u], a);
                }
                let sc = a.x + a.y + a.z + a.w;
                ssh[lid * CH + jj] = sc;
                cmax = max(cmax, sc);
            }
            let mnew = max(m, cmax);
            let corr = exp(max(m - mnew, -80.0));
            l *= corr;
            for (var c = 0u; c < TD4; c += 4u) {
                accs[row + c] *= corr;
                accs[row + c + 1u] *= corr;
                accs[row + c + 2u] *= corr;
                accs[row + c + 3u] *= corr;
            }
            for (var jj = 0u; jj < lim; jj++) {
                let pj = exp(ssh[lid * CH + jj] - mnew);
                l += pj;
                let vb = jj * TD4;
                for (var c = 0u; c < TD4; c += 4u) {
                    accs[row + c] = fma(vec4<f32>(pj), vs[vb + c], accs[row + c]);
                    accs[row + c + 1u] = fma(vec4<f32>(pj), vs[vb + c + 1u], accs[row + c + 1u]);
                    accs[row + c + 2u] = fma(vec4<f32>(pj), vs[vb + c + 2u], accs[row + c + 2u]);
                    accs[row + c + 3u] = fma(vec4<f32>(pj), vs[vb + c + 3u], accs[row + c + 3u]);
                }
            }
            m = mnew;
        }
        workgroupBarrier();
    }
    if (live) {
        let ob = p.o_off + qi * p.o_stride + h * p.d;
        for (var c = 0u; c < d4; c++) {
            let r = accs[row + c] / l;
            o[ob + 4u * c] = r.x;
            o[ob + 4u * c + 1u] = r.y;
            o[ob + 4u * c + 2u] = r.z;
            o[ob + 4u * c + 3u] = r.w;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decode variant for a few queries over up to 2048 keys (a decoder step: self-attention
// over the cache, cross-attention over the window's 1500 frames). One workgroup of 256
// threads per (query, head), three phases with a handful of barriers in all: every thread
// scores keys lid, lid+256, ... into workgroup memory; one max and one sum reduction; then
// four groups of 64 threads each sum p_j · v_j over every fourth key, a thread per output
// dimension (reads of v rows are contiguous across the 64), and the four partial sums are
// merged. The chunked kernel above needs 14 barriers per 64 keys: 400 us per dispatch on
// the H200 for 1500 keys, where this one's serial depth is ~6 dot products.

const AW: u32 = 256u;
const MAXK: u32 = 2048u;

var<workgroup> sc: array<f32, 2048>;
var<workgroup> red2: array<f32, 256>;
var<workgroup> part0: array<f32, 256>;
var<workgroup> part1: array<f32, 256>;

fn reduce2(v: f32, lid: u32, is_max: bool) -> f32 {
    red2[lid] = v;
    workgroupBarrier();
    for (var st = AW / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            if (is_max) {
                red2[lid] = max(red2[lid], red2[lid + st]);
            } else {
                red2[lid] += red2[lid + st];
            }
        }
        workgroupBarrier();
    }
    let r = red2[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(256)
fn main_decode(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let qi = wg.x;
    let h = wg.y;
    let d = p.d;
    let qb = p.q_off + qi * p.q_stride + h * d;
    for (var c = lid; c < d; c += AW) {
        qs[c] = q[qb + c] * p.scale;
    }
    var kmax = min(p.tk, MAXK);
    if (p.causal != 0u) {
        kmax = min(kmax, qi + p.causal_offset + 1u);
    }
    workgroupBarrier();
    var lmax = NEG;
    for (var j = lid; j < kmax; j += AW) {
        let kb = p.k_off + j * p.k_stride + h * d;
        // Eight key elements loaded before any is used (latency, as in gemv.wgsl).
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        var c = 0u;
        for (; c + 8u <= d; c += 8u) {
            let k0 = vec4<f32>(k[kb + c], k[kb + c + 1u], k[kb + c + 2u], k[kb + c + 3u]);
            let k1 = vec4<f32>(k[kb + c + 4u], k[kb + c + 5u], k[kb + c + 6u], k[kb + c + 7u]);
            a = fma(vec4<f32>(qs[c], qs[c + 1u], qs[c + 2u], qs[c + 3u]), k0, a);
            b = fma(vec4<f32>(qs[c + 4u], qs[c + 5u], qs[c + 6u], qs[c + 7u]), k1, b);
        }
        var dot_ = a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
        for (; c < d; c++) {
            dot_ = fma(qs[c], k[kb + c], dot_);
        }
        sc[j] = dot_;
        lmax = max(lmax, dot_);
    }
    let mx = reduce2(lmax, lid, true);
    var lsum = 0.0;
    for (var j = lid; j < kmax; j += AW) {
        let e = exp(sc[j] - mx);
        sc[j] = e;
        lsum += e;
    }
    let total = reduce2(lsum, lid, false);
    // reduce2 ends with a barrier: every sc[j] is final here.
    let c = lid % 64u;
    let g = lid / 64u;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var j = g; j < kmax; j += 4u) {
        let vb = p.v_off + j * p.v_stride + h * d;
        let pj = sc[j];
        if (c < d) {
            acc0 = fma(pj, v[vb + c], acc0);
        }
        if (c + 64u < d) {
            acc1 = fma(pj, v[vb + c + 64u], acc1);
        }
    }
    part0[lid] = acc0;
    part1[lid] = acc1;
    workgroupBarrier();
    if (lid < 64u) {
        let ob = p.o_off + qi * p.o_stride + h * d;
        if (c < d) {
            o[ob + c] = (part0[c] + part0[64u + c] + part0[128u + c] + part0[192u + c]) / total;
        }
        if (c + 64u < d) {
            o[ob + c + 64u] = (part1[c] + part1[64u + c] + part1[128u + c] + part1[192u + c]) / total;
        }
    }
}
