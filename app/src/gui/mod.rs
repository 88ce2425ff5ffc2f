//! The window: eframe/egui drawn with wgpu, and the engine running on that same wgpu device
//! (borrowed from eframe's render state), on a worker thread so the UI never waits.
//!
//! - `app`: the window's state and layout (queue, transcript, timings, live, settings);
//! - `worker`: the GPU thread that owns the model;
//! - `live`: the live-microphone panel and the session it runs on the worker;
//! - `timings`: the stage bar and the per-kernel table;
//! - `settings`: what is remembered between runs.

mod app;
pub mod live;
mod settings;
mod timings;
mod worker;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

pub use app::{Automation, Startup, VerbatimApp};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct Args {
    /// Audio files to queue for transcription.
    pub files: Vec<PathBuf>,
    /// Model directory for this run (otherwise the one in the settings, or the default).
    #[arg(long, value_name = "DIR")]
    pub model: Option<PathBuf>,
    /// When every queued file is done, save a PNG of the window here (for tests and bug
    /// reports).
    #[arg(long, value_name = "PNG")]
    pub screenshot: Option<PathBuf>,
    /// Close the window once the queue is done (and the screenshot saved).
    #[arg(long)]
    pub quit_when_done: bool,
}

/// The wgpu setup eframe creates its device with: the adapter the settings name (else the
/// best), and the engine's device descriptor (its features and the adapter's limits), so
/// the device that draws can also run the model.
pub fn wgpu_setup(adapter: Option<String>) -> eframe::egui_wgpu::WgpuSetup {
    let mut setup = eframe::egui_wgpu::WgpuSetupCreateNew::without_display_handle();
    setup.instance_descriptor.backends =
        eframe::wgpu::Backends::VULKAN | eframe::wgpu::Backends::METAL | eframe::wgpu::Backends::DX12;
    setup.instance_descriptor.flags = engine::gpu::instance_flags(setup.instance_descriptor.flags);
    setup.native_adapter_selector = Some(Arc::new(move |adapters, _surface| {
        engine::gpu::choose_adapter(adapters.to_vec(), adapter.as_deref()).map_err(|e| e.to_string())
    }));
    setup.device_descriptor = Arc::new(|adapter| {
        let mut d = engine::gpu::device_descriptor(adapter);
        // egui wants textures as large as the screen (4k+) and its own default of 8192.
        d.required_limits.max_texture_dimension_2d = d.required_limits.max_texture_dimension_2d.max(8192).min(adapter.limits().max_texture_dimension_2d);
        d
    });
    eframe::egui_wgpu::WgpuSetup::CreateNew(setup)
}

pub fn run(args: Args) -> ExitCode {
    let settings_path = settings::default_path();
    let (settings, settings_note) = match &settings_path {
        Some(p) => settings::load(p),
        None => (settings::Settings::default(), Some("neither XDG_CONFIG_HOME nor HOME is set: settings will not be remembered".into())),
    };
    let mut options = eframe::NativeOptions {
        viewport: eframe::egui::ViewportBuilder::default()
            .with_title("Verbatim")
            .with_app_id("verbatim")
            .with_inner_size([1180.0, 780.0])
            .with_min_inner_size([640.0, 420.0])
            .with_drag_and_drop(true),
        renderer: eframe::Renderer::Wgpu,
        ..Default::default()
    };
    options.wgpu_options.wgpu_setup = wgpu_setup(settings.adapter.clone());
    let startup = Startup {
        files: args.files,
        model_override: args.model,
        settings,
        settings_path,
        notes: settings_note.into_iter().collect(),
        automation: Automation { screenshot: args.screenshot, quit_when_done: args.quit_when_done },
    };
    let result = eframe::run_native("Verbatim", options, Box::new(move |cc| Ok(Box::new(VerbatimApp::new(cc, startup)))));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "verbatim: cannot open the window: {e}. (On a machine without a display, use \
                 `verbatim transcribe FILE`.)"
            );
            ExitCode::FAILURE
        }
    }
}
