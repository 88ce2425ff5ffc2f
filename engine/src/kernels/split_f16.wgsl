// f32 activations into f16 hi/lo planes for the cooperative-matrix kernels that read them
// (gemm_planes.wgsl, attention_coop.wgsl; the kernel lab's gemm_direct.wgsl): hi = x with the
// low 13 mantissa bits cleared (exactly an f16), lo = (x - hi) * 2^12, as gemm_coop.wgsl
// splits in workgroup memory. Two halves per u32 word (pack2x16float), a thread per word.
// Runs on any device (no f16 arithmetic): the kernel tests hold it to the CPU's split.
//
// main_rows:  X [rows][cols] (x_off, x_stride) -> [2][rows_pad][cols] (hi plane, lo plane);
//             rows past `rows` are zero, so consumers read whole 16-row tiles unchecked.
//             With conv_stride not 0, X is the im2col view of a kernel-3 / padding-1
//             convolution (gemm_io.wgsl's flag 8: X[t][k] = in[ci * conv_cs + (t *
//             conv_stride + tap - 1) * conv_ts], ci = k / 3, tap = k % 3, zero outside
//             [0, conv_tin)): the convolution as gemm_planes' GEMM. Columns from `heads` on
//             (where it is not 0) are zero: K padded to the GEMM's slice (conv1: 240 -> 256).
// main_heads: a fused Q|K|V [rows][3 heads 64] -> [6][heads][rows_pad][64] (q hi, q lo,
//             k hi, k lo, v hi, v lo), q multiplied by `scale`.
// main_norm_rows: LayerNorm(X) (gamma, beta, eps), split as main_rows: the LayerNorm before
//             a linear layer writes the GEMM's planes itself (one dispatch instead of two).
//             Its statistics are layernorm.wgsl's (row_stats.wgsl, appended to both).
// main_norm_rows_out: main_norm_rows also writing the normalised f32 rows (the encoder's
//             final LayerNorm: its output, and the cross K|V GEMM's planes).

struct Params {
    rows: u32, cols: u32, rows_pad: u32, heads: u32,
    x_off: u32, x_stride: u32, scale: f32, eps: f32,
    conv_cs: u32, conv_ts: u32, conv_stride: u32, conv_tin: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<storage, read> gamma: array<f32>; // main_norm_rows only
@group(0) @binding(4) var<storage, read> beta: array<f32>;

// LO_SCALE, split_hi and split_pair: f16_split.wgsl (appended).

// Element i of X for row_stats.wgsl (appended).
fn row_x(i: u32) -> f32 {
    return x[i];
}

// One element of the im2col view (gemm_io.wgsl's load_x with flag 8).
fn conv_x(row: u32, col: u32) -> f32 {
    if (p.heads != 0u && col >= p.heads) {
        return 0.0;
    }
    let ci = col / 3u;
    let t = i32(row * p.conv_stride + col % 3u) - 1;
    if (t < 0 || u32(t) >= p.conv_tin) {
        return 0.0;
    }
    return x[p.x_off + ci * p.conv_cs + u32(t) * p.conv_ts];
}

// Columns c and c + 1 of row r: of X, or of a convolution's im2col view where conv_stride
// is not 0.
fn row_pair(r: u32, c: u32) -> vec2<f32> {
    if (p.conv_stride != 0u) {
        return vec2<f32>(conv_x(r, c), conv_x(r, c + 1u));
    }
    let s = p.x_off + r * p.x_stride + c;
    return vec2<f32>(x[s], x[s + 1u]);
}

@compute @workgroup_size(256)
fn main_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * 32768u) * 256u + lid;
    let half_cols = p.cols / 2u;
    let plane = p.rows_pad * half_cols;
    if (i >= plane) {
        return;
    }
    let r = i / half_cols;
    var v = vec2<f32>(0.0);
    if (r < p.rows) {
        v = row_pair(r, 2u * (i % half_cols));
    }
    let w = split_pair(v.x, v.y);
    out[i] = w.x;
    out[plane + i] = w.y;
}

@compute @workgroup_size(256)
fn main_heads(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let i = (wg.x + wg.y * 32768u) * 256u + lid;
    let plane = p.heads * p.rows_pad * 32u; // words per plane
    if (i >= 3u * plane) {
        return;
    }
    let which = i / plane; // 0 q, 1 k, 2 v
    let j = i % plane;
    let dp = j % 32u;
    let t = (j / 32u) % p.rows_pad;
    let h = j / (32u * p.rows_pad);
    var a = 0.0;
    var b = 0.0;
    if (t < p.rows) {
        let s = p.x_off + t * p.x_stride + (which * p.heads + h) * 64u + 2u * dp;
        a = x[s];
        b = x[s + 1u];
        if (which == 0u) {
            a *= p.scale;
            b *= p.scale;
        }
    }
    let w = split_pair(a, b);
    out[2u * which * plane + j] = w.x;
    out[(2u * which + 1u) * plane + j] = w.y;
}

// Columns c and c + 1 of the row at xb normalised (st: mean, 1 / std): layernorm.wgsl's
// expression.
fn norm_pair(xb: u32, c: u32, st: vec2<f32>) -> vec2<f32> {
    let a = (x[xb + c] - st.x) * st.y * gamma[c] + beta[c];
    let b = (x[xb + c + 1u] - st.x) * st.y * gamma[c + 1u] + beta[c + 1u];
    return vec2<f32>(a, b);
}

// The row a main_norm_rows workgroup takes: where its planes words go, and (live) its
// statistics; padding rows (rows <= row < rows_pad) are written as zeros here and come back
// not live, as do rows past the grid's padding.
struct NormRow {
    live: bool,
    row: u32,
    ob: u32,
    plane: u32,
    xb: u32,
    st: vec2<f32>,
}

// The row's place without its statistics (st left 0): what norm_row and ahead_row share.
fn place_row(wg: vec3<u32>, lid: u32) -> NormRow {
    var r: NormRow;
    r.row = wg.x + wg.y * 32768u;
    if (r.row >= p.rows_pad) {
        return r;
    }
    let half_cols = p.cols / 2u;
    r.plane = p.rows_pad * half_cols;
    r.ob = r.row * half_cols;
    if (r.row >= p.rows) {
        for (var j = lid; j < half_cols; j += ROW_WG) {
            out[r.ob + j] = 0u;
            out[r.plane + r.ob + j] = 0u;
        }
        return r;
    }
    r.xb = p.x_off + r.row * p.x_stride;
    r.live = true;
    return r;
}

fn norm_row(wg: vec3<u32>, lid: u32) -> NormRow {
    var r = place_row(wg, lid);
    if (r.live) {
        r.st = row_stats(r.xb, p.cols, p.eps, lid);
    }
    return r;
}

// Rows of at most 6 ROW_WG columns (tiny.en to small.en): every load of a row issued before
// its statistics are summed, the statistics from registers (row_stats6) and the output
// pairs' x, gamma and beta already loaded; otherwise (norm_row, norm_pair) each loop waits
// on a round trip a round: ~10 in a row for tiny.en, 8.4 us a layernorm_planes on the H100
// for 0.6 us of bytes. The same arithmetic: the same words. NORM_AHEAD = false
// (kernels/mod.rs, VERBATIM_NORM_AHEAD=0) keeps the loops, to compare.
const NORM_AHEAD: bool = true;

// Pair j of the output (clamped to the row's last) of the row at xb: x, gamma, beta.
struct PairIn {
    x: vec2<f32>,
    g: vec2<f32>,
    b: vec2<f32>,
}

fn pair_in(xb: u32, j: u32, half_cols: u32) -> PairIn {
    let c = 2u * min(j, half_cols - 1u);
    return PairIn(vec2<f32>(x[xb + c], x[xb + c + 1u]), vec2<f32>(gamma[c], gamma[c + 1u]), vec2<f32>(beta[c], beta[c + 1u]));
}

// Pair q normalised: norm_pair's expression.
fn normed(q: PairIn, st: vec2<f32>) -> vec2<f32> {
    return vec2<f32>((q.x.x - st.x) * st.y * q.g.x + q.b.x, (q.x.y - st.x) * st.y * q.g.y + q.b.y);
}

// A row as NORM_AHEAD takes it: its place (place_row), its output pairs lid + ROW_WG i
// (i < 3) loaded, then its statistics.
struct AheadRow {
    n: NormRow,
    q0: PairIn,
    q1: PairIn,
    q2: PairIn,
}

fn ahead_row(wg: vec3<u32>, lid: u32) -> AheadRow {
    var r: AheadRow;
    r.n = place_row(wg, lid);
    if (r.n.live) {
        let half_cols = p.cols / 2u;
        r.q0 = pair_in(r.n.xb, lid, half_cols);
        r.q1 = pair_in(r.n.xb, lid + ROW_WG, half_cols);
        r.q2 = pair_in(r.n.xb, lid + 2u * ROW_WG, half_cols);
        r.n.st = row_stats6(r.n.xb, p.cols, p.eps, lid);
    }
    return r;
}

// The normalised pair v as planes words at pair j of the row.
fn put_planes(r: AheadRow, j: u32, v: vec2<f32>) {
    let w = split_pair(v.x, v.y);
    out[r.n.ob + j] = w.x;
    out[r.n.plane + r.n.ob + j] = w.y;
}

// Pair j of the row (its inputs q) normalised into the planes, where the row has it.
fn put_ahead(r: AheadRow, j: u32, q: PairIn) {
    if (j < p.cols / 2u) {
        put_planes(r, j, normed(q, r.n.st));
    }
}

// A live row's three pairs a thread into the planes.
fn planes_ahead(r: AheadRow, lid: u32) {
    if (r.n.live) {
        put_ahead(r, lid, r.q0);
        put_ahead(r, lid + ROW_WG, r.q1);
        put_ahead(r, lid + 2u * ROW_WG, r.q2);
    }
}

// One workgroup per row of the padded planes (rows_pad of them; x_stride is the row width).
@compute @workgroup_size(128)
fn main_norm_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (NORM_AHEAD && p.cols <= 6u * ROW_WG) {
        planes_ahead(ahead_row(wg, lid), lid);
        return;
    }
    let r = norm_row(wg, lid);
    if (!r.live) {
        return;
    }
    for (var j = lid; j < p.cols / 2u; j += ROW_WG) {
        let v = norm_pair(r.xb, 2u * j, r.st);
        let w = split_pair(v.x, v.y);
        out[r.ob + j] = w.x;
        out[r.plane + r.ob + j] = w.y;
    }
}

// `main_norm_rows_out`: main_norm_rows writing the normalised rows as f32 too ([rows][cols]
// from 0): the encoder's final LayerNorm, whose rows are the encoder's output and whose
// planes the cross K|V GEMM reads (one dispatch instead of a LayerNorm and a split).
@group(0) @binding(5) var<storage, read_write> y: array<f32>;

// put_ahead, the same values also into the f32 rows. (Not in main_norm_rows' call tree: a
// kernel that names `y` needs binding 5 in its layout.)
fn put_ahead_out(r: AheadRow, j: u32, q: PairIn) {
    if (j < p.cols / 2u) {
        let v = normed(q, r.n.st);
        y[r.n.row * p.cols + 2u * j] = v.x;
        y[r.n.row * p.cols + 2u * j + 1u] = v.y;
        put_planes(r, j, v);
    }
}

@compute @workgroup_size(128)
fn main_norm_rows_out(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (NORM_AHEAD && p.cols <= 6u * ROW_WG) {
        let r = ahead_row(wg, lid);
        if (r.n.live) {
            put_ahead_out(r, lid, r.q0);
            put_ahead_out(r, lid + ROW_WG, r.q1);
            put_ahead_out(r, lid + 2u * ROW_WG, r.q2);
        }
        return;
    }
    let r = norm_row(wg, lid);
    if (!r.live) {
        return;
    }
    for (var j = lid; j < p.cols / 2u; j += ROW_WG) {
        let v = norm_pair(r.xb, 2u * j, r.st);
        y[r.row * p.cols + 2u * j] = v.x;
        y[r.row * p.cols + 2u * j + 1u] = v.y;
        let w = split_pair(v.x, v.y);
        out[r.ob + j] = w.x;
        out[r.plane + r.ob + j] = w.y;
    }
}
