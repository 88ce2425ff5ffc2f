//! WGSL kernels, one family per `.wgsl` file, and the thin Rust launchers that fill their
//! parameter blocks, pick grids and book each dispatch's bytes and FLOPs with the recorder.
//! Each launcher's CPU reference is in `crate::reference`; the tests in `tests.rs` hold them
//! to it on random inputs of awkward sizes with the output poisoned first.

#[cfg(test)]
mod tests;

pub mod nemotron;

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use wgpu::Buffer;

use crate::gpu::{Access, Cost, Gpu, Kernel, Recorder};
use crate::quant::block::{BlockFormat, BlockQuant};
use crate::{Error, Result};

/// Workgroups of the selection's first pass (`GROUPS` in select.wgsl).
const SELECT_GROUPS: u64 = 64;
/// Rows one multi-row selection takes (`SELECT_ROWS` in select.wgsl: the parameter block
/// of every selection dispatch is this many parameter sets), as many as a verify pass has.
pub const SELECT_ROWS: usize = VERIFY_MAX_ROWS as usize;
/// Words of one row's partials (64 x 9, then the probe logit).
const SELECT_ROW_PARTIALS: u64 = SELECT_GROUPS * 9 + 1;

/// Column pairs per GEMV workgroup (`CP` in gemv.wgsl).
const GEMV_COLUMN_PAIRS: u32 = 8;

/// Column pairs per workgroup of the streaming GEMV (gemv_stream.wgsl: 8 threads x 8 columns).
const GEMV_STREAM_COLUMN_PAIRS: u32 = 32;
/// Matrices of at least this many bytes (and a multiple of 8 columns) take the streaming GEMV.
const GEMV_WIDE_MIN_BYTES: u64 = 8 << 20;

/// gemv.wgsl as compiled: GELU and the shared LayerNorm / epilogue pieces prepended.
pub const GEMV_SOURCE: &str = concat!(include_str!("gelu.wgsl"), include_str!("gemv_common.wgsl"), include_str!("gemv.wgsl"));
/// gemv_q.wgsl as compiled.
pub const GEMV_Q_SOURCE: &str =
    concat!(include_str!("gelu.wgsl"), include_str!("gemv_common.wgsl"), include_str!("gemv_q.wgsl"));

/// `src` with each `(from, to)` applied, every one checked to occur exactly once (a
/// reshaped kernel that silently kept its old shape would be measured as the new one).
pub fn rewrite_source(name: &str, src: &str, edits: &[(&str, &str)]) -> Result<String> {
    let mut out = src.to_string();
    for (from, to) in edits {
        if out.matches(from).count() != 1 {
            return Err(Error::Invalid(format!("{name}: expected {from:?} once")));
        }
        out = out.replace(from, to);
    }
    Ok(out)
}

/// gemv_stream.wgsl as written (32 K slices); see [`gemv_stream_source`].
pub const GEMV_STREAM_SOURCE: &str =
    concat!(include_str!("gelu.wgsl"), include_str!("gemv_common.wgsl"), include_str!("gemv_stream.wgsl"));

/// gemv_stream.wgsl with `slices` K slices per workgroup (32 as written; 64 where the device
/// allows it, see [`gemv_stream_slices`]: on the H200 the lab's 512 MiB and 1 GiB matrices
/// read at 97 and 98 % of copy that way against 94 and 95 % with 32; 87 % either way at
/// 128 MiB).
pub fn gemv_stream_source(slices: u32) -> Result<String> {
    if slices == 32 {
        return Ok(GEMV_STREAM_SOURCE.to_string());
    }
    let kg = format!("const KG: u32 = {slices}u;");
    let size = format!("@workgroup_size(8, {slices})");
    rewrite_source(
        "gemv_stream.wgsl",
        GEMV_STREAM_SOURCE,
        &[("const KG: u32 = 32u;", kg.as_str()), ("@workgroup_size(8, 32)", size.as_str())],
    )
}

/// K slices of the streaming GEMV on a device with these limits: 64 needs 512 invocations
/// a workgroup and ~18 KiB of workgroup memory (its merge array and the LayerNorm's
/// scratch), 32 fits wgpu's default limits.
pub fn gemv_stream_slices(limits: &wgpu::Limits) -> u32 {
    if limits.max_compute_invocations_per_workgroup >= 512 && limits.max_compute_workgroup_storage_size >= 20 << 10 {
        64
    } else {
        32
    }
}

/// Columns per workgroup of the quantized GEMV (`CQ` in gemv_q.wgsl), and of its wide form.
const GEMV_Q_COLUMNS: u32 = 16;
const GEMV_Q_WIDE_COLUMNS: u32 = 64;

/// gemv_q.wgsl reshaped to 64 columns x 4 K slices (large matrices: the logits).
fn gemv_q_wide_source() -> Result<String> {
    rewrite_source(
        "gemv_q.wgsl (wide)",
        GEMV_Q_SOURCE,
        &[("const CQ: u32 = 16u;", "const CQ: u32 = 64u;"), ("const KQ: u32 = 16u;", "const KQ: u32 = 4u;")],
    )
}

/// Largest number of activation rows the GEMV kernel takes; more go to the tiled GEMM.
pub const GEMV_MAX_ROWS: u32 = 8;

/// Most rows the kernels of a speculative verify pass take, each row computed exactly as
/// the same row alone (`linear_per_row`, `ffn_decode`, `attention_rows`,
/// `attention_unmerged` with exact rows, `linear_merged`, `select_rows`). More than the
/// prompt's GEMV takes ([`GEMV_MAX_ROWS`]): a verify pass costs ~0.4 ms on the H200 whatever
/// its rows (tiny.en: 1 position 0.38-0.44 ms, 8 0.53-0.59, 16 0.71-0.82), so a draft that
/// holds (live mode's hint) is checked in fewer, longer passes: live replays 13-15 % faster
/// on jfk and lhotse_2412 at 16 rows than at 8 (bench/RESULTS.md 2026-12-05, second
/// session). 32 since 2026-12-06: a long window's hint (lhotse_2412's last windows hold
/// 50 tokens) in two passes instead of four; priced by the draft-policy test before a
/// device timed it (select.wgsl's SELECT_ROWS and ffn_decode.wgsl's FIN_ROWS follow it).
pub const VERIFY_MAX_ROWS: u32 = 32;

/// ffn_decode.wgsl as compiled (GELU prepended): the decoder's feed-forward block for up to
/// [`VERIFY_MAX_ROWS`] rows in two dispatches.
pub const FFN_DECODE_SOURCE: &str = concat!(include_str!("gelu.wgsl"), include_str!("ffn_decode.wgsl"), include_str!("row_stats.wgsl"));
/// Hidden units per ffn_decode workgroup (`CH` in ffn_decode.wgsl).
const FFN_CHUNK: u32 = 16;
/// Outputs per workgroup of its sum (`main_sum`).
const FFN_SUM_OUTPUTS: u32 = 16;
/// Widest d_model it takes (`MAXD`: the normalised row lives in workgroup memory).
const FFN_MAX_D: u32 = 1280;

/// f32 words of ffn_decode's partials for a model of `d` x `ffn`: every 16-unit chunk's
/// partial row for [`VERIFY_MAX_ROWS`] rows.
pub fn ffn_scratch_words(d: u32, ffn: u32) -> u64 {
    VERIFY_MAX_ROWS as u64 * ffn.div_ceil(FFN_CHUNK) as u64 * d as u64
}

/// Above this many queries the tiled attention (a thread per query, keys staged per
/// workgroup) beats one workgroup per query.
pub const ATTENTION_TILED_MIN_QUERIES: u32 = 8;

/// Keys per workgroup of the split (flash-decoding) attention for a few queries.
pub const ATTENTION_SPLIT_KEYS: u32 = 256;
/// Query rows a workgroup of attention.wgsl's `main_split_rows` (its RQ: the components of
/// a vec4), which is written for ATTENTION_SPLIT_KEYS = 256 (a key per thread).
pub const ATTENTION_SPLIT_ROWS: u32 = 4;
const _: () = assert!(ATTENTION_SPLIT_KEYS == 256);
/// Capacity of the split attention's partials; larger problems use the chunked kernel.
const ATTENTION_PARTIALS_FLOATS: u64 = 1 << 20;

/// The encoder GEMM in plain shader arithmetic (any device) and its cooperative-matrix twin. The
/// directives of the latter must open the module, before everything it shares.
/// gemv_rows.wgsl as compiled (the logits over the row-major embedding table).
pub const GEMV_ROWS_SOURCE: &str =
    concat!(include_str!("gelu.wgsl"), include_str!("gemv_common.wgsl"), include_str!("gemv_rows.wgsl"));
/// Outputs per workgroup of gemv_rows.wgsl (GROUPS = 8 x RPG = 4).
const GEMV_ROWS_OUTPUTS: u32 = 32;
/// Activation rows per workgroup of gemv_rows.wgsl's main_rows (its RPW).
const GEMV_ROWS_SHARED_ROWS: u32 = 16;
/// attention.wgsl (the kernel lab times its tiled and merge entries beside its own).
pub const ATTENTION_SOURCE: &str = concat!(include_str!("attention_io.wgsl"), include_str!("attention.wgsl"), include_str!("f16_split.wgsl"));

/// Whether the logits GEMV's loads past the row's end are made anyway and their words
/// dropped after (`BRANCHLESS_LOADS` in gemv_rows.wgsl, as shipped) or made behind their
/// bounds branches (`VERBATIM_BRANCHY_LOADS=1`, to compare on a device).
pub fn branchless_loads_wanted() -> bool {
    !std::env::var("VERBATIM_BRANCHY_LOADS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// gemv_rows.wgsl (the logits) with its loads branchless or not, and its LayerNorm switch
/// fixed (`ln`: flag 16 on; a variant takes only dispatches with that flag), as main_m1's
/// (`gemv_m1_source`): every x load goes through `ln_apply`.
pub fn gemv_rows_source(ln: bool, branchless: bool) -> Result<String> {
    let to_branchless = format!("const BRANCHLESS_LOADS: bool = {branchless};");
    let to_ln = format!("fn ln_on() -> bool {{\n    return {ln};\n}}");
    rewrite_source(
        "gemv_rows_source",
        GEMV_ROWS_SOURCE,
        &[
            ("const BRANCHLESS_LOADS: bool = true;", &to_branchless),
            ("fn ln_on() -> bool {\n    return (p.flags & 16u) != 0u;\n}", &to_ln),
        ],
    )
}
/// attention_blocked.wgsl: the register-blocked attention for many queries of head_dim 64.
pub const ATTENTION_BLOCKED_SOURCE: &str =
    concat!(include_str!("attention_io.wgsl"), include_str!("attention_blocked.wgsl"));
/// Queries per workgroup of attention_blocked.wgsl.
const ATTENTION_BLOCKED_QUERIES: u32 = 32;
/// Keys per block of attention_blocked.wgsl: its key splits are whole blocks.
const ATTENTION_BLOCKED_KEYS: u32 = 32;
/// Key splits of the blocked attention (each a workgroup of its own, merged by
/// attention.wgsl's `main_merge`): one split gave tiny.en's encoder 282 workgroups of two
/// warps, ~4 warps per H200 multiprocessor. Fewer run where the partials do not fit the
/// buffer [`Kernels::reserve_blocked_attention`] made (none made: one split, no merge).
pub const ATTENTION_BLOCKED_SPLITS: u32 = 4;
/// The blocked kernel runs where the tiled one would have fewer workgroups than this. On
/// the H200 (per encoder layer, 1500 queries) it won where the tiled kernel is short of
/// warps, tiny.en's 6 heads (282 workgroups): 463 -> 410 us; with 8 heads (base, 376) it
/// lost, 471 -> 540, and with 12 (small.en) 715 -> 799: with warps enough, main_tiled's
/// one thread per query does more per warp than the blocked tiles.
const ATTENTION_BLOCKED_MAX_TILED_GROUPS: u64 = 320;

/// Keys per split of the blocked attention for about `splits` splits of `tk` keys: a whole
/// number of 32-key blocks, so the splits are `tk.div_ceil(keys)`, at most `splits` (33 keys
/// in 4 splits: 32 + 1; 1500 in 4: 3 x 384 + 348). `main_merge` counts them the same way.
pub fn attention_blocked_split_keys(tk: u32, splits: u32) -> u32 {
    tk.div_ceil(splits.max(1)).max(1).next_multiple_of(ATTENTION_BLOCKED_KEYS)
}
pub const GEMM_SOURCE: &str =
    concat!(include_str!("gelu.wgsl"), include_str!("gemm_io.wgsl"), include_str!("gemm_epilogue.wgsl"), include_str!("gemm.wgsl"));
pub const GEMM_COOP_SOURCE: &str = concat!(
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    include_str!("gelu.wgsl"),
    include_str!("gemm_io.wgsl"),
    include_str!("gemm_epilogue.wgsl"),
    include_str!("gemm_coop_emit.wgsl"),
    include_str!("gemm_coop.wgsl")
);
/// The linear layers' tensor-core GEMM over X split into f16 planes beforehand
/// (gemm_planes.wgsl, fed by split_f16.wgsl's `main_rows`).
pub const GEMM_PLANES_SOURCE: &str = concat!(
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    include_str!("gelu.wgsl"),
    include_str!("gemm_planes.wgsl"),
    include_str!("gemm_epilogue.wgsl"),
    include_str!("gemm_coop_emit.wgsl")
);
/// gemm_planes.wgsl over tiles of 32 rows instead of 64 (twice the workgroups: tiny.en's out
/// projection, fc2 and conv2 have N = 384, 144 workgroups of 64 rows on a device of 132
/// SMs; and each subgroup holds 1 x 2 accumulator blocks instead of 2 x 2, so more
/// subgroups fit an SM, which is why wide GEMMs gain too).
pub fn gemm_planes_narrow_source() -> Result<String> {
    gemm_planes_tile_source(GemmTile::NARROW)
}

/// A tile of gemm_planes.wgsl's 32-row kernels: rows x columns of Y per workgroup, over
/// `rows / 16` x `cols / 32` subgroups of 1 x 2 blocks. 32 x 64 (4 subgroups) for most
/// GEMMs; 32 x 128 (8 subgroups, each X word read from L2 for twice the outputs) for wide
/// ones ([`GEMM_WIDE_TILE_MIN_N`]). (64 x 64 over 8 subgroups measured 1.5-1.8x slower on
/// the H200: bench/RESULTS.md, 2026-12-04, third session.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmTile {
    pub rows: u32,
    pub cols: u32,
}

impl GemmTile {
    pub const NARROW: GemmTile = GemmTile { rows: 32, cols: 64 };
    pub const WIDE: GemmTile = GemmTile { rows: 32, cols: 128 };

    fn subgroups(self) -> u32 {
        (self.rows / 16) * (self.cols / 32)
    }

    /// The kernels' names: the 32 x 64 tile keeps its old ones.
    fn names(self) -> (&'static str, &'static str) {
        if self == GemmTile::NARROW {
            ("gemm_planes_f16 (32-row tiles)", "gemm_planes_to_planes (32-row tiles)")
        } else {
            ("gemm_planes_f16 (32x128 tiles)", "gemm_planes_to_planes (32x128 tiles)")
        }
    }
}

/// Which of main_m1's runtime switches a compiled variant has fixed (`gemv_m1_source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvM1Variant {
    /// No LayerNorm, no merge (flags 16 and 32 off): an output projection, fc2-like GEMVs.
    Plain,
    /// The LayerNorm folded in (flag 16): the Q|K|V and the cross-attention's query.
    LayerNorm,
    /// The split attention's partials merged on the way in (flag 32).
    Merge,
}

/// gemv.wgsl with `ln_on()` and `merge_on()` fixed for `v` (main_m1 compiled from it takes
/// only dispatches with those flags). Every x load of main_m1 goes through `xv`, which tests
/// both switches; with them read from the parameters the driver's compiler kept each load
/// behind its branches, and a 384 x 384 GEMV in the kernel lab's dependent chain (H200) took
/// 4.12 us, against 3.34 with both fixed (`kernel-lab --grid-only`, bench/RESULTS.md
/// 2026-12-04, fourth session). The arithmetic is the same; a verify pass's rows and single
/// steps still take the same compiled kernel, so they agree bit for bit.
pub fn gemv_m1_source(v: GemvM1Variant) -> Result<String> {
    let (ln, merge) = match v {
        GemvM1Variant::Plain => (false, false),
        GemvM1Variant::LayerNorm => (true, false),
        GemvM1Variant::Merge => (false, true),
    };
    let ln_to = format!("fn ln_on() -> bool {{\n    return {ln};\n}}");
    let merge_to = format!("fn merge_on() -> bool {{\n    return {merge};\n}}");
    rewrite_source(
        "gemv_m1_source",
        GEMV_SOURCE,
        &[
            ("fn ln_on() -> bool {\n    return (p.flags & 16u) != 0u;\n}", &ln_to),
            ("fn merge_on() -> bool {\n    return (p.flags & 32u) != 0u;\n}", &merge_to),
        ],
    )
}

/// Which main_m1 with the LayerNorm folded in a verify pass takes
/// (`VERBATIM_GEMV_LN_PASS=main|late`, default late; decode steps keep `main` either way).
/// `main` (gemv_m1_f16_ln) takes 105 registers on NVIDIA's compiler: two 256-thread
/// workgroups an SM, so a pass of 16 rows (1152 workgroups on tiny.en's Q|K|V) runs in five
/// waves on 132 SMs. The registers are its rounds of sixteen weight words, each with its x,
/// gamma and beta in flight (64 loads): issuing less ahead of the row's statistics left
/// them at 105-109, rounds of eight words instead of sixteen took 91 (RESULTS.md
/// 2026-12-06, eleventh session). `late` does both: rounds of eight and nothing issued
/// before the statistics, 59 registers, four workgroups an SM. The same words are loaded
/// and the same products summed in the same order, so every row keeps the step's bits.
/// Timed on an H100: 1-3 µs less a tiny.en pass of 4 to 16 rows (of 80-124 µs in this
/// kernel), 2-71 µs less on small's, the same at 1-2 rows; so the waves were not what
/// this kernel's pass cost grows by (the weights are read again for every row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemvLnPass {
    Main,
    Late,
}

impl GemvLnPass {
    fn from_env() -> Result<GemvLnPass> {
        GemvLnPass::parse(std::env::var("VERBATIM_GEMV_LN_PASS").as_deref().unwrap_or(""))
    }

    /// `VERBATIM_GEMV_LN_PASS`'s value (empty: the default).
    fn parse(v: &str) -> Result<GemvLnPass> {
        match v {
            "" | "late" => Ok(GemvLnPass::Late),
            "main" => Ok(GemvLnPass::Main),
            v => Err(Error::Invalid(format!("VERBATIM_GEMV_LN_PASS={v}: main or late"))),
        }
    }
}

/// main_m1 with the LayerNorm folded in, as [`GemvLnPass`] `v` issues its loads.
pub fn gemv_m1_ln_source(v: GemvLnPass) -> Result<String> {
    let src = gemv_m1_source(GemvM1Variant::LayerNorm)?;
    match v {
        GemvLnPass::Main => Ok(src),
        GemvLnPass::Late => rewrite_source(
            "gemv_m1_ln_source",
            &src,
            &[
                ("for (; k + 16u <= k1; k += 16u) {", "for (; false; k += 16u) {"),
                ("const LN_AHEAD: bool = true;", "const LN_AHEAD: bool = false;"),
                ("let pre = cw < nw && k0 + 8u <= k1;", "let pre = false;"),
            ],
        ),
    }
}

/// GEMMs of at least this many columns (a multiple of 128) take [`GemmTile::WIDE`]
/// (`VERBATIM_GEMM_WIDE_TILE_MIN_N`, to compare on a device). H200, µs a GEMM against 32 x
/// 64: small.en's cross K|V (N = 18432) 725 -> 638, its Q|K|V (2304) 110 -> 101, fc1 (3072)
/// 128 -> 123, tiny.en's cross K|V (3072) 78 -> 74; narrower GEMMs lost or gained by turns
/// (tiny.en's Q|K|V, 1152: 42.7 -> 37.2; its fc1, 1536: 43.6 -> 46.8; every N = d GEMM lost
/// 2-15 %), so the rule is the width.
const GEMM_WIDE_TILE_MIN_N: u32 = 2048;

/// gemm_planes.wgsl over `tile` (subgroups of 1 x 2 blocks; see [`GemmTile`]).
pub fn gemm_planes_tile_source(tile: GemmTile) -> Result<String> {
    if tile != GemmTile::NARROW && tile != GemmTile::WIDE {
        return Err(Error::Invalid(format!("gemm_planes: no {} x {} tile", tile.rows, tile.cols)));
    }
    let tm = format!("const TM: u32 = {}u;", tile.rows);
    let wr = format!("const WR: u32 = {}u;", tile.rows / 16);
    let wc = format!("const WC: u32 = {}u;", tile.cols / 32);
    let size = format!("@workgroup_size({})", 32 * tile.subgroups());
    let cs = format!("var<workgroup> cs: array<f32, {}>;", 320 * tile.subgroups());
    rewrite_source(
        "gemm_planes.wgsl",
        GEMM_PLANES_SOURCE,
        &[
            ("const TM: u32 = 64u;", tm.as_str()),
            ("const WR: u32 = 2u;", wr.as_str()),
            ("const WC: u32 = 2u;", wc.as_str()),
            ("@workgroup_size(128)", size.as_str()),
            ("var<workgroup> cs: array<f32, 1280>;", cs.as_str()),
        ],
    )
}

/// GEMMs of at most this many columns take [`gemm_planes_narrow_source`]'s tiles (or
/// `VERBATIM_GEMM_NARROW_MAX_N`, to compare on a device): all of them. On the H200 the
/// 32-row tiles were faster at every width measured, wide ones too (tiny.en fc1, N = 1536:
/// 63 -> 46 us; the cross K|V, N = 3072: 109 -> 80; small.en's N = 768 GEMMs by 25-30 %).
const GEMM_PLANES_NARROW_MAX_N: u32 = u32::MAX;

/// gemm_planes.wgsl writing its output as f16 hi/lo planes (gemm_emit_planes.wgsl): rows
/// planes for the next GEMM, or a fused Q|K|V's head planes for attention_coop.wgsl.
pub fn gemm_planes_out_source(narrow: bool) -> Result<String> {
    let base = if narrow { gemm_planes_narrow_source()? } else { GEMM_PLANES_SOURCE.to_string() };
    gemm_planes_out_from(&base)
}

/// [`gemm_planes_out_source`] over another tile.
pub fn gemm_planes_out_tile_source(tile: GemmTile) -> Result<String> {
    gemm_planes_out_from(&gemm_planes_tile_source(tile)?)
}

fn gemm_planes_out_from(base: &str) -> Result<String> {
    let calls = [
        "    emit(c00, d00, cb, lane, r0, q0);\n",
        "    emit(c01, d01, cb, lane, r0, q0 + 16u);\n",
        "        emit(c10, d10, cb, lane, r0 + 16u, q0);\n",
        "        emit(c11, d11, cb, lane, r0 + 16u, q0 + 16u);\n",
    ];
    let renamed: Vec<String> = calls.iter().map(|c| c.replace("emit(", "emit_planes(")).collect();
    let edits: Vec<(&str, &str)> = calls.iter().zip(&renamed).map(|(a, b)| (*a, b.as_str())).collect();
    Ok(rewrite_source("gemm_planes.wgsl", base, &edits)? + include_str!("gemm_emit_planes.wgsl"))
}
/// attention_coop.wgsl: the encoder's self-attention on cooperative matrices over head planes.
pub const ATTENTION_COOP_SOURCE: &str = concat!("enable f16;\nenable wgpu_cooperative_matrix;\n", include_str!("attention_coop.wgsl"));
/// Keys per split of attention_coop.wgsl (a multiple of its 32-key block): 1500 keys in 4.
const ATTENTION_COOP_SPLIT_KEYS: u32 = 384;
/// Queries per workgroup of attention_coop.wgsl as written (its QW = 16 NSG; t_pad is a
/// multiple of it).
pub const ATTENTION_COOP_QUERIES: u32 = 64;

/// attention_coop.wgsl with `nsg` subgroups of 16 queries per workgroup (4 as written, or 2)
/// and its P·V leaving through the score tile `od` dims a round (32 as written: half the
/// tile, two rounds; or 64: one round through a tile twice as wide). Workgroup memory:
/// 4 x 32 37 KiB, 4 x 64 45 KiB, 2 x 64 32 KiB, 2 x 32 28 KiB.
pub fn attention_coop_source(nsg: u32, od: u32) -> Result<String> {
    if !matches!((nsg, od), (2, 64) | (2, 32) | (4, 32) | (4, 64)) {
        return Err(Error::Invalid(format!("attention_coop: {nsg} subgroups with {od}-dim rounds (2 x 64, 2 x 32, 4 x 32 or 4 x 64)")));
    }
    let n = format!("const NSG: u32 = {nsg}u;");
    let o = format!("const OD: u32 = {od}u;");
    let w = format!("@workgroup_size({})", 32 * nsg);
    rewrite_source(
        "attention_coop.wgsl",
        ATTENTION_COOP_SOURCE,
        &[("const NSG: u32 = 4u;", n.as_str()), ("const OD: u32 = 32u;", o.as_str()), ("@workgroup_size(128)", w.as_str())],
    )
}
/// Whether the encoder's attention takes attention_coop.wgsl's `main_held` (P·V's
/// accumulators held across key blocks, rescaled only when a row's scale moves) or `main`
/// (each block's P·V added into registers): `VERBATIM_ATTENTION_COOP_HELD=1|0`. `main`:
/// on the lent H100 (bench/RESULTS.md, 2026-12-08) main_held was 7-9 % faster but wrong
/// (its test, attention_coop_held_matches_reference, now ignored, failed its first case;
/// every transcript differed); it stays off until that is found.
pub fn attention_coop_held() -> bool {
    std::env::var("VERBATIM_ATTENTION_COOP_HELD").map_or(ATTENTION_COOP_HELD, |v| v != "0")
}
const ATTENTION_COOP_HELD: bool = false;

/// attention_coop.wgsl in shape `nsg` x `od` ([`attention_coop_source`]), entry `main_held`
/// or `main`, each combination under a name of its own (kernels are cached by name).
fn attention_coop_kernel(gpu: &Gpu, nsg: u32, od: u32, held: bool) -> Result<Arc<Kernel>> {
    let src = attention_coop_source(nsg, od)?;
    let name = match (nsg, od, held) {
        (4, 32, false) => "attention_coop",
        (4, 64, false) => "attention_coop (64-dim rounds)",
        (2, 64, false) => "attention_coop (2 subgroups, 64-dim rounds)",
        (2, 32, false) => "attention_coop (2 subgroups, 32-dim rounds)",
        (4, 32, true) => "attention_coop_held",
        (4, 64, true) => "attention_coop_held (64-dim tile)",
        (2, 64, true) => "attention_coop_held (2 subgroups, 64-dim tile)",
        _ => "attention_coop_held (2 subgroups, 32-dim tile)",
    };
    gpu.kernel_entry(name, &src, if held { "main_held" } else { "main" }, &[Access::Read, Access::ReadWrite])
}
/// split_f16.wgsl: f32 rows into f16 hi/lo planes (any device).
pub const SPLIT_F16_SOURCE: &str = concat!(include_str!("split_f16.wgsl"), include_str!("row_stats.wgsl"), include_str!("f16_split.wgsl"));
/// `src` as written (`on`) or with its `const {name}: bool = true;` rewritten to false: the
/// switch a kernel keeps to time a rewrite against the form it replaced on a device (the
/// same words either way; its kernel test compares the two).
pub fn switched(src: &str, name: &str, on: bool) -> Result<String> {
    if on {
        return Ok(src.to_string());
    }
    let (from, to) = (format!("const {name}: bool = true;"), format!("const {name}: bool = false;"));
    rewrite_source(name, src, &[(&from, &to)])
}

/// Whether the environment leaves a switch on (anything but `VAR=0`): the switches that
/// keep an older form of a kernel or a policy to compare on a device.
pub(crate) fn env_on(var: &str) -> bool {
    std::env::var(var).map_or(true, |v| v != "0")
}

/// layernorm.wgsl, with the row statistics it shares with split_f16.wgsl.
const LAYERNORM_SOURCE: &str = concat!(include_str!("layernorm.wgsl"), include_str!("row_stats.wgsl"));
/// Rows of a gemm_planes.wgsl tile: the planes are padded to a multiple of it.
const GEMM_PLANES_ROWS: u32 = 64;
/// K per slice of gemm_planes.wgsl (its `CK`): its GEMMs take K a multiple of it. (64-deep
/// slices measured slower on the H200: the kernel lab's gemm_planes.ck64.)
pub const GEMM_PLANES_CK: u32 = 32;

const GEMM_FLAG_BIAS: u32 = 1;
const GEMM_FLAG_GELU: u32 = 2;
/// gemm_emit_planes.wgsl: the output as head planes (else rows planes).
const GEMM_FLAG_HEAD_PLANES: u32 = 32;
/// gemm_epilogue.wgsl: Y in column segments of y_stride, one after the other.
const GEMM_FLAG_SEGMENTS: u32 = 64;
const GEMM_FLAG_ACCUMULATE: u32 = 4;
const GEMM_FLAG_CONV: u32 = 8;
/// GEMV only: LayerNorm the input rows first (gemv.wgsl).
const GEMV_FLAG_LAYERNORM: u32 = 16;
/// GEMV (main_m1) only: the input is the split attention's partials, merged on the way in.
const GEMV_FLAG_MERGE: u32 = 32;
/// Limits of that merge (gemv.wgsl's workgroup arrays): the row's width, heads x splits.
const GEMV_MERGE_MAX_K: u32 = 1280;
const GEMV_MERGE_MAX_PARTS: u32 = 128;

/// Split a 1-D count of workgroups into an (x, y) grid the kernels fold back with
/// `x + y * 32768` (the per-dimension limit is 65535).
fn grid_1d(groups: u32) -> [u32; 2] {
    if groups <= 32768 {
        [groups, 1]
    } else {
        [32768, groups.div_ceil(32768)]
    }
}

/// A weight matrix on the GPU. The model's [n][k] (output-major, as PyTorch and
/// CTranslate2 store a Linear) is uploaded transposed to k-major [k][n], f16 pairs packed
/// along n in u32 words: the GEMV kernel then gives each thread a column pair and every
/// read is contiguous across threads (see gemv.wgsl). n must be even.
pub struct F16Matrix {
    pub buf: Buffer,
    pub n: u32,
    pub k: u32,
}

impl F16Matrix {
    /// Upload `bits` (f16, row-major [n][k]) transposed.
    pub fn from_bits(gpu: &Gpu, label: &str, bits: &[u16], n: usize, k: usize) -> Result<Self> {
        if n % 2 != 0 {
            return Err(Error::Invalid(format!("{label}: {n} output rows; packed f16 needs an even count")));
        }
        if bits.len() != n * k {
            return Err(Error::Invalid(format!("{label}: {} values for a [{n}, {k}] matrix", bits.len())));
        }
        let mut t = vec![0u16; n * k];
        // Blocked transpose: 64x64 tiles keep both sides in cache for large matrices.
        const B: usize = 64;
        for r0 in (0..n).step_by(B) {
            for c0 in (0..k).step_by(B) {
                for r in r0..(r0 + B).min(n) {
                    for c in c0..(c0 + B).min(k) {
                        t[c * n + r] = bits[r * k + c];
                    }
                }
            }
        }
        Ok(F16Matrix { buf: gpu.upload(label, bytemuck::cast_slice(&t))?, n: n as u32, k: k as u32 })
    }

    pub fn bytes(&self) -> u64 {
        self.n as u64 * self.k as u64 * 2
    }
}

/// A weight matrix on the GPU as the checkpoint stores it, row-major [n][k], f16 pairs
/// packed along k in u32 words (k even): the tied embedding table, which the embedding
/// lookup reads by row and the logits GEMV (gemv_rows.wgsl) reads front to back.
pub struct F16Rows {
    pub buf: Buffer,
    pub n: u32,
    pub k: u32,
}

impl F16Rows {
    /// Upload `bits` (f16, row-major [n][k]) as they are.
    pub fn from_bits(gpu: &Gpu, label: &str, bits: &[u16], n: usize, k: usize) -> Result<Self> {
        Self::from_le_bytes(gpu, label, bytemuck::cast_slice(bits), n, k)
    }

    /// [`F16Rows::from_bits`] from the values' little-endian bytes (as a file stores them,
    /// at any alignment).
    pub fn from_le_bytes(gpu: &Gpu, label: &str, bytes: &[u8], n: usize, k: usize) -> Result<Self> {
        if !k.is_multiple_of(2) {
            return Err(Error::Invalid(format!("{label}: rows of {k} values; packed f16 needs an even count")));
        }
        if bytes.len() != n * k * 2 {
            return Err(Error::Invalid(format!("{label}: {} bytes for a [{n}, {k}] f16 matrix", bytes.len())));
        }
        Ok(F16Rows { buf: gpu.upload(label, bytes)?, n: n as u32, k: k as u32 })
    }

    pub fn bytes(&self) -> u64 {
        self.n as u64 * self.k as u64 * 2
    }
}

/// A block-quantized (q8_0 / q4_0) weight matrix on the GPU, in gemv_q.wgsl's layout (see
/// `crate::quant::block`).
pub struct QMatrix {
    pub codes: Buffer,
    pub scales: Buffer,
    pub n: u32,
    pub k: u32,
    pub format: BlockFormat,
}

impl QMatrix {
    pub fn upload(gpu: &Gpu, label: &str, q: &BlockQuant) -> Result<Self> {
        Ok(QMatrix {
            codes: gpu.upload(&format!("{label} codes"), bytemuck::cast_slice(&q.words))?,
            scales: gpu.upload(&format!("{label} scales"), bytemuck::cast_slice(&q.scales))?,
            n: q.n as u32,
            k: q.k as u32,
            format: q.format,
        })
    }

    pub fn bytes(&self) -> u64 {
        self.codes.size() + self.scales.size()
    }
}

/// What to do after the matrix product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Epilogue {
    pub gelu: bool,
    /// Add into the output instead of overwriting it (the residual add).
    pub accumulate: bool,
}

/// A view of rows of an f32 activation buffer: element (r, c) is at `off + r * stride + c`.
#[derive(Clone, Copy)]
pub struct Rows<'a> {
    pub buf: &'a Buffer,
    pub off: u32,
    pub stride: u32,
}

impl<'a> Rows<'a> {
    pub fn new(buf: &'a Buffer, stride: usize) -> Self {
        Rows { buf, off: 0, stride: stride as u32 }
    }
    pub fn at(buf: &'a Buffer, off: usize, stride: usize) -> Self {
        Rows { buf, off: off as u32, stride: stride as u32 }
    }
}

/// gemm_planes.wgsl's parameters (the epilogue reads the same names as gemm_io.wgsl's).
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemmPlanesParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    y_off: u32,
    y_stride: u32,
    m_pad: u32,
    /// The q third's scale where the output is head planes (gemm_emit_planes.wgsl).
    q_scale: f32,
}

/// attention_coop.wgsl's parameters.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionCoopParams {
    tq: u32,
    tk: u32,
    heads: u32,
    t_pad: u32,
    split_keys: u32,
    n_splits: u32,
    _pad: [u32; 2],
}

/// split_f16.wgsl's parameters.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct SplitParams {
    rows: u32,
    cols: u32,
    rows_pad: u32,
    heads: u32,
    x_off: u32,
    x_stride: u32,
    scale: f32,
    eps: f32,
    conv_cs: u32,
    conv_ts: u32,
    conv_stride: u32,
    conv_tin: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemmParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    conv_cs: u32,
    conv_ts: u32,
    conv_stride: u32,
    conv_tin: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GemvParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    eps: f32,
    merge_splits: u32,
    merge_hd: u32,
    _pad: u32,
}

impl GemvParams {
    /// The parameter block both GEMV families read (gemv.wgsl, gemv_q.wgsl).
    #[allow(clippy::too_many_arguments)]
    fn new(x: Rows, m: u32, n: u32, k: u32, norm: Option<NormArgs>, bias: bool, y: Rows, ep: Epilogue) -> Self {
        let flags = if bias { GEMM_FLAG_BIAS } else { 0 }
            | if ep.gelu { GEMM_FLAG_GELU } else { 0 }
            | if ep.accumulate { GEMM_FLAG_ACCUMULATE } else { 0 }
            | if norm.is_some() { GEMV_FLAG_LAYERNORM } else { 0 };
        GemvParams {
            m,
            n,
            k,
            flags,
            x_off: x.off,
            x_stride: x.stride,
            y_off: y.off,
            y_stride: y.stride,
            eps: norm.map_or(0.0, |n| n.eps),
            merge_splits: 0,
            merge_hd: 0,
            _pad: 0,
        }
    }
}

/// A LayerNorm to apply to a linear layer's input rows first (gamma, beta, eps).
#[derive(Clone, Copy)]
pub struct NormArgs<'a> {
    pub gamma: &'a Buffer,
    pub beta: &'a Buffer,
    pub eps: f32,
}

/// ffn_decode.wgsl's parameter block.
#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct FfnParams {
    d: u32,
    ffn: u32,
    chunks: u32,
    x_off: u32,
    x_stride: u32,
    eps: f32,
    fin_eps: f32,
    _p1: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LayerNormParams {
    rows: u32,
    cols: u32,
    x_off: u32,
    y_off: u32,
    eps: f32,
    _pad: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct AttentionParams {
    tq: u32,
    tk: u32,
    heads: u32,
    d: u32,
    q_off: u32,
    q_stride: u32,
    k_off: u32,
    k_stride: u32,
    v_off: u32,
    v_stride: u32,
    o_off: u32,
    o_stride: u32,
    causal: u32,
    causal_offset: u32,
    scale: f32,
    split_keys: u32,
    /// main_split: a single split writes the normalised output itself (no merge).
    direct: u32,
    /// main_merge_planes: rows of its planes output.
    rows_pad: u32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct EmbedParams {
    n_tok: u32,
    d: u32,
    pos0: u32,
    vocab: u32,
    tok_off: u32,
    done_off: u32,
    grid_lo: u32,
    grid_hi: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct CopyRowsParams {
    rows: u32,
    width: u32,
    src_off: u32,
    src_stride: u32,
    dst_off: u32,
    dst_stride: u32,
    _pad: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
pub(crate) struct SelectParams {
    pub vocab: u32,
    pub ts_begin: u32,
    pub eot: u32,
    pub flags: u32,
    pub ts_lo: u32,
    pub ts_hi: u32,
    pub extra0: u32,
    pub extra1: u32,
    pub probe: u32,
    pub logit_off: u32,
    /// Word offset of the 8 output words in `out`.
    pub out_off: u32,
    /// `select_pick`: where in `ids` the choice goes.
    pub tok_out: u32,
    /// Flags 8/16: word offset of the timestamp state (decode::TsState) in `ids`.
    pub state_off: u32,
    /// Flag 8: word offset in `out` of the masks the pick used (ts_lo, then bit 0 text
    /// masked | bit 1 "timestamps beat text" checked).
    pub rules_off: u32,
    /// Flag 32 (`main_pick`): word offset in `ids` of the done flag, set when it picks eot.
    pub done_off: u32,
    pub _pad: u32,
}

/// select.wgsl flags past the masks (1 text, 2 non-timestamps): the pick checks
/// "timestamps beat text"; the masks come from the timestamp state in `ids`; the pick
/// pushes its choice into that state.
pub(crate) const SELECT_FLAG_TS_OVER_TEXT: u32 = 4;
pub(crate) const SELECT_FLAG_RULES_FROM_STATE: u32 = 8;
pub(crate) const SELECT_FLAG_TRACK_STATE: u32 = 16;
/// `main_pick` sets `ids[done_off]` when it picks eot (the steps after it are gated off:
/// see `Kernels::embed`).
pub(crate) const SELECT_FLAG_MARK_DONE: u32 = 32;

/// Multi-head attention geometry and where Q, K, V and the output live.
#[derive(Clone, Copy)]
pub struct AttentionArgs<'a> {
    pub q: Rows<'a>,
    pub k: Rows<'a>,
    pub v: Rows<'a>,
    pub out: Rows<'a>,
    pub tq: u32,
    pub tk: u32,
    pub heads: u32,
    pub head_dim: u32,
    /// Some(offset): query i sees keys j <= i + offset.
    pub causal: Option<u32>,
}

/// The compiled kernels of the Whisper path, plus a small zero buffer bound where a kernel
/// has an optional input that is absent (no bias).
pub struct Kernels {
    gemm: Arc<Kernel>,
    /// The same GEMM source compiled under its own name, so the profile tells the
    /// convolutions (im2col reads) from the linear layers.
    conv: Arc<Kernel>,
    /// Both again on cooperative matrices (gemm_coop.wgsl), where the device has them.
    gemm_coop: Option<Arc<Kernel>>,
    conv_coop: Option<Arc<Kernel>>,
    /// The linear layers' tensor-core GEMM over pre-split planes (gemm_planes.wgsl), where
    /// the device has cooperative matrices; `VERBATIM_GEMM_PLANES=0` leaves it out (to
    /// compare on a device).
    gemm_planes: Option<Arc<Kernel>>,
    /// gemm_planes.wgsl writing f16 planes (gemm_emit_planes.wgsl), with gemm_planes.
    gemm_planes_out: Option<Arc<Kernel>>,
    /// gemm_planes.wgsl over 32-row tiles, for every GEMM (up to `narrow_max_n` columns);
    /// `VERBATIM_GEMM_NARROW=0` leaves it out (to compare on a device).
    gemm_planes_narrow: Option<Arc<Kernel>>,
    /// gemm_planes_out over 32-row tiles, with gemm_planes_narrow.
    gemm_planes_out_narrow: Option<Arc<Kernel>>,
    /// The tile of gemm_planes_narrow and gemm_planes_out_narrow ([`GemmTile::NARROW`];
    /// tests set others).
    tile: GemmTile,
    /// gemm_planes over [`GemmTile::WIDE`] (rows out and planes out), for GEMMs of at least
    /// `wide_tile_min_n` columns.
    gemm_planes_wide: Option<Arc<Kernel>>,
    gemm_planes_out_wide: Option<Arc<Kernel>>,
    wide_tile_min_n: u32,
    /// GEMMs of at most this many columns take the 32-row tiles.
    narrow_max_n: u32,
    /// The second planes buffer, as large as `planes`: one GEMM's planes output while
    /// `planes` holds its input (fc1 -> fc2).
    planes_out: Option<Buffer>,
    /// f32 rows into f16 hi/lo planes (split_f16.wgsl), for gemm_planes.
    split_planes: Arc<Kernel>,
    /// A LayerNorm writing those planes (split_f16.wgsl main_norm_rows).
    norm_planes: Arc<Kernel>,
    /// The same writing its f32 rows as well (main_norm_rows_out).
    norm_planes_rows: Arc<Kernel>,
    /// Whether the encoder's LayerNorms write the GEMM planes (else a LayerNorm and a
    /// split); `VERBATIM_NORM_PLANES=0`: not, to compare on a device.
    pub norm_into_planes: bool,
    /// Whether the encoder's GEMMs write the planes their readers take (Q|K|V -> head
    /// planes, fc1 -> fc2's); `VERBATIM_EPILOGUE_PLANES=0`: not, to compare on a device.
    pub gemm_into_planes: bool,
    /// Whether the encoder's attention merges its key splits into the out projection's
    /// planes (attention.wgsl main_merge_planes; else rows and a split);
    /// `VERBATIM_MERGE_PLANES=0`: not, to compare on a device.
    pub merge_into_planes: bool,
    /// A convolution's im2col rows into those planes (split_f16.wgsl main_rows with conv_stride);
    /// `VERBATIM_CONV_PLANES=0` keeps the convolutions on gemm_coop.wgsl (to compare).
    conv_planes: Option<Arc<Kernel>>,
    /// The planes of the GEMM in flight, [2][rows_pad][k] f16, sized by
    /// [`Kernels::reserve_gemm_planes`] (None: gemm_coop.wgsl splits X itself).
    planes: Option<Buffer>,
    /// The encoder's self-attention on cooperative matrices (attention_coop.wgsl), where the
    /// device has them; `VERBATIM_ATTENTION_COOP=0` leaves it out (to compare on a device).
    attention_coop: Option<Arc<Kernel>>,
    /// Its queries per workgroup (16 x its subgroups; [`Kernels::with_attention_coop_shape`]).
    attention_coop_queries: u32,
    /// Its keys per split: [`ATTENTION_COOP_SPLIT_KEYS`], or
    /// `VERBATIM_ATTENTION_COOP_SPLIT_KEYS` (a multiple of 32, to compare on a device).
    attention_coop_split_keys: u32,
    /// A fused Q|K|V into f16 hi/lo head planes (split_f16.wgsl main_heads).
    split_heads: Arc<Kernel>,
    /// Those planes, [6][heads][t_pad][64] f16, sized by
    /// [`Kernels::reserve_blocked_attention`] where attention_coop is there.
    head_planes: Option<Buffer>,
    gemv: Arc<Kernel>,
    /// The GEMV for one row (a decode step), named registers instead of a row array: its
    /// variants with the switches fixed (`gemv_m1_source`), indexed by [`GemvM1Variant`];
    /// all three the generic kernel (both switches read from the flags) with
    /// `VERBATIM_GEMV_M1_GENERIC=1`.
    gemv_m1: [Arc<Kernel>; 3],
    /// The LayerNorm variant a verify pass takes where it differs from a step's (None: the
    /// same; see [`GemvLnPass`]).
    gemv_m1_ln_pass: Option<Arc<Kernel>>,
    /// gemv.wgsl's `main_rows` without and with the LayerNorm (indexed as [`GemvM1Variant`]
    /// Plain, LayerNorm) where verify passes take it ([`gemv_pass_rows_min`]).
    gemv_pass_rows: [Option<Arc<Kernel>>; 2],
    /// The fewest rows of a pass that take `gemv_pass_rows`, indexed as it is (u32::MAX: none).
    gemv_pass_rows_min: [u32; 2],
    /// The M = 1 GEMV for matrices of 8 MiB and more (gemv_stream.wgsl).
    gemv_stream: Arc<Kernel>,
    /// The logits GEMV without and with its LayerNorm folded in (`gemv_rows_source`): one
    /// grid layer per activation row.
    gemv_rows: [Arc<Kernel>; 2],
    /// Its `main_rows` entry (every weight word loaded once for up to 16 rows), which takes
    /// a verify pass's logits (`linear_rows` with `pass`); None with `VERBATIM_LOGITS_LAYERS=1`
    /// (grid layers, to compare on a device).
    gemv_rows_shared: Option<Arc<Kernel>>,
    /// Matrices of at least this many bytes take gemv_stream ([`GEMV_WIDE_MIN_BYTES`], or
    /// `VERBATIM_GEMV_WIDE_MIN_BYTES` to compare on a device).
    gemv_wide_min_bytes: u64,
    /// The decoder's feed-forward block (ffn_decode.wgsl): the chunks' partials, their sum.
    ffn_decode: Arc<Kernel>,
    /// The chunk kernel a verify pass takes where it differs from a step's (None: the same):
    /// [`ffn_decode_late_source`]'s, whose registers let three of a pass's workgroups share
    /// an SM instead of two (a 16-row pass of tiny.en 102 -> 86 µs, small 709 -> 599;
    /// RESULTS.md 2026-12-06), while steps keep `main` (one row fits one wave either way,
    /// and the later load costs it ~0.2 µs). `VERBATIM_FFN_LATE=0`: passes on `main` too;
    /// `=1`: steps on the late kernel too (to compare on a device).
    ffn_decode_pass: Option<Arc<Kernel>>,
    ffn_sum: Arc<Kernel>,
    /// The sum that also writes the final LayerNorm of its rows (`main_sum_norm`; None where
    /// the device takes fewer than its 12 storage buffers a kernel, or with
    /// `VERBATIM_FINAL_NORM_FUSED=0` to compare on a device), and its arrival counters and
    /// row copies.
    ffn_sum_norm: Option<Arc<Kernel>>,
    ffn_fin: Buffer,
    /// Whether a decode step or verify pass over f16 weights takes it
    /// (`VERBATIM_FFN_FUSED=0`: fc1 and fc2 as two GEMVs, to compare on a device).
    pub ffn_fused: bool,
    /// Block-quantized GEMVs (gemv_q.wgsl): q8_0, q4_0, and their wide forms.
    gemv_q8: Arc<Kernel>,
    gemv_q4: Arc<Kernel>,
    gemv_q8_wide: Arc<Kernel>,
    gemv_q4_wide: Arc<Kernel>,
    layernorm: Arc<Kernel>,
    attention: Arc<Kernel>,
    attention_tiled: Arc<Kernel>,
    /// The register-blocked attention (attention_blocked.wgsl): many queries, head_dim 64,
    /// no causal mask (the encoder).
    attention_blocked: Arc<Kernel>,
    /// `VERBATIM_ATTENTION_TILED=1`: the tiled kernel where the blocked one would run (to
    /// compare the two on a device).
    force_tiled_attention: bool,
    /// Partials of the blocked attention's key splits, [query][head][split][66], sized by
    /// [`Kernels::reserve_blocked_attention`] (None: one split).
    blocked_partials: Option<Buffer>,
    attention_split: Arc<Kernel>,
    /// main_split_rows: a verify pass's unmasked split attention (the cross-attention) four
    /// query rows a workgroup, keys and values read once for the four; None with
    /// `VERBATIM_ATTENTION_ROWS=0` (main_split a row, to compare on a device).
    attention_split_rows: Option<Arc<Kernel>>,
    attention_merge: Arc<Kernel>,
    /// main_merge writing the next GEMM's planes (attention.wgsl main_merge_planes).
    attention_merge_planes: Arc<Kernel>,
    /// Partials of the split attention: [query][head][split][head_dim + 2].
    attention_partials: Buffer,
    embed: Arc<Kernel>,
    /// Bound as the embedding's grid table where no step is gated (never written then).
    no_grids: Buffer,
    copy_rows: Arc<Kernel>,
    select: Arc<Kernel>,
    select_partial: Arc<Kernel>,
    /// The selection's merge writing only the chosen id (drafts chosen on the GPU).
    select_pick: Arc<Kernel>,
    /// The selection of several rows, each under its own parameters (a verify pass).
    select_partial_rows: Arc<Kernel>,
    select_rows: Arc<Kernel>,
    /// Each pair above as one dispatch (select.wgsl's `main_pick_fused`, `main_rows_fused`):
    /// the last workgroup of a row to arrive merges its partials.
    select_pick_fused: Arc<Kernel>,
    select_rows_fused: Arc<Kernel>,
    /// Whether the selections take the fused kernels (`VERBATIM_SELECT_FUSED=0`: the pairs,
    /// to compare on a device; the same bits either way).
    pub select_fused: bool,
    /// Per row: 64 partial reductions of the logits + the probe logit (see select.wgsl);
    /// then the fused kernels' row counters.
    select_partials: Buffer,
    /// Bound where the pairs' kernels declare the fused kernels' atomics (never written).
    select_no_atomics: Buffer,
    zero: Buffer,
    /// A read-write binding nothing writes (gemm_into_planes' rows output).
    unused_out: Buffer,
}

/// ffn_decode.wgsl with fc2's words loaded after the hidden values rather than first: the
/// same loads and arithmetic, so the same bits, with 32 fewer registers a thread held through
/// fc1. `main` takes 109 registers on NVIDIA's compiler (RESULTS.md 2026-12-04, third
/// session): two 256-thread workgroups an SM, so a verify pass of 16 rows (1536 workgroups
/// on tiny.en) runs in six waves on 132 SMs, and passes grow by steps where a wave is added.
/// Fewer registers trade a load's round trip after the hidden values for more workgroups an
/// SM. Timed on an H100 (RESULTS.md 2026-12-06): 64 registers, three workgroups an SM; a
/// pass of 4 to 16 rows 2-16 µs faster on tiny.en (4 layers), one of 1-2 rows ~0.8 µs
/// slower: verify passes take it, decode steps keep `main`.
pub fn ffn_decode_late_source() -> Result<String> {
    const FC2_FIRST: &str = "    let v2a = fc2_words(h0, nh, min(lid, dw - 1u), dw);
    var v2b = v2a;
    if (dw > WG) {
        v2b = fc2_words(h0, nh, min(lid + WG, dw - 1u), dw);
    }
";
    const HIDDEN_DONE: &str = "        hs[2u * cp + 1u] = h.y;
    }
    workgroupBarrier();
";
    let late = HIDDEN_DONE.replace("    workgroupBarrier();\n", &format!("{FC2_FIRST}    workgroupBarrier();\n"));
    rewrite_source("ffn_decode_late_source", &ffn_decode_source()?, &[(FC2_FIRST, ""), (HIDDEN_DONE, &late)])
}

/// ffn_decode.wgsl with b1 loaded early (`EARLY_BIAS`, shipped) or where it is used
/// (`VERBATIM_FFN_EARLY_BIAS=0`, to compare; the same bits).
pub fn ffn_decode_source() -> Result<String> {
    switched(FFN_DECODE_SOURCE, "EARLY_BIAS", env_on("VERBATIM_FFN_EARLY_BIAS"))
}

/// main_m1 with the LayerNorm folded in, loading as `v` says.
fn gemv_m1_ln_pass_kernel(gpu: &Gpu, v: GemvLnPass) -> Result<Arc<Kernel>> {
    use Access::{Read as R, ReadWrite as W};
    let name = match v {
        GemvLnPass::Main => "gemv_m1_f16_ln",
        GemvLnPass::Late => "gemv_m1_f16_ln_late",
    };
    gpu.kernel_entry(name, &gemv_m1_ln_source(v)?, "main_m1", &[R, R, R, R, R, W])
}

/// From how many rows a verify pass's GEMVs take gemv.wgsl's `main_rows` ([`GEMV_PASS_ROWS`]
/// rows a workgroup, each weight word loaded once for them) instead of main_m1 a row, as
/// [plain, with the LayerNorm] (u32::MAX: never): `VERBATIM_GEMV_PASS_ROWS` = `N` (both
/// from N rows, 1 to [`VERIFY_MAX_ROWS`]), `N,M` (with the norm from N, plain from M) or `0`
/// (never); unset: [`GEMV_PASS_ROWS_MIN`].
fn gemv_pass_rows_min(v: &str) -> Result<[u32; 2]> {
    let bad = || Error::Invalid(format!("VERBATIM_GEMV_PASS_ROWS={v}: 0 (never), or N or N,M rows from 1 to {VERIFY_MAX_ROWS} (with the norm, plain)"));
    let rows = |t: &str| match t.parse::<u32>() {
        Ok(n) if (1..=VERIFY_MAX_ROWS).contains(&n) => Ok(n),
        _ => Err(bad()),
    };
    match v.split_once(',') {
        _ if v.is_empty() => Ok(GEMV_PASS_ROWS_MIN),
        _ if v == "0" => Ok([u32::MAX; 2]),
        None => rows(v).map(|n| [n, n]),
        Some((ln, plain)) => Ok([rows(plain)?, rows(ln)?]),
    }
}

/// `main_rows` without and with the LayerNorm (indexed as [`GemvM1Variant`] Plain,
/// LayerNorm) where passes take it (`min` as [`gemv_pass_rows_min`]).
fn gemv_pass_rows_kernels(gpu: &Gpu, min: [u32; 2]) -> Result<[Option<Arc<Kernel>>; 2]> {
    use Access::{Read as R, ReadWrite as W};
    let rw = [R, R, R, R, R, W];
    let kernel = |name: &'static str, v: GemvM1Variant, min: u32| -> Result<Option<Arc<Kernel>>> {
        if min > VERIFY_MAX_ROWS {
            return Ok(None);
        }
        Ok(Some(gpu.kernel_entry(name, &gemv_m1_source(v)?, "main_rows", &rw)?))
    };
    Ok([
        kernel("gemv_pass_rows_f16_plain", GemvM1Variant::Plain, min[0])?,
        kernel("gemv_pass_rows_f16_ln", GemvM1Variant::LayerNorm, min[1])?,
    ])
}

/// Rows a workgroup of gemv.wgsl's `main_rows` (its `RB`).
const GEMV_PASS_ROWS: u32 = 4;
/// The fewest rows of a verify pass that take `main_rows`, [plain, with the LayerNorm], unless
/// `VERBATIM_GEMV_PASS_ROWS` says otherwise. H100, µs a pass of 4 dispatches against
/// main_m1's (RESULTS.md 2026-12-06, twelfth session): with the norm, tiny.en 87.2 / 89.9
/// at 9 rows, 104.9 / 120.2 at 16 (86.3 / 69.5 at one: four rows' products and statistics
/// for one), small.en 399 / 456 at 9, 449 / 663 at 16; plain, small.en 137 / 155 at 9 but
/// tiny.en 37.0 / 30.2 at 9, level from 13 (37.2 / 37.1). Hence 9 with the norm, 13 plain.
/// With passes of both sides of 9 rows in one replay, a dispatch slot must keep a bind
/// group for each kernel (`DispatchCache`): with one, the live replay got slower (jfk 0.15
/// against 0.10 ms/token). Since then (thirteenth session, H100, alternated): tiny.en
/// passes of 12 / 16 rows 0.411 / 0.483 ms against 0.430 / 0.499; live replays with ngram
/// drafts jfk 0.0970-0.0976 against 0.0976-0.0981, lhotse_2412 0.0768-0.0769 against
/// 0.0775-0.0838; the 20 samples equal faster-whisper.
const GEMV_PASS_ROWS_MIN: [u32; 2] = [13, 9];

/// The feed-forward chunk kernel: ffn_decode.wgsl's `main`, or with `late` the same from
/// [`ffn_decode_late_source`].
fn ffn_decode_kernel(gpu: &Gpu, late: bool) -> Result<Arc<Kernel>> {
    use Access::{Read as R, ReadWrite as W};
    match late {
        true => gpu.kernel("ffn_decode_f16_late", &ffn_decode_late_source()?, &[W, R, R, R, R, R, R, W]),
        false => gpu.kernel("ffn_decode_f16", &ffn_decode_source()?, &[W, R, R, R, R, R, R, W]),
    }
}

impl Kernels {
    /// Every kernel Whisper takes at load (compiled side by side: `Gpu::compile_together`).
    pub fn load(gpu: &Gpu) -> Result<Kernels> {
        gpu.compile_together(|| Self::load_each(gpu))
    }

    fn load_each(gpu: &Gpu) -> Result<Kernels> {
        use Access::{Read as R, ReadWrite as W};
        let tile = GemmTile::NARROW;
        let ffn_late = std::env::var("VERBATIM_FFN_LATE");
        let pass_rows_min = gemv_pass_rows_min(std::env::var("VERBATIM_GEMV_PASS_ROWS").as_deref().unwrap_or(""))?;
        let norm_planes_src = switched(SPLIT_F16_SOURCE, "NORM_AHEAD", env_on("VERBATIM_NORM_AHEAD"))?;
        // The planes GEMMs over 32-row tiles (32 x 64, and 32 x 128 for wide GEMMs).
        let planes_narrow = gpu.info.coop_matrix
            && std::env::var("VERBATIM_GEMM_PLANES").map_or(true, |v| v != "0")
            && std::env::var("VERBATIM_GEMM_NARROW").map_or(true, |v| v != "0");
        let kernels = Kernels {
            gemm: gpu.kernel("gemm_f16", GEMM_SOURCE, &[R, R, R, W])?,
            conv: gpu.kernel("conv_k3_f16", GEMM_SOURCE, &[R, R, R, W])?,
            gemm_coop: match gpu.info.coop_matrix {
                true => Some(gpu.kernel("gemm_coop_f16", GEMM_COOP_SOURCE, &[R, R, R, W])?),
                false => None,
            },
            conv_coop: match gpu.info.coop_matrix {
                true => Some(gpu.kernel("conv_k3_coop_f16", GEMM_COOP_SOURCE, &[R, R, R, W])?),
                false => None,
            },
            gemm_planes: match gpu.info.coop_matrix && std::env::var("VERBATIM_GEMM_PLANES").map_or(true, |v| v != "0") {
                true => Some(gpu.kernel("gemm_planes_f16", GEMM_PLANES_SOURCE, &[R, R, R, W])?),
                false => None,
            },
            gemm_planes_out: match gpu.info.coop_matrix && std::env::var("VERBATIM_GEMM_PLANES").map_or(true, |v| v != "0") {
                true => Some(gpu.kernel("gemm_planes_to_planes", &gemm_planes_out_source(false)?, &[R, R, R, W, W])?),
                false => None,
            },
            planes_out: None,
            gemm_planes_narrow: match planes_narrow {
                true => Some(gpu.kernel(tile.names().0, &gemm_planes_tile_source(tile)?, &[R, R, R, W])?),
                false => None,
            },
            gemm_planes_out_narrow: match planes_narrow {
                true => Some(gpu.kernel(tile.names().1, &gemm_planes_out_tile_source(tile)?, &[R, R, R, W, W])?),
                false => None,
            },
            tile,
            gemm_planes_wide: match planes_narrow {
                true => Some(gpu.kernel(GemmTile::WIDE.names().0, &gemm_planes_tile_source(GemmTile::WIDE)?, &[R, R, R, W])?),
                false => None,
            },
            gemm_planes_out_wide: match planes_narrow {
                true => Some(gpu.kernel(GemmTile::WIDE.names().1, &gemm_planes_out_tile_source(GemmTile::WIDE)?, &[R, R, R, W, W])?),
                false => None,
            },
            wide_tile_min_n: match std::env::var("VERBATIM_GEMM_WIDE_TILE_MIN_N") {
                Ok(v) if !v.is_empty() => v.parse().map_err(|_| Error::Invalid(format!("VERBATIM_GEMM_WIDE_TILE_MIN_N={v}: a column count")))?,
                _ => GEMM_WIDE_TILE_MIN_N,
            },
            narrow_max_n: match std::env::var("VERBATIM_GEMM_NARROW_MAX_N") {
                Ok(v) if !v.is_empty() => v.parse().map_err(|_| Error::Invalid(format!("VERBATIM_GEMM_NARROW_MAX_N={v}: a column count")))?,
                _ => GEMM_PLANES_NARROW_MAX_N,
            },
            split_planes: gpu.kernel_entry("split_f16", SPLIT_F16_SOURCE, "main_rows", &[R, W])?,
            norm_planes: gpu.kernel_entry("layernorm_planes", &norm_planes_src, "main_norm_rows", &[R, W, R, R])?,
            norm_planes_rows: gpu.kernel_entry("layernorm_planes_rows", &norm_planes_src, "main_norm_rows_out", &[R, W, R, R, W])?,
            norm_into_planes: std::env::var("VERBATIM_NORM_PLANES").map_or(true, |v| v != "0"),
            gemm_into_planes: std::env::var("VERBATIM_EPILOGUE_PLANES").map_or(true, |v| v != "0"),
            merge_into_planes: std::env::var("VERBATIM_MERGE_PLANES").map_or(true, |v| v != "0"),
            conv_planes: match std::env::var("VERBATIM_CONV_PLANES").map_or(true, |v| v != "0") {
                true => Some(gpu.kernel_entry("split_f16_conv", SPLIT_F16_SOURCE, "main_rows", &[R, W])?),
                false => None,
            },
            planes: None,
            attention_coop: match gpu.info.coop_matrix && std::env::var("VERBATIM_ATTENTION_COOP").map_or(true, |v| v != "0") {
                true => Some(attention_coop_kernel(gpu, 4, 32, attention_coop_held())?),
                false => None,
            },
            attention_coop_queries: ATTENTION_COOP_QUERIES,
            attention_coop_split_keys: match std::env::var("VERBATIM_ATTENTION_COOP_SPLIT_KEYS") {
                Ok(v) if !v.is_empty() => match v.parse::<u32>() {
                    Ok(k) if k > 0 && k % 32 == 0 => k,
                    _ => return Err(Error::Invalid(format!("VERBATIM_ATTENTION_COOP_SPLIT_KEYS={v}: a multiple of 32"))),
                },
                _ => ATTENTION_COOP_SPLIT_KEYS,
            },
            split_heads: gpu.kernel_entry("split_f16_heads", SPLIT_F16_SOURCE, "main_heads", &[R, W])?,
            head_planes: None,
            gemv: gpu.kernel("gemv_f16", GEMV_SOURCE, &[R, R, R, R, R, W])?,
            gemv_stream: gpu.kernel(
                "gemv_stream_f16",
                &gemv_stream_source(gemv_stream_slices(&gpu.device.limits()))?,
                &[R, R, R, R, R, W],
            )?,
            gemv_rows: {
                let branchless = branchless_loads_wanted();
                let (plain, ln) = if branchless { ("gemv_rows_f16", "gemv_rows_f16_ln") } else { ("gemv_rows_f16_branchy", "gemv_rows_f16_ln_branchy") };
                [
                    gpu.kernel(plain, &gemv_rows_source(false, branchless)?, &[R, R, R, R, R, W])?,
                    gpu.kernel(ln, &gemv_rows_source(true, branchless)?, &[R, R, R, R, R, W])?,
                ]
            },
            gemv_rows_shared: match std::env::var("VERBATIM_LOGITS_LAYERS").is_ok_and(|v| !v.is_empty() && v != "0") {
                true => None,
                false => {
                    let (name, branchless) = match branchless_loads_wanted() {
                        true => ("gemv_rows_f16_shared", true),
                        false => ("gemv_rows_f16_shared_branchy", false),
                    };
                    Some(gpu.kernel_entry(name, &gemv_rows_source(false, branchless)?, "main_rows", &[R, R, R, R, R, W])?)
                }
            },
            gemv_wide_min_bytes: match std::env::var("VERBATIM_GEMV_WIDE_MIN_BYTES") {
                Ok(v) if !v.is_empty() => v.parse().map_err(|_| Error::Invalid(format!("VERBATIM_GEMV_WIDE_MIN_BYTES={v}: a byte count")))?,
                _ => GEMV_WIDE_MIN_BYTES,
            },
            gemv_m1: if std::env::var("VERBATIM_GEMV_M1_GENERIC").is_ok_and(|v| !v.is_empty() && v != "0") {
                let k = gpu.kernel_entry("gemv_m1_f16", GEMV_SOURCE, "main_m1", &[R, R, R, R, R, W])?;
                [k.clone(), k.clone(), k]
            } else {
                let rw = [R, R, R, R, R, W];
                [
                    gpu.kernel_entry("gemv_m1_f16_plain", &gemv_m1_source(GemvM1Variant::Plain)?, "main_m1", &rw)?,
                    gpu.kernel_entry("gemv_m1_f16_ln", &gemv_m1_source(GemvM1Variant::LayerNorm)?, "main_m1", &rw)?,
                    gpu.kernel_entry("gemv_m1_f16_merge", &gemv_m1_source(GemvM1Variant::Merge)?, "main_m1", &rw)?,
                ]
            },
            gemv_m1_ln_pass: match GemvLnPass::from_env()? {
                GemvLnPass::Main => None,
                v => Some(gemv_m1_ln_pass_kernel(gpu, v)?),
            },
            gemv_pass_rows: gemv_pass_rows_kernels(gpu, pass_rows_min)?,
            gemv_pass_rows_min: pass_rows_min,
            ffn_decode: ffn_decode_kernel(gpu, ffn_late.as_deref() == Ok("1"))?,
            ffn_decode_pass: match ffn_late.as_deref() {
                Ok("0" | "1") => None,
                _ => Some(ffn_decode_kernel(gpu, true)?),
            },
            ffn_sum: gpu.kernel_entry("ffn_sum", FFN_DECODE_SOURCE, "main_sum", &[W, R, R, R, R, R, R, W])?,
            ffn_sum_norm: match gpu.device.limits().max_storage_buffers_per_shader_stage >= 12
                && std::env::var("VERBATIM_FINAL_NORM_FUSED").map_or(true, |v| v != "0")
            {
                true => Some(gpu.kernel_entry("ffn_sum_norm", FFN_DECODE_SOURCE, "main_sum_norm", &[W, R, R, R, R, R, R, W, W, R, R, W])?),
                false => None,
            },
            ffn_fin: gpu.buffer("ffn final-norm rows", (VERIFY_MAX_ROWS + VERIFY_MAX_ROWS * FFN_MAX_D) as u64 * 4)?,
            ffn_fused: std::env::var("VERBATIM_FFN_FUSED").map_or(true, |v| v != "0"),
            gemv_q8: gpu.kernel_entry("gemv_q8_0", GEMV_Q_SOURCE, "main_q8", &[R, R, R, R, R, R, W])?,
            gemv_q4: gpu.kernel_entry("gemv_q4_0", GEMV_Q_SOURCE, "main_q4", &[R, R, R, R, R, R, W])?,
            gemv_q8_wide: gpu.kernel_entry("gemv_wide_q8_0", &gemv_q_wide_source()?, "main_q8", &[R, R, R, R, R, R, W])?,
            gemv_q4_wide: gpu.kernel_entry("gemv_wide_q4_0", &gemv_q_wide_source()?, "main_q4", &[R, R, R, R, R, R, W])?,
            layernorm: gpu.kernel("layernorm", LAYERNORM_SOURCE, &[R, R, R, W])?,
            attention: gpu.kernel("attention", ATTENTION_SOURCE, &[R, R, R, W])?,
            attention_tiled: gpu.kernel_entry("attention_tiled", ATTENTION_SOURCE, "main_tiled", &[R, R, R, W])?,
            attention_blocked: gpu.kernel_entry("attention_blocked", ATTENTION_BLOCKED_SOURCE, "main_blocked", &[R, R, R, W])?,
            force_tiled_attention: std::env::var("VERBATIM_ATTENTION_TILED").is_ok_and(|v| !v.is_empty() && v != "0"),
            blocked_partials: None,
            attention_split: gpu.kernel_entry("attention_split", ATTENTION_SOURCE, "main_split", &[R, R, R, W])?,
            attention_split_rows: match std::env::var("VERBATIM_ATTENTION_ROWS").is_ok_and(|v| v == "0") {
                true => None,
                false => Some(gpu.kernel_entry("attention_split_rows", ATTENTION_SOURCE, "main_split_rows", &[R, R, R, W])?),
            },
            attention_merge: gpu.kernel_entry("attention_merge", &switched(ATTENTION_SOURCE, "MERGE_ONE_TRIP", env_on("VERBATIM_MERGE_ONE_TRIP"))?, "main_merge", &[R, R, R, W])?,
            attention_merge_planes: gpu.kernel_entry("attention_merge_planes", &switched(ATTENTION_SOURCE, "MERGE_ONE_TRIP", env_on("VERBATIM_MERGE_ONE_TRIP"))?, "main_merge_planes", &[R, R, R, W, W])?,
            attention_partials: gpu.buffer("attention partials", ATTENTION_PARTIALS_FLOATS * 4)?,
            embed: gpu.kernel("embed", include_str!("embed.wgsl"), &[R, R, R, W, W])?,
            no_grids: gpu.buffer("no gated grids", 4)?,
            copy_rows: gpu.kernel("copy_rows", include_str!("copy_rows.wgsl"), &[R, W])?,
            // Every selection entry declares all five buffers (the partials' reads and
            // writes go through functions that also name the fused kernels' atomics).
            select: gpu.kernel("select", include_str!("select.wgsl"), &[R, R, W, W, W])?,
            select_partial: gpu.kernel_entry("select_partial", include_str!("select.wgsl"), "main_partial", &[R, R, W, W, W])?,
            select_pick: gpu.kernel_entry("select_pick", include_str!("select.wgsl"), "main_pick", &[R, R, W, W, W])?,
            select_partial_rows: gpu.kernel_entry("select_partial_rows", include_str!("select.wgsl"), "main_partial_rows", &[R, R, W, W, W])?,
            select_rows: gpu.kernel_entry("select_rows", include_str!("select.wgsl"), "main_rows", &[R, R, W, W, W])?,
            select_pick_fused: gpu.kernel_entry("select_pick_fused", include_str!("select.wgsl"), "main_pick_fused", &[R, R, W, W, W])?,
            select_rows_fused: gpu.kernel_entry("select_rows_fused", include_str!("select.wgsl"), "main_rows_fused", &[R, R, W, W, W])?,
            select_fused: std::env::var("VERBATIM_SELECT_FUSED").map_or(true, |v| v != "0"),
            select_partials: gpu.buffer("select partials", (SELECT_ROW_PARTIALS + 1) * SELECT_ROWS as u64 * 4)?,
            select_no_atomics: gpu.buffer("select: no atomics", 16)?,
            zero: gpu.buffer("zero", 16)?,
            unused_out: gpu.buffer("unused output", 16)?,
        };
        // `VERBATIM_ATTENTION_COOP_SHAPE=4x32` (subgroups x dims a round): another shape of
        // attention_coop.wgsl, to compare on a device.
        match std::env::var("VERBATIM_ATTENTION_COOP_SHAPE") {
            Ok(v) if !v.is_empty() => {
                let bad = || Error::Invalid(format!("VERBATIM_ATTENTION_COOP_SHAPE={v}: 2x64, 2x32, 4x32 or 4x64"));
                let (n, o) = v.split_once('x').ok_or_else(bad)?;
                let (n, o) = (n.parse().map_err(|_| bad())?, o.parse().map_err(|_| bad())?);
                kernels.with_attention_coop_shape(gpu, n, o)
            }
            _ => Ok(kernels),
        }
    }

    /// The same kernels without the cooperative-matrix GEMMs (tests compare both paths on a
    /// device that has them; `VERBATIM_NO_COOP=1` does this for a whole run).
    pub fn without_coop(mut self) -> Kernels {
        self.gemm_coop = None;
        self.conv_coop = None;
        self.gemm_planes = None;
        self.gemm_planes_out = None;
        self.gemm_planes_narrow = None;
        self.gemm_planes_out_narrow = None;
        self.gemm_planes_wide = None;
        self.gemm_planes_out_wide = None;
        self.attention_coop = None;
        self
    }

    /// The same kernels with the streaming GEMV built for `slices` K slices (32 or 64)
    /// whatever the device's limits would pick (tests hold both shapes to the CPU).
    pub fn with_stream_slices(mut self, gpu: &Gpu, slices: u32) -> Result<Kernels> {
        let name = match slices {
            32 => "gemv_stream_f16 (32 slices)",
            64 => "gemv_stream_f16 (64 slices)",
            _ => return Err(Error::Invalid(format!("gemv_stream: {slices} K slices (32 or 64)"))),
        };
        self.gemv_stream = gpu.kernel(name, &gemv_stream_source(slices)?, &[Access::Read, Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite])?;
        Ok(self)
    }

    /// The same kernels with attention_coop.wgsl in another shape ([`attention_coop_source`]),
    /// its entry as the run picks it ([`attention_coop_held`]), where the device has it.
    pub fn with_attention_coop_shape(self, gpu: &Gpu, nsg: u32, od: u32) -> Result<Kernels> {
        self.with_attention_coop_kernel(gpu, nsg, od, attention_coop_held())
    }

    /// The same kernels with attention_coop.wgsl in shape `nsg` x `od`, entry `main_held`
    /// (`held`) or `main`, where the device has it (tests hold each to the CPU).
    pub fn with_attention_coop_kernel(mut self, gpu: &Gpu, nsg: u32, od: u32, held: bool) -> Result<Kernels> {
        attention_coop_source(nsg, od)?; // (a shape it cannot build refused on any device)
        if self.attention_coop.is_some() {
            self.attention_coop = Some(attention_coop_kernel(gpu, nsg, od, held)?);
        }
        self.attention_coop_queries = 16 * nsg;
        Ok(self)
    }

    /// The same kernels with every planes GEMM of 32-row tiles over `tile` (the wide tile's
    /// kernels dropped), where the device has them: tests hold each tile to the CPU and to
    /// the other.
    pub fn with_gemm_tile(mut self, gpu: &Gpu, tile: GemmTile) -> Result<Kernels> {
        use Access::{Read as R, ReadWrite as W};
        if self.gemm_planes_narrow.is_some() {
            self.gemm_planes_narrow = Some(gpu.kernel(tile.names().0, &gemm_planes_tile_source(tile)?, &[R, R, R, W])?);
        }
        if self.gemm_planes_out_narrow.is_some() {
            self.gemm_planes_out_narrow = Some(gpu.kernel(tile.names().1, &gemm_planes_out_tile_source(tile)?, &[R, R, R, W, W])?);
        }
        self.tile = tile;
        self.gemm_planes_wide = None;
        self.gemm_planes_out_wide = None;
        Ok(self)
    }

    /// Whether the GEMMs run on cooperative matrices.
    pub fn uses_coop(&self) -> bool {
        self.gemm_coop.is_some()
    }

    /// y[r] (=|+=) act(LayerNorm(x[r]) · Wᵀ + b) for `m` rows of width w.k (contiguous in
    /// `x`): for a few rows the norm is folded into the GEMV (one dispatch); otherwise
    /// `scratch` receives the normed rows first (LayerNorm kernel, then the tiled GEMM).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_ln(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        norm: NormArgs,
        scratch: &Buffer,
        w: &F16Matrix,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
    ) -> Result<()> {
        if m <= GEMV_MAX_ROWS {
            return self.gemv(rec, x, m, Some(norm), w, bias, y, ep, false);
        }
        if x.stride != w.k {
            return Err(Error::Invalid(format!("linear_ln: rows of stride {} for a width of {}", x.stride, w.k)));
        }
        self.layer_norm(rec, x.buf, x.off, m, w.k, norm.gamma, norm.beta, scratch, 0, norm.eps)?;
        self.linear(rec, Rows::new(scratch, w.k as usize), m, w, bias, y, ep)
    }

    /// main_m1 for dispatches whose flags match `v`.
    fn m1_kernel(&self, v: GemvM1Variant) -> &Arc<Kernel> {
        &self.gemv_m1[v as usize]
    }

    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        norm: Option<NormArgs>,
        w: &F16Matrix,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
        per_row: bool,
    ) -> Result<()> {
        let params = GemvParams::new(x, m, w.n, w.k, norm, bias.is_some(), y, ep);
        let mut cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        if norm.is_some() {
            cost.bytes += w.k as u64 * 8;
        }
        let b = bias.unwrap_or(&self.zero);
        let (gamma, beta) = norm.map_or((&self.zero, &self.zero), |n| (n.gamma, n.beta));
        // Per row: the M = 1 kernel with one grid layer per row, each row computed exactly as
        // a lone row (what a verify pass needs); else the shared kernel for several rows.
        let wide = w.bytes() >= self.gemv_wide_min_bytes && w.n.is_multiple_of(8);
        let (kernel, cp, layers) = if m > 1 && !per_row {
            (&self.gemv, GEMV_COLUMN_PAIRS, 1)
        } else if wide {
            (&self.gemv_stream, GEMV_STREAM_COLUMN_PAIRS, m)
        } else if let (true, true, Some(rows)) =
            (per_row, m >= self.gemv_pass_rows_min[norm.is_some() as usize], &self.gemv_pass_rows[norm.is_some() as usize])
        {
            (rows, GEMV_COLUMN_PAIRS, m.div_ceil(GEMV_PASS_ROWS))
        } else if let (Some(_), true, Some(pass_ln)) = (norm, per_row, &self.gemv_m1_ln_pass) {
            (pass_ln, GEMV_COLUMN_PAIRS, m)
        } else {
            let v = if norm.is_some() { GemvM1Variant::LayerNorm } else { GemvM1Variant::Plain };
            (self.m1_kernel(v), GEMV_COLUMN_PAIRS, m)
        };
        if per_row {
            // Later rows (or groups of rows) re-read W, mostly from L2: booked at an eighth
            // of its size.
            cost.bytes += (layers as u64 - 1) * w.bytes() / 8;
        }
        let g = grid_1d((w.n / 2).div_ceil(cp));
        rec.dispatch(kernel, bytemuck::bytes_of(&params), &[x.buf, &w.buf, b, gamma, beta, y.buf], [g[0], g[1], layers], cost)
    }

    /// [`Kernels::linear_ln`] (or [`Kernels::linear`] with `norm` None) for up to
    /// [`VERIFY_MAX_ROWS`] rows, each row's result bit-identical to the same row alone (M = 1):
    /// a speculative verify pass then reproduces single decode steps exactly.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_per_row(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        norm: Option<NormArgs>,
        w: &F16Matrix,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
    ) -> Result<()> {
        if m == 0 || m > VERIFY_MAX_ROWS {
            return Err(Error::Invalid(format!("linear_per_row: {m} rows (1 to {VERIFY_MAX_ROWS})")));
        }
        self.gemv(rec, x, m, norm, w, bias, y, ep, true)
    }

    /// The decoder's feed-forward block over `m` (1 to [`VERIFY_MAX_ROWS`]) rows of the
    /// residual `x`, in place: x[r] += GELU(LayerNorm(x[r]) · W1ᵀ + b1) · W2ᵀ + b2, in two
    /// dispatches (ffn_decode.wgsl), each row bit-identical to the same row alone. `scratch`
    /// holds [`ffn_scratch_words`] floats (the partials). With `final_norm` (the decoder's
    /// last layer; see [`Kernels::final_norm_fused`]) the sum also writes LayerNorm(x[r]) with
    /// its gamma and beta to row r of its buffer, as [`Kernels::layer_norm`] would. `pass`: a
    /// verify pass's rows (one too, so that a dispatch slot keeps one kernel), which take the
    /// pass's chunk kernel ([`ffn_decode_late_source`]'s unless `VERBATIM_FFN_LATE` says
    /// otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn ffn_decode(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        norm: NormArgs,
        w1: &F16Matrix,
        b1: &Buffer,
        w2: &F16Matrix,
        b2: &Buffer,
        scratch: &Buffer,
        final_norm: Option<(NormArgs, &Buffer)>,
        pass: bool,
    ) -> Result<()> {
        let (d, ffn) = (w1.k, w1.n);
        let chunks = ffn.div_ceil(FFN_CHUNK);
        if m == 0 || m > VERIFY_MAX_ROWS {
            return Err(Error::Invalid(format!("ffn_decode: {m} rows (1 to {VERIFY_MAX_ROWS})")));
        }
        if w2.k != ffn || w2.n != d || d % 2 != 0 || ffn % 2 != 0 || d > FFN_MAX_D || x.stride < d {
            return Err(Error::Invalid(format!(
                "ffn_decode: W1 {d} x {ffn}, W2 {} x {}, rows of stride {} (d even and at most {FFN_MAX_D}, ffn even)",
                w2.k, w2.n, x.stride
            )));
        }
        let words = ffn_scratch_words(d, ffn);
        if scratch.size() < words * 4 {
            return Err(Error::Invalid(format!("ffn_decode: scratch of {} bytes for {} words", scratch.size(), words)));
        }
        let fin_eps = final_norm.map_or(0.0, |(n, _)| n.eps);
        let params = FfnParams { d, ffn, chunks, x_off: x.off, x_stride: x.stride, eps: norm.eps, fin_eps, _p1: 0 };
        let (mu, du, fu) = (m as u64, d as u64, ffn as u64);
        let parts = mu * chunks as u64 * du * 4;
        let bufs = [x.buf, &w1.buf, b1, &w2.buf, b2, norm.gamma, norm.beta, scratch];
        // The weights once (later rows from L2), the rows, the partials written.
        let cost = Cost { bytes: w1.bytes() + w2.bytes() + mu * du * 4 + parts, flops: 4 * mu * du * fu };
        let chunk_kernel = match (&self.ffn_decode_pass, pass) {
            (Some(k), true) => k,
            _ => &self.ffn_decode,
        };
        rec.dispatch(chunk_kernel, bytemuck::bytes_of(&params), &bufs, [chunks, 1, m], cost)?;
        let mut cost = Cost { bytes: parts + mu * du * 8, flops: mu * du * chunks as u64 };
        let grid = [d.div_ceil(FFN_SUM_OUTPUTS), 1, m];
        let Some((fin, out)) = final_norm else {
            return rec.dispatch(&self.ffn_sum, bytemuck::bytes_of(&params), &bufs, grid, cost);
        };
        let Some(kernel) = &self.ffn_sum_norm else {
            return Err(Error::Unsupported("ffn_decode: the final LayerNorm in the sum (see final_norm_fused)".into()));
        };
        if out.size() < mu * du * 4 {
            return Err(Error::Invalid(format!("ffn_decode: {} bytes for {m} normalised rows of {d}", out.size())));
        }
        // The row copies, read back, and the normalised rows.
        cost.bytes += mu * du * 12;
        let [xb, w1b, b1b, w2b, b2b, gb, bb, sb] = bufs;
        let bufs = [xb, w1b, b1b, w2b, b2b, gb, bb, sb, &self.ffn_fin, fin.gamma, fin.beta, out];
        rec.dispatch(kernel, bytemuck::bytes_of(&params), &bufs, grid, cost)
    }

    /// Dispatches [`Kernels::select`] records (the last of a recording that ends with it:
    /// a step encoded ahead rewrites their parameters before it is submitted).
    pub fn select_dispatches(&self) -> usize {
        if self.select_fused {
            1
        } else {
            2
        }
    }

    /// Whether [`Kernels::ffn_decode`] takes a final norm (its sum then writes it; a decode
    /// step needs no dispatch for the decoder's final LayerNorm).
    pub fn final_norm_fused(&self) -> bool {
        self.ffn_sum_norm.is_some()
    }

    /// y[r] (=|+=) act(LayerNorm(x[r]) · Wᵀ + b) (`norm` Some) or act(x[r] · Wᵀ + b) for any
    /// number of rows over a row-major matrix (gemv_rows.wgsl: the logits over the
    /// embedding table), each row bit-identical to the same row alone: one grid layer per
    /// row, or (`pass`: a verify pass's logits, one row too, without a LayerNorm) main_rows,
    /// each weight word loaded once for up to 16 rows. A verify pass always takes main_rows
    /// and a decode step `main` (a `DispatchCache` slot keeps only a few bind groups; one
    /// kernel a slot is the simplest way to keep each pass's replay program).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_rows(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        norm: Option<NormArgs>,
        w: &F16Rows,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
        pass: bool,
    ) -> Result<()> {
        if m == 0 || m > 65535 {
            return Err(Error::Invalid(format!("linear_rows: {m} rows")));
        }
        let params = GemvParams::new(x, m, w.n, w.k, norm, bias.is_some(), y, ep);
        let mut cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        cost.bytes += (m as u64 - 1) * w.bytes() / 8 + if norm.is_some() { w.k as u64 * 8 } else { 0 };
        let b = bias.unwrap_or(&self.zero);
        let (gamma, beta) = norm.map_or((&self.zero, &self.zero), |n| (n.gamma, n.beta));
        // main_rows: a workgroup per block of outputs and 16 rows, each weight word loaded
        // once for them (chunk fastest in the grid). main: row fastest in the grid, a block's
        // rows side by side (gemv_rows.wgsl).
        let (g, kernel) = match (&self.gemv_rows_shared, norm) {
            (Some(k), None) if pass => {
                cost.bytes -= (m as u64 - 1) * w.bytes() / 8;
                (grid_1d(w.n.div_ceil(GEMV_ROWS_OUTPUTS) * m.div_ceil(GEMV_ROWS_SHARED_ROWS)), k)
            }
            _ => (grid_1d(w.n.div_ceil(GEMV_ROWS_OUTPUTS) * m), &self.gemv_rows[norm.is_some() as usize]),
        };
        rec.dispatch(kernel, bytemuck::bytes_of(&params), &[x.buf, &w.buf, b, gamma, beta, y.buf], [g[0], g[1], 1], cost)
    }

    /// y[r] (=|+=) act(LayerNorm(x[r]) · deq(W)ᵀ + b) (`norm` Some) or act(x[r] · deq(W)ᵀ + b)
    /// for any number of rows over block-quantized weights: one grid layer per row, each
    /// row bit-identical to the same row alone (decode steps, verify passes and prompts
    /// all take this one kernel).
    #[allow(clippy::too_many_arguments)]
    pub fn linear_q(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        norm: Option<NormArgs>,
        w: &QMatrix,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
    ) -> Result<()> {
        if m == 0 {
            return Err(Error::Invalid("linear_q: no rows".into()));
        }
        let params = GemvParams::new(x, m, w.n, w.k, norm, bias.is_some(), y, ep);
        // Later rows re-read W, mostly from L2: booked at an eighth of its size.
        let mut cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        cost.bytes += (m as u64 - 1) * w.bytes() / 8 + if norm.is_some() { w.k as u64 * 8 } else { 0 };
        let wide = w.bytes() >= GEMV_WIDE_MIN_BYTES;
        let (kernel, cols) = match (w.format, wide) {
            (BlockFormat::Q8_0, false) => (&self.gemv_q8, GEMV_Q_COLUMNS),
            (BlockFormat::Q4_0, false) => (&self.gemv_q4, GEMV_Q_COLUMNS),
            (BlockFormat::Q8_0, true) => (&self.gemv_q8_wide, GEMV_Q_WIDE_COLUMNS),
            (BlockFormat::Q4_0, true) => (&self.gemv_q4_wide, GEMV_Q_WIDE_COLUMNS),
        };
        let b = bias.unwrap_or(&self.zero);
        let (gamma, beta) = norm.map_or((&self.zero, &self.zero), |n| (n.gamma, n.beta));
        let g = grid_1d(w.n.div_ceil(cols));
        rec.dispatch(
            kernel,
            bytemuck::bytes_of(&params),
            &[x.buf, &w.codes, &w.scales, b, gamma, beta, y.buf],
            [g[0], g[1], m],
            cost,
        )
    }

    /// y[r] (=|+=) act(x[r] · Wᵀ + b) for `m` rows: the GEMV kernel for a few rows (decode),
    /// the tiled GEMM otherwise.
    pub fn linear(
        &self,
        rec: &mut Recorder,
        x: Rows,
        m: u32,
        w: &F16Matrix,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
    ) -> Result<()> {
        if m <= GEMV_MAX_ROWS {
            return self.gemv(rec, x, m, None, w, bias, y, ep, false);
        }
        self.gemm_flags(rec, x, m, w, bias, y, ep, 0)
    }

    /// y = X · Wᵀ + b for `m` (many) rows with Y's columns in segments of `seg`, each
    /// segment a [m][seg] matrix after the last in `y` ([n / seg][m][seg]): every decoder
    /// layer's cross K|V from one GEMM, each layer's where its own buffer would have had
    /// them. `x` None: X is in the GEMM planes already ([`Kernels::split_into_planes`]).
    pub fn linear_segments(&self, rec: &mut Recorder, x: Option<Rows>, m: u32, w: &F16Matrix, bias: Option<&Buffer>, y: &Buffer, seg: u32) -> Result<()> {
        if m <= GEMV_MAX_ROWS || seg == 0 || !w.n.is_multiple_of(seg) || m as u64 * w.n as u64 * 4 > y.size() {
            return Err(Error::Invalid(format!("linear_segments: {m} rows of {} columns in segments of {seg}", w.n)));
        }
        let y = Rows { buf: y, off: 0, stride: seg };
        match x {
            Some(x) => self.gemm_flags(rec, x, m, w, bias, y, Epilogue::default(), GEMM_FLAG_SEGMENTS),
            None => self.linear_on_planes_flags(rec, m, w, bias, y, Epilogue::default(), GEMM_FLAG_SEGMENTS),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_flags(&self, rec: &mut Recorder, x: Rows, m: u32, w: &F16Matrix, bias: Option<&Buffer>, y: Rows, ep: Epilogue, extra: u32) -> Result<()> {
        let flags = bias.map_or(0, |_| GEMM_FLAG_BIAS)
            | if ep.gelu { GEMM_FLAG_GELU } else { 0 }
            | if ep.accumulate { GEMM_FLAG_ACCUMULATE } else { 0 }
            | extra;
        let params = GemmParams {
            m,
            n: w.n,
            k: w.k,
            flags,
            x_off: x.off,
            x_stride: x.stride,
            y_off: y.off,
            y_stride: y.stride,
            conv_cs: 0,
            conv_ts: 0,
            conv_stride: 0,
            conv_tin: 0,
        };
        let cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        let b = bias.unwrap_or(&self.zero);
        let groups = [w.n.div_ceil(64), m.div_ceil(64), 1];
        if let Some((_, planes)) = self.planes_for(m, w) {
            self.split_f16_rows(rec, x, m, w.k, planes)?;
            return self.linear_on_planes_flags(rec, m, w, bias, y, ep, extra);
        }
        let kernel = self.gemm_coop.as_ref().unwrap_or(&self.gemm);
        rec.dispatch(kernel, bytemuck::bytes_of(&params), &[x.buf, &w.buf, b, y.buf], groups, cost)
    }

    /// y[r] (=|+=) act(X[r] · Wᵀ + b) for `m` rows of X already in the GEMM planes
    /// ([`Kernels::split_into_planes`], [`Kernels::layer_norm_planes`]): gemm_planes.wgsl,
    /// where [`Kernels::uses_planes`] holds for `m` rows of `w` (an error otherwise).
    pub fn linear_on_planes(&self, rec: &mut Recorder, m: u32, w: &F16Matrix, bias: Option<&Buffer>, y: Rows, ep: Epilogue) -> Result<()> {
        self.linear_on_planes_flags(rec, m, w, bias, y, ep, 0)
    }

    #[allow(clippy::too_many_arguments)]
    fn linear_on_planes_flags(&self, rec: &mut Recorder, m: u32, w: &F16Matrix, bias: Option<&Buffer>, y: Rows, ep: Epilogue, extra: u32) -> Result<()> {
        let (kernel, planes) = match self.planes_for(m, w) {
            Some(kp) if m > GEMV_MAX_ROWS => kp,
            _ => return Err(Error::Invalid(format!("linear_on_planes: {m} rows of {} x {} do not take the planes GEMM", w.k, w.n))),
        };
        let flags = bias.map_or(0, |_| GEMM_FLAG_BIAS)
            | if ep.gelu { GEMM_FLAG_GELU } else { 0 }
            | if ep.accumulate { GEMM_FLAG_ACCUMULATE } else { 0 }
            | extra;
        let cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        let b = bias.unwrap_or(&self.zero);
        let m_pad = m.next_multiple_of(GEMM_PLANES_ROWS);
        let (kernel, groups) = self.planes_tiles(kernel, m, w.n);
        let pp = GemmPlanesParams { m, n: w.n, k: w.k, flags, y_off: y.off, y_stride: y.stride, m_pad, q_scale: 1.0 };
        rec.dispatch(kernel, bytemuck::bytes_of(&pp), &[planes, &w.buf, b, y.buf], groups, cost)
    }

    /// act(X[r] · Wᵀ + b) for `m` rows of X in the GEMM planes, written as f16 planes in turn
    /// (gemm_emit_planes.wgsl): into the second planes buffer, for a
    /// [`Kernels::linear_on_second_planes`] after it.
    pub fn linear_planes_to_planes(&self, rec: &mut Recorder, m: u32, w: &F16Matrix, bias: Option<&Buffer>, gelu: bool) -> Result<()> {
        let out = self.planes_out.as_ref().filter(|_| self.planes_to_planes(m, w));
        let Some(out) = out else {
            return Err(Error::Invalid(format!("linear_planes_to_planes: {m} rows of {} x {} do not fit", w.k, w.n)));
        };
        let flags = bias.map_or(0, |_| GEMM_FLAG_BIAS) | if gelu { GEMM_FLAG_GELU } else { 0 };
        self.gemm_into_planes(rec, m, w, bias, flags, 1.0, out)
    }

    /// Whether [`Kernels::linear_planes_to_planes`] takes `m` rows of `w` (its input and
    /// output both fit the planes).
    pub fn planes_to_planes(&self, m: u32, w: &F16Matrix) -> bool {
        let out_bytes = 2 * m.next_multiple_of(GEMM_PLANES_ROWS) as u64 * w.n as u64 * 2;
        self.uses_planes(m, w) && self.gemm_planes_out.is_some() && self.planes_out.as_ref().is_some_and(|b| b.size() >= out_bytes)
    }

    /// The fused Q|K|V projection of `m` rows of X in the GEMM planes, written as
    /// attention_coop.wgsl's head planes (q scaled by 1/sqrt(64)) for an
    /// [`Kernels::attention_on_head_planes`] after it: the split between goes.
    pub fn linear_planes_to_heads(&self, rec: &mut Recorder, m: u32, heads: u32, w: &F16Matrix, bias: Option<&Buffer>) -> Result<()> {
        if !self.qkv_to_heads(m, heads, w) {
            return Err(Error::Invalid(format!("linear_planes_to_heads: {m} rows, {heads} heads of {} x {}", w.k, w.n)));
        }
        let out = self.head_planes.as_ref().ok_or_else(|| Error::Invalid("no head planes".into()))?;
        let flags = bias.map_or(0, |_| GEMM_FLAG_BIAS) | GEMM_FLAG_HEAD_PLANES;
        // (attention_params' scale, the one split_f16 main_heads applies)
        self.gemm_into_planes(rec, m, w, bias, flags, 1.0 / 64f32.sqrt(), out)
    }

    /// Whether [`Kernels::linear_planes_to_heads`] and [`Kernels::attention_on_head_planes`]
    /// take `m` rows of the encoder's self-attention with `heads` heads of 64 through `w`.
    pub fn qkv_to_heads(&self, m: u32, heads: u32, w: &F16Matrix) -> bool {
        let t_pad = m.next_multiple_of(64) as u64;
        let n_splits = m.div_ceil(self.attention_coop_split_keys) as u64;
        w.n == 3 * heads * 64
            && m > ATTENTION_TILED_MIN_QUERIES
            && self.uses_planes(m, w)
            && self.gemm_planes_out.is_some()
            && self.attention_coop.is_some()
            && self.head_planes.as_ref().is_some_and(|b| b.size() >= 6 * heads as u64 * t_pad * 64 * 2)
            && self.blocked_partials.as_ref().is_some_and(|b| b.size() >= m as u64 * heads as u64 * n_splits * 66 * 4)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemm_into_planes(&self, rec: &mut Recorder, m: u32, w: &F16Matrix, bias: Option<&Buffer>, flags: u32, q_scale: f32, out: &Buffer) -> Result<()> {
        let (Some(kernel), Some(planes)) = (self.gemm_planes_out.as_ref(), self.planes.as_ref()) else {
            return Err(Error::Invalid("GEMM into planes without its kernel".into()));
        };
        let m_pad = m.next_multiple_of(GEMM_PLANES_ROWS);
        let mut cost = Cost::matmul(m, w.n, w.k, w.bytes(), false);
        cost.bytes = cost.bytes - m as u64 * w.n as u64 * 4 + m_pad as u64 * w.n as u64 * 4;
        let b = bias.unwrap_or(&self.zero);
        let pp = GemmPlanesParams { m, n: w.n, k: w.k, flags, y_off: 0, y_stride: 0, m_pad, q_scale };
        let (kernel, groups) = match &self.gemm_planes_out_narrow {
            // (over m_pad: the tiles past the last row write the padding rows' zeros)
            Some(_) if w.n <= self.narrow_max_n && self.takes_wide_tile(w.n) => {
                (self.gemm_planes_out_wide.as_ref().unwrap_or(kernel), [w.n / GemmTile::WIDE.cols, m_pad.div_ceil(GemmTile::WIDE.rows), 1])
            }
            Some(narrow) if w.n <= self.narrow_max_n => (narrow, [w.n.div_ceil(self.tile.cols), m_pad.div_ceil(self.tile.rows), 1]),
            _ => (kernel, [w.n.div_ceil(64), m_pad.div_ceil(64), 1]),
        };
        // (the rows output is not written here; its binding takes a buffer of its own, since
        // `zero` may already be bound read-only as the missing bias)
        rec.dispatch(kernel, bytemuck::bytes_of(&pp), &[planes, &w.buf, b, &self.unused_out, out], groups, cost)
    }

    /// The columns of the planes GEMM's tile for an output of `n` columns (n must be a
    /// multiple).
    fn planes_cols(&self, n: u32) -> u32 {
        if self.gemm_planes_narrow.is_some() && n <= self.narrow_max_n {
            if self.takes_wide_tile(n) {
                GemmTile::WIDE.cols
            } else {
                self.tile.cols
            }
        } else {
            64
        }
    }

    /// Whether a planes GEMM of `n` columns over 32-row tiles takes [`GemmTile::WIDE`]
    /// (both its kernels there, `n` at least `wide_tile_min_n` and a multiple of 128).
    fn takes_wide_tile(&self, n: u32) -> bool {
        self.gemm_planes_wide.is_some()
            && self.gemm_planes_out_wide.is_some()
            && n >= self.wide_tile_min_n
            && n.is_multiple_of(GemmTile::WIDE.cols)
    }

    /// gemm_planes.wgsl's kernel and grid for `m` rows of `n` columns: 32-row tiles where
    /// the columns are few.
    fn planes_tiles<'a>(&'a self, kernel: &'a Arc<Kernel>, m: u32, n: u32) -> (&'a Arc<Kernel>, [u32; 3]) {
        match &self.gemm_planes_narrow {
            Some(_) if n <= self.narrow_max_n && self.takes_wide_tile(n) => {
                (self.gemm_planes_wide.as_ref().unwrap_or(kernel), [n / GemmTile::WIDE.cols, m.div_ceil(GemmTile::WIDE.rows), 1])
            }
            Some(narrow) if n <= self.narrow_max_n => (narrow, [n.div_ceil(self.tile.cols), m.div_ceil(self.tile.rows), 1]),
            _ => (kernel, [n.div_ceil(64), m.div_ceil(64), 1]),
        }
    }

    /// Whether [`Kernels::linear_on_second_planes`] takes `m` rows of `w`.
    pub fn takes_second_planes(&self, m: u32, w: &F16Matrix) -> bool {
        let bytes = 2 * m.next_multiple_of(GEMM_PLANES_ROWS) as u64 * w.k as u64 * 2;
        self.gemm_planes.is_some()
            && m > GEMV_MAX_ROWS
            && w.n.is_multiple_of(self.planes_cols(w.n))
            && w.k.is_multiple_of(GEMM_PLANES_CK)
            && self.planes_out.as_ref().is_some_and(|b| b.size() >= bytes)
    }

    /// [`Kernels::linear_on_planes`] reading the second planes buffer (what
    /// [`Kernels::linear_planes_to_planes`] wrote).
    pub fn linear_on_second_planes(&self, rec: &mut Recorder, m: u32, w: &F16Matrix, bias: Option<&Buffer>, y: Rows, ep: Epilogue) -> Result<()> {
        let (Some(kernel), Some(planes)) = (self.gemm_planes.as_ref(), self.planes_out.as_ref().filter(|_| self.takes_second_planes(m, w))) else {
            return Err(Error::Invalid(format!("linear_on_second_planes: {m} rows of {} x {} do not take the planes GEMM", w.k, w.n)));
        };
        let flags = bias.map_or(0, |_| GEMM_FLAG_BIAS)
            | if ep.gelu { GEMM_FLAG_GELU } else { 0 }
            | if ep.accumulate { GEMM_FLAG_ACCUMULATE } else { 0 };
        let cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        let b = bias.unwrap_or(&self.zero);
        let m_pad = m.next_multiple_of(GEMM_PLANES_ROWS);
        let (kernel, groups) = self.planes_tiles(kernel, m, w.n);
        let pp = GemmPlanesParams { m, n: w.n, k: w.k, flags, y_off: y.off, y_stride: y.stride, m_pad, q_scale: 1.0 };
        rec.dispatch(kernel, bytemuck::bytes_of(&pp), &[planes, &w.buf, b, y.buf], groups, cost)
    }

    /// `rows` rows of X (width `cols`) into the GEMM planes, for the
    /// [`Kernels::linear_on_planes`] after it (several may read one split).
    pub fn split_into_planes(&self, rec: &mut Recorder, x: Rows, rows: u32, cols: u32) -> Result<()> {
        let planes = self.planes.as_ref().ok_or_else(|| Error::Invalid("split_into_planes: no GEMM planes reserved".into()))?;
        self.split_f16_rows(rec, x, rows, cols, planes)
    }

    /// LayerNorm of `rows` rows of width `cols` (contiguous from `x_off`) written straight
    /// into the GEMM planes (split_f16.wgsl main_norm_rows: the values layernorm.wgsl
    /// computes, split), for the [`Kernels::linear_on_planes`] after it.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_planes(
        &self,
        rec: &mut Recorder,
        x: &Buffer,
        x_off: u32,
        rows: u32,
        cols: u32,
        gamma: &Buffer,
        beta: &Buffer,
        eps: f32,
    ) -> Result<()> {
        let planes = self.planes.as_ref().ok_or_else(|| Error::Invalid("layer_norm_planes: no GEMM planes reserved".into()))?;
        self.layer_norm_f16_rows(rec, x, x_off, rows, cols, gamma, beta, eps, planes)
    }

    /// [`Kernels::layer_norm_planes`] writing the normalised rows to `y` as well ([rows][cols]
    /// f32 from offset 0, what [`Kernels::layer_norm`] writes): the encoder's final LayerNorm.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_planes_and_rows(
        &self,
        rec: &mut Recorder,
        x: &Buffer,
        rows: u32,
        cols: u32,
        gamma: &Buffer,
        beta: &Buffer,
        eps: f32,
        y: &Buffer,
    ) -> Result<()> {
        let planes = self.planes.as_ref().ok_or_else(|| Error::Invalid("layer_norm_planes_and_rows: no GEMM planes reserved".into()))?;
        let rows_pad = rows.next_multiple_of(GEMM_PLANES_ROWS);
        let words = rows_pad as u64 * cols as u64 / 2;
        if !cols.is_multiple_of(2) || words * 8 > planes.size() || rows as u64 * cols as u64 * 4 > y.size() {
            return Err(Error::Invalid(format!("layer_norm_planes_and_rows: {rows} x {cols} does not fit the planes or the rows")));
        }
        let sp = SplitParams { rows, cols, rows_pad, heads: 0, x_off: 0, x_stride: cols, scale: 1.0, eps, conv_cs: 0, conv_ts: 0, conv_stride: 0, conv_tin: 0 };
        let g = grid_1d(rows_pad);
        let cost = Cost { bytes: rows as u64 * cols as u64 * 12 + cols as u64 * 8 + words * 8, flops: rows as u64 * cols as u64 * 8 };
        rec.dispatch(&self.norm_planes_rows, bytemuck::bytes_of(&sp), &[x, planes, gamma, beta, y], [g[0], g[1], 1], cost)
    }

    /// LayerNorm of `rows` rows of width `cols` into f16 hi/lo planes in `out`, laid out as
    /// [`Kernels::split_f16_rows`] writes them (padding rows zero; split_f16.wgsl's
    /// main_norm_rows: layernorm.wgsl's arithmetic. A subgroup a row, without barriers, was
    /// no faster on the H200: 9.2 against 8.8 us; in history at ae10417).
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm_f16_rows(
        &self,
        rec: &mut Recorder,
        x: &Buffer,
        x_off: u32,
        rows: u32,
        cols: u32,
        gamma: &Buffer,
        beta: &Buffer,
        eps: f32,
        planes: &Buffer,
    ) -> Result<()> {
        let rows_pad = rows.next_multiple_of(GEMM_PLANES_ROWS);
        let words = rows_pad as u64 * cols as u64 / 2;
        if !cols.is_multiple_of(2) || words * 8 > planes.size() {
            return Err(Error::Invalid(format!("layer_norm_planes: {rows} x {cols} does not fit {} bytes in f16 pairs", planes.size())));
        }
        let sp = SplitParams { rows, cols, rows_pad, heads: 0, x_off, x_stride: cols, scale: 1.0, eps, conv_cs: 0, conv_ts: 0, conv_stride: 0, conv_tin: 0 };
        let g = grid_1d(rows_pad);
        let cost = Cost { bytes: rows as u64 * cols as u64 * 8 + cols as u64 * 8 + words * 8, flops: rows as u64 * cols as u64 * 8 };
        rec.dispatch(&self.norm_planes, bytemuck::bytes_of(&sp), &[x, planes, gamma, beta], [g[0], g[1], 1], cost)
    }

    /// `rows` rows of width `cols` (even) into f16 hi and lo planes in `out`,
    /// [2][rows_pad][cols] with rows_pad the next multiple of 64 and the padding rows zero
    /// (split_f16.wgsl `main_rows`).
    pub fn split_f16_rows(&self, rec: &mut Recorder, x: Rows, rows: u32, cols: u32, out: &Buffer) -> Result<()> {
        let rows_pad = rows.next_multiple_of(GEMM_PLANES_ROWS);
        let words = rows_pad as u64 * cols as u64 / 2;
        if !cols.is_multiple_of(2) || words * 8 > out.size() {
            return Err(Error::Invalid(format!("split_f16: {rows} x {cols} does not fit {} bytes in f16 pairs", out.size())));
        }
        let sp = SplitParams { rows, cols, rows_pad, heads: 0, x_off: x.off, x_stride: x.stride, scale: 1.0, eps: 0.0, conv_cs: 0, conv_ts: 0, conv_stride: 0, conv_tin: 0 };
        let g = grid_1d((words as u32).div_ceil(256));
        let cost = Cost { bytes: rows as u64 * cols as u64 * 4 + words * 8, flops: 0 };
        rec.dispatch(&self.split_planes, bytemuck::bytes_of(&sp), &[x.buf, out], [g[0], g[1], 1], cost)
    }

    /// Make room for the planes of gemm_planes.wgsl: `rows` activation rows of width up to
    /// `k` split into f16 hi and lo (the encoder: audio_ctx x max(d_model, ffn); 2 x 1536 x
    /// 1536 x 2 bytes = 9.4 MB for tiny.en). Nothing where the device has no cooperative
    /// matrices; a buffer already as large is kept. Without it the linear layers stay on
    /// gemm_coop.wgsl.
    pub fn reserve_gemm_planes(&mut self, gpu: &Gpu, rows: u32, k: u32) -> Result<()> {
        if self.gemm_planes.is_none() {
            return Ok(());
        }
        let bytes = 2 * rows.next_multiple_of(GEMM_PLANES_ROWS) as u64 * k as u64 * 2;
        if !self.planes.as_ref().is_some_and(|b| b.size() >= bytes) {
            self.planes = Some(gpu.buffer("gemm planes", bytes)?);
        }
        // (and as much for a GEMM writing planes while these hold its input)
        if self.gemm_planes_out.is_some() && !self.planes_out.as_ref().is_some_and(|b| b.size() >= bytes) {
            self.planes_out = Some(gpu.buffer("gemm planes out", bytes)?);
        }
        Ok(())
    }

    /// Whether [`Kernels::linear`] takes gemm_planes.wgsl for `m` rows of `w`.
    pub fn uses_planes(&self, m: u32, w: &F16Matrix) -> bool {
        m > GEMV_MAX_ROWS && self.planes_for(m, w).is_some()
    }

    /// gemm_planes.wgsl and the planes buffer where they take `m` rows of `w`: n a multiple
    /// of the tile's columns, k of the slice depth (no bounds checks inside), and planes
    /// reserved for that many rows and columns.
    fn planes_for(&self, m: u32, w: &F16Matrix) -> Option<(&Arc<Kernel>, &Buffer)> {
        let (kernel, planes) = (self.gemm_planes.as_ref()?, self.planes.as_ref()?);
        let bytes = 2 * m.next_multiple_of(GEMM_PLANES_ROWS) as u64 * w.k as u64 * 2;
        (w.n.is_multiple_of(self.planes_cols(w.n)) && w.k.is_multiple_of(GEMM_PLANES_CK) && bytes <= planes.size()).then_some((kernel, planes))
    }

    /// Kernel-3, padding-1 convolution as a GEMM over an in-place im2col view:
    /// out[t][co] (=|+=) act(b[co] + Σ_ci Σ_tap W[co][ci][tap] · in(ci, t·stride + tap − 1)),
    /// where in(ci, t) = input[ci·ch_stride + t·time_stride]. `w` is [cout][cin·3].
    #[allow(clippy::too_many_arguments)]
    pub fn conv_k3(
        &self,
        rec: &mut Recorder,
        input: &Buffer,
        t_in: u32,
        ch_stride: u32,
        time_stride: u32,
        stride: u32,
        w: &F16Matrix,
        bias: &Buffer,
        out: &Buffer,
        ep: Epilogue,
    ) -> Result<u32> {
        self.conv_k3_cols(rec, input, t_in, ch_stride, time_stride, stride, w, w.k, bias, out, ep)
    }

    /// The kernels a decode step or verify pass may take (the replay builds raw pipelines of
    /// them: `Gpu::prebuild_replay`); the block-quantized GEMVs with `quant`.
    pub fn decode_kernels(&self, quant: bool) -> Vec<&Arc<Kernel>> {
        let mut ks: Vec<&Arc<Kernel>> = vec![
            &self.embed,
            &self.gemv_stream,
            &self.ffn_decode,
            &self.ffn_sum,
            &self.attention_split,
            &self.attention_merge,
            &self.copy_rows,
        ];
        ks.extend(self.gemv_m1.iter().chain(&self.gemv_rows));
        let optional = [&self.gemv_m1_ln_pass, &self.gemv_rows_shared, &self.ffn_decode_pass, &self.ffn_sum_norm, &self.attention_split_rows];
        ks.extend(optional.into_iter().chain(&self.gemv_pass_rows).flatten());
        if self.select_fused {
            ks.extend([&self.select_pick_fused, &self.select_rows_fused]);
        } else {
            ks.extend([&self.select_partial, &self.select_pick, &self.select_partial_rows, &self.select_rows]);
        }
        if quant {
            ks.extend([&self.gemv_q8, &self.gemv_q4, &self.gemv_q8_wide, &self.gemv_q4_wide]);
        }
        let mut seen = std::collections::HashSet::new();
        ks.retain(|k| seen.insert(k.name));
        ks
    }

    /// The K a convolution of `k` im2col columns should have its weight padded to (zero rows
    /// past `k`) for [`Kernels::conv_k3_cols`] to run it on gemm_planes.wgsl; None where that
    /// GEMM is not there (the weight stays as it is).
    pub fn conv_padded_k(&self, k: u32) -> Option<u32> {
        (self.gemm_planes.is_some() && self.conv_planes.is_some() && self.planes.is_some()).then(|| k.next_multiple_of(GEMM_PLANES_CK))
    }

    /// [`Kernels::conv_k3`] over a weight whose rows past `cols` im2col columns are zero
    /// padding (`w.k` >= `cols`; [`Kernels::conv_padded_k`]). Padded weights take the GEMM
    /// over planes only (an error where it cannot run).
    #[allow(clippy::too_many_arguments)]
    pub fn conv_k3_cols(
        &self,
        rec: &mut Recorder,
        input: &Buffer,
        t_in: u32,
        ch_stride: u32,
        time_stride: u32,
        stride: u32,
        w: &F16Matrix,
        cols: u32,
        bias: &Buffer,
        out: &Buffer,
        ep: Epilogue,
    ) -> Result<u32> {
        let t_out = (t_in + 2 - 3) / stride + 1;
        // Where the GEMM over planes takes the shape (conv2: K = 3 x d_model): the im2col
        // rows split into planes, then gemm_planes.wgsl.
        if let (Some(split), Some((_, planes))) = (self.conv_planes.as_ref(), self.planes_for(t_out, w).filter(|_| t_out > GEMV_MAX_ROWS)) {
            let rows_pad = t_out.next_multiple_of(GEMM_PLANES_ROWS);
            let words = rows_pad as u64 * w.k as u64 / 2;
            let sp = SplitParams {
                rows: t_out,
                cols: w.k,
                rows_pad,
                heads: if cols < w.k { cols } else { 0 },
                x_off: 0,
                x_stride: 0,
                scale: 1.0,
                eps: 0.0,
                conv_cs: ch_stride,
                conv_ts: time_stride,
                conv_stride: stride,
                conv_tin: t_in,
            };
            let g = grid_1d((words as u32).div_ceil(256));
            let cost = Cost { bytes: (cols as u64 / 3) * t_in as u64 * 4 + words * 8, flops: 0 };
            rec.dispatch(split, bytemuck::bytes_of(&sp), &[input, planes], [g[0], g[1], 1], cost)?;
            self.linear_on_planes(rec, t_out, w, Some(bias), Rows::new(out, w.n as usize), ep)?;
            return Ok(t_out);
        }
        if cols != w.k {
            return Err(Error::Invalid(format!("conv_k3: a weight of {} rows padded from {cols} without the GEMM over planes", w.k)));
        }
        let params = GemmParams {
            m: t_out,
            n: w.n,
            k: w.k,
            flags: GEMM_FLAG_BIAS
                | GEMM_FLAG_CONV
                | if ep.gelu { GEMM_FLAG_GELU } else { 0 }
                | if ep.accumulate { GEMM_FLAG_ACCUMULATE } else { 0 },
            x_off: 0,
            x_stride: 0,
            y_off: 0,
            y_stride: w.n,
            conv_cs: ch_stride,
            conv_ts: time_stride,
            conv_stride: stride,
            conv_tin: t_in,
        };
        let (m64, n64, k64) = (t_out as u64, w.n as u64, w.k as u64);
        let cost = Cost { bytes: w.bytes() + (k64 / 3) * t_in as u64 * 4 + m64 * n64 * 4, flops: 2 * m64 * n64 * k64 };
        rec.dispatch(
            self.conv_coop.as_ref().unwrap_or(&self.conv),
            bytemuck::bytes_of(&params),
            &[input, &w.buf, bias, out],
            [w.n.div_ceil(64), t_out.div_ceil(64), 1],
            cost,
        )?;
        Ok(t_out)
    }

    /// LayerNorm of `rows` rows of width `cols` (contiguous), eps as given.
    #[allow(clippy::too_many_arguments)]
    pub fn layer_norm(
        &self,
        rec: &mut Recorder,
        x: &Buffer,
        x_off: u32,
        rows: u32,
        cols: u32,
        gamma: &Buffer,
        beta: &Buffer,
        y: &Buffer,
        y_off: u32,
        eps: f32,
    ) -> Result<()> {
        let params = LayerNormParams { rows, cols, x_off, y_off, eps, _pad: [0; 3] };
        let g = grid_1d(rows);
        let cost = Cost { bytes: rows as u64 * cols as u64 * 8 + cols as u64 * 8, flops: rows as u64 * cols as u64 * 8 };
        rec.dispatch(&self.layernorm, bytemuck::bytes_of(&params), &[x, gamma, beta, y], [g[0], g[1], 1], cost)
    }

    /// Attention for `a`: the register-blocked kernel for many queries of head_dim 64 without
    /// a causal mask where the tiled kernel would be short of workgroups (tiny.en's encoder),
    /// the tiled kernel for other many-query cases, the split
    /// (flash-decoding) kernels for a few, the chunked online-softmax kernel when none fits.
    pub fn attention(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        self.attention_upto(rec, a, ATTENTION_TILED_MIN_QUERIES, false)
    }

    /// [`Kernels::attention`] for the up to [`VERIFY_MAX_ROWS`] query rows of a verify
    /// pass: the split kernel (with its merge) however many, so that each row's output is
    /// bit for bit the one its query alone gets from [`Kernels::attention`] (a decode step).
    pub fn attention_rows(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        if a.tq == 0 || a.tq > VERIFY_MAX_ROWS {
            return Err(Error::Invalid(format!("attention_rows: {} query rows (1 to {VERIFY_MAX_ROWS})", a.tq)));
        }
        self.attention_upto(rec, a, VERIFY_MAX_ROWS, true)
    }

    /// [`Kernels::attention_rows`] where `rows` (a verify pass), else [`Kernels::attention`].
    pub fn attention_for(&self, rec: &mut Recorder, a: &AttentionArgs, rows: bool) -> Result<()> {
        if rows {
            self.attention_rows(rec, a)
        } else {
            self.attention(rec, a)
        }
    }

    /// [`Kernels::attention`] with up to `few` queries taken one workgroup per query (the
    /// split kernel; with `pass`, a verify pass, [`ATTENTION_SPLIT_ROWS`] a workgroup where
    /// `dispatch_split` takes them so), more by the many-query kernels.
    fn attention_upto(&self, rec: &mut Recorder, a: &AttentionArgs, few: u32, pass: bool) -> Result<()> {
        let (mut params, cost) = attention_params(a)?;
        let bufs = [a.q.buf, a.k.buf, a.v.buf, a.out.buf];
        let n_splits = a.tk.div_ceil(ATTENTION_SPLIT_KEYS);
        if a.tq <= few && n_splits == 1 {
            // Keys fit one split (a decode step's self-attention): one dispatch, no merge.
            params.direct = 1;
            return rec.dispatch(&self.attention_split, bytemuck::bytes_of(&params), &bufs, [a.tq, a.heads, 1], cost);
        }
        let p = bytemuck::bytes_of(&params);
        if a.tq > few && self.takes_attention_coop(a) {
            return self.attention_on_coop(rec, a);
        }
        let tiled_groups = a.tq.div_ceil(32) as u64 * a.heads as u64;
        if a.tq > few
            && a.causal.is_none()
            && a.head_dim == 64
            && tiled_groups < ATTENTION_BLOCKED_MAX_TILED_GROUPS
            && !self.force_tiled_attention
        {
            return self.attention_blocked(rec, a);
        }
        if a.tq > few && a.head_dim <= 64 && a.head_dim % 4 == 0 {
            return rec.dispatch(&self.attention_tiled, p, &bufs, [a.tq.div_ceil(32), a.heads, 1], cost);
        }
        let partials = a.tq as u64 * a.heads as u64 * n_splits as u64 * (a.head_dim as u64 + 2);
        if a.tq <= few && partials <= ATTENTION_PARTIALS_FLOATS {
            let split_cost = Cost { bytes: cost.bytes + partials * 4, flops: cost.flops };
            let merge_cost = Cost { bytes: partials * 8, flops: partials * 2 };
            let part = &self.attention_partials;
            self.dispatch_split(rec, a, p, [a.q.buf, a.k.buf, a.v.buf, part], n_splits, split_cost, pass)?;
            return rec.dispatch(&self.attention_merge, p, &[part, a.k.buf, a.v.buf, a.out.buf], [a.tq, a.heads, 1], merge_cost);
        }
        self.attention_chunked(rec, a)
    }

    /// [`Kernels::attention`] (or with `rows`, [`Kernels::attention_rows`]), but where it
    /// would run the split kernel and then the merge, only the split: the partials stay in
    /// the kernels' buffer for [`Kernels::linear_merged`] (the output projection merges
    /// them as it reads its input) and the split count is returned. None: the attention
    /// was recorded whole into `a.out`.
    pub fn attention_unmerged(&self, rec: &mut Recorder, a: &AttentionArgs, rows: bool) -> Result<Option<u32>> {
        let n_splits = a.tk.div_ceil(ATTENTION_SPLIT_KEYS);
        let partials = a.tq as u64 * a.heads as u64 * n_splits as u64 * (a.head_dim as u64 + 2);
        let few = if rows { VERIFY_MAX_ROWS } else { ATTENTION_TILED_MIN_QUERIES.min(GEMV_MAX_ROWS) };
        let fits = a.tq <= few
            && n_splits > 1
            && partials <= ATTENTION_PARTIALS_FLOATS
            && a.heads * n_splits <= GEMV_MERGE_MAX_PARTS
            && a.heads * a.head_dim <= GEMV_MERGE_MAX_K;
        if !fits {
            self.attention_for(rec, a, rows)?;
            return Ok(None);
        }
        let (params, cost) = attention_params(a)?;
        let split_cost = Cost { bytes: cost.bytes + partials * 4, flops: cost.flops };
        let bufs = [a.q.buf, a.k.buf, a.v.buf, &self.attention_partials];
        self.dispatch_split(rec, a, bytemuck::bytes_of(&params), bufs, n_splits, split_cost, rows)?;
        Ok(Some(n_splits))
    }

    /// The split attention's partials for `a` in `n_splits` splits: main_split_rows where
    /// `pass` (a verify pass, one row too, so that its dispatch slot keeps one kernel) and the
    /// shape is the one it serves (head_dim 64, no mask, the split keys it was written for),
    /// else main_split a query a workgroup. Either way each row's partial has the bits its
    /// query gets alone.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_split(&self, rec: &mut Recorder, a: &AttentionArgs, params: &[u8], bufs: [&Buffer; 4], n_splits: u32, cost: Cost, pass: bool) -> Result<()> {
        let hd = a.heads as u64 * a.head_dim as u64;
        match &self.attention_split_rows {
            Some(k) if pass && a.head_dim == 64 && a.causal.is_none() => {
                let groups = a.tq.div_ceil(ATTENTION_SPLIT_ROWS);
                // Keys and values once a group of four rows rather than once a row.
                let kv = a.tk as u64 * 2 * hd * 4;
                let cost = Cost { bytes: cost.bytes - a.tq as u64 * kv + groups as u64 * kv, flops: cost.flops };
                rec.dispatch(k, params, &bufs, [groups, a.heads, n_splits], cost)
            }
            _ => rec.dispatch(&self.attention_split, params, &bufs, [a.tq, a.heads, n_splits], cost),
        }
    }

    /// y[r] (=|+=) act(attn[r] · Wᵀ + b) for the `m` query rows whose attention
    /// [`Kernels::attention_unmerged`] left as `n_splits` partials of `heads` heads of
    /// `head_dim`: the M = 1 GEMV per row (bit-identical to a lone row), merging each row
    /// into workgroup memory first.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_merged(
        &self,
        rec: &mut Recorder,
        m: u32,
        heads: u32,
        head_dim: u32,
        n_splits: u32,
        w: &F16Matrix,
        bias: Option<&Buffer>,
        y: Rows,
        ep: Epilogue,
    ) -> Result<()> {
        if m == 0 || m > VERIFY_MAX_ROWS || heads * head_dim != w.k || heads * n_splits > GEMV_MERGE_MAX_PARTS || w.k > GEMV_MERGE_MAX_K {
            return Err(Error::Invalid(format!(
                "linear_merged: {m} rows of {heads} heads x {head_dim} in {n_splits} splits for a width of {}",
                w.k
            )));
        }
        let part = Rows::new(&self.attention_partials, 0);
        let mut params = GemvParams::new(part, m, w.n, w.k, None, bias.is_some(), y, ep);
        params.flags |= GEMV_FLAG_MERGE;
        params.merge_splits = n_splits;
        params.merge_hd = head_dim;
        let mut cost = Cost::matmul(m, w.n, w.k, w.bytes(), ep.accumulate);
        cost.bytes += m as u64 * heads as u64 * n_splits as u64 * (head_dim as u64 + 2) * 4;
        let b = bias.unwrap_or(&self.zero);
        // `main_m1` at any size: the merge (flag 32) is its own, and the projection it feeds
        // is d_model x d_model (3.3 MB for large-v3), below the streaming GEMV's sizes.
        let g = grid_1d((w.n / 2).div_ceil(GEMV_COLUMN_PAIRS));
        rec.dispatch(
            self.m1_kernel(GemvM1Variant::Merge),
            bytemuck::bytes_of(&params),
            &[part.buf, &w.buf, b, &self.zero, &self.zero, y.buf],
            [g[0], g[1], m],
            cost,
        )
    }

    /// Make room for the blocked attention's partials of `queries` queries of `heads` heads
    /// in [`ATTENTION_BLOCKED_SPLITS`] splits (the encoder: audio_ctx x n_heads; 1500 x 6 x
    /// 4 x 66 floats = 9.5 MB for tiny.en, 31.7 MB for large-v3's 20 heads). Sized by the
    /// model that loads the kernels rather than for the largest Whisper, so a small model on
    /// a small GPU does not hold the large one's buffer. A buffer already as large is kept.
    /// Nothing where the launcher would run the tiled kernel for that shape anyway. Where
    /// the device has cooperative matrices the encoder's attention runs on attention_coop.wgsl
    /// instead, which writes the same partials (in splits of [`ATTENTION_COOP_SPLIT_KEYS`])
    /// and needs its head planes: both are made then, for any shape.
    pub fn reserve_blocked_attention(&mut self, gpu: &Gpu, queries: u32, heads: u32) -> Result<()> {
        let coop = self.attention_coop.is_some();
        if coop {
            let bytes = 6 * heads as u64 * queries.next_multiple_of(64) as u64 * 64 * 2;
            if !self.head_planes.as_ref().is_some_and(|b| b.size() >= bytes) {
                self.head_planes = Some(gpu.buffer("attention head planes", bytes)?);
            }
        }
        if !coop && queries.div_ceil(32) as u64 * heads as u64 >= ATTENTION_BLOCKED_MAX_TILED_GROUPS {
            return Ok(());
        }
        let splits = ATTENTION_BLOCKED_SPLITS.max(if coop { queries.div_ceil(self.attention_coop_split_keys) } else { 0 });
        let floats = queries as u64 * heads as u64 * splits as u64 * 66;
        if self.blocked_partials.as_ref().is_some_and(|b| b.size() >= floats * 4) {
            return Ok(());
        }
        self.blocked_partials = Some(gpu.buffer("blocked attention partials", floats * 4)?);
        Ok(())
    }

    /// Whether [`Kernels::attention`] takes attention_coop.wgsl for `a`: many queries of
    /// head_dim 64, no mask, the queries' own keys (tq = tk), Q, K and V side by side in one
    /// fused buffer (the encoder's Q|K|V), and its planes and partials reserved.
    fn takes_attention_coop(&self, a: &AttentionArgs) -> bool {
        let hd = a.heads * a.head_dim;
        let t_pad = a.tq.next_multiple_of(64) as u64;
        let n_splits = a.tk.div_ceil(self.attention_coop_split_keys) as u64;
        self.attention_coop.is_some()
            && a.tq > ATTENTION_TILED_MIN_QUERIES
            && a.causal.is_none()
            && a.head_dim == 64
            && a.tq == a.tk
            && std::ptr::eq(a.q.buf, a.k.buf)
            && std::ptr::eq(a.q.buf, a.v.buf)
            && a.q.stride == a.k.stride
            && a.q.stride == a.v.stride
            && a.k.off == a.q.off + hd
            && a.v.off == a.q.off + 2 * hd
            && self.head_planes.as_ref().is_some_and(|b| b.size() >= 6 * a.heads as u64 * t_pad * 64 * 2)
            && self.blocked_partials.as_ref().is_some_and(|b| b.size() >= a.tq as u64 * a.heads as u64 * n_splits * 66 * 4)
    }

    /// The fused Q|K|V into head planes (split_f16.wgsl main_heads, q scaled), the key
    /// splits on cooperative matrices (attention_coop.wgsl), then attention.wgsl's merge.
    fn attention_on_coop(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        let Some(planes) = &self.head_planes else {
            return Err(Error::Invalid("attention on cooperative matrices without its head planes".into()));
        };
        let (params, _) = attention_params(a)?;
        let t_pad = a.tq.next_multiple_of(64);
        let sp = SplitParams {
            rows: a.tq,
            cols: 0,
            rows_pad: t_pad,
            heads: a.heads,
            x_off: a.q.off,
            x_stride: a.q.stride,
            scale: params.scale,
            eps: 0.0,
            conv_cs: 0,
            conv_ts: 0,
            conv_stride: 0,
            conv_tin: 0,
        };
        let words = 3 * a.heads as u64 * t_pad as u64 * 32;
        let g = grid_1d(words.div_ceil(256) as u32);
        let split_cost = Cost { bytes: a.tq as u64 * a.heads as u64 * 64 * 3 * 4 + words * 8, flops: 0 };
        rec.dispatch(&self.split_heads, bytemuck::bytes_of(&sp), &[a.q.buf, planes], [g[0], g[1], 1], split_cost)?;
        self.attention_on_head_planes(rec, a)
    }

    /// attention_coop.wgsl and the merge over head planes already written (by the split in
    /// [`Kernels::attention`], or by [`Kernels::linear_planes_to_heads`]); `a` gives the
    /// shape and the output (its q, k and v are not read).
    pub fn attention_on_head_planes(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        self.attention_coop_merged(rec, a, false)
    }

    /// [`Kernels::attention_on_head_planes`] merging its splits into the GEMM planes
    /// ([tq][heads 64] split into f16 hi/lo, as [`Kernels::split_into_planes`] of the
    /// output rows would: `a.out` is not written) for the [`Kernels::linear_on_planes`] of
    /// the out projection after it.
    pub fn attention_into_planes(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        self.attention_coop_merged(rec, a, true)
    }

    /// Whether [`Kernels::attention_into_planes`] can write `tq` rows of `heads` heads
    /// into the planes for `w` (the out projection) to read.
    pub fn attention_to_planes(&self, tq: u32, heads: u32, w: &F16Matrix) -> bool {
        w.k == heads * 64 && self.uses_planes(tq, w)
    }

    fn attention_coop_merged(&self, rec: &mut Recorder, a: &AttentionArgs, into_planes: bool) -> Result<()> {
        let (Some(kernel), Some(planes), Some(part)) = (&self.attention_coop, &self.head_planes, &self.blocked_partials) else {
            return Err(Error::Invalid("attention on cooperative matrices without its kernel or buffers".into()));
        };
        let (mut params, cost) = attention_params(a)?;
        let t_pad = a.tq.next_multiple_of(64);
        let words = 3 * a.heads as u64 * t_pad as u64 * 32;
        let n_splits = a.tk.div_ceil(self.attention_coop_split_keys);
        let cp = AttentionCoopParams {
            tq: a.tq,
            tk: a.tk,
            heads: a.heads,
            t_pad,
            split_keys: self.attention_coop_split_keys,
            n_splits,
            _pad: [0; 2],
        };
        let partials = a.tq as u64 * a.heads as u64 * n_splits as u64 * 66;
        let attn_cost = Cost { bytes: words * 8 + partials * 4, flops: cost.flops };
        rec.dispatch(kernel, bytemuck::bytes_of(&cp), &[planes, part], [t_pad / self.attention_coop_queries, a.heads * n_splits, 1], attn_cost)?;
        if into_planes {
            return self.merge_partials_into_planes(rec, a, self.attention_coop_split_keys);
        }
        params.split_keys = self.attention_coop_split_keys;
        let merge_cost = Cost { bytes: partials * 4 + a.tq as u64 * a.heads as u64 * 64 * 4, flops: partials * 2 };
        rec.dispatch(&self.attention_merge, bytemuck::bytes_of(&params), &[part, a.k.buf, a.v.buf, a.out.buf], [a.tq, a.heads, 1], merge_cost)
    }

    /// attention.wgsl's main_merge_planes: the key splits' partials in the reserved buffer
    /// (`split_keys` keys a split, as the attention that wrote them) merged into the GEMM
    /// planes, [tq][heads 64] as f16 hi/lo with the padding rows zero.
    pub(crate) fn merge_partials_into_planes(&self, rec: &mut Recorder, a: &AttentionArgs, split_keys: u32) -> Result<()> {
        let (Some(part), Some(gp)) = (&self.blocked_partials, &self.planes) else {
            return Err(Error::Invalid("attention into planes: no partials or GEMM planes reserved".into()));
        };
        let (mut params, _) = attention_params(a)?;
        let rows_pad = a.tq.next_multiple_of(GEMM_PLANES_ROWS);
        let n_splits = a.tk.div_ceil(split_keys.max(1)) as u64;
        let partials = a.tq as u64 * a.heads as u64 * n_splits * (a.head_dim as u64 + 2);
        if a.head_dim != 64 || 2 * rows_pad as u64 * a.heads as u64 * 64 * 2 > gp.size() || partials * 4 > part.size() {
            return Err(Error::Invalid(format!("attention into planes: {} rows of {} heads of {} do not fit", a.tq, a.heads, a.head_dim)));
        }
        params.split_keys = split_keys;
        params.rows_pad = rows_pad;
        let cost = Cost { bytes: partials * 4 + rows_pad as u64 * a.heads as u64 * 64 * 4, flops: partials * 2 };
        // (`o` is not written by this entry: the zero buffer fills its binding)
        // (16 (row, head) pairs a workgroup)
        rec.dispatch(&self.attention_merge_planes, bytemuck::bytes_of(&params), &[part, part, part, &self.zero, gp], [(rows_pad * a.heads).div_ceil(16), 1, 1], cost)
    }

    /// The register-blocked kernel (attention_blocked.wgsl) whatever the query count and
    /// `VERBATIM_ATTENTION_TILED`, in [`ATTENTION_BLOCKED_SPLITS`] key splits (fewer where
    /// the partials would not fit): head_dim 64 and no causal mask only.
    pub(crate) fn attention_blocked(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        self.attention_blocked_keys(rec, a, attention_blocked_split_keys(a.tk, ATTENTION_BLOCKED_SPLITS))
    }

    /// [`Kernels::attention_blocked`] with `split_keys` keys per split (any count; the
    /// launcher's are whole 32-key blocks): one split writes the output itself, more write
    /// their partials to the reserved buffer and `main_merge` merges them. Where they do
    /// not fit (or the merge's grid would not, tq > 65535), as many splits as fit.
    pub(crate) fn attention_blocked_keys(&self, rec: &mut Recorder, a: &AttentionArgs, split_keys: u32) -> Result<()> {
        if a.head_dim != 64 || a.causal.is_some() || a.tk == 0 {
            return Err(Error::Unsupported(format!(
                "blocked attention: head_dim {} causal {:?} over {} keys (head_dim 64 without a causal mask only)",
                a.head_dim, a.causal, a.tk
            )));
        }
        let (mut params, cost) = attention_params(a)?;
        let per_split = a.tq as u64 * a.heads as u64 * (a.head_dim as u64 + 2);
        let room = match &self.blocked_partials {
            Some(b) if a.tq <= 65535 => b.size() / 4 / per_split.max(1),
            _ => 0,
        };
        let mut sk = split_keys.max(1);
        if (a.tk.div_ceil(sk) as u64) > room {
            // As many splits as the partials hold (one: no partials, no merge).
            sk = if room >= 2 { attention_blocked_split_keys(a.tk, room.min(u32::MAX as u64) as u32) } else { a.tk };
        }
        let n_splits = a.tk.div_ceil(sk);
        params.split_keys = sk;
        let p = bytemuck::bytes_of(&params);
        let x = a.tq.div_ceil(ATTENTION_BLOCKED_QUERIES);
        if n_splits == 1 {
            return rec.dispatch(&self.attention_blocked, p, &[a.q.buf, a.k.buf, a.v.buf, a.out.buf], [x, a.heads, 1], cost);
        }
        let Some(part) = &self.blocked_partials else {
            return Err(Error::Invalid("blocked attention: key splits without a partials buffer".into()));
        };
        let partials = per_split * n_splits as u64;
        let split_cost = Cost { bytes: cost.bytes + partials * 4, flops: cost.flops };
        let merge_cost = Cost { bytes: partials * 4 + a.tq as u64 * a.heads as u64 * a.head_dim as u64 * 4, flops: partials * 2 };
        rec.dispatch(&self.attention_blocked, p, &[a.q.buf, a.k.buf, a.v.buf, part], [x, a.heads * n_splits, 1], split_cost)?;
        rec.dispatch(&self.attention_merge, p, &[part, a.k.buf, a.v.buf, a.out.buf], [a.tq, a.heads, 1], merge_cost)
    }

    /// The general fallback: one workgroup per (query, head), keys in chunks of 64 with an
    /// online softmax (any key count, head_dim <= 128).
    pub(crate) fn attention_chunked(&self, rec: &mut Recorder, a: &AttentionArgs) -> Result<()> {
        let (params, cost) = attention_params(a)?;
        let (x, z) = if a.tq <= 32768 { (a.tq, 1) } else { (32768, a.tq.div_ceil(32768)) };
        rec.dispatch(&self.attention, bytemuck::bytes_of(&params), &[a.q.buf, a.k.buf, a.v.buf, a.out.buf], [x, a.heads, z], cost)
    }

    /// x[i] = emb[tokens[tok_off + i]] + pos[pos0 + i] for i < n_tok (d channels).
    ///
    /// At the head of a gated decode step (`gate`: the step's grid table, the word range of
    /// its other dispatches' grids, the word in `tokens` of the done flag): when an earlier
    /// step's `select_pick` has set the flag (it picked eot), the embedding zeroes those
    /// grids instead, so the rest of the step runs empty (`Recorder::gate`: ~1.9 us a
    /// dependent empty dispatch on the H200 against ~4.5 for the smallest real one).
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &self,
        rec: &mut Recorder,
        tokens: &Buffer,
        tok_off: u32,
        n_tok: u32,
        emb: &F16Rows,
        pos: &Buffer,
        pos0: u32,
        x: &Buffer,
        gate: Option<(&Buffer, std::ops::Range<u32>, u32)>,
    ) -> Result<()> {
        let d = emb.k;
        let (grids, range, done_off) = gate.unwrap_or((&self.no_grids, 0..0, 0));
        let params = EmbedParams { n_tok, d, pos0, vocab: emb.n, tok_off, done_off, grid_lo: range.start, grid_hi: range.end };
        let cost = Cost { bytes: n_tok as u64 * d as u64 * (2 + 4 + 4), flops: n_tok as u64 * d as u64 };
        rec.dispatch(&self.embed, bytemuck::bytes_of(&params), &[tokens, &emb.buf, pos, x, grids], [(d / 2).div_ceil(64), n_tok, 1], cost)
    }

    /// dst rows (dst_off + i·dst_stride) ← src rows (src_off + i·src_stride), `width` floats each.
    pub fn copy_rows(&self, rec: &mut Recorder, src: Rows, dst: Rows, rows: u32, width: u32) -> Result<()> {
        let params = CopyRowsParams {
            rows,
            width,
            src_off: src.off,
            src_stride: src.stride,
            dst_off: dst.off,
            dst_stride: dst.stride,
            _pad: [0; 2],
        };
        let cost = Cost { bytes: rows as u64 * width as u64 * 8, flops: 0 };
        rec.dispatch(&self.copy_rows, bytemuck::bytes_of(&params), &[src.buf, dst.buf], [width.div_ceil(64), rows, 1], cost)
    }

    /// The masked reductions of one row of logits (see select.wgsl); 8 words into `out`. One
    /// dispatch, or two without `select_fused` ([`Kernels::select_dispatches`]).
    pub(crate) fn select(&self, rec: &mut Recorder, logits: &Buffer, suppress: &Buffer, params: &SelectParams, out: &Buffer) -> Result<()> {
        let cost = Cost { bytes: params.vocab as u64 * 4 + params.vocab as u64 / 8, flops: params.vocab as u64 * 4 };
        let block = select_block(std::slice::from_ref(params))?;
        let p = bytemuck::bytes_of(&block);
        let merge = Cost { bytes: SELECT_GROUPS * 9 * 4 + 32, flops: SELECT_GROUPS * 9 };
        let none = &self.select_no_atomics;
        // (no timestamp state: `zero` is bound where main_partial would read it)
        if self.select_fused {
            let both = Cost { bytes: cost.bytes + merge.bytes, flops: cost.flops + merge.flops };
            let bufs = [logits, suppress, out, &self.zero, &self.select_partials];
            return rec.dispatch(&self.select_rows_fused, p, &bufs, [SELECT_GROUPS as u32, 1, 1], both);
        }
        rec.dispatch(&self.select_partial, p, &[logits, suppress, &self.select_partials, &self.zero, none], [SELECT_GROUPS as u32, 1, 1], cost)?;
        rec.dispatch(&self.select, p, &[&self.select_partials, suppress, out, &self.zero, none], [1, 1, 1], merge)
    }

    /// [`Kernels::select`], and its choice written as a token id into `ids[params.tok_out]`:
    /// the host's greedy pick (with the "timestamps beat text" check where flag 4 or the
    /// timestamp state says; eot when nothing is allowed). The next decode step's
    /// embedding reads it there: several steps go without a round trip. With flags 8/16
    /// the masks come from, and the choice goes into, the timestamp state in `ids` (see
    /// select.wgsl).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn select_pick(
        &self,
        rec: &mut Recorder,
        logits: &Buffer,
        suppress: &Buffer,
        params: &SelectParams,
        out: &Buffer,
        ids: &Buffer,
    ) -> Result<()> {
        let cost = Cost { bytes: params.vocab as u64 * 4 + params.vocab as u64 / 8, flops: params.vocab as u64 * 4 };
        let block = select_block(std::slice::from_ref(params))?;
        let p = bytemuck::bytes_of(&block);
        let merge = Cost { bytes: SELECT_GROUPS * 9 * 4 + 36, flops: SELECT_GROUPS * 9 };
        if self.select_fused {
            let both = Cost { bytes: cost.bytes + merge.bytes, flops: cost.flops + merge.flops };
            let bufs = [logits, suppress, out, ids, &self.select_partials];
            return rec.dispatch(&self.select_pick_fused, p, &bufs, [SELECT_GROUPS as u32, 1, 1], both);
        }
        let none = &self.select_no_atomics;
        rec.dispatch(&self.select_partial, p, &[logits, suppress, &self.select_partials, ids, none], [SELECT_GROUPS as u32, 1, 1], cost)?;
        rec.dispatch(&self.select_pick, p, &[&self.select_partials, suppress, out, ids, none], [1, 1, 1], merge)
    }

    /// [`Kernels::select`] of up to [`SELECT_ROWS`] rows in one dispatch (one pair unfused), row `i`
    /// under `params[i]` (its own logit_off, out_off and masks): a verify pass's
    /// selections, each row's scores bit for bit what `select` gives it alone.
    pub(crate) fn select_rows(&self, rec: &mut Recorder, logits: &Buffer, suppress: &Buffer, params: &[SelectParams], out: &Buffer) -> Result<()> {
        let block = select_block(params)?;
        if params.iter().any(|p| p.flags & (SELECT_FLAG_RULES_FROM_STATE | SELECT_FLAG_TRACK_STATE) != 0) {
            return Err(Error::Invalid("select_rows: the timestamp state is for single-row picks".into()));
        }
        let rows = params.len() as u64;
        let vocab: u64 = params.iter().map(|p| p.vocab as u64).sum();
        let cost = Cost { bytes: vocab * 4 + vocab / 8, flops: vocab * 4 };
        let p = bytemuck::bytes_of(&block);
        // (no timestamp state: `zero` is bound where main_partial_rows would read it)
        let merge = Cost { bytes: rows * (SELECT_GROUPS * 9 * 4 + 32), flops: rows * SELECT_GROUPS * 9 };
        if self.select_fused {
            let both = Cost { bytes: cost.bytes + merge.bytes, flops: cost.flops + merge.flops };
            let bufs = [logits, suppress, out, &self.zero, &self.select_partials];
            return rec.dispatch(&self.select_rows_fused, p, &bufs, [SELECT_GROUPS as u32, rows as u32, 1], both);
        }
        let none = &self.select_no_atomics;
        let bufs = [logits, suppress, &self.select_partials, &self.zero, none];
        rec.dispatch(&self.select_partial_rows, p, &bufs, [SELECT_GROUPS as u32, rows as u32, 1], cost)?;
        rec.dispatch(&self.select_rows, p, &[&self.select_partials, suppress, out, &self.zero, none], [rows as u32, 1, 1], merge)
    }
}

/// The selection kernels' parameter block: `params` first, the rest of the
/// [`SELECT_ROWS`] sets zero.
fn select_block(params: &[SelectParams]) -> Result<[SelectParams; SELECT_ROWS]> {
    if params.is_empty() || params.len() > SELECT_ROWS {
        return Err(Error::Invalid(format!("a selection of {} rows (1 to {SELECT_ROWS})", params.len())));
    }
    let mut block = [SelectParams::zeroed(); SELECT_ROWS];
    block[..params.len()].copy_from_slice(params);
    Ok(block)
}

fn attention_params(a: &AttentionArgs) -> Result<(AttentionParams, Cost)> {
    if a.head_dim > 128 {
        return Err(Error::Unsupported(format!("attention head size {} (at most 128)", a.head_dim)));
    }
    let params = AttentionParams {
        tq: a.tq,
        tk: a.tk,
        heads: a.heads,
        d: a.head_dim,
        q_off: a.q.off,
        q_stride: a.q.stride,
        k_off: a.k.off,
        k_stride: a.k.stride,
        v_off: a.v.off,
        v_stride: a.v.stride,
        o_off: a.out.off,
        o_stride: a.out.stride,
        causal: a.causal.is_some() as u32,
        causal_offset: a.causal.unwrap_or(0),
        scale: 1.0 / (a.head_dim as f32).sqrt(),
        split_keys: ATTENTION_SPLIT_KEYS,
        direct: 0,
        rows_pad: 0,
        _pad: [0; 2],
    };
    let hd = a.heads as u64 * a.head_dim as u64;
    let cost = Cost {
        // Each (query, head) streams its keys and values once.
        bytes: a.tq as u64 * (a.tk as u64 * 2 + 2) * hd * 4,
        flops: 4 * a.tq as u64 * a.tk as u64 * hd,
    };
    Ok((params, cost))
}

/// The suppress bitmask the select kernel reads: bit id of word id/32.
pub fn suppress_bitmask(ids: &[u32], vocab: u32) -> Vec<u32> {
    let mut words = vec![0u32; (vocab as usize).div_ceil(32).max(1)];
    for &id in ids {
        if id < vocab {
            words[id as usize / 32] |= 1 << (id % 32);
        }
    }
    words
}

/// Pack the host side of the select kernel's parameters.
pub(crate) fn select_params(
    rules: &crate::decode::StepRules,
    vocab: u32,
    ts_begin: u32,
    eot: u32,
    logit_off: u32,
) -> SelectParams {
    SelectParams {
        vocab,
        ts_begin,
        eot,
        flags: rules.mask_text as u32 | (rules.mask_non_timestamps as u32) << 1,
        ts_lo: rules.ts_lo.max(ts_begin),
        ts_hi: rules.ts_hi.min(vocab),
        extra0: rules.extra_suppress[0],
        extra1: rules.extra_suppress[1],
        probe: rules.probe,
        logit_off,
        out_off: 0,
        tok_out: 0,
        state_off: 0,
        rules_off: 0,
        done_off: 0,
        _pad: 0,
    }
}

/// Decode the select kernel's 8 output words.
pub fn scores_from_words(w: &[u32]) -> crate::decode::StepScores {
    crate::decode::StepScores {
        text_best: w[0],
        text_max: f32::from_bits(w[1]),
        text_lse: f32::from_bits(w[2]),
        ts_best: w[3],
        ts_max: f32::from_bits(w[4]),
        ts_lse: f32::from_bits(w[5]),
        raw_lse: f32::from_bits(w[6]),
        probe_logit: f32::from_bits(w[7]),
    }
}
