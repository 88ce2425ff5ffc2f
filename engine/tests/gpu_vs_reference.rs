//! The GPU Whisper (`models::whisper::gpu`) held to the CPU reference
//! (`reference::whisper`), on models small enough that the whole file runs in seconds on
//! lavapipe.
//!
//! Why synthetic models: the CPU reference sums in f64 and needs ~40 s for one encoder
//! pass of the real model in dev, too slow for CI. A random Whisper of awkward geometry
//! (odd mel count, odd audio_ctx, eot/timestamp_begin inside a small vocabulary) runs the
//! same kernels, launch paths and masking rules in milliseconds. Both sides read the same
//! f16 weights (the GPU as f16, the reference widened to f32), so the only difference
//! left is arithmetic: f32 on the GPU against f64 sums on the CPU, which is why the
//! bounds can be tight (1e-4 relative L2 on activations and logits, 1e-3 on the scores).
//!
//! Why two geometries: the GPU has launch paths selected by shape. head_dim 16 takes the
//! tiled encoder attention (head_dim % 4 == 0 and <= 64), head_dim 10 the per-query one;
//! prompts of <= 8 tokens run the decoder's linears as GEMV, longer ones as the tiled
//! GEMM (and the decoder's self-attention as the tiled kernel when head_dim allows).
//!
//! The real model is covered cheaply too: `real_model_cropped_matches_reference` copies
//! tiny.en's own weights into a model whose encoder takes 1.5 s instead of 30 s (position
//! tables cut), which keeps the real geometry (d 384, head_dim 64, vocab 51864) and the
//! real weights' value ranges at a fraction of the cost. It skips, saying so, when the
//! model is not installed.
//!
//! Mel inputs are fresh random values each run (weights too); the seed is printed and
//! `VERBATIM_TEST_SEED=<n>` replays a run.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use engine::decode::{LogitSource, Step, StepRules, StepScores, TsState};
use engine::gpu::{Gpu, GpuOptions};
use engine::models::whisper::checkpoint::{write_synthetic, Checkpoint};
use engine::models::whisper::ct2::{write_ct2, Ct2File, DType};
use engine::models::whisper::gpu::{GpuWhisper, MAX_VERIFY};
use engine::models::whisper::{default_model_dir, Dims};
use engine::reference::select::masked_scores;
use engine::reference::whisper::CpuWhisper;
use engine::Error;

// ---- Bounds ------------------------------------------------------------------------------

/// Relative L2 error allowed on whole activations (encoder output, logits).
const REL_L2: f64 = 1e-4;
/// Error allowed on a score (max, log-sum-exp, probe), relative to max(|value|, 1): the
/// scores are O(1)..O(10), and a pure relative bound would be ill-posed near zero.
const SCORE_TOL: f64 = 1e-3;
/// Below this gap between the best and second-best allowed logit (in the reference), the
/// argmax is a coin toss between f32 and f64 rounding: the id check is skipped (and said).
const TIE_GAP: f32 = 1e-3;

// ---- Geometries --------------------------------------------------------------------------

/// head_dim 16: the encoder's self-attention takes the tiled kernel. Odd audio_ctx (602 mel
/// frames), more than one split of keys for the decoder's cross-attention (its output
/// projection merges them), 10 mels, three decoder layers, 300 ids with timestamps
/// [260, 300).
const GEOM_A: Geometry = Geometry {
    dims: Dims {
        n_mels: 10,
        d_model: 64,
        n_heads: 4,
        encoder_layers: 2,
        decoder_layers: 3,
        ffn: 256,
        vocab: 300,
        audio_ctx: 301,
        text_ctx: 24,
    },
    eot: 250,
    timestamp_begin: 260,
};

/// head_dim 10 (not a multiple of 4): every attention takes the per-query kernel. Odd
/// n_mels and audio_ctx, ffn not a multiple of the 64-wide tiles, vocab 222.
const GEOM_B: Geometry = Geometry {
    dims: Dims {
        n_mels: 7,
        d_model: 60,
        n_heads: 6,
        encoder_layers: 1,
        decoder_layers: 2,
        ffn: 150,
        vocab: 222,
        audio_ctx: 21,
        text_ctx: 16,
    },
    eot: 180,
    timestamp_begin: 191,
};

#[derive(Clone, Copy, Debug)]
struct Geometry {
    dims: Dims,
    eot: u32,
    timestamp_begin: u32,
}

// ---- Shared fixtures -------------------------------------------------------------------

/// One device for every test in this file: creating one costs seconds on lavapipe, and the
/// compiled kernels are cached on it.
fn gpu() -> Arc<Gpu> {
    static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| {
        let g = own_gpu();
        eprintln!(
            "GPU: {} ({}, {})",
            g.info.name, g.info.backend, g.info.device_type
        );
        g
    })
    .clone()
}

/// A device of the test's own: replays need one the engine opened, and a test that counts
/// what its device built would count what the tests beside it build on the shared one.
fn own_gpu() -> Arc<Gpu> {
    Arc::new(Gpu::new(&GpuOptions::default()).expect("a GPU adapter (lavapipe is enough)"))
}

/// The run's seed: `VERBATIM_TEST_SEED`, or the clock. Each test mixes in its own tag so
/// tests do not share inputs, and prints what it used.
fn seed(tag: &str) -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    let base = *BASE.get_or_init(|| match std::env::var("VERBATIM_TEST_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .expect("VERBATIM_TEST_SEED must be an unsigned integer"),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    });
    let s = tag
        .bytes()
        .fold(base, |h, b| h.rotate_left(5) ^ b as u64)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    eprintln!("[{tag}] seed {s} (base VERBATIM_TEST_SEED={base})");
    s
}

/// A directory under the system temp dir, removed on drop (also when a test fails).
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("verbatim-gpu-vs-ref-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A random non-zero mel window of the geometry's size (n_mels rows of 2·audio_ctx
/// frames), in the range of a normalised log-mel.
fn random_mel(dims: &Dims, rng: &mut StdRng) -> Vec<f32> {
    (0..dims.n_mels * 2 * dims.audio_ctx)
        .map(|_| {
            let v: f32 = rng.random_range(-1.0..1.5);
            if v.abs() < 1e-3 {
                0.5
            } else {
                v
            }
        })
        .collect()
}

/// The same random model on both sides: written as f16 CTranslate2 files, read back by
/// each implementation.
struct Pair {
    geom: Geometry,
    gpu: GpuWhisper,
    cpu: CpuWhisper,
    /// The static suppress list both were given.
    suppress: Vec<u32>,
    _dir: TempDir,
}

/// The test's seed, an rng from it and a pair of models with weights from it.
fn seeded_pair(geom: Geometry, tag: &str) -> (u64, StdRng, Pair) {
    let s = seed(tag);
    (s, StdRng::seed_from_u64(s), pair(geom, s, tag))
}

fn pair(geom: Geometry, weight_seed: u64, tag: &str) -> Pair {
    pair_on(gpu(), geom, weight_seed, tag)
}

/// `pair` on a device of its own (a test that counts what the device built, which tests
/// running beside it on the shared one would add to).
fn pair_on(gpu: Arc<Gpu>, geom: Geometry, weight_seed: u64, tag: &str) -> Pair {
    let dir = TempDir::new(tag);
    write_synthetic(&dir.0, &geom.dims, DType::F16, weight_seed)
        .expect("write the synthetic model");
    let ck = Checkpoint::open(&dir.0).expect("open the synthetic model");
    assert_eq!(ck.dims, geom.dims);
    let gpu =
        GpuWhisper::load(gpu, &ck, geom.eot, geom.timestamp_begin).expect("load on the GPU");
    let mut cpu = CpuWhisper::from_checkpoint(&ck).expect("load on the CPU");
    cpu.set_vocab_layout(geom.eot, geom.timestamp_begin)
        .unwrap();
    let mut p = Pair {
        geom,
        gpu,
        cpu,
        suppress: Vec::new(),
        _dir: dir,
    };
    // config.json's list plus a special and a timestamp, so the static mask touches every
    // region of the vocabulary.
    let mut ids = ck.config.suppress_ids.clone();
    ids.extend([geom.eot + 2, geom.timestamp_begin + 1]);
    p.set_suppress(&ids);
    p
}

impl Pair {
    fn set_suppress(&mut self, ids: &[u32]) {
        self.gpu.set_suppress(ids).unwrap();
        self.cpu.set_suppress(ids).unwrap();
        self.suppress = ids.to_vec();
    }

    fn begin_window(&mut self, mel: &[f32]) {
        self.gpu.begin_window(mel).expect("GPU begin_window");
        self.cpu.begin_window(mel).expect("CPU begin_window");
    }

    /// Advance both, compare scores and logits, fold the errors into `err`.
    fn advance(
        &mut self,
        tokens: &[u32],
        rules: &StepRules,
        what: &str,
        err: &mut Errors,
    ) -> StepScores {
        let g = self
            .gpu
            .advance(tokens, rules)
            .unwrap_or_else(|e| panic!("{what}: GPU advance: {e}"));
        let c = self
            .cpu
            .advance(tokens, rules)
            .unwrap_or_else(|e| panic!("{what}: CPU advance: {e}"));
        let gl = self.gpu.last_logits().expect("read the GPU logits");
        let cl = self.cpu.last_logits();
        let e = rel_l2(&gl, cl);
        err.logits = err.logits.max(e);
        assert!(
            e < REL_L2,
            "{what}: logits differ, relative L2 {e:.3e} (bound {REL_L2:.0e})"
        );
        self.compare_scores(&g, &c, cl, rules, what, err);
        c
    }

    /// The GPU's scores `g` against the reference's `c`, computed from the reference's
    /// `logits` under `rules` and this pair's suppress list. For the argmax checks, the
    /// second-best allowed logit is found by masking the best (the reference treats -inf
    /// as masked) and selecting again, so it obeys exactly the same rules.
    fn compare_scores(
        &self,
        g: &StepScores,
        c: &StepScores,
        logits: &[f32],
        rules: &StepRules,
        what: &str,
        err: &mut Errors,
    ) {
        let (eot, tb) = (self.geom.eot, self.geom.timestamp_begin);
        let second = |best: u32| {
            let mut l = logits.to_vec();
            l[best as usize] = f32::NEG_INFINITY;
            masked_scores(&l, &self.suppress, rules, tb, eot)
        };
        let text_gap = (c.text_best != u32::MAX).then(|| c.text_max - second(c.text_best).text_max);
        let ts_gap = (c.ts_best != u32::MAX).then(|| c.ts_max - second(c.ts_best).ts_max);
        check_id("text_best", g.text_best, c.text_best, text_gap, what, err);
        check_id("ts_best", g.ts_best, c.ts_best, ts_gap, what, err);
        for (name, got, want) in [
            ("text_max", g.text_max, c.text_max),
            ("text_lse", g.text_lse, c.text_lse),
            ("ts_max", g.ts_max, c.ts_max),
            ("ts_lse", g.ts_lse, c.ts_lse),
            ("raw_lse", g.raw_lse, c.raw_lse),
            ("probe_logit", g.probe_logit, c.probe_logit),
        ] {
            err.scores = err.scores.max(score_err(got, want, name, what));
        }
        err.steps += 1;
    }
}

// ---- Comparisons -----------------------------------------------------------------------

/// The largest errors seen, printed at the end of a test (the numbers worth reporting).
#[derive(Default, Debug)]
struct Errors {
    encoder: f64,
    logits: f64,
    scores: f64,
    /// Argmax checks skipped because of a near tie.
    ties: usize,
    steps: usize,
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "lengths differ");
    let (mut num, mut den) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite value {g} from the GPU");
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    assert!(
        den > 0.0,
        "the reference is all zeros: the comparison would say nothing"
    );
    (num / den).sqrt()
}

/// |got − want| / max(|want|, 1); 0 when both are -inf (an empty set on both sides).
fn score_err(got: f32, want: f32, name: &str, what: &str) -> f64 {
    if want == f32::NEG_INFINITY || got == f32::NEG_INFINITY {
        assert_eq!(got, want, "{what}: {name} is -inf on one side only");
        return 0.0;
    }
    assert!(got.is_finite(), "{what}: {name} = {got} on the GPU");
    let e = (got as f64 - want as f64).abs() / (want.abs() as f64).max(1.0);
    assert!(
        e < SCORE_TOL,
        "{what}: {name} GPU {got} vs reference {want} (error {e:.3e})"
    );
    e
}

/// The argmax `got` against the reference's `want`. They must match unless the reference's
/// best and second-best allowed logits are within `TIE_GAP` (`gap`, None when the set is
/// empty and `want` is u32::MAX).
fn check_id(name: &str, got: u32, want: u32, gap: Option<f32>, what: &str, err: &mut Errors) {
    match gap {
        None => assert_eq!(got, want, "{what}: {name}: the reference's set is empty"),
        Some(gap) if gap < TIE_GAP => {
            eprintln!(
                "{what}: {name}: top-2 gap {gap:.2e} < {TIE_GAP:.0e}, id check skipped \
                 (GPU {got}, reference {want})"
            );
            err.ties += 1;
        }
        Some(gap) => assert_eq!(got, want, "{what}: {name} differs (top-2 gap {gap:.3e})"),
    }
}

// ---- Step rules ------------------------------------------------------------------------

/// The rule sets a step cycles through: every mask of `StepRules`, empty sets (both ways of
/// writing an empty timestamp range, and an empty text set), bounds past the vocabulary,
/// a probe outside it. `prev_best` feeds suppress_blank-style extra ids.
fn rules_for(step: usize, geom: &Geometry, prev_best: u32) -> StepRules {
    let (eot, tb, v) = (geom.eot, geom.timestamp_begin, geom.dims.vocab as u32);
    let base = StepRules {
        mask_text: false,
        mask_non_timestamps: false,
        ts_lo: tb,
        ts_hi: v,
        extra_suppress: [u32::MAX; 2],
        probe: eot + 1,
    };
    match step % 8 {
        0 => base,
        1 => StepRules {
            mask_text: true,
            ts_lo: tb + 3,
            ts_hi: tb + 10,
            extra_suppress: [5, eot],
            probe: 0,
            ..base
        },
        2 => StepRules {
            mask_non_timestamps: true,
            probe: v - 1,
            ..base
        },
        3 => StepRules {
            ts_lo: tb + 5,
            ts_hi: tb + 5,
            extra_suppress: [u32::MAX, 7],
            ..base
        },
        4 => StepRules {
            ts_lo: tb + 9,
            ts_hi: tb + 2,
            extra_suppress: [prev_best, u32::MAX],
            ..base
        },
        5 => StepRules {
            ts_lo: 0,
            ts_hi: v + 50,
            probe: v + 3,
            extra_suppress: [v + 1, prev_best],
            ..base
        },
        6 => StepRules {
            mask_text: true,
            mask_non_timestamps: true,
            ts_lo: v - 4,
            ..base
        },
        _ => StepRules {
            extra_suppress: [prev_best, eot],
            probe: tb,
            ..base
        },
    }
}

fn random_tokens(n: usize, vocab: usize, rng: &mut StdRng) -> Vec<u32> {
    (0..n).map(|_| rng.random_range(0..vocab as u32)).collect()
}

// ---- 1. Encoder ------------------------------------------------------------------------

fn encoder_matches(geom: Geometry, tag: &str) {
    let t0 = Instant::now();
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    let mut p = pair(geom, s, tag);
    let mut err = Errors::default();
    // Two windows: the second re-encodes over the first's buffers.
    for w in 0..2 {
        let mel = random_mel(&geom.dims, &mut rng);
        p.begin_window(&mel);
        let g = p.gpu.encoder_output().unwrap();
        let e = rel_l2(&g, p.cpu.encoder_output());
        err.encoder = err.encoder.max(e);
        assert!(
            e < REL_L2,
            "{tag} window {w}: encoder output relative L2 {e:.3e} (bound {REL_L2:.0e})"
        );
    }
    eprintln!(
        "[{tag}] encoder rel L2 max {:.2e}; {:.2} s",
        err.encoder,
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn encoder_matches_reference_head_dim_16() {
    encoder_matches(GEOM_A, "encoder-A");
}

#[test]
fn encoder_matches_reference_head_dim_10() {
    encoder_matches(GEOM_B, "encoder-B");
}

/// The encoder replayed (from a model's second window on) writes what it writes through
/// wgpu, bit for bit, over each window's own mel: windows alternate, so a replay that
/// missed its mel (copied in its prologue from a staging buffer, or queued through wgpu)
/// would encode the window before; each way recorded every window and submitted again
/// unrecorded (the kept recording). One program, built once. 32 mels, so that the mel
/// (77 KB) is big enough for the replay to stage it.
#[test]
fn encoder_replayed_equals_encoder_through_wgpu() {
    let tag = "encoder-replay";
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    let geom = Geometry { dims: Dims { n_mels: 32, ..GEOM_A.dims }, ..GEOM_A };
    let mut p = pair_on(own_gpu(), geom, s, tag);
    let mels: Vec<Vec<f32>> = (0..2).map(|_| random_mel(&geom.dims, &mut rng)).collect();
    let g = &mut p.gpu;
    // (the encoder over the mel buffer, which the kept spectrogram's path replaces)
    g.encoder_resident = false;
    g.encoder_replay = false;
    let through: Vec<Vec<f32>> = mels
        .iter()
        .map(|m| {
            g.begin_window(m).unwrap();
            g.encoder_output().unwrap()
        })
        .collect();
    assert_ne!(through[0], through[1], "two windows' encodings");
    g.encoder_replay = true;
    let programs = g.gpu().replay_programs();
    // The mel in the replay's prologue, then through wgpu's staging before the replay;
    // each recorded every window, then kept.
    let rounds = [(true, true), (true, false), (true, false), (false, true), (false, false), (false, false)];
    for (round, (prologue, rerecord)) in rounds.into_iter().enumerate() {
        g.encoder_mel_prologue = prologue;
        g.encoder_rerecord = rerecord;
        for (i, m) in mels.iter().enumerate() {
            g.begin_window(m).unwrap();
            assert!(
                g.encoder_output().unwrap() == through[i],
                "round {round} (mel in the prologue: {prologue}, recorded: {rerecord}), window {i}: the replayed encoder differs from wgpu's"
            );
        }
    }
    let built = g.gpu().replay_programs() - programs;
    assert_eq!(built, if g.gpu().replay_available() { 1 } else { 0 }, "one encoder program, built once");
}

/// A recording's windows through `begin_window_of` (the kept encoder over a window copied
/// from the spectrogram kept time-major in a host buffer, filled a window ahead, two and a
/// half windows of it here so that windows cross its ends) equal the same windows cut out
/// on the host and encoded through wgpu, bit for bit: windows that overlap, start before
/// the kept part, run past the recording's end or lie wholly beyond it, and a second
/// recording whose values took the first one's place (the same address and length:
/// `fresh`). Windows of their own, replayed over the mel buffer, equal them too.
#[test]
fn encoder_windows_of_a_recording_equal_windows_cut_out() {
    let tag = "encoder-resident";
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    let geom = Geometry { dims: Dims { n_mels: 12, ..GEOM_A.dims }, ..GEOM_A };
    let mut p = pair_on(own_gpu(), geom, s, tag);
    let frames = 2 * geom.dims.audio_ctx;
    let n_frames = 7 * frames + 13;
    let spectrogram = |rng: &mut StdRng| engine::audio::mel::LogMel {
        n_mels: geom.dims.n_mels,
        n_frames,
        data: (0..geom.dims.n_mels * n_frames).map(|_| rng.random_range(-1.0f32..1.5)).collect(),
    };
    let mut mel = spectrogram(&mut rng);
    let windows = [
        // (cut short: the program's first two recordings take a window with zeros after it)
        (0, frames - 9),
        (frames - 3, frames),
        (2 * frames - 5, frames / 2),
        (3 * frames + 7, frames),
        (5 * frames + 2, frames),
        (1, frames),
        (n_frames - frames / 3, frames),
        (n_frames + 5, frames),
        (6 * frames, frames),
        // (what the kept part holds now is where the next recording's first window is)
        (0, frames),
    ];
    let g = &mut p.gpu;
    g.resident_frames = 5 * frames / 2;
    g.encoder_resident = true;
    let (mut hits, mut first_hits) = (0, 0);
    let mut programs = 0;
    for round in 0..2 {
        if round == 1 {
            // Another recording in the first one's place.
            let other = spectrogram(&mut rng);
            mel.data.copy_from_slice(&other.data);
        }
        g.encoder_replay = false;
        let wants: Vec<Vec<f32>> = windows
            .iter()
            .map(|&(start, len)| {
                g.begin_window(&mel.window_frames(start, len, frames)).unwrap();
                g.encoder_output().unwrap()
            })
            .collect();
        g.encoder_replay = true;
        if round == 0 {
            programs = g.gpu().replay_programs();
        }
        for (i, (&(start, len), want)) in windows.iter().zip(&wants).enumerate() {
            // Twice: a window the kept part does not hold puts it up for the next.
            for rep in 0..2 {
                let before = g.resident_windows;
                g.begin_window_of(&mel, start, len, i == 0 && rep == 0).unwrap();
                hits += g.resident_windows - before;
                if rep == 0 {
                    first_hits += g.resident_windows - before;
                }
                assert!(
                    g.encoder_output().unwrap() == *want,
                    "round {round}, window {i} (frames {start} + {len} of {n_frames}), call {rep}: the encoder over the kept spectrogram differs"
                );
            }
        }
        // Windows of their own (`begin_window`), cut out: replayed over the mel buffer.
        for (i, (&(start, len), want)) in windows.iter().zip(&wants).enumerate() {
            g.begin_window(&mel.window_frames(start, len, frames)).unwrap();
            assert!(g.encoder_output().unwrap() == *want, "round {round}, window {i} cut out: the replayed encoder over the mel buffer differs");
        }
    }
    let built = g.gpu().replay_programs() - programs;
    assert_eq!(
        built,
        if g.gpu().replay_available() { 2 } else { 0 },
        "one encoder program over the kept spectrogram's windows and one over the mel buffer, each built once"
    );
    // Another size of the kept part (its host buffer made anew), its first windows past
    // the recording's end or cut short by it.
    g.resident_frames = 3 * frames;
    for (i, &(start, len)) in [(n_frames + 5, frames), (n_frames - 7, frames), (n_frames - 7, frames), (n_frames - 2 * frames, frames)].iter().enumerate() {
        g.encoder_replay = false;
        g.begin_window(&mel.window_frames(start, len, frames)).unwrap();
        let want = g.encoder_output().unwrap();
        g.encoder_replay = true;
        g.begin_window_of(&mel, start, len, false).unwrap();
        assert!(g.encoder_output().unwrap() == want, "new size, window {i} (frames {start} + {len} of {n_frames}): the encoder over the kept spectrogram differs");
    }
    if g.gpu().replay_available() {
        assert!(hits >= 10, "windows copied from the kept spectrogram: {hits}");
        // In round 1, windows 1 and 2 lie in the part filled ahead while the window before
        // encoded (in round 0 they record the encoder over the kept spectrogram's GPU copy,
        // whose program is kept from its second window), and window 7 in each round lies
        // past the recording's end (all zeros): 4 held at their first call, 2 without the
        // filling ahead.
        assert!(first_hits >= 4, "windows held at their first call: {first_hits}");
    }
}

// ---- 2. Decoder: prefill and steps -----------------------------------------------------

/// Per window: a prefill, then single steps through every rule set, up to the last
/// position text_ctx allows (which reads the last row of the position table). The first
/// window prefills 5 tokens (GEMV path), the second 11 (GEMM, tiled self-attention when
/// head_dim allows); between them the static suppress list is replaced.
fn decoder_matches(geom: Geometry, tag: &str) {
    let t0 = Instant::now();
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    let mut p = pair(geom, s, tag);
    let mut err = Errors::default();
    let vocab = geom.dims.vocab;
    for (w, prefill) in [5usize, 11].into_iter().enumerate() {
        if w == 1 {
            p.set_suppress(&[0, 3, geom.eot - 1, geom.timestamp_begin, vocab as u32 - 1]);
        }
        let mel = random_mel(&geom.dims, &mut rng);
        p.begin_window(&mel);
        let prompt = random_tokens(prefill, vocab, &mut rng);
        let mut last = p.advance(
            &prompt,
            &rules_for(w, &geom, u32::MAX),
            &format!("{tag} w{w} prefill {prefill}"),
            &mut err,
        );
        for pos in prefill..geom.dims.text_ctx {
            let step = pos - prefill;
            // Feed the reference's greedy choice when there is one (as decoding would),
            // else a random id; now and then a random id anyway, timestamps included.
            let pick = if last.ts_max > last.text_max {
                last.ts_best
            } else {
                last.text_best
            };
            let tok = if pick == u32::MAX || step % 3 == 2 {
                rng.random_range(0..vocab as u32)
            } else {
                pick
            };
            let rules = rules_for(step + w, &geom, last.text_best);
            last = p.advance(
                &[tok],
                &rules,
                &format!("{tag} w{w} position {pos}"),
                &mut err,
            );
        }
    }
    eprintln!(
        "[{tag}] {} steps: logits rel L2 max {:.2e}, score error max {:.2e}, near ties skipped {}; {:.2} s",
        err.steps,
        err.logits,
        err.scores,
        err.ties,
        t0.elapsed().as_secs_f64()
    );
}

#[test]
fn decoder_matches_reference_head_dim_16() {
    decoder_matches(GEOM_A, "decoder-A");
}

/// An odd vocabulary: the embedding table (logits and lookup) is row-major, packed along
/// d, so any vocabulary size works (quantized logits still need an even one).
#[test]
fn decoder_matches_reference_odd_vocab() {
    let geom = Geometry {
        dims: Dims { vocab: 223, ..GEOM_B.dims },
        ..GEOM_B
    };
    decoder_matches(geom, "decoder-odd-vocab");
}

#[test]
fn decoder_matches_reference_head_dim_10() {
    decoder_matches(GEOM_B, "decoder-B");
}

// ---- 3. GPU against itself: prefill = steps; begin_window resets ------------------------

/// Scores and logits of one GPU run: a prefill of `split` tokens, then one token per call.
fn gpu_run(
    m: &mut GpuWhisper,
    mel: &[f32],
    tokens: &[u32],
    split: usize,
    rules: &StepRules,
) -> (StepScores, Vec<f32>) {
    m.begin_window(mel).unwrap();
    let mut s = m.advance(&tokens[..split], rules).unwrap();
    for t in &tokens[split..] {
        s = m.advance(std::slice::from_ref(t), rules).unwrap();
    }
    (s, m.last_logits().unwrap())
}

#[test]
fn prefill_equals_steps_and_begin_window_resets() {
    let tag = "self-consistency";
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    for geom in [GEOM_A, GEOM_B] {
        let mut p = pair(geom, s, tag);
        let rules = rules_for(0, &geom, u32::MAX);
        let mel = random_mel(&geom.dims, &mut rng);
        let other = random_mel(&geom.dims, &mut rng);
        // 10 tokens: a prefill of all 10 runs the GEMM path, the splits below GEMV.
        let tokens = random_tokens(10, geom.dims.vocab, &mut rng);
        let reference = gpu_run(&mut p.gpu, &mel, &tokens, 1, &rules);
        let mut worst = 0f64;
        for split in [10, 4, 7] {
            let (sc, lg) = gpu_run(&mut p.gpu, &mel, &tokens, split, &rules);
            let e = rel_l2(&lg, &reference.1);
            worst = worst.max(e);
            assert!(
                e < REL_L2,
                "prefill {split} + steps vs single steps: logits relative L2 {e:.3e}"
            );
            let mut err = Errors::default();
            // Held to the single-step run as the reference (its logits decide near ties).
            let what = format!("prefill {split} vs single steps");
            p.compare_scores(&sc, &reference.0, &reference.1, &rules, &what, &mut err);
        }
        // Dirty the state with another window and positions, then replay: a new
        // begin_window must start from position 0 with this window's cross K/V.
        p.gpu.begin_window(&other).unwrap();
        p.gpu.advance(&tokens[..6], &rules).unwrap();
        let replay = gpu_run(&mut p.gpu, &mel, &tokens, 1, &rules);
        assert_eq!(
            replay.0, reference.0,
            "replayed scores differ: begin_window did not reset the state"
        );
        assert_eq!(replay.1, reference.1, "replayed logits differ");
        // And the other window really is different (else the replay proves nothing).
        let (_, lg_other) = gpu_run(&mut p.gpu, &other, &tokens, 1, &rules);
        let apart = rel_l2(&lg_other, &reference.1);
        assert!(
            apart > 1e-3,
            "another window gave the same logits ({apart:.2e})"
        );
        // The GPU run is also the reference's (the long prefill included).
        p.cpu.begin_window(&mel).unwrap();
        p.cpu.advance(&tokens, &rules).unwrap();
        let e = rel_l2(&reference.1, p.cpu.last_logits());
        assert!(e < REL_L2, "GPU vs reference after 10 tokens: {e:.3e}");
        eprintln!(
            "[{tag}] head_dim {}: prefill vs steps logits rel L2 max {worst:.2e}; replay bit-identical \
             (another window: {apart:.2e} apart); vs reference {e:.2e}",
            geom.dims.head_dim()
        );
    }
}

/// Speculative decoding's verify pass: the scores at each of k+1 positions equal, bit for
/// bit, those of k+1 single steps (else a near tie could pick another token than plain
/// greedy decoding), and a rollback past rejected drafts leaves the state as if they had
/// never been fed.
#[test]
fn verify_equals_single_steps_bit_for_bit_and_rolls_back() {
    let tag = "verify";
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    let own = own_gpu();
    for geom in [GEOM_A, GEOM_B] {
        let mut p = pair_on(own.clone(), geom, s, tag);
        let mel = random_mel(&geom.dims, &mut rng);
        let prompt = random_tokens(3, geom.dims.vocab, &mut rng);
        // As many positions as a pass takes and the context holds after the prompt.
        let n = MAX_VERIFY.min(geom.dims.text_ctx - prompt.len());
        let tokens = random_tokens(n, geom.dims.vocab, &mut rng);
        let rules: Vec<StepRules> = (0..tokens.len()).map(|i| rules_for(i, &geom, tokens[i])).collect();
        let g = &mut p.gpu;
        // The single steps encoded through wgpu (the reference for everything replayed).
        g.replay = false;
        g.begin_window(&mel).unwrap();
        g.advance(&prompt, &rules_for(0, &geom, 0)).unwrap();
        let single: Vec<(StepScores, Vec<f32>)> =
            tokens.iter().zip(&rules).map(|(t, r)| (g.advance(std::slice::from_ref(t), r).unwrap(), g.last_logits().unwrap())).collect();
        assert_eq!(g.max_verify(), MAX_VERIFY);
        // A pass of the most positions, one past the prompt GEMV's 8 rows, 8, and fewer;
        // replayed through raw Vulkan (where the device allows it: lavapipe does) and
        // encoded through wgpu, each length twice (a replay's second run reuses its
        // program with new parameters; in between, the other way ran the same length).
        let replays = g.gpu().replay_available();
        let vulkan = g.gpu().info.backend == "Vulkan" && std::env::var("VERBATIM_REPLAY").map_or(true, |v| v != "0");
        assert_eq!(replays, vulkan, "replays where the engine opened a Vulkan device itself");
        let programs = g.gpu().replay_programs();
        for k in [n, 9, 8, 5, 1] {
            for replay in [true, false, true, false] {
                g.replay = replay;
                g.begin_window(&mel).unwrap();
                g.advance(&prompt, &rules_for(0, &geom, 0)).unwrap();
                let v = g.verify(&tokens[..k], &rules[..k]).unwrap();
                for i in 0..k {
                    assert_eq!(v[i], single[i].0, "verify of {k} (replayed {replay}): position {i} differs from a single step");
                }
            }
        }
        // One program per pass length (their grids differ), one for the prompt and one for
        // the encoder (replayed from the second window), built once however often they ran.
        let built = g.gpu().replay_programs() - programs;
        assert_eq!(built, if replays { 7 } else { 0 }, "replay programs built for 5 pass lengths, the prompt and the encoder");
        // Every draft kept, then single steps: through wgpu, the first one runs the step the
        // model encoded while the pass ran (for the position after the pass); replayed,
        // each step is recorded when it comes.
        for replay in [false, true] {
            g.replay = replay;
            g.begin_window(&mel).unwrap();
            g.advance(&prompt, &rules_for(0, &geom, 0)).unwrap();
            g.verify(&tokens[..5], &rules[..5]).unwrap();
            for i in 5..tokens.len() {
                let sc = g.advance(&tokens[i..=i], &rules[i]).unwrap();
                assert_eq!(sc, single[i].0, "after a verify pass (replayed {replay}): position {i}");
                assert_eq!(g.last_logits().unwrap(), single[i].1, "after a verify pass (replayed {replay}): logits at {i}");
            }
        }
        // Rejected drafts: feed tokens[0] and three wrong ones, keep one, roll two back,
        // then go on one step at a time: the same scores and logits as never drafting,
        // whether the step the pass encoded ahead is moved back to the rolled-back position
        // by its parameters (`retarget`) or a step is recorded anew, or all is replayed.
        for (replay, retarget) in [(false, true), (false, false), (true, true)] {
            g.replay = replay;
            g.retarget = retarget;
            g.begin_window(&mel).unwrap();
            g.advance(&prompt, &rules_for(0, &geom, 0)).unwrap();
            let wrong = [tokens[1], (tokens[2] + 1) % geom.dims.vocab as u32, tokens[0]];
            let fed = [tokens[0], wrong[0], wrong[1], wrong[2]];
            let v = g.verify(&fed, &rules[..4]).unwrap();
            assert_eq!(&v[..2], &[single[0].0, single[1].0], "the agreeing prefix");
            g.rollback(2).unwrap();
            for i in 2..tokens.len() {
                let sc = g.advance(&tokens[i..=i], &rules[i]).unwrap();
                assert_eq!(sc, single[i].0, "after the rollback (replay {replay}, retarget {retarget}): position {i}");
                assert_eq!(g.last_logits().unwrap(), single[i].1, "after the rollback (replay {replay}, retarget {retarget}): logits at {i}");
                // Each step also rolled back and taken again: the step encoded ahead moves
                // back one position at a time.
                g.rollback(1).unwrap();
                let again = g.advance(&tokens[i..=i], &rules[i]).unwrap();
                assert_eq!(again, single[i].0, "after a rollback of one (replay {replay}, retarget {retarget}): position {i}");
            }
        }
        g.retarget = true;
        // Bad calls are errors, not panics.
        assert!(g.verify(&[], &[]).is_err());
        assert!(g.verify(&tokens, &rules[..2]).is_err());
        assert!(g.verify(&[geom.dims.vocab as u32], &rules[..1]).is_err());
        assert!(g.rollback(10_000).is_err());
        // More positions than the cap: an error; the cap itself only from 1 to MAX_VERIFY.
        g.set_verify_max(2).unwrap();
        assert_eq!(g.max_verify(), 2);
        assert!(g.verify(&tokens[..3], &rules[..3]).is_err());
        assert!(g.set_verify_max(0).is_err() && g.set_verify_max(MAX_VERIFY + 1).is_err());
        assert_eq!(g.max_verify(), 2);
        g.set_verify_max(MAX_VERIFY).unwrap();
        eprintln!("[{tag}] head_dim {}: verify of 1/5/8/9/{n} = single steps bit for bit; rollback exact", geom.dims.head_dim());
    }
}

/// The host's greedy pick (decode::whisper::pick) from a step's scores.
fn host_pick(sc: &StepScores, check_ts_over_text: bool, eot: u32) -> u32 {
    let ts_ok = sc.ts_best != u32::MAX;
    let text_ok = sc.text_best != u32::MAX;
    if ts_ok && ((check_ts_over_text && sc.ts_lse > sc.text_max) || !text_ok || sc.ts_max > sc.text_max) {
        sc.ts_best
    } else if text_ok {
        sc.text_best
    } else {
        eot
    }
}

/// Several decode steps with one readback (the device picks each next token): the same
/// scores, bit for bit, as one `advance` per step fed the same tokens under the same masks,
/// and the picks are what the host's pick makes of those scores; with timestamp rules the
/// device derives each later step's masks from its own picks exactly as TsState does, and
/// reports them. Positions rolled back afterwards are as if never fed.
#[test]
fn greedy_steps_equal_single_steps_bit_for_bit() {
    let tag = "greedy-steps";
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    for geom in [GEOM_A, GEOM_B] {
        let mut p = pair(geom, s, tag);
        let mel = random_mel(&geom.dims, &mut rng);
        let prompt = random_tokens(3, geom.dims.vocab, &mut rng);
        let first = random_tokens(1, geom.dims.vocab, &mut rng)[0];
        let (tb, vocab) = (geom.timestamp_begin, geom.dims.vocab as u32);
        // End-of-text suppressed: a batch's steps after a device-picked eot run empty (their
        // grids zeroed, the decode loop discards them; a_pick_of_eot_gates_off_the_next_step
        // holds that), so with random weights a pick of eot would end the comparison early.
        let rules = StepRules { extra_suppress: [geom.eot, u32::MAX], ..rules_for(0, &geom, 0) };
        let text = tb / 2;
        // Without timestamp rules (every step under `rules`), and with them from states
        // after text, a lone timestamp, a closed pair, and one token (a first timestamp).
        let cases: [(Step, Option<TsState>); 5] = [
            (Step { rules, check_ts_over_text: false }, None),
            (Step { rules, check_ts_over_text: true }, TsState::new(&[tb + 1, text], tb)),
            (Step { rules, check_ts_over_text: true }, TsState::new(&[text, tb + 2], tb)),
            (Step { rules, check_ts_over_text: false }, TsState::new(&[tb + 2, tb + 3], tb)),
            (Step { rules, check_ts_over_text: true }, TsState::new(&[tb + 1], tb)),
        ];
        let g = &mut p.gpu;
        let k = 7;
        for (c, (step, ts)) in cases.iter().enumerate() {
            g.begin_window(&mel).unwrap();
            g.advance(&prompt, &rules).unwrap();
            let out = g.greedy_steps(first, k, step, *ts).unwrap();
            assert_eq!((out.picks.len(), out.scores.len(), out.steps.len()), (k, k, k));
            g.begin_window(&mel).unwrap();
            g.advance(&prompt, &rules).unwrap();
            let (mut t, mut st, mut state) = (first, *step, *ts);
            for i in 0..k {
                if i > 0 {
                    if let Some(s) = state {
                        st = s.step(step.rules, tb, vocab);
                    }
                }
                assert_eq!(out.steps[i], st, "case {c} step {i}: the masks the device used");
                let sc = g.advance(&[t], &st.rules).unwrap();
                assert_eq!(sc, out.scores[i], "case {c}: step {i} of a batch differs from a single step");
                assert_eq!(out.picks[i], host_pick(&sc, st.check_ts_over_text, geom.eot), "case {c} step {i}: the device's pick");
                t = out.picks[i];
                state = state.map(|s| s.push(t, tb));
            }
        }
        let step = Step { rules, check_ts_over_text: false };
        g.begin_window(&mel).unwrap();
        g.advance(&prompt, &rules).unwrap();
        let out = g.greedy_steps(first, k, &step, None).unwrap();
        // Roll three back and feed them again one at a time: the same scores.
        g.begin_window(&mel).unwrap();
        g.advance(&prompt, &rules).unwrap();
        g.greedy_steps(first, k, &step, None).unwrap();
        g.rollback(3).unwrap();
        for i in k - 3..k {
            assert_eq!(g.advance(&[out.picks[i - 1]], &rules).unwrap(), out.scores[i], "after the rollback: step {i}");
        }
        assert!(g.greedy_steps(first, 0, &step, None).is_err());
        assert!(g.greedy_steps(first, geom.dims.text_ctx, &step, None).is_err(), "past the context");
        assert!(g.greedy_steps(geom.dims.vocab as u32, 2, &step, None).is_err());
        eprintln!("[{tag}] head_dim {}: {k} steps per readback = single steps, with and without timestamp rules", geom.dims.head_dim());
    }
}

/// The choice a draft model makes from logits: the best id neither suppressed nor a
/// timestamp when timestamps are off (ties to the lower id).
fn draft_pick(logits: &[f32], suppress: &[u32], geom: &Geometry, timestamps: bool) -> u32 {
    let allowed = |id: usize| !suppress.contains(&(id as u32)) && (timestamps || (id as u32) < geom.timestamp_begin);
    let mut best = None;
    for (id, &v) in logits.iter().enumerate() {
        if allowed(id) && best.is_none_or(|(_, bv)| v > bv) {
            best = Some((id as u32, v));
        }
    }
    best.expect("some id is allowed").0
}

/// `--quant`: a decoder with block-quantized weights keeps the verify pass exact (each row
/// = a single step, bit for bit), and the draft model of the same format and full depth
/// proposes exactly the greedy continuation of that decoder, also after the context
/// diverged from what it drafted (its cached prefix kept, the rest recomputed).
#[test]
fn quantized_decoder_verifies_exactly_and_drafts_its_own_greedy_tokens() {
    use engine::quant::block::BlockFormat;
    let tag = "quant";
    let s = seed(tag);
    let mut rng = StdRng::seed_from_u64(s);
    for (geom, format, timestamps) in [(GEOM_A, BlockFormat::Q8_0, true), (GEOM_B, BlockFormat::Q4_0, false)] {
        let dir = TempDir::new(tag);
        write_synthetic(&dir.0, &geom.dims, DType::F16, s).expect("write the synthetic model");
        let ck = Checkpoint::open(&dir.0).expect("open the synthetic model");
        let mut g = GpuWhisper::load_with(gpu(), &ck, geom.eot, geom.timestamp_begin, Some(format)).expect("load quantized");
        assert_eq!(g.draft(&[1, 2], 3, true).unwrap(), Vec::<u32>::new(), "no draft model yet: no draft");
        g.set_draft(&ck, format, geom.dims.decoder_layers).expect("build the draft model");
        assert!(g.set_draft(&ck, format, geom.dims.decoder_layers + 1).is_err());
        let suppress = vec![geom.eot + 2, geom.timestamp_begin + 1, 3];
        g.set_suppress(&suppress).unwrap();
        let mel = random_mel(&geom.dims, &mut rng);
        let prompt = random_tokens(3, geom.dims.vocab, &mut rng);
        let vocab = geom.dims.vocab as u32;

        // Greedy continuation, one step at a time.
        let greedy_after = |g: &mut GpuWhisper, context: &[u32], n: usize| -> Vec<u32> {
            g.begin_window(&mel).unwrap();
            g.advance(context, &rules_for(0, &geom, 0)).unwrap();
            let mut out = Vec::new();
            for _ in 0..n {
                let t = draft_pick(&g.last_logits().unwrap(), &suppress, &geom, timestamps);
                out.push(t);
                g.advance(&[t], &rules_for(0, &geom, 0)).unwrap();
            }
            out
        };
        let greedy = greedy_after(&mut g, &prompt, 6);

        // Verify = single steps on the quantized decoder.
        let tokens = random_tokens(6, geom.dims.vocab, &mut rng);
        let rules: Vec<StepRules> = (0..tokens.len()).map(|i| rules_for(i, &geom, tokens[i])).collect();
        g.begin_window(&mel).unwrap();
        g.advance(&prompt, &rules_for(0, &geom, 0)).unwrap();
        let single: Vec<StepScores> = tokens.iter().zip(&rules).map(|(t, r)| g.advance(std::slice::from_ref(t), r).unwrap()).collect();
        g.begin_window(&mel).unwrap();
        g.advance(&prompt, &rules_for(0, &geom, 0)).unwrap();
        assert_eq!(g.verify(&tokens, &rules).unwrap(), single, "{format:?}: verify differs from single steps");

        // The draft model from the prompt: the greedy tokens.
        g.begin_window(&mel).unwrap();
        let d = g.draft(&prompt, 5, timestamps).unwrap();
        assert_eq!(d, greedy[..5], "{format:?}: draft from the prompt");
        // The context goes on with two of them and a token of its own.
        let other = (greedy[2] + 1) % vocab;
        let context: Vec<u32> = prompt.iter().chain(&greedy[..2]).chain([&other]).copied().collect();
        let want = greedy_after(&mut g, &context, 3);
        g.begin_window(&mel).unwrap();
        // (begin_window dropped the draft's cache: rebuild it as before the divergence.)
        g.draft(&prompt, 5, timestamps).unwrap();
        assert_eq!(g.draft(&context, 3, timestamps).unwrap(), want, "{format:?}: draft after a divergent token");
        // Bad calls are errors or empty drafts, never panics.
        assert!(g.draft(&[vocab], 2, timestamps).is_err());
        assert_eq!(g.draft(&context, 0, timestamps).unwrap(), Vec::<u32>::new());
        let full = vec![1; geom.dims.text_ctx];
        assert!(g.draft(&full, 4, timestamps).unwrap().is_empty(), "no room left in the context");
        eprintln!("[{tag}] {format:?}: verify exact; draft = greedy ({d:?})");
    }
}

// ---- 4. Errors are values --------------------------------------------------------------

#[test]
fn errors_are_values() {
    let geom = GEOM_B;
    let (dims, ctx) = (geom.dims, geom.dims.text_ctx);
    let (s, mut rng, mut p) = seeded_pair(geom, "errors");
    let rules = rules_for(0, &geom, u32::MAX);
    let invalid = |r: Result<StepScores, Error>, what: &str| match r {
        Err(Error::Invalid(msg)) => eprintln!("  {what}: {msg}"),
        other => panic!("{what}: expected Error::Invalid, got {other:?}"),
    };

    invalid(p.gpu.advance(&[1], &rules), "advance before begin_window");
    let mel = random_mel(&dims, &mut rng);
    for bad in [
        &mel[1..],
        &[][..],
        &[mel.clone(), vec![0.5]].concat()[..],
        &vec![0.5; dims.n_mels * 3000],
    ] {
        match p.gpu.begin_window(bad) {
            Err(Error::Invalid(msg)) => eprintln!("  mel of {} values: {msg}", bad.len()),
            other => panic!(
                "a mel of {} values: expected Error::Invalid, got {other:?}",
                bad.len()
            ),
        }
    }
    invalid(
        p.gpu.advance(&[1], &rules),
        "advance after a refused window",
    );

    p.begin_window(&mel);
    let mut err = Errors::default();
    invalid(p.gpu.advance(&[], &rules), "no tokens");
    invalid(
        p.gpu.advance(&[dims.vocab as u32], &rules),
        "token id = vocab",
    );
    invalid(
        p.gpu.advance(&[3, u32::MAX, 4], &rules),
        "token id u32::MAX inside a prefill",
    );
    invalid(
        p.gpu.advance(&vec![1; ctx + 1], &rules),
        "a prefill beyond text_ctx",
    );
    // None of that moved the state: the next call is still position 0, as the reference's.
    p.advance(&[1, 2, 3], &rules, "after refused calls", &mut err);
    p.advance(&vec![4; ctx - 4], &rules, "up to text_ctx - 1", &mut err);
    invalid(
        p.gpu.advance(&[5, 6], &rules),
        "two positions where one is left",
    );
    p.advance(&[5], &rules, "the last position", &mut err);
    invalid(p.gpu.advance(&[6], &rules), "one position beyond text_ctx");
    // A new window makes room again.
    p.begin_window(&mel);
    p.advance(&[6], &rules, "after the full window", &mut err);

    // A geometry the kernels cannot pack (an odd FFN width: f16 pairs along output rows) is
    // refused at load with an error, not a panic or a wrong result.
    let odd = Geometry {
        dims: Dims { ffn: 37, ..dims },
        ..geom
    };
    let dir = TempDir::new("errors-odd-ffn");
    write_synthetic(&dir.0, &odd.dims, DType::F16, s).unwrap();
    let ck = Checkpoint::open(&dir.0).unwrap();
    match GpuWhisper::load(gpu(), &ck, odd.eot, odd.timestamp_begin) {
        Err(e) => eprintln!("  odd ffn: {e}"),
        Ok(_) => panic!("a model with an odd FFN width loaded"),
    }
}

// ---- 5. The real model, cropped --------------------------------------------------------

/// tiny.en's vocabulary layout.
const EN_EOT: u32 = 50256;
const EN_SOT: u32 = 50257;
const EN_SOT_PREV: u32 = 50360;
const EN_NO_SPEECH: u32 = 50361;
const EN_TIMESTAMP_BEGIN: u32 = 50363;

/// Copy `src`'s model with the position tables cut to `audio_ctx` and `text_ctx` rows:
/// the same weights, a shorter window. `Checkpoint::open` derives the dims from the shapes.
fn write_cropped(src: &Path, dst: &Path, audio_ctx: usize, text_ctx: usize) {
    let file = Ct2File::open(&src.join("model.bin")).expect("open the real model.bin");
    let mut vars = Vec::new();
    for name in file.names() {
        let v = file.get(name).unwrap();
        let mut dims = v.dims.to_vec();
        let rows = match name {
            "encoder/position_encodings/encodings" => Some(audio_ctx),
            "decoder/position_encodings/encodings" => Some(text_ctx),
            _ => None,
        };
        let bytes = match rows {
            Some(r) => {
                assert!(r <= dims[0], "{name} has only {} rows", dims[0]);
                let row = v.bytes.len() / dims[0];
                dims[0] = r;
                v.bytes[..r * row].to_vec()
            }
            None => v.bytes.to_vec(),
        };
        vars.push((name.to_string(), dims, v.dtype, bytes));
    }
    let aliases: Vec<(String, String)> = file
        .aliases()
        .map(|(a, t)| (a.to_string(), t.to_string()))
        .collect();
    write_ct2(
        &dst.join("model.bin"),
        file.spec(),
        file.revision(),
        &vars,
        &aliases,
    )
    .expect("write the cropped model");
    std::fs::copy(src.join("config.json"), dst.join("config.json")).expect("copy config.json");
}

/// The first `2·audio_ctx` frames of jfk.wav's log-mel (the speech starts at ~0.3 s).
fn jfk_mel(n_mels: usize, frames: usize) -> Vec<f32> {
    let wav = Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/jfk.wav");
    let pcm = engine::audio::decode_wav_file(&wav)
        .expect("decode jfk.wav")
        .to_mono_16k()
        .unwrap();
    let mel = engine::audio::mel::log_mel_spectrogram(&pcm, n_mels, 160);
    assert!(mel.n_frames >= frames);
    let mut out = Vec::with_capacity(n_mels * frames);
    for m in 0..n_mels {
        out.extend_from_slice(&mel.data[m * mel.n_frames..m * mel.n_frames + frames]);
    }
    out
}

#[test]
fn real_model_cropped_matches_reference() {
    let src = default_model_dir();
    if !src.join("model.bin").is_file() {
        eprintln!(
            "SKIPPED: no model at {} (run packaging/fetch-model.sh)",
            src.display()
        );
        return;
    }
    let tag = "real-cropped";
    // 75 encoder positions = 1.5 s of audio (not a multiple of the GEMM's 64-row tiles);
    // 32 decoder positions. On lavapipe the GPU encoder takes ~4 s of this test's ~10 s
    // (its GEMM runs ~0.4 GFLOP/s there), the CPU one ~1.5 s.
    let (audio_ctx, text_ctx) = (75, 32);
    let t0 = Instant::now();
    let dir = TempDir::new(tag);
    write_cropped(&src, &dir.0, audio_ctx, text_ctx);
    let ck = Checkpoint::open(&dir.0).expect("open the cropped model");
    assert_eq!(
        (ck.dims.audio_ctx, ck.dims.text_ctx, ck.dims.vocab),
        (audio_ctx, text_ctx, 51864)
    );
    // Both sides must read identical weights: the GPU takes f16, so the file must store f16.
    let dtype = ck.file().get("decoder/embeddings/weight").unwrap().dtype;
    assert_eq!(
        dtype,
        DType::F16,
        "the comparison assumes f16 weights (else the GPU rounds them)"
    );
    let geom = Geometry {
        dims: ck.dims,
        eot: EN_EOT,
        timestamp_begin: EN_TIMESTAMP_BEGIN,
    };
    let mut p = Pair {
        geom,
        gpu: GpuWhisper::load(gpu(), &ck, EN_EOT, EN_TIMESTAMP_BEGIN).expect("load on the GPU"),
        cpu: CpuWhisper::from_checkpoint(&ck).expect("load on the CPU"),
        suppress: Vec::new(),
        _dir: dir,
    };
    p.cpu.set_vocab_layout(EN_EOT, EN_TIMESTAMP_BEGIN).unwrap();
    p.set_suppress(&ck.config.suppress_ids);
    let t_load = t0.elapsed();

    let mel = jfk_mel(ck.dims.n_mels, 2 * audio_ctx);
    let t1 = Instant::now();
    p.gpu.begin_window(&mel).expect("GPU begin_window");
    let t_gpu_enc = t1.elapsed();
    p.cpu.begin_window(&mel).expect("CPU begin_window");
    let t_enc = t1.elapsed();
    let mut err = Errors {
        encoder: rel_l2(&p.gpu.encoder_output().unwrap(), p.cpu.encoder_output()),
        ..Default::default()
    };
    assert!(
        err.encoder < REL_L2,
        "real encoder output relative L2 {:.3e}",
        err.encoder
    );

    // A previous-text prompt (<|startofprev|> " And" " so" " my" <|startoftranscript|>) in
    // one prefill, then greedy steps with Whisper's rules: a timestamp first (with " " and
    // eot suppressed, as suppress_blank does), the reference's choice fed back to both.
    let prompt = [EN_SOT_PREV, 843, 523, 616, EN_SOT];
    let first = StepRules {
        mask_text: false,
        mask_non_timestamps: true,
        ts_lo: EN_TIMESTAMP_BEGIN,
        ts_hi: EN_TIMESTAMP_BEGIN + 51,
        extra_suppress: [220, EN_EOT],
        probe: EN_NO_SPEECH,
    };
    let t2 = Instant::now();
    let mut last = p.advance(&prompt, &first, "real prefill", &mut err);
    let mut chosen = Vec::new();
    for step in 0..8 {
        let tok = if last.ts_max > last.text_max {
            last.ts_best
        } else {
            last.text_best
        };
        chosen.push(tok);
        let rules = StepRules {
            mask_non_timestamps: false,
            // After a lone timestamp, text is masked (Whisper's pairing rule), as here every
            // third step, to exercise the mask on the real vocabulary.
            mask_text: step % 3 == 2,
            extra_suppress: [u32::MAX; 2],
            ..first
        };
        last = p.advance(&[tok], &rules, &format!("real step {step}"), &mut err);
    }
    eprintln!(
        "[{tag}] tokens {chosen:?}; encoder rel L2 {:.2e}, logits rel L2 max {:.2e}, score error max {:.2e}, \
         near ties {}; load {:.1} s, encoders {:.1} s (GPU {:.1} s), decoders {:.1} s, total {:.1} s",
        err.encoder,
        err.logits,
        err.scores,
        err.ties,
        t_load.as_secs_f64(),
        t_enc.as_secs_f64(),
        t_gpu_enc.as_secs_f64(),
        t2.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
}

/// `GpuWhisper::leave_out` (`verbatim bench --step-parts`): each named part of a decode step
/// drops its own dispatches and only them (together the parts are the whole step), leaving a
/// part out changes what the step computes, and `None` gives the full step back bit for bit.
#[test]
fn a_part_left_out_drops_its_dispatches_and_the_parts_make_the_step() {
    let geom = GEOM_A;
    let (_, mut rng, mut p) = seeded_pair(geom, "leave-out");
    let rules = rules_for(0, &geom, u32::MAX);
    let mel = random_mel(&geom.dims, &mut rng);
    let tokens = random_tokens(4, geom.dims.vocab, &mut rng);
    // Dispatches of the last single step and its scores, with `part` left out.
    let mut step = |part: Option<&'static str>| -> (u64, StepScores) {
        p.gpu.leave_out = part;
        p.gpu.begin_window(&mel).unwrap();
        p.gpu.advance(&tokens[..3], &rules).unwrap();
        let before = p.gpu.profile.total_dispatches();
        let sc = p.gpu.advance(&tokens[3..], &rules).unwrap();
        (p.gpu.profile.total_dispatches() - before, sc)
    };
    let (all, full) = step(None);
    assert!(all > 10, "{all} dispatches a step");
    let mut dropped = 0;
    for part in engine::models::whisper::gpu::DECODE_PARTS {
        if part == "logits" || part == "final_norm" {
            // What the left-out part would have overwritten must differ from the full
            // step's: the logits of a step without its feed-forward blocks.
            step(Some("ffn"));
        }
        let (n, sc) = step(Some(part));
        // fc1 + fc2 and ffn (ffn_decode) are alternatives: one side records nothing; so is
        // final_norm where the last ffn_decode's sum writes the final norm.
        if n == all && matches!(part, "fc1" | "fc2" | "final_norm") {
            continue;
        }
        assert!(n < all, "{part}: {n} of {all} dispatches left");
        dropped += all - n;
        if part == "logits" || part == "final_norm" {
            assert_ne!(sc, full, "{part} left out, the same scores");
        }
    }
    assert_eq!(dropped, all, "the parts together are the whole step");
    let (again, back) = step(None);
    assert_eq!((again, back), (all, full), "nothing left out: the full step again");
}
