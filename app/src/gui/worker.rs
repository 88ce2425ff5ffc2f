//! The window's GPU worker: one thread that owns the model and runs every job (files, live
//! sessions) in turn, on the device the window draws with. The UI thread only sends jobs
//! and reads events, so it never waits on the GPU.
//!
//! Errors are events, never panics: a missing model, an unreadable file or a lost device
//! becomes a message the window shows, and the thread goes on with the next job (after a
//! device loss every later job reports the loss instead of touching the dead device).

use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;

use engine::decode::draft::Speculative;
use engine::decode::CancelFlag;
use engine::gpu::{Gpu, KernelStat};
use engine::pipeline::{Options, Transcriber, Transcript};
use engine::Error;

/// What the worker can be asked to do.
pub enum Job {
    /// Load (or reload) the model: `None` is the default model, fetched when missing.
    LoadModel(Option<PathBuf>),
    /// Transcribe a file; `cancel` stops it between tokens.
    File { id: u64, path: PathBuf, timestamps: bool, speculative: Speculative, cancel: CancelFlag },
    /// Anything else that needs the model (the live session): runs on the worker thread.
    Run(Box<dyn FnOnce(&mut Transcriber, &Sender<Event>) + Send>),
}

/// One file's result with everything the timing panels show.
#[derive(Clone, Debug)]
pub struct FileResult {
    pub transcript: Transcript,
    pub kernels: Vec<KernelStat>,
    /// Whether the kernel times come from GPU timestamp queries.
    pub timed: bool,
    pub load_seconds: f64,
    pub model_dir: PathBuf,
}

#[derive(Clone, Debug)]
pub enum ModelState {
    Loading(String),
    Ready { dir: PathBuf, seconds: f64 },
    Failed(String),
}

pub enum Event {
    Model(ModelState),
    Started { id: u64 },
    Progress { id: u64, fraction: f32 },
    Finished { id: u64, outcome: Result<Box<FileResult>, String> },
    Cancelled { id: u64 },
    /// Anything a [`Job::Run`] reports (the live session's updates).
    Live(crate::gui::live::LiveEvent),
}

pub struct Worker {
    jobs: Sender<Job>,
    pub events: Receiver<Event>,
}

impl Worker {
    /// Start the thread. `gpu` is the window's device (or why there is none); `wake` is
    /// called after every event so the UI repaints.
    pub fn spawn(gpu: Result<Arc<Gpu>, String>, wake: impl Fn() + Send + Sync + 'static) -> Worker {
        let (jobs, job_rx) = channel::<Job>();
        let (ev_tx, events) = channel::<Event>();
        let wake = Arc::new(wake);
        let spawned = std::thread::Builder::new().name("verbatim-gpu".into()).spawn(move || {
            let mut state = State { gpu, model: None, model_error: None, device_lost: None };
            let out = Notifier { tx: ev_tx.clone(), wake: wake.clone() };
            for job in job_rx {
                // A bug must not take the window (and its transcripts) down: report it and
                // carry on with the next job.
                let kind = match &job {
                    Job::File { id, .. } => Some(*id),
                    Job::LoadModel(_) => None,
                    Job::Run(_) => Some(u64::MAX),
                };
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| state.run(job, &out)));
                if let Err(p) = run {
                    let what = p
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| p.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "unknown panic".into());
                    let msg = format!("internal error: {what} (please report it)");
                    match kind {
                        Some(u64::MAX) => out.send(Event::Live(crate::gui::live::LiveEvent::Failed(msg))),
                        Some(id) => out.send(Event::Finished { id, outcome: Err(msg) }),
                        None => out.send(Event::Model(ModelState::Failed(msg))),
                    }
                }
            }
        });
        if let Err(e) = spawned {
            // Without a thread nothing can run; say so through the event channel.
            let (tx, rx) = channel();
            let _ = tx.send(Event::Model(ModelState::Failed(format!("cannot start the GPU thread: {e}"))));
            return Worker { jobs, events: rx };
        }
        Worker { jobs, events }
    }

    pub fn send(&self, job: Job) {
        // The thread ends only when this Worker is dropped.
        let _ = self.jobs.send(job);
    }
}

/// Sends an event and wakes the UI.
struct Notifier {
    tx: Sender<Event>,
    wake: Arc<dyn Fn() + Send + Sync>,
}

impl Notifier {
    fn send(&self, e: Event) {
        let _ = self.tx.send(e);
        (self.wake)();
    }
}

struct State {
    gpu: Result<Arc<Gpu>, String>,
    model: Option<Transcriber>,
    model_error: Option<String>,
    device_lost: Option<String>,
}

impl State {
    fn run(&mut self, job: Job, out: &Notifier) {
        match job {
            Job::LoadModel(dir) => self.load(dir, out),
            Job::File { id, path, timestamps, speculative, cancel } => {
                out.send(Event::Started { id });
                if cancel.is_set() {
                    out.send(Event::Cancelled { id });
                    return;
                }
                let outcome = self.transcribe(id, &path, timestamps, speculative, &cancel, out);
                match outcome {
                    Err(Error::Cancelled) => out.send(Event::Cancelled { id }),
                    Err(e) => {
                        self.note_device_loss(&e);
                        out.send(Event::Finished { id, outcome: Err(e.to_string()) })
                    }
                    Ok(r) => out.send(Event::Finished { id, outcome: Ok(Box::new(r)) }),
                }
            }
            Job::Run(f) => match self.ready() {
                Ok(model) => {
                    f(model, &out.tx);
                    (out.wake)();
                    if let Err(e) = model.gpu().check() {
                        self.note_device_loss(&e);
                    }
                }
                Err(msg) => out.send(Event::Live(crate::gui::live::LiveEvent::Failed(msg))),
            },
        }
    }

    fn load(&mut self, dir: Option<PathBuf>, out: &Notifier) {
        self.model = None;
        self.model_error = None;
        let gpu = match (&self.gpu, &self.device_lost) {
            (_, Some(lost)) => Err(lost.clone()),
            (Ok(g), None) => Ok(g.clone()),
            (Err(e), None) => Err(e.clone()),
        };
        let result = gpu.and_then(|gpu| {
            let dir = match dir {
                Some(d) => d,
                None => {
                    out.send(Event::Model(ModelState::Loading("looking for the default model".into())));
                    crate::transcribe::default_model()?
                }
            };
            out.send(Event::Model(ModelState::Loading(format!("loading {}", dir.display()))));
            Transcriber::load(gpu, &dir).map_err(|e| {
                self.note_device_loss(&e);
                e.to_string()
            })
        });
        match result {
            Ok(t) => {
                out.send(Event::Model(ModelState::Ready { dir: t.model_dir.clone(), seconds: t.load_time.as_secs_f64() }));
                self.model = Some(t);
            }
            Err(msg) => {
                self.model_error = Some(msg.clone());
                out.send(Event::Model(ModelState::Failed(msg)));
            }
        }
    }

    /// The loaded model, or why there is none.
    fn ready(&mut self) -> Result<&mut Transcriber, String> {
        if let Some(lost) = &self.device_lost {
            return Err(lost.clone());
        }
        match &mut self.model {
            Some(m) => Ok(m),
            None => Err(self.model_error.clone().unwrap_or_else(|| "the model is not loaded yet".into())),
        }
    }

    fn transcribe(
        &mut self,
        id: u64,
        path: &std::path::Path,
        timestamps: bool,
        speculative: Speculative,
        cancel: &CancelFlag,
        out: &Notifier,
    ) -> Result<FileResult, Error> {
        let model = self.ready().map_err(Error::Invalid)?;
        model.reset_profile();
        let mut opts = Options { timestamps, ..Options::default() };
        opts.decode.speculative = speculative;
        opts.decode.cancel = Some(cancel.clone());
        let transcript = model.transcribe_file_with_progress(path, &opts, &mut |fraction| {
            out.send(Event::Progress { id, fraction })
        })?;
        let profile = model.profile();
        Ok(FileResult {
            transcript,
            kernels: profile.stats(),
            timed: profile.timed,
            load_seconds: model.load_time.as_secs_f64(),
            model_dir: model.model_dir.clone(),
        })
    }

    /// After a device loss nothing more runs on the device: remember why.
    fn note_device_loss(&mut self, e: &Error) {
        if let Error::DeviceLost(_) = e {
            self.device_lost = Some(format!("{e}; restart Verbatim to continue (the transcripts so far are kept)"));
            self.model = None;
        }
    }
}
