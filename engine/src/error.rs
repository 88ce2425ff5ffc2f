//! Errors are values: every failure a user can cause (bad audio, a corrupt model, a GPU
//! without a needed feature, device loss) is one of these, with a sentence they understand.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be opened or read at all.
    #[error("cannot read {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },

    /// The file was read but is not audio we can decode (corrupt header, empty, not WAV...).
    #[error("{} is not usable audio: {reason}", path.display())]
    Audio { path: PathBuf, reason: String },

    /// Audio samples that cannot be processed (no samples, a rate of zero, ...).
    #[error("bad audio: {0}")]
    AudioData(String),

    /// A model file that is truncated, corrupt or disagrees with its configuration.
    /// `reason` names the variable when one is at fault.
    #[error("model {}: {reason}", path.display())]
    Model { path: PathBuf, reason: String },

    /// The tokenizer could not be loaded or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),

    /// No GPU adapter (not even a software one) could be found or opened.
    #[error("no usable GPU adapter: {0}")]
    NoAdapter(String),

    /// The adapter lacks something the engine needs.
    #[error("the GPU adapter cannot run this: {0}")]
    Unsupported(String),

    /// The device was lost (driver reset, GPU removed, out of memory...).
    #[error("the GPU device was lost: {0}")]
    DeviceLost(String),

    /// Any other error reported by wgpu (validation, out of memory).
    #[error("GPU error: {0}")]
    Gpu(String),

    /// The microphone could not be opened or stopped delivering audio (none present,
    /// unplugged, busy, no permission).
    #[error("microphone: {0}")]
    Microphone(String),

    /// The caller asked the work to stop (the window's Cancel button).
    #[error("cancelled")]
    Cancelled,

    /// A caller asked for something impossible (bad option, shapes that do not fit).
    #[error("{0}")]
    Invalid(String),
}

impl Error {
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }
    pub fn model(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Model { path: path.into(), reason: reason.into() }
    }
    pub fn audio(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Audio { path: path.into(), reason: reason.into() }
    }
}
