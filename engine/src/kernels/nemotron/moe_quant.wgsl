// The routed experts' GEMM over their per-expert lists (what `lists` in moe.wgsl builds),
// reading quantized banks: entry point `q4tp` (4-bit groups of 32, 5-bit log-scale codes,
// per-row f16 base/step) and `q8_2f` (int8, f16 row scales, f16 column field applied to the
// input). Layouts: src/quant/q4tp.rs and src/quant/q8_2f.rs (the seed's); a bank is the
// resident experts' matrices back to back, `slot_words` apart (a multiple of 4).
//
// Workgroup z is expert e of the lists; `slots[e]` (the residency map) is its slot in the
// bank or MISS: a missing expert's workgroups return at once and its entries' rows of y
// stay as they were (the host writes them). Entry j = list[e·cap + i] (i < cnt[e]) reads x row
// j / xdiv (xdiv = top-k: an entry is position·k + slot; 1 when x has a row per entry) and
// writes y row j: y[j][row] (=|+=) act(Σ_k W[row][k] · x[j / xdiv][k]).
//
// Tiles of 32 weight rows × 8 entries, a thread per output, K in chunks of 128 columns:
// the chunk's x rows (8 × 128) and weights (q4tp: 4 groups × 32 rows as raw vec4<u32> plus
// one scale each; q8_2f: 32 rows × 32 words) are staged in workgroup memory (6.5 KB /
// 8.3 KB, inside lavapipe's 32 KiB), so every weight word is read from memory once per
// tile of 8 entries. Each thread then unpacks its row's words against its entry's x: no
// reduction across threads, no subgroup size assumed. Loops per invocation: cols / 128
// (q4tp) or cols / 4 (q8_2f), far below lavapipe's 65535 cap.

struct Params {
    rows: u32, cols: u32, gpr: u32, flags: u32,
    x_off: u32, x_stride: u32, y_off: u32, y_stride: u32,
    cap: u32, xdiv: u32, slot_words: u32, _p0: u32,
}

const F_RELU2: u32 = 1u;
const F_ACCUMULATE: u32 = 2u;
const MISS: u32 = 0xffffffffu;
const TR: u32 = 32u;
const TE: u32 = 8u;
const KC: u32 = 128u;

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> slots: array<u32>;
@group(0) @binding(4) var<storage, read> list: array<u32>;
@group(0) @binding(5) var<storage, read> cnt: array<u32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

// x of the chunk: [entry][32] vec4s.
var<workgroup> xs: array<vec4<f32>, 256>;
// q4tp: [group of the chunk][row] raw nibble groups and their scales.
var<workgroup> w4s: array<vec4<u32>, 128>;
var<workgroup> scs: array<f32, 128>;
// q8_2f: [row][33] words (32 used; the odd stride keeps the rows' reads on separate banks).
var<workgroup> w8s: array<u32, 1056>;
var<workgroup> count_wg: u32;
var<workgroup> slot_wg: u32;

fn word(i: u32) -> u32 {
    return w[i >> 2u][i & 3u];
}

fn byte_at(b: u32) -> u32 {
    return (word(b >> 2u) >> ((b & 3u) * 8u)) & 0xffu;
}

fn half_at(h: u32) -> f32 {
    let v = unpack2x16float(word(h >> 1u));
    return select(v.x, v.y, (h & 1u) == 1u);
}

// The 8 nibbles of a word as two vec4s (elements 0..3, 4..7), minus the offset 8.
fn nib_lo(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(0u, 4u, 8u, 12u)) & vec4<u32>(15u)) - 8.0;
}
fn nib_hi(v: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> vec4<u32>(16u, 20u, 24u, 28u)) & vec4<u32>(15u)) - 8.0;
}

// The 4 int8s of a word, byte 0 first.
fn i8x4(v: u32) -> vec4<f32> {
    let s = vec4<i32>(bitcast<i32>(v));
    return vec4<f32>((s << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

fn finish(acc: f32, j: u32, row: u32) {
    var o = acc;
    if ((p.flags & F_RELU2) != 0u) {
        let r = max(o, 0.0);
        o = r * r;
    }
    let yi = p.y_off + j * p.y_stride + row;
    if ((p.flags & F_ACCUMULATE) != 0u) {
        o += y[yi];
    }
    y[yi] = o;
}

// The workgroup's entry count and bank slot, uniform for the barriers that follow.
fn header(e: u32, lid: u32) {
    if (lid == 0u) {
        count_wg = min(cnt[e], p.cap);
        slot_wg = slots[e];
    }
}

// Stage x[entry te][c0 .. c0 + 128] (times the column field when `field` is not MISS).
fn stage_x(xb: u32, live: bool, c0: u32, tr: u32, te: u32, field: u32) {
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        let col = c0 + tr * 4u + c;
        if (live && col < p.cols) {
            var xv = x[xb + col];
            if (field != MISS) {
                xv *= half_at(field + col);
            }
            v[c] = xv;
        }
    }
    xs[te * 32u + tr] = v;
}

@compute @workgroup_size(256)
fn q4tp(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = wg.z;
    header(e, lid);
    let count = workgroupUniformLoad(&count_wg);
    let slot = workgroupUniformLoad(&slot_wg);
    let e0 = wg.y * TE;
    if (slot == MISS || e0 >= count) {
        return; // not resident (the host computes it), or no entries in this tile
    }
    let tr = lid % TR;
    let te = lid / TR;
    let row = wg.x * TR + tr;
    let rlive = row < p.rows;
    let elive = e0 + te < count;
    var j = 0u;
    if (elive) {
        j = list[e * p.cap + e0 + te];
    }
    let xb = p.x_off + (j / p.xdiv) * p.x_stride;
    let gpr = p.gpr;
    let base = slot * p.slot_words;
    let params_w = base + p.rows * gpr * 4u;
    let codes_b = (params_w + p.rows) * 4u;
    let cstride = (gpr * 5u + 7u) / 8u;
    var pm = vec2<f32>(0.0);
    if (rlive) {
        pm = unpack2x16float(word(params_w + row));
    }
    var acc = 0.0;
    let steps = (gpr + 3u) / 4u;
    for (var s = 0u; s < steps; s++) {
        let g0 = s * 4u;
        stage_x(xb, elive, g0 * 32u, tr, te, MISS);
        // Threads of entries 0..3 load group g0 + te of their row, with its scale.
        if (te < 4u) {
            let g = g0 + te;
            var v = vec4<u32>(0x88888888u); // nibbles of 8: zero weights
            var sc = 0.0;
            if (rlive && g < gpr) {
                v = w[(base >> 2u) + row * gpr + g];
                let bit = g * 5u;
                let b = codes_b + row * cstride + (bit >> 3u);
                let code = ((byte_at(b) | (byte_at(b + 1u) << 8u)) >> (bit & 7u)) & 31u;
                sc = exp2(pm.x + f32(code) * pm.y);
            }
            w4s[te * 32u + tr] = v;
            scs[te * 32u + tr] = sc;
        }
        workgroupBarrier();
        for (var gg = 0u; gg < 4u; gg++) {
            let v = w4s[gg * 32u + tr];
            let xo = te * 32u + gg * 8u;
            let d = dot(nib_lo(v.x), xs[xo]) + dot(nib_hi(v.x), xs[xo + 1u])
                + dot(nib_lo(v.y), xs[xo + 2u]) + dot(nib_hi(v.y), xs[xo + 3u])
                + dot(nib_lo(v.z), xs[xo + 4u]) + dot(nib_hi(v.z), xs[xo + 5u])
                + dot(nib_lo(v.w), xs[xo + 6u]) + dot(nib_hi(v.w), xs[xo + 7u]);
            acc = fma(scs[gg * 32u + tr], d, acc);
        }
        workgroupBarrier();
    }
    if (rlive && elive) {
        finish(acc, j, row);
    }
}

@compute @workgroup_size(256)
fn q8_2f(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let e = wg.z;
    header(e, lid);
    let count = workgroupUniformLoad(&count_wg);
    let slot = workgroupUniformLoad(&slot_wg);
    let e0 = wg.y * TE;
    if (slot == MISS || e0 >= count) {
        return;
    }
    let tr = lid % TR;
    let te = lid / TR;
    let r0 = wg.x * TR;
    let row = r0 + tr;
    let rlive = row < p.rows;
    let elive = e0 + te < count;
    var j = 0u;
    if (elive) {
        j = list[e * p.cap + e0 + te];
    }
    let xb = p.x_off + (j / p.xdiv) * p.x_stride;
    let cols4 = p.gpr;
    let wpr = cols4 / 4u; // words per row
    let base = slot * p.slot_words;
    let scales_h = base * 2u + p.rows * cols4 / 2u;
    let field_h = scales_h + p.rows;
    // Loader role: row r0 + lid / 8, words (lid % 8)·4 .. +4 of the chunk.
    let lrow = r0 + lid / 8u;
    let lw = (lid % 8u) * 4u;
    var acc = 0.0;
    let steps = (p.cols + KC - 1u) / KC;
    for (var s = 0u; s < steps; s++) {
        let c0 = s * KC;
        stage_x(xb, elive, c0, tr, te, field_h);
        for (var c = 0u; c < 4u; c++) {
            let wi = c0 / 4u + lw + c;
            var v = 0u;
            if (lrow < p.rows && wi < wpr) {
                v = word(base + lrow * wpr + wi);
            }
            w8s[(lid / 8u) * 33u + lw + c] = v;
        }
        workgroupBarrier();
        for (var i = 0u; i < 32u; i++) {
            acc += dot(i8x4(w8s[tr * 33u + i]), xs[te * 32u + i]);
        }
        workgroupBarrier();
    }
    if (rlive && elive) {
        finish(acc * half_at(scales_h + row), j, row);
    }
}
