//! The window's logic through egui_kittest (the egui project's harness), drawn with wgpu on
//! the adapter the harness picks (lavapipe in CI) and running the real model on that same
//! device: a dropped file's transcript appears in the view, a bad file's error appears
//! and the queue goes on, a cancelled file stops, exports parse back.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use egui_kittest::kittest::Queryable;
use egui_kittest::Harness;

use super::app::{EntryState, ExportFormat};
use super::settings::Settings;
use super::{wgpu_setup, Automation, Startup, VerbatimApp};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A file dropped on the window, as winit hands it to egui.
#[derive(Debug)]
struct Dropped(PathBuf);

impl eframe::egui::DroppedFile for Dropped {
    fn path(&self) -> &Path {
        &self.0
    }
    fn bytes(&self) -> Result<Vec<u8>, String> {
        std::fs::read(&self.0).map_err(|e| e.to_string())
    }
}

fn harness() -> Harness<'static, VerbatimApp> {
    let startup = Startup {
        files: vec![],
        model_override: Some(engine::models::whisper::default_model_dir()),
        settings: Settings::default(),
        settings_path: None,
        notes: vec![],
        automation: Automation::default(),
    };
    // The engine's own device descriptor and adapter choice, as the real window uses; the
    // harness prefers a software adapter when it has the choice, so CI and GPU machines
    // alike run on lavapipe here unless VERBATIM_ADAPTER says otherwise.
    let adapter = std::env::var("VERBATIM_ADAPTER").ok().or(Some("llvmpipe".into()));
    Harness::builder()
        .with_size([1180.0, 780.0])
        .wgpu_setup(wgpu_setup(adapter))
        .build_eframe(move |cc| VerbatimApp::new(cc, startup))
}

/// Step the window until `done` holds (the worker runs on its own thread meanwhile).
fn step_until(h: &mut Harness<'static, VerbatimApp>, what: &str, limit: Duration, done: impl Fn(&VerbatimApp) -> bool) {
    let t = Instant::now();
    while !done(h.state()) {
        assert!(t.elapsed() < limit, "timed out after {limit:?} waiting for {what}; notes: {:?}", h.state().notes);
        h.step();
        std::thread::sleep(Duration::from_millis(20));
    }
    // A few more frames so what arrived is laid out.
    h.run_steps(3);
}

fn drop_file(h: &mut Harness<'static, VerbatimApp>, path: PathBuf) {
    h.input_mut().dropped_files.push(Arc::new(Dropped(path)));
    h.step();
}

/// SubRip back to (start ms, end ms, text), strictly.
fn parse_srt(doc: &str) -> Vec<(u64, u64, String)> {
    let clock = |s: &str| -> u64 {
        let (hms, frac) = s.split_once(',').unwrap_or_else(|| panic!("no ',' in {s:?}"));
        let p: Vec<u64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        assert!(p.len() == 3 && frac.len() == 3, "{s:?}");
        ((p[0] * 60 + p[1]) * 60 + p[2]) * 1000 + frac.parse::<u64>().unwrap()
    };
    doc.split("\n\n")
        .filter(|b| !b.is_empty())
        .enumerate()
        .map(|(i, block)| {
            let mut lines = block.lines();
            assert_eq!(lines.next(), Some((i + 1).to_string().as_str()), "{block:?}");
            let (a, b) = lines.next().unwrap().split_once(" --> ").unwrap();
            (clock(a), clock(b), lines.collect::<Vec<_>>().join("\n"))
        })
        .collect()
}

/// WebVTT back to (start ms, end ms, text), strictly.
fn parse_vtt(doc: &str) -> Vec<(u64, u64, String)> {
    let body = doc.strip_prefix("WEBVTT\n\n").expect("WEBVTT header");
    let clock = |s: &str| -> u64 {
        let (hms, frac) = s.split_once('.').unwrap();
        let p: Vec<u64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
        assert!(p.len() == 3 && frac.len() == 3, "{s:?}");
        ((p[0] * 60 + p[1]) * 60 + p[2]) * 1000 + frac.parse::<u64>().unwrap()
    };
    body.split("\n\n")
        .filter(|b| !b.is_empty())
        .map(|block| {
            let mut lines = block.lines();
            let (a, b) = lines.next().unwrap().split_once(" --> ").unwrap();
            (clock(a), clock(b), lines.collect::<Vec<_>>().join("\n"))
        })
        .collect()
}

#[test]
fn dropped_files_transcribe_fail_cancel_and_export() {
    let tmp = std::env::temp_dir().join(format!("verbatim-gui-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let bad = tmp.join("notes.wav");
    std::fs::write(&bad, "this is text, not audio\n").unwrap();
    let jfk = workspace_root().join("assets/jfk.wav");

    let mut h = harness();
    step_until(&mut h, "the model", Duration::from_secs(120), |a| {
        matches!(a.model_state(), super::worker::ModelState::Ready { .. } | super::worker::ModelState::Failed(_))
    });
    assert!(matches!(h.state().model_state(), super::worker::ModelState::Ready { .. }), "{:?}", h.state().notes);

    // A bad file first: its error shows, and the queue goes on to the good one.
    drop_file(&mut h, bad.clone());
    drop_file(&mut h, jfk.clone());
    // A third (the same sample again), cancelled while it waits.
    h.state_mut().queue_files(vec![jfk.clone()]);
    let third = h.state().entries[2].id;
    h.state_mut().cancel(third);
    step_until(&mut h, "the queue", Duration::from_secs(600), VerbatimApp::queue_done);

    let app = h.state();
    assert_eq!(app.entries.len(), 3);
    match &app.entries[0].state {
        EntryState::Failed(msg) => assert!(msg.contains("notes.wav") && msg.contains("not usable audio"), "{msg}"),
        other => panic!("the text file should fail, got {other:?}"),
    }
    let EntryState::Done(r) = &app.entries[1].state else { panic!("jfk: {:?}", app.entries[1].state) };
    let r = r.clone();
    assert!(matches!(app.entries[2].state, EntryState::Cancelled), "{:?}", app.entries[2].state);
    assert_eq!(
        r.transcript.text,
        "And so my fellow Americans ask not what your country can do for you ask what you can do for your country"
    );
    for k in &r.kernels {
        println!("{:<16}{:<12}{:>6}{:>12.3} ms", k.kernel, k.stage, k.dispatches, k.gpu_ns / 1e6);
    }
    // The per-kernel records are there, with GPU times when the adapter has timestamps.
    assert!(r.kernels.iter().any(|k| k.kernel.starts_with("gemm")), "{:?}", r.kernels);
    if r.timed {
        assert!(r.kernels.iter().all(|k| k.gpu_ns > 0.0), "{:?}", r.kernels);
    }
    let jfk_id = app.entries[1].id;

    // What the window shows: the error, the transcript, the stage bar and the kernel table.
    h.get_by_label_contains("not usable audio");
    h.state_mut().select(jfk_id);
    h.run_steps(3);
    h.get_by_label_contains("ask not what your country can do for you");
    h.get_by_label_contains("ask what you can do for your country");
    h.get_by_label_contains("real-time factor");
    assert!(h.get_all_by_label_contains("encoder").count() >= 2, "the stage legend and the kernel rows");
    assert!(h.get_all_by_label("gemm_f16").count() >= 1);

    // Exports parse back, with the segments' times and text.
    let app = h.state();
    let srt = tmp.join("jfk.srt");
    app.export_to(jfk_id, ExportFormat::Srt, &srt).unwrap();
    let cues = parse_srt(&std::fs::read_to_string(&srt).unwrap());
    let segs = &r.transcript.segments;
    assert_eq!(cues.len(), segs.len());
    for (c, s) in cues.iter().zip(segs) {
        assert_eq!((c.0, c.1), ((s.start * 1000.0).round() as u64, (s.end * 1000.0).round() as u64));
        assert_eq!(c.2, s.text.trim());
    }
    let vtt = tmp.join("jfk.vtt");
    app.export_to(jfk_id, ExportFormat::Vtt, &vtt).unwrap();
    assert_eq!(parse_vtt(&std::fs::read_to_string(&vtt).unwrap()), cues);
    let json = tmp.join("jfk.json");
    app.export_to(jfk_id, ExportFormat::Json, &json).unwrap();
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["files"][0]["text"], r.transcript.text.as_str());
    let txt = tmp.join("jfk.txt");
    app.export_to(jfk_id, ExportFormat::Txt, &txt).unwrap();
    assert_eq!(std::fs::read_to_string(&txt).unwrap().trim(), r.transcript.text);
    // A file without a transcript cannot be exported (and says so).
    assert!(app.export_to(app.entries[0].id, ExportFormat::Srt, &tmp.join("bad.srt")).is_err());
    let _ = std::fs::remove_dir_all(&tmp);
}

/// A missing model is a message in the window, not a crash; files then fail with it.
#[test]
fn missing_model_is_a_message() {
    let startup = Startup {
        files: vec![workspace_root().join("assets/jfk.wav")],
        model_override: Some("/nonexistent/verbatim-model".into()),
        settings: Settings::default(),
        settings_path: None,
        notes: vec![],
        automation: Automation::default(),
    };
    let mut h = Harness::builder()
        .with_size([900.0, 600.0])
        .wgpu_setup(wgpu_setup(Some("llvmpipe".into())))
        .build_eframe(move |cc| VerbatimApp::new(cc, startup));
    step_until(&mut h, "the queue", Duration::from_secs(60), VerbatimApp::queue_done);
    h.get_by_label_contains("The model could not be loaded");
    let EntryState::Failed(msg) = &h.state().entries[0].state else { panic!("{:?}", h.state().entries[0].state) };
    assert!(msg.contains("/nonexistent/verbatim-model"), "{msg}");
}

fn normalised(text: &str) -> String {
    text.to_lowercase()
        .chars()
        .map(|c| if c.is_alphanumeric() || c == '\'' { c } else { ' ' })
        .collect::<String>()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The live panel fed by the sample at real-time pace (the microphone's code path from the
/// source on): the committed text grows only, and in the end is the file's transcript.
#[test]
fn live_panel_from_a_file_commits_the_transcript() {
    let mut h = harness();
    step_until(&mut h, "the model", Duration::from_secs(120), |a| {
        matches!(a.model_state(), super::worker::ModelState::Ready { .. } | super::worker::ModelState::Failed(_))
    });
    let t = Instant::now();
    h.state_mut().start_live_file(workspace_root().join("assets/jfk.wav"));
    step_until(&mut h, "the live session", Duration::from_secs(900), |a| !a.live().running());
    println!("live session: {:.1} s for 11 s of audio", t.elapsed().as_secs_f64());
    let live = h.state().live();
    assert!(live.error().is_none(), "{:?}", live.error());
    assert!(!live.rewrote_committed, "committed text changed");
    assert_eq!(
        normalised(live.committed()),
        normalised("And so my fellow Americans ask not what your country can do for you ask what you can do for your country")
    );
    h.get_by_label_contains("ask what you can do for your country");
}
