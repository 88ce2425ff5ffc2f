// What the attention kernels (attention.wgsl, attention_blocked.wgsl) share: the parameter
// block (`AttentionParams` in mod.rs) and the bindings. Prepended to each. Rows of Q, K, V
// and O are addressed through offsets and strides (a fused QKV buffer, a KV cache, the
// cross-attention's K|V serve as they are); split kernels write partials to the buffer
// bound as `o` and main_merge reads them from the one bound as `q`.

struct Params {
    tq: u32, tk: u32, heads: u32, d: u32,
    q_off: u32, q_stride: u32, k_off: u32, k_stride: u32,
    v_off: u32, v_stride: u32, o_off: u32, o_stride: u32,
    causal: u32, causal_offset: u32, scale: f32, split_keys: u32,
    // main_split only: 1 = a single split, write the normalised output to `o` (no merge).
    direct: u32,
    // main_merge_planes only: rows of its planes output (tq padded to the GEMM's tile).
    rows_pad: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> o: array<f32>;
