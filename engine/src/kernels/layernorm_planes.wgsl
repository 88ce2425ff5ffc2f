// LayerNorm of rows written straight into f16 hi/lo planes (split_f16.wgsl's layout and
// split: [2][rows_pad][cols], rows past `rows` zero), for the encoder's GEMM over planes.
// One subgroup (32 lanes) per row, four rows per workgroup: the mean and the variance (the
// two-pass form, as layernorm.wgsl) by subgroupAdd, no workgroup barriers. split_f16.wgsl's
// main_norm_rows (layernorm.wgsl's 128-thread tree, two barriers a level) took 9 us a
// tiny.en window's LayerNorm on the H200. The sums are in another order than
// layernorm.wgsl's, so the values can differ from its rows in the last bits.
// Compiled where the device has cooperative matrices (the planes' only reader); needs
// 32-wide subgroups.

struct Params {
    rows: u32, cols: u32, rows_pad: u32, heads: u32,
    x_off: u32, x_stride: u32, scale: f32, eps: f32,
    conv_cs: u32, conv_ts: u32, conv_stride: u32, conv_tin: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read> gamma: array<f32>;
@group(0) @binding(4) var<storage, read> beta: array<f32>;

const LO_SCALE: f32 = 4096.0;

fn split_hi(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row = (wg.x + wg.y * 32768u) * 4u + sg;
    if (row >= p.rows_pad) {
        return;
    }
    let half_cols = p.cols / 2u;
    let plane = p.rows_pad * half_cols;
    let ob = row * half_cols;
    if (row >= p.rows) {
        for (var j = lane; j < half_cols; j += 32u) {
            out[ob + j] = 0u;
            out[plane + ob + j] = 0u;
        }
        return;
    }
    let xb = p.x_off + row * p.x_stride;
    var s = 0.0;
    for (var c = lane; c < p.cols; c += 32u) {
        s += x[xb + c];
    }
    let mean = subgroupAdd(s) / f32(p.cols);
    var q = 0.0;
    for (var c = lane; c < p.cols; c += 32u) {
        let d = x[xb + c] - mean;
        q += d * d;
    }
    let inv = inverseSqrt(subgroupAdd(q) / f32(p.cols) + p.eps);
    for (var j = lane; j < half_cols; j += 32u) {
        let c = 2u * j;
        let a = (x[xb + c] - mean) * inv * gamma[c] + beta[c];
        let b = (x[xb + c + 1u] - mean) * inv * gamma[c + 1u] + beta[c + 1u];
        let ha = split_hi(a);
        let hb = split_hi(b);
        out[ob + j] = pack2x16float(vec2<f32>(ha, hb));
        out[plane + ob + j] = pack2x16float(vec2<f32>((a - ha) * LO_SCALE, (b - hb) * LO_SCALE));
    }
}
