//! Audio in: WAV decode (hound), mono + resample to 16 kHz (rubato), Whisper's log-mel.
//!
//! The path every transcription takes:
//! `decode_wav_file` -> [`Audio::to_mono_16k`] -> [`mel::log_mel_spectrogram`] -> 30 s
//! windows of `[n_mels][N_FRAMES]` via [`mel::LogMel::window`].

pub mod decode;
pub mod mel;
pub mod resample;

/// The rate every model here consumes (Whisper's and the speech LM's audio encoders).
pub const SAMPLE_RATE: u32 = 16_000;

pub use decode::{decode_wav_bytes, decode_wav_file, Audio};

#[cfg(test)]
pub(crate) mod test_util {
    use std::path::{Path, PathBuf};

    /// `shared/samples` beside the repository (where CI puts it), else /work/shared
    /// (dev machines). Panics — failing the test — when neither exists, so that a
    /// missing folder cannot make the real-file tests pass silently.
    pub(crate) fn samples_dir() -> PathBuf {
        let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/samples");
        for dir in [beside, PathBuf::from("/work/shared/samples")] {
            if dir.join("jfk.wav").is_file() {
                return dir;
            }
        }
        panic!("the speech samples folder (shared/samples beside the repository) is missing");
    }
}
