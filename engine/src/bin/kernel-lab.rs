//! Kernel lab: the engine's kernels benchmarked in isolation on synthetic data (no model),
//! so one number answers one question.
//!
//! ```text
//! cargo run --release -p verbatim-engine --bin kernel-lab -- [--small] [--mib N] [--batches B]
//!     [--reps R] [--n N] [--k K] [--chain N]
//! ```
//!
//! What it measures:
//! - the **copy ceiling**: dst = src in 16-byte loads/stores over large buffers (`--mib`);
//!   every GB/s below is also given as a percentage of the best copy of this same run;
//! - f16 **GEMV variants** at M = 1 (a batch-1 decode step) on a matrix far larger than any
//!   last-level cache: the shipped kernel, rewrites of it that change one thing each, and a
//!   lab template (`kernel_lab/gemv_m1.wgsl`) for changes the shipped kernel cannot express;
//! - the **quantized GEMVs** (kernels/gemv_q.wgsl: ggml's q8_0 and q4_0 blocks) on the same
//!   matrix quantized, as shipped and in their wide shape; their GB/s count the bytes they
//!   really read (codes + scales), against the same copy ceiling;
//! - the **pure-read ceiling** of each GEMV access pattern: the same loads, in the same order
//!   and addressing, with no arithmetic; a GEMV near its read twin is limited by how it
//!   addresses memory, not by its arithmetic, and only a different shape can help it;
//! - the **dependent-dispatch chain** (launch + barrier per dispatch, as a decode step pays)
//!   against the same dispatches made independent, and the **submit/poll turnaround**.
//!
//! Habits that keep the numbers honest (from the seed's lessons):
//! - a time is the MINIMUM over several timed batches after a discarded warm-up batch:
//!   contention only ever slows a kernel down, so the minimum is the least contaminated
//!   estimate; the **spread** (worst/best) says how much to distrust it;
//! - a batch is one pass of R dispatches bracketed by GPU timestamps (wall clock around
//!   submit + wait where the adapter has no timestamp queries), so launch gaps are included
//!   exactly as a real step of back-to-back kernels sees them;
//! - every variant made by rewriting source text asserts that each replaced text occurred
//!   exactly once, and that the dispatch geometry matches the constants in the final source:
//!   a rewrite that silently matched nothing would benchmark the unmodified kernel under a
//!   variant's name;
//! - every GEMV variant is checked against a CPU computation (output poisoned with NaN first)
//!   before it is timed: a fast wrong kernel is reported WRONG, never timed.
//!
//! Adapters differ (subgroup size 4..128, limits, features): nothing here assumes a subgroup
//! size; variants the adapter cannot run are listed as skipped, with the reason.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use engine::gpu::{Access, Gpu, GpuOptions, Kernel};
use wgpu::util::DeviceExt;

type LabResult<T> = Result<T, Box<dyn std::error::Error>>;

/// ‖gpu − cpu‖ / ‖cpu‖ a GEMV must meet to be timed. f16 weights are exact in f32 and the
/// sums are f32 over a few thousand terms (≈1e-6 expected); a wrong kernel is off by O(1).
const REL_BOUND: f64 = 1e-4;

/// Grid dimension the kernels fold with `wg.x + wg.y * 32768u` (the per-dimension limit is
/// 65535 and one GiB of vec4 needs 262144 workgroups of 256).
const GRID_ROW: u32 = 32768;

const GEMV_PROD: &str = engine::kernels::GEMV_SOURCE;
const GEMV_TEMPLATE: &str = include_str!("kernel_lab/gemv_m1.wgsl");
const COPY: &str = include_str!("kernel_lab/copy.wgsl");
const CHAIN: &str = include_str!("kernel_lab/chain.wgsl");
const WARM: &str = include_str!("kernel_lab/warm.wgsl");
const CHAIN_VARIANTS: &str = include_str!("kernel_lab/chain_variants.wgsl");
const GRID_SYNC: &str = include_str!("kernel_lab/grid_sync.wgsl");
const SUBGROUP_SIZE: &str = include_str!("kernel_lab/subgroup_size.wgsl");
const COOP: &str = concat!("enable f16;\nenable wgpu_cooperative_matrix;\n", include_str!("kernel_lab/coop.wgsl"));
const SPLIT_F16: &str = engine::kernels::SPLIT_F16_SOURCE;
const GEMM_DIRECT: &str = concat!(
    "enable f16;\nenable wgpu_cooperative_matrix;\n",
    include_str!("kernel_lab/gemm_direct.wgsl"),
    include_str!("../kernels/gelu.wgsl"),
    include_str!("../kernels/gemm_epilogue.wgsl"),
    include_str!("../kernels/gemm_coop_emit.wgsl")
);
const GEMM_PLANES: &str = engine::kernels::GEMM_PLANES_SOURCE;

const ATTN_STAGED: &str = engine::kernels::ATTENTION_COOP_SOURCE;

// ---------------------------------------------------------------------------------------
// Command line

struct Args {
    batches: u32,
    reps: u32,
    copy_mib: u64,
    n: u32,
    k: u32,
    chain: u32,
    coop_only: bool,
    direct_only: bool,
    attention_only: bool,
    gemm_only: bool,
    rows_only: bool,
    gemv_only: bool,
    grid_only: bool,
}

const USAGE: &str = "usage: kernel-lab [--small] [--mib N] [--batches B] [--reps R] [--n N] [--k K] [--chain N]
  --small      lavapipe-sized run: 2048x1024 GEMV, 32 MiB copy (default 16384x4096, 1 GiB)
  --mib N      copy-ceiling buffer size in MiB (clamped to the adapter's binding limit)
  --batches B  timed batches per measurement, after one warm-up batch (default 5)
  --reps R     dispatches per batch (default 20; 8 with --small)
  --n N --k K  GEMV output columns and reduction length (N a multiple of 8)
  --chain N    dispatches in the dispatch-cost chains (default 256)
  --coop-only  only the cooperative-matrix section (MMA ceilings, encoder GEMM variants)
  --direct-only  only the encoder's attention shapes (tiled, reshaped; cooperative-matrix) and the
               cooperative-matrix GEMM fed straight from memory, with rewrites that take parts away
  --attention-only  with --direct-only: the attention rows only
  --gemm-only  with --direct-only: the GEMM rows only (and the shipped GEMM over grids of 1 to
               2256 workgroups and K of 32 to 1536: latency or throughput)
  --rows-only  only the copy ceiling, the row-major GEMV (gemv_rows.wgsl) and the decode GEMVs
               with and without their folded LayerNorm, on --n x --k; and a verify pass's
               logits over 16, 8 and 4 rows (grid layers against main_rows, RB 2 / 4 / 8)
  --gemv-only  everything but the cooperative-matrix sections (GEMVs, dispatch and submit costs)
  --grid-only  only the grid-barrier rows: --chain phases of one dispatch synchronised through a
               counter in memory, and a chain of 36 decode GEMVs (384 x 384) as dependent
               dispatches against one dispatch with a grid barrier between the GEMVs";

fn parse_args() -> Result<Args, String> {
    let mut small = false;
    let mut coop_only = false;
    let mut direct_only = false;
    let mut attention_only = false;
    let mut gemm_only = false;
    let mut rows_only = false;
    let mut gemv_only = false;
    let mut grid_only = false;
    let (mut mib, mut n, mut k) = (None, None, None);
    let (mut batches, mut reps, mut chain) = (5u32, None, 256u32);
    let mut it = std::env::args().skip(1);
    fn value<T: std::str::FromStr>(it: &mut impl Iterator<Item = String>, flag: &str) -> Result<T, String> {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("{flag}: \"{v}\" is not a number"))
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--small" => small = true,
            "--coop-only" => coop_only = true,
            "--direct-only" => direct_only = true,
            "--attention-only" => attention_only = true,
            "--gemm-only" => gemm_only = true,
            "--rows-only" => rows_only = true,
            "--gemv-only" => gemv_only = true,
            "--grid-only" => grid_only = true,
            "--mib" => mib = Some(value::<u64>(&mut it, "--mib")?),
            "--batches" => batches = value(&mut it, "--batches")?,
            "--reps" => reps = Some(value::<u32>(&mut it, "--reps")?),
            "--n" => n = Some(value::<u32>(&mut it, "--n")?),
            "--k" => k = Some(value::<u32>(&mut it, "--k")?),
            "--chain" => chain = value(&mut it, "--chain")?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument \"{other}\"\n{USAGE}")),
        }
    }
    let args = Args {
        batches,
        // lavapipe runs the kernels on a CPU, often a busy one: fewer reps keep --small short.
        reps: reps.unwrap_or(if small { 8 } else { 20 }),
        copy_mib: mib.unwrap_or(if small { 32 } else { 1024 }),
        n: n.unwrap_or(if small { 2048 } else { 16384 }),
        k: k.unwrap_or(if small { 1024 } else { 4096 }),
        chain,
        coop_only,
        direct_only,
        attention_only,
        gemm_only,
        rows_only,
        gemv_only,
        grid_only,
    };
    if args.batches == 0 || args.reps == 0 || args.chain == 0 || args.copy_mib == 0 {
        return Err("--batches, --reps, --chain and --mib must be at least 1".into());
    }
    if args.n == 0 || !args.n.is_multiple_of(8) || args.k == 0 {
        return Err("--n must be a positive multiple of 8 (vec4 loads hold 8 columns) and --k positive".into());
    }
    // The chain check counts in f32, exact below 2^24.
    if (args.batches as u64 + 1) * args.chain as u64 >= 1 << 24 {
        return Err("--chain x (--batches + 1) must stay below 2^24".into());
    }
    Ok(args)
}

// ---------------------------------------------------------------------------------------
// Timing

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Clock {
    /// GPU timestamps at the start and end of the batch's pass.
    Gpu,
    /// Wall clock around submit + wait (includes the submit turnaround).
    Wall,
}

/// Seconds per dispatch (or per round trip): best and worst of the timed batches.
#[derive(Clone, Copy, Debug)]
struct Timing {
    best: f64,
    worst: f64,
    clock: Clock,
}

impl Timing {
    fn from_batches(per_item: &[f64], clock: Clock) -> Timing {
        let best = per_item.iter().copied().fold(f64::INFINITY, f64::min);
        let worst = per_item.iter().copied().fold(0.0, f64::max);
        Timing { best, worst, clock }
    }
    fn spread(&self) -> f64 {
        self.worst / self.best
    }
    /// The same timing per each of `n` items (barriers, phases) a dispatch held.
    fn per(self, n: u32) -> Timing {
        Timing { best: self.best / n as f64, worst: self.worst / n as f64, ..self }
    }
}

struct Lab<'g> {
    gpu: &'g Gpu,
    batches: u32,
    timestamps: bool,
    period_ns: f64,
}

/// A timed dispatch's grid: given, or read by the GPU from an indirect-arguments buffer.
#[derive(Clone, Copy)]
enum Grid<'a> {
    Direct([u32; 2]),
    Indirect(&'a wgpu::Buffer),
}

impl Lab<'_> {
    fn uniform(&self, words: &[u32]) -> wgpu::Buffer {
        self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("lab params"),
            contents: bytemuck::cast_slice(words),
            usage: wgpu::BufferUsages::UNIFORM,
        })
    }

    /// A bind group in our kernels' convention: binding 0 the parameter block, 1.. buffers.
    fn bind(&self, k: &Kernel, params: &wgpu::Buffer, bufs: &[&wgpu::Buffer]) -> wgpu::BindGroup {
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: params.as_entire_binding() }];
        for (i, b) in bufs.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.as_entire_binding() });
        }
        self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.name),
            layout: &k.layout,
            entries: &entries,
        })
    }

    /// Keeps the GPU busy with warm.wgsl until its clock has settled (engine::gpu::warm_up)
    /// and prints what that took: without it the first sections time a GPU still climbing
    /// from its idle clock (an H200's dependent-dispatch chain read 1.6 us in some runs and
    /// 4.4 in others, never after a warm-up). Called before each timed section, since the
    /// host work between sections (references, pipelines) lets the clock fall again. A CPU
    /// adapter has no clock to warm (and the kernel would take seconds there).
    fn warm(&self, before: &str) -> LabResult<()> {
        if self.gpu.info.is_cpu() {
            return Ok(());
        }
        const WORKGROUPS: u32 = 1056; // 132 SMs x 8 workgroups of 256
        let k = self.gpu.kernel("lab.warm", WARM, &[Access::ReadWrite])?;
        let y = self.gpu.buffer("lab warm", WORKGROUPS as u64 * 256 * 4)?;
        let bind = self.bind(&k, &self.uniform(&[65536, 0, 0, 0]), &[&y]);
        let w = engine::gpu::warm_up::warm_up(|| self.run_once(&k, &bind, [WORKGROUPS, 1]))?;
        eprintln!("  warm-up before {before}: {}", w.describe("dispatch"));
        println!("warm-up before {before}: {}", w.describe("dispatch"));
        Ok(())
    }

    /// One dispatch, waited for (correctness checks, fills).
    fn run_once(&self, k: &Kernel, bind: &wgpu::BindGroup, grid: [u32; 2]) -> LabResult<()> {
        let mut enc = self.gpu.device.create_command_encoder(&Default::default());
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(k.name), timestamp_writes: None });
            pass.set_pipeline(k.pipeline());
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(grid[0], grid[1], 1);
        }
        self.gpu.queue.submit([enc.finish()]);
        self.gpu.wait()?;
        Ok(())
    }

    /// Time `per_batch` dispatches of `k` in one pass (bind groups used in turn), one warm-up
    /// batch then `self.batches` timed ones, each its own submit + wait. Pipeline and bind
    /// group are set before every dispatch, as the engine's recorder does.
    fn time(&self, k: &Kernel, binds: &[wgpu::BindGroup], grid: [u32; 2], per_batch: u32) -> LabResult<Timing> {
        self.time_mixed(&[k], binds, grid, per_batch)
    }

    /// `time_mixed` with every dispatch's grid read from `args` (x, y, z words at offset 0)
    /// by an indirect dispatch.
    fn time_indirect(&self, k: &Kernel, binds: &[wgpu::BindGroup], args: &wgpu::Buffer, per_batch: u32) -> LabResult<Timing> {
        self.time_with(&[k], binds, &[], Grid::Indirect(args), per_batch)
    }

    /// `time` with dispatch i running `kernels[i % len]` with `binds[i % len]` (a chain
    /// that alternates pipelines).
    fn time_mixed(
        &self,
        kernels: &[&Kernel],
        binds: &[wgpu::BindGroup],
        grid: [u32; 2],
        per_batch: u32,
    ) -> LabResult<Timing> {
        self.time_with(kernels, binds, &[], Grid::Direct(grid), per_batch)
    }

    /// `time` with dispatch i's parameters set as immediate data (`imms[i % len]`) before it.
    fn time_immediates(&self, k: &Kernel, binds: &[wgpu::BindGroup], imms: &[Vec<u8>], grid: [u32; 2], per_batch: u32) -> LabResult<Timing> {
        self.time_with(&[k], binds, imms, Grid::Direct(grid), per_batch)
    }

    fn time_with(&self, kernels: &[&Kernel], binds: &[wgpu::BindGroup], imms: &[Vec<u8>], grid: Grid, per_batch: u32) -> LabResult<Timing> {
        let k = kernels[0];
        let dev = &self.gpu.device;
        let total = self.batches + 1;
        let qs = self.timestamps.then(|| {
            dev.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("lab timestamps"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * total,
            })
        });
        let mut wall = Vec::new();
        for b in 0..total {
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let tw = qs.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                    query_set: q,
                    beginning_of_pass_write_index: Some(2 * b),
                    end_of_pass_write_index: Some(2 * b + 1),
                });
                let mut pass =
                    enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(k.name), timestamp_writes: tw });
                for i in 0..per_batch as usize {
                    pass.set_pipeline(kernels[i % kernels.len()].pipeline());
                    pass.set_bind_group(0, &binds[i % binds.len()], &[]);
                    if !imms.is_empty() {
                        pass.set_immediates(0, &imms[i % imms.len()]);
                    }
                    match grid {
                        Grid::Direct(g) => pass.dispatch_workgroups(g[0], g[1], 1),
                        Grid::Indirect(args) => pass.dispatch_workgroups_indirect(args, 0),
                    }
                }
            }
            let cmd = enc.finish(); // encoding stays outside the wall-clock window
            let t0 = Instant::now();
            self.gpu.queue.submit([cmd]);
            self.gpu.wait()?;
            wall.push(t0.elapsed().as_secs_f64() / per_batch as f64);
        }
        let wall_t = Timing::from_batches(&wall[1..], Clock::Wall);
        let Some(qs) = qs else { return Ok(wall_t) };
        let resolve = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("lab timestamps"),
            size: 16 * total as u64,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.resolve_query_set(&qs, 0..2 * total, &resolve, 0);
        self.gpu.queue.submit([enc.finish()]);
        let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&self.gpu.read(&resolve, 0, 16 * total as u64)?);
        let mut gpu = Vec::new();
        for b in 1..total as usize {
            let (a, e) = (ticks[2 * b], ticks[2 * b + 1]);
            if e <= a {
                // A driver that writes no (or wrapped) timestamps: better the wall clock
                // than a zero that reads as infinite bandwidth.
                eprintln!("  {}: GPU timestamps unusable ({a}..{e}); using wall clock", k.name);
                return Ok(wall_t);
            }
            gpu.push((e - a) as f64 * self.period_ns * 1e-9 / per_batch as f64);
        }
        Ok(Timing::from_batches(&gpu, Clock::Gpu))
    }

    /// Wall time of one submit + wait round trip, `per_batch` of them per batch.
    fn time_round_trips(&self, per_batch: u32, mut record: impl FnMut() -> wgpu::CommandBuffer) -> LabResult<Timing> {
        let mut v = Vec::new();
        for b in 0..=self.batches {
            let mut sum = 0.0;
            for _ in 0..per_batch {
                let cmd = record();
                let t0 = Instant::now();
                self.gpu.queue.submit([cmd]);
                self.gpu.wait()?;
                sum += t0.elapsed().as_secs_f64();
            }
            if b > 0 {
                v.push(sum / per_batch as f64);
            }
        }
        Ok(Timing::from_batches(&v, Clock::Wall))
    }
}

fn grid(groups: u64) -> [u32; 2] {
    let rows = groups.div_ceil(GRID_ROW as u64);
    if rows <= 1 {
        [groups as u32, 1]
    } else {
        [GRID_ROW, rows as u32]
    }
}

/// A kernel name for the engine's pipeline cache, which keys on `&'static str`. The lab
/// compiles a few dozen kernels once each, so leaking their names is harmless.
fn static_name(s: &str) -> &'static str {
    Box::leak(s.to_string().into_boxed_str())
}

// ---------------------------------------------------------------------------------------
// Source rewrites

type Edit = (String, String);

fn edit(from: impl Into<String>, to: impl Into<String>) -> Edit {
    (from.into(), to.into())
}

/// Apply `edits` in order, each of which must match exactly once; panics otherwise. A
/// rewrite that matches nothing would leave the parent kernel in place under the variant's
/// name, and one that matches twice changes more than it says.
fn rewrite(what: &str, src: &str, edits: &[Edit]) -> String {
    let mut s = src.to_string();
    for (from, to) in edits {
        let n = s.matches(from.as_str()).count();
        assert!(
            n == 1,
            "{what}: rewrite expected {from:?} exactly once in its parent's source, found it {n} times \
             (the kernel changed; update the lab's rewrite)"
        );
        s = s.replacen(from.as_str(), to, 1);
    }
    assert_ne!(s, src, "{what}: the rewrite left the source unchanged");
    s
}

fn konst(name: &str, from: u32, to: u32) -> Edit {
    edit(format!("const {name}: u32 = {from}u;"), format!("const {name}: u32 = {to}u;"))
}

// ---------------------------------------------------------------------------------------
// GEMV variants

/// What the host dispatches a GEMV variant with; checked against the variant's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    /// Threads along N per workgroup.
    cp: u32,
    /// K slices per workgroup.
    kg: u32,
    /// u32 words each thread loads per k (1, or 4 as a vec4).
    wpt: u32,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    /// kernels/gemv.wgsl: a [KG][MAXM=8][CP] vec2 reduction array.
    Prod,
    /// kernel_lab/gemv_m1.wgsl: a [KG][CP] array of WPT vec2.
    Template,
    /// kernels/gemv_stream.wgsl (matrices of 8 MiB and more): a [KG][CP] array of 2 vec4.
    Stream,
}

#[derive(Clone)]
struct Variant {
    name: String,
    change: String,
    family: Family,
    shape: Shape,
    src: String,
    needs_subgroups: bool,
    /// The pure-read twin: output of KG x (N / 2 WPT) words instead of N floats.
    pure_read: bool,
}

impl Variant {
    fn shared_bytes(&self) -> u32 {
        let s = self.shape;
        match (self.family, self.pure_read) {
            (_, true) => 0,
            // red [KG][8][CP] vec2 + the LayerNorm scratch (256 + 16 floats) + the attention
            // merge's weights and row (128 + 1280 floats).
            (Family::Prod, _) => s.kg * 8 * s.cp * 8 + (272 + 1408) * 4,
            (Family::Template, _) => s.kg * s.cp * s.wpt * 8,
            // red, the LayerNorm's per-thread sums and statistics.
            (Family::Stream, _) => s.kg * s.cp * 32 + s.kg * s.cp * 4 + 64,
        }
    }

    /// Guard: the constants in the final source are the ones the host dispatches with.
    fn assert_shape(&self) {
        let s = self.shape;
        let mut want = vec![format!("const CP: u32 = {}u;", s.cp), format!("const KG: u32 = {}u;", s.kg)];
        match self.family {
            Family::Prod | Family::Stream => want.push(format!("@workgroup_size({}, {})", s.cp, s.kg)),
            Family::Template => want.push(format!("const WPT: u32 = {}u;", s.wpt)),
        }
        for w in want {
            assert!(self.src.contains(&w), "{}: source lacks {w:?}: host geometry and kernel disagree", self.name);
        }
    }

    fn child(&self, name: &str, change: &str, shape: Shape, edits: &[Edit]) -> Variant {
        let v = Variant {
            name: name.into(),
            change: change.into(),
            shape,
            src: rewrite(name, &self.src, edits),
            ..self.clone()
        };
        v.assert_shape();
        v
    }
}

/// The shipped kernel with CP and/or KG changed: its workgroup size and its reduction array
/// ([KG][MAXM][CP]) are literals there and must follow.
fn prod_reshape(parent: &Variant, name: &str, change: &str, cp: u32, kg: u32) -> Variant {
    let p = parent.shape;
    let mut edits = Vec::new();
    if cp != p.cp {
        edits.push(konst("CP", p.cp, cp));
    }
    if kg != p.kg {
        edits.push(konst("KG", p.kg, kg));
    }
    edits.push(edit(format!("@workgroup_size({}, {})", p.cp, p.kg), format!("@workgroup_size({cp}, {kg})")));
    edits.push(edit(format!("array<vec2<f32>, {}>", p.kg * 8 * p.cp), format!("array<vec2<f32>, {}>", kg * 8 * cp)));
    parent.child(name, change, Shape { cp, kg, ..p }, &edits)
}

/// Template edits: u32 loads -> one vec4<u32> load (8 columns) per thread per k.
fn vec4_edits() -> Vec<Edit> {
    vec![
        konst("WPT", 1, 4),
        edit("var<storage, read> w: array<u32>;", "var<storage, read> w: array<vec4<u32>>;"),
        edit(
            "    return array<vec2<f32>, WPT>(unpack2x16float(w[i]));",
            "    let q = w[i];\n    return array<vec2<f32>, WPT>(unpack2x16float(q.x), unpack2x16float(q.y), \
             unpack2x16float(q.z), unpack2x16float(q.w));",
        ),
        edit("    return w[i];", "    let q = w[i];\n    return q.x ^ q.y ^ q.z ^ q.w;"),
    ]
}

/// Template edits: the K slices that share a subgroup are merged with butterfly shuffles
/// (lanes CP, 2CP, ... apart hold the same columns), leaving one partial per subgroup for
/// workgroup memory and cutting its traffic by subgroup_size / CP. Thread roles are taken
/// from the subgroup built-ins instead of local_invocation_id, so nothing assumes how an
/// implementation lays subgroups over the workgroup; it does need subgroup_size >= CP
/// (checked by the host against the sizes the probe kernel saw; a driver that picked a
/// smaller one for this kernel would fail the CPU check, not pass wrong) and a workgroup
/// made of whole subgroups (CP*KG = 256 is). naga only accepts subgroup_id in a
/// one-dimensional workgroup, so the same CP*KG invocations are declared flat.
fn subgroup_edits() -> Vec<Edit> {
    vec![
        edit("@compute @workgroup_size(CP, KG)", "@compute @workgroup_size(CP * KG)"),
        edit(
            "@builtin(local_invocation_id) li: vec3<u32>) {",
            "@builtin(local_invocation_id) li: vec3<u32>,\n        @builtin(subgroup_invocation_id) sl: u32, \
             @builtin(subgroup_size) ss: u32,\n        @builtin(subgroup_id) sid: u32, @builtin(num_subgroups) nsg: u32) {",
        ),
        edit(
            "    let c = li.x; // which of the CP word groups of this workgroup\n    let s = li.y; // which K slice\n",
            "    let c = sl % CP;\n    let s = sid * (ss / CP) + sl / CP;\n",
        ),
        edit(
            "    red[s * CP + c] = acc;\n    workgroupBarrier();\n    if (s == 0u && g < ng) {\n        \
             var t: array<vec2<f32>, WPT>;\n        for (var q = 0u; q < KG; q++) {",
            "    for (var off = CP; off < ss; off *= 2u) {\n        for (var j = 0u; j < WPT; j++) {\n            \
             acc[j] += subgroupShuffleXor(acc[j], off);\n        }\n    }\n    if (sl < CP) {\n        \
             red[sid * CP + c] = acc;\n    }\n    workgroupBarrier();\n    if (sid == 0u && sl < CP && g < ng) {\n        \
             var t: array<vec2<f32>, WPT>;\n        for (var q = 0u; q < nsg; q++) {",
        ),
    ]
}

/// The pure-read twin of a template shape: the same weight and x loads in the same order
/// and addressing, folded with XOR (no unpack, no FMA, no merge, no barrier), one word
/// written per thread so the loads cannot be dropped. The reduction array goes too: it is
/// not part of the access pattern, and an unused one could still cost occupancy.
fn read_twin(shape: Shape) -> Variant {
    let base = template_root();
    let mut edits = Vec::new();
    if shape.cp != 32 {
        edits.push(konst("CP", 32, shape.cp));
    }
    if shape.kg != 8 {
        edits.push(konst("KG", 8, shape.kg));
    }
    if shape.wpt == 4 {
        edits.extend(vec4_edits());
    }
    edits.push(edit("var<workgroup> red: array<array<vec2<f32>, WPT>, CP * KG>;\n", ""));
    let tail = &base.src[base.src.find("    // -- body --").expect("template lost its body marker")..];
    edits.push(edit(
        tail,
        "    // -- pure read --\n    var bits = 0u;\n    if (g < ng) {\n        for (var k = k0; k < k1; k++) {\n            \
         bits ^= load_raw(k * ng + g) ^ bitcast<u32>(x[p.x_off + k]);\n        }\n        \
         y[s * ng + g] = bitcast<f32>(bits);\n    }\n}\n",
    ));
    let name = format!("read.cp{}.kg{}.{}", shape.cp, shape.kg, if shape.wpt == 4 { "vec4" } else { "u32" });
    let mut v = base.child(&name, "pure read of this access pattern", shape, &edits);
    v.pure_read = true;
    v
}

fn template_root() -> Variant {
    let v = Variant {
        name: "m1".into(),
        change: "gemv, M fixed at 1 (lab template)".into(),
        family: Family::Template,
        shape: Shape { cp: 32, kg: 8, wpt: 1 },
        src: GEMV_TEMPLATE.to_string(),
        needs_subgroups: false,
        pure_read: false,
    };
    v.assert_shape();
    v
}

/// The GEMV variants, each named with its parent and the one thing it changes.
fn gemv_variants() -> Vec<Variant> {
    let prod = Variant {
        name: "gemv".into(),
        change: "kernels/gemv.wgsl as shipped".into(),
        family: Family::Prod,
        shape: Shape { cp: 8, kg: 32, wpt: 1 },
        src: GEMV_PROD.to_string(),
        needs_subgroups: false,
        pure_read: false,
    };
    prod.assert_shape();
    let m1 = template_root();
    let v4 = m1.child("m1.vec4", "m1, vec4<u32> loads (8 cols/thread)", Shape { wpt: 4, ..m1.shape }, &vec4_edits());
    let v4c8 = v4.child("m1.vec4.cp8", "m1.vec4, CP 32 -> 8", Shape { cp: 8, ..v4.shape }, &[konst("CP", 32, 8)]);
    let v4c8k32 = v4c8.child(
        "m1.vec4.cp8.kg32",
        "m1.vec4.cp8, KG 8 -> 32",
        Shape { kg: 32, ..v4c8.shape },
        &[konst("KG", 8, 32)],
    );
    let v4c8k64 = v4c8k32.child(
        "m1.vec4.cp8.kg64",
        "m1.vec4.cp8.kg32, KG 32 -> 64",
        Shape { kg: 64, ..v4c8k32.shape },
        &[konst("KG", 32, 64)],
    );
    let mut sg = v4c8k32.child(
        "m1.vec4.cp8.kg32.sg",
        "m1.vec4.cp8.kg32, merge by subgroup shuffles",
        v4c8k32.shape,
        &subgroup_edits(),
    );
    sg.needs_subgroups = true;
    let m1kg32 = m1.child("m1.kg32", "m1, KG 8 -> 32", Shape { kg: 32, ..m1.shape }, &[konst("KG", 8, 32)]);
    let reshaped = [
        prod_reshape(&prod, "gemv.cp32.kg8", "gemv, CP 8 -> 32, KG 32 -> 8 (shipped before)", 32, 8),
        prod_reshape(&prod, "gemv.cp16", "gemv, CP 8 -> 16 column pairs", 16, 32),
        prod_reshape(&prod, "gemv.kg16", "gemv, KG 32 -> 16 K slices", 8, 16),
        prod_reshape(&prod, "gemv.kg64", "gemv, KG 32 -> 64 K slices", 8, 64),
    ];
    // 32 words per round on long slices (the 128 MiB matrix: 512 per thread).
    let w32 = reshaped[0].child(
        "gemv.cp32.kg8.w32",
        "gemv.cp32.kg8, 32 words per round before the 16-word rounds",
        reshaped[0].shape,
        &[edit(
            "        // Sixteen words per round while they last (long slices: fc2, the logits).\n",
            "        // Thirty-two words per round while they last (the lab's w32 rewrite).\n        for (; k + 32u <= k1; k += 32u) {\n            let v0 = w[(k + 0u) * nw + cw];\n            let v1 = w[(k + 1u) * nw + cw];\n            let v2 = w[(k + 2u) * nw + cw];\n            let v3 = w[(k + 3u) * nw + cw];\n            let v4 = w[(k + 4u) * nw + cw];\n            let v5 = w[(k + 5u) * nw + cw];\n            let v6 = w[(k + 6u) * nw + cw];\n            let v7 = w[(k + 7u) * nw + cw];\n            let v8 = w[(k + 8u) * nw + cw];\n            let v9 = w[(k + 9u) * nw + cw];\n            let v10 = w[(k + 10u) * nw + cw];\n            let v11 = w[(k + 11u) * nw + cw];\n            let v12 = w[(k + 12u) * nw + cw];\n            let v13 = w[(k + 13u) * nw + cw];\n            let v14 = w[(k + 14u) * nw + cw];\n            let v15 = w[(k + 15u) * nw + cw];\n            let v16 = w[(k + 16u) * nw + cw];\n            let v17 = w[(k + 17u) * nw + cw];\n            let v18 = w[(k + 18u) * nw + cw];\n            let v19 = w[(k + 19u) * nw + cw];\n            let v20 = w[(k + 20u) * nw + cw];\n            let v21 = w[(k + 21u) * nw + cw];\n            let v22 = w[(k + 22u) * nw + cw];\n            let v23 = w[(k + 23u) * nw + cw];\n            let v24 = w[(k + 24u) * nw + cw];\n            let v25 = w[(k + 25u) * nw + cw];\n            let v26 = w[(k + 26u) * nw + cw];\n            let v27 = w[(k + 27u) * nw + cw];\n            let v28 = w[(k + 28u) * nw + cw];\n            let v29 = w[(k + 29u) * nw + cw];\n            let v30 = w[(k + 30u) * nw + cw];\n            let v31 = w[(k + 31u) * nw + cw];\n            a = fma(vec2<f32>(xv_m1(row, k + 0u)), unpack2x16float(v0), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 1u)), unpack2x16float(v1), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 2u)), unpack2x16float(v2), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 3u)), unpack2x16float(v3), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 4u)), unpack2x16float(v4), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 5u)), unpack2x16float(v5), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 6u)), unpack2x16float(v6), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 7u)), unpack2x16float(v7), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 8u)), unpack2x16float(v8), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 9u)), unpack2x16float(v9), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 10u)), unpack2x16float(v10), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 11u)), unpack2x16float(v11), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 12u)), unpack2x16float(v12), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 13u)), unpack2x16float(v13), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 14u)), unpack2x16float(v14), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 15u)), unpack2x16float(v15), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 16u)), unpack2x16float(v16), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 17u)), unpack2x16float(v17), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 18u)), unpack2x16float(v18), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 19u)), unpack2x16float(v19), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 20u)), unpack2x16float(v20), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 21u)), unpack2x16float(v21), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 22u)), unpack2x16float(v22), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 23u)), unpack2x16float(v23), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 24u)), unpack2x16float(v24), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 25u)), unpack2x16float(v25), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 26u)), unpack2x16float(v26), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 27u)), unpack2x16float(v27), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 28u)), unpack2x16float(v28), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 29u)), unpack2x16float(v29), b);\n            a = fma(vec2<f32>(xv_m1(row, k + 30u)), unpack2x16float(v30), a);\n            b = fma(vec2<f32>(xv_m1(row, k + 31u)), unpack2x16float(v31), b);\n        }\n        // Sixteen words per round while they last (long slices: fc2, the logits).\n",
        )],
    );
    let c64 = prod_reshape(&prod, "gemv.cp64.kg4", "gemv, CP 8 -> 64, KG 32 -> 4", 64, 4);
    // The shipped kernel for matrices of 8 MiB and more, in both of its shapes (the engine
    // takes 64 slices where the device's limits allow: `gemv_stream_slices`).
    let stream = [32u32, 64].map(|kg| {
        let v = Variant {
            name: format!("gemv_stream.kg{kg}"),
            change: format!("kernels/gemv_stream.wgsl as shipped, {kg} K slices"),
            family: Family::Stream,
            shape: Shape { cp: 8, kg, wpt: 4 },
            src: engine::kernels::gemv_stream_source(kg).expect("gemv_stream.wgsl rewrite"),
            needs_subgroups: false,
            pure_read: false,
        };
        v.assert_shape();
        v
    });
    let mut all = vec![prod];
    all.extend(stream);
    all.extend(reshaped);
    all.extend([w32, c64]);
    all.extend([m1, m1kg32, v4, v4c8, v4c8k32, v4c8k64, sg]);
    all
}

// ---------------------------------------------------------------------------------------
// Report rows

enum Section {
    Copy,
    Read,
    Gemv,
    Probe,
}

struct Row {
    section: Section,
    name: String,
    change: String,
    /// Back-to-back in one pass, each dispatch depending on the previous one.
    dep: Option<Timing>,
    /// The same dispatches writing distinct outputs (wgpu puts no barrier between them).
    indep: Option<Timing>,
    bytes: Option<u64>,
    twin: Option<String>,
    check: String,
}

impl Row {
    fn new(section: Section, name: &str, change: &str) -> Row {
        Row {
            section,
            name: name.into(),
            change: change.into(),
            dep: None,
            indep: None,
            bytes: None,
            twin: None,
            check: String::new(),
        }
    }
    fn gbs(&self) -> Option<f64> {
        Some(self.bytes? as f64 / self.dep?.best / 1e9)
    }
}

// ---------------------------------------------------------------------------------------
// Probes

/// Which subgroup sizes compute work really runs at (min, max), from the built-in.
fn probe_subgroup_size(lab: &Lab) -> LabResult<(u32, u32)> {
    let gpu = lab.gpu;
    let k = gpu.kernel("lab.subgroup_size", SUBGROUP_SIZE, &[Access::ReadWrite])?;
    let o = gpu.upload_u32("lab subgroup sizes", &[u32::MAX, 0])?;
    let params = lab.uniform(&[0; 4]);
    lab.run_once(&k, &lab.bind(&k, &params, &[&o]), [64, 1])?;
    let v = gpu.read_u32(&o, 0, 2)?;
    Ok((v[0], v[1]))
}

/// Copy ceiling: `UNROLL` 1 and 4 vec4 per thread, dst = src over `bytes`.
fn copy_rows(lab: &Lab, bytes: u64, reps: u32) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let n = bytes / 16;
    let src = gpu.buffer("lab copy src", bytes)?;
    let dst = gpu.buffer("lab copy dst", bytes)?;
    let seed = 0x5eed_1234u32;
    let params = lab.uniform(&[n as u32, GRID_ROW, seed, 0]);
    let fill = gpu.kernel_entry("lab.fill", COPY, "fill", &[Access::Read, Access::ReadWrite])?;
    // The fill writes its rw binding: bind src there (dst only fills the read slot).
    lab.run_once(&fill, &lab.bind(&fill, &params, &[&dst, &src]), grid(n.div_ceil(256)))?;
    let mut rows = Vec::new();
    for unroll in [1u32, 4] {
        let (name, src_text) = if unroll == 1 {
            ("copy", COPY.to_string())
        } else {
            ("copy.x4", rewrite("copy.x4", COPY, &[konst("UNROLL", 1, unroll)]))
        };
        let change =
            if unroll == 1 { "1 vec4 per thread".to_string() } else { format!("{unroll} vec4 per thread, WG apart") };
        let mut row = Row::new(Section::Copy, name, &change);
        row.bytes = Some(2 * n * 16);
        eprintln!("  {name}");
        let k = gpu.kernel(static_name(&format!("lab.{name}")), &src_text, &[Access::Read, Access::ReadWrite])?;
        gpu.fill_u32(&dst, 0);
        let bind = lab.bind(&k, &params, &[&src, &dst]);
        let g = grid(n.div_ceil(256 * unroll as u64));
        row.dep = Some(lab.time(&k, &[bind], g, reps)?);
        // Guard: the copy really copied (first and last 4 KiB against the fill's pattern).
        let span = n.min(256);
        let mut ok = true;
        for start in [0, n - span] {
            let got = gpu.read_u32(&dst, start * 4, (span * 4) as usize)?;
            for (j, v) in got.chunks(4).enumerate() {
                let i = (start + j as u64) as u32;
                let h = (i ^ seed).wrapping_mul(2654435761);
                ok &= v == [h, h ^ 0x9e37_79b9, h.wrapping_add(1), !h];
            }
        }
        row.check = if ok { "ok".into() } else { "WRONG copy".into() };
        if !ok {
            row.dep = None;
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Whether the adapter the engine would choose offers wgpu's experimental cooperative
/// matrices, and in which shapes (the issue asks before a GEMM is planned on them).
fn cooperative_matrix() -> String {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN | wgpu::Backends::METAL | wgpu::Backends::DX12;
    let instance = wgpu::Instance::new(desc.with_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    match engine::gpu::choose_adapter(adapters, std::env::var("VERBATIM_ADAPTER").ok().as_deref()) {
        Ok(a) if a.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX) => {
            format!("offered: {:?}", a.cooperative_matrix_properties())
        }
        Ok(_) => "not offered".into(),
        Err(e) => format!("unknown ({e})"),
    }
}

/// Dependent and independent dispatch chains of `n` one-workgroup dispatches in one pass.
fn chain_rows(lab: &Lab, n: u32) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let k = gpu.kernel("lab.chain", CHAIN, &[Access::ReadWrite])?;
    let params = lab.uniform(&[0; 4]);
    let expect_runs = (lab.batches + 1) as f32;
    let mut rows = Vec::new();

    eprintln!("  chain.dependent");
    let y = gpu.buffer("lab chain", 256)?;
    let bind = lab.bind(&k, &params, &[&y]);
    let mut dep = Row::new(Section::Probe, "chain.dependent", &format!("{n} dispatches, each reads the last"));
    dep.dep = Some(lab.time(&k, &[bind], [1, 1], n)?);
    let got = gpu.read_f32(&y, 0, 1)?[0];
    dep.check = if got == expect_runs * n as f32 { "ok".into() } else { format!("WRONG count {got}") };
    rows.push(dep);

    eprintln!("  chain.independent");
    let ys: Vec<wgpu::Buffer> = (0..n).map(|_| gpu.buffer("lab chain", 256)).collect::<Result<_, _>>()?;
    let binds: Vec<wgpu::BindGroup> = ys.iter().map(|b| lab.bind(&k, &params, &[b])).collect();
    let mut ind = Row::new(Section::Probe, "chain.independent", &format!("{n} dispatches, distinct buffers"));
    ind.dep = Some(lab.time(&k, &binds, [1, 1], n)?);
    let mut bad = 0;
    for b in &ys {
        if gpu.read_f32(b, 0, 1)?[0] != expect_runs {
            bad += 1;
        }
    }
    ind.check = if bad == 0 { "ok".into() } else { format!("WRONG ({bad} buffers)") };
    rows.push(ind);

    // A decode step's chain is heterogeneous: every dispatch another pipeline, shared
    // memory sizes that change, grids of many workgroups. Each of those, alone, against
    // chain.dependent (all dependent, one pass, same buffer, GPU timestamps around it).
    let rw = [Access::ReadWrite];
    let twin = gpu.kernel("lab.chain.twin", CHAIN, &rw)?;
    let shared = gpu.kernel_entry("lab.chain.shared", CHAIN_VARIANTS, "main_shared", &rw)?;
    let wide = gpu.kernel_entry("lab.chain.grid", CHAIN_VARIANTS, "main_grid", &rw)?;
    let y = gpu.buffer("lab chain variants", 256 * 64 * 4)?;
    for (name, change, second, groups) in [
        ("chain.alternate", "dependent, two pipelines of one source in turn", &twin, 1u32),
        ("chain.shared", "dependent, in turn with a 16 KiB-shared-memory kernel", &shared, 1),
        ("chain.grid256", "dependent, 256 workgroups each", &wide, 256),
    ] {
        eprintln!("  {name}");
        gpu.fill_u32(&y, 0);
        let b2 = lab.bind(second, &params, &[&y]);
        let b1 = if groups > 1 { b2.clone() } else { lab.bind(&k, &params, &[&y]) };
        let k1: &Kernel = if groups > 1 { second } else { &k };
        let mut row = Row::new(Section::Probe, name, change);
        let t = lab.time_mixed(&[k1, second], &[b1, b2], [groups, 1], n)?;
        row.dep = Some(t);
        let got = gpu.read_f32(&y, 0, 1)?[0];
        row.check = if got == expect_runs * n as f32 { "ok".into() } else { format!("WRONG count {got}") };
        rows.push(row);
    }

    // Indirect dispatches (the grid read from a buffer by the GPU), as a decode batch would
    // use to make the steps after a device-picked end-of-text empty: the chain with grids
    // of 1 and of 256 workgroups read indirectly, and with an empty grid (what a step past
    // the end-of-text would cost). wgpu validates indirect arguments with a dispatch of its
    // own unless WGPU_VALIDATION_INDIRECT_CALL=0 (the lab runs under whatever the
    // environment says; the row's change names it).
    let validated = wgpu::InstanceFlags::from_env_or_default().contains(wgpu::InstanceFlags::VALIDATION_INDIRECT_CALL);
    let checked = if validated { "validated by wgpu" } else { "not validated" };
    for (name, second, groups) in [
        ("chain.indirect", &k, 1u32),
        ("chain.indirect_grid256", &wide, 256),
        ("chain.indirect_empty", &k, 0),
    ] {
        eprintln!("  {name}");
        gpu.fill_u32(&y, 0);
        let args = dev_indirect(lab, [groups, 1, 1]);
        let b = lab.bind(second, &params, &[&y]);
        let mut row = Row::new(Section::Probe, name, &format!("dependent, {groups} workgroups from an indirect buffer ({checked})"));
        row.dep = Some(lab.time_indirect(second, &[b], &args, n)?);
        let got = gpu.read_f32(&y, 0, 1)?[0];
        let want = if groups == 0 { 0.0 } else { expect_runs * n as f32 };
        row.check = if got == want { "ok".into() } else { format!("WRONG count {got}") };
        rows.push(row);
    }

    // What the engine's per-kernel profile pays: every dispatch in its own pass with a
    // timestamp at each end, against the same chain in one pass, both by the wall clock
    // around submit + wait (per dispatch). The difference is the profile's overstatement
    // of each kernel's in-stream cost.
    let dev = &gpu.device;
    let y = gpu.buffer("lab chain passes", 256)?;
    let bind = lab.bind(&k, &params, &[&y]);
    let qs = lab.timestamps.then(|| {
        dev.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("lab pass chain"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * n,
        })
    });
    for (name, change, passes) in [
        ("chain.one_pass.wall", format!("{n} dependent dispatches, one pass (wall, per dispatch)"), false),
        ("chain.pass_each.wall", format!("{n} dependent dispatches, a timed pass each (the profile's way)"), true),
    ] {
        eprintln!("  {name}");
        let mut row = Row::new(Section::Probe, name, &change);
        let t = lab.time_round_trips(1, || {
            let mut enc = dev.create_command_encoder(&Default::default());
            if passes {
                for i in 0..n {
                    let tw = qs.as_ref().map(|q| wgpu::ComputePassTimestampWrites {
                        query_set: q,
                        beginning_of_pass_write_index: Some(2 * i),
                        end_of_pass_write_index: Some(2 * i + 1),
                    });
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: tw });
                    pass.set_pipeline(k.pipeline());
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(1, 1, 1);
                }
            } else {
                let mut pass = enc.begin_compute_pass(&Default::default());
                for _ in 0..n {
                    pass.set_pipeline(k.pipeline());
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(1, 1, 1);
                }
            }
            enc.finish()
        })?;
        row.dep = Some(t.per(n));
        row.check = "ok".into();
        rows.push(row);
    }
    Ok(rows)
}

/// grid_sync.wgsl's GEMV chain for `phases` GEMVs: the weights (f16 bits, [phases][K][N],
/// scaled to keep |x| near 1), x[0], and the CPU's x[1..=phases].
fn gemv_chain_inputs(phases: u32, seed: u64) -> (Vec<u16>, Vec<f32>, Vec<Vec<f64>>) {
    let n = GRID_N;
    let mut st = seed;
    let scale = (3.0 / n as f32).sqrt();
    let wbits: Vec<u16> =
        (0..phases as usize * n * n).map(|_| half::f16::from_f32(unit(&mut st) * scale).to_bits()).collect();
    let x0: Vec<f32> = (0..n).map(|_| unit(&mut st)).collect();
    let mut x: Vec<f64> = x0.iter().map(|&v| v as f64).collect();
    let mut rows = Vec::with_capacity(phases as usize);
    for wi in wbits.chunks_exact(n * n) {
        let mut y = vec![0f64; n];
        for (kk, row) in wi.chunks_exact(n).enumerate() {
            for (o, b) in y.iter_mut().zip(row) {
                *o += x[kk] * half::f16::from_bits(*b).to_f64();
            }
        }
        rows.push(y.clone());
        x = y;
    }
    (wbits, x0, rows)
}

/// Phases of grid_sync.wgsl's GEMV chain (a tiny.en decode step is 37 dependent kernels).
const GRID_GEMVS: u32 = 36;
/// grid_sync.wgsl's GEMV shape and the workgroups that compute it (N / 32).
const GRID_N: usize = 384;
const GRID_TILES: u32 = 12;

/// Grid-wide barriers in one dispatch (kernel_lab/grid_sync.wgsl) against the dependent
/// dispatches a decode step is made of. Each row's time is per phase. Nothing in Vulkan
/// promises that a workgroup waiting on another makes progress unless both are resident, so
/// grids stay small (at most 132 workgroups of 256 threads: one an SM on an H200) and a CPU
/// adapter, which runs workgroups a few at a time, is skipped.
fn grid_sync_rows(lab: &Lab, phases: u32) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let rw = Access::ReadWrite;
    let barrier = gpu.kernel_entry("lab.grid.barrier", GRID_SYNC, "main_barrier", &[Access::Read, rw, rw, rw])?;
    let barrier_atomic = gpu.kernel_entry("lab.grid.barrier_atomic", GRID_SYNC, "main_barrier_atomic", &[Access::Read, rw, rw, rw])?;
    let phase = gpu.kernel_entry("lab.grid.phase", GRID_SYNC, "main_phase", &[Access::Read, rw, rw, rw])?;
    let phase_dyn = gpu.kernel_entry("lab.grid.phase_dyn", GRID_SYNC, "main_phase_dyn", &[Access::Read, rw, rw, rw])?;
    let chain = gpu.kernel_entry("lab.grid.chain", GRID_SYNC, "main_chain", &[Access::Read, rw, rw, rw])?;
    let late = gpu.kernel_entry("lab.grid.chain_late", GRID_SYNC, "main_chain_late", &[Access::Read, rw, rw, rw])?;
    let chain_atomic = gpu.kernel_entry("lab.grid.chain_atomic", GRID_SYNC, "main_chain_atomic", &[Access::Read, rw, rw, rw])?;
    // [counter, timeouts, .., 32: main_barrier_atomic's two message rows of 132 x 32 words]
    let sync = gpu.buffer("lab grid sync", (32 + 2 * 132 * 32) * 4)?;
    let runs = (lab.batches + 1) as f32;
    let mut rows = Vec::new();

    // The GEMV chain: x[i + 1] = W[i] x[i], weights scaled to keep |x| near 1.
    let n = GRID_N;
    let (wbits, x0, want_rows) = gemv_chain_inputs(GRID_GEMVS, 0x9e1d_5eed);
    let x = want_rows.last().expect("a chain of GEMVs").clone();
    let w = gpu.upload("lab grid gemv w", bytemuck::cast_slice(&wbits))?;
    // Rows start 128-byte aligned (wgpu aligns buffers to at least 256 bytes) or, with
    // `skew` = 2 floats before x[0], straddle the lines.
    let xs = gpu.buffer("lab grid gemv x", ((GRID_GEMVS as u64 + 1) * n as u64 + 2) * 4)?;
    let bytes = GRID_GEMVS as u64 * (n * n * 2 + n * 8) as u64;
    let skew = std::cell::Cell::new(0u32);
    let check = |what: &str| -> LabResult<String> {
        let timeouts = gpu.read_u32(&sync, 1, 1)?[0];
        if timeouts != 0 {
            return Ok(format!("WRONG ({timeouts} spins gave up)"));
        }
        let got = gpu.read_f32(&xs, skew.get() as u64 + GRID_GEMVS as u64 * n as u64, n)?;
        let rel = rel_to(&got, &x);
        if rel <= REL_BOUND {
            return Ok(format!("ok {what} (rel {rel:.1e})"));
        }
        // Where the chain first went wrong, and how.
        let all = gpu.read_f32(&xs, skew.get() as u64 + n as u64, GRID_GEMVS as usize * n)?;
        for (i, (g, want)) in all.chunks_exact(n).zip(&want_rows).enumerate() {
            let r = rel_to(g, want);
            if r.is_nan() || r > REL_BOUND {
                let nan = g.iter().filter(|v| v.is_nan()).count();
                let zero = g.iter().filter(|&&v| v == 0.0).count();
                return Ok(format!("WRONG {what} (rel {rel:.1e}; first at GEMV {i}: rel {r:.1e}, {nan} NaN, {zero} zero)"));
            }
        }
        Ok(format!("WRONG {what} (rel {rel:.1e})"))
    };
    let poison = || {
        gpu.fill_u32(&xs, 0x7fc0_0000);
        gpu.write(&xs, skew.get() as u64 * 4, bytemuck::cast_slice(&x0));
        gpu.fill_u32(&sync, 0);
    };

    for (name, k, sk, what) in [
        ("grid.gemv_dispatches", &phase, 0u32, ""),
        ("grid.gemv_dispatches.skew", &phase, 2, ", rows straddling 128-byte lines"),
        ("grid.gemv_dispatches.dyn", &phase_dyn, 0, ", N and K read from the parameters"),
    ] {
        eprintln!("  {name}");
        skew.set(sk);
        poison();
        let binds: Vec<wgpu::BindGroup> = (0..GRID_GEMVS)
            .map(|i| lab.bind(k, &lab.uniform(&[GRID_GEMVS, GRID_TILES, i, sk, GRID_N as u32, GRID_N as u32, 0, 0]), &[&w, &xs, &sync, &xs]))
            .collect();
        let mut row = Row::new(
            Section::Probe,
            name,
            &format!("{GRID_GEMVS} dependent 384x384 GEMVs, a dispatch of {GRID_TILES} workgroups each{what} (per GEMV)"),
        );
        row.dep = Some(lab.time(k, &binds, [GRID_TILES, 1], GRID_GEMVS)?);
        row.bytes = Some(bytes / GRID_GEMVS as u64);
        row.check = check("vs CPU")?;
        rows.push(row);
    }

    // The engine's decode GEMV (gemv.wgsl main_m1, no flags) in the same
    // chain: each matrix its own buffer, X rows read from one buffer and written to the
    // other in turn (a buffer cannot be bound as X and Y at once), row i + 1 = W[i] row i.
    let mats: Vec<wgpu::Buffer> = wbits
        .chunks_exact(n * n)
        .map(|c| gpu.upload("lab grid m1 w", bytemuck::cast_slice(c)))
        .collect::<Result<_, _>>()?;
    let rows_ab = [gpu.buffer("lab grid m1 a", (GRID_GEMVS as u64 + 1) * n as u64 * 4)?, gpu.buffer("lab grid m1 b", (GRID_GEMVS as u64 + 1) * n as u64 * 4)?];
    let zero = gpu.buffer("lab grid m1 zero", 16)?;
    let r = Access::Read;
    // `.generic`: main_m1 as gemv.wgsl has it, both switches read from the flags; the other
    // row is the variant the engine compiles for dispatches without a LayerNorm or a merge
    // (`gemv_m1_source`): what fixing the switches is worth.
    let plain = engine::kernels::gemv_m1_source(engine::kernels::GemvM1Variant::Plain)?;
    for (name, entry, per_wg, src) in [
        ("grid.gemv_dispatches.main_m1", "main_m1", 16u32, plain.as_str()),
        ("grid.gemv_dispatches.main_m1.generic", "main_m1", 16u32, engine::kernels::GEMV_SOURCE),
    ] {
        eprintln!("  {name}");
        let k = gpu.kernel_entry(static_name(&format!("lab.{name}")), src, entry, &[r, r, r, r, r, Access::ReadWrite])?;
        for b in &rows_ab {
            gpu.fill_u32(b, 0x7fc0_0000);
        }
        gpu.write(&rows_ab[0], 0, bytemuck::cast_slice(&x0));
        let nn = n as u32;
        let binds: Vec<wgpu::BindGroup> = (0..GRID_GEMVS)
            .map(|i| {
                let (src, dst) = (&rows_ab[i as usize % 2], &rows_ab[(i as usize + 1) % 2]);
                // gemv.wgsl's Params: m n k flags x_off x_stride y_off y_stride eps pad*3
                let params = lab.uniform(&[1, nn, nn, 0, i * nn, nn, (i + 1) * nn, nn, 0, 0, 0, 0]);
                lab.bind(&k, &params, &[src, &mats[i as usize], &zero, &zero, &zero, dst])
            })
            .collect();
        let mut row = Row::new(Section::Probe, name, &format!("{GRID_GEMVS} dependent 384x384 GEMVs, the engine's {entry} (per GEMV)"));
        row.dep = Some(lab.time(&k, &binds, [(n as u32).div_ceil(per_wg), 1], GRID_GEMVS)?);
        row.bytes = Some(bytes / GRID_GEMVS as u64);
        let last = &rows_ab[GRID_GEMVS as usize % 2];
        let got = gpu.read_f32(last, GRID_GEMVS as u64 * n as u64, n)?;
        let rel = rel_to(&got, &x);
        row.check = if rel <= REL_BOUND { format!("ok vs CPU (rel {rel:.1e})") } else { format!("WRONG vs CPU (rel {rel:.1e})") };
        rows.push(row);
    }

    if gpu.info.is_cpu() {
        println!("grid barriers: skipped on a CPU adapter (its workgroups are not all resident at once)");
        return Ok(rows);
    }
    // Barrier alone: a message passed to the neighbour each phase.
    let phases = phases.next_multiple_of(2);
    for (name, groups, turn) in [
        ("grid.barrier12", 12u32, 0u32),
        ("grid.barrier132", 132, 0),
        ("grid.barrier132.reuse", 132, 1),
        ("grid.barrier132.atomic", 132, 2),
    ] {
        eprintln!("  {name}");
        let k = if turn == 2 { &barrier_atomic } else { &barrier };
        let rows_n = if turn >= 1 { 2 } else { phases as u64 + 1 };
        let msg = gpu.buffer("lab grid msg", rows_n * groups as u64 * 32 * 4)?;
        gpu.fill_u32(&sync, 0);
        let dummy = gpu.buffer("lab grid w", 16)?;
        let bind = lab.bind(k, &lab.uniform(&[phases, groups, turn, 0, 0, 0, 0, 0]), &[&dummy, &msg, &sync, &msg]);
        let what = match turn {
            0 => "a fresh message row each phase",
            1 => "two message rows in turn",
            _ => "two message rows in turn, atomic loads and stores",
        };
        let mut row = Row::new(
            Section::Probe,
            name,
            &format!("{phases} grid barriers in one dispatch of {groups} workgroups, {what} (per barrier)"),
        );
        let t = lab.time(k, &[bind], [groups, 1], 1)?;
        row.dep = Some(t.per(phases));
        let timeouts = gpu.read_u32(&sync, 1, 1)?[0];
        let last = if turn >= 1 { 0 } else { phases as u64 };
        let got: Vec<f32> = if turn == 2 {
            gpu.read_u32(&sync, 32, groups as usize * 32)?.iter().map(|&v| v as f32).collect()
        } else {
            gpu.read_f32(&msg, last * groups as u64 * 32, groups as usize * 32)?
        };
        let want = if turn >= 1 { runs * phases as f32 } else { phases as f32 };
        let bad: Vec<f32> = (0..groups as usize).map(|w| got[w * 32]).filter(|&v| v != want).collect();
        row.check = match (timeouts, bad.len()) {
            (0, 0) => "ok".into(),
            (0, b) => format!("WRONG ({b} of {groups} messages, e.g. {} for {want})", bad[0]),
            (t, _) => format!("WRONG ({t} spins gave up)"),
        };
        rows.push(row);
    }

    for (name, k, groups, sk, what) in [
        ("grid.gemv_sync12", &chain_atomic, GRID_TILES, 0, "next weights loaded before each barrier, x by atomic loads"),
        ("grid.gemv_sync132", &chain_atomic, 132, 0, "next weights loaded before each barrier, x by atomic loads"),
        ("grid.gemv_sync132.skew", &chain_atomic, 132, 2, "the same, rows straddling 128-byte lines"),
        ("grid.gemv_sync12.plain", &chain, GRID_TILES, 0, "next weights loaded before each barrier, x by plain loads"),
        ("grid.gemv_sync132.plain", &chain, 132, 0, "next weights loaded before each barrier, x by plain loads"),
        ("grid.gemv_sync132.plain_skew", &chain, 132, 2, "the same, rows straddling 128-byte lines"),
        ("grid.gemv_sync12.late", &late, GRID_TILES, 0, "weights loaded after each barrier, x by plain loads"),
    ] {
        eprintln!("  {name}");
        skew.set(sk);
        poison();
        let bind = lab.bind(k, &lab.uniform(&[GRID_GEMVS, groups, 0, sk, 0, 0, 0, 0]), &[&w, &xs, &sync, &xs]);
        let mut row = Row::new(
            Section::Probe,
            name,
            &format!("{GRID_GEMVS} GEMVs in one dispatch of {groups} workgroups, a grid barrier between, {what} (per GEMV)"),
        );
        let t = lab.time(k, &[bind], [groups, 1], 1)?;
        row.dep = Some(t.per(GRID_GEMVS));
        row.bytes = Some(bytes / GRID_GEMVS as u64);
        row.check = check("vs CPU")?;
        rows.push(row);
    }
    rows.extend(grid_sync_hbm_rows(lab, &sync)?);
    Ok(rows)
}

/// GEMVs of grid_sync_rows' chain over this many distinct 384 x 384 matrices (127 MB, past
/// the H100's 50 MB and the H200's 60 MB of L2), so each phase's weights come from HBM.
const GRID_HBM_GEMVS: u32 = 432;

/// What a persistent decode step would save per phase where a step's dispatches pay what
/// they pay in the engine: weights from HBM, new parameters and new code at every dispatch.
/// The same GEMV (grid_sync.wgsl) as GRID_HBM_GEMVS dependent dispatches, each with its own
/// parameter block, one program or four in turn (the products in four orders); against all
/// phases in one dispatch with a grid barrier between them, the next weights loaded before
/// each barrier or after it. Each row's time is per phase; each checked against the CPU.
fn grid_sync_hbm_rows(lab: &Lab, sync: &wgpu::Buffer) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let rw = Access::ReadWrite;
    let layout = [Access::Read, rw, rw, rw];
    let phase = gpu.kernel_entry("lab.grid.phase", GRID_SYNC, "main_phase", &layout)?;
    let rot: Vec<Arc<Kernel>> = ["main_phase_r1", "main_phase_r2", "main_phase_r3"]
        .iter()
        .map(|e| gpu.kernel_entry(static_name(&format!("lab.grid.{e}")), GRID_SYNC, e, &layout))
        .collect::<Result<_, _>>()?;
    let chain_atomic = gpu.kernel_entry("lab.grid.chain_atomic", GRID_SYNC, "main_chain_atomic", &layout)?;
    let late = gpu.kernel_entry("lab.grid.chain_late", GRID_SYNC, "main_chain_late", &layout)?;
    let (n, phases) = (GRID_N, GRID_HBM_GEMVS);
    let (wbits, x0, mut rows_want) = gemv_chain_inputs(phases, 0x4b4d_0a11);
    let want = rows_want.pop().expect("a chain of GEMVs");
    drop(rows_want);
    let w = gpu.upload("lab grid hbm w", bytemuck::cast_slice(&wbits))?;
    drop(wbits);
    let xs = gpu.buffer("lab grid hbm x", (phases as u64 + 1) * n as u64 * 4)?;
    let bytes = (n * n * 2 + n * 8) as u64;
    let poison = || {
        gpu.fill_u32(&xs, 0x7fc0_0000);
        gpu.write(&xs, 0, bytemuck::cast_slice(&x0));
        gpu.fill_u32(sync, 0);
    };
    let check = || -> LabResult<String> {
        let timeouts = gpu.read_u32(sync, 1, 1)?[0];
        if timeouts != 0 {
            return Ok(format!("WRONG ({timeouts} spins gave up)"));
        }
        let got = gpu.read_f32(&xs, phases as u64 * n as u64, n)?;
        let rel = rel_to(&got, &want);
        Ok(if rel <= REL_BOUND { format!("ok vs CPU (rel {rel:.1e})") } else { format!("WRONG vs CPU (rel {rel:.1e})") })
    };
    let mut rows = Vec::new();
    let binds: Vec<wgpu::BindGroup> = (0..phases)
        .map(|i| lab.bind(&phase, &lab.uniform(&[phases, GRID_TILES, i, 0, n as u32, n as u32, 0, 0]), &[&w, &xs, sync, &xs]))
        .collect();
    let mixed: [&Kernel; 4] = [&phase, &rot[0], &rot[1], &rot[2]];
    for (name, kernels, what) in [
        ("grid.hbm.dispatches", &mixed[..1], "one program"),
        ("grid.hbm.dispatches.mixed", &mixed[..], "four programs in turn"),
    ] {
        eprintln!("  {name}");
        poison();
        let mut row = Row::new(
            Section::Probe,
            name,
            &format!("{phases} dependent 384x384 GEMVs over as many matrices (HBM), a dispatch of {GRID_TILES} workgroups and a parameter block each, {what} (per GEMV)"),
        );
        row.dep = Some(lab.time_mixed(kernels, &binds, [GRID_TILES, 1], phases)?);
        row.bytes = Some(bytes);
        row.check = check()?;
        rows.push(row);
    }
    for (name, k, groups, what) in [
        ("grid.hbm.sync132", &chain_atomic, 132u32, "next weights loaded before each barrier, x by atomic loads"),
        ("grid.hbm.sync12", &chain_atomic, GRID_TILES, "next weights loaded before each barrier, x by atomic loads"),
        ("grid.hbm.sync12.late", &late, GRID_TILES, "weights loaded after each barrier, x by plain loads"),
    ] {
        eprintln!("  {name}");
        poison();
        let bind = lab.bind(k, &lab.uniform(&[phases, groups, 0, 0, 0, 0, 0, 0]), &[&w, &xs, sync, &xs]);
        let mut row = Row::new(
            Section::Probe,
            name,
            &format!("{phases} GEMVs over as many matrices (HBM) in one dispatch of {groups} workgroups, a grid barrier between, {what} (per GEMV)"),
        );
        let t = lab.time(k, &[bind], [groups, 1], 1)?;
        row.dep = Some(t.per(phases));
        row.bytes = Some(bytes);
        row.check = check()?;
        rows.push(row);
    }
    Ok(rows)
}

/// An indirect-arguments buffer holding one dispatch's grid.
fn dev_indirect(lab: &Lab, grid: [u32; 3]) -> wgpu::Buffer {
    lab.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("lab indirect grid"),
        contents: bytemuck::cast_slice(&grid),
        usage: wgpu::BufferUsages::INDIRECT,
    })
}

/// Submit + wait round trips: one tiny dispatch, and an empty command buffer.
fn submit_rows(lab: &Lab, reps: u32) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let k = gpu.kernel("lab.chain", CHAIN, &[Access::ReadWrite])?;
    let params = lab.uniform(&[0; 4]);
    let y = gpu.buffer("lab submit", 256)?;
    let bind = lab.bind(&k, &params, &[&y]);
    let dev = &gpu.device;
    eprintln!("  submit");
    let mut tiny = Row::new(Section::Probe, "submit+wait.tiny", "1 one-workgroup dispatch");
    tiny.dep = Some(lab.time_round_trips(reps, || {
        let mut enc = dev.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(k.pipeline());
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        enc.finish()
    })?);
    let got = gpu.read_f32(&y, 0, 1)?[0];
    tiny.check = if got == ((lab.batches + 1) * reps) as f32 { "ok".into() } else { format!("WRONG count {got}") };
    let mut empty = Row::new(Section::Probe, "submit+wait.empty", "empty command buffer");
    empty.dep = Some(lab.time_round_trips(reps, || dev.create_command_encoder(&Default::default()).finish())?);
    empty.check = "-".into();
    Ok(vec![tiny, empty])
}

// ---------------------------------------------------------------------------------------
// Cooperative matrices

/// gemm.wgsl in a module that declares cooperative matrices (see its row).
fn vkmm_gemm() -> LabResult<String> {
    let src = format!("enable f16;\nenable wgpu_cooperative_matrix;\n{}", engine::kernels::GEMM_SOURCE);
    Ok(engine::kernels::rewrite_source(
        "gemm_f16.vkmm",
        &src,
        &[
            ("var<workgroup> xs: ", "var<workgroup> vkmm_probe: array<f32, 256>;\nvar<workgroup> xs: "),
            (
                "    store_row(row + 3u, col, c3);\n}",
                "    store_row(row + 3u, col, c3);\n    if (p.flags == 0xffffffffu) {\n        coopStoreT(coop_mat16x16<f32, C>(), &vkmm_probe[0], 16u);\n    }\n}",
            ),
        ],
    )?)
}

/// TFLOP/s of a row whose time is known, for its check column.
fn tflops(flops: f64, t: Timing) -> String {
    format!("{:.1} TFLOP/s", flops / t.best / 1e12)
}

/// A GEMM's inputs for the lab: X [m][k] in [-1, 1), W f16 [k][n] (the engine's layout),
/// a bias, and the output Y [m][n].
fn gemm_inputs(gpu: &Gpu, m: u32, n: u32, kk: u32, seed: &mut u64) -> LabResult<(wgpu::Buffer, wgpu::Buffer, wgpu::Buffer, wgpu::Buffer)> {
    let x: Vec<f32> = (0..m as usize * kk as usize).map(|_| unit(seed) * 2.0 - 1.0).collect();
    let w: Vec<u16> = (0..n as usize * kk as usize).map(|_| half::f16::from_f32(unit(seed) - 0.5).to_bits()).collect();
    let bias: Vec<f32> = (0..n).map(|_| unit(seed)).collect();
    Ok((
        gpu.upload_f32("lab gemm x", &x)?,
        gpu.upload("lab gemm w", bytemuck::cast_slice(&w))?,
        gpu.upload_f32("lab gemm b", &bias)?,
        gpu.buffer("lab gemm y", m as u64 * n as u64 * 4)?,
    ))
}

/// The tensor cores' ceilings (kernel_lab/coop.wgsl), then the shipped encoder GEMM
/// (gemm_coop.wgsl) on tiny.en's two MLP shapes beside the CUDA-core GEMM, and rewrites of
/// it that each remove one part (the lo products, all products, the global loads), so its
/// time can be split between memory, staging and multiply-adds.
fn coop_rows(lab: &Lab) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let mut rows = Vec::new();
    let groups = 1056u32; // 8 per H200 multiprocessor
    let rounds = 1024u32;
    let out = gpu.buffer("lab coop out", groups as u64 * 4 * 1024 * 4)?;
    let params = lab.uniform(&[rounds, 0, 0, 0]);
    for (entry, name, change) in [
        ("main_regs", "coop.mma", "4 independent MMAs per round, operands in registers"),
        ("main_shared", "coop.load+mma", "2 A + 2 B loads from workgroup memory, 4 MMAs"),
    ] {
        eprintln!("  {name}");
        let k = gpu.kernel_entry(static_name(name), COOP, entry, &[Access::ReadWrite])?;
        let bind = lab.bind(&k, &params, &[&out]);
        let mut row = Row::new(Section::Probe, name, change);
        let t = lab.time(&k, &[bind], [groups, 1], 5)?;
        row.dep = Some(t);
        row.check = tflops(groups as f64 * 4.0 * rounds as f64 * 4.0 * 8192.0, t);
        rows.push(row);
    }

    // The encoder GEMM, as shipped and with parts removed.
    let lo_loads = [
        "            let l0 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[sr * XS_STRIDE + kk], XS_STRIDE);\n",
        "            let l1 = coopLoadT<coop_mat16x16<f16, A>>(&xs_lo[(sr + 16u) * XS_STRIDE + kk], XS_STRIDE);\n",
    ];
    let lo_mma = [
        "            d00 = coopMultiplyAdd(l0, b0, d00);\n",
        "            d01 = coopMultiplyAdd(l0, b1, d01);\n",
        "            d10 = coopMultiplyAdd(l1, b0, d10);\n",
        "            d11 = coopMultiplyAdd(l1, b1, d11);\n",
    ];
    let hi_mma = [
        "            c00 = coopMultiplyAdd(a0, b0, c00);\n",
        "            c01 = coopMultiplyAdd(a0, b1, c01);\n",
        "            c10 = coopMultiplyAdd(a1, b0, c10);\n",
        "            c11 = coopMultiplyAdd(a1, b1, c11);\n",
    ];
    let cut = |lines: &[&'static str]| lines.iter().map(|l| (*l, "")).collect::<Vec<_>>();
    let no_lo: Vec<_> = cut(&lo_loads).into_iter().chain(cut(&lo_mma)).collect();
    let no_mma: Vec<_> = no_lo.iter().copied().chain(cut(&hi_mma)).collect();
    let no_fetch = vec![("if (k1 < p.k) {", "if (k1 < 0u) {")];
    let src = engine::kernels::GEMM_COOP_SOURCE;
    // (name, change, source, rows per workgroup)
    let variants: Vec<(&str, &str, String, u32)> = vec![
        ("gemm_f16", "CUDA cores (gemm.wgsl), the reference", engine::kernels::GEMM_SOURCE.to_string(), 64),
        ("gemm_coop", "as shipped: hi and lo products", src.to_string(), 64),
        (
            "gemm_coop.no_lo",
            "without the lo loads and products",
            engine::kernels::rewrite_source("no_lo", src, &no_lo)?,
            64,
        ),
        (
            "gemm_coop.no_mma",
            "staging + hi loads only, no products",
            engine::kernels::rewrite_source("no_mma", src, &no_mma)?,
            64,
        ),
        (
            "gemm_coop.no_fetch",
            "only the first K slice read from memory",
            engine::kernels::rewrite_source("no_fetch", src, &no_fetch)?,
            64,
        ),
        // Is the memory model the cost? naga declares the Vulkan memory model for any
        // module with cooperative matrices; this is the CUDA-core GEMM in such a module (a
        // cooperative store no dispatch takes: flags are never all ones).
        ("gemm_f16.vkmm", "CUDA-core GEMM under the Vulkan memory model", vkmm_gemm()?, 64),
    ];
    let mut seed = 0x5eedu64;
    for &(m, n, kk) in &[(1500u32, 1536u32, 384u32), (1500, 384, 1536)] {
        let (xb, wb, bb, yb) = gemm_inputs(gpu, m, n, kk, &mut seed)?;
        // m n k flags(bias) x_off x_stride y_off y_stride conv*4
        let params = lab.uniform(&[m, n, kk, 1, 0, kk, 0, n, 0, 0, 0, 0]);
        let flops = 2.0 * m as f64 * n as f64 * kk as f64;
        let mut reference: Option<Vec<f32>> = None;
        for (name, change, vsrc, cm) in &variants {
            let label = format!("{name} {m}x{n}x{kk}");
            eprintln!("  {label}");
            let k = match gpu.kernel(
                static_name(&label),
                vsrc,
                &[Access::Read, Access::Read, Access::Read, Access::ReadWrite],
            ) {
                Ok(k) => k,
                Err(e) => {
                    let mut row = Row::new(Section::Probe, &label, change);
                    row.check = format!("does not build: {e}");
                    rows.push(row);
                    continue;
                }
            };
            let bind = lab.bind(&k, &params, &[&xb, &wb, &bb, &yb]);
            let grid = [n.div_ceil(64), m.div_ceil(*cm)];
            gpu.fill_u32(&yb, 0x7fc0_0000);
            lab.run_once(&k, &bind, grid)?;
            let got = gpu.read_f32(&yb, 0, (m * n) as usize)?;
            let check = match (&reference, *name) {
                (None, _) => "reference".to_string(),
                (Some(r), _) if !name.contains(".no_") => rel_check(&got, r),
                _ => "timing only".to_string(),
            };
            if reference.is_none() {
                reference = Some(got);
            }
            let mut row = Row::new(Section::Probe, &label, change);
            let t = lab.time(&k, &[bind], grid, 5)?;
            row.dep = Some(t);
            row.check = format!("{check}, {}", tflops(flops, t));
            eprintln!("    {:.1} µs, {}", t.best * 1e6, row.check);
            rows.push(row);
        }
    }
    Ok(rows)
}

/// attention.wgsl with its tiled kernel reshaped: `tq` queries x `splits` key splits per
/// workgroup, chunks of `ch` keys (every derived constant rewritten with them).
fn tiled_attention_variant(tq: u32, splits: u32, ch: u32) -> LabResult<String> {
    let td4 = 16;
    let (kv, merge) = (ch * td4, splits / 2 * tq * td4);
    let edits = [
        ("const TQ: u32 = 32u;".to_string(), format!("const TQ: u32 = {tq}u;")),
        ("const SPLITS: u32 = 4u;".into(), format!("const SPLITS: u32 = {splits}u;")),
        ("const LOG_SPLITS: u32 = 2u;".into(), format!("const LOG_SPLITS: u32 = {}u;", splits.trailing_zeros())),
        ("const CH: u32 = 32u;".into(), format!("const CH: u32 = {ch}u;")),
        ("const KPT: u32 = 8u;".into(), format!("const KPT: u32 = {}u;", ch / splits)),
        ("const KV: u32 = 512u;".into(), format!("const KV: u32 = {kv}u;")),
        ("const TSH: u32 = 1024u;".into(), format!("const TSH: u32 = {}u;", (2 * kv).max(merge))),
        ("const TWG: u32 = 128u;".into(), format!("const TWG: u32 = {}u;", tq * splits)),
        ("const MLN: u32 = 64u;".into(), format!("const MLN: u32 = {}u;", splits / 2 * tq)),
    ];
    let e: Vec<(&str, &str)> = edits.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    Ok(engine::kernels::rewrite_source("tiled attention", engine::kernels::ATTENTION_SOURCE, &e)?)
}

/// Relative RMS difference of `got` from `want`, "ok" within 1e-5.
fn rel_check(got: &[f32], want: &[f32]) -> String {
    let num: f64 = got.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    let e = (num / den).sqrt();
    if e.is_nan() || e > 1e-5 {
        format!("WRONG rel err {e:.1e}")
    } else {
        format!("ok ({e:.0e})")
    }
}

/// Where gemm_planes.wgsl's K loop starts and ends in `src` (byte offsets: from the loop's
/// head to the epilogue), and its products' loop through the K loop's closing brace
/// (dropped), for the rewrites below that rebuild the loop around it.
fn planes_k_loop<'a>(src: &'a str, what: &str) -> LabResult<(usize, usize, &'a str)> {
    let head = "    for (var k0 = 0u; k0 < p.k; k0 += CK) {\n";
    let tail = "    let cb = sg * 16u * CS_STRIDE;";
    let mma_head = "        for (var kk = 0u; kk < CK; kk += 16u) {";
    let (a, b) = (src.find(head).ok_or(format!("{what}: no K loop"))?, src.find(tail).ok_or(format!("{what}: no epilogue"))?);
    let body = &src[a..b];
    let mma_at = body.find(mma_head).ok_or(format!("{what}: no products"))?;
    let mma = body[mma_at..].trim_end().strip_suffix('}').ok_or(format!("{what}: K loop not closed"))?;
    Ok((a, b, mma))
}

/// gemm_planes.wgsl (any tile) with each slice's words loaded two slices ahead: the K loop
/// unrolled by two over two register sets, so a set's loads have two slices' products to
/// land in instead of one. K must be a multiple of 2 CK (every lab shape is).
fn planes_prefetch2(src: &str) -> LabResult<String> {
    let (a, b, mma) = planes_k_loop(src, "pf2")?;
    let set = |h: &str, l: &str, wv: &str, at: &str| {
        format!(
            "for (var i = 0u; i < NX; i++) {{\n                {h}[i] = xw(hb, {at}, lid, i);\n                {l}[i] = xw(lb, {at}, lid, i);\n            }}\n            for (var i = 0u; i < NW; i++) {{\n                {wv}[i] = ww(col0, {at}, lid, i);\n            }}"
        )
    };
    let put = |h: &str, l: &str, wv: &str| {
        format!(
            "        workgroupBarrier();\n        for (var i = 0u; i < NX; i++) {{\n            put_x({h}[i], {l}[i], lid, i);\n        }}\n        for (var i = 0u; i < NW; i++) {{\n            put_w({wv}[i], lid, i);\n        }}\n        workgroupBarrier();\n"
        )
    };
    let new_loop = format!(
        "    var h2: array<vec4<f16>, NX>;\n    var l2: array<vec4<f16>, NX>;\n    var wv2: array<vec4<f16>, NW>;\n    if (CK < p.k) {{\n            {}\n    }}\n    for (var k0 = 0u; k0 < p.k; k0 += 2u * CK) {{\n{}        if (k0 + 2u * CK < p.k) {{\n            {}\n        }}\n{}\n{}        if (k0 + 3u * CK < p.k) {{\n            {}\n        }}\n{}\n    }}\n",
        set("h2", "l2", "wv2", "CK"),
        put("h", "l", "wv"),
        set("h", "l", "wv", "k0 + 2u * CK"),
        mma,
        put("h2", "l2", "wv2"),
        set("h2", "l2", "wv2", "k0 + 3u * CK"),
        mma
    );
    let out = format!("{}{}{}", &src[..a], new_loop, &src[b..]);
    if out.matches("coopMultiplyAdd").count() != 2 * src.matches("coopMultiplyAdd").count() {
        return Err("pf2: the products were not doubled".into());
    }
    Ok(out)
}

/// gemm_planes.wgsl (any tile) staged through two buffers of workgroup memory in turn: a
/// slice's words are stored into one while the other's are multiplied, one barrier a slice
/// instead of two.
fn planes_double_buffer(src: &str) -> LabResult<String> {
    let (a, b, mma) = planes_k_loop(src, "db")?;
    let mma = mma.replace("&ws[", "&ws[sb * (CK * WS4) + ").replace("&xs_hi[", "&xs_hi[sb * (TM * XS4) + ").replace("&xs_lo[", "&xs_lo[sb * (TM * XS4) + ");
    let put = "for (var i = 0u; i < NX; i++) {\n            put_x(h[i], l[i], lid, i);\n        }\n        for (var i = 0u; i < NW; i++) {\n            put_w(wv[i], lid, i);\n        }";
    let load = |at: &str| {
        format!(
            "for (var i = 0u; i < NX; i++) {{\n                h[i] = xw(hb, {at}, lid, i);\n                l[i] = xw(lb, {at}, lid, i);\n            }}\n            for (var i = 0u; i < NW; i++) {{\n                wv[i] = ww(col0, {at}, lid, i);\n            }}"
        )
    };
    let new_loop = format!(
        "    sbuf = 0u;\n        {put}\n    if (CK < p.k) {{\n            {}\n    }}\n    for (var k0 = 0u; k0 < p.k; k0 += CK) {{\n        workgroupBarrier();\n        let sb = (k0 / CK) % 2u;\n        if (k0 + CK < p.k) {{\n            sbuf = 1u - sb;\n        {put}\n            if (k0 + 2u * CK < p.k) {{\n            {}\n            }}\n        }}\n{mma}\n    }}\n",
        load("CK"),
        load("k0 + 2u * CK"),
    );
    let out = format!("{}{}{}", &src[..a], new_loop, &src[b..]);
    Ok(engine::kernels::rewrite_source(
        "double_buffer",
        &out,
        &[
            ("var<workgroup> xs_hi: array<vec4<f16>, TM * XS4>;", "var<private> sbuf: u32;\nvar<workgroup> xs_hi: array<vec4<f16>, 2u * TM * XS4>;"),
            ("var<workgroup> xs_lo: array<vec4<f16>, TM * XS4>;", "var<workgroup> xs_lo: array<vec4<f16>, 2u * TM * XS4>;"),
            ("var<workgroup> ws: array<vec4<f16>, CK * WS4>;", "var<workgroup> ws: array<vec4<f16>, 2u * CK * WS4>;"),
            ("    xs_hi[s] = hi;\n    xs_lo[s] = lo;", "    xs_hi[sbuf * (TM * XS4) + s] = hi;\n    xs_lo[sbuf * (TM * XS4) + s] = lo;"),
            ("    ws[(e / TN4) * WS4 + e % TN4] = v;", "    ws[sbuf * (CK * WS4) + (e / TN4) * WS4 + e % TN4] = v;"),
        ],
    )?)
}

/// gemm_planes.wgsl (any tile) with one part of its K loop taken away (timing only).
fn planes_probe(src: &str, what: &str) -> LabResult<String> {
    let stage = "        workgroupBarrier();\n        for (var i = 0u; i < NX; i++) {\n            put_x(h[i], l[i], lid, i);\n        }\n        for (var i = 0u; i < NW; i++) {\n            put_w(wv[i], lid, i);\n        }\n        workgroupBarrier();\n";
    let edit: (&str, String) = match what {
        // A runtime-false condition: the loads stay compiled, never issued.
        "no_refill" => ("        if (k1 < p.k) {\n", "        if (k1 < p.k && p.flags > 1000000u) {\n".to_string()),
        "no_stage" => (stage, format!("        workgroupBarrier();\n        if (k0 == 0u) {{\n{}        }}\n        workgroupBarrier();\n", &stage["        workgroupBarrier();\n".len()..stage.len() - "        workgroupBarrier();\n".len()])),
        "no_barrier" => (stage, stage.replace("        workgroupBarrier();\n", "")),
        "hi_only" => ("            d00 = coopMultiplyAdd(e0, b0, d00);\n            d01 = coopMultiplyAdd(e0, b1, d01);\n", String::new()),
        _ => return Err(format!("no probe {what}").into()),
    };
    Ok(engine::kernels::rewrite_source(what, src, &[(edit.0, edit.1.as_str())])?)
}

/// gemm_planes.wgsl (any tile) with K split over `splits` workgroups a tile (grid y =
/// row tiles x splits, split-major). Each split writes Y as the whole GEMM would: a probe of
/// what a split-K GEMM's products cost before any reduction, not a GEMM.
fn planes_split_k(src: &str, splits: u32) -> LabResult<String> {
    let row0 = format!(
        "    let tiles_m = p.m_pad / TM;\n    let row0 = (wg.y % tiles_m) * TM;\n    let kb = (wg.y / tiles_m) * (p.k / {splits}u);\n    let ke = kb + p.k / {splits}u;\n"
    );
    Ok(engine::kernels::rewrite_source(
        "split_k",
        src,
        &[
            ("    let row0 = wg.y * TM;\n", &row0),
            ("        h[i] = xw(hb, 0u, lid, i);\n        l[i] = xw(lb, 0u, lid, i);\n", "        h[i] = xw(hb, kb, lid, i);\n        l[i] = xw(lb, kb, lid, i);\n"),
            ("        wv[i] = ww(col0, 0u, lid, i);\n", "        wv[i] = ww(col0, kb, lid, i);\n"),
            ("    for (var k0 = 0u; k0 < p.k; k0 += CK) {\n", "    for (var k0 = kb; k0 < ke; k0 += CK) {\n"),
            ("        if (k1 < p.k) {\n", "        if (k1 < ke) {\n"),
        ],
    )?)
}

/// The encoder's self-attention (tiny.en: 1500 frames, 6 heads of 64): the tiled kernel,
/// the register-blocked one that ships (attention_blocked.wgsl, in 1, 2, 4 and 8 key
/// splits, those above one with attention.wgsl's merge timed beside), and reshapes of the tiled
/// one (queries x key splits x chunk per workgroup; any device),
/// then, where the device has cooperative matrices, kernels over f16 hi/lo planes
/// (split_f16.wgsl makes them): the shipped tensor-core attention (attention_coop.wgsl +
/// attention.wgsl's merge; rewrites without its P·V or its Q·K products, and with its
/// softmax read from registers), and the encoder GEMM on tiny.en's shapes: the lab's
/// gemm_direct.wgsl (every operand loaded straight from memory, with rewrites that take the
/// epilogue away, hoist every load out of the K loop or make the strides constants) against
/// the shipped gemm_coop.wgsl and gemm_planes.wgsl. What they found (H200): feeding the
/// tensor cores is the cost; fragments loaded straight from memory were as slow as
/// gemm_coop's staging (102 against 100 us; products alone 14), staged vec4<f16> words
/// halved it (39-46), and the same staging took the attention from 525 (fragments from
/// memory, the lab's former attn_coop.wgsl) to 290 us.
fn coop_direct_rows(lab: &Lab, attention_only: bool, gemm_only: bool) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let mut rows = Vec::new();
    let mut seed = 0xd1ec7u64;
    let timed = |rows: &mut Vec<Row>, name: &str, change: &str, k: &Kernel, bind: wgpu::BindGroup, grid: [u32; 2], check: String| -> LabResult<Timing> {
        let t = lab.time(k, &[bind], grid, 5)?;
        let mut row = Row::new(Section::Probe, name, change);
        row.dep = Some(t);
        row.check = check;
        eprintln!("    {name}: {:.1} µs, {}", t.best * 1e6, row.check);
        rows.push(row);
        Ok(t)
    };
    let split_rows = gpu.kernel_entry("lab split_f16 rows", SPLIT_F16, "main_rows", &[Access::Read, Access::ReadWrite])?;
    let split_heads = gpu.kernel_entry("lab split_f16 heads", SPLIT_F16, "main_heads", &[Access::Read, Access::ReadWrite])?;
    let (r, w) = (Access::Read, Access::ReadWrite);

    if !gemm_only {
        // Attention: tiny.en's encoder self-attention, 1500 frames, 6 heads of 64.
        let (t, heads) = (1500u32, 6u32);
        let d = heads * 64;
        let t_pad = t.div_ceil(64) * 64;
        let scale = 0.125f32;
        eprintln!("  coop attention {t} x {heads} heads");
        let qkv: Vec<f32> = (0..t as usize * 3 * d as usize).map(|_| unit(&mut seed) * 4.0 - 2.0).collect();
        let qkvb = gpu.upload_f32("lab qkv", &qkv)?;
        let out = gpu.buffer("lab attn out", t as u64 * d as u64 * 4)?;
        let att_tiled = gpu.kernel_entry("attention_tiled", engine::kernels::ATTENTION_SOURCE, "main_tiled", &[r, r, r, w])?;
        let att_merge = gpu.kernel_entry("attention_merge", engine::kernels::ATTENTION_SOURCE, "main_merge", &[r, r, r, w])?;
        let att_params = |split_keys: u32| {
            lab.uniform(&[t, t, heads, 64, 0, 3 * d, d, 3 * d, 2 * d, 3 * d, 0, d, 0, 0, scale.to_bits(), split_keys, 0, 0, 0, 0])
        };
        let tp = att_params(0);
        let tgrid = [t.div_ceil(32), heads];
        let bind = lab.bind(&att_tiled, &tp, &[&qkvb, &qkvb, &qkvb, &out]);
        gpu.fill_u32(&out, 0x7fc0_0000);
        lab.run_once(&att_tiled, &bind, tgrid)?;
        let want = gpu.read_f32(&out, 0, (t * d) as usize)?;
        let attn_flops = 4.0 * t as f64 * t as f64 * d as f64;
        let tt = timed(&mut rows, "attention_tiled 1500x6x64", "CUDA cores, a thread per query (VERBATIM_ATTENTION_TILED=1)", &att_tiled, bind, tgrid, "reference".into())?;
        rows.last_mut().unwrap().check = format!("reference, {}", tflops(attn_flops, tt));
        // Shipped for the encoder: register-blocked, 32 queries x 32-key blocks per workgroup,
        // the keys in 1, 2, 4 (ATTENTION_BLOCKED_SPLITS) or 8 splits of whole blocks, each a
        // workgroup writing its partial for attention.wgsl's merge (one split: the output).
        let att_blocked = gpu.kernel_entry("attention_blocked", engine::kernels::ATTENTION_BLOCKED_SOURCE, "main_blocked", &[r, r, r, w])?;
        let max_splits = 8u32;
        let bpart = gpu.buffer("lab blocked partials", t as u64 * heads as u64 * max_splits as u64 * 66 * 4)?;
        for asked in [1u32, 2, 4, max_splits] {
            let split_keys = engine::kernels::attention_blocked_split_keys(t, asked);
            let n_splits = t.div_ceil(split_keys);
            let bp = att_params(split_keys);
            let bgrid = [t.div_ceil(32), heads * n_splits];
            let shipped = if asked == engine::kernels::ATTENTION_BLOCKED_SPLITS { "shipped: " } else { "" };
            let plural = if n_splits == 1 { "" } else { "s" };
            let change = format!("{shipped}CUDA cores, register-blocked, {n_splits} key split{plural} of {split_keys}");
            let name = format!("attention_blocked/{n_splits} 1500x6x64");
            if n_splits == 1 {
                let bbind = lab.bind(&att_blocked, &bp, &[&qkvb, &qkvb, &qkvb, &out]);
                gpu.fill_u32(&out, 0x7fc0_0000);
                lab.run_once(&att_blocked, &bbind, bgrid)?;
                let c = rel_check(&gpu.read_f32(&out, 0, (t * d) as usize)?, &want);
                let tb = timed(&mut rows, &name, &change, &att_blocked, bbind, bgrid, String::new())?;
                rows.last_mut().unwrap().check = format!("{c}, {}", tflops(attn_flops, tb));
                continue;
            }
            let bbind = lab.bind(&att_blocked, &bp, &[&qkvb, &qkvb, &qkvb, &bpart]);
            let mgrid = [t, heads];
            let mbind = lab.bind(&att_merge, &bp, &[&bpart, &qkvb, &qkvb, &out]);
            gpu.fill_u32(&bpart, 0x7fc0_0000);
            gpu.fill_u32(&out, 0x7fc0_0000);
            lab.run_once(&att_blocked, &bbind, bgrid)?;
            lab.run_once(&att_merge, &mbind, mgrid)?;
            let c = rel_check(&gpu.read_f32(&out, 0, (t * d) as usize)?, &want);
            let tb = timed(&mut rows, &name, &change, &att_blocked, bbind, bgrid, String::new())?;
            let tm = timed(&mut rows, &format!("attention_merge /{n_splits}"), "the blocked splits' partials merged", &att_merge, mbind, mgrid, "timing only".into())?;
            let total = tb.best + tm.best;
            let at = rows.len() - 2;
            let tot = format!("{:.1} TFLOP/s", attn_flops / total / 1e12);
            rows[at].check = format!("{c}, {} alone; blocked+merge {:.1} µs, {tot}", tflops(attn_flops, tb), total * 1e6);
        }
        // The tiled kernel reshaped: (queries, key splits, chunk) per workgroup.
        for (tq, splits, ch) in [(32u32, 4u32, 16u32), (32, 8, 32), (16, 8, 32), (16, 16, 64), (64, 4, 16)] {
            let name = format!("attention_tiled.{tq}x{splits}x{ch}");
            let k = gpu.kernel_entry(static_name(&name), &tiled_attention_variant(tq, splits, ch)?, "main_tiled", &[r, r, r, w])?;
            let g = [t.div_ceil(tq), heads];
            let bind = lab.bind(&k, &tp, &[&qkvb, &qkvb, &qkvb, &out]);
            gpu.fill_u32(&out, 0x7fc0_0000);
            lab.run_once(&k, &bind, g)?;
            let c = rel_check(&gpu.read_f32(&out, 0, (t * d) as usize)?, &want);
            let change = format!("{tq} queries x {splits} key splits, chunks of {ch} keys");
            let tv = timed(&mut rows, &format!("{name} 1500x6x64"), &change, &k, bind, g, String::new())?;
            rows.last_mut().unwrap().check = format!("{c}, {}", tflops(attn_flops, tv));
        }
        if !gpu.info.coop_matrix {
            return Ok(rows);
        }
        let planes = gpu.buffer("lab head planes", 6 * heads as u64 * t_pad as u64 * 64 * 2)?;
        let sp = lab.uniform(&[t, 0, t_pad, heads, 0, 3 * d, scale.to_bits(), 0, 0, 0, 0, 0]);
        let sgrid = grid((3 * heads as u64 * t_pad as u64 * 32).div_ceil(256));
        let sbind = lab.bind(&split_heads, &sp, &[&qkvb, &planes]);
        gpu.fill_u32(&planes, 0x7e00_7e00);
        lab.run_once(&split_heads, &sbind, sgrid)?;
        let ts = timed(&mut rows, "split_f16 heads 1500x6", "Q, K, V into f16 hi/lo head planes", &split_heads, sbind, sgrid, "timing only".into())?;
        // The shipped kernel, and with parts taken out (time only): its P·V or Q·K products,
        // the K|V loads after the first block.
        let no_pv: Vec<(&str, &str)> = (0..4)
            .map(|i| [
                "            pv(&oh0, &ol0, ah, al, t, 0u);\n",
                "            pv(&oh1, &ol1, ah, al, t, 1u);\n",
                "            pv(&oh2, &ol2, ah, al, t, 2u);\n",
                "            pv(&oh3, &ol3, ah, al, t, 3u);\n",
            ][i])
            .map(|l| (l, ""))
            .collect();
        let no_qk: Vec<(&str, &str)> = [
            "            qk(&sh, &sl, qh0, ql0, t, 0u);\n",
            "            qk(&sh, &sl, qh1, ql1, t, 1u);\n",
            "            qk(&sh, &sl, qh2, ql2, t, 2u);\n",
            "            qk(&sh, &sl, qh3, ql3, t, 3u);\n",
        ]
        .iter()
        .map(|l| (*l, ""))
        .collect();
        let mut att_variants = vec![
            ("", ", shipped: K|V staged as vec4<f16> words, softmax from registers".to_string(), ATTN_STAGED.to_string()),
            (".no_pv", " (no P·V products)".to_string(), engine::kernels::rewrite_source("no_pv", ATTN_STAGED, &no_pv)?),
            (".no_qk", " (no Q·K products)".to_string(), engine::kernels::rewrite_source("no_qk", ATTN_STAGED, &no_qk)?),
            (".no_stage", " (the first block's K|V reused: no loads after it)".to_string(), engine::kernels::rewrite_source("no_stage", ATTN_STAGED, &[("            stage(j0 + BK, hb4, plane4, lid);\n", "")])?),
            (".out4", " (P·V accumulators kept over 4 blocks: the output's round trip through workgroup memory every 4th)".to_string(), attention_out4()?),
        ];
        let mut runs = vec![(384u32, 0usize), (768, 0), (384, 1), (384, 2), (384, 3), (384, 4)];
        if gpu.device.features().contains(wgpu::Features::SUBGROUP_BARRIER) {
            att_variants.push((".sgbar", " (subgroup barriers where a subgroup only meets its own tiles: 2 workgroup barriers a block instead of 6; timing only, not ordered for workgroup memory by the SPIR-V naga writes)".to_string(), attention_subgroup_barriers()?));
            runs.push((384, att_variants.len() - 1));
        }
        for (split_keys, vi) in runs {
            let (suffix, what, vsrc) = &att_variants[vi];
            let att_coop = gpu.kernel(static_name(&format!("lab attention_coop{suffix}")), vsrc, &[r, w])?;
            let n_splits = t.div_ceil(split_keys);
            let part = gpu.buffer("lab attn partials", t as u64 * heads as u64 * n_splits as u64 * 66 * 4)?;
            let cp = lab.uniform(&[t, t, heads, t_pad, split_keys, n_splits, 0, 0]);
            let cgrid = [t_pad / engine::kernels::ATTENTION_COOP_QUERIES, heads * n_splits];
            let cbind = lab.bind(&att_coop, &cp, &[&planes, &part]);
            let mp = att_params(split_keys);
            let mgrid = [t, heads];
            let mbind = lab.bind(&att_merge, &mp, &[&part, &qkvb, &qkvb, &out]);
            gpu.fill_u32(&part, 0x7fc0_0000);
            gpu.fill_u32(&out, 0x7fc0_0000);
            lab.run_once(&att_coop, &cbind, cgrid)?;
            lab.run_once(&att_merge, &mbind, mgrid)?;
            let c = if vi == 0 { rel_check(&gpu.read_f32(&out, 0, (t * d) as usize)?, &want) } else { "timing only".into() };
            let tc = timed(
                &mut rows,
                &format!("attention_coop{suffix} 1500x6x64 /{n_splits}"),
                &format!("tensor cores, Q from memory, {n_splits} key splits{what}"),
                &att_coop,
                cbind,
                cgrid,
                String::new(),
            )?;
            let tm = timed(&mut rows, &format!("attention_merge /{n_splits}"), "the splits' partials merged", &att_merge, mbind, mgrid, "timing only".into())?;
            let total = ts.best + tc.best + tm.best;
            let at = rows.len() - 2;
            rows[at].check = format!("{c}, {}; split+attn+merge {:.1} µs", tflops(attn_flops, tc), total * 1e6);
        }
    }
    if attention_only {
        return Ok(rows);
    }
    // GEMM
    let gemm_ref = gpu.kernel("gemm_f16", engine::kernels::GEMM_SOURCE, &[r, r, r, w])?;
    let gemm_coop = gpu.kernel("gemm_coop", engine::kernels::GEMM_COOP_SOURCE, &[r, r, r, w])?;
    for &(m, n, kk) in &[(1500u32, 1536u32, 384u32), (1500, 384, 1536), (1500, 1152, 384), (1500, 384, 384)] {
        eprintln!("  direct GEMM {m}x{n}x{kk}");
        let m_pad = m.div_ceil(64) * 64;
        let (xb, wb, bb, yb) = gemm_inputs(gpu, m, n, kk, &mut seed)?;
        let planes = gpu.buffer("lab planes", 2 * m_pad as u64 * kk as u64 * 2)?;
        let params = lab.uniform(&[m, n, kk, 1, 0, kk, 0, n, 0, 0, 0, 0]);
        let flops = 2.0 * m as f64 * n as f64 * kk as f64;
        let ref_grid = [n.div_ceil(64), m.div_ceil(64)];
        let bind = lab.bind(&gemm_ref, &params, &[&xb, &wb, &bb, &yb]);
        gpu.fill_u32(&yb, 0x7fc0_0000);
        lab.run_once(&gemm_ref, &bind, ref_grid)?;
        let want = gpu.read_f32(&yb, 0, (m * n) as usize)?;
        let t = lab.time(&gemm_ref, &[bind], ref_grid, 5)?;
        eprintln!("    gemm_f16 {:.1} µs", t.best * 1e6);
        let bind = lab.bind(&gemm_coop, &params, &[&xb, &wb, &bb, &yb]);
        gpu.fill_u32(&yb, 0x7fc0_0000);
        lab.run_once(&gemm_coop, &bind, ref_grid)?;
        let c = rel_check(&gpu.read_f32(&yb, 0, (m * n) as usize)?, &want);
        let tc = timed(&mut rows, &format!("gemm_coop {m}x{n}x{kk}"), "shipped: staged in workgroup memory", &gemm_coop, bind, ref_grid, String::new())?;
        rows.last_mut().unwrap().check = format!("{c}, {}", tflops(flops, tc));

        let sp = lab.uniform(&[m, kk, m_pad, 0, 0, kk, 0, 0, 0, 0, 0, 0]);
        let sgrid = grid((m_pad as u64 * kk as u64 / 2).div_ceil(256));
        let sbind = lab.bind(&split_rows, &sp, &[&xb, &planes]);
        gpu.fill_u32(&planes, 0x7e00_7e00);
        lab.run_once(&split_rows, &sbind, sgrid)?;
        let ts = timed(&mut rows, &format!("split_f16 rows {m}x{kk}"), "X into f16 hi/lo planes", &split_rows, sbind, sgrid, "timing only".into())?;
        // m n k flags(bias) y_off y_stride m_pad
        let dp = lab.uniform(&[m, n, kk, 1, 0, n, m_pad, 0]);
        let dgrid = [n / 64, m_pad / 64];
        let y2 = gpu.buffer("lab gemm y2", 2 * m_pad as u64 * n as u64 * 4)?;
        // Rewrites that each take a part away (the check is then timing only).
        let plain_store: Vec<(&str, String)> = vec![(
            "    emit(c00, d00, cb, lane, row0, col0);\n    emit(c01, d01, cb, lane, row0, col0 + 16u);\n    emit(c10, d10, cb, lane, row0 + 16u, col0);\n    emit(c11, d11, cb, lane, row0 + 16u, col0 + 16u);\n",
            "    let blk = ((wg.y * (p.n / 64u) + wg.x) * 4u + sg) * 2048u;\n    put4(c00, c01, c10, c11, blk);\n    put4(d00, d01, d10, d11, blk + 1024u);\n".to_string(),
        )];
        let mut hoisted = plain_store.clone();
        hoisted.push(("    for (var k0 = 0u; k0 < p.k; k0 += 32u) {\n        let k1 = k0 + 16u;\n", "    let k0 = 0u;\n    let k1 = 16u;\n".into()));
        hoisted.push(("        c00 = coopMultiplyAdd(x0, b0, c00);\n", "    for (var kq = 0u; kq < p.k; kq += 32u) {\n        c00 = coopMultiplyAdd(x0, b0, c00);\n".into()));
        let mut constant = plain_store.clone();
        constant.push(("    let sk = p.k;", format!("    let sk = {kk}u;")));
        constant.push(("    let sn = p.n;", format!("    let sn = {n}u;")));
        fn edits<'a>(e: &'a [(&'a str, String)]) -> Vec<(&'a str, &'a str)> {
            e.iter().map(|(a, b)| (*a, b.as_str())).collect()
        }
        let variants = [
            ("gemm_direct", "operands loaded from memory, no staging", GEMM_DIRECT.to_string()),
            ("gemm_direct.plain_store", "accumulators stored as they are (no epilogue)", engine::kernels::rewrite_source("plain", GEMM_DIRECT, &edits(&plain_store))?),
            ("gemm_direct.hoisted", "plain store, loads hoisted out of the K loop (products only)", engine::kernels::rewrite_source("hoisted", GEMM_DIRECT, &edits(&hoisted))?),
            ("gemm_direct.const", "plain store, strides as constants", engine::kernels::rewrite_source("const", GEMM_DIRECT, &edits(&constant))?),
        ];
        for (vname, change, vsrc) in &variants {
            let label = format!("{vname} {m}x{n}x{kk}");
            let k = gpu.kernel(static_name(&label), vsrc, &[r, r, r, w])?;
            let first = *vname == "gemm_direct";
            let yt = if first { &yb } else { &y2 };
            let dbind = lab.bind(&k, &dp, &[&planes, &wb, &bb, yt]);
            gpu.fill_u32(yt, 0x7fc0_0000);
            lab.run_once(&k, &dbind, dgrid)?;
            let c = if first { rel_check(&gpu.read_f32(&yb, 0, (m * n) as usize)?, &want) } else { "timing only".into() };
            if first {
                let t50 = lab.time(&k, std::slice::from_ref(&dbind), dgrid, 50)?;
                eprintln!("    (50 per batch: {:.1} µs)", t50.best * 1e6);
            }
            let td = timed(&mut rows, &label, change, &k, dbind, dgrid, String::new())?;
            rows.last_mut().unwrap().check = format!("{c}, {}; with split {:.1} µs", tflops(flops, td), (td.best + ts.best) * 1e6);
        }
        // X split into planes beforehand and staged as vec4<f16> words (the engine's
        // gemm_planes.wgsl), and the same with the cooperative loads' strides counted in
        // halves instead of vec4s: the check says which count the driver uses.
        // (name, change, source, rows per workgroup)
        // Probes of the 32-row kernel's slice chain (bench/RESULTS.md 2026-12-05, fifth
        // session): its next slice's words two slices ahead instead of one; K split over 2 or
        // 4 workgroups a tile (every split writes the same Y: timing only, no reduction); two
        // staging buffers with one barrier a slice; and one part of the loop taken away at a
        // time. On the H100 none of the first three gained (the same, slower, 1.4-1.7x
        // slower); without refills 21-31 % less, without staging stores 12-17 %, without
        // barriers or lo products 3-5 %: no one part sets the time.
        let tm32 = engine::kernels::gemm_planes_narrow_source()?;
        let planes_variants = [
            ("gemm_planes", "shipped: X pre-split, staged as vec4<f16> words", GEMM_PLANES.to_string(), 64u32, 1u32),
            ("gemm_planes.tm32.pf2", "32-row tiles, words loaded two slices ahead (two register sets)", planes_prefetch2(&tm32)?, 32, 1),
            ("gemm_planes.tm32.split2", "32-row tiles, K over 2 workgroups (timing only)", planes_split_k(&tm32, 2)?, 32, 2),
            ("gemm_planes.tm32.split4", "32-row tiles, K over 4 workgroups (timing only)", planes_split_k(&tm32, 4)?, 32, 4),
            ("gemm_planes.tm32.db", "32-row tiles, two staging buffers: one barrier a slice", planes_double_buffer(&tm32)?, 32, 1),
            ("gemm_planes.tm32.no_refill", "no global loads after the first slice (timing only)", planes_probe(&tm32, "no_refill")?, 32, 1),
            ("gemm_planes.tm32.no_stage", "no staging stores after the first slice (timing only)", planes_probe(&tm32, "no_stage")?, 32, 1),
            ("gemm_planes.tm32.no_barrier", "no workgroup barriers in the K loop (timing only)", planes_probe(&tm32, "no_barrier")?, 32, 1),
            ("gemm_planes.tm32.hi_only", "the hi products only (timing only)", planes_probe(&tm32, "hi_only")?, 32, 1),
            // (256 threads over 128x64 tiles, gemm_planes_wide, was slower and went: RESULTS.md
            // "2026-12-03")
            ("gemm_planes.tm32", "32-row tiles (the engine's for every GEMM)", tm32.clone(), 32, 1),
            (
                "gemm_planes.ck64",
                "64-deep K slices (twice the words in flight, half the barriers; engine: slower)",
                engine::kernels::rewrite_source("ck64", GEMM_PLANES, &[("const CK: u32 = 32u;", "const CK: u32 = 64u;")])?,
                64,
                1,
            ),
            (
                "gemm_planes.halves",
                "the same, cooperative-load strides in halves",
                engine::kernels::rewrite_source("halves", GEMM_PLANES, &[("const XLD: u32 = XS4;", "const XLD: u32 = XS4 * 4u;"), ("const WLD: u32 = WS4;", "const WLD: u32 = WS4 * 4u;")])?,
                64,
                1,
            ),
        ];
        for (vname, change, vsrc, tile_rows, splits) in &planes_variants {
            let label = format!("{vname} {m}x{n}x{kk}");
            // (the planes are padded to 64 rows: 1536 for 1500, also a multiple of 128)
            let dgrid = [n / 64, m_pad / tile_rows * splits];
            let k = match gpu.kernel(static_name(&label), vsrc, &[r, r, r, w]) {
                Ok(k) => k,
                Err(e) => {
                    let mut row = Row::new(Section::Probe, &label, change);
                    row.check = format!("does not build: {e}");
                    eprintln!("    {label}: {}", row.check);
                    rows.push(row);
                    continue;
                }
            };
            let dbind = lab.bind(&k, &dp, &[&planes, &wb, &bb, &y2]);
            gpu.fill_u32(&y2, 0x7fc0_0000);
            lab.run_once(&k, &dbind, dgrid)?;
            let c = if *splits == 1 { rel_check(&gpu.read_f32(&y2, 0, (m * n) as usize)?, &want) } else { "timing only".into() };
            let td = timed(&mut rows, &label, change, &k, dbind, dgrid, String::new())?;
            rows.last_mut().unwrap().check = format!("{c}, {}; with split {:.1} µs", tflops(flops, td), (td.best + ts.best) * 1e6);
        }
    }

    // The shipped GEMM over grids from one workgroup to 2256 and K from one slice to 48:
    // whether a workgroup's chain of slices (latency) or the device's throughput sets its time.
    if gemm_only {
        for &(m, n, kk) in &[
            (64u32, 64u32, 384u32),
            (64, 64, 32),
            (64, 1536, 384),
            (512, 1536, 384),
            (1500, 1536, 32),
            (1500, 1536, 384),
            (1500, 1536, 1536),
            (6016, 1536, 384),
        ] {
            let (xb, wb, bb, yb) = gemm_inputs(gpu, m, n, kk, &mut seed)?;
            let params = lab.uniform(&[m, n, kk, 1, 0, kk, 0, n, 0, 0, 0, 0]);
            let grid = [n.div_ceil(64), m.div_ceil(64)];
            let bind = lab.bind(&gemm_coop, &params, &[&xb, &wb, &bb, &yb]);
            let wgs = grid[0] * grid[1];
            let label = format!("gemm_coop scale {m}x{n}x{kk}");
            let t = timed(&mut rows, &label, &format!("{wgs} workgroups x {} slices", kk / 32), &gemm_coop, bind, grid, String::new())?;
            let flops = 2.0 * m as f64 * n as f64 * kk as f64;
            rows.last_mut().unwrap().check = format!("{}, {:.2} µs per slice", tflops(flops, t), t.best * 1e6 / (kk / 32) as f64);
        }
    }

    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// GEMV

struct GemvData {
    n: u32,
    k: u32,
    x: wgpu::Buffer,
    w: wgpu::Buffer,
    bias: wgpu::Buffer,
    params: wgpu::Buffer,
    /// One output per dispatch of a batch (the independent mode); [0] is also the checked one.
    ys: Vec<wgpu::Buffer>,
    reference: Vec<f64>,
}

/// splitmix64: a reproducible, dependency-free source of synthetic values.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn unit(state: &mut u64) -> f32 {
    (splitmix(state) >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

/// Inputs, CPU reference and `reps` outputs of `out_words` words each (a pure-read twin
/// writes one word per thread, more than the N a GEMV writes).
fn gemv_data(lab: &Lab, n: u32, k: u32, reps: u32, out_words: u64) -> LabResult<GemvData> {
    let gpu = lab.gpu;
    let (nu, ku) = (n as usize, k as usize);
    let mut st = 0x1ab_cafe_u64;
    // Weights k-major [K][N] as f16: two neighbouring columns form one u32 word, the low
    // half the even column, exactly the layout kernels::F16Matrix uploads.
    let wbits: Vec<u16> = (0..nu * ku).map(|_| half::f16::from_f32(unit(&mut st)).to_bits()).collect();
    let x: Vec<f32> = (0..ku).map(|_| unit(&mut st)).collect();
    let mut reference = vec![0f64; nu];
    for (kk, row) in wbits.chunks_exact(nu).enumerate() {
        let xv = x[kk] as f64;
        for (r, b) in reference.iter_mut().zip(row) {
            *r += xv * half::f16::from_bits(*b).to_f64();
        }
    }
    let ys = (0..reps).map(|_| gpu.buffer("lab gemv y", out_words * 4)).collect::<Result<_, _>>()?;
    Ok(GemvData {
        n,
        k,
        x: gpu.upload_f32("lab gemv x", &x)?,
        w: gpu.upload("lab gemv w", bytemuck::cast_slice(&wbits))?,
        bias: gpu.buffer("lab gemv bias", 16)?,
        // gemv.wgsl's Params: m n k flags x_off x_stride y_off y_stride eps pad*3 (no bias,
        // GELU, accumulate or LayerNorm: the epilogue is not what M = 1 decode is short of).
        params: lab.uniform(&[1, n, k, 0, 0, k, 0, n, 0, 0, 0, 0]),
        ys,
        reference,
    })
}

/// Why the adapter cannot run `v`, if it cannot.
fn unsupported(v: &Variant, limits: &wgpu::Limits, subgroup_min: Option<u32>) -> Option<String> {
    let s = v.shape;
    if s.cp * s.kg > limits.max_compute_invocations_per_workgroup {
        return Some(format!(
            "skipped: {} invocations > {}",
            s.cp * s.kg,
            limits.max_compute_invocations_per_workgroup
        ));
    }
    // The subgroup variant declares its CP*KG invocations flat (see subgroup_edits).
    let (wx, wy) = if v.needs_subgroups { (s.cp * s.kg, 1) } else { (s.cp, s.kg) };
    if wx > limits.max_compute_workgroup_size_x || wy > limits.max_compute_workgroup_size_y {
        return Some(format!("skipped: workgroup {wx}x{wy} too large"));
    }
    if v.shared_bytes() > limits.max_compute_workgroup_storage_size {
        return Some(format!(
            "skipped: {} B workgroup memory > {}",
            v.shared_bytes(),
            limits.max_compute_workgroup_storage_size
        ));
    }
    if v.needs_subgroups {
        match subgroup_min {
            None => return Some("skipped: no subgroups".into()),
            Some(m) if m < s.cp => return Some(format!("skipped: subgroup size {m} < CP {}", s.cp)),
            Some(m) if !(s.cp * s.kg).is_multiple_of(m) => {
                return Some("skipped: workgroup not whole subgroups".into())
            }
            _ => {}
        }
    }
    None
}

fn gemv_row(lab: &Lab, d: &GemvData, v: &Variant, reps: u32, subgroup_min: Option<u32>) -> LabResult<Row> {
    let gpu = lab.gpu;
    let section = if v.pure_read { Section::Read } else { Section::Gemv };
    let mut row = Row::new(section, &v.name, &v.change);
    let s = v.shape;
    let ng = d.n / (2 * s.wpt);
    let (n, k) = (d.n as u64, d.k as u64);
    let out = if v.pure_read { s.kg as u64 * ng as u64 } else { n };
    row.bytes = Some(n * k * 2 + k * 4 + out * 4);
    if !v.pure_read {
        row.twin = Some(read_twin(s).name);
    }
    if let Some(why) = unsupported(v, &gpu.device.limits(), subgroup_min) {
        row.check = why;
        return Ok(row);
    }
    eprintln!("  {}", v.name);
    // The shipped GEMV: its M = 1 entry (what a decode step runs), with gamma and beta
    // bound to the (unused) bias buffer.
    let prod = matches!(v.family, Family::Prod | Family::Stream) && !v.pure_read;
    let entry = if v.family == Family::Stream { "main" } else { "main_m1" };
    let compiled = if prod {
        gpu.kernel_entry(
            static_name(&format!("lab.{}", v.name)),
            &v.src,
            entry,
            &[Access::Read, Access::Read, Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        )
    } else {
        gpu.kernel(
            static_name(&format!("lab.{}", v.name)),
            &v.src,
            &[Access::Read, Access::Read, Access::Read, Access::ReadWrite],
        )
    };
    let kernel: Arc<Kernel> = match compiled {
        Ok(kernel) => kernel,
        Err(e) => {
            eprintln!("{}: {e}", v.name);
            row.check = "COMPILE ERROR (see above)".into();
            return Ok(row);
        }
    };
    let g = grid(ng.div_ceil(s.cp) as u64);
    let binds: Vec<wgpu::BindGroup> =
        d.ys.iter()
            .map(|y| {
                if prod {
                    lab.bind(&kernel, &d.params, &[&d.x, &d.w, &d.bias, &d.bias, &d.bias, y])
                } else {
                    lab.bind(&kernel, &d.params, &[&d.x, &d.w, &d.bias, y])
                }
            })
            .collect();
    // Correctness guard, on exactly the bind group that is timed: poison, run, compare.
    gpu.fill_u32(&d.ys[0], 0x7fc0_0000);
    lab.run_once(&kernel, &binds[0], g)?;
    if v.pure_read {
        row.check = "ceiling".into();
    } else {
        let got = gpu.read_f32(&d.ys[0], 0, d.n as usize)?;
        let rel = rel_to(&got, &d.reference);
        if !rel.is_finite() || rel > REL_BOUND {
            let nan = got.iter().filter(|a| !a.is_finite()).count();
            row.check = format!("WRONG rel {rel:.1e}, {nan} unwritten/NaN");
            return Ok(row);
        }
        row.check = format!("ok {rel:.0e}");
    }
    row.dep = Some(lab.time(&kernel, &binds[..1], g, reps)?);
    row.indep = Some(lab.time(&kernel, &binds, g, reps)?);
    Ok(row)
}

/// The block-quantized GEMVs (q8_0, q4_0) at M = 1, as shipped (16 columns x 16 K
/// slices) and wide (64 x 4, what matrices of 8 MiB or more take), each checked against
/// the CPU product with the dequantized weights before it is timed.
/// ‖got − reference‖ / ‖reference‖ of a GEMV's output.
fn rel_to(got: &[f32], reference: &[f64]) -> f64 {
    let (mut num, mut den) = (0f64, 0f64);
    for (a, r) in got.iter().zip(reference) {
        num += (*a as f64 - r).powi(2);
        den += r * r;
    }
    (num / den).sqrt()
}

/// gemv_common.wgsl's `ln_stats` (two passes over the row: the mean's tree, then the
/// squared deviations' tree) replaced by one tree of (count, mean, M2) merged pairwise
/// (Welford per thread, Chan et al.'s merge: as stable, one tree fewer) or by one pass over
/// x - x[0] with one tree of (sum, sum of squares) (fastest, but it loses precision when
/// x[0] is far from the mean). Returns the rewritten source.
fn ln_stats_variant(name: &str, src: &str, kind: &str) -> LabResult<String> {
    const CHAN: &str = "var<workgroup> rs3: array<vec3<f32>, 256>;

fn ln_stats(xb: u32, slot: u32, lid: u32) {
    var n = 0.0;
    var mean = 0.0;
    var m2 = 0.0;
    for (var c = lid; c < p.k; c += WG) {
        let v = x[xb + c];
        n += 1.0;
        let d = v - mean;
        mean += d / n;
        m2 += d * (v - mean);
    }
    rs3[lid] = vec3<f32>(n, mean, m2);
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            let a = rs3[lid];
            let b = rs3[lid + st];
            if (a.x == 0.0) {
                rs3[lid] = b;
            } else if (b.x > 0.0) {
                let nn = a.x + b.x;
                let d = b.y - a.y;
                let f = b.x / nn;
                rs3[lid] = vec3<f32>(nn, a.y + d * f, a.z + b.z + d * d * a.x * f);
            }
        }
        workgroupBarrier();
    }
    let t = rs3[0];
    workgroupBarrier();
    if (lid == 0u) {
        stat[slot] = t.y;
        stat[MAXM + slot] = inverseSqrt(t.z / f32(p.k) + p.eps);
    }
}
";
    const ONE_PASS: &str = "var<workgroup> rs2: array<vec2<f32>, 256>;

fn ln_stats(xb: u32, slot: u32, lid: u32) {
    let kf = f32(p.k);
    let x0 = x[xb];
    var sq = vec2<f32>(0.0);
    for (var c = lid; c < p.k; c += WG) {
        let d = x[xb + c] - x0;
        sq += vec2<f32>(d, d * d);
    }
    rs2[lid] = sq;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st / 2u) {
        if (lid < st) {
            rs2[lid] += rs2[lid + st];
        }
        workgroupBarrier();
    }
    let t = rs2[0];
    workgroupBarrier();
    let md = t.x / kf;
    if (lid == 0u) {
        stat[slot] = x0 + md;
        stat[MAXM + slot] = inverseSqrt(max(t.y / kf - md * md, 0.0) + p.eps);
    }
}
";
    let start = src.find("fn ln_stats(").ok_or_else(|| format!("{name}: no ln_stats"))?;
    let len = src[start..].find("\n}\n").ok_or_else(|| format!("{name}: ln_stats has no end"))? + 3;
    let shipped = &src[start..start + len];
    let to = match kind {
        "chan" => CHAN,
        "one_pass" => ONE_PASS,
        _ => return Ok(src.to_string()),
    };
    let out = engine::kernels::rewrite_source(name, src, &[(shipped, to)])?;
    assert!(out != src, "{name}: the rewrite did nothing");
    Ok(out)
}

/// The decode GEMVs on --n x --k, each with and without the LayerNorm folded in: the
/// shipped k-major `main_m1` (the decoder's QKV, cross-attention query and fc1 run it with
/// flag 16) and the row-major logits kernel (gemv_rows.wgsl, its matrix stored [N][K] as
/// the embedding table is), with the statistics as shipped or rewritten
/// (`ln_stats_variant`), `main_m1`'s loads-ahead put back (`.ln.late`), and gemv_rows with
/// 4 or 2 groups of 32 threads a workgroup instead of 8 (shorter workgroups, more of them).
fn decode_gemv_rows(lab: &Lab, n: u32, k: u32, reps: u32) -> LabResult<Vec<Row>> {
    let gpu = lab.gpu;
    let (nu, ku) = (n as usize, k as usize);
    let mut st = 0x1a7e_5eed_u64;
    let wbits: Vec<u16> = (0..nu * ku).map(|_| half::f16::from_f32(unit(&mut st)).to_bits()).collect();
    // An offset mean, as a residual stream has: the one-pass statistics must survive it.
    let x: Vec<f32> = (0..ku).map(|_| 3.0 + unit(&mut st)).collect();
    let gamma: Vec<f32> = (0..ku).map(|_| 1.0 + 0.5 * unit(&mut st)).collect();
    let beta: Vec<f32> = (0..ku).map(|_| 0.5 * unit(&mut st)).collect();
    let eps = 1e-5f32;
    let mean = x.iter().map(|v| *v as f64).sum::<f64>() / ku as f64;
    let var = x.iter().map(|v| (*v as f64 - mean).powi(2)).sum::<f64>() / ku as f64;
    let inv = 1.0 / (var + eps as f64).sqrt();
    let xn: Vec<f64> = (0..ku).map(|i| (x[i] as f64 - mean) * inv * gamma[i] as f64 + beta[i] as f64).collect();
    let xr: Vec<f64> = x.iter().map(|v| *v as f64).collect();
    // wbits read as [K][N] (k-major, the F16Matrix layout) and as [N][K] (F16Rows).
    let kmajor = |xs: &[f64]| -> Vec<f64> {
        let mut out = vec![0f64; nu];
        for (kk, row) in wbits.chunks_exact(nu).enumerate() {
            for (o, b) in out.iter_mut().zip(row) {
                *o += xs[kk] * half::f16::from_bits(*b).to_f64();
            }
        }
        out
    };
    let rowmajor = |xs: &[f64]| -> Vec<f64> {
        wbits.chunks_exact(ku).map(|row| row.iter().zip(xs).map(|(b, v)| half::f16::from_bits(*b).to_f64() * v).sum()).collect()
    };
    // [layout][LayerNorm]: k-major, row-major; without, with.
    let refs = [[kmajor(&xr), kmajor(&xn)], [rowmajor(&xr), rowmajor(&xn)]];
    // A verify pass's rows (the multi-row logits below).
    let mmax = engine::kernels::VERIFY_MAX_ROWS as usize;
    let xm: Vec<f32> = (0..mmax * ku).map(|_| 3.0 + unit(&mut st)).collect();
    let refs_m: Vec<Vec<f64>> = xm.chunks_exact(ku).map(|r| rowmajor(&r.iter().map(|v| *v as f64).collect::<Vec<_>>())).collect();
    let xb = gpu.upload_f32("lab decode gemv x", &x)?;
    let gb = gpu.upload_f32("lab decode gemv gamma", &gamma)?;
    let bb = gpu.upload_f32("lab decode gemv beta", &beta)?;
    let wb = gpu.upload("lab decode gemv w", bytemuck::cast_slice(&wbits))?;
    drop(wbits);
    let zero = gpu.buffer("lab decode gemv zero", 16)?;
    let params = lab.uniform(&[1, n, k, 0, 0, k, 0, n, 0, 0, 0, 0]);
    let params_ln = lab.uniform(&[1, n, k, 16, 0, k, 0, n, eps.to_bits(), 0, 0, 0]);
    let ys = (0..reps).map(|_| gpu.buffer("lab decode gemv y", n as u64 * 4)).collect::<Result<Vec<_>, _>>()?;

    // (name, change, source, entry, outputs per workgroup, layout, LayerNorm)
    let mut variants: Vec<(String, String, String, &str, u32, usize, bool)> = Vec::new();
    for (family, entry, per_wg, layout) in [("m1", "main_m1", 16u32, 0usize), ("rows", "main", 32, 1)] {
        for (stats, ln, change) in [
            ("", false, "no LayerNorm"),
            (".ln", true, "LayerNorm folded in, as shipped (two passes, two trees)"),
            (".lnc", true, "LayerNorm, Welford per thread, one tree merging (n, mean, M2)"),
            (".ln1", true, "LayerNorm, one pass over x - x[0], one (sum, sum sq) tree"),
            (".ln.late", true, "LayerNorm, x/gamma/beta of the first 8 words not loaded ahead"),
        ] {
            let name = format!("{family}{stats}");
            let kind = match stats {
                ".lnc" => "chan",
                ".ln1" => "one_pass",
                _ => "",
            };
            // Each kernel as the engine compiles it: the variant with the LayerNorm switch
            // fixed on or off (kernels::gemv_m1_source, gemv_rows_source).
            let fixed = if family == "m1" {
                let v = if ln { engine::kernels::GemvM1Variant::LayerNorm } else { engine::kernels::GemvM1Variant::Plain };
                engine::kernels::gemv_m1_source(v)?
            } else {
                engine::kernels::gemv_rows_source(ln, true)?
            };
            let mut code = ln_stats_variant(&name, &fixed, kind)?;
            if stats == ".ln.late" {
                let ahead = "const LN_AHEAD: bool = true;";
                if !code.contains(ahead) {
                    continue;
                }
                code = code.replace(ahead, "const LN_AHEAD: bool = false;");
            }
            variants.push((name, format!("{family}: {change}"), code, entry, per_wg, layout, ln));
        }
    }
    // The streaming GEMV (what matrices of 8 MiB and more take) at this shape, as the
    // engine compiles it for this device: does it beat main_m1 on short matrices too?
    if n.is_multiple_of(8) {
        let kg = engine::kernels::gemv_stream_slices(&gpu.device.limits());
        let code = engine::kernels::gemv_stream_source(kg)?;
        let change = format!("gemv_stream.wgsl ({kg} K slices)");
        variants.push(("stream".into(), format!("{change}, no LayerNorm"), code.clone(), "main", 64, 0, false));
        variants.push(("stream.ln".into(), format!("{change}, LayerNorm folded in"), code, "main", 64, 0, true));
    }
    let groups_line = "const GROUPS: u32 = 8u;";
    for groups in [4u32, 2] {
        let to = format!("const GROUPS: u32 = {groups}u;");
        let name = format!("rows.g{groups}");
        let code = engine::kernels::rewrite_source(&name, engine::kernels::GEMV_ROWS_SOURCE, &[(groups_line, to.as_str())])?;
        assert!(code.contains(&to), "{name}: the rewrite did not apply");
        let change = format!("rows: {groups} groups of 32 threads, {} rows a workgroup", 4 * groups);
        variants.push((name.clone(), change.clone(), code.clone(), "main", 4 * groups, 1, false));
        variants.push((format!("{name}.ln"), format!("{change}, LayerNorm"), code, "main", 4 * groups, 1, true));
    }

    let mut rows = Vec::new();
    for (name, change, code, entry, per_wg, layout, ln) in variants {
        let mut row = Row::new(Section::Gemv, &name, &change);
        row.bytes = Some(n as u64 * k as u64 * 2 + k as u64 * 4 + n as u64 * 4);
        eprintln!("  {name}");
        let r = Access::Read;
        let kernel = gpu.kernel_entry(static_name(&format!("lab.decode.{name}")), &code, entry, &[r, r, r, r, r, Access::ReadWrite])?;
        let g = grid(n.div_ceil(per_wg) as u64);
        let (pr, gm, bt) = if ln { (&params_ln, &gb, &bb) } else { (&params, &zero, &zero) };
        let binds: Vec<wgpu::BindGroup> =
            ys.iter().map(|y| lab.bind(&kernel, pr, &[&xb, &wb, &zero, gm, bt, y])).collect();
        gpu.fill_u32(&ys[0], 0x7fc0_0000);
        lab.run_once(&kernel, &binds[0], g)?;
        let rel = rel_to(&gpu.read_f32(&ys[0], 0, nu)?, &refs[layout][ln as usize]);
        if !rel.is_finite() || rel > REL_BOUND {
            row.check = format!("WRONG rel {rel:.1e}");
        } else {
            row.check = format!("ok {rel:.0e}");
            row.dep = Some(lab.time(&kernel, &binds[..1], g, reps)?);
            row.indep = Some(lab.time(&kernel, &binds, g, reps)?);
        }
        rows.push(row);
    }

    // A verify pass's logits: m activation rows over the same row-major matrix, as grid
    // layers (`main`: one sweep of the matrix a row) and in one workgroup per block of
    // outputs and 16 rows (`main_rows`, what verify passes take; RB rows a round through
    // workgroup memory, 4 as shipped, rewritten to 2 and 8). Every row checked against its
    // reference.
    let xmb = gpu.upload_f32("lab decode gemv x rows", &xm)?;
    let yms = (0..reps).map(|_| gpu.buffer("lab decode gemv y rows", (mmax * nu * 4) as u64)).collect::<Result<Vec<_>, _>>()?;
    let (rb_line, parts_line) = ("const RB: u32 = 4u;", "var<workgroup> parts_rows: array<f32, 4224>;");
    let mut multi = Vec::new();
    for (name, entry, rb) in [("layers", "main", 0u32), ("shared", "main_rows", 4), ("shared.rb2", "main_rows", 2), ("shared.rb8", "main_rows", 8)] {
        let code = if rb == 0 || rb == 4 {
            engine::kernels::gemv_rows_source(false, true)?
        } else {
            let (to_rb, to_parts) = (format!("const RB: u32 = {rb}u;"), format!("var<workgroup> parts_rows: array<f32, {}>;", 1056 * rb));
            let code = engine::kernels::rewrite_source(name, &engine::kernels::gemv_rows_source(false, true)?, &[(rb_line, &to_rb), (parts_line, &to_parts)])?;
            assert!(code.contains(&to_rb) && code.contains(&to_parts), "rows.m.{name}: the rewrite did not apply");
            code
        };
        let r = Access::Read;
        multi.push((name, entry, gpu.kernel_entry(static_name(&format!("lab.decode.rows.m.{name}")), &code, entry, &[r, r, r, r, r, Access::ReadWrite])?));
    }
    for m in [mmax as u32, 8, 4] {
        let params_m = lab.uniform(&[m, n, k, 0, 0, k, 0, n, 0, 0, 0, 0]);
        for (name, entry, kernel) in &multi {
            let vname = format!("rows.m{m}.{name}");
            let per_grid = if *entry == "main" { m } else { m.div_ceil(engine::kernels::VERIFY_MAX_ROWS) };
            let g = grid(n.div_ceil(32) as u64 * per_grid as u64);
            let mut row = Row::new(Section::Gemv, &vname, &format!("{m} rows: {entry} ({name})"));
            row.bytes = Some(n as u64 * k as u64 * 2 + m as u64 * (k as u64 + n as u64) * 4);
            eprintln!("  {vname}");
            let binds: Vec<wgpu::BindGroup> = yms.iter().map(|y| lab.bind(kernel, &params_m, &[&xmb, &wb, &zero, &zero, &zero, y])).collect();
            gpu.fill_u32(&yms[0], 0x7fc0_0000);
            lab.run_once(kernel, &binds[0], g)?;
            let got = gpu.read_f32(&yms[0], 0, m as usize * nu)?;
            let rel = got.chunks_exact(nu).zip(&refs_m).map(|(y, want)| rel_to(y, want)).fold(0f64, |a, b| if b.is_nan() { f64::NAN } else { a.max(b) });
            if !rel.is_finite() || rel > REL_BOUND {
                row.check = format!("WRONG rel {rel:.1e}");
            } else {
                row.check = format!("ok {rel:.0e}");
                row.dep = Some(lab.time(kernel, &binds[..1], g, reps)?);
                row.indep = Some(lab.time(kernel, &binds, g, reps)?);
            }
            rows.push(row);
        }
    }

    // The shipped decode GEMV (m1 with its LayerNorm) on weights that are not hot: the same
    // dependent chain over distinct copies of the matrix, taken in turn, totalling ~16 MiB
    // (still in the 60 MB L2) and ~128 MiB (past it: every dispatch reads HBM, as a decode
    // step's layers do once the logits' 40 MB have passed through L2). What a decode GEMV
    // pays for its weights' trip, against the hot row above.
    let code = ln_stats_variant("m1.ln", &engine::kernels::gemv_m1_source(engine::kernels::GemvM1Variant::LayerNorm)?, "")?;
    let r = Access::Read;
    let kernel = gpu.kernel_entry("lab.decode.m1.ln.cold", &code, "main_m1", &[r, r, r, r, r, Access::ReadWrite])?;
    let g = grid(n.div_ceil(16) as u64);
    let wbytes = n as u64 * k as u64 * 2;
    // `copies` new buffers, each a GPU copy of the weights.
    let weight_copies = |copies: u64| -> LabResult<Vec<wgpu::Buffer>> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let mut ws = Vec::with_capacity(copies as usize);
        for _ in 0..copies {
            let w = gpu.buffer("lab decode gemv w copy", wbytes)?;
            enc.copy_buffer_to_buffer(&wb, 0, &w, 0, wbytes);
            ws.push(w);
        }
        gpu.queue.submit([enc.finish()]);
        Ok(ws)
    };
    // The third row also gives each dispatch a parameter block of its own, as the engine's
    // recorder does (a 256-byte slot each, uploaded before the submission): what new
    // parameters cost a dispatch, which the lab's shared block hides (~0.3 us on the H200).
    // The fourth row passes each dispatch's parameters as immediate data (Vulkan push
    // constants, no buffer to load), where the device offers them: no cheaper there
    // (bench/RESULTS.md 2026-12-04).
    let imm_code = code.replace("@group(0) @binding(0) var<uniform> p: Params;", "var<immediate> p: Params;");
    assert!(imm_code != code, "m1.ln.hbm.imm: the rewrite to var<immediate> did not apply");
    let params_words = [1, n, k, 16, 0, k, 0, n, eps.to_bits(), 0, 0, 0];
    let imm_kernel = match gpu.kernel_entry_with("lab.decode.m1.ln.imm", &imm_code, "main_m1", &[r, r, r, r, r, Access::ReadWrite], 48) {
        Ok(k) => Some(k),
        Err(e) => {
            eprintln!("  m1.ln.hbm.imm: skipped ({e})");
            None
        }
    };
    for (name, total, own_params) in [("m1.ln.l2", 16u64 << 20, false), ("m1.ln.hbm", 128 << 20, false), ("m1.ln.hbm.params", 128 << 20, true), ("m1.ln.hbm.imm", 128 << 20, true)] {
        let imm = name.ends_with(".imm");
        if imm && imm_kernel.is_none() {
            continue;
        }
        let kernel = if imm { imm_kernel.as_ref().expect("checked") } else { &kernel };
        let copies = total.div_ceil(wbytes).clamp(2, 1024);
        let mut row = Row::new(
            Section::Gemv,
            name,
            &format!(
                "m1.ln over {copies} copies of the weights in turn ({} MiB), dependent{}",
                copies * wbytes >> 20,
                if imm {
                    ", parameters as immediates"
                } else if own_params {
                    ", a parameter block each"
                } else {
                    ""
                }
            ),
        );
        row.bytes = Some(wbytes + k as u64 * 4 + n as u64 * 4);
        eprintln!("  {name}");
        let ws = weight_copies(copies)?;
        let own: Vec<wgpu::Buffer> = if own_params {
            (0..copies).map(|_| lab.uniform(&params_words)).collect()
        } else {
            Vec::new()
        };
        let binds: Vec<wgpu::BindGroup> = ws
            .iter()
            .enumerate()
            .map(|(i, w)| lab.bind(kernel, own.get(i).unwrap_or(&params_ln), &[&xb, w, &zero, &gb, &bb, &ys[0]]))
            .collect();
        // Immediates: each dispatch's own copy of the words (as a recorder would set them).
        let imms: Vec<Vec<u8>> = if imm { (0..copies).map(|_| bytemuck::cast_slice(&params_words).to_vec()).collect() } else { Vec::new() };
        // Guard: the last copy gives the hot matrix's product.
        gpu.fill_u32(&ys[0], 0x7fc0_0000);
        let last = binds.len() - 1;
        if imm {
            lab.time_immediates(kernel, &binds[last..], &imms[last..], g, 1)?;
        } else {
            lab.run_once(kernel, &binds[last], g)?;
        }
        let rel = rel_to(&gpu.read_f32(&ys[0], 0, nu)?, &refs[0][1]);
        if !rel.is_finite() || rel > REL_BOUND {
            row.check = format!("WRONG rel {rel:.1e}");
        } else {
            row.check = format!("ok {rel:.0e}");
            row.dep = Some(if imm {
                lab.time_immediates(kernel, &binds, &imms, g, copies as u32)?
            } else {
                lab.time(kernel, &binds, g, copies as u32)?
            });
        }
        rows.push(row);
    }

    // The logits' kernel (gemv_rows without the LayerNorm, as shipped: the final norm is a
    // dispatch of its own) on a table that is not hot: copies totalling >= 256 MiB in turn,
    // each dispatch reading HBM as a decode step's logits mostly do (the step's layers and
    // cross K/V pass through L2 between two steps' reads of the 40 MB table); and its
    // 4-group form (the rewrite of the rows.g* rows above; the 8-group row is the shipped
    // source). Against the hot row above: what the table's trip costs the logits.
    for (name, groups) in [("rows.hbm", 8u32), ("rows.g4.hbm", 4)] {
        let code = if groups == 8 {
            engine::kernels::GEMV_ROWS_SOURCE.to_string()
        } else {
            let to = format!("const GROUPS: u32 = {groups}u;");
            let code = engine::kernels::rewrite_source(name, engine::kernels::GEMV_ROWS_SOURCE, &[(groups_line, to.as_str())])?;
            assert!(code.contains(&to), "{name}: the rewrite did not apply");
            code
        };
        let kernel = gpu.kernel_entry(static_name(&format!("lab.decode.{name}")), &code, "main", &[r, r, r, r, r, Access::ReadWrite])?;
        let g = grid(n.div_ceil(4 * groups) as u64);
        let copies = (256u64 << 20).div_ceil(wbytes).clamp(2, 1024);
        let mut row = Row::new(
            Section::Gemv,
            name,
            &format!("rows ({groups} groups of 32 threads) over {copies} copies of the matrix in turn ({} MiB), dependent", copies * wbytes >> 20),
        );
        row.bytes = Some(wbytes + k as u64 * 4 + n as u64 * 4);
        eprintln!("  {name}");
        let ws = weight_copies(copies)?;
        let binds: Vec<wgpu::BindGroup> = ws.iter().map(|w| lab.bind(&kernel, &params, &[&xb, w, &zero, &zero, &zero, &ys[0]])).collect();
        gpu.fill_u32(&ys[0], 0x7fc0_0000);
        lab.run_once(&kernel, &binds[binds.len() - 1], g)?;
        let rel = rel_to(&gpu.read_f32(&ys[0], 0, nu)?, &refs[1][0]);
        if !rel.is_finite() || rel > REL_BOUND {
            row.check = format!("WRONG rel {rel:.1e}");
        } else {
            row.check = format!("ok {rel:.0e}");
            row.dep = Some(lab.time(&kernel, &binds, g, copies as u32)?);
        }
        rows.push(row);
    }

    // A chain that changes kernel at every dispatch, as a decode step does (each of its
    // dispatches runs other code than the one before): four LayerNorm variants of main_m1
    // (the same loads and products, other instructions) in turn over the cold copies,
    // against each of them alone over the same copies. Shared parameters, so only the code
    // changes between dispatches.
    let mut mix = Vec::new();
    for (suffix, kind, late) in [("", "", false), ("1", "one_pass", false), ("c", "chan", false), (".late", "", true)] {
        let vname = format!("m1.ln{suffix}");
        let mut code = ln_stats_variant(&vname, engine::kernels::GEMV_SOURCE, kind)?;
        if late {
            let ahead = "const LN_AHEAD: bool = true;";
            assert!(code.contains(ahead), "{vname}: LN_AHEAD not found");
            code = code.replace(ahead, "const LN_AHEAD: bool = false;");
        }
        let kname = static_name(&format!("lab.decode.mix.{vname}"));
        mix.push((vname, gpu.kernel_entry(kname, &code, "main_m1", &[r, r, r, r, r, Access::ReadWrite])?));
    }
    let copies = (128u64 << 20).div_ceil(wbytes).clamp(4, 1024).next_multiple_of(4);
    let ws = weight_copies(copies)?;
    let bind_w = |k: &Kernel, w: &wgpu::Buffer| lab.bind(k, &params_ln, &[&xb, w, &zero, &gb, &bb, &ys[0]]);
    let mib_total = copies * wbytes >> 20;
    for (vname, kern) in &mix {
        let name = format!("{vname}.hbm1");
        let mut row = Row::new(Section::Gemv, &name, &format!("{vname} alone over the {copies} copies ({mib_total} MiB), dependent"));
        row.bytes = Some(wbytes + k as u64 * 4 + n as u64 * 4);
        eprintln!("  {name}");
        let binds: Vec<wgpu::BindGroup> = ws.iter().map(|w| bind_w(kern, w)).collect();
        gpu.fill_u32(&ys[0], 0x7fc0_0000);
        lab.run_once(kern, &binds[0], g)?;
        let rel = rel_to(&gpu.read_f32(&ys[0], 0, nu)?, &refs[0][1]);
        if !rel.is_finite() || rel > REL_BOUND {
            row.check = format!("WRONG rel {rel:.1e}");
        } else {
            row.check = format!("ok {rel:.0e}");
            row.dep = Some(lab.time(kern, &binds, g, copies as u32)?);
        }
        rows.push(row);
    }
    let mut row = Row::new(
        Section::Gemv,
        "m1.ln.mix.hbm",
        &format!("the four above in turn, a new kernel every dispatch, over the {copies} copies ({mib_total} MiB), dependent"),
    );
    row.bytes = Some(wbytes + k as u64 * 4 + n as u64 * 4);
    eprintln!("  m1.ln.mix.hbm");
    let kernels: Vec<&Kernel> = mix.iter().map(|(_, k)| &**k).collect();
    let binds: Vec<wgpu::BindGroup> = ws.iter().enumerate().map(|(j, w)| bind_w(kernels[j % kernels.len()], w)).collect();
    gpu.fill_u32(&ys[0], 0x7fc0_0000);
    let t = lab.time_mixed(&kernels, &binds, g, copies as u32)?;
    // Guard: the chain's last dispatch (the fourth variant) left the right product.
    let rel = rel_to(&gpu.read_f32(&ys[0], 0, nu)?, &refs[0][1]);
    if !rel.is_finite() || rel > REL_BOUND {
        row.check = format!("WRONG rel {rel:.1e}");
    } else {
        row.check = format!("ok {rel:.0e}");
        row.dep = Some(t);
    }
    rows.push(row);
    Ok(rows)
}

fn gemv_q_rows(lab: &Lab, n: u32, k: u32, reps: u32) -> LabResult<Vec<Row>> {
    use engine::quant::block::{BlockFormat, BlockQuant};
    let gpu = lab.gpu;
    let (nu, ku) = (n as usize, k as usize);
    let mut st = 0x5eed_0b10_c0de_u64;
    let w: Vec<f32> = (0..nu * ku).map(|_| unit(&mut st)).collect();
    let x: Vec<f32> = (0..ku).map(|_| unit(&mut st)).collect();
    let xb = gpu.upload_f32("lab gemv_q x", &x)?;
    let zero = gpu.buffer("lab gemv_q zero", 16)?;
    let params = lab.uniform(&[1, n, k, 0, 0, k, 0, n, 0, 0, 0, 0]);
    let ys = (0..reps).map(|_| gpu.buffer("lab gemv_q y", n as u64 * 4)).collect::<Result<Vec<_>, _>>()?;
    let mut rows = Vec::new();
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
        let q = BlockQuant::quantize(format, &w, nu, ku)?;
        let deq = q.dequantize();
        let reference: Vec<f64> =
            (0..nu).map(|c| deq[c * ku..(c + 1) * ku].iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum()).collect();
        let codes = gpu.upload("lab gemv_q codes", bytemuck::cast_slice(&q.words))?;
        let scales = gpu.upload("lab gemv_q scales", bytemuck::cast_slice(&q.scales))?;
        let entry = if format == BlockFormat::Q8_0 { "main_q8" } else { "main_q4" };
        for (shape, cq, edits) in [
            ("16x16", 16u32, vec![]),
            (
                "64x4 (wide)",
                64,
                vec![("const CQ: u32 = 16u;", "const CQ: u32 = 64u;"), ("const KQ: u32 = 16u;", "const KQ: u32 = 4u;")],
            ),
        ] {
            let name = format!("gemv_{}.{}", format.name(), if cq == 16 { "cq16" } else { "cq64" });
            let mut row =
                Row::new(Section::Gemv, &name, &format!("kernels/gemv_q.wgsl {entry}, {shape} columns x slices"));
            row.bytes = Some(q.bytes() + k as u64 * 4 + n as u64 * 4);
            let src = engine::kernels::rewrite_source(&name, engine::kernels::GEMV_Q_SOURCE, &edits)?;
            assert!(src.contains(&format!("const CQ: u32 = {cq}u;")), "{name}: host geometry and kernel disagree");
            eprintln!("  {name}");
            let r = Access::Read;
            let kernel = gpu.kernel_entry(
                static_name(&format!("lab.{name}")),
                &src,
                entry,
                &[r, r, r, r, r, r, Access::ReadWrite],
            )?;
            let g = grid(n.div_ceil(cq) as u64);
            let binds: Vec<wgpu::BindGroup> = ys
                .iter()
                .map(|y| lab.bind(&kernel, &params, &[&xb, &codes, &scales, &zero, &zero, &zero, y]))
                .collect();
            gpu.fill_u32(&ys[0], 0x7fc0_0000);
            lab.run_once(&kernel, &binds[0], g)?;
            let got = gpu.read_f32(&ys[0], 0, nu)?;
            let rel = rel_to(&got, &reference);
            if !rel.is_finite() || rel > REL_BOUND {
                row.check = format!("WRONG rel {rel:.1e}");
                rows.push(row);
                continue;
            }
            row.check = format!("ok {rel:.0e}");
            row.dep = Some(lab.time(&kernel, &binds[..1], g, reps)?);
            row.indep = Some(lab.time(&kernel, &binds, g, reps)?);
            rows.push(row);
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// Output

fn mib(b: u64) -> String {
    format!("{:.1}", b as f64 / (1u64 << 20) as f64)
}

fn us(t: Option<Timing>) -> String {
    match t {
        Some(t) if t.best * 1e6 >= 100.0 => format!("{:.1}", t.best * 1e6),
        Some(t) => format!("{:.2}", t.best * 1e6),
        None => "-".into(),
    }
}

fn print_table(rows: &[Row], clock_note: &str) {
    let ceiling = rows.iter().filter(|r| matches!(r.section, Section::Copy)).filter_map(Row::gbs).fold(0.0, f64::max);
    println!();
    println!("times: min of the timed batches, per dispatch ({clock_note}); spread = worst/best batch;");
    println!("µs = back-to-back dispatches each depending on the last (barrier between), indep = same with");
    println!("distinct outputs; GB/s and %copy from µs; %read = the access pattern's pure-read time / this time;");
    println!("GEMV checked against the CPU before timing (‖gpu−cpu‖/‖cpu‖ ≤ {REL_BOUND:.0e}).");
    println!(
        "{:<22} {:<44} {:>9} {:>6} {:>9} {:>9} {:>8} {:>6} {:>6}  check",
        "kernel", "change", "µs", "spread", "indep µs", "MiB", "GB/s", "%copy", "%read"
    );
    let mut last = None;
    for r in rows {
        let sec = std::mem::discriminant(&r.section);
        if last.is_some_and(|l| l != sec) {
            println!();
        }
        last = Some(sec);
        let gbs = r.gbs();
        let pct = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0}"));
        let twin = r.twin.as_ref().and_then(|t| rows.iter().find(|x| &x.name == t));
        let read_pct = match (twin.and_then(|t| t.dep), r.dep) {
            (Some(t), Some(me)) => Some(t.best / me.best * 100.0),
            _ => None,
        };
        let spread = r.dep.map_or("-".into(), |t| format!("{:.2}", t.spread()));
        // Submit round trips are wall time by nature; anything else on the wall clock is marked.
        let clk = match r.dep.map(|t| t.clock) {
            Some(Clock::Wall) if !r.name.starts_with("submit") => " [wall]",
            _ => "",
        };
        println!(
            "{:<22} {:<44} {:>9} {:>6} {:>9} {:>9} {:>8} {:>6} {:>6}  {}{}",
            r.name,
            r.change,
            us(r.dep),
            spread,
            us(r.indep),
            r.bytes.map_or("-".into(), mib),
            gbs.map_or("-".into(), |g| format!("{g:.1}")),
            pct(gbs.filter(|_| ceiling > 0.0).map(|g| g / ceiling * 100.0)),
            pct(read_pct),
            r.check,
            clk
        );
    }
}

// ---------------------------------------------------------------------------------------

fn run(args: &Args) -> LabResult<()> {
    let gpu = Gpu::new(&GpuOptions { profile: true, ..Default::default() })?;
    let limits = gpu.device.limits();
    let info = &gpu.info;
    let lab = Lab {
        gpu: &gpu,
        batches: args.batches,
        timestamps: info.timestamps,
        period_ns: gpu.queue.get_timestamp_period() as f64,
    };
    let yes = |b: bool| if b { "yes" } else { "no" };
    println!(
        "adapter: {} ({}, {}), driver {}; shader runtime checks {}",
        info.name,
        info.backend,
        info.device_type,
        info.driver,
        if info.shader_checks { "on (VERBATIM_SHADER_CHECKS)" } else { "off" }
    );
    let subgroup = if info.subgroups { Some(probe_subgroup_size(&lab)?) } else { None };
    println!(
        "features: timestamp queries {}, subgroups {}, shader-f16 {}",
        yes(info.timestamps),
        match subgroup {
            Some((a, b)) if a == b => format!("yes (subgroup_size {a})"),
            Some((a, b)) => format!("yes (subgroup_size {a}..{b})"),
            None => "no".into(),
        },
        yes(info.shader_f16)
    );
    println!("cooperative matrix (wgpu EXPERIMENTAL_COOPERATIVE_MATRIX): {}", cooperative_matrix());
    println!(
        "limits: storage binding {} MiB, buffer {} MiB, workgroup memory {} KiB, {} invocations/workgroup \
         (x {} y {}), {} workgroups/dimension",
        limits.max_storage_buffer_binding_size >> 20,
        limits.max_buffer_size >> 20,
        limits.max_compute_workgroup_storage_size >> 10,
        limits.max_compute_invocations_per_workgroup,
        limits.max_compute_workgroup_size_x,
        limits.max_compute_workgroup_size_y,
        limits.max_compute_workgroups_per_dimension,
    );
    let clock_note = if lab.timestamps {
        format!("GPU timestamps around each batch's pass, {} ns/tick", lab.period_ns)
    } else {
        "no timestamp queries: wall clock around submit + wait, which includes the submit turnaround".into()
    };
    println!("timing: {clock_note}; {} batches x {} dispatches after 1 warm-up batch", args.batches, args.reps);

    // Copy size: what was asked, within one binding, a multiple of 16 bytes.
    let want = args.copy_mib << 20;
    let cap = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
    let copy_bytes = want.min(cap) / 16 * 16;
    if copy_bytes < want {
        println!(
            "copy: {} MiB asked, the adapter binds at most {} MiB: using {}",
            args.copy_mib,
            cap >> 20,
            mib(copy_bytes)
        );
    }
    let wbytes = args.n as u64 * args.k as u64 * 2;
    if wbytes > cap {
        return Err(format!(
            "a {}x{} f16 matrix ({} MiB) exceeds the adapter's {} MiB binding; use --n/--k",
            args.n,
            args.k,
            wbytes >> 20,
            cap >> 20
        )
        .into());
    }
    println!("gemv: N {} x K {} f16 = {} MiB of weights, M = 1", args.n, args.k, mib(wbytes));

    let mut rows = Vec::new();
    if args.grid_only {
        lab.warm("the grid barriers")?;
        eprintln!("grid barriers");
        rows.extend(chain_rows(&lab, args.chain)?.into_iter().filter(|r| r.name == "chain.dependent" || r.name == "chain.grid256"));
        rows.extend(grid_sync_rows(&lab, args.chain)?);
        gpu.check()?;
        print_table(&rows, &clock_note);
        return Ok(());
    }
    lab.warm("the copy ceiling")?;
    eprintln!("copy ceiling ({} MiB)", mib(copy_bytes));
    rows.extend(copy_rows(&lab, copy_bytes, args.reps)?);
    if args.rows_only {
        lab.warm("the decode GEMVs")?;
        rows.extend(decode_gemv_rows(&lab, args.n, args.k, args.reps)?);
        gpu.check()?;
        print_table(&rows, &clock_note);
        return Ok(());
    }
    if args.direct_only {
        lab.warm("the cooperative-matrix kernels")?;
        if gpu.info.coop_matrix {
            eprintln!("cooperative matrices fed from memory");
            rows.extend(coop_direct_rows(&lab, args.attention_only, args.gemm_only)?);
        } else {
            rows.extend(coop_direct_rows(&lab, args.attention_only, args.gemm_only)?);
        }
        gpu.check()?;
        print_table(&rows, &clock_note);
        return Ok(());
    }
    if args.gemv_only {
        println!("coop: skipped (--gemv-only)");
    } else if gpu.info.coop_matrix {
        lab.warm("the cooperative-matrix kernels")?;
        eprintln!("cooperative matrices");
        rows.extend(coop_rows(&lab)?);
        rows.extend(coop_direct_rows(&lab, args.attention_only, args.gemm_only)?);
    } else {
        println!("coop: skipped (the engine does not use cooperative matrices on this device)");
    }
    if args.coop_only {
        gpu.check()?;
        print_table(&rows, &clock_note);
        return Ok(());
    }

    // Build every variant (and its read twin) before running any: a broken rewrite fails
    // here, before minutes of measuring.
    let variants = gemv_variants();
    let mut twins: Vec<Variant> = Vec::new();
    for v in &variants {
        if !twins.iter().any(|t| t.shape == v.shape) {
            twins.push(read_twin(v.shape));
        }
    }
    let all: Vec<&Variant> = twins.iter().chain(&variants).collect();
    for (i, a) in all.iter().enumerate() {
        for b in &all[..i] {
            assert!(a.src != b.src, "{} and {} have the same source: a rewrite did nothing", a.name, b.name);
        }
    }
    eprintln!("gemv data (CPU reference)");
    let out_words = twins.iter().map(|t| t.shape.kg as u64 * (args.n / (2 * t.shape.wpt)) as u64).max();
    let data = gemv_data(&lab, args.n, args.k, args.reps, out_words.unwrap_or(0).max(args.n as u64))?;
    let sg_min = subgroup.map(|s| s.0);
    lab.warm("the GEMV variants")?;
    for v in &twins {
        rows.push(gemv_row(&lab, &data, v, args.reps, sg_min)?);
    }
    for v in &variants {
        rows.push(gemv_row(&lab, &data, v, args.reps, sg_min)?);
    }
    drop(data);
    lab.warm("the decode GEMVs")?;
    eprintln!("decode gemvs (k-major m1, row-major logits), with and without the LayerNorm");
    rows.extend(decode_gemv_rows(&lab, args.n, args.k, args.reps)?);
    eprintln!("quantized gemv");
    rows.extend(gemv_q_rows(&lab, args.n, args.k, args.reps)?);

    lab.warm("the dispatch and submit costs")?;
    eprintln!("dispatch and submit costs");
    rows.extend(chain_rows(&lab, args.chain)?);
    rows.extend(submit_rows(&lab, args.reps)?);
    gpu.check()?;
    print_table(&rows, &clock_note);
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kernel-lab: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kernel-lab: {e}");
            ExitCode::FAILURE
        }
    }
}

/// attention_coop.wgsl with its P·V accumulators kept across blocks and their round trip
/// through workgroup memory (stores, barriers, the lanes' reads) taken every 4th block only:
/// what that round trip costs (timing only: the output is not the attention's).
fn attention_out4() -> engine::Result<String> {
    let decls: String = ["oh0", "oh1", "oh2", "oh3", "ol0", "ol1", "ol2", "ol3"].iter().map(|n| format!("        var {n} = coop_mat16x16<f32, C>();\n")).collect();
    let hoisted = decls.replace("        var", "    var");
    let src = engine::kernels::rewrite_source("out4", ATTN_STAGED, &[(decls.as_str(), "")])?;
    engine::kernels::rewrite_source(
        "out4",
        &src,
        &[
            ("    var o7 = vec4<f32>(0.0);\n", &format!("    var o7 = vec4<f32>(0.0);\n{hoisted}")),
            ("        if (OD == 64u) {\n", "        if (((j0 - j_begin) / BK) % 4u != 3u && j0 + BK < j_end) {\n        } else if (OD == 64u) {\n"),
        ],
    )
}

/// attention_coop.wgsl with subgroupBarrier() where a barrier only orders a subgroup's own
/// score and P tiles (the score store before the softmax, P before P·V, the output's round
/// trip), a workgroup barrier kept for the shared K|V staging: how much the workgroup-wide
/// barriers cost. Timing only: naga's subgroupBarrier carries subgroup-memory semantics,
/// which do not order workgroup memory under the Vulkan memory model.
fn attention_subgroup_barriers() -> engine::Result<String> {
    let src = ATTN_STAGED;
    let (from, to) = ("    for (var j0 = j_begin", "        // (every K|V read of this block is behind the barrier above)\n");
    let (a, b) = (src.find(from), src.find(to));
    let (Some(a), Some(b)) = (a, b) else {
        return Err(engine::Error::Invalid("sgbar: the block loop not found".into()));
    };
    let body = &src[a..b];
    let n = body.matches("workgroupBarrier();").count();
    if n < 4 {
        return Err(engine::Error::Invalid(format!("sgbar: {n} barriers in the block loop")));
    }
    let body = body.replace("workgroupBarrier();", "subgroupBarrier();");
    Ok(format!("{}{}        workgroupBarrier();\n{}", &src[..a], body, &src[b..]))
}
