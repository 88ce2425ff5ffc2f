//! Draft sources for speculative decoding.
//!
//! A draft is a guess at the next few tokens. The decoding loop feeds the token it just
//! chose and the draft to one verify pass ([`super::LogitSource::verify`]), keeps the
//! longest prefix of the draft that greedy decoding would have chosen anyway plus the
//! model's own next token, and rolls the state back past the first miss. The transcript
//! is therefore exactly greedy's whatever the draft: a bad draft costs time, never text.
//!
//! Sources here cost no GPU work (the other kind, a quantized draft model sharing the
//! encoder output, lives with the model: `LogitSource::draft`, `--speculative self-q8`):
//! - **hint**: a token sequence the caller expects, e.g. live mode's previous hypothesis
//!   for the same audio (re-decoded 0.5 s later it mostly repeats). While the window's
//!   tokens so far follow the hint, the rest of the hint is the draft. Timestamps follow
//!   each other whatever their times: given more audio, Whisper keeps the words and moves
//!   the segment boundaries by a few frames (`<|7.40|><|7.40|>` becomes `<|7.28|><|7.28|>`),
//!   so a time the window chose instead of the hint's replaces that time in the draft too.
//! - **n-gram** ("prompt lookup"): the last few tokens are looked up in the hint and in the
//!   text so far (the previous windows' text is in the prompt); what followed their latest
//!   earlier occurrence is the draft.
//!
//! - **times**, with timestamps: a time that closes a segment (after text) is never copied
//!   from the text so far, where it lies in the past; an n-gram draft ends in the window's
//!   audio end instead, where Whisper's last time lands when the speech runs on to it (live
//!   mode's prefixes: 8 of jfk's 21 windows close exactly there). And where nothing else
//!   is drafted after a closing time, the next segment opening at that time is (Whisper
//!   writes `<|7.40|><|7.40|>`); where nothing is drafted after a sentence's end (".",
//!   "?", "!", "..."), the closing time at the audio end is (live mode's windows mostly
//!   close there after one). A verify pass of two positions costs little more than a
//!   lone step's round trip (on the H100 0.299 against 0.283 ms: bench/RESULTS.md), and a
//!   time that holds spares the next round trip: the end-of-text after a closing time, or
//!   the next segment's first word.
//!
//! The n-gram draft's length adapts: doubled after a fully accepted draft, halved after a
//! draft rejected at its first token. The hint, while the window follows it, is drafted as
//! far as a verify pass takes: it is the same audio's transcript of half a second before and
//! mostly holds, and a pass of 8 positions costs ~1.5x one of 4 (bench/RESULTS.md).

use std::str::FromStr;

use crate::Error;

/// Which drafts the decoding loop tries (`--speculative`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculative {
    /// Plain greedy decoding, one position per pass.
    #[default]
    Off,
    /// The hint (when given), then n-gram lookup in the hint and the text so far.
    Ngram,
    /// A copy of the model's first decoder layers with q8_0 weights drafts on the GPU.
    SelfQ8,
    /// The same with q4_0 weights.
    SelfQ4,
}

impl Speculative {
    pub const NAMES: [&'static str; 4] = ["off", "ngram", "self-q8", "self-q4"];

    pub fn name(self) -> &'static str {
        match self {
            Speculative::Off => "off",
            Speculative::Ngram => "ngram",
            Speculative::SelfQ8 => "self-q8",
            Speculative::SelfQ4 => "self-q4",
        }
    }

    /// The draft model's weight format, for the sources that draft with one.
    pub fn draft_format(self) -> Option<crate::quant::block::BlockFormat> {
        use crate::quant::block::BlockFormat;
        match self {
            Speculative::SelfQ8 => Some(BlockFormat::Q8_0),
            Speculative::SelfQ4 => Some(BlockFormat::Q4_0),
            Speculative::Off | Speculative::Ngram => None,
        }
    }
}

impl FromStr for Speculative {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        match s {
            "off" => Ok(Speculative::Off),
            "ngram" => Ok(Speculative::Ngram),
            "self-q8" => Ok(Speculative::SelfQ8),
            "self-q4" => Ok(Speculative::SelfQ4),
            other => Err(Error::Invalid(format!(
                "unknown draft source {other:?} (one of: {})",
                Speculative::NAMES.join(", ")
            ))),
        }
    }
}

/// Longest n-gram looked up; shorter ones are tried after it, down to one token.
const MAX_NGRAM: usize = 3;
/// First draft length.
const START_DRAFT: usize = 4;
/// Seconds between Whisper's time tokens, and the most of them after the first (30 s).
const TIME_STEP: f64 = 0.02;
const MAX_TIME_STEPS: u32 = 1500;

/// Proposes drafts for one window and adapts their length.
#[derive(Clone, Debug)]
pub struct Drafter {
    hint: Vec<u32>,
    /// Tokens that end a draft (end of text: nothing follows it in a window).
    stop: u32,
    /// The first timestamp token (ids from it on are times; `u32::MAX`: none).
    timestamp_begin: u32,
    /// The time token of the window's audio end (`u32::MAX`: unknown, or no timestamps).
    audio_end: u32,
    /// Text tokens that end a sentence, after which a closing time is drafted.
    sentence_ends: Vec<u32>,
    len: usize,
}

impl Drafter {
    pub fn new(hint: &[u32], stop: u32, timestamp_begin: u32) -> Self {
        Drafter { hint: hint.to_vec(), stop, timestamp_begin, audio_end: u32::MAX, sentence_ends: Vec::new(), len: START_DRAFT }
    }

    /// Draft the closing time at the audio end after these text tokens (a sentence's end:
    /// [`crate::decode::SpecialTokens::sentence_ends`]) where nothing else is drafted.
    /// Needs the audio end.
    pub fn with_sentence_ends(mut self, ids: &[u32]) -> Self {
        self.sentence_ends = ids.to_vec();
        self
    }

    /// Draft closing times at the window's audio end, `seconds` after its start (Whisper's
    /// times are 0.02 s apart, 30 s at most). Needs timestamps.
    pub fn with_audio_end(mut self, seconds: f64) -> Self {
        if self.timestamp_begin != u32::MAX && seconds.is_finite() && seconds > 0.0 {
            let steps = (seconds / TIME_STEP).round().min(MAX_TIME_STEPS as f64) as u32;
            self.audio_end = self.timestamp_begin.saturating_add(steps);
        }
        self
    }

    /// Up to `min(limit, current length)` tokens likely to follow `sampled` (this window's
    /// tokens so far), given `prompt` (the window's prompt, previous text included).
    pub fn propose(&self, prompt: &[u32], sampled: &[u32], limit: usize) -> Vec<u32> {
        let take_n = |from: &[u32], n: usize| -> Vec<u32> { from.iter().take(n).take_while(|&&t| t != self.stop).copied().collect() };
        // The hint, while this window follows it: as far as the pass takes.
        if let Some(moved) = self.follows(sampled) {
            let rest = self.hint[sampled.len()..].iter().map(|&t| moved.iter().rev().find(|m| m.0 == t).map_or(t, |m| m.1));
            return rest.take(limit).take_while(|&t| t != self.stop).collect();
        }
        let want = self.len.min(limit);
        if want == 0 {
            return Vec::new();
        }
        let take = |from: &[u32]| take_n(from, want);
        let ctx: Vec<u32> = prompt.iter().chain(sampled).copied().collect();
        for n in (1..=MAX_NGRAM.min(sampled.len())).rev() {
            let key = &ctx[ctx.len() - n..];
            // The latest occurrence in the hint, then in the text before the key itself.
            if let Some(at) = last_occurrence(&self.hint, key) {
                let d = take(&self.hint[at + n..]);
                if !d.is_empty() {
                    return self.closing_time_at_end(sampled, d);
                }
            }
            if let Some(at) = last_occurrence(&ctx[..ctx.len() - 1], key) {
                let d = take(&ctx[at + n..]);
                if !d.is_empty() {
                    return self.closing_time_at_end(sampled, d);
                }
            }
        }
        self.time_where_nothing_drafts(sampled)
    }

    fn is_time(&self, t: u32) -> bool {
        t >= self.timestamp_begin
    }

    /// An n-gram draft up to its first closing time (a time after text), that time replaced
    /// by the audio end: the copied time lies in the past, and a window's last segment
    /// mostly closes at the audio end. Unchanged without a known audio end.
    fn closing_time_at_end(&self, sampled: &[u32], mut draft: Vec<u32>) -> Vec<u32> {
        if self.audio_end == u32::MAX {
            return draft;
        }
        let closing = (0..draft.len()).find(|&i| {
            let before = if i == 0 { sampled.last() } else { draft.get(i - 1) };
            self.is_time(draft[i]) && before.is_some_and(|&b| !self.is_time(b))
        });
        if let Some(i) = closing {
            draft.truncate(i);
            draft.push(self.audio_end);
        }
        draft
    }

    /// Where nothing else drafts: after a closing time before the audio end, the next
    /// segment opening at the same time; after a sentence's end, the segment closing at
    /// the audio end (the end-of-text after it then comes with the same pass).
    fn time_where_nothing_drafts(&self, sampled: &[u32]) -> Vec<u32> {
        if self.audio_end == u32::MAX {
            return Vec::new();
        }
        match *sampled {
            [.., text, time] if !self.is_time(text) && self.is_time(time) && time < self.audio_end => vec![time],
            [.., end] if self.sentence_ends.contains(&end) => vec![self.audio_end],
            _ => Vec::new(),
        }
    }

    /// Whether `sampled` follows the hint: shorter, and equal to its start but for times
    /// (a timestamp where the hint has one). Returns the times moved: (hint's, sampled).
    fn follows(&self, sampled: &[u32]) -> Option<Vec<(u32, u32)>> {
        if sampled.len() >= self.hint.len() {
            return None;
        }
        let is_time = |t: u32| t >= self.timestamp_begin;
        let mut moved = Vec::new();
        for (&h, &s) in self.hint.iter().zip(sampled) {
            if h != s {
                if !(is_time(h) && is_time(s)) {
                    return None;
                }
                moved.push((h, s));
            }
        }
        Some(moved)
    }

    /// How many tokens to draft now, at most `limit` (a draft model's request).
    pub fn length(&self, limit: usize) -> usize {
        self.len.min(limit)
    }

    /// After a verify pass: `accepted` of `drafted` tokens were kept.
    pub fn record(&mut self, drafted: usize, accepted: usize, max: usize) {
        if drafted == 0 {
            return;
        }
        if accepted == drafted {
            self.len = (self.len * 2).min(max.max(1));
        } else if accepted == 0 {
            self.len = (self.len / 2).max(1);
        }
    }
}

/// Start of the last occurrence of `key` in `hay`.
fn last_occurrence(hay: &[u32], key: &[u32]) -> Option<usize> {
    if key.is_empty() || hay.len() < key.len() {
        return None;
    }
    (0..=hay.len() - key.len()).rev().find(|&i| &hay[i..i + key.len()] == key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EOT: u32 = 99;
    /// Timestamps: ids from 100 on (100 = 0.00 s).
    const TS: u32 = 100;

    #[test]
    fn draft_follows_the_hint_while_the_window_agrees_with_it() {
        let d = Drafter::new(&[5, 6, 7, 8, 9, 10, 11], EOT, TS);
        // Followed: as much of the hint as the pass takes.
        assert_eq!(d.propose(&[1, 2], &[], 5), vec![5, 6, 7, 8, 9]);
        assert_eq!(d.propose(&[1, 2], &[5, 6], 3), vec![7, 8, 9]);
        assert_eq!(d.propose(&[1, 2], &[5, 6], 0), Vec::<u32>::new());
        // Diverged: the n-gram lookup finds "6" in the hint and drafts what followed it,
        // at the n-gram draft's length (4 at first).
        assert_eq!(d.propose(&[1, 2], &[5, 40, 6], 8), vec![7, 8, 9, 10]);
    }

    #[test]
    fn draft_follows_the_hint_across_moved_timestamps() {
        // <|0.00|> 5 6 <|1.40|><|1.40|> 7 8 <|3.00|>: the window chose 1.36 for the boundary.
        let d = Drafter::new(&[100, 5, 6, 170, 170, 7, 8, 250], EOT, TS);
        assert_eq!(d.propose(&[1], &[100, 5, 6], 8), vec![170, 170, 7, 8, 250]);
        // The moved time is drafted where the hint repeats it; other times stay.
        assert_eq!(d.propose(&[1], &[100, 5, 6, 168], 8), vec![168, 7, 8, 250]);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 168, 168], 2), vec![7, 8]);
        // A text token where the hint has a time (or the reverse) is a divergence: the
        // n-gram lookup takes over ("6" is followed by 170 in the hint, "170" last by 7).
        assert_eq!(d.propose(&[1], &[100, 5, 6, 9, 6], 8), vec![170, 170, 7, 8]);
        assert_eq!(d.propose(&[1], &[100, 5, 170], 8), vec![7, 8, 250]);
        // Without timestamps (`u32::MAX`) times are tokens like any other.
        let plain = Drafter::new(&[100, 5, 6, 170, 170, 7], EOT, u32::MAX);
        assert_eq!(plain.propose(&[1], &[100, 5, 6, 168], 8), Vec::<u32>::new());
    }

    #[test]
    fn draft_looks_up_the_longest_ngram_in_the_text_so_far() {
        let d = Drafter::new(&[], EOT, TS);
        // "3 4" occurred in the prompt followed by 5 6; "4" alone last by 9.
        let prompt = [3, 4, 5, 6, 7, 4, 9];
        assert_eq!(d.propose(&prompt, &[3, 4], 8), vec![5, 6, 7, 4]);
        assert_eq!(d.propose(&prompt, &[4], 2), vec![9, 4]);
        assert_eq!(d.propose(&prompt, &[12], 8), Vec::<u32>::new());
        // A draft ends before end of text.
        assert_eq!(d.propose(&[8, 1, EOT, 2], &[8, 1], 8), Vec::<u32>::new());
        assert_eq!(d.propose(&[8, 1, 3, EOT], &[8, 1], 8), vec![3]);
    }

    #[test]
    fn draft_closes_a_segment_at_the_audio_end_not_at_a_copied_time() {
        // The window's audio ends at 2.00 s (token 200); "5 6" closed at 1.00 s before.
        let d = Drafter::new(&[], EOT, TS).with_audio_end(2.0);
        let prompt = [1];
        let sampled = [100, 5, 6, 150, 150, 7, 5, 6];
        // "5 6" was followed by <|1.00|>: drafted as the audio end, and nothing after it.
        assert_eq!(d.propose(&prompt, &sampled, 8), vec![200]);
        // A time after a time (an opening one) is copied as it is.
        let d = Drafter::new(&[], EOT, TS).with_audio_end(2.0);
        assert_eq!(d.propose(&prompt, &[100, 5, 6, 150, 150, 7, 5, 6, 150], 8), vec![150, 7, 5, 6]);
        // Text before the closing time stays in the draft ("7" was followed by "8 9 <|1.20|>").
        let d = Drafter::new(&[], EOT, TS).with_audio_end(1.5);
        assert_eq!(d.propose(&[1], &[100, 7, 8, 9, 160, 160, 7], 8), vec![8, 9, 175]);
        // The hint's times too (the hint ends where the audio did half a second before).
        let d = Drafter::new(&[100, 5, 6, 7, 170], EOT, TS).with_audio_end(2.2);
        assert_eq!(d.propose(&[1], &[100, 5, 9, 6, 7], 8), vec![210]);
        // The end past 30 s is the last time token.
        let d = Drafter::new(&[], EOT, TS).with_audio_end(31.0);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 150, 150, 5, 6], 8), vec![TS + 1500]);
        // Unknown end, or no timestamps: drafted as copied.
        let d = Drafter::new(&[], EOT, TS);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 150, 150, 5, 6], 8), vec![150, 150, 5, 6]);
        let d = Drafter::new(&[], EOT, u32::MAX).with_audio_end(2.0);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 150, 150, 5, 6], 8), vec![150, 150, 5, 6]);
    }

    #[test]
    fn draft_opens_the_next_segment_where_the_last_one_closed() {
        let d = Drafter::new(&[], EOT, TS).with_audio_end(3.0);
        // Text, then <|1.40|> with nothing to look up: <|1.40|> again.
        assert_eq!(d.propose(&[1], &[100, 5, 6, 170], 8), vec![170]);
        // Not at the audio end (end-of-text follows there), not after a time, not after text.
        assert_eq!(d.propose(&[1], &[100, 5, 6, 250], 8), Vec::<u32>::new());
        assert_eq!(d.propose(&[1], &[100, 5, 180, 170], 8), Vec::<u32>::new());
        assert_eq!(d.propose(&[1], &[100, 5, 6], 8), Vec::<u32>::new());
        assert_eq!(d.propose(&[1], &[100, 5, 6, 170], 0), Vec::<u32>::new());
        // Without a known audio end, nothing.
        let d = Drafter::new(&[], EOT, TS);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 170], 8), Vec::<u32>::new());
    }

    #[test]
    fn draft_closes_at_the_audio_end_after_a_sentence_end() {
        // "13" ends a sentence; the audio ends at 3.00 s.
        let d = Drafter::new(&[], EOT, TS).with_audio_end(3.0).with_sentence_ends(&[13, 30]);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 13], 8), vec![250]);
        assert_eq!(d.propose(&[1], &[100, 5, 30], 8), vec![250]);
        // Other text drafts nothing; an n-gram to copy is copied ("5" was followed by "6").
        assert_eq!(d.propose(&[1], &[100, 5, 6], 8), Vec::<u32>::new());
        assert_eq!(d.propose(&[1], &[100, 5, 6, 13, 5], 8), vec![6, 13, 5]);
        // Without the audio end, or without timestamps, nothing.
        let d = Drafter::new(&[], EOT, TS).with_sentence_ends(&[13]);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 13], 8), Vec::<u32>::new());
        let d = Drafter::new(&[], EOT, u32::MAX).with_audio_end(3.0).with_sentence_ends(&[13]);
        assert_eq!(d.propose(&[1], &[100, 5, 6, 13], 8), Vec::<u32>::new());
    }

    #[test]
    fn draft_length_adapts_to_acceptance() {
        // N-gram drafts ("7" is followed by twenty tokens in the prompt).
        let mut d = Drafter::new(&[], EOT, TS);
        let prompt: Vec<u32> = [7].into_iter().chain(20..40).collect();
        assert_eq!(d.propose(&prompt, &[7], 20).len(), 4);
        d.record(4, 4, 7);
        assert_eq!(d.propose(&prompt, &[7], 20).len(), 7);
        d.record(7, 0, 7);
        assert_eq!(d.propose(&prompt, &[7], 20).len(), 3);
        d.record(3, 1, 7);
        assert_eq!(d.propose(&prompt, &[7], 20).len(), 3);
        d.record(3, 0, 7);
        d.record(1, 0, 7);
        d.record(1, 0, 7);
        assert_eq!(d.propose(&prompt, &[7], 20).len(), 1);
        assert_eq!(d.propose(&prompt, &[7], 0).len(), 0);
        // A followed hint is drafted whole whatever the n-gram length.
        let mut h = Drafter::new(&[1; 20], EOT, TS);
        h.record(4, 0, 7);
        assert_eq!(h.propose(&[], &[], 7).len(), 7);
    }

    #[test]
    fn draft_source_names_parse() {
        for name in Speculative::NAMES {
            assert_eq!(name.parse::<Speculative>().unwrap().name(), name);
        }
        assert!("self-q5".parse::<Speculative>().is_err());
    }
}
