//! One GPU device shared by all tests of the crate (on CI: lavapipe). Creating a device
//! per test would cost seconds each on a software rasteriser.

use std::sync::OnceLock;

use crate::gpu::{Gpu, GpuOptions};

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
