// Tiled GEMM on cooperative matrices (tensor cores): the encoder's linear layers and
// convolutions where the device offers wgpu's experimental cooperative matrices in the
// 16x16x16 f16 x f16 -> f32 shape with 32-wide subgroups (kernels/mod.rs checks; the
// `enable f16; enable wgpu_cooperative_matrix;` directives, gelu.wgsl, gemm_io.wgsl,
// gemm_epilogue.wgsl and gemm_coop_emit.wgsl (LO_SCALE, `cs`, emit) are prepended there).
// Same parameters, flags and epilogue as gemm.wgsl. Where X is rows in memory and the
// planes are reserved, the linear layers take gemm_planes.wgsl instead (faster); this one
// runs the convolutions (X read in place) and whatever the planes do not fit.
//
// Exact to f32, not f16: each X element is split into two f16 parts, hi = x with the low
// 13 mantissa bits cleared (exactly an f16) and lo = (x - hi) * 2^12 (rounded to f16), and
// both are multiplied by the (already f16) weight into separate f32 accumulators, combined
// as hi_acc + lo_acc * 2^-12 at the end. hi + lo carries ~22 of x's 24 mantissa bits, so
// the result matches the f32 GEMM to f32 rounding (the kernel test holds it to the same
// 1e-5 as gemm.wgsl) where plain f16 activations are off by ~1.5e-4 relative. Why bits and
// a scale rather than lo = f16(x - f32(f16(x))): on the H200's driver that form came out
// as f16 precision (the round trip folded away or the small lo flushed as a subnormal);
// integer masking cannot be folded, and the 2^12 keeps lo in f16's normal range. |x| must
// stay below 65504 (f16's range); encoder activations are far inside it.
//
// One workgroup of 4 subgroups computes a 64x64 tile of Y; subgroup s owns the 32x32
// block at rows 32 (s / 2), columns 32 (s % 2): 2x2 accumulators of 16x16. Each 32-deep
// slice of K is staged in workgroup memory as f16 (X as hi and lo, W as is), rows padded
// by 8 halves (16 bytes) so neighbouring rows do not share banks and every row starts
// 16-byte aligned. The next slice's global loads are issued into registers before the
// current slice's products (kernel lab: with staging in line, 128-thread workgroups spent
// 85 % of their time waiting on those loads; the products alone ran at 30-37 TFLOP/s).
// The accumulators leave through a small per-subgroup tile of workgroup memory, 16x16 at a
// time (hi, then lo), so that the epilogue (bias, GELU, residual) is the same per-element
// code as gemm.wgsl's, and the workgroup needs 20 KiB, not 47.

// The shape (the fetch and stage helpers are written out for it; kernels/mod.rs sizes the
// grid by CM and CN). The kernel lab also timed 64-deep slices (slower) and 256 threads
// over 128x64 tiles (15 % faster on one shape, the same on the other).
const WG: u32 = 128u;
const CM: u32 = 64u;
const CK: u32 = 32u;
const CN: u32 = 64u;
const XS_STRIDE: u32 = CK + 8u; // halves per staged X row
const WS_STRIDE: u32 = CN + 8u; // halves per staged W row (one k)

// x = hi + lo / LO_SCALE with hi exactly an f16 (see above).
fn split_hi(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) & 0xffffe000u);
}

var<workgroup> xs_hi: array<f16, CM * XS_STRIDE>; // [CM][XS_STRIDE]
var<workgroup> xs_lo: array<f16, CM * XS_STRIDE>;
var<workgroup> ws16: array<f16, CK * WS_STRIDE>; // [CK][WS_STRIDE]

// Elements 4q..4q+3 of a thread's X share of the slice at k0 (see main).
fn fetch_x(row0: u32, k0: u32, lid: u32, q: u32) -> vec4<f32> {
    let e = lid + 512u * q;
    return vec4<f32>(
        load_x(row0 + e / CK, k0 + e % CK),
        load_x(row0 + (e + 128u) / CK, k0 + (e + 128u) % CK),
        load_x(row0 + (e + 256u) / CK, k0 + (e + 256u) % CK),
        load_x(row0 + (e + 384u) / CK, k0 + (e + 384u) % CK),
    );
}

fn w_word(col0: u32, kk: u32, cw: u32) -> u32 {
    let n = col0 + 2u * cw;
    if (n >= p.n || kk >= p.k) {
        return 0u;
    }
    return w[kk * (p.n / 2u) + n / 2u];
}

// Words 4q..4q+3 of a thread's W share of the slice at k0.
fn fetch_w(col0: u32, k0: u32, lid: u32, q: u32) -> vec4<u32> {
    let e = lid + 512u * q;
    return vec4<u32>(
        w_word(col0, k0 + e / 32u, e % 32u),
        w_word(col0, k0 + (e + 128u) / 32u, (e + 128u) % 32u),
        w_word(col0, k0 + (e + 256u) / 32u, (e + 256u) % 32u),
        w_word(col0, k0 + (e + 384u) / 32u, (e + 384u) % 32u),
    );
}

fn stage_x1(v: f32, e: u32) {
    let i = (e / CK) * XS_STRIDE + e % CK;
    let hi = split_hi(v);
    xs_hi[i] = f16(hi);
    xs_lo[i] = f16((v - hi) * LO_SCALE);
}

fn stage_x(v: vec4<f32>, lid: u32, q: u32) {
    let e = lid + 512u * q;
    stage_x1(v.x, e);
    stage_x1(v.y, e + 128u);
    stage_x1(v.z, e + 256u);
    stage_x1(v.w, e + 384u);
}

fn stage_w1(word: u32, e: u32) {
    // (an f16 widened to f32 and back is exact; naga 30 mistypes bitcast<vec2<f16>>(u32))
    let pair = vec2<f16>(unpack2x16float(word));
    let i = (e / 32u) * WS_STRIDE + 2u * (e % 32u);
    ws16[i] = pair.x;
    ws16[i + 1u] = pair.y;
}

fn stage_w(v: vec4<u32>, lid: u32, q: u32) {
    let e = lid + 512u * q;
    stage_w1(v.x, e);
    stage_w1(v.y, e + 128u);
    stage_w1(v.z, e + 256u);
    stage_w1(v.w, e + 384u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row0 = wg.y * CM;
    let col0 = wg.x * CN;
    let sr = (sg / 2u) * 32u;
    let sc = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var d00 = coop_mat16x16<f32, C>(); // the lo parts' accumulators (x LO_SCALE)
    var d01 = coop_mat16x16<f32, C>();
    var d10 = coop_mat16x16<f32, C>();
    var d11 = coop_mat16x16<f32, C>();
    // A thread's share of a slice, loaded a slice ahead into named registers (private
    // arrays indexed in loops can land in local memory): X 64 rows x 32 columns as 4 vec4
    // (element i of 16 at e = lid + 128 i: row e / 32, column e % 32, so a row's columns are
    // read by neighbouring threads), W 32 k-rows x 32 words as 2 vec4 (word i of 8 at
    // e = lid + 128 i: k-row e / 32, column pair e % 32).
    var x0 = fetch_x(row0, 0u, lid, 0u);
    var x1 = fetch_x(row0, 0u, lid, 1u);
    var x2 = fetch_x(row0, 0u, lid, 2u);
    var x3 = fetch_x(row0, 0u, lid, 3u);
    var w0 = fetch_w(col0, 0u, lid, 0u);
    var w1 = fetch_w(col0, 0u, lid, 1u);
    for (var k0 = 0u; k0 < p.k; k0 += CK) {
        workgroupBarrier();
        stage_x(x0, lid, 0u);
        stage_x(x1, lid, 1u);
        stage_x(x2, lid, 2u);
        stage_x(x3, lid, 3u);
        stage_w(w0, lid, 0u);
        stage_w(w1, lid, 1u);
        workgroupBarrier();
        // The next slice's loads, in flight during this slice's products.
        let k1 = k0 + CK;
        if (k1 < p.k) {
            x0 = fetch_x(row0, k1, lid, 0u);
            x1 = fetch_x(row0, k1, lid, 1u);
            x2 = fetch_x(row0, k1, lid, 2u);
            x3 = fetch_x(row0, k1, lid, 3u);
            w0 = fetch_w(col0, k1, lid, 0u);
            w1 = fetch_w(col0, k1, lid, 1u);
        }
        for (var kk = 0u; kk < CK; kk += 16u) {
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&ws16[kk * WS_STRIDE + sc], WS_STRIDE);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&ws16[kk * WS_STRIDE + sc + 16u], WS_STRIDE);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_hi[sr * XS_STRIDE + kk], XS_STRIDE);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_hi[(sr + 16u) * XS_STRIDE + kk], XS_STRIDE);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            let l0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[sr * XS_STRIDE + kk], XS_STRIDE);
            let l1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[(sr + 16u) * XS_STRIDE + kk], XS_STRIDE);
            d00 = coopMultiplyAdd(l0, b0, d00);
            d01 = coopMultiplyAdd(l0, b1, d01);
            d10 = coopMultiplyAdd(l1, b0, d10);
            d11 = coopMultiplyAdd(l1, b1, d11);
        }
    }
    let cb = sg * 16u * CS_STRIDE;
    let r0 = row0 + sr;
    let q0 = col0 + sc;
    emit(c00, d00, cb, lane, r0, q0);
    emit(c01, d01, cb, lane, r0, q0 + 16u);
    emit(c10, d10, cb, lane, r0 + 16u, q0);
    emit(c11, d11, cb, lane, r0 + 16u, q0 + 16u);
}
