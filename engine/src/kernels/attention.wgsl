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
