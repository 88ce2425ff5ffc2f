//! `verbatim bench`: how fast the Whisper path runs on this GPU, as numbers to put beside
//! whisper.cpp's. On a real model directory (`--model`, default the fetched tiny.en) or
//! random weights of a named geometry made on this machine (`--synthetic tiny|base|small|
//! medium|large-v3`, so nothing large travels):
//!
//! - encoder ms per 30 s window (random log-mel; the work does not depend on the values);
//! - decode ms/token over `--steps` forced steps (one submit + wait each, as the decoding
//!   loop does), prefill ms/token for 4 and 64 positions;
//! - dispatches per decode step (the recorder's count);
//! - decode ms/token with several steps per readback (the device picks each next token
//!   and the next step's embedding reads it: each step submitted while the host records the next);
//! - the per-kernel table from timestamp queries (a timed pass per dispatch, so each time
//!   includes a pass's boundaries: on the H200 the table sums to ≈ 0.46 ms per decode step
//!   where a submission of 16 steps runs one in ≈ 0.33 ms; timestamps between the
//!   dispatches of one pass summed to 0.54, worse), GB/s and % of a copy ceiling measured in
//!   the same run (a vec4 copy kernel over two large buffers);
//! - the per-kernel µs of verify passes of 1 to 32 positions side by side (where a
//!   kernel's time steps up with the rows);
//! - verify passes of 1..32 positions (speculative decoding's check of k = 0..31 drafts), ms
//!   per pass, each followed by a rollback of all of them (the state is reused); and a
//!   single step with none encoded ahead for its position (after a rollback): the step
//!   encoded ahead for the next position moved back by its parameters (`retarget`), and
//!   recorded anew, submitted in parts and whole;
//! - with `--file`, end-to-end time and real-time factor of transcribing it, and a live
//!   replay: the file's prefixes every 0.5 s re-decoded as live mode does, without drafts
//!   and with the previous hypothesis as the draft (`--speculative ngram`): decode ms per
//!   token, acceptance, tokens per verify pass; every prefix's text must be the same both
//!   ways (else the bench stops: a draft may never change the text).
//!
//! - `--live-files WAV...`, in place of every other section: for each file, the live replay
//!   (drafts off and ngram) and live mode itself (`LiveSession` fed the file in 30 ms
//!   pieces, decoding when it asks, with its prompt, trimming and drafts), then the
//!   token-weighted figures over all files;
//!
//! - the draft models of `--speculative self-q8|self-q4`: ms per `draft` call of 1 and 7
//!   tokens (one submission each) at depths 1, half and all of the decoder's layers;
//! - with `--file`, the file transcribed with every draft source: decode ms per emitted
//!   token, acceptance, tokens per verify pass (the text must equal `off`'s, else the
//!   bench stops);
//! - `--quant q8_0|q4_0`: all of the above with the decoder's weights quantized;
//! - `--step-parts`: decode ms/token (16 steps per readback) with each part of a step left
//!   out in turn (embed, the QKV GEMV, self-attention, ..., logits, selection; the results are
//!   then wrong, only the time counts): what each part costs in the stream of a step, which
//!   the per-kernel table (a pass per dispatch) does not say.
//!
//! Every figure is the minimum over `--batches` timed batches (after a warm-up), with the
//! spread (max / min) beside it. A binary, never a timed test.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use clap::ValueEnum;
use engine::decode::{LogitSource, StepRules};
use engine::gpu::warm_up::warm_up;
use engine::gpu::{Access, Cost, Gpu, GpuOptions, Profile};
use engine::models::whisper::checkpoint::{write_synthetic, Checkpoint};
use engine::models::whisper::ct2::DType;
use engine::models::whisper::gpu::GpuWhisper;
use engine::models::whisper::Dims;
use engine::pipeline::{Options, Transcriber};
use engine::quant::block::BlockFormat;

#[derive(clap::Args)]
pub struct Args {
    /// A CTranslate2 Whisper model directory [default: the fetched tiny.en].
    #[arg(long, value_name = "DIR", conflicts_with = "synthetic")]
    model: Option<PathBuf>,

    /// Random weights of this geometry, written to a temporary directory first.
    #[arg(long, value_enum, value_name = "GEOMETRY")]
    synthetic: Option<Geometry>,

    /// Forced decode steps per batch.
    #[arg(long, default_value_t = 256)]
    steps: usize,

    /// Timed batches (the minimum is reported, with the spread).
    #[arg(long, default_value_t = 5)]
    batches: usize,

    /// Also transcribe this file (needs a real model directory) and report its time and RTF.
    #[arg(long, value_name = "WAV")]
    file: Option<PathBuf>,

    /// Only live mode on each of these files, drafts off and ngram: the prefix replay (as
    /// with --file) and a live session fed the file, after a warm-up before each file, then
    /// the token-weighted figures over all files: speculative decoding's ms per emitted token
    /// across real speech (needs a real model directory).
    #[arg(long, value_name = "WAV", num_args = 1.., conflicts_with_all = ["file", "synthetic"])]
    live_files: Vec<PathBuf>,

    /// Copy-ceiling buffer size in MiB (clamped to the adapter's binding limit).
    #[arg(long, default_value_t = 512)]
    copy_mib: u64,

    /// Also time decode steps with each part of the step left out in turn (what each
    /// part costs in the stream of a step; the per-kernel table times dispatches alone).
    #[arg(long)]
    step_parts: bool,

    /// The decoder's weights in q8_0 or q4_0 (default f16).
    #[arg(long, value_name = "FORMAT", value_parser = |s: &str| s.parse::<BlockFormat>().map_err(|e| e.to_string()))]
    quant: Option<BlockFormat>,

    /// Also print the driver's compiler statistics of every kernel the run compiled
    /// (registers, shared memory, spills: Vulkan's VK_KHR_pipeline_executable_properties),
    /// and write the driver's text representations of each kernel, where it gives any, into
    /// DIR.
    #[arg(long, value_name = "DIR")]
    pipeline_stats: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Geometry {
    Tiny,
    Base,
    Small,
    Medium,
    #[value(name = "large-v3")]
    LargeV3,
}

impl Geometry {
    fn name(self) -> &'static str {
        match self {
            Geometry::Tiny => "tiny",
            Geometry::Base => "base",
            Geometry::Small => "small",
            Geometry::Medium => "medium",
            Geometry::LargeV3 => "large-v3",
        }
    }

    fn dims(self) -> Dims {
        let (d, heads, layers, n_mels, vocab) = match self {
            Geometry::Tiny => (384, 6, 4, 80, 51864),
            Geometry::Base => (512, 8, 6, 80, 51864),
            Geometry::Small => (768, 12, 12, 80, 51864),
            Geometry::Medium => (1024, 16, 24, 80, 51864),
            Geometry::LargeV3 => (1280, 20, 32, 128, 51866),
        };
        Dims {
            n_mels,
            d_model: d,
            n_heads: heads,
            encoder_layers: layers,
            decoder_layers: layers,
            ffn: 4 * d,
            vocab,
            audio_ctx: 1500,
            text_ctx: 448,
        }
    }
}

/// Minimum and spread (max / min) of a set of timings.
struct Stat {
    min: f64,
    spread: f64,
}

fn stat(v: &[f64]) -> Stat {
    let min = v.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = v.iter().cloned().fold(0.0, f64::max);
    Stat { min, spread: if min > 0.0 { max / min } else { 0.0 } }
}

pub fn run(args: Args) -> ExitCode {
    match bench(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("verbatim bench: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Special-token ids the selection needs: eot, timestamp_begin, no_speech.
fn specials(dir: &Path, vocab: u32, synthetic: bool) -> Result<(u32, u32, u32), String> {
    if synthetic {
        // The layouts of the real vocabularies (English-only and multilingual).
        return Ok(match vocab {
            51864 => (50256, 50363, 50361),
            51865 => (50257, 50364, 50362),
            _ => (50257, 50365, 50363),
        });
    }
    let ck_tok = dir.join("tokenizer.json");
    let tok = engine::decode::tokenizer::WhisperTokenizer::from_file(&ck_tok, vocab).map_err(|e| e.to_string())?;
    let sp = tok.special();
    Ok((sp.eot, sp.timestamp_begin, sp.no_speech))
}

fn bench(args: &Args) -> Result<(), String> {
    let batches = args.batches.max(1);
    let gpu = Arc::new(
        Gpu::new(&GpuOptions { profile: true, pipeline_stats: args.pipeline_stats.is_some(), ..Default::default() })
            .map_err(|e| e.to_string())?,
    );
    gpu.pause_profiling(true);
    println!(
        "adapter: {} ({}, {}); encoder GEMMs on {}; shader runtime checks {}; waits poll for {} µs before blocking",
        gpu.info.name,
        gpu.info.backend,
        gpu.info.driver,
        if gpu.info.coop_matrix { "cooperative matrices (tensor cores)" } else { "tiled shader arithmetic (no cooperative matrices, or VERBATIM_NO_COOP)" },
        if gpu.info.shader_checks { "on (VERBATIM_SHADER_CHECKS)" } else { "off" },
        gpu.spin_wait().as_micros()
    );

    // The model.
    let t = Instant::now();
    let (dir, synthetic) = match (args.synthetic, &args.model) {
        (Some(g), _) => {
            let dir = std::env::temp_dir().join(format!("verbatim-bench-{}", g.name()));
            std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            if !dir.join("model.bin").is_file() {
                write_synthetic(&dir, &g.dims(), DType::F16, 1)
                    .map_err(|e| format!("cannot write a synthetic model to {}: {e}", dir.display()))?;
            }
            (dir, true)
        }
        (None, Some(dir)) => (dir.clone(), false),
        (None, None) => (engine::models::whisper::default_model_dir(), false),
    };
    if !args.live_files.is_empty() {
        return live_files(gpu, &dir, args);
    }
    let ck = Checkpoint::open(&dir).map_err(|e| e.to_string())?;
    let dims = ck.dims;
    let (eot, ts_begin, no_speech) = specials(&dir, dims.vocab as u32, synthetic)?;
    let mut model = GpuWhisper::load_with(gpu.clone(), &ck, eot, ts_begin, args.quant).map_err(|e| e.to_string())?;
    println!(
        "model: {} ({}; decoder {}; d {}, {} heads, {}+{} layers, vocab {}), loaded in {:.2} s",
        dir.display(),
        if synthetic { "synthetic f16" } else { "checkpoint" },
        args.quant.map_or("f16", |q| q.name()),
        dims.d_model,
        dims.n_heads,
        dims.encoder_layers,
        dims.decoder_layers,
        dims.vocab,
        t.elapsed().as_secs_f64()
    );

    // Random log-mel in Whisper's range.
    let n_mel = dims.n_mels * 2 * dims.audio_ctx;
    let mut s = 0x1234_5678u32;
    let mel: Vec<f32> = (0..n_mel)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
        })
        .collect();
    let rules = StepRules {
        mask_text: false,
        mask_non_timestamps: false,
        ts_lo: ts_begin,
        ts_hi: dims.vocab as u32,
        // End-of-text never picked: a batch of device-picked steps runs empty after one
        // (the steps are gated off), which would time less than the steps asked for.
        extra_suppress: [eot, u32::MAX],
        probe: no_speech,
    };
    let err = |e: engine::Error| e.to_string();
    let text_token = |i: usize| 400 + (i as u32 * 37) % 20000;

    // Encoder. The first window builds pipelines and bind groups; then the GPU is kept busy
    // until its clock has settled (see `warm_up`), or the first measurements time a GPU
    // still climbing from its idle clock.
    model.begin_window(&mel).map_err(err)?;
    let warm = warm_up(|| model.begin_window(&mel).map_err(err))?;
    // The clock falls again under latency-bound work: nvidia-smi read the H200's
    // utilisation as 0-4 % through decode steps and its clock going 1980 -> 1400-1600 MHz
    // about 1.5 s after the warm-up (bench/RESULTS.md, 2026-12-04). Each later section is
    // warmed again first (not on a CPU adapter, whose windows take seconds), and the report
    // lists those warm-ups.
    let mut rewarms: Vec<(&str, engine::gpu::warm_up::WarmUp)> = Vec::new();
    let mut rewarm = |model: &mut GpuWhisper, what: &'static str| -> Result<(), String> {
        if !gpu.info.is_cpu() {
            rewarms.push((what, warm_up(|| model.begin_window(&mel).map_err(err))?));
        }
        Ok(())
    };
    // The encoder as shipped (replayed from the second window where the device allows it,
    // else submitted in parts, if on), submitted in parts through wgpu, and recorded whole
    // before one submission, alternated in one process (the host's speed varies between
    // processes). Each mode's first window is not timed (a replay's program is built then).
    let (parts, replay, mel_prologue, rerecord) = (model.encoder_parts, model.encoder_replay, model.encoder_mel_prologue, model.encoder_rerecord);
    let replays = replay && gpu.replay_available();
    let (mut enc, mut enc_whole, mut enc_wgpu, mut enc_mel, mut enc_rec, mut enc_res, mut enc_cut) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // The host's split of each mode's fastest batch: mel upload, recording + submission, wait.
    let mut enc_split = [(f64::INFINITY, (0.0, 0.0, 0.0)); 7];
    // Mode 5: a recording's windows as a long file's run (`begin_window_of`): a 31000-frame
    // spectrogram (the window tiled), ten windows a batch from its start, 2800 frames apart
    // (a window's seek moves ~28 s), each batch a fresh recording. The kept part of the
    // spectrogram (RESIDENT_FRAMES, 30000) holds ten such windows, so each batch has one
    // window that writes its own frames first: the mean of a batch is what a window costs
    // over a file.
    // Mode 6: the same windows cut out on the host and encoded as mode 0 does (what the
    // decode loop does with the kept spectrogram off), the cut timed with them.
    let (rec_frames, rec_windows, rec_step) = (31_000usize, 10usize, 2800usize);
    let window_frames = mel.len() / dims.n_mels;
    let recording = engine::audio::mel::LogMel {
        n_mels: dims.n_mels,
        n_frames: rec_frames,
        data: (0..dims.n_mels * rec_frames).map(|i| mel[(i % dims.n_mels) * window_frames + (i / dims.n_mels) % window_frames]).collect(),
    };
    let resident = model.encoder_resident;
    for b in 0..=batches {
        for mode in 0..7 {
            // 0 shipped, 1 whole, 2 parts through wgpu, 3 replayed with the mel the other
            // way, 4 replayed with the recording kept the other way (each window recorded
            // or the program submitted again unrecorded), 5 and 6 a recording's windows
            // with the kept spectrogram on and off
            let mode = (mode + b) % 7;
            if mode >= 2 && !replays {
                continue;
            }
            model.encoder_parts = parts && mode != 1;
            model.encoder_replay = replay && (mode == 0 || mode >= 3);
            model.encoder_mel_prologue = mel_prologue != (mode == 3);
            model.encoder_rerecord = rerecord != (mode == 4);
            // (windows of their own take the mel buffer whatever it says: `begin_window`)
            model.encoder_resident = mode == 5;
            model.encoder_host = (0.0, 0.0, 0.0, 0);
            let t = Instant::now();
            let reps = if mode >= 5 { rec_windows } else { 3 };
            for i in 0..reps {
                match mode {
                    5 => model.begin_window_of(&recording, i * rec_step, window_frames, i == 0).map_err(err)?,
                    6 => model.begin_window(&recording.window_frames(i * rec_step, window_frames, window_frames)).map_err(err)?,
                    _ => model.begin_window(&mel).map_err(err)?,
                }
            }
            let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
            if b > 0 {
                [&mut enc, &mut enc_whole, &mut enc_wgpu, &mut enc_mel, &mut enc_rec, &mut enc_res, &mut enc_cut][mode].push(ms);
                let (m, r, w, n) = model.encoder_host;
                let per = |x: f64| x * 1e3 / n.max(1) as f64;
                if ms < enc_split[mode].0 {
                    enc_split[mode] = (ms, (per(m), per(r), per(w)));
                }
            }
        }
    }
    model.encoder_parts = parts;
    model.encoder_replay = replay;
    model.encoder_mel_prologue = mel_prologue;
    model.encoder_rerecord = rerecord;
    model.encoder_resident = resident;
    let resident_memory = if model.resident_device_local() { "device-local" } else { "host memory" };

    // Prefill (4 and 64 positions from 0) and forced decode steps.
    let steps = args.steps.min(dims.text_ctx - 4);
    let prompt4: Vec<u32> = (0..4).map(text_token).collect();
    let prompt64: Vec<u32> = (0..64).map(text_token).collect();
    let (mut pre4, mut pre64, mut dec, mut dec_wgpu) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut per_step_dispatches = 0.0;
    let mut host_split = Vec::new();
    for b in 0..=batches {
        model.begin_window(&mel).map_err(err)?;
        let t = Instant::now();
        model.advance(&prompt64, &rules).map_err(err)?;
        let p64 = t.elapsed().as_secs_f64() * 1e3 / 64.0;
        model.begin_window(&mel).map_err(err)?;
        let t = Instant::now();
        model.advance(&prompt4, &rules).map_err(err)?;
        let p4 = t.elapsed().as_secs_f64() * 1e3 / 4.0;
        let before = model.profile.total_dispatches();
        model.host_times = (0.0, 0.0, 0);
        let t = Instant::now();
        for i in 0..steps {
            model.advance(&[text_token(i + 4)], &rules).map_err(err)?;
        }
        let d = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
        per_step_dispatches = (model.profile.total_dispatches() - before) as f64 / steps as f64;
        let (rs, ws, n) = model.host_times;
        // The same with replays off (the prompt and the first step through wgpu too), alternated.
        if model.replay && model.gpu().replay_available() {
            model.replay = false;
            model.begin_window(&mel).map_err(err)?;
            let prefilled = model.advance(&prompt4, &rules);
            let t = Instant::now();
            let stepped = prefilled.and_then(|_| (0..steps).try_for_each(|i| model.advance(&[text_token(i + 4)], &rules).map(|_| ())));
            let dw = t.elapsed().as_secs_f64() * 1e3 / steps as f64;
            model.replay = true;
            stepped.map_err(err)?;
            if b > 0 {
                dec_wgpu.push(dw);
            }
        }
        if b > 0 {
            host_split.push((d, rs * 1e3 / n.max(1) as f64, ws * 1e3 / n.max(1) as f64));
            // Batch 0 is the warm-up (bind groups of every KV length's dispatch shapes).
            pre4.push(p4);
            pre64.push(p64);
            dec.push(d);
        }
    }

    // Several steps per readback (greedy_steps: the device picks each next token): ms
    // per token for 4 and for the most steps a submission takes, over about `steps` tokens.
    let mut batched_ms = Vec::new();
    let mut first_ms = Vec::new();
    if model.max_steps() > 1 {
        rewarm(&mut model, "steps per readback")?;
        // `calls` batches of k steps in a fresh window after the 4-token prompt: ms per
        // token from the first step's recording to the last readback.
        let run_batches = |model: &mut GpuWhisper, k: usize, calls: usize| -> Result<f64, String> {
            model.host_times = (0.0, 0.0, 0);
            model.begin_window(&mel).map_err(err)?;
            model.advance(&prompt4, &rules).map_err(err)?;
            let mut next = text_token(4);
            let t = Instant::now();
            for _ in 0..calls {
                let step = engine::decode::Step { rules, check_ts_over_text: false };
                let out = model.greedy_steps(next, k, &step, None).map_err(err)?;
                if out.picks.contains(&eot) {
                    return Err("a timed batch picked end-of-text (its later steps ran empty)".into());
                }
                next = *out.picks.last().expect("k picks");
            }
            Ok(t.elapsed().as_secs_f64() * 1e3 / (calls * k) as f64)
        };
        for k in [4, model.max_steps()] {
            let calls = (steps / k).max(1);
            let mut v = Vec::new();
            let mut split = (f64::INFINITY, 0.0, 0.0);
            for b in 0..=batches {
                let ms = run_batches(&mut model, k, calls)?;
                if b > 0 {
                    let (rs, ws, n) = model.host_times;
                    if ms < split.0 {
                        split = (ms, rs * 1e3 / n.max(1) as f64, ws * 1e3 / n.max(1) as f64);
                    }
                    v.push(ms);
                }
            }
            batched_ms.push((k, calls * k, stat(&v), split));
        }
        // The most steps a readback also with each batch encoded before its clock (the
        // host's recording off the path: the GPU's own time for a batch, what a batch
        // recorded once and replayed would cost), alternated batch by batch with the
        // shipped chunks so both see the same clocks.
        let k = model.max_steps();
        let calls = (steps / k).max(1);
        let (mut shipped, mut pre) = (Vec::new(), Vec::new());
        for b in 0..=batches {
            for enc_first in [false, true] {
                model.batch_encoded_first = enc_first;
                let all = run_batches(&mut model, k, calls);
                model.batch_encoded_first = false;
                let all = all?;
                let (rs, ws, _) = model.host_times;
                // Encoded first: from the first submission to the last readback.
                let ms = if enc_first { (rs + ws) * 1e3 / (calls * k) as f64 } else { all };
                if b > 0 {
                    if enc_first { pre.push(ms) } else { shipped.push(ms) }
                }
            }
        }
        first_ms.push((k, calls * k, stat(&shipped), stat(&pre)));
    }

    // Each part of a step left out in turn, the most steps per readback: what the part
    // costs where it runs, between its neighbours (first row: nothing left out).
    let mut parts_ms = Vec::new();
    if args.step_parts && model.max_steps() > 1 {
        rewarm(&mut model, "step parts")?;
        let k = model.max_steps();
        let calls = (steps / k).max(1);
        for part in std::iter::once(None).chain(engine::models::whisper::gpu::DECODE_PARTS.iter().copied().map(Some)) {
            model.leave_out = part;
            let mut v = Vec::new();
            let mut per_step = 0.0;
            for b in 0..=batches {
                model.begin_window(&mel).map_err(err)?;
                model.advance(&prompt4, &rules).map_err(err)?;
                let before = model.profile.total_dispatches();
                let t = Instant::now();
                for _ in 0..calls {
                    // The same first token every call: with a part left out the picks are
                    // meaningless, and the timing does not depend on them.
                    let step = engine::decode::Step { rules, check_ts_over_text: false };
                    let out = model.greedy_steps(text_token(4), k, &step, None).map_err(err)?;
                    if out.picks.contains(&eot) {
                        return Err("a timed batch picked end-of-text (its later steps ran empty)".into());
                    }
                }
                if b > 0 {
                    v.push(t.elapsed().as_secs_f64() * 1e3 / (calls * k) as f64);
                    per_step = (model.profile.total_dispatches() - before) as f64 / (calls * k) as f64;
                }
            }
            // A part with no dispatches in this step (fc1 and fc2 where ffn_decode runs, or
            // the other way round) would read as a free part: left out of the table.
            if part.is_some() && parts_ms.first().is_some_and(|&(_, _, all, _)| all == per_step) {
                continue;
            }
            parts_ms.push((part.unwrap_or("nothing"), k, per_step, stat(&v)));
        }
        model.leave_out = None;
    }

    // Verify passes of n positions (k = n - 1 drafts), rolled back after each. Guard: a
    // verify pass must give each position's scores bit for bit as single steps do (a
    // driver that fuses differently in the multi-row kernel would change transcripts).
    let mut verify_ms = Vec::new();
    let mut fresh_ms = Vec::new();
    if model.max_verify() > 0 {
        for n in [2, 3, 5, model.max_verify()] {
            let tokens: Vec<u32> = (0..n).map(|i| text_token(i + 4)).collect();
            model.begin_window(&mel).map_err(err)?;
            model.advance(&prompt4, &rules).map_err(err)?;
            let single = tokens.iter().map(|t| model.advance(&[*t], &rules)).collect::<Result<Vec<_>, _>>().map_err(err)?;
            model.begin_window(&mel).map_err(err)?;
            model.advance(&prompt4, &rules).map_err(err)?;
            let verified = model.verify(&tokens, &vec![rules; n]).map_err(err)?;
            if verified != single {
                return Err(format!("a verify pass of {n} positions differs from single steps: {verified:?} vs {single:?}"));
            }
        }
        // Each n as the decoder runs it (the first layer submitted early), and the most
        // positions also recorded whole before one submission, to see what that hides.
        rewarm(&mut model, "verify passes")?;
        let early = model.early_submit.clone();
        // Each n encoded through wgpu as the decoder did before replays, then replayed (where
        // the device allows it), alternated; the most positions also recorded whole.
        let replays = model.gpu().replay_available() && model.replay;
        let replay_before = model.replay;
        let runs = (1..=model.max_verify())
            .flat_map(|n| [(n, early.clone(), false), (n, Vec::new(), true)])
            .filter(|&(_, _, r)| !r || replays)
            .chain([(model.max_verify(), Vec::new(), false)]);
        // 16 calls of `call` per batch, each batch in a fresh window after the 4-token
        // prompt (batch 0 a warm-up): ms per call, and the host's record / wait split of the
        // fastest batch.
        let timed = |model: &mut GpuWhisper, call: &mut dyn FnMut(&mut GpuWhisper, usize) -> engine::Result<()>| {
            let reps = 16;
            let mut v = Vec::new();
            let mut split = (f64::INFINITY, 0.0, 0.0);
            for b in 0..=batches {
                model.begin_window(&mel).map_err(err)?;
                model.advance(&prompt4, &rules).map_err(err)?;
                model.host_times = (0.0, 0.0, 0);
                let t = Instant::now();
                for i in 0..reps {
                    call(model, i).map_err(err)?;
                }
                let ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
                let (rs, ws, calls) = model.host_times;
                if b > 0 {
                    v.push(ms);
                    if ms < split.0 {
                        split = (ms, rs * 1e3 / calls.max(1) as f64, ws * 1e3 / calls.max(1) as f64);
                    }
                }
            }
            Ok::<_, String>((stat(&v), split.1, split.2))
        };
        for (n, early_submit, replay) in runs {
            model.early_submit = early_submit.clone();
            model.replay = replay;
            let tokens: Vec<u32> = (0..n).map(|i| text_token(i + 4)).collect();
            let rules_n = vec![rules; n];
            let (v, r, w) = timed(&mut model, &mut |m, _| {
                m.verify(&tokens, &rules_n)?;
                m.rollback(n)
            })?;
            verify_ms.push((n, early_submit, replay, v, r, w));
        }
        model.replay = replay_before;
        // A single step with none encoded ahead for its position (after drafts were rolled
        // back: the live replay's lone steps after a missed draft): the step encoded ahead
        // for the next position moved back by its parameters (`retarget`), and with that off
        // recorded anew, submitted in parts as the decoder runs it and recorded whole;
        // alternated.
        let retarget = model.retarget;
        for _ in 0..2 {
            let ways = [(early.clone(), true, false), (early.clone(), false, false), (Vec::new(), false, false), (Vec::new(), false, true)];
            for (early_submit, moved, replay) in ways {
                if replay && !replays {
                    continue;
                }
                model.early_submit = early_submit.clone();
                model.retarget = moved;
                model.replay = replay;
                let (v, r, w) = timed(&mut model, &mut |m, i| {
                    m.advance(&[text_token(i + 4)], &rules)?;
                    m.rollback(1)
                })?;
                fresh_ms.push((early_submit, moved, replay, v, r, w));
            }
        }
        model.early_submit = early;
        model.retarget = retarget;
        model.replay = replay_before;
    }

    // Draft models: one `draft` call of k tokens is one submission of k decoder steps of
    // the cut, quantized copy (the last context token recomputed each call here).
    let mut draft_ms = Vec::new();
    let mut depths = vec![1, dims.decoder_layers.div_ceil(2), dims.decoder_layers];
    depths.dedup();
    rewarm(&mut model, "drafts")?;
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
        for &layers in &depths {
            model.set_draft(&ck, format, layers).map_err(err)?;
            let mut row = Vec::new();
            for k in [1, 7] {
                let mut v = Vec::new();
                for b in 0..=batches {
                    model.begin_window(&mel).map_err(err)?;
                    model.draft(&prompt4, k, true).map_err(err)?;
                    let reps = 8;
                    let t = Instant::now();
                    for _ in 0..reps {
                        model.draft(&prompt4, k, true).map_err(err)?;
                    }
                    if b > 0 {
                        v.push(t.elapsed().as_secs_f64() * 1e3 / reps as f64);
                    }
                }
                row.push(stat(&v));
            }
            draft_ms.push((format, layers, row));
        }
    }
    drop(ck);

    // Copy ceiling, then the per-kernel table (timestamps on).
    let copy_gbs = copy_ceiling(&gpu, args.copy_mib, batches)?;
    rewarm(&mut model, "per-kernel profile")?;
    gpu.pause_profiling(false);
    model.profile.clear();
    let prof_steps = 64.min(steps);
    model.begin_window(&mel).map_err(err)?;
    model.advance(&prompt4, &rules).map_err(err)?;
    for i in 0..prof_steps {
        model.advance(&[text_token(i + 4)], &rules).map_err(err)?;
    }
    // Verify passes of the most positions, each rolled back: the table's "verify" rows.
    let prof_passes = if model.max_verify() > 0 { 16 } else { 0 };
    let verify_tokens: Vec<u32> = (0..model.max_verify()).map(|i| text_token(i + 4)).collect();
    for _ in 0..prof_passes {
        model.verify(&verify_tokens, &vec![rules; verify_tokens.len()]).map_err(err)?;
        model.rollback(verify_tokens.len()).map_err(err)?;
    }
    gpu.pause_profiling(true);
    let profile = model.profile.clone();
    let by_length = pass_length_profile(&gpu, &mut model, &rules)?;

    // End to end.
    let mut file_line = None;
    if let Some(file) = &args.file {
        if synthetic {
            return Err("--file needs a real model directory (--model), not --synthetic".into());
        }
        rewarm(&mut model, "end to end")?;
        drop(model);
        let mut tr = Transcriber::load_with(gpu.clone(), &dir, args.quant).map_err(err)?;
        let opts = Options::default();
        let mut times = Vec::new();
        let mut last = None;
        for _ in 0..=batches {
            let t = Instant::now();
            let tx = tr.transcribe_file(file, &opts).map_err(err)?;
            times.push(t.elapsed().as_secs_f64());
            last = Some(tx);
        }
        times.remove(0);
        let tx = last.expect("at least one run");
        let st = stat(&times);
        let mut lines = vec![format!(
            "| end to end: {} ({:.1} s audio, {} tokens) | {:.1} ms | {:.2} | RTF {:.5} |",
            file.display(),
            tx.audio_seconds,
            tx.tokens,
            st.min * 1e3,
            st.spread,
            st.min / tx.audio_seconds
        )];
        lines.extend(file_drafts(&mut tr, file, batches)?);
        let audio = engine::audio::decode_wav_file(file).map_err(err)?.to_mono_16k().map_err(err)?;
        lines.extend(live_replay(&mut tr, &audio, batches, true)?.into_iter().map(|r| r.line));
        file_line = Some(lines.join("\n"));
    }

    // Report.
    println!();
    println!("| measure | min | spread | note |");
    println!("|---|---:|---:|---|");
    println!("| GPU warm-up before timing, ms | {:.0} | | {} |", warm.elapsed_ms, warm.describe("window"));
    for (what, w) in &rewarms {
        println!("| GPU warm-up again before {what}, ms | {:.0} | | {} |", w.elapsed_ms, w.describe("window"));
    }
    let e = stat(&enc);
    let how_wgpu = if parts { "submitted in parts (after each convolution and the first layer)" } else { "one submission (VERBATIM_ENCODER_EARLY=0)" };
    let how = match (replays, mel_prologue) {
        (true, true) => "replayed (a raw Vulkan command buffer built once, the mel copied by its prologue from a staging buffer)",
        (true, false) => "replayed (a raw Vulkan command buffer built once, the mel through wgpu)",
        (false, _) => how_wgpu,
    };
    let kept = if rerecord { "recorded every window" } else { "submitted again unrecorded" };
    let split = |mode: usize| {
        let (m, r, w) = enc_split[mode].1;
        format!("host: mel upload {m:.3}, records and submits {r:.3}, waits {w:.3}")
    };
    let how = if replays { format!("{how}, {kept}") } else { how.to_string() };
    println!("| encoder, ms per 30 s window | {:.3} | {:.2} | incl. cross K/V, {how} + wait; {} |", e.min, e.spread, split(0));
    if replays {
        let ep = stat(&enc_wgpu);
        println!("| encoder through wgpu, {how_wgpu}, ms | {:.3} | {:.2} | the same windows, alternated with the rows around it; {} |", ep.min, ep.spread, split(2));
        let em = stat(&enc_mel);
        let other = if mel_prologue { "through wgpu's staging and an empty submission" } else { "copied by the replay's prologue from a staging buffer" };
        println!("| encoder replayed, the mel {other}, ms | {:.3} | {:.2} | the same windows, alternated with the rows around it; {} |", em.min, em.spread, split(3));
        let er = stat(&enc_rec);
        let other = if rerecord { "submitted again unrecorded" } else { "recorded every window" };
        println!("| encoder replayed, {other}, ms | {:.3} | {:.2} | the same windows, alternated with the rows around it; {} |", er.min, er.spread, split(4));
        if !rerecord {
            let es = stat(&enc_res);
            println!(
                "| encoder over a recording's windows (begin_window_of), ms per window | {:.3} | {:.2} | the kept encoder over the spectrogram kept in a host buffer ({}), each window filling the next ahead while the GPU encodes, 1 in {rec_windows} writing its own first (the mean of {rec_windows} windows {rec_step} frames apart, alternated with the rows around it); {} |",
                es.min,
                es.spread,
                resident_memory,
                split(5)
            );
            let ec = stat(&enc_cut);
            println!(
                "| the same windows cut out on the host, ms per window | {:.3} | {:.2} | each window a {} KB vector (transposed to band-major), then as the first row; {} |",
                ec.min,
                ec.spread,
                mel.len() * 4 / 1000,
                split(6)
            );
        }
    }
    let ew = stat(&enc_whole);
    println!("| encoder recorded whole before one submission, ms | {:.3} | {:.2} | the same windows, alternated with the rows above; {} |", ew.min, ew.spread, split(1));
    let p4 = stat(&pre4);
    let p64 = stat(&pre64);
    println!("| prefill 4 positions, ms/token | {:.3} | {:.2} | |", p4.min, p4.spread);
    println!("| prefill 64 positions, ms/token | {:.4} | {:.2} | |", p64.min, p64.spread);
    let d = stat(&dec);
    let how = if dec_wgpu.is_empty() { "each encoded ahead through wgpu" } else { "each encoded ahead, the first (after the prompt) replayed" };
    println!(
        "| decode, ms/token ({steps} forced steps) | {:.4} | {:.2} | one submit + wait per step, {how} |",
        d.min, d.spread
    );
    if !dec_wgpu.is_empty() {
        let w = stat(&dec_wgpu);
        println!(
            "| decode, ms/token ({steps} forced steps), replays off | {:.4} | {:.2} | one submit + wait per step, each encoded ahead through wgpu; alternated with the row above |",
            w.min, w.spread
        );
    }
    if let Some(&(_, r, w)) = host_split.iter().min_by(|a, b| a.0.total_cmp(&b.0)) {
        println!("| decode step: record + submit, ms | {r:.4} | | host, fastest batch (encoding ahead not counted) |");
        println!("| decode step: wait for GPU + readback, ms | {w:.4} | | |");
    }
    println!("| dispatches per decode step | {per_step_dispatches:.1} | | |");
    for (k, n, v, (_, r, w)) in &batched_ms {
        println!(
            "| decode, ms/token, {k} steps per readback ({n} steps) | {:.4} | {:.2} | the device picks each next token; per step: host records {r:.4}, waits {w:.4} |",
            v.min, v.spread
        );
    }
    for (k, n, shipped, pre) in &first_ms {
        println!(
            "| decode, ms/token, {k} steps per readback ({n} steps), each batch encoded before its clock | {:.4} | {:.2} | the GPU's own time for a batch (the host's recording off the path); recorded as shipped in the same batches: {:.4} ({:.2}) |",
            pre.min, pre.spread, shipped.min, shipped.spread
        );
    }
    if let Some((_, _, _, all)) = parts_ms.first() {
        for (part, k, per_step, v) in &parts_ms[1..] {
            println!(
                "| decode without {part}, ms/token, {k} per readback | {:.4} | {:.2} | {per_step:.1} dispatches a step; the part costs {:.4} in the stream |",
                v.min,
                v.spread,
                all.min - v.min
            );
        }
    }
    for (n, early, replay, v, r, w) in &verify_ms {
        let how = match (replay, early.as_slice()) {
            (true, _) => ", replayed (a raw Vulkan command buffer built once, its parameters uploaded by a prologue)".to_string(),
            (false, []) => ", recorded whole before one submission".to_string(),
            (false, e) => format!(", submitted at dispatches {e:?} and the end"),
        };
        println!(
            "| verify pass, {n} positions (k = {} drafts){how}, ms | {:.4} | {:.2} | {:.2}x a decode step; + rollback; host records {r:.4}, waits {w:.4} |",
            n - 1,
            v.min,
            v.spread,
            v.min / d.min
        );
    }
    for (early, moved, replay, v, r, w) in &fresh_ms {
        let how = match (replay, moved, early.as_slice()) {
            (true, _, _) => "replayed".to_string(),
            (false, true, _) => "the step encoded ahead moved back by its parameters (retarget)".to_string(),
            (false, false, []) => "recorded whole before one submission".to_string(),
            (false, false, e) => format!("submitted at dispatches {e:?} and the end"),
        };
        println!(
            "| decode step after a rollback (none encoded for its position), {how}, ms | {:.4} | {:.2} | + rollback; host records {r:.4}, waits {w:.4} |",
            v.min, v.spread
        );
    }
    for (format, layers, row) in &draft_ms {
        println!(
            "| draft {} {layers} layer(s): 1 token / 7 tokens per call, ms | {:.4} / {:.4} | {:.2} / {:.2} | {:.4} ms per further token |",
            format.name(),
            row[0].min,
            row[1].min,
            row[0].spread,
            row[1].spread,
            (row[1].min - row[0].min) / 6.0
        );
    }
    println!("| copy ceiling, GB/s | {copy_gbs:.0} | | vec4 copy kernel, {} MiB buffers |", args.copy_mib);
    if let Some(l) = file_line {
        println!("{l}");
    }
    println!();
    kernel_table(&profile, copy_gbs, prof_steps, prof_passes, verify_tokens.len());
    pass_length_table(&by_length);
    if let Some(dir) = &args.pipeline_stats {
        pipeline_stats_table(&gpu, dir)?;
    }
    Ok(())
}

/// The driver's compiler statistics of every kernel compiled in this run, one row a kernel
/// and one column a statistic (as the driver names them), and its text representations
/// written to `dir` as `<kernel>.<entry>.<n>.txt`.
fn pipeline_stats_table(gpu: &Gpu, dir: &Path) -> Result<(), String> {
    let reports = gpu.pipeline_stats().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut columns: Vec<String> = Vec::new();
    for r in &reports {
        for e in &r.executables {
            for s in &e.statistics {
                if !columns.contains(&s.name) {
                    columns.push(s.name.clone());
                }
            }
        }
    }
    println!();
    println!("Compiler statistics ({} kernels, the driver's names):", reports.len());
    println!();
    println!("| kernel | entry | subgroup | {} |", columns.join(" | "));
    println!("|---|---|---:|{}", "---:|".repeat(columns.len()));
    let mut files = 0;
    for r in &reports {
        for (i, e) in r.executables.iter().enumerate() {
            let cells: Vec<String> = columns
                .iter()
                .map(|c| e.statistics.iter().find(|s| &s.name == c).map(|s| s.value.clone()).unwrap_or_default())
                .collect();
            println!("| {} | {} | {} | {} |", r.kernel, r.entry, e.subgroup_size, cells.join(" | "));
            for (j, (name, text)) in e.representations.iter().enumerate() {
                let safe = |s: &str| s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect::<String>();
                let path = dir.join(format!("{}.{}.{i}.{j}.{}.txt", safe(r.kernel), safe(&r.entry), safe(name)));
                std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                files += 1;
            }
        }
    }
    if let Some(r) = reports.iter().find_map(|r| r.executables.first()) {
        println!();
        for s in &r.statistics {
            println!("- {}: {}", s.name, s.description);
        }
    }
    println!();
    println!("{files} text representations written to {}", dir.display());
    Ok(())
}

/// `file` transcribed with each draft source: decode ms per emitted token (the "decode
/// steps" stage over the tokens), acceptance; every text must be `off`'s.
fn file_drafts(tr: &mut Transcriber, file: &Path, batches: usize) -> Result<Vec<String>, String> {
    use engine::decode::draft::Speculative;
    let err = |e: engine::Error| e.to_string();
    let mut rows = Vec::new();
    let mut plain_text = None;
    for timestamps in [true, false] {
        for spec in [Speculative::Off, Speculative::Ngram, Speculative::SelfQ8, Speculative::SelfQ4] {
            let mut opts = Options { timestamps, ..Options::default() };
            opts.decode.speculative = spec;
            let mut per_token = Vec::new();
            let mut last = None;
            for b in 0..=batches {
                let t = tr.transcribe_file(file, &opts).map_err(err)?;
                let decode_s = t.stage_seconds("decode steps");
                if b > 0 {
                    per_token.push(decode_s * 1e3 / t.tokens.max(1) as f64);
                }
                last = Some(t);
            }
            let t = last.expect("one run");
            if spec == Speculative::Off {
                plain_text = Some(t.text.clone());
            } else if plain_text.as_ref() != Some(&t.text) {
                return Err(format!("{}: the text with drafts {} differs from off's", file.display(), spec.name()));
            }
            let st = stat(&per_token);
            rows.push(format!(
                "| file, {}, drafts {}: decode ms per emitted token | {:.4} | {:.2} | {} tokens; {:.0} % of drafts kept, {:.2} tokens per pass |",
                if timestamps { "timestamps" } else { "no timestamps" },
                spec.name(),
                st.min,
                st.spread,
                t.tokens,
                t.spec.acceptance() * 100.0,
                t.spec.tokens_per_pass()
            ));
        }
    }
    Ok(rows)
}

/// `--live-files`: [`live_replay`] (drafts off and ngram only) and [`live_session_replay`]
/// of each file in turn, the GPU warmed on the file's first second before each, then one
/// table of every file's rows and the token-weighted figures over all files.
fn live_files(gpu: Arc<Gpu>, dir: &Path, args: &Args) -> Result<(), String> {
    let err = |e: engine::Error| e.to_string();
    let batches = args.batches.max(1);
    let mut tr = Transcriber::load_with(gpu.clone(), dir, args.quant).map_err(err)?;
    let mut rows = Vec::new();
    // (a live session, drafts on, tokens, decode ms) over every file: the token-weighted
    // figure of each kind of row.
    let mut totals: Vec<(bool, bool, usize, f64)> = Vec::new();
    for file in &args.live_files {
        let audio = engine::audio::decode_wav_file(file).map_err(err)?.to_mono_16k().map_err(err)?;
        let head = &audio[..audio.len().min(16_000)];
        let warm = if gpu.info.is_cpu() {
            String::new()
        } else {
            let opts = Options::default();
            let w = warm_up(|| tr.transcribe_samples(head, &opts, &mut |_| {}).map(|_| ()).map_err(err))?;
            format!(" (warm-up {:.0} ms, {})", w.elapsed_ms, w.describe("first second"))
        };
        let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
        eprintln!("{name}: {:.1} s{warm}", audio.len() as f64 / 16_000.0);
        let mut file_rows = live_replay(&mut tr, &audio, batches, false)?;
        file_rows.extend(live_session_replay(&mut tr, &audio, batches)?);
        for row in file_rows {
            rows.push(row.line.replacen("| live ", &format!("| {name}: live "), 1));
            match totals.iter_mut().find(|t| (t.0, t.1) == (row.session, row.drafts)) {
                Some(t) => {
                    t.2 += row.tokens;
                    t.3 += row.ms_per_token * row.tokens as f64;
                }
                None => totals.push((row.session, row.drafts, row.tokens, row.ms_per_token * row.tokens as f64)),
            }
        }
    }
    println!();
    println!("| measure | min | spread | note |");
    println!("|---|---:|---:|---|");
    for row in rows {
        println!("{row}");
    }
    for (session, drafts, tokens, ms) in totals {
        println!(
            "| over {} file(s), {}, drafts {}: decode ms per emitted token | {:.4} | | {tokens} tokens; each file's best batch, weighted by its tokens |",
            args.live_files.len(),
            if session { "live sessions" } else { "prefix replays" },
            if drafts { "ngram" } else { "off" },
            ms / tokens.max(1) as f64
        );
    }
    Ok(())
}

/// Live mode itself on `audio`: a [`LiveSession`](engine::live::session::LiveSession) fed
/// the file in 30 ms pieces, decoding whenever it asks (every 0.5 s of new audio while
/// there is speech), with its committed-text prompt, its buffer trimmed at committed
/// segments and its hypothesis as the next decode's draft, as the microphone path runs it
/// when each decode takes less than the 0.5 s it waits for. Drafts off and ngram, the
/// committed text the same both ways (else the bench stops). Rows as [`live_replay`]'s.
fn live_session_replay(tr: &mut Transcriber, audio: &[f32], batches: usize) -> Result<Vec<LiveRow>, String> {
    use engine::decode::draft::Speculative;
    use engine::live::session::LiveSession;
    use engine::live::{LiveOptions, Recognizer, Whisper};
    let err = |e: engine::Error| e.to_string();
    let cancel = engine::decode::CancelFlag::new();
    let mut rows = Vec::new();
    let mut texts = Vec::new();
    for spec in [Speculative::Off, Speculative::Ngram] {
        let mut opts = LiveOptions::default();
        opts.decode.speculative = spec;
        let mut per_token = Vec::new();
        let mut last = (0usize, 0usize, engine::decode::whisper::SpecStats::default());
        for b in 0..=batches {
            let mut session = LiveSession::new(opts.clone());
            let mut rec = Whisper::new(tr, opts.decode.clone());
            for piece in audio.chunks(480) {
                session.push_audio(piece, Instant::now());
                if session.wants_decode() {
                    session.step(&mut rec, &cancel, false).map_err(err)?;
                }
            }
            session.finish(&mut rec, &cancel).map_err(err)?;
            let (tokens, seconds) = rec.decoded();
            if b == 0 {
                texts.push(session.committed_text().to_string());
            } else {
                per_token.push(seconds * 1e3 / tokens.max(1) as f64);
            }
            last = (session.decodes(), tokens, rec.spec());
        }
        let st = stat(&per_token);
        let (decodes, tokens, sp) = last;
        let line = format!(
            "| live session ({decodes} decodes, {tokens} tokens), drafts {}: decode ms/token | {:.4} | {:.2} | {} |",
            spec.name(),
            st.min,
            st.spread,
            spec_note(spec, &sp)
        );
        rows.push(LiveRow { line, session: true, drafts: spec != Speculative::Off, tokens, ms_per_token: st.min });
    }
    if texts.iter().any(|t| *t != texts[0]) {
        return Err("the live session's committed text differs with and without drafts: speculative decoding changed the output".into());
    }
    Ok(rows)
}

/// A live row's note: what the drafts did.
fn spec_note(spec: engine::decode::draft::Speculative, sp: &engine::decode::whisper::SpecStats) -> String {
    if spec == engine::decode::draft::Speculative::Off {
        return "one position per pass".to_string();
    }
    format!(
        "{:.0} % of drafts accepted, {:.2} tokens per verify pass ({} passes), {} positions alone (no draft); passes by positions: {}",
        sp.acceptance() * 100.0,
        sp.tokens_per_pass(),
        sp.passes,
        sp.alone,
        sp.describe_positions()
    )
}

/// One row of [`live_replay`] or [`live_session_replay`]: the table line, and what an
/// aggregate over files needs.
struct LiveRow {
    line: String,
    /// A live session (`live_session_replay`) rather than prefixes (`live_replay`).
    session: bool,
    drafts: bool,
    tokens: usize,
    ms_per_token: f64,
}

/// Live mode's work on `audio` (a file's 16 kHz samples): its prefixes every 0.5 s (from
/// 1 s) transcribed in turn, each with the previous prefix's tokens as the draft hint (what
/// live mode's recognizer does), against the same without drafts; with `variants`, also
/// with steps after a rollback recorded anew (no `retarget`), with verify passes cut to 8
/// positions (their length before 2026-12-05), and encoded through wgpu against replayed.
/// Table rows: decode ms per token each way.
fn live_replay(tr: &mut Transcriber, audio: &[f32], batches: usize, variants: bool) -> Result<Vec<LiveRow>, String> {
    use engine::decode::draft::Speculative;
    use engine::decode::whisper::SpecStats;
    let err = |e: engine::Error| e.to_string();
    let step = 8_000;
    let ends: Vec<usize> = (2..).map(|i| i * step).take_while(|&e| e < audio.len()).chain([audio.len()]).collect();
    let mut texts: Vec<Vec<String>> = Vec::new();
    let mut rows = Vec::new();
    let most = tr.verify_max();
    let retarget = tr.retarget();
    let replay = tr.replay() && tr.gpu().replay_available();
    let replay_before = tr.replay();
    // (drafts, most positions a pass, a step encoded ahead moved back after a rollback,
    // verify passes replayed)
    let mut runs = vec![(Speculative::Off, most, retarget, replay), (Speculative::Ngram, most, retarget, replay)];
    if variants && replay {
        runs.push((Speculative::Ngram, most, retarget, false));
        runs.push((Speculative::Ngram, most, retarget, true));
    }
    if retarget && variants {
        runs.push((Speculative::Ngram, most, false, replay));
    }
    if most > 8 && variants {
        runs.push((Speculative::Ngram, 8, retarget, replay));
    }
    for (spec, verify_max, moved, replayed) in runs {
        tr.set_verify_max(verify_max).map_err(err)?;
        tr.set_retarget(moved);
        tr.set_replay(replayed);
        let mut per_token = Vec::new();
        let mut total = (0usize, SpecStats::default());
        for b in 0..=batches {
            let mut hint: Vec<u32> = Vec::new();
            let (mut decode_s, mut tokens, mut sp) = (0.0, 0usize, SpecStats::default());
            let mut run_texts = Vec::new();
            for &end in &ends {
                let mut opts = Options::default();
                opts.decode.speculative = spec;
                opts.decode.draft_hint = std::mem::take(&mut hint);
                let t = tr.transcribe_samples(&audio[..end], &opts, &mut |_| {}).map_err(err)?;
                decode_s += t.stage_seconds("decode steps");
                tokens += t.tokens;
                sp.add(&t.spec);
                hint = t.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
                run_texts.push(t.text);
            }
            if b > 0 {
                per_token.push(decode_s * 1e3 / tokens.max(1) as f64);
                total = (tokens, sp);
            }
            if b == 0 {
                texts.push(run_texts);
            }
        }
        let st = stat(&per_token);
        let (tokens, sp) = total;
        let mut passes = match (spec, moved) {
            (Speculative::Off, _) => String::new(),
            (_, true) => format!(", verify passes of at most {verify_max}"),
            (_, false) => format!(", verify passes of at most {verify_max}, steps after a rollback recorded anew"),
        };
        if spec != Speculative::Off {
            passes += if replayed { ", replayed" } else { ", encoded through wgpu" };
        }
        let line = format!(
            "| live replay ({} decodes of 0.5 s steps, {tokens} tokens), drafts {}{passes}: decode ms/token | {:.4} | {:.2} | {} |",
            ends.len(),
            spec.name(),
            st.min,
            st.spread,
            spec_note(spec, &sp)
        );
        rows.push(LiveRow { line, session: false, drafts: spec != Speculative::Off, tokens, ms_per_token: st.min });
    }
    tr.set_verify_max(most).map_err(err)?;
    tr.set_retarget(retarget);
    tr.set_replay(replay_before);
    if texts.iter().any(|t| *t != texts[0]) {
        return Err("the live replay's texts differ with and without drafts: speculative decoding changed the output".into());
    }
    Ok(rows)
}

/// Per-kernel GPU µs a verify pass of one length: (positions, [(kernel, µs a pass)]).
type PassLengthProfile = (usize, Vec<(&'static str, f64)>);

/// Verify-pass lengths the by-length table profiles (those up to the model's most).
const PROFILE_PASS_LENGTHS: [usize; 12] = [1, 2, 4, 8, 9, 11, 12, 13, 16, 23, 29, 32];

/// Per-kernel GPU µs a verify pass for each length of PROFILE_PASS_LENGTHS, from 8 timed
/// passes each, rolled back. A pass's time does not grow evenly with its rows (jfk's
/// replayed passes on the H100, 2026-12-05: +3 to +19 µs a row up to 11, +52 from 11 to 12,
/// +29 from 12 to 13): a kernel whose grid grows with the rows steps up where its
/// workgroups pass another wave of the SMs' slots, which a table of one length cannot show.
fn pass_length_profile(gpu: &Gpu, model: &mut GpuWhisper, rules: &StepRules) -> Result<Vec<PassLengthProfile>, String> {
    let err = |e: engine::Error| e.to_string();
    let mut out = Vec::new();
    if !model.profile.timed || model.max_verify() == 0 {
        return Ok(out);
    }
    const PASSES: usize = 8;
    // The tokens the bench's other passes verify (any text tokens do: the work is the same).
    let text_token = |i: usize| 400 + (i as u32 * 37) % 20000;
    let most = model.max_verify();
    for &n in PROFILE_PASS_LENGTHS.iter().filter(|&&n| n <= most) {
        let tokens: Vec<u32> = (0..n).map(|i| text_token(i + 4)).collect();
        // One untimed pass first: a pass length's first use builds its bind groups.
        model.verify(&tokens, &vec![*rules; n]).map_err(err)?;
        model.rollback(n).map_err(err)?;
        model.profile.clear();
        gpu.pause_profiling(false);
        for _ in 0..PASSES {
            model.verify(&tokens, &vec![*rules; n]).map_err(err)?;
            model.rollback(n).map_err(err)?;
        }
        gpu.pause_profiling(true);
        let mut per: Vec<(&'static str, f64)> = Vec::new();
        for k in model.profile.stats() {
            let us = k.gpu_ns / 1e3 / PASSES as f64;
            match per.iter_mut().find(|(name, _)| *name == k.kernel) {
                Some(e) => e.1 += us,
                None => per.push((k.kernel, us)),
            }
        }
        out.push((n, per));
    }
    model.profile.clear();
    Ok(out)
}

/// The by-length table: kernels (rows) against pass lengths (columns), GPU µs a pass.
fn pass_length_table(by_length: &[PassLengthProfile]) {
    let Some((_, longest)) = by_length.last() else {
        return;
    };
    println!();
    println!("Verify passes by length (GPU µs a pass, a pass per dispatch, 8 passes each; the kernels of a pass summed by name):");
    println!();
    let head: Vec<String> = by_length.iter().map(|(n, _)| n.to_string()).collect();
    println!("| kernel | {} |", head.join(" | "));
    println!("|---|{}", "---:|".repeat(by_length.len()));
    let mut names: Vec<&'static str> = longest.iter().map(|(k, _)| *k).collect();
    for (_, per) in by_length {
        for (k, _) in per {
            if !names.contains(k) {
                names.push(k);
            }
        }
    }
    for name in names {
        let cells: Vec<String> = by_length
            .iter()
            .map(|(_, per)| per.iter().find(|(k, _)| *k == name).map(|(_, us)| format!("{us:.1}")).unwrap_or_default())
            .collect();
        println!("| {name} | {} |", cells.join(" | "));
    }
    let totals: Vec<String> = by_length.iter().map(|(_, per)| format!("{:.1}", per.iter().map(|(_, us)| us).sum::<f64>())).collect();
    println!("| all | {} |", totals.join(" | "));
}

/// The per-kernel table: GPU time per dispatch from timestamp queries, GB/s and % of copy.
fn kernel_table(p: &Profile, copy_gbs: f64, steps: usize, passes: usize, positions: usize) {
    if !p.timed {
        println!("(no timestamp queries on this adapter: no per-kernel table)");
        return;
    }
    println!(
        "Per kernel (one window, 4-token prefill, {steps} decode steps, {passes} verify passes of {positions} positions; timestamps, a pass per dispatch):"
    );
    println!();
    println!("| kernel | stage | dispatches | per step / pass | mean µs | total ms | GB/s | % copy | GFLOP/s |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut total = 0.0;
    let mut decode_ns = 0.0;
    let mut verify_ns = 0.0;
    for k in p.stats() {
        let mean_us = k.gpu_ns / 1e3 / k.dispatches.max(1) as f64;
        let gbs = if k.gpu_ns > 0.0 { k.bytes as f64 / k.gpu_ns } else { 0.0 };
        let gflops = if k.gpu_ns > 0.0 { k.flops as f64 / k.gpu_ns } else { 0.0 };
        let per_step = match k.stage {
            "decode" => format!("{:.1}", k.dispatches as f64 / steps as f64),
            "verify" => format!("{:.1}", k.dispatches as f64 / passes.max(1) as f64),
            _ => String::new(),
        };
        match k.stage {
            "decode" => decode_ns += k.gpu_ns,
            "verify" => verify_ns += k.gpu_ns,
            _ => {}
        }
        total += k.gpu_ns;
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.3} | {:.0} | {:.1} | {:.0} |",
            k.kernel,
            k.stage,
            k.dispatches,
            per_step,
            mean_us,
            k.gpu_ns / 1e6,
            gbs,
            100.0 * gbs / copy_gbs,
            gflops
        );
    }
    println!();
    println!(
        "{} dispatches, {:.3} ms of GPU time; decode steps {:.4} ms/token, verify passes {:.4} ms/pass of GPU time (timed passes)",
        p.total_dispatches(),
        total / 1e6,
        decode_ns / 1e6 / steps.max(1) as f64,
        verify_ns / 1e6 / passes.max(1) as f64
    );
}

const COPY: &str = r#"
struct Params { n: u32, row: u32, a: u32, b: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) li: vec3<u32>) {
    let i = (wg.x + wg.y * p.row) * 256u + li.x;
    if (i < p.n) {
        dst[i] = src[i];
    }
}
"#;

/// GB/s (read + write bytes) of the best of `batches` timed copies of `mib` MiB.
fn copy_ceiling(gpu: &Gpu, mib: u64, batches: usize) -> Result<f64, String> {
    let e = |e: engine::Error| e.to_string();
    let cap = gpu.info.max_storage_binding.min(gpu.device.limits().max_buffer_size);
    let bytes = ((mib << 20).min(cap) / 16 * 16).max(16);
    let src = gpu.buffer("bench copy src", bytes).map_err(e)?;
    let dst = gpu.buffer("bench copy dst", bytes).map_err(e)?;
    gpu.fill_u32(&src, 0x3c00_3c00);
    let k = gpu.kernel("bench_copy", COPY, &[Access::Read, Access::ReadWrite]).map_err(e)?;
    let n = (bytes / 16) as u32;
    let groups = n.div_ceil(256);
    let row = groups.min(32768);
    let params: Vec<u8> = [n, row, 0, 0].iter().flat_map(|x| x.to_le_bytes()).collect();
    gpu.pause_profiling(false);
    let mut best = f64::INFINITY;
    for _ in 0..=batches {
        let mut prof = Profile::default();
        let mut rec = gpu.recorder();
        for _ in 0..4 {
            rec.dispatch(&k, &params, &[&src, &dst], [row, groups.div_ceil(row), 1], Cost { bytes: 2 * bytes, flops: 0 })
                .map_err(e)?;
        }
        rec.submit(Some(&mut prof)).map_err(e)?;
        gpu.wait().map_err(e)?;
        for s in prof.stats() {
            if s.gpu_ns > 0.0 {
                best = best.min(s.gpu_ns / s.dispatches as f64);
            }
        }
    }
    gpu.pause_profiling(true);
    if !best.is_finite() {
        // No timestamps: time submit + wait of the same work on the clock.
        let t = Instant::now();
        let mut rec = gpu.recorder();
        for _ in 0..4 {
            rec.dispatch(&k, &params, &[&src, &dst], [row, groups.div_ceil(row), 1], Cost::default()).map_err(e)?;
        }
        rec.submit(None).map_err(e)?;
        gpu.wait().map_err(e)?;
        best = t.elapsed().as_secs_f64() * 1e9 / 4.0;
    }
    Ok(2.0 * bytes as f64 / best)
}
