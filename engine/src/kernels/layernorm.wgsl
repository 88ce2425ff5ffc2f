// LayerNorm over rows: y = (x - mean) / sqrt(var + eps) * gamma + beta.
// One workgroup of 128 threads per row; mean and variance by two tree reductions (the
// two-pass form: subtracting the mean before squaring keeps f32 accurate for rows with a
// large mean, which the residual stream of a transformer has).

struct Params {
    rows: u32, cols: u32, x_off: u32, y_off: u32,
    eps: f32, _p0: u32, _p1: u32, _p2: u32,
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
    let mean = reduce_sum(s, lid) / f32(p.cols);
    var q = 0.0;
    for (var c = lid; c < p.cols; c += WG) {
        let d = x[xb + c] - mean;
        q += d * d;
    }
    let inv = inverseSqrt(reduce_sum(q, lid) / f32(p.cols) + p.eps);
    let yb = p.y_off + row * p.cols;
    for (var c = lid; c < p.cols; c += WG) {
        y[yb + c] = (x[xb + c] - mean) * inv * gamma[c] + beta[c];
    }
}
