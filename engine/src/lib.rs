//! Verbatim's inference engine: speech in, text out, every FLOP in our own WGSL kernels
//! driven through wgpu. See DESIGN.md at the top of the repository for the layout.

pub mod audio;
pub mod decode;
pub mod error;
pub mod gpu;
pub mod kernels;
pub mod live;
pub mod models;
pub mod pipeline;
pub mod quant;
pub mod reference;
pub(crate) mod threads;

pub use error::{Error, Result};

#[cfg(test)]
pub(crate) mod testgpu;
