//! Live transcription: audio as it is captured -> 16 kHz -> voice gate -> a sliding window
//! re-decoded every step, text committed once two consecutive hypotheses agree on it
//! (whisper_streaming's LocalAgreement-2).
//!
//! The window's worker thread calls [`run_live`] with a loaded [`Transcriber`], an
//! [`AudioSource`] (the microphone, or a [`FileSource`] — the tests use the same path) and
//! a stop switch; it gets a [`LiveUpdate`] after every decode and every
//! [`LiveOptions::update_interval`] in between (the level meter), and the last one when the
//! run ends. Committed text only ever grows.
//!
//! Latency, as reported in [`LiveUpdate::latency`]: for the words a step commits, the wall
//! time from the arrival of the audio at the (estimated) end of the last of them to the
//! moment they are committed. "Arrival" is when the driver received that audio from the
//! source (a file source delivers it at its real-time position; a microphone a few ms after
//! capture). Word ends are estimated from segment timestamps (see `agreement`). While
//! someone talks, a word is committed by the second decode that hears it: latency ≈ one to
//! two steps plus a decode. At the end of a stream there is no waiting for agreement: one
//! decode of what is left, and all of it is committed.

pub mod agreement;
pub mod gate;
pub mod resample;
pub mod session;
pub mod source;

use std::time::{Duration, Instant};

pub use gate::{GateOptions, Level};
pub use session::LiveSession;
pub use source::{AudioSource, FileSource, SourceState};

use crate::decode::draft::Speculative;
use crate::decode::whisper::{DecodeOptions, SpecStats};
use crate::decode::CancelFlag;
use crate::pipeline::{Options, Transcriber};
use crate::{Error, Result};

/// How a live session behaves. The defaults suit a microphone and tiny.en.
#[derive(Clone, Debug)]
pub struct LiveOptions {
    /// New audio (seconds) between two decodes (whisper_streaming's min-chunk-size).
    pub step_seconds: f64,
    /// Past this many seconds of buffer, trim it at a committed segment boundary
    /// (whisper_streaming's buffer_trimming_sec).
    pub trim_after_seconds: f64,
    /// Never decode a longer buffer than this: commit the hypothesis and cut instead.
    /// Below 30 s so that a decode stays one Whisper window.
    pub max_buffer_seconds: f64,
    /// After this many seconds of unvoiced audio with everything committed, empty the buffer.
    pub silence_reset_seconds: f64,
    /// Characters of committed text given to the decoder as a prompt (whisper_streaming: 200).
    pub prompt_chars: usize,
    pub gate: GateOptions,
    /// Decoding options (timestamps are always on: trimming needs segment times).
    pub decode: DecodeOptions,
    /// How often an update is sent between decodes (for the level meter).
    pub update_interval: Duration,
}

impl Default for LiveOptions {
    fn default() -> Self {
        LiveOptions {
            step_seconds: 0.5,
            trim_after_seconds: 15.0,
            max_buffer_seconds: 25.0,
            silence_reset_seconds: 2.0,
            prompt_chars: 200,
            gate: GateOptions::default(),
            // Each decode drafts from the previous hypothesis of the same audio (verified in
            // batched passes: the text is the same as without, it only comes sooner; not on
            // a CPU adapter, where a verify pass costs a step per position).
            decode: DecodeOptions { speculative: Speculative::Ngram, ..DecodeOptions::default() },
            update_interval: Duration::from_millis(50),
        }
    }
}

/// The state of a live run, sent to the window.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LiveUpdate {
    /// All committed text (never changes once there; later updates only append).
    pub committed: String,
    /// The current hypothesis after the committed text: may still change.
    pub tentative: String,
    /// What this update committed (empty for most).
    pub newly_committed: String,
    /// Seconds of audio received so far.
    pub received_seconds: f64,
    /// Seconds of audio in the window being re-decoded.
    pub buffer_seconds: f64,
    /// For an update that committed words: see the module documentation.
    pub latency: Option<Duration>,
    /// For an update that follows a decode: how long it took.
    pub decode_time: Option<Duration>,
    /// Decodes so far.
    pub decodes: usize,
    /// Input level since the last update.
    pub level: Level,
    /// Whether the voice gate hears speech now.
    pub voiced: bool,
    /// Wall time since the run started.
    pub elapsed: Duration,
    /// The last update of the run.
    pub finished: bool,
    /// Speculative decoding so far (drafts from the previous hypothesis).
    pub spec: SpecStats,
}

/// A live run that ended in an error (a microphone unplugged, a device lost): the error,
/// and the last update, which already holds everything transcribed — the tentative tail
/// committed as it stood.
#[derive(Debug)]
pub struct LiveFailure {
    pub error: Error,
    pub last: LiveUpdate,
}

impl std::fmt::Display for LiveFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for LiveFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// One decode request of a live session.
pub struct Request<'a> {
    /// 16 kHz mono: the whole buffer.
    pub samples: &'a [f32],
    /// Where the buffer starts in the stream (a scripted recognizer needs it; Whisper not).
    pub offset_seconds: f64,
    /// Committed text before the buffer, to condition the decoder on.
    pub prompt: &'a str,
    /// Set: stop and return [`Error::Cancelled`].
    pub cancel: &'a CancelFlag,
}

/// A segment of a hypothesis: seconds from the start of the request's samples, and text.
#[derive(Clone, Debug, PartialEq)]
pub struct HypSegment {
    pub start: f64,
    pub end: f64,
    pub text: String,
}

/// Something that transcribes a buffer: Whisper on the GPU, or a script in the tests.
pub trait Recognizer {
    fn recognize(&mut self, req: Request<'_>) -> Result<Vec<HypSegment>>;
    /// What speculative decoding did over all requests so far.
    fn spec(&self) -> SpecStats {
        SpecStats::default()
    }
}

/// Whisper through the file path's own entry point (`transcribe_samples`): what
/// [`run_live`] decodes with (public for driving a [`LiveSession`] step by step).
pub struct Whisper<'a> {
    transcriber: &'a mut Transcriber,
    decode: DecodeOptions,
    /// The last hypothesis's tokens: the next decode's draft (the same audio and 0.5 s more).
    last_tokens: Vec<u32>,
    spec: SpecStats,
    /// Tokens decoded and seconds in the decode loops over all requests (a benchmark's
    /// ms per emitted token).
    tokens: usize,
    decode_seconds: f64,
}

impl<'a> Whisper<'a> {
    pub fn new(transcriber: &'a mut Transcriber, decode: DecodeOptions) -> Self {
        Whisper { transcriber, decode, last_tokens: Vec::new(), spec: SpecStats::default(), tokens: 0, decode_seconds: 0.0 }
    }

    /// Tokens emitted and seconds spent in the decode loops ("decode steps") over all
    /// requests so far.
    pub fn decoded(&self) -> (usize, f64) {
        (self.tokens, self.decode_seconds)
    }
}

impl Recognizer for Whisper<'_> {
    fn recognize(&mut self, req: Request<'_>) -> Result<Vec<HypSegment>> {
        let mut decode = self.decode.clone();
        decode.timestamps = true;
        decode.cancel = Some(req.cancel.clone());
        // faster-whisper encodes `" " + initial_prompt.strip()` (whisper_streaming passes the
        // committed text as initial_prompt).
        let prompt = req.prompt.trim();
        decode.initial_prompt =
            if prompt.is_empty() { Vec::new() } else { self.transcriber.tokenizer().encode_text(&format!(" {prompt}"))? };
        decode.draft_hint = std::mem::take(&mut self.last_tokens);
        if self.transcriber.gpu().info.is_cpu() {
            // On a CPU rasteriser a verify pass costs a step per position: drafts only lose.
            decode.speculative = Speculative::Off;
        }
        let opts = Options { timestamps: true, decode };
        let t = self.transcriber.transcribe_samples(req.samples, &opts, &mut |_| {})?;
        self.spec.add(&t.spec);
        self.tokens += t.tokens;
        self.decode_seconds += t.stage_seconds("decode steps");
        self.last_tokens = t.segments.iter().flat_map(|s| s.tokens.iter().copied()).collect();
        Ok(t.segments.into_iter().map(|s| HypSegment { start: s.start, end: s.end, text: s.text }).collect())
    }

    fn spec(&self) -> SpecStats {
        self.spec
    }
}

/// Transcribe `source` live with Whisper until it ends, `stop` is set, or it fails.
///
/// `on_update` gets every update, the final one (`finished`) included. On success the final
/// update is returned; on failure a [`LiveFailure`] with the error and the final update.
/// Setting `stop` cancels a decode in flight; what the last finished decode heard is
/// committed (audio after it is dropped). Blocks: call it on a worker thread.
pub fn run_live(
    transcriber: &mut Transcriber,
    source: &mut dyn AudioSource,
    opts: &LiveOptions,
    stop: &CancelFlag,
    on_update: &mut dyn FnMut(&LiveUpdate),
) -> Result<LiveUpdate, LiveFailure> {
    let mut whisper = Whisper::new(transcriber, opts.decode.clone());
    run_live_with(&mut whisper, source, opts, stop, on_update)
}

/// [`run_live`] with any recognizer.
pub fn run_live_with(
    rec: &mut dyn Recognizer,
    source: &mut dyn AudioSource,
    opts: &LiveOptions,
    stop: &CancelFlag,
    on_update: &mut dyn FnMut(&LiveUpdate),
) -> Result<LiveUpdate, LiveFailure> {
    let start = Instant::now();
    let mut session = LiveSession::new(opts.clone());
    let mut meter = gate::LevelMeter::default();
    let mut last_sent = Instant::now();
    let mut raw = Vec::new();
    let mut pcm = Vec::new();
    // How the loop ended: None = stopped or ended normally.
    let mut failure: Option<Error> = None;
    // The last report with words in it that no update has shown yet.
    let mut report: Option<session::StepReport> = None;

    let mut resampler = match resample::StreamResampler::new(source.sample_rate()) {
        Ok(r) => Some(r),
        Err(e) => {
            failure = Some(e);
            None
        }
    };

    while let Some(rs) = resampler.as_mut() {
        if stop.is_set() {
            break;
        }
        raw.clear();
        let state = match source.poll(&mut raw) {
            Ok(s) => s,
            Err(e) => {
                failure = Some(e);
                break;
            }
        };
        let now = Instant::now();
        meter.add(&raw);
        pcm.clear();
        let resampled = rs.process(&raw, &mut pcm).and_then(|()| match state {
            SourceState::Ended => rs.finish(&mut pcm),
            SourceState::Running => Ok(()),
        });
        if let Err(e) = resampled {
            failure = Some(e);
            break;
        }
        session.push_audio(&pcm, now);

        if state == SourceState::Ended {
            match session.finish(rec, stop) {
                Ok(r) => report = Some(r),
                Err(e) => failure = Some(e),
            }
            break;
        }
        if session.wants_decode() {
            match session.step(rec, stop, false) {
                Ok(r) => {
                    let u = LiveUpdate { spec: rec.spec(), ..session.update(Some(&r), meter.take(), start.elapsed(), false) };
                    on_update(&u);
                    last_sent = Instant::now();
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
            continue;
        }
        if last_sent.elapsed() >= opts.update_interval {
            on_update(&LiveUpdate { spec: rec.spec(), ..session.update(None, meter.take(), start.elapsed(), false) });
            last_sent = Instant::now();
        }
        if raw.is_empty() {
            // Nothing arrived: a device delivers every few ms, so a short nap costs no latency.
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    // Whatever ended the run, the tentative tail is committed as it stands: the user saw it,
    // and nothing already transcribed may be lost. (After a finished stream it is empty.)
    if matches!(failure, Some(Error::Cancelled)) && stop.is_set() {
        failure = None; // the user's Stop, not a fault
    }
    let flushed = session.flush();
    if !flushed.newly.is_empty() || report.is_none() {
        report = Some(merge(report, flushed));
    }
    let last = LiveUpdate { spec: rec.spec(), ..session.update(report.as_ref(), meter.take(), start.elapsed(), true) };
    on_update(&last);
    match failure {
        None => Ok(last),
        Some(error) => Err(LiveFailure { error, last }),
    }
}

/// Two reports of the run's end as one (the final decode's words, then the flushed ones).
fn merge(a: Option<session::StepReport>, b: session::StepReport) -> session::StepReport {
    match a {
        None => b,
        Some(mut a) => {
            a.newly.extend(b.newly);
            a.latency = b.latency.or(a.latency);
            a
        }
    }
}

#[cfg(test)]
mod tests;
