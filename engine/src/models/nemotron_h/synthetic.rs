//! Synthetic Nemotron-H models for speed measurements (`nemotron-bench`): a [`Config`] built
//! in memory (the Nemotron 3 Nano 30B-A3B geometry, or a small one for software adapters),
//! random f32 weights for everything the frame keeps in f32, and quantized expert banks
//! made on the GPU.
//!
//! The banks: quantizing 128 experts × 23 layers × 2 projections of real size (≈30 G
//! weights) on the host would take minutes and move tens of GB over the bus. Instead
//! [`BankMaker`] quantizes a few *template* experts once (random f32 rows through the real
//! quantizer, so scales and codes are what the kernels meet on real weights), uploads them,
//! and fills every layer's bank slot by slot with GPU buffer copies of the templates. Each
//! expert still has its own memory, so a kernel reads exactly the bytes it would read on a
//! real checkpoint; only the values repeat (every `templates`-th expert is the same).
//!
//! Values are uniform in ±1/√fan-in (embeddings ±1, norms 1, A_log = ln(1 + h mod 16),
//! D = 1, dt_bias ≈ softplus⁻¹(0.01)), so 52 layers of residual stream stay finite.

use crate::gpu::Gpu;
use crate::kernels::nemotron::QuantBank;
use crate::quant::{QuantFormat, QuantMatrix};
use crate::reference::nemotron_h::{
    AttentionWeights, DtClamp, Layer, Linear, MambaWeights, Mixer, Model, MoeWeights, Relu2Mlp,
};
use crate::{Error, Result};

use super::config::{AttentionConfig, Config, LayerKind, MambaConfig, MoeConfig};

/// Nemotron 3 Nano 30B-A3B's layer list.
pub const NANO_PATTERN: &str = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME";

/// A geometry: what [`config`] needs besides the defaults every Nemotron-H shares.
#[derive(Clone, Debug)]
pub struct Geometry {
    pub pattern: String,
    pub hidden: usize,
    pub vocab: usize,
    /// (query heads, KV heads, head dim).
    pub attention: (usize, usize, usize),
    /// (heads, head dim, groups, state).
    pub mamba: (usize, usize, usize, usize),
    /// (routed experts, top k, expert width, shared expert width).
    pub moe: (usize, usize, usize, usize),
}

impl Geometry {
    /// Nemotron 3 Nano 30B-A3B: hidden 2688, 52 layers, 32/2 heads of 128, Mamba 64×64 in 8
    /// groups with state 128, 128 experts top-6 of width 1856, shared 3712, vocab 131072.
    pub fn nano_30b_a3b() -> Geometry {
        Geometry {
            pattern: NANO_PATTERN.into(),
            hidden: 2688,
            vocab: 131072,
            attention: (32, 2, 128),
            mamba: (64, 64, 8, 128),
            moe: (128, 6, 1856, 3712),
        }
    }

    /// A small geometry (the fixture's sizes, every layer kind but the dense MLP) that runs
    /// in seconds on a software adapter.
    pub fn small() -> Geometry {
        Geometry {
            pattern: "MEM*EMEM*E".into(),
            hidden: 256,
            vocab: 4096,
            attention: (8, 2, 32),
            mamba: (8, 32, 2, 32),
            moe: (16, 4, 128, 192),
        }
    }
}

/// The configuration of a geometry (Nano's other values: eps 1e-5, conv kernel 4 with bias,
/// no projection biases, sigmoid router with scaling 2.5 over the normalised top k, tied
/// embeddings so the host holds one `[vocab][hidden]` table; the frame uploads the head
/// separately either way).
pub fn config(g: &Geometry) -> Result<Config> {
    let layers = g
        .pattern
        .chars()
        .map(|c| {
            LayerKind::from_pattern_char(c)
                .ok_or_else(|| Error::Invalid(format!("layer pattern character {c:?}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let (qh, kvh, hd) = g.attention;
    let (mh, mhd, groups, state) = g.mamba;
    let (ne, k, inter, shared) = g.moe;
    Ok(Config {
        vocab_size: g.vocab,
        hidden_size: g.hidden,
        layers,
        tie_word_embeddings: true,
        layer_norm_epsilon: 1e-5,
        residual_in_fp32: false,
        mlp_intermediate_size: shared,
        mlp_bias: false,
        attention: AttentionConfig {
            num_heads: qh,
            num_kv_heads: kvh,
            head_dim: hd,
            bias: false,
        },
        mamba: MambaConfig {
            num_heads: mh,
            head_dim: mhd,
            state_size: state,
            n_groups: groups,
            conv_kernel: 4,
            conv_bias: true,
            proj_bias: false,
            time_step_min: 0.001,
            time_step_limit: (0.0, f64::INFINITY),
            chunk_size: 128,
        },
        moe: MoeConfig {
            n_routed_experts: ne,
            top_k: k,
            intermediate_size: inter,
            shared_intermediate_size: shared,
            n_shared_experts: 1,
            latent_size: None,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: true,
            routed_scaling_factor: 2.5,
        },
        bos_token_id: Some(1),
        eos_token_ids: vec![2],
        pad_token_id: Some(0),
    })
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` values uniform in ±`scale` (never 0), deterministic in `seed`, filled on all cores.
pub fn rand_f32(n: usize, scale: f32, seed: u64) -> Vec<f32> {
    let mut v = vec![0f32; n];
    let threads = std::thread::available_parallelism()
        .map_or(1, |t| t.get())
        .min(32);
    let chunk = n.div_ceil(threads).max(1 << 16);
    std::thread::scope(|s| {
        for (i, c) in v.chunks_mut(chunk).enumerate() {
            s.spawn(move || {
                let mut st = seed ^ (i as u64 + 1).wrapping_mul(0xd6e8_feb8_6659_fd93);
                for x in c {
                    // 24 random bits → an odd multiple of 2^-24 in (−1, 1).
                    let u = (splitmix(&mut st) >> 40) as i64 * 2 - (1 << 24) + 1;
                    *x = u as f32 * (scale / (1 << 24) as f32);
                }
            });
        }
    });
    v
}

/// Seeds for the weights of one model, one per tensor.
struct Seeds(u64);

impl Seeds {
    fn next(&mut self) -> u64 {
        splitmix(&mut self.0)
    }
    fn lin(&mut self, rows: usize, cols: usize) -> Linear {
        Linear {
            w: rand_f32(rows * cols, 1.0 / (cols as f32).sqrt(), self.next()),
            b: None,
            rows,
            cols,
        }
    }
}

/// A model of `c`'s geometry with random weights, **without routed expert weights** (every
/// MoE layer's `experts` is empty: give the banks with
/// [`NemotronGpu::from_model_with_banks`](super::gpu::NemotronGpu::from_model_with_banks)).
pub fn model(c: &Config, seed: u64) -> Result<Model> {
    let h = c.hidden_size;
    let mut s = Seeds(seed);
    let ones = |n: usize| vec![1f32; n];
    let mut layers = Vec::with_capacity(c.layers.len());
    for &kind in &c.layers {
        let mixer = match kind {
            LayerKind::Mamba => {
                let m = &c.mamba;
                // softplus⁻¹(0.01) = ln(e^0.01 − 1).
                let dt_bias = (0.01f64.exp_m1()).ln() as f32;
                Mixer::Mamba(MambaWeights {
                    in_proj: s.lin(m.in_proj_rows(), h),
                    out_proj: s.lin(h, m.inner()),
                    conv_w: rand_f32(m.conv_dim() * m.conv_kernel, 0.5, s.next()),
                    conv_b: Some(rand_f32(m.conv_dim(), 0.1, s.next())),
                    a_log: (0..m.num_heads)
                        .map(|i| (1.0 + (i % 16) as f32).ln())
                        .collect(),
                    d: ones(m.num_heads),
                    dt_bias: vec![dt_bias; m.num_heads],
                    norm: ones(m.inner()),
                })
            }
            LayerKind::Attention => {
                let a = &c.attention;
                let (qw, kvw) = (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim);
                Mixer::Attention(AttentionWeights {
                    q: s.lin(qw, h),
                    k: s.lin(kvw, h),
                    v: s.lin(kvw, h),
                    o: s.lin(h, qw),
                })
            }
            LayerKind::Moe => {
                let e = &c.moe;
                let sh = e.shared_intermediate_size;
                Mixer::Moe(MoeWeights {
                    gate: rand_f32(e.n_routed_experts * h, 1.0 / (h as f32).sqrt(), s.next()),
                    bias: rand_f32(e.n_routed_experts, 0.01, s.next()),
                    experts: Vec::new(),
                    shared: Relu2Mlp {
                        up: s.lin(sh, h),
                        down: s.lin(h, sh),
                    },
                    latent: None,
                })
            }
            LayerKind::Mlp => {
                let mi = c.mlp_intermediate_size;
                Mixer::Mlp(Relu2Mlp {
                    up: s.lin(mi, h),
                    down: s.lin(h, mi),
                })
            }
        };
        layers.push(Layer {
            norm: ones(h),
            mixer,
        });
    }
    Ok(Model {
        config: c.clone(),
        embeddings: rand_f32(c.vocab_size * h, 1.0, s.next()),
        layers,
        norm_f: ones(h),
        lm_head: None,
        dt_clamp: DtClamp::TimeStepMin,
    })
}

/// Makes every MoE layer's quantized banks on the GPU from a few template experts (see the
/// module documentation).
pub struct BankMaker<'g> {
    gpu: &'g Gpu,
    format: QuantFormat,
    experts: u32,
    hidden: u32,
    inter: u32,
    /// Template (up, down) matrices on the GPU.
    up: Vec<wgpu::Buffer>,
    down: Vec<wgpu::Buffer>,
    up_words: u32,
    down_words: u32,
}

impl<'g> BankMaker<'g> {
    /// Quantizes `templates` random experts of `c`'s geometry in `format` (on all cores)
    /// and uploads them. Fails with the sizes when a layer's bank cannot be one binding.
    pub fn new(
        gpu: &'g Gpu,
        c: &Config,
        format: QuantFormat,
        templates: usize,
        seed: u64,
    ) -> Result<BankMaker<'g>> {
        let (h, inter, ne) = (
            c.hidden_size,
            c.moe.intermediate_size,
            c.moe.n_routed_experts,
        );
        let t = templates.clamp(1, ne.max(1));
        let mats: Vec<Result<(QuantMatrix, QuantMatrix)>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..t)
                .map(|i| {
                    s.spawn(move || {
                        let seed = seed ^ (i as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                        let up = rand_f32(inter * h, 1.0 / (h as f32).sqrt(), seed);
                        let up = QuantMatrix::quantize(format, &up, inter, h)?;
                        let down = rand_f32(h * inter, 1.0 / (inter as f32).sqrt(), !seed);
                        let down = QuantMatrix::quantize(format, &down, h, inter)?;
                        Ok((up, down))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().expect("template quantizer panicked"))
                .collect()
        });
        let mut up = Vec::with_capacity(t);
        let mut down = Vec::with_capacity(t);
        let (mut up_words, mut down_words) = (0, 0);
        for m in mats {
            let (u, d) = m?;
            up_words = u.words().len();
            down_words = d.words().len();
            up.push(gpu.upload_u32("template expert up", u.words())?);
            down.push(gpu.upload_u32("template expert down", d.words())?);
        }
        let limits = gpu.device.limits();
        let cap = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        for (what, w) in [("up", up_words), ("down", down_words)] {
            let bytes = (ne * w * 4) as u64;
            if bytes > cap {
                return Err(Error::Unsupported(format!(
                    "a {} bank of {ne} {what} projections takes {bytes} bytes; the adapter binds at most \
                     {cap}: the bank would have to be split",
                    format.name()
                )));
            }
        }
        let words = |w: usize| {
            u32::try_from(w).map_err(|_| Error::Unsupported(format!("an expert of {w} words")))
        };
        Ok(BankMaker {
            gpu,
            format,
            experts: ne as u32,
            hidden: h as u32,
            inter: inter as u32,
            up,
            down,
            up_words: words(up_words)?,
            down_words: words(down_words)?,
        })
    }

    /// Bytes of one expert's (up, down) matrices.
    pub fn expert_bytes(&self) -> (u64, u64) {
        (self.up_words as u64 * 4, self.down_words as u64 * 4)
    }

    /// The (up, down) banks of MoE layer `layer`: expert e is template `(e + 3·layer) mod t`,
    /// copied on the GPU. Waits for the copies (which also flushes uploads queued before).
    pub fn make(&self, layer: usize) -> Result<(QuantBank, QuantBank)> {
        let g = self.gpu;
        let t = self.up.len();
        let fill = |label: &str, temps: &[wgpu::Buffer], words: u32| -> Result<wgpu::Buffer> {
            let slot = words as u64 * 4;
            let buf = g.buffer(label, self.experts as u64 * slot)?;
            let mut enc = g.device.create_command_encoder(&Default::default());
            for e in 0..self.experts as usize {
                let src = &temps[(e + 3 * layer) % t];
                enc.copy_buffer_to_buffer(src, 0, &buf, e as u64 * slot, slot);
            }
            g.queue.submit([enc.finish()]);
            g.wait()?;
            Ok(buf)
        };
        let up = fill("experts up", &self.up, self.up_words)?;
        let down = fill("experts down", &self.down, self.down_words)?;
        Ok((
            QuantBank::from_buffer(
                g,
                "experts up",
                self.format,
                up,
                self.inter,
                self.hidden,
                self.experts,
                self.up_words,
            )?,
            QuantBank::from_buffer(
                g,
                "experts down",
                self.format,
                down,
                self.hidden,
                self.inter,
                self.experts,
                self.down_words,
            )?,
        ))
    }
}
