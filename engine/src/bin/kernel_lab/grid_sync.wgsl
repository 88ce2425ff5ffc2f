// Grid-wide barriers inside one dispatch, against dependent dispatches: what a decode step
// would cost as one persistent dispatch whose phases (the layers' GEMVs, attentions, ...)
// wait on each other through a counter in memory instead of through kernel boundaries.
//
// A grid barrier: every workgroup makes its stores available (storageBarrier: naga writes
// it with device-scope acquire-release semantics), its first thread adds one to a counter
// and spins until the counter reaches the next multiple of the grid (the counter only
// grows, so no reset between dispatches), and the workgroup barrier after the spin orders
// the loads that follow. This needs every workgroup of the grid resident at once (nothing
// in Vulkan promises forward progress otherwise): the grid is kept well under the SMs x the
// workgroups each SM holds, and a spin gives up after SPIN_CAP polls, counts a timeout and
// lets every later barrier fall through, so a grid that does not fit ends as a WRONG row
// instead of a hung device.
//
// Entries:
// - `main_barrier`: phases of nothing but a message: workgroup w reads what workgroup w + 1
//   wrote in the phase before and writes it plus one (p.c = 0: a fresh row of `msg` each
//   phase; p.c = 1: two rows in turn, so a stale cached line would show as a wrong count).
// - `main_phase`: one 384 x 384 f16 GEMV (tiny.en's decode shape, k-major words of two
//   columns) of the chain x[i + 1] = W[i] x[i], the phase given by p.c: a chain of these,
//   one dispatch each, is what the engine does today.
// - `main_chain`: all p.a phases in one dispatch with a grid barrier between them; each
//   workgroup loads its next phase's weights before it waits (they do not depend on x).
// - `main_chain_late`: the same, weights loaded after the barrier (what the prefetch buys).
// - `main_chain_atomic`: main_chain reading x through atomic loads (`xa`, the same buffer).
// - `main_phase_dyn`: main_phase with N and K read from the parameters, as the engine's
//   kernels take every shape (what compile-time dimensions are worth).
// - `main_phase_r1`, `_r2`, `_r3`: main_phase with its six products in another order (the
//   same work, other code): a chain that takes them in turn changes program at every
//   dispatch, as a decode step's kernels do.
//
// Plain loads are not enough inside one dispatch: on the H200 (NVIDIA 580) a load after the
// barrier can return a line that this SM's L1 cached earlier in the dispatch (main_barrier
// with two rows in turn reads old messages, and the GEMV chain read NaN poison whenever its
// rows were not 128-byte aligned, p.d = 2, so that reading row i also cached the head of row
// i + 1 before it was written). storageBarrier's device-scope acquire does not drop those
// lines; atomic loads go to L2.

struct Params {
    a: u32, // phases
    b: u32, // workgroups in the grid (the barrier's count)
    c: u32, // main_barrier: 1 = two message rows in turn; main_phase: the phase
    d: u32, // GEMV chain: floats before x[0] (2: rows that straddle 128-byte lines)
    n: u32, // main_phase_dyn: N and K read here instead of the constants (both 384)
    k: u32,
    _p0: u32,
    _p1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<vec4<u32>>; // [phases][K][N / 8]
@group(0) @binding(2) var<storage, read_write> xs: array<f32>; // [p.d][phases + 1][N]; msg rows
@group(0) @binding(3) var<storage, read_write> sync: array<atomic<u32>>; // [counter, timeouts]
@group(0) @binding(4) var<storage, read_write> xa: array<atomic<u32>>; // xs again, as atomics

const N: u32 = 384u;
const K: u32 = 384u;
const TILE: u32 = 32u; // outputs a workgroup: 4 vec4 words of 8 columns
const TILES: u32 = N / TILE; // 12 workgroups do the GEMV; the rest of a grid only syncs
const KL: u32 = 64u; // K lanes: thread t takes word t % 4 of its rows k = t / 4 + 64 j
const SPIN_CAP: u32 = 1048576u;

var<workgroup> red: array<vec4<f32>, 512>;

fn grid_sync(lid: u32) {
    storageBarrier();
    if (lid == 0u) {
        if (atomicLoad(&sync[1]) == 0u) {
            let old = atomicAdd(&sync[0], 1u);
            let target_ = (old / p.b + 1u) * p.b;
            var n = 0u;
            loop {
                if (bitcast<i32>(atomicLoad(&sync[0]) - target_) >= 0) {
                    break;
                }
                n++;
                if (n >= SPIN_CAP) {
                    atomicAdd(&sync[1], 1u);
                    break;
                }
            }
        }
    }
    storageBarrier();
}

@compute @workgroup_size(64)
fn main_barrier(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = p.b;
    let me = wg.x;
    let next = (me + 1u) % g;
    for (var i = 0u; i < p.a; i++) {
        let src = select(i, i % 2u, p.c == 1u);
        let dst = select(i + 1u, (i + 1u) % 2u, p.c == 1u);
        // Rows padded to 32 floats a workgroup (a 128-byte line each).
        let v = xs[(src * g + next) * 32u];
        if (lid == 0u) {
            xs[(dst * g + me) * 32u] = v + 1.0;
        }
        grid_sync(lid);
    }
}

// main_barrier with the messages in `sync` (words 32 ..), written and read as atomics:
// whether atomics see what a cached load of a reused address does not.
@compute @workgroup_size(64)
fn main_barrier_atomic(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let g = p.b;
    let me = wg.x;
    let next = (me + 1u) % g;
    for (var i = 0u; i < p.a; i++) {
        let src = i % 2u;
        let dst = (i + 1u) % 2u;
        let v = atomicLoad(&sync[32u + (src * g + next) * 32u]);
        if (lid == 0u) {
            atomicStore(&sync[32u + (dst * g + me) * 32u], v + 1u);
        }
        grid_sync(lid);
    }
}

struct W6 { a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>, e: vec4<u32>, f: vec4<u32> }

// Thread t's six words of phase i, tile `tile`: rows k = t / 4 + 64 j, word t % 4 of the tile.
fn load_w(i: u32, tile: u32, lid: u32) -> W6 {
    return load_w_dims(i, tile, lid, N, K);
}

fn load_w_dims(i: u32, tile: u32, lid: u32, n: u32, k: u32) -> W6 {
    let base = i * k * (n / 8u) + (lid / 4u) * (n / 8u) + tile * 4u + lid % 4u;
    let s = KL * (n / 8u);
    return W6(w[base], w[base + s], w[base + 2u * s], w[base + 3u * s], w[base + 4u * s], w[base + 5u * s]);
}

fn mac(acc: ptr<function, array<vec4<f32>, 2>>, word: vec4<u32>, x: f32) {
    let a = vec4<f32>(unpack2x16float(word.x), unpack2x16float(word.y));
    let b = vec4<f32>(unpack2x16float(word.z), unpack2x16float(word.w));
    (*acc)[0] = fma(a, vec4<f32>(x), (*acc)[0]);
    (*acc)[1] = fma(b, vec4<f32>(x), (*acc)[1]);
}

struct X6 { a: f32, b: f32, c: f32, d: f32, e: f32, f: f32 }

// Thread t's six values of x[i] (rows k = t / 4 + 64 j).
fn load_x(i: u32, lid: u32) -> X6 {
    return load_x_dims(i, lid, N);
}

fn load_x_dims(i: u32, lid: u32, n: u32) -> X6 {
    let xb = p.d + i * n + lid / 4u;
    return X6(xs[xb], xs[xb + KL], xs[xb + 2u * KL], xs[xb + 3u * KL], xs[xb + 4u * KL], xs[xb + 5u * KL]);
}

fn load_x_atomic(i: u32, lid: u32) -> X6 {
    let xb = p.d + i * N + lid / 4u;
    return X6(bitcast<f32>(atomicLoad(&xa[xb])), bitcast<f32>(atomicLoad(&xa[xb + KL])),
              bitcast<f32>(atomicLoad(&xa[xb + 2u * KL])), bitcast<f32>(atomicLoad(&xa[xb + 3u * KL])),
              bitcast<f32>(atomicLoad(&xa[xb + 4u * KL])), bitcast<f32>(atomicLoad(&xa[xb + 5u * KL])));
}

// x[i + 1][tile's 32 outputs] = W[i] x[i] with the weights in `wv`, x in `xv`.
fn gemv_phase(i: u32, tile: u32, lid: u32, wv: W6, xv: X6) {
    gemv_phase_dims(i, tile, lid, wv, xv, N);
}

fn gemv_phase_dims(i: u32, tile: u32, lid: u32, wv: W6, xv: X6, n: u32) {
    var acc = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
    mac(&acc, wv.a, xv.a);
    mac(&acc, wv.b, xv.b);
    mac(&acc, wv.c, xv.c);
    mac(&acc, wv.d, xv.d);
    mac(&acc, wv.e, xv.e);
    mac(&acc, wv.f, xv.f);
    gemv_finish(i, tile, lid, acc, n);
}

// The six products rotated by `rot` (a constant at each call, so each entry compiles to
// its own order), written out: a private array indexed in a loop may land in local memory.
fn gemv_phase_rot(i: u32, tile: u32, lid: u32, wv: W6, xv: X6, rot: u32) {
    var acc = array<vec4<f32>, 2>(vec4<f32>(0.0), vec4<f32>(0.0));
    if (rot == 1u) {
        mac(&acc, wv.b, xv.b); mac(&acc, wv.c, xv.c); mac(&acc, wv.d, xv.d);
        mac(&acc, wv.e, xv.e); mac(&acc, wv.f, xv.f); mac(&acc, wv.a, xv.a);
    } else if (rot == 2u) {
        mac(&acc, wv.c, xv.c); mac(&acc, wv.d, xv.d); mac(&acc, wv.e, xv.e);
        mac(&acc, wv.f, xv.f); mac(&acc, wv.a, xv.a); mac(&acc, wv.b, xv.b);
    } else {
        mac(&acc, wv.d, xv.d); mac(&acc, wv.e, xv.e); mac(&acc, wv.f, xv.f);
        mac(&acc, wv.a, xv.a); mac(&acc, wv.b, xv.b); mac(&acc, wv.c, xv.c);
    }
    gemv_finish(i, tile, lid, acc, N);
}

// The tile's 32 sums of `acc` over the K lanes, stored as x[i + 1]'s outputs.
fn gemv_finish(i: u32, tile: u32, lid: u32, acc: array<vec4<f32>, 2>, n: u32) {
    // 64 K lanes x 4 words: lanes l, l + 16, l + 32, l + 48 then the 16 that are left.
    red[2u * lid] = acc[0];
    red[2u * lid + 1u] = acc[1];
    workgroupBarrier();
    if (lid < 64u) {
        let q = lid / 4u; // 0..15
        let wd = lid % 4u;
        for (var h = 0u; h < 2u; h++) {
            let r = ((q * 4u + wd) * 2u) + h;
            red[r] = (red[r] + red[r + 128u]) + (red[r + 256u] + red[r + 384u]);
        }
    }
    workgroupBarrier();
    if (lid < 8u) {
        let wd = lid / 2u;
        let h = lid % 2u;
        var s = vec4<f32>(0.0);
        for (var q = 0u; q < 16u; q++) {
            s += red[(q * 4u + wd) * 2u + h];
        }
        let o = p.d + (i + 1u) * n + tile * TILE + wd * 8u + h * 4u;
        xs[o] = s.x;
        xs[o + 1u] = s.y;
        xs[o + 2u] = s.z;
        xs[o + 3u] = s.w;
    }
}

@compute @workgroup_size(256)
fn main_phase(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    gemv_phase(p.c, wg.x, lid, load_w(p.c, wg.x, lid), load_x(p.c, lid));
}

@compute @workgroup_size(256)
fn main_phase_r1(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    gemv_phase_rot(p.c, wg.x, lid, load_w(p.c, wg.x, lid), load_x(p.c, lid), 1u);
}

@compute @workgroup_size(256)
fn main_phase_r2(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    gemv_phase_rot(p.c, wg.x, lid, load_w(p.c, wg.x, lid), load_x(p.c, lid), 2u);
}

@compute @workgroup_size(256)
fn main_phase_r3(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    gemv_phase_rot(p.c, wg.x, lid, load_w(p.c, wg.x, lid), load_x(p.c, lid), 3u);
}

@compute @workgroup_size(256)
fn main_phase_dyn(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    gemv_phase_dims(p.c, wg.x, lid, load_w_dims(p.c, wg.x, lid, p.n, p.k), load_x_dims(p.c, lid, p.n), p.n);
}

// main_chain's loop: x read by plain or by atomic loads (`atomic_x`, constant at each call).
fn chain(tile: u32, lid: u32, atomic_x: bool) {
    let works = tile < TILES;
    var wv = W6(vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u), vec4<u32>(0u));
    if (works) {
        wv = load_w(0u, tile, lid);
    }
    for (var i = 0u; i < p.a; i++) {
        if (works) {
            var xv: X6;
            if (atomic_x) {
                xv = load_x_atomic(i, lid);
            } else {
                xv = load_x(i, lid);
            }
            gemv_phase(i, tile, lid, wv, xv);
            if (i + 1u < p.a) {
                wv = load_w(i + 1u, tile, lid);
            }
        }
        grid_sync(lid);
    }
}

@compute @workgroup_size(256)
fn main_chain(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    chain(wg.x, lid, false);
}

@compute @workgroup_size(256)
fn main_chain_atomic(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    chain(wg.x, lid, true);
}

@compute @workgroup_size(256)
fn main_chain_late(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let tile = wg.x;
    for (var i = 0u; i < p.a; i++) {
        if (tile < TILES) {
            gemv_phase(i, tile, lid, load_w(i, tile, lid), load_x(i, lid));
        }
        grid_sync(lid);
    }
}
