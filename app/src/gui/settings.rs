//! What the window remembers between runs: a small JSON file in the XDG config directory
//! (`$XDG_CONFIG_HOME/verbatim/settings.json`, else `~/.config/verbatim/settings.json`).
//!
//! A missing file means defaults; an unreadable or corrupt one also means defaults, with a
//! note the window shows (the file is then rewritten on the next change, never silently
//! at startup, so a hand-edited file with a typo is not lost before the user sees why).

use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Settings {
    /// A CTranslate2 Whisper model directory; None: the default model, fetched when missing.
    pub model_dir: Option<PathBuf>,
    /// Part of the GPU adapter's name to use; None: the best one. Applies at the next start
    /// (the window draws with the same device).
    pub adapter: Option<String>,
    /// Decode with timestamps (segments with times) or text only.
    pub timestamps: bool,
    /// The input device for live transcription; None: the system default.
    pub microphone: Option<String>,
    /// Speculative decoding of files: drafts from the text so far ("ngram"), or "off". The
    /// text is the same either way; on speech read for the first time few drafts hold, so
    /// the default is off (live mode always drafts from its previous hypothesis).
    pub speculative: String,
}

impl Default for Settings {
    fn default() -> Self {
        Settings { model_dir: None, adapter: None, timestamps: true, microphone: None, speculative: "off".into() }
    }
}

/// Where the settings live, or None when neither XDG_CONFIG_HOME nor HOME is set.
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").filter(|v| !v.is_empty()).map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("verbatim").join("settings.json"))
}

/// The settings at `path` and, when the file exists but cannot be used, why.
pub fn load(path: &Path) -> (Settings, Option<String>) {
    match std::fs::read_to_string(path) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(s) => (s, None),
            Err(e) => (
                Settings::default(),
                Some(format!("the settings in {} could not be read ({e}); using the defaults", path.display())),
            ),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Settings::default(), None),
        Err(e) => (Settings::default(), Some(format!("cannot read {}: {e}; using the defaults", path.display()))),
    }
}

/// Write through a temporary file and a rename, so a crash never leaves half a file.
pub fn save(path: &Path, settings: &Settings) -> Result<(), String> {
    let text = serde_json::to_string_pretty(settings).map_err(|e| e.to_string())?;
    let dir = path.parent().ok_or_else(|| format!("{} has no parent directory", path.display()))?;
    let tmp = dir.join(".settings.json.partial");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, text + "\n"))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot save the settings to {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("verbatim-settings-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn round_trip_and_defaults() {
        let dir = temp_dir("rt");
        let path = dir.join("verbatim").join("settings.json");
        assert_eq!(load(&path), (Settings::default(), None), "a missing file gives the defaults, silently");
        let s = Settings {
            model_dir: Some("/models/x".into()),
            adapter: Some("llvmpipe".into()),
            timestamps: false,
            microphone: Some("USB Mic".into()),
            speculative: "ngram".into(),
        };
        save(&path, &s).unwrap();
        assert_eq!(load(&path), (s, None));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn corrupt_file_gives_defaults_and_a_note() {
        let dir = temp_dir("bad");
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("settings.json");
        std::fs::write(&path, "{ \"timestamps\": tru").unwrap();
        let (s, note) = load(&path);
        assert_eq!(s, Settings::default());
        assert!(note.unwrap().contains("settings.json"));
        // Unknown keys (a newer version's) and missing keys (an older one's) are fine.
        std::fs::write(&path, r#"{"timestamps": false, "future_key": 3}"#).unwrap();
        let (s, note) = load(&path);
        assert!(note.is_none());
        assert!(!s.timestamps);
        assert_eq!(s.model_dir, None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
