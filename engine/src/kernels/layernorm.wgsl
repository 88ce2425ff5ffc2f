// LayerNorm over rows: y = (x - mean) / sqrt(var + eps) * gamma + beta.
// One workgroup of 128 threads per row; mean and variance by two tree reductions (the
// two-pass form: subtracting the mean before squaring keeps f32 accurate for rows with a
// large mean, which the residual stream of a transformer has).
//
// The arithmetic is spelled out so that the compiler has no choices: explicit fmas, and
// 1 / cols from the host instead of a division. gemv_rows.wgsl folds the decoder's final
// LayerNorm into the logits with this very arithmetic (`ln_stats_as_layernorm`), and the
// two must agree bit for bit (a verify pass normalises here, a decode step there); NVIDIA's
// compiler otherwise fuses a multiply into an add, or turns a division into a reciprocal
// and a multiply, differently from one kernel to the other.

struct Params {
    rows: u32, cols: u32, x_off: u32, y_off: u32,
    eps: f32, inv_cols: f32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const WG: u32 = 128u;
var<workgroup> red: array<f32, WG>;

fn reduce_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            red[lid] += red[lid + st];
        }
        workgroupBarrier();
    }
    let total = red[0];
    workgroupBarrier();
    return total;
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * 32768u;
    if (row >= p.rows) {
        return;
    }
    let xb = p.x_off + row * p.cols;
    var s = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        s += x[xb + c];
    }
    let mean = reduce_sum(s, lid) * p.inv_cols;
    var q = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let d = x[xb + c] - mean;
        q = fma(d, d, q);
    }
    let inv = inverseSqrt(fma(reduce_sum(q, lid), p.inv_cols, p.eps));
    let yb = p.y_off + row * p.cols;
    for (var c = lid; c < p.cols; c += WG) {
        y[yb + c] = fma((x[xb + c] - mean) * inv, gamma[c], beta[c]);
    }
}
