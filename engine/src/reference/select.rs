//! The CPU reference of the GPU's masked-selection kernel: from a full row of logits to
//! the few numbers Whisper's decoding rules need ([`StepScores`]).

use crate::decode::{StepRules, StepScores};

/// Max, lowest argmax and log-sum-exp over a set of logits, built one id at a time.
///
/// A logit of -inf never becomes the best: that is how a masked logit looks on the GPU,
/// so an unmasked -inf is treated as masked, and a set holding only -inf reads as empty.
struct Reduce {
    best: u32,
    max: f32,
    ids: Vec<u32>,
}

impl Reduce {
    fn new() -> Self {
        Reduce {
            best: u32::MAX,
            max: f32::NEG_INFINITY,
            ids: Vec::new(),
        }
    }

    fn push(&mut self, id: u32, v: f32) {
        // Strictly greater: ids arrive in increasing order, so ties keep the lowest id.
        if v > self.max {
            self.max = v;
            self.best = id;
        }
        self.ids.push(id);
    }

    /// log Σ exp(v) over the set, stably in f64 around the max; -inf when empty.
    fn lse(&self, logits: &[f32]) -> f32 {
        if self.max == f32::NEG_INFINITY {
            return f32::NEG_INFINITY;
        }
        let m = self.max as f64;
        let s: f64 = self
            .ids
            .iter()
            .map(|&i| (logits[i as usize] as f64 - m).exp())
            .sum();
        (m + s.ln()) as f32
    }
}

/// What the GPU's masked-selection kernel computes: see StepRules / StepScores in engine/src/decode/mod.rs (read it!).
///
/// Masked at every step: the ids in `suppress` and `rules.extra_suppress` (u32::MAX =
/// unused slot; ids outside the vocabulary are ignored). Then:
/// - text set = [0, timestamp_begin), minus [0, eot) if `mask_text`, minus everything if
///   `mask_non_timestamps`;
/// - timestamp set = [max(ts_lo, timestamp_begin), min(ts_hi, vocab)) — only timestamp
///   tokens can be allowed timestamps, and only ids that exist;
/// - `raw_lse` is over every logit with no mask at all;
/// - `probe_logit` = logits[probe], or -inf when `probe` is outside the vocabulary (the
///   same "nothing there" value as an empty set, rather than a NaN that would poison any
///   comparison it enters).
///
/// Empty sets give max -inf, best u32::MAX, lse -inf; ties go to the lowest id; an
/// unmasked logit of -inf is treated as masked (see [`Reduce`]).
pub fn masked_scores(
    logits: &[f32],
    suppress: &[u32],
    rules: &StepRules,
    timestamp_begin: u32,
    eot: u32,
) -> StepScores {
    let vocab = logits.len();
    let mut masked = vec![false; vocab];
    for &id in suppress.iter().chain(rules.extra_suppress.iter()) {
        if (id as usize) < vocab {
            masked[id as usize] = true;
        }
    }
    let text_end = (timestamp_begin as usize).min(vocab);
    if rules.mask_non_timestamps {
        masked[..text_end].iter_mut().for_each(|m| *m = true);
    }
    if rules.mask_text {
        masked[..(eot as usize).min(vocab)]
            .iter_mut()
            .for_each(|m| *m = true);
    }

    let mut text = Reduce::new();
    for id in 0..text_end {
        if !masked[id] {
            text.push(id as u32, logits[id]);
        }
    }
    let ts_lo = (rules.ts_lo.max(timestamp_begin) as usize).min(vocab);
    let ts_hi = (rules.ts_hi as usize).min(vocab);
    let mut ts = Reduce::new();
    for id in ts_lo..ts_hi.max(ts_lo) {
        if !masked[id] {
            ts.push(id as u32, logits[id]);
        }
    }

    let raw_lse = {
        let m = logits
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        if m == f64::NEG_INFINITY {
            f32::NEG_INFINITY
        } else {
            (m + logits
                .iter()
                .map(|&v| (v as f64 - m).exp())
                .sum::<f64>()
                .ln()) as f32
        }
    };

    StepScores {
        text_best: text.best,
        text_max: text.max,
        text_lse: text.lse(logits),
        ts_best: ts.best,
        ts_max: ts.max,
        ts_lse: ts.lse(logits),
        raw_lse,
        probe_logit: logits
            .get(rules.probe as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn rules() -> StepRules {
        StepRules {
            mask_text: false,
            mask_non_timestamps: false,
            ts_lo: 0,
            ts_hi: 0,
            extra_suppress: [u32::MAX; 2],
            probe: 0,
        }
    }

    /// The naive version: a per-id predicate "is this id in the set?", then max / first
    /// argmax / LSE over the ids that pass, with no shared mask array.
    fn naive(logits: &[f32], suppress: &[u32], r: &StepRules, tb: u32, eot: u32) -> StepScores {
        let in_text = |i: u32| {
            i < tb
                && !suppress.contains(&i)
                && !r.extra_suppress.contains(&i)
                && !r.mask_non_timestamps
                && !(r.mask_text && i < eot)
        };
        let in_ts = |i: u32| {
            i >= tb
                && i >= r.ts_lo
                && i < r.ts_hi
                && !suppress.contains(&i)
                && !r.extra_suppress.contains(&i)
        };
        let pick = |f: &dyn Fn(u32) -> bool| {
            let ids: Vec<u32> = (0..logits.len() as u32)
                .filter(|&i| f(i) && logits[i as usize] > f32::NEG_INFINITY)
                .collect();
            if ids.is_empty() {
                return (u32::MAX, f32::NEG_INFINITY, f32::NEG_INFINITY);
            }
            let max = ids
                .iter()
                .map(|&i| logits[i as usize])
                .fold(f32::NEG_INFINITY, f32::max);
            let best = *ids.iter().find(|&&i| logits[i as usize] == max).unwrap();
            let s: f64 = ids.iter().map(|&i| (logits[i as usize] as f64).exp()).sum();
            (best, max, s.ln() as f32)
        };
        let (text_best, text_max, text_lse) = pick(&in_text);
        let (ts_best, ts_max, ts_lse) = pick(&in_ts);
        let raw: f64 = logits.iter().map(|&v| (v as f64).exp()).sum();
        StepScores {
            text_best,
            text_max,
            text_lse,
            ts_best,
            ts_max,
            ts_lse,
            raw_lse: raw.ln() as f32,
            probe_logit: logits
                .get(r.probe as usize)
                .copied()
                .unwrap_or(f32::NEG_INFINITY),
        }
    }

    fn assert_same(a: &StepScores, b: &StepScores, what: &str) {
        assert_eq!((a.text_best, a.ts_best), (b.text_best, b.ts_best), "{what}");
        assert_eq!(
            (a.text_max, a.ts_max, a.probe_logit),
            (b.text_max, b.ts_max, b.probe_logit),
            "{what}"
        );
        for (x, y) in [
            (a.text_lse, b.text_lse),
            (a.ts_lse, b.ts_lse),
            (a.raw_lse, b.raw_lse),
        ] {
            assert!(
                x == y || (x - y).abs() <= 1e-5 * y.abs().max(1.0),
                "{what}: lse {x} vs {y}"
            );
        }
    }

    #[test]
    fn select_matches_naive_on_random_rules() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for case in 0..400 {
            let vocab = rng.random_range(1..90u32);
            let tb = rng.random_range(0..=vocab + 3);
            // Whisper's eot always precedes the timestamps.
            let eot = rng.random_range(0..=tb);
            // Few distinct values so ties happen often; small range so naive's un-shifted
            // exp() is safe.
            let logits: Vec<f32> = (0..vocab)
                .map(|_| rng.random_range(-8..8) as f32 * 0.5)
                .collect();
            let suppress: Vec<u32> = (0..rng.random_range(0..12))
                .map(|_| rng.random_range(0..vocab + 5))
                .collect();
            let mut extra = || {
                if rng.random_bool(0.4) {
                    u32::MAX
                } else {
                    rng.random_range(0..vocab + 2)
                }
            };
            let extra_suppress = [extra(), extra()];
            let r = StepRules {
                mask_text: rng.random_bool(0.3),
                mask_non_timestamps: rng.random_bool(0.2),
                ts_lo: rng.random_range(0..vocab + 4),
                ts_hi: rng.random_range(0..vocab + 4),
                extra_suppress,
                probe: rng.random_range(0..vocab + 3),
            };
            let got = masked_scores(&logits, &suppress, &r, tb, eot);
            let want = naive(&logits, &suppress, &r, tb, eot);
            assert_same(
                &got,
                &want,
                &format!("case {case}: {r:?} tb {tb} eot {eot} vocab {vocab}"),
            );
        }
    }

    #[test]
    fn select_empty_sets_and_ties() {
        let logits = [1.0, 3.0, 3.0, 0.5, 2.0, 2.0, -1.0];
        // tb = 4: text [0,4), timestamps [4,7).
        let mut r = rules();
        r.ts_lo = 4;
        r.ts_hi = 7;
        let s = masked_scores(&logits, &[], &r, 4, 3);
        assert_eq!(
            (s.text_best, s.text_max),
            (1, 3.0),
            "tie goes to the lowest id"
        );
        assert_eq!((s.ts_best, s.ts_max), (4, 2.0));
        let want_text = (1f64.exp() + 2.0 * 3f64.exp() + 0.5f64.exp()).ln() as f32;
        assert!((s.text_lse - want_text).abs() < 1e-6);

        // Everything text masked and no timestamps allowed: both sets empty.
        r.mask_non_timestamps = true;
        r.ts_hi = 4;
        let s = masked_scores(&logits, &[], &r, 4, 3);
        assert_eq!(
            (s.text_best, s.text_max, s.text_lse),
            (u32::MAX, f32::NEG_INFINITY, f32::NEG_INFINITY)
        );
        assert_eq!(
            (s.ts_best, s.ts_max, s.ts_lse),
            (u32::MAX, f32::NEG_INFINITY, f32::NEG_INFINITY)
        );
        // raw_lse ignores every mask.
        let raw = logits.iter().map(|&v| (v as f64).exp()).sum::<f64>().ln() as f32;
        assert!((s.raw_lse - raw).abs() < 1e-6);

        // mask_text leaves [eot, tb) = {3}; suppress and extra_suppress remove ids.
        let mut r = rules();
        r.mask_text = true;
        r.ts_lo = 0; // below timestamp_begin: clamped, text ids never count as timestamps
        r.ts_hi = 100; // beyond the vocabulary: clamped
        r.extra_suppress = [5, u32::MAX];
        r.probe = 2;
        let s = masked_scores(&logits, &[4], &r, 4, 3);
        assert_eq!((s.text_best, s.text_max), (3, 0.5));
        assert_eq!((s.ts_best, s.ts_max), (6, -1.0));
        assert_eq!(s.ts_lse, -1.0);
        assert_eq!(s.probe_logit, 3.0);
        r.probe = 7;
        assert_eq!(
            masked_scores(&logits, &[], &r, 4, 3).probe_logit,
            f32::NEG_INFINITY
        );
    }

    #[test]
    fn select_lse_is_stable_for_large_logits() {
        let logits = [1000.0, 1000.0, -1000.0, 999.0];
        let mut r = rules();
        r.ts_lo = 3;
        r.ts_hi = 4;
        let s = masked_scores(&logits, &[], &r, 3, 3);
        let want = 1000.0 + (2.0f64).ln();
        assert!((s.text_lse as f64 - want).abs() < 1e-3);
        assert_eq!(s.ts_lse, 999.0);
        assert!(s.raw_lse.is_finite());
    }
}
