// Strided row copy: dst[dst_off + i*dst_stride + c] = src[src_off + i*src_stride + c]
// for i < rows, c < width. Appends the K and V columns of a fused QKV result to the
// decoder's KV cache in one dispatch per cache (a buffer copy per row would cost a command
// per position during prefill).

struct Params {
    rows: u32, width: u32, src_off: u32, src_stride: u32,
    dst_off: u32, dst_stride: u32, _p0: u32, _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let i = gid.y;
    if (c >= p.width || i >= p.rows) {
        return;
    }
    dst[p.dst_off + i * p.dst_stride + c] = src[p.src_off + i * p.src_stride + c];
}
