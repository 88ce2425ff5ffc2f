// GEMV for a few rows of activations (decode steps, the last prefill position):
// Y[m][n] (=|+=) act(sum_k X[m][k] * W[n][k] + b[n]) for m < M <= 8.
//
// Memory-bound: every weight word is read exactly once per dispatch and used for all M
// rows. W is k-major ([K][N], f16 pairs packed along N, as gemm.wgsl). A workgroup is
// 8 column pairs x 32 slices of K (CP must match GEMV_COLUMN_PAIRS in mod.rs): the threads
// of a slice read neighbouring words of one weight row (32-byte sectors on a GPU), X is the
// same address across them (a broadcast), and one barrier merges the slices.
// Splitting K matters on a big GPU: with one thread walking all of K per column pair, a
// 384x1152 matrix gave 576 threads each with 384 loads in a row, 285 us per dispatch on
// the H200; 8 slices gave 19.6 us, and the kernel lab favoured 32 slices on large matrices.
// flags as gemm.wgsl: 1 bias, 2 GELU (gelu.wgsl is prepended), 4 accumulate.

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
const CP: u32 = 8u;
const KG: u32 = 32u;

var<workgroup> red: array<vec2<f32>, 2048>; // [KG][MAXM][CP]

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

@compute @workgroup_size(8, 32)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let nw = p.n / 2u;
    let cw = (wg.x + wg.y * 32768u) * CP + li.x;
    let kg = li.y;
    let m = min(p.m, MAXM);
    let kc = (p.k + KG - 1u) / KG;
    let k0 = kg * kc;
    let k1 = min(p.k, k0 + kc);
    var acc: array<vec2<f32>, 8>;
    for (var i = 0u; i < MAXM; i++) {
        acc[i] = vec2<f32>(0.0, 0.0);
    }
    if (cw < nw) {
        // Four weight words issued back to back before they are used: a GPU thread stalls
        // at the first use of a load, so a plain loop pays the memory latency per word.
        var k = k0;
        for (; k + 4u <= k1; k += 4u) {
            let w0 = unpack2x16float(w[k * nw + cw]);
            let w1 = unpack2x16float(w[(k + 1u) * nw + cw]);
            let w2 = unpack2x16float(w[(k + 2u) * nw + cw]);
            let w3 = unpack2x16float(w[(k + 3u) * nw + cw]);
            for (var mi = 0u; mi < m; mi++) {
                let xb = p.x_off + mi * p.x_stride + k;
                var a = acc[mi];
                a = fma(vec2<f32>(x[xb]), w0, a);
                a = fma(vec2<f32>(x[xb + 1u]), w1, a);
                a = fma(vec2<f32>(x[xb + 2u]), w2, a);
                a = fma(vec2<f32>(x[xb + 3u]), w3, a);
                acc[mi] = a;
            }
        }
        for (; k < k1; k++) {
            let wv = unpack2x16float(w[k * nw + cw]);
            for (var mi = 0u; mi < m; mi++) {
                acc[mi] = fma(vec2<f32>(x[p.x_off + mi * p.x_stride + k]), wv, acc[mi]);
            }
        }
    }
    for (var mi = 0u; mi < m; mi++) {
        red[(kg * MAXM + mi) * CP + li.x] = acc[mi];
    }
    workgroupBarrier();
    if (kg == 0u && cw < nw) {
        for (var mi = 0u; mi < m; mi++) {
            var s = vec2<f32>(0.0, 0.0);
            for (var g = 0u; g < KG; g++) {
                s += red[(g * MAXM + mi) * CP + li.x];
            }
            finish(s.x, 2u * cw, mi);
            finish(s.y, 2u * cw + 1u, mi);
        }
    }
}
