// Clock warm-up: arithmetic only (~1 ms a dispatch on an H200 at its full clock, ~6 at its
// 345 MHz idle clock), enough to keep every SM busy while the clock climbs. The lab runs it
// through engine::gpu::warm_up before each timed section. Four independent fma chains a
// thread keep the FP32 units, not the chains' latency, the limit; one word a thread is
// stored so that the compiler cannot drop the loop.

struct Params {
    iters: u32, b: u32, c: u32, d: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gi: vec3<u32>) {
    var a = f32(gi.x) * 1e-6;
    var b = a + 0.25;
    var c = a + 0.5;
    var d = a + 0.75;
    for (var i = 0u; i < p.iters; i++) {
        a = fma(a, 0.9999, 0.0001);
        b = fma(b, 0.9999, 0.0001);
        c = fma(c, 0.9999, 0.0001);
        d = fma(d, 0.9999, 0.0001);
    }
    y[gi.x] = a + b + c + d;
}
