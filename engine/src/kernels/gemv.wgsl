// GEMV for a few rows of activations (decode steps, the last prefill position):
// Y[m][n] (=|+=) act(sum_k X[m][k] * W[n][k] + b[n]) for m < M <= 8.
//
// Memory-bound: every weight word is read exactly once per dispatch and used for all M
// rows. A workgroup of 64 threads owns 4 weight rows; threads stride over the packed f16
// words of those rows (neighbouring threads read neighbouring words), then a tree
// reduction in workgroup memory sums the 64 partials. No subgroup operations: the
// reduction does not depend on the subgroup size (8 on lavapipe, 32 NVIDIA, 64 AMD).
// flags as gemm.wgsl: 1 bias, 2 GELU, 4 accumulate.

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    x_off: u32, x_stride: u32, y_off: u32, y_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 64u;
const R: u32 = 4u;
const MAXM: u32 = 8u;

var<workgroup> red: array<f32, 2048>; // [MAXM * R][WG]

fn erf_approx(v: f32) -> f32 {
    let s = sign(v);
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return s * (1.0 - poly * exp(-a * a));
}

fn gelu(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n0 = (wg.x + wg.y * 32768u) * R;
    let kw = p.k / 2u;
    let m = min(p.m, MAXM);
    var acc: array<f32, 32>;
    for (var i = 0u; i < 32u; i++) {
        acc[i] = 0.0;
    }
    for (var wi = lid; wi < kw; wi += WG) {
        var wv: array<vec2<f32>, 4>;
        for (var r = 0u; r < R; r++) {
            wv[r] = vec2<f32>(0.0, 0.0);
            if (n0 + r < p.n) {
                wv[r] = unpack2x16float(w[(n0 + r) * kw + wi]);
            }
        }
        for (var mi = 0u; mi < m; mi++) {
            let xb = p.x_off + mi * p.x_stride + 2u * wi;
            let xv = vec2<f32>(x[xb], x[xb + 1u]);
            for (var r = 0u; r < R; r++) {
                acc[mi * R + r] += dot(xv, wv[r]);
            }
        }
    }
    let outs = m * R;
    for (var i = 0u; i < outs; i++) {
        red[i * WG + lid] = acc[i];
    }
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            for (var i = 0u; i < outs; i++) {
                red[i * WG + lid] += red[i * WG + lid + st];
            }
        }
        workgroupBarrier();
    }
    if (lid < outs) {
        let mi = lid / R;
        let n = n0 + lid % R;
        if (n < p.n) {
            var v = red[lid * WG];
            if ((p.flags & 1u) != 0u) {
                v += bias[n];
            }
            if ((p.flags & 2u) != 0u) {
                v = gelu(v);
            }
            let o = p.y_off + mi * p.y_stride + n;
            if ((p.flags & 4u) != 0u) {
                v += y[o];
            }
            y[o] = v;
        }
    }
}
