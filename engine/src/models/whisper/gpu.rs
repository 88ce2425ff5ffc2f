//! Whisper on the GPU: the weights as buffers, the encoder and decoder as sequences of
//! named dispatches through the recorder, and [`LogitSource`] for the decoding loop.
//!
//! Layout of the work:
//! - `begin_window`: conv1 (+GELU) → conv2 (+GELU, + positions) → N encoder blocks → final
//!   LayerNorm → every decoder layer's cross-attention K|V, computed once per window. One
//!   submission.
//! - `advance(tokens)`: all new positions in one pass (prefill when several): embed →
//!   per layer {LN + fused QKV written straight into the q|k|v cache, causal attention
//!   over the cache, out-proj + residual, LN + cross-attention query, attention over the
//!   window's K|V, out-proj + residual, LN + FFN with GELU, + residual} → final LN + logits
//!   of the last position (tied embeddings) → masked selection. For a few positions each
//!   "LN +" is one GEMV dispatch (the norm folded in) and an attention over at most 256
//!   keys one dispatch: 9 per layer. One submission and a 32-byte readback per call; the
//!   logits stay on the GPU.
//! - `verify(tokens)`: speculative decoding's check, up to 8 positions in one pass, every
//!   GEMV in its per-row form (each row bit-identical to a lone decode step), the logits
//!   and the masked selection of every position, 32 bytes back per position; `rollback`
//!   drops positions past the first rejected draft (the KV length goes back).

use std::sync::Arc;

use wgpu::Buffer;

use super::checkpoint::Checkpoint;
use super::Dims;
use crate::decode::{LogitSource, StepRules, StepScores};
use crate::gpu::{DispatchCache, Encoded, Gpu, Profile, Recorder};
use crate::kernels::{
    scores_from_words, select_params, suppress_bitmask, AttentionArgs, Epilogue, F16Matrix, Kernels, NormArgs, Rows,
    SelectParams,
};
use crate::{Error, Result};

const LN_EPS: f32 = 1e-5;

/// Most positions in one verify pass: the per-row GEMV, the split attention and the
/// selection's output rows are sized for it.
pub const MAX_VERIFY: usize = crate::kernels::GEMV_MAX_ROWS as usize;

/// The decoder's scratch and output buffers, borrowed field by field (so the dispatch
/// cache can be borrowed mutably beside them).
struct DecBufs<'a> {
    tokens: &'a Buffer,
    emb: &'a F16Matrix,
    dec_pos: &'a Buffer,
    dec_x: &'a Buffer,
    dec_xn: &'a Buffer,
    dec_q: &'a Buffer,
    dec_attn: &'a Buffer,
    dec_h: &'a Buffer,
    dec_norm: &'a Norm,
    logits: &'a Buffer,
    suppress: &'a Buffer,
    select_out: &'a Buffer,
    readback: &'a Buffer,
}

macro_rules! dec_bufs {
    ($s:ident) => {
        DecBufs {
            tokens: &$s.tokens,
            emb: &$s.emb,
            dec_pos: &$s.dec_pos,
            dec_x: &$s.dec_x,
            dec_xn: &$s.dec_xn,
            dec_q: &$s.dec_q,
            dec_attn: &$s.dec_attn,
            dec_h: &$s.dec_h,
            dec_norm: &$s.dec_norm,
            logits: &$s.logits,
            suppress: &$s.suppress,
            select_out: &$s.select_out,
            readback: &$s.readback,
        }
    };
}

/// A single-token decode step encoded ahead (see `decode_positions`): the position it is
/// for, the command buffer, and where its two selection dispatches read their parameters.
struct PendingStep {
    pos0: usize,
    enc: Encoded,
    select_slots: Vec<(Buffer, u64)>,
}

struct Norm {
    gamma: Buffer,
    beta: Buffer,
}

struct Linear {
    w: F16Matrix,
    b: Buffer,
}

struct EncoderLayer {
    attn_norm: Norm,
    qkv: Linear,
    attn_out: Linear,
    ffn_norm: Norm,
    fc1: Linear,
    fc2: Linear,
}

struct DecoderLayer {
    self_norm: Norm,
    qkv: Linear,
    self_out: Linear,
    cross_norm: Norm,
    cross_q: Linear,
    cross_kv: Linear,
    cross_out: Linear,
    ffn_norm: Norm,
    fc1: Linear,
    fc2: Linear,
    /// Every position's q | k | v, [text_ctx][3d]: the fused projection writes its output
    /// here directly, so appending to the KV cache costs no copy dispatch.
    qkv_cache: Buffer,
    /// This window's cross-attention keys | values, [audio_ctx][2d].
    enc_kv: Buffer,
}

pub struct GpuWhisper {
    gpu: Arc<Gpu>,
    kern: Kernels,
    pub dims: Dims,
    eot: u32,
    ts_begin: u32,
    conv1: Linear,
    conv2: Linear,
    enc_pos: Buffer,
    enc_layers: Vec<EncoderLayer>,
    enc_norm: Norm,
    emb: F16Matrix,
    dec_pos: Buffer,
    dec_layers: Vec<DecoderLayer>,
    dec_norm: Norm,
    // Scratch.
    mel: Buffer,
    enc_x: Buffer,
    enc_xn: Buffer,
    enc_qkv: Buffer,
    enc_attn: Buffer,
    enc_h: Buffer,
    dec_x: Buffer,
    dec_xn: Buffer,
    dec_q: Buffer,
    dec_attn: Buffer,
    dec_h: Buffer,
    tokens: Buffer,
    logits: Buffer,
    suppress: Buffer,
    select_out: Buffer,
    /// Host-mappable copy of `select_out`, reused every step (no buffer creation and no
    /// second submission per step).
    readback: Buffer,
    kv_len: usize,
    window_ready: bool,
    /// Per-kernel records (GPU times when the device has timestamps and profiling is on).
    pub profile: Profile,
    /// Host-side split of `advance`: seconds recording + submitting, seconds waiting for
    /// the GPU and the readback, and the number of calls (for `verbatim bench`).
    pub host_times: (f64, f64, u64),
    /// The next single-token step, encoded while the last one ran.
    pending: Option<PendingStep>,
    enc_cache: DispatchCache,
    dec_cache: DispatchCache,
    /// Verify passes keep their own bind groups (another dispatch sequence).
    ver_cache: DispatchCache,
}

fn ln(n: &Norm) -> NormArgs<'_> {
    NormArgs { gamma: &n.gamma, beta: &n.beta, eps: LN_EPS }
}

fn norm(gpu: &Gpu, ck: &Checkpoint, prefix: &str) -> Result<Norm> {
    Ok(Norm {
        gamma: gpu.upload_f32(&format!("{prefix}/gamma"), &ck.f32(&format!("{prefix}/gamma"))?)?,
        beta: gpu.upload_f32(&format!("{prefix}/beta"), &ck.f32(&format!("{prefix}/beta"))?)?,
    })
}

fn matrix(gpu: &Gpu, ck: &Checkpoint, name: &str) -> Result<F16Matrix> {
    let t = ck.tensor(name)?;
    let n = t.dims[0];
    let k: usize = t.dims[1..].iter().product();
    if n * k * 2 > gpu.info.max_storage_binding as usize {
        return Err(Error::Unsupported(format!(
            "weight {name} ({} MB) exceeds the adapter's storage binding limit ({} MB)",
            n * k * 2 >> 20,
            gpu.info.max_storage_binding >> 20
        )));
    }
    let bits = ck.f16_bits(name)?;
    F16Matrix::from_bits(gpu, name, &bits, n, k)
}

fn linear(gpu: &Gpu, ck: &Checkpoint, prefix: &str) -> Result<Linear> {
    Ok(Linear {
        w: matrix(gpu, ck, &format!("{prefix}/weight"))?,
        b: gpu.upload_f32(&format!("{prefix}/bias"), &ck.f32(&format!("{prefix}/bias"))?)?,
    })
}

impl GpuWhisper {
    /// Upload a validated checkpoint. `eot` and `timestamp_begin` come from the tokenizer.
    pub fn load(gpu: Arc<Gpu>, ck: &Checkpoint, eot: u32, timestamp_begin: u32) -> Result<GpuWhisper> {
        let g = &*gpu;
        let dims = ck.dims;
        let d = dims.d_model;
        if dims.head_dim() > 128 || d % dims.n_heads != 0 {
            return Err(Error::Unsupported(format!("{} heads of width {d}", dims.n_heads)));
        }
        if eot >= timestamp_begin || timestamp_begin > dims.vocab as u32 {
            return Err(Error::model(
                &ck.dir,
                format!("the tokenizer puts eot at {eot} and timestamps at {timestamp_begin}, which does not fit a vocabulary of {}", dims.vocab),
            ));
        }
        let kern = Kernels::load(g)?;
        let mut enc_layers = Vec::with_capacity(dims.encoder_layers);
        for i in 0..dims.encoder_layers {
            let p = format!("encoder/layer_{i}");
            enc_layers.push(EncoderLayer {
                attn_norm: norm(g, ck, &format!("{p}/self_attention/layer_norm"))?,
                qkv: linear(g, ck, &format!("{p}/self_attention/linear_0"))?,
                attn_out: linear(g, ck, &format!("{p}/self_attention/linear_1"))?,
                ffn_norm: norm(g, ck, &format!("{p}/ffn/layer_norm"))?,
                fc1: linear(g, ck, &format!("{p}/ffn/linear_0"))?,
                fc2: linear(g, ck, &format!("{p}/ffn/linear_1"))?,
            });
        }
        let mut dec_layers = Vec::with_capacity(dims.decoder_layers);
        let cache = (dims.text_ctx * 3 * d * 4) as u64;
        for i in 0..dims.decoder_layers {
            let p = format!("decoder/layer_{i}");
            dec_layers.push(DecoderLayer {
                self_norm: norm(g, ck, &format!("{p}/self_attention/layer_norm"))?,
                qkv: linear(g, ck, &format!("{p}/self_attention/linear_0"))?,
                self_out: linear(g, ck, &format!("{p}/self_attention/linear_1"))?,
                cross_norm: norm(g, ck, &format!("{p}/attention/layer_norm"))?,
                cross_q: linear(g, ck, &format!("{p}/attention/linear_0"))?,
                cross_kv: linear(g, ck, &format!("{p}/attention/linear_1"))?,
                cross_out: linear(g, ck, &format!("{p}/attention/linear_2"))?,
                ffn_norm: norm(g, ck, &format!("{p}/ffn/layer_norm"))?,
                fc1: linear(g, ck, &format!("{p}/ffn/linear_0"))?,
                fc2: linear(g, ck, &format!("{p}/ffn/linear_1"))?,
                qkv_cache: g.buffer("q|k|v cache", cache)?,
                enc_kv: g.buffer("cross k|v", (dims.audio_ctx * 2 * d * 4) as u64)?,
            });
        }
        let (a, t, f) = (dims.audio_ctx, dims.text_ctx, dims.ffn);
        let f32s = |n: usize| (n * 4) as u64;
        Ok(GpuWhisper {
            kern,
            dims,
            eot,
            ts_begin: timestamp_begin,
            conv1: linear(g, ck, "encoder/conv1")?,
            conv2: linear(g, ck, "encoder/conv2")?,
            enc_pos: g.upload_f32("encoder positions", &ck.f32("encoder/position_encodings/encodings")?)?,
            enc_layers,
            enc_norm: norm(g, ck, "encoder/layer_norm")?,
            emb: matrix(g, ck, "decoder/embeddings/weight")?,
            dec_pos: g.upload_f32("decoder positions", &ck.f32("decoder/position_encodings/encodings")?)?,
            dec_layers,
            dec_norm: norm(g, ck, "decoder/layer_norm")?,
            mel: g.buffer("mel", f32s(dims.n_mels * 2 * a))?,
            enc_x: g.buffer("encoder x", f32s(a * d))?,
            enc_xn: g.buffer("encoder x normed", f32s(a * d))?,
            enc_qkv: g.buffer("encoder qkv", f32s(a * 3 * d))?,
            enc_attn: g.buffer("encoder attention", f32s(a * d))?,
            // Holds conv1's output [2·audio_ctx][d] too.
            enc_h: g.buffer("encoder hidden", f32s((a * f).max(2 * a * d)))?,
            dec_x: g.buffer("decoder x", f32s(t * d))?,
            dec_xn: g.buffer("decoder x normed", f32s(t * d))?,
            dec_q: g.buffer("decoder cross q", f32s(t * d))?,
            dec_attn: g.buffer("decoder attention", f32s(t * d))?,
            dec_h: g.buffer("decoder hidden", f32s(t * f))?,
            tokens: g.buffer("tokens", (t * 4) as u64)?,
            // One row per verified position.
            logits: g.buffer("logits", f32s(dims.vocab * MAX_VERIFY))?,
            suppress: g.upload_u32("suppress", &suppress_bitmask(&[], dims.vocab as u32))?,
            select_out: g.buffer("select out", 32 * MAX_VERIFY as u64)?,
            readback: g.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("select readback"),
                size: 32 * MAX_VERIFY as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            kv_len: 0,
            window_ready: false,
            profile: Profile::default(),
            host_times: (0.0, 0.0, 0),
            pending: None,
            enc_cache: DispatchCache::default(),
            dec_cache: DispatchCache::default(),
            ver_cache: DispatchCache::default(),
            gpu,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    fn encode(&mut self, mel: &[f32]) -> Result<()> {
        let d = self.dims.d_model as u32;
        let a = self.dims.audio_ctx as u32;
        let frames = 2 * a;
        let g = self.gpu.clone();
        g.write(&self.mel, 0, bytemuck::cast_slice(mel));
        let k = &self.kern;
        let mut rec = g.recorder_cached(&mut self.enc_cache);
        rec.stage("encoder");
        let gelu = Epilogue { gelu: true, accumulate: false };
        // conv1 reads the mel channel-major [n_mels][frames] and writes time-major [frames][d].
        k.conv_k3(&mut rec, &self.mel, frames, frames, 1, 1, &self.conv1.w, &self.conv1.b, &self.enc_h, gelu)?;
        // x = positions, then x += GELU(conv2(h)) (stride 2: 3000 -> 1500 frames).
        rec.copy(&self.enc_pos, 0, &self.enc_x, 0, (a * d * 4) as u64);
        k.conv_k3(
            &mut rec,
            &self.enc_h,
            frames,
            1,
            d,
            2,
            &self.conv2.w,
            &self.conv2.b,
            &self.enc_x,
            Epilogue { gelu: true, accumulate: true },
        )?;
        let acc = Epilogue { gelu: false, accumulate: true };
        let plain = Epilogue::default();
        let heads = self.dims.n_heads as u32;
        let hd = self.dims.head_dim() as u32;
        let (du, f) = (d as usize, self.dims.ffn);
        for l in &self.enc_layers {
            k.layer_norm(&mut rec, &self.enc_x, 0, a, d, &l.attn_norm.gamma, &l.attn_norm.beta, &self.enc_xn, 0, LN_EPS)?;
            k.linear(&mut rec, Rows::new(&self.enc_xn, du), a, &l.qkv.w, Some(&l.qkv.b), Rows::new(&self.enc_qkv, 3 * du), plain)?;
            k.attention(
                &mut rec,
                &AttentionArgs {
                    q: Rows::at(&self.enc_qkv, 0, 3 * du),
                    k: Rows::at(&self.enc_qkv, du, 3 * du),
                    v: Rows::at(&self.enc_qkv, 2 * du, 3 * du),
                    out: Rows::new(&self.enc_attn, du),
                    tq: a,
                    tk: a,
                    heads,
                    head_dim: hd,
                    causal: None,
                },
            )?;
            k.linear(&mut rec, Rows::new(&self.enc_attn, du), a, &l.attn_out.w, Some(&l.attn_out.b), Rows::new(&self.enc_x, du), acc)?;
            k.layer_norm(&mut rec, &self.enc_x, 0, a, d, &l.ffn_norm.gamma, &l.ffn_norm.beta, &self.enc_xn, 0, LN_EPS)?;
            k.linear(&mut rec, Rows::new(&self.enc_xn, du), a, &l.fc1.w, Some(&l.fc1.b), Rows::new(&self.enc_h, f), gelu)?;
            k.linear(&mut rec, Rows::new(&self.enc_h, f), a, &l.fc2.w, Some(&l.fc2.b), Rows::new(&self.enc_x, du), acc)?;
        }
        k.layer_norm(&mut rec, &self.enc_x, 0, a, d, &self.enc_norm.gamma, &self.enc_norm.beta, &self.enc_xn, 0, LN_EPS)?;
        rec.stage("cross k|v");
        for l in &self.dec_layers {
            k.linear(&mut rec, Rows::new(&self.enc_xn, du), a, &l.cross_kv.w, Some(&l.cross_kv.b), Rows::new(&l.enc_kv, 2 * du), plain)?;
        }
        rec.submit(Some(&mut self.profile))?;
        self.gpu.wait()
    }

    /// The encoder's output for the current window ([audio_ctx][d], after the final
    /// LayerNorm), for comparisons with the reference.
    pub fn encoder_output(&self) -> Result<Vec<f32>> {
        self.gpu.read_f32(&self.enc_xn, 0, self.dims.audio_ctx * self.dims.d_model)
    }

    /// The buffer holding the encoder's output (`[audio_ctx][d]` f32 from offset 0), for
    /// consumers on the same device (the speech-LM projector reads it in place).
    pub fn encoder_buffer(&self) -> &wgpu::Buffer {
        &self.enc_xn
    }

    /// Frames and width of the encoder output.
    pub fn encoder_shape(&self) -> (usize, usize) {
        (self.dims.audio_ctx, self.dims.d_model)
    }

    /// The logits of the last position of the last `advance`.
    pub fn last_logits(&self) -> Result<Vec<f32>> {
        self.gpu.read_f32(&self.logits, 0, self.dims.vocab)
    }

    /// What `advance` and `verify` require of the tokens they append: a window, at least one
    /// token, ids in the vocabulary, room in the decoder context.
    fn check_append(&self, call: &str, tokens: &[u32]) -> Result<()> {
        if !self.window_ready {
            return Err(Error::Invalid(format!("{call} before begin_window")));
        }
        if tokens.is_empty() {
            return Err(Error::Invalid(format!("{call} with no tokens")));
        }
        let vocab = self.dims.vocab as u32;
        if let Some(&bad) = tokens.iter().find(|&&t| t >= vocab) {
            return Err(Error::Invalid(format!("token id {bad} is outside the vocabulary of {vocab}")));
        }
        if self.kv_len + tokens.len() > self.dims.text_ctx {
            return Err(Error::Invalid(format!(
                "{} decoder positions exceed the model's {}",
                self.kv_len + tokens.len(),
                self.dims.text_ctx
            )));
        }
        Ok(())
    }

    fn decode_positions(&mut self, tokens: &[u32], rules: &StepRules) -> Result<StepScores> {
        let n = tokens.len();
        let pos0 = self.kv_len;
        let vocab = self.dims.vocab as u32;
        let t_record = std::time::Instant::now();
        let g = self.gpu.clone();
        g.write(&self.tokens, 0, bytemuck::cast_slice(tokens));
        let sp = select_params(rules, vocab, self.ts_begin, self.eot, 0);
        // Untimed, a single-token step is encoded while the previous one runs (below) and
        // only its token and selection rules are written now.
        let pipelined = !g.timing_dispatches();
        match self.pending.take() {
            Some(p) if pipelined && n == 1 && p.pos0 == pos0 => {
                for (buf, off) in &p.select_slots {
                    g.queue.write_buffer(buf, *off, bytemuck::bytes_of(&sp));
                }
                p.enc.submit(&g, Some(&mut self.profile))?;
            }
            _ => {
                if pipelined {
                    self.record_step(n, pos0, &sp)?.enc.submit(&g, Some(&mut self.profile))?;
                } else {
                    self.record_step_timed(n, pos0, &sp)?;
                }
            }
        }
        let t_submitted = std::time::Instant::now();
        if pipelined && pos0 + n < self.dims.text_ctx {
            // The next step's dispatches, parameters and bind groups while the GPU works; its
            // token and rules follow in the next call (a step that never comes is dropped).
            self.pending = Some(self.record_step(1, pos0 + n, &sp)?);
        }
        let t_wait = std::time::Instant::now();
        g.map_and_wait(&self.readback)?;
        // (The encoding of the next step, between the two, overlaps the GPU's work.)
        self.host_times.0 += (t_submitted - t_record).as_secs_f64();
        self.host_times.1 += t_wait.elapsed().as_secs_f64();
        self.host_times.2 += 1;
        let words = self.read_scores(1)?;
        self.kv_len += n;
        Ok(scores_from_words(&words))
    }

    /// The first `rows` x 8 words of the mapped readback, then unmapped.
    fn read_scores(&self, rows: usize) -> Result<Vec<u32>> {
        let words: Vec<u32> = {
            let view = self.readback.get_mapped_range(..).map_err(|e| Error::Gpu(format!("reading scores back: {e}")))?;
            bytemuck::pod_collect_to_vec(&view[..rows * 32])
        };
        self.readback.unmap();
        Ok(words)
    }

    /// Speculative decoding's verify pass (see `LogitSource::verify`).
    fn verify_positions(&mut self, tokens: &[u32], rules: &[StepRules]) -> Result<Vec<StepScores>> {
        let n = tokens.len();
        let pos0 = self.kv_len;
        let vocab = self.dims.vocab as u32;
        let t_record = std::time::Instant::now();
        // The single step encoded ahead is for another position now.
        self.pending = None;
        let g = self.gpu.clone();
        g.write(&self.tokens, 0, bytemuck::cast_slice(tokens));
        let sps: Vec<SelectParams> = rules
            .iter()
            .enumerate()
            .map(|(i, r)| SelectParams { out_off: 8 * i as u32, ..select_params(r, vocab, self.ts_begin, self.eot, i as u32 * vocab) })
            .collect();
        let mut rec = g.recorder_cached(&mut self.ver_cache);
        Self::record_decoder(&self.kern, &self.dims, &self.dec_layers, &dec_bufs!(self), &mut rec, n, pos0, &sps, true)?;
        rec.submit(Some(&mut self.profile))?;
        let t_wait = std::time::Instant::now();
        g.map_and_wait(&self.readback)?;
        self.host_times.0 += (t_wait - t_record).as_secs_f64();
        self.host_times.1 += t_wait.elapsed().as_secs_f64();
        self.host_times.2 += 1;
        let words = self.read_scores(n)?;
        self.kv_len += n;
        Ok(words.chunks(8).map(scores_from_words).collect())
    }

    /// Record the decoder over `n` positions from `pos0` (tokens already in `tokens`), the
    /// logits of the last and the selection with `sp`, and encode it without submitting.
    fn record_step(&mut self, n: usize, pos0: usize, sp: &SelectParams) -> Result<PendingStep> {
        let g = self.gpu.clone();
        let mut rec = g.recorder_cached(&mut self.dec_cache);
        Self::record_decoder(&self.kern, &self.dims, &self.dec_layers, &dec_bufs!(self), &mut rec, n, pos0, &[*sp], false)?;
        let select_slots = rec.last_param_slots(2);
        Ok(PendingStep { pos0, enc: rec.encode()?, select_slots })
    }

    /// The same, submitted with a timestamp per dispatch (profiling).
    fn record_step_timed(&mut self, n: usize, pos0: usize, sp: &SelectParams) -> Result<()> {
        let g = self.gpu.clone();
        let mut rec = g.recorder_cached(&mut self.dec_cache);
        Self::record_decoder(&self.kern, &self.dims, &self.dec_layers, &dec_bufs!(self), &mut rec, n, pos0, &[*sp], false)?;
        rec.submit(Some(&mut self.profile))
    }

    #[allow(clippy::too_many_arguments)]
    fn record_decoder(
        k: &Kernels,
        dims: &Dims,
        dec_layers: &[DecoderLayer],
        b: &DecBufs,
        rec: &mut Recorder,
        n: usize,
        pos0: usize,
        sps: &[SelectParams],
        per_row: bool,
    ) -> Result<()> {
        let d = dims.d_model;
        let (m, p0) = (n as u32, pos0 as u32);
        let heads = dims.n_heads as u32;
        let hd = dims.head_dim() as u32;
        let (acc, plain) = (Epilogue { gelu: false, accumulate: true }, Epilogue::default());
        let gelu = Epilogue { gelu: true, accumulate: false };
        // The same dispatches on the same buffers every step: bind groups are built once.
        rec.stage(if per_row && n > 1 {
            "verify"
        } else if n > 1 {
            "prefill"
        } else {
            "decode"
        });
        // y (=|+=) act(LN(x) W + b) (`norm` Some) or act(x W + b): per row in a verify pass.
        let lin = |rec: &mut Recorder, x: Rows, norm: Option<&Norm>, w: &Linear, y: Rows, ep: Epilogue| -> Result<()> {
            if per_row {
                return k.linear_per_row(rec, x, m, norm.map(ln), &w.w, Some(&w.b), y, ep);
            }
            match norm {
                Some(nm) => k.linear_ln(rec, x, m, ln(nm), b.dec_xn, &w.w, Some(&w.b), y, ep),
                None => k.linear(rec, x, m, &w.w, Some(&w.b), y, ep),
            }
        };
        k.embed(rec, &b.tokens, m, &b.emb, &b.dec_pos, p0, &b.dec_x)?;
        let x = Rows::new(&b.dec_x, d);
        let s3 = 3 * d;
        // Per layer: the LayerNorms are folded into the GEMVs that read them (for a few rows;
        // more rows go through the LayerNorm kernel into `dec_xn` and the tiled GEMM).
        for l in dec_layers {
            let qkv = Rows::at(&l.qkv_cache, pos0 * s3, s3);
            lin(rec, x, Some(&l.self_norm), &l.qkv, qkv, plain)?;
            k.attention(
                rec,
                &AttentionArgs {
                    q: qkv,
                    k: Rows::at(&l.qkv_cache, d, s3),
                    v: Rows::at(&l.qkv_cache, 2 * d, s3),
                    out: Rows::new(&b.dec_attn, d),
                    tq: m,
                    tk: p0 + m,
                    heads,
                    head_dim: hd,
                    causal: Some(p0),
                },
            )?;
            lin(rec, Rows::new(b.dec_attn, d), None, &l.self_out, x, acc)?;
            let q = Rows::new(&b.dec_q, d);
            lin(rec, x, Some(&l.cross_norm), &l.cross_q, q, plain)?;
            k.attention(
                rec,
                &AttentionArgs {
                    q,
                    k: Rows::at(&l.enc_kv, 0, 2 * d),
                    v: Rows::at(&l.enc_kv, d, 2 * d),
                    out: Rows::new(&b.dec_attn, d),
                    tq: m,
                    tk: dims.audio_ctx as u32,
                    heads,
                    head_dim: hd,
                    causal: None,
                },
            )?;
            lin(rec, Rows::new(b.dec_attn, d), None, &l.cross_out, x, acc)?;
            let h = Rows::new(&b.dec_h, dims.ffn);
            lin(rec, x, Some(&l.ffn_norm), &l.fc1, h, gelu)?;
            lin(rec, h, None, &l.fc2, x, acc)?;
        }
        // Final LayerNorm folded into the logits (tied embeddings): of the last position only,
        // or of every position in a verify pass, each row then selected with its own rules.
        let logits = Rows::new(b.logits, dims.vocab);
        if per_row {
            k.linear_per_row(rec, x, m, Some(ln(b.dec_norm)), b.emb, None, logits, plain)?;
        } else {
            let last = Rows::at(b.dec_x, (n - 1) * d, d);
            k.linear_ln(rec, last, 1, ln(b.dec_norm), b.dec_xn, b.emb, None, logits, plain)?;
        }
        for sp in sps {
            k.select(rec, b.logits, b.suppress, sp, b.select_out)?;
        }
        rec.copy(b.select_out, 0, b.readback, 0, 32 * sps.len() as u64);
        Ok(())
    }
}

impl LogitSource for GpuWhisper {
    fn begin_window(&mut self, mel: &[f32]) -> Result<()> {
        // 3000 frames for every real Whisper (audio_ctx 1500); small test models take fewer.
        let want = self.dims.n_mels * 2 * self.dims.audio_ctx;
        if mel.len() != want {
            return Err(Error::Invalid(format!("a window of {} mel values; the encoder takes {want}", mel.len())));
        }
        self.window_ready = false;
        self.pending = None;
        self.encode(mel)?;
        self.kv_len = 0;
        self.window_ready = true;
        Ok(())
    }

    fn advance(&mut self, tokens: &[u32], rules: &StepRules) -> Result<StepScores> {
        self.check_append("advance", tokens)?;
        self.decode_positions(tokens, rules)
    }

    fn max_verify(&self) -> usize {
        MAX_VERIFY
    }

    fn verify(&mut self, tokens: &[u32], rules: &[StepRules]) -> Result<Vec<StepScores>> {
        self.check_append("verify", tokens)?;
        if tokens.len() > MAX_VERIFY || rules.len() != tokens.len() {
            return Err(Error::Invalid(format!(
                "verify takes 1 to {MAX_VERIFY} tokens with one rule set each, not {} and {}",
                tokens.len(),
                rules.len()
            )));
        }
        self.verify_positions(tokens, rules)
    }

    fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.kv_len {
            return Err(Error::Invalid(format!("rollback of {n} positions with {} in the cache", self.kv_len)));
        }
        // The self-attention reads keys below the KV length only: the dropped positions are
        // overwritten by the next pass. A step encoded ahead was for the old position.
        self.kv_len -= n;
        self.pending = None;
        Ok(())
    }

    fn set_suppress(&mut self, ids: &[u32]) -> Result<()> {
        let words = suppress_bitmask(ids, self.dims.vocab as u32);
        self.gpu.write(&self.suppress, 0, bytemuck::cast_slice(&words));
        Ok(())
    }

    fn max_positions(&self) -> usize {
        self.dims.text_ctx
    }

    fn n_mels(&self) -> usize {
        self.dims.n_mels
    }
}
