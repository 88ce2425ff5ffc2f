//! A plain CPU Nemotron-H frame: f32 storage, f64 sums, one [`Context`] per sequence.
//!
//! This is what the GPU frame is held to, and it is itself held to Hugging Face
//! transformers (`NemotronHForCausalLM`, reference non-fused Mamba-2 path, eager MoE) by
//! the `nemotron-h-tiny` fixture. It follows transformers operation by operation:
//!
//! - block: `h += mixer(RMSNorm(h))`; after the last block the final RMSNorm and LM head;
//! - Mamba-2: `in_proj` → `[z | xBC | dt]`; depthwise causal conv over xBC (kernel K, a
//!   ring of the K−1 previous inputs) + bias, SiLU; `dt = softplus(dt + dt_bias)` clamped
//!   (see [`DtClamp`]); `A = −exp(A_log)`; per head h (group `h / (heads/groups)` for B
//!   and C): `s = exp(dt·A)·s + dt·B ⊗ x`, `y = s·C + D·x`; gated group RMSNorm
//!   `w · n(y·SiLU(z))` with the mean square per group of `inner / n_groups` channels
//!   (transformers' `Zamba2RMSNormGated`, gate applied *before* the norm); `out_proj`;
//! - attention: GQA (query head h reads KV head `h / (heads/kv_heads)`), no positional
//!   encoding, scale `head_dim^-½`, causal over a KV cache;
//! - MoE: router logits `x·Wᵀ`, scores `sigmoid`; experts chosen by top-k of
//!   `score + e_score_correction_bias` (within the best `topk_group` of `n_group` groups,
//!   a group scored by the sum of its two best); weights = the chosen plain scores,
//!   divided by their sum (+1e-20) when `norm_topk_prob`, times `routed_scaling_factor`;
//!   each expert `down(relu²(up(x)))` (inside `fc1/fc2_latent_proj` when the config has a
//!   latent size); plus the shared expert `down(relu²(up(x)))` of the block input;
//! - dense MLP: `down(relu²(up(x)))`.
//!
//! Every position's arithmetic is the same whatever the chunking: `forward` over 420
//! positions, over passes of 64, or one position at a time give the same bits. So
//! prefill and decode are one code path here ([`Context::forward`]); the tests check
//! that the carried state (conv ring, SSM state, KV cache) makes them agree.
//!
//! State layouts (the seed's, which the GPU frame keeps so snapshots compare directly):
//! - conv ring `[K−1][conv_dim]`, oldest input first;
//! - SSM state `[head][state][head_dim]` (element `(h·N + n)·P + p`);
//! - KV cache `[position][kv_head][head_dim]` for K and for V.

use std::path::Path;

use crate::models::nemotron_h::{
    Checkpoint, Config, ExpertProj, LayerKind, MambaConfig, MoeConfig,
};
use crate::reference::ops::{dot_f64, linear};
use crate::{Error, Result};

/// How dt is clamped after the softplus.
///
/// transformers' reference (non-fused) Mamba-2 path — the one the fixture was made with —
/// clamps from below by `time_step_min` (`torch.clamp(dt, self.time_step_min)`), in prefill
/// and in cached steps; the fused CUDA kernels clamp to `time_step_limit` instead (which
/// real configs set to `(0, inf)`, i.e. no clamp).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DtClamp {
    /// `max(dt, time_step_min)` (transformers' torch path). The default.
    TimeStepMin,
    /// `clamp(dt, time_step_limit.0, time_step_limit.1)` (the fused kernels).
    TimeStepLimit,
    /// No clamp.
    None,
}

impl DtClamp {
    /// The (lo, hi) bounds this clamp applies for `m`.
    pub fn bounds(self, m: &MambaConfig) -> (f64, f64) {
        match self {
            DtClamp::TimeStepMin => (m.time_step_min, f64::INFINITY),
            DtClamp::TimeStepLimit => m.time_step_limit,
            DtClamp::None => (f64::NEG_INFINITY, f64::INFINITY),
        }
    }
}

/// A linear layer `y = x·Wᵀ + b`, W row-major `[rows][cols]`.
#[derive(Clone, Debug)]
pub struct Linear {
    pub w: Vec<f32>,
    pub b: Option<Vec<f32>>,
    pub rows: usize,
    pub cols: usize,
}

impl Linear {
    fn load(ck: &Checkpoint, weight: &str, rows: usize, cols: usize, bias: bool) -> Result<Linear> {
        let w = ck.f32(weight, &[rows, cols])?;
        let b = if bias {
            let name = format!("{}.bias", weight.strip_suffix(".weight").unwrap_or(weight));
            Some(ck.f32(&name, &[rows])?)
        } else {
            None
        };
        Ok(Linear { w, b, rows, cols })
    }

    /// `n` rows of `cols` → `n` rows of `rows` (f64 sums, f32 out).
    pub fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        linear(x, n, self.cols, &self.w, self.rows, self.b.as_deref())
    }
}

/// `down(relu²(up(x)))`: the dense MLP, a routed expert and the shared expert.
#[derive(Clone, Debug)]
pub struct Relu2Mlp {
    pub up: Linear,
    pub down: Linear,
}

impl Relu2Mlp {
    pub fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut a = self.up.apply(x, n);
        a.iter_mut().for_each(|v| *v = relu2(*v));
        self.down.apply(&a, n)
    }
}

#[derive(Clone, Debug)]
pub struct MambaWeights {
    pub in_proj: Linear,
    pub out_proj: Linear,
    /// `[conv_dim][K]` (the checkpoint's `[conv_dim, 1, K]`).
    pub conv_w: Vec<f32>,
    pub conv_b: Option<Vec<f32>>,
    pub a_log: Vec<f32>,
    pub d: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// Gated group RMSNorm weight `[inner]`.
    pub norm: Vec<f32>,
}

#[derive(Clone, Debug)]
pub struct AttentionWeights {
    pub q: Linear,
    pub k: Linear,
    pub v: Linear,
    pub o: Linear,
}

#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// Router `[n_routed_experts][hidden]`.
    pub gate: Vec<f32>,
    /// `e_score_correction_bias` `[n_routed_experts]` (choosing only).
    pub bias: Vec<f32>,
    pub experts: Vec<Relu2Mlp>,
    pub shared: Relu2Mlp,
    /// `fc1_latent_proj`, `fc2_latent_proj` when the config has `moe_latent_size`.
    pub latent: Option<(Linear, Linear)>,
}

#[derive(Clone, Debug)]
pub enum Mixer {
    Mamba(MambaWeights),
    Attention(AttentionWeights),
    Moe(MoeWeights),
    Mlp(Relu2Mlp),
}

#[derive(Clone, Debug)]
pub struct Layer {
    /// The block's pre-mixer RMSNorm weight `[hidden]`.
    pub norm: Vec<f32>,
    pub mixer: Mixer,
}

/// The whole model as f32 (bf16/f16 widened exactly).
#[derive(Clone, Debug)]
pub struct Model {
    pub config: Config,
    /// `[vocab][hidden]`.
    pub embeddings: Vec<f32>,
    pub layers: Vec<Layer>,
    pub norm_f: Vec<f32>,
    /// `[vocab][hidden]`; `None` when tied to the embeddings.
    pub lm_head: Option<Vec<f32>>,
    pub dt_clamp: DtClamp,
}

impl Model {
    /// Opens and validates the checkpoint in `dir` and widens every weight to f32.
    pub fn load(dir: &Path) -> Result<Model> {
        Model::from_checkpoint(&Checkpoint::open(dir)?)
    }

    pub fn from_checkpoint(ck: &Checkpoint) -> Result<Model> {
        let c = &ck.config;
        let h = c.hidden_size;
        let embeddings = ck.f32(ck.embeddings_name(), &[c.vocab_size, h])?;
        let norm_f = ck.f32(ck.final_norm_name(), &[h])?;
        let lm_head = if ck.lm_head_name() == ck.embeddings_name() {
            None
        } else {
            Some(ck.f32(ck.lm_head_name(), &[c.vocab_size, h])?)
        };
        let mut layers = Vec::with_capacity(c.layers.len());
        for (i, &kind) in c.layers.iter().enumerate() {
            let n = |s: &str| ck.layer_name(i, s);
            let norm = ck.f32(&n("norm.weight"), &[h])?;
            let mixer = match kind {
                LayerKind::Mamba => {
                    let m = &c.mamba;
                    Mixer::Mamba(MambaWeights {
                        in_proj: Linear::load(
                            ck,
                            &n("mixer.in_proj.weight"),
                            m.in_proj_rows(),
                            h,
                            m.proj_bias,
                        )?,
                        out_proj: Linear::load(
                            ck,
                            &n("mixer.out_proj.weight"),
                            h,
                            m.inner(),
                            m.proj_bias,
                        )?,
                        conv_w: ck
                            .f32(&n("mixer.conv1d.weight"), &[m.conv_dim(), 1, m.conv_kernel])?,
                        conv_b: if m.conv_bias {
                            Some(ck.f32(&n("mixer.conv1d.bias"), &[m.conv_dim()])?)
                        } else {
                            None
                        },
                        a_log: ck.f32(&n("mixer.A_log"), &[m.num_heads])?,
                        d: ck.f32(&n("mixer.D"), &[m.num_heads])?,
                        dt_bias: ck.f32(&n("mixer.dt_bias"), &[m.num_heads])?,
                        norm: ck.f32(&n("mixer.norm.weight"), &[m.inner()])?,
                    })
                }
                LayerKind::Attention => {
                    let a = &c.attention;
                    let (qw, kvw) = (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim);
                    Mixer::Attention(AttentionWeights {
                        q: Linear::load(ck, &n("mixer.q_proj.weight"), qw, h, false)?,
                        k: Linear::load(ck, &n("mixer.k_proj.weight"), kvw, h, false)?,
                        v: Linear::load(ck, &n("mixer.v_proj.weight"), kvw, h, false)?,
                        o: Linear::load(ck, &n("mixer.o_proj.weight"), h, qw, false)?,
                    })
                }
                LayerKind::Mlp => Mixer::Mlp(Relu2Mlp {
                    up: Linear::load(
                        ck,
                        &n("mixer.up_proj.weight"),
                        c.mlp_intermediate_size,
                        h,
                        c.mlp_bias,
                    )?,
                    down: Linear::load(
                        ck,
                        &n("mixer.down_proj.weight"),
                        h,
                        c.mlp_intermediate_size,
                        c.mlp_bias,
                    )?,
                }),
                LayerKind::Moe => {
                    let e = &c.moe;
                    let io = e.expert_io(h);
                    let inter = e.intermediate_size;
                    let mut experts = Vec::with_capacity(e.n_routed_experts);
                    for x in 0..e.n_routed_experts {
                        let up = ck.expert(i, x, ExpertProj::Up)?;
                        let down = ck.expert(i, x, ExpertProj::Down)?;
                        experts.push(Relu2Mlp {
                            up: Linear {
                                w: up.to_f32(),
                                b: None,
                                rows: inter,
                                cols: io,
                            },
                            down: Linear {
                                w: down.to_f32(),
                                b: None,
                                rows: io,
                                cols: inter,
                            },
                        });
                    }
                    let s = e.shared_intermediate_size;
                    let latent = match e.latent_size {
                        Some(l) => Some((
                            Linear::load(ck, &n("mixer.fc1_latent_proj.weight"), l, h, c.mlp_bias)?,
                            Linear::load(ck, &n("mixer.fc2_latent_proj.weight"), h, l, c.mlp_bias)?,
                        )),
                        None => None,
                    };
                    Mixer::Moe(MoeWeights {
                        gate: ck.f32(&n("mixer.gate.weight"), &[e.n_routed_experts, h])?,
                        bias: ck.f32(
                            &n("mixer.gate.e_score_correction_bias"),
                            &[e.n_routed_experts],
                        )?,
                        experts,
                        shared: Relu2Mlp {
                            up: Linear::load(
                                ck,
                                &n("mixer.shared_experts.up_proj.weight"),
                                s,
                                h,
                                c.mlp_bias,
                            )?,
                            down: Linear::load(
                                ck,
                                &n("mixer.shared_experts.down_proj.weight"),
                                h,
                                s,
                                c.mlp_bias,
                            )?,
                        },
                        latent,
                    })
                }
            };
            layers.push(Layer { norm, mixer });
        }
        Ok(Model {
            config: c.clone(),
            embeddings,
            layers,
            norm_f,
            lm_head,
            dt_clamp: DtClamp::TimeStepMin,
        })
    }

    /// A fresh context (empty state) for one sequence.
    pub fn context(&self) -> Context<'_> {
        let c = &self.config;
        let states = c
            .layers
            .iter()
            .map(|k| match k {
                LayerKind::Mamba => LayerState::Mamba {
                    conv: vec![0.0; c.mamba.conv_state_len()],
                    ssm: vec![0.0; c.mamba.ssm_state_len()],
                },
                LayerKind::Attention => LayerState::Attention {
                    k: Vec::new(),
                    v: Vec::new(),
                },
                LayerKind::Moe | LayerKind::Mlp => LayerState::Stateless,
            })
            .collect();
        Context {
            model: self,
            pos: 0,
            states,
        }
    }

    /// The embedding rows of `tokens`, `[n][hidden]` (what `inputs_embeds` replaces).
    pub fn embed(&self, tokens: &[u32]) -> Result<Vec<f32>> {
        let h = self.config.hidden_size;
        let mut out = Vec::with_capacity(tokens.len() * h);
        for &t in tokens {
            let t = t as usize;
            if t >= self.config.vocab_size {
                return Err(Error::Invalid(format!(
                    "token id {t} is outside the vocabulary ({} tokens)",
                    self.config.vocab_size
                )));
            }
            out.extend_from_slice(&self.embeddings[t * h..(t + 1) * h]);
        }
        Ok(out)
    }

    fn lm_head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embeddings)
    }
}

/// One layer's recurrent state.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerState {
    /// Conv ring `[K−1][conv_dim]` (oldest first) and SSM state `[head][state][head_dim]`.
    Mamba { conv: Vec<f32>, ssm: Vec<f32> },
    /// KV cache `[position][kv_head][head_dim]`.
    Attention { k: Vec<f32>, v: Vec<f32> },
    /// MoE and MLP layers carry nothing.
    Stateless,
}

/// What a forward pass reads: token ids, or embedding rows `[n][hidden]` (`inputs_embeds`).
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Tokens(&'a [u32]),
    Embeds(&'a [f32]),
}

/// The hidden states of one pass, each `[n][hidden]`, for finding which layer diverges.
/// transformers' `output_hidden_states` is `[embeddings, layers[0..L-1], final_norm]`.
#[derive(Clone, Debug)]
pub struct Trace {
    /// The block input of layer 0.
    pub embeddings: Vec<f32>,
    /// Each layer's output (the residual stream after it).
    pub layers: Vec<Vec<f32>>,
    /// After the final RMSNorm (what the LM head reads).
    pub final_norm: Vec<f32>,
}

/// One sequence: position and every layer's state. `Clone` is a snapshot.
#[derive(Clone, Debug)]
pub struct Context<'m> {
    model: &'m Model,
    pos: usize,
    states: Vec<LayerState>,
}

impl<'m> Context<'m> {
    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Positions consumed so far (the KV length).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// Layer `i`'s state.
    pub fn state(&self, i: usize) -> &LayerState {
        &self.states[i]
    }

    /// Runs `input` (n positions) from the current position: logits `[n][vocab]`.
    pub fn forward(&mut self, input: Input<'_>) -> Result<Vec<f32>> {
        self.run(input, false).map(|(l, _)| l)
    }

    /// As [`forward`](Self::forward), also returning every layer's hidden states.
    pub fn forward_traced(&mut self, input: Input<'_>) -> Result<(Vec<f32>, Trace)> {
        self.run(input, true).map(|(l, t)| (l, t.expect("traced")))
    }

    /// Prefill with token ids: logits at every position.
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.forward(Input::Tokens(tokens))
    }

    /// Prefill with embedding rows (`inputs_embeds`): logits at every position.
    pub fn prefill_embeds(&mut self, embeds: &[f32]) -> Result<Vec<f32>> {
        self.forward(Input::Embeds(embeds))
    }

    /// One decode step: the logits after `token`.
    pub fn step(&mut self, token: u32) -> Result<Vec<f32>> {
        self.forward(Input::Tokens(&[token]))
    }

    /// One decode step from an embedding row.
    pub fn step_embed(&mut self, embed: &[f32]) -> Result<Vec<f32>> {
        self.forward(Input::Embeds(embed))
    }

    fn run(&mut self, input: Input<'_>, trace: bool) -> Result<(Vec<f32>, Option<Trace>)> {
        let model = self.model;
        let c = &model.config;
        let hd = c.hidden_size;
        let mut h = match input {
            Input::Tokens(t) => model.embed(t)?,
            Input::Embeds(e) => {
                if e.len() % hd != 0 {
                    return Err(Error::Invalid(format!(
                        "inputs_embeds has {} values, not a whole number of rows of {hd}",
                        e.len()
                    )));
                }
                e.to_vec()
            }
        };
        let n = h.len() / hd;
        if n == 0 {
            return Ok((Vec::new(), None));
        }
        let pos0 = self.pos;
        let eps = c.layer_norm_epsilon;
        let mut tr = trace.then(|| Trace {
            embeddings: h.clone(),
            layers: Vec::with_capacity(model.layers.len()),
            final_norm: Vec::new(),
        });
        for (layer, state) in model.layers.iter().zip(self.states.iter_mut()) {
            let x = rms_norm(&h, hd, &layer.norm, eps);
            let out = match (&layer.mixer, state) {
                (Mixer::Mamba(w), LayerState::Mamba { conv, ssm }) => {
                    mamba(&c.mamba, model.dt_clamp, eps, w, conv, ssm, &x, n)
                }
                (Mixer::Attention(w), LayerState::Attention { k, v }) => {
                    attention(c, w, k, v, &x, n, pos0)
                }
                (Mixer::Moe(w), LayerState::Stateless) => moe(&c.moe, hd, w, &x, n),
                (Mixer::Mlp(w), LayerState::Stateless) => w.apply(&x, n),
                _ => unreachable!("layer state built from the same config"),
            };
            for (a, b) in h.iter_mut().zip(&out) {
                *a += *b;
            }
            if let Some(t) = tr.as_mut() {
                t.layers.push(h.clone());
            }
        }
        let normed = rms_norm(&h, hd, &model.norm_f, eps);
        let logits = linear(&normed, n, hd, model.lm_head(), c.vocab_size, None);
        if let Some(t) = tr.as_mut() {
            t.final_norm = normed;
        }
        self.pos += n;
        Ok((logits, tr))
    }
}

/// relu(x)².
#[inline]
pub fn relu2(x: f32) -> f32 {
    let r = x.max(0.0);
    r * r
}

#[inline]
fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// torch's softplus (beta 1, threshold 20: linear above it).
#[inline]
pub fn softplus(x: f64) -> f64 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// RMSNorm of each row of `dim`: `w · x / sqrt(mean(x²) + eps)`, mean in f64.
pub fn rms_norm(x: &[f32], dim: usize, w: &[f32], eps: f64) -> Vec<f32> {
    assert_eq!(w.len(), dim);
    let mut out = vec![0f32; x.len()];
    for (xr, orow) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let inv = 1.0 / (dot_f64(xr, xr) / dim as f64 + eps).sqrt();
        for ((o, &v), &g) in orow.iter_mut().zip(xr).zip(w) {
            *o = (g as f64 * (v as f64 * inv)) as f32;
        }
    }
    out
}

/// One position of the depthwise causal conv + SiLU over `conv_dim` channels: reads the
/// ring `[K−1][conv_dim]` and the new input `x`, writes `out`, advances the ring.
pub fn conv_step(
    ring: &mut [f32],
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    out: &mut [f32],
) {
    let cdim = x.len();
    debug_assert_eq!(ring.len(), (k - 1) * cdim);
    for c in 0..cdim {
        let wc = &w[c * k..(c + 1) * k];
        let mut acc = bias.map_or(0.0, |b| b[c] as f64);
        for j in 0..k - 1 {
            acc += wc[j] as f64 * ring[j * cdim + c] as f64;
        }
        acc += wc[k - 1] as f64 * x[c] as f64;
        for j in 0..k.saturating_sub(2) {
            ring[j * cdim + c] = ring[(j + 1) * cdim + c];
        }
        if k > 1 {
            ring[(k - 2) * cdim + c] = x[c];
        }
        out[c] = silu(acc) as f32;
    }
}

/// The Mamba-2 mixer over `n` positions of normed input `x` `[n][hidden]`, advancing
/// `conv` and `ssm`. Returns `[n][hidden]`.
#[allow(clippy::too_many_arguments)]
pub fn mamba(
    m: &MambaConfig,
    clamp: DtClamp,
    eps: f64,
    w: &MambaWeights,
    conv: &mut [f32],
    ssm: &mut [f32],
    x: &[f32],
    n: usize,
) -> Vec<f32> {
    let (inner, cdim, nh, p, ns, ng) = (
        m.inner(),
        m.conv_dim(),
        m.num_heads,
        m.head_dim,
        m.state_size,
        m.n_groups,
    );
    let hpg = m.heads_per_group();
    let rows = m.in_proj_rows();
    let proj = w.in_proj.apply(x, n);
    let (lo, hi) = clamp.bounds(m);
    let a: Vec<f64> = w.a_log.iter().map(|&v| -(v as f64).exp()).collect();

    let mut xbc = vec![0f32; cdim];
    let mut y = vec![0f32; n * inner];
    let mut acc = vec![0f64; p];
    for t in 0..n {
        let pr = &proj[t * rows..(t + 1) * rows];
        conv_step(
            conv,
            &pr[inner..inner + cdim],
            &w.conv_w,
            w.conv_b.as_deref(),
            m.conv_kernel,
            &mut xbc,
        );
        let yt = &mut y[t * inner..(t + 1) * inner];
        for h in 0..nh {
            let g = h / hpg;
            let dt = softplus(pr[inner + cdim + h] as f64 + w.dt_bias[h] as f64)
                .max(lo)
                .min(hi);
            let da = (dt * a[h]).exp();
            let b = &xbc[inner + g * ns..inner + (g + 1) * ns];
            let cc = &xbc[inner + (ng + g) * ns..inner + (ng + g + 1) * ns];
            let xh = &xbc[h * p..(h + 1) * p];
            acc.iter_mut().for_each(|v| *v = 0.0);
            for k in 0..ns {
                let row = &mut ssm[(h * ns + k) * p..(h * ns + k + 1) * p];
                let db = dt * b[k] as f64;
                let ck = cc[k] as f64;
                for ((s, &xv), av) in row.iter_mut().zip(xh).zip(acc.iter_mut()) {
                    let v = (da * *s as f64 + db * xv as f64) as f32;
                    *s = v;
                    *av += v as f64 * ck;
                }
            }
            let dh = w.d[h] as f64;
            for ((o, &av), &xv) in yt[h * p..(h + 1) * p].iter_mut().zip(&acc).zip(xh) {
                *o = (av + dh * xv as f64) as f32;
            }
        }
        let z = &pr[..inner];
        gated_group_norm(yt, z, &w.norm, ng, eps);
    }
    w.out_proj.apply(&y, n)
}

/// transformers' `Zamba2RMSNormGated` (norm_before_gate = false) on one position, in
/// place: `v = y·SiLU(z)`, then per group of `len / groups` channels
/// `w · v / sqrt(mean(v²) + eps)`.
pub fn gated_group_norm(y: &mut [f32], z: &[f32], w: &[f32], groups: usize, eps: f64) {
    let gs = y.len() / groups;
    let mut v = vec![0f64; gs];
    for g in 0..groups {
        let r = g * gs..(g + 1) * gs;
        let mut ss = 0f64;
        for ((vi, &yi), &zi) in v.iter_mut().zip(&y[r.clone()]).zip(&z[r.clone()]) {
            *vi = yi as f64 * silu(zi as f64);
            ss += *vi * *vi;
        }
        let inv = 1.0 / (ss / gs as f64 + eps).sqrt();
        for ((o, &vi), &wi) in y[r.clone()].iter_mut().zip(&v).zip(&w[r]) {
            *o = (wi as f64 * (vi * inv)) as f32;
        }
    }
}

/// GQA self-attention over `n` positions from `pos0`, appending to the KV cache.
fn attention(
    c: &Config,
    w: &AttentionWeights,
    kc: &mut Vec<f32>,
    vc: &mut Vec<f32>,
    x: &[f32],
    n: usize,
    pos0: usize,
) -> Vec<f32> {
    let a = &c.attention;
    let q = w.q.apply(x, n);
    kc.extend_from_slice(&w.k.apply(x, n));
    vc.extend_from_slice(&w.v.apply(x, n));
    let out = gqa_attention(&q, kc, vc, n, pos0, a.num_heads, a.num_kv_heads, a.head_dim);
    w.o.apply(&out, n)
}

/// Causal GQA: `q` `[n][heads][d]` at positions `pos0..pos0+n`, caches `[len][kv][d]`
/// holding at least `pos0 + n` positions. Query head h reads KV head `h / (heads/kv)`;
/// scale `d^-½`; scores, softmax and sums in f64. Returns `[n][heads][d]`.
#[allow(clippy::too_many_arguments)]
pub fn gqa_attention(
    q: &[f32],
    kc: &[f32],
    vc: &[f32],
    n: usize,
    pos0: usize,
    heads: usize,
    kv: usize,
    d: usize,
) -> Vec<f32> {
    let rep = heads / kv;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; n * heads * d];
    let mut scores = vec![0f64; pos0 + n];
    let mut acc = vec![0f64; d];
    for t in 0..n {
        let npos = pos0 + t + 1;
        for h in 0..heads {
            let g = h / rep;
            let qh = &q[(t * heads + h) * d..(t * heads + h + 1) * d];
            let mut max = f64::NEG_INFINITY;
            for (j, s) in scores[..npos].iter_mut().enumerate() {
                *s = dot_f64(qh, &kc[(j * kv + g) * d..(j * kv + g + 1) * d]) * scale;
                max = max.max(*s);
            }
            let mut sum = 0f64;
            for s in &mut scores[..npos] {
                *s = (*s - max).exp();
                sum += *s;
            }
            acc.iter_mut().for_each(|v| *v = 0.0);
            for (j, &s) in scores[..npos].iter().enumerate() {
                let pj = s / sum;
                for (av, &vv) in acc
                    .iter_mut()
                    .zip(&vc[(j * kv + g) * d..(j * kv + g + 1) * d])
                {
                    *av += pj * vv as f64;
                }
            }
            for (o, &av) in out[(t * heads + h) * d..(t * heads + h + 1) * d]
                .iter_mut()
                .zip(&acc)
            {
                *o = av as f32;
            }
        }
    }
    out
}

/// The router of one position: from its logits `[E]` and `e_score_correction_bias`, the
/// chosen experts (best first, ties to the lower index) and their weights.
pub fn route(logits: &[f32], bias: &[f32], e: &MoeConfig) -> Vec<(usize, f32)> {
    let ne = e.n_routed_experts;
    let scores: Vec<f64> = logits
        .iter()
        .map(|&l| 1.0 / (1.0 + (-(l as f64)).exp()))
        .collect();
    let mut choice: Vec<f64> = scores
        .iter()
        .zip(bias)
        .map(|(&s, &b)| s + b as f64)
        .collect();
    if e.n_group > 1 {
        // Group-limited: a group scores the sum of its two best; only the best
        // `topk_group` groups stay eligible.
        let per = ne / e.n_group;
        let gscore: Vec<f64> = (0..e.n_group)
            .map(|g| {
                let mut v: Vec<f64> = choice[g * per..(g + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                v[0] + v[1]
            })
            .collect();
        let keep = top_indices(&gscore, e.topk_group);
        for g in 0..e.n_group {
            if !keep.contains(&g) {
                choice[g * per..(g + 1) * per]
                    .iter_mut()
                    .for_each(|v| *v = f64::NEG_INFINITY);
            }
        }
    }
    let chosen = top_indices(&choice, e.top_k);
    let sum: f64 = chosen.iter().map(|&i| scores[i]).sum();
    let den = if e.norm_topk_prob { sum + 1e-20 } else { 1.0 };
    chosen
        .into_iter()
        .map(|i| (i, (scores[i] / den * e.routed_scaling_factor) as f32))
        .collect()
}

/// Indices of the `k` largest values, largest first, ties to the lower index.
fn top_indices(v: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The MoE mixer over `n` positions of normed input `x`.
fn moe(e: &MoeConfig, hidden: usize, w: &MoeWeights, x: &[f32], n: usize) -> Vec<f32> {
    let ne = e.n_routed_experts;
    let logits = linear(x, n, hidden, &w.gate, ne, None);
    let routes: Vec<Vec<(usize, f32)>> = (0..n)
        .map(|t| route(&logits[t * ne..(t + 1) * ne], &w.bias, e))
        .collect();
    let xin = match &w.latent {
        Some((fc1, _)) => fc1.apply(x, n),
        None => x.to_vec(),
    };
    let io = e.expert_io(hidden);
    // Per expert, the positions that chose it, in one batch; sums per position in
    // expert order (as transformers' eager loop), f64.
    let mut sum = vec![0f64; n * io];
    for (ei, expert) in w.experts.iter().enumerate() {
        let picks: Vec<(usize, f32)> = routes
            .iter()
            .enumerate()
            .filter_map(|(t, r)| r.iter().find(|&&(i, _)| i == ei).map(|&(_, wt)| (t, wt)))
            .collect();
        if picks.is_empty() {
            continue;
        }
        let mut xb = Vec::with_capacity(picks.len() * io);
        for &(t, _) in &picks {
            xb.extend_from_slice(&xin[t * io..(t + 1) * io]);
        }
        let yb = expert.apply(&xb, picks.len());
        for (j, &(t, wt)) in picks.iter().enumerate() {
            for (s, &v) in sum[t * io..(t + 1) * io]
                .iter_mut()
                .zip(&yb[j * io..(j + 1) * io])
            {
                *s += wt as f64 * v as f64;
            }
        }
    }
    let routed: Vec<f32> = sum.iter().map(|&v| v as f32).collect();
    let routed = match &w.latent {
        Some((_, fc2)) => fc2.apply(&routed, n),
        None => routed,
    };
    let shared = w.shared.apply(x, n);
    routed.iter().zip(&shared).map(|(&r, &s)| r + s).collect()
}

/// The best token of a logits row and its margin over the second best.
pub fn argmax(logits: &[f32]) -> (usize, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    let mut second = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best.1 {
            second = best.1;
            best = (i, v);
        } else if v > second {
            second = v;
        }
    }
    (best.0, best.1 - second)
}

#[cfg(test)]
mod tests {
    //! The frame held to transformers' outputs on the `nemotron-h-tiny` fixture.

    use super::*;
    use crate::models::nemotron_h::fixture::{fixture_dir, max_row_rel, Expected};
    use std::sync::OnceLock;

    /// Bound on logits / hidden states: max over positions of ‖ours − ref‖ / ‖ref‖.
    const REL_BOUND: f64 = 1e-3;
    /// Greedy steps whose top-2 gap is below this may legitimately differ.
    const GAP_SKIP: f32 = 1e-3;

    fn model() -> &'static Model {
        static M: OnceLock<Model> = OnceLock::new();
        M.get_or_init(|| Model::load(&fixture_dir()).expect("the fixture checkpoint loads"))
    }

    fn expected() -> &'static Expected {
        static E: OnceLock<Expected> = OnceLock::new();
        E.get_or_init(Expected::load)
    }

    /// Greedy continuation through `step`, compared with `want`. Where ours differs, the
    /// reference's top-2 gap (`gaps`, or ours when the fixture has none) must be below
    /// `GAP_SKIP`; the fixture's token is fed on either way so later steps stay
    /// comparable. Returns (matches, skipped).
    fn greedy_check(
        ctx: &mut Context<'_>,
        last_logits: &[f32],
        want: &[u32],
        gaps: Option<&[f32]>,
        what: &str,
    ) -> (usize, usize) {
        let mut logits = last_logits.to_vec();
        let (mut same, mut skipped) = (0, 0);
        for (i, &w) in want.iter().enumerate() {
            let (ours, our_gap) = argmax(&logits);
            let gap = gaps.map_or(our_gap, |g| g[i]);
            if ours as u32 == w {
                same += 1;
            } else {
                assert!(
                    gap < GAP_SKIP,
                    "{what}: greedy step {i} picked {ours}, transformers {w} (gap {gap})"
                );
                skipped += 1;
            }
            if i + 1 < want.len() {
                logits = ctx.step(w).unwrap();
            }
        }
        (same, skipped)
    }

    #[test]
    fn nemotron_fixture_prompt_logits_hidden_and_greedy() {
        let (m, ex) = (model(), expected());
        let c = &m.config;
        let ids = ex.ids("prompt_ids");
        let n = ids.len();
        let (hd, v) = (c.hidden_size, c.vocab_size);
        let mut ctx = m.context();
        let (logits, tr) = ctx.forward_traced(Input::Tokens(&ids)).unwrap();

        let hs = ex.get("prompt_hidden_states");
        assert_eq!(hs.shape, [c.num_layers() + 1, n, hd]);
        let want = |i: usize| &hs.f32[i * n * hd..(i + 1) * n * hd];
        let mut report = Vec::new();
        let (e, _) = max_row_rel(&tr.embeddings, want(0), hd);
        report.push(("embeddings".to_string(), e));
        for l in 0..c.num_layers() - 1 {
            let (e, _) = max_row_rel(&tr.layers[l], want(l + 1), hd);
            report.push((format!("layer {l} ({:?})", c.layers[l]), e));
        }
        let (e, _) = max_row_rel(&tr.final_norm, want(c.num_layers()), hd);
        report.push((format!("layer {} + final norm", c.num_layers() - 1), e));
        let (le, lpos) = max_row_rel(&logits, ex.f32("prompt_logits"), v);
        for (name, e) in &report {
            eprintln!("prompt hidden {name:<28} max rel {e:.3e}");
        }
        eprintln!("prompt logits max rel {le:.3e} (position {lpos})");
        for (name, e) in &report {
            assert!(
                *e < REL_BOUND,
                "prompt hidden state {name}: max rel {e:.3e}"
            );
        }
        assert!(
            le < REL_BOUND,
            "prompt logits: max rel {le:.3e} at position {lpos}"
        );

        let gaps = ex.f32("greedy_top2_gap");
        let want_ids = ex.ids("greedy_ids");
        let (same, skipped) = greedy_check(
            &mut ctx,
            &logits[(n - 1) * v..],
            &want_ids,
            Some(gaps),
            "prompt",
        );
        eprintln!(
            "prompt greedy: {same}/{} equal, {skipped} skipped (gap < {GAP_SKIP})",
            want_ids.len()
        );
        assert_eq!(ctx.position(), n + want_ids.len() - 1);
    }

    #[test]
    fn nemotron_fixture_embeds_logits_and_greedy() {
        let (m, ex) = (model(), expected());
        let v = m.config.vocab_size;
        let embeds = ex.f32("embeds_input");
        let n = embeds.len() / m.config.hidden_size;
        // The text rows of the fixture's prompt are our own embeddings of its text ids.
        let text = ex.ids("embeds_text_ids");
        let ours = m.embed(&text).unwrap();
        assert_eq!(
            &embeds[(n - text.len()) * m.config.hidden_size..],
            &ours[..]
        );

        let mut ctx = m.context();
        let logits = ctx.prefill_embeds(embeds).unwrap();
        let (le, lpos) = max_row_rel(&logits, ex.f32("embeds_logits"), v);
        eprintln!("embeds logits max rel {le:.3e} (position {lpos})");
        assert!(
            le < REL_BOUND,
            "embeds logits: max rel {le:.3e} at position {lpos}"
        );
        let want_ids = ex.ids("embeds_greedy_ids");
        let (same, skipped) =
            greedy_check(&mut ctx, &logits[(n - 1) * v..], &want_ids, None, "embeds");
        eprintln!(
            "embeds greedy: {same}/{} equal, {skipped} skipped (our gap < {GAP_SKIP})",
            want_ids.len()
        );
    }

    #[test]
    fn nemotron_prefill_passes_and_steps_agree() {
        let (m, ex) = (model(), expected());
        let v = m.config.vocab_size;
        let ids = ex.ids("prompt_ids");
        let n = ids.len();
        let mut whole = m.context();
        let full = whole.prefill(&ids).unwrap();

        // Passes of up to 64 positions, as the GPU frame prefills.
        let mut passes = m.context();
        let mut chunked = Vec::with_capacity(full.len());
        for c in ids.chunks(64) {
            chunked.extend(passes.prefill(c).unwrap());
        }
        // One position at a time (the recurrent path).
        let mut steps = m.context();
        let mut stepped = Vec::with_capacity(full.len());
        for &t in &ids {
            stepped.extend(steps.step(t).unwrap());
        }
        let (e64, _) = max_row_rel(&chunked, &full, v);
        let (e1, _) = max_row_rel(&stepped, &full, v);
        eprintln!("prefill vs passes of 64: max rel {e64:.3e}; vs single steps: {e1:.3e}");
        assert!(
            e64 <= 1e-6 && e1 <= 1e-6,
            "passes {e64:.3e}, steps {e1:.3e}"
        );
        for i in 0..m.config.num_layers() {
            assert_eq!(
                whole.state(i),
                steps.state(i),
                "layer {i} state after {n} positions"
            );
            assert_eq!(
                whole.state(i),
                passes.state(i),
                "layer {i} state after {n} positions"
            );
        }
        // A snapshot (clone) taken mid-sequence continues exactly like the original.
        let mut a = m.context();
        a.prefill(&ids[..100]).unwrap();
        let mut b = a.clone();
        assert_eq!(a.step(ids[100]).unwrap(), b.step(ids[100]).unwrap());
    }

    #[test]
    fn nemotron_dt_clamp_policies() {
        // Which clamp transformers' path used shows in the logits: report all three.
        let ex = expected();
        let ids = ex.ids("prompt_ids");
        let v = model().config.vocab_size;
        for clamp in [DtClamp::TimeStepMin, DtClamp::TimeStepLimit, DtClamp::None] {
            let mut m = model().clone();
            m.dt_clamp = clamp;
            let logits = m.context().prefill(&ids).unwrap();
            let (e, _) = max_row_rel(&logits, ex.f32("prompt_logits"), v);
            eprintln!("dt clamp {clamp:?}: prompt logits max rel {e:.3e}");
        }
        // The clamp is wired in: with dt driven far below time_step_min it changes the output.
        let mut m = model().clone();
        for layer in &mut m.layers {
            if let Mixer::Mamba(w) = &mut layer.mixer {
                w.dt_bias.iter_mut().for_each(|b| *b = -30.0);
            }
        }
        let run = |m: &Model| m.context().prefill(&ids[..16]).unwrap();
        let clamped = run(&m);
        m.dt_clamp = DtClamp::None;
        assert_ne!(clamped, run(&m), "time_step_min clamp had no effect");
    }

    #[test]
    fn nemotron_bad_inputs_are_errors() {
        let m = model();
        let mut ctx = m.context();
        assert!(matches!(
            ctx.step(m.config.vocab_size as u32),
            Err(Error::Invalid(_))
        ));
        assert!(matches!(
            ctx.prefill_embeds(&[0.0; 3]),
            Err(Error::Invalid(_))
        ));
        assert_eq!(ctx.position(), 0);
        assert!(ctx.prefill(&[]).unwrap().is_empty());
    }

    #[test]
    fn nemotron_router_picks_on_biased_scores_and_weighs_plain_ones() {
        let e = MoeConfig {
            n_routed_experts: 4,
            top_k: 2,
            intermediate_size: 1,
            shared_intermediate_size: 1,
            n_shared_experts: 1,
            latent_size: None,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.0,
        };
        // Plain scores favour 0 and 1; the bias makes 2 and 3 the choice.
        let logits = [3.0f32, 2.0, 0.0, -1.0];
        let bias = [0.0f32, 0.0, 1.0, 1.0];
        let r = route(&logits, &bias, &e);
        let s = |x: f64| 1.0 / (1.0 + (-x).exp());
        let (s2, s3) = (s(0.0), s(-1.0));
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [2, 3]);
        assert!((r[0].1 as f64 - s2 / (s2 + s3) * 2.0).abs() < 1e-6);
        assert!((r[1].1 as f64 - s3 / (s2 + s3) * 2.0).abs() < 1e-6);
        // Group-limited: two groups of two, only the best group eligible.
        let g = MoeConfig {
            n_group: 2,
            topk_group: 1,
            ..e
        };
        let r = route(&[3.0, 2.0, 0.0, -1.0], &[0.0; 4], &g);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [0, 1]);
    }
}
