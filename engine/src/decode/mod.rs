//! Decoding: turning a model's per-position scores into tokens, and tokens into text.
//!
//! The model side (GPU, or the CPU reference) implements [`LogitSource`]: it encodes a
//! 30 s window, appends tokens to the decoder state (one batched pass for several) and
//! returns, for the last position, the few numbers Whisper's decoding rules need. The full
//! vocabulary of logits never leaves the GPU: the masking and the argmax / log-sum-exp
//! reductions run there (see `kernels/select.wgsl`), and only [`StepScores`] comes back.

pub mod draft;
pub mod tokenizer;
pub mod whisper;

use crate::Result;

/// Token ids of the special tokens and the layout of the vocabulary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialTokens {
    pub eot: u32,
    pub sot: u32,
    pub sot_prev: u32,
    pub no_speech: u32,
    pub no_timestamps: u32,
    /// First timestamp token (<|0.00|>); timestamps run to the end of the vocabulary.
    pub timestamp_begin: u32,
    /// Number of logits (vocabulary size).
    pub vocab: u32,
    /// Text tokens that end a sentence (".", "?", "!", "..." where each is one token):
    /// Whisper mostly closes a segment after one, so drafts guess a closing time there.
    pub sentence_ends: Vec<u32>,
}

/// The masks of one decoding step, on top of the static suppress list that the source
/// was given at load (config.json's `suppress_ids`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepRules {
    /// Mask every token in [0, eot): text must not follow a lone timestamp.
    pub mask_text: bool,
    /// Mask every token in [0, timestamp_begin): the first token must be a timestamp.
    pub mask_non_timestamps: bool,
    /// Allowed timestamp tokens are [ts_lo, ts_hi); empty when ts_lo >= ts_hi.
    pub ts_lo: u32,
    pub ts_hi: u32,
    /// Up to two more ids masked at this step (Whisper's suppress_blank: " " and eot at
    /// the first sampled position); u32::MAX marks an unused slot.
    pub extra_suppress: [u32; 2],
    /// A token whose raw logit is reported in [`StepScores::probe_logit`] (no_speech).
    pub probe: u32,
}

/// One step's masks, and whether the "timestamps beat text" rule is to be checked on the
/// scores (it needs the masked scores, so it is the picker's half of the rule).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    pub rules: StepRules,
    pub check_ts_over_text: bool,
}

/// What Whisper's timestamp rules need to know of the tokens sampled so far in a window
/// (for every step but the first): the last two of them and the lowest timestamp a segment
/// may take after text. The decoding loop derives its masks through it, and the device
/// keeps it across several greedy steps without a round trip (select.wgsl's `masks` and
/// main_pick mirror [`TsState::step`] and [`TsState::push`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TsState {
    pub last: u32,
    /// With one token sampled, the last again (CTranslate2 and OpenAI count a missing
    /// penultimate as a timestamp, so a first timestamp opens a pair).
    pub penultimate: u32,
    /// The last sampled timestamp + 1 (after text, timestamps strictly increase: a
    /// segment has a nonzero length), or timestamp_begin when none was sampled.
    pub ts_lo_after_text: u32,
}

impl TsState {
    /// The state after `sampled`; None when nothing was sampled yet.
    pub fn new(sampled: &[u32], ts_begin: u32) -> Option<TsState> {
        let (&last, rest) = sampled.split_last()?;
        let ts_lo_after_text = sampled.iter().rev().find(|&&t| t >= ts_begin).map_or(ts_begin, |&t| t + 1);
        Some(TsState { last, penultimate: rest.last().copied().unwrap_or(last), ts_lo_after_text })
    }

    /// The state after one more sampled token.
    pub fn push(self, token: u32, ts_begin: u32) -> TsState {
        TsState {
            last: token,
            penultimate: self.last,
            ts_lo_after_text: if token >= ts_begin { token + 1 } else { self.ts_lo_after_text },
        }
    }

    /// The next step's masks: `base` (a later step's rules: extra ids, probe, ts_hi) with
    /// the timestamp rules applied. A closed pair of timestamps is followed by text (or
    /// eot); a lone timestamp after text by another timestamp (not earlier) or eot; text
    /// by anything, timestamps from `ts_lo_after_text`.
    pub fn step(&self, base: StepRules, ts_begin: u32, vocab: u32) -> Step {
        let mut rules = StepRules { mask_text: false, mask_non_timestamps: false, ..base };
        if self.last >= ts_begin {
            if self.penultimate >= ts_begin {
                rules.ts_lo = vocab;
                return Step { rules, check_ts_over_text: false };
            }
            rules.mask_text = true;
            rules.ts_lo = self.last;
            return Step { rules, check_ts_over_text: true };
        }
        rules.ts_lo = self.ts_lo_after_text;
        Step { rules, check_ts_over_text: true }
    }
}

/// What [`LogitSource::greedy_steps`] returns: per step, the device's choice, the scores
/// and the masks they were computed under.
#[derive(Clone, Debug, Default)]
pub struct GreedySteps {
    pub picks: Vec<u32>,
    pub scores: Vec<StepScores>,
    pub steps: Vec<Step>,
}

/// What comes back from the GPU per step. "Masked" means after the static suppress list
/// and the [`StepRules`]. A maximum over an empty set is -inf, its best id u32::MAX.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StepScores {
    /// Argmax / max / log-sum-exp of the masked logits over [0, timestamp_begin)
    /// (text tokens, eot and the other specials). Ties go to the lowest id.
    pub text_best: u32,
    pub text_max: f32,
    pub text_lse: f32,
    /// The same over the allowed timestamps [ts_lo, ts_hi), masked.
    pub ts_best: u32,
    pub ts_max: f32,
    pub ts_lse: f32,
    /// Log-sum-exp of all raw logits (no mask at all).
    pub raw_lse: f32,
    /// Raw logit of `StepRules::probe`.
    pub probe_logit: f32,
}

/// A Whisper model seen from the decoder loop.
pub trait LogitSource {
    /// Encode one 30 s window of log-mel (`n_mels` rows of 3000 frames, row-major) and
    /// reset the decoder state (KV length 0; cross-attention K/V computed once here).
    fn begin_window(&mut self, mel: &[f32]) -> Result<()>;
    /// The same for frames `[start, start + len)` of a recording's spectrogram (zero past
    /// `len`): `begin_window(&mel.window(start, len))`, unless the source does better.
    /// `fresh`: `mel` is another recording than the last call's (its values may sit where
    /// the last one's did); GpuWhisper keeps a recording's spectrogram on its device and
    /// copies its later windows there.
    fn begin_window_of(&mut self, mel: &crate::audio::mel::LogMel, start: usize, len: usize, fresh: bool) -> Result<()> {
        let _ = fresh;
        self.begin_window(&mel.window(start, len))
    }
    /// Append `tokens` at the next decoder positions (all in one batched pass when there
    /// are several) and return the masked scores at the last of them.
    fn advance(&mut self, tokens: &[u32], rules: &StepRules) -> Result<StepScores>;
    /// Set the token ids masked at every step (config.json's suppress_ids plus what the
    /// decoding options add). Replaces any earlier list.
    fn set_suppress(&mut self, ids: &[u32]) -> Result<()>;
    /// Most positions one [`LogitSource::verify`] takes; 0 when the source cannot verify
    /// (speculative decoding then falls back to single steps).
    fn max_verify(&self) -> usize {
        0
    }
    /// Speculative decoding's check: append `tokens` at the next positions in one batched
    /// pass and return the masked scores at every one of them, position i with `rules[i]`.
    /// Each must equal, bit for bit, what `advance(&[tokens[i]], &rules[i])` would return
    /// after `tokens[..i]`: a verify pass may never change the transcript.
    fn verify(&mut self, tokens: &[u32], rules: &[StepRules]) -> Result<Vec<StepScores>> {
        let _ = (tokens, rules);
        Err(crate::Error::Unsupported("this logit source has no verify pass".into()))
    }
    /// Most decode steps [`LogitSource::greedy_steps`] takes with one readback; 0 when the
    /// source has no such path (the decoding loop then steps one position at a time).
    fn max_steps(&self) -> usize {
        0
    }
    /// `k` greedy decode steps with one readback (no host round trip between them): feed
    /// `first` at the next position, choose the next token on the device from its scores
    /// under `step` (the host's pick, "timestamps beat text" included where `step` checks
    /// it), feed that, and so on. With `ts` (timestamp rules on: the state after the tokens
    /// sampled so far, `first` the last of them) every later step's masks are derived on
    /// the device from its own choices, as [`TsState::step`] on `step.rules`; without, all
    /// k steps use `step`. Returns the k choices, the k positions' scores (as `advance`
    /// would give them under the same masks, bit for bit) and the masks each position was
    /// scored under, for the caller to compare with its own; the k positions stay in the
    /// state (roll back what the caller does not keep).
    fn greedy_steps(&mut self, first: u32, k: usize, step: &Step, ts: Option<TsState>) -> Result<GreedySteps> {
        let _ = (first, k, step, ts);
        Err(crate::Error::Unsupported("this logit source has no multi-step path".into()))
    }
    /// A draft model's guess at up to `k` tokens following `context` (this window's prompt
    /// and every token chosen so far, the last not yet fed to `advance`/`verify`), with
    /// timestamp tokens allowed or not. Empty when the source has no draft model.
    fn draft(&mut self, context: &[u32], k: usize, timestamps: bool) -> Result<Vec<u32>> {
        let _ = (context, k, timestamps);
        Ok(Vec::new())
    }
    /// Forget the last `n` positions (the rejected drafts of a verify pass).
    fn rollback(&mut self, n: usize) -> Result<()> {
        let _ = n;
        Err(crate::Error::Unsupported("this logit source cannot roll back".into()))
    }
    /// Decoder context length (448 for Whisper).
    fn max_positions(&self) -> usize;
    /// Mel bins the encoder takes (80; 128 for large-v3).
    fn n_mels(&self) -> usize;
}

/// A shared "stop" switch: the window's Cancel button sets it, the decoding loop checks it
/// before every window and every token. Clones share the switch.
#[derive(Clone, Debug, Default)]
pub struct CancelFlag(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl CancelFlag {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    pub fn is_set(&self) -> bool {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Two options are equal when they share the same switch.
impl PartialEq for CancelFlag {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}
