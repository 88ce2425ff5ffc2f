//! What the driver's compiler made of each kernel: registers, shared memory, spills, as the
//! Vulkan driver reports them through `VK_KHR_pipeline_executable_properties`.
//!
//! Why: until now every guess about a kernel's occupancy ("the accumulators spill to local
//! memory", "two workgroups an SM") was read off timings, with no disassembly to confirm it.
//! NVIDIA's and Mesa's Vulkan drivers answer the question directly for a pipeline created
//! with `VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR`. wgpu creates its pipelines without
//! that flag and does not expose their SPIR-V, so each kernel the engine compiled is
//! compiled a second time here: the same WGSL through the same naga, with the options
//! wgpu-hal gives it for this device (SPIR-V version, bounds-check policy of
//! `Gpu::kernel_entry`'s runtime checks, workgroup memory zeroed natively), into a raw
//! Vulkan pipeline with the capture flags, whose statistics are read and which is then
//! destroyed. The device must have been opened with the extension (`GpuOptions::
//! pipeline_stats`: `verbatim bench --pipeline-stats`); nothing here runs otherwise.

use super::Access;
#[cfg(not(target_vendor = "apple"))]
pub(super) use vulkan::{layout_bindings, open_device, report, spirv};

/// A kernel as `Gpu::kernel_entry_with` compiled it: enough to compile it again.
#[derive(Clone, Debug)]
pub struct KernelSource {
    pub name: &'static str,
    pub source: String,
    pub entry: String,
    pub bindings: Vec<Access>,
    pub immediate_size: u32,
}

/// One statistic of one executable, as the driver names it.
#[derive(Clone, Debug)]
pub struct Statistic {
    pub name: String,
    pub description: String,
    pub value: String,
}

/// One executable of a pipeline (a compute pipeline has one) and what the driver says of it.
#[derive(Clone, Debug)]
pub struct Executable {
    pub name: String,
    pub subgroup_size: u32,
    pub statistics: Vec<Statistic>,
    /// The driver's internal representations (IR, assembly) where it offers them as text:
    /// (name, text).
    pub representations: Vec<(String, String)>,
}

/// The statistics of one kernel.
#[derive(Clone, Debug)]
pub struct KernelReport {
    pub kernel: &'static str,
    pub entry: String,
    pub executables: Vec<Executable>,
}

#[cfg(target_vendor = "apple")]
pub(super) fn open_device(
    _adapter: &wgpu::Adapter,
    _desc: &wgpu::DeviceDescriptor<'_>,
) -> crate::Result<(wgpu::Device, wgpu::Queue)> {
    Err(crate::Error::Unsupported("compiler statistics come from Vulkan drivers; this build has no Vulkan backend".into()))
}

#[cfg(target_vendor = "apple")]
pub(super) fn report(_device: &wgpu::Device, _src: &KernelSource, _checks: bool) -> crate::Result<KernelReport> {
    Err(crate::Error::Unsupported("compiler statistics come from Vulkan drivers; this build has no Vulkan backend".into()))
}

#[cfg(not(target_vendor = "apple"))]
mod vulkan {
    use std::ffi::{c_char, CStr};

    use ash::vk;
    use wgpu::hal::api::Vulkan;
    use wgpu::naga;

    use super::{Executable, KernelReport, KernelSource, Statistic};
    use crate::{Error, Result};

    const EXTENSION: &CStr = ash::khr::pipeline_executable_properties::NAME;

    fn c_text(chars: &[c_char]) -> String {
        let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8_lossy(&bytes).trim().to_string()
    }

    /// Open a device on `adapter` as `desc` asks, with `VK_KHR_pipeline_executable_properties`
    /// and its `pipelineExecutableInfo` feature enabled. Errors where the adapter is not a
    /// Vulkan one or its driver lacks the extension.
    pub(in crate::gpu) fn open_device(
        adapter: &wgpu::Adapter,
        desc: &wgpu::DeviceDescriptor<'_>,
    ) -> Result<(wgpu::Device, wgpu::Queue)> {
        let name = adapter.get_info().name;
        // SAFETY: the hal adapter is only used to open a device on it, below, while `adapter`
        // lives; nothing is destroyed through it.
        let hal = unsafe { adapter.as_hal::<Vulkan>() }
            .ok_or_else(|| Error::Unsupported(format!("pipeline statistics need a Vulkan adapter; {name} is not one")))?;
        let instance = hal.shared_instance().raw_instance();
        // SAFETY: a query on the adapter's own physical device.
        let extensions = unsafe { instance.enumerate_device_extension_properties(hal.raw_physical_device()) }
            .map_err(|e| Error::Gpu(format!("cannot list {name}'s device extensions: {e}")))?;
        if !extensions.iter().any(|e| e.extension_name_as_c_str() == Ok(EXTENSION)) {
            return Err(Error::Unsupported(format!(
                "{name}'s Vulkan driver does not offer {} (compiler statistics)",
                EXTENSION.to_string_lossy()
            )));
        }
        let mut feature = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default().pipeline_executable_info(true);
        let feature = &mut feature;
        let callback: Box<wgpu::hal::vulkan::CreateDeviceCallback<'_>> = Box::new(move |args| {
            args.extensions.push(EXTENSION);
            let info = std::mem::take(args.create_info);
            *args.create_info = info.push_next(feature);
        });
        // SAFETY: the features and limits are `desc`'s, which `device_descriptor` took from this
        // adapter; the callback only adds an extension the driver listed and its feature.
        let open = unsafe {
            hal.open_with_callback(desc.required_features, &desc.required_limits, &desc.memory_hints, Some(callback))
        }
        .map_err(|e| Error::NoAdapter(format!("{name} refused a device with compiler statistics: {e}")))?;
        drop(hal);
        // SAFETY: `open` was created from this adapter's hal adapter with `desc`'s features.
        unsafe { adapter.create_device_from_hal(open, desc) }
            .map_err(|e| Error::NoAdapter(format!("{name} refused a device: {e}")))
    }

    /// The SPIR-V wgpu-hal writes for `src` on a device of Vulkan `api_version`: naga's options as
    /// wgpu-hal builds them, with `Gpu::kernel_entry`'s runtime checks (`checks`). Capabilities
    /// are left open (wgpu lists what the device offers; a kernel that compiled there needs no
    /// more). Workgroup memory is zeroed natively (`native_zero`, where the device enables
    /// the feature, as wgpu-hal does) or by naga's polyfill.
    pub(in crate::gpu) fn spirv(src: &KernelSource, api_version: u32, checks: bool, native_zero: bool) -> Result<Vec<u32>> {
        use naga::back::spv;
        let bad = |what: &str, e: String| Error::Gpu(format!("kernel {} ({}): {what}: {e}", src.name, src.entry));
        let module = naga::front::wgsl::parse_str(&src.source).map_err(|e| bad("WGSL", e.emit_to_string(&src.source)))?;
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .map_err(|e| bad("validation", e.emit_to_string(&src.source)))?;
        let mut options = spv::Options {
            lang_version: if api_version >= vk::API_VERSION_1_3 {
                (1, 6)
            } else if api_version >= vk::API_VERSION_1_2 {
                (1, 5)
            } else {
                (1, 3)
            },
            capabilities: None,
            zero_initialize_workgroup_memory: if native_zero {
                spv::ZeroInitializeWorkgroupMemoryMode::Native
            } else {
                spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
            },
            force_loop_bounding: checks,
            // wgpu's unchecked modules divide without the zero-divisor wrappers.
            emit_int_div_checks: checks,
            ..Default::default()
        };
        let unchecked = naga::proc::BoundsCheckPolicy::Unchecked;
        options.bounds_check_policies = naga::proc::BoundsCheckPolicies {
            index: if checks { naga::proc::BoundsCheckPolicy::Restrict } else { unchecked },
            buffer: unchecked,
            image_load: unchecked,
            binding_array: unchecked,
        };
        let stage = spv::PipelineOptions { entry_point: src.entry.clone(), shader_stage: naga::ShaderStage::Compute };
        spv::write_vec(&module, &info, &options, Some(&stage)).map_err(|e| bad("SPIR-V", e.to_string()))
    }

    /// A kernel's set layout as `Gpu::kernel_entry_with` builds it: the parameter block at
    /// binding 0, `storage` storage buffers at 1...
    pub(in crate::gpu) fn layout_bindings(storage: usize) -> Vec<vk::DescriptorSetLayoutBinding<'static>> {
        let binding = |i: usize, ty| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(i as u32)
                .descriptor_type(ty)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        };
        std::iter::once(binding(0, vk::DescriptorType::UNIFORM_BUFFER))
            .chain((1..=storage).map(|i| binding(i, vk::DescriptorType::STORAGE_BUFFER)))
            .collect()
    }

    /// Compile `src` again into a raw pipeline with the capture flags and read what the driver
    /// reports of it. `device` must come from [`open_device`].
    pub(in crate::gpu) fn report(device: &wgpu::Device, src: &KernelSource, checks: bool) -> Result<KernelReport> {
        // SAFETY: the raw device is used to create, query and destroy objects of our own, all
        // destroyed before returning; wgpu's objects are not touched.
        let hal = unsafe { device.as_hal::<Vulkan>() }
            .ok_or_else(|| Error::Unsupported("pipeline statistics need a Vulkan device".into()))?;
        let raw = hal.raw_device();
        let instance = hal.shared_instance().raw_instance();
        // SAFETY: as above; the physical device is the device's own.
        let api_version = unsafe { instance.get_physical_device_properties(hal.raw_physical_device()) }.api_version;
        let words = spirv(src, api_version, checks, true)?;
        let ext = ash::khr::pipeline_executable_properties::Device::new(instance, raw);
        let vk_err = |what: &str, e: vk::Result| Error::Gpu(format!("kernel {} ({}): {what}: {e}", src.name, src.entry));

        let bindings = layout_bindings(src.bindings.len());
        // Everything created below is destroyed at the end, whatever happened in between.
        struct Objects<'a> {
            raw: &'a ash::Device,
            module: vk::ShaderModule,
            set_layout: vk::DescriptorSetLayout,
            layout: vk::PipelineLayout,
            pipeline: vk::Pipeline,
        }
        impl Drop for Objects<'_> {
            fn drop(&mut self) {
                // SAFETY: null handles are ignored by vkDestroy*; the others are ours and unused.
                unsafe {
                    self.raw.destroy_pipeline(self.pipeline, None);
                    self.raw.destroy_pipeline_layout(self.layout, None);
                    self.raw.destroy_descriptor_set_layout(self.set_layout, None);
                    self.raw.destroy_shader_module(self.module, None);
                }
            }
        }
        let mut o = Objects {
            raw,
            module: vk::ShaderModule::null(),
            set_layout: vk::DescriptorSetLayout::null(),
            layout: vk::PipelineLayout::null(),
            pipeline: vk::Pipeline::null(),
        };
        // SAFETY (this block): valid create infos built above; the handles go into `o`.
        unsafe {
            o.module = raw
                .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None)
                .map_err(|e| vk_err("shader module", e))?;
            o.set_layout = raw
                .create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings), None)
                .map_err(|e| vk_err("descriptor set layout", e))?;
            let ranges = [vk::PushConstantRange::default()
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
                .size(src.immediate_size.max(4))];
            let set_layouts = [o.set_layout];
            let mut layout_info = vk::PipelineLayoutCreateInfo::default().set_layouts(&set_layouts);
            if src.immediate_size > 0 {
                layout_info = layout_info.push_constant_ranges(&ranges);
            }
            o.layout = raw.create_pipeline_layout(&layout_info, None).map_err(|e| vk_err("pipeline layout", e))?;
            let entry = std::ffi::CString::new(src.entry.as_str()).map_err(|e| Error::Invalid(e.to_string()))?;
            // wgpu lets the driver pick the subgroup size where the device has subgroups.
            let stage_flags = if device.features().contains(wgpu::Features::SUBGROUP) {
                vk::PipelineShaderStageCreateFlags::ALLOW_VARYING_SUBGROUP_SIZE
            } else {
                vk::PipelineShaderStageCreateFlags::empty()
            };
            let stage = vk::PipelineShaderStageCreateInfo::default()
                .flags(stage_flags)
                .stage(vk::ShaderStageFlags::COMPUTE)
                .module(o.module)
                .name(&entry);
            let info = vk::ComputePipelineCreateInfo::default()
                .flags(
                    vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
                        | vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR,
                )
                .stage(stage)
                .layout(o.layout);
            o.pipeline = raw
                .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
                .map_err(|(_, e)| vk_err("compute pipeline", e))?[0];

            let pipeline_info = vk::PipelineInfoKHR::default().pipeline(o.pipeline);
            let props = ext
                .get_pipeline_executable_properties(&pipeline_info)
                .map_err(|e| vk_err("executable properties", e))?;
            let mut executables = Vec::new();
            for (i, p) in props.iter().enumerate() {
                let exe = vk::PipelineExecutableInfoKHR::default().pipeline(o.pipeline).executable_index(i as u32);
                let stats = ext.get_pipeline_executable_statistics(&exe).map_err(|e| vk_err("statistics", e))?;
                let statistics = stats
                    .iter()
                    .map(|s| Statistic {
                        name: c_text(&s.name),
                        description: c_text(&s.description),
                        value: match s.format {
                            vk::PipelineExecutableStatisticFormatKHR::BOOL32 => (s.value.b32 != 0).to_string(),
                            vk::PipelineExecutableStatisticFormatKHR::INT64 => wide(s.value.i64 as u64),
                            vk::PipelineExecutableStatisticFormatKHR::UINT64 => wide(s.value.u64),
                            vk::PipelineExecutableStatisticFormatKHR::FLOAT64 => format!("{:.3}", s.value.f64),
                            _ => "?".into(),
                        },
                    })
                    .collect();
                executables.push(Executable {
                    name: c_text(&p.name),
                    subgroup_size: p.subgroup_size,
                    statistics,
                    representations: representations(&ext, &exe).unwrap_or_default(),
                });
            }
            Ok(KernelReport { kernel: src.name, entry: src.entry.clone(), executables })
        }
    }

    /// A 64-bit statistic. NVIDIA's driver (580) reports "Local Memory Size" with 2^36 in the
    /// high half (68719476736 for none, 68719476800 for 64 bytes): where the high half is set,
    /// the low half is shown with the raw value beside it.
    fn wide(v: u64) -> String {
        match v >> 32 {
            0 => v.to_string(),
            _ => format!("{} (raw {v:#x})", v & 0xffff_ffff),
        }
    }

    /// The driver's text representations of an executable (two calls: sizes, then the text).
    ///
    /// SAFETY: `exe` names a pipeline created with the capture flags on `ext`'s device.
    unsafe fn representations(
        ext: &ash::khr::pipeline_executable_properties::Device,
        exe: &vk::PipelineExecutableInfoKHR<'_>,
    ) -> Result<Vec<(String, String)>> {
        let fp = ext.fp().get_pipeline_executable_internal_representations_khr;
        let mut count = 0u32;
        // SAFETY: the count query, then arrays of that many entries.
        unsafe {
            let r = fp(ext.device(), exe, &mut count, std::ptr::null_mut());
            if r != vk::Result::SUCCESS || count == 0 {
                return Ok(Vec::new());
            }
            let mut reps = vec![vk::PipelineExecutableInternalRepresentationKHR::default(); count as usize];
            let r = fp(ext.device(), exe, &mut count, reps.as_mut_ptr());
            if r != vk::Result::SUCCESS && r != vk::Result::INCOMPLETE {
                return Ok(Vec::new());
            }
            let mut data: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
            for (r, d) in reps.iter_mut().zip(data.iter_mut()) {
                r.p_data = d.as_mut_ptr().cast();
            }
            let r = fp(ext.device(), exe, &mut count, reps.as_mut_ptr());
            if r != vk::Result::SUCCESS && r != vk::Result::INCOMPLETE {
                return Ok(Vec::new());
            }
            Ok(reps
                .iter()
                .zip(data)
                .filter(|(r, _)| r.is_text != 0)
                .map(|(r, d)| {
                    let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
                    (c_text(&r.name), String::from_utf8_lossy(&d[..end]).into_owned())
                })
                .collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::gpu::{Access, Gpu, GpuOptions};
    use crate::Error;

    /// A device opened for compiler statistics reports them for each kernel compiled (the
    /// H200's driver), or the opening fails with a clear refusal where the driver lacks the
    /// extension (lavapipe of Mesa 22.3); a device opened without them refuses the query.
    #[test]
    fn statistics_or_a_clear_refusal() {
        const PROBE: &str = "@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) i: vec3<u32>) { o[i.x] = p.x + i.x; }
";
        match Gpu::new(&GpuOptions { pipeline_stats: true, ..Default::default() }) {
            Ok(gpu) => {
                gpu.kernel("statistics probe", PROBE, &[Access::ReadWrite]).unwrap();
                let reports = gpu.pipeline_stats().unwrap();
                assert_eq!(reports.len(), 1);
                assert_eq!((reports[0].kernel, reports[0].entry.as_str()), ("statistics probe", "main"));
                assert!(!reports[0].executables.is_empty(), "no executables");
                for e in &reports[0].executables {
                    assert!(!e.statistics.is_empty(), "executable {} without statistics", e.name);
                }
            }
            Err(Error::Unsupported(m)) => {
                assert!(m.contains("VK_KHR_pipeline_executable_properties") || m.contains("Vulkan"), "unclear refusal: {m}")
            }
            Err(e) => panic!("opening a device for compiler statistics: {e}"),
        }
        let plain = crate::testgpu::gpu();
        assert!(matches!(plain.pipeline_stats(), Err(Error::Unsupported(_))), "a plain device answered the query");
    }
}
