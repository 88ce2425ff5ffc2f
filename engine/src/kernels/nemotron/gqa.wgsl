// Causal GQA over the KV cache for the n positions of a pass (no positional encoding):
// query t (absolute position pos0 + t) of head h reads keys and values 0..=pos0 + t of
// KV head h / (heads / kv_heads) from the caches [position][kv_head][head_dim] (the pass's
// own K/V already written there: the K and V projections write straight into the cache
// rows pos0..). kernels/attention.wgsl indexes K/V by the query head, so GQA lives here.
//
// One workgroup of 64 per (position, head); keys in chunks of 64 with an online softmax
// (running max and sum, the accumulator rescaled when the max grows), so any context fits
// in fixed workgroup memory. Thread j of a chunk scores key j; thread c owns output
// dimensions c and c + 64 (head_dim <= 128). Per invocation the dot loop runs
// (keys / 64) · head_dim times and the value loop once per key: far below lavapipe's
// 65535 cap for contexts of a few thousand. Reductions in workgroup memory.

struct Params {
    n: u32, heads: u32, kv: u32, d: u32,
    pos0: u32, q_off: u32, q_stride: u32, o_off: u32,
    o_stride: u32, _p0: u32, _p1: u32, _p2: u32,
    scale: f32, _p3: u32, _p4: u32, _p5: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;

const WG: u32 = 64u;
const MAXD: u32 = 128u;
const NEG: f32 = -3.0e38;

var<workgroup> qs: array<f32, MAXD>;
var<workgroup> ps: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

fn reduce(v: f32, lid: u32, is_max: bool) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            if (is_max) {
                red[lid] = max(red[lid], red[lid + st]);
            } else {
                red[lid] += red[lid + st];
            }
        }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x;
    let h = wg.y;
    if (t >= p.n) {
        return;
    }
    let d = p.d;
    let g = h / (p.heads / p.kv);
    let qb = p.q_off + t * p.q_stride + h * d;
    for (var c = lid; c < d; c += WG) {
        qs[c] = q[qb + c] * p.scale;
    }
    workgroupBarrier();
    let keys = p.pos0 + t + 1u;
    let row = p.kv * d; // cache row of one position
    var m = NEG;
    var l = 0.0;
    var acc0 = 0.0;
    var acc1 = 0.0;
    for (var j0 = 0u; j0 < keys; j0 += WG) {
        let j = j0 + lid;
        var s = NEG;
        if (j < keys) {
            let kb = j * row + g * d;
            var dot_ = 0.0;
            for (var c = 0u; c < d; c++) {
                dot_ = fma(qs[c], kc[kb + c], dot_);
            }
            s = dot_;
        }
        let mnew = max(m, reduce(s, lid, true));
        var pj = 0.0;
        if (j < keys) {
            pj = exp(s - mnew);
        }
        ps[lid] = pj;
        let psum = reduce(pj, lid, false); // its barriers also publish ps
        let corr = exp(m - mnew);
        l = l * corr + psum;
        acc0 *= corr;
        acc1 *= corr;
        let cnt = min(WG, keys - j0);
        for (var jj = 0u; jj < cnt; jj++) {
            let vb = (j0 + jj) * row + g * d;
            let pw = ps[jj];
            if (lid < d) {
                acc0 = fma(pw, vc[vb + lid], acc0);
            }
            if (lid + WG < d) {
                acc1 = fma(pw, vc[vb + lid + WG], acc1);
            }
        }
        m = mnew;
        workgroupBarrier();
    }
    let ob = p.o_off + t * p.o_stride + h * d;
    if (lid < d) {
        o[ob + lid] = acc0 / l;
    }
    if (lid + WG < d) {
        o[ob + lid + WG] = acc1 / l;
    }
}
