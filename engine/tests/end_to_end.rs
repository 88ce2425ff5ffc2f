//! The real model on real speech, end to end through our kernels (lavapipe in CI).

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use engine::gpu::{Gpu, GpuOptions};
use engine::models::whisper::default_model_dir;
use engine::pipeline::{Options, Transcriber};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One loaded model for every test in this file (loading compiles the kernels and uploads
/// 76 MB; on lavapipe that is worth doing once).
fn transcriber() -> &'static Mutex<Transcriber> {
    static T: OnceLock<Mutex<Transcriber>> = OnceLock::new();
    T.get_or_init(|| {
        let dir = default_model_dir();
        assert!(
            dir.join("model.bin").is_file(),
            "the default model is missing at {} — run packaging/fetch-model.sh",
            dir.display()
        );
        let profile = std::env::var_os("VERBATIM_PROFILE").is_some();
        let gpu = Arc::new(Gpu::new(&GpuOptions { profile, ..Default::default() }).expect("a GPU adapter (lavapipe is enough)"));
        eprintln!("GPU: {} ({})", gpu.info.name, gpu.info.backend);
        Mutex::new(Transcriber::load(gpu, &dir).expect("load the default model"))
    })
}

pub fn normalise(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() || c.is_whitespace() || c == '\'' { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
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
