// An f32 as two f16 halves, hi = x with its low 13 mantissa bits cleared (exactly an f16)
// and lo = (x - hi) * 2^12, packed two values to a u32 word: the planes every
// cooperative-matrix kernel reads. Appended to split_f16.wgsl (the split kernels) and
// attention.wgsl (main_merge_planes), which write planes from f32 values.

const LO_SCALE: f32 = 4096.0;

fn split_hi(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) & 0xffffe000u);
}

// (hi word, lo word) of the pair (a, b).
fn split_pair(a: f32, b: f32) -> vec2<u32> {
    let ha = split_hi(a);
    let hb = split_hi(b);
    return vec2<u32>(pack2x16float(vec2<f32>(ha, hb)),
                     pack2x16float(vec2<f32>((a - ha) * LO_SCALE, (b - hb) * LO_SCALE)));
}
