//! The kernels of the Nemotron-H frame (Mamba-2 mixers, GQA attention, relu² MoE) for a
//! pass of up to [`PASS_MAX`] positions, f32 activations, f32 weights, and the routed
//! experts optionally in quantized banks (`q4tp`, `q8_2f`: `moe_quant.wgsl`, held to
//! dequantize-then-f32-GEMM by `moe_quant_tests.rs`).
//! Each launcher is held to its CPU reference in `crate::reference::nemotron_h` by
//! `tests.rs` (random inputs of awkward sizes, outputs poisoned with NaN first), and a
//! test-only sketch there wires them into the whole fixture model (prefill in passes of
//! 64, a verify pass with snapshots, rollback) and holds it to the reference and to
//! transformers.
//!
//! | file | launchers |
//! |------|-----------|
//! | `rmsnorm.wgsl` | [`add_rmsnorm`](NemotronKernels::add_rmsnorm), [`add_moe_rmsnorm`](NemotronKernels::add_moe_rmsnorm) |
//! | `mamba.wgsl` | [`mamba_conv`](NemotronKernels::mamba_conv), [`mamba_scan`](NemotronKernels::mamba_scan), [`gated_norm`](NemotronKernels::gated_norm) |
//! | `linear.wgsl` | [`linear`](NemotronKernels::linear), [`expert_linear`](NemotronKernels::expert_linear) |
//! | `moe.wgsl` | [`route`](NemotronKernels::route), [`expert_lists`](NemotronKernels::expert_lists), [`moe_combine`](NemotronKernels::moe_combine), [`relu2`](NemotronKernels::relu2) |
//! | `moe_quant.wgsl` | [`expert_linear_quant`](NemotronKernels::expert_linear_quant) over a [`QuantBank`] (q4tp / q8_2f, residency map) |
//! | `gqa.wgsl` | [`gqa`](NemotronKernels::gqa), [`gqa_split`](NemotronKernels::gqa_split) |
//! | `embed.wgsl`, `argmax.wgsl` | [`embed`](NemotronKernels::embed), [`argmax`](NemotronKernels::argmax) |
//!
//! Layouts are the reference's, so states and snapshots compare directly:
//! - activations `[position][width]`; the Mamba in_proj output is `[position][z | xBC | dt]`;
//! - conv ring `[3][conv_dim]` (oldest first), SSM state `[head][state][head_dim]`;
//! - snapshots: slot b holds the state after position b of the pass (rollback(j) copies
//!   slot j back; attention rolls back by its KV length alone);
//! - KV cache `[position][kv_head][head_dim]` (the K/V projections write straight into it);
//! - f32 weights row-major `[out][in]` (as PyTorch's Linear); expert banks `[E][out][in]`;
//!   quantized expert banks: the resident experts' matrices back to back in the layouts of
//!   `crate::quant`, with a map expert → slot or [`MISS`] (the residency map).
//!
//! No kernel assumes a subgroup size: reductions go through workgroup memory. Every loop
//! runs at most a few thousand times per invocation (lavapipe stops loops at 65535).

mod moe_quant;
#[cfg(test)]
mod tests;

pub use moe_quant::{host_expert, QuantBank, MISS};

use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use wgpu::Buffer;

use crate::gpu::{Access, Cost, Gpu, Kernel, Recorder};
use crate::{Error, Result};

/// Positions per pass.
pub const PASS_MAX: u32 = 64;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RmsParams {
    rows: u32,
    cols: u32,
    add: u32,
    k: u32,
    eps: f32,
    _p1: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ConvParams {
    n: u32,
    cdim: u32,
    in_off: u32,
    in_stride: u32,
    bias: u32,
    snap: u32,
    _p: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct ScanParams {
    n: u32,
    nh: u32,
    hdim: u32,
    ns: u32,
    ng: u32,
    hpg: u32,
    inner: u32,
    cdim: u32,
    dt_off: u32,
    in_stride: u32,
    snap: u32,
    _p0: u32,
    dt_lo: f32,
    dt_hi: f32,
    _p1: [u32; 2],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct NormParams {
    n: u32,
    inner: u32,
    gs: u32,
    z_off: u32,
    z_stride: u32,
    _p0: [u32; 3],
    eps: f32,
    _p1: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct LinearParams {
    m: u32,
    n: u32,
    k: u32,
    flags: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    cap: u32,
    xdiv: u32,
    w_stride: u32,
    _p0: u32,
}

const LIN_RELU2: u32 = 1;
const LIN_ACCUMULATE: u32 = 2;
const LIN_LISTS: u32 = 4;
const LIN_BIAS: u32 = 8;

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct RouteParams {
    n: u32,
    ne: u32,
    k: u32,
    norm: u32,
    n_group: u32,
    topk_group: u32,
    _p0: [u32; 2],
    scale: f32,
    _p1: [u32; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct Quad {
    a: u32,
    b: u32,
    c: u32,
    d: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Pod, Zeroable)]
struct GqaParams {
    n: u32,
    heads: u32,
    kv: u32,
    d: u32,
    pos0: u32,
    q_off: u32,
    q_stride: u32,
    o_off: u32,
    o_stride: u32,
    chunk: u32,
    splits: u32,
    _p0: u32,
    scale: f32,
    _p1: [u32; 3],
}

/// Causal GQA geometry for a pass: `n` queries at positions `pos0..pos0 + n`, the caches
/// holding at least `pos0 + n` positions.
#[derive(Clone, Copy, Debug)]
pub struct GqaShape {
    pub n: u32,
    pub pos0: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
}

/// Largest expert count the router takes (its workgroup holds every score).
pub const ROUTE_MAX_EXPERTS: u32 = 512;

/// A view of rows of an f32 buffer: row r starts at `off + r·stride`.
#[derive(Clone, Copy)]
pub struct RowsF32<'a> {
    pub buf: &'a Buffer,
    pub off: u32,
    pub stride: u32,
}

impl<'a> RowsF32<'a> {
    pub fn new(buf: &'a Buffer, stride: u32) -> Self {
        RowsF32 {
            buf,
            off: 0,
            stride,
        }
    }
    pub fn at(buf: &'a Buffer, off: u32, stride: u32) -> Self {
        RowsF32 { buf, off, stride }
    }
}

/// What follows the product in [`NemotronKernels::linear`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinearOps {
    pub relu2: bool,
    /// Add into y instead of overwriting it.
    pub accumulate: bool,
}

/// An f32 weight matrix `[n][k]` (row-major, PyTorch's Linear), or a bank of `experts`
/// such matrices `[E][n][k]`.
pub struct F32Weights {
    pub buf: Buffer,
    pub n: u32,
    pub k: u32,
    pub experts: u32,
}

impl F32Weights {
    pub fn upload(gpu: &Gpu, label: &str, w: &[f32], n: usize, k: usize) -> Result<Self> {
        Self::upload_bank(gpu, label, w, 1, n, k)
    }
    pub fn upload_bank(
        gpu: &Gpu,
        label: &str,
        w: &[f32],
        experts: usize,
        n: usize,
        k: usize,
    ) -> Result<Self> {
        if w.len() != experts * n * k {
            return Err(Error::Invalid(format!(
                "{label}: {} values for {experts} × [{n}, {k}]",
                w.len()
            )));
        }
        Ok(F32Weights {
            buf: gpu.upload_f32(label, w)?,
            n: n as u32,
            k: k as u32,
            experts: experts as u32,
        })
    }
    pub fn bytes(&self) -> u64 {
        self.n as u64 * self.k as u64 * 4
    }
}

/// The per-expert lists of a pass: `list[e·cap + i]` (i < `cnt[e]`) are the entries
/// (position·top_k + slot) that chose expert e, ascending.
pub struct ExpertLists<'a> {
    pub list: &'a Buffer,
    pub cnt: &'a Buffer,
    /// Row capacity per expert (at least the pass's positions).
    pub cap: u32,
    pub top_k: u32,
}

/// The Mamba-2 geometry the conv, scan and gated-norm kernels need.
#[derive(Clone, Copy, Debug)]
pub struct MambaShape {
    pub heads: u32,
    pub head_dim: u32,
    pub state: u32,
    pub groups: u32,
}

impl MambaShape {
    pub fn from_config(m: &crate::models::nemotron_h::MambaConfig) -> Result<MambaShape> {
        if m.conv_kernel != 4 {
            return Err(Error::Unsupported(format!(
                "Mamba conv kernel {} (the GPU frame has 4)",
                m.conv_kernel
            )));
        }
        Ok(MambaShape {
            heads: m.num_heads as u32,
            head_dim: m.head_dim as u32,
            state: m.state_size as u32,
            groups: m.n_groups as u32,
        })
    }
    pub fn inner(&self) -> u32 {
        self.heads * self.head_dim
    }
    pub fn conv_dim(&self) -> u32 {
        self.inner() + 2 * self.groups * self.state
    }
    /// Width of an in_proj row: z | xBC | dt.
    pub fn in_proj_rows(&self) -> u32 {
        self.inner() + self.conv_dim() + self.heads
    }
    pub fn conv_state_len(&self) -> u32 {
        3 * self.conv_dim()
    }
    pub fn ssm_state_len(&self) -> u32 {
        self.heads * self.state * self.head_dim
    }
}

/// The scan's per-head parameter block `[3][heads]`: A = −exp(A_log) (in f64, rounded
/// once), D, dt_bias.
pub fn scan_params(a_log: &[f32], d: &[f32], dt_bias: &[f32]) -> Vec<f32> {
    let mut v: Vec<f32> = a_log.iter().map(|&x| (-(x as f64).exp()) as f32).collect();
    v.extend_from_slice(d);
    v.extend_from_slice(dt_bias);
    v
}

fn check_pass(n: u32) -> Result<()> {
    if n > PASS_MAX {
        return Err(Error::Invalid(format!(
            "a pass of {n} positions (at most {PASS_MAX})"
        )));
    }
    Ok(())
}

/// The compiled Nemotron-H kernels plus a small buffer bound where an optional input is
/// absent.
pub struct NemotronKernels {
    rmsnorm: Arc<Kernel>,
    conv: Arc<Kernel>,
    scan: Arc<Kernel>,
    gnorm: Arc<Kernel>,
    linear: Arc<Kernel>,
    route: Arc<Kernel>,
    lists: Arc<Kernel>,
    combine: Arc<Kernel>,
    relu2: Arc<Kernel>,
    gqa: Arc<Kernel>,
    gqa_split: Arc<Kernel>,
    gqa_merge: Arc<Kernel>,
    argmax: Arc<Kernel>,
    embed: Arc<Kernel>,
    q4tp: Arc<Kernel>,
    q8_2f: Arc<Kernel>,
    /// Bound for an absent read-only input.
    dummy: Buffer,
    /// Bound for an absent output (a separate buffer: one dispatch cannot use a buffer both
    /// read-only and writable).
    dummy_w: Buffer,
}

impl NemotronKernels {
    /// Every Nemotron-H kernel (compiled side by side: `Gpu::compile_together`).
    pub fn load(gpu: &Gpu) -> Result<NemotronKernels> {
        gpu.compile_together(|| Self::load_each(gpu))
    }

    fn load_each(gpu: &Gpu) -> Result<NemotronKernels> {
        use Access::{Read as R, ReadWrite as W};
        let mamba = include_str!("mamba.wgsl");
        let moe = include_str!("moe.wgsl");
        let quant = include_str!("moe_quant.wgsl");
        Ok(NemotronKernels {
            rmsnorm: gpu.kernel(
                "nh_add_rmsnorm",
                include_str!("rmsnorm.wgsl"),
                &[W, R, R, W, R, R],
            )?,
            conv: gpu.kernel_entry("nh_conv", mamba, "conv", &[R, R, R, W, W, W])?,
            scan: gpu.kernel_entry("nh_scan", mamba, "scan", &[R, R, R, W, W, W])?,
            gnorm: gpu.kernel_entry("nh_gated_norm", mamba, "gnorm", &[W, R, R])?,
            linear: gpu.kernel(
                "nh_linear_f32",
                include_str!("linear.wgsl"),
                &[R, R, R, R, R, W],
            )?,
            route: gpu.kernel_entry("nh_route", moe, "route", &[R, R, W, W])?,
            lists: gpu.kernel_entry("nh_expert_lists", moe, "lists", &[R, W, W])?,
            combine: gpu.kernel_entry("nh_moe_combine", moe, "combine", &[R, R, W])?,
            relu2: gpu.kernel_entry("nh_relu2", moe, "relu2", &[W])?,
            gqa: gpu.kernel("nh_gqa", include_str!("gqa.wgsl"), &[R, R, R, W])?,
            gqa_split: gpu.kernel_entry(
                "nh_gqa_split",
                include_str!("gqa.wgsl"),
                "split",
                &[R, R, R, W],
            )?,
            gqa_merge: gpu.kernel_entry(
                "nh_gqa_merge",
                include_str!("gqa.wgsl"),
                "merge",
                &[R, W],
            )?,
            argmax: gpu.kernel("nh_argmax", include_str!("argmax.wgsl"), &[R, W])?,
            embed: gpu.kernel("nh_embed", include_str!("embed.wgsl"), &[R, R, W])?,
            q4tp: gpu.kernel_entry("nh_expert_q4tp", quant, "q4tp", &[R, R, R, R, R, W])?,
            q8_2f: gpu.kernel_entry("nh_expert_q8_2f", quant, "q8_2f", &[R, R, R, R, R, W])?,
            dummy: gpu.buffer("nemotron dummy", 16)?,
            dummy_w: gpu.buffer("nemotron dummy out", 16)?,
        })
    }

    /// For each of `rows` positions of width `cols`: `h += delta` when `delta` is given
    /// (h is the residual stream, updated in place), then `y = w · h / sqrt(mean(h²) + eps)`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rmsnorm(
        &self,
        rec: &mut Recorder,
        h: &Buffer,
        delta: Option<&Buffer>,
        w: &Buffer,
        y: &Buffer,
        rows: u32,
        cols: u32,
        eps: f32,
    ) -> Result<()> {
        self.rmsnorm_dispatch(rec, h, delta.map(|d| (d, None)), w, y, rows, cols, eps)
    }

    /// [`add_rmsnorm`](Self::add_rmsnorm) after a MoE layer, its routed sum folded in:
    /// `h += shared + Σ_s weights[t·top_k + s] · eo[t·top_k + s]` (the router's weights and
    /// the expert outputs per entry, rows of `cols`), then the RMSNorm. Saves the combine
    /// pass.
    #[allow(clippy::too_many_arguments)]
    pub fn add_moe_rmsnorm(
        &self,
        rec: &mut Recorder,
        h: &Buffer,
        shared: &Buffer,
        weights: &Buffer,
        eo: &Buffer,
        top_k: u32,
        w: &Buffer,
        y: &Buffer,
        rows: u32,
        cols: u32,
        eps: f32,
    ) -> Result<()> {
        self.rmsnorm_dispatch(
            rec,
            h,
            Some((shared, Some((weights, eo, top_k)))),
            w,
            y,
            rows,
            cols,
            eps,
        )
    }

    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn rmsnorm_dispatch(
        &self,
        rec: &mut Recorder,
        h: &Buffer,
        add: Option<(&Buffer, Option<(&Buffer, &Buffer, u32)>)>,
        w: &Buffer,
        y: &Buffer,
        rows: u32,
        cols: u32,
        eps: f32,
    ) -> Result<()> {
        let moe = add.and_then(|a| a.1);
        let k = moe.map_or(0, |m| m.2);
        let params = RmsParams {
            rows,
            cols,
            add: match add {
                None => 0,
                Some((_, None)) => 1,
                Some((_, Some(_))) => 2,
            },
            k,
            eps,
            _p1: [0; 3],
        };
        let rc = rows as u64 * cols as u64;
        let cost = Cost {
            bytes: rc * 4 * (if add.is_some() { 4 } else { 2 } + k as u64) + cols as u64 * 4,
            flops: rc * (5 + 2 * k as u64),
        };
        rec.dispatch(
            &self.rmsnorm,
            bytemuck::bytes_of(&params),
            &[
                h,
                add.map_or(&self.dummy, |a| a.0),
                w,
                y,
                moe.map_or(&self.dummy, |m| m.0),
                moe.map_or(&self.dummy, |m| m.1),
            ],
            [rows, 1, 1],
            cost,
        )
    }

    /// The depthwise causal conv (kernel 4) + bias + SiLU over `n` positions. xBC of
    /// position t is `proj[t·in_stride + in_off ..][..conv_dim]`; `conv_w` is
    /// `[conv_dim][4]`; the ring `[3][conv_dim]` advances; `out` is `[n][conv_dim]`.
    /// With `snap`, slot t of `snap` (`[n][3][conv_dim]`) gets the ring after position t.
    #[allow(clippy::too_many_arguments)]
    pub fn mamba_conv(
        &self,
        rec: &mut Recorder,
        s: &MambaShape,
        n: u32,
        proj: &Buffer,
        in_off: u32,
        in_stride: u32,
        conv_w: &Buffer,
        conv_b: Option<&Buffer>,
        ring: &Buffer,
        out: &Buffer,
        snap: Option<&Buffer>,
    ) -> Result<()> {
        check_pass(n)?;
        let cdim = s.conv_dim();
        let params = ConvParams {
            n,
            cdim,
            in_off,
            in_stride,
            bias: conv_b.is_some() as u32,
            snap: snap.is_some() as u32,
            _p: [0; 2],
        };
        let c = cdim as u64;
        let cost = Cost {
            bytes: c * 4 * (4 + 1 + 6 + 2 * n as u64) + snap.map_or(0, |_| 12 * c * n as u64),
            flops: 12 * c * n as u64,
        };
        rec.dispatch(
            &self.conv,
            bytemuck::bytes_of(&params),
            &[
                proj,
                conv_w,
                conv_b.unwrap_or(&self.dummy),
                ring,
                out,
                snap.unwrap_or(&self.dummy_w),
            ],
            [cdim.div_ceil(64), 1, 1],
            cost,
        )
    }

    /// The SSM scan over `n` positions: dt of position t (head h) is
    /// `proj[t·in_stride + dt_off + h]`, `dt = clamp(softplus(dt + dt_bias), lo, hi)`;
    /// x, B, C come from the conv output `xbc` `[n][conv_dim]`; `par` is [`scan_params`];
    /// `state` `[head][state][head_dim]` advances; `y` `[n][inner]` gets `s·C + D·x`.
    /// With `snap`, slot t of `snap` (`[n][ssm_state_len]`) gets the state after position t.
    #[allow(clippy::too_many_arguments)]
    pub fn mamba_scan(
        &self,
        rec: &mut Recorder,
        s: &MambaShape,
        n: u32,
        proj: &Buffer,
        dt_off: u32,
        in_stride: u32,
        xbc: &Buffer,
        par: &Buffer,
        dt_clamp: (f32, f32),
        state: &Buffer,
        y: &Buffer,
        snap: Option<&Buffer>,
    ) -> Result<()> {
        check_pass(n)?;
        if s.state > 256 {
            return Err(Error::Unsupported(format!(
                "Mamba state size {} (at most 256)",
                s.state
            )));
        }
        if s.groups == 0 || !s.heads.is_multiple_of(s.groups) {
            return Err(Error::Invalid(format!(
                "{} Mamba heads in {} groups",
                s.heads, s.groups
            )));
        }
        let params = ScanParams {
            n,
            nh: s.heads,
            hdim: s.head_dim,
            ns: s.state,
            ng: s.groups,
            hpg: s.heads / s.groups,
            inner: s.inner(),
            cdim: s.conv_dim(),
            dt_off,
            in_stride,
            snap: snap.is_some() as u32,
            _p0: 0,
            dt_lo: dt_clamp.0,
            dt_hi: dt_clamp.1,
            _p1: [0; 2],
        };
        let sl = s.ssm_state_len() as u64;
        let nn = n as u64;
        let cost = Cost {
            bytes: sl * 8
                + nn * (s.conv_dim() as u64 + s.inner() as u64) * 4
                + snap.map_or(0, |_| sl * 4 * nn),
            flops: 5 * sl * nn,
        };
        rec.dispatch(
            &self.scan,
            bytemuck::bytes_of(&params),
            &[proj, xbc, par, state, y, snap.unwrap_or(&self.dummy_w)],
            [s.heads, s.head_dim.div_ceil(32), 1],
            cost,
        )
    }

    /// Gated group RMSNorm in place on `y` `[n][inner]`: `v = y · SiLU(z)`, then per group
    /// of `inner / groups` channels `w · v / sqrt(mean(v²) + eps)`; z of position t is
    /// `proj[t·z_stride + z_off ..][..inner]`.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_norm(
        &self,
        rec: &mut Recorder,
        s: &MambaShape,
        n: u32,
        y: &Buffer,
        proj: &Buffer,
        z_off: u32,
        z_stride: u32,
        w: &Buffer,
        eps: f32,
    ) -> Result<()> {
        let inner = s.inner();
        let params = NormParams {
            n,
            inner,
            gs: inner / s.groups,
            z_off,
            z_stride,
            _p0: [0; 3],
            eps,
            _p1: [0; 3],
        };
        let e = n as u64 * inner as u64;
        let cost = Cost {
            bytes: e * 16 + inner as u64 * 4,
            flops: e * 12,
        };
        rec.dispatch(
            &self.gnorm,
            bytemuck::bytes_of(&params),
            &[y, proj, w],
            [s.groups, n, 1],
            cost,
        )
    }

    /// `y[r] (=|+=) act(x[r] · Wᵀ + b)` for `m` rows (f32 weights `[n][k]`); relu² and the
    /// accumulate come after the bias.
    #[allow(clippy::too_many_arguments)]
    pub fn linear(
        &self,
        rec: &mut Recorder,
        x: RowsF32,
        m: u32,
        w: &F32Weights,
        bias: Option<&Buffer>,
        y: RowsF32,
        ops: LinearOps,
    ) -> Result<()> {
        let params = LinearParams {
            m,
            n: w.n,
            k: w.k,
            flags: lin_flags(ops, bias.is_some()),
            x_off: x.off,
            x_stride: x.stride,
            y_off: y.off,
            y_stride: y.stride,
            cap: 0,
            xdiv: 1,
            w_stride: 0,
            _p0: 0,
        };
        let cost = Cost::matmul(m, w.n, w.k, w.bytes(), ops.accumulate);
        rec.dispatch(
            &self.linear,
            bytemuck::bytes_of(&params),
            &[
                x.buf,
                &w.buf,
                bias.unwrap_or(&self.dummy),
                &self.dummy,
                &self.dummy,
                y.buf,
            ],
            [w.n.div_ceil(16), m.div_ceil(16), 1],
            cost,
        )
    }

    /// The routed experts' GEMM over their lists: for every expert e of the bank `w`
    /// (`[E][n][k]`) and entry j in its list, `y[j] (=|+=) act(x[j / x_per_entry] · W_eᵀ)`.
    /// `x_per_entry` is top_k when x has a row per position (the up projection) and 1 when
    /// it has a row per entry (the down projection); y has a row per entry.
    /// `rows_bound` bounds the entries of any one expert (the pass's positions): it sizes
    /// the grid; empty tiles return at once.
    #[allow(clippy::too_many_arguments)]
    pub fn expert_linear(
        &self,
        rec: &mut Recorder,
        lists: &ExpertLists,
        rows_bound: u32,
        x: RowsF32,
        x_per_entry: u32,
        w: &F32Weights,
        y: RowsF32,
        ops: LinearOps,
    ) -> Result<()> {
        if x_per_entry == 0 {
            return Err(Error::Invalid("expert_linear: x_per_entry 0".into()));
        }
        let rows = rows_bound.min(lists.cap);
        let params = LinearParams {
            m: rows,
            n: w.n,
            k: w.k,
            flags: lin_flags(ops, false) | LIN_LISTS,
            x_off: x.off,
            x_stride: x.stride,
            y_off: y.off,
            y_stride: y.stride,
            cap: lists.cap,
            xdiv: x_per_entry,
            w_stride: w.n * w.k,
            _p0: 0,
        };
        // Bytes: at most top_k experts per position are read; book the upper bound.
        let (r64, n64, k64) = (rows as u64 * lists.top_k as u64, w.n as u64, w.k as u64);
        let read_experts = (w.experts as u64).min(r64);
        let cost = Cost {
            bytes: read_experts * w.bytes() + r64 * (k64 + n64) * 4,
            flops: 2 * r64 * n64 * k64,
        };
        rec.dispatch(
            &self.linear,
            bytemuck::bytes_of(&params),
            &[x.buf, &w.buf, &self.dummy, lists.list, lists.cnt, y.buf],
            [w.n.div_ceil(16), rows.div_ceil(16), w.experts],
            cost,
        )
    }

    /// The router of `n` positions: from logits `[n][experts]` and the correction bias,
    /// `sel` `[n][top_k]` (u32 expert ids, best first) and `weights` `[n][top_k]`, as
    /// `crate::reference::nemotron_h::route`.
    #[allow(clippy::too_many_arguments)]
    pub fn route(
        &self,
        rec: &mut Recorder,
        e: &crate::models::nemotron_h::MoeConfig,
        n: u32,
        logits: &Buffer,
        bias: &Buffer,
        sel: &Buffer,
        weights: &Buffer,
    ) -> Result<()> {
        let ne = e.n_routed_experts as u32;
        if ne > ROUTE_MAX_EXPERTS || e.top_k == 0 || e.top_k > e.n_routed_experts {
            return Err(Error::Unsupported(format!(
                "router of {ne} experts, top {} (at most {ROUTE_MAX_EXPERTS} experts)",
                e.top_k
            )));
        }
        if e.n_group > 1
            && (e.n_group > 64
                || !e.n_routed_experts.is_multiple_of(e.n_group)
                || e.n_routed_experts / e.n_group < 2)
        {
            return Err(Error::Unsupported(format!(
                "group-limited routing with {} groups of {ne} experts",
                e.n_group
            )));
        }
        let params = RouteParams {
            n,
            ne,
            k: e.top_k as u32,
            norm: e.norm_topk_prob as u32,
            n_group: e.n_group as u32,
            topk_group: e.topk_group as u32,
            _p0: [0; 2],
            scale: e.routed_scaling_factor as f32,
            _p1: [0; 3],
        };
        let cost = Cost {
            bytes: (n as u64 + 1) * ne as u64 * 4 + n as u64 * e.top_k as u64 * 8,
            flops: n as u64 * ne as u64 * (8 + e.top_k as u64),
        };
        rec.dispatch(
            &self.route,
            bytemuck::bytes_of(&params),
            &[logits, bias, sel, weights],
            [n, 1, 1],
            cost,
        )
    }

    /// Per expert, the entries of `sel` (`[n][top_k]`) that chose it: `list` `[experts][cap]`
    /// and `cnt` `[experts]` (every count is written; no clearing needed).
    #[allow(clippy::too_many_arguments)]
    pub fn expert_lists(
        &self,
        rec: &mut Recorder,
        n: u32,
        experts: u32,
        top_k: u32,
        sel: &Buffer,
        list: &Buffer,
        cnt: &Buffer,
        cap: u32,
    ) -> Result<()> {
        if cap < n {
            return Err(Error::Invalid(format!(
                "expert lists of {cap} rows for a pass of {n}"
            )));
        }
        let params = Quad {
            a: n,
            b: experts,
            c: top_k,
            d: cap,
        };
        let cost = Cost {
            bytes: experts as u64 * n as u64 * top_k as u64 * 4,
            flops: 0,
        };
        rec.dispatch(
            &self.lists,
            bytemuck::bytes_of(&params),
            &[sel, list, cnt],
            [experts.div_ceil(64), 1, 1],
            cost,
        )
    }

    /// The routed sum: `y[t] (=|+=) Σ_s weights[t·top_k + s] · eo[t·top_k + s]`, rows of `io`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine(
        &self,
        rec: &mut Recorder,
        n: u32,
        io: u32,
        top_k: u32,
        weights: &Buffer,
        eo: &Buffer,
        y: &Buffer,
        accumulate: bool,
    ) -> Result<()> {
        let params = Quad {
            a: n,
            b: io,
            c: top_k,
            d: accumulate as u32,
        };
        let e = n as u64 * io as u64;
        let cost = Cost {
            bytes: e * 4 * (top_k as u64 + 1 + accumulate as u64),
            flops: 2 * e * top_k as u64,
        };
        rec.dispatch(
            &self.combine,
            bytemuck::bytes_of(&params),
            &[weights, eo, y],
            [io.div_ceil(64), n, 1],
            cost,
        )
    }

    /// `y = max(y, 0)²` on the first `count` elements, in place.
    pub fn relu2(&self, rec: &mut Recorder, y: &Buffer, count: u32) -> Result<()> {
        let params = Quad {
            a: count,
            b: 0,
            c: 0,
            d: 0,
        };
        let groups = count.div_ceil(256);
        let grid = if groups <= 65535 {
            [groups, 1, 1]
        } else {
            [65535, groups.div_ceil(65535), 1]
        };
        rec.dispatch(
            &self.relu2,
            bytemuck::bytes_of(&params),
            &[y],
            grid,
            Cost {
                bytes: count as u64 * 8,
                flops: count as u64 * 2,
            },
        )
    }

    /// Causal GQA: queries `q` (rows of `heads·head_dim`, one per position of the pass),
    /// caches `[position][kv_heads][head_dim]` already holding the pass's own K and V;
    /// query head h reads KV head `h / (heads / kv_heads)`, scale `head_dim^-½`; `out` rows
    /// of `heads·head_dim`. As `crate::reference::nemotron_h::gqa_attention`. One
    /// workgroup per (position, head) walks the whole context.
    pub fn gqa(
        &self,
        rec: &mut Recorder,
        a: &GqaShape,
        q: RowsF32,
        k_cache: &Buffer,
        v_cache: &Buffer,
        out: RowsF32,
    ) -> Result<()> {
        let params = gqa_params(a, q, out, 0, 1)?;
        rec.dispatch(
            &self.gqa,
            bytemuck::bytes_of(&params),
            &[q.buf, k_cache, v_cache, out.buf],
            [a.n, a.heads, 1],
            gqa_cost(a),
        )
    }

    /// [`gqa`](Self::gqa) with the keys cut into chunks of `chunk` (a multiple of 64 is
    /// best) over separate workgroups, then merged: for few queries over a long context
    /// (decode, verify). `part` holds `n · heads · splits · (head_dim + 2)` floats, where
    /// `splits = ⌈(pos0 + n) / chunk⌉` (see [`gqa_part_len`](Self::gqa_part_len)).
    #[allow(clippy::too_many_arguments)]
    pub fn gqa_split(
        &self,
        rec: &mut Recorder,
        a: &GqaShape,
        q: RowsF32,
        k_cache: &Buffer,
        v_cache: &Buffer,
        out: RowsF32,
        part: &Buffer,
        chunk: u32,
    ) -> Result<()> {
        if chunk == 0 {
            return Err(Error::Invalid("GQA split into chunks of 0 keys".into()));
        }
        let splits = (a.pos0 + a.n).div_ceil(chunk);
        let need = Self::gqa_part_len(a, chunk) as u64 * 4;
        if part.size() < need {
            return Err(Error::Invalid(format!(
                "GQA partials need {need} bytes, the buffer has {}",
                part.size()
            )));
        }
        let params = gqa_params(a, q, out, chunk, splits)?;
        rec.dispatch(
            &self.gqa_split,
            bytemuck::bytes_of(&params),
            &[q.buf, k_cache, v_cache, part],
            [splits, a.heads, a.n],
            gqa_cost(a),
        )?;
        let merge = Cost {
            bytes: a.n as u64 * a.heads as u64 * (splits as u64 + 1) * (a.head_dim as u64 + 2) * 4,
            flops: 0,
        };
        rec.dispatch(
            &self.gqa_merge,
            bytemuck::bytes_of(&params),
            &[part, out.buf],
            [a.n, a.heads, 1],
            merge,
        )
    }

    /// Floats of the partials buffer [`gqa_split`](Self::gqa_split) needs.
    pub fn gqa_part_len(a: &GqaShape, chunk: u32) -> u32 {
        a.n * a.heads * (a.pos0 + a.n).div_ceil(chunk.max(1)) * (a.head_dim + 2)
    }

    /// `ids[t] = argmax logits[t]` (ties to the lower id) for `n` rows of `vocab`.
    pub fn argmax(
        &self,
        rec: &mut Recorder,
        n: u32,
        vocab: u32,
        logits: RowsF32,
        ids: &Buffer,
    ) -> Result<()> {
        let params = Quad {
            a: n,
            b: vocab,
            c: logits.off,
            d: logits.stride,
        };
        let cost = Cost {
            bytes: n as u64 * vocab as u64 * 4 + n as u64 * 4,
            flops: n as u64 * vocab as u64,
        };
        rec.dispatch(
            &self.argmax,
            bytemuck::bytes_of(&params),
            &[logits.buf, ids],
            [n, 1, 1],
            cost,
        )
    }

    /// `h[t] = emb[ids[ids_off + t]]` for `n` positions; `emb` is `[vocab][hidden]` f32
    /// (an id outside the vocabulary gives a zero row).
    #[allow(clippy::too_many_arguments)]
    pub fn embed(
        &self,
        rec: &mut Recorder,
        n: u32,
        ids: &Buffer,
        ids_off: u32,
        emb: &Buffer,
        vocab: u32,
        hidden: u32,
        h: &Buffer,
    ) -> Result<()> {
        check_pass(n)?;
        let params = Quad {
            a: n,
            b: hidden,
            c: vocab,
            d: ids_off,
        };
        let cost = Cost {
            bytes: n as u64 * (hidden as u64 * 8 + 4),
            flops: 0,
        };
        rec.dispatch(
            &self.embed,
            bytemuck::bytes_of(&params),
            &[ids, emb, h],
            [hidden.div_ceil(64), n, 1],
            cost,
        )
    }
}

fn gqa_params(
    a: &GqaShape,
    q: RowsF32,
    out: RowsF32,
    chunk: u32,
    splits: u32,
) -> Result<GqaParams> {
    check_pass(a.n)?;
    if a.head_dim > 128 || a.kv_heads == 0 || !a.heads.is_multiple_of(a.kv_heads) {
        return Err(Error::Unsupported(format!(
            "GQA with {} heads over {} KV heads of {} (head size at most 128, heads a multiple of KV heads)",
            a.heads, a.kv_heads, a.head_dim
        )));
    }
    Ok(GqaParams {
        n: a.n,
        heads: a.heads,
        kv: a.kv_heads,
        d: a.head_dim,
        pos0: a.pos0,
        q_off: q.off,
        q_stride: q.stride,
        o_off: out.off,
        o_stride: out.stride,
        chunk,
        splits,
        _p0: 0,
        scale: 1.0 / (a.head_dim as f32).sqrt(),
        _p1: [0; 3],
    })
}

fn gqa_cost(a: &GqaShape) -> Cost {
    let (n, keys, hd) = (
        a.n as u64,
        a.pos0 as u64 + a.n as u64,
        a.heads as u64 * a.head_dim as u64,
    );
    // Each query streams its keys and values (causal: on average about half the pass's own).
    Cost {
        bytes: n * keys * 2 * hd * 4 + n * hd * 8,
        flops: 4 * n * keys * hd,
    }
}

fn lin_flags(ops: LinearOps, bias: bool) -> u32 {
    (if ops.relu2 { LIN_RELU2 } else { 0 })
        | (if ops.accumulate { LIN_ACCUMULATE } else { 0 })
        | (if bias { LIN_BIAS } else { 0 })
}
