// gemm_planes.wgsl's output as f16 hi/lo planes instead of f32 rows, for the next
// cooperative-matrix kernel to read without a split dispatch between (split_f16.wgsl's
// arithmetic: hi = v with its 13 low mantissa bits cleared, lo = (v - hi) * 2^12). Appended
// to gemm_planes.wgsl (after gemm_epilogue.wgsl and gemm_coop_emit.wgsl), whose main then
// calls emit_planes instead of emit. Bias and GELU apply; accumulating cannot (planes are
// not summed into). Rows from m to m_pad are written as zeros.
//
// flags & 32 = 0: rows planes [2][m_pad][n] (gemm_planes' own input: fc1 -> fc2);
// flags & 32 != 0: head planes [6][heads][m_pad][64] of a fused Q|K|V, heads = n / 192, the
//   q third multiplied by p.q_scale (attention_coop.wgsl's input, as split_f16.wgsl's
//   main_heads writes it).

@group(0) @binding(5) var<storage, read_write> yw: array<u32>;

fn split_hi_f(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
}

// Element (row, col) of the tile: lanes 2i and 2i + 1 hold columns c and c + 1 of one row
// (c even); the even lane writes the pair's hi word, the odd lane its lo word.
fn put_plane(row: u32, col: u32, acc: f32, lane: u32) {
    var v = acc;
    if ((p.flags & 1u) != 0u) {
        v += bias[col];
    }
    if ((p.flags & 2u) != 0u) {
        v = gelu(v);
    }
    let heads_out = (p.flags & 32u) != 0u;
    let hd3 = p.n / 3u;
    if (heads_out && col < hd3) {
        v *= p.q_scale;
    }
    if (row >= p.m) {
        v = 0.0;
    }
    let other = subgroupShuffleXor(v, 1u);
    let odd = (lane & 1u) == 1u;
    let a = select(v, other, odd);
    let b = select(other, v, odd);
    let ha = split_hi_f(a);
    let hb = split_hi_f(b);
    let hi = pack2x16float(vec2<f32>(ha, hb));
    let lo = pack2x16float(vec2<f32>((a - ha) * LO_SCALE, (b - hb) * LO_SCALE));
    var word: u32;
    var plane: u32;
    if (heads_out) {
        let which = col / hd3; // q, k, v
        let hh = (col % hd3) / 64u;
        let heads = hd3 / 64u;
        word = 2u * which * heads * p.m_pad * 32u + (hh * p.m_pad + row) * 32u + (col % 64u) / 2u;
        plane = heads * p.m_pad * 32u;
    } else {
        word = row * (p.n / 2u) + col / 2u;
        plane = p.m_pad * (p.n / 2u);
    }
    yw[word + select(0u, plane, odd)] = select(hi, lo, odd);
}

// As gemm_coop_emit.wgsl's emit, into planes.
fn emit_planes(hi: coop_mat16x16<f32, C>, lo: coop_mat16x16<f32, C>, cb: u32, lane: u32, row: u32, col: u32) {
    let v = tile_values(hi, lo, cb, lane);
    for (var i = 0u; i < 8u; i++) {
        let e = lane + i * 32u;
        put_plane(row + e / 16u, col + e % 16u, v[i], lane);
    }
}
