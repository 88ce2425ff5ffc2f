//! The Nemotron-H frame on the GPU: [`NemotronGpu`] holds the weights (uploaded once, f32),
//! [`NemotronContext`] one sequence (KV caches, conv rings, SSM states, verify snapshots,
//! the position).
//!
//! Every forward is a *pass* of up to [`PASS_MAX`] positions in one submission, every
//! weight read once per pass (the MoE experts over per-expert lists of the positions that
//! chose them). Prefill splits its input into passes; decode is a pass of one; verify is a
//! pass of up to [`VERIFY_MAX`] positions that also writes every Mamba layer's conv ring
//! and SSM state after each position, so [`NemotronContext::rollback`] can go back to the
//! state after any of them by copying one slot per layer and cutting the KV length.
//!
//! Routed experts: f32 (exact), or quantized banks (`q4tp` / `q8_2f`, see
//! [`crate::quant`]) with a residency map ([`ExpertOptions`]): only the resident experts'
//! matrices are on the GPU; a MoE layer with experts kept on the host ends the pass's
//! submission after its expert GEMMs, reads back the router's choices and the layer input,
//! computes the entries that chose a missing expert on the host with the same quantized
//! weights, writes them into the expert outputs and carries on in a new submission.
//!
//! Bind groups: each kind of pass (token or embedding input × attention kernel × snapshots)
//! records the same dispatch sequence over the same buffers every time, so a
//! [`DispatchCache`] per kind builds its bind groups on the first pass only; later passes
//! rewrite the parameter blocks (count, first position) alone.

use std::sync::Arc;

use wgpu::Buffer;

use super::{Checkpoint, Config};
use crate::gpu::{DispatchCache, Gpu, Recorder};
use crate::kernels::nemotron::{
    host_expert, scan_params, ExpertLists, F32Weights, GqaShape, LinearOps, MambaShape,
    NemotronKernels, QuantBank, RowsF32, PASS_MAX,
};
use crate::quant::{QuantFormat, QuantMatrix};
use crate::reference::nemotron_h::{Linear, Mixer, Model};
use crate::{Error, Result};

/// Positions of a verify pass (its snapshot slots).
pub const VERIFY_MAX: u32 = 8;

/// Passes of at most this many positions split the keys of attention over workgroups.
const SPLIT_MAX: u32 = 8;
/// Keys per workgroup of the split attention.
const SPLIT_CHUNK: u32 = 64;

struct Lin {
    w: F32Weights,
    b: Option<Buffer>,
}

fn lin(g: &Gpu, label: &str, l: &Linear) -> Result<Lin> {
    Ok(Lin {
        w: F32Weights::upload(g, label, &l.w, l.rows, l.cols)?,
        b: l.b.as_ref().map(|b| g.upload_f32(label, b)).transpose()?,
    })
}

enum LayerWeights {
    Mamba {
        in_proj: Lin,
        out_proj: Lin,
        conv_w: Buffer,
        conv_b: Option<Buffer>,
        par: Buffer,
        norm: Buffer,
    },
    Attention {
        q: Lin,
        k: Lin,
        v: Lin,
        o: Lin,
    },
    Moe {
        gate: F32Weights,
        bias: Buffer,
        experts: Experts,
        sup: Lin,
        sdown: Lin,
        /// `fc1_latent_proj`, `fc2_latent_proj` (`moe_latent_size`): the routed experts
        /// then read and write rows of the latent width.
        latent: Option<(Lin, Lin)>,
    },
    Mlp {
        up: Lin,
        down: Lin,
    },
}

/// A MoE layer's routed experts.
enum Experts {
    F32 {
        up: F32Weights,
        down: F32Weights,
    },
    Quant {
        up: QuantBank,
        down: QuantBank,
        /// `[experts]`: the (up, down) matrices of the experts kept on the host.
        host: Vec<Option<(QuantMatrix, QuantMatrix)>>,
    },
}

impl Experts {
    /// Whether some experts of the layer run on the host (the pass splits there).
    fn has_host(&self) -> bool {
        matches!(self, Experts::Quant { host, .. } if host.iter().any(Option::is_some))
    }
}

/// How [`NemotronGpu`] holds the routed experts.
#[derive(Clone, Debug, Default)]
pub struct ExpertOptions {
    /// `None`: f32, as the checkpoint (widened). `Some(format)`: quantized banks.
    pub format: Option<QuantFormat>,
    /// Which routed experts live on the GPU: `resident[layer][expert]` for every layer of
    /// the model (entries of layers that are not MoE are ignored; an empty entry means all
    /// resident). Empty: all resident. The others run on the host with the same quantized
    /// weights; a residency map needs a quantized format.
    pub resident: Vec<Vec<bool>>,
}

/// The weights of a Nemotron-H checkpoint on the GPU, with the kernels that run it.
pub struct NemotronGpu {
    gpu: Arc<Gpu>,
    kern: NemotronKernels,
    config: Config,
    shape: MambaShape,
    dt: (f32, f32),
    norms: Vec<Buffer>,
    layers: Vec<LayerWeights>,
    norm_f: Buffer,
    head: F32Weights,
    emb: Buffer,
}

impl NemotronGpu {
    /// Widens the checkpoint to f32 (bf16 exactly) and uploads every weight once.
    pub fn load(gpu: Arc<Gpu>, ck: &Checkpoint) -> Result<NemotronGpu> {
        let m = Model::from_checkpoint(ck)?;
        Self::from_model(gpu, &m)
    }

    /// Uploads the weights of a CPU reference model (same layouts).
    pub fn from_model(gpu: Arc<Gpu>, m: &Model) -> Result<NemotronGpu> {
        Self::from_model_with(gpu, m, &ExpertOptions::default())
    }

    /// [`load`](Self::load) with the routed experts held as `opts` says.
    pub fn load_with(gpu: Arc<Gpu>, ck: &Checkpoint, opts: &ExpertOptions) -> Result<NemotronGpu> {
        let m = Model::from_checkpoint(ck)?;
        Self::from_model_with(gpu, &m, opts)
    }

    /// [`from_model`](Self::from_model) with the routed experts held as `opts` says.
    pub fn from_model_with(gpu: Arc<Gpu>, m: &Model, opts: &ExpertOptions) -> Result<NemotronGpu> {
        Self::build(gpu, m, opts, None)
    }

    /// [`from_model`](Self::from_model) with every MoE layer's routed experts taken from
    /// `banks(layer)` (up, down), already on the GPU and all resident; the model's own
    /// expert weights are not read (they may be empty). For harnesses whose banks are made
    /// on the GPU (`nemotron-bench`): quantizing billions of host floats would take minutes.
    pub fn from_model_with_banks(
        gpu: Arc<Gpu>,
        m: &Model,
        banks: &mut BankSource<'_>,
    ) -> Result<NemotronGpu> {
        Self::build(gpu, m, &ExpertOptions::default(), Some(banks))
    }

    fn build(
        gpu: Arc<Gpu>,
        m: &Model,
        opts: &ExpertOptions,
        mut banks: Option<&mut BankSource<'_>>,
    ) -> Result<NemotronGpu> {
        let g: &Gpu = &gpu;
        let c = &m.config;
        let hid = c.hidden_size;
        let e = &c.moe;
        // The width the routed experts read and write (the latent size when there is one).
        let io = e.expert_io(hid);
        let shape = MambaShape::from_config(&c.mamba)?;
        if !opts.resident.is_empty() && opts.resident.len() != m.layers.len() {
            return Err(Error::Invalid(format!(
                "a residency map of {} layers for a model of {}",
                opts.resident.len(),
                m.layers.len()
            )));
        }
        let mut layers = Vec::with_capacity(m.layers.len());
        for (li, l) in m.layers.iter().enumerate() {
            layers.push(match &l.mixer {
                Mixer::Mamba(w) => LayerWeights::Mamba {
                    in_proj: lin(g, "in_proj", &w.in_proj)?,
                    out_proj: lin(g, "out_proj", &w.out_proj)?,
                    conv_w: g.upload_f32("conv_w", &w.conv_w)?,
                    conv_b: w
                        .conv_b
                        .as_ref()
                        .map(|b| g.upload_f32("conv_b", b))
                        .transpose()?,
                    par: g.upload_f32("scan params", &scan_params(&w.a_log, &w.d, &w.dt_bias))?,
                    norm: g.upload_f32("gated norm", &w.norm)?,
                },
                Mixer::Attention(w) => LayerWeights::Attention {
                    q: lin(g, "q_proj", &w.q)?,
                    k: lin(g, "k_proj", &w.k)?,
                    v: lin(g, "v_proj", &w.v)?,
                    o: lin(g, "o_proj", &w.o)?,
                },
                Mixer::Moe(w) => {
                    let ne = e.n_routed_experts;
                    let resident = match opts.resident.get(li) {
                        Some(r) if !r.is_empty() => {
                            if r.len() != ne {
                                return Err(Error::Invalid(format!(
                                    "layer {li}: a residency map of {} experts for {ne}",
                                    r.len()
                                )));
                            }
                            r.clone()
                        }
                        _ => vec![true; ne],
                    };
                    if w.experts
                        .iter()
                        .any(|x| x.up.b.is_some() || x.down.b.is_some())
                    {
                        return Err(Error::Unsupported(
                            "expert biases are not in the GPU frame".into(),
                        ));
                    }
                    if w.latent.is_some() && resident.iter().any(|&r| !r) {
                        // Host experts read the layer input; with a latent projection they
                        // would need its projected rows.
                        return Err(Error::Unsupported(
                            "a residency map with latent MoE projections is not in the GPU frame".into(),
                        ));
                    }
                    LayerWeights::Moe {
                        gate: F32Weights::upload(g, "router", &w.gate, ne, hid)?,
                        bias: g.upload_f32("router bias", &w.bias)?,
                        experts: match banks.as_deref_mut() {
                            Some(src) => given_banks(src, li, ne, io, e.intermediate_size)?,
                            None => upload_experts(
                                g,
                                w,
                                ne,
                                io,
                                e.intermediate_size,
                                opts.format,
                                &resident,
                            )?,
                        },
                        sup: lin(g, "shared up", &w.shared.up)?,
                        sdown: lin(g, "shared down", &w.shared.down)?,
                        latent: match &w.latent {
                            Some((fc1, fc2)) => Some((lin(g, "fc1_latent_proj", fc1)?, lin(g, "fc2_latent_proj", fc2)?)),
                            None => None,
                        },
                    }
                }
                Mixer::Mlp(w) => LayerWeights::Mlp {
                    up: lin(g, "mlp up", &w.up)?,
                    down: lin(g, "mlp down", &w.down)?,
                },
            });
        }
        let norms = m
            .layers
            .iter()
            .map(|l| g.upload_f32("norm", &l.norm))
            .collect::<Result<Vec<_>>>()?;
        let (lo, hi) = m.dt_clamp.bounds(&c.mamba);
        let head = F32Weights::upload(
            g,
            "lm head",
            m.lm_head.as_deref().unwrap_or(&m.embeddings),
            c.vocab_size,
            hid,
        )?;
        let kern = NemotronKernels::load(g)?;
        let out = NemotronGpu {
            kern,
            config: c.clone(),
            shape,
            dt: (lo as f32, hi as f32),
            norms,
            layers,
            norm_f: g.upload_f32("norm_f", &m.norm_f)?,
            head,
            emb: g.upload_f32("embeddings", &m.embeddings)?,
            gpu: gpu.clone(),
        };
        Ok(out)
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// A fresh sequence of at most `max_len` positions.
    pub fn context(&self, max_len: u32) -> Result<NemotronContext<'_>> {
        NemotronContext::new(self, max_len)
    }
}

/// Makes the (up, down) banks of a MoE layer, given its index in the model.
pub type BankSource<'a> = dyn FnMut(usize) -> Result<(QuantBank, QuantBank)> + 'a;

/// A MoE layer's banks from a [`BankSource`], checked against the layer's geometry.
fn given_banks(
    src: &mut BankSource<'_>,
    li: usize,
    ne: usize,
    hid: usize,
    inter: usize,
) -> Result<Experts> {
    let (up, down) = src(li)?;
    let want = |b: &QuantBank, rows: usize, cols: usize| {
        b.experts as usize == ne
            && b.rows as usize == rows
            && b.cols as usize == cols
            && b.resident_count() == ne
    };
    if !want(&up, inter, hid) || !want(&down, hid, inter) || up.format != down.format {
        return Err(Error::Invalid(format!(
            "layer {li}: given banks are not {ne} resident experts of [{inter}][{hid}] up and [{hid}][{inter}] down in one format"
        )));
    }
    Ok(Experts::Quant {
        up,
        down,
        host: (0..ne).map(|_| None).collect(),
    })
}

/// The routed experts of one MoE layer, as `format` and `resident` say.
fn upload_experts(
    g: &Gpu,
    w: &crate::reference::nemotron_h::MoeWeights,
    ne: usize,
    hid: usize,
    inter: usize,
    format: Option<QuantFormat>,
    resident: &[bool],
) -> Result<Experts> {
    let Some(format) = format else {
        if resident.iter().any(|&r| !r) {
            return Err(Error::Unsupported(
                "a residency map needs quantized experts (q4tp or q8_2f)".into(),
            ));
        }
        let up: Vec<f32> = w
            .experts
            .iter()
            .flat_map(|x| x.up.w.iter().copied())
            .collect();
        let down: Vec<f32> = w
            .experts
            .iter()
            .flat_map(|x| x.down.w.iter().copied())
            .collect();
        return Ok(Experts::F32 {
            up: F32Weights::upload_bank(g, "experts up", &up, ne, inter, hid)?,
            down: F32Weights::upload_bank(g, "experts down", &down, ne, hid, inter)?,
        });
    };
    let mut ups = Vec::with_capacity(ne);
    let mut downs = Vec::with_capacity(ne);
    for x in &w.experts {
        ups.push(QuantMatrix::quantize(format, &x.up.w, inter, hid)?);
        downs.push(QuantMatrix::quantize(format, &x.down.w, hid, inter)?);
    }
    let up = QuantBank::upload(g, "experts up", &ups.iter().collect::<Vec<_>>(), resident)?;
    let down = QuantBank::upload(
        g,
        "experts down",
        &downs.iter().collect::<Vec<_>>(),
        resident,
    )?;
    // Only the host's experts stay in host memory.
    let host = ups
        .into_iter()
        .zip(downs)
        .zip(resident)
        .map(|(pair, &res)| (!res).then_some(pair))
        .collect();
    Ok(Experts::Quant { up, down, host })
}

enum LayerState {
    Mamba {
        ring: Buffer,
        ssm: Buffer,
        ring_snap: Buffer,
        ssm_snap: Buffer,
    },
    Attention {
        kc: Buffer,
        vc: Buffer,
    },
    Stateless,
}

/// Scratch of one pass (`PASS_MAX` rows each).
struct Scratch {
    h: Buffer,
    x: Buffer,
    out: Buffer,
    proj: Buffer,
    xbc: Buffer,
    y: Buffer,
    q: Buffer,
    att: Buffer,
    rl: Buffer,
    sel: Buffer,
    wts: Buffer,
    list: Buffer,
    cnt: Buffer,
    hmid: Buffer,
    eo: Buffer,
    /// The latent rows the routed experts read, and their weighted sum (latent MoE only).
    lat_in: Buffer,
    lat_sum: Buffer,
    mid: Buffer,
    logits: Buffer,
    ids: Buffer,
    top: Buffer,
    part: Buffer,
    /// `[layers + 1][PASS_MAX][hidden]`: the residual stream after each layer and the final
    /// norm's output, written by traced passes only.
    trace: Buffer,
}

/// What a pass reads.
#[derive(Clone, Copy, Debug)]
pub enum PassInput<'a> {
    Tokens(&'a [u32]),
    /// `[n][hidden]` rows (`inputs_embeds`).
    Embeds(&'a [f32]),
}

impl PassInput<'_> {
    fn len(&self, hidden: usize) -> usize {
        match self {
            PassInput::Tokens(t) => t.len(),
            PassInput::Embeds(e) => e.len() / hidden.max(1),
        }
    }
}

/// The output of a verify pass: logits `[k][vocab]` and the argmax of each row.
#[derive(Clone, Debug)]
pub struct Verified {
    pub logits: Vec<f32>,
    pub argmax: Vec<u32>,
}

/// Hidden states of a traced pass, each `[n][hidden]`: the output of every layer, then the
/// final norm's output (transformers' `output_hidden_states` less the embeddings).
#[derive(Clone, Debug)]
pub struct PassTrace {
    pub layers: Vec<Vec<f32>>,
    pub final_norm: Vec<f32>,
}

/// What one pass returns: logits, argmax per row (when asked), hidden states (when traced).
type PassOutput = (Vec<f32>, Option<Vec<u32>>, Option<PassTrace>);

/// One sequence on the GPU.
pub struct NemotronContext<'m> {
    m: &'m NemotronGpu,
    max_len: u32,
    pos: u32,
    states: Vec<LayerState>,
    s: Scratch,
    /// One list per kind of pass (embeds × split attention × snapshots), one cache per
    /// submission of the pass (more than one when experts run on the host).
    caches: Vec<Vec<DispatchCache>>,
    /// The last verify pass: its first position and how many of its slots are still
    /// restorable (a later pass overwrites KV rows from its own first position on).
    verify: Option<(u32, u32)>,
}

impl<'m> NemotronContext<'m> {
    fn new(m: &'m NemotronGpu, max_len: u32) -> Result<NemotronContext<'m>> {
        if max_len == 0 {
            return Err(Error::Invalid("a context of 0 positions".into()));
        }
        let g: &Gpu = &m.gpu;
        let c = &m.config;
        let hid = c.hidden_size;
        let p = PASS_MAX as usize;
        let s = m.shape;
        let a = &c.attention;
        let e = &c.moe;
        let kvw = (a.num_kv_heads * a.head_dim) as u64;
        let vs = VERIFY_MAX as u64;
        let mut states = Vec::with_capacity(m.layers.len());
        for l in &m.layers {
            states.push(match l {
                LayerWeights::Mamba { .. } => {
                    let (cl, sl) = (s.conv_state_len() as u64 * 4, s.ssm_state_len() as u64 * 4);
                    let ring = g.buffer("conv ring", cl)?;
                    let ssm = g.buffer("ssm state", sl)?;
                    g.fill_u32(&ring, 0);
                    g.fill_u32(&ssm, 0);
                    LayerState::Mamba {
                        ring,
                        ssm,
                        ring_snap: g.buffer("conv ring snapshots", vs * cl)?,
                        ssm_snap: g.buffer("ssm state snapshots", vs * sl)?,
                    }
                }
                LayerWeights::Attention { .. } => LayerState::Attention {
                    kc: g.buffer("k cache", max_len as u64 * kvw * 4)?,
                    vc: g.buffer("v cache", max_len as u64 * kvw * 4)?,
                },
                _ => LayerState::Stateless,
            });
        }
        let f = |label: &str, n: usize| g.buffer(label, (n.max(1) * 4) as u64);
        let mid = e.shared_intermediate_size.max(c.mlp_intermediate_size);
        let qw = a.num_heads * a.head_dim;
        let part = GqaShape {
            n: SPLIT_MAX,
            pos0: max_len.saturating_sub(SPLIT_MAX),
            heads: a.num_heads as u32,
            kv_heads: a.num_kv_heads as u32,
            head_dim: a.head_dim as u32,
        };
        let sc = Scratch {
            h: f("h", p * hid)?,
            x: f("x", p * hid)?,
            out: f("out", p * hid)?,
            proj: f("in_proj out", p * s.in_proj_rows() as usize)?,
            xbc: f("xbc", p * s.conv_dim() as usize)?,
            y: f("y", p * s.inner() as usize)?,
            q: f("q", p * qw)?,
            att: f("att", p * qw)?,
            rl: f("router logits", p * e.n_routed_experts)?,
            sel: f("selected", p * e.top_k)?,
            wts: f("weights", p * e.top_k)?,
            list: f("expert lists", e.n_routed_experts * p)?,
            cnt: f("expert counts", e.n_routed_experts)?,
            hmid: f("expert mid", p * e.top_k * e.intermediate_size)?,
            eo: f("expert out", p * e.top_k * e.expert_io(hid).max(hid))?,
            lat_in: f("latent in", p * e.latent_size.unwrap_or(1))?,
            lat_sum: f("latent sum", p * e.latent_size.unwrap_or(1))?,
            mid: f("mid", p * mid)?,
            logits: f("logits", p * c.vocab_size)?,
            ids: f("ids", p)?,
            top: f("argmax", p)?,
            part: f(
                "gqa partials",
                NemotronKernels::gqa_part_len(&part, SPLIT_CHUNK) as usize + max_len as usize,
            )?,
            trace: f("trace", (m.layers.len() + 1) * p * hid)?,
        };
        g.wait()?;
        let segments = 1 + m
            .layers
            .iter()
            .filter(|l| matches!(l, LayerWeights::Moe { experts, .. } if experts.has_host()))
            .count();
        Ok(NemotronContext {
            m,
            max_len,
            pos: 0,
            states,
            s: sc,
            caches: (0..8)
                .map(|_| (0..segments).map(|_| DispatchCache::default()).collect())
                .collect(),
            verify: None,
        })
    }

    /// Positions consumed so far (the KV length).
    pub fn position(&self) -> u32 {
        self.pos
    }

    pub fn max_len(&self) -> u32 {
        self.max_len
    }

    fn check(&self, input: PassInput<'_>) -> Result<usize> {
        let c = &self.m.config;
        let n = match input {
            PassInput::Tokens(t) => {
                if let Some(bad) = t.iter().find(|&&id| id as usize >= c.vocab_size) {
                    return Err(Error::Invalid(format!(
                        "token id {bad} is outside the vocabulary of {}",
                        c.vocab_size
                    )));
                }
                t.len()
            }
            PassInput::Embeds(e) => {
                if e.len() % c.hidden_size != 0 {
                    return Err(Error::Invalid(format!(
                        "{} embedding values are not rows of {}",
                        e.len(),
                        c.hidden_size
                    )));
                }
                e.len() / c.hidden_size
            }
        };
        if self.pos as usize + n > self.max_len as usize {
            return Err(Error::Invalid(format!(
                "{n} more positions after {} exceed the context's {}",
                self.pos, self.max_len
            )));
        }
        Ok(n)
    }

    /// Prefill: `input` in passes of up to [`PASS_MAX`] positions; logits `[n][vocab]`.
    pub fn prefill(&mut self, input: PassInput<'_>) -> Result<Vec<f32>> {
        let n = self.check(input)?;
        let hid = self.m.config.hidden_size;
        let mut logits = Vec::with_capacity(n * self.m.config.vocab_size);
        let p = PASS_MAX as usize;
        for start in (0..n).step_by(p) {
            let end = (start + p).min(n);
            let part = match input {
                PassInput::Tokens(t) => PassInput::Tokens(&t[start..end]),
                PassInput::Embeds(e) => PassInput::Embeds(&e[start * hid..end * hid]),
            };
            logits.extend(self.pass(part, false, false, false)?.0);
        }
        Ok(logits)
    }

    /// Prefill with token ids.
    pub fn prefill_tokens(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.prefill(PassInput::Tokens(tokens))
    }

    /// Prefill with embedding rows `[n][hidden]`.
    pub fn prefill_embeds(&mut self, embeds: &[f32]) -> Result<Vec<f32>> {
        self.prefill(PassInput::Embeds(embeds))
    }

    /// One pass of at most [`PASS_MAX`] positions with every layer's hidden states.
    pub fn forward_traced(&mut self, input: PassInput<'_>) -> Result<(Vec<f32>, PassTrace)> {
        self.check(input)?;
        let (l, _, t) = self.pass(input, false, false, true)?;
        Ok((l, t.expect("traced")))
    }

    /// One decode step: the logits `[vocab]` after `token`.
    pub fn decode(&mut self, token: u32) -> Result<Vec<f32>> {
        self.check(PassInput::Tokens(&[token]))?;
        Ok(self
            .pass(PassInput::Tokens(&[token]), false, false, false)?
            .0)
    }

    /// One decode step from an embedding row.
    pub fn decode_embed(&mut self, embed: &[f32]) -> Result<Vec<f32>> {
        if embed.len() != self.m.config.hidden_size {
            return Err(Error::Invalid(format!(
                "an embedding row of {} values (hidden size {})",
                embed.len(),
                self.m.config.hidden_size
            )));
        }
        self.check(PassInput::Embeds(embed))?;
        Ok(self.pass(PassInput::Embeds(embed), false, false, false)?.0)
    }

    /// A verify pass of `tokens` (1..=[`VERIFY_MAX`]): logits and argmax at each position,
    /// the state after each position kept for [`rollback`](Self::rollback).
    pub fn verify(&mut self, tokens: &[u32]) -> Result<Verified> {
        if tokens.is_empty() || tokens.len() > VERIFY_MAX as usize {
            return Err(Error::Invalid(format!(
                "a verify pass of {} positions (1 to {VERIFY_MAX})",
                tokens.len()
            )));
        }
        self.check(PassInput::Tokens(tokens))?;
        let pos0 = self.pos;
        let (logits, argmax, _) = self.pass(PassInput::Tokens(tokens), true, true, false)?;
        self.verify = Some((pos0, tokens.len() as u32));
        Ok(Verified {
            logits,
            argmax: argmax.expect("argmax"),
        })
    }

    /// Back to the state after position `j` (0-based) of the last verify pass: every Mamba
    /// layer's ring and SSM state from snapshot slot j, the KV length cut to
    /// `pos0 + j + 1`. Copies O(state); recomputes nothing.
    pub fn rollback(&mut self, j: u32) -> Result<()> {
        let Some((pos0, valid)) = self.verify else {
            return Err(Error::Invalid("rollback without a verify pass".into()));
        };
        if j >= valid {
            return Err(Error::Invalid(format!(
                "rollback to position {j} of a verify pass with {valid} restorable positions"
            )));
        }
        let g: &Gpu = &self.m.gpu;
        let s = self.m.shape;
        let (cl, sl) = (s.conv_state_len() as u64 * 4, s.ssm_state_len() as u64 * 4);
        let mut rec = g.recorder();
        for st in &self.states {
            if let LayerState::Mamba {
                ring,
                ssm,
                ring_snap,
                ssm_snap,
            } = st
            {
                rec.copy(ring_snap, j as u64 * cl, ring, 0, cl);
                rec.copy(ssm_snap, j as u64 * sl, ssm, 0, sl);
            }
        }
        rec.submit(None)?;
        self.pos = pos0 + j + 1;
        Ok(())
    }

    /// One pass of at most `PASS_MAX` positions (already checked) from the current position.
    fn pass(
        &mut self,
        input: PassInput<'_>,
        snap: bool,
        want_argmax: bool,
        traced: bool,
    ) -> Result<PassOutput> {
        let m = self.m;
        let (g, k): (&Gpu, &NemotronKernels) = (&m.gpu, &m.kern);
        let c = &m.config;
        let hidu = c.hidden_size;
        let n = input.len(hidu) as u32;
        check_n(n)?;
        if snap && n > VERIFY_MAX {
            return Err(Error::Invalid(format!(
                "a snapshotting pass of {n} positions"
            )));
        }
        let hid = hidu as u32;
        let s = m.shape;
        let eps = c.layer_norm_epsilon as f32;
        let a = &c.attention;
        let e = &c.moe;
        let (qw, kvw) = (
            (a.num_heads * a.head_dim) as u32,
            (a.num_kv_heads * a.head_dim) as u32,
        );
        let rows = s.in_proj_rows();
        let split = n <= SPLIT_MAX;
        let embeds = matches!(input, PassInput::Embeds(_));
        let key = (embeds as usize) | (split as usize) << 1 | (snap as usize) << 2;
        let sc = &self.s;
        let states = &self.states;
        let pos = self.pos;
        match input {
            PassInput::Tokens(t) => g.write(&sc.ids, 0, bytemuck::cast_slice(t)),
            PassInput::Embeds(rows) => g.write(&sc.h, 0, bytemuck::cast_slice(rows)),
        }
        // One cache per submission of this kind of pass (see `caches`).
        let mut segs = self.caches[key].iter_mut();
        let no_cache =
            || Error::Invalid("a pass with more submissions than its context planned".into());
        let mut rec = g.recorder_cached(segs.next().ok_or_else(no_cache)?);
        rec.stage("nemotron");
        let mut r = &mut rec;
        if !embeds {
            k.embed(r, n, &sc.ids, 0, &m.emb, c.vocab_size as u32, hid, &sc.h)?;
        }
        let plain = LinearOps::default();
        let relu2 = LinearOps {
            relu2: true,
            accumulate: false,
        };
        let apply = |r: &mut Recorder, x: RowsF32, l: &Lin, y: RowsF32, ops: LinearOps| {
            k.linear(r, x, n, &l.w, l.b.as_ref(), y, ops)
        };
        let tk = e.top_k as u32;
        let layer_bytes = (PASS_MAX * hid) as u64 * 4;
        let row_bytes = (n * hid) as u64 * 4;
        // The residual add of the previous layer's output + this layer's norm; after a MoE
        // layer its routed sum is folded in there.
        let add_norm = |r: &mut Recorder, first: bool, after_moe: bool, w: &Buffer| -> Result<()> {
            if after_moe {
                k.add_moe_rmsnorm(
                    r, &sc.h, &sc.out, &sc.wts, &sc.eo, tk, w, &sc.x, n, hid, eps,
                )
            } else {
                k.add_rmsnorm(r, &sc.h, (!first).then_some(&sc.out), w, &sc.x, n, hid, eps)
            }
        };
        let mut after_moe = false;
        for (i, (layer, st)) in m.layers.iter().zip(states).enumerate() {
            add_norm(r, i == 0, after_moe, &m.norms[i])?;
            if traced && i > 0 {
                r.copy(&sc.h, 0, &sc.trace, (i as u64 - 1) * layer_bytes, row_bytes);
            }
            // With a latent projection the routed sum is projected back inside the layer.
            after_moe = matches!(layer, LayerWeights::Moe { latent: None, .. });
            let x = RowsF32::new(&sc.x, hid);
            let out = RowsF32::new(&sc.out, hid);
            match (layer, st) {
                (
                    LayerWeights::Mamba {
                        in_proj,
                        out_proj,
                        conv_w,
                        conv_b,
                        par,
                        norm,
                    },
                    LayerState::Mamba {
                        ring,
                        ssm,
                        ring_snap,
                        ssm_snap,
                    },
                ) => {
                    apply(r, x, in_proj, RowsF32::new(&sc.proj, rows), plain)?;
                    k.mamba_conv(
                        r,
                        &s,
                        n,
                        &sc.proj,
                        s.inner(),
                        rows,
                        conv_w,
                        conv_b.as_ref(),
                        ring,
                        &sc.xbc,
                        snap.then_some(ring_snap),
                    )?;
                    k.mamba_scan(
                        r,
                        &s,
                        n,
                        &sc.proj,
                        s.inner() + s.conv_dim(),
                        rows,
                        &sc.xbc,
                        par,
                        m.dt,
                        ssm,
                        &sc.y,
                        snap.then_some(ssm_snap),
                    )?;
                    k.gated_norm(r, &s, n, &sc.y, &sc.proj, 0, rows, norm, eps)?;
                    apply(r, RowsF32::new(&sc.y, s.inner()), out_proj, out, plain)?;
                }
                (LayerWeights::Attention { q, k: kp, v, o }, LayerState::Attention { kc, vc }) => {
                    apply(r, x, q, RowsF32::new(&sc.q, qw), plain)?;
                    // K and V straight into the cache rows of this pass.
                    apply(r, x, kp, RowsF32::at(kc, pos * kvw, kvw), plain)?;
                    apply(r, x, v, RowsF32::at(vc, pos * kvw, kvw), plain)?;
                    let sh = GqaShape {
                        n,
                        pos0: pos,
                        heads: a.num_heads as u32,
                        kv_heads: a.num_kv_heads as u32,
                        head_dim: a.head_dim as u32,
                    };
                    let (qr, ar) = (RowsF32::new(&sc.q, qw), RowsF32::new(&sc.att, qw));
                    if split {
                        k.gqa_split(r, &sh, qr, kc, vc, ar, &sc.part, SPLIT_CHUNK)?;
                    } else {
                        k.gqa(r, &sh, qr, kc, vc, ar)?;
                    }
                    apply(r, RowsF32::new(&sc.att, qw), o, out, plain)?;
                }
                (
                    LayerWeights::Moe {
                        gate,
                        bias,
                        experts,
                        sup,
                        sdown,
                        latent,
                    },
                    _,
                ) => {
                    let (ne, inter) = (e.n_routed_experts as u32, e.intermediate_size as u32);
                    k.linear(r, x, n, gate, None, RowsF32::new(&sc.rl, ne), plain)?;
                    k.route(r, e, n, &sc.rl, bias, &sc.sel, &sc.wts)?;
                    k.expert_lists(r, n, ne, tk, &sc.sel, &sc.list, &sc.cnt, PASS_MAX)?;
                    let lists = ExpertLists {
                        list: &sc.list,
                        cnt: &sc.cnt,
                        cap: PASS_MAX,
                        top_k: tk,
                    };
                    let hmid = RowsF32::new(&sc.hmid, inter);
                    let io = e.expert_io(hid as usize) as u32;
                    let eo = RowsF32::new(&sc.eo, io);
                    // The experts' input: the normed rows, or their latent projection.
                    let xin = match latent {
                        Some((fc1, _)) => {
                            apply(r, x, fc1, RowsF32::new(&sc.lat_in, io), plain)?;
                            RowsF32::new(&sc.lat_in, io)
                        }
                        None => x,
                    };
                    match experts {
                        Experts::F32 { up, down } => {
                            k.expert_linear(r, &lists, n, xin, tk, up, hmid, relu2)?;
                            k.expert_linear(r, &lists, n, hmid, 1, down, eo, plain)?;
                        }
                        Experts::Quant { up, down, .. } => {
                            k.expert_linear_quant(r, &lists, n, xin, tk, up, hmid, relu2)?;
                            k.expert_linear_quant(r, &lists, n, hmid, 1, down, eo, plain)?;
                        }
                    }
                    let si = e.shared_intermediate_size as u32;
                    apply(r, x, sup, RowsF32::new(&sc.mid, si), relu2)?;
                    apply(r, RowsF32::new(&sc.mid, si), sdown, out, plain)?;
                    if let Some((_, fc2)) = latent {
                        // Σ weights · expert rows in the latent width, then back to the
                        // hidden width on top of the shared expert's output.
                        k.moe_combine(r, n, io, tk, &sc.wts, &sc.eo, &sc.lat_sum, false)?;
                        let add = LinearOps { relu2: false, accumulate: true };
                        apply(r, RowsF32::new(&sc.lat_sum, io), fc2, out, add)?;
                    }
                    if let Experts::Quant { host, .. } = experts {
                        if host.iter().any(Option::is_some) {
                            // The experts kept on the host: finish this submission, compute
                            // their entries from the layer input, write them into the expert
                            // outputs, and go on in the next submission.
                            rec.submit(None)?;
                            host_rows(g, sc, host, n as usize, tk as usize, hidu)?;
                            rec = g.recorder_cached(segs.next().ok_or_else(no_cache)?);
                            rec.stage("nemotron");
                            r = &mut rec;
                        }
                    }
                }
                (LayerWeights::Mlp { up, down }, _) => {
                    let mi = c.mlp_intermediate_size as u32;
                    apply(r, x, up, RowsF32::new(&sc.mid, mi), relu2)?;
                    apply(r, RowsF32::new(&sc.mid, mi), down, out, plain)?;
                }
                _ => return Err(Error::Invalid("layer weights and state disagree".into())),
            }
        }
        let nl = m.layers.len() as u64;
        add_norm(r, false, after_moe, &m.norm_f)?;
        if traced {
            r.copy(&sc.h, 0, &sc.trace, (nl - 1) * layer_bytes, row_bytes);
            r.copy(&sc.x, 0, &sc.trace, nl * layer_bytes, row_bytes);
        }
        let v = c.vocab_size as u32;
        k.linear(
            r,
            RowsF32::new(&sc.x, hid),
            n,
            &m.head,
            None,
            RowsF32::new(&sc.logits, v),
            plain,
        )?;
        if want_argmax {
            k.argmax(r, n, v, RowsF32::new(&sc.logits, v), &sc.top)?;
        }
        rec.submit(None)?;
        // A pass overwrites KV rows from `pos` on: verify slots that need them are gone.
        if let Some((p0, valid)) = self.verify.as_mut() {
            *valid = (*valid).min(pos.saturating_sub(*p0));
        }
        self.pos = pos + n;
        let logits = g.read_f32(&sc.logits, 0, (n * v) as usize)?;
        let top = if want_argmax {
            Some(g.read_u32(&sc.top, 0, n as usize)?)
        } else {
            None
        };
        let trace = if traced {
            let rd =
                |l: u64| g.read_f32(&sc.trace, l * (PASS_MAX * hid) as u64, (n * hid) as usize);
            Some(PassTrace {
                layers: (0..nl).map(rd).collect::<Result<Vec<_>>>()?,
                final_norm: rd(nl)?,
            })
        } else {
            None
        };
        Ok((logits, top, trace))
    }
}

/// The entries of a pass that chose an expert kept on the host: read back the router's
/// choices and the MoE layer's input, run each such expert once over its entries (the same
/// quantized weights, dequantized), write the rows into the expert outputs.
fn host_rows(
    g: &Gpu,
    sc: &Scratch,
    host: &[Option<(QuantMatrix, QuantMatrix)>],
    n: usize,
    k: usize,
    hid: usize,
) -> Result<()> {
    let sel = g.read_u32(&sc.sel, 0, n * k)?;
    let x = g.read_f32(&sc.x, 0, n * hid)?;
    let mut by_expert: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (j, &e) in sel.iter().enumerate() {
        if host.get(e as usize).is_some_and(Option::is_some) {
            by_expert.entry(e as usize).or_default().push(j);
        }
    }
    for (e, entries) in by_expert {
        let Some((up, down)) = &host[e] else { continue };
        let mut xb = Vec::with_capacity(entries.len() * hid);
        for &j in &entries {
            let t = j / k;
            xb.extend_from_slice(&x[t * hid..(t + 1) * hid]);
        }
        let y = host_expert(up, down, &xb, entries.len())?;
        for (i, &j) in entries.iter().enumerate() {
            g.write(
                &sc.eo,
                (j * hid * 4) as u64,
                bytemuck::cast_slice(&y[i * hid..(i + 1) * hid]),
            );
        }
    }
    Ok(())
}

fn check_n(n: u32) -> Result<()> {
    if n == 0 || n > PASS_MAX {
        return Err(Error::Invalid(format!(
            "a pass of {n} positions (1 to {PASS_MAX})"
        )));
    }
    Ok(())
}

/// Greedy decoding with speculative drafts: `draft(context_tokens, k)` proposes up to `k`
/// next tokens; each round verifies `[last, drafts...]` in one pass, keeps the drafts that
/// equal the model's greedy choice plus the model's own next token, and rolls back past the
/// first wrong draft. Returns exactly `steps` tokens, the same as plain greedy decoding.
/// `last_logits` are the logits at the last position already in `ctx`.
pub fn speculative_greedy(
    ctx: &mut NemotronContext<'_>,
    last_logits: &[f32],
    steps: usize,
    mut draft: impl FnMut(&[u32], usize) -> Vec<u32>,
) -> Result<Vec<u32>> {
    let mut out: Vec<u32> = Vec::with_capacity(steps);
    if steps == 0 {
        return Ok(out);
    }
    // The first token comes from the prompt's logits.
    let mut next = argmax(last_logits);
    while out.len() < steps {
        out.push(next);
        if out.len() == steps {
            break;
        }
        let want = (steps - out.len()).min(VERIFY_MAX as usize - 1);
        let mut d = draft(&out, want);
        d.truncate(want);
        let mut batch = vec![next];
        batch.extend(&d);
        let v = ctx.verify(&batch)?;
        // Position i's argmax is the model's token after batch[..=i].
        let mut accepted = 0;
        while accepted < d.len() && v.argmax[accepted] == d[accepted] {
            accepted += 1;
        }
        for &t in &d[..accepted] {
            if out.len() < steps {
                out.push(t);
            }
        }
        next = v.argmax[accepted];
        if accepted < d.len() {
            ctx.rollback(accepted as u32)?;
        }
    }
    out.truncate(steps);
    Ok(out)
}

/// The index of the largest value (ties to the lower index).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0usize;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "quant_tests.rs"]
mod quant_tests;
