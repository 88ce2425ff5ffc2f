//! Transcript writers: one line of text, timed lines for the terminal, SubRip (SRT) and
//! WebVTT. Pure functions from cues to a `String`, so the tests can parse every format
//! back and the CLI decides where the text goes.

/// One timed piece of text, as the decoder's segments give it (seconds from the start).
#[derive(Clone, Copy, Debug)]
pub struct Cue<'a> {
    pub start: f64,
    pub end: f64,
    pub text: &'a str,
}

/// The text on a single line: Whisper's segments start with a space and may, rarely,
/// carry newlines; a "one line per file" output must not break on either.
pub fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whole milliseconds, never negative: a NaN or negative time (which a decoder bug could
/// produce) must not turn into a huge unsigned number or a malformed timestamp.
fn millis(seconds: f64) -> u64 {
    if seconds > 0.0 { (seconds * 1000.0).round() as u64 } else { 0 }
}

/// `[hh:]mm:ss<sep>mmm`.
fn clock(ms: u64, sep: char, hours: bool) -> String {
    let (h, m, s, f) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    if hours { format!("{h:02}:{m:02}:{s:02}{sep}{f:03}") } else { format!("{m:02}:{s:02}{sep}{f:03}") }
}

/// A cue's text fit for a subtitle block: lines trimmed, empty lines dropped (a blank
/// line ends a cue in both SRT and WebVTT). None when nothing is left.
fn block_text(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Start and end in ms, the end never before the start.
fn span(cue: &Cue) -> (u64, u64) {
    let start = millis(cue.start);
    (start, millis(cue.end).max(start))
}

/// `[00:00.000 --> 00:04.120]  text` lines, as whisper.cpp prints them. Hours appear
/// only when the transcript reaches an hour, and then on every line so columns align.
pub fn timed_lines(cues: &[Cue]) -> String {
    let hours = cues.iter().any(|c| span(c).1 >= 3_600_000);
    let mut out = String::new();
    for cue in cues {
        let (start, end) = span(cue);
        out += &format!("[{} --> {}]  {}\n", clock(start, '.', hours), clock(end, '.', hours), one_line(cue.text));
    }
    out
}

/// SubRip: numbered blocks `1\n00:00:00,000 --> 00:00:04,120\ntext\n\n`.
pub fn srt(cues: &[Cue]) -> String {
    let mut out = String::new();
    let mut n = 0;
    for cue in cues {
        let Some(text) = block_text(cue.text) else { continue };
        n += 1;
        let (start, end) = span(cue);
        out += &format!("{n}\n{} --> {}\n{text}\n\n", clock(start, ',', true), clock(end, ',', true));
    }
    out
}

/// WebVTT: `WEBVTT`, a blank line, then `00:00:00.000 --> 00:00:04.120\ntext\n\n` blocks.
/// Cue text is HTML-like in WebVTT: `&`, `<` and `>` are escaped (which also keeps a
/// literal "-->" out of the text, where the spec forbids it).
pub fn vtt(cues: &[Cue]) -> String {
    let mut out = String::from("WEBVTT\n\n");
    for cue in cues {
        let Some(text) = block_text(cue.text) else { continue };
        let text = text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
        let (start, end) = span(cue);
        out += &format!("{} --> {}\n{text}\n\n", clock(start, '.', true), clock(end, '.', true));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a reader of the file gets back: times in ms and the text.
    type Parsed = Vec<(u64, u64, String)>;

    /// `hh:mm:ss<sep>mmm` -> ms, strictly (two-digit fields, three-digit fraction).
    fn parse_clock(s: &str, sep: char) -> u64 {
        let (hms, frac) = s.split_once(sep).unwrap_or_else(|| panic!("no '{sep}' in {s:?}"));
        let parts: Vec<&str> = hms.split(':').collect();
        assert_eq!(parts.len(), 3, "{s:?}");
        assert!(parts.iter().all(|p| p.len() == 2) && frac.len() == 3, "{s:?}");
        let n: Vec<u64> = parts.iter().map(|p| p.parse().unwrap()).collect();
        assert!(n[1] < 60 && n[2] < 60, "{s:?}");
        ((n[0] * 60 + n[1]) * 60 + n[2]) * 1000 + frac.parse::<u64>().unwrap()
    }

    fn parse_timing(line: &str, sep: char) -> (u64, u64) {
        let (a, b) = line.split_once(" --> ").unwrap_or_else(|| panic!("not a timing line: {line:?}"));
        (parse_clock(a, sep), parse_clock(b, sep))
    }

    fn parse_srt(doc: &str) -> Parsed {
        assert!(doc.is_empty() || doc.ends_with("\n\n"), "{doc:?}");
        let mut out = Vec::new();
        for (i, block) in doc.split("\n\n").filter(|b| !b.is_empty()).enumerate() {
            let mut lines = block.lines();
            assert_eq!(lines.next().unwrap(), (i + 1).to_string(), "cues are numbered from 1");
            let (start, end) = parse_timing(lines.next().unwrap(), ',');
            let text: Vec<&str> = lines.collect();
            assert!(!text.is_empty(), "a cue without text");
            out.push((start, end, text.join("\n")));
        }
        out
    }

    fn parse_vtt(doc: &str) -> Parsed {
        let body = doc.strip_prefix("WEBVTT\n\n").expect("WEBVTT header and a blank line");
        assert!(body.is_empty() || body.ends_with("\n\n"), "{doc:?}");
        let mut out = Vec::new();
        for block in body.split("\n\n").filter(|b| !b.is_empty()) {
            let mut lines = block.lines();
            let (start, end) = parse_timing(lines.next().unwrap(), '.');
            let text: Vec<&str> = lines.collect();
            assert!(!text.is_empty(), "a cue without text");
            for line in &text {
                assert!(!line.contains("-->") && !line.contains('<'), "unescaped text {line:?}");
            }
            let text = text.join("\n").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&");
            out.push((start, end, text));
        }
        out
    }

    fn cues() -> Vec<Cue<'static>> {
        vec![
            Cue { start: 0.0, end: 4.12, text: " And so, my fellow Americans," },
            Cue { start: 4.12, end: 7.4996, text: " ask not what your country can do for you," },
            Cue { start: 7.5, end: 7.5, text: "   " }, // nothing to show: dropped
            Cue { start: 61.001, end: 3725.5, text: " line one\n\n line two " }, // a blank line inside
            Cue { start: 3725.5, end: 3725.0, text: "a <b> & c --> d" }, // end before start
            Cue { start: -1.0, end: f64::NAN, text: "bad times" },
        ]
    }

    fn expected() -> Parsed {
        vec![
            (0, 4120, "And so, my fellow Americans,".into()),
            (4120, 7500, "ask not what your country can do for you,".into()),
            (61001, 3725500, "line one\nline two".into()),
            (3725500, 3725500, "a <b> & c --> d".into()),
            (0, 0, "bad times".into()),
        ]
    }

    #[test]
    fn srt_parses_back() {
        let doc = srt(&cues());
        assert!(doc.starts_with("1\n00:00:00,000 --> 00:00:04,120\nAnd so, my fellow Americans,\n\n2\n"));
        assert_eq!(parse_srt(&doc), expected());
    }

    #[test]
    fn vtt_parses_back() {
        let doc = vtt(&cues());
        assert!(doc.starts_with("WEBVTT\n\n00:00:00.000 --> 00:00:04.120\nAnd so, my fellow Americans,\n\n"));
        assert!(doc.contains("a &lt;b&gt; &amp; c --&gt; d"));
        assert_eq!(parse_vtt(&doc), expected());
    }

    #[test]
    fn empty_transcripts_are_valid_documents() {
        assert_eq!(srt(&[]), "");
        assert_eq!(parse_srt(&srt(&[])), vec![]);
        assert_eq!(vtt(&[]), "WEBVTT\n\n");
        assert_eq!(parse_vtt(&vtt(&[])), vec![]);
    }

    #[test]
    fn timed_lines_show_hours_only_when_needed() {
        let short = [Cue { start: 0.0, end: 4.12, text: " And so," }, Cue { start: 4.12, end: 65.0, text: "ask\nnot" }];
        assert_eq!(timed_lines(&short), "[00:00.000 --> 00:04.120]  And so,\n[00:04.120 --> 01:05.000]  ask not\n");
        let long = [Cue { start: 0.0, end: 1.0, text: "a" }, Cue { start: 3599.0, end: 3600.0, text: "b" }];
        assert_eq!(
            timed_lines(&long),
            "[00:00:00.000 --> 00:00:01.000]  a\n[00:59:59.000 --> 01:00:00.000]  b\n"
        );
    }

    #[test]
    fn one_line_collapses_whitespace() {
        assert_eq!(one_line("  And so,\nmy  fellow\tAmericans "), "And so, my fellow Americans");
    }
}
