// Kernel-lab variant of gemm_planes.wgsl: 256 threads (8 subgroups) over 128x64 tiles of Y,
// so a workgroup stages half the W words per output and passes half the barriers per
// output that the shipped 128-thread, 64x64 kernel does. Same parameters and bindings;
// m_pad a multiple of 128. `enable f16; enable wgpu_cooperative_matrix;`, gelu.wgsl and
// the engine's gemm_planes.wgsl Params/bindings are prepended by the lab, the epilogue
// appended.

const CK: u32 = 32u;
const XS4: u32 = 10u; // vec4 per staged X row: CK / 4 + 2 (rows 80 bytes apart: no bank conflicts)
const WS4: u32 = 18u; // vec4 per staged W row: 64 / 4 + 2
// The strides the cooperative loads pass, in vec4 units (the lab's `.halves` rewrite passes
// them in halves, in case the driver counts the other way).
const XLD: u32 = XS4;
const WLD: u32 = WS4;
const CS_STRIDE: u32 = 20u;
const LO_SCALE: f32 = 4096.0;

var<workgroup> xs_hi: array<vec4<f16>, 1280>; // [128][XS4]
var<workgroup> xs_lo: array<vec4<f16>, 1280>;
var<workgroup> ws: array<vec4<f16>, 576>;    // [CK][WS4]
var<workgroup> cs: array<f32, 2560>;         // [8 subgroups][16][CS_STRIDE]

// One 16x16 output block through this subgroup's tile of `cs` (as gemm_coop.wgsl).
fn emit(hi: coop_mat16x16<f32, C>, lo: coop_mat16x16<f32, C>, cb: u32, lane: u32, row: u32, col: u32) {
    workgroupBarrier();
    coopStoreT(hi, &cs[cb], CS_STRIDE);
    workgroupBarrier();
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + i * 32u;
        v[i] = cs[cb + (e / 16u) * CS_STRIDE + e % 16u];
    }
    workgroupBarrier();
    coopStoreT(lo, &cs[cb], CS_STRIDE);
    workgroupBarrier();
    for (var i = 0u; i < 8u; i++) {
        let e = lane + i * 32u;
        let r = e / 16u;
        let c = e % 16u;
        store(row + r, col + c, v[i] + cs[cb + r * CS_STRIDE + c] * (1.0 / LO_SCALE));
    }
}

fn xw(base: u32, k0: u32, lid: u32, i: u32) -> vec4<f16> {
    let e = lid + 256u * i;
    return xp[base + (e / 8u) * (p.k / 4u) + k0 / 4u + e % 8u];
}

fn ww(col0: u32, k0: u32, lid: u32, i: u32) -> vec4<f16> {
    let e = lid + 256u * i;
    return w[(k0 + e / 16u) * (p.n / 4u) + col0 / 4u + e % 16u];
}

fn put_x(hi: vec4<f16>, lo: vec4<f16>, lid: u32, i: u32) {
    let e = lid + 256u * i;
    let s = (e / 8u) * XS4 + e % 8u;
    xs_hi[s] = hi;
    xs_lo[s] = lo;
}

fn put_w(v: vec4<f16>, lid: u32, i: u32) {
    let e = lid + 256u * i;
    ws[(e / 16u) * WS4 + e % 16u] = v;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32,
        @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let row0 = wg.y * 128u;
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
    for (var k0 = 0u; k0 < p.k; k0 += CK) {
        workgroupBarrier();
        put_x(h0, l0, lid, 0u);
        put_x(h1, l1, lid, 1u);
        put_x(h2, l2, lid, 2u);
        put_x(h3, l3, lid, 3u);
        put_w(w0, lid, 0u);
        put_w(w1, lid, 1u);
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
