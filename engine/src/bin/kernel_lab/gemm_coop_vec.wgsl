// Lab candidate: kernels/gemm_coop.wgsl with its staging vectorised. The lab found the
// shipped GEMM bound by staging, not by its products (no products at all: 86 of 88 us):
// per 32-deep slice each thread issued 24 bounds-checked scalar loads and 48 scalar f16
// stores into workgroup memory. Here, where a slice lies wholly inside X and W (every
// slice of the encoder's linear layers), a thread loads 4 vec4 of X and 2 vec4<u32> of W
// (lanes side by side along a row, so a warp reads whole 128-byte lines) and writes runs
// of 4 or 8 adjacent halves, which the driver may merge into 8- or 16-byte stores. Edges,
// convolutions and unaligned strides keep the shipped scalar path. The products, their
// order and the epilogue are the shipped kernel's, so results are bit for bit the same.
//
// Bindings 5 and 6 are X and W again, as vec4 arrays (the lab binds the same buffers).

@group(0) @binding(5) var<storage, read> x4: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read> w4: array<vec4<u32>>;

const WG: u32 = 128u;
const CM: u32 = 64u;
const CK: u32 = 32u;
const CN: u32 = 64u;
const XS_STRIDE: u32 = CK + 8u;
const WS_STRIDE: u32 = CN + 8u;
const CS_STRIDE: u32 = 20u;
const LO_SCALE: f32 = 4096.0;

fn split_hi(x: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(x) & 0xffffe000u);
}

var<workgroup> xs_hi: array<f16, CM * XS_STRIDE>;
var<workgroup> xs_lo: array<f16, CM * XS_STRIDE>;
var<workgroup> ws16: array<f16, CK * WS_STRIDE>;
var<workgroup> cs: array<f32, WG / 2u * CS_STRIDE>;

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

// Whether the slice at k0 of this tile can take the vector path (uniform per workgroup).
fn x_whole(row0: u32, k0: u32) -> bool {
    return (p.flags & 8u) == 0u && row0 + CM <= p.m && k0 + CK <= p.k && p.x_off % 4u == 0u && p.x_stride % 4u == 0u;
}

fn w_whole(col0: u32, k0: u32) -> bool {
    return col0 + CN <= p.n && k0 + CK <= p.k && p.n % 8u == 0u;
}

// X: vec4 q of a thread's 4 covers row e / 8, columns 4 (e % 8).., e = lid + 128 q.
fn fetch_x(row0: u32, k0: u32, lid: u32, q: u32, whole: bool) -> vec4<f32> {
    let e = lid + WG * q;
    let r = row0 + e / 8u;
    let c = k0 + 4u * (e % 8u);
    if (whole) {
        return x4[(p.x_off + r * p.x_stride + c) / 4u];
    }
    return vec4<f32>(load_x(r, c), load_x(r, c + 1u), load_x(r, c + 2u), load_x(r, c + 3u));
}

fn w_word(col0: u32, kk: u32, cw: u32) -> u32 {
    let n = col0 + 2u * cw;
    if (n >= p.n || kk >= p.k) {
        return 0u;
    }
    return w[kk * (p.n / 2u) + n / 2u];
}

// W: vec4 q of a thread's 2 covers k-row e / 8, words 4 (e % 8).. (8 columns), e = lid + 128 q.
fn fetch_w(col0: u32, k0: u32, lid: u32, q: u32, whole: bool) -> vec4<u32> {
    let e = lid + WG * q;
    let kr = k0 + e / 8u;
    let cw = 4u * (e % 8u);
    if (whole) {
        return w4[(kr * (p.n / 2u) + col0 / 2u + cw) / 4u];
    }
    return vec4<u32>(w_word(col0, kr, cw), w_word(col0, kr, cw + 1u), w_word(col0, kr, cw + 2u), w_word(col0, kr, cw + 3u));
}

fn stage_x(v: vec4<f32>, lid: u32, q: u32) {
    let e = lid + WG * q;
    let i = (e / 8u) * XS_STRIDE + 4u * (e % 8u);
    let h = vec4<f32>(split_hi(v.x), split_hi(v.y), split_hi(v.z), split_hi(v.w));
    let l = (v - h) * LO_SCALE;
    xs_hi[i] = f16(h.x);
    xs_hi[i + 1u] = f16(h.y);
    xs_hi[i + 2u] = f16(h.z);
    xs_hi[i + 3u] = f16(h.w);
    xs_lo[i] = f16(l.x);
    xs_lo[i + 1u] = f16(l.y);
    xs_lo[i + 2u] = f16(l.z);
    xs_lo[i + 3u] = f16(l.w);
}

fn stage_w(v: vec4<u32>, lid: u32, q: u32) {
    let e = lid + WG * q;
    let i = (e / 8u) * WS_STRIDE + 8u * (e % 8u);
    let a = vec2<f16>(unpack2x16float(v.x));
    let b = vec2<f16>(unpack2x16float(v.y));
    let c = vec2<f16>(unpack2x16float(v.z));
    let d = vec2<f16>(unpack2x16float(v.w));
    ws16[i] = a.x;
    ws16[i + 1u] = a.y;
    ws16[i + 2u] = b.x;
    ws16[i + 3u] = b.y;
    ws16[i + 4u] = c.x;
    ws16[i + 5u] = c.y;
    ws16[i + 6u] = d.x;
    ws16[i + 7u] = d.y;
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
    var d00 = coop_mat16x16<f32, C>();
    var d01 = coop_mat16x16<f32, C>();
    var d10 = coop_mat16x16<f32, C>();
    var d11 = coop_mat16x16<f32, C>();
    var xw = x_whole(row0, 0u);
    var ww = w_whole(col0, 0u);
    var x0 = fetch_x(row0, 0u, lid, 0u, xw);
    var x1 = fetch_x(row0, 0u, lid, 1u, xw);
    var x2 = fetch_x(row0, 0u, lid, 2u, xw);
    var x3 = fetch_x(row0, 0u, lid, 3u, xw);
    var w0 = fetch_w(col0, 0u, lid, 0u, ww);
    var w1 = fetch_w(col0, 0u, lid, 1u, ww);
    for (var k0 = 0u; k0 < p.k; k0 += CK) {
        workgroupBarrier();
        stage_x(x0, lid, 0u);
        stage_x(x1, lid, 1u);
        stage_x(x2, lid, 2u);
        stage_x(x3, lid, 3u);
        stage_w(w0, lid, 0u);
        stage_w(w1, lid, 1u);
        workgroupBarrier();
        let k1 = k0 + CK;
        if (k1 < p.k) {
            xw = x_whole(row0, k1);
            ww = w_whole(col0, k1);
            x0 = fetch_x(row0, k1, lid, 0u, xw);
            x1 = fetch_x(row0, k1, lid, 1u, xw);
            x2 = fetch_x(row0, k1, lid, 2u, xw);
            x3 = fetch_x(row0, k1, lid, 3u, xw);
            w0 = fetch_w(col0, k1, lid, 0u, ww);
            w1 = fetch_w(col0, k1, lid, 1u, ww);
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
