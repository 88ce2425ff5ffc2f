// The epilogue of one output element, shared by the encoder GEMMs (gemm.wgsl, gemm_coop.wgsl,
// gemm_planes.wgsl): each declares `p` (with m, n, flags, y_off, y_stride), `bias` and `y`
// as gemm_io.wgsl does; the flags are gemm_io.wgsl's.

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
    var o = p.y_off + row * p.y_stride + col;
    if ((p.flags & 64u) != 0u) {
        // Y's columns in segments of y_stride, each stored as a matrix of its own after the
        // last: [n / y_stride][m][y_stride] (every decoder layer's cross K|V from one GEMM).
        o = p.y_off + (col / p.y_stride) * p.m * p.y_stride + row * p.y_stride + col % p.y_stride;
    }
    if ((p.flags & 4u) != 0u) {
        v += y[o];
    }
    y[o] = v;
}

