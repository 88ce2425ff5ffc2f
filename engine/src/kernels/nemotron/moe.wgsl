// The MoE pieces around the expert GEMMs (linear.wgsl) for the positions of a pass:
//
// - `route`: per position (a workgroup of 64), scores = sigmoid(logits); experts chosen by
//   top-k of score + e_score_correction_bias (group-limited when n_group > 1: a group
//   scores the sum of its two best, only the best topk_group groups stay eligible), ties to
//   the lower index, best first; weights = the chosen plain scores / (their sum + 1e-20)
//   when norm_topk_prob, × routed_scaling_factor. Entry j = position·k + slot.
// - `lists`: per expert (a thread each), the entries that chose it in ascending order and
//   their count, so the expert GEMM reads each selected expert once per pass.
// - `combine`: y[t] (=|+=) Σ_slot w[t·k + slot] · eo[t·k + slot] (the routed sum).
// - `relu2`: y = max(y, 0)² in place.
//
// Reductions go through workgroup memory (no subgroup size assumed); every loop runs at
// most a few hundred times per invocation.

const NEG_INF: f32 = -3.4028235e38;

struct RouteParams {
    n: u32, ne: u32, k: u32, norm: u32,
    n_group: u32, topk_group: u32, _p0: u32, _p1: u32,
    scale: f32, _p2: u32, _p3: u32, _p4: u32,
}

@group(0) @binding(0) var<uniform> rp: RouteParams;
@group(0) @binding(1) var<storage, read> r_logits: array<f32>;
@group(0) @binding(2) var<storage, read> r_bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> r_sel: array<u32>;
@group(0) @binding(4) var<storage, read_write> r_w: array<f32>;

const RW: u32 = 64u;
const MAXE: u32 = 512u;
const MAXG: u32 = 64u;
var<workgroup> score: array<f32, MAXE>;
var<workgroup> choice: array<f32, MAXE>;
// 1: not eligible (its group was dropped) or already chosen.
var<workgroup> gone: array<u32, MAXE>;
var<workgroup> red_v: array<f32, RW>;
var<workgroup> red_i: array<u32, RW>;
var<workgroup> gscore: array<f32, MAXG>;

// (va, ia) better than (vb, ib): larger, ties to the lower index; an index of 0xffffffff
// is "nothing".
fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    if (ia == 0xffffffffu) {
        return false;
    }
    if (ib == 0xffffffffu) {
        return true;
    }
    return va > vb || (va == vb && ia < ib);
}

@compute @workgroup_size(64)
fn route(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x;
    if (t >= rp.n) {
        return;
    }
    let ne = rp.ne;
    let lo = t * ne;
    for (var e = lid; e < ne; e += RW) {
        let s = 1.0 / (1.0 + exp(-r_logits[lo + e]));
        score[e] = s;
        choice[e] = s + r_bias[e];
        gone[e] = 0u;
    }
    workgroupBarrier();
    if (rp.n_group > 1u && lid == 0u) {
        // Group-limited routing, serially: n_group and the group sizes are small.
        let per = ne / rp.n_group;
        for (var g = 0u; g < rp.n_group; g++) {
            var b1 = NEG_INF;
            var b2 = NEG_INF;
            for (var i = g * per; i < (g + 1u) * per; i++) {
                let v = choice[i];
                if (v > b1) {
                    b2 = b1;
                    b1 = v;
                } else if (v > b2) {
                    b2 = v;
                }
            }
            gscore[g] = b1 + b2;
        }
        // Keep the best topk_group groups (ties to the lower index): mark the rest gone.
        for (var g = 0u; g < rp.n_group; g++) {
            var rank = 0u;
            for (var h = 0u; h < rp.n_group; h++) {
                if (gscore[h] > gscore[g] || (gscore[h] == gscore[g] && h < g)) {
                    rank++;
                }
            }
            if (rank >= rp.topk_group) {
                for (var i = g * per; i < (g + 1u) * per; i++) {
                    gone[i] = 1u;
                }
            }
        }
    }
    workgroupBarrier();
    let so = t * rp.k;
    for (var s = 0u; s < rp.k; s++) {
        var bv = NEG_INF;
        var bi = 0xffffffffu;
        for (var e = lid; e < ne; e += RW) {
            if (gone[e] == 0u && better(choice[e], e, bv, bi)) {
                bv = choice[e];
                bi = e;
            }
        }
        red_v[lid] = bv;
        red_i[lid] = bi;
        workgroupBarrier();
        for (var st = RW / 2u; st > 0u; st = st / 2u) {
            if (lid < st && better(red_v[lid + st], red_i[lid + st], red_v[lid], red_i[lid])) {
                red_v[lid] = red_v[lid + st];
                red_i[lid] = red_i[lid + st];
            }
            workgroupBarrier();
        }
        if (lid == 0u) {
            var bi = red_i[0];
            if (bi == 0xffffffffu) {
                // Fewer eligible experts than k (a config the reference also fills from
                // the dropped groups, lowest index first).
                for (var e = 0u; e < ne; e++) {
                    if (gone[e] == 1u) {
                        bi = e;
                        break;
                    }
                }
            }
            r_sel[so + s] = bi;
            gone[bi] = 2u;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        var sum = 0.0;
        for (var s = 0u; s < rp.k; s++) {
            sum += score[r_sel[so + s]];
        }
        var den = 1.0;
        if (rp.norm != 0u) {
            den = sum + 1e-20;
        }
        for (var s = 0u; s < rp.k; s++) {
            r_w[so + s] = score[r_sel[so + s]] / den * rp.scale;
        }
    }
}

struct ListParams {
    n: u32, ne: u32, k: u32, cap: u32,
}

@group(0) @binding(0) var<uniform> lp: ListParams;
@group(0) @binding(1) var<storage, read> l_sel: array<u32>;
@group(0) @binding(2) var<storage, read_write> l_list: array<u32>;
@group(0) @binding(3) var<storage, read_write> l_cnt: array<u32>;

@compute @workgroup_size(64)
fn lists(@builtin(global_invocation_id) gid: vec3<u32>) {
    let e = gid.x;
    if (e >= lp.ne) {
        return;
    }
    var c = 0u;
    let total = lp.n * lp.k;
    for (var j = 0u; j < total; j++) {
        if (l_sel[j] == e && c < lp.cap) {
            l_list[e * lp.cap + c] = j;
            c++;
        }
    }
    l_cnt[e] = c;
}

struct CombineParams {
    n: u32, io: u32, k: u32, accumulate: u32,
}

@group(0) @binding(0) var<uniform> cbp: CombineParams;
@group(0) @binding(1) var<storage, read> c_w: array<f32>;
@group(0) @binding(2) var<storage, read> c_eo: array<f32>;
@group(0) @binding(3) var<storage, read_write> c_y: array<f32>;

@compute @workgroup_size(64)
fn combine(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    let t = gid.y;
    if (c >= cbp.io || t >= cbp.n) {
        return;
    }
    var acc = 0.0;
    for (var s = 0u; s < cbp.k; s++) {
        let j = t * cbp.k + s;
        acc = fma(c_w[j], c_eo[j * cbp.io + c], acc);
    }
    let yi = t * cbp.io + c;
    if (cbp.accumulate != 0u) {
        acc += c_y[yi];
    }
    c_y[yi] = acc;
}

struct Relu2Params {
    count: u32, _p0: u32, _p1: u32, _p2: u32,
}

@group(0) @binding(0) var<uniform> qp: Relu2Params;
@group(0) @binding(1) var<storage, read_write> q_y: array<f32>;

@compute @workgroup_size(256)
fn relu2(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x + gid.y * 65535u * 256u;
    if (i >= qp.count) {
        return;
    }
    let v = max(q_y[i], 0.0);
    q_y[i] = v * v;
}
