//! Words of a hypothesis, and the two comparisons LocalAgreement needs: where a new
//! hypothesis stops repeating what is already committed, and how far two consecutive
//! hypotheses agree.
//!
//! whisper_streaming finds the first new word by word timestamps (words starting after the
//! last committed one) plus an n-gram check. Our decoder gives segment timestamps, not word
//! ones, so the committed words still in the audio buffer are aligned to the start of the
//! hypothesis by edit distance on normalised words (a misheard or dropped word costs one),
//! and the segment times, spread over a segment's words by their length, only break ties.

/// One word of a transcript.
#[derive(Clone, Debug, PartialEq)]
pub struct Word {
    /// As decoded (case and punctuation kept): what is shown.
    pub text: String,
    /// Lowercase letters, digits and apostrophes only: what is compared.
    pub key: String,
    /// Estimated seconds from the start of the stream: the segment's times spread over its
    /// words in proportion to their length (the decoder gives no word timestamps).
    pub start: f64,
    pub end: f64,
}

/// A decoded segment: seconds from the start of the stream, and its text.
#[derive(Clone, Debug, PartialEq)]
pub struct TimedText {
    pub start: f64,
    pub end: f64,
    pub text: String,
}

/// The comparison form of a word: lowercase, only letters, digits and apostrophes
/// ("Americans," and "americans" agree; "don't" keeps its apostrophe).
pub fn normalise_word(w: &str) -> String {
    w.chars().filter(|c| c.is_alphanumeric() || *c == '\'').flat_map(char::to_lowercase).collect()
}

/// The words of `segments`, and for each word the index of its segment. A token with
/// nothing to compare (a lone "-" or "...") is glued to the word before it in its segment,
/// or dropped at a segment's start.
pub fn words_of(segments: &[TimedText]) -> (Vec<Word>, Vec<usize>) {
    let (mut words, mut seg_of) = (Vec::new(), Vec::new());
    for (si, seg) in segments.iter().enumerate() {
        let tokens: Vec<&str> = seg.text.split_whitespace().collect();
        let total: usize = tokens.iter().map(|t| t.chars().count()).sum();
        let dur = (seg.end - seg.start).max(0.0);
        let mut done = 0usize;
        let first = words.len();
        for t in tokens {
            let at = |chars: usize| seg.start + if total == 0 { 0.0 } else { dur * chars as f64 / total as f64 };
            let start = at(done);
            done += t.chars().count();
            let end = at(done);
            let key = normalise_word(t);
            if key.is_empty() {
                if words.len() > first {
                    let last: &mut Word = words.last_mut().expect("a word of this segment");
                    last.text.push(' ');
                    last.text.push_str(t);
                    last.end = end;
                }
                continue;
            }
            words.push(Word { text: t.to_string(), key, start, end });
            seg_of.push(si);
        }
    }
    (words, seg_of)
}

/// How many leading words `a` and `b` share (compared by key): LocalAgreement's commit.
pub fn common_prefix(a: &[Word], b: &[Word]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x.key == y.key).count()
}

/// Where the committed words `committed` (those whose audio is still in the buffer, in
/// order) end in the hypothesis `hyp` (which transcribes the whole buffer, so it should
/// begin with them). Returns `k` — `hyp[k..]` is new — and for each committed word the
/// index of the hypothesis word aligned to it (None when the hypothesis dropped it).
///
/// `k` minimises the edit distance between `committed` and `hyp[..k]` (a word matched: 0,
/// misheard, missing or extra: 1). Ties go to the `k` closest to `hint` (the number of
/// hypothesis words that, by their estimated times, lie before the end of the last committed
/// word), then to the larger `k`.
pub fn align_committed(committed: &[Word], hyp: &[Word], hint: usize) -> (usize, Vec<Option<usize>>) {
    let (c, h) = (committed.len(), hyp.len());
    if c == 0 {
        return (0, Vec::new());
    }
    // d[i][j]: edit distance of committed[..i] and hyp[..j].
    let w = h + 1;
    let mut d = vec![0u32; (c + 1) * w];
    for j in 0..=h {
        d[j] = j as u32;
    }
    for i in 1..=c {
        d[i * w] = i as u32;
        for j in 1..=h {
            let sub = d[(i - 1) * w + j - 1] + u32::from(committed[i - 1].key != hyp[j - 1].key);
            let del = d[(i - 1) * w + j] + 1;
            let ins = d[i * w + j - 1] + 1;
            d[i * w + j] = sub.min(del).min(ins);
        }
    }
    let row = &d[c * w..];
    let best = *row.iter().min().expect("a row of h + 1 >= 1 cells");
    let k = (0..=h)
        .filter(|&j| row[j] == best)
        .min_by_key(|&j| (j.abs_diff(hint), std::cmp::Reverse(j)))
        .expect("the minimum is in the row");
    // Walk back from (c, k): which hypothesis word each committed word went to.
    let mut map = vec![None; c];
    let (mut i, mut j) = (c, k);
    while i > 0 {
        let here = d[i * w + j];
        if j > 0 && here == d[(i - 1) * w + j - 1] + u32::from(committed[i - 1].key != hyp[j - 1].key) {
            map[i - 1] = Some(j - 1);
            i -= 1;
            j -= 1;
        } else if here == d[(i - 1) * w + j] + 1 {
            i -= 1;
        } else {
            j -= 1;
        }
    }
    (k, map)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(start: f64, end: f64, text: &str) -> TimedText {
        TimedText { start, end, text: text.into() }
    }

    fn ws(text: &str) -> Vec<Word> {
        words_of(&[seg(0.0, 1.0, text)]).0
    }

    #[test]
    fn live_words_are_normalised_and_timed() {
        assert_eq!(normalise_word("Americans,"), "americans");
        assert_eq!(normalise_word("Don't!"), "don't");
        assert_eq!(normalise_word("..."), "");
        let (w, s) = words_of(&[seg(0.0, 2.0, " And so my - friends..."), seg(2.0, 3.0, " Ask. ")]);
        let keys: Vec<&str> = w.iter().map(|w| w.key.as_str()).collect();
        assert_eq!(keys, ["and", "so", "my", "friends", "ask"]);
        assert_eq!(w[2].text, "my -", "punctuation-only tokens stay with the word before");
        assert_eq!(s, [0, 0, 0, 0, 1]);
        // "And so my - friends..." has 3+2+2+1+10 = 18 characters over 2 s.
        assert!((w[0].end - 2.0 * 3.0 / 18.0).abs() < 1e-9 && (w[3].end - 2.0).abs() < 1e-9, "{w:?}");
        assert!(w.windows(2).all(|p| p[0].end <= p[1].start + 1e-12));
    }

    #[test]
    fn live_agreement_is_the_common_prefix_of_keys() {
        assert_eq!(common_prefix(&ws("And so, my fellow"), &ws("and so my fellow Americans")), 4);
        assert_eq!(common_prefix(&ws("And so my fellow"), &ws("And so I")), 2);
        assert_eq!(common_prefix(&ws(""), &ws("And")), 0);
    }

    #[test]
    fn live_committed_words_are_found_at_the_start_of_a_hypothesis() {
        let c = ws("and so my");
        // Repeated exactly, with other punctuation.
        let (k, map) = align_committed(&c, &ws("And so, my fellow Americans"), 3);
        assert_eq!((k, map), (3, vec![Some(0), Some(1), Some(2)]));
        // A committed word misheard in the new hypothesis still counts as repeated.
        let (k, _) = align_committed(&c, &ws("And so by fellow Americans"), 3);
        assert_eq!(k, 3);
        // One dropped: "fellow" is new, not a substitute for "my".
        let (k, map) = align_committed(&c, &ws("And so fellow Americans"), 2);
        assert_eq!(k, 2);
        assert_eq!(map, vec![Some(0), Some(1), None]);
        // An extra word inside the committed part.
        let (k, _) = align_committed(&c, &ws("and so uh my fellow"), 4);
        assert_eq!(k, 4);
        // The hypothesis no longer has the committed words at all: by the times, nothing of
        // it lies before the committed end, so everything in it is new.
        let (k, _) = align_committed(&c, &ws("fellow Americans ask"), 0);
        assert_eq!(k, 0);
        // Nothing committed in the buffer: all new.
        assert_eq!(align_committed(&[], &ws("a b"), 0), (0, vec![]));
    }
}
