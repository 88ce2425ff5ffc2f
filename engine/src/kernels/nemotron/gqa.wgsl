// Causal GQA over the KV cache for the n positions of a pass (no positional encoding):
// query t (absolute position pos0 + t) of head h reads keys and values 0..=pos0 + t of
// KV head h / (heads / kv_heads) from the caches [position][kv_head][head_dim] (the pass's
// own K/V already written there: the K and V projections write straight into the cache
// rows pos0..). kernels/attention.wgsl indexes K/V by the query head, so GQA lives here.
//
// `main`: one workgroup of 64 per (position, head); `split` + `merge`: the keys cut into
// chunks over several workgroups, then merged (for few queries over a long context). Keys in chunks of 64 with an online softmax
// (running max and sum, the accumulator rescaled when the max grows), so any context fits
// in fixed workgroup memory. Thread j of a chunk scores key j; thread c owns output
// dimensions c and c + 64 (head_dim <= 128). Per invocation the dot loop runs
// (keys / 64) · head_dim times and the value loop once per key: far below lavapipe's
// 65535 cap for contexts of a few thousand. Reductions in workgroup memory.

struct Params {
    n: u32, heads: u32, kv: u32, d: u32,
    pos0: u32, q_off: u32, q_stride: u32, o_off: u32,
    o_stride: u32, chunk: u32, splits: u32, _p2: u32,
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

struct Partial {
    m: f32,
    l: f32,
    acc0: f32,
    acc1: f32,
}

// The online softmax of query (t, h) over keys [j_start, j_end) (its scaled q in qs):
// running max m, sum l, and this thread's output dimensions lid and lid + 64.
fn attend(g: u32, j_start: u32, j_end: u32, lid: u32) -> Partial {
    let d = p.d;
    let row = p.kv * d; // cache row of one position
    var r = Partial(NEG, 0.0, 0.0, 0.0);
    for (var j0 = j_start; j0 < j_end; j0 += WG) {
        let j = j0 + lid;
        var s = NEG;
        if (j < j_end) {
            let kb = j * row + g * d;
            var dot_ = 0.0;
            for (var c = 0u; c < d; c++) {
                dot_ = fma(qs[c], kc[kb + c], dot_);
            }
            s = dot_;
        }
        let mnew = max(r.m, reduce(s, lid, true));
        var pj = 0.0;
        if (j < j_end) {
            pj = exp(s - mnew);
        }
        ps[lid] = pj;
        let psum = reduce(pj, lid, false); // its barriers also publish ps
        let corr = exp(r.m - mnew);
        r.l = r.l * corr + psum;
        r.acc0 *= corr;
        r.acc1 *= corr;
        let cnt = min(WG, j_end - j0);
        for (var jj = 0u; jj < cnt; jj++) {
            let vb = (j0 + jj) * row + g * d;
            let pw = ps[jj];
            if (lid < d) {
                r.acc0 = fma(pw, vc[vb + lid], r.acc0);
            }
            if (lid + WG < d) {
                r.acc1 = fma(pw, vc[vb + lid + WG], r.acc1);
            }
        }
        r.m = mnew;
        workgroupBarrier();
    }
    return r;
}

fn load_q(t: u32, h: u32, lid: u32) {
    let qb = p.q_off + t * p.q_stride + h * p.d;
    for (var c = lid; c < p.d; c += WG) {
        qs[c] = q[qb + c] * p.scale;
    }
    workgroupBarrier();
}

// Whole context in one workgroup per (position, head).
@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x;
    let h = wg.y;
    if (t >= p.n) {
        return;
    }
    load_q(t, h, lid);
    let r = attend(h / (p.heads / p.kv), 0u, p.pos0 + t + 1u, lid);
    let ob = p.o_off + t * p.o_stride + h * p.d;
    if (lid < p.d) {
        o[ob + lid] = r.acc0 / r.l;
    }
    if (lid + WG < p.d) {
        o[ob + lid + WG] = r.acc1 / r.l;
    }
}

// Split: workgroup (split, head, position) takes keys [split·chunk, (split+1)·chunk) and
// writes its partial [position][head][split][head_dim + 2] (acc, then m and l) to `o`
// (bound to the partials buffer); `merge` combines them. Few queries (decode, verify)
// then still fill the GPU. A split past the query's last key writes an empty partial.
@compute @workgroup_size(64)
fn split(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let sp = wg.x;
    let h = wg.y;
    let t = wg.z;
    if (t >= p.n) {
        return;
    }
    load_q(t, h, lid);
    let keys = p.pos0 + t + 1u;
    let start = min(sp * p.chunk, keys);
    let end = min(start + p.chunk, keys);
    let r = attend(h / (p.heads / p.kv), start, end, lid);
    let stride = p.d + 2u;
    let base = ((t * p.heads + h) * p.splits + sp) * stride;
    if (lid < p.d) {
        o[base + lid] = r.acc0;
    }
    if (lid + WG < p.d) {
        o[base + lid + WG] = r.acc1;
    }
    if (lid == 0u) {
        o[base + p.d] = r.m;
        o[base + p.d + 1u] = r.l;
    }
}

@group(0) @binding(0) var<uniform> mp: Params;
@group(0) @binding(1) var<storage, read> m_part: array<f32>;
@group(0) @binding(2) var<storage, read_write> m_o: array<f32>;

// Merge of the split partials: workgroup (position, head), thread c owns dimensions
// c and c + 64. Loops run `splits` times.
@compute @workgroup_size(64)
fn merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x;
    let h = wg.y;
    if (t >= mp.n) {
        return;
    }
    let stride = mp.d + 2u;
    let pb = (t * mp.heads + h) * mp.splits * stride;
    var mx = NEG;
    for (var s = 0u; s < mp.splits; s++) {
        mx = max(mx, m_part[pb + s * stride + mp.d]);
    }
    var den = 0.0;
    var a0 = 0.0;
    var a1 = 0.0;
    for (var s = 0u; s < mp.splits; s++) {
        let b = pb + s * stride;
        let l = m_part[b + mp.d + 1u];
        if (l > 0.0) {
            let f = exp(m_part[b + mp.d] - mx);
            den += l * f;
            if (lid < mp.d) {
                a0 = fma(m_part[b + lid], f, a0);
            }
            if (lid + WG < mp.d) {
                a1 = fma(m_part[b + lid + WG], f, a1);
            }
        }
    }
    let ob = mp.o_off + t * mp.o_stride + h * mp.d;
    if (lid < mp.d) {
        m_o[ob + lid] = a0 / den;
    }
    if (lid + WG < mp.d) {
        m_o[ob + lid + WG] = a1 / den;
    }
}
