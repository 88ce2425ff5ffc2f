//! Nemotron-H speed harness: the GPU frame (`NemotronGpu` / `NemotronContext`) on synthetic
//! weights at the Nemotron 3 Nano 30B-A3B geometry, routed experts in q4tp or q8_2f.
//!
//! ```text
//! cargo run --release -p verbatim-engine --bin nemotron-bench -- [--small] [--experts q4tp|q8_2f]
//!     [--batches B] [--decode N] [--prompt P] [--reps R] [--mib M] [--seed S]
//! ```
//!
//! What it measures (all wall clock around the frame's public calls, so the host's part —
//! recording, one submit + wait per pass, reading the logits back — is included exactly as
//! a caller pays it):
//! - **prefill** of P (420) token positions in passes of 64, each batch in a fresh context;
//! - **decode**: N greedy steps per batch (decode + the host's argmax of the logits);
//! - **verify** of k = 1..8 positions (a snapshotting pass), rolled back after each;
//! - the **copy ceiling** of this run: dst = src over M MiB (the kernel lab's copy kernel),
//!   and a plain buffer-to-buffer copy;
//! - the frame's f32 **linear kernel alone** at one row on each f32 weight shape (what a
//!   decode step spends there);
//! - **bytes per decode token**: the weights a decode pass actually reads (embedding row,
//!   norms, every Mamba and attention projection, router, shared expert, the top-k routed
//!   experts, the LM head) plus the Mamba state and KV rows it reads and writes; GB/s and %
//!   of the copy ceiling.
//!
//! Habits (the seed's): a time is the minimum over B timed batches after one discarded
//! warm-up batch (bind groups are built then), with the spread (worst / best); guards check
//! that the logits are finite and that after a rollback the same token decoded twice gives
//! bit-identical logits while another token gives different ones (a timed no-op would not).

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use engine::gpu::{Access, Gpu, GpuOptions};
use engine::kernels::nemotron::{F32Weights, LinearOps, NemotronKernels, RowsF32};
use engine::models::nemotron_h::gpu::{argmax, NemotronGpu, VERIFY_MAX};
use engine::models::nemotron_h::synthetic::{self, BankMaker, Geometry};
use engine::models::nemotron_h::{Config, LayerKind};
use engine::quant::QuantFormat;
use wgpu::util::DeviceExt;

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

const COPY: &str = include_str!("kernel_lab/copy.wgsl");
/// Grid row the copy kernel folds its workgroups with.
const GRID_ROW: u32 = 32768;
/// Positions of one prefill pass (the frame's `PASS_MAX`).
const PASS: usize = 64;

struct Args {
    small: bool,
    format: QuantFormat,
    batches: u32,
    decode: u32,
    prompt: u32,
    reps: u32,
    mib: u64,
    seed: u64,
}

const USAGE: &str =
    "usage: nemotron-bench [--small] [--experts q4tp|q8_2f] [--batches B] [--decode N] \
[--prompt P] [--reps R] [--mib M] [--seed S]
  --small      a small geometry (seconds on lavapipe: prompt ≤ 80, ≤ 2 batches, 1 rep);
               default: Nemotron 3 Nano 30B-A3B
  --experts    routed expert format (default q4tp)
  --batches B  timed batches after one warm-up (default 5)
  --decode N   decode steps per batch (default 32; 4 with --small)
  --prompt P   prefill positions (default 420)
  --reps R     verify passes per k per batch (default 2)
  --mib M      copy-ceiling buffer in MiB (default 1024; 32 with --small)
  --seed S     weight seed (default 1)";

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        small: false,
        format: QuantFormat::Q4tp,
        batches: 5,
        decode: 0,
        prompt: 420,
        reps: 2,
        mib: 0,
        seed: 1,
    };
    fn value<T: std::str::FromStr>(
        it: &mut impl Iterator<Item = String>,
        flag: &str,
    ) -> Result<T, String> {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse()
            .map_err(|_| format!("{flag}: `{v}` is not a valid value"))
    }
    while let Some(f) = it.next() {
        match f.as_str() {
            "--small" => a.small = true,
            "--experts" => {
                a.format = match value::<String>(&mut it, &f)?.as_str() {
                    "q4tp" => QuantFormat::Q4tp,
                    "q8_2f" => QuantFormat::Q8_2f,
                    o => return Err(format!("--experts: `{o}` (q4tp or q8_2f)")),
                }
            }
            "--batches" => a.batches = value(&mut it, &f)?,
            "--decode" => a.decode = value(&mut it, &f)?,
            "--prompt" => a.prompt = value(&mut it, &f)?,
            "--reps" => a.reps = value(&mut it, &f)?,
            "--mib" => a.mib = value(&mut it, &f)?,
            "--seed" => a.seed = value(&mut it, &f)?,
            "-h" | "--help" => return Err(USAGE.into()),
            o => return Err(format!("unknown argument `{o}`\n{USAGE}")),
        }
    }
    if a.decode == 0 {
        a.decode = if a.small { 4 } else { 32 };
    }
    if a.small {
        // Seconds on lavapipe: two passes of prefill, two timed batches.
        a.prompt = a.prompt.min(80);
        a.batches = a.batches.min(2);
        a.reps = 1;
    }
    if a.mib == 0 {
        a.mib = if a.small { 32 } else { 1024 };
    }
    if a.batches == 0 || a.reps == 0 || a.prompt == 0 {
        return Err("--batches, --reps and --prompt must be at least 1".into());
    }
    Ok(a)
}

/// Best and worst of the timed batches (seconds per item).
#[derive(Clone, Copy)]
struct Timing {
    best: f64,
    worst: f64,
}

impl Timing {
    fn of(v: &[f64]) -> Timing {
        Timing {
            best: v.iter().copied().fold(f64::INFINITY, f64::min),
            worst: v.iter().copied().fold(0.0, f64::max),
        }
    }
    fn spread(&self) -> f64 {
        self.worst / self.best
    }
}

/// What a decode pass reads and writes, by part (bytes).
#[derive(Default)]
struct DecodeBytes {
    mamba: u64,
    attention: u64,
    moe_dense: u64,
    experts: u64,
    head: u64,
    state: u64,
    other: u64,
}

impl DecodeBytes {
    fn total(&self) -> u64 {
        self.mamba
            + self.attention
            + self.moe_dense
            + self.experts
            + self.head
            + self.state
            + self.other
    }
}

/// Bytes a decode pass at KV length `pos` moves: every f32 weight once, the top-k experts'
/// quantized matrices, the Mamba ring and state (read + written), the KV rows read.
fn decode_bytes(c: &Config, expert: (u64, u64), pos: u64) -> DecodeBytes {
    let f = 4u64;
    let h = c.hidden_size as u64;
    let m = &c.mamba;
    let a = &c.attention;
    let e = &c.moe;
    let mut b = DecodeBytes {
        head: c.vocab_size as u64 * h * f,
        other: h * f * 2, // embedding row, final norm
        ..Default::default()
    };
    for k in &c.layers {
        b.other += h * f; // the block norm
        match k {
            LayerKind::Mamba => {
                let (rows, inner, cd) = (
                    m.in_proj_rows() as u64,
                    m.inner() as u64,
                    m.conv_dim() as u64,
                );
                b.mamba +=
                    (rows * h + h * inner + cd * 4 + cd + inner + 3 * m.num_heads as u64) * f;
                b.state += 2 * (m.conv_state_len() + m.ssm_state_len()) as u64 * f;
            }
            LayerKind::Attention => {
                let (qw, kvw) = (
                    (a.num_heads * a.head_dim) as u64,
                    (a.num_kv_heads * a.head_dim) as u64,
                );
                b.attention += (2 * qw * h + 2 * kvw * h) * f;
                b.state += 2 * (pos + 1) * kvw * f;
            }
            LayerKind::Moe => {
                let (ne, s) = (e.n_routed_experts as u64, e.shared_intermediate_size as u64);
                b.moe_dense += (ne * h + ne + 2 * s * h) * f;
                b.experts += e.top_k as u64 * (expert.0 + expert.1);
            }
            LayerKind::Mlp => b.moe_dense += 2 * c.mlp_intermediate_size as u64 * h * f,
        }
    }
    b
}

/// Dispatches of one pass, as the frame's pass records them: embed; per layer the add+norm
/// and Mamba 5 (in_proj, conv, scan, gated norm, out_proj), attention 6 (q, k, v, split
/// attention + merge, o), MoE 7 (router, top-k, lists, expert up, down, shared up, down),
/// MLP 2; final add+norm, head (+ argmax for verify).
fn dispatches(c: &Config, verify: bool) -> u64 {
    let per = |k: &LayerKind| match k {
        LayerKind::Mamba => 5,
        LayerKind::Attention => 6,
        LayerKind::Moe => 7,
        LayerKind::Mlp => 2,
    };
    1 + c.layers.iter().map(|k| 1 + per(k)).sum::<u64>() + 2 + verify as u64
}

/// Weight elements a position uses (f32 weights + its top-k experts): 2× this is its FLOPs.
fn active_params(c: &Config) -> u64 {
    let d = decode_bytes(c, (0, 0), 0);
    let e = &c.moe;
    let experts = c.layers.iter().filter(|k| **k == LayerKind::Moe).count() as u64
        * e.top_k as u64
        * 2
        * (e.intermediate_size * c.hidden_size) as u64;
    (d.mamba + d.attention + d.moe_dense + d.head) / 4 + experts
}

/// The copy ceiling: `copy.wgsl` (dst = src, 16-byte loads) over `bytes`, `reps` copies per
/// batch (wall clock, and GPU timestamps around the pass), and a buffer-to-buffer copy;
/// bytes/s counting read + write, as rates (best = highest). Checks the copy.
fn copy_ceiling(
    g: &Gpu,
    bytes: u64,
    reps: u32,
    batches: u32,
) -> BenchResult<(Timing, Option<Timing>, Timing)> {
    let n = bytes / 16;
    let src = g.buffer("copy src", bytes)?;
    let dst = g.buffer("copy dst", bytes)?;
    let seed = 0x5eed_1234u32;
    let params = g
        .device
        .create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("copy params"),
            contents: bytemuck::cast_slice(&[n as u32, GRID_ROW, seed, 0]),
            usage: wgpu::BufferUsages::UNIFORM,
        });
    let bind = |k: &engine::gpu::Kernel, a: &wgpu::Buffer, b: &wgpu::Buffer| {
        g.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.name),
            layout: &k.layout,
            entries: &[
                wgpu::BindGroupEntry {
                    binding: 0,
                    resource: params.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: a.as_entire_binding(),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: b.as_entire_binding(),
                },
            ],
        })
    };
    let groups = n.div_ceil(256);
    let grid = if groups <= GRID_ROW as u64 {
        [groups as u32, 1]
    } else {
        [GRID_ROW, groups.div_ceil(GRID_ROW as u64) as u32]
    };
    let fill = g.kernel_entry(
        "bench.fill",
        COPY,
        "fill",
        &[Access::Read, Access::ReadWrite],
    )?;
    let copy = g.kernel("bench.copy", COPY, &[Access::Read, Access::ReadWrite])?;
    let qs = g.info.timestamps.then(|| {
        g.device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("copy timestamps"),
            ty: wgpu::QueryType::Timestamp,
            count: 2,
        })
    });
    let resolve = g.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("copy timestamps"),
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let period = g.queue.get_timestamp_period() as f64 * 1e-9;
    // (wall seconds, GPU seconds from timestamps around the pass when the adapter has them).
    let run = |k: &engine::gpu::Kernel,
               bg: &wgpu::BindGroup,
               times: u32|
     -> BenchResult<(f64, Option<f64>)> {
        let mut enc = g.device.create_command_encoder(&Default::default());
        {
            let tw = qs.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                query_set: q,
                beginning_of_pass_write_index: Some(0),
                end_of_pass_write_index: Some(1),
            });
            let mut p = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(k.name),
                timestamp_writes: tw,
            });
            for _ in 0..times {
                p.set_pipeline(k.pipeline());
                p.set_bind_group(0, bg, &[]);
                p.dispatch_workgroups(grid[0], grid[1], 1);
            }
        }
        if let Some(q) = &qs {
            enc.resolve_query_set(q, 0..2, &resolve, 0);
        }
        let cmd = enc.finish();
        let t0 = Instant::now();
        g.queue.submit([cmd]);
        g.wait()?;
        let wall = t0.elapsed().as_secs_f64();
        let gpu_t = if qs.is_some() {
            let t: Vec<u64> = bytemuck::pod_collect_to_vec(&g.read(&resolve, 0, 16)?);
            (t[1] > t[0]).then(|| (t[1] - t[0]) as f64 * period)
        } else {
            None
        };
        Ok((wall, gpu_t))
    };
    // The fill writes its read-write binding: src there.
    run(&fill, &bind(&fill, &dst, &src), 1)?;
    g.fill_u32(&dst, 0);
    let bg = bind(&copy, &src, &dst);
    // The first timed work of the run: the GPU is kept busy with the copy until its clock
    // has settled (an idle GPU climbs from a low clock; engine::gpu::warm_up). Not on a CPU
    // adapter, which has no such clock.
    if !g.info.is_cpu() {
        let w = engine::gpu::warm_up::warm_up(|| run(&copy, &bg, reps).map(|_| ()))?;
        println!("warm-up: {}", w.describe("copy batch"));
    }
    let (mut k, mut kg) = (Vec::new(), Vec::new());
    for b in 0..=batches + 2 {
        let (w, gt) = run(&copy, &bg, reps)?;
        if b > 2 {
            k.push(2.0 * bytes as f64 / (w / reps as f64));
            if let Some(gt) = gt {
                kg.push(2.0 * bytes as f64 / (gt / reps as f64));
            }
        }
    }
    // Guard: the copy copied (the first and last 4 KiB against the fill's pattern).
    let span = n.min(256);
    for start in [0, n - span] {
        let got = g.read_u32(&dst, start * 4, (span * 4) as usize)?;
        for (j, v) in got.chunks(4).enumerate() {
            let h = ((start + j as u64) as u32 ^ seed).wrapping_mul(2654435761);
            if v != [h, h ^ 0x9e37_79b9, h.wrapping_add(1), !h] {
                return Err("the copy kernel did not copy (guard)".into());
            }
        }
    }
    let mut c = Vec::new();
    for b in 0..=batches {
        let mut enc = g.device.create_command_encoder(&Default::default());
        for _ in 0..reps {
            enc.copy_buffer_to_buffer(&src, 0, &dst, 0, bytes);
        }
        let cmd = enc.finish();
        let t0 = Instant::now();
        g.queue.submit([cmd]);
        g.wait()?;
        if b > 0 {
            c.push(2.0 * bytes as f64 / (t0.elapsed().as_secs_f64() / reps as f64));
        }
    }
    // Rates: best is the highest; Timing keeps (best, worst) as rates here.
    let rate = |v: &[f64]| Timing {
        best: v.iter().copied().fold(0.0, f64::max),
        worst: v.iter().copied().fold(f64::INFINITY, f64::min),
    };
    Ok((rate(&k), (!kg.is_empty()).then(|| rate(&kg)), rate(&c)))
}

/// One f32 linear shape of a decode step, timed alone.
struct LinProbe {
    name: &'static str,
    n: u32,
    k: u32,
    per_token: u32,
    bytes: u64,
    t: Timing,
}

/// The frame's f32 `linear` kernel at one row (a decode step) on each f32 weight shape of
/// the model, alone: R dispatches in one submission (wall clock around submit + wait, the
/// same clock as the decode), min over batches. The weights are zeros (the kernel's speed
/// does not depend on values).
fn probe_linear(g: &Gpu, c: &Config, batches: u32, small: bool) -> BenchResult<Vec<LinProbe>> {
    let kern = NemotronKernels::load(g)?;
    let h = c.hidden_size as u32;
    let (m, at, e) = (&c.mamba, &c.attention, &c.moe);
    let count = |k: LayerKind| c.layers.iter().filter(|x| **x == k).count() as u32;
    let (nm, na, ne) = (
        count(LayerKind::Mamba),
        count(LayerKind::Attention),
        count(LayerKind::Moe),
    );
    let (qw, kvw) = (
        (at.num_heads * at.head_dim) as u32,
        (at.num_kv_heads * at.head_dim) as u32,
    );
    let s = e.shared_intermediate_size as u32;
    let shapes = [
        ("Mamba in_proj", m.in_proj_rows() as u32, h, nm),
        ("Mamba out_proj", h, m.inner() as u32, nm),
        ("attention q", qw, h, na),
        ("attention k, v", kvw, h, 2 * na),
        ("attention o", h, qw, na),
        ("router", e.n_routed_experts as u32, h, ne),
        ("shared up", s, h, ne),
        ("shared down", h, s, ne),
        ("LM head", c.vocab_size as u32, h, 1),
    ];
    let mut out = Vec::new();
    for (name, n, k, per_token) in shapes {
        if per_token == 0 {
            continue;
        }
        let bytes = n as u64 * k as u64 * 4;
        let w = F32Weights {
            buf: g.buffer(name, bytes)?,
            n,
            k,
            experts: 1,
        };
        let x = g.buffer("probe x", k as u64 * 4)?;
        let y = g.buffer("probe y", n as u64 * 4)?;
        let reps = if small {
            2
        } else {
            (8u64 << 30).div_ceil(bytes).clamp(4, 64) as u32
        };
        let mut ts = Vec::new();
        for b in 0..=batches {
            let mut rec = g.recorder();
            for _ in 0..reps {
                kern.linear(
                    &mut rec,
                    RowsF32::new(&x, k),
                    1,
                    &w,
                    None,
                    RowsF32::new(&y, n),
                    LinearOps::default(),
                )?;
            }
            let t0 = Instant::now();
            rec.submit(None)?;
            g.wait()?;
            if b > 0 {
                ts.push(t0.elapsed().as_secs_f64() / reps as f64);
            }
        }
        out.push(LinProbe {
            name,
            n,
            k,
            per_token,
            bytes,
            t: Timing::of(&ts),
        });
    }
    Ok(out)
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

fn mb(b: u64) -> String {
    format!("{:.1} MB", b as f64 / 1e6)
}

fn run(a: &Args) -> BenchResult<bool> {
    let t_all = Instant::now();
    let gpu = Arc::new(Gpu::new(&GpuOptions::default())?);
    let g: &Gpu = &gpu;
    let info = &g.info;
    let lim = g.device.limits();
    println!(
        "adapter: {} ({}, {}), driver {}",
        info.name, info.backend, info.device_type, info.driver
    );
    println!(
        "limits: storage binding {} MiB, buffer {} MiB",
        lim.max_storage_buffer_binding_size >> 20,
        lim.max_buffer_size >> 20
    );
    let geo = if a.small {
        Geometry::small()
    } else {
        Geometry::nano_30b_a3b()
    };
    let c = synthetic::config(&geo)?;
    let (h, v) = (c.hidden_size, c.vocab_size);
    println!(
        "geometry: {} — hidden {h}, {} layers {}, attention {}/{}×{}, Mamba {}×{} in {} groups state {}, \
         {} experts top-{} of {} + shared {}, vocab {v}; experts {}",
        if a.small { "small" } else { "Nemotron 3 Nano 30B-A3B" },
        c.layers.len(),
        c.pattern(),
        c.attention.num_heads,
        c.attention.num_kv_heads,
        c.attention.head_dim,
        c.mamba.num_heads,
        c.mamba.head_dim,
        c.mamba.n_groups,
        c.mamba.state_size,
        c.moe.n_routed_experts,
        c.moe.top_k,
        c.moe.intermediate_size,
        c.moe.shared_intermediate_size,
        a.format.name(),
    );
    // The f32 weights one binding must hold (the frame keeps each in one buffer).
    let cap = lim.max_storage_buffer_binding_size.min(lim.max_buffer_size);
    let big = [
        ("embeddings / LM head", (v * h * 4) as u64),
        ("Mamba in_proj", (c.mamba.in_proj_rows() * h * 4) as u64),
        (
            "shared expert up",
            (c.moe.shared_intermediate_size * h * 4) as u64,
        ),
        (
            "attention q",
            (c.attention.num_heads * c.attention.head_dim * h * 4) as u64,
        ),
    ];
    for (what, bytes) in big {
        if bytes > cap {
            return Err(format!(
                "{what} takes {bytes} bytes in f32; the adapter binds at most {cap} in one buffer \
                 (the frame would have to split it)"
            )
            .into());
        }
    }

    // Weights.
    let t0 = Instant::now();
    let model = synthetic::model(&c, a.seed)?;
    let t_gen = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let maker = BankMaker::new(g, &c, a.format, 8, a.seed ^ 0xe4)?;
    let t_tmpl = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let m = NemotronGpu::from_model_with_banks(gpu.clone(), &model, &mut |li| maker.make(li))?;
    drop(model);
    g.wait()?;
    let t_up = t0.elapsed().as_secs_f64();
    let ex = maker.expert_bytes();
    let n_moe = c.layers.iter().filter(|k| **k == LayerKind::Moe).count() as u64;
    let bank_bytes = n_moe * c.moe.n_routed_experts as u64 * (ex.0 + ex.1);
    let dense = decode_bytes(&c, (0, 0), 0);
    let f32_bytes = dense.mamba + dense.attention + dense.moe_dense + 2 * dense.head;
    println!(
        "weights: f32 {} (head and embeddings {} each), routed experts {} ({} per expert up+down); \
         host generation {t_gen:.1} s, templates {t_tmpl:.1} s, upload + bank copies {t_up:.1} s",
        gib(f32_bytes),
        gib(dense.head),
        gib(bank_bytes),
        mb(ex.0 + ex.1)
    );

    // Copy ceiling.
    let copy_bytes = (a.mib << 20).min(cap) / 16 * 16;
    let (kcopy, kgpu, bcopy) =
        copy_ceiling(g, copy_bytes, if a.small { 2 } else { 20 }, a.batches)?;
    // The ceiling the wall-clock times below are held to: the kernel copy's wall clock (the
    // same clock); the GPU-timestamp rate is printed beside it.
    let ceiling = kcopy.best.max(bcopy.best);
    println!(
        "copy ceiling over {}: kernel {:.0} GB/s wall (worst {:.0}), {} GPU timestamps; buffer copy {:.0} GB/s \
         wall (worst {:.0}) [read + write]",
        gib(copy_bytes),
        kcopy.best / 1e9,
        kcopy.worst / 1e9,
        kgpu.map_or("no".to_string(), |t| format!("{:.0} GB/s (worst {:.0})", t.best / 1e9, t.worst / 1e9)),
        bcopy.best / 1e9,
        bcopy.worst / 1e9
    );
    let lin = probe_linear(g, &c, a.batches, a.small)?;

    let b = a.batches;
    let prompt: Vec<u32> = (0..a.prompt)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % v as u32)
        .collect();
    let max_len = a.prompt + (b + 1) * a.decode + (b + 1) * a.reps * VERIFY_MAX + 4 * VERIFY_MAX;
    let mut ok = true;

    // Prefill: each batch a fresh context.
    eprintln!("prefill ({} positions)", a.prompt);
    let mut pre = Vec::new();
    let mut last_ctx = None;
    for i in 0..=b {
        let mut ctx = m.context(max_len)?;
        let t0 = Instant::now();
        let logits = ctx.prefill_tokens(&prompt)?;
        let t = t0.elapsed().as_secs_f64();
        if i == 0 {
            let bad = logits.iter().filter(|x| !x.is_finite()).count();
            if bad > 0 {
                println!("GUARD: {bad} prefill logits are not finite");
                ok = false;
            }
        } else {
            pre.push(t);
        }
        last_ctx = Some((ctx, logits[(a.prompt as usize - 1) * v..].to_vec()));
    }
    let pre = Timing::of(&pre);
    let (mut ctx, last) = last_ctx.expect("a prefill batch");

    // Decode: greedy from the prompt's last logits.
    eprintln!("decode ({} batches of {})", b + 1, a.decode);
    let mut next = argmax(&last);
    let mut dec = Vec::new();
    let pos_decode = ctx.position();
    for i in 0..=b {
        let t0 = Instant::now();
        for _ in 0..a.decode {
            let l = ctx.decode(next)?;
            next = argmax(&l);
        }
        let t = t0.elapsed().as_secs_f64() / a.decode as f64;
        if i > 0 {
            dec.push(t);
        }
    }
    let dec = Timing::of(&dec);

    // Verify k = 1..8, each rolled back to its first position.
    eprintln!("verify (k = 1..{VERIFY_MAX})");
    let mut ver = Vec::new();
    for k in 1..=VERIFY_MAX {
        let toks: Vec<u32> = (0..k).map(|j| (next + 7 * j) % v as u32).collect();
        let mut ts = Vec::new();
        for i in 0..=b {
            let mut best = f64::INFINITY;
            for _ in 0..a.reps {
                let t0 = Instant::now();
                let out = ctx.verify(&toks)?;
                best = best.min(t0.elapsed().as_secs_f64());
                if out.argmax.len() != k as usize || out.logits.len() != k as usize * v {
                    println!("GUARD: verify of {k} returned {} rows", out.argmax.len());
                    ok = false;
                }
                ctx.rollback(0)?;
            }
            if i > 0 {
                ts.push(best);
            }
        }
        ver.push(Timing::of(&ts));
    }

    // Guards: same state + same token → identical logits; another token → different ones.
    let (t1, t2) = (next, (next + 1) % v as u32);
    ctx.verify(&[t1, t2])?;
    ctx.rollback(0)?;
    let l1 = ctx.decode(t1)?;
    ctx.rollback(0)?;
    let l2 = ctx.decode(t1)?;
    ctx.rollback(0)?;
    let l3 = ctx.decode(t2)?;
    let finite = l1.iter().chain(&l2).chain(&l3).all(|x| x.is_finite());
    let same = l1.iter().zip(&l2).all(|(x, y)| x.to_bits() == y.to_bits());
    let differ = l1.iter().zip(&l3).filter(|(x, y)| x != y).count();
    let spread = l1.iter().copied().fold(f32::NEG_INFINITY, f32::max)
        - l1.iter().copied().fold(f32::INFINITY, f32::min);
    let guard_ok = finite && same && differ > v / 2 && spread > 0.0;
    ok &= guard_ok;
    g.check()?;

    // The table.
    let db = decode_bytes(
        &c,
        ex,
        pos_decode as u64 + (b as u64 + 1) * a.decode as u64 / 2,
    );
    let per_tok = db.total();
    let passes = (a.prompt as usize).div_ceil(PASS);
    let pass_bytes = {
        // Every weight once per pass, all routed experts (64 positions × top-k choose most).
        let d = decode_bytes(&c, ex, 0);
        d.total() - d.experts - d.state + bank_bytes
    };
    let gbs = |bytes: f64, s: f64| bytes / s / 1e9;
    let pct = |bytes: f64, s: f64| 100.0 * bytes / s / ceiling;
    println!();
    println!(
        "## nemotron-bench: {} geometry, experts {}, {} batches after 1 warm-up (min, spread = worst/best)",
        if a.small { "small" } else { "Nemotron 3 Nano 30B-A3B" },
        a.format.name(),
        b
    );
    println!();
    println!("| what | time | spread | rate | bytes moved | GB/s | % copy |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    println!(
        "| copy ceiling ({}, kernel wall / kernel GPU / buffer copy) | | {:.2} | | | {:.0} / {} / {:.0} | 100 |",
        gib(copy_bytes),
        kcopy.best / kcopy.worst,
        kcopy.best / 1e9,
        kgpu.map_or("-".to_string(), |t| format!("{:.0}", t.best / 1e9)),
        bcopy.best / 1e9
    );
    let pb = (pass_bytes * passes as u64) as f64;
    println!(
        "| prefill {} positions ({passes} passes of ≤{PASS}) | {:.1} ms | {:.2} | {:.0} pos/s, {:.1} ms/pass, {:.1} TFLOP/s | ≤{} | ≤{:.0} | ≤{:.0} |",
        a.prompt,
        pre.best * 1e3,
        pre.spread(),
        a.prompt as f64 / pre.best,
        pre.best * 1e3 / passes as f64,
        2.0 * active_params(&c) as f64 * a.prompt as f64 / pre.best / 1e12,
        gib(pass_bytes * passes as u64),
        gbs(pb, pre.best),
        pct(pb, pre.best)
    );
    println!(
        "| decode, 1 token (after {} positions) | {:.3} ms | {:.2} | {:.1} tok/s | {} | {:.0} | {:.1} |",
        pos_decode,
        dec.best * 1e3,
        dec.spread(),
        1.0 / dec.best,
        mb(per_tok),
        gbs(per_tok as f64, dec.best),
        pct(per_tok as f64, dec.best)
    );
    for (i, t) in ver.iter().enumerate() {
        let k = i + 1;
        println!(
            "| verify k = {k} | {:.3} ms | {:.2} | {:.2}× decode, {:.3} ms/position | | | |",
            t.best * 1e3,
            t.spread(),
            t.best / dec.best,
            t.best * 1e3 / k as f64
        );
    }
    let mut lin_sum = 0.0;
    for p in &lin {
        lin_sum += p.per_token as f64 * p.t.best;
        println!(
            "| linear n=1 {} [{}×{}] f32 (×{}/token) | {:.1} µs | {:.2} | {:.2} ms/token | {} | {:.0} | {:.1} |",
            p.name,
            p.n,
            p.k,
            p.per_token,
            p.t.best * 1e6,
            p.t.spread(),
            p.per_token as f64 * p.t.best * 1e3,
            mb(p.bytes),
            gbs(p.bytes as f64, p.t.best),
            pct(p.bytes as f64, p.t.best)
        );
    }
    println!();
    println!(
        "f32 linear kernels alone (the probes above × their count per token): {:.2} ms of the {:.2} ms decode step",
        lin_sum * 1e3,
        dec.best * 1e3
    );
    println!(
        "decode bytes per token: Mamba projections {}, attention {}, router + shared experts {}, \
         routed experts ({} × {}) {}, LM head {}, Mamba state + KV {}, norms/embedding {}",
        mb(db.mamba),
        mb(db.attention),
        mb(db.moe_dense),
        c.moe.top_k,
        mb(ex.0 + ex.1),
        mb(db.experts),
        mb(db.head),
        mb(db.state),
        mb(db.other)
    );
    println!(
        "floors: bytes / copy ceiling {:.3} ms; {} dispatches per decode pass ({} per verify), \
         one submit + wait + {} of logits read back per pass",
        per_tok as f64 / ceiling * 1e3,
        dispatches(&c, false),
        dispatches(&c, true),
        mb(v as u64 * 4)
    );
    println!(
        "guards: prefill logits finite; after rollback the same token twice: {}; another token changes {} of {v} logits; {}",
        if same { "bit-identical" } else { "DIFFERENT" },
        differ,
        if guard_ok { "ok" } else { "FAILED" }
    );
    println!("total run {:.1} s", t_all.elapsed().as_secs_f64());
    Ok(ok)
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("nemotron-bench: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&a) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("nemotron-bench: a guard failed (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("nemotron-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
