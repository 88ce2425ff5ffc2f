//! Where live audio comes from: the microphone (in the app crate, through cpal) or a file
//! played at real-time pace, behind one trait so that the tests drive the very code path the
//! microphone uses.

use std::path::Path;
use std::time::Instant;

use crate::audio::decode_wav_file;
use crate::{Error, Result};

/// What a source says after a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceState {
    /// More audio may come.
    Running,
    /// No more audio will come (the end of a file); everything has been delivered.
    Ended,
}

/// Captured audio, pulled by the live driver.
///
/// `poll` must not block for long (the driver polls every few milliseconds and also checks
/// its stop switch): it appends whatever mono f32 samples (nominally in [-1, 1], at
/// [`AudioSource::sample_rate`]) have arrived since the last call — possibly none — and says
/// whether more will come. A device failure (a microphone unplugged) is an `Err`, never a
/// panic; the driver keeps what it transcribed so far.
pub trait AudioSource: Send {
    /// Samples per second of what `poll` delivers (constant for the life of the source).
    fn sample_rate(&self) -> u32;
    fn poll(&mut self, out: &mut Vec<f32>) -> Result<SourceState>;
}

/// A recording delivered as if it were being captured now: by the wall clock since the
/// first poll, `speed` seconds of audio per second (1 = real time).
pub struct FileSource {
    samples: Vec<f32>,
    rate: u32,
    speed: f64,
    pos: usize,
    start: Option<Instant>,
}

impl FileSource {
    /// A WAV file (any layout `decode_wav_file` reads), downmixed to mono, at its own rate,
    /// at real-time pace.
    pub fn open(path: &Path) -> Result<Self> {
        let audio = decode_wav_file(path)?;
        if audio.sample_rate == 0 || audio.channels == 0 {
            return Err(Error::audio(path, "it has no channels or a sample rate of 0 Hz"));
        }
        Ok(Self::from_samples(audio.to_mono(), audio.sample_rate))
    }

    /// Mono samples at `rate` Hz, at real-time pace.
    pub fn from_samples(samples: Vec<f32>, rate: u32) -> Self {
        FileSource { samples, rate, speed: 1.0, pos: 0, start: None }
    }

    /// Deliver `speed` seconds of audio per wall-clock second (tests; must be > 0).
    pub fn with_speed(mut self, speed: f64) -> Self {
        if speed.is_finite() && speed > 0.0 {
            self.speed = speed;
        }
        self
    }

    /// Seconds of audio in the whole recording.
    pub fn duration_seconds(&self) -> f64 {
        if self.rate == 0 { 0.0 } else { self.samples.len() as f64 / self.rate as f64 }
    }
}

impl AudioSource for FileSource {
    fn sample_rate(&self) -> u32 {
        self.rate
    }

    fn poll(&mut self, out: &mut Vec<f32>) -> Result<SourceState> {
        let start = *self.start.get_or_insert_with(Instant::now);
        let due = (start.elapsed().as_secs_f64() * self.speed * self.rate as f64) as usize;
        let end = due.min(self.samples.len());
        if end > self.pos {
            out.extend_from_slice(&self.samples[self.pos..end]);
            self.pos = end;
        }
        Ok(if self.pos == self.samples.len() { SourceState::Ended } else { SourceState::Running })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn live_file_source_delivers_at_its_pace_and_ends() {
        let mut s = FileSource::from_samples((0..8_000).map(|i| i as f32).collect(), 8_000).with_speed(4.0);
        let mut got = Vec::new();
        assert_eq!(s.poll(&mut got).unwrap(), SourceState::Running);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(s.poll(&mut got).unwrap(), SourceState::Running);
        // 0.1 s at 4x is 0.4 s of audio (3200 samples); allow for a slow scheduler.
        assert!(got.len() >= 3_200 && got.len() < 8_000, "{} samples after 0.1 s", got.len());
        let t = Instant::now();
        while s.poll(&mut got).unwrap() == SourceState::Running {
            assert!(t.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(5));
        }
        // Every sample once, in order.
        assert_eq!(got, (0..8_000).map(|i| i as f32).collect::<Vec<_>>());
        assert!((s.duration_seconds() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn live_file_source_missing_file_is_an_error() {
        assert!(FileSource::open(Path::new("/nonexistent/verbatim.wav")).is_err());
    }
}
