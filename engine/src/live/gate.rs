//! The energy voice gate and the input level meter.
//!
//! Why a gate at all: Whisper given silence or room noise readily "hears" something
//! ("Thank you.", "you"), and every decode costs GPU time the window shares. So the live
//! session decodes only a window that holds voiced frames, and silence produces no text.
//!
//! How: RMS level per 30 ms frame (480 samples at 16 kHz) in dBFS. A frame is loud when
//! it is above both an absolute floor (`min_dbfs`: quieter is silence however quiet the
//! room) and the room's noise level plus a margin. The noise level is a low percentile of
//! the last few seconds of frame levels: speech has gaps between words, so the 10th
//! percentile of 3 s sits on the background even while someone talks, and it follows a
//! fan switching on within seconds. Voiced starts after `onset_frames` loud frames in a row
//! (a click is not speech) and lasts `hangover_frames` after the last loud frame (the quiet
//! end of a word is still speech).

use std::collections::VecDeque;

/// Samples per gate frame: 30 ms at 16 kHz.
pub const FRAME: usize = 480;

/// Level below which a frame counts as digital silence (log of zero is -inf).
const FLOOR_DBFS: f32 = -100.0;

#[derive(Clone, Debug, PartialEq)]
pub struct GateOptions {
    /// A frame quieter than this (RMS, dBFS) is never voiced.
    pub min_dbfs: f32,
    /// A voiced frame is this many dB above the noise level.
    pub margin_db: f32,
    /// Frames of history the noise level is estimated over (100 = 3 s).
    pub noise_frames: usize,
    /// The percentile of that history taken as the noise level (0..1).
    pub noise_percentile: f32,
    /// Loud frames in a row before voiced starts.
    pub onset_frames: usize,
    /// Frames voiced lasts after the last loud one.
    pub hangover_frames: usize,
}

impl Default for GateOptions {
    fn default() -> Self {
        // Measured on assets/jfk.wav: background -45..-37 dBFS, speech -30..-8 dBFS.
        GateOptions {
            min_dbfs: -50.0,
            margin_db: 10.0,
            noise_frames: 100,
            noise_percentile: 0.1,
            onset_frames: 2,
            hangover_frames: 10,
        }
    }
}

/// The gate: feed it 16 kHz audio, get one voiced flag per completed 30 ms frame.
#[derive(Clone, Debug)]
pub struct VoiceGate {
    opts: GateOptions,
    /// Samples of the frame being filled.
    partial: Vec<f32>,
    /// Recent frame levels (dBFS) for the noise estimate.
    history: VecDeque<f32>,
    scratch: Vec<f32>,
    loud_run: usize,
    hang: usize,
    voiced: bool,
    /// Noise level of the last frame (for display and tests).
    noise_dbfs: f32,
}

impl VoiceGate {
    pub fn new(opts: GateOptions) -> Self {
        VoiceGate {
            partial: Vec::with_capacity(FRAME),
            history: VecDeque::with_capacity(opts.noise_frames + 1),
            scratch: Vec::new(),
            loud_run: 0,
            hang: 0,
            voiced: false,
            noise_dbfs: FLOOR_DBFS,
            opts,
        }
    }

    /// Take `samples`; append a flag for each frame completed to `flags`.
    pub fn push(&mut self, samples: &[f32], flags: &mut Vec<bool>) {
        let mut rest = samples;
        while !rest.is_empty() {
            let take = rest.len().min(FRAME - self.partial.len());
            self.partial.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.partial.len() == FRAME {
                let db = rms_dbfs(&self.partial);
                self.partial.clear();
                flags.push(self.frame(db));
            }
        }
    }

    /// Whether the last completed frame was voiced.
    pub fn is_voiced(&self) -> bool {
        self.voiced
    }

    /// The current noise-level estimate (dBFS).
    pub fn noise_dbfs(&self) -> f32 {
        self.noise_dbfs
    }

    fn frame(&mut self, db: f32) -> bool {
        let db = db.max(FLOOR_DBFS);
        self.history.push_back(db);
        while self.history.len() > self.opts.noise_frames.max(1) {
            self.history.pop_front();
        }
        self.scratch.clear();
        self.scratch.extend(self.history.iter().copied());
        let k = ((self.scratch.len() - 1) as f32 * self.opts.noise_percentile.clamp(0.0, 1.0)) as usize;
        let (_, noise, _) = self.scratch.select_nth_unstable_by(k, |a, b| a.total_cmp(b));
        self.noise_dbfs = *noise;
        let loud = db > self.opts.min_dbfs && db > self.noise_dbfs + self.opts.margin_db;
        if loud {
            self.loud_run += 1;
            if self.loud_run >= self.opts.onset_frames.max(1) {
                self.voiced = true;
                self.hang = self.opts.hangover_frames;
            }
        } else {
            self.loud_run = 0;
            if self.hang > 0 {
                self.hang -= 1;
            } else {
                self.voiced = false;
            }
        }
        self.voiced
    }
}

/// RMS of `x` in dBFS (a full-scale square wave is 0 dB); -inf for silence or no samples.
pub fn rms_dbfs(x: &[f32]) -> f32 {
    if x.is_empty() {
        return f32::NEG_INFINITY;
    }
    let ms = x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / x.len() as f64;
    (10.0 * ms.log10()) as f32
}

/// Input level for a meter: RMS and peak in dBFS over some stretch of audio
/// (-inf when there was no signal).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Level {
    pub rms_dbfs: f32,
    pub peak_dbfs: f32,
}

impl Default for Level {
    fn default() -> Self {
        Level { rms_dbfs: f32::NEG_INFINITY, peak_dbfs: f32::NEG_INFINITY }
    }
}

/// Accumulates a [`Level`] over the samples given since the last `take`.
#[derive(Clone, Debug, Default)]
pub struct LevelMeter {
    sum_sq: f64,
    n: u64,
    peak: f32,
    last: Level,
}

impl LevelMeter {
    pub fn add(&mut self, x: &[f32]) {
        for &v in x {
            self.sum_sq += (v as f64) * (v as f64);
            self.peak = self.peak.max(v.abs());
        }
        self.n += x.len() as u64;
    }

    /// The level since the last call; with no new samples, the previous level again (a
    /// meter should not flicker to -inf between two deliveries of a device).
    pub fn take(&mut self) -> Level {
        if self.n > 0 {
            self.last = Level {
                rms_dbfs: (10.0 * (self.sum_sq / self.n as f64).log10()) as f32,
                peak_dbfs: 20.0 * self.peak.log10(),
            };
            *self = LevelMeter { last: self.last, ..Default::default() };
        }
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tone(n: usize, amp: f32) -> Vec<f32> {
        (0..n).map(|i| amp * (i as f32 * 0.07).sin()).collect()
    }

    /// Uniform pseudo-noise of RMS `amp / sqrt(3)`.
    fn noise(n: usize, amp: f32, seed: u32) -> Vec<f32> {
        let mut x = seed;
        (0..n)
            .map(|_| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                amp * (2.0 * ((x >> 8) as f32 / (1u32 << 24) as f32) - 1.0)
            })
            .collect()
    }

    fn flags(gate: &mut VoiceGate, x: &[f32]) -> Vec<bool> {
        let mut f = Vec::new();
        gate.push(x, &mut f);
        f
    }

    #[test]
    fn live_gate_silence_and_faint_noise_are_not_voiced() {
        let mut g = VoiceGate::new(GateOptions::default());
        let f = flags(&mut g, &vec![0.0; 16_000 * 5]);
        assert_eq!(f.len(), 16_000 * 5 / FRAME);
        assert!(f.iter().all(|v| !v));
        // -60 dBFS of hiss: under the absolute floor.
        let f = flags(&mut g, &noise(16_000 * 5, 0.0017, 7));
        assert!(f.iter().all(|v| !v));
    }

    #[test]
    fn live_gate_steady_room_noise_is_not_voiced_but_speech_over_it_is() {
        let mut g = VoiceGate::new(GateOptions::default());
        // -35 dBFS of steady noise (above the absolute floor): the noise estimate takes it.
        let n = noise(16_000 * 4, 0.03, 3);
        let f = flags(&mut g, &n);
        // The first frames may pass while the estimate settles; after 1 s none may.
        assert!(f[33..].iter().all(|v| !v), "{:?}", &f[33..]);
        assert!((g.noise_dbfs() - rms_dbfs(&n)).abs() < 1.5, "noise estimate {}", g.noise_dbfs());
        // A 0.6 s "word" at -15 dBFS over the noise, then 1 s of noise again.
        let mut word = tone(9_600, 0.25);
        for (w, v) in word.iter_mut().zip(noise(9_600, 0.03, 4)) {
            *w += v;
        }
        let f = flags(&mut g, &word);
        assert!(f.iter().filter(|v| **v).count() >= f.len() - 2, "{f:?}");
        let f = flags(&mut g, &noise(16_000, 0.03, 5));
        // Voiced lasts the hangover after the word, then stops.
        let hang = GateOptions::default().hangover_frames;
        assert!(f[..hang].iter().all(|v| *v), "{f:?}");
        assert!(f[hang + 1..].iter().all(|v| !v), "{f:?}");
    }

    #[test]
    fn live_gate_a_click_is_not_speech() {
        let mut g = VoiceGate::new(GateOptions::default());
        let mut x = vec![0.0; 16_000];
        for v in &mut x[16 * FRAME..17 * FRAME] {
            *v = 0.5; // one loud frame, aligned to the frame grid
        }
        assert!(flags(&mut g, &x).iter().all(|v| !v));
    }

    #[test]
    fn live_level_meter_reports_rms_and_peak() {
        let mut m = LevelMeter::default();
        assert_eq!(m.take().rms_dbfs, f32::NEG_INFINITY);
        m.add(&[0.5, -0.5, 0.5, -0.5]);
        let l = m.take();
        assert!((l.rms_dbfs - -6.0206).abs() < 1e-3 && (l.peak_dbfs - -6.0206).abs() < 1e-3, "{l:?}");
        // Nothing new: the last level stays.
        assert_eq!(m.take(), l);
        m.add(&[0.0, 0.1]);
        let l = m.take();
        assert!((l.peak_dbfs - -20.0).abs() < 1e-3 && (l.rms_dbfs - -23.0103).abs() < 1e-3, "{l:?}");
    }
}
