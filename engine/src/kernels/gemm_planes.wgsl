// The encoder's linear layers on cooperative matrices (tensor cores), X already split into
// f16 hi/lo planes in memory by split_f16.wgsl (`main_rows`: [2][m_pad][k], rows past m
// zero). gemm_coop.wgsl splits X itself while staging it: per thread and 32-deep K slice
// 16 f32 loads, 16 splits and 48 16-bit stores to workgroup memory. Here every array is
// seen as vec4<f16> and a thread moves 12 8-byte words from memory to workgroup memory, no
// conversion: kernel lab (H200), 1500x1536x384 39 against 84 us, 1500x384x1536 60 against
// 94, 1500x1152x384 42 against 84, plus 3.4-5.7 us for the split. The lab's
// `--direct-only --gemm-only` also found one workgroup alone spends ~3.5 us per K slice:
// each slice's instructions, not the grid, set the time.
//
// The cooperative loads take their stride in the pointer's element type (vec4 here: the
// lab's rewrite counting it in halves came out wrong). Exactness as gemm_coop.wgsl: hi and
// lo products in separate accumulators, hi + lo / 2^12 at the end, then gemm_epilogue.wgsl
// (bias, GELU, residual). Shape: 64x64 tiles of Y, 4 subgroups of 2x2 16x16 blocks, K in
// slices of 32 loaded a slice ahead into named registers. n must be a multiple of 64, k of
// 32 and m_pad of 64 (kernels/mod.rs falls back to gemm_coop.wgsl otherwise).
// `enable f16; enable wgpu_cooperative_matrix;` and gelu.wgsl are prepended,
// gemm_epilogue.wgsl and gemm_coop_emit.wgsl (LO_SCALE, `cs`, emit) appended.

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    y_off: u32, y_stride: u32, m_pad: u32, _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xp: array<vec4<f16>>; // [2][m_pad][k / 4]
@group(0) @binding(2) var<storage, read> w: array<vec4<f16>>;  // [k][n / 4]
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const CK: u32 = 32u;
const XS4: u32 = 10u; // vec4 per staged X row: CK / 4 + 2 (rows 80 bytes apart: no bank conflicts)
const WS4: u32 = 18u; // vec4 per staged W row: 64 / 4 + 2
// The strides the cooperative loads pass, in vec4 units (the lab's `.halves` rewrite passes
// them in halves, in case the driver counts the other way).
const XLD: u32 = XS4;
const WLD: u32 = WS4;

var<workgroup> xs_hi: array<vec4<f16>, 640>; // [64][XS4]
var<workgroup> xs_lo: array<vec4<f16>, 640>;
var<workgroup> ws: array<vec4<f16>, 576>;    // [CK][WS4]

// A thread's X words of a slice: element e = lid + 128 i of 512 per plane, row e / 8,
// vec4 column e % 8 (8 neighbouring threads read a row's 64 bytes).
fn xw(base: u32, k0: u32, lid: u32, i: u32) -> vec4<f16> {
    let e = lid + 128u * i;
    return xp[base + (e / 8u) * (p.k / 4u) + k0 / 4u + e % 8u];
}

// W words: element e of 512, k-row e / 16, vec4 column e % 16.
fn ww(col0: u32, k0: u32, lid: u32, i: u32) -> vec4<f16> {
    let e = lid + 128u * i;
    return w[(k0 + e / 16u) * (p.n / 4u) + col0 / 4u + e % 16u];
}

fn put_x(hi: vec4<f16>, lo: vec4<f16>, lid: u32, i: u32) {
    let e = lid + 128u * i;
    let s = (e / 8u) * XS4 + e % 8u;
    xs_hi[s] = hi;
    xs_lo[s] = lo;
}

fn put_w(v: vec4<f16>, lid: u32, i: u32) {
    let e = lid + 128u * i;
    ws[(e / 16u) * WS4 + e % 16u] = v;
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row0 = wg.y * 64u;
    let col0 = wg.x * 64u;
    let sr = (sg / 2u) * 32u;
    let sc = (sg % 2u) * 32u;
    let hb = row0 * (p.k / 4u);
    let lb = hb + p.m_pad * (p.k / 4u);
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var d00 = coop_mat16x16<f32, C>();
    var d01 = coop_mat16x16<f32, C>();
    var d10 = coop_mat16x16<f32, C>();
    var d11 = coop_mat16x16<f32, C>();
    var h0 = xw(hb, 0u, lid, 0u);
    var h1 = xw(hb, 0u, lid, 1u);
    var h2 = xw(hb, 0u, lid, 2u);
    var h3 = xw(hb, 0u, lid, 3u);
    var l0 = xw(lb, 0u, lid, 0u);
    var l1 = xw(lb, 0u, lid, 1u);
    var l2 = xw(lb, 0u, lid, 2u);
    var l3 = xw(lb, 0u, lid, 3u);
    var w0 = ww(col0, 0u, lid, 0u);
    var w1 = ww(col0, 0u, lid, 1u);
    var w2 = ww(col0, 0u, lid, 2u);
    var w3 = ww(col0, 0u, lid, 3u);
    for (var k0 = 0u; k0 < p.k; k0 += CK) {
        workgroupBarrier();
        put_x(h0, l0, lid, 0u);
        put_x(h1, l1, lid, 1u);
        put_x(h2, l2, lid, 2u);
        put_x(h3, l3, lid, 3u);
        put_w(w0, lid, 0u);
        put_w(w1, lid, 1u);
        put_w(w2, lid, 2u);
        put_w(w3, lid, 3u);
        workgroupBarrier();
        let k1 = k0 + CK;
        if (k1 < p.k) {
            h0 = xw(hb, k1, lid, 0u);
            h1 = xw(hb, k1, lid, 1u);
            h2 = xw(hb, k1, lid, 2u);
            h3 = xw(hb, k1, lid, 3u);
            l0 = xw(lb, k1, lid, 0u);
            l1 = xw(lb, k1, lid, 1u);
            l2 = xw(lb, k1, lid, 2u);
            l3 = xw(lb, k1, lid, 3u);
            w0 = ww(col0, k1, lid, 0u);
            w1 = ww(col0, k1, lid, 1u);
            w2 = ww(col0, k1, lid, 2u);
            w3 = ww(col0, k1, lid, 3u);
        }
        for (var kk = 0u; kk < CK; kk += 16u) {
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&ws[kk * WS4 + sc / 4u], WLD);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&ws[kk * WS4 + sc / 4u + 4u], WLD);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_hi[sr * XS4 + kk / 4u], XLD);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_hi[(sr + 16u) * XS4 + kk / 4u], XLD);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            let e0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[sr * XS4 + kk / 4u], XLD);
            let e1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[(sr + 16u) * XS4 + kk / 4u], XLD);
            d00 = coopMultiplyAdd(e0, b0, d00);
            d01 = coopMultiplyAdd(e0, b1, d01);
            d10 = coopMultiplyAdd(e1, b0, d10);
            d11 = coopMultiplyAdd(e1, b1, d11);
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
