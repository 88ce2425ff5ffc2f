// A row's LayerNorm statistics, shared by layernorm.wgsl and split_f16.wgsl's
// main_norm_rows (appended to each, which declare `x`), so both normalise with the same
// arithmetic: 128 threads per row, the mean and the variance by two tree reductions (the
// two-pass form: subtracting the mean before squaring keeps f32 accurate for rows with a
// large mean, which the residual stream of a transformer has).

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

// (mean, 1 / sqrt(variance + eps)) of x[xb .. xb + cols), thread `lid` of the row's 128.
fn row_stats(xb: u32, cols: u32, eps: f32, lid: u32) -> vec2<f32> {
    var s = 0.0;
    for (var c = lid; c < cols; c += WG) {
        s += x[xb + c];
    }
    let mean = reduce_sum(s, lid) / f32(cols);
    var q = 0.0;
    for (var c = lid; c < cols; c += WG) {
        let d = x[xb + c] - mean;
        q += d * d;
    }
    return vec2<f32>(mean, inverseSqrt(reduce_sum(q, lid) / f32(cols) + eps));
}
