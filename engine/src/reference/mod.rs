//! Plain CPU implementations that the GPU kernels and models are held to.
//!
//! - [`ops`]: the operators (linear, GELU, LayerNorm, conv, attention, softmax), f32 in
//!   and out, f64 sums inside.
//! - [`select`]: the masked argmax / log-sum-exp of one decoding step.
//! - [`whisper`]: a whole Whisper built from those, itself held to CTranslate2.

pub mod nemotron_h;
pub mod ops;
pub mod select;
pub mod whisper;
