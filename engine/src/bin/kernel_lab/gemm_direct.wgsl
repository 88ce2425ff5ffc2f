// Encoder GEMM on cooperative matrices with every operand loaded straight from memory
// (no staging in workgroup memory): X as the f16 hi/lo planes split_f16.wgsl writes
// ([2][m_pad][k]), W as the f16 [k][n] it already is. gemm_coop.wgsl spends most of its
// time staging (kernel lab: 86 of 101 us with no products at all); here the L1 cache does
// what the staging did. Y = X W + b; k a multiple of 32, n of 64.

// The engine's gelu.wgsl, gemm_epilogue.wgsl and gemm_coop_emit.wgsl (LO_SCALE, `cs`, emit)
// are appended by the lab; the parameters are gemm_planes.wgsl's.
struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    y_off: u32, y_stride: u32, m_pad: u32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xp: array<f16>;
@group(0) @binding(2) var<storage, read> w: array<f16>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

// The lab's plain_store rewrite: four accumulators stored as they are, 16x16 blocks side
// by side at `o` (constant strides: naga 30's SPIR-V writer panics on a cooperative store
// whose stride is not a constant).
fn put4(a: coop_mat16x16<f32, C>, b: coop_mat16x16<f32, C>, c: coop_mat16x16<f32, C>, d: coop_mat16x16<f32, C>, o: u32) {
    coopStoreT(a, &y[o], 16u);
    coopStoreT(b, &y[o + 256u], 16u);
    coopStoreT(c, &y[o + 512u], 16u);
    coopStoreT(d, &y[o + 768u], 16u);
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row0 = wg.y * 64u + (sg / 2u) * 32u;
    let col0 = wg.x * 64u + (sg % 2u) * 32u;
    let sk = p.k; // the strides, named so the lab can make them constants
    let sn = p.n;
    let lo = p.m_pad * sk;
    let a0 = row0 * sk;
    let a1 = a0 + 16u * sk;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var d00 = coop_mat16x16<f32, C>();
    var d01 = coop_mat16x16<f32, C>();
    var d10 = coop_mat16x16<f32, C>();
    var d11 = coop_mat16x16<f32, C>();
    for (var k0 = 0u; k0 < p.k; k0 += 32u) {
        let k1 = k0 + 16u;
        let x0 = coopLoadT<coop_mat16x16<f16, A>>(&xp[a0 + k0], sk);
        let x1 = coopLoadT<coop_mat16x16<f16, A>>(&xp[a1 + k0], sk);
        let l0 = coopLoadT<coop_mat16x16<f16, A>>(&xp[lo + a0 + k0], sk);
        let l1 = coopLoadT<coop_mat16x16<f16, A>>(&xp[lo + a1 + k0], sk);
        let b0 = coopLoadT<coop_mat16x16<f16, B>>(&w[k0 * sn + col0], sn);
        let b1 = coopLoadT<coop_mat16x16<f16, B>>(&w[k0 * sn + col0 + 16u], sn);
        let y0 = coopLoadT<coop_mat16x16<f16, A>>(&xp[a0 + k1], sk);
        let y1 = coopLoadT<coop_mat16x16<f16, A>>(&xp[a1 + k1], sk);
        let m0 = coopLoadT<coop_mat16x16<f16, A>>(&xp[lo + a0 + k1], sk);
        let m1 = coopLoadT<coop_mat16x16<f16, A>>(&xp[lo + a1 + k1], sk);
        let e0 = coopLoadT<coop_mat16x16<f16, B>>(&w[k1 * sn + col0], sn);
        let e1 = coopLoadT<coop_mat16x16<f16, B>>(&w[k1 * sn + col0 + 16u], sn);
        c00 = coopMultiplyAdd(x0, b0, c00);
        c01 = coopMultiplyAdd(x0, b1, c01);
        c10 = coopMultiplyAdd(x1, b0, c10);
        c11 = coopMultiplyAdd(x1, b1, c11);
        d00 = coopMultiplyAdd(l0, b0, d00);
        d01 = coopMultiplyAdd(l0, b1, d01);
        d10 = coopMultiplyAdd(l1, b0, d10);
        d11 = coopMultiplyAdd(l1, b1, d11);
        c00 = coopMultiplyAdd(y0, e0, c00);
        c01 = coopMultiplyAdd(y0, e1, c01);
        c10 = coopMultiplyAdd(y1, e0, c10);
        c11 = coopMultiplyAdd(y1, e1, c11);
        d00 = coopMultiplyAdd(m0, e0, d00);
        d01 = coopMultiplyAdd(m0, e1, d01);
        d10 = coopMultiplyAdd(m1, e0, d10);
        d11 = coopMultiplyAdd(m1, e1, d11);
    }
    let cb = sg * 16u * CS_STRIDE;
    emit(c00, d00, cb, lane, row0, col0);
    emit(c01, d01, cb, lane, row0, col0 + 16u);
    emit(c10, d10, cb, lane, row0 + 16u, col0);
    emit(c11, d11, cb, lane, row0 + 16u, col0 + 16u);
}
