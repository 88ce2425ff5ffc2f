//! `config.json` of a Hugging Face Nemotron-H checkpoint (`model_type: nemotron_h`).
//!
//! Real configs come in several generations, so this reads them the way transformers'
//! `NemotronHConfig` does and resolves them into one plain [`Config`]:
//!
//! - the layer list is `layers_block_type` (or its attribute alias `layer_types`), with the
//!   current names (`linear_attention` = Mamba-2, `full_attention`, `moe`, `mlp`) or the
//!   legacy ones (`mamba`, `attention`); older configs carry a `hybrid_override_pattern`
//!   string instead (`M` Mamba-2, `E` MoE, `*` attention, `-` MLP). When both are present
//!   the list wins, as in transformers;
//! - legacy Mamba key names (`mamba_n_groups`, `mamba_d_conv`, `mamba_expand`,
//!   `mamba_dt_min`, `mamba_dt_max`, `mamba_dt_limit`, `mamba_dt_init_floor`,
//!   `mamba_conv_bias`, `mamba_chunk_size`) override the current ones when present, as
//!   transformers' `__post_init__` does; `num_local_experts` is `n_routed_experts`;
//! - float values may be written as numbers, as strings (`"Infinity"`), as Python's json
//!   module writes them (a bare `Infinity` / `NaN` token, which is not JSON) or as the
//!   `{"__float__": "Infinity"}` objects some exporters write;
//! - a missing key takes transformers' default, except the layer list (a config with
//!   neither list nor pattern is refused rather than guessed).
//!
//! Anything we cannot run (an unknown layer kind, an activation other than relu² / SiLU,
//! sizes that do not divide) is an [`Error::Model`] naming the key at fault.

use std::path::Path;

use serde::de::{self, Deserializer};
use serde::Deserialize;

use crate::{Error, Result};

/// `config.json` is a few kilobytes; refuse to read anything absurdly large.
const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// What one layer's mixer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerKind {
    /// Mamba-2 mixer (`linear_attention` / legacy `mamba` / pattern `M`).
    Mamba,
    /// GQA self-attention without positional encoding (`full_attention` / `attention` / `*`).
    Attention,
    /// Routed relu² experts plus a shared expert (`moe` / `E`).
    Moe,
    /// Dense relu² MLP (`mlp` / `-`).
    Mlp,
}

impl LayerKind {
    /// The kind a `layers_block_type` entry names (current or legacy spelling).
    pub fn from_name(name: &str) -> Option<LayerKind> {
        match name {
            "linear_attention" | "mamba" | "mamba2" => Some(LayerKind::Mamba),
            "full_attention" | "attention" => Some(LayerKind::Attention),
            "moe" => Some(LayerKind::Moe),
            "mlp" => Some(LayerKind::Mlp),
            _ => None,
        }
    }

    /// The kind a `hybrid_override_pattern` character names.
    pub fn from_pattern_char(c: char) -> Option<LayerKind> {
        match c {
            'M' => Some(LayerKind::Mamba),
            '*' => Some(LayerKind::Attention),
            'E' => Some(LayerKind::Moe),
            '-' => Some(LayerKind::Mlp),
            _ => None,
        }
    }

    /// The pattern character (`M`, `*`, `E`, `-`).
    pub fn pattern_char(self) -> char {
        match self {
            LayerKind::Mamba => 'M',
            LayerKind::Attention => '*',
            LayerKind::Moe => 'E',
            LayerKind::Mlp => '-',
        }
    }
}

/// GQA self-attention geometry.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionConfig {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    /// `attention_bias`. transformers' NemotronH ignores it (its projections have no
    /// bias); we refuse a config that sets it rather than silently drop biases.
    pub bias: bool,
}

/// Mamba-2 mixer geometry and parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct MambaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    /// SSM state size per group (`ssm_state_size`).
    pub state_size: usize,
    pub n_groups: usize,
    /// Depthwise causal conv kernel (4 in every real config); the ring holds `conv_kernel - 1`.
    pub conv_kernel: usize,
    pub conv_bias: bool,
    /// Bias on `in_proj` / `out_proj` (`use_bias`, as transformers builds them).
    pub proj_bias: bool,
    /// `time_step_min`: transformers' reference (non-fused) path clamps dt from below by it.
    pub time_step_min: f64,
    /// `time_step_limit` (lo, hi): the fused kernels' dt clamp; `(0, inf)` is none.
    pub time_step_limit: (f64, f64),
    pub chunk_size: usize,
}

impl MambaConfig {
    /// Width of the SSM input / output (`mamba_num_heads * mamba_head_dim`).
    pub fn inner(&self) -> usize {
        self.num_heads * self.head_dim
    }
    /// Channels through the conv: x | B | C.
    pub fn conv_dim(&self) -> usize {
        self.inner() + 2 * self.n_groups * self.state_size
    }
    /// Rows of `in_proj`: z | xBC | dt.
    pub fn in_proj_rows(&self) -> usize {
        self.inner() + self.conv_dim() + self.num_heads
    }
    /// Channels per group of the gated RMSNorm.
    pub fn norm_group_size(&self) -> usize {
        self.inner() / self.n_groups
    }
    /// Heads that share one group's B and C.
    pub fn heads_per_group(&self) -> usize {
        self.num_heads / self.n_groups
    }
    /// f32 elements of one layer's conv ring (`(conv_kernel - 1) * conv_dim`).
    pub fn conv_state_len(&self) -> usize {
        (self.conv_kernel - 1) * self.conv_dim()
    }
    /// f32 elements of one layer's SSM state (`num_heads * state_size * head_dim`).
    pub fn ssm_state_len(&self) -> usize {
        self.num_heads * self.state_size * self.head_dim
    }
}

/// Mixture-of-experts geometry and routing.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    pub n_routed_experts: usize,
    /// `num_experts_per_tok`.
    pub top_k: usize,
    /// Width of one routed expert (`moe_intermediate_size`).
    pub intermediate_size: usize,
    /// Width of the shared expert (`moe_shared_expert_intermediate_size`).
    pub shared_intermediate_size: usize,
    /// `n_shared_experts` as written; transformers builds exactly one shared MLP regardless.
    pub n_shared_experts: usize,
    /// `moe_latent_size`: routed experts work in this width between `fc1_latent_proj` and
    /// `fc2_latent_proj` when set.
    pub latent_size: Option<usize>,
    /// Group-limited routing (`n_group` groups, the best `topk_group` of them eligible).
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_topk_prob: bool,
    pub routed_scaling_factor: f64,
}

impl MoeConfig {
    /// Width the routed experts read and write (latent size, else hidden size).
    pub fn expert_io(&self, hidden: usize) -> usize {
        self.latent_size.unwrap_or(hidden)
    }
}

/// A resolved Nemotron-H configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub layers: Vec<LayerKind>,
    pub tie_word_embeddings: bool,
    /// Epsilon of every RMSNorm (block norms, final norm, gated group norm).
    pub layer_norm_epsilon: f64,
    pub residual_in_fp32: bool,
    /// Width of the dense MLP layers (`intermediate_size`).
    pub mlp_intermediate_size: usize,
    pub mlp_bias: bool,
    pub attention: AttentionConfig,
    pub mamba: MambaConfig,
    pub moe: MoeConfig,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
}

impl Config {
    /// Reads and resolves `config.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Config> {
        let meta = std::fs::metadata(path).map_err(|e| Error::io(path, e))?;
        if meta.len() > MAX_CONFIG_BYTES {
            return Err(Error::model(
                path,
                format!(
                    "config.json is {} bytes, far too large to be a model config",
                    meta.len()
                ),
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Config::from_json(&text).map_err(|reason| Error::model(path, reason))
    }

    /// Parses and resolves config text; the error is a sentence naming the key at fault.
    pub fn from_json(text: &str) -> std::result::Result<Config, String> {
        let text = quote_bare_non_finite(text);
        let raw: RawConfig = serde_json::from_str(&text)
            .map_err(|e| format!("config.json is not a valid Nemotron-H config: {e}"))?;
        raw.resolve()
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The layer list as a `hybrid_override_pattern` string (`M*E-`...).
    pub fn pattern(&self) -> String {
        self.layers.iter().map(|k| k.pattern_char()).collect()
    }

    pub fn has(&self, kind: LayerKind) -> bool {
        self.layers.contains(&kind)
    }
}

/// A float as configs write it: a number, a string, or `{"__float__": "Infinity"}`.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Float(f64);

impl<'de> Deserialize<'de> for Float {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Float, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Num(f64),
            Str(String),
            Obj {
                #[serde(rename = "__float__")]
                float: Repr2,
            },
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr2 {
            Num(f64),
            Str(String),
        }
        let parse = |s: &str| {
            parse_float_str(s).ok_or_else(|| de::Error::custom(format!("`{s}` is not a number")))
        };
        match Repr::deserialize(d)? {
            Repr::Num(v) => Ok(Float(v)),
            Repr::Str(s) => parse(&s).map(Float),
            Repr::Obj {
                float: Repr2::Num(v),
            } => Ok(Float(v)),
            Repr::Obj {
                float: Repr2::Str(s),
            } => parse(&s).map(Float),
        }
    }
}

fn parse_float_str(s: &str) -> Option<f64> {
    let t = s.trim();
    let (neg, body) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = match body.to_ascii_lowercase().as_str() {
        "inf" | "infinity" => f64::INFINITY,
        "nan" => f64::NAN,
        _ => return t.parse::<f64>().ok(),
    };
    Some(if neg { -v } else { v })
}

/// Python's json module writes non-finite floats as bare `Infinity`, `-Infinity`, `NaN`
/// tokens, which serde_json rejects. Quote them (outside strings only) so [`Float`]
/// can read them.
fn quote_bare_non_finite(text: &str) -> std::borrow::Cow<'_, str> {
    if !(text.contains("Infinity") || text.contains("NaN")) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut in_str = false;
    let mut escaped = false;
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_str {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_str = false;
            }
            rest = &rest[c.len_utf8()..];
            continue;
        }
        if c == '"' {
            in_str = true;
            out.push(c);
            rest = &rest[1..];
            continue;
        }
        let mut matched = false;
        for tok in ["-Infinity", "Infinity", "NaN"] {
            if rest.starts_with(tok) {
                out.push('"');
                out.push_str(tok);
                out.push('"');
                rest = &rest[tok.len()..];
                matched = true;
                break;
            }
        }
        if !matched {
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Token ids may be one id, a list, or null.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum Ids {
    One(u32),
    Many(Vec<u32>),
}

impl Ids {
    fn into_vec(self) -> Vec<u32> {
        match self {
            Ids::One(i) => vec![i],
            Ids::Many(v) => v,
        }
    }
}

/// `config.json` as written, every key optional. Legacy names are separate fields (not
/// serde aliases) so a config carrying both spellings parses, and the legacy value wins
/// as in transformers.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawConfig {
    model_type: Option<String>,
    vocab_size: Option<usize>,
    hidden_size: Option<usize>,
    layers_block_type: Option<Vec<String>>,
    layer_types: Option<Vec<String>>,
    hybrid_override_pattern: Option<String>,
    tie_word_embeddings: Option<bool>,
    layer_norm_epsilon: Option<Float>,
    residual_in_fp32: Option<bool>,

    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    attention_head_dim: Option<usize>,
    attention_bias: Option<bool>,

    intermediate_size: Option<usize>,
    mlp_hidden_act: Option<String>,
    mlp_bias: Option<bool>,

    ssm_state_size: Option<usize>,
    mamba_num_heads: Option<usize>,
    mamba_head_dim: Option<usize>,
    mamba_hidden_act: Option<String>,
    n_groups: Option<usize>,
    mamba_n_groups: Option<usize>,
    conv_kernel: Option<usize>,
    mamba_d_conv: Option<usize>,
    expand: Option<usize>,
    mamba_expand: Option<usize>,
    time_step_min: Option<Float>,
    mamba_dt_min: Option<Float>,
    time_step_limit: Option<Vec<Float>>,
    mamba_dt_limit: Option<Vec<Float>>,
    use_conv_bias: Option<bool>,
    mamba_conv_bias: Option<bool>,
    chunk_size: Option<usize>,
    mamba_chunk_size: Option<usize>,
    use_bias: Option<bool>,

    n_routed_experts: Option<usize>,
    num_local_experts: Option<usize>,
    n_shared_experts: Option<usize>,
    moe_intermediate_size: Option<usize>,
    moe_shared_expert_intermediate_size: Option<usize>,
    moe_latent_size: Option<usize>,
    num_experts_per_tok: Option<usize>,
    routed_scaling_factor: Option<Float>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    norm_topk_prob: Option<bool>,

    bos_token_id: Option<Ids>,
    eos_token_id: Option<Ids>,
    pad_token_id: Option<Ids>,
}

impl RawConfig {
    fn resolve(self) -> std::result::Result<Config, String> {
        if let Some(t) = &self.model_type {
            if t != "nemotron_h" {
                return Err(format!(
                    "`model_type` is `{t}`, not `nemotron_h` (is this a Nemotron-H checkpoint?)"
                ));
            }
        }

        let layers = match (
            self.layers_block_type.or(self.layer_types),
            &self.hybrid_override_pattern,
        ) {
            (Some(list), _) => list
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    LayerKind::from_name(name).ok_or_else(|| {
                        format!(
                            "`layers_block_type` entry {i} is `{name}`, an unknown layer kind \
                             (known: linear_attention/mamba, full_attention/attention, moe, mlp)"
                        )
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()?,
            (None, Some(pattern)) => pattern
                .chars()
                .enumerate()
                .map(|(i, c)| {
                    LayerKind::from_pattern_char(c).ok_or_else(|| {
                        format!(
                            "`hybrid_override_pattern` character {i} is `{c}`, an unknown layer \
                             kind (known: M Mamba-2, * attention, E MoE, - MLP)"
                        )
                    })
                })
                .collect::<std::result::Result<Vec<_>, _>>()?,
            (None, None) => {
                return Err("config.json has neither `layers_block_type` nor \
                            `hybrid_override_pattern`: the layer list is unknown"
                    .into())
            }
        };
        if layers.is_empty() {
            return Err("the layer list (`layers_block_type`) is empty".into());
        }

        let hidden_size = self.hidden_size.unwrap_or(4096);
        let num_heads = self.num_attention_heads.unwrap_or(32);
        let head_dim = self.head_dim.or(self.attention_head_dim).unwrap_or(128);
        let time_step_limit = match self.mamba_dt_limit.or(self.time_step_limit) {
            None => (0.0, f64::INFINITY),
            Some(v) if v.len() == 2 => (v[0].0, v[1].0),
            Some(v) => {
                return Err(format!(
                    "`time_step_limit` has {} values, expected two (low, high)",
                    v.len()
                ))
            }
        };
        let id = |v: Option<Ids>| v.and_then(|i| i.into_vec().first().copied());

        let config = Config {
            vocab_size: self.vocab_size.unwrap_or(131072),
            hidden_size,
            layers,
            tie_word_embeddings: self.tie_word_embeddings.unwrap_or(false),
            layer_norm_epsilon: self.layer_norm_epsilon.map_or(1e-5, |f| f.0),
            residual_in_fp32: self.residual_in_fp32.unwrap_or(false),
            mlp_intermediate_size: self.intermediate_size.unwrap_or(21504),
            mlp_bias: self.mlp_bias.unwrap_or(false),
            attention: AttentionConfig {
                num_heads,
                num_kv_heads: self.num_key_value_heads.unwrap_or(8),
                head_dim,
                bias: self.attention_bias.unwrap_or(false),
            },
            mamba: MambaConfig {
                num_heads: self.mamba_num_heads.unwrap_or(128),
                head_dim: self.mamba_head_dim.unwrap_or(64),
                state_size: self.ssm_state_size.unwrap_or(128),
                n_groups: self.mamba_n_groups.or(self.n_groups).unwrap_or(8),
                conv_kernel: self.mamba_d_conv.or(self.conv_kernel).unwrap_or(4),
                conv_bias: self.mamba_conv_bias.or(self.use_conv_bias).unwrap_or(true),
                proj_bias: self.use_bias.unwrap_or(false),
                time_step_min: self
                    .mamba_dt_min
                    .or(self.time_step_min)
                    .map_or(0.001, |f| f.0),
                time_step_limit,
                chunk_size: self.mamba_chunk_size.or(self.chunk_size).unwrap_or(128),
            },
            moe: MoeConfig {
                n_routed_experts: self
                    .n_routed_experts
                    .or(self.num_local_experts)
                    .unwrap_or(8),
                top_k: self.num_experts_per_tok.unwrap_or(2),
                intermediate_size: self.moe_intermediate_size.unwrap_or(7688),
                shared_intermediate_size: self.moe_shared_expert_intermediate_size.unwrap_or(7688),
                n_shared_experts: self.n_shared_experts.unwrap_or(1),
                latent_size: self.moe_latent_size,
                n_group: self.n_group.unwrap_or(1),
                topk_group: self.topk_group.unwrap_or(1),
                norm_topk_prob: self.norm_topk_prob.unwrap_or(true),
                routed_scaling_factor: self.routed_scaling_factor.map_or(1.0, |f| f.0),
            },
            bos_token_id: id(self.bos_token_id),
            eos_token_ids: self.eos_token_id.map(Ids::into_vec).unwrap_or_default(),
            pad_token_id: id(self.pad_token_id),
        };
        // `expand` (legacy `mamba_expand`) only sizes the mixer in old remote code; the
        // width transformers builds is mamba_num_heads * mamba_head_dim, which we check
        // against the weights instead.
        let _ = self.mamba_expand.or(self.expand);

        if let Some(act) = &self.mlp_hidden_act {
            if act != "relu2" {
                return Err(format!(
                    "`mlp_hidden_act` is `{act}`; only `relu2` (relu²) is supported"
                ));
            }
        }
        if let Some(act) = &self.mamba_hidden_act {
            if act != "silu" && act != "swish" {
                return Err(format!(
                    "`mamba_hidden_act` is `{act}`; only `silu` is supported"
                ));
            }
        }
        validate(&config)?;
        Ok(config)
    }
}

fn validate(c: &Config) -> std::result::Result<(), String> {
    let positive = |name: &str, v: usize| {
        if v == 0 {
            Err(format!("`{name}` is 0"))
        } else {
            Ok(())
        }
    };
    positive("vocab_size", c.vocab_size)?;
    positive("hidden_size", c.hidden_size)?;
    if !(c.layer_norm_epsilon.is_finite() && c.layer_norm_epsilon >= 0.0) {
        return Err(format!("`layer_norm_epsilon` is {}", c.layer_norm_epsilon));
    }
    if c.has(LayerKind::Attention) {
        let a = &c.attention;
        positive("num_attention_heads", a.num_heads)?;
        positive("num_key_value_heads", a.num_kv_heads)?;
        positive("head_dim", a.head_dim)?;
        if !a.num_heads.is_multiple_of(a.num_kv_heads) {
            return Err(format!(
                "`num_attention_heads` ({}) is not a multiple of `num_key_value_heads` ({})",
                a.num_heads, a.num_kv_heads
            ));
        }
        if a.bias {
            return Err(
                "`attention_bias` is true; Nemotron-H attention has no biases (transformers \
                        ignores the flag) and we refuse to guess"
                    .into(),
            );
        }
    }
    if c.has(LayerKind::Mlp) {
        positive("intermediate_size", c.mlp_intermediate_size)?;
    }
    if c.has(LayerKind::Mamba) {
        let m = &c.mamba;
        positive("mamba_num_heads", m.num_heads)?;
        positive("mamba_head_dim", m.head_dim)?;
        positive("ssm_state_size", m.state_size)?;
        positive("n_groups", m.n_groups)?;
        positive("conv_kernel", m.conv_kernel)?;
        if !m.num_heads.is_multiple_of(m.n_groups) {
            return Err(format!(
                "`mamba_num_heads` ({}) is not a multiple of `n_groups` ({})",
                m.num_heads, m.n_groups
            ));
        }
        if !(m.time_step_min.is_finite() && m.time_step_min >= 0.0) {
            return Err(format!("`time_step_min` is {}", m.time_step_min));
        }
        let (lo, hi) = m.time_step_limit;
        if lo.is_nan() || hi.is_nan() || lo > hi {
            return Err(format!(
                "`time_step_limit` is [{lo}, {hi}], not an interval"
            ));
        }
    }
    if c.has(LayerKind::Moe) {
        let e = &c.moe;
        positive("n_routed_experts", e.n_routed_experts)?;
        positive("num_experts_per_tok", e.top_k)?;
        positive("moe_intermediate_size", e.intermediate_size)?;
        positive(
            "moe_shared_expert_intermediate_size",
            e.shared_intermediate_size,
        )?;
        positive("n_group", e.n_group)?;
        positive("topk_group", e.topk_group)?;
        if let Some(l) = e.latent_size {
            positive("moe_latent_size", l)?;
        }
        if !e.n_routed_experts.is_multiple_of(e.n_group) {
            return Err(format!(
                "`n_routed_experts` ({}) is not a multiple of `n_group` ({})",
                e.n_routed_experts, e.n_group
            ));
        }
        if e.n_group > 1 && e.n_routed_experts / e.n_group < 2 {
            return Err("group-limited routing needs at least two experts per group".into());
        }
        if e.topk_group > e.n_group {
            return Err(format!(
                "`topk_group` ({}) exceeds `n_group` ({})",
                e.topk_group, e.n_group
            ));
        }
        let eligible = e.n_routed_experts / e.n_group * e.topk_group;
        if e.top_k > eligible {
            return Err(format!(
                "`num_experts_per_tok` ({}) exceeds the {eligible} experts routing may choose from",
                e.top_k
            ));
        }
        if !e.routed_scaling_factor.is_finite() {
            return Err(format!(
                "`routed_scaling_factor` is {}",
                e.routed_scaling_factor
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE_LIKE: &str = r#"{
        "model_type": "nemotron_h", "hidden_size": 256, "vocab_size": 512,
        "layers_block_type": ["linear_attention", "moe", "full_attention", "mlp"],
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32,
        "mamba_num_heads": 8, "mamba_head_dim": 32, "n_groups": 2, "ssm_state_size": 32,
        "n_routed_experts": 16, "num_experts_per_tok": 4, "moe_intermediate_size": 128,
        "moe_shared_expert_intermediate_size": 192, "intermediate_size": 512,
        "routed_scaling_factor": 2.5,
        "time_step_limit": [0.0, {"__float__": "Infinity"}],
        "eos_token_id": 2
    }"#;

    #[test]
    fn nemotron_config_current_names() {
        let c = Config::from_json(FIXTURE_LIKE).unwrap();
        assert_eq!(
            c.layers,
            [
                LayerKind::Mamba,
                LayerKind::Moe,
                LayerKind::Attention,
                LayerKind::Mlp
            ]
        );
        assert_eq!(c.pattern(), "ME*-");
        assert_eq!(c.mamba.time_step_limit, (0.0, f64::INFINITY));
        assert_eq!(c.mamba.n_groups, 2);
        assert_eq!(c.mamba.conv_dim(), 256 + 2 * 2 * 32);
        assert_eq!(c.mamba.in_proj_rows(), 648);
        assert_eq!(c.moe.routed_scaling_factor, 2.5);
        assert_eq!(c.eos_token_ids, vec![2]);
    }

    #[test]
    fn nemotron_config_legacy_names_and_pattern() {
        // An older config: pattern string, legacy Mamba keys (overriding the current ones,
        // as transformers does), legacy layer names absent, bare Python `Infinity`.
        let text = r#"{
            "model_type": "nemotron_h", "hidden_size": 64, "vocab_size": 100,
            "hybrid_override_pattern": "M-M*E",
            "num_attention_heads": 4, "num_key_value_heads": 1, "attention_head_dim": 16,
            "mamba_num_heads": 4, "mamba_head_dim": 16, "n_groups": 8, "mamba_n_groups": 2,
            "mamba_d_conv": 3, "mamba_dt_limit": [0.001, Infinity], "mamba_dt_min": 0.01,
            "ssm_state_size": 8, "mamba_conv_bias": false, "num_local_experts": 4,
            "num_experts_per_tok": 2, "eos_token_id": [2, 11], "note": "NaN is fine in a \"string\""
        }"#;
        let c = Config::from_json(text).unwrap();
        assert_eq!(c.pattern(), "M-M*E");
        assert_eq!(c.attention.head_dim, 16);
        assert_eq!(c.mamba.n_groups, 2);
        assert_eq!(c.mamba.conv_kernel, 3);
        assert!(!c.mamba.conv_bias);
        assert_eq!(c.mamba.time_step_limit, (0.001, f64::INFINITY));
        assert_eq!(c.mamba.time_step_min, 0.01);
        assert_eq!(c.moe.n_routed_experts, 4);
        assert_eq!(c.eos_token_ids, vec![2, 11]);

        // Legacy layer names in the list.
        let text = r#"{"model_type": "nemotron_h", "hidden_size": 64,
            "layers_block_type": ["mamba", "attention", "mlp"],
            "hybrid_override_pattern": "EEE",
            "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 16,
            "time_step_limit": ["0.0", "inf"]}"#;
        let c = Config::from_json(text).unwrap();
        assert_eq!(c.pattern(), "M*-", "the list wins over the pattern");
        assert_eq!(c.mamba.time_step_limit, (0.0, f64::INFINITY));
    }

    #[test]
    fn nemotron_config_rejects_unknown_kinds_and_bad_values() {
        let bad_kind = FIXTURE_LIKE.replace("\"mlp\"]", "\"sliding_attention\"]");
        let e = Config::from_json(&bad_kind).unwrap_err();
        assert!(
            e.contains("sliding_attention") && e.contains("entry 3"),
            "{e}"
        );

        let bad_char = r#"{"hybrid_override_pattern": "M-X", "hidden_size": 64}"#;
        let e = Config::from_json(bad_char).unwrap_err();
        assert!(e.contains("`X`"), "{e}");

        let none = r#"{"model_type": "nemotron_h", "hidden_size": 64}"#;
        assert!(Config::from_json(none).unwrap_err().contains("layer list"));

        let other = FIXTURE_LIKE.replace("\"nemotron_h\"", "\"llama\"");
        assert!(Config::from_json(&other).unwrap_err().contains("llama"));

        let gqa = FIXTURE_LIKE.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3");
        assert!(Config::from_json(&gqa)
            .unwrap_err()
            .contains("num_key_value_heads"));

        let act = FIXTURE_LIKE.replace("\"eos_token_id\": 2", "\"mlp_hidden_act\": \"gelu\"");
        assert!(Config::from_json(&act).unwrap_err().contains("gelu"));

        assert!(Config::from_json("{not json").is_err());
    }
}
