// f32 GEMM over the rows of a pass, y[row] (=|+=) act(x[row] · Wᵀ + b), W row-major
// [n][k] (PyTorch's Linear). Serves the router logits, the shared expert and, in list
// mode, the routed experts: workgroup z is an expert e, its rows are the entries of its
// list (what `lists` in moe.wgsl builds), W is expert e's slice of a bank [E][n][k], so
// every selected expert's weights are read once per pass and unselected ones never.
//
// Tiles of 16 rows × 16 columns, one output per thread, K in chunks of 16 staged in
// workgroup memory. The innermost loop runs k times per invocation in all: fine on
// lavapipe (65535 cap) for k up to ~65000. No subgroup operations.
//
// Row mapping: plain mode, row r reads x row r and writes y row r; list mode, entry
// j = list[e·cap + r] (r < cnt[e]) reads x row j / xdiv (xdiv = top-k: an entry is
// position·k + slot) and writes y row j.

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    x_off: u32, x_stride: u32, y_off: u32, y_stride: u32,
    cap: u32, xdiv: u32, w_stride: u32, _p0: u32,
}

const F_RELU2: u32 = 1u;
const F_ACCUMULATE: u32 = 2u;
const F_LISTS: u32 = 4u;
const F_BIAS: u32 = 8u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read> list: array<u32>;
@group(0) @binding(5) var<storage, read> cnt: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

const T: u32 = 16u;
var<workgroup> xs: array<f32, 272>; // [16][17]
var<workgroup> ws: array<f32, 272>;
var<workgroup> rows_wg: u32;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = wg.z;
    let lists = (p.flags & F_LISTS) != 0u;
    if (lid == 0u) {
        var rows = p.m;
        if (lists) {
            rows = min(cnt[e], p.cap);
        }
        rows_wg = rows;
    }
    let rows = workgroupUniformLoad(&rows_wg);
    let row0 = wg.y * T;
    if (row0 >= rows) {
        return; // an expert chosen by fewer entries, or none: the tile is empty
    }
    let tx = lid % T;
    let ty = lid / T;
    let col0 = wg.x * T;
    // The row this thread loads (ty) and, in its output role, writes (also ty).
    let r = row0 + ty;
    let rlive = r < rows;
    var xrow = r;
    var yrow = r;
    if (lists && rlive) {
        let j = list[e * p.cap + r];
        xrow = j / p.xdiv;
        yrow = j;
    }
    let xb = p.x_off + xrow * p.x_stride;
    let wcol = col0 + ty; // the weight row (output column) this thread loads
    let wb = e * p.w_stride + wcol * p.k;
    var acc = 0.0;
    for (var k0 = 0u; k0 < p.k; k0 += T) {
        let kk = k0 + tx;
        var xv = 0.0;
        if (rlive && kk < p.k) {
            xv = x[xb + kk];
        }
        var wv = 0.0;
        if (wcol < p.n && kk < p.k) {
            wv = w[wb + kk];
        }
        xs[ty * 17u + tx] = xv;
        ws[ty * 17u + tx] = wv;
        workgroupBarrier();
        for (var i = 0u; i < T; i++) {
            acc = fma(xs[ty * 17u + i], ws[tx * 17u + i], acc);
        }
        workgroupBarrier();
    }
    let col = col0 + tx;
    if (rlive && col < p.n) {
        if ((p.flags & F_BIAS) != 0u) {
            acc += bias[col];
        }
        if ((p.flags & F_RELU2) != 0u) {
            let rl = max(acc, 0.0);
            acc = rl * rl;
        }
        let yi = p.y_off + yrow * p.y_stride + col;
        if ((p.flags & F_ACCUMULATE) != 0u) {
            acc += y[yi];
        }
        y[yi] = acc;
    }
}
