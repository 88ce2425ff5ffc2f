// Tiled GEMM with f16 weights in plain shader arithmetic (every device; gemm_io.wgsl is prepended:
// parameters, bindings, X reads, epilogue).
//
// W's k-major layout ([K][N] f16 pairs, read with unpack2x16float, so no SHADER_F16 feature
// is needed) makes every weight read contiguous across neighbouring threads, both here (a
// tile row) and in the GEMV kernel (one column pair per thread, no cross-thread reduction).
// One workgroup computes a 64x64 tile of Y from 16-deep slices of X and W staged in
// workgroup memory (each weight word read from memory once per 64 rows of X); each of the
// 256 threads owns a 4x4 block, rows 4ty+i and columns 4tx+j (a thread's stores of a row are
// 16 contiguous bytes, and contiguous across threads).

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

// Tiles as vec4 so that the inner loop reads a thread's 4 rows and 4 columns with one
// 16-byte load each (scalar loads made the loop bound by workgroup-memory instructions:
// 8 loads per 16 FMAs). xs rows are padded by one vec4 against bank conflicts on stores.
const XS_ROW: u32 = 17u; // vec4 per k-row of xs: BM / 4 + 1
var<workgroup> xs: array<vec4<f32>, 272>; // [BK][XS_ROW]: rows 4i..4i+3 in vec4 i
var<workgroup> ws: array<vec4<f32>, 256>; // [BK][BN / 4]: columns 4j..4j+3 in vec4 j

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
