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
// (bias, GELU, residual). Shape: 64x64 tiles of Y, 4 subgroups of 2x2 16x16 blocks (or
// kernels/mod.rs's rewrites: TM rows x 32 WC columns, WR x WC subgroups of BR x 2 blocks), K in
// slices of CK = 32 (kernels/mod.rs GEMM_PLANES_CK; 64, the kernel lab's gemm_planes.ck64,
// measured slower in the engine: fc2 83 against 62 us) loaded a slice ahead into registers. n must be a multiple of TN, k of CK and m_pad of 64 (kernels/mod.rs falls
// back to gemm_coop.wgsl otherwise).
// `enable f16; enable wgpu_cooperative_matrix;` and gelu.wgsl are prepended,
// gemm_epilogue.wgsl and gemm_coop_emit.wgsl (LO_SCALE, `cs`, emit) appended.

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    y_off: u32, y_stride: u32, m_pad: u32, q_scale: f32, // q_scale: gemm_emit_planes.wgsl
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> xp: array<vec4<f16>>; // [2][m_pad][k / 4]
@group(0) @binding(2) var<storage, read> w: array<vec4<f16>>;  // [k][n / 4]
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const TM: u32 = 64u; // rows of Y per workgroup: 64 (4 subgroups of 2 x 2 blocks) or 32 (1 x 2)
const WR: u32 = 2u; // subgroups along the tile's rows
const WC: u32 = 2u; // subgroups along its columns, 32 columns each
const TN: u32 = 32u * WC; // columns of Y per workgroup
const NT: u32 = 32u * WR * WC; // threads (the workgroup size; kernels/mod.rs rewrites both)
const BR: u32 = TM / (16u * WR); // 16-row blocks per subgroup: 2 or 1
const TN4: u32 = TN / 4u; // vec4 of W per k-row of the tile
const CK: u32 = 32u; // K per slice (k must be a multiple)
const XR4: u32 = CK / 4u; // vec4 of X per row and slice
const XS4: u32 = XR4 + 2u; // vec4 per staged X row (rows 80 bytes apart for CK 32: no bank conflicts)
const WS4: u32 = TN4 + 2u; // vec4 per staged W row
const NX: u32 = TM * XR4 / NT; // X words per thread, plane and slice (TM rows x XR4 / NT threads)
const NW: u32 = CK * TN4 / NT; // W words per thread and slice (CK k-rows x TN4 / NT)
// The strides the cooperative loads pass, in vec4 units (the lab's `.halves` rewrite passes
// them in halves, in case the driver counts the other way).
const XLD: u32 = XS4;
const WLD: u32 = WS4;

var<workgroup> xs_hi: array<vec4<f16>, TM * XS4>; // [TM][XS4]
var<workgroup> xs_lo: array<vec4<f16>, TM * XS4>;
var<workgroup> ws: array<vec4<f16>, CK * WS4>;    // [CK][WS4]

// A thread's X words of a slice: element e = lid + NT i of TM XR4 per plane, row e / XR4,
// vec4 column e % XR4 (neighbouring threads read a row's contiguous bytes).
fn xw(base: u32, k0: u32, lid: u32, i: u32) -> vec4<f16> {
    let e = lid + NT * i;
    return xp[base + (e / XR4) * (p.k / 4u) + k0 / 4u + e % XR4];
}

// W words: element e of CK x TN4, k-row e / TN4, vec4 column e % TN4.
fn ww(col0: u32, k0: u32, lid: u32, i: u32) -> vec4<f16> {
    let e = lid + NT * i;
    return w[(k0 + e / TN4) * (p.n / 4u) + col0 / 4u + e % TN4];
}

fn put_x(hi: vec4<f16>, lo: vec4<f16>, lid: u32, i: u32) {
    let e = lid + NT * i;
    let s = (e / XR4) * XS4 + e % XR4;
    xs_hi[s] = hi;
    xs_lo[s] = lo;
}

fn put_w(v: vec4<f16>, lid: u32, i: u32) {
    let e = lid + NT * i;
    ws[(e / TN4) * WS4 + e % TN4] = v;
}

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row0 = wg.y * TM;
    let col0 = wg.x * TN;
    let sr = (sg / WC) * (16u * BR);
    let sc = (sg % WC) * 32u;
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
    // The next slice's words, loaded while this one is multiplied (constant indices only:
    // the arrays stay in registers).
    var h: array<vec4<f16>, NX>;
    var l: array<vec4<f16>, NX>;
    var wv: array<vec4<f16>, NW>;
    for (var i = 0u; i < NX; i++) {
        h[i] = xw(hb, 0u, lid, i);
        l[i] = xw(lb, 0u, lid, i);
    }
    for (var i = 0u; i < NW; i++) {
        wv[i] = ww(col0, 0u, lid, i);
    }
    for (var k0 = 0u; k0 < p.k; k0 += CK) {
        workgroupBarrier();
        for (var i = 0u; i < NX; i++) {
            put_x(h[i], l[i], lid, i);
        }
        for (var i = 0u; i < NW; i++) {
            put_w(wv[i], lid, i);
        }
        workgroupBarrier();
        let k1 = k0 + CK;
        if (k1 < p.k) {
            for (var i = 0u; i < NX; i++) {
                h[i] = xw(hb, k1, lid, i);
                l[i] = xw(lb, k1, lid, i);
            }
            for (var i = 0u; i < NW; i++) {
                wv[i] = ww(col0, k1, lid, i);
            }
        }
        for (var kk = 0u; kk < CK; kk += 16u) {
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&ws[kk * WS4 + sc / 4u], WLD);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&ws[kk * WS4 + sc / 4u + 4u], WLD);
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_hi[sr * XS4 + kk / 4u], XLD);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            let e0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[sr * XS4 + kk / 4u], XLD);
            d00 = coopMultiplyAdd(e0, b0, d00);
            d01 = coopMultiplyAdd(e0, b1, d01);
            if (BR == 2u) {
                let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_hi[(sr + 16u) * XS4 + kk / 4u], XLD);
                c10 = coopMultiplyAdd(a1, b0, c10);
                c11 = coopMultiplyAdd(a1, b1, c11);
                let e1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[(sr + 16u) * XS4 + kk / 4u], XLD);
                d10 = coopMultiplyAdd(e1, b0, d10);
                d11 = coopMultiplyAdd(e1, b1, d11);
            }
        }
    }
    let cb = sg * 16u * CS_STRIDE;
    let r0 = row0 + sr;
    let q0 = col0 + sc;
    emit(c00, d00, cb, lane, r0, q0);
    emit(c01, d01, cb, lane, r0, q0 + 16u);
    if (BR == 2u) {
        emit(c10, d10, cb, lane, r0 + 16u, q0);
        emit(c11, d11, cb, lane, r0 + 16u, q0 + 16u);
    }
}
