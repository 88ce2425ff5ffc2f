//! File in, transcript out: audio decode -> 16 kHz -> log-mel -> Whisper on the GPU ->
//! segments, with the time each stage took. The CLI and the window both call this.

use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;
use std::time::Instant;

use crate::audio::mel::log_mel_spectrogram;
use crate::audio::resample::to_16k;
use crate::audio::{decode_wav_file, SAMPLE_RATE};
use crate::decode::tokenizer::WhisperTokenizer;
use crate::decode::draft::Speculative;
use crate::decode::whisper::{default_draft_layers, suppress_list, transcribe, DecodeOptions, Segment, SpecStats};
use crate::gpu::Gpu;
use crate::models::whisper::checkpoint::Checkpoint;
use crate::models::whisper::gpu::GpuWhisper;
use crate::quant::block::BlockFormat;
use crate::{Error, Result};

/// Zeros appended before the STFT, as faster-whisper's feature extractor does (one hop).
const MEL_PAD_SAMPLES: usize = 160;

/// Options of one transcription.
#[derive(Clone, Debug)]
pub struct Options {
    /// Decode with timestamp tokens (segments with times); false adds <|notimestamps|>.
    pub timestamps: bool,
    pub decode: DecodeOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options { timestamps: true, decode: DecodeOptions::default() }
    }
}

/// One named stage and how long it took (wall clock, GPU work included).
#[derive(Clone, Debug, serde::Serialize)]
pub struct Stage {
    pub name: &'static str,
    pub seconds: f64,
}

#[derive(Clone, Debug)]
pub struct Transcript {
    pub path: PathBuf,
    /// The whole text, segments joined.
    pub text: String,
    pub segments: Vec<Segment>,
    /// Seconds of audio.
    pub audio_seconds: f64,
    /// Generated tokens (timestamps included).
    pub tokens: usize,
    /// Sampling steps (one per chosen token, the final end-of-text included).
    pub decode_steps: usize,
    /// 30 s windows encoded.
    pub windows: usize,
    /// Stages in order: audio decode, resample, mel, encoder, prefill, decode steps, total.
    pub stages: Vec<Stage>,
    /// The draft source used and what speculative decoding did (zeros when off).
    pub speculative: Speculative,
    pub spec: SpecStats,
}

impl Transcript {
    /// Seconds of the stage of this name (0 where there is none).
    pub fn stage_seconds(&self, name: &str) -> f64 {
        self.stages.iter().find(|s| s.name == name).map_or(0.0, |s| s.seconds)
    }
    pub fn total_seconds(&self) -> f64 {
        self.stage_seconds("total")
    }
    /// Processing time / audio time (below 1 is faster than real time).
    pub fn real_time_factor(&self) -> f64 {
        if self.audio_seconds > 0.0 { self.total_seconds() / self.audio_seconds } else { 0.0 }
    }
}

/// A file's audio decoded and resampled to 16 kHz mono: the host's part of a file, which
/// needs no model, so it can run ahead on a thread of its own (the CLI reads each file
/// while the GPU opens or transcribes the one before: 0.3-0.4 s of a 10-minute 44.1 kHz
/// stereo file on a 2-core machine like CI's, 2026-12-06).
pub struct FileAudio {
    pub path: PathBuf,
    /// Mono, 16 kHz.
    pub samples: Vec<f32>,
    /// The audio's length as the file gives it.
    pub seconds: f64,
    decode: Duration,
    resample: Duration,
}

impl FileAudio {
    pub fn read(path: &Path) -> Result<FileAudio> {
        let t0 = Instant::now();
        let audio = decode_wav_file(path)?;
        let decode = t0.elapsed();
        let t1 = Instant::now();
        let samples = to_16k(&audio.to_mono(), audio.sample_rate)?;
        Ok(FileAudio { path: path.to_path_buf(), samples, seconds: audio.duration_seconds(), decode, resample: t1.elapsed() })
    }
}

/// A loaded model ready to transcribe files, on its own device or a borrowed one.
pub struct Transcriber {
    pub model_dir: PathBuf,
    /// How long opening the device took (`open_with`; zero for a device passed in).
    pub gpu_open_time: Duration,
    /// How long loading took besides opening the device (weights read, uploaded, pipelines
    /// compiled).
    pub load_time: Duration,
    model: GpuWhisper,
    tokenizer: WhisperTokenizer,
    suppress: Vec<u32>,
}

impl Transcriber {
    /// Load a CTranslate2 Whisper model directory onto `gpu`.
    pub fn load(gpu: Arc<Gpu>, model_dir: &Path) -> Result<Self> {
        Self::load_with(gpu, model_dir, None)
    }

    /// [`Transcriber::load`] with the decoder's weights quantized to `quant` (`--quant`).
    pub fn load_with(gpu: Arc<Gpu>, model_dir: &Path, quant: Option<BlockFormat>) -> Result<Self> {
        Self::open_with(|| Ok(gpu), model_dir, quant)
    }

    /// [`Transcriber::load_with`] on the device `open_gpu` opens, while the tokenizer is
    /// parsed: opening a Vulkan device took ~125 ms on the lent H100s and the tokenizer's
    /// parse ~60 (2026-12-06, eighteenth session), and the parse used to wait for both the
    /// device and the weights. The model directory is checked first, so a broken one fails
    /// before any device opens. `gpu_open_time` says how long `open_gpu` took; `load_time`
    /// what the load added after it.
    pub fn open_with(open_gpu: impl FnOnce() -> Result<Arc<Gpu>>, model_dir: &Path, quant: Option<BlockFormat>) -> Result<Self> {
        let t = Instant::now();
        let ck = Checkpoint::open(model_dir)?;
        let ck = &ck;
        let (model, tokenizer, gpu_open_time) = std::thread::scope(|s| {
            let tokenizer = s.spawn(move || WhisperTokenizer::from_file(&ck.tokenizer_path(), ck.dims.vocab as u32));
            // The spectrogram's worker pool (where it takes one) started here, not at the
            // first file.
            if crate::audio::mel::mel_pool() {
                s.spawn(|| crate::threads::pool().is_some());
            }
            let opened = Instant::now();
            let gpu = open_gpu()?;
            let gpu_open_time = opened.elapsed();
            // The special ids are checked against the model once both are there.
            let (model, tokenizer) = GpuWhisper::load_beside(gpu, ck, quant, move || {
                let tokenizer: WhisperTokenizer =
                    tokenizer.join().map_err(|_| Error::Gpu("the tokenizer's thread panicked".into()))??;
                let sp = tokenizer.special();
                let (eot, ts) = (sp.eot, sp.timestamp_begin);
                Ok((tokenizer, eot, ts))
            })?;
            Ok::<_, Error>((model, tokenizer, gpu_open_time))
        })?;
        let sp = tokenizer.special().clone();
        let suppress = suppress_list(&ck.config.suppress_ids, &sp);
        Ok(Transcriber {
            model_dir: model_dir.to_path_buf(),
            gpu_open_time,
            load_time: t.elapsed().saturating_sub(gpu_open_time),
            model,
            tokenizer,
            suppress,
        })
    }

    /// The model's tokenizer (to encode a prompt, e.g. the live mode's committed text).
    pub fn tokenizer(&self) -> &WhisperTokenizer {
        &self.tokenizer
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        self.model.gpu()
    }

    /// Per-kernel records of everything run so far (GPU times when profiling).
    pub fn profile(&self) -> &crate::gpu::Profile {
        &self.model.profile
    }

    pub fn reset_profile(&mut self) {
        self.model.profile.clear();
    }

    /// Most positions a speculative verify pass takes.
    pub fn verify_max(&self) -> usize {
        crate::decode::LogitSource::max_verify(&self.model)
    }

    /// Cap verify passes at `n` positions (see `GpuWhisper::set_verify_max`).
    pub fn set_verify_max(&mut self, n: usize) -> Result<()> {
        self.model.set_verify_max(n)
    }

    /// Whether a step encoded ahead is moved back after a rollback (`GpuWhisper::retarget`).
    pub fn retarget(&self) -> bool {
        self.model.retarget
    }

    pub fn set_retarget(&mut self, on: bool) {
        self.model.retarget = on;
    }

    /// Whether verify passes and steps are replayed where the device allows it (`GpuWhisper::replay`).
    pub fn replay(&self) -> bool {
        self.model.replay
    }

    pub fn set_replay(&mut self, on: bool) {
        self.model.replay = on;
    }

    /// The decoder's weight format (None: f16).
    pub fn quant(&self) -> Option<BlockFormat> {
        self.model.quant()
    }

    /// Make sure the draft model that `opts` asks for is built (`self-q8`/`self-q4`): it
    /// is quantized from this model's checkpoint on first use and kept while the same
    /// format and depth are asked for.
    pub fn prepare_draft(&mut self, opts: &DecodeOptions) -> Result<()> {
        let Some(format) = opts.speculative.draft_format() else {
            return Ok(());
        };
        let layers = match opts.draft_layers {
            0 => default_draft_layers(self.model.dims.decoder_layers),
            n => n,
        };
        if self.model.draft_config() == Some((format, layers)) {
            return Ok(());
        }
        let ck = Checkpoint::open(&self.model_dir)?;
        self.model.set_draft(&ck, format, layers)
    }

    /// Transcribe one audio file.
    pub fn transcribe_file(&mut self, path: &Path, opts: &Options) -> Result<Transcript> {
        self.transcribe_file_with_progress(path, opts, &mut |_| {})
    }

    /// Transcribe one audio file; `progress(fraction of the audio done)` after each window.
    pub fn transcribe_file_with_progress(
        &mut self,
        path: &Path,
        opts: &Options,
        progress: &mut dyn FnMut(f32),
    ) -> Result<Transcript> {
        let audio = FileAudio::read(path)?;
        self.transcribe_audio(audio, opts, progress)
    }

    /// Transcribe a file whose audio was read already ([`FileAudio::read`], perhaps on
    /// another thread while the file before it was transcribed).
    pub fn transcribe_audio(&mut self, audio: FileAudio, opts: &Options, progress: &mut dyn FnMut(f32)) -> Result<Transcript> {
        let t0 = Instant::now();
        let mut out = self.transcribe_samples(&audio.samples, opts, progress)?;
        out.path = audio.path;
        out.audio_seconds = audio.seconds;
        out.stages.insert(0, Stage { name: "audio decode", seconds: audio.decode.as_secs_f64() });
        out.stages.insert(1, Stage { name: "resample", seconds: audio.resample.as_secs_f64() });
        if let Some(total) = out.stages.iter_mut().find(|s| s.name == "total") {
            // The file's own work, wherever its audio was read.
            total.seconds = (audio.decode + audio.resample + t0.elapsed()).as_secs_f64();
        }
        Ok(out)
    }

    /// Transcribe 16 kHz mono samples (the live path and the file path both end here).
    pub fn transcribe_samples(
        &mut self,
        samples: &[f32],
        opts: &Options,
        progress: &mut dyn FnMut(f32),
    ) -> Result<Transcript> {
        if samples.is_empty() {
            return Err(Error::AudioData("there are no samples to transcribe".into()));
        }
        let t0 = Instant::now();
        let mel = log_mel_spectrogram(samples, self.model.dims.n_mels, MEL_PAD_SAMPLES);
        let t_mel = t0.elapsed();
        let mut dopts = opts.decode.clone();
        dopts.timestamps = opts.timestamps;
        self.prepare_draft(&dopts)?;
        let (segments, stats) = transcribe(&mut self.model, &mel, &self.tokenizer, &self.suppress, &dopts, progress)?;
        let text = segments.iter().map(|s| s.text.as_str()).collect::<String>().trim().to_string();
        let stages = vec![
            Stage { name: "mel", seconds: t_mel.as_secs_f64() },
            // The decoding loop times the prompt pass(es) and the one-token steps itself: a
            // one-token prompt (<|startoftranscript|>) is still the prefill.
            Stage { name: "encoder", seconds: stats.encode_time.as_secs_f64() },
            Stage { name: "prefill", seconds: stats.prefill_time.as_secs_f64() },
            Stage { name: "decode steps", seconds: stats.decode_time.as_secs_f64() },
            Stage { name: "total", seconds: t0.elapsed().as_secs_f64() },
        ];
        Ok(Transcript {
            path: PathBuf::new(),
            text,
            segments,
            audio_seconds: samples.len() as f64 / SAMPLE_RATE as f64,
            tokens: stats.tokens,
            decode_steps: stats.steps,
            windows: stats.windows,
            stages,
            speculative: dopts.speculative,
            spec: stats.spec,
        })
    }
}
