// A row's LayerNorm statistics, shared by layernorm.wgsl, split_f16.wgsl's main_norm_rows
// and ffn_decode.wgsl's main_sum_norm (appended to each, which define `row_x(i)`, element i
// of the row's storage), so all three normalise with the same arithmetic: 128 threads per
// row, the mean and the variance by two tree reductions (the two-pass form: subtracting the
// mean before squaring keeps f32 accurate for rows with a large mean, which the residual
// stream of a transformer has). A wider workgroup may call these from every thread (the
// barriers are in uniform control flow): threads from ROW_WG on add nothing.

const ROW_WG: u32 = 128u;
var<workgroup> row_red: array<f32, ROW_WG>;

// The binary tree's sums, two of its levels per barrier while they last: (r[l] + r[l + 2q])
// + (r[l + q] + r[l + 3q]) is what levels 2q and q add, so the bits are the tree's with 4
// barriers instead of 7 (gemv_common.wgsl's wg_sum does the same).
fn reduce_sum(v: f32, lid: u32) -> f32 {
    if (lid < ROW_WG) {
        row_red[lid] = v;
    }
    workgroupBarrier();
    var st = ROW_WG / 2u;
    for (; st >= 2u; st = st / 4u) {
        let q = st / 2u;
        if (lid < q) {
            row_red[lid] = (row_red[lid] + row_red[lid + st]) + (row_red[lid + q] + row_red[lid + st + q]);
        }
        workgroupBarrier();
    }
    if (st == 1u) {
        if (lid == 0u) {
            row_red[0] += row_red[1];
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

// row_stats for rows of at most 6 ROW_WG elements (d_model up to 768: tiny.en to small.en)
// with thread lid's elements lid + ROW_WG i loaded once, all before the first is added
// (addresses clamped to the row's last element, whose copies are not added): the loop
// above waits on a load a round, and loads the row again for the variance. The same sums
// in the same order.
fn row_stats6(xb: u32, cols: u32, eps: f32, lid: u32) -> vec2<f32> {
    let last = xb + cols - 1u;
    let a = vec3<f32>(row_x(min(xb + lid, last)), row_x(min(xb + lid + ROW_WG, last)), row_x(min(xb + lid + 2u * ROW_WG, last)));
    let b = vec3<f32>(row_x(min(xb + lid + 3u * ROW_WG, last)), row_x(min(xb + lid + 4u * ROW_WG, last)), row_x(min(xb + lid + 5u * ROW_WG, last)));
    let on = lid < ROW_WG;
    var s = 0.0;
    if (on && lid < cols) { s += a.x; }
    if (on && lid + ROW_WG < cols) { s += a.y; }
    if (on && lid + 2u * ROW_WG < cols) { s += a.z; }
    if (on && lid + 3u * ROW_WG < cols) { s += b.x; }
    if (on && lid + 4u * ROW_WG < cols) { s += b.y; }
    if (on && lid + 5u * ROW_WG < cols) { s += b.z; }
    let mean = reduce_sum(s, lid) / f32(cols);
    var q = 0.0;
    if (on && lid < cols) { let d = a.x - mean; q += d * d; }
    if (on && lid + ROW_WG < cols) { let d = a.y - mean; q += d * d; }
    if (on && lid + 2u * ROW_WG < cols) { let d = a.z - mean; q += d * d; }
    if (on && lid + 3u * ROW_WG < cols) { let d = b.x - mean; q += d * d; }
    if (on && lid + 4u * ROW_WG < cols) { let d = b.y - mean; q += d * d; }
    if (on && lid + 5u * ROW_WG < cols) { let d = b.z - mean; q += d * d; }
    return vec2<f32>(mean, inverseSqrt(reduce_sum(q, lid) / f32(cols) + eps));
}
