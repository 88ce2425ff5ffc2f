// Tiled GEMM with f16 weights: Y[m][n] (=|+=) act(sum_k X[m][k] * W[n][k] + b[n]).
//
// W is stored transposed, [K][N] (k-major), as f16 pairs packed in u32 words along N and
// read with unpack2x16float, so no SHADER_F16 feature is needed; N is even. The k-major
// layout makes every weight read contiguous across neighbouring threads, both here (a tile
// row) and in the GEMV kernel (one column pair per thread, no cross-thread reduction).
// X and Y are f32. One workgroup computes a 64x64 tile of Y from 16-deep slices of X and W
// staged in workgroup memory (each weight word read from memory once per 64 rows of X);
// each of the 256 threads owns a 4x4 block, rows 4ty+i and columns 4tx+j (a thread's
// stores of a row are 16 contiguous bytes, and contiguous across threads).
//
// flags: 1 add bias, 2 GELU (exact, erf; gelu.wgsl is prepended), 4 accumulate into Y (residual add: Y += ...),
//        8 the input is a kernel-3 / padding-1 convolution read in place (im2col on the fly):
//          X[m][k] = in[ci * conv_cs + t * conv_ts], ci = k / 3, t = m * conv_stride + k % 3 - 1,
//          zero outside [0, conv_tin); the weight [Cout][Cin][3] is then exactly [N][K].

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    x_off: u32, x_stride: u32, y_off: u32, y_stride: u32,
    conv_cs: u32, conv_ts: u32, conv_stride: u32, conv_tin: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

// Tiles as vec4 so that the inner loop reads a thread's 4 rows and 4 columns with one
// 16-byte load each (scalar loads made the loop bound by workgroup-memory instructions:
// 8 loads per 16 FMAs). xs rows are padded by one vec4 against bank conflicts on stores.
const XS_ROW: u32 = 17u; // vec4 per k-row of xs: BM / 4 + 1
var<workgroup> xs: array<vec4<f32>, 272>; // [BK][XS_ROW]: rows 4i..4i+3 in vec4 i
var<workgroup> ws: array<vec4<f32>, 256>; // [BK][BN / 4]: columns 4j..4j+3 in vec4 j

fn load_x(row: u32, col: u32) -> f32 {
    if (row >= p.m || col >= p.k) {
        return 0.0;
    }
    if ((p.flags & 8u) != 0u) {
        let ci = col / 3u;
        let t = i32(row * p.conv_stride + col % 3u) - 1;
        if (t < 0 || u32(t) >= p.conv_tin) {
            return 0.0;
        }
        return x[p.x_off + ci * p.conv_cs + u32(t) * p.conv_ts];
    }
    return x[p.x_off + row * p.x_stride + col];
}

// One output element's epilogue: bias, GELU, residual accumulate, store.
fn store(row: u32, col: u32, acc: f32) {
    if (row >= p.m || col >= p.n) {
        return;
    }
    var v = acc;
    if ((p.flags & 1u) != 0u) {
        v += bias[col];
    }
    if ((p.flags & 2u) != 0u) {
        v = gelu(v);
    }
    let o = p.y_off + row * p.y_stride + col;
    if ((p.flags & 4u) != 0u) {
        v += y[o];
    }
    y[o] = v;
}

fn store_row(row: u32, col: u32, acc: vec4<f32>) {
    store(row, col, acc.x);
    store(row, col + 1u, acc.y);
    store(row, col + 2u, acc.z);
    store(row, col + 3u, acc.w);
}

// The 4x4 block of a thread (rows 4ty.., columns 4tx..) is four vec4 accumulators, not a
// private array: a private array indexed in loops can end up in (slow) local memory.
// Each output sums its k terms in ascending order, one fma each.
@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wg: vec3<u32>,
        @builtin(local_invocation_id) li: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row0 = wg.y * BM;
    let col0 = wg.x * BN;
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);
    let nw = p.n / 2u;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // X tile: 64 rows x 16 columns, 4 elements per thread.
        for (var i = 0u; i < 4u; i++) {
            let e = lid + i * 256u;
            let r = e / BK;
            let c = e % BK;
            xs[c * XS_ROW + r / 4u][r % 4u] = load_x(row0 + r, k0 + c);
        }
        // W tile: 16 k-rows x 32 words (64 columns), 2 words per thread.
        for (var i = 0u; i < 2u; i++) {
            let e = lid + i * 256u;
            let kr = e / 32u;
            let cw = e % 32u;
            let n = col0 + 2u * cw;
            let kk = k0 + kr;
            var pair = vec2<f32>(0.0, 0.0);
            if (n < p.n && kk < p.k) {
                pair = unpack2x16float(w[kk * nw + n / 2u]);
            }
            let wv = kr * (BN / 4u) + cw / 2u;
            let wc = 2u * (cw % 2u);
            ws[wv][wc] = pair.x;
            ws[wv][wc + 1u] = pair.y;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let a = xs[kk * XS_ROW + li.y];
            let b = ws[kk * (BN / 4u) + li.x];
            c0 = fma(vec4<f32>(a.x), b, c0);
            c1 = fma(vec4<f32>(a.y), b, c1);
            c2 = fma(vec4<f32>(a.z), b, c2);
            c3 = fma(vec4<f32>(a.w), b, c3);
        }
        workgroupBarrier();
    }
    let col = col0 + 4u * li.x;
    let row = row0 + 4u * li.y;
    store_row(row, col, c0);
    store_row(row + 1u, col, c1);
    store_row(row + 2u, col, c2);
    store_row(row + 3u, col, c3);
}
