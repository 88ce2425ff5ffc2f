// GEMV over matrices much larger than the L2 (8 MiB and up: Whisper medium / large-v3's
// decode FFNs, the kernel lab's 128 MiB - 1 GiB matrices): y[row][n] (=|+=) act(sum_k
// X'[row][k] * W[n][k] + b[n]), one row per grid layer (wg.z), each row computed exactly
// as it would be alone (a verify pass reproduces single steps bit for bit).
//
// Built to stream: a thread owns 8 columns (one 16-byte vec4<u32> of W per k; the 8
// threads of a slice read 128 contiguous bytes of a k-row) in one K slice and walks its
// slice with one load per k and nothing else in the loop, leaving the unrolling and the
// loads in flight to the driver's compiler; a workgroup covers 64 columns and KG slices of K, merged
// through workgroup memory at the end. The kernel lab (`--gemv-only`, H200) measured it
// near the pure-read ceiling of its access pattern: 1 GiB at 98 % of the copy ceiling
// measured in the same run, 512 MiB at 97 %, 128 MiB at 87 %, where gemv.wgsl's `main_m1`
// reshaped to 32 column pairs x 8 slices (what shipped here before) read 62 / 60 / 53 %:
// its hand-unrolled rounds of 16 words kept fewer loads in flight than the compiler's own
// pipelining once wgpu's loop-bounding counters were off (gpu/mod.rs). At decode sizes
// (K up to ~3072, a few MB) main_m1 stays faster: there a dispatch's latency counts.
//
// KG (slices) and the workgroup size are rewritten together by kernels/mod.rs: 64 slices
// where the device allows 512 invocations and ~18 KiB of workgroup memory, else 32. N must be a multiple of 8 (mod.rs
// takes gemv.wgsl's `main_m1` otherwise). flags as gemv.wgsl: 1 bias, 2 GELU, 4
// accumulate, 16 LayerNorm folded in (the row's statistics computed per workgroup first).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> gamma: array<f32>;
@group(0) @binding(5) var<storage, read> beta: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const MAXM: u32 = 1u; // statistics slots (gemv_common.wgsl): one row per workgroup
const CP: u32 = 8u; // threads along N, 8 columns each
const KG: u32 = 32u; // K slices
const WG: u32 = CP * KG;

var<workgroup> red: array<vec4<f32>, 2u * WG>; // [KG][CP] x (columns 0-3, 4-7)

@compute @workgroup_size(8, 32)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let ng = p.n / 8u; // vec4 words per k-row of W
    let g = (wg.x + wg.y * 32768u) * CP + li.x;
    let s = li.y;
    let lid = s * CP + li.x;
    let row = wg.z;
    let xb = p.x_off + row * p.x_stride;
    if (ln_on()) {
        ln_stats(xb, 0u, lid);
        workgroupBarrier();
    }
    let kc = (p.k + KG - 1u) / KG;
    let k0 = s * kc;
    let k1 = min(p.k, k0 + kc);
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var a2 = vec2<f32>(0.0);
    var a3 = vec2<f32>(0.0);
    if (g < ng) {
        for (var k = k0; k < k1; k++) {
            let wv = w[k * ng + g];
            let xv = vec2<f32>(ln_apply(x[xb + k], 0u, k));
            a0 = fma(xv, unpack2x16float(wv.x), a0);
            a1 = fma(xv, unpack2x16float(wv.y), a1);
            a2 = fma(xv, unpack2x16float(wv.z), a2);
            a3 = fma(xv, unpack2x16float(wv.w), a3);
        }
    }
    red[2u * lid] = vec4<f32>(a0, a1);
    red[2u * lid + 1u] = vec4<f32>(a2, a3);
    workgroupBarrier();
    if (s == 0u && g < ng) {
        var lo = vec4<f32>(0.0);
        var hi = vec4<f32>(0.0);
        for (var q = 0u; q < KG; q++) {
            lo += red[2u * (q * CP + li.x)];
            hi += red[2u * (q * CP + li.x) + 1u];
        }
        let n0 = 8u * g;
        let o = p.y_off + row * p.y_stride + n0;
        let v = array<f32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
        for (var j = 0u; j < 8u; j++) {
            var b = 0.0;
            if ((p.flags & 1u) != 0u) {
                b = bias[n0 + j];
            }
            var yo = 0.0;
            if ((p.flags & 4u) != 0u) {
                yo = y[o + j];
            }
            finish_pre(v[j], o + j, b, yo);
        }
    }
}
