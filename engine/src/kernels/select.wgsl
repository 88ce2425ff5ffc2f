// Masked selection over one row of logits: the reductions Whisper's decoding rules need,
// so the vocabulary (51864 floats) never leaves the GPU; 32 bytes come back per step.
//
// Over text ids [0, ts_begin) and over allowed timestamps [ts_lo, ts_hi), each after the
// masks (a suppress bitmask, two extra ids, "mask text [0, eot)", "mask all non-timestamp
// ids"): the argmax (ties -> lowest id), the max and the log-sum-exp. Also the log-sum-exp
// of all raw logits and the raw logit of one probe id (no_speech probability).
// Two dispatches: `main_partial`, 64 workgroups of 256 threads over slices of the
// vocabulary, each thread keeping online (max, argmax, sum of exp) triples merged by a tree
// reduction into one partial per workgroup (written to the buffer bound as `out`); then
// `main`, one workgroup merging the 64 partials (bound as `logits`). One workgroup over the
// whole vocabulary was 94 us per step on the H200.
//
// out[out_off..]: [text_best, text_max, text_lse, ts_best, ts_max, ts_lse, raw_lse,
// probe_logit] (floats as bits); an empty set gives best = 0xffffffff and max = lse = -inf.
// `main_pick` is `main` that also writes its choice as a token id at ids[tok_out] (a
// decode step's next input without a round trip; see Kernels::select_pick).
//
// Whisper's timestamp rules on the device, for several decode steps without a round trip
// (flags 8 and 16, main_partial and main_pick only): ids[state_off..] holds the state of
// decode::TsState (the last and the penultimate sampled token, the lowest timestamp a
// segment may take after text); with flag 8 both kernels derive the step's masks from it
// (`masks`, the mirror of TsState::step) instead of the parameters, and main_pick writes
// the masks it used to out[rules_off..] (ts_lo; bit 0 text masked, bit 1 "timestamps beat
// text" checked) for the host to compare with its own; with flag 16 main_pick pushes its
// choice into the state (TsState::push). Flag 4: apply "timestamps beat text" (the
// timestamps' log-sum-exp above the best text logit picks the best timestamp).
// Flag 32 (main_pick): picking eot sets ids[done_off], which gates off the later steps of
// a batch (embed.wgsl zeroes their grids). `out_off` places a row's 8 words in `out`. A verify pass selects all of its rows with one
// pair of dispatches (`main_partial_rows` on a grid of 64 x rows, `main_rows` on one
// workgroup per row), each row under its own parameters: the uniform block is an array of
// SELECT_ROWS parameter sets (the single-row entries read set 0), and each row's partials
// take their own stretch of the partials buffer. A row's arithmetic is the single row's,
// in the same order: the verify pass still gives the single steps' scores bit for bit.
//
// Fused (`main_pick_fused`, `main_rows_fused`; Kernels::select_fused): one dispatch instead
// of each pair. The 64 workgroups of a row write their partials as atomics into `pa` (the
// partials buffer, its row counters after the SELECT_ROWS rows' partials) and count their
// arrival; the last to arrive merges them with the same arithmetic as `main_pick` /
// `main_rows` (the same bits) and resets the counter. storageBarrier is a device-scope
// acquire-release in SPIR-V, and atomics are read from L2, where an SM's L1 could hold a
// stale line.

struct Params {
    vocab: u32, ts_begin: u32, eot: u32, flags: u32,
    ts_lo: u32, ts_hi: u32, extra0: u32, extra1: u32,
    probe: u32, logit_off: u32, out_off: u32, tok_out: u32,
    state_off: u32, rules_off: u32, done_off: u32, _p1: u32,
}

const SELECT_ROWS: u32 = 32u; // kernels/mod.rs SELECT_ROWS (= VERIFY_MAX_ROWS)
@group(0) @binding(0) var<uniform> ps: array<Params, SELECT_ROWS>;
// This invocation's row's parameters (set 0 for the single-row entries), copied at entry.
var<private> p: Params;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> suppress: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;
// main_pick (the token and the timestamp state) and main_partial (the state, flag 8 only).
@group(0) @binding(4) var<storage, read_write> ids: array<u32>;
// The fused entries: the partials and the row counters as atomics.
@group(0) @binding(5) var<storage, read_write> pa: array<atomic<u32>>;

const WG: u32 = 256u;
const NEG: f32 = -3.0e38;
const NONE: u32 = 0xffffffffu;

struct Acc { m: f32, s: f32, a: u32 }

var<workgroup> rm: array<f32, 768>;
var<workgroup> rs: array<f32, 768>;
var<workgroup> ra: array<u32, 768>;
var<workgroup> raw_m: array<f32, WG>;
var<workgroup> raw_s: array<f32, WG>;

fn push(acc: Acc, v: f32, id: u32) -> Acc {
    var r = acc;
    if (v > r.m) {
        r.s = r.s * exp(r.m - v) + 1.0;
        r.m = v;
        r.a = id;
    } else {
        r.s += exp(v - r.m);
    }
    return r;
}

fn merge(x: Acc, y: Acc) -> Acc {
    if (y.s == 0.0) {
        return x;
    }
    if (x.s == 0.0) {
        return y;
    }
    var r: Acc;
    r.m = max(x.m, y.m);
    r.s = x.s * exp(x.m - r.m) + y.s * exp(y.m - r.m);
    if (x.m > y.m) {
        r.a = x.a;
    } else if (y.m > x.m) {
        r.a = y.a;
    } else {
        r.a = min(x.a, y.a);
    }
    return r;
}

// One step's masks: from the parameters, or with flag 8 from the timestamp state.
struct Masks { text: bool, non_ts: bool, ts_lo: u32, check: bool }

fn masks() -> Masks {
    var m = Masks((p.flags & 1u) != 0u, (p.flags & 2u) != 0u, p.ts_lo, (p.flags & 4u) != 0u);
    if ((p.flags & 8u) != 0u) {
        let last = ids[p.state_off];
        let penultimate = ids[p.state_off + 1u];
        m = Masks(false, false, ids[p.state_off + 2u], true);
        if (last >= p.ts_begin) {
            if (penultimate >= p.ts_begin) {
                // A pair closed: text (or eot) next.
                m.ts_lo = p.vocab;
                m.check = false;
            } else {
                // A lone timestamp after text: another timestamp (>= it) or eot.
                m.text = true;
                m.ts_lo = last;
            }
        }
    }
    return m;
}

fn suppressed(id: u32) -> bool {
    if (id == p.extra0 || id == p.extra1) {
        return true;
    }
    return ((suppress[id / 32u] >> (id % 32u)) & 1u) != 0u;
}

fn neg_inf_bits() -> u32 {
    return 0xff800000u;
}

const GROUPS: u32 = 64u;
// Partial layout: GROUPS x 9 words (text m, s, a; ts m, s, a; raw m, s, a), then the probe.
const PW: u32 = 9u;

fn tree_merge(lid: u32) {
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            for (var g = 0u; g < 3u; g++) {
                let i = g * WG + lid;
                let j = i + st;
                let r = merge(Acc(rm[i], rs[i], ra[i]), Acc(rm[j], rs[j], ra[j]));
                rm[i] = r.m; rs[i] = r.s; ra[i] = r.a;
            }
        }
        workgroupBarrier();
    }
}

// Words of one row's partials (GROUPS x PW, then the probe).
const ROW_PARTIALS: u32 = GROUPS * PW + 1u;
// The fused entries' row counters in `pa`, after every row's partials.
const COUNTERS: u32 = SELECT_ROWS * ROW_PARTIALS;

var<workgroup> last_flag: u32;

// Word i of the partials: written to `out` (the partials buffer bound there), or to `pa`
// by the fused entries (`fused` is a constant at every call).
fn put_partial(i: u32, w: u32, fused: bool) {
    if (fused) {
        atomicStore(&pa[i], w);
    } else {
        out[i] = w;
    }
}

// Word i of the partials as a float: from `logits` (the partials buffer bound there), or
// from `pa` in the fused entries.
fn partial_word(i: u32, fused: bool) -> f32 {
    if (fused) {
        return bitcast<f32>(atomicLoad(&pa[i]));
    }
    return logits[i];
}

// The fused entries, after a workgroup's partial: whether it is the last of the row's
// GROUPS to arrive (uniform; the last one also resets the row's counter).
fn arrived_last(row: u32, lid: u32) -> bool {
    storageBarrier();
    if (lid == 0u) {
        last_flag = u32(atomicAdd(&pa[COUNTERS + row], 1u) + 1u == GROUPS);
    }
    let last = workgroupUniformLoad(&last_flag) != 0u;
    if (last) {
        storageBarrier();
        if (lid == 0u) {
            atomicStore(&pa[COUNTERS + row], 0u);
        }
    }
    return last;
}

@compute @workgroup_size(256)
fn main_partial(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    p = ps[0];
    partial(wg.x, lid, 0u, false);
}

@compute @workgroup_size(256)
fn main_partial_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    p = ps[wg.y];
    partial(wg.x, lid, wg.y * ROW_PARTIALS, false);
}

// Workgroup `group`'s partial over its slice of the vocabulary, written at out[base..].
fn partial(group: u32, lid: u32, base: u32, fused: bool) {
    let chunk = (p.vocab + GROUPS - 1u) / GROUPS;
    let lo = group * chunk;
    let hi = min(p.vocab, lo + chunk);
    var text = Acc(NEG, 0.0, NONE);
    var ts = Acc(NEG, 0.0, NONE);
    var raw = Acc(NEG, 0.0, NONE);
    let mk = masks();
    for (var id = lo + lid; id < hi; id += WG) {
        let v = logits[p.logit_off + id];
        raw = push(raw, v, id);
        if (suppressed(id)) {
            continue;
        }
        if (id < p.ts_begin) {
            let masked = mk.non_ts || (mk.text && id < p.eot);
            if (!masked) {
                text = push(text, v, id);
            }
        } else if (id >= mk.ts_lo && id < p.ts_hi) {
            ts = push(ts, v, id);
        }
    }
    rm[lid] = text.m; rs[lid] = text.s; ra[lid] = text.a;
    rm[WG + lid] = ts.m; rs[WG + lid] = ts.s; ra[WG + lid] = ts.a;
    rm[2u * WG + lid] = raw.m; rs[2u * WG + lid] = raw.s; ra[2u * WG + lid] = raw.a;
    tree_merge(lid);
    if (lid < 3u) {
        let b = base + group * PW + 3u * lid;
        put_partial(b, bitcast<u32>(rm[lid * WG]), fused);
        put_partial(b + 1u, bitcast<u32>(rs[lid * WG]), fused);
        // The id as a float (exact below 2^24; -1 for none): the merge pass reads partials
        // through the f32 binding, and a bit-cast id would be a denormal some GPUs flush.
        put_partial(b + 2u, bitcast<u32>(select(f32(ra[lid * WG]), -1.0, ra[lid * WG] == NONE)), fused);
    }
    if (group == 0u && lid == 0u) {
        if (p.probe < p.vocab) {
            put_partial(base + GROUPS * PW, bitcast<u32>(logits[p.logit_off + p.probe]), fused);
        } else {
            put_partial(base + GROUPS * PW, neg_inf_bits(), fused);
        }
    }
}

// Load the 64 partials at logits[base..] (the partials buffer is bound as `logits`; `pa`
// when fused) and merge them into slot 0 of each group.
fn merge_partials(lid: u32, base: u32, fused: bool) {
    for (var g = 0u; g < 3u; g++) {
        var acc = Acc(NEG, 0.0, NONE);
        if (lid < GROUPS) {
            let b = base + lid * PW + 3u * g;
            let id = partial_word(b + 2u, fused);
            acc = Acc(partial_word(b, fused), partial_word(b + 1u, fused), select(u32(id), NONE, id < 0.0));
        }
        rm[g * WG + lid] = acc.m; rs[g * WG + lid] = acc.s; ra[g * WG + lid] = acc.a;
    }
    tree_merge(lid);
}

// The 8 output words at out[out_off..] from the merged slots (thread 0 only); the probe
// from the partials at logits[base..] (`pa` when fused).
fn write_scores(base: u32, fused: bool) {
    let o = p.out_off;
    for (var g = 0u; g < 2u; g++) {
        let i = g * WG;
        if (rs[i] == 0.0) {
            out[o + 3u * g] = NONE;
            out[o + 3u * g + 1u] = neg_inf_bits();
            out[o + 3u * g + 2u] = neg_inf_bits();
        } else {
            out[o + 3u * g] = ra[i];
            out[o + 3u * g + 1u] = bitcast<u32>(rm[i]);
            out[o + 3u * g + 2u] = bitcast<u32>(rm[i] + log(rs[i]));
        }
    }
    out[o + 6u] = bitcast<u32>(rm[2u * WG] + log(rs[2u * WG]));
    out[o + 7u] = bitcast<u32>(partial_word(base + GROUPS * PW, fused));
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) lid: u32) {
    // `logits` is the partials buffer here.
    p = ps[0];
    merge_partials(lid, 0u, false);
    if (lid == 0u) {
        write_scores(0u, false);
    }
}

// One workgroup per row of a verify pass.
@compute @workgroup_size(256)
fn main_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    p = ps[wg.x];
    let base = wg.x * ROW_PARTIALS;
    merge_partials(lid, base, false);
    if (lid == 0u) {
        write_scores(base, false);
    }
}

// main_partial_rows and main_rows in one dispatch (grid GROUPS x rows; one row: `main`).
@compute @workgroup_size(256)
fn main_rows_fused(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    p = ps[wg.y];
    let base = wg.y * ROW_PARTIALS;
    partial(wg.x, lid, base, true);
    if (!arrived_last(wg.y, lid)) {
        return;
    }
    merge_partials(lid, base, true);
    if (lid == 0u) {
        write_scores(base, true);
    }
}

// The host's greedy pick (decode::whisper::pick) from the merged scores: with the
// "timestamps beat text" check (flag 4, or as the state says), the best timestamp when
// the timestamps' log-sum-exp is above the best text logit; otherwise the best allowed
// timestamp when its logit is above the best text token's, else the text token; eot when
// nothing is allowed. Ties go to text (every text id is below every timestamp). The
// comparisons use the very f32 values written to `out`, as the host's do.
@compute @workgroup_size(256)
fn main_pick(@builtin(local_invocation_index) lid: u32) {
    p = ps[0];
    merge_partials(lid, 0u, false);
    if (lid == 0u) {
        pick(false);
    }
}

// main_partial and main_pick in one dispatch (grid GROUPS).
@compute @workgroup_size(256)
fn main_pick_fused(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    p = ps[0];
    partial(wg.x, lid, 0u, true);
    if (!arrived_last(0u, lid)) {
        return;
    }
    merge_partials(lid, 0u, true);
    if (lid == 0u) {
        pick(true);
    }
}

// main_pick's choice from the merged slots (thread 0).
fn pick(fused: bool) {
    let mk = masks();
    write_scores(0u, fused);
    let text_ok = rs[0] != 0.0;
    let ts_ok = rs[WG] != 0.0;
    var id = p.eot;
    if (text_ok) {
        id = ra[0];
    }
    if (ts_ok && (!text_ok || rm[WG] > rm[0])) {
        id = ra[WG];
    }
    if (mk.check && ts_ok) {
        let ts_lse = bitcast<f32>(out[p.out_off + 5u]);
        if (!text_ok || ts_lse > rm[0]) {
            id = ra[WG];
        }
    }
    ids[p.tok_out] = id;
    if ((p.flags & 32u) != 0u && id == p.eot) {
        ids[p.done_off] = 1u; // the later steps of a gated batch run empty (embed.wgsl)
    }
    if ((p.flags & 8u) != 0u) {
        out[p.rules_off] = mk.ts_lo;
        out[p.rules_off + 1u] = u32(mk.text) | (u32(mk.check) << 1u);
    }
    if ((p.flags & 16u) != 0u) {
        ids[p.state_off + 1u] = ids[p.state_off];
        ids[p.state_off] = id;
        if (id >= p.ts_begin) {
            ids[p.state_off + 2u] = id + 1u;
        }
    }
}
