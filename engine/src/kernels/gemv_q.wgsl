// GEMV over block-quantized weights (ggml's q8_0 and q4_0: 32 weights along K share an
// f16 scale; quant/block.rs has the formats, the layout and the CPU side): the decoder's
// kernel under `--quant` and in the quantized draft model of speculative decoding.
//   y[row][n] (=|+=) act(sum_k X'[row][k] * deq(W)[n][k] + b[n])
// X' is X or, with flag 16, LayerNorm(X) (the norm folded in, as gemv.wgsl). One grid layer
// per row (row = workgroup_id.z, any number of rows: prompts too): each row is computed
// exactly as it would be alone, so a verify pass reproduces single steps bit for bit.
// A workgroup is CQ columns x KQ slices of K's blocks. A thread owns one column and walks
// its slice a block at a time: the block's code words and its scale are all issued before
// the first is used (one memory round trip per block; decode is latency-bound), the
// block's dot product is summed in f32 and scaled once, and a tree over the KQ slices in
// workgroup memory finishes. Adjacent threads read adjacent words (the layout is k-major
// per code word), the activations are the same address across a column group (broadcast).
// Two entries: `main_q8` (8 words a block, signed bytes) and `main_q4` (4 words, nibbles
// offset by 8). Large matrices (the logits) use CQ 64 x KQ 4 (`GEMV_Q_WIDE` in mod.rs).
// flags as gemv.wgsl: 1 bias, 2 GELU, 4 accumulate, 16 LayerNorm (gemv_common.wgsl).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<u32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> gamma: array<f32>;
@group(0) @binding(6) var<storage, read> beta: array<f32>;
@group(0) @binding(7) var<storage, read_write> y: array<f32>;

// One row's statistics per workgroup (slot 0).
const MAXM: u32 = 1u;
const CQ: u32 = 16u;
const KQ: u32 = 16u;
const WG: u32 = 256u; // CQ * KQ

var<workgroup> part: array<f32, 256>;

// Input element k of this workgroup's row: 0 past K (a last block's padding).
fn xin(xr: u32, k: u32) -> f32 {
    if (k >= p.k) {
        return 0.0;
    }
    return ln_apply(x[xr + k], 0u, k);
}

fn dot_q8(u: u32, xr: u32, k0: u32) -> f32 {
    let s = bitcast<i32>(u);
    var t = f32(extractBits(s, 0u, 8u)) * xin(xr, k0);
    t = fma(f32(extractBits(s, 8u, 8u)), xin(xr, k0 + 1u), t);
    t = fma(f32(extractBits(s, 16u, 8u)), xin(xr, k0 + 2u), t);
    return fma(f32(extractBits(s, 24u, 8u)), xin(xr, k0 + 3u), t);
}

// Written out (a loop over the nibbles ran the lab's q4_0 GEMV at 79 GB/s on the H200).
fn dot_q4(u: u32, xr: u32, k0: u32) -> f32 {
    var t = f32(i32(u & 15u) - 8) * xin(xr, k0);
    t = fma(f32(i32((u >> 4u) & 15u) - 8), xin(xr, k0 + 1u), t);
    t = fma(f32(i32((u >> 8u) & 15u) - 8), xin(xr, k0 + 2u), t);
    t = fma(f32(i32((u >> 12u) & 15u) - 8), xin(xr, k0 + 3u), t);
    t = fma(f32(i32((u >> 16u) & 15u) - 8), xin(xr, k0 + 4u), t);
    t = fma(f32(i32((u >> 20u) & 15u) - 8), xin(xr, k0 + 5u), t);
    t = fma(f32(i32((u >> 24u) & 15u) - 8), xin(xr, k0 + 6u), t);
    return fma(f32(i32(u >> 28u) - 8), xin(xr, k0 + 7u), t);
}

fn block_scale(kb: u32, col: u32) -> f32 {
    let s = unpack2x16float(scales[(kb * p.n + col) / 2u]);
    return select(s.x, s.y, (col & 1u) != 0u);
}

struct Setup {
    col: u32,
    kq: u32,
    row: u32,
    xr: u32,
    kb0: u32,
    kb1: u32,
    eb: f32,
    ey: f32,
}

// The thread's column, slice of blocks and row; the epilogue's operands loaded ahead, then
// the LayerNorm statistics (uniform control flow).
fn setup(wg: vec3<u32>, li: vec3<u32>) -> Setup {
    var s: Setup;
    s.col = (wg.x + wg.y * 32768u) * CQ + li.x;
    s.kq = li.y;
    s.row = wg.z;
    s.xr = p.x_off + s.row * p.x_stride;
    let nb = (p.k + 31u) / 32u;
    let bc = (nb + KQ - 1u) / KQ;
    s.kb0 = s.kq * bc;
    s.kb1 = min(nb, s.kb0 + bc);
    s.eb = 0.0;
    s.ey = 0.0;
    if (s.kq == 0u && s.col < p.n) {
        if ((p.flags & 1u) != 0u) {
            s.eb = bias[s.col];
        }
        if ((p.flags & 4u) != 0u) {
            s.ey = y[p.y_off + s.row * p.y_stride + s.col];
        }
    }
    if (ln_on()) {
        ln_stats(s.xr, 0u, li.y * CQ + li.x);
        workgroupBarrier();
    }
    return s;
}

// Sum the slices' partial dot products and write the column.
fn reduce_and_finish(s: Setup, a: f32, li: vec3<u32>) {
    let slot = s.kq * CQ + li.x;
    part[slot] = a;
    workgroupBarrier();
    for (var st = KQ / 2u; st > 0u; st = st / 2u) {
        if (s.kq < st) {
            part[slot] += part[slot + st * CQ];
        }
        workgroupBarrier();
    }
    if (s.kq == 0u && s.col < p.n) {
        finish_pre(part[li.x], p.y_off + s.row * p.y_stride + s.col, s.eb, s.ey);
    }
}

@compute @workgroup_size(CQ, KQ)
fn main_q8(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let s = setup(wg, li);
    let n = p.n;
    var a = 0.0;
    if (s.col < n) {
        for (var kb = s.kb0; kb < s.kb1; kb++) {
            let b = kb * 8u * n + s.col;
            let u0 = w[b];
            let u1 = w[b + n];
            let u2 = w[b + 2u * n];
            let u3 = w[b + 3u * n];
            let u4 = w[b + 4u * n];
            let u5 = w[b + 5u * n];
            let u6 = w[b + 6u * n];
            let u7 = w[b + 7u * n];
            let d = block_scale(kb, s.col);
            let k0 = kb * 32u;
            var t = dot_q8(u0, s.xr, k0) + dot_q8(u1, s.xr, k0 + 4u);
            t += dot_q8(u2, s.xr, k0 + 8u) + dot_q8(u3, s.xr, k0 + 12u);
            t += dot_q8(u4, s.xr, k0 + 16u) + dot_q8(u5, s.xr, k0 + 20u);
            t += dot_q8(u6, s.xr, k0 + 24u) + dot_q8(u7, s.xr, k0 + 28u);
            a = fma(d, t, a);
        }
    }
    reduce_and_finish(s, a, li);
}

@compute @workgroup_size(CQ, KQ)
fn main_q4(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let s = setup(wg, li);
    let n = p.n;
    var a = 0.0;
    if (s.col < n) {
        for (var kb = s.kb0; kb < s.kb1; kb++) {
            let b = kb * 4u * n + s.col;
            let u0 = w[b];
            let u1 = w[b + n];
            let u2 = w[b + 2u * n];
            let u3 = w[b + 3u * n];
            let d = block_scale(kb, s.col);
            let k0 = kb * 32u;
            let t = (dot_q4(u0, s.xr, k0) + dot_q4(u1, s.xr, k0 + 8u)) + (dot_q4(u2, s.xr, k0 + 16u) + dot_q4(u3, s.xr, k0 + 24u));
            a = fma(d, t, a);
        }
    }
    reduce_and_finish(s, a, li);
}
