//! Streaming sample-rate conversion to 16 kHz: the batch resampler of
//! [`crate::audio::resample`] cut into pieces as audio arrives.
//!
//! Why the same algorithm and not an asynchronous resampler: a live session fed from a
//! file must hear exactly what the file path hears, so the transcripts can be compared
//! word for word. This resampler runs rubato's `FftFixedInOut` on the same chunks the batch
//! function would (chunk `k` is input samples `[k·chunk_in, (k+1)·chunk_in)`, counted from
//! the start of the stream), drops the same `chunk_out / 2` samples of filter delay and,
//! on [`StreamResampler::finish`], pads with the same zeros and cuts to the same
//! `round(n · 16000 / rate)` samples. Output pieces joined are therefore bit-identical to
//! `resample(whole input)`; the unit tests check it.
//!
//! The cost is latency: a sample comes out only once its whole chunk is in (≈ 43 ms of
//! input at 48 kHz) plus the filter's half-chunk delay — small against a 0.5 s live step.

use rubato::{FftFixedInOut, Resampler};

use crate::audio::resample::{MAX_RATE, MIN_RATE};
use crate::audio::SAMPLE_RATE;
use crate::{Error, Result};

/// Input samples per FFT chunk we aim for: the same as the batch resampler (a sharp
/// anti-aliasing filter at little cost), so both produce the same samples.
const TARGET_CHUNK_IN: usize = 2048;

/// Converts a mono stream at `from_rate` to 16 kHz, piece by piece.
pub struct StreamResampler {
    from_rate: u32,
    /// None at 16 kHz already: samples pass through unchanged.
    fft: Option<Fft>,
    /// Input samples taken so far (for the final length).
    taken: u64,
    /// Output samples handed out so far.
    given: u64,
    finished: bool,
}

struct Fft {
    rs: FftFixedInOut<f32>,
    chunk_in: usize,
    chunk_out: usize,
    /// Input of the chunk being filled.
    pending: Vec<f32>,
    out_buf: Vec<f32>,
    /// Delay samples still to drop from the front of the output.
    skip: usize,
}

impl StreamResampler {
    /// A resampler from `from_rate` Hz; a rate outside the range the batch resampler
    /// accepts is an error (a device reporting 0 Hz, say).
    pub fn new(from_rate: u32) -> Result<Self> {
        if !(MIN_RATE..=MAX_RATE).contains(&from_rate) {
            return Err(Error::AudioData(format!(
                "a sample rate of {from_rate} Hz is outside the range this program can resample ({MIN_RATE} to {MAX_RATE} Hz)"
            )));
        }
        let fft = if from_rate == SAMPLE_RATE {
            None
        } else {
            // The batch resampler's chunk choice (see audio/resample.rs): an even number of
            // whole-ratio units, so both FFT sizes are even and the delay is exact.
            let (from, to) = (from_rate as u64, SAMPLE_RATE as u64);
            let g = gcd(from, to);
            let unit_in = (from / g) as usize;
            let mut units = TARGET_CHUNK_IN.div_ceil(unit_in).max(1);
            units += units % 2;
            let rs = FftFixedInOut::<f32>::new(from_rate as usize, SAMPLE_RATE as usize, units * unit_in, 1)
                .map_err(|e| fail(from_rate, &e))?;
            let (chunk_in, chunk_out) = (rs.input_frames_next(), rs.output_frames_next());
            if chunk_in != units * unit_in || chunk_out % 2 != 0 {
                return Err(fail(from_rate, &format!("unexpected chunk sizes {chunk_in} -> {chunk_out}")));
            }
            Some(Fft {
                rs,
                chunk_in,
                chunk_out,
                pending: Vec::with_capacity(chunk_in),
                out_buf: vec![0.0; chunk_out],
                skip: chunk_out / 2,
            })
        };
        Ok(StreamResampler { from_rate, fft, taken: 0, given: 0, finished: false })
    }

    pub fn from_rate(&self) -> u32 {
        self.from_rate
    }

    /// Take `input` and append to `out` every 16 kHz sample that is now complete.
    /// A sample that is not a finite number is an error (a broken driver or file), as in
    /// the batch path.
    pub fn process(&mut self, input: &[f32], out: &mut Vec<f32>) -> Result<()> {
        if self.finished {
            return Err(Error::Invalid("audio was given to a resampler after its end".into()));
        }
        if let Some(i) = input.iter().position(|s| !s.is_finite()) {
            return Err(Error::AudioData(format!(
                "sample {} of the incoming audio is not a finite number",
                self.taken + i as u64
            )));
        }
        self.taken += input.len() as u64;
        let Some(f) = self.fft.as_mut() else {
            out.extend_from_slice(input);
            self.given += input.len() as u64;
            return Ok(());
        };
        let mut rest = input;
        while !rest.is_empty() {
            let take = rest.len().min(f.chunk_in - f.pending.len());
            f.pending.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if f.pending.len() == f.chunk_in {
                self.given += f.run(out, usize::MAX, self.from_rate)? as u64;
            }
        }
        Ok(())
    }

    /// The stream ended: pad with silence (as the batch resampler treats the signal
    /// outside the input) and append the remaining samples, so that the total is
    /// `round(samples in · 16000 / rate)`.
    pub fn finish(&mut self, out: &mut Vec<f32>) -> Result<()> {
        if self.finished {
            return Ok(());
        }
        self.finished = true;
        let (from, to) = (self.from_rate as u64, SAMPLE_RATE as u64);
        let total = (self.taken * to + from / 2) / from;
        let Some(f) = self.fft.as_mut() else { return Ok(()) };
        while self.given < total {
            f.pending.resize(f.chunk_in, 0.0);
            let want = (total - self.given) as usize;
            self.given += f.run(out, want, self.from_rate)? as u64;
        }
        Ok(())
    }
}

impl Fft {
    /// Resample the full pending chunk; append at most `limit` samples past the delay.
    fn run(&mut self, out: &mut Vec<f32>, limit: usize, rate: u32) -> Result<usize> {
        self.rs
            .process_into_buffer(&[&self.pending[..]], &mut [&mut self.out_buf[..]], None)
            .map_err(|e| fail(rate, &e))?;
        self.pending.clear();
        let skip = self.skip.min(self.chunk_out);
        self.skip -= skip;
        let keep = (self.chunk_out - skip).min(limit);
        out.extend_from_slice(&self.out_buf[skip..skip + keep]);
        Ok(keep)
    }
}

fn fail(rate: u32, e: &dyn std::fmt::Display) -> Error {
    Error::AudioData(format!("resampling from {rate} Hz to {SAMPLE_RATE} Hz failed: {e}"))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audio::resample::to_16k;

    /// Deterministic "speech-like" input: a few sines and a little pseudo-noise.
    fn signal(n: usize, rate: u32) -> Vec<f32> {
        let mut x = 12345u32;
        (0..n)
            .map(|i| {
                x = x.wrapping_mul(1664525).wrapping_add(1013904223);
                let t = i as f32 / rate as f32;
                0.3 * (2.0 * std::f32::consts::PI * 220.0 * t).sin()
                    + 0.2 * (2.0 * std::f32::consts::PI * 1800.0 * t).sin()
                    + 0.05 * ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5)
            })
            .collect()
    }

    #[test]
    fn live_resample_pieces_equal_the_batch_resampler() {
        for &rate in &[8_000u32, 11_025, 16_000, 22_050, 44_100, 48_000, 96_000] {
            for &n in &[0usize, 1, 7, 2051, 2052, 2053, 30_001] {
                let x = signal(n, rate);
                let want = to_16k(&x, rate).unwrap();
                // Pieces of awkward, varying sizes (as a device delivers them), empty included.
                let mut rs = StreamResampler::new(rate).unwrap();
                let mut got = Vec::new();
                let (mut pos, mut k) = (0usize, 0usize);
                while pos < n {
                    let len = [0usize, 1, 17, 441, 480, 1024, 4099][k % 7].min(n - pos);
                    rs.process(&x[pos..pos + len], &mut got).unwrap();
                    pos += len;
                    k += 1;
                    // Never more out than the final length (nothing to take back later).
                    assert!(got.len() <= want.len(), "{rate} Hz: {} > {}", got.len(), want.len());
                }
                rs.finish(&mut got).unwrap();
                assert_eq!(got.len(), want.len(), "{rate} Hz, {n} samples: length");
                assert!(got == want, "{rate} Hz, {n} samples: the streamed samples differ from the batch ones");
            }
        }
    }

    #[test]
    fn live_resample_output_keeps_up_with_input() {
        // After each piece, everything but the last chunk and the filter delay is out: a
        // mic at 48 kHz is never more than ~0.1 s behind.
        let mut rs = StreamResampler::new(48_000).unwrap();
        let mut out = Vec::new();
        let x = signal(48_000, 48_000);
        for piece in x.chunks(480) {
            rs.process(piece, &mut out).unwrap();
        }
        let behind = 16_000 - out.len();
        assert!(behind < 1_600, "{behind} samples behind after 1 s");
    }

    #[test]
    fn live_resample_bad_input_is_an_error() {
        assert!(matches!(StreamResampler::new(0), Err(Error::AudioData(_))));
        assert!(matches!(StreamResampler::new(MAX_RATE + 1), Err(Error::AudioData(_))));
        let mut rs = StreamResampler::new(44_100).unwrap();
        let mut out = Vec::new();
        let err = rs.process(&[0.0, f32::NAN], &mut out).unwrap_err();
        assert!(err.to_string().contains("not a finite number"), "{err}");
        rs.finish(&mut out).unwrap();
        assert!(rs.process(&[0.0], &mut out).is_err(), "audio after the end is refused");
    }
}
