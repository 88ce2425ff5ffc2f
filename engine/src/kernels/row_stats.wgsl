// A row's LayerNorm statistics, shared by layernorm.wgsl, split_f16.wgsl's main_norm_rows
// and ffn_decode.wgsl's main_sum_norm (appended to each, which define `row_x(i)`, element i
// of the row's storage), so all three normalise with the same arithmetic: 128 threads per
// row, the mean and the variance by two tree reductions (the two-pass form: subtracting the
// mean before squaring keeps f32 accurate for rows with a large mean, which the residual
// stream of a transformer has). A wider workgroup may call these from every thread (the
// barriers are in uniform control flow): threads from ROW_WG on add nothing.

const ROW_WG: u32 = 128u;
var<workgroup> row_red: array<f32, ROW_WG>;

fn reduce_sum(v: f32, lid: u32) -> f32 {
    if (lid < ROW_WG) {
        row_red[lid] = v;
    }
    workgroupBarrier();
    for (var st = ROW_WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            row_red[lid] += row_red[lid + st];
        }
        workgroupBarrier();
    }
    let total = row_red[0];
    workgroupBarrier();
    return total;
}

// (mean, 1 / sqrt(variance + eps)) of the row's elements xb .. xb + cols, thread `lid` of
// the row's 128.
fn row_stats(xb: u32, cols: u32, eps: f32, lid: u32) -> vec2<f32> {
    var s = 0.0;
    for (var c = lid; c < cols && lid < ROW_WG; c += ROW_WG) {
        s += row_x(xb + c);
    }
    let mean = reduce_sum(s, lid) / f32(cols);
    var q = 0.0;
    for (var c = lid; c < cols && lid < ROW_WG; c += ROW_WG) {
        let d = row_x(xb + c) - mean;
        q += d * d;
    }
    return vec2<f32>(mean, inverseSqrt(reduce_sum(q, lid) / f32(cols) + eps));
}
