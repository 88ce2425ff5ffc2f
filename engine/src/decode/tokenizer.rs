//! Whisper's tokenizer: the Hugging Face `tokenizer.json` of the model, plus the ids of the
//! special tokens that the decoding loop needs.
//!
//! The special ids are looked up by name, never hard-coded: English-only and multilingual
//! vocabularies (and large-v3) put them at different places. Timestamps are not in
//! `tokenizer.json` at all: the model's logits simply continue past `<|notimestamps|>`, one
//! id per 0.02 s, up to the model's vocabulary size.

use std::path::Path;

use super::SpecialTokens;
use crate::{Error, Result};

/// A loaded Whisper tokenizer.
pub struct WhisperTokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    /// `<|transcribe|>`, `<|translate|>`, `<|startoflm|>`: not part of [`SpecialTokens`], but
    /// faster-whisper adds them to the suppress list.
    task_ids: [u32; 3],
    /// The id of " ", which suppress_blank masks at the first sampled position.
    blank: u32,
    /// What follows the previous-text prompt: [sot] for English-only models,
    /// [sot, <|en|>, <|transcribe|>] for multilingual ones.
    sot_sequence: Vec<u32>,
}

impl WhisperTokenizer {
    /// Load `tokenizer.json` for a model whose logits have `vocab` entries (51864 for the
    /// English-only models, 51865 multilingual, 51866 large-v3).
    pub fn from_file(path: &Path, vocab: u32) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer(format!("cannot load {}: {e}", path.display())))?;

        let id = |name: &str| {
            inner.token_to_id(name).ok_or_else(|| {
                Error::Tokenizer(format!(
                    "{} has no {name} token; is it a Whisper tokenizer?",
                    path.display()
                ))
            })
        };
        let eot = id("<|endoftext|>")?;
        let sot = id("<|startoftranscript|>")?;
        let sot_prev = id("<|startofprev|>")?;
        let no_timestamps = id("<|notimestamps|>")?;
        let transcribe = id("<|transcribe|>")?;
        let translate = id("<|translate|>")?;
        let sot_lm = id("<|startoflm|>")?;
        // Older English-only vocabularies call it <|nocaptions|>, newer ones <|nospeech|>
        // (faster-whisper's Tokenizer.no_speech tries both in this order).
        let no_speech = inner
            .token_to_id("<|nospeech|>")
            .or_else(|| inner.token_to_id("<|nocaptions|>"))
            .ok_or_else(|| {
                Error::Tokenizer(format!(
                    "{} has neither <|nospeech|> nor <|nocaptions|>",
                    path.display()
                ))
            })?;
        // Timestamps follow <|notimestamps|> (faster-whisper: timestamp_begin = no_timestamps + 1).
        let timestamp_begin = no_timestamps + 1;

        // The decoding rules treat [0, eot) as text, [eot, timestamp_begin) as specials and
        // [timestamp_begin, vocab) as timestamps. A vocabulary that breaks this layout would
        // make them mask the wrong tokens, so refuse it here rather than transcribe wrongly.
        let specials = [sot, sot_prev, no_speech, transcribe, translate, sot_lm];
        if specials.iter().any(|&s| s <= eot || s >= no_timestamps) {
            return Err(Error::Tokenizer(format!(
                "{}: the special tokens are not between <|endoftext|> ({eot}) and \
                 <|notimestamps|> ({no_timestamps}) as in every Whisper vocabulary",
                path.display()
            )));
        }
        if timestamp_begin >= vocab {
            return Err(Error::Tokenizer(format!(
                "{}: the model has {vocab} logits, so no room for timestamp tokens after \
                 <|notimestamps|> ({no_timestamps}); tokenizer and model do not match",
                path.display()
            )));
        }

        let blank = inner
            .encode(" ", false)
            .map_err(|e| Error::Tokenizer(format!("cannot encode \" \": {e}")))?
            .get_ids()
            .to_vec();
        let blank = match blank[..] {
            [b] => b,
            _ => {
                return Err(Error::Tokenizer(format!(
                    "{}: \" \" is not a single token ({blank:?}); not a Whisper tokenizer",
                    path.display()
                )))
            }
        };

        // Sentence ends, as single tokens (a draft's hint only: none found is no error).
        let sentence_ends = [".", "?", "!", "..."]
            .iter()
            .filter_map(|s| match inner.encode(*s, false).ok()?.get_ids() {
                [id] if *id < eot => Some(*id),
                _ => None,
            })
            .collect();

        // CTranslate2 calls a model multilingual by its vocabulary size (51865, large-v3
        // 51866); English-only vocabularies also hold language tokens, so their presence
        // tells nothing. Multilingual models are told the language (English) and the task,
        // as faster-whisper does with language="en".
        let sot_sequence = if vocab >= 51865 {
            vec![sot, id("<|en|>")?, transcribe]
        } else {
            vec![sot]
        };

        Ok(Self {
            inner,
            special: SpecialTokens {
                eot,
                sot,
                sot_prev,
                no_speech,
                no_timestamps,
                timestamp_begin,
                vocab,
                sentence_ends,
            },
            task_ids: [transcribe, translate, sot_lm],
            blank,
            sot_sequence,
        })
    }

    pub fn special(&self) -> &SpecialTokens {
        &self.special
    }

    /// The start of every window's prompt after the previous text (see `whisper::build_prompt`).
    pub fn sot_sequence(&self) -> &[u32] {
        &self.sot_sequence
    }

    /// `<|transcribe|>`, `<|translate|>` and `<|startoflm|>`.
    pub fn task_ids(&self) -> [u32; 3] {
        self.task_ids
    }

    /// The token of a single space: Whisper's suppress_blank masks it (and eot) at the first
    /// sampled position (CTranslate2's config.json calls this list `suppress_ids_begin`).
    pub fn blank_id(&self) -> u32 {
        self.blank
    }

    /// Text of `tokens`. Ids >= eot (specials and timestamps) are dropped first, as
    /// faster-whisper's `Tokenizer.decode` does.
    pub fn decode_text(&self, tokens: &[u32]) -> Result<String> {
        let text: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t < self.special.eot)
            .collect();
        self.inner
            .decode(&text, true)
            .map_err(|e| Error::Tokenizer(format!("cannot decode {} tokens: {e}", text.len())))
    }

    /// Token ids of `text`, without special tokens (e.g. for an initial prompt; faster-whisper
    /// prepends a space to prompt text before encoding).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer(format!("cannot encode text: {e}")))?
            .get_ids()
            .to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default model's tokenizer.json. This fails (never skips) when the model is
    /// missing: set VERBATIM_MODEL_DIR or install the default model.
    fn real_tokenizer() -> WhisperTokenizer {
        let dir = crate::models::whisper::default_model_dir();
        let path = dir.join("tokenizer.json");
        assert!(
            path.is_file(),
            "{} is missing: install the default model (tiny.en) or set VERBATIM_MODEL_DIR",
            path.display()
        );
        WhisperTokenizer::from_file(&path, 51864).expect("load tokenizer.json")
    }

    #[test]
    fn decode_tokenizer_special_ids_of_tiny_en() {
        let tok = real_tokenizer();
        assert_eq!(
            *tok.special(),
            SpecialTokens {
                eot: 50256,
                sot: 50257,
                sot_prev: 50360,
                no_speech: 50361,
                no_timestamps: 50362,
                timestamp_begin: 50363,
                vocab: 51864,
                sentence_ends: vec![13, 30, 0, 986],
            }
        );
        assert_eq!(tok.task_ids(), [50358, 50357, 50359]);
        assert_eq!(tok.blank_id(), 220);
        assert_eq!(tok.sot_sequence(), &[50257]);
    }

    #[test]
    fn decode_tokenizer_text_of_known_ids() {
        let tok = real_tokenizer();
        // Ids from faster-whisper's transcript of a LibriVox clip (tiny.en).
        let ids = [
            50363, 362, 13, 1649, 16571, 45764, 2236, 7284, 14566, 11906, 4772, 50801,
        ];
        assert_eq!(
            tok.decode_text(&ids).unwrap(),
            " 2. When forty winters shall besiege thy brow"
        );
        // Specials and timestamps are dropped, not rendered.
        assert_eq!(tok.decode_text(&[50257, 50256, 51000, 50362]).unwrap(), "");
        assert_eq!(tok.encode_text(" thy brow").unwrap(), vec![11906, 4772]);
    }

    #[test]
    fn decode_tokenizer_errors_are_values() {
        let missing = std::path::Path::new("/nonexistent/tokenizer.json");
        assert!(matches!(
            WhisperTokenizer::from_file(missing, 51864),
            Err(Error::Tokenizer(_))
        ));
        // A vocabulary too small to hold timestamps: the model does not match the tokenizer.
        let path = crate::models::whisper::default_model_dir().join("tokenizer.json");
        assert!(path.is_file(), "{} is missing", path.display());
        let err = WhisperTokenizer::from_file(&path, 50363)
            .err()
            .expect("must fail");
        assert!(
            matches!(err, Error::Tokenizer(ref m) if m.contains("timestamp")),
            "{err}"
        );
    }
}
