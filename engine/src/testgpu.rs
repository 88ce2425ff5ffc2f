//! One GPU device shared by all tests of the crate (on CI: lavapipe; creating a device
//! per test would cost seconds each on a software rasteriser), and the helpers every
//! kernel test uses: fresh random inputs with a printed seed, NaN-poisoned outputs, and
//! the relative error that fails on an unwritten element.

use std::sync::OnceLock;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::gpu::{Gpu, GpuOptions};

/// A second shared device without profiling, as an `Arc` for the models that hold one
/// (their submits then run as one pass each, not a timed pass per dispatch).
pub fn gpu_arc() -> std::sync::Arc<Gpu> {
    static GPU: OnceLock<std::sync::Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        std::sync::Arc::new(Gpu::new(&GpuOptions::default()).unwrap_or_else(|e| panic!("tests need a GPU adapter (lavapipe is enough): {e}")))
    })
    .clone()
}

pub fn gpu() -> &'static Gpu {
    static GPU: OnceLock<Gpu> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::new(&GpuOptions { profile: true, ..Default::default() }) {
        Ok(g) => {
            eprintln!("test GPU: {} ({}, {})", g.info.name, g.info.backend, g.info.device_type);
            g
        }
        Err(e) => panic!("tests need a GPU adapter (lavapipe is enough): {e}"),
    })
}

/// A quiet NaN: outputs are filled with it first, so an element a kernel fails to write
/// cannot pass a comparison.
pub const NAN_BITS: u32 = 0x7fc0_0000;

/// A fresh random generator; the seed is printed so a failure can be replayed with
/// `VERBATIM_TEST_SEED=...`.
pub fn rng(test: &str) -> StdRng {
    let seed = std::env::var("VERBATIM_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    eprintln!("{test}: seed {seed}");
    StdRng::seed_from_u64(seed)
}

/// Uniform in ±scale, never exactly zero.
pub fn rand_vec(r: &mut StdRng, n: usize, scale: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let v: f32 = r.random_range(-scale..scale);
            if v == 0.0 { scale * 0.5 } else { v }
        })
        .collect()
}

/// ‖a − b‖ / ‖b‖, and no NaN anywhere in `a`.
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    assert!(a.iter().all(|v| v.is_finite()), "GPU output has NaN/inf (an element left unwritten?)");
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((*x - *y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

/// An output buffer of `n` floats filled with NaN.
pub fn poisoned(n: usize) -> wgpu::Buffer {
    let g = gpu();
    let b = g.buffer("out", (n * 4) as u64).unwrap();
    g.fill_u32(&b, NAN_BITS);
    b
}
