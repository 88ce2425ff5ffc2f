//! A CTranslate2 Whisper model directory (`model.bin`, `config.json`, `tokenizer.json`),
//! opened and validated as a whole.
//!
//! [`Checkpoint::open`] derives the model's [`Dims`] from the stored shapes and then checks
//! every tensor the engine will read against them, so that later stages can index weights
//! without re-checking: a corrupt or mismatched model fails here, once, with a sentence
//! naming the variable at fault, instead of as a panic or a wrong transcript later.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::ct2::{write_ct2, Ct2File, DType, TensorView};
use super::Dims;
use crate::{Error, Result};

/// The spec name CTranslate2's Whisper converter writes.
pub const SPEC: &str = "WhisperSpec";

/// `config.json` is a few kilobytes; refuse to read anything absurdly large into memory.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The decoding configuration CTranslate2 stores next to a Whisper model.
/// Missing keys read as empty lists; unknown keys are ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct WhisperConfig {
    /// Tokens never sampled (besides the special tokens the decoder suppresses itself).
    pub suppress_ids: Vec<u32>,
    /// Tokens suppressed at the first sampled position only.
    pub suppress_ids_begin: Vec<u32>,
    /// Language tokens, in the order of Whisper's language list (empty for `.en` models
    /// in some converters).
    pub lang_ids: Vec<u32>,
    /// `(decoder layer, head)` pairs whose cross-attention tracks time alignment.
    pub alignment_heads: Vec<(usize, usize)>,
}

/// An opened, validated Whisper model directory.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub dims: Dims,
    pub config: WhisperConfig,
    file: Ct2File,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("dims", &self.dims)
            .field("config", &self.config)
            .field("file", &self.file)
            .finish()
    }
}

impl Checkpoint {
    /// Reads `config.json` and maps `model.bin` from `dir`, derives [`Dims`] from the
    /// stored shapes and validates every tensor the model needs (present, a float or
    /// int8-with-scales dtype, the shape `Dims` implies), the architecture flags and the
    /// config's token ids.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if !dir.is_dir() {
            return Err(Error::model(
                dir,
                "the model directory does not exist (run packaging/fetch-model.sh to fetch \
                 the default model, or point VERBATIM_MODEL_DIR at a CTranslate2 Whisper model)",
            ));
        }
        let model_path = dir.join("model.bin");
        if !model_path.is_file() {
            return Err(Error::model(
                dir,
                "no model.bin in this directory (is this a CTranslate2 Whisper model directory?)",
            ));
        }
        let config = read_config(dir)?;
        let file = Ct2File::open(&model_path)?;
        if file.spec() != SPEC {
            return Err(Error::model(
                &model_path,
                format!(
                    "this is a `{}` model, not a Whisper model (`{SPEC}`)",
                    file.spec()
                ),
            ));
        }
        let dims = derive_dims(&file)?;
        validate_tensors(&file, &dims)?;
        validate_flags(&file)?;
        validate_config(&dir.join("config.json"), &config, &dims)?;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            dims,
            config,
            file,
        })
    }

    /// The underlying `model.bin`.
    pub fn file(&self) -> &Ct2File {
        &self.file
    }

    /// The variable `name` (aliases resolved); a missing one is an error naming it.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        self.file.get(name).ok_or_else(|| missing(&self.file, name))
    }

    /// `name` as f32, from any float dtype or int8 dequantized with its `<name>_scale`.
    pub fn f32(&self, name: &str) -> Result<Vec<f32>> {
        let view = self.tensor(name)?;
        match view.dtype {
            DType::F32 | DType::F16 | DType::BF16 => Ok(float_values(&view)),
            DType::I8 => dequantize(&self.file, &view),
            DType::I16 | DType::I32 => Err(not_a_weight(&self.file, &view)),
        }
    }

    /// `name` as IEEE half bits. Borrowed straight from the map when stored as float16 at
    /// a 2-byte-aligned offset (CTranslate2 does not align data, so roughly half of the
    /// tensors qualify); otherwise converted, rounding to nearest even. A value outside
    /// float16's range is an error rather than a silent infinity.
    pub fn f16_bits(&self, name: &str) -> Result<Cow<'_, [u16]>> {
        let view = self.tensor(name)?;
        if view.dtype == DType::F16 {
            // The file is little-endian: borrowing is only a reinterpretation on LE hosts.
            if cfg!(target_endian = "little") {
                if let Ok(bits) = bytemuck::try_cast_slice::<u8, u16>(view.bytes) {
                    return Ok(Cow::Borrowed(bits));
                }
                // Unaligned: one copy of the bytes (a memcpy; the pairs one by one ran at
                // ~0.7 GB/s, half of a tiny.en load's host work).
                let pairs = view.bytes.len() / 2;
                let mut bits = vec![0u16; pairs];
                bytemuck::cast_slice_mut::<u16, u8>(&mut bits).copy_from_slice(&view.bytes[..pairs * 2]);
                return Ok(Cow::Owned(bits));
            }
            let bits = view
                .bytes
                .chunks_exact(2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
                .collect();
            return Ok(Cow::Owned(bits));
        }
        let values = self.f32(name)?;
        let mut bits = Vec::with_capacity(values.len());
        for (i, &x) in values.iter().enumerate() {
            let h = half::f16::from_f32(x);
            if x.is_finite() && !h.is_finite() {
                return Err(Error::model(
                    self.file.path(),
                    format!(
                        "variable `{}`: value {x} at index {i} is outside float16's range \
                         (±65504)",
                        view.name
                    ),
                ));
            }
            bits.push(h.to_bits());
        }
        Ok(Cow::Owned(bits))
    }

    /// Where the Hugging Face tokenizer of this model lives (not checked here).
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join("tokenizer.json")
    }
}

fn read_config(dir: &Path) -> Result<WhisperConfig> {
    let path = dir.join("config.json");
    let meta = match std::fs::metadata(&path) {
        Ok(m) if m.is_file() => m,
        _ => {
            return Err(Error::model(
                dir,
                "no config.json in this directory (is this a CTranslate2 Whisper model \
                 directory?)",
            ))
        }
    };
    if meta.len() > MAX_CONFIG_BYTES {
        return Err(Error::model(
            &path,
            format!(
                "config.json is {} bytes, far too large to be a model config",
                meta.len()
            ),
        ));
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| {
        Error::model(
            &path,
            format!("config.json is not a valid Whisper config: {e}"),
        )
    })
}

fn missing(file: &Ct2File, name: &str) -> Error {
    Error::model(file.path(), format!("variable `{name}` is missing"))
}

fn not_a_weight(file: &Ct2File, view: &TensorView<'_>) -> Error {
    Error::model(
        file.path(),
        format!(
            "variable `{}` is stored as {}; weights must be float32, float16, bfloat16 or \
             int8 with scales",
            view.name, view.dtype
        ),
    )
}

/// A float tensor's values as f32 (the caller has checked the dtype is a float).
fn float_values(view: &TensorView<'_>) -> Vec<f32> {
    let b = view.bytes;
    match view.dtype {
        DType::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        DType::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32())
            .collect(),
        DType::I8 | DType::I16 | DType::I32 => unreachable!("float_values on {}", view.dtype),
    }
}

/// The per-row scales of int8 `view`, checked: CTranslate2 stores `<name>_scale`, one
/// float per output row (`dims[0]`), with `value = int8 / scale`. A single scale for the
/// whole tensor is accepted too. Scales must be finite and non-zero, or dequantizing
/// would produce infinities.
fn int8_scales(file: &Ct2File, view: &TensorView<'_>) -> Result<Vec<f32>> {
    let scale_name = format!("{}_scale", view.name);
    let err = |reason: String| Error::model(file.path(), reason);
    let scale = file.get(&scale_name).ok_or_else(|| {
        err(format!(
            "variable `{}` is int8 but its scales `{scale_name}` are missing",
            view.name
        ))
    })?;
    if !scale.dtype.is_float() {
        return Err(err(format!(
            "variable `{scale_name}` (scales of int8 `{}`) is {}, not a float type",
            view.name, scale.dtype
        )));
    }
    let rows = view.dims.first().copied().unwrap_or(1);
    if scale.numel() != rows && scale.numel() != 1 {
        return Err(err(format!(
            "variable `{scale_name}` holds {} scales but int8 `{}` of shape {:?} has {rows} rows",
            scale.numel(),
            view.name,
            view.dims
        )));
    }
    let values = float_values(&scale);
    if let Some((i, s)) = values
        .iter()
        .enumerate()
        .find(|(_, s)| !s.is_finite() || **s == 0.0)
    {
        return Err(err(format!(
            "variable `{scale_name}`: scale {s} at row {i} is not a usable int8 scale \
             (it must be finite and non-zero)"
        )));
    }
    Ok(values)
}

fn dequantize(file: &Ct2File, view: &TensorView<'_>) -> Result<Vec<f32>> {
    let scales = int8_scales(file, view)?;
    let rows = view.dims.first().copied().unwrap_or(1).max(1);
    let per_row = view.bytes.len() / rows;
    Ok(view
        .bytes
        .iter()
        .enumerate()
        .map(|(i, &q)| {
            let s = if scales.len() == 1 {
                scales[0]
            } else {
                scales[i / per_row]
            };
            q as i8 as f32 / s
        })
        .collect())
}

/// The shape of `name`, which must exist and have rank `rank`; `form` describes the
/// expected shape for the error message.
fn shape<'a>(file: &'a Ct2File, name: &str, rank: usize, form: &str) -> Result<&'a [usize]> {
    let view = file.get(name).ok_or_else(|| missing(file, name))?;
    if view.dims.len() != rank || view.dims.contains(&0) {
        return Err(Error::model(
            file.path(),
            format!(
                "variable `{name}` has shape {:?} but Whisper needs {form}",
                view.dims
            ),
        ));
    }
    Ok(view.dims)
}

/// An integer scalar such as `encoder/num_heads`, if present.
fn scalar(file: &Ct2File, name: &str) -> Result<Option<i64>> {
    let Some(view) = file.get(name) else {
        return Ok(None);
    };
    view.scalar_i64().map(Some).ok_or_else(|| {
        Error::model(
            file.path(),
            format!(
                "variable `{name}` should be an integer scalar but is {} of shape {:?}",
                view.dtype, view.dims
            ),
        )
    })
}

/// Number of layers under `prefix` (`encoder` or `decoder`), found by scanning names for
/// `<prefix>/layer_<i>/`. Layers must be numbered 0..n without gaps; requiring that the
/// distinct indices found are exactly 0..n also bounds n by the number of variables, so a
/// corrupt index such as `layer_4000000000` cannot make validation loop for ages.
fn count_layers(file: &Ct2File, prefix: &str) -> Result<usize> {
    let start = format!("{prefix}/layer_");
    let mut seen = std::collections::BTreeMap::<usize, &str>::new();
    for name in file.names() {
        let Some(rest) = name.strip_prefix(&start) else {
            continue;
        };
        let Some((index, _)) = rest.split_once('/') else {
            continue;
        };
        // `layer_norm/...` shares the prefix; only all-digit indices are layers.
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let i: usize = index.parse().map_err(|_| {
            Error::model(
                file.path(),
                format!("variable `{name}` has an unreadable layer number"),
            )
        })?;
        seen.entry(i).or_insert(name);
    }
    let Some((&last, &last_name)) = seen.iter().next_back() else {
        return Err(Error::model(
            file.path(),
            format!("the {prefix} has no layers (no variable named `{start}0/...`)"),
        ));
    };
    if last + 1 != seen.len() {
        let gap = (0..).find(|i| !seen.contains_key(i)).unwrap_or(0);
        return Err(Error::model(
            file.path(),
            format!(
                "variable `{last_name}` belongs to {prefix} layer {last} but layer {gap} has no \
                 variables (layers must be numbered 0 to n-1)"
            ),
        ));
    }
    Ok(seen.len())
}

/// Reads the geometry off the shapes of a few defining tensors.
fn derive_dims(file: &Ct2File) -> Result<Dims> {
    let err = |reason: String| Error::model(file.path(), reason);
    let conv1 = shape(file, "encoder/conv1/weight", 3, "[d_model, n_mels, 3]")?;
    if conv1[2] != 3 {
        return Err(err(format!(
            "variable `encoder/conv1/weight` has shape {conv1:?} but Whisper's first \
             convolution has kernel width 3"
        )));
    }
    let (d_model, n_mels) = (conv1[0], conv1[1]);

    let enc_heads =
        scalar(file, "encoder/num_heads")?.ok_or_else(|| missing(file, "encoder/num_heads"))?;
    if let Some(dec_heads) = scalar(file, "decoder/num_heads")? {
        // Dims has one head count; Whisper uses the same in both halves.
        if dec_heads != enc_heads {
            return Err(err(format!(
                "variable `decoder/num_heads` is {dec_heads} but `encoder/num_heads` is \
                 {enc_heads}; Whisper uses the same head count in both"
            )));
        }
    }
    let n_heads = usize::try_from(enc_heads)
        .ok()
        .filter(|&h| h > 0 && d_model % h == 0)
        .ok_or_else(|| {
            err(format!(
                "variable `encoder/num_heads` is {enc_heads}, which does not divide d_model \
                 {d_model} into heads"
            ))
        })?;

    // Layers before the per-layer tensors, so a model without any says so plainly.
    let encoder_layers = count_layers(file, "encoder")?;
    let decoder_layers = count_layers(file, "decoder")?;
    let ffn = shape(
        file,
        "encoder/layer_0/ffn/linear_0/weight",
        2,
        "[ffn, d_model]",
    )?[0];
    let vocab = shape(file, "decoder/embeddings/weight", 2, "[vocab, d_model]")?[0];
    let audio_ctx = shape(
        file,
        "encoder/position_encodings/encodings",
        2,
        "[audio_ctx, d_model]",
    )?[0];
    let text_ctx = shape(
        file,
        "decoder/position_encodings/encodings",
        2,
        "[text_ctx, d_model]",
    )?[0];

    Ok(Dims {
        n_mels,
        d_model,
        n_heads,
        encoder_layers,
        decoder_layers,
        ffn,
        vocab,
        audio_ctx,
        text_ctx,
    })
}

/// Every stored tensor the engine reads, with the shape `dims` implies, in CTranslate2's
/// WhisperSpec naming. `decoder/projection/weight` (usually an alias of the embeddings)
/// and the integer scalars are not listed.
pub fn whisper_tensors(dims: &Dims) -> Vec<(String, Vec<usize>)> {
    // Saturating: dims come from a file; an absurd value must turn into a shape mismatch,
    // not an overflow panic.
    let d = dims.d_model;
    let x = |k: usize| k.saturating_mul(d);
    let mut t: Vec<(String, Vec<usize>)> = Vec::new();
    let mut add = |name: String, shape: Vec<usize>| t.push((name, shape));
    let linear = |add: &mut dyn FnMut(String, Vec<usize>), p: &str, rows: usize, cols: usize| {
        add(format!("{p}/weight"), vec![rows, cols]);
        add(format!("{p}/bias"), vec![rows]);
    };
    let norm = |add: &mut dyn FnMut(String, Vec<usize>), p: &str| {
        add(format!("{p}/gamma"), vec![d]);
        add(format!("{p}/beta"), vec![d]);
    };
    let ffn = |add: &mut dyn FnMut(String, Vec<usize>), p: &str| {
        norm(add, &format!("{p}/ffn/layer_norm"));
        linear(add, &format!("{p}/ffn/linear_0"), dims.ffn, d);
        linear(add, &format!("{p}/ffn/linear_1"), d, dims.ffn);
    };
    let self_attention = |add: &mut dyn FnMut(String, Vec<usize>), p: &str| {
        norm(add, &format!("{p}/self_attention/layer_norm"));
        linear(add, &format!("{p}/self_attention/linear_0"), x(3), d); // fused Q|K|V
        linear(add, &format!("{p}/self_attention/linear_1"), d, d);
    };

    add("encoder/conv1/weight".into(), vec![d, dims.n_mels, 3]);
    add("encoder/conv1/bias".into(), vec![d]);
    add("encoder/conv2/weight".into(), vec![d, d, 3]);
    add("encoder/conv2/bias".into(), vec![d]);
    add(
        "encoder/position_encodings/encodings".into(),
        vec![dims.audio_ctx, d],
    );
    for i in 0..dims.encoder_layers {
        let p = format!("encoder/layer_{i}");
        self_attention(&mut add, &p);
        ffn(&mut add, &p);
    }
    norm(&mut add, "encoder/layer_norm");

    add("decoder/embeddings/weight".into(), vec![dims.vocab, d]);
    add(
        "decoder/position_encodings/encodings".into(),
        vec![dims.text_ctx, d],
    );
    for i in 0..dims.decoder_layers {
        let p = format!("decoder/layer_{i}");
        self_attention(&mut add, &p);
        norm(&mut add, &format!("{p}/attention/layer_norm"));
        linear(&mut add, &format!("{p}/attention/linear_0"), d, d); // cross-attention query
        linear(&mut add, &format!("{p}/attention/linear_1"), x(2), d); // fused cross K|V
        linear(&mut add, &format!("{p}/attention/linear_2"), d, d);
        ffn(&mut add, &p);
    }
    norm(&mut add, "decoder/layer_norm");
    t
}

fn describe(dims: &Dims) -> String {
    format!(
        "n_mels {}, d_model {}, ffn {}, vocab {}, audio_ctx {}, text_ctx {}",
        dims.n_mels, dims.d_model, dims.ffn, dims.vocab, dims.audio_ctx, dims.text_ctx
    )
}

fn check_tensor(file: &Ct2File, dims: &Dims, name: &str, expected: &[usize]) -> Result<()> {
    let view = file.get(name).ok_or_else(|| missing(file, name))?;
    if view.dims != expected {
        return Err(Error::model(
            file.path(),
            format!(
                "variable `{name}` has shape {:?} but this model ({}) needs {expected:?}",
                view.dims,
                describe(dims)
            ),
        ));
    }
    match view.dtype {
        DType::F32 | DType::F16 | DType::BF16 => Ok(()),
        DType::I8 => int8_scales(file, &view).map(drop),
        DType::I16 | DType::I32 => Err(not_a_weight(file, &view)),
    }
}

fn validate_tensors(file: &Ct2File, dims: &Dims) -> Result<()> {
    for (name, expected) in whisper_tensors(dims) {
        check_tensor(file, dims, &name, &expected)?;
    }
    // The output projection: CTranslate2 ties it to the embeddings with an alias, but a
    // converter may store it on its own; either way it must be there with this shape.
    check_tensor(
        file,
        dims,
        "decoder/projection/weight",
        &[dims.vocab, dims.d_model],
    )
}

/// Architecture switches CTranslate2's generic Transformer spec stores as scalars. The
/// engine implements Whisper only, so a model that flips one of them would decode into a
/// silently wrong transcript; refuse it instead. Each is checked only when present
/// (older converters omit some).
fn validate_flags(file: &Ct2File) -> Result<()> {
    const FLAGS: &[(&str, i64, &str)] = &[
        ("decoder/pre_norm", 1, "layer norm before each block"),
        (
            "decoder/activation",
            3,
            "exact GELU (CTranslate2 activation 3)",
        ),
        ("decoder/alibi", 0, "learned positions, no ALiBi"),
        ("decoder/scale_embeddings", 0, "unscaled embeddings"),
        (
            "decoder/start_from_zero_embedding",
            0,
            "no zero start embedding",
        ),
    ];
    for &(name, want, meaning) in FLAGS {
        if let Some(got) = scalar(file, name)? {
            if got != want {
                return Err(Error::model(
                    file.path(),
                    format!(
                        "variable `{name}` is {got} but Whisper needs {want} ({meaning}); the \
                         engine cannot run this model"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Token ids and alignment heads must fit the model, or decoding would index out of range.
fn validate_config(path: &Path, config: &WhisperConfig, dims: &Dims) -> Result<()> {
    for (key, ids) in [
        ("suppress_ids", &config.suppress_ids),
        ("suppress_ids_begin", &config.suppress_ids_begin),
        ("lang_ids", &config.lang_ids),
    ] {
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= dims.vocab) {
            return Err(Error::model(
                path,
                format!(
                    "`{key}` contains token {id} but the model's vocabulary has {} tokens",
                    dims.vocab
                ),
            ));
        }
    }
    if let Some(&(layer, head)) = config
        .alignment_heads
        .iter()
        .find(|&&(l, h)| l >= dims.decoder_layers || h >= dims.n_heads)
    {
        return Err(Error::model(
            path,
            format!(
                "`alignment_heads` names layer {layer} head {head} but the decoder has {} layers \
                 of {} heads",
                dims.decoder_layers, dims.n_heads
            ),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Synthetic checkpoints, for tests here and in other modules.

/// A small deterministic generator (SplitMix64), so synthetic models need no `rand` in
/// the library and are identical on every machine.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), never closer to 0 than 1/64 (tests want non-zero values).
    fn signed(&mut self) -> f32 {
        let u = (self.next() >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
        let x = 2.0 * u - 1.0;
        if x.abs() < 1.0 / 64.0 {
            x.signum() / 64.0 + x
        } else {
            x
        }
    }
}

/// The tensors of a random Whisper with geometry `dims`, as f32: `(name, shape, values)`
/// in [`whisper_tensors`] order. Values are non-zero and scaled so a forward pass stays
/// in a sane range: weights ~ 1/sqrt(fan-in), layer-norm gains near 1.
pub fn synthetic_tensors(dims: &Dims, seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let mut rng = SplitMix(seed ^ 0x7768_6973_7065_7200);
    whisper_tensors(dims)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let fan_in: usize = shape[1..].iter().product::<usize>().max(1);
            let values = (0..n)
                .map(|_| {
                    let r = rng.signed();
                    if name.ends_with("/gamma") {
                        1.0 + 0.1 * r
                    } else if name.ends_with("/weight") {
                        r / (fan_in as f32).sqrt()
                    } else {
                        0.1 * r
                    }
                })
                .collect();
            (name, shape, values)
        })
        .collect()
}

/// Quantizes row-major `values` with `rows` rows as CTranslate2 does: per row,
/// `scale = 127 / max|x|` and `q = round(x * scale)`.
pub fn quantize_int8(values: &[f32], rows: usize) -> (Vec<i8>, Vec<f32>) {
    let per_row = values.len() / rows.max(1);
    let mut q = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(rows);
    for row in values.chunks(per_row.max(1)) {
        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = if amax > 0.0 { 127.0 / amax } else { 1.0 };
        q.extend(
            row.iter()
                .map(|x| (x * scale).round().clamp(-127.0, 127.0) as i8),
        );
        scales.push(scale);
    }
    (q, scales)
}

/// A variable as [`write_ct2`] takes it: name, shape, dtype, stored bytes.
pub type Ct2Var = (String, Vec<usize>, DType, Vec<u8>);
/// `(alias, target)`, as [`write_ct2`] takes it.
pub type Ct2Alias = (String, String);

/// The variables and aliases of [`synthetic_tensors`] encoded for `write_ct2`: floats as
/// `dtype` (F32, F16 or BF16), or with `DType::I8` the matrices (`.../weight` of rank >= 2)
/// as int8 + f32 `_scale` and everything else f32, as CTranslate2's `int8` quantization
/// stores them. Integer scalars (head counts, flags) are added as the real converter
/// writes them.
pub fn synthetic_vars(
    dims: &Dims,
    dtype: DType,
    seed: u64,
) -> std::io::Result<(Vec<Ct2Var>, Vec<Ct2Alias>)> {
    let float = |values: &[f32], dtype: DType| -> Vec<u8> {
        match dtype {
            DType::F16 => values
                .iter()
                .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                .collect(),
            DType::BF16 => values
                .iter()
                .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
                .collect(),
            _ => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    };
    if matches!(dtype, DType::I16 | DType::I32) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("synthetic Whisper weights cannot be stored as {dtype}"),
        ));
    }
    let mut vars = Vec::new();
    for (name, shape, values) in synthetic_tensors(dims, seed) {
        if dtype == DType::I8 && name.ends_with("/weight") && shape.len() >= 2 {
            let (q, scales) = quantize_int8(&values, shape[0]);
            vars.push((
                name.clone(),
                shape.clone(),
                DType::I8,
                q.iter().map(|&v| v as u8).collect(),
            ));
            vars.push((
                format!("{name}_scale"),
                vec![shape[0]],
                DType::F32,
                float(&scales, DType::F32),
            ));
        } else {
            let stored = if dtype == DType::I8 {
                DType::F32
            } else {
                dtype
            };
            vars.push((name, shape, stored, float(&values, stored)));
        }
    }
    let heads = (dims.n_heads as i16).to_le_bytes().to_vec();
    vars.push((
        "encoder/num_heads".into(),
        vec![],
        DType::I16,
        heads.clone(),
    ));
    vars.push(("decoder/num_heads".into(), vec![], DType::I16, heads));
    for (flag, value) in [
        ("decoder/activation", 3u8),
        ("decoder/alibi", 0),
        ("decoder/pre_norm", 1),
        ("decoder/scale_embeddings", 0),
        ("decoder/start_from_zero_embedding", 0),
    ] {
        vars.push((flag.into(), vec![], DType::I8, vec![value]));
    }
    vars.push((
        "decoder/alignment_layer".into(),
        vec![],
        DType::I16,
        (-1i16).to_le_bytes().to_vec(),
    ));
    let aliases = vec![(
        "decoder/projection/weight".into(),
        "decoder/embeddings/weight".into(),
    )];
    Ok((vars, aliases))
}

/// A `config.json` that fits `dims`: a few suppressed ids, one alignment head.
pub fn synthetic_config_json(dims: &Dims) -> String {
    let v = dims.vocab as u32;
    let ids = |ids: &[u32]| {
        ids.iter()
            .filter(|&&i| i < v)
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "{{\n  \"suppress_ids\": [{}],\n  \"suppress_ids_begin\": [{}],\n  \"lang_ids\": [],\n  \
         \"alignment_heads\": [[{}, 0]]\n}}\n",
        ids(&[1, 2, 7]),
        ids(&[v.saturating_sub(1)]),
        dims.decoder_layers.saturating_sub(1)
    )
}

/// Writes a random Whisper of geometry `dims` (weights stored as `dtype`, see
/// [`synthetic_vars`]) as `model.bin` + `config.json` in `dir`, which must exist. No
/// tokenizer is written. Tests read the expected values back from [`synthetic_tensors`]
/// with the same seed.
pub fn write_synthetic(dir: &Path, dims: &Dims, dtype: DType, seed: u64) -> std::io::Result<()> {
    let (vars, aliases) = synthetic_vars(dims, dtype, seed)?;
    write_ct2(&dir.join("model.bin"), SPEC, 3, &vars, &aliases)?;
    std::fs::write(dir.join("config.json"), synthetic_config_json(dims))
}

#[cfg(test)]
mod tests {
    use super::super::ct2::tests::temp_dir;
    use super::*;

    const SMALL: Dims = Dims {
        n_mels: 4,
        d_model: 8,
        n_heads: 2,
        encoder_layers: 1,
        decoder_layers: 1,
        ffn: 32,
        vocab: 20,
        audio_ctx: 6,
        text_ctx: 5,
    };

    /// Two layers each side, to exercise layer counting beyond the trivial case.
    const TWO_LAYERS: Dims = Dims {
        encoder_layers: 2,
        decoder_layers: 2,
        ..SMALL
    };

    fn err_text(dir: &Path) -> String {
        match Checkpoint::open(dir) {
            Ok(c) => panic!("opened a bad checkpoint: {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// Writes `vars`/`aliases` with a config fitting SMALL into a fresh directory.
    fn write_dir(tag: &str, vars: &[Ct2Var], aliases: &[(String, String)]) -> PathBuf {
        let dir = temp_dir(tag);
        write_ct2(&dir.join("model.bin"), SPEC, 3, vars, aliases).unwrap();
        std::fs::write(dir.join("config.json"), synthetic_config_json(&SMALL)).unwrap();
        dir
    }

    fn small_vars(dtype: DType) -> (Vec<Ct2Var>, Vec<(String, String)>) {
        synthetic_vars(&SMALL, dtype, 1).unwrap()
    }

    /// Largest allowed |stored - original| for a value `x` in a row whose max is `amax`.
    fn tolerance(dtype: DType, x: f32, amax: f32) -> f32 {
        match dtype {
            DType::F32 => 0.0,
            DType::F16 => x.abs() * 2f32.powi(-11) + 1e-7,
            DType::BF16 => x.abs() * 2f32.powi(-8),
            // Half a quantization step, plus float slack in the scale.
            _ => amax / 127.0 * 0.5 + amax * 1e-6,
        }
    }

    #[test]
    fn synthetic_checkpoints_round_trip() {
        for dims in [SMALL, TWO_LAYERS] {
            for dtype in [DType::F32, DType::F16, DType::BF16, DType::I8] {
                let dir = temp_dir("ckpt-rt");
                write_synthetic(&dir, &dims, dtype, 42).unwrap();
                let ckpt = Checkpoint::open(&dir).unwrap();
                assert_eq!(ckpt.dims, dims, "{dtype}");
                assert_eq!(ckpt.file().spec(), SPEC);
                assert_eq!(ckpt.config.suppress_ids, [1, 2, 7]);
                assert_eq!(ckpt.config.suppress_ids_begin, [19]);
                assert_eq!(ckpt.config.alignment_heads, [(dims.decoder_layers - 1, 0)]);
                assert_eq!(ckpt.tokenizer_path(), dir.join("tokenizer.json"));

                for (name, shape, want) in synthetic_tensors(&dims, 42) {
                    let view = ckpt.tensor(&name).unwrap();
                    assert_eq!(view.dims, &shape[..], "{name}");
                    let got = ckpt.f32(&name).unwrap();
                    assert_eq!(got.len(), want.len(), "{name}");
                    let quantized = view.dtype == DType::I8;
                    let per_row = want.len() / shape[0];
                    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                        let row = &want[i / per_row * per_row..][..per_row];
                        let amax = row.iter().fold(0f32, |m, x| m.max(x.abs()));
                        let tol =
                            tolerance(if quantized { DType::I8 } else { view.dtype }, w, amax);
                        assert!((g - w).abs() <= tol, "{name}[{i}] ({dtype}): {g} vs {w}");
                    }
                    // f16 bits: exactly the f16 rounding of whatever f32 holds.
                    let bits = ckpt.f16_bits(&name).unwrap();
                    assert_eq!(bits.len(), got.len());
                    for (i, (&b, &g)) in bits.iter().zip(&got).enumerate() {
                        assert_eq!(b, half::f16::from_f32(g).to_bits(), "{name}[{i}] ({dtype})");
                    }
                }
                // The tied output projection resolves to the embeddings, same bytes.
                let proj = ckpt.tensor("decoder/projection/weight").unwrap();
                let emb = ckpt.tensor("decoder/embeddings/weight").unwrap();
                assert_eq!(proj.name, "decoder/embeddings/weight");
                assert_eq!(proj.bytes.as_ptr(), emb.bytes.as_ptr());

                let e = ckpt
                    .tensor("decoder/layer_9/ffn/linear_0/weight")
                    .unwrap_err()
                    .to_string();
                assert!(
                    e.contains("variable `decoder/layer_9/ffn/linear_0/weight` is missing"),
                    "{e}"
                );
                let e = ckpt.f32("encoder/num_heads").unwrap_err().to_string();
                assert!(e.contains("`encoder/num_heads` is stored as int16"), "{e}");
                std::fs::remove_dir_all(&dir).unwrap();
            }
        }
    }

    #[test]
    fn f16_bits_borrow_aligned_float16() {
        let dir = temp_dir("ckpt-borrow");
        write_synthetic(&dir, &SMALL, DType::F16, 7).unwrap();
        let ckpt = Checkpoint::open(&dir).unwrap();
        let (mut borrowed, mut owned) = (0, 0);
        for (name, _) in whisper_tensors(&SMALL) {
            let aligned = ckpt.tensor(&name).unwrap().bytes.as_ptr().align_offset(2) == 0;
            match ckpt.f16_bits(&name).unwrap() {
                Cow::Borrowed(_) => {
                    assert!(aligned, "{name}");
                    borrowed += 1;
                }
                Cow::Owned(_) => {
                    assert!(
                        !aligned || cfg!(target_endian = "big"),
                        "{name} copied needlessly"
                    );
                    owned += 1;
                }
            }
        }
        // The file's name lengths put tensors at both parities; both paths are exercised.
        assert!(
            borrowed > 0 && owned > 0,
            "borrowed {borrowed}, owned {owned}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn f16_overflow_is_an_error() {
        let (mut vars, aliases) = small_vars(DType::F32);
        let v = vars
            .iter_mut()
            .find(|v| v.0 == "encoder/conv2/bias")
            .unwrap();
        v.3[4..8].copy_from_slice(&1.0e6f32.to_le_bytes());
        let dir = write_dir("ckpt-ovf", &vars, &aliases);
        let ckpt = Checkpoint::open(&dir).unwrap();
        assert_eq!(ckpt.f32("encoder/conv2/bias").unwrap()[1], 1.0e6);
        let e = ckpt.f16_bits("encoder/conv2/bias").unwrap_err().to_string();
        assert!(
            e.contains("variable `encoder/conv2/bias`: value 1000000 at index 1"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn missing_files_are_errors() {
        let dir = temp_dir("ckpt-files");
        let gone = dir.join("does-not-exist");
        let e = err_text(&gone);
        assert!(
            e.contains("does not exist") && e.contains("packaging/fetch-model.sh"),
            "{e}"
        );

        let e = err_text(&dir);
        assert!(
            e.contains("no model.bin") && e.contains(&dir.display().to_string()),
            "{e}"
        );

        write_synthetic(&dir, &SMALL, DType::F32, 3).unwrap();
        std::fs::remove_file(dir.join("config.json")).unwrap();
        let e = err_text(&dir);
        assert!(e.contains("no config.json"), "{e}");

        std::fs::write(dir.join("config.json"), "{ not json").unwrap();
        let e = err_text(&dir);
        assert!(
            e.contains("config.json is not a valid Whisper config"),
            "{e}"
        );
        std::fs::write(dir.join("config.json"), r#"{"suppress_ids": [-1]}"#).unwrap();
        assert!(err_text(&dir).contains("config.json"));

        // Missing keys are empty lists.
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        assert_eq!(
            Checkpoint::open(&dir).unwrap().config,
            WhisperConfig::default()
        );

        std::fs::write(dir.join("model.bin"), b"").unwrap();
        let e = err_text(&dir);
        assert!(e.contains("empty"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_missing_tensor_is_named() {
        let (vars, aliases) = small_vars(DType::F16);
        let needed: Vec<String> = whisper_tensors(&SMALL).into_iter().map(|t| t.0).collect();
        for name in needed
            .iter()
            .chain(["encoder/num_heads".to_string()].iter())
        {
            let kept: Vec<Ct2Var> = vars.iter().filter(|v| &v.0 != name).cloned().collect();
            // Without the embeddings the projection alias would dangle, which the file
            // parser reports first (tested in ct2); drop it to reach the checkpoint's check.
            let aliases = if name == "decoder/embeddings/weight" {
                &[][..]
            } else {
                &aliases[..]
            };
            let dir = write_dir("ckpt-miss", &kept, aliases);
            let e = err_text(&dir);
            assert!(
                e.contains(&format!("variable `{name}` is missing")),
                "{name}: {e}"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
        // The projection, when neither alias nor variable.
        let dir = write_dir("ckpt-miss", &vars, &[]);
        let e = err_text(&dir);
        assert!(
            e.contains("variable `decoder/projection/weight` is missing"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_wrong_shape_is_named() {
        let (vars, aliases) = small_vars(DType::F32);
        for (name, shape) in whisper_tensors(&SMALL) {
            // Same bytes, another shape: consistent for the file, wrong for the model.
            let reshaped = match shape.len() {
                1 => vec![shape[0], 1],
                2 => vec![shape[0] * shape[1]],
                _ => vec![shape[0], shape[1] * shape[2]],
            };
            let mut bad = vars.clone();
            bad.iter_mut().find(|v| v.0 == name).unwrap().1 = reshaped;
            let dir = write_dir("ckpt-shape", &bad, &aliases);
            let e = err_text(&dir);
            assert!(
                e.contains(&format!("variable `{name}` has shape")),
                "{name}: {e}"
            );
            std::fs::remove_dir_all(&dir).unwrap();
        }
        // A transposed fused QKV: right size, wrong orientation.
        let mut bad = vars.clone();
        let name = "decoder/layer_0/self_attention/linear_0/weight";
        bad.iter_mut().find(|v| v.0 == name).unwrap().1 = vec![8, 24];
        let dir = write_dir("ckpt-shape", &bad, &aliases);
        let e = err_text(&dir);
        assert!(
            e.contains(&format!("variable `{name}` has shape [8, 24]")) && e.contains("[24, 8]"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_weight_dtypes_and_scales_are_named() {
        let name = "encoder/layer_0/ffn/linear_1/weight";
        let scale = format!("{name}_scale");
        let (vars, aliases) = small_vars(DType::I8);
        let cases: Vec<(Vec<Ct2Var>, String)> = vec![
            (
                vars.iter().filter(|v| v.0 != scale).cloned().collect(),
                format!("variable `{name}` is int8 but its scales `{scale}` are missing"),
            ),
            (
                vars.iter()
                    .map(|v| {
                        if v.0 == scale {
                            (v.0.clone(), vec![3], DType::F32, vec![0; 12])
                        } else {
                            v.clone()
                        }
                    })
                    .collect(),
                format!("variable `{scale}` holds 3 scales"),
            ),
            (
                vars.iter()
                    .map(|v| {
                        let mut v = v.clone();
                        if v.0 == scale {
                            v.3[4..8].copy_from_slice(&0f32.to_le_bytes());
                        }
                        v
                    })
                    .collect(),
                format!("variable `{scale}`: scale 0 at row 1"),
            ),
            (
                vars.iter()
                    .map(|v| {
                        if v.0 == scale {
                            (v.0.clone(), v.1.clone(), DType::I32, v.3.clone())
                        } else {
                            v.clone()
                        }
                    })
                    .collect(),
                "is int32, not a float type".to_string(),
            ),
            (
                vars.iter()
                    .map(|v| {
                        if v.0 == name {
                            (v.0.clone(), v.1.clone(), DType::I16, vec![0; v.3.len() * 2])
                        } else {
                            v.clone()
                        }
                    })
                    .collect(),
                format!("variable `{name}` is stored as int16"),
            ),
        ];
        for (bad, want) in cases {
            let dir = write_dir("ckpt-dtype", &bad, &aliases);
            let e = err_text(&dir);
            assert!(e.contains(&want), "want {want:?}: {e}");
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    /// Replaces (or adds) an integer scalar.
    fn with_scalar(vars: &[Ct2Var], name: &str, dtype: DType, bytes: Vec<u8>) -> Vec<Ct2Var> {
        let mut out: Vec<Ct2Var> = vars.iter().filter(|v| v.0 != name).cloned().collect();
        out.push((name.into(), vec![], dtype, bytes));
        out
    }

    #[test]
    fn bad_heads_flags_and_layers_are_errors() {
        let (vars, aliases) = small_vars(DType::F32);
        let i16b = |v: i16| v.to_le_bytes().to_vec();
        let cases: Vec<(Vec<Ct2Var>, &str)> = vec![
            (
                with_scalar(&vars, "decoder/num_heads", DType::I16, i16b(4)),
                "variable `decoder/num_heads` is 4 but `encoder/num_heads` is 2",
            ),
            (
                with_scalar(
                    &with_scalar(&vars, "decoder/num_heads", DType::I16, i16b(3)),
                    "encoder/num_heads",
                    DType::I16,
                    i16b(3),
                ),
                "variable `encoder/num_heads` is 3, which does not divide d_model 8",
            ),
            (
                with_scalar(&vars, "encoder/num_heads", DType::I16, i16b(-2)),
                "`encoder/num_heads` is -2",
            ),
            (
                with_scalar(
                    &vars,
                    "encoder/num_heads",
                    DType::F32,
                    2f32.to_le_bytes().to_vec(),
                ),
                "variable `encoder/num_heads` should be an integer scalar but is float32",
            ),
            (
                with_scalar(&vars, "decoder/pre_norm", DType::I8, vec![0]),
                "variable `decoder/pre_norm` is 0 but Whisper needs 1",
            ),
            (
                with_scalar(&vars, "decoder/activation", DType::I8, vec![1]),
                "variable `decoder/activation` is 1 but Whisper needs 3",
            ),
            (
                vars.iter()
                    .map(|v| {
                        let mut v = v.clone();
                        v.0 = v.0.replace("decoder/layer_0/", "decoder/layer_1/");
                        v
                    })
                    .collect(),
                "belongs to decoder layer 1 but layer 0 has no variables",
            ),
            (
                vars.iter()
                    .filter(|v| !v.0.starts_with("encoder/layer_"))
                    .cloned()
                    .collect(),
                "the encoder has no layers",
            ),
        ];
        for (bad, want) in cases {
            let dir = write_dir("ckpt-heads", &bad, &aliases);
            let e = err_text(&dir);
            assert!(e.contains(want), "want {want:?}: {e}");
            std::fs::remove_dir_all(&dir).unwrap();
        }

        // A model of another spec.
        let dir = temp_dir("ckpt-spec");
        write_ct2(
            &dir.join("model.bin"),
            "TransformerSpec",
            1,
            &vars,
            &aliases,
        )
        .unwrap();
        std::fs::write(dir.join("config.json"), "{}").unwrap();
        let e = err_text(&dir);
        assert!(
            e.contains("`TransformerSpec` model, not a Whisper model"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn config_disagreeing_with_model_is_an_error() {
        let dir = temp_dir("ckpt-cfg");
        write_synthetic(&dir, &SMALL, DType::F16, 5).unwrap();
        let cases = [
            (
                r#"{"suppress_ids": [1, 20]}"#,
                "`suppress_ids` contains token 20 but the model's vocabulary has 20 tokens",
            ),
            (
                r#"{"suppress_ids_begin": [99]}"#,
                "`suppress_ids_begin` contains token 99",
            ),
            (
                r#"{"lang_ids": [4000000000]}"#,
                "`lang_ids` contains token 4000000000",
            ),
            (
                r#"{"alignment_heads": [[1, 0]]}"#,
                "`alignment_heads` names layer 1 head 0 but the decoder has 1 layers of 2 heads",
            ),
            (r#"{"alignment_heads": [[0, 2]]}"#, "names layer 0 head 2"),
            (
                r#"{"alignment_heads": [[0]]}"#,
                "config.json is not a valid Whisper config",
            ),
        ];
        for (json, want) in cases {
            std::fs::write(dir.join("config.json"), json).unwrap();
            let e = err_text(&dir);
            assert!(
                e.contains(want) && e.contains("config.json"),
                "want {want:?}: {e}"
            );
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn truncated_and_corrupted_checkpoints_are_errors() {
        use rand::{Rng, SeedableRng};
        let dir = temp_dir("ckpt-trunc");
        write_synthetic(&dir, &SMALL, DType::I8, 9).unwrap();
        let good = std::fs::read(dir.join("model.bin")).unwrap();
        let model = dir.join("model.bin");
        // Every byte of the first 600 (header, first names, shapes), then a stride through
        // the rest (the ct2 tests sweep every prefix of a file through the parser).
        let offsets = (0..600.min(good.len())).chain((600..good.len()).step_by(37));
        for len in offsets {
            std::fs::write(&model, &good[..len]).unwrap();
            assert!(
                Checkpoint::open(&dir).is_err(),
                "truncated at {len} of {} opened",
                good.len()
            );
        }
        // Random byte flips: any result but a panic; if it opens, reading every tensor
        // must not panic either.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        for _ in 0..300 {
            let mut b = good.clone();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            std::fs::write(&model, &b).unwrap();
            if let Ok(ckpt) = Checkpoint::open(&dir) {
                for (name, _) in whisper_tensors(&ckpt.dims) {
                    let _ = ckpt.f32(&name);
                    let _ = ckpt.f16_bits(&name);
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The real default model (tiny.en). It must be present: CI and this machine have it,
    /// and a silently skipped test would hide a broken setup.
    #[test]
    fn real_tiny_en_model() {
        let dir = super::super::default_model_dir();
        if !dir.join("model.bin").is_file() {
            panic!(
                "the default model is missing from {}: run packaging/fetch-model.sh (or set \
                 VERBATIM_MODEL_DIR to a CTranslate2 Whisper model directory)",
                dir.display()
            );
        }
        let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ckpt.dims,
            Dims {
                n_mels: 80,
                d_model: 384,
                n_heads: 6,
                encoder_layers: 4,
                decoder_layers: 4,
                ffn: 1536,
                vocab: 51864,
                audio_ctx: 1500,
                text_ctx: 448,
            }
        );
        let f = ckpt.file();
        assert_eq!((f.version(), f.spec(), f.revision()), (6, SPEC, 3));
        let proj = ckpt.tensor("decoder/projection/weight").unwrap();
        let emb = ckpt.tensor("decoder/embeddings/weight").unwrap();
        assert_eq!(proj.name, "decoder/embeddings/weight");
        assert_eq!(proj.bytes.as_ptr(), emb.bytes.as_ptr());
        assert_eq!(emb.dtype, DType::F16);
        assert!(!ckpt.config.suppress_ids.is_empty());
        assert!(!ckpt.config.suppress_ids_begin.is_empty());
        assert!(!ckpt.config.alignment_heads.is_empty());

        // Values are sane: finite, not all zero, layer-norm gains near 1 on average.
        let gamma = ckpt.f32("encoder/layer_norm/gamma").unwrap();
        assert_eq!(gamma.len(), 384);
        assert!(gamma.iter().all(|x| x.is_finite()));
        let mean = gamma.iter().sum::<f32>() / gamma.len() as f32;
        assert!(mean > 0.1 && mean < 10.0, "mean gamma {mean}");
        let bits = ckpt.f16_bits("decoder/embeddings/weight").unwrap();
        assert_eq!(bits.len(), 51864 * 384);
        assert!(bits.iter().any(|&b| b & 0x7fff != 0));
        assert!(
            bits.iter().all(|&b| b & 0x7c00 != 0x7c00),
            "no inf/NaN in the embeddings"
        );
    }
}
