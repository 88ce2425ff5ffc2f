//! `verbatim lm-check` end to end on the `nemotron-h-tiny` fixture (`../shared/fixtures`
//! beside the repository, else `/work/shared/fixtures`): the acceptance run passes (exit 0,
//! both input sets, every bound ok), and a missing file is one line on stderr with exit 1.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_verbatim");

fn fixture() -> PathBuf {
    let rel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/nemotron-h-tiny");
    let abs = Path::new("/work/shared/fixtures/nemotron-h-tiny");
    for p in [rel.as_path(), abs] {
        if p.join("expected.safetensors").is_file() {
            return p.to_path_buf();
        }
    }
    panic!(
        "the nemotron-h-tiny fixture is missing: looked in {} and {}",
        rel.display(),
        abs.display()
    );
}

fn lm_check(args: &[&Path]) -> Output {
    Command::new(BIN)
        .arg("lm-check")
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run verbatim")
}

#[test]
fn lm_check_passes_on_the_fixture() {
    let f = fixture();
    let out = lm_check(&[&f, &f.join("expected.safetensors")]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0));
    for set in ["prompt_ids (420 positions)", "embeds_input (420 positions)"] {
        assert!(stdout.contains(set), "no {set}");
    }
    assert!(stdout.contains("layer 5"), "per-layer errors");
    assert_eq!(stdout.matches("greedy:").count(), 2);
    assert!(!stdout.contains("OUT OF BOUNDS"));
    assert!(stdout.trim_end().ends_with("lm-check: PASS"));
}

#[test]
fn lm_check_missing_expected_is_one_line() {
    let f = fixture();
    let missing = f.join("no-such-expected.safetensors");
    let out = lm_check(&[&f, &missing]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].contains("no-such-expected.safetensors"),
        "{stderr}"
    );
}
