// Dispatch-cost probe: one workgroup that reads what the previous dispatch wrote and adds
// one. Bound to the same buffer every time, wgpu must put a barrier between the dispatches
// (a dependent chain, as a decode step is); bound to a different buffer each time, they are
// independent and the GPU may overlap them. The host checks the final counts, so a dispatch
// that was dropped or reordered cannot go unnoticed.

struct Params {
    a: u32, b: u32, c: u32, d: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(local_invocation_id) li: vec3<u32>) {
    y[li.x] = y[li.x] + 1.0;
}
