//! Nemotron-H: the hybrid decoder of the seed's speech LM (Mamba-2 mixers, GQA attention
//! without positional encoding, relu² MoE with a sigmoid + bias top-k router, dense relu²
//! MLPs), loaded from a Hugging Face checkpoint directory.
//!
//! - [`config`]: `config.json` in all its generations, resolved into one [`Config`];
//! - [`checkpoint`]: the safetensors weights (single file or sharded), memory-mapped and
//!   validated against the config, with exact bf16/f16 → f32 widening.
//!
//! The plain f32 CPU frame that the GPU frame is held to is
//! [`crate::reference::nemotron_h`]; it is itself held to transformers' outputs (the
//! `nemotron-h-tiny` fixture).

pub mod checkpoint;
pub mod config;
pub mod gpu;
pub mod synthetic;

pub use checkpoint::{
    bf16_to_f32, layer_tensors, widen_to_f32, Checkpoint, ExpertProj, WeightDtype, WeightView,
};
pub use config::{AttentionConfig, Config, LayerKind, MambaConfig, MoeConfig};

pub mod fixture;
#[cfg(test)]
mod tests;
