//! The `verbatim` CLI end to end, run as a user runs it: the real binary, the default
//! model (tiny.en, `VERBATIM_MODEL_DIR` overrides), real files.
//!
//! - Bad inputs (a truncated or missing model, a corrupt WAV header, an empty file, a text
//!   file, a missing file, a directory, a WAV without samples): exactly one line on stderr
//!   that names the culprit, exit status 1, no panic and no backtrace, nothing on stdout.
//!   None of these transcribes anything (the model loads in under a second or not at all).
//! - `assets/jfk.wav` three times (each run is one 30 s window, ~40 s on lavapipe):
//!   plain text + `--timings`; `--json` beside a bad file (the good file is still done,
//!   exit 1); `--no-timestamps --format srt --output-dir` beside an empty file.
//! - Three sentences spoken by espeak-ng, made here, in one file: word error rate ≤ 25 %.
//!
//! Real transcriptions take a lock so that at most one runs at a time: on a 2-core machine
//! running lavapipe, two at once only make both slower and risk the timeout.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_verbatim");

/// What JFK says in `assets/jfk.wav`, normalised (see [`words`]).
const JFK: &str = "and so my fellow americans ask not what your country can do for you ask what you can do for your country";

/// Length of `assets/jfk.wav` (176 000 samples at 16 kHz).
const JFK_SECONDS: f64 = 11.0;

/// Ordinary sentences for espeak-ng, 10–14 words each, numbers avoided (a digit in the
/// transcript against a word in the reference would count as an error that is not one).
const SENTENCES: [&str; 3] = [
    "The weather was warm and sunny, so we walked to the park after lunch.",
    "My brother likes to read old books about ships and the sea.",
    "We will meet at the train station early tomorrow morning.",
];

/// No single run should come anywhere near this; a hung CLI fails instead of hanging CI.
const RUN_TIMEOUT: Duration = Duration::from_secs(900);

/// Held while a real transcription runs (see the module comment).
static GPU_RUN: Mutex<()> = Mutex::new(());

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("app/ has a parent").to_path_buf()
}

/// The finished process: status code, stdout, stderr, how long it took.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Run `verbatim ARGS...` in `cwd`. `RUST_BACKTRACE=1` makes any panic that escaped the
/// CLI's hook show up as a backtrace, which the checks below reject.
fn verbatim_in(cwd: &Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(BIN);
    cmd.args(args).current_dir(cwd).env("RUST_BACKTRACE", "1").stdin(Stdio::null());
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let t_out = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for verbatim") {
            break status;
        }
        if start.elapsed() > RUN_TIMEOUT {
            let _ = child.kill(); // our own child, by its handle
            let _ = child.wait();
            panic!("verbatim {args:?} did not finish in {RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = start.elapsed();
    let stdout = String::from_utf8(t_out.join().unwrap()).expect("stdout is UTF-8");
    let stderr = String::from_utf8(t_err.join().unwrap()).expect("stderr is UTF-8");
    Run { code: status.code(), stdout, stderr, elapsed }
}

/// A run that transcribes for real: one at a time, and its time printed.
fn transcribe(cwd: &Path, args: &[&str]) -> Run {
    let _guard = GPU_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let run = verbatim_in(cwd, args);
    eprintln!("verbatim {} -> {:?} in {:.1} s", args.join(" "), run.code, run.elapsed.as_secs_f64());
    run
}

/// A private scratch directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("verbatim-cli-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("create a temporary directory");
        TempDir(dir)
    }

    fn path(&self) -> &Path {
        &self.0
    }

    fn file(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.0.join(name);
        fs::write(&path, bytes).expect("write a test file");
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn jfk_bytes() -> Vec<u8> {
    fs::read(workspace_root().join("assets/jfk.wav")).expect("assets/jfk.wav")
}

/// Where the CLI finds its default model (the same rule as the CLI's).
fn model_dir() -> PathBuf {
    engine::models::whisper::default_model_dir()
}

/// The checks every failure must pass: the exit status, nothing on stdout, and one
/// `verbatim: ...` line per culprit on stderr, each naming its culprit, with no trace of
/// a panic. Returns the lines.
fn assert_failed(run: &Run, code: i32, culprits: &[&str]) -> Vec<String> {
    let context = format!("status {:?}\nstdout: {:?}\nstderr: {:?}", run.code, run.stdout, run.stderr);
    for bad in ["panicked", "RUST_BACKTRACE", "stack backtrace", "internal error", "note: run with"] {
        assert!(!run.stderr.contains(bad), "a panic's trace ({bad:?}) on stderr\n{context}");
    }
    assert_eq!(run.code, Some(code), "exit status\n{context}");
    assert!(run.stderr.ends_with('\n'), "stderr ends its line\n{context}");
    let lines: Vec<String> = run.stderr.lines().map(str::to_string).collect();
    assert_eq!(lines.len(), culprits.len(), "one stderr line per failure\n{context}");
    for (line, culprit) in lines.iter().zip(culprits) {
        assert!(line.starts_with("verbatim: "), "a line of ours: {line:?}\n{context}");
        assert!(line.contains(culprit), "the line names {culprit:?}: {line:?}\n{context}");
        assert!(line.len() < 400, "one readable sentence, not a dump: {line:?}");
    }
    lines
}

// ---------------------------------------------------------------------------------------
// Word error rate

/// Lowercase words, punctuation gone ("country." -> "country", "don't" -> "dont").
fn words(text: &str) -> Vec<String> {
    let cleaned: String = text
        .chars()
        .filter(|c| *c != '\'' && *c != '’')
        .map(|c| if c.is_alphanumeric() { c.to_ascii_lowercase() } else { ' ' })
        .collect();
    cleaned.split_whitespace().map(str::to_string).collect()
}

fn normalised(text: &str) -> String {
    words(text).join(" ")
}

/// Word-level Levenshtein distance (substitutions + deletions + insertions) over the
/// reference's length.
fn word_error_rate(reference: &str, hypothesis: &str) -> f64 {
    let (r, h) = (words(reference), words(hypothesis));
    assert!(!r.is_empty(), "an empty reference");
    let mut prev: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut cur = vec![i + 1; h.len() + 1];
        for (j, hw) in h.iter().enumerate() {
            let sub = prev[j] + usize::from(rw != hw);
            cur[j + 1] = sub.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[h.len()] as f64 / r.len() as f64
}

#[test]
fn word_error_rate_counts_edits() {
    assert_eq!(word_error_rate("a b c d", "a b c d"), 0.0);
    assert_eq!(word_error_rate("A, b. C!", "a b c"), 0.0);
    assert_eq!(word_error_rate("a b c d", "a x c d"), 0.25); // substitution
    assert_eq!(word_error_rate("a b c d", "a c d"), 0.25); // deletion
    assert_eq!(word_error_rate("a b c d", "a b b c d"), 0.25); // insertion
    assert_eq!(word_error_rate("a b", ""), 1.0);
    assert_eq!(word_error_rate("a b", "c d e f"), 2.0);
    assert_eq!(word_error_rate("tonight it is", "to hide it is"), 2.0 / 3.0);
}

// ---------------------------------------------------------------------------------------
// Bad inputs: no transcription runs

/// The default model's files `names` copied into `dir` (a model directory to break).
fn copy_model_files(dir: &TempDir, names: &[&str]) {
    let src = model_dir();
    for name in names {
        fs::copy(src.join(name), dir.path().join(name))
            .unwrap_or_else(|e| panic!("copy {name} of the default model {} (fetch it first): {e}", src.display()));
    }
}

#[test]
fn truncated_model_is_one_line_naming_model_bin() {
    let src = model_dir();
    let dir = TempDir::new("truncated-model");
    copy_model_files(&dir, &["config.json", "tokenizer.json", "vocabulary.txt"]);
    let model = fs::read(src.join("model.bin")).expect("the default model's model.bin");
    let jfk = workspace_root().join("assets/jfk.wav");
    let jfk = jfk.to_str().unwrap();
    let model_arg = dir.path().to_str().unwrap();

    // Cut inside a variable's data (10 MB) and inside the header (100 bytes).
    for cut in [10_000_000, 100] {
        assert!(model.len() > cut);
        fs::write(dir.path().join("model.bin"), &model[..cut]).unwrap();
        let run = verbatim_in(dir.path(), &["transcribe", "--model", model_arg, jfk]);
        let lines = assert_failed(&run, 1, &["model.bin"]);
        assert!(lines[0].contains("truncated"), "says the model is truncated: {:?}", lines[0]);
        assert!(lines[0].contains("variable"), "names the variable it could not read: {:?}", lines[0]);
        assert!(run.elapsed < Duration::from_secs(60), "fails at load, before any audio: {:?}", run.elapsed);
    }

    // The same through VERBATIM_MODEL_DIR (where the CLI must not "repair" it by download).
    let run = {
        let mut cmd = Command::new(BIN);
        cmd.args(["transcribe", jfk]).env("VERBATIM_MODEL_DIR", dir.path()).env("RUST_BACKTRACE", "1");
        let out = cmd.output().expect("run verbatim");
        Run {
            code: out.status.code(),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
            elapsed: Duration::ZERO,
        }
    };
    assert_failed(&run, 1, &["model.bin"]);

    // A model directory that does not exist, and one without model.bin.
    fs::remove_file(dir.path().join("model.bin")).unwrap();
    let run = verbatim_in(dir.path(), &["transcribe", "--model", model_arg, jfk]);
    assert_failed(&run, 1, &["model.bin"]);
    let missing = dir.path().join("no-such-model");
    let run = verbatim_in(dir.path(), &["transcribe", "--model", missing.to_str().unwrap(), jfk]);
    assert_failed(&run, 1, &["no-such-model"]);
}

/// The tokenizer is parsed on a thread beside the kernels' compilation and the weights'
/// upload (`GpuWhisper::load_beside`): a broken one still ends the run with one line
/// naming it, after the load beside it has finished, and no panic.
#[test]
fn broken_tokenizer_is_one_line_naming_it() {
    let dir = TempDir::new("broken-tokenizer");
    copy_model_files(&dir, &["config.json", "vocabulary.txt", "model.bin"]);
    let jfk = workspace_root().join("assets/jfk.wav");
    let model_arg = dir.path().to_str().unwrap();
    // Not JSON at all, and JSON that is no tokenizer.
    for (what, text) in [("not JSON", "{ this is not json"), ("no tokenizer", "{\"version\": \"1.0\"}")] {
        fs::write(dir.path().join("tokenizer.json"), text).unwrap();
        let run = verbatim_in(dir.path(), &["transcribe", "--model", model_arg, jfk.to_str().unwrap()]);
        let lines = assert_failed(&run, 1, &["tokenizer.json"]);
        println!("{what}: {}", lines[0]);
        assert!(run.stdout.is_empty(), "{what}: no transcript: {:?}", run.stdout);
    }
}

/// Each bad file alone: one line naming it, exit 1, nothing on stdout.
#[test]
fn bad_audio_files_are_one_line_each() {
    let dir = TempDir::new("bad-audio");
    let jfk = jfk_bytes();
    let mut corrupt = jfk.clone();
    corrupt[20..36].fill(0xff); // the fmt chunk's body: format, channels, rates, bits
    let mut no_channels = jfk.clone();
    no_channels[22..24].fill(0);
    let mut no_samples = jfk[..44].to_vec(); // a complete header whose data chunk is empty
    no_samples[40..44].fill(0);
    no_samples[4..8].copy_from_slice(&36u32.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("corrupt-header.wav", corrupt),
        ("no-channels.wav", no_channels),
        ("cut-in-header.wav", jfk[..30].to_vec()),
        ("cut-after-header.wav", jfk[..1000].to_vec()),
        ("no-samples.wav", no_samples),
        ("empty.wav", Vec::new()),
        ("notes.wav", b"Shopping list: milk, bread, eggs.\nCall the bank.\n".to_vec()),
        ("notes.txt", b"not audio at all\n".to_vec()),
    ];
    for (name, bytes) in &cases {
        dir.file(name, bytes);
        let run = verbatim_in(dir.path(), &["transcribe", name]);
        assert_failed(&run, 1, &[name]);
        assert!(run.stdout.is_empty(), "{name}: nothing on stdout: {:?}", run.stdout);
    }
    // Files that cannot be opened: the CLI says so before it loads any model.
    fs::create_dir(dir.path().join("folder.wav")).unwrap();
    for (name, why) in [("missing.wav", "no such file"), ("folder.wav", "directory")] {
        let run = verbatim_in(dir.path(), &["transcribe", name]);
        let lines = assert_failed(&run, 1, &[name]);
        assert!(lines[0].contains(why), "{name}: says {why:?}: {:?}", lines[0]);
        assert!(run.stdout.is_empty());
    }
}

/// Several bad files: one line each, in order, exit 1. (The good-file-beside-bad-files
/// case, which needs a real transcription, is in the JFK tests below.)
#[test]
fn several_bad_files_get_a_line_each() {
    let dir = TempDir::new("several-bad");
    dir.file("empty.wav", b"");
    dir.file("text.wav", b"hello, this is a text file\n");
    let run = verbatim_in(dir.path(), &["transcribe", "empty.wav", "missing.wav", "text.wav"]);
    assert_failed(&run, 1, &["empty.wav", "missing.wav", "text.wav"]);
    assert!(run.stdout.is_empty(), "{:?}", run.stdout);

    // With --json the document still comes, listing each failure with its error.
    let run = verbatim_in(dir.path(), &["transcribe", "--json", "empty.wav", "missing.wav"]);
    assert_failed(&run, 1, &["empty.wav", "missing.wav"]);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).expect("--json output parses");
    let files = doc["files"].as_array().expect("files");
    assert_eq!(files.len(), 2);
    for (f, name) in files.iter().zip(["empty.wav", "missing.wav"]) {
        assert_eq!(f["path"], name);
        assert!(f["error"].as_str().is_some_and(|e| !e.is_empty()), "{f}");
        assert!(f.get("text").is_none(), "{f}");
    }
}

#[test]
fn usage_errors_exit_2_without_transcribing() {
    let root = workspace_root();
    for args in [
        vec!["transcribe"],
        vec!["transcribe", "--format", "srt", "assets/jfk.wav", "assets/jfk.wav"],
        vec!["transcribe", "--json", "--format", "srt", "assets/jfk.wav"],
        vec!["transcribe", "--timestamps", "--no-timestamps", "assets/jfk.wav"],
        vec!["transcribe", "--format", "mp3", "assets/jfk.wav"],
        vec!["transcribe", "--no-such-flag", "assets/jfk.wav"],
    ] {
        let run = verbatim_in(&root, &args);
        assert_eq!(run.code, Some(2), "{args:?}: usage error\n{}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?}: {:?}", run.stdout);
        assert!(run.stderr.starts_with("error: "), "{args:?}: clap's message: {:?}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{args:?}: {:?}", run.stderr);
        assert!(run.elapsed < Duration::from_secs(30), "{args:?}: no model load, no transcription");
    }
}

/// `verbatim` alone opens the window; where there is no display it says so in one line
/// (and where to turn instead) rather than panicking.
#[test]
fn window_without_a_display_is_one_line() {
    let mut cmd = Command::new(BIN);
    cmd.current_dir(workspace_root())
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env("XDG_CONFIG_HOME", std::env::temp_dir().join("verbatim-no-display-config"))
        .stdin(Stdio::null());
    let out = cmd.output().expect("run verbatim");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(stderr.contains("verbatim: cannot open the window"), "{stderr}");
    assert!(stderr.contains("verbatim transcribe"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

// ---------------------------------------------------------------------------------------
// The JFK sample: three real runs

/// `verbatim transcribe assets/jfk.wav --timings`: the text on one line, then the table.
#[test]
fn jfk_plain_text_with_timings() {
    let run = transcribe(&workspace_root(), &["transcribe", "assets/jfk.wav", "--timings"]);
    assert_eq!(run.code, Some(0), "stderr: {}", run.stderr);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert!(lines.len() >= 12, "text + header + 9 stages + summary:\n{}", run.stdout);
    println!("jfk: {}", lines[0]);
    assert_eq!(normalised(lines[0]), JFK, "the transcript line: {:?}", lines[0]);

    // The stage table, in order, each a number of ms.
    let header: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(header, ["stage", "ms"], "the table's header: {:?}", lines[1]);
    let stages = ["GPU open", "model load", "audio decode", "resample", "mel", "encoder", "prefill", "decode steps", "total"];
    let mut ms = Vec::new();
    for (line, stage) in lines[2..].iter().zip(stages) {
        let (name, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("a stage line: {line:?}"));
        assert_eq!(name.trim(), stage, "stage order: {line:?}");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("a number of ms: {line:?}"));
        assert!(v.is_finite() && v >= 0.0, "{line:?}");
        ms.push(v);
    }
    assert_eq!(ms.len(), stages.len());
    let total = ms[8];
    assert!(ms[0] > 0.0 && ms[1] > 0.0, "opening the GPU and loading the model take time:\n{}", run.stdout);
    assert!(ms[5] > 0.0 && ms[7] > 0.0, "encoder and decode steps take time:\n{}", run.stdout);
    let parts: f64 = ms[2..8].iter().sum();
    assert!(parts <= total + 1.0, "the stages after model load fit in total ({parts} > {total}):\n{}", run.stdout);
    assert!(ms[0] + ms[1] + total <= run.elapsed.as_secs_f64() * 1e3, "opening, loading and total within the run's wall time");

    // "tokens N, audio 11.00 s, real-time factor R"
    let summary = lines[11];
    let rest = summary.strip_prefix("tokens ").unwrap_or_else(|| panic!("the summary line: {summary:?}"));
    let (tokens, rest) = rest.split_once(", audio ").expect("audio length");
    let (audio, rtf) = rest.split_once(" s, real-time factor ").expect("real-time factor");
    let tokens: usize = tokens.parse().expect("tokens");
    assert!((20..200).contains(&tokens), "{summary:?}");
    assert_eq!(audio, "11.00", "{summary:?}");
    let rtf: f64 = rtf.parse().expect("real-time factor");
    let expected = total / 1e3 / JFK_SECONDS;
    assert!((rtf - expected).abs() <= 1e-3 + 1e-3 * expected, "rtf {rtf} = total / audio = {expected}");
    assert_eq!(lines.len(), 12, "nothing after the summary:\n{}", run.stdout);
}

/// Files are read ahead of the GPU (each next one while the one before is transcribed):
/// a stereo copy of JFK's first 7 s, an empty file and JFK still come out in order, the
/// copy with the first of JFK's words (its two equal channels average to the same samples).
#[test]
fn files_read_ahead_come_out_in_order() {
    let root = workspace_root();
    let dir = TempDir::new("read-ahead");
    let jfk = jfk_bytes();
    let mono = &jfk[44..44 + 7 * 16_000 * 2];
    let mut stereo = jfk[..44].to_vec();
    stereo[22..24].copy_from_slice(&2u16.to_le_bytes()); // channels
    stereo[28..32].copy_from_slice(&(16_000u32 * 4).to_le_bytes()); // byte rate
    stereo[32..34].copy_from_slice(&4u16.to_le_bytes()); // block align
    stereo[40..44].copy_from_slice(&(mono.len() as u32 * 2).to_le_bytes());
    stereo[4..8].copy_from_slice(&(36 + mono.len() as u32 * 2).to_le_bytes());
    for s in mono.chunks_exact(2) {
        stereo.extend_from_slice(s);
        stereo.extend_from_slice(s);
    }
    let stereo = dir.file("stereo.wav", &stereo);
    let empty = dir.file("empty.wav", b"");
    let (stereo, empty) = (stereo.to_str().unwrap(), empty.to_str().unwrap());
    let run = transcribe(&root, &["transcribe", stereo, empty, "assets/jfk.wav"]);
    assert_failed(&run, 1, &[empty]);
    let lines: Vec<&str> = run.stdout.lines().collect();
    assert_eq!(lines.len(), 2, "a line for each good file:\n{}", run.stdout);
    let texts: Vec<String> = lines
        .iter()
        .zip([stereo, "assets/jfk.wav"])
        .map(|(line, name)| normalised(line.strip_prefix(&format!("{name}: ")).unwrap_or_else(|| panic!("{name} first: {line:?}"))))
        .collect();
    assert!(texts[0].len() > 10 && texts[0].len() < JFK.len() - 20 && JFK.starts_with(&texts[0]), "the first 7 s: {:?}", texts[0]);
    assert_eq!(texts[1], JFK);
}

/// `--json` with a bad file first: the bad one gets its line, the good one is still
/// transcribed, the document parses and has the segments, exit 1.
#[test]
fn jfk_json_beside_a_bad_file() {
    let root = workspace_root();
    let dir = TempDir::new("json-mixed");
    let notes = dir.file("notes.txt", b"These are notes, not audio.\n");
    let notes = notes.to_str().unwrap();
    let run = transcribe(&root, &["transcribe", "--json", notes, "assets/jfk.wav"]);
    assert_failed(&run, 1, &[notes]);

    let doc: serde_json::Value = serde_json::from_str(&run.stdout).expect("--json output parses");
    assert!(doc["model"].as_str().is_some_and(|m| !m.is_empty()), "the model: {doc}");
    assert!(doc["load_seconds"].as_f64().is_some_and(|s| s >= 0.0), "load time: {doc}");
    let files = doc["files"].as_array().expect("files");
    assert_eq!(files.len(), 2, "both files, in order");
    assert_eq!(files[0]["path"], notes);
    assert!(files[0]["error"].as_str().is_some_and(|e| run.stderr.contains(e)), "the same error: {}", files[0]);

    let f = &files[1];
    assert_eq!(f["path"], "assets/jfk.wav");
    assert!(f.get("error").is_none(), "{f}");
    assert_eq!(normalised(f["text"].as_str().expect("text")), JFK, "{f}");
    let segments = f["segments"].as_array().expect("segments");
    assert!(!segments.is_empty(), "{f}");
    let mut joined = String::new();
    let mut last_end = 0.0;
    for s in segments {
        let (start, end) = (s["start"].as_f64().expect("start"), s["end"].as_f64().expect("end"));
        assert!(start >= last_end - 1e-9 && end >= start, "segments in order: {s} after {last_end}");
        assert!(end <= JFK_SECONDS + 0.5, "within the audio: {s}");
        last_end = end;
        joined += " ";
        joined += s["text"].as_str().expect("segment text");
    }
    assert_eq!(normalised(&joined), JFK, "the segments carry the text: {segments:?}");
    assert!(last_end > JFK_SECONDS * 0.7, "the segments reach the end of the speech: {segments:?}");

    assert!((f["audio_seconds"].as_f64().unwrap() - JFK_SECONDS).abs() < 0.01, "{f}");
    assert!(f["tokens"].as_u64().is_some_and(|t| t > 10), "{f}");
    assert!(f["rtf"].as_f64().is_some_and(|r| r > 0.0), "{f}");
    let names: Vec<&str> = f["stages"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["audio decode", "resample", "mel", "encoder", "prefill", "decode steps", "total"]);
}

/// `--no-timestamps --format srt --output-dir DIR` with an empty file beside: DIR/jfk.srt
/// parses back as SubRip and carries the same text; the empty file gets its line.
#[test]
fn jfk_srt_without_timestamps_into_a_directory() {
    let dir = TempDir::new("srt");
    let empty = dir.file("empty.wav", b"");
    let out_dir = dir.path().join("out");
    let run = transcribe(
        &workspace_root(),
        &[
            "transcribe",
            "--no-timestamps",
            "--format",
            "srt",
            "--output-dir",
            out_dir.to_str().unwrap(),
            "assets/jfk.wav",
            empty.to_str().unwrap(),
        ],
    );
    assert_failed(&run, 1, &["empty.wav"]);
    assert!(run.stdout.is_empty(), "everything went to the directory: {:?}", run.stdout);
    let written: Vec<String> = fs::read_dir(&out_dir)
        .expect("the output directory")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(written, ["jfk.srt"], "one file, no partial leftovers, none for the failed input");

    let doc = fs::read_to_string(out_dir.join("jfk.srt")).unwrap();
    let cues = parse_srt(&doc);
    assert!(!cues.is_empty(), "{doc:?}");
    let text: Vec<&str> = cues.iter().map(|c| c.2.as_str()).collect();
    assert_eq!(normalised(&text.join(" ")), JFK, "{doc}");
    for (start, end, _) in &cues {
        assert!(start <= end && *end as f64 <= (JFK_SECONDS + 0.5) * 1e3, "{doc}");
    }
}

/// SubRip, strictly: numbered blocks from 1, `hh:mm:ss,mmm --> hh:mm:ss,mmm`, text lines.
fn parse_srt(doc: &str) -> Vec<(u64, u64, String)> {
    assert!(doc.ends_with("\n\n"), "blocks end with a blank line: {doc:?}");
    let clock = |s: &str| -> u64 {
        let (hms, frac) = s.split_once(',').unwrap_or_else(|| panic!("no ',' in {s:?}"));
        let p: Vec<u64> = hms.split(':').map(|x| x.parse().unwrap_or_else(|_| panic!("{s:?}"))).collect();
        assert!(p.len() == 3 && frac.len() == 3 && p[1] < 60 && p[2] < 60, "{s:?}");
        ((p[0] * 60 + p[1]) * 60 + p[2]) * 1000 + frac.parse::<u64>().unwrap()
    };
    let mut cues = Vec::new();
    for (i, block) in doc.split("\n\n").filter(|b| !b.is_empty()).enumerate() {
        let mut lines = block.lines();
        assert_eq!(lines.next(), Some((i + 1).to_string().as_str()), "numbered from 1: {block:?}");
        let timing = lines.next().unwrap_or_else(|| panic!("a timing line: {block:?}"));
        let (a, b) = timing.split_once(" --> ").unwrap_or_else(|| panic!("{timing:?}"));
        let text: Vec<&str> = lines.collect();
        assert!(!text.is_empty(), "a cue with text: {block:?}");
        cues.push((clock(a), clock(b), text.join("\n")));
    }
    cues
}

// ---------------------------------------------------------------------------------------
// Synthetic speech

/// Three sentences spoken by espeak-ng (made here, one file, one 30 s window) come back
/// with a word error rate of at most 25 %.
#[test]
fn espeak_sentences_word_error_rate() {
    let dir = TempDir::new("espeak");
    let wav = dir.path().join("sentences.wav");
    let reference = SENTENCES.join(" ");
    let made = Command::new("espeak-ng")
        .args(["-v", "en-us", "-s", "150", "-w"])
        .arg(&wav)
        .arg(&reference)
        .output();
    let made = match made {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "espeak-ng is not installed, and this test needs it to make its speech: \
             install it (Debian/Ubuntu: `sudo apt-get install espeak-ng`; packaging/setup-debian.sh does)"
        ),
        Err(e) => panic!("cannot run espeak-ng: {e}"),
    };
    assert!(made.status.success(), "espeak-ng failed: {}", String::from_utf8_lossy(&made.stderr));
    let size = fs::metadata(&wav).map(|m| m.len()).unwrap_or(0);
    assert!(size > 100_000, "espeak-ng wrote {size} bytes to {}", wav.display());

    let run = transcribe(dir.path(), &["transcribe", "--json", "sentences.wav"]);
    assert_eq!(run.code, Some(0), "stderr: {}", run.stderr);
    let doc: serde_json::Value = serde_json::from_str(&run.stdout).expect("--json output parses");
    let file = &doc["files"][0];
    let audio = file["audio_seconds"].as_f64().expect("audio_seconds");
    assert!(audio > 5.0 && audio < 30.0, "one window of speech: {audio} s");
    let segments = file["segments"].as_array().expect("segments");
    let hypothesis: Vec<&str> = segments.iter().map(|s| s["text"].as_str().expect("text")).collect();
    let hypothesis = hypothesis.join(" ");
    assert_eq!(normalised(&hypothesis), normalised(file["text"].as_str().unwrap()), "segments = text");
    let wer = word_error_rate(&reference, &hypothesis);
    println!("espeak-ng reference:  {reference}");
    println!("transcript:           {hypothesis}");
    println!("word error rate:      {:.1} % ({} reference words)", wer * 100.0, words(&reference).len());
    assert!(wer <= 0.25, "word error rate {:.1} % > 25 %\nreference:  {reference}\nhypothesis: {hypothesis}", wer * 100.0);
}
