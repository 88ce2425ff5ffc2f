// What the two GEMV families (gemv.wgsl: f16 weights; gemv_q.wgsl: q8_0 / q4_0 blocks)
// share: the LayerNorm folded into the input rows and the epilogue with its operands loaded
// ahead, and the parameter block (`GemvParams` in mod.rs). Prepended to each (after
// gelu.wgsl); the including file declares `p: Params` (binding 0), `x`, `gamma`, `beta`,
// `y`, `bias`, `WG` (threads per workgroup) and `MAXM` (rows whose statistics a workgroup
// keeps).

struct Params {
    m: u32, n: u32, k: u32, flags: u32,
    x_off: u32, x_stride: u32, y_off: u32, y_stride: u32,
    eps: f32,
    // gemv.wgsl flag 32 only: X is the split attention's partials, `merge_splits` splits of
    // heads of `merge_hd` (see gemv.wgsl)
    merge_splits: u32, merge_hd: u32, _p2: u32,
}

var<workgroup> rs: array<f32, WG>; // one per thread (wg_sum)
var<workgroup> stat: array<f32, 16>; // mean[MAXM], 1/sigma[MAXM]

fn ln_on() -> bool {
    return (p.flags & 16u) != 0u;
}

// Sum of v over the workgroup (every thread gets it). Uniform control flow. Two levels of
// the binary tree per barrier while they last: (r[l] + r[l + 2s]) + (r[l + s] + r[l + 3s])
// is exactly what levels 2s and s add, so the bits are the binary tree's with half the
// barriers (a decode GEMV with the LayerNorm folded in waits on two of these trees).
fn wg_sum(v: f32, lid: u32) -> f32 {
    rs[lid] = v;
    workgroupBarrier();
    var st = WG / 2u;
    for (; st >= 2u; st = st / 4u) {
        let q = st / 2u;
        if (lid < q) {
            rs[lid] = (rs[lid] + rs[lid + st]) + (rs[lid + q] + rs[lid + st + q]);
        }
        workgroupBarrier();
    }
    if (st == 1u) {
        if (lid == 0u) {
            rs[0] += rs[1];
        }
        workgroupBarrier();
    }
    let t = rs[0];
    workgroupBarrier();
    return t;
}

// LayerNorm statistics (two-pass, as layernorm.wgsl) of the row of X starting at `xb`
// into stat slot `slot`. The caller puts a barrier before the slot is read. The kernel lab
// (`--rows-only`) times two rewrites, neither shipped: one tree of (count, mean, M2) merged
// pairwise (Welford per thread, Chan's merge): 0.4-0.8 us faster a GEMV at K = 384 but
// small.en's decode 1.03 -> 1.09 ms/token (K = 768), and one pass over x - x[0] (fastest,
// but it loses precision when x[0] is far from the mean).
// The first pass loads four of the thread's elements before adding any (the same adds in
// the same order as one at a time): a loop of `s += x[..]` waits on a round trip to L2 per
// element, three of them for d = 768 with 256 threads. Its first round's four stay in
// registers for the second pass (every row up to 4 WG = 1024 wide has no other), which
// then loads nothing after the first tree; the same subtractions in the same order.
// Nothing is left for the compiler to contract: every multiply is inside an explicit fma
// or feeds only a store, and the mean is t * (1 / K) written as such. Two kernels that
// fold the norm (a step's main_m1, a verify pass's main_rows) then give the same bits on
// NVIDIA too; with `q += d * d` and `(v - mean) * inv * g + b` the driver fused them
// differently in the two and the bench's verify-against-steps guard caught it on the H200
// (bench/RESULTS.md 2026-12-06). A multiply added to outside an fma here is that bug again.
fn ln_stats(xb: u32, slot: u32, lid: u32) {
    let kf = f32(p.k);
    let last = xb + p.k - 1u;
    let v0 = x[min(xb + lid, last)];
    let v1 = x[min(xb + lid + WG, last)];
    let v2 = x[min(xb + lid + 2u * WG, last)];
    let v3 = x[min(xb + lid + 3u * WG, last)];
    let in0 = lid < p.k;
    let in1 = lid + WG < p.k;
    let in2 = lid + 2u * WG < p.k;
    let in3 = lid + 3u * WG < p.k;
    var s = 0.0;
    if (in0) {
        s += v0;
    }
    if (in1) {
        s += v1;
    }
    if (in2) {
        s += v2;
    }
    if (in3) {
        s += v3;
    }
    for (var c = lid + 4u * WG; c < p.k; c += 4u * WG) {
        let u0 = x[xb + c];
        let u1 = x[min(xb + c + WG, last)];
        let u2 = x[min(xb + c + 2u * WG, last)];
        let u3 = x[min(xb + c + 3u * WG, last)];
        s += u0;
        if (c + WG < p.k) {
            s += u1;
        }
        if (c + 2u * WG < p.k) {
            s += u2;
        }
        if (c + 3u * WG < p.k) {
            s += u3;
        }
    }
    // Every product below is inside an fma or feeds only a store (see the note above).
    let rk = 1.0 / kf;
    let t = wg_sum(s, lid);
    let mean = t * rk;
    var q = 0.0;
    if (in0) {
        let d = fma(-t, rk, v0);
        q = fma(d, d, q);
    }
    if (in1) {
        let d = fma(-t, rk, v1);
        q = fma(d, d, q);
    }
    if (in2) {
        let d = fma(-t, rk, v2);
        q = fma(d, d, q);
    }
    if (in3) {
        let d = fma(-t, rk, v3);
        q = fma(d, d, q);
    }
    for (var c = lid + 4u * WG; c < p.k; c += WG) {
        let d = fma(-t, rk, x[xb + c]);
        q = fma(d, d, q);
    }
    let inv = inverseSqrt(fma(wg_sum(q, lid), rk, p.eps));
    if (lid == 0u) {
        stat[slot] = mean;
        stat[MAXM + slot] = inv;
    }
}

// v = X[.][k] normalised with slot `slot`'s statistics when flag 16 is set.
fn ln_apply(v: f32, slot: u32, k: u32) -> f32 {
    if (ln_on()) {
        return ln_with(v, slot, gamma[k], beta[k]);
    }
    return v;
}

// The same with gamma and beta already loaded (kernels that load them ahead of the
// statistics).
fn ln_with(v: f32, slot: u32, g: f32, b: f32) -> f32 {
    return fma((v - stat[slot]) * stat[MAXM + slot], g, b);
}

// The epilogue with the bias and the accumulated value loaded ahead; `o` is the output's
// index (flags: 2 GELU; the bias and the residual are 0 when their flags are off).
fn finish_pre(v0: f32, o: u32, b: f32, yo: f32) {
    var v = v0 + b;
    if ((p.flags & 2u) != 0u) {
        v = gelu(v);
    }
    y[o] = v + yo;
}
