// Which subgroup sizes the device really runs compute work at (it may vary within the
// adapter's min..max range): o[0] = smallest seen, o[1] = largest seen.

struct Params {
    a: u32, b: u32, c: u32, d: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> o: array<atomic<u32>>;

@compute @workgroup_size(256)
fn main(@builtin(subgroup_size) ss: u32) {
    atomicMin(&o[0], ss);
    atomicMax(&o[1], ss);
}
