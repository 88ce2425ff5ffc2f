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
//! - `verify(tokens)`: speculative decoding's check, up to 32 positions in one pass
//!   (`MAX_VERIFY`), every GEMV in its per-row form (each row bit-identical to a lone
//!   decode step), the logits and the masked selection of every position, 32 bytes back
//!   per position; `rollback` drops positions past the first rejected draft (the KV
//!   length goes back).
//! - `--quant q8_0|q4_0` (`load_with`): the decoder's GEMV weights and the logits
//!   projection block-quantized (gemv_q.wgsl, one kernel for steps, verify passes and
//!   prompts); the encoder and the cross-attention K|V projection stay f16 (GEMM-bound).
//! - A draft model (`set_draft`): the first L decoder layers with quantized weights, the
//!   final LayerNorm and quantized logits, sharing the main model's norms, biases, scratch
//!   and this window's cross-attention K|V. `draft` proposes k tokens in one submission:
//!   each step's choice is picked on the GPU (select_pick) into the token buffer the next
//!   step's embedding reads, so k steps cost one round trip.

use std::sync::Arc;

use wgpu::Buffer;

use super::checkpoint::Checkpoint;
use super::ct2::DType;
use super::Dims;
use crate::decode::{GreedySteps, LogitSource, Step, StepRules, StepScores, TsState};
use crate::gpu::{DispatchCache, Encoded, Gpu, Kept, Moves, Profile, Recorder, Signature, Ticket};
use crate::kernels::{
    scores_from_words, select_params, suppress_bitmask, AttentionArgs, Epilogue, F16Matrix, F16Rows, Kernels, NormArgs, QMatrix,
    Rows, SelectParams, SELECT_FLAG_MARK_DONE, SELECT_FLAG_RULES_FROM_STATE, SELECT_FLAG_TRACK_STATE, SELECT_FLAG_TS_OVER_TEXT,
};
use crate::quant::block::{BlockFormat, BlockQuant};
use crate::threads::side_by_side;
use crate::{Error, Result};

const LN_EPS: f32 = 1e-5;

/// Most positions in one verify pass: the per-row GEMV, the split attention and the
/// selection's output rows are sized for it. `VERBATIM_VERIFY_MAX` (1 to this) caps it
/// at run time, for comparisons.
pub const MAX_VERIFY: usize = crate::kernels::VERIFY_MAX_ROWS as usize;

/// Most tokens one `draft` call proposes: a draft model's tokens cost a step each, so its
/// drafts stay as long as they were before verify passes grew to 16 (not measured longer).
pub const MAX_DRAFT: usize = 8;

/// Most decode steps per readback (`greedy_steps`).
pub const MAX_STEPS: usize = 16;

/// The parts of a decode step as recorded (`Recorder::part`), in order; `verbatim bench
/// --step-parts` leaves each out in turn (`GpuWhisper::leave_out`).
pub const DECODE_PARTS: [&str; 13] = [
    "embed",
    "self_qkv",
    "self_attention",
    "self_out",
    "cross_q",
    "cross_attention",
    "cross_out",
    "fc1",
    "fc2",
    "ffn",
    "final_norm",
    "logits",
    "select",
];
/// Dispatch counts at which a verify pass, or a step not encoded ahead, submits what it has
/// recorded: the embedding and one decoder layer (8 dispatches a layer; the H200 runs a
/// layer of 8 rows in ≈ 0.13 ms while the host records the other layers, ≈ 5 µs a
/// dispatch; −0.05 ms a verify pass of 8, bench/RESULTS.md 2026-12-01).
const EARLY_SUBMIT: &[usize] = &[9];

/// Frames of a recording's spectrogram kept for the kept encoder at most (`begin_window_of`,
/// a host buffer): 5 minutes, 9.6 MB for 80 mel bands, filled a window ahead as the windows
/// come; a window past them starts the kept part again from its own frames.
const RESIDENT_FRAMES: usize = 30_000;

/// Words of the timestamp state (decode::TsState, padded) after the fed tokens.
const TS_STATE_WORDS: usize = 4;

/// Rows of 8 score words the selection output holds (verify rows or greedy steps); after
/// them, 2 words per greedy step: the masks its pick used (select.wgsl, flag 8).
const SCORE_ROWS: usize = if MAX_STEPS > MAX_VERIFY { MAX_STEPS } else { MAX_VERIFY };

/// The decoder's scratch and output buffers, borrowed field by field (so the dispatch
/// cache can be borrowed mutably beside them).
struct DecBufs<'a> {
    tokens: &'a Buffer,
    emb: &'a F16Rows,
    dec_pos: &'a Buffer,
    dec_x: &'a Buffer,
    dec_xn: &'a Buffer,
    dec_q: &'a Buffer,
    dec_attn: &'a Buffer,
    dec_h: &'a Buffer,
    ffn_scratch: &'a Buffer,
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
            ffn_scratch: &$s.ffn_scratch,
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
    /// What it records (`Recorder::signature`), for `retarget_step`.
    sig: Signature,
}

/// Frames `base..base + filled` of a recording's spectrogram in a host buffer the replay's
/// prologue copies from, time-major as `LogMel` holds it: frame `base + i` from float
/// `i * n_mels` (`begin_window_of`).
struct ResidentMel {
    buf: crate::gpu::HostBuffer,
    /// Frames it has room for.
    cap: usize,
    /// Whose frames (the values' address and the recording's frames): None until written,
    /// and once another recording comes (`fresh`).
    holds: Option<(usize, usize)>,
    base: usize,
    filled: usize,
}

struct Norm {
    gamma: Buffer,
    beta: Buffer,
}

struct Linear {
    w: F16Matrix,
    b: Buffer,
}

/// A decoder weight: f16, or block-quantized under `--quant`.
enum Weight {
    F16(F16Matrix),
    Q(QMatrix),
}

impl Weight {
    fn view(&self) -> WRef<'_> {
        match self {
            Weight::F16(m) => WRef::F16(m),
            Weight::Q(q) => WRef::Q(q),
        }
    }
}

struct DecLinear {
    w: Weight,
    b: Buffer,
}

impl DecLinear {
    fn view(&self) -> Lin<'_> {
        Lin { w: self.w.view(), b: &self.b }
    }
}

#[derive(Clone, Copy)]
enum WRef<'a> {
    F16(&'a F16Matrix),
    Q(&'a QMatrix),
    /// The row-major embedding table (the logits).
    Rows(&'a F16Rows),
}

/// A linear layer as one pass records it: its weight (either kind) and bias.
#[derive(Clone, Copy)]
struct Lin<'a> {
    w: WRef<'a>,
    b: &'a Buffer,
}

/// A decoder layer as one pass records it: the main model's own, or the draft model's
/// quantized weights with the main layer's norms, biases and cross-attention K|V.
struct LayerView<'a> {
    self_norm: &'a Norm,
    qkv: Lin<'a>,
    self_out: Lin<'a>,
    cross_norm: &'a Norm,
    cross_q: Lin<'a>,
    cross_out: Lin<'a>,
    ffn_norm: &'a Norm,
    fc1: Lin<'a>,
    fc2: Lin<'a>,
    qkv_cache: &'a Buffer,
    enc_kv: &'a Buffer,
    /// This layer's keys at `kv_off` of each row of `enc_kv`, its values d after.
    kv_off: usize,
    kv_stride: usize,
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
    qkv: DecLinear,
    self_out: DecLinear,
    cross_norm: Norm,
    cross_q: DecLinear,
    cross_out: DecLinear,
    ffn_norm: Norm,
    fc1: DecLinear,
    fc2: DecLinear,
    /// Every position's q | k | v, [text_ctx][3d]: the fused projection writes its output
    /// here directly, so appending to the KV cache costs no copy dispatch.
    qkv_cache: Buffer,
    /// This window's cross-attention keys | values of every layer, [layers][audio_ctx][2d]
    /// (one GEMM writes them all: `GpuWhisper::cross_kv`); this layer's from `kv_off`.
    enc_kv: Buffer,
    kv_off: usize,
    kv_stride: usize,
}

impl DecoderLayer {
    fn view(&self) -> LayerView<'_> {
        LayerView {
            self_norm: &self.self_norm,
            qkv: self.qkv.view(),
            self_out: self.self_out.view(),
            cross_norm: &self.cross_norm,
            cross_q: self.cross_q.view(),
            cross_out: self.cross_out.view(),
            ffn_norm: &self.ffn_norm,
            fc1: self.fc1.view(),
            fc2: self.fc2.view(),
            qkv_cache: &self.qkv_cache,
            enc_kv: &self.enc_kv,
            kv_off: self.kv_off,
            kv_stride: self.kv_stride,
        }
    }
}

/// One layer of the draft model: quantized copies of a decoder layer's GEMV weights and
/// its own q|k|v cache (norms, biases and the cross K|V are the main layer's).
struct DraftLayer {
    qkv: QMatrix,
    self_out: QMatrix,
    cross_q: QMatrix,
    cross_out: QMatrix,
    fc1: QMatrix,
    fc2: QMatrix,
    qkv_cache: Buffer,
}

impl DraftLayer {
    fn view<'a>(&'a self, main: &'a DecoderLayer) -> LayerView<'a> {
        let lin = |q: &'a QMatrix, b: &'a DecLinear| Lin { w: WRef::Q(q), b: &b.b };
        LayerView {
            self_norm: &main.self_norm,
            qkv: lin(&self.qkv, &main.qkv),
            self_out: lin(&self.self_out, &main.self_out),
            cross_norm: &main.cross_norm,
            cross_q: lin(&self.cross_q, &main.cross_q),
            cross_out: lin(&self.cross_out, &main.cross_out),
            ffn_norm: &main.ffn_norm,
            fc1: lin(&self.fc1, &main.fc1),
            fc2: lin(&self.fc2, &main.fc2),
            qkv_cache: &self.qkv_cache,
            enc_kv: &main.enc_kv,
            kv_off: main.kv_off,
            kv_stride: main.kv_stride,
        }
    }
}

/// The draft model of speculative decoding (see the module documentation).
struct DraftModel {
    format: BlockFormat,
    layers: Vec<DraftLayer>,
    logits_w: QMatrix,
    /// Tokens by position: the context written by the host, the draft's own picks after it.
    tokens: Buffer,
    logits: Buffer,
    readback: Buffer,
    /// The tokens whose K|V the draft's caches hold, by position.
    fed: Vec<u32>,
    cache: DispatchCache,
}

pub struct GpuWhisper {
    gpu: Arc<Gpu>,
    kern: Kernels,
    pub dims: Dims,
    eot: u32,
    ts_begin: u32,
    conv1: Linear,
    /// conv1's im2col columns (3 n_mels): its weight may have zero rows past them
    /// (`Kernels::conv_padded_k`).
    conv1_cols: u32,
    conv2: Linear,
    enc_pos: Buffer,
    enc_layers: Vec<EncoderLayer>,
    enc_norm: Norm,
    /// Every decoder layer's cross-attention K|V projection side by side ([layers·2d][d]):
    /// one GEMM a window instead of one a layer.
    cross_kv: Linear,
    /// Their output, [layers][audio_ctx][2d] (each decoder layer holds a handle to it; its
    /// rows as a buffer of its own would hold them, for the decode attention).
    enc_kv: Buffer,
    emb: F16Rows,
    /// The logits projection under `--quant` (the tied embedding, quantized); None: `emb`.
    logits_q: Option<QMatrix>,
    dec_pos: Buffer,
    dec_layers: Vec<DecoderLayer>,
    dec_norm: Norm,
    /// `--quant`: the decoder's weight format (None: f16).
    quant: Option<BlockFormat>,
    draft: Option<DraftModel>,
    // Scratch.
    mel: Buffer,
    /// The part of a recording's spectrogram kept in a host buffer (`begin_window_of`).
    resident: Option<ResidentMel>,
    /// The window the encoder reads there (`record_encoder`), copied from it: time-major,
    /// `[frames][n_mels]`.
    mel_by_frame: Option<Buffer>,
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
    /// ffn_decode's partials (one decoder feed-forward block at a time).
    ffn_scratch: Buffer,
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
    /// The host's seconds in `encode` summed over windows: the mel's upload (queued, or
    /// nothing where it goes in a replay's prologue), recording and submission, the wait;
    /// and the windows counted (`verbatim bench` prints them per window).
    pub encoder_host: (f64, f64, f64, u64),
    /// A verify pass (and a step not encoded ahead) submits what it has recorded when its
    /// dispatch count reaches each of these, so the GPU runs the first layers while the host
    /// records the rest; empty: the whole pass recorded before one submission.
    /// `VERBATIM_EARLY_SUBMIT=a,b,..` (or 0) sets it for a run (to compare); `verbatim
    /// bench` times it against one submission.
    pub early_submit: Vec<usize>,
    /// Whether the encoder goes to the GPU in parts (`encode`): on unless
    /// `VERBATIM_ENCODER_EARLY=0`; `verbatim bench` times it both ways.
    pub encoder_parts: bool,
    /// Whether the encoder is replayed (`Recorder::replay`: a raw Vulkan command buffer
    /// built once) from a model's second window on, where the device allows it: on unless
    /// `VERBATIM_ENCODER_REPLAY=0`; `verbatim bench` times it against the rows above. Not
    /// the first window: its program is built on that replay's first use (the kernels'
    /// raw pipelines compiled), which a file of one window would pay for nothing.
    pub encoder_replay: bool,
    /// Where a replayed encoder's mel goes up: in the replay's prologue, copied from the
    /// replay's own staging buffer in device-local host-visible memory (the default), or
    /// through wgpu's staging and an empty submission before the replay
    /// (`VERBATIM_ENCODER_MEL=wgpu`). H100, alternated in one process: tiny.en 1.375-1.447
    /// against 1.389-1.500 ms a window, small.en 9.39 both (RESULTS.md 2026-12-07, twenty-
    /// second session); from host memory the prologue's copy was 0.05 ms slower than wgpu's,
    /// and as `vkCmdUpdateBuffer`s ~0.2 ms. `verbatim bench` times both.
    pub encoder_mel_prologue: bool,
    /// Windows encoded so far (`encoder_replay` waits for the second).
    windows_encoded: u64,
    /// The replayed encoder kept (`Recorder::replay_kept`): from its second replay on the
    /// program is submitted again without recording the window (the same dispatches and
    /// parameters every window; only the mel differs). `VERBATIM_ENCODER_RERECORD=1`
    /// records every window (`verbatim bench` times both).
    encoder_kept: Option<Kept>,
    /// Whether a replayed encoder records every window (not kept; see above).
    pub encoder_rerecord: bool,
    /// The kept encoder over `mel_by_frame` (`encode_resident`).
    encoder_kept_resident: Option<Kept>,
    /// Whether the replayed encoder takes a recording's windows (`begin_window_of`) through
    /// the spectrogram kept time-major in a host buffer (`encode_resident`): copied by the
    /// prologue, one region, from what the host wrote ahead, where the host would otherwise
    /// cut each window out (a 960 KB vector transposed to band-major) and write it before
    /// the GPU starts. On unless `VERBATIM_ENCODER_RESIDENT=0`: H100, tiny.en 1.323-1.335
    /// ms a window against 1.656-1.708 cut out, small.en 9.334 against 10.092; over a
    /// 104.6 s file (4 windows) the encoder stage 7.0 ms against 9.1, jfk's one window 1.4
    /// against 1.6 (RESULTS.md 2026-12-07, twenty-sixth session). Windows of their own
    /// (`begin_window`, band-major) take the mel buffer. `verbatim bench` times both.
    pub encoder_resident: bool,
    /// Frames the kept spectrogram holds at a time: [`RESIDENT_FRAMES`] (tests set fewer).
    pub resident_frames: usize,
    /// Windows copied from the kept spectrogram so far (for tests and the bench).
    pub resident_windows: u64,
    /// Whether a step encoded ahead survives a rollback, to be moved to the new position
    /// by its parameters (`retarget_step`): on unless `VERBATIM_RETARGET=0`; `verbatim
    /// bench` times the step after a rollback both ways.
    pub retarget: bool,
    /// For measuring only (`verbatim bench`): a batch of steps (`greedy_steps`) is recorded
    /// and encoded whole before its clock starts, so `host_times` holds only its submission
    /// and wait: what the GPU takes for the batch with the host's recording off the path.
    pub batch_encoded_first: bool,
    /// Whether verify passes and single steps are replayed (`Recorder::replay`: a raw
    /// Vulkan command buffer per distinct pass or step, submitted again after a prologue
    /// with its parameters and tokens) where the device allows it (`Gpu::replay_available`;
    /// `VERBATIM_REPLAY=0` turns that off), instead of encoded through wgpu each time (a
    /// step then encoded ahead while the last one runs): `verbatim bench` times both.
    pub replay: bool,
    /// A part of the decoder (one of [`DECODE_PARTS`]) left out of every decode step and
    /// verify pass recorded from now on (`verbatim bench --step-parts`: what the part costs
    /// in the stream). For measuring only: the results are then wrong. A step already
    /// encoded ahead keeps what it was recorded with.
    pub leave_out: Option<&'static str>,
    /// Most positions a verify pass takes (`max_verify`): [`MAX_VERIFY`], or
    /// `VERBATIM_VERIFY_MAX`, or `set_verify_max` (the bench compares pass lengths).
    verify_max: usize,
    /// The next single-token step, encoded while the last one ran.
    pending: Option<PendingStep>,
    enc_cache: DispatchCache,
    /// The same for the encoder over the kept spectrogram's GPU copy (`record_encoder`).
    enc_resident_cache: DispatchCache,
    dec_cache: DispatchCache,
    /// Verify passes keep their own bind groups (another dispatch sequence).
    ver_cache: DispatchCache,
    /// So do submissions of several steps.
    steps_cache: DispatchCache,
    /// And a batch encoded whole before its clock (`batch_encoded_first`).
    batch_cache: DispatchCache,
    /// And a replayed prompt (`decode_positions` with more than one token).
    prompt_cache: DispatchCache,
    /// The grids of a batch's gated steps (`greedy_positions`): `gate_stride` dispatches'
    /// worth per step, zeroed on the device for the steps after a picked end-of-text.
    step_grids: Buffer,
}

/// The u32 words in each byte range of a mapped readback buffer, then unmapped.
fn read_mapped(buf: &Buffer, ranges: &[std::ops::Range<usize>]) -> Result<Vec<Vec<u32>>> {
    let words = {
        let view = buf.get_mapped_range(..).map_err(|e| Error::Gpu(format!("reading results back: {e}")))?;
        ranges.iter().map(|r| bytemuck::pod_collect_to_vec(&view[r.clone()])).collect()
    };
    buf.unmap();
    Ok(words)
}

/// The steps of a batch of device-picked steps per submission, in order, the last size
/// repeating: 1, 2, 4, 8 (see `greedy_positions`; `VERBATIM_STEP_CHUNKS=1,4` for example
/// sets another schedule, to compare them on a device).
fn step_chunks() -> &'static [usize] {
    static CHUNKS: std::sync::OnceLock<Vec<usize>> = std::sync::OnceLock::new();
    CHUNKS.get_or_init(|| {
        let given: Option<Vec<usize>> = std::env::var("VERBATIM_STEP_CHUNKS")
            .ok()
            .and_then(|v| v.split(',').map(|c| c.trim().parse().ok().filter(|&n| n > 0)).collect());
        given.filter(|v| !v.is_empty()).unwrap_or_else(|| vec![1, 2, 4, 8])
    })
}

/// A gated decode step (see `greedy_positions`): the grid table, the byte range of the
/// step's grids in it, and the word in `tokens` of the batch's done flag.
struct StepGate<'a> {
    grids: &'a Buffer,
    range: std::ops::Range<u64>,
    done_off: u32,
}

/// Dispatches a decode step may have (its gated grids' stride in the table): per layer
/// at most 8 plus the self-attention's merge past 256 keys, and the embedding, final norm,
/// logits and selection.
fn gate_stride(dims: &Dims) -> usize {
    10 * dims.decoder_layers + 8
}

/// `n` as the most positions of a verify pass: 1 to [`MAX_VERIFY`].
fn checked_verify_max(n: usize) -> Result<usize> {
    if (1..=MAX_VERIFY).contains(&n) {
        Ok(n)
    } else {
        Err(Error::Invalid(format!("verify passes of {n} positions (1 to {MAX_VERIFY})")))
    }
}

/// The most positions of a verify pass as `VERBATIM_VERIFY_MAX` sets it (`setting`), or
/// [`MAX_VERIFY`] when unset.
fn verify_max_setting(setting: Option<&str>) -> Result<usize> {
    let Some(v) = setting else {
        return Ok(MAX_VERIFY);
    };
    let n = v.trim().parse::<usize>().map_err(|_| Error::Invalid(format!("VERBATIM_VERIFY_MAX={v:?}: not a number of positions")))?;
    checked_verify_max(n).map_err(|e| Error::Invalid(format!("VERBATIM_VERIFY_MAX: {e}")))
}

/// Whether the steps of a batch after a device-picked end-of-text are gated off (the
/// default; `VERBATIM_GATED_STEPS=0` computes them, to compare on a device).
fn steps_gated() -> bool {
    static GATED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *GATED.get_or_init(|| std::env::var("VERBATIM_GATED_STEPS").map_or(true, |v| v != "0"))
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

/// A checkpoint matrix's [n][k] (k the product of the trailing dimensions), refused if its
/// f16 values would not fit one storage binding.
fn matrix_dims(gpu: &Gpu, ck: &Checkpoint, name: &str) -> Result<(usize, usize)> {
    let t = ck.tensor(name)?;
    let n = t.dims[0];
    let k: usize = t.dims[1..].iter().product();
    if n * k * 2 > gpu.info.max_storage_binding as usize {
        return Err(Error::Unsupported(format!(
            "weight {name} ({} MB) exceeds the adapter's storage binding limit ({} MB)",
            (n * k * 2) >> 20,
            gpu.info.max_storage_binding >> 20
        )));
    }
    Ok((n, k))
}

/// A checkpoint matrix's f16 bits as stored ([n][k], k the product of the trailing
/// dimensions), refused if it would not fit one storage binding.
fn matrix_bits<'c>(gpu: &Gpu, ck: &'c Checkpoint, name: &str) -> Result<(std::borrow::Cow<'c, [u16]>, usize, usize)> {
    let (n, k) = matrix_dims(gpu, ck, name)?;
    Ok((ck.f16_bits(name)?, n, k))
}

fn matrix(gpu: &Gpu, ck: &Checkpoint, name: &str) -> Result<F16Matrix> {
    let (bits, n, k) = matrix_bits(gpu, ck, name)?;
    F16Matrix::from_bits(gpu, name, &bits, n, k)
}

/// A checkpoint matrix as stored, row-major (the embedding table: see F16Rows). Stored as
/// float16, its bytes go up as they lie in the file (no copy: 40 of tiny.en's 76 MB).
fn rows_matrix(gpu: &Gpu, ck: &Checkpoint, name: &str) -> Result<F16Rows> {
    let t = ck.tensor(name)?;
    if t.dtype == DType::F16 && cfg!(target_endian = "little") {
        let (n, k) = matrix_dims(gpu, ck, name)?;
        return F16Rows::from_le_bytes(gpu, name, t.bytes, n, k);
    }
    let (bits, n, k) = matrix_bits(gpu, ck, name)?;
    F16Rows::from_bits(gpu, name, &bits, n, k)
}

/// The tokenizer's `eot` and first timestamp against the model's vocabulary.
fn check_specials(ck: &Checkpoint, eot: u32, timestamp_begin: u32) -> Result<()> {
    if eot >= timestamp_begin || timestamp_begin > ck.dims.vocab as u32 {
        return Err(Error::model(
            &ck.dir,
            format!("the tokenizer puts eot at {eot} and timestamps at {timestamp_begin}, which does not fit a vocabulary of {}", ck.dims.vocab),
        ));
    }
    Ok(())
}

/// A checkpoint matrix block-quantized (the weight's [n][k] f16 bits as stored).
fn qmatrix(gpu: &Gpu, ck: &Checkpoint, name: &str, format: BlockFormat) -> Result<QMatrix> {
    let t = ck.tensor(name)?;
    let n = t.dims[0];
    let k: usize = t.dims[1..].iter().product();
    let q = BlockQuant::from_f16_bits(format, &ck.f16_bits(name)?, n, k)?;
    if q.words.len() as u64 * 4 > gpu.info.max_storage_binding {
        return Err(Error::Unsupported(format!("weight {name} in {} exceeds the adapter's storage binding limit", format.name())));
    }
    QMatrix::upload(gpu, &format!("{name} {}", format.name()), &q)
}

fn dec_linear(gpu: &Gpu, ck: &Checkpoint, prefix: &str, quant: Option<BlockFormat>) -> Result<DecLinear> {
    let name = format!("{prefix}/weight");
    Ok(DecLinear {
        w: match quant {
            Some(f) => Weight::Q(qmatrix(gpu, ck, &name, f)?),
            None => Weight::F16(matrix(gpu, ck, &name)?),
        },
        b: gpu.upload_f32(&format!("{prefix}/bias"), &ck.f32(&format!("{prefix}/bias"))?)?,
    })
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
        Self::load_with(gpu, ck, eot, timestamp_begin, None)
    }

    /// [`GpuWhisper::load`] with the decoder's weights in `quant` (None: f16). The kernels
    /// compile on worker threads while the weights upload (`Gpu::compile_together`).
    pub fn load_with(
        gpu: Arc<Gpu>,
        ck: &Checkpoint,
        eot: u32,
        timestamp_begin: u32,
        quant: Option<BlockFormat>,
    ) -> Result<GpuWhisper> {
        Self::load_beside(gpu, ck, quant, || Ok(((), eot, timestamp_begin))).map(|(m, ())| m)
    }

    /// [`GpuWhisper::load_with`] with the special ids from `side`, which runs on a thread of
    /// its own meanwhile and returns them with a value handed back beside the model: the
    /// tokenizer, whose parse (~70 ms on the lent H100's host) then overlaps the upload.
    pub fn load_beside<T: Send>(
        gpu: Arc<Gpu>,
        ck: &Checkpoint,
        quant: Option<BlockFormat>,
        side: impl FnOnce() -> Result<(T, u32, u32)> + Send,
    ) -> Result<(GpuWhisper, T)> {
        std::thread::scope(|s| {
            let side = s.spawn(side);
            let model = gpu.clone().compile_together(|| Self::load_parts(gpu, ck, quant));
            let (t, eot, timestamp_begin) = side.join().map_err(|_| Error::Gpu("the thread beside the model load panicked".into()))??;
            let mut m = model?;
            check_specials(ck, eot, timestamp_begin)?;
            (m.eot, m.ts_begin) = (eot, timestamp_begin);
            Ok((m, t))
        })
    }

    /// Everything but the special ids (set by the callers once checked).
    fn load_parts(gpu: Arc<Gpu>, ck: &Checkpoint, quant: Option<BlockFormat>) -> Result<GpuWhisper> {
        let g = &*gpu;
        let dims = ck.dims;
        let d = dims.d_model;
        if dims.head_dim() > 128 || d % dims.n_heads != 0 {
            return Err(Error::Unsupported(format!("{} heads of width {d}", dims.n_heads)));
        }
        let mut kern = Kernels::load(g)?;
        // The encoder's self-attention splits its keys (attention_blocked.wgsl + merge).
        kern.reserve_blocked_attention(g, dims.audio_ctx as u32, dims.n_heads as u32)?;
        // The linear layers of many rows (the encoder's audio_ctx, a prefill's prompt) split
        // their input into f16 planes first (gemm_planes.wgsl, where the device has
        // cooperative matrices).
        kern.reserve_gemm_planes(g, dims.audio_ctx.max(dims.text_ctx) as u32, dims.d_model.max(dims.ffn) as u32)?;
        let cache = (dims.text_ctx * 3 * d * 4) as u64;
        let kv_stride = 2 * d;
        let enc_kv = g.buffer("cross k|v", (dims.decoder_layers * dims.audio_ctx * kv_stride * 4) as u64)?;
        // Each layer's weights are copied, transposed and uploaded on a thread of their own
        // (`side_by_side`), the decoder's beside the encoder's and the embedding table (the
        // largest tensor, uploaded as stored) beside both: one after another that host work
        // took ~95 ms of a tiny.en load on the lent H100s (2026-12-06, eighteenth session),
        // longer than anything else there once the device was open.
        let table = "decoder/embeddings/weight";
        let ((emb, logits_q), enc_layers, (cross_kv, dec_layers)) = std::thread::scope(|s| {
            // The replay's raw pipelines of the decode kernels, which the first file's passes
            // would otherwise wait for. A kernel that fails here is compiled again where a
            // pass first takes it, which reports the error.
            s.spawn(|| g.prebuild_replay(&kern.decode_kernels(quant.is_some())));
            let emb = s.spawn(|| -> Result<_> {
                let q = match quant {
                    Some(f) => Some(qmatrix(g, ck, table, f)?),
                    None => None,
                };
                Ok((rows_matrix(g, ck, table)?, q))
            });
            let decoder = s.spawn(|| -> Result<_> {
                let cross_kv = {
                    let (mut w, mut b) = (Vec::new(), Vec::new());
                    for i in 0..dims.decoder_layers {
                        let p = format!("decoder/layer_{i}/attention/linear_1");
                        let (bits, n, k) = matrix_bits(g, ck, &format!("{p}/weight"))?;
                        let bias = ck.f32(&format!("{p}/bias"))?;
                        if n != 2 * d || k != d || bias.len() != n {
                            return Err(Error::model(&ck.dir, format!("{p}: {n} x {k} with {} biases, not {} x {d}", bias.len(), 2 * d)));
                        }
                        w.extend_from_slice(&bits);
                        b.extend_from_slice(&bias);
                    }
                    if w.len() * 2 > g.info.max_storage_binding as usize {
                        return Err(Error::Unsupported(format!("the cross K|V weights ({} MB) exceed the adapter's storage binding limit", (w.len() * 2) >> 20)));
                    }
                    Linear { w: F16Matrix::from_bits(g, "cross k|v weights", &w, dims.decoder_layers * 2 * d, d)?, b: g.upload_f32("cross k|v biases", &b)? }
                };
                let dec_layers = side_by_side(dims.decoder_layers, |i| {
                    let p = format!("decoder/layer_{i}");
                    Ok(DecoderLayer {
                        self_norm: norm(g, ck, &format!("{p}/self_attention/layer_norm"))?,
                        qkv: dec_linear(g, ck, &format!("{p}/self_attention/linear_0"), quant)?,
                        self_out: dec_linear(g, ck, &format!("{p}/self_attention/linear_1"), quant)?,
                        cross_norm: norm(g, ck, &format!("{p}/attention/layer_norm"))?,
                        cross_q: dec_linear(g, ck, &format!("{p}/attention/linear_0"), quant)?,
                        cross_out: dec_linear(g, ck, &format!("{p}/attention/linear_2"), quant)?,
                        ffn_norm: norm(g, ck, &format!("{p}/ffn/layer_norm"))?,
                        fc1: dec_linear(g, ck, &format!("{p}/ffn/linear_0"), quant)?,
                        fc2: dec_linear(g, ck, &format!("{p}/ffn/linear_1"), quant)?,
                        qkv_cache: g.buffer("q|k|v cache", cache)?,
                        enc_kv: enc_kv.clone(),
                        kv_off: i * dims.audio_ctx * 2 * d,
                        kv_stride,
                    })
                })?
                .into_iter()
                .collect::<Result<Vec<_>>>()?;
                Ok((cross_kv, dec_layers))
            });
            let layers = side_by_side(dims.encoder_layers, |i| {
                let p = format!("encoder/layer_{i}");
                Ok(EncoderLayer {
                    attn_norm: norm(g, ck, &format!("{p}/self_attention/layer_norm"))?,
                    qkv: linear(g, ck, &format!("{p}/self_attention/linear_0"))?,
                    attn_out: linear(g, ck, &format!("{p}/self_attention/linear_1"))?,
                    ffn_norm: norm(g, ck, &format!("{p}/ffn/layer_norm"))?,
                    fc1: linear(g, ck, &format!("{p}/ffn/linear_0"))?,
                    fc2: linear(g, ck, &format!("{p}/ffn/linear_1"))?,
                })
            })?
            .into_iter()
            .collect::<Result<Vec<_>>>();
            let emb = emb.join().map_err(|_| Error::Gpu("the embedding table's thread panicked".into()))?;
            let decoder = decoder.join().map_err(|_| Error::Gpu("the decoder weights' thread panicked".into()))?;
            Ok::<_, Error>((emb?, layers?, decoder?))
        })?;
        // conv1 (K = 3 x 80 = 240) on the GEMM over planes wants K a multiple of its slice:
        // its weight gets zero rows to the next one.
        let conv1 = {
            let name = "encoder/conv1/weight";
            let (bits, n, k) = matrix_bits(g, ck, name)?;
            let b = g.upload_f32("encoder/conv1/bias", &ck.f32("encoder/conv1/bias")?)?;
            match kern.conv_padded_k(k as u32).map(|p| p as usize).filter(|&p| p != k) {
                Some(kp) => {
                    let mut padded = vec![0u16; n * kp];
                    for (row, src) in padded.chunks_mut(kp).zip(bits.chunks(k)) {
                        row[..k].copy_from_slice(src);
                    }
                    (Linear { w: F16Matrix::from_bits(g, name, &padded, n, kp)?, b }, k as u32)
                }
                None => (Linear { w: F16Matrix::from_bits(g, name, &bits, n, k)?, b }, k as u32),
            }
        };
        let (a, t, f) = (dims.audio_ctx, dims.text_ctx, dims.ffn);
        let f32s = |n: usize| (n * 4) as u64;
        Ok(GpuWhisper {
            kern,
            dims,
            eot: 0,
            ts_begin: 0,
            conv1: conv1.0,
            conv1_cols: conv1.1,
            conv2: linear(g, ck, "encoder/conv2")?,
            enc_pos: g.upload_f32("encoder positions", &ck.f32("encoder/position_encodings/encodings")?)?,
            enc_layers,
            enc_norm: norm(g, ck, "encoder/layer_norm")?,
            cross_kv,
            enc_kv,
            emb,
            logits_q,
            quant,
            draft: None,
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
            ffn_scratch: g.buffer("decoder feed-forward partials", crate::kernels::ffn_scratch_words(d as u32, f as u32) * 4)?,
            // The fed tokens, then the timestamp state of batched steps (TS_STATE_WORDS at
            // word t + 1) and the batch's done flag (see `greedy_positions`).
            tokens: g.buffer("tokens", ((t + 1 + TS_STATE_WORDS + 1) * 4) as u64)?,
            step_grids: g.grid_table("gated step grids", (MAX_STEPS * gate_stride(&dims) * 12) as u64)?,
            // One row per verified position.
            logits: g.buffer("logits", f32s(dims.vocab * MAX_VERIFY))?,
            suppress: g.upload_u32("suppress", &suppress_bitmask(&[], dims.vocab as u32))?,
            select_out: g.buffer("select out", 40 * SCORE_ROWS as u64)?,
            // Scores, then (greedy steps) the chosen tokens and the masks used.
            readback: g.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("select readback"),
                size: 44 * SCORE_ROWS as u64,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            kv_len: 0,
            window_ready: false,
            profile: Profile::default(),
            host_times: (0.0, 0.0, 0),
            encoder_host: (0.0, 0.0, 0.0, 0),
            early_submit: std::env::var("VERBATIM_EARLY_SUBMIT")
                .ok()
                .and_then(|v| v.split(',').map(|c| c.trim().parse().ok()).collect::<Option<Vec<usize>>>())
                .map(|v| v.into_iter().filter(|&c| c > 0).collect())
                .unwrap_or_else(|| EARLY_SUBMIT.to_vec()),
            encoder_parts: std::env::var("VERBATIM_ENCODER_EARLY").map_or(true, |v| v != "0"),
            encoder_replay: std::env::var("VERBATIM_ENCODER_REPLAY").map_or(true, |v| v != "0"),
            encoder_mel_prologue: std::env::var("VERBATIM_ENCODER_MEL").map_or(true, |v| v != "wgpu"),
            windows_encoded: 0,
            encoder_kept: None,
            encoder_rerecord: std::env::var("VERBATIM_ENCODER_RERECORD").is_ok_and(|v| v == "1"),
            encoder_resident: std::env::var("VERBATIM_ENCODER_RESIDENT").map_or(true, |v| v != "0"),
            resident_frames: RESIDENT_FRAMES,
            resident_windows: 0,
            resident: None,
            mel_by_frame: None,
            encoder_kept_resident: None,
            retarget: std::env::var("VERBATIM_RETARGET").map_or(true, |v| v != "0"),
            batch_encoded_first: false,
            replay: true,
            leave_out: None,
            verify_max: verify_max_setting(std::env::var("VERBATIM_VERIFY_MAX").ok().as_deref())?,
            pending: None,
            enc_cache: DispatchCache::default(),
            enc_resident_cache: DispatchCache::default(),
            dec_cache: DispatchCache::default(),
            ver_cache: DispatchCache::default(),
            steps_cache: DispatchCache::default(),
            batch_cache: DispatchCache::default(),
            prompt_cache: DispatchCache::default(),
            gpu,
        })
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    /// Record the encoder over one window and run it. The host records a dispatch in 2-5 µs
    /// on the lent H100 / H200 machines (38 dispatches for tiny.en, 110 for small.en), so
    /// the recording goes to the GPU in parts (`Recorder::flush`): after the first
    /// convolution, after the second and after the first layer, each part submitted while
    /// the host records the next; from the first layer on the GPU's work (~0.3 ms a tiny.en
    /// layer) outruns the recording. H200, alternated in one process: small.en 9.37-9.41 ms
    /// a window against 9.59-9.63 recorded whole; tiny.en within the noise (1.50 / 1.51 /
    /// 1.54 against 1.49 / 1.52 / 1.59): its recording is short, and each submission costs
    /// the host and the GPU a little. `encoder_parts` (`VERBATIM_ENCODER_EARLY=0`: off)
    /// records it whole before one submission, as before 2026-12-05. From the second window
    /// on (`encoder_replay`) the whole recording is replayed instead where the device
    /// allows it: the host records without encoding and uploads the parameters in the
    /// replay's prologue. H100, alternated in one process (`verbatim bench`): tiny.en 1.390-
    /// 1.396 ms a window against 1.489-1.491 through wgpu in parts and 1.472-1.477 whole;
    /// small.en 9.42 against 9.49 and 9.65.
    fn encode(&mut self, mel: &[f32]) -> Result<()> {
        let t_start = std::time::Instant::now();
        let g = self.gpu.clone();
        // Replayed, the recording is whole (nothing submitted early) and the mel goes up
        // through wgpu with an empty submission of its own (a queued write lands only with
        // wgpu's next submission) or in the replay's prologue (`encoder_mel_prologue`).
        let replaying = self.encoder_replay && self.windows_encoded > 0 && self.replaying();
        self.windows_encoded += 1;
        let mel_prologue = replaying && self.encoder_mel_prologue;
        if !mel_prologue {
            g.write(&self.mel, 0, bytemuck::cast_slice(mel));
            if replaying {
                // The queued write lands with wgpu's next submission, before the replay's.
                g.queue.submit([]);
            }
        }
        let t_mel = std::time::Instant::now();
        let mel_bytes = bytemuck::cast_slice::<f32, u8>(mel);
        let mel_write = [(&self.mel, 0, mel_bytes)];
        let writes: &[(&wgpu::Buffer, u64, &[u8])] = if mel_prologue { &mel_write } else { &[] };
        if let Some(kept) = self.encoder_kept.as_ref().filter(|_| replaying && !self.encoder_rerecord) {
            if let Some(t) = kept.submit(&g, writes, Some(&mut self.profile))? {
                let t_submitted = std::time::Instant::now();
                self.gpu.replay_wait(t)?;
                self.add_encoder_host(t_start, t_mel, t_submitted);
                return Ok(());
            }
            self.encoder_kept = None; // the program was dropped: record it anew
        }
        self.record_encoder(false, replaying, mel_prologue.then_some(mel_bytes), t_start, t_mel)
    }

    /// Record the encoder and submit it: replayed (its program kept in `encoder_kept`, or
    /// `encoder_kept_resident` where `by_frame`) where `replaying`, else through wgpu (in
    /// parts where `encoder_parts`); then wait. Its input: the mel buffer `[n_mels][frames]`
    /// (with `mel_bytes` written into it by the replay's prologue), or where `by_frame` the
    /// window copied from the kept spectrogram, `mel_by_frame`, `[frames][n_mels]`.
    fn record_encoder(&mut self, by_frame: bool, replaying: bool, mel_bytes: Option<&[u8]>, t_start: std::time::Instant, t_mel: std::time::Instant) -> Result<()> {
        let d = self.dims.d_model as u32;
        let a = self.dims.audio_ctx as u32;
        let frames = 2 * a;
        let g = self.gpu.clone();
        let mel_write: Vec<(&wgpu::Buffer, u64, &[u8])> = mel_bytes.map(|b| (&self.mel, 0, b)).into_iter().collect();
        let writes = &mel_write[..];
        // (a band's stride, a frame's)
        let (input, band_stride, frame_stride) = match (by_frame, self.mel_by_frame.as_ref()) {
            (true, Some(buf)) => (buf, 1, self.dims.n_mels as u32),
            (true, None) => return Err(Error::Gpu("the encoder's time-major input is not there".into())),
            (false, _) => (&self.mel, frames, 1),
        };
        let k = &self.kern;
        let mut rec = g.recorder_cached(if by_frame { &mut self.enc_resident_cache } else { &mut self.enc_cache });
        rec.stage("encoder");
        let gelu = Epilogue { gelu: true, accumulate: false };
        // conv1 reads the mel band-major ([n_mels][frames]) or time-major ([frames][n_mels])
        // and writes time-major [frames][d].
        rec.stage("encoder conv1");
        k.conv_k3_cols(&mut rec, input, frames, band_stride, frame_stride, 1, &self.conv1.w, self.conv1_cols, &self.conv1.b, &self.enc_h, gelu)?;
        let early = self.encoder_parts && !replaying;
        if early {
            rec.flush()?;
        }
        // x = positions, then x += GELU(conv2(h)) (stride 2: 3000 -> 1500 frames).
        rec.copy(&self.enc_pos, 0, &self.enc_x, 0, (a * d * 4) as u64);
        rec.stage("encoder conv2");
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
        if early {
            rec.flush()?;
        }
        rec.stage("encoder");
        let acc = Epilogue { gelu: false, accumulate: true };
        let plain = Epilogue::default();
        let heads = self.dims.n_heads as u32;
        let hd = self.dims.head_dim() as u32;
        let (du, f) = (d as usize, self.dims.ffn);
        // The GEMMs under stages of their own ("encoder qkv", ...): they share one kernel,
        // and the per-kernel table then times each shape apart.
        // y (=|+=) act(LayerNorm(x) Wᵀ + b): where the GEMM runs over f16 planes, the
        // LayerNorm writes them (one dispatch, not a LayerNorm and a split).
        // (`VERBATIM_NORM_PLANES=0`: a LayerNorm and a split, to compare on a device)
        let into_planes = k.norm_into_planes;
        let norm_linear = |rec: &mut Recorder, norm: &Norm, lin: &Linear, y: Rows, ep: Epilogue, stage: &'static str| -> Result<()> {
            if into_planes && k.uses_planes(a, &lin.w) {
                k.layer_norm_planes(rec, &self.enc_x, 0, a, d, &norm.gamma, &norm.beta, LN_EPS)?;
                rec.stage(stage);
                k.linear_on_planes(rec, a, &lin.w, Some(&lin.b), y, ep)?;
            } else {
                k.layer_norm(rec, &self.enc_x, 0, a, d, &norm.gamma, &norm.beta, &self.enc_xn, 0, LN_EPS)?;
                rec.stage(stage);
                k.linear(rec, Rows::new(&self.enc_xn, du), a, &lin.w, Some(&lin.b), y, ep)?;
            }
            rec.stage("encoder");
            Ok(())
        };
        // Where the GEMMs can write f16 planes themselves (`VERBATIM_EPILOGUE_PLANES=0`: not,
        // to compare on a device): the Q|K|V projection writes the attention's head planes,
        // fc1 the planes fc2 reads; two splits a layer go.
        let epilogue_planes = into_planes && k.gemm_into_planes;
        for (li, l) in self.enc_layers.iter().enumerate() {
            let args = AttentionArgs {
                q: Rows::at(&self.enc_qkv, 0, 3 * du),
                k: Rows::at(&self.enc_qkv, du, 3 * du),
                v: Rows::at(&self.enc_qkv, 2 * du, 3 * du),
                out: Rows::new(&self.enc_attn, du),
                tq: a,
                tk: a,
                heads,
                head_dim: hd,
                causal: None,
            };
            // The attention's splits merged into the out projection's planes
            // (`VERBATIM_MERGE_PLANES=0`: into rows, split again by the GEMM).
            let mut out_on_planes = false;
            if epilogue_planes && hd == 64 && k.qkv_to_heads(a, heads, &l.qkv.w) {
                k.layer_norm_planes(&mut rec, &self.enc_x, 0, a, d, &l.attn_norm.gamma, &l.attn_norm.beta, LN_EPS)?;
                rec.stage("encoder qkv");
                k.linear_planes_to_heads(&mut rec, a, heads, &l.qkv.w, Some(&l.qkv.b))?;
                rec.stage("encoder");
                out_on_planes = k.merge_into_planes && k.attention_to_planes(a, heads, &l.attn_out.w);
                match out_on_planes {
                    true => k.attention_into_planes(&mut rec, &args)?,
                    false => k.attention_on_head_planes(&mut rec, &args)?,
                }
            } else {
                norm_linear(&mut rec, &l.attn_norm, &l.qkv, Rows::new(&self.enc_qkv, 3 * du), plain, "encoder qkv")?;
                k.attention(&mut rec, &args)?;
            }
            rec.stage("encoder out");
            match out_on_planes {
                true => k.linear_on_planes(&mut rec, a, &l.attn_out.w, Some(&l.attn_out.b), Rows::new(&self.enc_x, du), acc)?,
                false => k.linear(&mut rec, Rows::new(&self.enc_attn, du), a, &l.attn_out.w, Some(&l.attn_out.b), Rows::new(&self.enc_x, du), acc)?,
            }
            rec.stage("encoder");
            if epilogue_planes && k.planes_to_planes(a, &l.fc1.w) && k.takes_second_planes(a, &l.fc2.w) {
                k.layer_norm_planes(&mut rec, &self.enc_x, 0, a, d, &l.ffn_norm.gamma, &l.ffn_norm.beta, LN_EPS)?;
                rec.stage("encoder fc1");
                k.linear_planes_to_planes(&mut rec, a, &l.fc1.w, Some(&l.fc1.b), true)?;
                rec.stage("encoder fc2");
                k.linear_on_second_planes(&mut rec, a, &l.fc2.w, Some(&l.fc2.b), Rows::new(&self.enc_x, du), acc)?;
            } else {
                norm_linear(&mut rec, &l.ffn_norm, &l.fc1, Rows::new(&self.enc_h, f), gelu, "encoder fc1")?;
                rec.stage("encoder fc2");
                k.linear(&mut rec, Rows::new(&self.enc_h, f), a, &l.fc2.w, Some(&l.fc2.b), Rows::new(&self.enc_x, du), acc)?;
            }
            if early && li == 0 {
                rec.flush()?;
            }
            rec.stage("encoder");
        }
        // Every layer's K|V in one GEMM, each layer's [audio_ctx][2d] after the last's; the
        // encoder's output stays in f32 rows as well (`encoder_output` reads them): the final
        // LayerNorm writes both.
        let seg = 2 * d;
        if into_planes && k.uses_planes(a, &self.cross_kv.w) {
            k.layer_norm_planes_and_rows(&mut rec, &self.enc_x, a, d, &self.enc_norm.gamma, &self.enc_norm.beta, LN_EPS, &self.enc_xn)?;
            rec.stage("cross k|v");
            k.linear_segments(&mut rec, None, a, &self.cross_kv.w, Some(&self.cross_kv.b), &self.enc_kv, seg)?;
        } else {
            k.layer_norm(&mut rec, &self.enc_x, 0, a, d, &self.enc_norm.gamma, &self.enc_norm.beta, &self.enc_xn, 0, LN_EPS)?;
            rec.stage("cross k|v");
            k.linear_segments(&mut rec, Some(Rows::new(&self.enc_xn, du)), a, &self.cross_kv.w, Some(&self.cross_kv.b), &self.enc_kv, seg)?;
        }
        let ticket = match replaying {
            true => {
                // None: the program's first use, built, and this window went through wgpu.
                let (ticket, kept) = rec.replay_kept(writes, Some(&mut self.profile))?;
                if ticket.is_some() {
                    match by_frame {
                        true => self.encoder_kept_resident = Some(kept),
                        false => self.encoder_kept = Some(kept),
                    }
                }
                ticket
            }
            false => {
                rec.submit(Some(&mut self.profile))?;
                None
            }
        };
        let t_submitted = std::time::Instant::now();
        match ticket {
            Some(t) => self.gpu.replay_wait(t)?,
            None => self.gpu.wait()?,
        }
        self.add_encoder_host(t_start, t_mel, t_submitted);
        Ok(())
    }

    /// The kept encoder over frames `[start, start + len)` of `data` (zero past them), read
    /// from `mel_by_frame`, into which the replay's prologue copies the window from the
    /// spectrogram kept in a host buffer (`ResidentMel`). Both are time-major, as `data` is,
    /// so a window is one contiguous span (960 KB for tiny.en), copied as one region, and
    /// its zeros past a recording's end one more. A window the buffer does not hold is
    /// written into it first (one span straight from `data`, no window cut out); once the
    /// encoder is submitted, while the GPU runs, the buffer is filled on to two windows past
    /// `start` (bytes after the window's, which the prologue does not copy), so that the
    /// recording's next window (a seek moves at most one window) costs the host nothing
    /// before the GPU starts. The host writes at most a window's frames each time, hidden
    /// behind the encoder. The first two windows record the encoder over `mel_by_frame` (its
    /// program kept from the second). False where the kept program is gone: the caller
    /// encodes the window the other way. `data`: a spectrogram time-major
    /// (`[n_frames][n_mels]`, `LogMel::data`); `id`: what identifies it as the same
    /// recording from window to window.
    fn encode_resident(&mut self, data: &[f32], n_frames: usize, id: (usize, usize), start: usize, len: usize) -> Result<bool> {
        let (frames, nm) = (2 * self.dims.audio_ctx, self.dims.n_mels);
        let n = len.min(frames).min(n_frames.saturating_sub(start));
        let cap = self.resident_frames.max(frames);
        let t_start = std::time::Instant::now();
        let g = self.gpu.clone();
        // Frames `from..to` as bytes (none where they lie past the end).
        let span = |from: usize, to: usize| -> &[u8] {
            match from < to {
                true => bytemuck::cast_slice(&data[from * nm..to * nm]),
                false => &[],
            }
        };
        let zeros_at = (n * nm * 4) as u64;
        if self.mel_by_frame.is_none() {
            self.mel_by_frame = Some(g.buffer("mel (a window of the kept spectrogram, time-major)", (nm * frames * 4) as u64)?);
        }
        if self.resident.as_ref().is_none_or(|r| r.cap != cap) {
            // (made here, not at the first window it holds: with the program's first
            // recording, which costs a process milliseconds anyway)
            if let Some(old) = self.resident.take() {
                g.free_host_buffer(old.buf)?;
            }
            let buf = g.host_buffer((nm * cap * 4) as u64)?;
            self.resident = Some(ResidentMel { buf, cap, holds: None, base: 0, filled: 0 });
        }
        if self.encoder_kept_resident.is_none() {
            // Until its program is kept (its first two windows): the window written into the
            // GPU copy through wgpu, the encoder recorded.
            let buf = self.mel_by_frame.as_ref().ok_or_else(|| Error::Gpu("no time-major mel buffer".into()))?;
            g.write(buf, 0, span(start, start + n));
            g.write(buf, zeros_at, &vec![0u8; (frames - n) * nm * 4]);
            // The queued writes land with wgpu's next submission, before the replay's.
            g.queue.submit([]);
            self.windows_encoded += 1;
            self.record_encoder(true, true, None, t_start, std::time::Instant::now())?;
            return Ok(true);
        }
        let held = |r: &ResidentMel| r.holds == Some(id) && start >= r.base && start + n <= r.base + r.filled;
        let hit = n == 0 || self.resident.as_ref().is_some_and(held);
        if !hit {
            let r = self.resident.as_mut().ok_or_else(|| Error::Gpu("no resident spectrogram".into()))?;
            r.holds = None;
            g.write_host(&r.buf, &[(0, span(start, start + n))])?;
            (r.holds, r.base, r.filled) = (Some(id), start, n);
        }
        let t_mel = std::time::Instant::now();
        let (Some(kept), Some(by_frame)) = (self.encoder_kept_resident.as_ref(), self.mel_by_frame.as_ref()) else {
            return Ok(false);
        };
        let mut moves = Moves::default();
        if let Some(r) = self.resident.as_ref().filter(|_| n > 0) {
            moves.host_copies.push((&r.buf, by_frame, vec![(((start - r.base) * nm * 4) as u64, 0, (n * nm * 4) as u64)]));
        }
        if n < frames {
            moves.zeros = vec![(by_frame, zeros_at, ((frames - n) * nm * 4) as u64)];
        }
        let Some(t) = kept.submit_with(&g, &[], &moves, Some(&mut self.profile))? else {
            self.encoder_kept_resident = None;
            return Ok(false);
        };
        let t_submitted = std::time::Instant::now();
        // While the GPU encodes: the kept part filled on to two windows past `start`.
        if let Some(r) = self.resident.as_mut().filter(|r| n > 0 && r.holds == Some(id)) {
            let (from, to) = (r.base + r.filled, (start + 2 * frames).min(n_frames).min(r.base + cap));
            if to > from {
                g.write_host(&r.buf, &[((r.filled * nm * 4) as u64, span(from, to))])?;
                r.filled = to - r.base;
            }
        }
        self.gpu.replay_wait(t)?;
        self.add_encoder_host(t_start, t_mel, t_submitted);
        self.windows_encoded += 1;
        self.resident_windows += u64::from(hit);
        Ok(true)
    }

    /// Whether a window goes through `encode_resident`: the kept spectrogram on, the
    /// encoder replayed and its program kept (not recorded every window), and not the
    /// process's first window (recorded through wgpu).
    fn takes_resident(&self) -> bool {
        self.encoder_resident && self.encoder_replay && !self.encoder_rerecord && self.windows_encoded > 0 && self.replaying()
    }

    /// Whether the kept spectrogram lies in device-local memory (false before it exists).
    pub fn resident_device_local(&self) -> bool {
        self.resident.as_ref().is_some_and(|r| r.buf.device_local())
    }

    /// Forget the last window's decoder state before a new window is encoded.
    fn leave_window(&mut self) {
        self.window_ready = false;
        self.pending = None;
        if let Some(d) = self.draft.as_mut() {
            d.fed.clear(); // its K|V were over the last window's cross-attention
        }
    }

    /// A window's host split into `encoder_host`: the mel's upload, recording and
    /// submission, the wait (until now).
    fn add_encoder_host(&mut self, t_start: std::time::Instant, t_mel: std::time::Instant, t_submitted: std::time::Instant) {
        let h = &mut self.encoder_host;
        h.0 += (t_mel - t_start).as_secs_f64();
        h.1 += (t_submitted - t_mel).as_secs_f64();
        h.2 += t_submitted.elapsed().as_secs_f64();
        h.3 += 1;
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

    /// Cap verify passes at `n` positions (1 to [`MAX_VERIFY`]; `max_verify` says it), for
    /// comparisons.
    pub fn set_verify_max(&mut self, n: usize) -> Result<()> {
        self.verify_max = checked_verify_max(n)?;
        Ok(())
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
        let sp = select_params(rules, vocab, self.ts_begin, self.eot, 0);
        // Untimed, a single-token step is encoded while the previous one runs (below) and
        // only its token and selection rules are written now.
        let pipelined = !g.timing_dispatches();
        let replaying = self.replaying();
        // The step encoded ahead, for this position or (after a rollback, `retarget`, where
        // steps are not replayed) moved here by rewriting its parameters.
        let ready = match self.pending.take() {
            Some(p) if pipelined && n == 1 && p.pos0 == pos0 => Some(p),
            Some(p) if pipelined && n == 1 && self.retarget && !replaying => self.retarget_step(p, pos0, &sp)?,
            _ => None,
        };
        let mut ticket = None;
        match ready {
            Some(p) => {
                g.write(&self.tokens, 0, bytemuck::cast_slice(tokens));
                for (buf, off) in &p.select_slots {
                    g.queue.write_buffer(buf, *off, bytemuck::bytes_of(&sp));
                }
                p.enc.submit(&g, Some(&mut self.profile))?;
            }
            // No step encoded for this position (a prompt, or a step after drafts were
            // rolled back): replayed, its tokens in the replay's prologue (H100: 0.29-0.32
            // ms against 0.31-0.35 moved back by `retarget`; a step encoded ahead, whose
            // host work hid behind the last one, stays faster than replaying it), ...
            None if replaying => {
                // (A prompt keeps bind groups of its own: sharing the steps' would replace
                // them slot by slot each window, and each replaced one is a new program.)
                let (layers, logits_w) = Self::main_views(&self.dec_layers, &self.logits_q, &self.emb);
                let cache = if n == 1 { &mut self.dec_cache } else { &mut self.prompt_cache };
                let mut rec = g.recorder_cached(cache);
                Self::record_decoder(&self.kern, &self.dims, &layers, logits_w, &dec_bufs!(self), &mut rec, n, pos0, &[sp], false)?;
                ticket = rec.replay(&[(&self.tokens, 0, bytemuck::cast_slice(tokens))], Some(&mut self.profile))?;
            }
            // ... or recorded now and submitted in parts like a verify pass.
            None => {
                g.write(&self.tokens, 0, bytemuck::cast_slice(tokens));
                self.record_step_now(n, pos0, &sp)?;
            }
        }
        let t_submitted = std::time::Instant::now();
        self.encode_step_ahead(pos0 + n, &sp)?;
        // (The encoding of the next step, between the two, overlaps the GPU's work.)
        self.wait_readback(t_record, t_submitted, 1, ticket)?;
        let words = self.read_scores(1)?;
        self.kv_len += n;
        Ok(scores_from_words(&words))
    }

    /// Whether this step or pass is replayed (`replay`, the device allows it, nothing left
    /// out: a part left out is measured through wgpu's path).
    fn replaying(&self) -> bool {
        self.replay && self.leave_out.is_none() && self.gpu.replay_available()
    }

    /// Wait until the readback is mapped; the host's time recording (`t_record` to
    /// `t_submitted`) and waiting (from now) go into `host_times`, for `calls` of them.
    fn wait_readback(
        &mut self,
        t_record: std::time::Instant,
        t_submitted: std::time::Instant,
        calls: usize,
        replayed: Option<Ticket>,
    ) -> Result<()> {
        let t_wait = std::time::Instant::now();
        if let Some(t) = replayed {
            self.gpu.replay_wait(t)?;
        }
        self.gpu.map_and_wait(&self.readback)?;
        self.host_times.0 += (t_submitted - t_record).as_secs_f64();
        self.host_times.1 += t_wait.elapsed().as_secs_f64();
        self.host_times.2 += calls as u64;
        Ok(())
    }

    /// The first `rows` x 8 words of the mapped readback, then unmapped.
    fn read_scores(&self, rows: usize) -> Result<Vec<u32>> {
        Ok(read_mapped(&self.readback, &[0..rows * 32])?.remove(0))
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
        let replay = self.replaying();
        if !replay {
            g.write(&self.tokens, 0, bytemuck::cast_slice(tokens));
        }
        let sps: Vec<SelectParams> = rules
            .iter()
            .enumerate()
            .map(|(i, r)| SelectParams { out_off: 8 * i as u32, ..select_params(r, vocab, self.ts_begin, self.eot, i as u32 * vocab) })
            .collect();
        let (layers, logits_w) = Self::main_views(&self.dec_layers, &self.logits_q, &self.emb);
        let mut rec = g.recorder_cached(&mut self.ver_cache);
        rec.leave_out(self.leave_out);
        if !replay {
            rec.submit_early_at(&self.early_submit);
        }
        Self::record_decoder(&self.kern, &self.dims, &layers, logits_w, &dec_bufs!(self), &mut rec, n, pos0, &sps, true)?;
        // Replayed, the tokens go with the pass's own prologue (a queued write would land
        // only with wgpu's next submission).
        let ticket = match replay {
            true => rec.replay(&[(&self.tokens, 0, bytemuck::cast_slice(tokens))], Some(&mut self.profile))?,
            false => {
                rec.submit(Some(&mut self.profile))?;
                None
            }
        };
        let t_submitted = std::time::Instant::now();
        // While the GPU runs the pass: the single step after it, for when every draft holds
        // and nothing is drafted next (the end of a live hint: the new audio's first token).
        // A rollback drops it; the step then records anew as before.
        self.encode_step_ahead(pos0 + n, &select_params(&rules[n - 1], vocab, self.ts_begin, self.eot, 0))?;
        // A replay: wgpu knows nothing of it, so its fence first, then the readback's map.
        self.wait_readback(t_record, t_submitted, 1, ticket)?;
        let words = self.read_scores(n)?;
        self.kv_len += n;
        Ok(words.chunks(8).map(scores_from_words).collect())
    }

    /// Several decode steps with one readback (see `LogitSource::greedy_steps`).
    fn greedy_positions(&mut self, first: u32, k: usize, step: &Step, ts: Option<TsState>) -> Result<GreedySteps> {
        let pos0 = self.kv_len;
        let vocab = self.dims.vocab as u32;
        let t_record = std::time::Instant::now();
        self.pending = None;
        if k > MAX_STEPS {
            return Err(Error::Invalid(format!("{k} steps with one readback (at most {MAX_STEPS})")));
        }
        let g = self.gpu.clone();
        g.write(&self.tokens, 0, bytemuck::cast_slice(&[first]));
        // The timestamp state behind the tokens (select.wgsl reads and advances it), and
        // the done flag behind it (set by the pick of end-of-text; gates the later steps).
        let state_off = (self.dims.text_ctx + 1) as u32;
        let done_off = state_off + TS_STATE_WORDS as u32;
        let gated = steps_gated();
        let mark_done = if gated { SELECT_FLAG_MARK_DONE } else { 0 };
        let stride = gate_stride(&self.dims);
        g.write(&self.tokens, 4 * done_off as u64, bytemuck::cast_slice(&[0u32]));
        if let Some(st) = ts {
            g.write(&self.tokens, 4 * state_off as u64, bytemuck::cast_slice(&[st.last, st.penultimate, st.ts_lo_after_text, 0]));
        }
        let mut base = select_params(&step.rules, vocab, self.ts_begin, self.eot, 0);
        base.state_off = state_off;
        let check = if step.check_ts_over_text { SELECT_FLAG_TS_OVER_TEXT } else { 0 };
        let track = if ts.is_some() { SELECT_FLAG_TRACK_STATE } else { 0 };
        // Step 0 under the host's masks; later steps under the state's (with timestamps).
        let first_flags = base.flags | check | track;
        let later_flags = if ts.is_some() { SELECT_FLAG_RULES_FROM_STATE | track } else { first_flags };
        let rules_words = 8 * SCORE_ROWS as u32;
        let (layers, logits_w) = Self::main_views(&self.dec_layers, &self.logits_q, &self.emb);
        let bufs = dec_bufs!(self);
        // Step i embeds tokens[i] (the host's first, then the GPU's picks) at pos0 + i. The
        // steps go in submissions of 1, 2, 4, 8, 8, ... steps (`step_chunks`), each
        // submitted as soon as it is recorded, so the GPU runs one while the host records
        // the next: recording costs 0.07-0.12 ms a step on the H200 and running it ~0.25,
        // so each submission can be twice the last and the GPU still never waits. A
        // submission per step cost the GPU ≈ 0.04 ms a step in gaps, 4 or 16 steps recorded
        // before one submission left all the recording unhidden, and 1, 4, 4, 4 left the GPU
        // idle while the host recorded the second submission (0.280-0.292 ms/token at 16
        // steps per readback against 0.265-0.266 for 1, 2, 4, 8 in one call; within the
        // drift in later ones; the 20 samples' steps 285 -> 280 ms). The parameter arenas are
        // reused from submission to submission: queue writes are ordered with the
        // submissions around them.
        let first = self.batch_encoded_first && !g.timing_dispatches();
        let chunks = if first { &[MAX_STEPS][..] } else { step_chunks() };
        let mut t_record = t_record;
        let mut i = 0;
        let mut c = 0;
        while i < k {
            let end = (i + chunks[c.min(chunks.len() - 1)]).min(k);
            c += 1;
            let cache = if first { &mut self.batch_cache } else { &mut self.steps_cache };
            let mut rec = g.recorder_cached(cache);
            rec.leave_out(self.leave_out);
            rec.stage("decode");
            for j in i..end {
                // Steps after the first are gated: once a step picks end-of-text, the
                // later ones run empty (their grids zeroed by their embedding).
                let gate = (gated && j > 0).then(|| StepGate {
                    grids: &self.step_grids,
                    range: (j * stride * 12) as u64..((j + 1) * stride * 12) as u64,
                    done_off,
                });
                Self::record_forward(&self.kern, &self.dims, &layers, logits_w, &bufs, &mut rec, 1, pos0 + j, j, false, gate)?;
                let sp = SelectParams {
                    out_off: 8 * j as u32,
                    tok_out: j as u32 + 1,
                    flags: if j == 0 { first_flags } else { later_flags } | mark_done,
                    rules_off: rules_words + 2 * j as u32,
                    done_off,
                    ..base
                };
                self.kern.select_pick(&mut rec, &self.logits, &self.suppress, &sp, &self.select_out, &self.tokens)?;
                rec.gate(None);
            }
            if end == k {
                rec.copy(&self.select_out, 0, &self.readback, 0, 32 * k as u64);
                rec.copy(&self.tokens, 4, &self.readback, 32 * SCORE_ROWS as u64, 4 * k as u64);
                if ts.is_some() {
                    rec.copy(&self.select_out, 4 * rules_words as u64, &self.readback, 36 * SCORE_ROWS as u64, 8 * k as u64);
                }
            }
            if first {
                let enc = rec.encode()?;
                t_record = std::time::Instant::now();
                enc.submit(&g, Some(&mut self.profile))?;
            } else {
                rec.submit(Some(&mut self.profile))?;
            }
            i = end;
        }
        self.wait_readback(t_record, std::time::Instant::now(), k, None)?;
        let (picks_at, rules_at) = (32 * SCORE_ROWS, 36 * SCORE_ROWS);
        let rules_len = if ts.is_some() { 8 * k } else { 0 };
        let mut parts = read_mapped(&self.readback, &[0..k * 32, picks_at..picks_at + 4 * k, rules_at..rules_at + rules_len])?;
        let used = parts.pop().unwrap_or_default();
        let (picks, words) = (parts.pop().unwrap_or_default(), parts.pop().unwrap_or_default());
        self.kv_len += k;
        // The masks each position was scored under, as the device reports them.
        let steps = (0..k)
            .map(|j| match (j, used.get(2 * j..2 * j + 2)) {
                (1.., Some(&[ts_lo, bits])) => Step {
                    rules: StepRules { mask_text: bits & 1 != 0, mask_non_timestamps: false, ts_lo, ..step.rules },
                    check_ts_over_text: bits & 2 != 0,
                },
                _ => *step,
            })
            .collect();
        Ok(GreedySteps { picks, scores: words.chunks(8).map(scores_from_words).collect(), steps })
    }

    /// Encode the single step at `pos` while the GPU works (untimed runs only): its
    /// dispatches, parameters and bind groups now; its token and rules follow in the call
    /// that submits it (`decode_positions`). A step that never comes is dropped.
    fn encode_step_ahead(&mut self, pos: usize, sp: &SelectParams) -> Result<()> {
        if !self.gpu.timing_dispatches() && pos < self.dims.text_ctx {
            self.pending = Some(self.record_step(1, pos, sp)?);
        }
        Ok(())
    }

    /// Record the decoder over `n` positions from `pos0` (tokens already in `tokens`), the
    /// logits of the last and the selection with `sp`, and encode it without submitting.
    fn record_step(&mut self, n: usize, pos0: usize, sp: &SelectParams) -> Result<PendingStep> {
        let g = self.gpu.clone();
        let (layers, logits_w) = Self::main_views(&self.dec_layers, &self.logits_q, &self.emb);
        let mut rec = g.recorder_cached(&mut self.dec_cache);
        rec.leave_out(self.leave_out);
        Self::record_decoder(&self.kern, &self.dims, &layers, logits_w, &dec_bufs!(self), &mut rec, n, pos0, &[*sp], false)?;
        let select_slots = rec.last_param_slots(self.kern.select_dispatches());
        let sig = rec.signature();
        Ok(PendingStep { pos0, enc: rec.encode()?, select_slots, sig })
    }

    /// The step encoded ahead (`p`, for another position) made the step at `pos0`: the
    /// step at `pos0` is recorded again but not encoded, and where it runs the same
    /// dispatches on the same bind groups and grids from the same parameter slots (equal
    /// signatures), its parameters are queued over `p`'s, which then computes it (`None`:
    /// they differ, e.g. a self-attention split more; the caller records the step anew).
    /// After a rollback the position moves back, and re-encoding a step costs the host
    /// ~0.07-0.18 ms on the lent machines, two thirds of it wgpu's encoding (RESULTS.md
    /// 2026-12-05, fifth session), which this skips.
    fn retarget_step(&mut self, p: PendingStep, pos0: usize, sp: &SelectParams) -> Result<Option<PendingStep>> {
        let g = self.gpu.clone();
        let (layers, logits_w) = Self::main_views(&self.dec_layers, &self.logits_q, &self.emb);
        let mut rec = g.recorder_cached(&mut self.dec_cache);
        rec.leave_out(self.leave_out);
        Self::record_decoder(&self.kern, &self.dims, &layers, logits_w, &dec_bufs!(self), &mut rec, 1, pos0, &[*sp], false)?;
        if rec.signature() != p.sig {
            return Ok(None);
        }
        rec.upload_only()?;
        Ok(Some(PendingStep { pos0, ..p }))
    }

    /// The same, submitted now: the embedding and the first layer as soon as they are
    /// recorded (`early_submit`, as a verify pass: the GPU runs them while the host records
    /// the rest; the host records a dispatch in ~5 µs on the H200, the whole step in
    /// ~0.1-0.2 ms), or with a timestamp per dispatch when profiling (in one submission).
    fn record_step_now(&mut self, n: usize, pos0: usize, sp: &SelectParams) -> Result<()> {
        let g = self.gpu.clone();
        let (layers, logits_w) = Self::main_views(&self.dec_layers, &self.logits_q, &self.emb);
        let mut rec = g.recorder_cached(&mut self.dec_cache);
        rec.leave_out(self.leave_out);
        rec.submit_early_at(&self.early_submit);
        Self::record_decoder(&self.kern, &self.dims, &layers, logits_w, &dec_bufs!(self), &mut rec, n, pos0, &[*sp], false)?;
        rec.submit(Some(&mut self.profile))
    }

    /// The main model's layers and logits weight as a pass records them (from fields, so
    /// a dispatch cache can be borrowed mutably beside them).
    fn main_views<'a>(
        dec_layers: &'a [DecoderLayer],
        logits_q: &'a Option<QMatrix>,
        emb: &'a F16Rows,
    ) -> (Vec<LayerView<'a>>, WRef<'a>) {
        let logits_w = match logits_q {
            Some(q) => WRef::Q(q),
            None => WRef::Rows(emb),
        };
        (dec_layers.iter().map(DecoderLayer::view).collect(), logits_w)
    }

    /// Record the decoder over `n` positions from `pos0` (tokens already in `tokens`), the
    /// logits (of the last position, or of every one in a verify pass), the selection of
    /// each with its `sps` and the copy of their scores to the readback buffer.
    #[allow(clippy::too_many_arguments)]
    fn record_decoder(
        k: &Kernels,
        dims: &Dims,
        layers: &[LayerView],
        logits_w: WRef,
        b: &DecBufs,
        rec: &mut Recorder,
        n: usize,
        pos0: usize,
        sps: &[SelectParams],
        per_row: bool,
    ) -> Result<()> {
        // The same dispatches on the same buffers every step: bind groups are built once.
        rec.stage(if per_row && n > 1 {
            "verify"
        } else if n > 1 {
            "prefill"
        } else {
            "decode"
        });
        Self::record_forward(k, dims, layers, logits_w, b, rec, n, pos0, 0, per_row, None)?;
        // A verify pass's rows in one selection (one per row was ~14 dependent
        // dispatches more for 8 positions).
        rec.part("select");
        match sps {
            [sp] => k.select(rec, b.logits, b.suppress, sp, b.select_out)?,
            _ => k.select_rows(rec, b.logits, b.suppress, sps, b.select_out)?,
        }
        rec.copy(b.select_out, 0, b.readback, 0, 32 * sps.len() as u64);
        Ok(())
    }

    /// The decoder proper: embed `n` tokens (`tokens[tok_off..]`) at positions `pos0..`,
    /// the layers, the final LayerNorm and the logits into `b.logits` (every row with
    /// `per_row`, else the last). Quantized weights always go through the per-row kernel.
    #[allow(clippy::too_many_arguments)]
    fn record_forward(
        k: &Kernels,
        dims: &Dims,
        layers: &[LayerView],
        logits_w: WRef,
        b: &DecBufs,
        rec: &mut Recorder,
        n: usize,
        pos0: usize,
        tok_off: usize,
        per_row: bool,
        gate: Option<StepGate>,
    ) -> Result<()> {
        let d = dims.d_model;
        let (m, p0) = (n as u32, pos0 as u32);
        let heads = dims.n_heads as u32;
        let hd = dims.head_dim() as u32;
        let (acc, plain) = (Epilogue { gelu: false, accumulate: true }, Epilogue::default());
        let gelu = Epilogue { gelu: true, accumulate: false };
        // y (=|+=) act(LN(x) W + b) (`norm` Some) or act(x W + b) over m rows.
        let lin_m = |rec: &mut Recorder, x: Rows, m: u32, norm: Option<&Norm>, w: WRef, bias: Option<&Buffer>, y: Rows, ep: Epilogue| -> Result<()> {
            match w {
                WRef::Q(q) => k.linear_q(rec, x, m, norm.map(ln), q, bias, y, ep),
                WRef::Rows(r) => k.linear_rows(rec, x, m, norm.map(ln), r, bias, y, ep, per_row),
                WRef::F16(f) if per_row => k.linear_per_row(rec, x, m, norm.map(ln), f, bias, y, ep),
                WRef::F16(f) => match norm {
                    Some(nm) => k.linear_ln(rec, x, m, ln(nm), b.dec_xn, f, bias, y, ep),
                    None => k.linear(rec, x, m, f, bias, y, ep),
                },
            }
        };
        let lin = |rec: &mut Recorder, x: Rows, norm: Option<&Norm>, w: Lin, y: Rows, ep: Epilogue| -> Result<()> {
            lin_m(rec, x, m, norm, w.w, Some(w.b), y, ep)
        };
        rec.part("embed");
        let words = gate.as_ref().map(|g| (g.grids, (g.range.start / 4) as u32..(g.range.end / 4) as u32, g.done_off));
        k.embed(rec, b.tokens, tok_off as u32, m, b.emb, b.dec_pos, p0, b.dec_x, words)?;
        if let Some(g) = gate {
            // The rest of the step (the caller ends the gate after its selection).
            rec.gate(Some((g.grids, g.range.start, g.range.end)));
        }
        let x = Rows::new(b.dec_x, d);
        let s3 = 3 * d;
        // The final LayerNorm in the last feed-forward block's sum (ffn_decode.wgsl's
        // main_sum_norm), where that block normalises exactly the rows the logits read: a
        // dispatch less a step.
        let ffn_decode_rows = k.ffn_fused && (m == 1 || per_row);
        let norm_in_ffn = ffn_decode_rows
            && k.final_norm_fused()
            && matches!(logits_w, WRef::Rows(_))
            && layers.last().is_some_and(|l| matches!((l.fc1.w, l.fc2.w), (WRef::F16(_), WRef::F16(_))));
        // Per layer: the LayerNorms are folded into the GEMVs that read them (for a few rows;
        // more rows of f16 weights go through the LayerNorm kernel into `dec_xn` and the
        // tiled GEMM).
        for (li, l) in layers.iter().enumerate() {
            let qkv = Rows::at(l.qkv_cache, pos0 * s3, s3);
            rec.part("self_qkv");
            lin(rec, x, Some(l.self_norm), l.qkv, qkv, plain)?;
            rec.part("self_attention");
            let self_attention = AttentionArgs {
                q: qkv,
                k: Rows::at(l.qkv_cache, d, s3),
                v: Rows::at(l.qkv_cache, 2 * d, s3),
                out: Rows::new(b.dec_attn, d),
                tq: m,
                tk: p0 + m,
                heads,
                head_dim: hd,
                causal: Some(p0),
            };
            // A verify pass's rows each as its step alone would compute it.
            k.attention_for(rec, &self_attention, per_row)?;
            rec.part("self_out");
            lin(rec, Rows::new(b.dec_attn, d), None, l.self_out, x, acc)?;
            let q = Rows::new(b.dec_q, d);
            rec.part("cross_q");
            lin(rec, x, Some(l.cross_norm), l.cross_q, q, plain)?;
            let cross = AttentionArgs {
                q,
                k: Rows::at(l.enc_kv, l.kv_off, l.kv_stride),
                v: Rows::at(l.enc_kv, l.kv_off + d, l.kv_stride),
                out: Rows::new(b.dec_attn, d),
                tq: m,
                tk: dims.audio_ctx as u32,
                heads,
                head_dim: hd,
                causal: None,
            };
            // f16 weights: the output projection merges the attention's key splits itself
            // (one dispatch less); quantized ones take the merged output.
            rec.part("cross_attention");
            let merged = match l.cross_out.w {
                WRef::F16(_) => k.attention_unmerged(rec, &cross, per_row)?,
                _ => {
                    k.attention_for(rec, &cross, per_row)?;
                    None
                }
            };
            rec.part("cross_out");
            match (merged, l.cross_out.w) {
                (Some(splits), WRef::F16(w)) => k.linear_merged(rec, m, heads, hd, splits, w, Some(l.cross_out.b), x, acc)?,
                _ => lin(rec, Rows::new(b.dec_attn, d), None, l.cross_out, x, acc)?,
            }
            // A decode step's row or a verify pass's rows over f16 weights: fc1 and fc2 as
            // ffn_decode.wgsl's chunks and their sum (every row as it would be alone).
            match (l.fc1.w, l.fc2.w) {
                (WRef::F16(w1), WRef::F16(w2)) if ffn_decode_rows => {
                    rec.part("ffn");
                    let fin = (norm_in_ffn && li + 1 == layers.len()).then(|| (ln(b.dec_norm), b.dec_xn));
                    k.ffn_decode(rec, x, m, ln(l.ffn_norm), w1, l.fc1.b, w2, l.fc2.b, b.ffn_scratch, fin, per_row)?;
                }
                _ => {
                    let h = Rows::new(b.dec_h, dims.ffn);
                    rec.part("fc1");
                    lin(rec, x, Some(l.ffn_norm), l.fc1, h, gelu)?;
                    rec.part("fc2");
                    lin(rec, h, None, l.fc2, x, acc)?;
                }
            }
        }
        // The final LayerNorm and the logits (tied embeddings): of the last position only, or
        // of every position in a verify pass (each row then selected with its own rules).
        // Over the f16 table the norm is a dispatch of its own: folded into gemv_rows, each
        // of its 1621 workgroups a row recomputed the row's statistics (two barrier trees).
        let logits = Rows::new(b.logits, dims.vocab);
        let (xl, ml) = if per_row { (x, m) } else { (Rows::at(b.dec_x, (n - 1) * d, d), 1) };
        match logits_w {
            WRef::Rows(_) => {
                if !norm_in_ffn {
                    rec.part("final_norm");
                    k.layer_norm(rec, xl.buf, xl.off, ml, d as u32, &b.dec_norm.gamma, &b.dec_norm.beta, b.dec_xn, 0, LN_EPS)?;
                }
                rec.part("logits");
                lin_m(rec, Rows::new(b.dec_xn, d), ml, None, logits_w, None, logits, plain)
            }
            _ => {
                rec.part("logits");
                lin_m(rec, xl, ml, Some(b.dec_norm), logits_w, None, logits, plain)
            }
        }
    }

    /// Build the draft model: the first `layers` decoder layers of `ck` (this model's
    /// checkpoint) in `format`, and the logits projection in `format`. Replaces any draft.
    pub fn set_draft(&mut self, ck: &Checkpoint, format: BlockFormat, layers: usize) -> Result<()> {
        let dims = self.dims;
        if layers == 0 || layers > dims.decoder_layers {
            return Err(Error::Invalid(format!(
                "a draft model of {layers} layers (this model has {})",
                dims.decoder_layers
            )));
        }
        if ck.dims != dims {
            return Err(Error::Invalid("the draft's checkpoint is not this model's".into()));
        }
        let g = &*self.gpu;
        // The layers quantized and uploaded side by side, as a load's are.
        let dl = side_by_side(layers, |i| {
            let p = format!("decoder/layer_{i}");
            let q = |name: &str| qmatrix(g, ck, &format!("{p}/{name}/weight"), format);
            Ok(DraftLayer {
                qkv: q("self_attention/linear_0")?,
                self_out: q("self_attention/linear_1")?,
                cross_q: q("attention/linear_0")?,
                cross_out: q("attention/linear_2")?,
                fc1: q("ffn/linear_0")?,
                fc2: q("ffn/linear_1")?,
                qkv_cache: g.buffer("draft q|k|v cache", (dims.text_ctx * 3 * dims.d_model * 4) as u64)?,
            })
        })?
        .into_iter()
        .collect::<Result<Vec<_>>>()?;
        self.draft = Some(DraftModel {
            format,
            layers: dl,
            logits_w: qmatrix(g, ck, "decoder/embeddings/weight", format)?,
            tokens: g.buffer("draft tokens", (dims.text_ctx as u64 + 1) * 4)?,
            logits: g.buffer("draft logits", dims.vocab as u64 * 4)?,
            readback: g.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("draft readback"),
                size: MAX_DRAFT as u64 * 4,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            fed: Vec::new(),
            cache: DispatchCache::default(),
        });
        Ok(())
    }

    /// The draft model's format and depth, if one is built.
    pub fn draft_config(&self) -> Option<(BlockFormat, usize)> {
        self.draft.as_ref().map(|d| (d.format, d.layers.len()))
    }

    /// The decoder's weight format (`--quant`; None: f16).
    pub fn quant(&self) -> Option<BlockFormat> {
        self.quant
    }

    /// The draft model's proposal (see `LogitSource::draft`).
    fn draft_tokens(&mut self, context: &[u32], k: usize, timestamps: bool) -> Result<Vec<u32>> {
        let dims = self.dims;
        let vocab = dims.vocab as u32;
        let (ts_begin, eot) = (self.ts_begin, self.eot);
        let Some(dr) = self.draft.as_mut() else {
            return Ok(Vec::new());
        };
        if !self.window_ready {
            return Err(Error::Invalid("draft before begin_window".into()));
        }
        if let Some(&bad) = context.iter().find(|&&t| t >= vocab) {
            return Err(Error::Invalid(format!("token id {bad} is outside the vocabulary of {vocab}")));
        }
        // Positions up to context + k - 1 are fed (the last pick is never fed).
        let k = k.min(MAX_DRAFT).min(dims.text_ctx.saturating_sub(context.len()));
        if context.is_empty() || k == 0 {
            return Ok(Vec::new());
        }
        // Keep the K|V of the longest common prefix; at least one token goes in, for logits.
        let common = dr.fed.iter().zip(context).take_while(|(a, b)| a == b).count().min(context.len() - 1);
        dr.fed.truncate(common);
        let g = self.gpu.clone();
        g.write(&dr.tokens, common as u64 * 4, bytemuck::cast_slice(&context[common..]));
        let rules = StepRules {
            mask_text: false,
            mask_non_timestamps: false,
            ts_lo: ts_begin,
            ts_hi: if timestamps { vocab } else { ts_begin },
            extra_suppress: [u32::MAX, u32::MAX],
            probe: u32::MAX,
        };
        let base = select_params(&rules, vocab, ts_begin, eot, 0);
        let layers: Vec<LayerView> = dr.layers.iter().zip(&self.dec_layers).map(|(d, m)| d.view(m)).collect();
        let bufs = DecBufs { tokens: &dr.tokens, logits: &dr.logits, ..dec_bufs!(self) };
        let mut rec = g.recorder_cached(&mut dr.cache);
        rec.stage("draft");
        let end = context.len();
        // The new context tokens in one pass, then one position per drafted token; every
        // step's pick lands in the token buffer the next step's embedding reads.
        let mut pos = common;
        let mut n = end - common;
        for i in 0..k {
            Self::record_forward(&self.kern, &dims, &layers, WRef::Q(&dr.logits_w), &bufs, &mut rec, n, pos, pos, false, None)?;
            // (The scores go to the main model's selection scratch, unread.)
            let sp = SelectParams { tok_out: (end + i) as u32, ..base };
            self.kern.select_pick(&mut rec, &dr.logits, &self.suppress, &sp, &self.select_out, &dr.tokens)?;
            pos += n;
            n = 1;
        }
        rec.copy(&dr.tokens, end as u64 * 4, &dr.readback, 0, k as u64 * 4);
        rec.submit(Some(&mut self.profile))?;
        g.map_and_wait(&dr.readback)?;
        let drafted = read_mapped(&dr.readback, &[0..k * 4])?.remove(0);
        dr.fed = context.to_vec();
        dr.fed.extend_from_slice(&drafted[..k - 1]);
        if let Some(&bad) = drafted.iter().find(|&&t| t >= vocab) {
            return Err(Error::Gpu(format!("the draft model picked token {bad} outside the vocabulary")));
        }
        Ok(drafted)
    }
}

impl LogitSource for GpuWhisper {
    fn begin_window_of(&mut self, mel: &crate::audio::mel::LogMel, start: usize, len: usize, fresh: bool) -> Result<()> {
        let frames = 2 * self.dims.audio_ctx;
        if fresh {
            if let Some(r) = self.resident.as_mut() {
                r.holds = None;
            }
        }
        if self.takes_resident() && mel.n_mels == self.dims.n_mels && mel.data.len() == mel.n_mels * mel.n_frames {
            self.leave_window();
            let id = (mel.data.as_ptr() as usize, mel.n_frames);
            if self.encode_resident(&mel.data, mel.n_frames, id, start, len.min(frames))? {
                self.kv_len = 0;
                self.window_ready = true;
                return Ok(());
            }
        }
        self.begin_window(&mel.window_frames(start, len, frames))
    }

    fn begin_window(&mut self, mel: &[f32]) -> Result<()> {
        // 3000 frames for every real Whisper (audio_ctx 1500); small test models take fewer.
        let frames = 2 * self.dims.audio_ctx;
        let want = self.dims.n_mels * frames;
        if mel.len() != want {
            return Err(Error::Invalid(format!("a window of {} mel values; the encoder takes {want}", mel.len())));
        }
        self.leave_window();
        // Over the mel buffer, band-major as the window comes: the kept spectrogram's path
        // takes frames time-major, which a window of its own would have to be transposed to
        // on the host before the GPU starts (~0.2 ms a tiny.en window on the lent H100's
        // host: RESULTS.md 2026-12-07, twenty-sixth session). A process that takes both
        // paths builds two encoder programs (the bench and tests do; transcription takes
        // `begin_window_of` only).
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
        self.verify_max
    }

    fn verify(&mut self, tokens: &[u32], rules: &[StepRules]) -> Result<Vec<StepScores>> {
        self.check_append("verify", tokens)?;
        if tokens.len() > self.verify_max || rules.len() != tokens.len() {
            return Err(Error::Invalid(format!(
                "verify takes 1 to {} tokens with one rule set each, not {} and {}",
                self.verify_max,
                tokens.len(),
                rules.len()
            )));
        }
        self.verify_positions(tokens, rules)
    }

    fn max_steps(&self) -> usize {
        MAX_STEPS
    }

    fn greedy_steps(&mut self, first: u32, k: usize, step: &Step, ts: Option<TsState>) -> Result<GreedySteps> {
        self.check_append("greedy_steps", &[first])?;
        if k == 0 || k > MAX_STEPS || self.kv_len + k > self.dims.text_ctx {
            return Err(Error::Invalid(format!(
                "greedy_steps of {k} steps at position {} (1 to {MAX_STEPS}, within {} positions)",
                self.kv_len, self.dims.text_ctx
            )));
        }
        self.greedy_positions(first, k, step, ts)
    }

    fn draft(&mut self, context: &[u32], k: usize, timestamps: bool) -> Result<Vec<u32>> {
        self.draft_tokens(context, k, timestamps)
    }

    fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.kv_len {
            return Err(Error::Invalid(format!("rollback of {n} positions with {} in the cache", self.kv_len)));
        }
        // The self-attention reads keys below the KV length only: the dropped positions are
        // overwritten by the next pass. A step encoded ahead was for the old position: kept
        // to be moved (`retarget_step`), or dropped.
        self.kv_len -= n;
        if !self.retarget {
            self.pending = None;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_max_setting_takes_1_to_max_verify() {
        assert_eq!(verify_max_setting(None).unwrap(), MAX_VERIFY);
        assert_eq!(verify_max_setting(Some(" 8")).unwrap(), 8);
        assert_eq!(verify_max_setting(Some("1")).unwrap(), 1);
        let past = (MAX_VERIFY + 1).to_string();
        for bad in ["0", &past, "-1", "eight", ""] {
            assert!(verify_max_setting(Some(bad)).is_err(), "{bad:?}");
        }
        assert!(checked_verify_max(MAX_VERIFY + 1).is_err());
    }
}
