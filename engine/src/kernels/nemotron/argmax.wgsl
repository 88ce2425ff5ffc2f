// The best token of every position of a pass (a verify pass checks all its drafts at
// once): ids[t] = argmax logits[t], ties to the lower id (as the reference's first
// maximum). One workgroup of 256 per position; each thread scans a strided slice
// (vocab / 256 iterations: 512 for a 131072 vocabulary), then a tree in workgroup memory.

struct Params {
    n: u32, vocab: u32, l_off: u32, l_stride: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;

const WG: u32 = 256u;
var<workgroup> bv: array<f32, WG>;
var<workgroup> bi: array<u32, WG>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x;
    if (t >= p.n) {
        return;
    }
    let o = p.l_off + t * p.l_stride;
    var v = -3.4028235e38;
    var i = 0xffffffffu;
    for (var c = lid; c < p.vocab; c += WG) {
        let x = logits[o + c];
        if (i == 0xffffffffu || x > v) {
            v = x;
            i = c;
        }
    }
    bv[lid] = v;
    bi[lid] = i;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            let ov = bv[lid + st];
            let oi = bi[lid + st];
            if (oi != 0xffffffffu && (bi[lid] == 0xffffffffu || ov > bv[lid] || (ov == bv[lid] && oi < bi[lid]))) {
                bv[lid] = ov;
                bi[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        ids[t] = bi[0];
    }
}
