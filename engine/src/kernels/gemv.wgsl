// GEMV for a few rows of activations (decode steps, the last prefill position):
// Y[m][n] (=|+=) act(sum_k X[m][k] * W[n][k] + b[n]) for m < M <= 8.
//
// Memory-bound: every weight word is read exactly once per dispatch and used for all M
// rows. W is k-major ([K][N], f16 pairs packed along N, as gemm.wgsl), so each thread owns
// one pair of output columns and walks down K: neighbouring threads read neighbouring
// words (coalesced on a GPU, one vector load on a CPU rasteriser), X is the same address
// for every thread (a broadcast), and no cross-thread reduction or barrier is needed.
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

const MAXM: u32 = 8u;

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

fn finish(v0: f32, n: u32, mi: u32) {
    var v = v0;
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

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let nw = p.n / 2u;
    let cw = gid.x + gid.y * 65536u; // grid (1024, y) workgroups of 64
    if (cw >= nw) {
        return;
    }
    let m = min(p.m, MAXM);
    var acc: array<vec2<f32>, 8>;
    for (var i = 0u; i < MAXM; i++) {
        acc[i] = vec2<f32>(0.0, 0.0);
    }
    for (var k = 0u; k < p.k; k++) {
        let wv = unpack2x16float(w[k * nw + cw]);
        for (var mi = 0u; mi < m; mi++) {
            acc[mi] = fma(vec2<f32>(x[p.x_off + mi * p.x_stride + k]), wv, acc[mi]);
        }
    }
    for (var mi = 0u; mi < m; mi++) {
        finish(acc[mi].x, 2u * cw, mi);
        finish(acc[mi].y, 2u * cw + 1u, mi);
    }
}
