//! The LocalAgreement-2 session of whisper_streaming (Macháček et al., 2023), on 16 kHz
//! audio: a buffer of up to 30 s re-decoded every step, words committed once two consecutive
//! hypotheses agree on them, committed audio trimmed at a segment boundary.
//!
//! Differences from whisper_streaming, and why:
//! - The new part of a hypothesis is found by aligning the committed words still in the
//!   buffer to its start (see `agreement`), since our decoder gives segment times, not word
//!   times.
//! - The voice gate decides whether a step is worth a decode: none while the buffer holds
//!   no voiced frame, none when nothing voiced arrived and nothing is tentative.
//! - After a pause (everything committed, `silence_reset_seconds` of unvoiced audio) the
//!   buffer is emptied down to a short lead-in, as whisper_streaming's voice-activity
//!   controller does, so silence neither grows the buffer nor is decoded.
//! - A hard limit (`max_buffer_seconds`) commits the current hypothesis and cuts, so the
//!   decoder is never asked for more than one 30 s window even when no segment boundary
//!   can be committed (one endless sentence, or speech Whisper will not transcribe).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::agreement::{align_committed, common_prefix, words_of, TimedText, Word};
use super::gate::{Level, VoiceGate, FRAME};
use super::{LiveOptions, LiveUpdate, Recognizer, Request};
use crate::audio::SAMPLE_RATE;
use crate::decode::CancelFlag;
use crate::Result;

const RATE: f64 = SAMPLE_RATE as f64;

/// Audio kept before speech after a pause: the gate's onset lags the first syllable.
const LEAD_IN_SECONDS: f64 = 0.5;

/// What one decode step did.
#[derive(Clone, Debug, Default)]
pub struct StepReport {
    /// Words committed by this step.
    pub newly: Vec<Word>,
    /// See [`LiveUpdate::latency`].
    pub latency: Option<Duration>,
    pub decode_time: Duration,
}

/// The state of a live transcription: feed it audio, let it decode when it wants to.
pub struct LiveSession {
    opts: LiveOptions,
    gate: VoiceGate,
    flags: Vec<bool>,
    /// 16 kHz audio from stream sample `buffer_start` on.
    buffer: Vec<f32>,
    buffer_start: u64,
    /// Stream samples received so far.
    received: u64,
    /// Stream sample up to which the last hypothesis heard the audio.
    decoded_to: u64,
    /// Voiced flag of gate frame `frames_start + i` (frame f covers samples 480f..480f+480).
    frames: VecDeque<bool>,
    frames_start: u64,
    /// End (stream sample) of the last voiced frame.
    last_voiced_end: Option<u64>,
    /// (stream samples received in total, when): when each piece of audio arrived.
    arrivals: VecDeque<(u64, Instant)>,
    committed: Vec<Word>,
    committed_text: String,
    /// `committed[in_buffer..]` are the committed words whose audio is still in the buffer;
    /// the ones before it are the prompt.
    in_buffer: usize,
    /// The uncommitted tail of the last hypothesis.
    tentative: Vec<Word>,
    decodes: usize,
    trims: usize,
    longest_decode_seconds: f64,
}

impl LiveSession {
    pub fn new(opts: LiveOptions) -> Self {
        LiveSession {
            gate: VoiceGate::new(opts.gate.clone()),
            opts,
            flags: Vec::new(),
            buffer: Vec::new(),
            buffer_start: 0,
            received: 0,
            decoded_to: 0,
            frames: VecDeque::new(),
            frames_start: 0,
            last_voiced_end: None,
            arrivals: VecDeque::new(),
            committed: Vec::new(),
            committed_text: String::new(),
            in_buffer: 0,
            tentative: Vec::new(),
            decodes: 0,
            trims: 0,
            longest_decode_seconds: 0.0,
        }
    }

    /// Append 16 kHz audio that arrived at `arrived`.
    pub fn push_audio(&mut self, samples: &[f32], arrived: Instant) {
        if samples.is_empty() {
            return;
        }
        self.buffer.extend_from_slice(samples);
        self.received += samples.len() as u64;
        self.arrivals.push_back((self.received, arrived));
        self.flags.clear();
        self.gate.push(samples, &mut self.flags);
        for &f in &self.flags {
            self.frames.push_back(f);
            if f {
                self.last_voiced_end = Some((self.frames_start + self.frames.len() as u64) * FRAME as u64);
            }
        }
        self.reset_after_pause();
    }

    /// Whether a decode step is due: a step's worth of new audio, a voiced frame in the
    /// buffer, and something a new hypothesis could change (new voiced audio or a
    /// tentative tail).
    pub fn wants_decode(&self) -> bool {
        let new = self.received - self.decoded_to.max(self.buffer_start);
        new as f64 >= self.opts.step_seconds * RATE && self.worth_decoding()
    }

    fn worth_decoding(&self) -> bool {
        let from = self.decoded_to.max(self.buffer_start);
        self.received > from
            && self.voiced_in(self.buffer_start, self.received)
            && (!self.tentative.is_empty() || self.voiced_in(from, self.received))
    }

    /// Decode the buffer and commit what two consecutive hypotheses agree on (`last`:
    /// everything, the stream has ended). `cancel` stops the decode ([`crate::Error::Cancelled`]).
    pub fn step(&mut self, rec: &mut dyn Recognizer, cancel: &CancelFlag, last: bool) -> Result<StepReport> {
        let t0 = Instant::now();
        let offset = self.buffer_start as f64 / RATE;
        let buffer_seconds = self.buffer.len() as f64 / RATE;
        let prompt = self.prompt();
        let segments = rec.recognize(Request { samples: &self.buffer, offset_seconds: offset, prompt: &prompt, cancel })?;
        let decode_time = t0.elapsed();
        self.decodes += 1;
        self.longest_decode_seconds = self.longest_decode_seconds.max(buffer_seconds);
        self.decoded_to = self.buffer_start + self.buffer.len() as u64;

        // Times from the buffer's start to the stream's, kept inside the audio decoded.
        let segments: Vec<TimedText> = segments
            .into_iter()
            .map(|s| TimedText {
                start: offset + s.start.clamp(0.0, buffer_seconds),
                end: offset + s.end.clamp(0.0, buffer_seconds),
                text: s.text,
            })
            .collect();
        let (hyp, seg_of) = words_of(&segments);

        // Skip what repeats the committed words still in the buffer.
        let held = &self.committed[self.in_buffer..];
        let hint = held.last().map_or(0, |l| hyp.iter().filter(|w| 0.5 * (w.start + w.end) < l.end).count());
        let (k, map) = align_committed(held, &hyp, hint);
        let new = &hyp[k..];
        // LocalAgreement-2: the prefix this hypothesis shares with the last one's new part.
        let n = if last { new.len() } else { common_prefix(&self.tentative, new) };
        let newly = new[..n].to_vec();
        self.tentative = new[n..].to_vec();
        // Hypothesis word of each committed word in the buffer (None: not in it).
        let mut placed: Vec<Option<usize>> = map;
        placed.extend((k..k + n).map(Some));
        let latency = self.commit(&newly);

        self.trim_at_segment(&segments, &seg_of, k + n, &placed);
        if self.buffer.len() as f64 > self.opts.max_buffer_seconds * RATE {
            self.force_cut(&segments);
        }
        Ok(StepReport { newly, latency, decode_time })
    }

    /// Commit the tentative tail as it is (the end of a stream without a new decode).
    pub fn flush(&mut self) -> StepReport {
        let newly = std::mem::take(&mut self.tentative);
        let latency = self.commit(&newly);
        StepReport { newly, latency, decode_time: Duration::ZERO }
    }

    /// At the end of the stream: one last decode when audio arrived since the last one
    /// that could change the text, then everything in the hypothesis is committed.
    pub fn finish(&mut self, rec: &mut dyn Recognizer, cancel: &CancelFlag) -> Result<StepReport> {
        if self.worth_decoding() {
            self.step(rec, cancel, true)
        } else {
            Ok(self.flush())
        }
    }

    fn commit(&mut self, words: &[Word]) -> Option<Duration> {
        for w in words {
            if !self.committed_text.is_empty() {
                self.committed_text.push(' ');
            }
            self.committed_text.push_str(&w.text);
        }
        self.committed.extend_from_slice(words);
        // The latency of a commit: now minus when the audio at the (estimated) end of its
        // last word arrived.
        let end = words.last()?.end;
        let sample = ((end * RATE) as u64).min(self.received);
        let arrived = self.arrivals.iter().find(|(upto, _)| *upto >= sample).or(self.arrivals.back())?.1;
        Some(arrived.elapsed())
    }

    /// whisper_streaming's `chunk_completed_segment`: once the buffer is longer than
    /// `trim_after_seconds`, cut it at the end of the last segment whose words are all
    /// committed — never the hypothesis' last segment, whose end is still moving.
    /// `committed_upto`: hypothesis words before it are committed; `placed[i]`: the
    /// hypothesis word of `committed[in_buffer + i]`.
    fn trim_at_segment(&mut self, segments: &[TimedText], seg_of: &[usize], committed_upto: usize, placed: &[Option<usize>]) {
        if (self.buffer.len() as f64) <= self.opts.trim_after_seconds * RATE || segments.len() < 2 {
            return;
        }
        let cut = (0..segments.len() - 1).rev().find_map(|s| {
            let last_word = seg_of.iter().rposition(|&x| x == s)?;
            (last_word < committed_upto).then_some((s, last_word))
        });
        let Some((s, last_word)) = cut else { return };
        // The committed words up to that segment's last one leave the buffer (and become the
        // prompt); a word the hypothesis dropped goes with its neighbours before it.
        if let Some(p) = placed.iter().rposition(|h| matches!(h, Some(h) if *h <= last_word)) {
            self.in_buffer += p + 1;
        }
        self.cut((segments[s].end * RATE) as u64);
    }

    /// The buffer outgrew `max_buffer_seconds` without a committed segment boundary: commit
    /// the hypothesis and keep only what follows its last segment (at most a few seconds).
    fn force_cut(&mut self, segments: &[TimedText]) {
        let rest = std::mem::take(&mut self.tentative);
        self.commit(&rest);
        self.in_buffer = self.committed.len();
        let last_end = segments.last().map_or(0, |s| (s.end * RATE) as u64);
        let keep_from = self.decoded_to.saturating_sub((5.0 * RATE) as u64);
        self.cut(last_end.max(keep_from));
    }

    /// After a pause with nothing tentative and every voiced frame heard, the words in the
    /// buffer are all committed: empty it down to a short lead-in.
    fn reset_after_pause(&mut self) {
        if !self.tentative.is_empty() {
            return;
        }
        let voiced_end = self.last_voiced_end.unwrap_or(0);
        if self.decoded_to < voiced_end {
            return; // voiced audio not heard yet
        }
        let quiet_from = voiced_end.max(self.buffer_start);
        if (self.received - quiet_from) as f64 >= self.opts.silence_reset_seconds * RATE {
            self.in_buffer = self.committed.len();
            self.cut(self.received.saturating_sub((LEAD_IN_SECONDS * RATE) as u64));
        }
    }

    /// Drop the audio before stream sample `at`.
    fn cut(&mut self, at: u64) {
        let at = at.clamp(self.buffer_start, self.received);
        if at == self.buffer_start {
            return;
        }
        self.buffer.drain(..(at - self.buffer_start) as usize);
        self.buffer_start = at;
        while !self.frames.is_empty() && (self.frames_start + 1) * FRAME as u64 <= at {
            self.frames.pop_front();
            self.frames_start += 1;
        }
        while self.arrivals.len() > 1 && self.arrivals[0].0 <= at {
            self.arrivals.pop_front();
        }
        self.trims += 1;
    }

    fn voiced_in(&self, from: u64, to: u64) -> bool {
        if to <= from {
            return false;
        }
        let first = (from / FRAME as u64).max(self.frames_start);
        let last = to.div_ceil(FRAME as u64);
        (first..last).any(|f| self.frames.get((f - self.frames_start) as usize).copied().unwrap_or(false))
    }

    /// whisper_streaming's prompt: the committed words that have left the buffer, the last
    /// `prompt_chars` characters of them.
    fn prompt(&self) -> String {
        let before = &self.committed[..self.in_buffer];
        let (mut len, mut from) = (0usize, before.len());
        while from > 0 && len < self.opts.prompt_chars {
            from -= 1;
            len += before[from].text.len() + 1;
        }
        before[from..].iter().map(|w| w.text.as_str()).collect::<Vec<_>>().join(" ")
    }

    pub fn committed_text(&self) -> &str {
        &self.committed_text
    }

    pub fn tentative_text(&self) -> String {
        self.tentative.iter().map(|w| w.text.as_str()).collect::<Vec<_>>().join(" ")
    }

    pub fn received_seconds(&self) -> f64 {
        self.received as f64 / RATE
    }

    pub fn buffer_seconds(&self) -> f64 {
        self.buffer.len() as f64 / RATE
    }

    pub fn decodes(&self) -> usize {
        self.decodes
    }

    pub fn trims(&self) -> usize {
        self.trims
    }

    /// The longest buffer handed to the decoder, in seconds.
    pub fn longest_decode_seconds(&self) -> f64 {
        self.longest_decode_seconds
    }

    pub fn is_voiced(&self) -> bool {
        self.gate.is_voiced()
    }

    /// The state as an update for the window.
    pub fn update(&self, step: Option<&StepReport>, level: Level, elapsed: Duration, finished: bool) -> LiveUpdate {
        LiveUpdate {
            committed: self.committed_text.clone(),
            tentative: self.tentative_text(),
            newly_committed: step.map(|s| s.newly.iter().map(|w| w.text.as_str()).collect::<Vec<_>>().join(" ")).unwrap_or_default(),
            received_seconds: self.received_seconds(),
            buffer_seconds: self.buffer_seconds(),
            latency: step.and_then(|s| s.latency),
            decode_time: step.filter(|s| s.decode_time > Duration::ZERO).map(|s| s.decode_time),
            decodes: self.decodes,
            level,
            voiced: self.is_voiced(),
            elapsed,
            finished,
            // The recognizer's to fill in (run_live_with does).
            spec: Default::default(),
        }
    }
}
