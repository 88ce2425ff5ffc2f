//! `verbatim`: speech to text on your own GPU. With no subcommand (or `gui`) the window
//! opens, with any files named on the command line queued (as a desktop "Open with" does);
//! `transcribe` and the other subcommands are the command line.
//!
//! Exit status: 0 when every file was transcribed, 1 when any failed (the others are
//! still done), 2 for a usage error. Every failure is one sentence on stderr.

mod bench;
mod export;
mod gui;
mod lm_check;
mod mic;
mod model_fetch;
mod transcribe;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "verbatim", version, about = "Speech to text on your own GPU", args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// With no subcommand: open the window with these audio files queued.
    #[command(flatten)]
    gui: gui::Args,
}

#[derive(Subcommand)]
enum Command {
    /// Open the window (the default when no subcommand is given).
    Gui(gui::Args),
    /// Transcribe audio files and print the text.
    Transcribe(transcribe::Args),
    /// Check the Nemotron-H GPU frame against a fixture's expected outputs
    /// (MODEL_DIR EXPECTED.safetensors); exit 0 only within bounds.
    LmCheck(lm_check::Args),
    /// Measure the Whisper path on this GPU: encoder, prefill and decode times, dispatches
    /// per step, the per-kernel table against a copy ceiling (see app/src/bench.rs).
    Bench(bench::Args),
}

fn main() -> ExitCode {
    install_panic_hook();
    ensure_runtime_dir();
    let cli = Cli::parse(); // usage errors: clap prints them and exits with 2
    match cli.command {
        Some(Command::Gui(args)) => gui::run(args),
        Some(Command::Transcribe(args)) => transcribe::run(args),
        Some(Command::LmCheck(args)) => lm_check::run(args),
        Some(Command::Bench(args)) => bench::run(args),
        None => gui::run(cli.gui),
    }
}

/// Whether a finished command may leave without tearing its GPU device down
/// (`VERBATIM_EXIT_DROP=1` tears it down, as a library user's drop does). Dropping the
/// device took ~65 ms at the end of a ~280 ms warm `transcribe` of an 11 s file on the lent
/// H100s, and leaking it only moved that into the process's exit handlers (eighteenth
/// session); leaving through `_exit` skips the driver's part: warm runs 15 ms shorter on
/// average (bench/RESULTS.md, 2026-12-06, nineteenth session). The rest is the kernel's,
/// closing the device for any ending process.
pub(crate) fn exit_fast() -> bool {
    std::env::var("VERBATIM_EXIT_DROP").map_or(true, |v| v != "1")
}

/// Flush stdout and stderr and end the process now with `code`, without running exit
/// handlers or destructors (the GPU driver's among them): the kernel frees the device's
/// memory and handles as for any ending process. Only once every output is written: files
/// are written whole with `fs::write`, and stdout is flushed here.
pub(crate) fn exit_now(code: i32) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    #[cfg(unix)]
    {
        extern "C" {
            fn _exit(status: i32) -> !;
        }
        // SAFETY: _exit only ends the process; nothing of ours is left half-written.
        unsafe { _exit(code) }
    }
    #[cfg(not(unix))]
    std::process::exit(code)
}

/// The last resort behind "errors are values": should anything panic anyway, print one
/// line instead of Rust's message and backtrace. On the main thread, then exit 1 (the
/// default exit code of a panicking main thread is 101, which no caller expects). On
/// another thread (the window's GPU worker) the panic unwinds to that thread's
/// `catch_unwind`, which reports it in the window: the window and its transcripts stay.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("unknown panic");
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("verbatim: internal error: {what}{at} (please report it)");
        if std::thread::current().name() == Some("main") {
            std::process::exit(1);
        }
    }));
}

/// Mesa's Vulkan drivers (lavapipe included) print "XDG_RUNTIME_DIR is invalid or not
/// set in the environment" several times per device when it is missing, as it is under
/// ssh, cron and CI containers: noise that would bury our one-line errors. Point it at a
/// private 0700 directory, as `packaging/setup-debian.sh` does, before any thread starts
/// (setting the environment is only sound while the process is single-threaded).
fn ensure_runtime_dir() {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        if std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|v| !v.is_empty()) {
            return;
        }
        // Our uid without libc: /proc/self belongs to the process's effective user.
        let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return };
        let dir = std::path::PathBuf::from(format!("/tmp/runtime-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        // Use it only if it is a real directory of ours (not a symlink another user
        // planted), then make sure it is private.
        let Ok(meta) = std::fs::symlink_metadata(&dir) else { return };
        if meta.is_dir()
            && meta.uid() == uid
            && std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).is_ok()
        {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}
