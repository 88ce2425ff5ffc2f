// Lab template for the M = 1 f16 GEMV: y[n] = sum_k x[k] * W[k][n], with W k-major [K][N]
// and f16 pairs packed along N in u32 words, read exactly as ../../kernels/gemv.wgsl reads
// them. It is that kernel with the activation-row count fixed at one (no MAXM loop, no
// per-row accumulator array, no epilogue flags), so it isolates what a batch-1 decode step
// pays. kernel-lab.rs derives variants from it by rewriting ONE thing at a time: the shape
// constants, the weight-load width, the K-slice merge, or (for the pure-read twin) the whole
// body; it asserts that every rewritten text occurs here exactly once, so keep the marked
// pieces verbatim when editing this file.

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    x_off: u32, x_stride: u32, y_off: u32, y_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const CP: u32 = 32u; // threads along N per workgroup; each owns WPT words (2*WPT columns)
const KG: u32 = 8u; // slices of K per workgroup, merged through workgroup memory
const WPT: u32 = 1u; // words per thread per k: 1 (a u32 load) or 4 (one vec4<u32> load)

var<workgroup> red: array<array<vec2<f32>, WPT>, CP * KG>;

// One weight load: WPT words at index i (in units of WPT words), as WPT column pairs.
fn load_w(i: u32) -> array<vec2<f32>, WPT> {
    return array<vec2<f32>, WPT>(unpack2x16float(w[i]));
}

// The same load without the unpack, folded to one word (for the pure-read twin).
fn load_raw(i: u32) -> u32 {
    return w[i];
}

@compute @workgroup_size(CP, KG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let ng = p.n / (2u * WPT); // WPT-word groups per weight row
    let c = li.x; // which of the CP word groups of this workgroup
    let s = li.y; // which K slice
    let g = (wg.x + wg.y * 32768u) * CP + c;
    let kc = (p.k + KG - 1u) / KG;
    let k0 = s * kc;
    let k1 = min(p.k, k0 + kc);
    // -- body --
    var acc: array<vec2<f32>, WPT>;
    if (g < ng) {
        for (var k = k0; k < k1; k++) {
            let wv = load_w(k * ng + g);
            let xv = vec2<f32>(x[p.x_off + k]);
            for (var j = 0u; j < WPT; j++) {
                acc[j] = fma(xv, wv[j], acc[j]);
            }
        }
    }
    red[s * CP + c] = acc;
    workgroupBarrier();
    if (s == 0u && g < ng) {
        var t: array<vec2<f32>, WPT>;
        for (var q = 0u; q < KG; q++) {
            let r = red[q * CP + c];
            for (var j = 0u; j < WPT; j++) {
                t[j] += r[j];
            }
        }
        for (var j = 0u; j < WPT; j++) {
            let col = 2u * (g * WPT + j);
            y[p.y_off + col] = t[j].x;
            y[p.y_off + col + 1u] = t[j].y;
        }
    }
}
