//! Live mode on the real model (lavapipe in CI), through the path the microphone takes:
//! a file-backed source at real-time pace -> run_live -> LocalAgreement.

use std::time::Duration;

use engine::audio::decode_wav_file;
use engine::decode::CancelFlag;
use engine::live::gate::{GateOptions, VoiceGate, FRAME};
use engine::live::{run_live, FileSource, LiveOptions, LiveUpdate};
use engine::pipeline::Options;

mod common;
use common::{normalise, repo, transcriber};

/// Every update only appends to the committed text, and exactly the last one is final.
fn check_append_only(updates: &[LiveUpdate]) {
    for pair in updates.windows(2) {
        assert!(
            pair[1].committed.starts_with(&pair[0].committed),
            "committed text changed:\n {:?}\n {:?}",
            pair[0].committed,
            pair[1].committed
        );
    }
    assert!(updates.last().is_some_and(|u| u.finished));
    assert_eq!(updates.iter().filter(|u| u.finished).count(), 1);
}

#[test]
fn live_jfk_at_real_time_commits_the_file_transcript() {
    let path = repo().join("assets/jfk.wav");
    let mut t = transcriber().lock().unwrap();
    // The file path's transcript (also warms the pipelines, so the live run is not charged
    // for first-use compilation).
    let want = t.transcribe_file(&path, &Options::default()).unwrap().text;

    // Where the speech ends, by the same gate the session uses.
    let audio = decode_wav_file(&path).unwrap().to_mono_16k().unwrap();
    let mut flags = Vec::new();
    VoiceGate::new(GateOptions::default()).push(&audio, &mut flags);
    let speech_end = flags.iter().rposition(|v| *v).map_or(0.0, |f| ((f + 1) * FRAME) as f64 / 16_000.0);

    let mut src = FileSource::open(&path).unwrap();
    let mut updates: Vec<LiveUpdate> = Vec::new();
    let last = run_live(&mut t, &mut src, &LiveOptions::default(), &CancelFlag::new(), &mut |u| {
        if u.decode_time.is_some() || !u.newly_committed.is_empty() || u.finished {
            eprintln!(
                "{:6.2} s wall, {:5.2} s audio, decode {:>8}, committed +{:?}, tentative {:?}, latency {}",
                u.elapsed.as_secs_f64(),
                u.received_seconds,
                u.decode_time.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64())),
                u.newly_committed,
                u.tentative,
                u.latency.map_or("-".into(), |d| format!("{:.2} s", d.as_secs_f64())),
            );
        }
        updates.push(u.clone());
    })
    .expect("the live run succeeds");
    check_append_only(&updates);
    assert_eq!(&last, updates.last().unwrap());
    assert_eq!(normalise(&last.committed), normalise(&want), "live vs file transcript");
    assert!((last.received_seconds - 11.0).abs() < 0.01, "{}", last.received_seconds);
    assert!(last.decodes >= 1 && last.tentative.is_empty());

    // Speech end -> committed: the source delivers audio second t at about t seconds after
    // the run starts, so the wall time of the update that committed the last word minus
    // the speech end is the delay a speaker would see. Reported, not asserted: on lavapipe
    // one decode takes ~20 s (encoder), on a GPU a few tens of ms.
    let done = updates.iter().find(|u| normalise(&u.committed) == normalise(&want)).unwrap();
    let longest_decode = updates.iter().filter_map(|u| u.decode_time).max().unwrap_or(Duration::ZERO);
    eprintln!(
        "speech ends at {speech_end:.2} s; committed in full at {:.2} s wall: latency {:.2} s \
         (reported for the last commit: {:?}); {} decodes, longest {:.2} s",
        done.elapsed.as_secs_f64(),
        done.elapsed.as_secs_f64() - speech_end,
        done.latency,
        last.decodes,
        longest_decode.as_secs_f64(),
    );
}

#[test]
fn live_silence_and_faint_noise_give_no_text_and_no_decodes() {
    // 6 s of digital silence then 6 s of -60 dBFS noise at 48 kHz, delivered 4x real time.
    let mut x = vec![0.0f32; 48_000 * 6];
    let mut r = 1u32;
    x.extend((0..48_000 * 6).map(|_| {
        r = r.wrapping_mul(1664525).wrapping_add(1013904223);
        0.0017 * (2.0 * ((r >> 8) as f32 / (1u32 << 24) as f32) - 1.0)
    }));
    let mut src = FileSource::from_samples(x, 48_000).with_speed(4.0);
    let mut t = transcriber().lock().unwrap();
    let mut updates = Vec::new();
    let last = run_live(&mut t, &mut src, &LiveOptions::default(), &CancelFlag::new(), &mut |u| updates.push(u.clone()))
        .expect("the live run succeeds");
    check_append_only(&updates);
    assert_eq!(last.committed, "");
    assert_eq!(last.decodes, 0, "silence was decoded");
    assert!((last.received_seconds - 12.0).abs() < 0.01);
    assert!(updates.len() > 10, "level updates while idle: {}", updates.len());
}

/// What a GPU that keeps up would do: a decode after every 0.5 s of audio (the session
/// driven step by step, so the decode time does not matter). Slow on lavapipe (~22
/// decodes), hence ignored; run it by hand:
/// `cargo test -p verbatim-engine --test live -- --ignored --nocapture`.
/// Prints, per commit, how far the audio had got past the end of the committed words:
/// the latency a fast GPU would add to its decode time.
#[test]
#[ignore]
fn live_jfk_every_step_as_a_fast_gpu_would() {
    use engine::live::{LiveSession, Whisper};
    use std::time::Instant;
    let path = repo().join("assets/jfk.wav");
    let mut t = transcriber().lock().unwrap();
    let want = t.transcribe_file(&path, &Options::default()).unwrap().text;
    let audio = decode_wav_file(&path).unwrap().to_mono_16k().unwrap();
    let opts = LiveOptions::default();
    let mut session = LiveSession::new(opts.clone());
    let mut rec = Whisper::new(&mut t, opts.decode.clone());
    let cancel = CancelFlag::new();
    let mut committed = String::new();
    let mut log = |s: &LiveSession, r: &engine::live::session::StepReport, at: f64| {
        assert!(s.committed_text().starts_with(&committed), "committed text changed");
        committed = s.committed_text().to_string();
        let behind = r.newly.last().map(|w| at - w.end);
        eprintln!(
            "audio {at:5.2} s: decode {:6.2} s, +{:?} (audio past its end: {}), tentative {:?}",
            r.decode_time.as_secs_f64(),
            r.newly.iter().map(|w| w.text.as_str()).collect::<Vec<_>>().join(" "),
            behind.map_or("-".into(), |b| format!("{b:.2} s")),
            s.tentative_text(),
        );
    };
    for (i, piece) in audio.chunks(1_600).enumerate() {
        session.push_audio(piece, Instant::now());
        if session.wants_decode() {
            let r = session.step(&mut rec, &cancel, false).unwrap();
            log(&session, &r, (i + 1) as f64 * 0.1);
        }
    }
    let r = session.finish(&mut rec, &cancel).unwrap();
    log(&session, &r, audio.len() as f64 / 16_000.0);
    eprintln!("{} decodes; live: {:?}\nfile: {:?}", session.decodes(), session.committed_text(), want);
    assert_eq!(normalise(session.committed_text()), normalise(&want));
}

/// Records a live session's windows for the draft-policy test
/// (`decode::whisper::tests::live_drafts_on_real_speech_count_their_round_trips`): the
/// prefixes of `VERBATIM_RECORD_WAV` every 0.5 s from 1 s (the last: the whole file), as
/// `verbatim bench`'s live replay decodes them, each window's seconds and chosen tokens,
/// end-of-text last, written as JSON to `VERBATIM_RECORD_OUT`
/// (engine/tests/data/NAME_live_windows.json). The tokens are greedy decoding's, so they
/// do not depend on the drafts. A tool, not a check (~4 minutes for 11 s on lavapipe):
/// `VERBATIM_RECORD_WAV=F VERBATIM_RECORD_OUT=G cargo test --release -p verbatim-engine
/// --test live -- --ignored --nocapture live_windows_recorded`.
#[test]
#[ignore]
fn live_windows_recorded() {
    let (Ok(wav), Ok(out)) = (std::env::var("VERBATIM_RECORD_WAV"), std::env::var("VERBATIM_RECORD_OUT")) else {
        panic!("set VERBATIM_RECORD_WAV (a WAV file) and VERBATIM_RECORD_OUT (the JSON to write)");
    };
    let audio = decode_wav_file(std::path::Path::new(&wav)).unwrap().to_mono_16k().unwrap();
    let ends: Vec<usize> = (2..).map(|i| i * 8_000).take_while(|&e| e < audio.len()).chain([audio.len()]).collect();
    let mut t = transcriber().lock().unwrap();
    let eot = t.tokenizer().special().eot;
    let mut windows = Vec::new();
    for &end in &ends {
        let tx = t.transcribe_samples(&audio[..end], &Options::default(), &mut |_| {}).unwrap();
        let tokens: Vec<u32> = tx.segments.iter().flat_map(|s| s.tokens.iter().copied()).chain([eot]).collect();
        eprintln!("{:.2} s: {}", end as f64 / 16_000.0, tx.text);
        windows.push(serde_json::json!({ "seconds": end as f64 / 16_000.0, "tokens": tokens }));
    }
    std::fs::write(&out, serde_json::to_string_pretty(&serde_json::json!({ "windows": windows })).unwrap()).unwrap();
}
