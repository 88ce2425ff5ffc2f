//! The live panel: pick an input (a microphone, or a WAV file played at real-time pace
//! through the very same path), see the level meter, start/stop; committed text in full
//! colour, the tentative tail greyed, the latency from speech to committed text.
//!
//! The session runs on the GPU worker thread ([`engine::live::run_live`]); updates come
//! back as [`LiveEvent`]s. A source that fails mid-way (a microphone unplugged) ends the
//! session with a message, and everything transcribed until then stays on screen.

use std::path::PathBuf;
use std::sync::mpsc::Sender;

use eframe::egui::{self, Color32, RichText, Ui};
use engine::decode::CancelFlag;
use engine::live::{run_live, AudioSource, FileSource, LiveOptions, LiveUpdate};

use super::worker::{Event, Job, ModelState, Worker};

#[derive(Debug)]
pub enum LiveEvent {
    /// A progress update of the running session.
    Update(Box<LiveUpdate>),
    /// The session ended normally (stopped, or the file ended): its last update.
    Ended(Box<LiveUpdate>),
    /// The session ended in an error; `last` holds everything transcribed until then.
    Failed(String),
    FailedWith { error: String, last: Box<LiveUpdate> },
}

/// Where the live audio comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A microphone by name; None: the system default.
    Microphone(Option<String>),
    /// A WAV file delivered at real-time pace (a demo, and what the tests drive).
    File(PathBuf),
}

pub struct LivePanel {
    input: Input,
    devices: Option<Result<Vec<crate::mic::InputDevice>, String>>,
    stop: Option<CancelFlag>,
    last: Option<Box<LiveUpdate>>,
    /// Text of earlier sessions in this window (kept when a new one starts).
    history: Vec<String>,
    error: Option<String>,
    latencies: Vec<f64>,
    /// The microphone's own level, read on the UI thread (keeps the meter moving while a
    /// slow decode holds the session's updates back).
    mic_level: Option<crate::mic::LevelHandle>,
    /// The user asked for a file as input: the app opens the dialog (off the UI thread).
    pub wants_file: bool,
    /// Set if an update ever changed text that was already committed (it must not).
    pub rewrote_committed: bool,
}

impl LivePanel {
    pub fn new(microphone: Option<String>) -> Self {
        LivePanel {
            input: Input::Microphone(microphone),
            devices: None,
            stop: None,
            last: None,
            history: Vec::new(),
            error: None,
            latencies: Vec::new(),
            rewrote_committed: false,
            mic_level: None,
            wants_file: false,
        }
    }

    pub fn running(&self) -> bool {
        self.stop.is_some()
    }

    /// Ask the running session to stop (it flushes what it heard and ends).
    pub fn stop(&mut self) {
        if let Some(s) = &self.stop {
            s.set();
        }
    }

    /// The text committed so far in the current (or last) session.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn committed(&self) -> &str {
        self.last.as_ref().map(|u| u.committed.as_str()).unwrap_or("")
    }

    #[cfg_attr(not(test), allow(dead_code))]
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// Use a WAV file at real-time pace as the input (the menu's "WAV file..." entry).
    pub fn set_input_file(&mut self, path: PathBuf) {
        self.input = Input::File(path);
    }

    pub fn on_event(&mut self, ev: LiveEvent) {
        match ev {
            LiveEvent::Update(u) => self.take_update(u),
            LiveEvent::Ended(u) => {
                self.take_update(u);
                self.stop = None;
            }
            LiveEvent::Failed(msg) => {
                self.error = Some(msg);
                self.stop = None;
            }
            LiveEvent::FailedWith { error, last } => {
                self.take_update(last);
                self.error = Some(error);
                self.stop = None;
            }
        }
    }

    fn take_update(&mut self, u: Box<LiveUpdate>) {
        if let Some(prev) = &self.last {
            if !u.committed.starts_with(prev.committed.as_str()) {
                self.rewrote_committed = true;
            }
        }
        if let Some(l) = u.latency {
            self.latencies.push(l.as_secs_f64());
        }
        self.last = Some(u);
    }

    /// Start a session on the worker with the chosen input.
    pub fn start(&mut self, worker: &Worker) {
        self.mic_level = None;
        let source: Result<Box<dyn AudioSource>, String> = match &self.input {
            Input::Microphone(name) => crate::mic::MicSource::open(name.as_deref())
                .map(|m| {
                    self.mic_level = Some(m.level());
                    Box::new(m) as Box<dyn AudioSource>
                })
                .map_err(|e| e.to_string()),
            Input::File(path) => FileSource::open(path).map(|f| Box::new(f) as Box<dyn AudioSource>).map_err(|e| e.to_string()),
        };
        let mut source = match source {
            Ok(s) => s,
            Err(e) => {
                self.error = Some(e);
                return;
            }
        };
        if let Some(u) = self.last.take() {
            if !u.committed.trim().is_empty() {
                self.history.push(u.committed.trim().to_string());
            }
        }
        self.error = None;
        self.latencies.clear();
        let stop = CancelFlag::new();
        self.stop = Some(stop.clone());
        worker.send(Job::Run(Box::new(move |transcriber, events: &Sender<Event>| {
            let opts = LiveOptions::default();
            let send = |e: LiveEvent| {
                let _ = events.send(Event::Live(e));
            };
            let result = run_live(transcriber, source.as_mut(), &opts, &stop, &mut |u| {
                send(LiveEvent::Update(Box::new(u.clone())));
            });
            match result {
                Ok(last) => send(LiveEvent::Ended(Box::new(last))),
                Err(f) => send(LiveEvent::FailedWith { error: f.error.to_string(), last: Box::new(f.last) }),
            }
        })));
    }

    /// Draw the panel; returns the microphone to remember in the settings.
    pub fn ui_panel(&mut self, ui: &mut Ui, worker: &Worker, model: &ModelState) -> Option<String> {
        egui::CentralPanel::default().show(ui, |ui| {
            ui.horizontal(|ui| {
                ui.label("Input:");
                let label = match &self.input {
                    Input::Microphone(None) => "default microphone".to_string(),
                    Input::Microphone(Some(id)) => match &self.devices {
                        Some(Ok(list)) => list.iter().find(|d| &d.id == id).map(|d| d.name.clone()).unwrap_or_else(|| id.clone()),
                        _ => id.clone(),
                    },
                    Input::File(p) => format!("file: {}", p.display()),
                };
                let running = self.running();
                ui.add_enabled_ui(!running, |ui| {
                    let combo = egui::ComboBox::from_id_salt("input").selected_text(label).width(320.0).show_ui(ui, |ui| {
                        if ui.selectable_label(self.input == Input::Microphone(None), "default microphone").clicked() {
                            self.input = Input::Microphone(None);
                        }
                        match self.devices.get_or_insert_with(|| crate::mic::input_devices().map_err(|e| e.to_string())) {
                            Ok(devices) if devices.is_empty() => {
                                ui.label("no microphone found");
                            }
                            Ok(devices) => {
                                for d in devices.clone() {
                                    let sel = self.input == Input::Microphone(Some(d.id.clone()));
                                    let label = if d.is_default { format!("{} (default)", d.name) } else { d.name.clone() };
                                    if ui.selectable_label(sel, label).on_hover_text(&d.id).clicked() {
                                        self.input = Input::Microphone(Some(d.id));
                                    }
                                }
                            }
                            Err(e) => {
                                ui.label(RichText::new(e.as_str()).color(ui.visuals().error_fg_color));
                            }
                        }
                    });
                    // Look for devices afresh each time the list opens (one may be plugged in).
                    if combo.response.clicked() {
                        self.devices = None;
                    }
                    if ui.button("WAV file at real-time pace…").clicked() {
                        self.wants_file = true;
                    }
                });
            });
            ui.horizontal(|ui| {
                let ready = matches!(model, ModelState::Ready { .. });
                if self.running() {
                    if ui.button(RichText::new("Stop").strong()).clicked() {
                        self.stop();
                    }
                    ui.spinner();
                } else if ui.add_enabled(ready, egui::Button::new(RichText::new("Start").strong())).clicked() {
                    self.start(worker);
                }
                if !ready {
                    ui.label("(waiting for the model)");
                }
                let live_level = self.mic_level.as_ref().filter(|_| self.stop.is_some()).map(|h| h.get());
                level_meter(ui, self.last.as_deref(), live_level);
            });
            if let Some(e) = &self.error {
                ui.label(RichText::new(e).color(ui.visuals().error_fg_color));
            }
            if let Some(u) = &self.last {
                ui.label(format!(
                    "{:.1} s heard, window {:.1} s, {} decodes{}{}",
                    u.received_seconds,
                    u.buffer_seconds,
                    u.decodes,
                    u.decode_time.map(|d| format!(", last decode {:.0} ms", d.as_secs_f64() * 1e3)).unwrap_or_default(),
                    latency_text(&self.latencies),
                ));
                if u.spec.passes > 0 {
                    ui.label(format!(
                        "drafts from the previous hypothesis: {:.0} % accepted, {:.2} tokens per verify pass",
                        u.spec.acceptance() * 100.0,
                        u.spec.tokens_per_pass()
                    ));
                }
            }
            ui.separator();
            egui::ScrollArea::vertical().id_salt("live-text").auto_shrink([false, false]).stick_to_bottom(true).show(ui, |ui| {
                for h in &self.history {
                    ui.add(egui::Label::new(RichText::new(h).color(ui.visuals().weak_text_color())).selectable(true).wrap());
                    ui.separator();
                }
                if let Some(u) = &self.last {
                    // Committed text, then the tentative tail greyed and italic.
                    let mut job = egui::text::LayoutJob::default();
                    let font = egui::TextStyle::Body.resolve(ui.style());
                    job.append(u.committed.trim(), 0.0, egui::TextFormat { font_id: font.clone(), color: ui.visuals().strong_text_color(), ..Default::default() });
                    if !u.tentative.trim().is_empty() {
                        job.append(
                            &format!(" {}", u.tentative.trim()),
                            0.0,
                            egui::TextFormat { font_id: font, color: Color32::GRAY, italics: true, ..Default::default() },
                        );
                    }
                    job.wrap.max_width = ui.available_width();
                    ui.add(egui::Label::new(job).selectable(true));
                    if !u.committed.trim().is_empty() && ui.button("Copy committed text").clicked() {
                        ui.ctx().copy_text(u.committed.trim().to_string());
                    }
                } else {
                    ui.label("Press Start and speak: committed text appears here, the tentative tail in grey.");
                }
            });
        });
        match &self.input {
            Input::Microphone(n) => n.clone(),
            Input::File(_) => None,
        }
    }
}

fn latency_text(l: &[f64]) -> String {
    if l.is_empty() {
        return String::new();
    }
    let mean = l.iter().sum::<f64>() / l.len() as f64;
    let max = l.iter().cloned().fold(0.0, f64::max);
    format!(", latency to commit {:.2} s (mean {mean:.2}, max {max:.2})", l[l.len() - 1])
}

/// A horizontal meter: RMS as the bar, peak as a tick, -60..0 dBFS.
fn level_meter(ui: &mut Ui, u: Option<&LiveUpdate>, mic: Option<engine::live::Level>) {
    let (mut rms, mut peak, voiced) = u.map(|u| (u.level.rms_dbfs, u.level.peak_dbfs, u.voiced)).unwrap_or((f32::NEG_INFINITY, f32::NEG_INFINITY, false));
    if let Some(l) = mic {
        (rms, peak) = (l.rms_dbfs, l.peak_dbfs);
    }
    let frac = |db: f32| if db.is_finite() { ((db + 60.0) / 60.0).clamp(0.0, 1.0) } else { 0.0 };
    let (rect, resp) = ui.allocate_exact_size(egui::vec2(220.0, 14.0), egui::Sense::hover());
    let p = ui.painter_at(rect);
    p.rect_filled(rect, 2.0, ui.visuals().extreme_bg_color);
    let mut bar = rect;
    bar.set_width(rect.width() * frac(rms));
    p.rect_filled(bar, 2.0, if voiced { Color32::from_rgb(0x59, 0xa1, 0x4f) } else { Color32::from_rgb(0x8c, 0x8c, 0x8c) });
    let x = rect.left() + rect.width() * frac(peak);
    p.line_segment([egui::pos2(x, rect.top()), egui::pos2(x, rect.bottom())], egui::Stroke::new(2.0, Color32::from_rgb(0xe1, 0x57, 0x59)));
    resp.on_hover_text(format!("RMS {rms:.0} dBFS, peak {peak:.0} dBFS{}", if voiced { ", speech" } else { "" }));
    ui.label(if voiced { "speech" } else { "quiet" });
}
