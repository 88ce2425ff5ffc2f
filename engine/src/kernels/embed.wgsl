// Decoder input: x[i][c] = embedding[token[tok_off + i]][c] + position[pos0 + i][c]
// (`tok_off`: a draft model keeps its tokens by position, the ones it chose itself included).
// The embedding table is the f16 matrix that also projects to logits (tied), stored
// k-major like every weight ([d][vocab], pairs packed along the vocabulary), so a token's
// row is a strided column here: d reads per token, negligible next to the projection,
// which reads the whole table. Positions are f32 [ctx][d]. One thread per pair of channels.

struct Params {
    n_tok: u32, d: u32, pos0: u32, vocab: u32,
    tok_off: u32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> emb: array<u32>;
@group(0) @binding(3) var<storage, read> pos: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let half_d = p.d / 2u;
    let cw = gid.x;
    let i = gid.y;
    if (cw >= half_d || i >= p.n_tok) {
        return;
    }
    // An out-of-range id would read another row; clamp (the host validates ids anyway).
    let t = min(tokens[p.tok_off + i], p.vocab - 1u);
    let vw = p.vocab / 2u;
    let c = 2u * cw;
    let e0 = unpack2x16float(emb[c * vw + t / 2u]);
    let e1 = unpack2x16float(emb[(c + 1u) * vw + t / 2u]);
    var a = e0.x;
    var b = e1.x;
    if ((t & 1u) != 0u) {
        a = e0.y;
        b = e1.y;
    }
    let pb = (p.pos0 + i) * p.d + c;
    let xb = i * p.d + c;
    x[xb] = a + pos[pb];
    x[xb + 1u] = b + pos[pb + 1u];
}
