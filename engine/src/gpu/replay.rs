//! Recordings replayed through raw Vulkan: a command buffer recorded once per distinct
//! dispatch sequence and submitted again with new parameters.
//!
//! Why: wgpu consumes a command buffer on submission, so every verify pass is encoded anew,
//! and on the lent machines that costs the host 0.1-0.2 ms a tiny.en pass (two thirds of it
//! wgpu-core's per-dispatch usage tracking, RESULTS.md 2026-12-05 fifth session) while the
//! GPU waits for most of it. A pass's dispatches, bind groups and grids repeat (the
//! `Recorder::signature` of a pass depends on its row count and its attention's key splits,
//! not on its tokens or position): here each distinct signature becomes one Vulkan command
//! buffer, built on its first use from the same WGSL (compiled again through naga with
//! wgpu-hal's options, as `pipeline_stats` does) and the same buffers, and each submission
//! is a small prologue of `vkCmdUpdateBuffer`s (the parameter bytes and the caller's writes)
//! followed by that buffer. The host then records the pass without encoding it (our own
//! bookkeeping: kernels, slots, bind groups) and uploads a few KiB.
//!
//! Ordering with wgpu's own submissions on the same queue is by submission order and
//! global barriers: the prologue begins with one from every earlier command (wgpu's too),
//! the replayed buffer ends with one to every later command and the host. Writes queued
//! through wgpu (`Queue::write_buffer`) land only with wgpu's next submission, so whatever
//! a replay must see goes through its own prologue. Only where the engine opened the device
//! itself (`Gpu::new`): `vkQueueSubmit` needs the queue to itself, and a window drawing
//! on a borrowed device submits from its own thread.

use std::collections::HashMap;
use std::sync::Arc;

use ash::vk;
use wgpu::hal::api::Vulkan;

use super::pipeline_stats::{layout_bindings, spirv, KernelSource};
use super::recorder::Signature;
use super::Kernel;
use crate::{Error, Result};

/// One command of a program: a dispatch with its parameter range and storage buffers, or a
/// copy.
pub(crate) enum ProgramCmd {
    Dispatch {
        kernel: Arc<Kernel>,
        /// The parameter block: arena buffer, byte offset, bytes.
        params: (wgpu::Buffer, u64, u64),
        buffers: Vec<wgpu::Buffer>,
        groups: [u32; 3],
        indirect: Option<(wgpu::Buffer, u64)>,
    },
    Copy { src: wgpu::Buffer, src_off: u64, dst: wgpu::Buffer, dst_off: u64, size: u64 },
}

/// A submission in flight: wait for it with [`Replayer::wait`].
#[derive(Clone, Copy, Debug)]
pub struct Ticket {
    entry: usize,
    serial: u64,
}

struct RawPipeline {
    module: vk::ShaderModule,
    set_layout: vk::DescriptorSetLayout,
    layout: vk::PipelineLayout,
    pipeline: vk::Pipeline,
}

struct Program {
    cmd: vk::CommandBuffer,
    /// The buffers its descriptors and commands name, kept alive with it.
    _keep: Vec<wgpu::Buffer>,
    /// Its last submission, which must finish before it is submitted again.
    last: Option<Ticket>,
}

/// A prologue command buffer and the fence of the submission it went with.
struct Entry {
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    serial: u64,
    busy: bool,
    /// Host memory the prologue copies its big writes from (made on the first big write,
    /// grown as needed): free whenever the entry is, since its submission has finished.
    staging: Option<Staging>,
}

/// A buffer in host-visible, host-coherent memory, mapped for its lifetime.
struct Staging {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    ptr: std::ptr::NonNull<u8>,
    size: u64,
    /// In device-local memory (the BAR), where the device's reads stay in video memory.
    device_local: bool,
}

// SAFETY: the mapping is written only through `&mut Replayer` (`Gpu` keeps it behind a
// mutex): an entry's staging only while the entry is not in flight, a host buffer
// (`write_host`) whenever its caller says the bytes are not being copied (a write beside a
// copy in flight is the GPU's concern, not memory safety's); a shared reference (the
// pipelines' compilation on worker threads) never touches it.
unsafe impl Send for Staging {}
unsafe impl Sync for Staging {}

/// Prologues in flight at most (each submission takes the next; one still running is
/// waited for).
const ENTRIES: usize = 8;
/// Descriptor sets a pool holds (another pool is made when one is full).
const SETS_PER_POOL: u32 = 1024;
/// `vkCmdUpdateBuffer` takes at most this many bytes at a time.
const UPDATE_MAX: usize = 65536;
/// Writes of at least this many bytes go through the entry's staging buffer and a
/// `vkCmdCopyBuffer`, not inline: a 30 s window's mel (960 KB) as `vkCmdUpdateBuffer`s made
/// the tiny.en encoder ~0.2 ms slower than wgpu's staging copy (H100, 2026-12-07), since
/// the command buffer carries the bytes and the GPU's front end feeds them through.
const STAGE_MIN: usize = UPDATE_MAX;
/// Programs kept at most: past this all are dropped (and rebuilt as they recur). A model's
/// passes make a few dozen (16 lengths x its self-attention's key splits); the bound is for
/// a device that outlives many models (the tests' shared one), whose old programs would
/// otherwise keep their buffers alive.
const MAX_PROGRAMS: usize = 256;

pub(crate) struct Replayer {
    raw: ash::Device,
    queue: vk::Queue,
    cmd_pool: vk::CommandPool,
    desc_pools: Vec<vk::DescriptorPool>,
    pipelines: HashMap<&'static str, RawPipeline>,
    programs: HashMap<Signature, Program>,
    entries: Vec<Entry>,
    next: usize,
    serial: u64,
    api_version: u32,
    checks: bool,
    native_zero: bool,
    subgroups: bool,
    /// For the staging buffers' memory type.
    memory_types: Vec<vk::MemoryType>,
    /// `MAX_PROGRAMS`, or less in a test.
    max_programs: usize,
    /// Buffers the host writes and prologues copy from (`Gpu::host_buffer`), by id.
    host: HashMap<u64, Staging>,
}

fn vk_err(what: &str, e: vk::Result) -> Error {
    match e {
        vk::Result::ERROR_DEVICE_LOST => Error::DeviceLost(format!("{what}: {e}")),
        _ => Error::Gpu(format!("replay: {what}: {e}")),
    }
}

/// The raw handle of a wgpu buffer.
fn raw_buffer(b: &wgpu::Buffer) -> Result<vk::Buffer> {
    // SAFETY: the handle is only recorded into command buffers and descriptors while the
    // caller keeps `b` alive (programs keep their buffers).
    unsafe { b.as_hal::<Vulkan>().map(|h| h.raw_handle()) }
        .ok_or_else(|| Error::Unsupported("replay: a buffer without a Vulkan handle".into()))
}

/// Every earlier command's writes before every later command's reads and writes.
fn full_barrier(raw: &ash::Device, cmd: vk::CommandBuffer, dst_stage: vk::PipelineStageFlags, dst_access: vk::AccessFlags) {
    let barrier = vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
        .dst_access_mask(dst_access);
    // SAFETY: `cmd` is in the recording state (callers).
    unsafe {
        raw.cmd_pipeline_barrier(
            cmd,
            vk::PipelineStageFlags::ALL_COMMANDS,
            dst_stage,
            vk::DependencyFlags::empty(),
            &[barrier],
            &[],
            &[],
        )
    }
}

const ALL_ACCESS: vk::AccessFlags = vk::AccessFlags::from_raw(
    vk::AccessFlags::MEMORY_READ.as_raw() | vk::AccessFlags::MEMORY_WRITE.as_raw(),
);

impl Replayer {
    /// A replayer on `device`'s Vulkan device and queue; `Unsupported` where the device is
    /// not a Vulkan one.
    pub(crate) fn new(device: &wgpu::Device, checks: bool) -> Result<Replayer> {
        // SAFETY: the raw device and queue are used for objects of our own (destroyed in
        // `drop`, which the `Gpu` runs before its device goes) and for submissions ordered
        // with wgpu's by the queue (see the module's notes).
        let hal = unsafe { device.as_hal::<Vulkan>() }
            .ok_or_else(|| Error::Unsupported("replay needs a Vulkan device".into()))?;
        let raw = hal.raw_device().clone();
        let queue = hal.raw_queue();
        let family = hal.queue_family_index();
        let instance = hal.shared_instance().raw_instance();
        let phys = hal.raw_physical_device();
        // SAFETY: queries on the device's own physical device.
        let api_version = unsafe { instance.get_physical_device_properties(phys) }.api_version;
        // wgpu zeroes workgroup memory natively where the driver offers it (1.3 or the
        // extension, and the feature), else by a polyfill; the same here.
        let has_ext = hal.enabled_device_extensions().contains(&ash::khr::zero_initialize_workgroup_memory::NAME);
        let native_zero = (api_version >= vk::API_VERSION_1_3 || has_ext) && {
            let mut zero = vk::PhysicalDeviceZeroInitializeWorkgroupMemoryFeatures::default();
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut zero);
            // SAFETY: a query with a valid chain.
            unsafe { instance.get_physical_device_features2(phys, &mut f2) };
            zero.shader_zero_initialize_workgroup_memory != 0
        };
        let subgroups = device.features().contains(wgpu::Features::SUBGROUP);
        // SAFETY: a query on the device's own physical device.
        let props = unsafe { instance.get_physical_device_memory_properties(phys) };
        let memory_types = props.memory_types[..props.memory_type_count as usize].to_vec();
        drop(hal);
        // SAFETY: a pool on the device's queue family.
        let cmd_pool = unsafe {
            raw.create_command_pool(
                &vk::CommandPoolCreateInfo::default()
                    .queue_family_index(family)
                    .flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER),
                None,
            )
        }
        .map_err(|e| vk_err("command pool", e))?;
        let mut r = Replayer {
            raw,
            queue,
            cmd_pool,
            desc_pools: Vec::new(),
            pipelines: HashMap::new(),
            programs: HashMap::new(),
            entries: Vec::new(),
            next: 0,
            serial: 0,
            api_version,
            checks,
            native_zero,
            subgroups,
            memory_types,
            max_programs: MAX_PROGRAMS,
            host: HashMap::new(),
        };
        let cmds = r.alloc_cmds(ENTRIES as u32)?;
        for cmd in cmds {
            // SAFETY: a plain fence.
            let fence = unsafe { r.raw.create_fence(&vk::FenceCreateInfo::default(), None) }.map_err(|e| vk_err("fence", e))?;
            r.entries.push(Entry { cmd, fence, serial: 0, busy: false, staging: None });
        }
        Ok(r)
    }

    fn alloc_cmds(&self, n: u32) -> Result<Vec<vk::CommandBuffer>> {
        // SAFETY: primary buffers from our pool.
        unsafe {
            self.raw.allocate_command_buffers(
                &vk::CommandBufferAllocateInfo::default()
                    .command_pool(self.cmd_pool)
                    .level(vk::CommandBufferLevel::PRIMARY)
                    .command_buffer_count(n),
            )
        }
        .map_err(|e| vk_err("command buffers", e))
    }

    /// Whether a program for this signature exists.
    pub(crate) fn has(&self, sig: &Signature) -> bool {
        self.programs.contains_key(sig)
    }

    /// Keep at most `n` programs (tests: the drop of all at the bound).
    #[cfg(test)]
    pub(crate) fn set_max_programs(&mut self, n: usize) {
        self.max_programs = n.clamp(1, MAX_PROGRAMS);
    }

    /// Raw pipelines built so far (tests).
    #[cfg(test)]
    pub(crate) fn pipelines(&self) -> usize {
        self.pipelines.len()
    }

    /// Programs built so far (for tests and the bench's notes).
    pub(crate) fn programs(&self) -> usize {
        self.programs.len()
    }

    /// Compile the kernels of `cmds` that have no raw pipeline yet, side by side
    /// (`threads::side_by_side`). A program's first build used to compile its ~35
    /// kernels one after another: 1.1 s of a first file's prefill on an H100 with the
    /// driver's cache empty, ~40 ms with it full (2026-12-06, seventeenth session).
    fn compile_missing(&mut self, cmds: &[ProgramCmd]) -> Result<()> {
        let kernels: Vec<&Kernel> = cmds
            .iter()
            .filter_map(|c| match c {
                ProgramCmd::Dispatch { kernel, .. } => Some(&**kernel),
                ProgramCmd::Copy { .. } => None,
            })
            .collect();
        self.prebuild(&kernels, 2)
    }

    /// Compile the raw pipelines of `kernels` that are not built yet, side by side, where
    /// at least `min` are missing (fewer are left to their first use); the first error.
    pub(crate) fn prebuild(&mut self, kernels: &[&Kernel], min: usize) -> Result<()> {
        let mut missing: Vec<&Kernel> = Vec::new();
        for &k in kernels {
            if !self.pipelines.contains_key(k.name) && !missing.iter().any(|m| m.name == k.name) {
                missing.push(k);
            }
        }
        if missing.len() < min {
            return Ok(());
        }
        let made = crate::threads::side_by_side(missing.len(), |i| (missing[i].name, self.compile(missing[i])))?;
        let mut first_err = None;
        for (name, r) in made {
            match r {
                Ok(p) => {
                    self.pipelines.insert(name, p);
                }
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    fn pipeline(&mut self, k: &Kernel) -> Result<&RawPipeline> {
        if !self.pipelines.contains_key(k.name) {
            let p = self.compile(k)?;
            self.pipelines.insert(k.name, p);
        }
        Ok(&self.pipelines[k.name])
    }

    /// `k` compiled again into a raw pipeline: its WGSL through naga with wgpu-hal's
    /// options for this device, its layout as `Gpu::kernel_entry_with` builds it.
    fn compile(&self, k: &Kernel) -> Result<RawPipeline> {
        if k.immediate_size > 0 {
            return Err(Error::Unsupported(format!("replay: kernel {} takes immediate data", k.name)));
        }
        let src = KernelSource {
            name: k.name,
            source: k.source.to_string(),
            entry: k.entry.clone(),
            bindings: k.bindings.clone(),
            immediate_size: 0,
        };
        let words = spirv(&src, self.api_version, self.checks, self.native_zero)?;
        let err = |what: &str, e: vk::Result| vk_err(&format!("kernel {} {what}", k.name), e);
        let bindings = layout_bindings(k.bindings.len());
        let mut p = RawPipeline {
            module: vk::ShaderModule::null(),
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
        };
        // SAFETY (this block): valid create infos; on an error the objects made so far are
        // destroyed by `destroy_pipeline` (null handles are ignored).
        let made = unsafe {
            (|| -> Result<()> {
                p.module = self
                    .raw
                    .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                    .map_err(|e| err("shader module", e))?;
                p.set_layout = self
                    .raw
                    .create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)
                    .map_err(|e| err("set layout", e))?;
                let set_layouts = [p.set_layout];
                p.layout = self
                    .raw
                    .create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts), None)
                    .map_err(|e| err("pipeline layout", e))?;
                let entry = std::ffi::CString::new(k.entry.as_str()).map_err(|e| Error::Invalid(e.to_string()))?;
                let flags = if self.subgroups {
                    vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE
                } else {
                    vk::PipelineShaderStageCreateFlags::empty()
                };
                let stage = vk::PipelineShaderStageCreateInfo::default()
                    .flags(flags)
                    .stage(vk::ShaderStageFlags::COMPUTE)
                    .module(p.module)
                    .name(&entry);
                let info = vk::ComputePipelineCreateInfo::default().stage(stage).layout(p.layout);
                p.pipeline = self
                    .raw
                    .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                    .map_err(|(_, e)| err("pipeline", e))?[0];
                Ok(())
            })()
        };
        match made {
            Ok(()) => Ok(p),
            Err(e) => {
                self.destroy_pipeline(&p);
                Err(e)
            }
        }
    }

    fn destroy_pipeline(&self, p: &RawPipeline) {
        // SAFETY: our own objects, not in use (callers); null handles are ignored.
        unsafe {
            self.raw.destroy_pipeline(p.pipeline, None);
            self.raw.destroy_pipeline_layout(p.layout, None);
            self.raw.destroy_descriptor_set_layout(p.set_layout, None);
            self.raw.destroy_shader_module(p.module, None);
        }
    }

    fn alloc_set(&mut self, layout: vk::DescriptorSetLayout) -> Result<vk::DescriptorSet> {
        let layouts = [layout];
        if let Some(&pool) = self.desc_pools.last() {
            // SAFETY: a set of a layout of ours from a pool of ours.
            match unsafe {
                self.raw
                    .allocate_descriptor_sets(&vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts))
            } {
                Ok(s) => return Ok(s[0]),
                Err(vk::Result::ERROR_OUT_OF_POOL_MEMORY | vk::Result::ERROR_FRAGMENTED_POOL) => {}
                Err(e) => return Err(vk_err("descriptor set", e)),
            }
        }
        let sizes = [
            vk::DescriptorPoolSize::default().ty(vk::DescriptorType::UNIFORM_BUFFER).descriptor_count(SETS_PER_POOL),
            vk::DescriptorPoolSize::default().ty(vk::DescriptorType::STORAGE_BUFFER).descriptor_count(SETS_PER_POOL * 12),
        ];
        // SAFETY: a plain pool.
        let pool = unsafe {
            self.raw
                .create_descriptor_pool(&vk::DescriptorPoolCreateInfo::default().max_sets(SETS_PER_POOL).pool_sizes(&sizes), None)
        }
        .map_err(|e| vk_err("descriptor pool", e))?;
        self.desc_pools.push(pool);
        // SAFETY: as above, from the new pool.
        unsafe {
            self.raw.allocate_descriptor_sets(&vk::DescriptorSetAllocateInfo::default().descriptor_pool(pool).set_layouts(&layouts))
        }
        .map(|s| s[0])
        .map_err(|e| vk_err("descriptor set", e))
    }

    /// Build the program for `sig` from its commands: one descriptor set a dispatch, a
    /// global barrier between commands, one to every later command and the host at the end.
    pub(crate) fn build(&mut self, sig: Signature, cmds: &[ProgramCmd]) -> Result<()> {
        if self.programs.len() >= self.max_programs {
            self.drop_programs()?;
        }
        let mut keep: Vec<wgpu::Buffer> = Vec::new();
        /// A dispatch as the command buffer records it.
        struct Bound {
            pipeline: vk::Pipeline,
            layout: vk::PipelineLayout,
            set: vk::DescriptorSet,
            groups: [u32; 3],
            indirect: Option<(vk::Buffer, u64)>,
        }
        let mut recorded: Vec<Bound> = Vec::new();
        self.compile_missing(cmds)?;
        enum Step {
            Dispatch(usize),
            Copy(vk::Buffer, vk::Buffer, vk::BufferCopy),
        }
        let mut steps = Vec::with_capacity(cmds.len());
        for c in cmds {
            match c {
                ProgramCmd::Dispatch { kernel, params, buffers, groups, indirect } => {
                    let (pipeline, layout, set_layout) = {
                        let p = self.pipeline(kernel)?;
                        (p.pipeline, p.layout, p.set_layout)
                    };
                    let set = self.alloc_set(set_layout)?;
                    let mut infos = vec![vk::DescriptorBufferInfo::default()
                        .buffer(raw_buffer(&params.0)?)
                        .offset(params.1)
                        .range(params.2)];
                    for b in buffers {
                        infos.push(vk::DescriptorBufferInfo::default().buffer(raw_buffer(b)?).offset(0).range(vk::WHOLE_SIZE));
                    }
                    let writes: Vec<vk::WriteDescriptorSet> = infos
                        .iter()
                        .enumerate()
                        .map(|(i, info)| {
                            vk::WriteDescriptorSet::default()
                                .dst_set(set)
                                .dst_binding(i as u32)
                                .descriptor_type(if i == 0 {
                                    vk::DescriptorType::UNIFORM_BUFFER
                                } else {
                                    vk::DescriptorType::STORAGE_BUFFER
                                })
                                .buffer_info(std::slice::from_ref(info))
                        })
                        .collect();
                    // SAFETY: writes into a set of ours, naming live buffers (kept below).
                    unsafe { self.raw.update_descriptor_sets(&writes, &[]) };
                    keep.push(params.0.clone());
                    keep.extend(buffers.iter().cloned());
                    let ind = match indirect {
                        Some((b, off)) => {
                            keep.push(b.clone());
                            Some((raw_buffer(b)?, *off))
                        }
                        None => None,
                    };
                    recorded.push(Bound { pipeline, layout, set, groups: *groups, indirect: ind });
                    steps.push(Step::Dispatch(recorded.len() - 1));
                }
                ProgramCmd::Copy { src, src_off, dst, dst_off, size } => {
                    keep.push(src.clone());
                    keep.push(dst.clone());
                    let region = vk::BufferCopy { src_offset: *src_off, dst_offset: *dst_off, size: *size };
                    steps.push(Step::Copy(raw_buffer(src)?, raw_buffer(dst)?, region));
                }
            }
        }
        let cmd = self.alloc_cmds(1)?[0];
        // Between commands, a barrier from every earlier dispatch's and copy's writes (a
        // barrier's first scope is every earlier command, so the chain covers commands two
        // or more apart) to just what the next command does: on the H100 a barrier that
        // also named the indirect-argument, transfer and host stages for every dispatch made
        // a tiny.en verify pass ~0.1 ms slower than wgpu's.
        let wait_for = |next: &Step| -> (vk::PipelineStageFlags, vk::AccessFlags) {
            match next {
                Step::Dispatch(j) if recorded[*j].indirect.is_some() => (
                    vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::DRAW_INDIRECT,
                    vk::AccessFlags::SHADER_READ
                        | vk::AccessFlags::SHADER_WRITE
                        | vk::AccessFlags::UNIFORM_READ
                        | vk::AccessFlags::INDIRECT_COMMAND_READ,
                ),
                Step::Dispatch(_) => (
                    vk::PipelineStageFlags::COMPUTE_SHADER,
                    vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::UNIFORM_READ,
                ),
                Step::Copy(..) => (vk::PipelineStageFlags::TRANSFER, vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE),
            }
        };
        let (mut src_stage, mut src_access) = (vk::PipelineStageFlags::empty(), vk::AccessFlags::empty());
        // SAFETY (this block): recording a buffer of ours with objects of ours and live buffers.
        unsafe {
            self.raw
                .begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default())
                .map_err(|e| vk_err("begin program", e))?;
            let mut bound = vk::Pipeline::null();
            for s in &steps {
                if !src_stage.is_empty() {
                    let (dst_stage, dst_access) = wait_for(s);
                    let barrier = vk::MemoryBarrier::default().src_access_mask(src_access).dst_access_mask(dst_access);
                    self.raw.cmd_pipeline_barrier(cmd, src_stage, dst_stage, vk::DependencyFlags::empty(), &[barrier], &[], &[]);
                }
                match s {
                    Step::Dispatch(_) => {
                        src_stage |= vk::PipelineStageFlags::COMPUTE_SHADER;
                        src_access |= vk::AccessFlags::SHADER_WRITE;
                    }
                    Step::Copy(..) => {
                        src_stage |= vk::PipelineStageFlags::TRANSFER;
                        src_access |= vk::AccessFlags::TRANSFER_WRITE;
                    }
                }
                match s {
                    Step::Dispatch(j) => {
                        let Bound { pipeline, layout, set, groups, indirect: ind } = recorded[*j];
                        if pipeline != bound {
                            self.raw.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
                            bound = pipeline;
                        }
                        self.raw.cmd_bind_descriptor_sets(cmd, vk::PipelineBindPoint::COMPUTE, layout, 0, &[set], &[]);
                        match ind {
                            Some((b, off)) => self.raw.cmd_dispatch_indirect(cmd, b, off),
                            None => self.raw.cmd_dispatch(cmd, groups[0], groups[1], groups[2]),
                        }
                    }
                    Step::Copy(src, dst, region) => self.raw.cmd_copy_buffer(cmd, *src, *dst, std::slice::from_ref(region)),
                }
            }
            full_barrier(&self.raw, cmd, vk::PipelineStageFlags::ALL_COMMANDS | vk::PipelineStageFlags::HOST, ALL_ACCESS | vk::AccessFlags::HOST_READ);
            self.raw.end_command_buffer(cmd).map_err(|e| vk_err("end program", e))?;
        }
        self.programs.insert(sig, Program { cmd, _keep: keep, last: None });
        Ok(())
    }

    /// Drop every program once nothing is in flight: their command buffers freed, the
    /// descriptor pools reset for the next ones.
    fn drop_programs(&mut self) -> Result<()> {
        for i in 0..self.entries.len() {
            let t = Ticket { entry: i, serial: self.entries[i].serial };
            self.wait(t, std::time::Duration::ZERO)?;
        }
        let cmds: Vec<vk::CommandBuffer> = self.programs.drain().map(|(_, p)| p.cmd).collect();
        // SAFETY: none of these is in flight (every submission waited for above); one pool
        // is kept, reset, for the next programs.
        unsafe {
            self.raw.free_command_buffers(self.cmd_pool, &cmds);
            for pool in self.desc_pools.drain(1..) {
                self.raw.destroy_descriptor_pool(pool, None);
            }
            if let Some(&pool) = self.desc_pools.first() {
                self.raw.reset_descriptor_pool(pool, vk::DescriptorPoolResetFlags::empty()).map_err(|e| vk_err("reset pool", e))?;
            }
        }
        Ok(())
    }

    /// Submit the program for `sig` after a prologue writing `writes` (buffer, byte offset,
    /// bytes; offsets and lengths multiples of 4): inline, or copied from the entry's staging
    /// buffer where a write is big (`STAGE_MIN`); then `moves`' copies between buffers and
    /// zero fills.
    pub(crate) fn submit(&mut self, sig: &Signature, writes: &[(vk::Buffer, u64, &[u8])], moves: &RawMoves, spin: std::time::Duration) -> Result<Ticket> {
        let prog = self.programs.get(sig).ok_or_else(|| Error::Invalid("replay: no program for this recording".into()))?;
        let (prog_cmd, last) = (prog.cmd, prog.last);
        if let Some(t) = last {
            self.wait(t, spin)?;
        }
        for (_, off, data) in writes {
            if off % 4 != 0 || data.len() % 4 != 0 {
                return Err(Error::Invalid(format!("replay: a write of {} bytes at {off} is not in whole words", data.len())));
            }
        }
        for &(_, off, size) in &moves.zeros {
            if off % 4 != 0 || size % 4 != 0 {
                return Err(Error::Invalid(format!("replay: a zero fill of {size} bytes at {off} is not in whole words")));
            }
        }
        let mut host_copies: Vec<(vk::Buffer, vk::Buffer, &[vk::BufferCopy])> = Vec::with_capacity(moves.host_copies.len());
        for (id, dst, regions) in &moves.host_copies {
            let src = self.host.get(id).ok_or_else(|| Error::Invalid("replay: a copy from a host buffer that is gone".into()))?;
            if let Some(r) = regions.iter().find(|r| r.src_offset.checked_add(r.size).is_none_or(|end| end > src.size)) {
                return Err(Error::Invalid(format!("replay: a copy of {} bytes at {} past a host buffer's {} bytes", r.size, r.src_offset, src.size)));
            }
            host_copies.push((src.buffer, *dst, regions));
        }
        let idx = self.next;
        self.next = (self.next + 1) % ENTRIES;
        if self.entries[idx].busy {
            let t = Ticket { entry: idx, serial: self.entries[idx].serial };
            self.wait(t, spin)?;
        }
        // The big writes' bytes into the entry's staging buffer (free: its last submission
        // has finished), each at a 16-byte aligned offset.
        let staged: u64 = writes.iter().filter(|w| w.2.len() >= STAGE_MIN).map(|w| (w.2.len() as u64).next_multiple_of(16)).sum();
        let mut copies: Vec<(vk::Buffer, vk::BufferCopy)> = Vec::new();
        if staged > 0 {
            if self.entries[idx].staging.as_ref().is_none_or(|s| s.size < staged) {
                if let Some(old) = self.entries[idx].staging.take() {
                    self.destroy_staging(old);
                }
                // Every idle entry without one gets its buffer now too, so that the
                // allocations (and the pages' first touch) fall on the first big write,
                // not on one of the next eight.
                for i in 0..self.entries.len() {
                    if i == idx || (self.entries[i].staging.is_none() && !self.entries[i].busy) {
                        self.entries[i].staging = Some(self.make_staging(staged)?);
                    }
                }
            }
            let st = self.entries[idx].staging.as_ref().ok_or_else(|| Error::Gpu("replay: no staging buffer".into()))?;
            let mut at = 0u64;
            for (buf, off, data) in writes.iter().filter(|w| w.2.len() >= STAGE_MIN) {
                // SAFETY: `at + len <= st.size` (summed above); the mapping is ours and not
                // read by the GPU (the entry is not in flight).
                unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), st.ptr.as_ptr().add(at as usize), data.len()) };
                copies.push((*buf, vk::BufferCopy { src_offset: at, dst_offset: *off, size: data.len() as u64 }));
                at += (data.len() as u64).next_multiple_of(16);
            }
        }
        let staging_buffer = self.entries[idx].staging.as_ref().map(|s| s.buffer);
        self.serial += 1;
        let e = &mut self.entries[idx];
        e.serial = self.serial;
        let (cmd, fence) = (e.cmd, e.fence);
        // SAFETY (this block): the entry's buffer and fence are not in flight (waited for
        // above); the written buffers are live (the caller's). The staging buffer's host
        // writes are visible to the copies: host-coherent memory, and a submission makes
        // earlier host writes available to the device.
        unsafe {
            self.raw.reset_fences(&[fence]).map_err(|e| vk_err("reset fence", e))?;
            self.raw
                .begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT))
                .map_err(|e| vk_err("begin prologue", e))?;
            full_barrier(&self.raw, cmd, vk::PipelineStageFlags::TRANSFER, vk::AccessFlags::TRANSFER_WRITE);
            for (buf, off, data) in writes.iter().filter(|w| w.2.len() < STAGE_MIN) {
                for (i, chunk) in data.chunks(UPDATE_MAX).enumerate() {
                    self.raw.cmd_update_buffer(cmd, *buf, off + (i * UPDATE_MAX) as u64, chunk);
                }
            }
            if let Some(src) = staging_buffer {
                for (dst, region) in &copies {
                    self.raw.cmd_copy_buffer(cmd, src, *dst, std::slice::from_ref(region));
                }
            }
            // (the moves touch other bytes than the writes: callers')
            for &(src, dst, regions) in &host_copies {
                if !regions.is_empty() {
                    self.raw.cmd_copy_buffer(cmd, src, dst, regions);
                }
            }
            for &(buf, off, size) in &moves.zeros {
                if size > 0 {
                    self.raw.cmd_fill_buffer(cmd, buf, off, size, 0);
                }
            }
            full_barrier(&self.raw, cmd, vk::PipelineStageFlags::ALL_COMMANDS, ALL_ACCESS);
            self.raw.end_command_buffer(cmd).map_err(|e| vk_err("end prologue", e))?;
            let cmds = [cmd, prog_cmd];
            let info = vk::SubmitInfo::default().command_buffers(&cmds);
            self.raw.queue_submit(self.queue, &[info], fence).map_err(|e| vk_err("submit", e))?;
        }
        self.entries[idx].busy = true;
        let t = Ticket { entry: idx, serial: self.serial };
        if let Some(p) = self.programs.get_mut(sig) {
            p.last = Some(t);
        }
        Ok(t)
    }

    /// A staging buffer of at least `size` bytes in host-visible, host-coherent memory
    /// (device-local where the device offers it, else host-cached), mapped.
    fn make_staging(&self, size: u64) -> Result<Staging> {
        let size = size.next_multiple_of(1 << 20);
        // SAFETY (this block): objects of ours; on an error what was made is destroyed.
        unsafe {
            let buffer = self
                .raw
                .create_buffer(&vk::BufferCreateInfo::default().size(size).usage(vk::BufferUsageFlags::TRANSFER_SRC), None)
                .map_err(|e| vk_err("staging buffer", e))?;
            let req = self.raw.get_buffer_memory_requirements(buffer);
            let want = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
            let fits = |i: usize, flags: vk::MemoryPropertyFlags| {
                req.memory_type_bits & (1 << i) != 0 && self.memory_types[i].property_flags.contains(flags)
            };
            let n = self.memory_types.len();
            // Device-local where the host can map it (the BAR): the host's writes cross the
            // bus once and the prologue's copy stays in video memory. H100, the mel in the
            // prologue: 1.375 ms a tiny.en window against 1.430 from host-cached or uncached
            // host memory and 1.389 through wgpu's staging (RESULTS.md 2026-12-07, twenty-
            // second session).
            let Some(ty) = (0..n)
                .find(|&i| fits(i, want | vk::MemoryPropertyFlags::DEVICE_LOCAL))
                .or_else(|| (0..n).find(|&i| fits(i, want | vk::MemoryPropertyFlags::HOST_CACHED)))
                .or_else(|| (0..n).find(|&i| fits(i, want)))
            else {
                self.raw.destroy_buffer(buffer, None);
                return Err(Error::Unsupported("replay: no host-visible, host-coherent memory for staging".into()));
            };
            let memory = match self
                .raw
                .allocate_memory(&vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(ty as u32), None)
            {
                Ok(m) => m,
                Err(e) => {
                    self.raw.destroy_buffer(buffer, None);
                    return Err(vk_err("staging memory", e));
                }
            };
            let mapped = self
                .raw
                .bind_buffer_memory(buffer, memory, 0)
                .and_then(|()| self.raw.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()));
            match mapped.map(|p| std::ptr::NonNull::new(p.cast::<u8>())) {
                Ok(Some(ptr)) => {
                    // Touch every page now, not in a window's copy.
                    std::ptr::write_bytes(ptr.as_ptr(), 0, size as usize);
                    let device_local = self.memory_types[ty].property_flags.contains(vk::MemoryPropertyFlags::DEVICE_LOCAL);
                    Ok(Staging { buffer, memory, ptr, size, device_local })
                }
                other => {
                    self.raw.destroy_buffer(buffer, None);
                    self.raw.free_memory(memory, None);
                    Err(match other {
                        Err(e) => vk_err("staging map", e),
                        _ => Error::Gpu("replay: the staging memory mapped to null".into()),
                    })
                }
            }
        }
    }

    fn destroy_staging(&self, s: Staging) {
        // SAFETY: ours, not in flight (callers); freeing the memory unmaps it.
        unsafe {
            self.raw.destroy_buffer(s.buffer, None);
            self.raw.free_memory(s.memory, None);
        }
    }

    /// A host buffer of at least `size` bytes (`Gpu::host_buffer`): its id, size and
    /// whether it is device-local.
    pub(crate) fn make_host(&mut self, size: u64) -> Result<(u64, u64, bool)> {
        let s = self.make_staging(size.max(1))?;
        // Ids unique in the process: another device's host buffer is not found here.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let id = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (size, local) = (s.size, s.device_local);
        self.host.insert(id, s);
        Ok((id, size, local))
    }

    /// Write `data` into host buffer `id` at byte `off` (in bounds; any GPU read of these
    /// bytes in flight is the caller's to have waited for).
    pub(crate) fn write_host(&mut self, id: u64, off: u64, data: &[u8]) -> Result<()> {
        let s = self.host.get(&id).ok_or_else(|| Error::Invalid("a write into a host buffer that is gone".into()))?;
        if off.checked_add(data.len() as u64).is_none_or(|end| end > s.size) {
            return Err(Error::Invalid(format!("a write of {} bytes at {off} past a host buffer's {} bytes", data.len(), s.size)));
        }
        // SAFETY: in bounds (checked); the mapping lives as long as the entry in `host`, and
        // `&mut self` is the only writer.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), s.ptr.as_ptr().add(off as usize), data.len()) };
        Ok(())
    }

    /// Destroy host buffer `id` once no prologue that may copy from it is in flight.
    pub(crate) fn free_host(&mut self, id: u64, spin: std::time::Duration) -> Result<()> {
        if !self.host.contains_key(&id) {
            return Ok(());
        }
        for i in 0..self.entries.len() {
            if self.entries[i].busy {
                self.wait(Ticket { entry: i, serial: self.entries[i].serial }, spin)?;
            }
        }
        if let Some(s) = self.host.remove(&id) {
            self.destroy_staging(s);
        }
        Ok(())
    }

    /// Wait for `t`'s submission: its fence polled for `spin`, then waited on.
    pub(crate) fn wait(&mut self, t: Ticket, spin: std::time::Duration) -> Result<()> {
        let e = &mut self.entries[t.entry];
        if e.serial != t.serial || !e.busy {
            return Ok(()); // done and reused since, or already waited for
        }
        let fence = e.fence;
        let end = std::time::Instant::now() + spin;
        loop {
            // SAFETY: a fence of ours.
            match unsafe { self.raw.get_fence_status(fence) } {
                Ok(true) => break,
                Ok(false) if std::time::Instant::now() < end => std::hint::spin_loop(),
                Ok(false) => {
                    // SAFETY: as above; 30 s is far past any pass.
                    unsafe { self.raw.wait_for_fences(&[fence], true, 30_000_000_000) }.map_err(|e| match e {
                        vk::Result::TIMEOUT => Error::Gpu("the GPU did not finish a replayed pass in 30 s".into()),
                        other => vk_err("wait", other),
                    })?;
                    break;
                }
                Err(err) => return Err(vk_err("fence status", err)),
            }
        }
        self.entries[t.entry].busy = false;
        Ok(())
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        // SAFETY: nothing of ours may be in flight when destroyed: wait for the device, then
        // destroy what we made (the `Gpu` drops this before its wgpu device).
        unsafe {
            let _ = self.raw.device_wait_idle();
            for e in &self.entries {
                self.raw.destroy_fence(e.fence, None);
            }
            let mut staging: Vec<Staging> = self.entries.iter_mut().filter_map(|e| e.staging.take()).collect();
            staging.extend(self.host.drain().map(|(_, s)| s));
            for s in staging {
                self.destroy_staging(s);
            }
            for p in self.pipelines.values() {
                self.destroy_pipeline(p);
            }
            for &pool in &self.desc_pools {
                self.raw.destroy_descriptor_pool(pool, None);
            }
            self.raw.destroy_command_pool(self.cmd_pool, None);
        }
    }
}

/// A prologue's copies from host buffers and zero fills (buffer, byte offset, bytes), on
/// raw buffers.
#[derive(Default)]
pub(crate) struct RawMoves {
    /// Copies from host buffers (their ids, resolved by the replayer) to raw buffers.
    host_copies: Vec<(u64, vk::Buffer, Vec<vk::BufferCopy>)>,
    zeros: Vec<(vk::Buffer, u64, u64)>,
}

/// Submit the program built for `sig` after a prologue writing `writes` (wgpu buffers,
/// byte offsets, bytes) and running `moves`.
pub(crate) fn submit_recording(gpu: &super::Gpu, sig: &Signature, writes: &[(&wgpu::Buffer, u64, &[u8])], moves: &super::Moves) -> Result<Ticket> {
    let spin = gpu.spin_wait();
    // Every range inside its buffer: a raw copy or fill past the end is the driver's
    // undefined behaviour, where wgpu would have refused it.
    let inside = |b: &wgpu::Buffer, off: u64, len: u64, what: &str| match off.checked_add(len) {
        Some(end) if end <= b.size() => Ok(()),
        _ => Err(Error::Invalid(format!("replay: {what} of {len} bytes at {off} past a buffer's {} bytes", b.size()))),
    };
    for (b, off, data) in writes {
        inside(b, *off, data.len() as u64, "a write")?;
    }
    for (_, dst, regions) in &moves.host_copies {
        for &(_, d, n) in regions {
            inside(dst, d, n, "a host copy's destination")?;
        }
    }
    for (b, off, size) in &moves.zeros {
        inside(b, *off, *size, "a zero fill")?;
    }
    let raw: Vec<(vk::Buffer, u64, &[u8])> =
        writes.iter().map(|(b, off, data)| Ok((raw_buffer(b)?, *off, *data))).collect::<Result<_>>()?;
    let region = |&(src_offset, dst_offset, size): &(u64, u64, u64)| vk::BufferCopy { src_offset, dst_offset, size };
    let raw_moves = RawMoves {
        host_copies: moves
            .host_copies
            .iter()
            .map(|(src, dst, regions)| Ok((src.id, raw_buffer(dst)?, regions.iter().map(region).collect())))
            .collect::<Result<_>>()?,
        zeros: moves.zeros.iter().map(|(b, off, size)| Ok((raw_buffer(b)?, *off, *size))).collect::<Result<_>>()?,
    };
    gpu.with_replayer(|r| r.submit(sig, &raw, &raw_moves, spin))
}
