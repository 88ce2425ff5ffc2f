//! The microphone as a live audio source, through cpal (ALSA on Linux, which PulseAudio and
//! PipeWire also serve).
//!
//! Shape, and why:
//! - cpal's `Stream` is not `Send` on every platform, so a dedicated capture thread opens
//!   the device, owns the stream for its whole life and drops it there. [`MicSource`] — what
//!   the live driver polls on the worker thread — is only the receiving end.
//! - The data callback runs on the audio thread, where blocking or allocating risks dropped
//!   audio: it only downmixes to mono f32 into a preallocated single-producer ring of atomics
//!   (no lock, no allocation, no unsafe). The capture thread moves the ring's contents into
//!   an ordinary channel every 10 ms; a decode that keeps the worker busy for seconds (a
//!   software GPU) then only grows that channel.
//! - A stream error that ends capture (device unplugged, stream invalidated) is kept and
//!   becomes the `Err` of the next `poll`; so does a device that silently stops delivering.
//!   Glitch reports (overrun, reroute, no real-time priority) are not errors.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cpal::traits::{DeviceTrait, HostTrait, StreamTrait};
use cpal::{FromSample, SampleFormat, SizedSample};
use engine::live::{AudioSource, Level, SourceState};
use engine::{Error, Result};

/// Samples the callback ring holds (mono): 2^18 is 5.4 s at 48 kHz, far more than the
/// 10 ms between two drains of the capture thread.
const RING: usize = 1 << 18;
/// How often the capture thread drains the ring.
const DRAIN_EVERY: Duration = Duration::from_millis(10);
/// No audio for this long from a running stream: the device is gone.
const STALL: Duration = Duration::from_secs(3);
/// How long opening a device may take before we give up on it.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// An input device as the device picker shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputDevice {
    /// cpal's stable id ("alsa:default", ...): pass it to [`MicSource::open`].
    pub id: String,
    /// For people.
    pub name: String,
    pub is_default: bool,
}

/// The input devices of the default host, the default one first. An empty list means no
/// microphone (the window says so); an error means the audio system itself failed.
pub fn input_devices() -> Result<Vec<InputDevice>> {
    let host = cpal::default_host();
    let default_id = host.default_input_device().and_then(|d| d.id().ok()).map(|id| id.to_string());
    let devices = host.input_devices().map_err(|e| Error::Microphone(format!("cannot list the input devices: {e}")))?;
    let mut list: Vec<InputDevice> = devices
        .filter_map(|d| {
            // A device that vanished between listing and asking has no id: leave it out.
            let id = d.id().ok()?.to_string();
            let name = d.description().map(|desc| desc.to_string()).unwrap_or_else(|_| d.to_string());
            Some(InputDevice { is_default: Some(&id) == default_id.as_ref(), id, name })
        })
        .collect();
    // Stable: the default first, the rest in the host's order.
    list.sort_by_key(|d| !d.is_default);
    Ok(list)
}

/// Single-producer single-consumer ring of f32 samples stored as bits in atomics: the
/// audio callback writes, the capture thread reads; neither ever waits.
struct Ring {
    slots: Vec<AtomicU32>,
    /// Samples ever written / read (wrapping indices into `slots`).
    written: AtomicUsize,
    read: AtomicUsize,
    /// Samples dropped because the ring was full.
    overruns: AtomicU64,
}

impl Ring {
    fn new(capacity: usize) -> Self {
        Ring {
            slots: (0..capacity).map(|_| AtomicU32::new(0)).collect(),
            written: AtomicUsize::new(0),
            read: AtomicUsize::new(0),
            overruns: AtomicU64::new(0),
        }
    }

    /// Producer side (the audio callback only).
    fn push(&self, v: f32) {
        let w = self.written.load(Ordering::Relaxed);
        if w.wrapping_sub(self.read.load(Ordering::Acquire)) >= self.slots.len() {
            self.overruns.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.slots[w % self.slots.len()].store(v.to_bits(), Ordering::Relaxed);
        // Release: the sample is visible before the count that announces it.
        self.written.store(w.wrapping_add(1), Ordering::Release);
    }

    /// Consumer side (the capture thread only).
    fn drain_into(&self, out: &mut Vec<f32>) {
        let w = self.written.load(Ordering::Acquire);
        let mut r = self.read.load(Ordering::Relaxed);
        while r != w {
            out.push(f32::from_bits(self.slots[r % self.slots.len()].load(Ordering::Relaxed)));
            r = r.wrapping_add(1);
        }
        self.read.store(r, Ordering::Release);
    }
}

/// What the audio callback, the error callback, the capture thread and the source share.
struct Shared {
    ring: Ring,
    /// A fatal stream error, for the next poll.
    error: Mutex<Option<String>>,
    stop: AtomicBool,
    /// Level of the last drained piece, as f32 bits (RMS, peak dBFS).
    rms_bits: AtomicU32,
    peak_bits: AtomicU32,
}

/// Reads the microphone's input level from any thread (the window's meter keeps moving
/// even while the worker is busy decoding).
#[derive(Clone)]
pub struct LevelHandle(Arc<Shared>);

impl LevelHandle {
    pub fn get(&self) -> Level {
        Level {
            rms_dbfs: f32::from_bits(self.0.rms_bits.load(Ordering::Relaxed)),
            peak_dbfs: f32::from_bits(self.0.peak_bits.load(Ordering::Relaxed)),
        }
    }
}

/// An open microphone: the receiving end of its capture thread.
pub struct MicSource {
    shared: Arc<Shared>,
    rx: Receiver<Vec<f32>>,
    thread: Option<JoinHandle<()>>,
    rate: u32,
    /// The device's name and format, for the window ("USB mic, 48000 Hz, 2 ch, i16").
    pub description: String,
    last_data: Instant,
    /// Samples delivered since `opened`: a "device" far faster than its rate is no
    /// microphone (ALSA's null device generates zeros as fast as it is read).
    delivered: u64,
    opened: Instant,
    failed: Option<String>,
}

impl MicSource {
    /// Open `device` — an id or a name from [`input_devices`] — or, with None, the default
    /// input device, in its default configuration, and start capturing.
    pub fn open(device: Option<&str>) -> Result<MicSource> {
        let shared = Arc::new(Shared {
            ring: Ring::new(RING),
            error: Mutex::new(None),
            stop: AtomicBool::new(false),
            rms_bits: AtomicU32::new(f32::NEG_INFINITY.to_bits()),
            peak_bits: AtomicU32::new(f32::NEG_INFINITY.to_bits()),
        });
        let (ready_tx, ready_rx) = mpsc::sync_channel::<Result<(u32, String)>>(1);
        let (data_tx, rx) = mpsc::channel::<Vec<f32>>();
        let id = device.map(str::to_string);
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("verbatim-mic".into())
            .spawn(move || capture_thread(id, sh, ready_tx, data_tx))
            .map_err(|e| Error::Microphone(format!("cannot start the capture thread: {e}")))?;
        let opened = match ready_rx.recv_timeout(OPEN_TIMEOUT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                Err(Error::Microphone("the microphone did not start within 10 s".into()))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                Err(Error::Microphone("the capture thread ended while opening the microphone".into()))
            }
        };
        let mut src = MicSource {
            shared,
            rx,
            thread: Some(thread),
            rate: 0,
            description: String::new(),
            last_data: Instant::now(),
            delivered: 0,
            opened: Instant::now(),
            failed: None,
        };
        // On an error, dropping `src` stops and joins the thread.
        let (rate, description) = opened?;
        src.rate = rate;
        src.description = description;
        src.last_data = Instant::now();
        src.opened = Instant::now();
        Ok(src)
    }

    /// A handle on the input level, readable from the UI thread.
    pub fn level(&self) -> LevelHandle {
        LevelHandle(self.shared.clone())
    }

    /// Samples dropped because nobody drained the callback's ring in time (should stay 0;
    /// the tests check it, a diagnostics view may show it).
    #[allow(dead_code)]
    pub fn overruns(&self) -> u64 {
        self.shared.ring.overruns.load(Ordering::Relaxed)
    }
}

impl AudioSource for MicSource {
    fn sample_rate(&self) -> u32 {
        self.rate
    }

    fn poll(&mut self, out: &mut Vec<f32>) -> Result<SourceState> {
        if let Some(msg) = &self.failed {
            return Err(Error::Microphone(msg.clone()));
        }
        // Deliver what arrived before a failure first: nothing captured is lost.
        loop {
            match self.rx.try_recv() {
                Ok(piece) => {
                    if !piece.is_empty() {
                        self.last_data = Instant::now();
                    }
                    self.delivered += piece.len() as u64;
                    out.extend_from_slice(&piece);
                }
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    let msg = self.take_error().unwrap_or_else(|| "the capture thread ended".into());
                    return Err(self.fail(msg));
                }
            }
        }
        if let Some(msg) = self.take_error() {
            return Err(self.fail(msg));
        }
        let secs = self.opened.elapsed().as_secs_f64();
        if secs > 1.0 && self.delivered as f64 > 3.0 * self.rate as f64 * secs {
            return Err(self.fail(format!(
                "the input delivers audio far faster than {} Hz ({} samples in {secs:.1} s): it is not a microphone",
                self.rate, self.delivered
            )));
        }
        if self.last_data.elapsed() > STALL {
            return Err(self.fail(format!(
                "the microphone delivered no audio for {} s (unplugged?)",
                STALL.as_secs()
            )));
        }
        Ok(SourceState::Running)
    }
}

impl MicSource {
    fn take_error(&self) -> Option<String> {
        self.shared.error.lock().map(|mut e| e.take()).unwrap_or_else(|p| p.into_inner().take())
    }

    fn fail(&mut self, msg: String) -> Error {
        self.failed = Some(msg.clone());
        Error::Microphone(msg)
    }
}

impl Drop for MicSource {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            // The thread checks `stop` every 10 ms and drops the stream on its way out.
            let _ = t.join();
        }
    }
}

/// Opens the device, owns the stream until told to stop, and moves captured audio from
/// the callback's ring into `data_tx`.
fn capture_thread(
    device_id: Option<String>,
    shared: Arc<Shared>,
    ready: mpsc::SyncSender<Result<(u32, String)>>,
    data_tx: mpsc::Sender<Vec<f32>>,
) {
    let stream = match open_stream(device_id.as_deref(), &shared) {
        Ok((stream, rate, description)) => {
            let _ = ready.send(Ok((rate, description)));
            stream
        }
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let mut piece = Vec::new();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(DRAIN_EVERY);
        piece.clear();
        shared.ring.drain_into(&mut piece);
        if piece.is_empty() {
            continue;
        }
        let (mut sum_sq, mut peak) = (0f64, 0f32);
        for &v in &piece {
            sum_sq += (v as f64) * (v as f64);
            peak = peak.max(v.abs());
        }
        let rms = (10.0 * (sum_sq / piece.len() as f64).log10()) as f32;
        shared.rms_bits.store(rms.to_bits(), Ordering::Relaxed);
        shared.peak_bits.store((20.0 * peak.log10()).to_bits(), Ordering::Relaxed);
        if data_tx.send(std::mem::take(&mut piece)).is_err() {
            break; // the source was dropped
        }
    }
    drop(stream);
}

fn mic_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Microphone(format!("{what}: {e}"))
}

/// The device, its default input configuration and a playing stream into `shared.ring`.
fn open_stream(device_id: Option<&str>, shared: &Arc<Shared>) -> Result<(cpal::Stream, u32, String)> {
    let host = cpal::default_host();
    let device = match device_id {
        // An id from `input_devices`, or a name as people see it (a remembered setting).
        Some(id) => id
            .parse::<cpal::DeviceId>()
            .ok()
            .and_then(|parsed| host.device_by_id(&parsed))
            .or_else(|| {
                host.input_devices().ok()?.find(|d| {
                    d.to_string() == id || d.description().is_ok_and(|desc| desc.to_string() == id || desc.name() == id)
                })
            })
            .ok_or_else(|| Error::Microphone(format!("the input device {id} is not available (unplugged?)")))?,
        None => host.default_input_device().ok_or_else(|| {
            Error::Microphone("no microphone was found: connect one, or check the system's sound settings".into())
        })?,
    };
    let name = device.description().map(|d| d.to_string()).unwrap_or_else(|_| device.to_string());
    let config = device.default_input_config().map_err(|e| mic_err(&format!("{name} cannot record"), e))?;
    let (rate, channels, format) = (config.sample_rate(), config.channels().max(1) as usize, config.sample_format());

    let err_shared = shared.clone();
    let on_error = move |e: cpal::Error| {
        use cpal::ErrorKind::*;
        match e.kind() {
            // Glitches and reroutes: capture goes on.
            Xrun | DeviceChanged | RealtimeDenied => {}
            _ => {
                if let Ok(mut slot) = err_shared.error.lock() {
                    slot.get_or_insert_with(|| format!("the microphone stopped: {e}"));
                }
            }
        }
    };
    let data_shared = shared.clone();
    let on_data = move |data: &cpal::Data, _: &cpal::InputCallbackInfo| {
        let ring = &data_shared.ring;
        match data.sample_format() {
            SampleFormat::F32 => push_mono::<f32>(data, channels, ring),
            SampleFormat::F64 => push_mono::<f64>(data, channels, ring),
            SampleFormat::I8 => push_mono::<i8>(data, channels, ring),
            SampleFormat::I16 => push_mono::<i16>(data, channels, ring),
            SampleFormat::I24 => push_mono::<cpal::I24>(data, channels, ring),
            SampleFormat::I32 => push_mono::<i32>(data, channels, ring),
            SampleFormat::I64 => push_mono::<i64>(data, channels, ring),
            SampleFormat::U8 => push_mono::<u8>(data, channels, ring),
            SampleFormat::U16 => push_mono::<u16>(data, channels, ring),
            SampleFormat::U24 => push_mono::<cpal::U24>(data, channels, ring),
            SampleFormat::U32 => push_mono::<u32>(data, channels, ring),
            SampleFormat::U64 => push_mono::<u64>(data, channels, ring),
            _ => {} // refused before the stream was built (see below)
        }
    };
    if format.is_dsd() {
        return Err(Error::Microphone(format!("{name} records in {format}, which this program cannot read")));
    }
    let stream = device
        .build_input_stream_raw(config.config(), format, on_data, on_error, None)
        .map_err(|e| mic_err(&format!("cannot open {name}"), e))?;
    stream.play().map_err(|e| mic_err(&format!("cannot start {name}"), e))?;
    let description = format!("{name}, {rate} Hz, {channels} ch, {format}");
    Ok((stream, rate, description))
}

/// Frames of `data` averaged over their channels into the ring (no allocation: this runs
/// on the audio thread).
fn push_mono<T: SizedSample>(data: &cpal::Data, channels: usize, ring: &Ring)
where
    f32: FromSample<T>,
{
    let Some(samples) = data.as_slice::<T>() else { return };
    let inv = 1.0 / channels as f32;
    for frame in samples.chunks_exact(channels) {
        let sum: f32 = frame.iter().map(|&s| f32::from_sample_(s)).sum();
        ring.push(sum * inv);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mic_ring_passes_samples_in_order_and_counts_overruns() {
        let ring = Ring::new(8);
        let mut out = Vec::new();
        for i in 0..5 {
            ring.push(i as f32);
        }
        ring.drain_into(&mut out);
        assert_eq!(out, [0.0, 1.0, 2.0, 3.0, 4.0]);
        // Wraps around the slots; beyond capacity, samples are dropped and counted.
        for i in 5..15 {
            ring.push(i as f32);
        }
        out.clear();
        ring.drain_into(&mut out);
        assert_eq!(out, (5..13).map(|i| i as f32).collect::<Vec<_>>());
        assert_eq!(ring.overruns.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn mic_ring_across_threads() {
        let ring = Arc::new(Ring::new(1 << 10));
        let r2 = ring.clone();
        let n = 200_000;
        let producer = std::thread::spawn(move || {
            let mut i = 0;
            while i < n {
                if r2.written.load(Ordering::Relaxed).wrapping_sub(r2.read.load(Ordering::Acquire)) < 1 << 10 {
                    r2.push(i as f32);
                    i += 1;
                }
            }
        });
        let mut out = Vec::new();
        while out.len() < n {
            ring.drain_into(&mut out);
        }
        producer.join().unwrap();
        assert!(out.iter().enumerate().all(|(i, v)| *v == i as f32));
        assert_eq!(ring.overruns.load(Ordering::Relaxed), 0);
    }

    /// The issue's virtual capture device: records through cpal from a PulseAudio null
    /// sink's monitor while `assets/jfk.wav` plays into the sink, then transcribes what was
    /// captured. Needs a PulseAudio server whose default source is that monitor, `paplay`,
    /// and ALSA's pulse plugin (Debian: pulseaudio pulseaudio-utils libasound2-plugins):
    ///
    /// ```text
    /// pulseaudio --start --exit-idle-time=-1 -n -F /dev/null \
    ///     --load=module-native-protocol-unix --load="module-null-sink sink_name=vsink"
    /// VERBATIM_TEST_PULSE=1 cargo test -p verbatim mic_records
    /// ```
    ///
    /// Without VERBATIM_TEST_PULSE=1 it only says it was skipped: on a desktop it would
    /// record the real microphone.
    #[test]
    fn mic_records_the_sample_played_into_a_null_sink() {
        if std::env::var_os("VERBATIM_TEST_PULSE").is_none() {
            eprintln!("skipped: set VERBATIM_TEST_PULSE=1 with a PulseAudio null sink as the default source");
            return;
        }
        let mut mic = MicSource::open(None).expect("open the default input (the null sink's monitor)");
        eprintln!("recording from {}", mic.description);
        let wav = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/jfk.wav");
        let mut play = std::process::Command::new("paplay").arg(&wav).spawn().expect("run paplay");
        let mut pcm = Vec::new();
        let t = Instant::now();
        // Until the 11 s sample has played, then 1.5 s more: the pulse plugin delivers
        // ~0.5 s behind (measured here).
        let mut ended: Option<Instant> = None;
        while ended.is_none_or(|e| e.elapsed() < Duration::from_millis(1_500)) {
            mic.poll(&mut pcm).expect("capture goes on");
            if ended.is_none() && play.try_wait().expect("paplay runs").is_some() {
                ended = Some(Instant::now());
            }
            assert!(t.elapsed() < Duration::from_secs(30), "paplay did not end");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(play.wait().expect("paplay ends").success(), "paplay failed");
        assert_eq!(mic.overruns(), 0);
        let secs = pcm.len() as f64 / mic.sample_rate() as f64;
        let wall = t.elapsed().as_secs_f64();
        eprintln!("{secs:.2} s of audio captured in {wall:.2} s");
        assert!(secs > 11.0 && secs < wall + 0.1, "{secs} s captured in {wall} s");

        let mut rs = engine::live::resample::StreamResampler::new(mic.sample_rate()).unwrap();
        let mut x = Vec::new();
        rs.process(&pcm, &mut x).unwrap();
        rs.finish(&mut x).unwrap();
        let peak = x.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(peak > 0.1, "nothing audible was captured (peak {peak})");
        let gpu = engine::gpu::Gpu::new(&engine::gpu::GpuOptions::default()).expect("a GPU adapter");
        let model = engine::models::whisper::default_model_dir();
        let mut t = engine::pipeline::Transcriber::load(Arc::new(gpu), &model).expect("the default model");
        let out = t.transcribe_samples(&x, &engine::pipeline::Options::default(), &mut |_| {}).unwrap();
        let norm: String = out
            .text
            .to_lowercase()
            .chars()
            .map(|c| if c.is_alphanumeric() || c == '\'' { c } else { ' ' })
            .collect::<String>()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert_eq!(
            norm,
            "and so my fellow americans ask not what your country can do for you ask what you can do for your country"
        );
    }

    /// On a machine without a microphone (CI), opening the default device is an error
    /// that says so — not a panic; with one, it opens and delivers audio.
    #[test]
    fn mic_open_default_is_a_source_or_a_clear_error() {
        match MicSource::open(None) {
            Ok(mut mic) => {
                assert!(mic.sample_rate() > 0, "{}", mic.description);
                let mut out = Vec::new();
                std::thread::sleep(Duration::from_millis(300));
                match mic.poll(&mut out) {
                    Ok(_) => eprintln!("{}: {} samples in 0.3 s", mic.description, out.len()),
                    Err(e) => eprintln!("{}: {e}", mic.description),
                }
            }
            Err(e) => {
                assert!(matches!(e, Error::Microphone(_)), "{e}");
                eprintln!("no microphone here: {e}");
            }
        }
        let _ = input_devices().map(|l| eprintln!("input devices: {l:?}"));
    }
}
