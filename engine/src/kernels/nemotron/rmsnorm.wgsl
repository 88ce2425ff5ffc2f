// Residual add + RMSNorm over the positions of a pass, one workgroup per position:
//   add == 1: h[b] += delta[b] (written back: h is the residual stream);
//   add == 2: h[b] += delta[b] + Σ_slot wts[b·k + slot] · eo[b·k + slot] (a MoE layer's
//             shared-expert output plus its routed sum, folded in: no combine pass);
//   y[b] = w · h[b] / sqrt(mean(h[b]²) + eps).
// The mean square is a tree reduction in workgroup memory (no subgroup size assumed).
// Each invocation loops cols / 256 times: far below lavapipe's 65535 loop cap.

struct Params {
    rows: u32, cols: u32, add: u32, k: u32,
    eps: f32, _p1: u32, _p2: u32, _p3: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> h: array<f32>;
@group(0) @binding(2) var<storage, read> delta: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<storage, read> wts: array<f32>;
@group(0) @binding(6) var<storage, read> eo: array<f32>;

const WG: u32 = 256u;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x;
    if (row >= p.rows) {
        return;
    }
    let base = row * p.cols;
    var ss = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        var v = h[base + c];
        if (p.add != 0u) {
            var d = delta[base + c];
            if (p.add == 2u) {
                var r = 0.0;
                for (var s = 0u; s < p.k; s++) {
                    let j = row * p.k + s;
                    r = fma(wts[j], eo[j * p.cols + c], r);
                }
                d += r;
            }
            v += d;
            h[base + c] = v;
        }
        ss = fma(v, v, ss);
    }
    red[lid] = ss;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    let inv = 1.0 / sqrt(red[0] / f32(p.cols) + p.eps);
    // Each thread rereads only the elements it wrote itself: no barrier needed.
    for (var c = lid; c < p.cols; c += WG) {
        y[base + c] = w[c] * (h[base + c] * inv);
    }
}
