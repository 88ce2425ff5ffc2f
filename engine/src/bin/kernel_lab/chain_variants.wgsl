// Variants of chain.wgsl's one-workgroup "read the last, add one" probe, to tell apart what a
// decode step's heterogeneous chain pays beyond the plain dependent dispatch:
// - `main_shared`: the same with 16 KiB of workgroup memory in use (the GEMV and selection
//   kernels use 9-17 KiB; a change of a kernel's shared-memory size may reconfigure an SM);
// - `main_grid`: 256 workgroups, each adding one to its own 64 floats (a decode GEMV's grid
//   is 24-1621 workgroups): the launch and drain of a grid rather than of one workgroup.

struct Params {
    a: u32, b: u32, c: u32, d: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

var<workgroup> big: array<f32, 4096>;

@compute @workgroup_size(64)
fn main_shared(@builtin(local_invocation_id) li: vec3<u32>) {
    for (var i = li.x; i < 4096u; i += 64u) {
        big[i] = f32(i);
    }
    workgroupBarrier();
    y[li.x] = y[li.x] + 1.0 + big[4095u - li.x] - f32(4095u - li.x);
}

@compute @workgroup_size(64)
fn main_grid(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let i = wg.x * 64u + li.x;
    y[i] = y[i] + 1.0;
}
