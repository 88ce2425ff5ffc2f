//! A real window: `verbatim FILE --screenshot PNG --quit-when-done` under Xvfb, drawn and
//! computed on the same wgpu device (lavapipe in CI). The window transcribes the sample,
//! saves a screenshot of itself (transcript, stage bar, kernel table) as a test artifact
//! in `target/test-artifacts/` (never committed), prints what it finished, and closes.
//!
//! Xvfb is required (packaging/setup-debian.sh installs it): a missing Xvfb fails the
//! test with that advice rather than passing silently.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// An Xvfb server on a free display, stopped on drop.
struct Xvfb {
    child: std::process::Child,
    display: String,
}

impl Xvfb {
    fn start() -> Xvfb {
        // -displayfd: Xvfb picks a free display number and writes it to the pipe when ready.
        let mut child = Command::new("Xvfb")
            .args(["-displayfd", "1", "-screen", "0", "1280x860x24", "-nolisten", "tcp"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start Xvfb ({e}); install it with packaging/setup-debian.sh"));
        let mut out = child.stdout.take().unwrap();
        let mut num = String::new();
        let mut byte = [0u8; 1];
        while out.read(&mut byte).map(|n| n == 1).unwrap_or(false) && byte[0] != b'\n' {
            num.push(byte[0] as char);
        }
        assert!(!num.trim().is_empty(), "Xvfb did not report a display");
        Xvfb { child, display: format!(":{}", num.trim()) }
    }
}

impl Drop for Xvfb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn window_under_xvfb_transcribes_and_saves_a_screenshot() {
    let x = Xvfb::start();
    let artifacts = workspace_root().join("target").join("test-artifacts");
    std::fs::create_dir_all(&artifacts).unwrap();
    let png = artifacts.join("window.png");
    let _ = std::fs::remove_file(&png);
    let config = artifacts.join("window-config"); // fresh settings, not the user's

    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_verbatim"))
        .arg(workspace_root().join("assets/jfk.wav"))
        .arg("--model")
        .arg(engine::models::whisper::default_model_dir())
        .arg("--screenshot")
        .arg(&png)
        .arg("--quit-when-done")
        .env("DISPLAY", &x.display)
        .env_remove("WAYLAND_DISPLAY")
        .env("XDG_CONFIG_HOME", &config)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run verbatim");
    // The window should be done in well under 10 minutes even on lavapipe with 2 cores.
    let limit = Duration::from_secs(600);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            panic!("the window did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut stdout = String::new();
    let mut stderr = String::new();
    child.stdout.take().unwrap().read_to_string(&mut stdout).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    println!("window run: {:.1} s\nstdout:\n{stdout}\nstderr:\n{stderr}", t.elapsed().as_secs_f64());
    assert!(status.success(), "status {status:?}\nstderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // What the window finished, as it reports on quitting.
    assert!(
        stdout.contains("jfk.wav: And so my fellow Americans ask not what your country can do for you ask what you can do for your country"),
        "{stdout}"
    );
    let gpu_ms: f64 = stdout
        .lines()
        .find_map(|l| l.split_once("kernel GPU time ms: ").map(|(_, v)| v.trim().parse().unwrap()))
        .unwrap_or_else(|| panic!("no kernel time line in {stdout}"));
    assert!(gpu_ms > 0.0, "the per-kernel table has GPU times: {stdout}");

    // The screenshot: a real image of the window, not a blank one.
    let decoder = png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&png).expect("the screenshot")));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    assert!(info.width >= 640 && info.height >= 420, "{}x{}", info.width, info.height);
    let pixels = &buf[..info.buffer_size()];
    let distinct: std::collections::HashSet<&[u8]> = pixels.chunks(4).collect();
    assert!(distinct.len() > 50, "the screenshot has only {} colours", distinct.len());
    println!("screenshot: {} ({}x{})", png.display(), info.width, info.height);
}
