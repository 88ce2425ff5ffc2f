//! The window's state and layout: a queue of files on the left (progress, ETA, cancel,
//! errors), the selected transcript in the middle (selectable, copy, export), the stage bar
//! and the per-kernel table below it, the live microphone panel, and the settings.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use eframe::egui::{self, Color32, RichText, Ui};
use engine::decode::CancelFlag;

use super::live::LivePanel;
use super::settings::{self, Settings};
use super::timings::{self, Sort};
use super::worker::{Event, FileResult, Job, ModelState, Worker};
use crate::export::{self, Cue};

/// What the window starts with.
pub struct Startup {
    pub files: Vec<PathBuf>,
    /// `--model DIR` for this run only (not saved).
    pub model_override: Option<PathBuf>,
    pub settings: Settings,
    /// Where settings are saved; None: not remembered.
    pub settings_path: Option<PathBuf>,
    /// Messages to show from the start (e.g. a corrupt settings file).
    pub notes: Vec<String>,
    pub automation: Automation,
}

/// Unattended use (tests, bug reports): screenshot and quit once the queue is done.
#[derive(Clone, Debug, Default)]
pub struct Automation {
    pub screenshot: Option<PathBuf>,
    pub quit_when_done: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    Txt,
    Srt,
    Vtt,
    Json,
}

impl ExportFormat {
    pub const ALL: [ExportFormat; 4] = [ExportFormat::Txt, ExportFormat::Srt, ExportFormat::Vtt, ExportFormat::Json];
    pub fn extension(self) -> &'static str {
        match self {
            ExportFormat::Txt => "txt",
            ExportFormat::Srt => "srt",
            ExportFormat::Vtt => "vtt",
            ExportFormat::Json => "json",
        }
    }
}

#[derive(Debug)]
pub enum EntryState {
    Queued,
    Running,
    Done(Box<FileResult>),
    Failed(String),
    Cancelled,
}

pub struct Entry {
    pub id: u64,
    pub path: PathBuf,
    pub state: EntryState,
    /// Fraction of the audio done.
    pub fraction: f32,
    started: Option<Instant>,
    cancel: CancelFlag,
}

impl Entry {
    fn name(&self) -> String {
        self.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| self.path.display().to_string())
    }
    fn finished(&self) -> bool {
        !matches!(self.state, EntryState::Queued | EntryState::Running)
    }
}

/// What a file dialog (run on its own thread, so the UI never blocks on it) sends back.
enum DialogResult {
    Open(Vec<PathBuf>),
    Export { id: u64, format: ExportFormat, path: PathBuf },
    ModelDir(PathBuf),
    LiveFile(PathBuf),
    Failed(String),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tab {
    Files,
    Live,
}

pub struct VerbatimApp {
    worker: Worker,
    adapter: String,
    adapters: Vec<String>,
    model: ModelState,
    model_override: Option<PathBuf>,
    pub entries: Vec<Entry>,
    next_id: u64,
    selected: Option<u64>,
    settings: Settings,
    settings_path: Option<PathBuf>,
    /// Messages at the top of the window (dismissable): errors that are not a file's.
    pub notes: Vec<String>,
    sort: Sort,
    tab: Tab,
    show_settings: bool,
    live: LivePanel,
    dialog_tx: Sender<DialogResult>,
    dialog_rx: Receiver<DialogResult>,
    automation: Automation,
    /// Frames drawn since the queue finished (the screenshot waits for a settled frame).
    done_frames: u32,
    screenshot: Arc<Mutex<ScreenshotState>>,
    quitting: bool,
}

#[derive(Default, PartialEq, Eq, Debug)]
enum ScreenshotState {
    #[default]
    None,
    Requested,
    Saved,
}

impl VerbatimApp {
    pub fn new(cc: &eframe::CreationContext<'_>, startup: Startup) -> Self {
        let ctx = cc.egui_ctx.clone();
        let (gpu, adapter, adapters) = match &cc.wgpu_render_state {
            Some(rs) => {
                let info = rs.adapter.get_info();
                let gpu = engine::gpu::Gpu::borrow(rs.device.clone(), rs.queue.clone(), &rs.adapter, true);
                let names = rs.available_adapters.iter().map(|a| a.get_info().name).collect();
                let cores = if gpu.info.coop_matrix { ", tensor cores" } else { "" };
                (Ok(Arc::new(gpu)), format!("{} ({:?}{cores})", info.name, info.backend), names)
            }
            None => (Err("the window has no wgpu device (the engine needs the wgpu renderer)".to_string()), "no GPU".into(), vec![]),
        };
        let worker = Worker::spawn(gpu, move || ctx.request_repaint());
        let (dialog_tx, dialog_rx) = channel();
        let mut app = VerbatimApp {
            worker,
            adapter,
            adapters,
            model: ModelState::Loading("starting".into()),
            model_override: startup.model_override,
            entries: Vec::new(),
            next_id: 1,
            selected: None,
            live: LivePanel::new(startup.settings.microphone.clone()),
            settings: startup.settings,
            settings_path: startup.settings_path,
            notes: startup.notes,
            sort: Sort::default(),
            tab: Tab::Files,
            show_settings: false,
            dialog_tx,
            dialog_rx,
            automation: startup.automation,
            done_frames: 0,
            screenshot: Arc::default(),
            quitting: false,
        };
        app.load_model();
        app.queue_files(startup.files);
        app
    }

    fn model_dir(&self) -> Option<PathBuf> {
        self.model_override.clone().or_else(|| self.settings.model_dir.clone())
    }

    fn load_model(&mut self) {
        self.model = ModelState::Loading("queued".into());
        self.worker.send(Job::LoadModel(self.model_dir()));
    }

    /// Queue files for transcription (drop, Open dialog, command line).
    pub fn queue_files(&mut self, paths: Vec<PathBuf>) {
        for path in paths {
            let id = self.next_id;
            self.next_id += 1;
            let cancel = CancelFlag::new();
            // An unknown name in a hand-edited settings file decodes plainly.
            let speculative = self.settings.speculative.parse().unwrap_or_default();
            self.worker.send(Job::File { id, path: path.clone(), timestamps: self.settings.timestamps, speculative, cancel: cancel.clone() });
            self.entries.push(Entry { id, path, state: EntryState::Queued, fraction: 0.0, started: None, cancel });
            self.tab = Tab::Files;
        }
    }

    /// True when something was queued and nothing is waiting or running.
    pub fn queue_done(&self) -> bool {
        !self.entries.is_empty() && self.entries.iter().all(Entry::finished)
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn model_state(&self) -> &ModelState {
        &self.model
    }

    /// Start a live session from a WAV file at real-time pace (the live panel's file input).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn start_live_file(&mut self, path: PathBuf) {
        self.tab = Tab::Live;
        self.live.set_input_file(path);
        self.live.start(&self.worker);
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn live(&self) -> &LivePanel {
        &self.live
    }

    /// Stop a queued or running file (the Cancel button).
    pub fn cancel(&self, id: u64) {
        if let Some(e) = self.entry(id) {
            e.cancel.set();
        }
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn select(&mut self, id: u64) {
        self.selected = Some(id);
    }

    fn entry(&self, id: u64) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == id)
    }

    fn entry_mut(&mut self, id: u64) -> Option<&mut Entry> {
        self.entries.iter_mut().find(|e| e.id == id)
    }

    fn save_settings(&mut self) {
        if let Some(path) = &self.settings_path {
            if let Err(e) = settings::save(path, &self.settings) {
                self.notes.push(e);
            }
        }
    }

    /// Drain the worker's and the dialogs' messages.
    pub fn poll(&mut self) {
        while let Ok(ev) = self.worker.events.try_recv() {
            match ev {
                Event::Model(state) => {
                    if let ModelState::Failed(msg) = &state {
                        self.notes.push(format!("The model could not be loaded: {msg}"));
                    }
                    self.model = state;
                }
                Event::Started { id } => {
                    if let Some(e) = self.entry_mut(id) {
                        e.state = EntryState::Running;
                        e.started = Some(Instant::now());
                    }
                }
                Event::Progress { id, fraction } => {
                    if let Some(e) = self.entry_mut(id) {
                        e.fraction = fraction;
                    }
                }
                Event::Finished { id, outcome } => {
                    if let Some(e) = self.entry_mut(id) {
                        e.fraction = 1.0;
                        e.state = match outcome {
                            Ok(r) => EntryState::Done(r),
                            Err(msg) => EntryState::Failed(msg),
                        };
                    }
                    // Show the newest finished file unless the user picked another done one.
                    let keep = self.selected.and_then(|s| self.entry(s)).is_some_and(|e| matches!(e.state, EntryState::Done(_)));
                    if !keep {
                        self.selected = Some(id);
                    }
                }
                Event::Cancelled { id } => {
                    if let Some(e) = self.entry_mut(id) {
                        e.state = EntryState::Cancelled;
                    }
                }
                Event::Live(ev) => self.live.on_event(ev),
            }
        }
        while let Ok(d) = self.dialog_rx.try_recv() {
            match d {
                DialogResult::Open(paths) => self.queue_files(paths),
                DialogResult::Export { id, format, path } => match self.export_to(id, format, &path) {
                    Ok(()) => self.notes.push(format!("Saved {}", path.display())),
                    Err(e) => self.notes.push(e),
                },
                DialogResult::ModelDir(dir) => {
                    self.settings.model_dir = Some(dir);
                    self.model_override = None;
                    self.save_settings();
                    self.load_model();
                }
                DialogResult::LiveFile(path) => self.live.set_input_file(path),
                DialogResult::Failed(msg) => self.notes.push(msg),
            }
        }
    }

    /// The document of one finished file in `format`.
    pub fn export_document(&self, id: u64, format: ExportFormat) -> Result<String, String> {
        let Some(EntryState::Done(r)) = self.entry(id).map(|e| &e.state) else {
            return Err("this file has no transcript to export".into());
        };
        let t = &r.transcript;
        let cues: Vec<Cue> = t.segments.iter().map(|s| Cue { start: s.start, end: s.end, text: &s.text }).collect();
        Ok(match format {
            ExportFormat::Txt => format!("{}\n", export::one_line(&t.text)),
            ExportFormat::Srt => export::srt(&cues),
            ExportFormat::Vtt => export::vtt(&cues),
            ExportFormat::Json => crate::transcribe::json_document(&r.model_dir, r.load_seconds, t),
        })
    }

    /// Write one finished file's transcript (through a temporary name and a rename).
    pub fn export_to(&self, id: u64, format: ExportFormat, path: &Path) -> Result<(), String> {
        let doc = self.export_document(id, format)?;
        let tmp = path.with_extension(format!("{}.partial", format.extension()));
        std::fs::write(&tmp, doc)
            .and_then(|()| std::fs::rename(&tmp, path))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    fn open_dialog(&self) {
        let tx = self.dialog_tx.clone();
        spawn_dialog(tx, move || {
            rfd::FileDialog::new()
                .set_title("Open audio files")
                .add_filter("WAV audio", &["wav", "wave", "WAV"])
                .add_filter("All files", &["*"])
                .pick_files()
                .map(DialogResult::Open)
        });
    }

    fn export_dialog(&self, id: u64, format: ExportFormat) {
        let Some(e) = self.entry(id) else { return };
        let stem = e.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "transcript".into());
        let dir = e.path.parent().map(Path::to_path_buf);
        let tx = self.dialog_tx.clone();
        spawn_dialog(tx, move || {
            let mut d = rfd::FileDialog::new()
                .set_title("Export transcript")
                .set_file_name(format!("{stem}.{}", format.extension()))
                .add_filter(format.extension().to_uppercase(), &[format.extension()]);
            if let Some(dir) = dir {
                d = d.set_directory(dir);
            }
            d.save_file().map(|path| DialogResult::Export { id, format, path })
        });
    }

    fn model_dir_dialog(&self) {
        spawn_dialog(self.dialog_tx.clone(), || {
            rfd::FileDialog::new().set_title("Choose a Whisper model directory").pick_folder().map(DialogResult::ModelDir)
        });
    }

    fn handle_drops(&mut self, ctx: &egui::Context) {
        let dropped: Vec<PathBuf> = ctx.input(|i| i.raw.dropped_files.iter().map(|f| f.path().to_path_buf()).collect());
        if !dropped.is_empty() {
            self.queue_files(dropped);
        }
    }

    fn automation(&mut self, ctx: &egui::Context) {
        let Some(path) = self.automation.screenshot.clone().or_else(|| self.automation.quit_when_done.then(PathBuf::new)) else {
            return;
        };
        let model_failed = matches!(self.model, ModelState::Failed(_));
        if !(self.queue_done() || (self.entries.is_empty() && model_failed)) {
            self.done_frames = 0;
            ctx.request_repaint_after(Duration::from_millis(100));
            return;
        }
        self.done_frames += 1;
        let state = std::mem::take(&mut *self.screenshot.lock().unwrap_or_else(|p| p.into_inner()));
        match state {
            // A few frames so the last result is laid out and drawn.
            ScreenshotState::None if self.done_frames >= 4 => {
                if self.automation.screenshot.is_some() {
                    let slot = self.screenshot.clone();
                    let ctx2 = ctx.clone();
                    *slot.lock().unwrap_or_else(|p| p.into_inner()) = ScreenshotState::Requested;
                    ctx.send_viewport_cmd(egui::ViewportCommand::Screenshot(egui::ScreenshotCallback::new(move |img| {
                        if let Err(e) = save_png(&path, &img) {
                            eprintln!("verbatim: {e}");
                        }
                        *slot.lock().unwrap_or_else(|p| p.into_inner()) = ScreenshotState::Saved;
                        ctx2.request_repaint();
                    })));
                } else {
                    *self.screenshot.lock().unwrap_or_else(|p| p.into_inner()) = ScreenshotState::Saved;
                }
                ctx.request_repaint();
            }
            ScreenshotState::Saved => {
                *self.screenshot.lock().unwrap_or_else(|p| p.into_inner()) = ScreenshotState::Saved;
                if self.automation.quit_when_done && !self.quitting {
                    self.quitting = true;
                    self.print_summary();
                    ctx.send_viewport_cmd(egui::ViewportCommand::Close);
                }
            }
            other => {
                *self.screenshot.lock().unwrap_or_else(|p| p.into_inner()) = other;
                ctx.request_repaint_after(Duration::from_millis(50));
            }
        }
    }

    /// On an unattended run's exit: each file's outcome on stdout, one line each, and the
    /// kernels' total GPU time, so a script can check what the window showed.
    fn print_summary(&self) {
        for e in &self.entries {
            match &e.state {
                EntryState::Done(r) => {
                    println!("{}: {}", e.name(), export::one_line(&r.transcript.text));
                    let gpu_ns: f64 = r.kernels.iter().map(|k| k.gpu_ns).sum();
                    println!("{}: kernel GPU time ms: {:.3}", e.name(), gpu_ns / 1e6);
                    for k in &r.kernels {
                        println!("  {} {} {} {:.3}", k.kernel, k.stage, k.dispatches, k.gpu_ns / 1e6);
                    }
                }
                EntryState::Failed(msg) => println!("{}: error: {msg}", e.name()),
                EntryState::Cancelled => println!("{}: cancelled", e.name()),
                EntryState::Queued | EntryState::Running => {}
            }
        }
        for n in &self.notes {
            println!("note: {n}");
        }
    }

    // ---- layout ----

    fn top_bar(&mut self, ui: &mut Ui) {
        ui.horizontal(|ui| {
            ui.heading("Verbatim");
            ui.separator();
            if ui.button("Open…").on_hover_text("Queue WAV files (or drop them on the window)").clicked() {
                self.open_dialog();
            }
            ui.selectable_value(&mut self.tab, Tab::Files, "Files");
            ui.selectable_value(&mut self.tab, Tab::Live, "Live microphone");
            if ui.button("Settings").clicked() {
                self.show_settings = !self.show_settings;
            }
            ui.separator();
            match &self.model {
                ModelState::Loading(what) => {
                    ui.spinner();
                    ui.label(format!("model: {what}"));
                }
                ModelState::Ready { dir, seconds } => {
                    let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    ui.label(format!("model {name} (loaded in {:.0} ms)", seconds * 1e3)).on_hover_text(dir.display().to_string());
                }
                ModelState::Failed(_) => {
                    ui.label(RichText::new("no model").color(ui.visuals().error_fg_color));
                }
            }
            ui.separator();
            ui.label(format!("GPU: {}", self.adapter));
        });
    }

    fn notes(&mut self, ui: &mut Ui) {
        let mut dismiss = None;
        for (i, note) in self.notes.iter().enumerate() {
            ui.horizontal(|ui| {
                if ui.small_button("Dismiss").clicked() {
                    dismiss = Some(i);
                }
                ui.label(RichText::new(note).color(ui.visuals().warn_fg_color));
            });
        }
        if let Some(i) = dismiss {
            self.notes.remove(i);
        }
    }

    fn queue_panel(&mut self, ui: &mut Ui) {
        ui.heading("Queue");
        if self.entries.is_empty() {
            ui.label("Drop WAV files here, or use Open…");
        }
        let mut select = None;
        let mut cancel = None;
        egui::ScrollArea::vertical().id_salt("queue").show(ui, |ui| {
            for e in &self.entries {
                let selected = self.selected == Some(e.id);
                ui.group(|ui| {
                    ui.set_width(ui.available_width());
                    if ui.selectable_label(selected, RichText::new(e.name()).strong()).on_hover_text(e.path.display().to_string()).clicked() {
                        select = Some(e.id);
                    }
                    match &e.state {
                        EntryState::Queued => {
                            ui.horizontal(|ui| {
                                ui.label("waiting");
                                if ui.small_button("Cancel").clicked() {
                                    cancel = Some(e.id);
                                }
                            });
                        }
                        EntryState::Running => {
                            let elapsed = e.started.map(|s| s.elapsed().as_secs_f64()).unwrap_or(0.0);
                            let eta = if e.fraction > 0.01 {
                                format!("ETA {:.0} s", elapsed * f64::from(1.0 - e.fraction) / f64::from(e.fraction))
                            } else {
                                format!("{elapsed:.0} s")
                            };
                            ui.add(egui::ProgressBar::new(e.fraction).text(format!("{:.0}% · {eta}", e.fraction * 100.0)).animate(true));
                            if ui.small_button("Cancel").clicked() {
                                cancel = Some(e.id);
                            }
                        }
                        EntryState::Done(r) => {
                            ui.label(format!(
                                "{:.1} s of audio in {:.2} s (RTF {:.3})",
                                r.transcript.audio_seconds,
                                r.transcript.total_seconds(),
                                r.transcript.real_time_factor()
                            ));
                        }
                        EntryState::Failed(msg) => {
                            ui.label(RichText::new(msg).color(ui.visuals().error_fg_color));
                        }
                        EntryState::Cancelled => {
                            ui.label("cancelled");
                        }
                    }
                });
            }
        });
        if let Some(id) = select {
            self.selected = Some(id);
        }
        if let Some(id) = cancel {
            self.cancel(id);
        }
    }

    fn transcript_view(&mut self, ui: &mut Ui) {
        let Some(id) = self.selected else {
            ui.label("The transcript of the selected file appears here.");
            return;
        };
        let Some(e) = self.entry(id) else { return };
        let r = match &e.state {
            EntryState::Done(r) => r,
            EntryState::Failed(msg) => {
                ui.label(RichText::new(format!("{}: {msg}", e.name())).color(ui.visuals().error_fg_color));
                return;
            }
            _ => {
                ui.label(format!("{}: not transcribed yet", e.name()));
                return;
            }
        };
        let mut export = None;
        ui.horizontal(|ui| {
            ui.strong(e.name());
            if ui.button("Copy text").clicked() {
                ui.ctx().copy_text(r.transcript.text.clone());
            }
            ui.label("Export:");
            for f in ExportFormat::ALL {
                if ui.button(f.extension().to_uppercase()).clicked() {
                    export = Some(f);
                }
            }
        });
        ui.separator();
        egui::ScrollArea::vertical().id_salt("transcript").auto_shrink([false, false]).show(ui, |ui| {
            for s in &r.transcript.segments {
                ui.horizontal_wrapped(|ui| {
                    ui.label(RichText::new(format!("{} → {}", clock(s.start), clock(s.end))).monospace().color(Color32::GRAY));
                    ui.add(egui::Label::new(s.text.trim()).selectable(true).wrap());
                });
            }
            if r.transcript.segments.is_empty() {
                ui.label("(no speech)");
            }
        });
        if let Some(f) = export {
            self.export_dialog(id, f);
        }
    }

    fn timings_panel(&mut self, ui: &mut Ui) {
        let Some(r) = self.selected.and_then(|id| self.entry(id)).and_then(|e| match &e.state {
            EntryState::Done(r) => Some(r.clone()),
            _ => None,
        }) else {
            ui.label("Stage times and the per-kernel GPU table of the selected file appear here.");
            return;
        };
        ui.strong("Stages");
        timings::stage_bar(ui, &r);
        ui.separator();
        ui.strong("GPU kernels");
        timings::kernel_table(ui, &r, &self.adapter, &mut self.sort);
    }

    fn settings_window(&mut self, ctx: &egui::Context) {
        let mut open = self.show_settings;
        let mut changed = false;
        let mut reload = false;
        let mut browse = false;
        egui::Window::new("Settings").open(&mut open).resizable(false).show(ctx, |ui| {
            ui.strong("Model");
            let current = self.model_dir().map(|d| d.display().to_string()).unwrap_or_else(|| "default (tiny.en, fetched when missing)".into());
            ui.label(current);
            ui.horizontal(|ui| {
                if ui.button("Choose directory…").clicked() {
                    browse = true;
                }
                if ui.button("Use the default").clicked() {
                    self.settings.model_dir = None;
                    self.model_override = None;
                    changed = true;
                    reload = true;
                }
                if ui.button("Reload").clicked() {
                    reload = true;
                }
            });
            ui.separator();
            ui.strong("GPU adapter (applies at the next start)");
            let label = self.settings.adapter.clone().unwrap_or_else(|| "best available".into());
            egui::ComboBox::from_id_salt("adapter").selected_text(label).show_ui(ui, |ui| {
                if ui.selectable_label(self.settings.adapter.is_none(), "best available").clicked() {
                    self.settings.adapter = None;
                    changed = true;
                }
                for name in &self.adapters {
                    if ui.selectable_label(self.settings.adapter.as_deref() == Some(name), name).clicked() {
                        self.settings.adapter = Some(name.clone());
                        changed = true;
                    }
                }
            });
            ui.label(format!("in use: {}", self.adapter));
            ui.separator();
            if ui.checkbox(&mut self.settings.timestamps, "Timestamps (segments with times)").changed() {
                changed = true;
            }
            ui.horizontal(|ui| {
                ui.label("Speculative decoding of files:");
                for name in engine::decode::draft::Speculative::NAMES {
                    if ui.selectable_label(self.settings.speculative == name, name).clicked() {
                        self.settings.speculative = name.to_string();
                        changed = true;
                    }
                }
            })
            .response
            .on_hover_text("Drafts checked by batched verify passes: the same text, sooner when drafts hold. Live mode always drafts from its previous hypothesis.");
            if let Some(p) = &self.settings_path {
                ui.label(RichText::new(format!("saved in {}", p.display())).small());
            }
        });
        self.show_settings = open;
        if browse {
            self.model_dir_dialog();
        }
        if changed {
            self.save_settings();
        }
        if reload {
            self.load_model();
        }
    }
}

impl eframe::App for VerbatimApp {
    fn ui(&mut self, ui: &mut Ui, _frame: &mut eframe::Frame) {
        let ctx = ui.ctx().clone();
        self.poll();
        self.handle_drops(&ctx);

        egui::Panel::top("top").show(ui, |ui| {
            self.top_bar(ui);
            self.notes(ui);
        });
        match self.tab {
            Tab::Files => {
                egui::Panel::left("queue").resizable(true).default_size(280.0).show(ui, |ui| self.queue_panel(ui));
                let h = ctx.content_rect().height();
                egui::Panel::bottom("timings")
                    .resizable(true)
                    .default_size((h * 0.6).max(300.0))
                    // (egui 0.37 sizes a fresh panel to its minimum: half the window for the
                    // timings, so the kernel table shows more than two rows.)
                    .min_size((h * 0.5).max(220.0))
                    .show(ui, |ui| self.timings_panel(ui));
                egui::CentralPanel::default().show(ui, |ui| self.transcript_view(ui));
            }
            Tab::Live => {
                let mic = self.live.ui_panel(ui, &self.worker, &self.model);
                if std::mem::take(&mut self.live.wants_file) {
                    spawn_dialog(self.dialog_tx.clone(), || {
                        rfd::FileDialog::new()
                            .set_title("Play a WAV file into the live transcriber")
                            .add_filter("WAV audio", &["wav", "wave", "WAV"])
                            .pick_file()
                            .map(DialogResult::LiveFile)
                    });
                }
                if mic != self.settings.microphone {
                    self.settings.microphone = mic;
                    self.save_settings();
                }
            }
        }
        self.settings_window(&ctx);

        // Files hovering over the window: say what a drop will do.
        if ctx.input(|i| !i.raw.hovered_files.is_empty()) {
            let screen = ctx.content_rect();
            let painter = ctx.layer_painter(egui::LayerId::new(egui::Order::Foreground, egui::Id::unique("drop")));
            painter.rect_filled(screen, 0.0, Color32::from_black_alpha(160));
            painter.text(screen.center(), egui::Align2::CENTER_CENTER, "Drop audio files to transcribe", egui::FontId::proportional(28.0), Color32::WHITE);
        }

        // Keep the progress bars and ETAs moving while work runs (the worker also wakes
        // us on every event).
        // (4 Hz: on a software adapter every frame costs CPU the model could use.)
        if self.entries.iter().any(|e| matches!(e.state, EntryState::Running)) || self.live.running() {
            ctx.request_repaint_after(Duration::from_millis(250));
        }
        self.automation(&ctx);
    }

    fn on_exit(&mut self) {
        // Stop what runs so the worker thread ends promptly.
        for e in &self.entries {
            e.cancel.set();
        }
        self.live.stop();
    }
}

fn spawn_dialog(tx: Sender<DialogResult>, f: impl FnOnce() -> Option<DialogResult> + Send + 'static) {
    let on_fail = tx.clone();
    let spawned = std::thread::Builder::new().name("verbatim-dialog".into()).spawn(move || {
        // rfd reports "no portal" and similar by returning None after logging; a panic in it
        // must not take the window down.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(Some(r)) => {
                let _ = tx.send(r);
            }
            Ok(None) => {}
            Err(_) => {
                let _ = tx.send(DialogResult::Failed("the file dialog failed (is a desktop portal running?)".into()));
            }
        }
    });
    if let Err(e) = spawned {
        let _ = on_fail.send(DialogResult::Failed(format!("cannot open the file dialog: {e}")));
    }
}

/// `mm:ss.mmm` (with hours past the hour).
fn clock(seconds: f64) -> String {
    let ms = if seconds > 0.0 { (seconds * 1000.0).round() as u64 } else { 0 };
    let (h, m, s, f) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
    if h > 0 { format!("{h}:{m:02}:{s:02}.{f:03}") } else { format!("{m:02}:{s:02}.{f:03}") }
}

fn save_png(path: &Path, img: &egui::ColorImage) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), img.size[0] as u32, img.size[1] as u32);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    w.write_image_data(img.as_raw()).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
