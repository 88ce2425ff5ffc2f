//! The live driver and session on scripted speech, no GPU: a recognizer that "hears" the
//! words of a script whose audio lies in the buffer (a word cut off at the buffer's end
//! comes out garbled, differently each time, as Whisper's last word flickers), and audio
//! made of tone bursts where the words are, so that the voice gate sees them.

use std::sync::{Arc, Mutex};

use super::*;

const RATE: usize = 16_000;

#[derive(Clone, Debug)]
struct ScriptWord {
    start: f64,
    end: f64,
    text: &'static str,
    segment: usize,
}

/// Sentences starting at given seconds; each word lasts 0.35 s with 0.1 s gaps.
fn script(sentences: &[(f64, &'static str)]) -> Vec<ScriptWord> {
    let mut words = Vec::new();
    for (si, (start, text)) in sentences.iter().enumerate() {
        let mut t = *start;
        for w in text.split_whitespace() {
            words.push(ScriptWord { start: t, end: t + 0.35, text: w, segment: si });
            t += 0.45;
        }
    }
    words
}

fn script_text(words: &[ScriptWord]) -> String {
    words.iter().map(|w| w.text).collect::<Vec<_>>().join(" ")
}

/// `seconds` of audio at `rate`: a -17 dBFS tone during each word, `noise` elsewhere.
fn audio(words: &[ScriptWord], seconds: f64, rate: usize, noise: f32) -> Vec<f32> {
    let n = (seconds * rate as f64) as usize;
    let mut x: Vec<f32> = (0..n).map(|i| noise * (((i * 7919) % 1001) as f32 / 500.0 - 1.0)).collect();
    for w in words {
        let (a, b) = ((w.start * rate as f64) as usize, ((w.end * rate as f64) as usize).min(n));
        for (i, v) in x.iter_mut().enumerate().take(b).skip(a) {
            *v += 0.2 * (2.0 * std::f32::consts::PI * 300.0 * i as f32 / rate as f32).sin();
        }
    }
    x
}

#[derive(Clone, Debug)]
struct Call {
    offset: f64,
    seconds: f64,
    prompt: String,
}

struct ScriptRecognizer {
    words: Vec<ScriptWord>,
    calls: Arc<Mutex<Vec<Call>>>,
    /// Fail the n-th call (1-based) with this error.
    fail_at: Option<(usize, fn() -> Error)>,
}

impl ScriptRecognizer {
    fn new(words: &[ScriptWord]) -> Self {
        ScriptRecognizer { words: words.to_vec(), calls: Arc::default(), fail_at: None }
    }
}

impl Recognizer for ScriptRecognizer {
    fn recognize(&mut self, req: Request<'_>) -> Result<Vec<HypSegment>> {
        let off = req.offset_seconds;
        let seconds = req.samples.len() as f64 / RATE as f64;
        let mut calls = self.calls.lock().unwrap();
        calls.push(Call { offset: off, seconds, prompt: req.prompt.to_string() });
        let n = calls.len();
        if let Some((at, err)) = self.fail_at {
            if at == n {
                return Err(err());
            }
        }
        let end = off + seconds;
        let mut segs: Vec<(usize, HypSegment)> = Vec::new();
        for w in self.words.iter().filter(|w| w.start >= off - 0.05 && w.start < end) {
            let text = if w.end <= end { w.text.to_string() } else { format!("zz{n}") };
            match segs.last_mut() {
                Some((s, seg)) if *s == w.segment => {
                    seg.text.push(' ');
                    seg.text.push_str(&text);
                    seg.end = w.end - off;
                }
                _ => segs.push((w.segment, HypSegment { start: w.start - off, end: w.end - off, text: format!(" {text}") })),
            }
        }
        Ok(segs.into_iter().map(|(_, s)| s).collect())
    }
}

/// Delivers fixed pieces per poll (deterministic, no clock); fails at `fail_at` samples.
struct ChunkSource {
    samples: Vec<f32>,
    rate: u32,
    chunk: usize,
    pos: usize,
    fail_at: Option<usize>,
}

impl ChunkSource {
    fn new(samples: Vec<f32>, rate: usize) -> Self {
        // 100 ms pieces, like a device buffer (larger than the usual 10 ms, to keep tests fast).
        ChunkSource { samples, rate: rate as u32, chunk: rate / 10, pos: 0, fail_at: None }
    }
}

impl AudioSource for ChunkSource {
    fn sample_rate(&self) -> u32 {
        self.rate
    }
    fn poll(&mut self, out: &mut Vec<f32>) -> Result<SourceState> {
        if self.fail_at.is_some_and(|f| self.pos >= f) {
            return Err(Error::Microphone("the microphone was unplugged".into()));
        }
        let end = (self.pos + self.chunk).min(self.samples.len());
        out.extend_from_slice(&self.samples[self.pos..end]);
        self.pos = end;
        Ok(if end == self.samples.len() { SourceState::Ended } else { SourceState::Running })
    }
}

/// Run and check the invariants every run must keep: committed text only grows, exactly
/// one final update, which is the last and equals the result.
fn run(
    rec: &mut ScriptRecognizer,
    src: &mut ChunkSource,
    opts: &LiveOptions,
    stop: &CancelFlag,
    mut hook: impl FnMut(&LiveUpdate),
) -> (Result<LiveUpdate, LiveFailure>, Vec<LiveUpdate>) {
    let mut updates: Vec<LiveUpdate> = Vec::new();
    let res = run_live_with(rec, src, opts, stop, &mut |u| {
        hook(u);
        updates.push(u.clone());
    });
    for pair in updates.windows(2) {
        assert!(
            pair[1].committed.starts_with(&pair[0].committed),
            "committed text changed:\n {:?}\n {:?}",
            pair[0].committed,
            pair[1].committed
        );
    }
    assert_eq!(updates.iter().filter(|u| u.finished).count(), 1);
    let last = updates.last().expect("at least the final update");
    assert!(last.finished);
    match &res {
        Ok(u) => assert_eq!(u, last),
        Err(f) => assert_eq!(&f.last, last),
    }
    (res, updates)
}

#[test]
fn live_commits_the_script_once_and_only_appends() {
    // Two sentences, a 4 s pause, a third: at 16 kHz and through the resampler at 44.1 kHz.
    let words = script(&[
        (0.4, "And so, my fellow Americans,"),
        (3.0, "ask not what your country can do for you,"),
        (11.2, "ask what you can do for your country."),
    ]);
    let total = 15.5;
    for &rate in &[16_000usize, 44_100] {
        let mut rec = ScriptRecognizer::new(&words);
        let mut src = ChunkSource::new(audio(&words, total, rate, 0.0), rate);
        let (res, updates) = run(&mut rec, &mut src, &LiveOptions::default(), &CancelFlag::new(), |_| {});
        let last = res.expect("the run succeeds");
        assert_eq!(last.committed, script_text(&words), "{rate} Hz");
        assert_eq!(last.tentative, "");
        assert!((last.received_seconds - total).abs() < 1e-3, "{}", last.received_seconds);
        // Words were committed along the way, not all at the end.
        let before_end: Vec<&LiveUpdate> = updates.iter().filter(|u| !u.finished && !u.newly_committed.is_empty()).collect();
        assert!(before_end.len() >= 5, "{rate} Hz: {} committing updates", before_end.len());
        assert!(before_end.iter().all(|u| u.latency.is_some() && u.decode_time.is_some()));
        // The pause: no decode of it once everything before it was committed, and the buffer
        // was emptied, so the third sentence is decoded from just before its start with the
        // first two as the prompt.
        let calls = rec.calls.lock().unwrap();
        let in_pause = calls.iter().filter(|c| c.offset + c.seconds > 8.5 && c.offset + c.seconds < 11.2).count();
        assert_eq!(in_pause, 0, "{rate} Hz: decodes during the pause: {calls:?}");
        let third = calls.iter().find(|c| c.offset + c.seconds > 11.5).expect("a decode of the third sentence");
        assert!(third.offset > 7.0, "{rate} Hz: the buffer was not emptied in the pause: {third:?}");
        assert!(third.prompt.ends_with("for you,"), "{rate} Hz: prompt {:?}", third.prompt);
        assert_eq!(last.decodes, calls.len());
    }
}

#[test]
fn live_long_speech_is_trimmed_at_segment_ends_and_stays_under_30_s() {
    // 80 s of talk in 4 s sentences with short gaps: no pause to reset at, so only the
    // segment trimming keeps the buffer short.
    const S: &str = "one two three four five six seven eight";
    let sentences: Vec<(f64, &'static str)> = (0..20).map(|i| (0.3 + i as f64 * 3.9, S)).collect();
    let words = script(&sentences);
    let mut rec = ScriptRecognizer::new(&words);
    let mut src = ChunkSource::new(audio(&words, 79.0, RATE, 0.0), RATE);
    let opts = LiveOptions::default();
    let (res, _) = run(&mut rec, &mut src, &opts, &CancelFlag::new(), |_| {});
    let last = res.unwrap();
    assert_eq!(last.committed, script_text(&words));
    let calls = rec.calls.lock().unwrap();
    let longest = calls.iter().map(|c| c.seconds).fold(0.0, f64::max);
    // Trimmed past 15 s at a segment end; a step of audio may come on top.
    assert!(longest <= opts.trim_after_seconds + 4.5, "longest decode {longest} s");
    assert!(longest > opts.trim_after_seconds, "never needed a trim? {longest} s");
    assert!(calls.iter().filter(|c| c.offset > 0.0).count() > 10);
    // Each trim is at a segment's end: the next buffer starts in the gap before a sentence.
    for c in calls.iter().filter(|c| c.offset > 0.0) {
        // A sentence lasts 7 * 0.45 + 0.35 = 3.5 s.
        let into = (c.offset - 0.3).rem_euclid(3.9);
        assert!((into - 3.5).abs() < 0.01, "buffer starts {into:.2} s into a sentence: {c:?}");
    }
    // The prompt is the committed text before the buffer: the end of the script so far.
    for c in calls.iter().filter(|c| c.offset > 0.0) {
        assert!(!c.prompt.is_empty() && c.prompt.len() <= opts.prompt_chars + 10, "{c:?}");
        assert!(c.prompt.ends_with("seven eight"), "{c:?}");
    }
}

#[test]
fn live_silence_is_never_decoded() {
    for noise in [0.0f32, 0.001] {
        let mut rec = ScriptRecognizer::new(&[]);
        let mut src = ChunkSource::new(audio(&[], 40.0, 48_000, noise), 48_000);
        let (res, updates) = run(&mut rec, &mut src, &LiveOptions::default(), &CancelFlag::new(), |_| {});
        let last = res.unwrap();
        assert_eq!(rec.calls.lock().unwrap().len(), 0, "noise {noise}");
        assert_eq!((last.decodes, last.committed.as_str()), (0, ""));
        // Silence does not pile up in the buffer either.
        let longest = updates.iter().map(|u| u.buffer_seconds).fold(0.0, f64::max);
        assert!(longest < 2.5, "buffer of {longest} s of silence");
        assert!(updates.iter().all(|u| !u.voiced));
    }
}

#[test]
fn live_an_unplugged_source_keeps_the_text() {
    let words = script(&[(0.4, "And so, my fellow Americans,"), (3.0, "ask not what your country can do")]);
    let mut rec = ScriptRecognizer::new(&words);
    let mut src = ChunkSource::new(audio(&words, 8.0, RATE, 0.0), RATE);
    // Fails 4.05 s in, in the middle of "what": the last decode (at 4.0 s) heard it cut
    // off, and the window showed that garbled guess as tentative.
    src.fail_at = Some(4 * RATE + RATE / 20);
    let mut seen_tentative = String::new();
    let (res, _) = run(&mut rec, &mut src, &LiveOptions::default(), &CancelFlag::new(), |u| {
        if !u.finished {
            seen_tentative = format!("{} {}", u.committed, u.tentative);
        }
    });
    let f = res.expect_err("the source failed");
    assert!(matches!(f.error, Error::Microphone(_)), "{}", f.error);
    // Everything shown before the failure (committed and tentative) is kept, committed.
    assert_eq!(f.last.committed.trim(), seen_tentative.trim());
    assert!(f.last.committed.starts_with("And so, my fellow Americans, ask not"), "{:?}", f.last.committed);
    assert!(f.last.finished && f.last.tentative.is_empty());
}

#[test]
fn live_a_failed_decode_keeps_the_text() {
    let words = script(&[(0.4, "And so, my fellow Americans,"), (3.0, "ask not what your country can do")]);
    let mut rec = ScriptRecognizer::new(&words);
    rec.fail_at = Some((6, || Error::DeviceLost("test".into())));
    let mut src = ChunkSource::new(audio(&words, 8.0, RATE, 0.0), RATE);
    let (res, _) = run(&mut rec, &mut src, &LiveOptions::default(), &CancelFlag::new(), |_| {});
    let f = res.expect_err("the decode failed");
    assert!(matches!(f.error, Error::DeviceLost(_)));
    assert!(f.last.committed.starts_with("And so,"), "{:?}", f.last.committed);
    assert_eq!(rec.calls.lock().unwrap().len(), 6, "no decode after the failure");
}

#[test]
fn live_stop_ends_the_run_and_keeps_the_text() {
    let words = script(&[(0.4, "And so, my fellow Americans,"), (3.0, "ask not what your country can do")]);
    let mut rec = ScriptRecognizer::new(&words);
    let mut src = ChunkSource::new(audio(&words, 8.0, RATE, 0.0), RATE);
    let stop = CancelFlag::new();
    let mut shown = String::new();
    let (res, _) = run(&mut rec, &mut src, &LiveOptions::default(), &stop.clone(), |u| {
        if !u.finished && u.committed.contains("fellow") {
            shown = format!("{} {}", u.committed, u.tentative);
            stop.set();
        }
    });
    let last = res.expect("Stop is not a failure");
    assert_eq!(last.committed.trim(), shown.trim());
    assert!(!last.committed.contains("country"), "ran on after Stop: {:?}", last.committed);
    assert!(src.pos < src.samples.len());
}

#[test]
fn live_stop_during_a_decode_cancels_it() {
    let words = script(&[(0.4, "And so, my fellow Americans,")]);
    let rec = ScriptRecognizer::new(&words);
    let stop = CancelFlag::new();
    // The 4th decode sees the switch set (as the real decoder checks it per token).
    let calls = rec.calls.clone();
    let stop2 = stop.clone();
    struct Stopping {
        inner: ScriptRecognizer,
        stop: CancelFlag,
        calls: Arc<Mutex<Vec<Call>>>,
    }
    impl Recognizer for Stopping {
        fn recognize(&mut self, req: Request<'_>) -> Result<Vec<HypSegment>> {
            if self.calls.lock().unwrap().len() == 3 {
                self.stop.set();
            }
            if req.cancel.is_set() {
                return Err(Error::Cancelled);
            }
            self.inner.recognize(req)
        }
    }
    let mut rec = Stopping { inner: rec, stop: stop2, calls };
    let mut src = ChunkSource::new(audio(&words, 4.0, RATE, 0.0), RATE);
    let res = run_live_with(&mut rec, &mut src, &LiveOptions::default(), &stop, &mut |_| {});
    let last = res.expect("a cancelled decode after Stop is not a failure");
    assert!(last.finished);
    assert_eq!(rec.calls.lock().unwrap().len(), 3);
    assert!(!last.committed.is_empty());
}

#[test]
fn live_a_source_at_an_impossible_rate_is_an_error() {
    let mut rec = ScriptRecognizer::new(&[]);
    let mut src = ChunkSource::new(vec![0.0; 100], 0);
    src.rate = 0;
    src.chunk = 10;
    let f = run_live_with(&mut rec, &mut src, &LiveOptions::default(), &CancelFlag::new(), &mut |_| {}).unwrap_err();
    assert!(matches!(f.error, Error::AudioData(_)), "{}", f.error);
    assert!(f.last.finished);
}
