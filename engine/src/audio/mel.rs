//! Whisper's log-mel spectrogram, computed exactly as faster-whisper 1.2 computes it,
//! because faster-whisper's transcripts are the reference ours are held to.
//!
//! The recipe (faster_whisper/feature_extractor.py, itself Whisper's `log_mel_spectrogram`):
//! append `pad_samples` zeros (the pipeline passes 160, as faster-whisper does); STFT with
//! n_fft 400, hop 160, periodic Hann window, `center=True` with *reflect* padding of 200
//! samples on both sides; power |X|²; drop the last frame (so `frames = len / 160`); mel
//! = filters · power with librosa's Slaney mel filters; `log10(max(mel, 1e-10))`; clamp
//! to (global max − 8) over the *whole* spectrogram; then `(x + 4) / 4`.
//!
//! We compute in f64 (faster-whisper uses f32/complex64); the difference is at f32
//! rounding level, far below the 1e-3 the fixtures hold us to.

use realfft::num_complex::Complex;
use realfft::RealFftPlanner;

/// STFT size: 25 ms at 16 kHz.
pub const N_FFT: usize = 400;
/// STFT hop: 10 ms at 16 kHz.
pub const HOP: usize = 160;
/// Frames in one 30 s encoder window.
pub const N_FRAMES: usize = 3000;

/// Bins of the one-sided spectrum.
const N_BINS: usize = N_FFT / 2 + 1;
const SAMPLE_RATE: f64 = super::SAMPLE_RATE as f64;
/// Whisper's filters span 0 Hz to Nyquist (8 kHz).
const F_MAX: f64 = SAMPLE_RATE / 2.0;

/// A normalised log-mel spectrogram of a whole recording.
#[derive(Clone, Debug, PartialEq)]
pub struct LogMel {
    pub n_mels: usize,
    pub n_frames: usize,
    /// `[n_frames][n_mels]`, time-major: frame `t`, mel band `m` is `data[t * n_mels + m]`
    /// ([`LogMel::at`]). A frame is computed whole, so it is stored as it comes (no
    /// transpose of the recording), and any run of frames is one contiguous span: the
    /// encoder's kept spectrogram copies a window as one region whatever its start
    /// (`models::whisper::gpu`). Windows for the encoder are band-major ([`LogMel::window`]).
    pub data: Vec<f32>,
}

impl LogMel {
    /// Frames `[start, start + len)` copied into a `[n_mels][N_FRAMES]` window, zero on
    /// the right — what faster-whisper's `pad_or_trim` gives the encoder (the padding is
    /// 0.0 in the normalised log-mel domain, not silence's value).
    ///
    /// `len` is capped at `N_FRAMES`, and frames past the end of the spectrogram are
    /// zeros, so any `start`/`len` is safe.
    pub fn window(&self, start: usize, len: usize) -> Vec<f32> {
        self.window_frames(start, len, N_FRAMES)
    }

    /// The same for a window of `frames` frames (small test models take fewer than 3000).
    pub fn window_frames(&self, start: usize, len: usize, frames: usize) -> Vec<f32> {
        let nm = self.n_mels;
        let mut out = vec![0f32; nm * frames];
        let end = start.saturating_add(len.min(frames)).min(self.n_frames);
        if start < end {
            // Transposed in runs of 16 frames: each band's 16 values are one run of `out`.
            for (b, run) in self.data[start * nm..end * nm].chunks(16 * nm).enumerate() {
                for m in 0..nm {
                    let dst = &mut out[m * frames + 16 * b..];
                    for (j, frame) in run.chunks_exact(nm).enumerate() {
                        dst[j] = frame[m];
                    }
                }
            }
        }
        out
    }

    /// Band `m`'s value at frame `t`.
    pub fn at(&self, m: usize, t: usize) -> f32 {
        self.data[t * self.n_mels + m]
    }
}

/// librosa's (Slaney's) mel scale: linear below 1 kHz at 3 mels per 200 Hz, logarithmic
/// above at 27 mels per factor 6.4. Whisper's filters are built on it (not on HTK's).
fn hz_to_mel(f: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_HZ: f64 = 1000.0;
    if f < MIN_LOG_HZ {
        f / F_SP
    } else {
        MIN_LOG_HZ / F_SP + (f / MIN_LOG_HZ).ln() * 27.0 / 6.4f64.ln()
    }
}

fn mel_to_hz(m: f64) -> f64 {
    const F_SP: f64 = 200.0 / 3.0;
    const MIN_LOG_MEL: f64 = 1000.0 / F_SP;
    if m < MIN_LOG_MEL {
        m * F_SP
    } else {
        1000.0 * ((m - MIN_LOG_MEL) * 6.4f64.ln() / 27.0).exp()
    }
}

/// Filter weights in f64, `[n_mels][N_BINS]`.
fn mel_filters_f64(n_mels: usize) -> Vec<f64> {
    // n_mels + 2 edge frequencies equally spaced in mel from 0 Hz to 8 kHz; filter m is
    // the triangle over edges m, m+1, m+2.
    let mel_max = hz_to_mel(F_MAX);
    let edges: Vec<f64> =
        (0..n_mels + 2).map(|i| mel_to_hz(mel_max * i as f64 / (n_mels + 1) as f64)).collect();
    let mut w = vec![0f64; n_mels * N_BINS];
    for m in 0..n_mels {
        let (lo, mid, hi) = (edges[m], edges[m + 1], edges[m + 2]);
        // Slaney normalisation: every triangle has the same area.
        let norm = 2.0 / (hi - lo);
        for k in 0..N_BINS {
            let f = k as f64 * SAMPLE_RATE / N_FFT as f64;
            let rise = (f - lo) / (mid - lo);
            let fall = (hi - f) / (hi - mid);
            w[m * N_BINS + k] = rise.min(fall).max(0.0) * norm;
        }
    }
    w
}

/// Whisper's mel filter bank, `[n_mels][N_FFT / 2 + 1]` row-major: librosa/Slaney mel
/// scale and Slaney normalisation, 0 Hz to 8 kHz at 16 kHz (`librosa.filters.mel(sr=16000,
/// n_fft=400, n_mels=n_mels)`, which is what Whisper's `mel_filters.npz` holds).
pub fn mel_filters(n_mels: usize) -> Vec<f32> {
    mel_filters_f64(n_mels).into_iter().map(|w| w as f32).collect()
}

/// A filter as its non-zero span: each triangle covers a few bins of 201, so the
/// mel projection costs ~2 multiply-adds per bin instead of `n_mels`.
struct SparseFilter {
    first_bin: usize,
    weights: Vec<f64>,
}

fn sparse_filters(n_mels: usize) -> Vec<SparseFilter> {
    let dense = mel_filters_f64(n_mels);
    dense
        .chunks_exact(N_BINS)
        .map(|row| {
            let first = row.iter().position(|&w| w != 0.0).unwrap_or(0);
            let last = row.iter().rposition(|&w| w != 0.0).map_or(first, |l| l + 1);
            SparseFilter { first_bin: first, weights: row[first..last].to_vec() }
        })
        .collect()
}

/// Index into `0..n` of position `j` of the signal extended by mirror reflection about
/// its end samples (numpy's `mode="reflect"`, which for pads longer than the signal
/// keeps reflecting: a period of `2(n - 1)`). `n` must be at least 1.
fn reflect(j: isize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n as isize - 1);
    let j = j.rem_euclid(period);
    (if j < n as isize { j } else { period - j }) as usize
}

/// Frames a new thread takes at least: below this the spectrogram stays on the calling
/// thread (a thread costs tens of µs to start here, more on the lent machines; a frame ~3 µs).
const MIN_FRAMES_PER_THREAD: usize = 256;
/// Frames a worker of the pool started once ([`crate::threads::pool`]) takes at least.
const MIN_FRAMES_PER_POOL_THREAD: usize = 64;

/// Whether the spectrogram's parts go to the pool started once ([`crate::threads::pool`])
/// or to threads started for each spectrogram (`VERBATIM_MEL_POOL=1|0`). Off until it is
/// timed on a lent machine, where starting threads is what cost (bench/RESULTS.md, the
/// twenty-sixth and twenty-seventh sessions).
pub(crate) fn mel_pool() -> bool {
    std::env::var("VERBATIM_MEL_POOL").map_or(MEL_POOL, |v| v != "0")
}
const MEL_POOL: bool = false;

/// The normalised log-mel spectrogram of 16 kHz mono `samples_16k` with `pad_samples`
/// zeros appended first (pass 160 to match faster-whisper's transcription).
///
/// Gives `(len + pad_samples) / 160` frames; none (empty data) when that is zero.
/// Samples must be finite (decode and resample guarantee it): a NaN would leave NaNs in
/// its frames. The frames are spread over the machine's cores (each frame is computed
/// alone, so the result is the same bits whatever the split: 30 s of audio cost ~9 ms on
/// one core of the lent machine, as much as the GPU's encoder).
pub fn log_mel_spectrogram(samples_16k: &[f32], n_mels: usize, pad_samples: usize) -> LogMel {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    log_mel_threads(samples_16k, n_mels, pad_samples, cores, mel_pool())
}

/// [`log_mel_spectrogram`] on at most `threads` threads: the pool's workers (`on_pool`,
/// where the system gave the pool its threads) or threads started for it.
fn log_mel_threads(samples_16k: &[f32], n_mels: usize, pad_samples: usize, threads: usize, on_pool: bool) -> LogMel {
    let n = samples_16k.len() + pad_samples;
    let n_frames = n / HOP;
    if n_frames == 0 || n_mels == 0 {
        return LogMel { n_mels, n_frames, data: Vec::new() };
    }
    // Periodic Hann: np.hanning(401)[:-1].
    let window: Vec<f64> = (0..N_FFT)
        .map(|k| 0.5 - 0.5 * (2.0 * std::f64::consts::PI * k as f64 / N_FFT as f64).cos())
        .collect();
    let filters = sparse_filters(n_mels);
    let pool = if on_pool { crate::threads::pool() } else { None };
    let min_frames = if pool.is_some() { MIN_FRAMES_PER_POOL_THREAD } else { MIN_FRAMES_PER_THREAD };
    let threads = threads.clamp(1, n_frames.div_ceil(min_frames));
    let per = n_frames.div_ceil(threads);
    let frames = |t0: usize| log10_mels(samples_16k, n, &window, &filters, t0..(t0 + per).min(n_frames));
    // Each part: [frame][mel] for its frames, and their largest value.
    let parts: Vec<(Vec<f32>, f32)> = if threads == 1 {
        vec![frames(0)]
    } else if let Some(pool) = pool {
        use rayon::prelude::*;
        // (collected in part order whichever worker took a part)
        pool.install(|| (0..threads).into_par_iter().map(|i| frames(i * per)).collect())
    } else {
        // A thread the system refuses (out of resources) leaves its part to this one.
        std::thread::scope(|sc| {
            let handles: Vec<_> =
                (0..threads).map(|i| (i, std::thread::Builder::new().spawn_scoped(sc, move || frames(i * per)))).collect();
            handles
                .into_iter()
                .map(|(i, h)| match h {
                    Ok(h) => h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)),
                    Err(_) => frames(i * per),
                })
                .collect()
        })
    };
    let max = parts.iter().map(|p| p.1).fold(f32::NEG_INFINITY, f32::max);
    // Clamp to 80 dB below the loudest value of the whole recording, then scale to ~[-1, 1].
    let floor = max - 8.0;
    // The parts are consecutive runs of frames, each time-major: their concatenation is.
    let data: Vec<f32> = parts.iter().flat_map(|(part, _)| part.iter().map(|&v| (v.max(floor) + 4.0) / 4.0)).collect();
    debug_assert_eq!(data.len(), n_mels * n_frames);
    LogMel { n_mels, n_frames, data }
}

/// log10 of the mel energies of `frames` (`[frame][mel]`), before the clamp, and their
/// largest value. `n` is the padded signal's length.
fn log10_mels(
    samples_16k: &[f32],
    n: usize,
    window: &[f64],
    filters: &[SparseFilter],
    frames: std::ops::Range<usize>,
) -> (Vec<f32>, f32) {
    // The signal with its zero padding; anything else is outside it.
    let sig = |i: usize| samples_16k.get(i).copied().unwrap_or(0.0) as f64;
    let fft = RealFftPlanner::<f64>::new().plan_fft_forward(N_FFT);
    let mut frame = fft.make_input_vec();
    let mut spec: Vec<Complex<f64>> = fft.make_output_vec();
    let mut scratch = fft.make_scratch_vec();
    let mut power = [0f64; N_BINS];
    let mut out = Vec::with_capacity(frames.len() * filters.len());
    let mut max = f32::NEG_INFINITY;
    let half = (N_FFT / 2) as isize;
    for t in frames {
        // Frame t covers padded positions [t*HOP, t*HOP + N_FFT), i.e. signal positions
        // starting at t*HOP - 200 ("center=True").
        let start = (t * HOP) as isize - half;
        if start >= 0 && start as usize + N_FFT <= samples_16k.len() {
            // Interior frame, the common case: straight from the samples.
            let s = &samples_16k[start as usize..start as usize + N_FFT];
            for ((f, &x), &w) in frame.iter_mut().zip(s).zip(window) {
                *f = x as f64 * w;
            }
        } else {
            // Near an edge: reflect off the padded signal's ends, or read appended zeros.
            for (k, (f, &w)) in frame.iter_mut().zip(window).enumerate() {
                *f = sig(reflect(start + k as isize, n)) * w;
            }
        }
        // Lengths come from the plan itself, so this cannot fail.
        fft.process_with_scratch(&mut frame, &mut spec, &mut scratch)
            .expect("realfft buffers sized by their own plan");
        for (p, c) in power.iter_mut().zip(&spec) {
            *p = c.norm_sqr();
        }
        for filt in filters {
            let bins = &power[filt.first_bin..filt.first_bin + filt.weights.len()];
            let e: f64 = bins.iter().zip(&filt.weights).map(|(p, w)| p * w).sum();
            let v = e.max(1e-10).log10() as f32;
            max = max.max(v);
            out.push(v);
        }
    }
    (out, max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture(name: &str) -> Vec<f32> {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/mel").join(name);
        let bytes = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert_eq!(bytes.len() % 4, 0, "{name}");
        bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }

    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
    }

    /// Our log-mel of `input` against the fixture's `[n_mels][frames]`.
    fn check(input: &str, expected: &str, n_mels: usize, pad: usize, frames: usize) {
        let x = fixture(input);
        let want = fixture(expected);
        let got = log_mel_spectrogram(&x, n_mels, pad);
        assert_eq!((got.n_mels, got.n_frames), (n_mels, frames), "{expected}");
        // Both sides compute in f64 and store f32: measured 1.2e-7. The bound is far
        // tighter than the 1e-3 a transcript would tolerate, so subtle slips show.
        let err = max_abs_diff(&got.window_frames(0, frames, frames), &want);
        assert!(err < 1e-5, "{expected}: max abs error {err}");
    }

    #[test]
    fn filters_match_the_independent_slaney_filters() {
        for n_mels in [80, 128] {
            let want = fixture(&format!("filters_{n_mels}.bin"));
            let got = mel_filters(n_mels);
            assert_eq!(got.len(), n_mels * N_BINS);
            let peak = want.iter().fold(0f32, |m, w| m.max(*w));
            let err = max_abs_diff(&got, &want);
            assert!(err < 1e-6 * peak, "{n_mels} mels: max abs error {err} (peak {peak})");
        }
    }

    #[test]
    fn chirp_matches_fixture_80_and_128() {
        check("chirp_in.bin", "chirp_mel80.bin", 80, 160, 131);
        check("chirp_in.bin", "chirp_mel128.bin", 128, 160, 131);
    }

    #[test]
    fn chirp_exercises_the_clamp() {
        // The fixture signal has a near-silent gap, so the (max - 8) floor must be hit:
        // in normalised units the minimum is exactly max - 2.
        let mel = log_mel_spectrogram(&fixture("chirp_in.bin"), 80, 160);
        let max = mel.data.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
        let min = mel.data.iter().fold(f32::INFINITY, |m, v| m.min(*v));
        assert!((min - (max - 2.0)).abs() < 1e-6, "min {min} max {max}");
        assert!(mel.data.iter().filter(|&&v| v == min).count() > 100);
    }

    #[test]
    fn short_signals_match_fixture() {
        check("short_in.bin", "short_mel80.bin", 80, 160, 21);
        check("short_in.bin", "short_mel80_nopad.bin", 80, 0, 20);
        // 180 samples: shorter than the 200-sample reflect pad, so the reflection repeats.
        check("tiny_in.bin", "tiny_mel80.bin", 80, 80, 1);
    }

    #[test]
    fn jfk_matches_faster_whisper() {
        let dir = crate::audio::test_util::samples_dir();
        let audio = crate::audio::decode_wav_file(&dir.join("jfk.wav")).unwrap();
        let x = audio.to_mono_16k().unwrap();
        let mel = log_mel_spectrogram(&x, 80, 160);
        assert_eq!(mel.n_frames, 1101);
        // The fixture keeps every 8th frame of faster-whisper's FeatureExtractor output.
        let want = fixture("jfk_fw_mel80_every8.bin");
        let cols = mel.n_frames.div_ceil(8);
        assert_eq!(want.len(), 80 * cols);
        let mut err = 0f32;
        for m in 0..80 {
            for c in 0..cols {
                let got = mel.at(m, c * 8);
                err = err.max((got - want[m * cols + c]).abs());
            }
        }
        // faster-whisper computes in f32/complex64: measured 6.3e-6.
        assert!(err < 1e-4, "max abs error vs faster-whisper {err}");
    }

    #[test]
    fn threads_give_the_same_bits() {
        // 11 s of a chirp plus noise: 1101 frames, so 1, 2, 3, 7 and 16 threads split it
        // differently, the last part shorter (and the edges' reflected frames in the first
        // and last parts); on threads started for it and on the pool's workers.
        let x: Vec<f32> = (0..176_000)
            .map(|i| {
                let t = i as f32 / 16_000.0;
                (t * t * 900.0).sin() * 0.5 + ((i * 7919 % 101) as f32 / 101.0 - 0.5) * 0.1
            })
            .collect();
        let one = log_mel_threads(&x, 80, 160, 1, false);
        assert_eq!(one.n_frames, 1101);
        assert!(crate::threads::pool().is_some(), "no pool on this machine");
        for on_pool in [false, true] {
            for threads in [2, 3, 7, 16] {
                let many = log_mel_threads(&x, 80, 160, threads, on_pool);
                assert_eq!(many.n_frames, one.n_frames);
                let same = many.data.iter().zip(&one.data).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{threads} threads (pool: {on_pool}): a value differs from one thread's");
            }
            // Fewer frames than a thread takes: one part, however many threads are offered.
            let short = log_mel_threads(&x[..4_000], 128, 160, 8, on_pool);
            assert_eq!(short, log_mel_threads(&x[..4_000], 128, 160, 1, false));
        }
    }

    #[test]
    fn frame_counts_and_silence() {
        for (len, pad, frames) in [
            (0, 0, 0),
            (0, 160, 1),
            (159, 0, 0),
            (160, 0, 1),
            (1, 160, 1),
            (16_000, 160, 101),
            (480_000, 0, 3000),
        ] {
            let mel = log_mel_spectrogram(&vec![0.0; len], 80, pad);
            assert_eq!(mel.n_frames, frames, "{len} + {pad}");
            assert_eq!(mel.data.len(), 80 * frames);
            // Silence: log10(1e-10) = -10 everywhere, (-10 + 4) / 4 = -1.5.
            assert!(mel.data.iter().all(|&v| v == -1.5), "{len} + {pad}");
        }
        // Very short non-silent inputs (a single sample, reflected into a constant frame).
        let mel = log_mel_spectrogram(&[0.5], 80, 200);
        assert_eq!(mel.n_frames, 1);
        assert!(mel.data.iter().all(|v| v.is_finite()));
        assert!(log_mel_spectrogram(&[0.1; 500], 0, 160).data.is_empty());
    }

    #[test]
    fn reflect_matches_numpy() {
        // np.pad(np.arange(n), 12, mode="reflect") for n = 5, written out.
        let want =
            [4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0, 1, 2, 3, 4, 3, 2, 1, 0];
        let got: Vec<usize> = (-12..5 + 12).map(|j| reflect(j, 5)).collect();
        assert_eq!(got, want);
        assert_eq!(reflect(-3, 1), 0);
        assert_eq!(reflect(-1, 2), 1);
    }

    #[test]
    fn windows_copy_and_zero_pad() {
        let n_frames = 4500;
        // Every value its own (band m, frame t holds 1 + 10000 m + t).
        let mel = LogMel {
            n_mels: 3,
            n_frames,
            data: (0..3 * n_frames).map(|i| (1 + 10_000 * (i % 3) + i / 3) as f32).collect(),
        };
        let at = |w: &[f32], m: usize, t: usize| w[m * N_FRAMES + t];
        assert_eq!(mel.at(2, 7), 20_008.0);
        // A full window from the middle: every value.
        let w = mel.window(1000, N_FRAMES);
        assert_eq!(w.len(), 3 * N_FRAMES);
        for m in 0..3 {
            assert!((0..N_FRAMES).all(|t| at(&w, m, t) == mel.at(m, 1000 + t)), "band {m}");
        }
        // A short segment: the rest is zero.
        let w = mel.window(10, 5);
        assert!((0..5).all(|t| (0..3).all(|m| at(&w, m, t) == mel.at(m, 10 + t))));
        assert!((5..N_FRAMES).all(|t| (0..3).all(|m| at(&w, m, t) == 0.0)));
        // Running off the end, over-long and out-of-range requests never panic.
        let w = mel.window(4000, N_FRAMES);
        assert!((0..500).all(|t| (0..3).all(|m| at(&w, m, t) == mel.at(m, 4000 + t))));
        assert_eq!(at(&w, 1, 500), 0.0);
        // Runs of frames that are no multiple of 16.
        let w = mel.window_frames(17, 37, 50);
        assert!((0..37).all(|t| (0..3).all(|m| w[m * 50 + t] == mel.at(m, 17 + t))));
        assert!((37..50).all(|t| (0..3).all(|m| w[m * 50 + t] == 0.0)));
        assert_eq!(mel.window(0, 10 * N_FRAMES).len(), 3 * N_FRAMES);
        assert!(mel.window(usize::MAX, usize::MAX).iter().all(|&v| v == 0.0));
    }
}
