// Cooperative-matrix ceilings (16x16x16, f16 x f16 -> f32, one subgroup per matrix), so
// the tensor-core GEMM (gemm_coop.wgsl) can be read against what the device gives at all. `enable f16; enable wgpu_cooperative_matrix;` are prepended.
//
// main_regs:   multiply-adds only: A and B loaded once, 4 independent accumulators, p.a
//              rounds of 4 MMAs (the tensor cores' issue rate).
// main_shared: each round loads 2 A and 2 B blocks from workgroup memory at a moving
//              offset, then 4 MMAs (the inner loop of gemm_coop.wgsl without staging).
// Both store the accumulators so nothing is dead code. Workgroup 128 = 4 subgroups of 32.

struct Params {
    a: u32, b: u32, c: u32, d: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;

const ST: u32 = 24u; // halves per staged row
var<workgroup> sh: array<f16, 6144>; // 256 rows of ST

fn fill(lid: u32) {
    for (var i = lid; i < 6144u; i += 128u) {
        sh[i] = f16(f32(i % 7u) * 0.125 - 0.375);
    }
    workgroupBarrier();
}

fn out(c0: coop_mat16x16<f32, C>, c1: coop_mat16x16<f32, C>, c2: coop_mat16x16<f32, C>, c3: coop_mat16x16<f32, C>, base: u32) {
    coopStoreT(c0, &o[base], 16u);
    coopStoreT(c1, &o[base + 256u], 16u);
    coopStoreT(c2, &o[base + 512u], 16u);
    coopStoreT(c3, &o[base + 768u], 16u);
}

@compute @workgroup_size(128)
fn main_regs(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32) {
    fill(lid);
    let a = coopLoadT<coop_mat16x16<f16, A>>(&sh[sg * 16u * ST], ST);
    let b = coopLoadT<coop_mat16x16<f16, B>>(&sh[(sg + 4u) * 16u * ST], ST);
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    var c2 = coop_mat16x16<f32, C>();
    var c3 = coop_mat16x16<f32, C>();
    for (var i = 0u; i < p.a; i++) {
        c0 = coopMultiplyAdd(a, b, c0);
        c1 = coopMultiplyAdd(a, b, c1);
        c2 = coopMultiplyAdd(a, b, c2);
        c3 = coopMultiplyAdd(a, b, c3);
    }
    out(c0, c1, c2, c3, ((wg.x + wg.y * 32768u) * 4u + sg) * 1024u);
}

@compute @workgroup_size(128)
fn main_shared(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(subgroup_id) sg: u32) {
    fill(lid);
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    var c2 = coop_mat16x16<f32, C>();
    var c3 = coop_mat16x16<f32, C>();
    for (var i = 0u; i < p.a; i++) {
        let r = (i * 32u + sg * 16u) % 224u; // a moving row, so loads are not hoisted
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&sh[r * ST], ST);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&sh[(r + 16u) * ST], ST);
        let b0 = coopLoadT<coop_mat16x16<f16, B>>(&sh[(r + 8u) * ST], ST);
        let b1 = coopLoadT<coop_mat16x16<f16, B>>(&sh[(r + 8u) * ST + 8u], ST);
        c0 = coopMultiplyAdd(a0, b0, c0);
        c1 = coopMultiplyAdd(a0, b1, c1);
        c2 = coopMultiplyAdd(a1, b0, c2);
        c3 = coopMultiplyAdd(a1, b1, c3);
    }
    out(c0, c1, c2, c3, ((wg.x + wg.y * 32768u) * 4u + sg) * 1024u);
}
