// Decoder input: x[i][c] = embedding[token[tok_off + i]][c] + position[pos0 + i][c]
// (`tok_off`: a draft model keeps its tokens by position, the ones it chose itself included).
// The embedding table is the f16 matrix that also projects to logits (tied), kept row-major
// as the checkpoint stores it ([vocab][d], pairs packed along d; gemv_rows.wgsl reads it
// for the logits), so a token's row is contiguous. Positions are f32 [ctx][d]. One thread
// per pair of channels.
//
// At the head of a gated decode step (grid_hi > grid_lo: Kernels::embed), once an
// earlier step of the batch picked end-of-text (select.wgsl's main_pick set
// tokens[done_off]), it embeds nothing and zeroes grids[grid_lo..grid_hi): the grids the
// step's other dispatches read (Recorder::gate), which then run empty.

struct Params {
    n_tok: u32, d: u32, pos0: u32, vocab: u32,
    tok_off: u32, done_off: u32, grid_lo: u32, grid_hi: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> tokens: array<u32>;
@group(0) @binding(2) var<storage, read> emb: array<u32>;
@group(0) @binding(3) var<storage, read> pos: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
@group(0) @binding(5) var<storage, read_write> grids: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    if (p.grid_hi > p.grid_lo && tokens[p.done_off] != 0u) {
        if (gid.y == 0u) {
            for (var i = p.grid_lo + gid.x; i < p.grid_hi; i += 64u * nwg.x) {
                grids[i] = 0u;
            }
        }
        return;
    }
    let half_d = p.d / 2u;
    let cw = gid.x;
    let i = gid.y;
    if (cw >= half_d || i >= p.n_tok) {
        return;
    }
    // An out-of-range id would read another row; clamp (the host validates ids anyway).
    let t = min(tokens[p.tok_off + i], p.vocab - 1u);
    let c = 2u * cw;
    let e = unpack2x16float(emb[t * half_d + cw]);
    let a = e.x;
    let b = e.y;
    let pb = (p.pos0 + i) * p.d + c;
    let xb = i * p.d + c;
    x[xb] = a + pos[pb];
    x[xb + 1u] = b + pos[pb + 1u];
}
