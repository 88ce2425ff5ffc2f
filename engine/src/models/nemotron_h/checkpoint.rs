//! The safetensors weights of a Nemotron-H checkpoint, memory-mapped and validated.
//!
//! A directory holds `model.safetensors`, or shards `model-0000x-of-0000y.safetensors`
//! listed by `model.safetensors.index.json` (`weight_map`: tensor name → shard file). Each
//! file is mapped, its header parsed by the safetensors crate (which refuses a truncated
//! or inconsistent file), and every tensor the configuration implies is checked here,
//! once: present, a float dtype we read (BF16, F16, F32), the shape the config implies.
//! Later stages index weights without re-checking.
//!
//! Names are the checkpoint's own (what `NemotronHForCausalLM.save_pretrained` writes):
//! `backbone.embeddings.weight`, `backbone.layers.{i}.norm.weight`,
//! `backbone.layers.{i}.mixer.{in_proj,out_proj}.weight`, `...mixer.conv1d.{weight,bias}`
//! (`[conv_dim, 1, K]`), `...mixer.{A_log,D,dt_bias}`, `...mixer.norm.weight`,
//! `...mixer.{q,k,v,o}_proj.weight`, `...mixer.{up,down}_proj.weight` (dense MLP),
//! `...mixer.gate.{weight,e_score_correction_bias}`, `...mixer.experts.{e}.{up,down}_proj.weight`,
//! `...mixer.shared_experts.{up,down}_proj.weight`, `backbone.norm_f.weight`, `lm_head.weight`.
//! A `model.` prefix instead of `backbone.`, `embed_tokens` for `embeddings`, `norm` for
//! `norm_f`, and routed experts stacked as `...mixer.experts.{up,down}_proj` (`[E, out, in]`,
//! transformers 5's in-memory layout) are accepted too.
//!
//! Values: bf16 widens to f32 exactly (the 16 bits become the high half of the f32),
//! never through f16; f16 widens exactly; f32 is read as is.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, SafeTensors};

use super::config::{Config, LayerKind};
use crate::{Error, Result};

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The shard index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// The float formats a weight may be stored in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightDtype {
    BF16,
    F16,
    F32,
}

impl WeightDtype {
    pub fn size(self) -> usize {
        match self {
            WeightDtype::BF16 | WeightDtype::F16 => 2,
            WeightDtype::F32 => 4,
        }
    }
}

/// bf16 bits → f32, exactly: bf16 is the high half of an f32.
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Little-endian stored floats of `dtype` → f32 (exact for all three formats).
pub fn widen_to_f32(dtype: WeightDtype, bytes: &[u8], out: &mut Vec<f32>) {
    out.clear();
    out.reserve(bytes.len() / dtype.size());
    match dtype {
        WeightDtype::BF16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        ),
        WeightDtype::F16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()),
        ),
        WeightDtype::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
    }
}

/// A borrowed weight: its name in the checkpoint, format, logical shape and raw bytes
/// (little-endian). For a routed expert stored stacked, the bytes are that expert's slice.
#[derive(Clone, Copy)]
pub struct WeightView<'a> {
    pub name: &'a str,
    pub dtype: WeightDtype,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

impl fmt::Debug for WeightView<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeightView")
            .field("name", &self.name)
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

impl WeightView<'_> {
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The values as f32 (exact widening).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut v = Vec::new();
        widen_to_f32(self.dtype, self.bytes, &mut v);
        v
    }
}

/// Which projection of a routed expert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertProj {
    /// `up_proj`: `[moe_intermediate_size, io]`.
    Up,
    /// `down_proj`: `[io, moe_intermediate_size]`.
    Down,
}

impl ExpertProj {
    fn name(self) -> &'static str {
        match self {
            ExpertProj::Up => "up_proj",
            ExpertProj::Down => "down_proj",
        }
    }
}

struct Shard {
    path: PathBuf,
    map: Mmap,
}

/// Where a tensor's bytes are.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte range in the shard's map.
    start: usize,
    end: usize,
}

/// An opened, validated Nemotron-H checkpoint directory.
pub struct Checkpoint {
    pub dir: PathBuf,
    pub config: Config,
    shards: Vec<Shard>,
    entries: HashMap<String, Entry>,
    /// `backbone.` (what real checkpoints use) or `model.`.
    prefix: String,
    embeddings: String,
    final_norm: String,
    /// Routed experts stored as one `[E, out, in]` tensor per projection.
    stacked_experts: bool,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("layers", &self.config.pattern())
            .field(
                "shards",
                &self.shards.iter().map(|s| &s.path).collect::<Vec<_>>(),
            )
            .field("tensors", &self.entries.len())
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Checkpoint {
    /// Reads `config.json`, maps the weights (single file or shards with an index) and
    /// validates every tensor the configuration needs.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        if !dir.is_dir() {
            return Err(Error::model(dir, "the model directory does not exist"));
        }
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(Error::model(
                dir,
                "no config.json in this directory (is this a Hugging Face Nemotron-H checkpoint?)",
            ));
        }
        let config = Config::from_file(&config_path)?;
        let (shards, entries) = map_weights(dir)?;
        let mut ck = Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            entries,
            prefix: String::new(),
            embeddings: String::new(),
            final_norm: String::new(),
            stacked_experts: false,
        };
        ck.resolve_names()?;
        ck.validate()?;
        Ok(ck)
    }

    /// Every tensor name in the checkpoint, sorted.
    pub fn names(&self) -> Vec<&str> {
        let mut v: Vec<&str> = self.entries.keys().map(|s| s.as_str()).collect();
        v.sort_unstable();
        v
    }

    /// The files the weights were mapped from.
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// Where the checkpoint's tensors live: the weights file (or the index if sharded).
    fn weights_path(&self) -> PathBuf {
        if self.shards.len() == 1 {
            self.shards[0].path.clone()
        } else {
            self.dir.join(INDEX_FILE)
        }
    }

    fn err(&self, reason: impl Into<String>) -> Error {
        Error::model(self.weights_path(), reason)
    }

    /// The tensor `name` as stored, any dtype checked to be a float we read.
    pub fn tensor(&self, name: &str) -> Result<WeightView<'_>> {
        let (key, e) = self
            .entries
            .get_key_value(name)
            .ok_or_else(|| self.err(format!("tensor `{name}` is missing")))?;
        let dtype = float_dtype(e.dtype).ok_or_else(|| {
            self.err(format!(
                "tensor `{name}` has dtype {:?}; weights must be BF16, F16 or F32",
                e.dtype
            ))
        })?;
        Ok(WeightView {
            name: key,
            dtype,
            shape: &e.shape,
            bytes: &self.shards[e.shard].map[e.start..e.end],
        })
    }

    /// The tensor `name`, checked to have `shape`.
    pub fn tensor_shaped(&self, name: &str, shape: &[usize]) -> Result<WeightView<'_>> {
        let v = self.tensor(name)?;
        if v.shape != shape {
            return Err(self.err(format!(
                "tensor `{name}` has shape {:?}, but config.json implies {:?}",
                v.shape, shape
            )));
        }
        Ok(v)
    }

    /// `name` widened to f32, checked to have `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        Ok(self.tensor_shaped(name, shape)?.to_f32())
    }

    /// Full name of a tensor of layer `i`, e.g. `layer_name(0, "mixer.in_proj.weight")`.
    pub fn layer_name(&self, i: usize, suffix: &str) -> String {
        format!("{}layers.{i}.{suffix}", self.prefix)
    }

    /// Name of the token embedding table `[vocab, hidden]`.
    pub fn embeddings_name(&self) -> &str {
        &self.embeddings
    }

    /// Name of the final RMSNorm weight `[hidden]`.
    pub fn final_norm_name(&self) -> &str {
        &self.final_norm
    }

    /// Name of the LM head `[vocab, hidden]` (the embeddings when tied).
    /// (`tie_word_embeddings`: transformers then reads the embeddings, whatever
    /// `lm_head.weight` the file may also hold).
    pub fn lm_head_name(&self) -> &str {
        if self.config.tie_word_embeddings {
            &self.embeddings
        } else {
            "lm_head.weight"
        }
    }

    /// Whether routed experts are stored stacked (`[E, out, in]`) rather than one tensor each.
    pub fn stacked_experts(&self) -> bool {
        self.stacked_experts
    }

    /// One routed expert's projection of MoE layer `layer` (`[I, io]` up, `[io, I]` down),
    /// from per-expert tensors or a slice of the stacked one.
    pub fn expert(&self, layer: usize, expert: usize, proj: ExpertProj) -> Result<WeightView<'_>> {
        let moe = &self.config.moe;
        let io = moe.expert_io(self.config.hidden_size);
        let want = match proj {
            ExpertProj::Up => [moe.intermediate_size, io],
            ExpertProj::Down => [io, moe.intermediate_size],
        };
        if expert >= moe.n_routed_experts {
            return Err(Error::Invalid(format!(
                "expert {expert} of layer {layer}: there are {} experts",
                moe.n_routed_experts
            )));
        }
        if !self.stacked_experts {
            let name = self.layer_name(
                layer,
                &format!("mixer.experts.{expert}.{}.weight", proj.name()),
            );
            return self.tensor_shaped(&name, &want);
        }
        let name = self.stacked_expert_name(layer, proj)?;
        let full = self.tensor_shaped(&name, &[moe.n_routed_experts, want[0], want[1]])?;
        let per = want[0] * want[1] * full.dtype.size();
        let e = &self.entries[full.name];
        Ok(WeightView {
            name: full.name,
            dtype: full.dtype,
            // The entry's shape without the expert axis.
            shape: &e.shape[1..],
            bytes: &full.bytes[expert * per..(expert + 1) * per],
        })
    }

    fn stacked_expert_name(&self, layer: usize, proj: ExpertProj) -> Result<String> {
        let a = self.layer_name(layer, &format!("mixer.experts.{}", proj.name()));
        if self.entries.contains_key(&a) {
            return Ok(a);
        }
        let b = format!("{a}.weight");
        if self.entries.contains_key(&b) {
            return Ok(b);
        }
        Err(self.err(format!("tensor `{a}` is missing")))
    }

    /// Finds the name prefix, the embedding / final-norm spellings and the expert layout.
    fn resolve_names(&mut self) -> Result<()> {
        let has = |n: &str| self.entries.contains_key(n);
        let mut found = None;
        'outer: for prefix in ["backbone.", "model.", ""] {
            for emb in ["embeddings.weight", "embed_tokens.weight"] {
                if has(&format!("{prefix}{emb}")) {
                    found = Some((prefix.to_string(), format!("{prefix}{emb}")));
                    break 'outer;
                }
            }
        }
        let (prefix, embeddings) = found.ok_or_else(|| {
            self.err(
                "tensor `backbone.embeddings.weight` is missing (no embedding table under \
                      any known name)",
            )
        })?;
        let final_norm = ["norm_f.weight", "norm.weight"]
            .iter()
            .map(|s| format!("{prefix}{s}"))
            .find(|n| has(n))
            .unwrap_or_else(|| format!("{prefix}norm_f.weight"));
        // Experts: per-expert tensors unless the first MoE layer has the stacked form.
        let stacked = self
            .config
            .layers
            .iter()
            .position(|&k| k == LayerKind::Moe)
            .map(|i| {
                let a = format!("{prefix}layers.{i}.mixer.experts.up_proj");
                has(&a) || has(&format!("{a}.weight"))
            })
            .unwrap_or(false);
        self.prefix = prefix;
        self.embeddings = embeddings;
        self.final_norm = final_norm;
        self.stacked_experts = stacked;
        Ok(())
    }

    /// Checks every tensor the configuration implies: present, a float dtype, its shape.
    fn validate(&self) -> Result<()> {
        let c = &self.config;
        let h = c.hidden_size;
        self.tensor_shaped(&self.embeddings, &[c.vocab_size, h])?;
        self.tensor_shaped(&self.final_norm, &[h])?;
        if !c.tie_word_embeddings {
            self.tensor_shaped("lm_head.weight", &[c.vocab_size, h])?;
        }
        for (i, &kind) in c.layers.iter().enumerate() {
            for (suffix, shape) in layer_tensors(c, kind) {
                self.tensor_shaped(&self.layer_name(i, &suffix), &shape)?;
            }
            if kind == LayerKind::Moe {
                for e in 0..c.moe.n_routed_experts {
                    self.expert(i, e, ExpertProj::Up)?;
                    self.expert(i, e, ExpertProj::Down)?;
                }
            }
        }
        Ok(())
    }
}

/// The tensors (suffix after `layers.{i}.`, shape) a layer of `kind` has, routed experts
/// excepted (see [`Checkpoint::expert`]).
pub fn layer_tensors(c: &Config, kind: LayerKind) -> Vec<(String, Vec<usize>)> {
    let h = c.hidden_size;
    let mut t: Vec<(String, Vec<usize>)> = vec![("norm.weight".into(), vec![h])];
    let mut lin = |name: &str, rows: usize, cols: usize, bias: bool| {
        t.push((format!("mixer.{name}.weight"), vec![rows, cols]));
        if bias {
            t.push((format!("mixer.{name}.bias"), vec![rows]));
        }
    };
    match kind {
        LayerKind::Mamba => {
            let m = &c.mamba;
            lin("in_proj", m.in_proj_rows(), h, m.proj_bias);
            lin("out_proj", h, m.inner(), m.proj_bias);
            t.push((
                "mixer.conv1d.weight".into(),
                vec![m.conv_dim(), 1, m.conv_kernel],
            ));
            if m.conv_bias {
                t.push(("mixer.conv1d.bias".into(), vec![m.conv_dim()]));
            }
            for p in ["A_log", "D", "dt_bias"] {
                t.push((format!("mixer.{p}"), vec![m.num_heads]));
            }
            t.push(("mixer.norm.weight".into(), vec![m.inner()]));
        }
        LayerKind::Attention => {
            let a = &c.attention;
            lin("q_proj", a.num_heads * a.head_dim, h, false);
            lin("k_proj", a.num_kv_heads * a.head_dim, h, false);
            lin("v_proj", a.num_kv_heads * a.head_dim, h, false);
            lin("o_proj", h, a.num_heads * a.head_dim, false);
        }
        LayerKind::Mlp => {
            lin("up_proj", c.mlp_intermediate_size, h, c.mlp_bias);
            lin("down_proj", h, c.mlp_intermediate_size, c.mlp_bias);
        }
        LayerKind::Moe => {
            let e = &c.moe;
            t.push(("mixer.gate.weight".into(), vec![e.n_routed_experts, h]));
            t.push((
                "mixer.gate.e_score_correction_bias".into(),
                vec![e.n_routed_experts],
            ));
            let s = e.shared_intermediate_size;
            let mut lin = |name: &str, rows: usize, cols: usize, bias: bool| {
                t.push((format!("mixer.{name}.weight"), vec![rows, cols]));
                if bias {
                    t.push((format!("mixer.{name}.bias"), vec![rows]));
                }
            };
            lin("shared_experts.up_proj", s, h, c.mlp_bias);
            lin("shared_experts.down_proj", h, s, c.mlp_bias);
            if let Some(l) = e.latent_size {
                lin("fc1_latent_proj", l, h, c.mlp_bias);
                lin("fc2_latent_proj", h, l, c.mlp_bias);
            }
        }
    }
    t
}

fn float_dtype(d: Dtype) -> Option<WeightDtype> {
    match d {
        Dtype::BF16 => Some(WeightDtype::BF16),
        Dtype::F16 => Some(WeightDtype::F16),
        Dtype::F32 => Some(WeightDtype::F32),
        _ => None,
    }
}

/// Maps the single file or every shard of the index; returns the shards and where each
/// tensor is.
fn map_weights(dir: &Path) -> Result<(Vec<Shard>, HashMap<String, Entry>)> {
    let single = dir.join(SINGLE_FILE);
    let index = dir.join(INDEX_FILE);
    let files: Vec<PathBuf>;
    let mut weight_map: Option<HashMap<String, String>> = None;
    if single.is_file() {
        files = vec![single];
    } else if index.is_file() {
        let map = read_index(&index)?;
        let names: BTreeSet<&String> = map.values().collect();
        files = names.into_iter().map(|f| dir.join(f)).collect();
        for f in &files {
            if !f.is_file() {
                return Err(Error::model(
                    &index,
                    format!(
                        "the index lists shard `{}`, which is not in the directory",
                        f.display()
                    ),
                ));
            }
        }
        weight_map = Some(map);
    } else {
        return Err(Error::model(
            dir,
            format!("neither {SINGLE_FILE} nor {INDEX_FILE} is in this directory"),
        ));
    }

    let mut shards = Vec::with_capacity(files.len());
    let mut entries: HashMap<String, Entry> = HashMap::new();
    for (si, path) in files.into_iter().enumerate() {
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the map is read-only; the file is not ours to keep stable, and a file
        // changed underneath a running model is outside what we guard against.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let (header_len, meta) = SafeTensors::read_metadata(&map).map_err(|e| {
            Error::model(
                &path,
                format!("not a valid safetensors file (truncated or corrupt?): {e}"),
            )
        })?;
        let base = 8 + header_len;
        for (name, info) in meta.tensors() {
            let (s, e) = info.data_offsets;
            let entry = Entry {
                shard: si,
                dtype: info.dtype,
                shape: info.shape.clone(),
                start: base + s,
                end: base + e,
            };
            if let Some(prev) = entries.insert(name.clone(), entry) {
                return Err(Error::model(
                    &path,
                    format!(
                        "tensor `{name}` is in both {} and {}",
                        shards.get(prev.shard).map_or_else(
                            || path.display().to_string(),
                            |s: &Shard| s.path.display().to_string()
                        ),
                        path.display()
                    ),
                ));
            }
        }
        shards.push(Shard { path, map });
    }
    if let Some(map) = weight_map {
        for (name, file) in &map {
            let want = dir.join(file);
            match entries.get(name) {
                Some(e) if shards[e.shard].path == want => {}
                Some(e) => {
                    return Err(Error::model(
                        dir.join(INDEX_FILE),
                        format!(
                            "the index puts tensor `{name}` in {file}, but it is in {}",
                            shards[e.shard].path.display()
                        ),
                    ))
                }
                None => {
                    return Err(Error::model(
                        dir.join(INDEX_FILE),
                        format!("tensor `{name}` is missing: the index lists it in {file}, which does not hold it"),
                    ))
                }
            }
        }
    }
    Ok((shards, entries))
}

fn read_index(path: &Path) -> Result<HashMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let idx: Index = serde_json::from_str(&text)
        .map_err(|e| Error::model(path, format!("not a valid safetensors index: {e}")))?;
    for f in idx.weight_map.values() {
        if f.contains('/') || f.contains('\\') || f == ".." {
            return Err(Error::model(
                path,
                format!("shard name `{f}` is not a plain file name"),
            ));
        }
    }
    Ok(idx.weight_map)
}
