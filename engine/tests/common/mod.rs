//! What the integration tests share: the repository root, one loaded default model per
//! test binary (loading compiles the kernels and uploads 76 MB; on lavapipe that is worth
//! doing once), and the text normalisation transcripts are compared under.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use engine::gpu::{Gpu, GpuOptions};
use engine::models::whisper::default_model_dir;
use engine::pipeline::Transcriber;

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The default model on the default adapter; `VERBATIM_PROFILE=1` turns on per-kernel
/// GPU timing.
pub fn transcriber() -> &'static Mutex<Transcriber> {
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

/// Lowercase, punctuation gone, single spaces.
pub fn normalise(s: &str) -> String {
    s.to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() || c.is_whitespace() || c == '\'' { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
