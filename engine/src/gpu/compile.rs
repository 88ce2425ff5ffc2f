//! Kernels compiled side by side: [`Gpu::compile_together`].
//!
//! A model asks for some sixty kernels while it loads, and each one is WGSL parsed by naga,
//! written out as SPIR-V and compiled by the driver. One after another on a lent H100
//! (2026-12-06, seventeenth session) that took 6.3 s the first time (the driver's shader
//! cache empty) and 0.17 s after, against 4 ms for the encoder and 7 ms for the decode of
//! an 11 s file: a first `verbatim transcribe` spent 8 s, nearly all of it compiling. Inside
//! `compile_together` a kernel asked for is handed to worker threads (one per core, at
//! most 16) while the thread that asked goes on (the weights upload meanwhile), and the
//! call returns once every one has compiled. wgpu's device is shared across threads and its
//! error scopes belong to the thread that pushes them, so each worker checks its own
//! compilations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use super::{Gpu, Kernel};
use crate::{Error, Result};

/// A kernel waiting for a worker, with the layout its pipeline is built on.
pub(super) struct Job {
    kernel: Arc<Kernel>,
    layout: wgpu::PipelineLayout,
}

/// One `compile_together` in progress.
pub(crate) struct Batch {
    /// The thread whose requests are deferred; other threads compile theirs at once.
    owner: ThreadId,
    jobs: mpsc::Sender<Job>,
    /// Kernels asked for in this batch, by name (moved into the device's cache at the end
    /// if all compiled).
    pending: HashMap<&'static str, Arc<Kernel>>,
}

/// Drops the batch (and with it the workers' sender) when dropped.
struct TakeBatch<'a>(&'a Gpu);

impl Drop for TakeBatch<'_> {
    fn drop(&mut self) {
        self.0.batch.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

impl Gpu {
    /// Run `f`, compiling the kernels it asks for ([`Gpu::kernel`] and the like) on worker
    /// threads meanwhile; return `f`'s value once all of them have compiled, or the first
    /// error (`f`'s own first). Kernels handed out inside `f` have no pipeline until this
    /// returns, so `f` must not record them (it loads: builds kernels, uploads weights). A
    /// call inside another one on the same thread, or while another thread's runs, just
    /// runs `f` (its kernels go to the outer batch, or compile at once).
    pub fn compile_together<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let (tx, rx) = mpsc::channel::<Job>();
        {
            let mut b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
            if b.is_some() {
                drop(b);
                return f();
            }
            *b = Some(Batch { owner: std::thread::current().id(), jobs: tx, pending: HashMap::new() });
        }
        let rx = Mutex::new(rx);
        let cancel = AtomicBool::new(false);
        let n = crate::threads::threads();
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|_| {
                    s.spawn(|| -> Option<Error> {
                        let mut first = None;
                        loop {
                            // One worker waits on the queue at a time (holding its lock),
                            // the others for the lock; each compiles with the lock released.
                            let job = rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
                            let Ok(job) = job else { break };
                            if cancel.load(Ordering::Relaxed) {
                                continue;
                            }
                            if let Err(e) = self.compile_pipeline(&job.kernel, &job.layout) {
                                cancel.store(true, Ordering::Relaxed);
                                first.get_or_insert(e);
                            }
                        }
                        first
                    })
                })
                .collect();
            // Should `f` panic, the batch must still go, or the workers would wait on its
            // sender forever and the scope with them.
            let _guard = TakeBatch(self);
            let r = f();
            if r.is_err() {
                cancel.store(true, Ordering::Relaxed);
            }
            // Dropping the batch's sender lets the workers finish the queue and stop.
            let pending = self.batch.lock().unwrap_or_else(|p| p.into_inner()).take().map(|b| b.pending).unwrap_or_default();
            let mut failed = None;
            for h in handles {
                let e = h.join().unwrap_or_else(|_| Some(Error::Gpu("a kernel compiler thread panicked".into())));
                if failed.is_none() {
                    failed = e;
                }
            }
            let t = r?;
            if let Some(e) = failed {
                return Err(e);
            }
            let mut cache = self.kernels.lock().unwrap_or_else(|p| p.into_inner());
            for (name, k) in pending {
                if k.pipeline.get().is_none() {
                    return Err(Error::Gpu(format!("kernel {name} was not compiled")));
                }
                cache.insert(name, k);
            }
            Ok(t)
        })
    }

    /// The kernel `name` if this thread's batch already has it.
    pub(super) fn batched(&self, name: &str) -> Option<Arc<Kernel>> {
        let b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        let b = b.as_ref().filter(|b| b.owner == std::thread::current().id())?;
        b.pending.get(name).cloned()
    }

    /// Hand `k` to this thread's batch, or give it back where there is none.
    pub(super) fn defer(&self, k: Arc<Kernel>, layout: wgpu::PipelineLayout) -> std::result::Result<Arc<Kernel>, (Arc<Kernel>, wgpu::PipelineLayout)> {
        let mut b = self.batch.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = b.as_mut().filter(|b| b.owner == std::thread::current().id()) else {
            return Err((k, layout));
        };
        b.pending.insert(k.name, k.clone());
        // The workers hold the receiver until the batch is taken, so this send cannot fail
        // while the batch exists; were it to, the check at the end reports the kernel.
        let _ = b.jobs.send(Job { kernel: k.clone(), layout });
        Ok(k)
    }
}

#[cfg(test)]
mod tests {
    use crate::gpu::{Access, Cost};
    use crate::testgpu::{gpu, poisoned, rand_vec, rng, NAN_BITS};
    use crate::{Error, Result};

    /// y[i] = x[i] * a + b for i < n, with a and b this variant's constants (a a power of
    /// two, so the product is exact and a fused or unfused add rounds alike).
    fn affine_source(a: f32, b: f32) -> String {
        format!(
            "struct Params {{ n: u32, _p0: u32, _p1: u32, _p2: u32 }}
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    if (gid.x < p.n) {{
        y[gid.x] = x[gid.x] * {a:?} + {b:?};
    }}
}}
"
        )
    }

    const NAMES: [&str; 6] = ["together_0", "together_1", "together_2", "together_3", "together_4", "together_5"];

    #[test]
    fn kernels_asked_for_together_compile_on_workers_and_run() {
        use Access::{Read as R, ReadWrite as W};
        let g = gpu();
        let mut r = rng("kernels_asked_for_together");
        let consts: Vec<(f32, f32)> = (0..NAMES.len()).map(|i| (2f32.powi(i as i32 - 2), -0.3 * i as f32 - 0.7)).collect();
        let kernels = g
            .compile_together(|| {
                let ks: Vec<_> = NAMES.iter().zip(&consts).map(|(n, &(a, b))| g.kernel(n, &affine_source(a, b), &[R, W])).collect::<Result<_>>()?;
                // Asked for again inside the batch: the same kernel, not a second compile.
                let again = g.kernel(NAMES[0], &affine_source(consts[0].0, consts[0].1), &[R, W])?;
                assert!(std::sync::Arc::ptr_eq(&again, &ks[0]));
                Ok(ks)
            })
            .unwrap();
        let n = 203;
        let x = rand_vec(&mut r, n, 3.0);
        let xb = g.upload_f32("x", &x).unwrap();
        for (k, &(a, b)) in kernels.iter().zip(&consts) {
            // Compiled when the batch returned, and in the device's cache from then on.
            let cached = g.kernel(k.name, "not parsed: the cache answers", &[R, W]).unwrap();
            assert!(std::sync::Arc::ptr_eq(&cached, k), "{}", k.name);
            let yb = poisoned(n + 5);
            let mut rec = g.recorder();
            let params = [n as u32, 0, 0, 0];
            rec.dispatch(k, bytemuck::cast_slice(&params), &[&xb, &yb], [(n as u32).div_ceil(64), 1, 1], Cost { bytes: 8 * n as u64, flops: 2 * n as u64 })
                .unwrap();
            rec.submit(None).unwrap();
            let got = g.read_u32(&yb, 0, n + 5).unwrap();
            for i in 0..n {
                assert_eq!(f32::from_bits(got[i]), x[i] * a + b, "{} element {i}", k.name);
            }
            assert!(got[n..].iter().all(|&w| w == NAN_BITS), "{} wrote past n", k.name);
        }
    }

    #[test]
    fn a_kernel_that_fails_to_compile_fails_the_batch_and_is_not_kept() {
        use Access::{Read as R, ReadWrite as W};
        let g = gpu();
        let bad = "@compute @workgroup_size(64) fn main() { let v: u32 = not_declared; }";
        for attempt in 0..2 {
            let r = g.compile_together(|| {
                let good = g.kernel("together_good", &affine_source(2.0, 1.0), &[R, W])?;
                let bad = g.kernel("together_bad", bad, &[R, W])?;
                Ok((good, bad))
            });
            match r {
                Err(Error::Gpu(m)) => assert!(m.contains("together_bad"), "attempt {attempt}: {m}"),
                Err(e) => panic!("attempt {attempt}: another error: {e}"),
                Ok(_) => panic!("attempt {attempt}: a kernel that cannot compile was handed out"),
            }
        }
        // Outside a batch the same: an error, never a kernel without a pipeline.
        assert!(g.kernel("together_bad", bad, &[R, W]).is_err());
    }

    #[test]
    fn the_loads_own_error_comes_first_and_nothing_is_kept() {
        use Access::{Read as R, ReadWrite as W};
        let g = gpu();
        let r: Result<()> = g.compile_together(|| {
            g.kernel("together_dropped", &affine_source(3.0, 0.5), &[R, W])?;
            Err(Error::Invalid("the load failed".into()))
        });
        assert!(matches!(r, Err(Error::Invalid(ref m)) if m == "the load failed"), "{r:?}");
        // Not cached: asked for again, it compiles from its source (a bad one fails).
        assert!(g.kernel("together_dropped", "not WGSL", &[R, W]).is_err());
        // A batch inside a batch runs in the outer one.
        let k = g
            .compile_together(|| g.compile_together(|| g.kernel("together_nested", &affine_source(4.0, 0.0), &[R, W])))
            .unwrap();
        k.pipeline();
    }

    /// A large upload goes in chunks written side by side (`Gpu::upload`): the bytes arrive
    /// whole, from a slice at an odd address and of a length no multiple of 4 (zeros after).
    #[test]
    fn a_large_upload_arrives_whole_from_any_alignment() {
        use rand::Rng;
        let g = gpu();
        let mut r = rng("large upload");
        let n = 2 * super::super::UPLOAD_CHUNK + 3 * 4096 + 7;
        let all: Vec<u8> = (0..n + 1).map(|_| r.random_range(1..=255u8)).collect();
        let bytes = &all[1..];
        let buf = g.upload("large upload", bytes).unwrap();
        let back = g.read(&buf, 0, n.next_multiple_of(4) as u64).unwrap();
        assert!(back[..n] == *bytes, "the bytes uploaded in chunks differ");
        assert!(back[n..].iter().all(|&b| b == 0), "the padding after the last chunk");
    }

}
