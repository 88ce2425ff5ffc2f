// LayerNorm over rows: y = (x - mean) / sqrt(var + eps) * gamma + beta.
// One workgroup of 128 threads per row; the statistics from row_stats.wgsl (appended).

struct Params {
    rows: u32, cols: u32, x_off: u32, y_off: u32,
    eps: f32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> gamma: array<f32>;
@group(0) @binding(3) var<storage, read> beta: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

fn row_x(i: u32) -> f32 {
    return x[i];
}

@compute @workgroup_size(ROW_WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wg.x + wg.y * 32768u;
    if (row >= p.rows) {
        return;
    }
    let xb = p.x_off + row * p.cols;
    let st = row_stats(xb, p.cols, p.eps, lid);
    let mean = st.x;
    let inv = st.y;
    let yb = p.y_off + row * p.cols;
    for (var c = lid; c < p.cols; c += ROW_WG) {
        y[yb + c] = (x[xb + c] - mean) * inv * gamma[c] + beta[c];
    }
}
