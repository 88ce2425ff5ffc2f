// Embedding rows of the pass's tokens: h[t] = emb[ids[ids_off + t]] (f32 table
// [vocab][hidden]). The ids live on the GPU, so a token chosen by `argmax` can be fed to
// the next pass without a readback. An id outside the vocabulary writes zeros (the host
// checks ids it supplies; this only keeps a bad GPU-side id from reading out of bounds).

struct Params {
    n: u32, hidden: u32, vocab: u32, ids_off: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read> emb: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    if (c >= p.hidden || t >= p.n) {
        return;
    }
    let id = ids[p.ids_off + t];
    var v = 0.0;
    if (id < p.vocab) {
        v = emb[id * p.hidden + c];
    }
    h[t * p.hidden + c] = v;
}
