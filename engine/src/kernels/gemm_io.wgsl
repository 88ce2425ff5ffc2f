// What both f32-input encoder GEMMs share (gemm.wgsl: shader-arithmetic tiles; gemm_coop.wgsl:
// cooperative matrices): the parameters, the bindings and reading X (in place for a
// convolution). gemm_epilogue.wgsl follows it.
//
// Y[m][n] (=|+=) act(sum_k X[m][k] * W[n][k] + b[n]); W is stored transposed, [K][N]
// (k-major), as f16 pairs packed in u32 words along N; N is even. X and Y are f32.
//
// flags: 1 add bias, 2 GELU (exact, erf; gelu.wgsl is prepended), 4 accumulate into Y (residual add: Y += ...),
//        8 the input is a kernel-3 / padding-1 convolution read in place (im2col on the fly):
//          X[m][k] = in[ci * conv_cs + t * conv_ts], ci = k / 3, t = m * conv_stride + k % 3 - 1,
//          zero outside [0, conv_tin); the weight [Cout][Cin][3] is then exactly [N][K].
//        64 Y in column segments of y_stride, one after the other (gemm_epilogue.wgsl).

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
