// What the two cooperative-matrix GEMMs (gemm_coop.wgsl, gemm_planes.wgsl) share: the
// hi/lo scale of their split activations and the way their accumulators leave, through a
// small per-subgroup tile of workgroup memory so that gemm_epilogue.wgsl's per-element
// store applies (bias, GELU, residual). Both run 4 subgroups per workgroup.

const LO_SCALE: f32 = 4096.0;
const CS_STRIDE: u32 = 20u; // floats per row of a subgroup's 16x16 output tile

var<workgroup> cs: array<f32, 1280>; // [4 subgroups][16][CS_STRIDE]

// One 16x16 output block through this subgroup's tile of `cs`: hi + lo / LO_SCALE, joined on
// the matrices before the store (one store and one read where the hi and lo tiles went
// through `cs` in turn), this lane's 8 elements (element e = lane + 32 i: row e / 16, column
// e % 16). Every subgroup calls it in step (the barriers are workgroup-wide).
fn tile_values(hi: coop_mat16x16<f32, C>, lo: coop_mat16x16<f32, C>, cb: u32, lane: u32) -> array<f32, 8> {
    workgroupBarrier();
    coopStoreT(hi + lo * (1.0 / LO_SCALE), &cs[cb], CS_STRIDE);
    workgroupBarrier();
    var v: array<f32, 8>;
    for (var i = 0u; i < 8u; i++) {
        let e = lane + i * 32u;
        v[i] = cs[cb + (e / 16u) * CS_STRIDE + e % 16u];
    }
    return v;
}

// One 16x16 output block (rows row.., columns col.. of Y) through the epilogue.
fn emit(hi: coop_mat16x16<f32, C>, lo: coop_mat16x16<f32, C>, cb: u32, lane: u32, row: u32, col: u32) {
    let v = tile_values(hi, lo, cb, lane);
    for (var i = 0u; i < 8u; i++) {
        let e = lane + i * 32u;
        store(row + e / 16u, col + e % 16u, v[i]);
    }
}
