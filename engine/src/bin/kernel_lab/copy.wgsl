// Copy ceiling: dst = src in 16-byte (vec4<u32>) loads and stores. With UNROLL > 1 a thread
// moves UNROLL vectors a workgroup-width apart, so every load instruction of a subgroup still
// touches one contiguous run (coalesced) while each thread has more loads in flight.
// `fill` writes a non-zero pattern, so no driver or memory system can shortcut zero pages.

struct Params {
    n: u32, // vec4 elements
    row: u32, // workgroups per grid row (the grid is folded into x and y)
    seed: u32,
    pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;

const WG: u32 = 256u;
const UNROLL: u32 = 1u;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let base = (wg.x + wg.y * p.row) * (WG * UNROLL) + li.x;
    for (var u = 0u; u < UNROLL; u++) {
        let i = base + u * WG;
        if (i < p.n) {
            dst[i] = src[i];
        }
    }
}

@compute @workgroup_size(WG)
fn fill(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let base = (wg.x + wg.y * p.row) * (WG * UNROLL) + li.x;
    for (var u = 0u; u < UNROLL; u++) {
        let i = base + u * WG;
        if (i < p.n) {
            let h = (i ^ p.seed) * 2654435761u;
            dst[i] = vec4<u32>(h, h ^ 0x9e3779b9u, h + 1u, ~h);
        }
    }
}
