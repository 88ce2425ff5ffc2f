//! The GPU device context: one wgpu device, created here or borrowed from the window, plus
//! the pieces every kernel launch goes through (pipeline cache, buffers, the recorder).
//!
//! Errors from wgpu arrive asynchronously (validation, out of memory, device loss). wgpu's
//! default handler panics on them; we install our own that records the first one, and
//! every submit / readback checks it, so a failure becomes an [`Error`] value at the next
//! call instead of a panic in a callback.

mod compile;
pub mod pipeline_stats;
mod recorder;
#[cfg(not(target_vendor = "apple"))]
mod replay;
pub mod warm_up;

use crate::threads::side_by_side;

/// Bytes a large upload writes at a time (a multiple of wgpu's copy alignment).
const UPLOAD_CHUNK: usize = 4 << 20;

#[cfg(not(target_vendor = "apple"))]
pub use replay::Ticket;
/// A replayed submission in flight (no replays without Vulkan).
#[cfg(target_vendor = "apple")]
#[derive(Clone, Copy, Debug)]
pub struct Ticket;

pub use recorder::{CmdSig, Cost, DispatchCache, Encoded, Kept, KernelStat, Profile, Recorder, Signature};

/// What a kept replay's prologue does on the GPU besides its writes ([`Kept::submit_with`]):
/// copies from host buffers and zero fills, e.g. a window of a spectrogram the host wrote
/// ahead copied into the encoder's input.
#[derive(Default)]
pub struct Moves<'a> {
    /// Copies from host buffers ([`Gpu::host_buffer`]): source, destination, regions
    /// (source offset, destination offset, bytes).
    pub host_copies: Vec<(&'a HostBuffer, &'a wgpu::Buffer, Vec<(u64, u64, u64)>)>,
    /// Buffer, byte offset, bytes set to zero (offsets and sizes multiples of 4).
    pub zeros: Vec<(&'a wgpu::Buffer, u64, u64)>,
}

/// A buffer the host writes straight into its mapping ([`Gpu::write_host`]) and a kept
/// replay's prologue copies from ([`Moves::host_copies`]): device-local, host-visible
/// memory (the BAR) where the device offers it, so that the host's writes cross the bus
/// once, whenever the host has time, and the prologue's copy stays in video memory. Made
/// by the replayer (Vulkan only); freed by [`Gpu::free_host_buffer`], or with the device.
#[derive(Debug)]
pub struct HostBuffer {
    id: u64,
    size: u64,
    device_local: bool,
}

impl HostBuffer {
    /// Its size in bytes (the asked size rounded up).
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether it lies in device-local memory.
    pub fn device_local(&self) -> bool {
        self.device_local
    }
}

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::{Error, Result};

/// How to pick and open the adapter.
#[derive(Clone, Debug, Default)]
pub struct GpuOptions {
    /// Use the first adapter whose name contains this (case-insensitive). `VERBATIM_ADAPTER`
    /// in the environment does the same when this is `None`.
    pub adapter: Option<String>,
    /// Resolve per-dispatch GPU times with timestamp queries when the adapter offers them.
    pub profile: bool,
    /// Open the device with the driver's compiler statistics (Vulkan's
    /// `VK_KHR_pipeline_executable_properties`) and keep every kernel's source, so that
    /// [`Gpu::pipeline_stats`] can report registers, shared memory and spills per kernel.
    /// An error where the driver does not offer them.
    pub pipeline_stats: bool,
}

/// The kinds of binding a kernel declares, in binding order (binding 0 is always the
/// uniform parameter block and is not listed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// A compiled compute kernel: its pipeline and the explicit bind-group layout built from its
/// declared bindings (explicit, so an unused binding cannot silently drop out of an
/// auto-derived layout).
pub struct Kernel {
    pub name: &'static str,
    /// Set once the driver has compiled it: at once, or by the end of the
    /// [`Gpu::compile_together`] it was asked for in (see [`Kernel::pipeline`]).
    pipeline: std::sync::OnceLock<wgpu::ComputePipeline>,
    pub layout: wgpu::BindGroupLayout,
    pub bindings: Vec<Access>,
    /// What it was compiled from, for compiling it again outside wgpu (a replay).
    pub(crate) source: Arc<str>,
    pub(crate) entry: String,
    pub(crate) immediate_size: u32,
}

impl Kernel {
    /// The compiled pipeline. Every kernel a caller holds has one: [`Gpu::kernel`] returns
    /// compiled kernels, and [`Gpu::compile_together`] returns only once every kernel asked
    /// for inside it has compiled (or with the error). Recording a kernel inside the
    /// `compile_together` that asked for it, before it has compiled, is a bug in the engine.
    pub fn pipeline(&self) -> &wgpu::ComputePipeline {
        self.pipeline.get().unwrap_or_else(|| panic!("kernel {} recorded before its compilation finished", self.name))
    }
}

/// Shared state the wgpu callbacks write into.
#[derive(Default)]
struct Faults {
    lost: Option<String>,
    error: Option<String>,
}

/// What the adapter is and what it can do.
#[derive(Clone, Debug)]
pub struct GpuInfo {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub timestamps: bool,
    pub subgroups: bool,
    pub shader_f16: bool,
    /// Cooperative matrices usable by the engine's tensor-core kernels (gemm_coop.wgsl):
    /// see `coop_matrix_usable`.
    pub coop_matrix: bool,
    pub max_storage_binding: u64,
    /// Whether our kernels are compiled with wgpu's runtime checks (see `shader_checks_wanted`).
    pub shader_checks: bool,
}

impl GpuInfo {
    /// A CPU rasteriser (lavapipe, SwiftShader): rows of a batched pass cost about as much
    /// as separate passes there, so speculative drafts do not pay.
    pub fn is_cpu(&self) -> bool {
        self.device_type == "Cpu"
    }
}

pub struct Gpu {
    /// Recordings replayed through raw Vulkan (`replay.rs`), made on first use; declared
    /// first so it is dropped (and its objects destroyed) before the device.
    #[cfg(not(target_vendor = "apple"))]
    replayer: Mutex<Option<replay::Replayer>>,
    /// Whether replays may run here: a Vulkan device the engine opened itself (the queue
    /// is ours alone), unless `VERBATIM_REPLAY=0`.
    replay_ok: bool,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: GpuInfo,
    /// Whether per-dispatch timestamps are recorded (asked for and supported).
    pub profiling: bool,
    faults: Arc<Mutex<Faults>>,
    kernels: Mutex<HashMap<&'static str, Arc<Kernel>>>,
    /// The kernels one thread asks for inside [`Gpu::compile_together`], compiled on worker
    /// threads meanwhile (compile.rs).
    batch: Mutex<Option<compile::Batch>>,
    /// Uniform arenas reused across recorders (see `Recorder`).
    pub(crate) arena_pool: Mutex<Vec<wgpu::Buffer>>,
    /// Timestamps off for a while on a profiling device (`verbatim bench` times the same
    /// work with and without them).
    profiling_paused: std::sync::atomic::AtomicBool,
    /// Every kernel compiled, kept where the device was opened with compiler statistics.
    sources: Option<Mutex<Vec<pipeline_stats::KernelSource>>>,
    /// How long a wait for the GPU polls without blocking before it blocks, in µs
    /// (`spin_budget`; `set_spin_wait`).
    spin_us: std::sync::atomic::AtomicU64,
}

/// How long a wait for the GPU first polls the fence without blocking, on a GPU that is not
/// the CPU (`VERBATIM_SPIN_WAIT_US`, microseconds; 0 blocks at once). A blocking wait
/// sleeps in the driver and wakes through the kernel: on the lent machines an empty submit
/// and wait took 31-75 µs, a round trip every decode step and verify pass pays. Polling
/// costs a core for at most this long, then the wait blocks as before. On a CPU adapter
/// (lavapipe) the GPU's work runs on the same cores, so it never spins there.
fn spin_budget(is_cpu: bool, setting: Option<&str>) -> std::time::Duration {
    let us = match setting.map(str::trim).and_then(|v| v.parse::<u64>().ok()) {
        Some(us) => us,
        None if is_cpu => 0,
        None => 2000,
    };
    std::time::Duration::from_micros(us.min(1_000_000))
}

fn features_wanted(adapter: &wgpu::Adapter) -> wgpu::Features {
    let mut f = wgpu::Features::SHADER_F16
        | wgpu::Features::SUBGROUP
        // (the kernel lab's subgroup-barrier variants; no engine kernel uses it)
        | wgpu::Features::SUBGROUP_BARRIER
        | wgpu::Features::TIMESTAMP_QUERY
        | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES
        // (only the kernel lab's immediates row: on the H200 push constants were no faster
        // than a parameter block per dispatch, bench/RESULTS.md 2026-12-04)
        | wgpu::Features::IMMEDIATES;
    if coop_matrix_usable(adapter) {
        f |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
    }
    f
}

/// Whether the engine's cooperative-matrix kernels can run on this adapter: wgpu's
/// experimental feature offered, the 16x16x16 f16 x f16 -> f32 shape among its
/// configurations, f16 and subgroups, and subgroups always 32 wide (the kernels give each
/// of a workgroup's 4 subgroups a fixed quarter of the tile). `VERBATIM_NO_COOP=1` turns
/// them off (the experimental path can be compared against the portable one, or avoided
/// if a driver misbehaves).
pub fn coop_matrix_usable(adapter: &wgpu::Adapter) -> bool {
    if std::env::var("VERBATIM_NO_COOP").is_ok_and(|v| !v.is_empty() && v != "0") {
        return false;
    }
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
    let info = adapter.get_info();
    adapter.features().contains(needed)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|c| {
            c.m_size == 16
                && c.n_size == 16
                && c.k_size == 16
                && c.ab_type == wgpu::CooperativeScalarType::F16
                && c.cr_type == wgpu::CooperativeScalarType::F32
        })
}

/// Whether kernels are compiled with wgpu's injected runtime checks. By default they are not:
/// every module the engine compiles is our own WGSL, whose loops are bounded and whose
/// indices the kernel tests exercise, and the checks are not free (~12 % of the encoder and
/// of a decode step on the H200). With them naga puts a 64-bit loop counter with a break
/// test into every loop (likely hiding constant trip counts from the driver's compiler, so
/// short loops stay rolled) and clamps every index into a workgroup or private array with
/// a `min` (likely hiding adjacent stores). Buffer accesses stay bounded by the driver's
/// own robust buffer access where the platform has it. `VERBATIM_SHADER_CHECKS=1` turns the
/// checks back on (to compare, or to chase a kernel that indexes out of bounds).
pub fn shader_checks_wanted() -> bool {
    std::env::var("VERBATIM_SHADER_CHECKS").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Pick the adapter: the one whose name contains `wanted` (case-insensitive) when given,
/// else the best kind (discrete, integrated, virtual, other; CPU/software last). The window
/// uses it as eframe's adapter selector, so both paths choose alike.
pub fn choose_adapter(mut adapters: Vec<wgpu::Adapter>, wanted: Option<&str>) -> Result<wgpu::Adapter> {
    if adapters.is_empty() {
        return Err(Error::NoAdapter(
            "no Vulkan, Metal or DirectX 12 adapter was found. Without a GPU, install Mesa's \
             software Vulkan driver (Debian/Ubuntu: `apt-get install mesa-vulkan-drivers libvulkan1`)"
                .into(),
        ));
    }
    match wanted.filter(|w| !w.trim().is_empty()) {
        Some(name) => {
            let lower = name.to_lowercase();
            let pos = adapters
                .iter()
                .position(|a| a.get_info().name.to_lowercase().contains(&lower))
                .ok_or_else(|| {
                    let names: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
                    Error::NoAdapter(format!("no adapter named like \"{name}\"; available: {}", names.join(", ")))
                })?;
            Ok(adapters.swap_remove(pos))
        }
        None => {
            let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
                wgpu::DeviceType::DiscreteGpu => 0,
                wgpu::DeviceType::IntegratedGpu => 1,
                wgpu::DeviceType::VirtualGpu => 2,
                wgpu::DeviceType::Other => 3,
                wgpu::DeviceType::Cpu => 4,
            };
            adapters.sort_by_key(rank);
            Ok(adapters.remove(0))
        }
    }
}

/// What we ask of a device: the adapter's own limits (large weight buffers) and the
/// optional features it has among those the engine can use (f16, subgroups, timestamps).
/// The window hands this to eframe so that the device it draws with can also run us.
pub fn device_descriptor(adapter: &wgpu::Adapter) -> wgpu::DeviceDescriptor<'static> {
    wgpu::DeviceDescriptor {
        label: Some("verbatim"),
        required_features: adapter.features() & features_wanted(adapter),
        required_limits: adapter.limits(),
        // SAFETY: the only experimental feature asked for is cooperative matrices, and only
        // where `coop_matrix_usable` checked the shape the kernels use; wgpu's warning is
        // that experimental paths may still have bugs (VERBATIM_NO_COOP=1 avoids them).
        experimental_features: if coop_matrix_usable(adapter) {
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        },
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }
}

/// The instance flags the engine wants: `flags` without wgpu's validation of indirect
/// arguments (on in release builds too). It puts a dispatch of its own before every indirect
/// dispatch, 10 us a dispatch in the kernel lab's chain on the H200 against 4.75 without;
/// our only indirect grids are the decode batches' gated ones, written by the host (checked
/// against the adapter's limits when recorded) or zeroed by our kernels. The environment
/// (`WGPU_VALIDATION_INDIRECT_CALL=1`) can still turn it on.
pub fn instance_flags(flags: wgpu::InstanceFlags) -> wgpu::InstanceFlags {
    flags - wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL
}

impl Gpu {
    /// Open our own device: the best adapter (a real GPU before a software one), with the
    /// adapter's own limits and the optional features it has.
    pub fn new(opts: &GpuOptions) -> Result<Gpu> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
        desc.flags = instance_flags(desc.flags);
        let instance = wgpu::Instance::new(desc.with_env());
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        let wanted = opts.adapter.clone().or_else(|| std::env::var("VERBATIM_ADAPTER").ok());
        let adapter = choose_adapter(adapters, wanted.as_deref())?;
        let desc = device_descriptor(&adapter);
        let (device, queue) = if opts.pipeline_stats {
            pipeline_stats::open_device(&adapter, &desc)?
        } else {
            pollster::block_on(adapter.request_device(&desc))
                .map_err(|e| Error::NoAdapter(format!("{} refused a device: {e}", adapter.get_info().name)))?
        };
        let mut gpu = Gpu::from_parts(device, queue, &adapter, opts.profile);
        gpu.replay_ok = cfg!(not(target_vendor = "apple"))
            && adapter.get_info().backend == wgpu::Backend::Vulkan
            && std::env::var("VERBATIM_REPLAY").map_or(true, |v| v != "0");
        if opts.pipeline_stats {
            gpu.sources = Some(Mutex::new(Vec::new()));
        }
        Ok(gpu)
    }

    /// Use a device someone else created (the window's, from eframe's render state).
    /// Features the device lacks are simply not used.
    pub fn borrow(device: wgpu::Device, queue: wgpu::Queue, adapter: &wgpu::Adapter, profile: bool) -> Gpu {
        Gpu::from_parts(device, queue, adapter, profile)
    }

    fn from_parts(device: wgpu::Device, queue: wgpu::Queue, adapter: &wgpu::Adapter, profile: bool) -> Gpu {
        let ai = &adapter.get_info();
        let faults = Arc::new(Mutex::new(Faults::default()));
        {
            let f = faults.clone();
            device.set_device_lost_callback(move |reason, msg| {
                let mut g = f.lock().unwrap_or_else(|p| p.into_inner());
                // Dropping our own device reports "Destroyed"; that is not a fault.
                if !matches!(reason, wgpu::DeviceLostReason::Destroyed) {
                    g.lost.get_or_insert(format!("{msg} ({reason:?})"));
                }
            });
            let f = faults.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                let mut g = f.lock().unwrap_or_else(|p| p.into_inner());
                g.error.get_or_insert(e.to_string());
            }));
        }
        let feats = device.features();
        let info = GpuInfo {
            name: ai.name.clone(),
            backend: format!("{:?}", ai.backend),
            device_type: format!("{:?}", ai.device_type),
            driver: format!("{} {}", ai.driver, ai.driver_info).trim().to_string(),
            timestamps: feats.contains(wgpu::Features::TIMESTAMP_QUERY),
            subgroups: feats.contains(wgpu::Features::SUBGROUP),
            shader_f16: feats.contains(wgpu::Features::SHADER_F16),
            coop_matrix: feats.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) && coop_matrix_usable(adapter),
            max_storage_binding: device.limits().max_storage_buffer_binding_size as u64,
            shader_checks: shader_checks_wanted(),
        };
        let profiling = profile && info.timestamps;
        let spin = spin_budget(info.is_cpu(), std::env::var("VERBATIM_SPIN_WAIT_US").ok().as_deref());
        Gpu {
            #[cfg(not(target_vendor = "apple"))]
            replayer: Mutex::new(None),
            replay_ok: false,
            device,
            queue,
            info,
            profiling,
            faults,
            kernels: Mutex::new(HashMap::new()),
            batch: Mutex::new(None),
            arena_pool: Mutex::new(Vec::new()),
            profiling_paused: std::sync::atomic::AtomicBool::new(false),
            sources: None,
            spin_us: std::sync::atomic::AtomicU64::new(spin.as_micros() as u64),
        }
    }

    /// Pause (or resume) per-dispatch timestamps on a profiling device: paused, dispatches
    /// share passes again as without profiling, and only counts and bytes are recorded.
    pub fn pause_profiling(&self, paused: bool) {
        self.profiling_paused.store(paused, std::sync::atomic::Ordering::Relaxed);
    }

    /// How long a wait for the GPU polls before it blocks (`VERBATIM_SPIN_WAIT_US`).
    pub fn spin_wait(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.spin_us.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Set how long a wait polls before it blocks (zero: it blocks at once).
    pub fn set_spin_wait(&self, d: std::time::Duration) {
        self.spin_us.store(d.as_micros() as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether dispatches are timed now (profiling asked for, supported and not paused).
    pub fn timing_dispatches(&self) -> bool {
        self.profiling && !self.profiling_paused.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The first asynchronous fault wgpu reported, as an error (device loss first).
    pub fn check(&self) -> Result<()> {
        let g = self.faults.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = &g.lost {
            return Err(Error::DeviceLost(m.clone()));
        }
        if let Some(m) = &g.error {
            return Err(Error::Gpu(m.clone()));
        }
        Ok(())
    }

    /// Compile (once) and return the kernel `name` from WGSL `source`, entry point `main`.
    /// `bindings` lists bindings 1.. in order; binding 0 is the uniform parameter block.
    /// Inside [`Gpu::compile_together`] on the same thread, the compilation goes to its
    /// workers and the kernel is usable once that call has returned.
    pub fn kernel(&self, name: &'static str, source: &str, bindings: &[Access]) -> Result<Arc<Kernel>> {
        self.kernel_entry(name, source, "main", bindings)
    }

    /// As [`Gpu::kernel`], for a module with several entry points.
    pub fn kernel_entry(&self, name: &'static str, source: &str, entry: &str, bindings: &[Access]) -> Result<Arc<Kernel>> {
        self.kernel_entry_with(name, source, entry, bindings, 0)
    }

    /// As [`Gpu::kernel_entry`], with `immediate_size` bytes of immediate data (Vulkan push
    /// constants, `var<immediate>` in WGSL; the device needs `Features::IMMEDIATES`) in its
    /// pipeline layout. Binding 0 stays in the layout whether the shader reads it or not.
    pub fn kernel_entry_with(
        &self,
        name: &'static str,
        source: &str,
        entry: &str,
        bindings: &[Access],
        immediate_size: u32,
    ) -> Result<Arc<Kernel>> {
        if immediate_size > 0 && !self.device.features().contains(wgpu::Features::IMMEDIATES) {
            return Err(Error::Unsupported(format!("kernel {name}: the device offers no immediate data")));
        }
        if let Some(k) = self.kernels.lock().unwrap_or_else(|p| p.into_inner()).get(name) {
            return Ok(k.clone());
        }
        if let Some(k) = self.batched(name) {
            return Ok(k);
        }
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        }];
        for (i, a) in bindings.iter().enumerate() {
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: i as u32 + 1,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: *a == Access::Read },
                    has_dynamic_offset: false,
                    min_binding_size: None,
                },
                count: None,
            });
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some(name),
            entries: &entries,
        });
        let pipeline_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some(name),
            bind_group_layouts: &[Some(&layout)],
            immediate_size,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("kernel {name}: its bindings were refused: {e}")));
        }
        let k = Arc::new(Kernel {
            name,
            pipeline: std::sync::OnceLock::new(),
            layout,
            bindings: bindings.to_vec(),
            source: source.into(),
            entry: entry.to_string(),
            immediate_size,
        });
        if let Some(s) = &self.sources {
            s.lock().unwrap_or_else(|p| p.into_inner()).push(pipeline_stats::KernelSource {
                name,
                source: source.to_string(),
                entry: entry.to_string(),
                bindings: bindings.to_vec(),
                immediate_size,
            });
        }
        // Inside this thread's compile_together: a worker compiles it.
        let (k, pipeline_layout) = match self.defer(k, pipeline_layout) {
            Ok(k) => return Ok(k),
            Err(back) => back,
        };
        self.compile_pipeline(&k, &pipeline_layout)?;
        self.kernels.lock().unwrap_or_else(|p| p.into_inner()).insert(name, k.clone());
        Ok(k)
    }

    /// Compile `k`'s WGSL into its pipeline (on whatever thread calls: wgpu's error scopes
    /// are the calling thread's).
    fn compile_pipeline(&self, k: &Kernel, pipeline_layout: &wgpu::PipelineLayout) -> Result<()> {
        let name = k.name;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor { label: Some(name), source: wgpu::ShaderSource::Wgsl((&*k.source).into()) };
        let module = if self.info.shader_checks {
            self.device.create_shader_module(desc)
        } else {
            // SAFETY: the source is one of the engine's own kernels (or the kernel lab's
            // rewrites of them), not user input: every loop is bounded and the kernel tests
            // hold their indexing to the CPU references (see `shader_checks_wanted`).
            unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        };
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: Some(pipeline_layout),
            module: &module,
            entry_point: Some(&k.entry),
            compilation_options: Default::default(),
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("kernel {name} failed to compile: {e}")));
        }
        // Only this call sets it (a kernel is compiled once, by whoever made it or one worker).
        let _ = k.pipeline.set(pipeline);
        Ok(())
    }

    /// The driver's compiler statistics (registers, shared memory, spills: whatever it
    /// reports) of every kernel compiled so far, in compile order. Needs a device opened with
    /// `GpuOptions::pipeline_stats`.
    pub fn pipeline_stats(&self) -> Result<Vec<pipeline_stats::KernelReport>> {
        let Some(sources) = &self.sources else {
            return Err(Error::Unsupported("the device was not opened with compiler statistics (GpuOptions::pipeline_stats)".into()));
        };
        let sources = sources.lock().unwrap_or_else(|p| p.into_inner()).clone();
        sources.iter().map(|s| pipeline_stats::report(&self.device, s, self.info.shader_checks)).collect()
    }

    /// A storage buffer of `size` bytes (at least 4), zero-initialised by wgpu.
    pub fn buffer(&self, label: &str, size: u64) -> Result<wgpu::Buffer> {
        self.buffer_for(label, size, wgpu::BufferUsages::empty())
    }

    /// A storage buffer that indirect dispatches also read their grids from (the table of
    /// `Recorder::gate`).
    pub fn grid_table(&self, label: &str, size: u64) -> Result<wgpu::Buffer> {
        self.buffer_for(label, size, wgpu::BufferUsages::INDIRECT)
    }

    fn buffer_for(&self, label: &str, size: u64, extra: wgpu::BufferUsages) -> Result<wgpu::Buffer> {
        let size = size.max(4).next_multiple_of(4);
        if size > self.device.limits().max_buffer_size {
            return Err(Error::Unsupported(format!(
                "buffer {label} needs {size} bytes; the adapter allows {}",
                self.device.limits().max_buffer_size
            )));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC | extra,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("cannot allocate {label} ({size} bytes): {e}")));
        }
        Ok(b)
    }

    /// A storage buffer holding `bytes` (padded to a multiple of 4).
    pub fn upload(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
        let b = self.buffer(label, bytes.len() as u64)?;
        if bytes.len() <= 2 * UPLOAD_CHUNK {
            self.write(&b, 0, bytes);
        } else {
            // wgpu copies each write into a staging buffer of its own outside its locks: a
            // large upload's chunks are copied side by side.
            let chunks: Vec<&[u8]> = bytes.chunks(UPLOAD_CHUNK).collect();
            side_by_side(chunks.len(), |i| self.write(&b, (i * UPLOAD_CHUNK) as u64, chunks[i]))?;
        }
        Ok(b)
    }

    pub fn upload_f32(&self, label: &str, v: &[f32]) -> Result<wgpu::Buffer> {
        self.upload(label, bytemuck::cast_slice(v))
    }

    pub fn upload_u32(&self, label: &str, v: &[u32]) -> Result<wgpu::Buffer> {
        self.upload(label, bytemuck::cast_slice(v))
    }

    /// Queue a write; lengths that are not a multiple of 4 are padded with zeros.
    pub fn write(&self, buf: &wgpu::Buffer, offset: u64, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        if bytes.len() % 4 == 0 {
            self.queue.write_buffer(buf, offset, bytes);
        } else {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().next_multiple_of(4), 0);
            self.queue.write_buffer(buf, offset, &v);
        }
    }

    /// Fill a buffer with a 32-bit pattern (tests poison outputs with NaN this way).
    pub fn fill_u32(&self, buf: &wgpu::Buffer, pattern: u32) {
        let n = (buf.size() / 4) as usize;
        self.queue.write_buffer(buf, 0, bytemuck::cast_slice(&vec![pattern; n]));
    }

    /// Copy `len` bytes at `offset` of `buf` back to the host (waits for the GPU).
    pub fn read(&self, buf: &wgpu::Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        let len4 = len.next_multiple_of(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: len4.max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, offset, &staging, 0, len4);
        self.queue.submit([enc.finish()]);
        self.map_and_wait(&staging)?;
        let mut data = staging
            .get_mapped_range(..)
            .map_err(|e| Error::Gpu(format!("reading a result back failed: {e}")))?
            .to_vec();
        staging.unmap();
        data.truncate(len as usize);
        Ok(data)
    }

    pub fn read_f32(&self, buf: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<f32>> {
        let b = self.read(buf, offset_elems * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    pub fn read_u32(&self, buf: &wgpu::Buffer, offset_elems: u64, n: usize) -> Result<Vec<u32>> {
        let b = self.read(buf, offset_elems * 4, n as u64 * 4)?;
        Ok(bytemuck::pod_collect_to_vec(&b))
    }

    /// Map a MAP_READ buffer and block until it is mapped or the device fails.
    pub(crate) fn map_and_wait(&self, staging: &wgpu::Buffer) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        // Polled first (`spin_budget`) until the callback has run, not until the queue is
        // empty: the window's frames share the queue.
        let mut got = None;
        if !self.spin_until(|_| {
            got = rx.try_recv().ok();
            got.is_some()
        })? {
            self.wait_blocking()?;
        }
        // Another thread sharing the device may be the one whose poll runs our callback, a
        // moment after our own wait returned: keep polling briefly until it arrives.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let r = match got.take() {
                Some(r) => Ok(r),
                None => rx.recv_timeout(std::time::Duration::from_millis(2)),
            };
            match r {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => {
                    self.check()?;
                    return Err(Error::Gpu(format!("reading a result back failed: {e}")));
                }
                Err(_) if std::time::Instant::now() < deadline => {
                    self.check()?;
                    let _ = self.device.poll(wgpu::PollType::Poll);
                }
                Err(_) => {
                    self.check()?;
                    return Err(Error::Gpu("reading a result back did not complete".into()));
                }
            }
        }
    }

    /// Wait until all submitted work is done (polling first for `spin_budget`, then
    /// blocking); report faults.
    pub fn wait(&self) -> Result<()> {
        if self.spin_until(|idle| idle)? {
            return self.check();
        }
        self.wait_blocking()
    }

    /// Poll without blocking until `done` (given whether the queue is idle) holds or the
    /// spin budget is spent: whether it held.
    /// Whether recordings can be replayed here (`Recorder::replay`): a Vulkan device the
    /// engine opened itself, not `VERBATIM_REPLAY=0`, no per-dispatch timestamps.
    pub fn replay_available(&self) -> bool {
        self.replay_ok && !self.timing_dispatches()
    }

    /// Run `f` on the replayer, made on first use.
    #[cfg(not(target_vendor = "apple"))]
    pub(crate) fn with_replayer<T>(&self, f: impl FnOnce(&mut replay::Replayer) -> Result<T>) -> Result<T> {
        if !self.replay_ok {
            return Err(Error::Unsupported("replays need a Vulkan device the engine opened itself".into()));
        }
        let mut g = self.replayer.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() {
            *g = Some(replay::Replayer::new(&self.device, self.info.shader_checks)?);
        }
        match g.as_mut() {
            Some(r) => f(r),
            None => Err(Error::Unsupported("no replayer".into())),
        }
    }

    /// Build the replay's raw pipelines of `kernels` now (a model's load: its decode
    /// kernels, beside the weights' upload) rather than at the first pass that takes them.
    /// With the driver's shader cache empty, a first file's prefill waited 0.27-0.48 s for
    /// them on the lent H100s (2026-12-06, eighteenth session). Nothing where nothing is
    /// replayed.
    pub fn prebuild_replay(&self, kernels: &[&Arc<Kernel>]) -> Result<()> {
        if !self.replay_available() {
            return Ok(());
        }
        #[cfg(not(target_vendor = "apple"))]
        {
            let ks: Vec<&Kernel> = kernels.iter().map(|k| &***k).collect();
            self.with_replayer(|r| r.prebuild(&ks, 1))
        }
        #[cfg(target_vendor = "apple")]
        {
            let _ = kernels;
            Ok(())
        }
    }

    /// Wait for a replayed submission (polled for `spin_budget`, then blocking).
    pub fn replay_wait(&self, t: Ticket) -> Result<()> {
        #[cfg(not(target_vendor = "apple"))]
        {
            let spin = self.spin_wait();
            self.with_replayer(|r| r.wait(t, spin))
        }
        #[cfg(target_vendor = "apple")]
        {
            let _ = t;
            Err(Error::Unsupported("replays need Vulkan".into()))
        }
    }

    /// A [`HostBuffer`] of at least `bytes` bytes, zeroed. An error where nothing is
    /// replayed (not a Vulkan device the engine opened) or the memory is not there.
    pub fn host_buffer(&self, bytes: u64) -> Result<HostBuffer> {
        #[cfg(not(target_vendor = "apple"))]
        {
            let (id, size, device_local) = self.with_replayer(|r| r.make_host(bytes))?;
            Ok(HostBuffer { id, size, device_local })
        }
        #[cfg(target_vendor = "apple")]
        {
            let _ = bytes;
            Err(Error::Unsupported("host buffers need Vulkan".into()))
        }
    }

    /// Write each `(byte offset, bytes)` of `writes` into `b`'s mapping, in bounds (else an
    /// error, before any is written). The GPU sees them from the next submission on; bytes a
    /// submission in flight may still copy are the caller's to leave alone until it is done.
    pub fn write_host(&self, b: &HostBuffer, writes: &[(u64, &[u8])]) -> Result<()> {
        if let Some((off, data)) = writes.iter().find(|(off, data)| off.checked_add(data.len() as u64).is_none_or(|end| end > b.size)) {
            return Err(Error::Invalid(format!("a write of {} bytes at {off} past a host buffer's {} bytes", data.len(), b.size)));
        }
        #[cfg(not(target_vendor = "apple"))]
        {
            self.with_replayer(|r| writes.iter().try_for_each(|(off, data)| r.write_host(b.id, *off, data)))
        }
        #[cfg(target_vendor = "apple")]
        Err(Error::Unsupported("host buffers need Vulkan".into()))
    }

    /// Free `b`, once every replay submission that may copy from it has finished.
    pub fn free_host_buffer(&self, b: HostBuffer) -> Result<()> {
        #[cfg(not(target_vendor = "apple"))]
        {
            let spin = self.spin_wait();
            self.with_replayer(|r| r.free_host(b.id, spin))
        }
        #[cfg(target_vendor = "apple")]
        {
            let _ = b;
            Ok(())
        }
    }

    /// Keep at most `n` replay programs (a test of dropping them at the bound).
    #[cfg(all(test, not(target_vendor = "apple")))]
    pub(crate) fn set_replay_max_programs(&self, n: usize) -> Result<()> {
        self.with_replayer(|r| {
            r.set_max_programs(n);
            Ok(())
        })
    }

    /// Raw pipelines the replayer has built (a test of `prebuild_replay`).
    #[cfg(all(test, not(target_vendor = "apple")))]
    pub(crate) fn replay_pipelines(&self) -> usize {
        self.replayer.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map_or(0, |r| r.pipelines())
    }

    /// Programs the replayer has built (0 before its first use).
    pub fn replay_programs(&self) -> usize {
        #[cfg(not(target_vendor = "apple"))]
        {
            self.replayer.lock().unwrap_or_else(|p| p.into_inner()).as_ref().map_or(0, |r| r.programs())
        }
        #[cfg(target_vendor = "apple")]
        0
    }

    fn spin_until(&self, mut done: impl FnMut(bool) -> bool) -> Result<bool> {
        let end = std::time::Instant::now() + self.spin_wait();
        while std::time::Instant::now() < end {
            if done(self.poll_once()?) {
                return Ok(true);
            }
            std::hint::spin_loop();
        }
        Ok(false)
    }

    /// One poll that does not block: whether no submission is in flight any more.
    fn poll_once(&self) -> Result<bool> {
        match self.device.poll(wgpu::PollType::Poll) {
            Ok(status) => Ok(status.is_queue_empty()),
            Err(e) => {
                self.check()?;
                Err(Error::DeviceLost(e.to_string()))
            }
        }
    }

    /// Block until all submitted work is done; report faults.
    fn wait_blocking(&self) -> Result<()> {
        if let Err(e) = self.device.poll(wgpu::PollType::wait_indefinitely()) {
            self.check()?;
            return Err(match e {
                wgpu::PollError::Timeout => Error::Gpu("the GPU did not finish in time".into()),
                other => Error::DeviceLost(other.to_string()),
            });
        }
        self.check()
    }

    /// Start recording dispatches for one submission.
    pub fn recorder(&self) -> Recorder<'_> {
        Recorder::new(self, None)
    }

    /// A recorder that keeps bind groups and parameter slots in `cache` for the next
    /// recording of the same sequence of dispatches (see [`DispatchCache`]).
    pub fn recorder_cached<'a>(&'a self, cache: &'a mut DispatchCache) -> Recorder<'a> {
        Recorder::new(self, Some(cache))
    }
}

#[cfg(test)]
mod tests {
    use super::spin_budget;
    use std::time::Duration;

    /// Reads and waits through the polling path (forced on, even on lavapipe) return what
    /// the GPU wrote: the map callback caught while polling is not lost.
    #[test]
    fn polling_waits_read_back_what_the_gpu_wrote() {
        let gpu = crate::testgpu::gpu_arc();
        let mut rng = crate::testgpu::rng("polling_waits_read_back_what_the_gpu_wrote");
        let data: Vec<u32> = (0..1027).map(|_| rand::Rng::random::<u32>(&mut rng) | 1).collect();
        let buf = gpu.buffer("spin test", 4 * data.len() as u64).unwrap();
        gpu.fill_u32(&buf, crate::testgpu::NAN_BITS);
        let before = gpu.spin_wait();
        gpu.set_spin_wait(Duration::from_secs(1));
        gpu.write(&buf, 0, bytemuck::cast_slice(&data));
        let got = gpu.read_u32(&buf, 0, data.len());
        let waited = gpu.wait();
        gpu.set_spin_wait(before);
        assert_eq!(got.unwrap(), data);
        waited.unwrap();
    }

    #[test]
    fn waits_spin_on_a_gpu_by_default_and_never_on_the_cpu() {
        assert_eq!(spin_budget(false, None), Duration::from_micros(2000));
        assert_eq!(spin_budget(true, None), Duration::ZERO);
        assert_eq!(spin_budget(true, Some("500")), Duration::from_micros(500), "a setting holds on the CPU too");
        assert_eq!(spin_budget(false, Some(" 0 ")), Duration::ZERO);
        assert_eq!(spin_budget(false, Some("lots")), Duration::from_micros(2000), "unreadable: the default");
        assert_eq!(spin_budget(false, Some("99999999")), Duration::from_secs(1), "capped at a second");
    }
}
