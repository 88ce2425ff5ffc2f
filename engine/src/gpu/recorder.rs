//! The dispatch recorder: every kernel launch goes through [`Recorder::dispatch`], which
//! names it (kernel + stage), books the bytes and FLOPs it must move, and — when the device
//! has timestamp queries and profiling is on — times it on the GPU. The same records feed
//! `--timings` in the CLI and the timing panel in the window.
//!
//! Parameters: each dispatch's small uniform block is written into a 256-byte slot of an
//! "arena" buffer (a larger block, such as the per-row parameters of a multi-row selection,
//! into as many consecutive slots as it needs); all slots are uploaded with one `write_buffer` per arena just before the
//! submit (queue writes are ordered before the submit that follows them), so a dispatch
//! costs no buffer creation (a recording submitted in parts uploads only what each part
//! added: `submit_early_at`). Arenas go back to a pool on the `Gpu` after the submit: a later
//! recorder's `write_buffer` is ordered after this submission, so reuse is safe.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Gpu, Kernel};
use crate::{Error, Result};

/// Uniform slot size: the largest `min_uniform_buffer_offset_alignment` in practice.
const SLOT: u64 = 256;
/// Slots per arena buffer.
const SLOTS_PER_ARENA: u64 = 256;
/// The most consecutive slots one parameter block may take (2 KiB).
const MAX_SLOTS_PER_BLOCK: u64 = 8;

/// Bytes of arena a parameter block of `len` bytes takes: whole slots, at least one.
fn slot_bytes(len: usize) -> u64 {
    (len as u64).div_ceil(SLOT).max(1) * SLOT
}
/// wgpu caps a query set at 4096 queries: 2 per timed dispatch.
const MAX_TIMED: usize = 2048;

/// What a dispatch must move and compute, for GB/s and FLOP/s in the profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cost {
    pub bytes: u64,
    pub flops: u64,
}

impl Cost {
    /// y[m][n] (=|+=) x[m][k] · Wᵀ with `weight_bytes` of weights: the weights once, x
    /// once, y written (and read too when accumulating).
    pub fn matmul(m: u32, n: u32, k: u32, weight_bytes: u64, accumulate: bool) -> Cost {
        let (m, n, k) = (m as u64, n as u64, k as u64);
        Cost { bytes: weight_bytes + m * k * 4 + m * n * 4 * if accumulate { 2 } else { 1 }, flops: 2 * m * n * k }
    }
}

/// Aggregated records of one kernel in one stage.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct KernelStat {
    pub kernel: &'static str,
    pub stage: &'static str,
    pub dispatches: u64,
    /// Sum of GPU time over the dispatches (0 when the device has no timestamps).
    pub gpu_ns: f64,
    pub bytes: u64,
    pub flops: u64,
}

/// Per-kernel statistics collected over many submissions.
#[derive(Clone, Debug, Default)]
pub struct Profile {
    /// Whether GPU times come from timestamp queries (false: only counts and bytes).
    pub timed: bool,
    stats: HashMap<(&'static str, &'static str), KernelStat>,
}

impl Profile {
    fn add(&mut self, kernel: &'static str, stage: &'static str, cost: Cost, ns: f64) {
        let s = self.stats.entry((kernel, stage)).or_insert_with(|| KernelStat {
            kernel,
            stage,
            ..Default::default()
        });
        s.dispatches += 1;
        s.gpu_ns += ns;
        s.bytes += cost.bytes;
        s.flops += cost.flops;
    }

    /// All records, largest GPU time first (dispatch count when untimed).
    pub fn stats(&self) -> Vec<KernelStat> {
        let mut v: Vec<KernelStat> = self.stats.values().cloned().collect();
        v.sort_by(|a, b| {
            b.gpu_ns
                .partial_cmp(&a.gpu_ns)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(b.dispatches.cmp(&a.dispatches))
                .then(a.kernel.cmp(b.kernel))
        });
        v
    }

    pub fn total_dispatches(&self) -> u64 {
        self.stats.values().map(|s| s.dispatches).sum()
    }

    pub fn merge(&mut self, other: &Profile) {
        self.timed |= other.timed;
        for (k, s) in &other.stats {
            let e = self.stats.entry(*k).or_insert_with(|| KernelStat { kernel: s.kernel, stage: s.stage, ..Default::default() });
            e.dispatches += s.dispatches;
            e.gpu_ns += s.gpu_ns;
            e.bytes += s.bytes;
            e.flops += s.flops;
        }
    }

    pub fn clear(&mut self) {
        self.stats.clear();
    }
}

enum Cmd {
    Dispatch {
        kernel: Arc<Kernel>,
        bind: wgpu::BindGroup,
        groups: [u32; 3],
        /// Gated (`Recorder::gate`): the grid is read by the GPU from this buffer at this
        /// byte offset, where `groups` was written and a kernel may have zeroed it since.
        indirect: Option<(wgpu::Buffer, u64)>,
        stage: &'static str,
        cost: Cost,
    },
    Copy {
        src: wgpu::Buffer,
        src_off: u64,
        dst: wgpu::Buffer,
        dst_off: u64,
        size: u64,
    },
}

/// What a recording does, command by command, for telling whether two recordings differ
/// in anything but their parameter bytes (`Recorder::signature`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CmdSig {
    Dispatch { kernel: &'static str, bind: wgpu::BindGroup, groups: [u32; 3], indirect: Option<(wgpu::Buffer, u64)> },
    Copy { src: wgpu::Buffer, src_off: u64, dst: wgpu::Buffer, dst_off: u64, size: u64 },
}

/// A recording's commands and where each dispatch's parameters sit (arena, byte offset).
pub type Signature = (Vec<CmdSig>, Vec<(usize, u64)>);

/// Bind groups and parameter slots kept from one recording to the next. A sequence of
/// dispatches that repeats with the same buffers (a decode step) then creates no bind
/// groups after its first recording: dispatch i reuses slot i and, when its kernel and
/// buffers are among the last [`BINDS_PER_SLOT`] it had there, that bind group; only the
/// parameter bytes are rewritten (one `write_buffer` per arena). More than one a slot
/// because a verify pass's kernel for a slot can depend on its rows (main_rows from
/// `GEMV_PASS_ROWS_MIN` on): with one, passes alternating across that threshold each made
/// a new bind group, so a new signature and a new replay program every time (live replay
/// on the H100, 2026-12-06: 0.15 against 0.10 ms/token).
#[derive(Default)]
pub struct DispatchCache {
    arenas: Vec<wgpu::Buffer>,
    /// Per slot, oldest first: the kernel, its parameter block's size, its buffers and the
    /// bind group.
    binds: Vec<Vec<SlotBind>>,
}

/// A bind group a [`DispatchCache`] slot keeps: kernel, parameter bytes, buffers, the group.
type SlotBind = (&'static str, u64, Vec<wgpu::Buffer>, wgpu::BindGroup);

/// Bind groups a [`DispatchCache`] slot keeps (the oldest goes first).
const BINDS_PER_SLOT: usize = 4;

pub struct Recorder<'g> {
    gpu: &'g Gpu,
    cmds: Vec<Cmd>,
    /// Parameter arenas: the buffer, the bytes to upload, and whether it goes back to the
    /// device's pool after the submit (not when it belongs to a cache).
    arenas: Vec<(wgpu::Buffer, Vec<u8>, bool)>,
    stage: &'static str,
    cache: Option<&'g mut DispatchCache>,
    /// (arena index, byte offset) of each dispatch's parameters, in recording order.
    slots: Vec<(usize, u64)>,
    /// Per arena: the bytes already uploaded (by an early submission).
    written: Vec<usize>,
    /// Submit what is recorded once this many dispatches are, each in turn, largest first
    /// (see `submit_early_at`).
    early_at: Vec<usize>,
    /// Dispatches already submitted early, for the profile's counts.
    submitted: Vec<(&'static str, &'static str, Cost)>,
    /// The part of the model being recorded (`part`) and the one left out (`leave_out`).
    part: &'static str,
    leave_out: Option<&'static str>,
    /// Gating (`gate`): the grid table, the byte offset of the next gated dispatch's grid
    /// and the end of the range this recording may use.
    gate: Option<(wgpu::Buffer, u64, u64)>,
    /// Grids of gated dispatches not uploaded yet: (table, byte offset, words), runs of
    /// consecutive grids merged.
    grid_writes: Vec<(wgpu::Buffer, u64, Vec<u32>)>,
}

/// A replayed recording kept to be submitted again unchanged (`Recorder::replay_kept`): its
/// signature names the program, and its parameters stay where the last recording uploaded
/// them (the arenas of the recording's `DispatchCache`, which nothing else writes), so
/// submitting it again skips the host's recording (an encoder window's: 0.030 → 0.016 ms
/// of host before the GPU starts for tiny.en, 0.141 → 0.060 for small.en; H100,
/// bench/RESULTS.md 2026-12-07 twenty-first session).
pub struct Kept {
    sig: Signature,
    /// Each dispatch's kernel, stage and cost, for the profile's counts.
    dispatches: Vec<(&'static str, &'static str, Cost)>,
}

impl Kept {
    /// Submit the kept recording's program again after a prologue writing `writes`;
    /// `None` where the program is gone (dropped at the replayer's bound): record anew.
    pub fn submit(&self, gpu: &Gpu, writes: &[(&wgpu::Buffer, u64, &[u8])], profile: Option<&mut Profile>) -> Result<Option<super::Ticket>> {
        self.submit_with(gpu, writes, &super::Moves::default(), profile)
    }

    /// The same with `moves`' copies and zero fills in the prologue, after the writes.
    pub fn submit_with(&self, gpu: &Gpu, writes: &[(&wgpu::Buffer, u64, &[u8])], moves: &super::Moves, profile: Option<&mut Profile>) -> Result<Option<super::Ticket>> {
        #[cfg(target_vendor = "apple")]
        {
            let _ = (gpu, writes, moves, profile);
            Ok(None)
        }
        #[cfg(not(target_vendor = "apple"))]
        {
            if !gpu.replay_available() || !gpu.with_replayer(|r| Ok(r.has(&self.sig)))? {
                return Ok(None);
            }
            let ticket = super::replay::submit_recording(gpu, &self.sig, writes, moves)?;
            gpu.check()?;
            if let Some(profile) = profile {
                for &(name, stage, cost) in &self.dispatches {
                    profile.add(name, stage, cost, 0.0);
                }
            }
            Ok(Some(ticket))
        }
    }
}

/// A recording encoded into a command buffer, its parameters already written (queued
/// before the next submission), not yet submitted: a decode step can be encoded while
/// the previous one runs on the GPU and submitted once its token is known.
pub struct Encoded {
    cmd: wgpu::CommandBuffer,
    untimed: Vec<(&'static str, &'static str, Cost)>,
    pooled: Vec<wgpu::Buffer>,
}

impl Encoded {
    /// Submit; `profile` gets the dispatch counts and bytes (no GPU times).
    pub fn submit(self, gpu: &Gpu, profile: Option<&mut Profile>) -> Result<()> {
        gpu.queue.submit([self.cmd]);
        {
            let mut pool = gpu.arena_pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.extend(self.pooled);
        }
        gpu.check()?;
        if let Some(profile) = profile {
            for (k, s, c) in &self.untimed {
                profile.add(k, s, *c, 0.0);
            }
        }
        Ok(())
    }
}

/// One dispatch: its grid as recorded, or read from the gate's table (see `Recorder::gate`).
fn dispatch(pass: &mut wgpu::ComputePass, groups: &[u32; 3], indirect: &Option<(wgpu::Buffer, u64)>) {
    match indirect {
        Some((table, off)) => pass.dispatch_workgroups_indirect(table, *off),
        None => pass.dispatch_workgroups(groups[0], groups[1], groups[2]),
    }
}

impl<'g> Recorder<'g> {
    pub(super) fn new(gpu: &'g Gpu, cache: Option<&'g mut DispatchCache>) -> Self {
        Recorder {
            gpu,
            cmds: Vec::new(),
            arenas: Vec::new(),
            stage: "",
            cache,
            slots: Vec::new(),
            written: Vec::new(),
            early_at: Vec::new(),
            submitted: Vec::new(),
            part: "",
            leave_out: None,
            gate: None,
            grid_writes: Vec::new(),
        }
    }

    /// Gate the dispatches recorded from now on (None: stop): each one's grid is written
    /// into `table` (a buffer with INDIRECT usage) at the next 12 bytes from `from` (up to
    /// `to`), uploaded with the parameters, and the dispatch reads it from there on the GPU
    /// (an indirect dispatch). A kernel that runs before them may zero those grids, which
    /// makes the gated dispatches empty: a decode batch's steps past a device-picked
    /// end-of-text (see `Kernels::embed`). The grid is uploaded before the submission
    /// that carries the dispatch, so the zeroing must come later in the same submission.
    pub fn gate(&mut self, table: Option<(&wgpu::Buffer, u64, u64)>) {
        self.gate = table.map(|(b, from, to)| (b.clone(), from, to));
    }

    /// Submit what is recorded each time the count of dispatches reaches one of `counts`
    /// and go on recording: the GPU runs the first part while the host records the rest
    /// (recording a dispatch costs the host ≈ 5 µs on the H200, so a verify pass's ~36
    /// dispatches ≈ 0.2 ms that would otherwise sit before the GPU's first instruction).
    /// Off while dispatches are timed (each is its own pass then, and the times are read at
    /// the final submit).
    pub fn submit_early_at(&mut self, counts: &[usize]) {
        self.early_at.clear();
        if !self.gpu.timing_dispatches() {
            self.early_at.extend(counts.iter().copied().filter(|&c| c > 0));
            self.early_at.sort_unstable_by(|a, b| b.cmp(a));
        }
    }

    /// Submit what is recorded so far and go on recording: the GPU starts on it while the
    /// host records the rest (a pass's dispatches at chosen points rather than counts, as
    /// `submit_early_at` places them). Nothing while dispatches are timed.
    pub fn flush(&mut self) -> Result<()> {
        if self.gpu.timing_dispatches() || self.cmds.is_empty() {
            return Ok(());
        }
        self.submit_recorded()
    }

    /// The commands recorded so far and their parameter slots: two recordings through one
    /// `DispatchCache` with equal signatures run the same dispatches on the same bind
    /// groups and grids, reading their parameters from the same places, so either's
    /// encoded command buffer computes the other's once the other's parameters are
    /// uploaded (`upload_only`).
    pub fn signature(&self) -> Signature {
        let cmds = self
            .cmds
            .iter()
            .map(|c| match c {
                Cmd::Dispatch { kernel, bind, groups, indirect, .. } => {
                    CmdSig::Dispatch { kernel: kernel.name, bind: bind.clone(), groups: *groups, indirect: indirect.clone() }
                }
                Cmd::Copy { src, src_off, dst, dst_off, size } => {
                    CmdSig::Copy { src: src.clone(), src_off: *src_off, dst: dst.clone(), dst_off: *dst_off, size: *size }
                }
            })
            .collect();
        (cmds, self.slots.clone())
    }

    /// Queue this recording's parameters (written before the next submission) and drop
    /// its commands unencoded: another recording with the same signature, encoded and not
    /// yet submitted, then runs with these parameters. Only with a `DispatchCache` (its
    /// arenas outlive the recorder); nothing else is uploaded (a gate's grids need the
    /// commands that read them).
    pub fn upload_only(mut self) -> Result<()> {
        if self.cache.is_none() || self.gate.is_some() || !self.grid_writes.is_empty() {
            return Err(Error::Invalid("upload_only: only a cached recording without gated grids".into()));
        }
        self.upload_params();
        Ok(())
    }

    /// Submit this recording as a replay (`replay.rs`): a raw Vulkan command buffer built on
    /// the first recording with this signature and submitted again after a prologue that
    /// uploads the parameters, the gated grids and `writes` (buffer, byte offset, bytes:
    /// what wgpu's `write_buffer` would otherwise carry, which a replay would not see). Only
    /// a whole recording through a `DispatchCache` (its arenas and bind groups are the
    /// program's), nothing left out or submitted early, on a device with
    /// `Gpu::replay_available`. `Some(ticket)`: replayed, wait with `Gpu::replay_wait`
    /// before reading results. `None`: this signature's first recording, which builds the
    /// program and goes through wgpu (`writes` queued, `submit`): wgpu zeroes a buffer's
    /// memory on its first use in a submission of its own, so a replay must never be a
    /// buffer's first user, or wgpu's later first use would wipe what the replay wrote (the
    /// KV cache of a first window's prompt did).
    pub fn replay(self, writes: &[(&wgpu::Buffer, u64, &[u8])], profile: Option<&mut Profile>) -> Result<Option<super::Ticket>> {
        if !self.gpu.replay_available() {
            return Err(Error::Unsupported("replays need a Vulkan device the engine opened itself, untimed".into()));
        }
        if self.cache.is_none() || self.leave_out.is_some() || !self.submitted.is_empty() || self.written.iter().any(|&w| w > 0) {
            return Err(Error::Invalid("replay: only a whole cached recording with nothing left out or submitted".into()));
        }
        #[cfg(target_vendor = "apple")]
        {
            let _ = (writes, profile);
            Err(Error::Unsupported("replays need Vulkan".into()))
        }
        #[cfg(not(target_vendor = "apple"))]
        {
            let sig = self.signature();
            let gpu = self.gpu;
            if !gpu.with_replayer(|r| Ok(r.has(&sig)))? {
                let cmds = self.program_cmds()?;
                gpu.with_replayer(|r| r.build(sig, &cmds))?;
                for (buf, off, data) in writes {
                    gpu.queue.write_buffer(buf, *off, data);
                }
                self.submit(profile)?;
                return Ok(None);
            }
            let mut all: Vec<(&wgpu::Buffer, u64, &[u8])> = Vec::with_capacity(writes.len() + self.arenas.len() + self.grid_writes.len());
            for (buf, off, words) in &self.grid_writes {
                all.push((buf, *off, bytemuck::cast_slice(words)));
            }
            for (buf, data, _) in &self.arenas {
                all.push((buf, 0, &data[..]));
            }
            all.extend_from_slice(writes);
            let ticket = super::replay::submit_recording(gpu, &sig, &all, &super::Moves::default())?;
            gpu.check()?;
            if let Some(profile) = profile {
                for c in &self.cmds {
                    if let Cmd::Dispatch { kernel, stage, cost, .. } = c {
                        profile.add(kernel.name, stage, *cost, 0.0);
                    }
                }
            }
            Ok(Some(ticket))
        }
    }

    /// `replay`, keeping what submits the same recording again without recording it
    /// (`Kept::submit`): for a recording whose dispatches, parameters and grids never change
    /// (the encoder's), where only `writes` differ. No gated grids (they change).
    pub fn replay_kept(self, writes: &[(&wgpu::Buffer, u64, &[u8])], profile: Option<&mut Profile>) -> Result<(Option<super::Ticket>, Kept)> {
        if self.gate.is_some() || !self.grid_writes.is_empty() {
            return Err(Error::Invalid("replay_kept: a recording with gated grids changes between submissions".into()));
        }
        let kept = Kept {
            sig: self.signature(),
            dispatches: self
                .cmds
                .iter()
                .filter_map(|c| match c {
                    Cmd::Dispatch { kernel, stage, cost, .. } => Some((kernel.name, *stage, *cost)),
                    Cmd::Copy { .. } => None,
                })
                .collect(),
        };
        Ok((self.replay(writes, profile)?, kept))
    }

    /// The recording's commands with each dispatch's parameter range and buffers (from the
    /// dispatch cache), for building a replay's program.
    #[cfg(not(target_vendor = "apple"))]
    fn program_cmds(&self) -> Result<Vec<super::replay::ProgramCmd>> {
        use super::replay::ProgramCmd;
        let cache = self.cache.as_ref().ok_or_else(|| Error::Invalid("replay: no dispatch cache".into()))?;
        let mut slots = self.slots.iter();
        let mut out = Vec::with_capacity(self.cmds.len());
        for c in &self.cmds {
            out.push(match c {
                Cmd::Dispatch { kernel, bind, groups, indirect, .. } => {
                    let &(ai, off) = slots.next().ok_or_else(|| Error::Invalid("replay: a dispatch without a slot".into()))?;
                    let slot = (ai as u64 * SLOTS_PER_ARENA + off / SLOT) as usize;
                    let kept = cache.binds.get(slot).and_then(|k| k.iter().find(|(_, _, _, bg)| bg == bind));
                    let (size, buffers) = match kept {
                        Some((_, size, bufs, _)) => (*size, bufs.clone()),
                        None => return Err(Error::Invalid(format!("replay: kernel {}'s slot has no bind group", kernel.name))),
                    };
                    ProgramCmd::Dispatch {
                        kernel: kernel.clone(),
                        params: (self.arenas[ai].0.clone(), off, size),
                        buffers,
                        groups: *groups,
                        indirect: indirect.clone(),
                    }
                }
                Cmd::Copy { src, src_off, dst, dst_off, size } => {
                    ProgramCmd::Copy { src: src.clone(), src_off: *src_off, dst: dst.clone(), dst_off: *dst_off, size: *size }
                }
            });
        }
        Ok(out)
    }

    /// Upload the parameter bytes not uploaded yet (queued: applied before the next
    /// submission, which is ordered after the earlier ones reading the same arena).
    fn upload_params(&mut self) {
        for (buf, off, words) in self.grid_writes.drain(..) {
            self.gpu.queue.write_buffer(&buf, off, bytemuck::cast_slice(&words));
        }
        self.written.resize(self.arenas.len(), 0);
        for ((buf, data, _), done) in self.arenas.iter().zip(self.written.iter_mut()) {
            if data.len() > *done {
                self.gpu.queue.write_buffer(buf, *done as u64, &data[*done..]);
                *done = data.len();
            }
        }
    }

    /// Encode `cmds` into `enc` without timestamps: consecutive dispatches share a pass
    /// (wgpu orders each after the previous one's writes), copies sit between passes.
    fn encode_untimed(enc: &mut wgpu::CommandEncoder, cmds: &[Cmd], untimed: &mut Vec<(&'static str, &'static str, Cost)>) {
        let mut i = 0;
        while i < cmds.len() {
            match &cmds[i] {
                Cmd::Copy { src, src_off, dst, dst_off, size } => {
                    enc.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *size);
                    i += 1;
                }
                Cmd::Dispatch { .. } => {
                    let mut pass =
                        enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("dispatches"), timestamp_writes: None });
                    while let Some(Cmd::Dispatch { kernel, bind, groups, indirect, stage, cost }) = cmds.get(i) {
                        pass.set_pipeline(kernel.pipeline());
                        pass.set_bind_group(0, bind, &[]);
                        dispatch(&mut pass, groups, indirect);
                        untimed.push((kernel.name, *stage, *cost));
                        i += 1;
                    }
                }
            }
        }
    }

    /// Submit everything recorded so far and keep recording (arenas and slots go on).
    fn submit_recorded(&mut self) -> Result<()> {
        self.upload_params();
        let cmds = std::mem::take(&mut self.cmds);
        let mut enc = self.gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("verbatim early") });
        Self::encode_untimed(&mut enc, &cmds, &mut self.submitted);
        self.gpu.queue.submit([enc.finish()]);
        self.gpu.check()
    }

    /// Where the parameters of the last `n` dispatches live (arena buffer, byte offset),
    /// oldest first: rewriting them with `queue.write_buffer` before an [`Encoded`] is
    /// submitted changes what those dispatches see.
    pub fn last_param_slots(&self, n: usize) -> Vec<(wgpu::Buffer, u64)> {
        let from = self.slots.len().saturating_sub(n);
        self.slots[from..].iter().map(|&(ai, off)| (self.arenas[ai].0.clone(), off)).collect()
    }

    /// Write the parameters and encode everything recorded, without timestamps and
    /// without submitting.
    pub fn encode(mut self) -> Result<Encoded> {
        let gpu = self.gpu;
        self.upload_params();
        let cmds = std::mem::take(&mut self.cmds);
        let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("verbatim") });
        let mut untimed = std::mem::take(&mut self.submitted);
        Self::encode_untimed(&mut enc, &cmds, &mut untimed);
        let pooled = self.arenas.drain(..).filter(|(_, _, pooled)| *pooled).map(|(b, _, _)| b).collect();
        Ok(Encoded { cmd: enc.finish(), untimed, pooled })
    }

    fn new_arena(&self) -> wgpu::Buffer {
        self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("kernel parameters"),
            size: SLOT * SLOTS_PER_ARENA,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Name the stage the following dispatches belong to (encoder, prefill, decode...).
    pub fn stage(&mut self, stage: &'static str) {
        self.stage = stage;
        self.part = "";
    }

    /// Name the part of the model the following dispatches compute (a decode step's
    /// "cross_attention", "logits", ...), for `leave_out`.
    pub fn part(&mut self, part: &'static str) {
        self.part = part;
    }

    /// Drop the dispatches of the named part from this recording (for measuring only:
    /// what the recording computes is then wrong).
    pub fn leave_out(&mut self, part: Option<&'static str>) {
        self.leave_out = part;
    }

    pub fn len(&self) -> usize {
        self.cmds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cmds.is_empty()
    }

    /// Write `params` into the next uniform slots (one, or as many consecutive ones as a
    /// larger block needs); returns (arena index, byte offset).
    fn param_slot(&mut self, params: &[u8]) -> Result<(usize, u64)> {
        let size = slot_bytes(params.len());
        if size > SLOT * MAX_SLOTS_PER_BLOCK {
            return Err(Error::Invalid(format!("kernel parameters of {} bytes exceed {MAX_SLOTS_PER_BLOCK} slots", params.len())));
        }
        let need_new = match self.arenas.last() {
            Some((_, data, _)) => data.len() as u64 + size > SLOT * SLOTS_PER_ARENA,
            None => true,
        };
        if need_new {
            let idx = self.arenas.len();
            let cached = self.cache.as_ref().and_then(|c| c.arenas.get(idx).cloned());
            let (buf, pooled) = match (cached, self.cache.is_some()) {
                (Some(b), _) => (b, false),
                (None, true) => {
                    let b = self.new_arena();
                    if let Some(c) = self.cache.as_mut() {
                        c.arenas.push(b.clone());
                    }
                    (b, false)
                }
                (None, false) => {
                    let pooled = self.gpu.arena_pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
                    (pooled.unwrap_or_else(|| self.new_arena()), true)
                }
            };
            self.arenas.push((buf, Vec::with_capacity((SLOT * SLOTS_PER_ARENA) as usize), pooled));
        }
        let idx = self.arenas.len() - 1;
        let data = &mut self.arenas[idx].1;
        let off = data.len() as u64;
        data.extend_from_slice(params);
        data.resize((off + size) as usize, 0);
        Ok((idx, off))
    }

    /// Record one dispatch of `kernel` with its parameter block and storage buffers
    /// (bindings 1.. in the order the kernel declared them).
    pub fn dispatch(
        &mut self,
        kernel: &Arc<Kernel>,
        params: &[u8],
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
        cost: Cost,
    ) -> Result<()> {
        if buffers.len() != kernel.bindings.len() {
            return Err(Error::Invalid(format!(
                "kernel {} takes {} buffers, got {}",
                kernel.name,
                kernel.bindings.len(),
                buffers.len()
            )));
        }
        let max = self.gpu.device.limits().max_compute_workgroups_per_dimension;
        if groups.iter().any(|&g| g > max) {
            return Err(Error::Invalid(format!("kernel {}: grid {groups:?} exceeds the adapter's {max}", kernel.name)));
        }
        if groups.contains(&0) {
            return Ok(()); // nothing to do (an empty range)
        }
        let (ai, off) = self.param_slot(params)?;
        let param_bytes = slot_bytes(params.len());
        self.slots.push((ai, off));
        let slot = (ai as u64 * SLOTS_PER_ARENA + off / SLOT) as usize;
        let reuse = self.cache.as_ref().and_then(|c| {
            c.binds.get(slot)?.iter().find_map(|(name, size, bufs, bg)| {
                (*name == kernel.name
                    && *size == param_bytes
                    && bufs.len() == buffers.len()
                    && bufs.iter().zip(buffers).all(|(a, b)| a == *b))
                .then(|| bg.clone())
            })
        });
        let bind = match reuse {
            Some(bg) => bg,
            None => {
                let mut entries = Vec::with_capacity(buffers.len() + 1);
                entries.push(wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &self.arenas[ai].0,
                        offset: off,
                        size: wgpu::BufferSize::new(param_bytes),
                    }),
                });
                for (i, b) in buffers.iter().enumerate() {
                    entries.push(wgpu::BindGroupEntry { binding: i as u32 + 1, resource: b.as_entire_binding() });
                }
                let bg = self.gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(kernel.name),
                    layout: &kernel.layout,
                    entries: &entries,
                });
                if let Some(c) = self.cache.as_mut() {
                    if c.binds.len() <= slot {
                        c.binds.resize(slot + 1, Vec::new());
                    }
                    let kept = &mut c.binds[slot];
                    if kept.len() == BINDS_PER_SLOT {
                        kept.remove(0);
                    }
                    kept.push((kernel.name, param_bytes, buffers.iter().map(|b| (*b).clone()).collect(), bg.clone()));
                }
                bg
            }
        };
        // A part left out keeps its parameter slot and bind group (the cache and the slots
        // of later dispatches stay as they are) and records no command.
        if self.leave_out.is_none_or(|l| l != self.part) {
            let indirect = match &mut self.gate {
                Some((table, next, end)) => {
                    if *next + 12 > *end {
                        return Err(Error::Invalid(format!("kernel {}: the gated grids' range is full", kernel.name)));
                    }
                    let at = *next;
                    *next += 12;
                    match self.grid_writes.last_mut() {
                        Some((b, off, words)) if b == table && *off + 4 * words.len() as u64 == at => words.extend_from_slice(&groups),
                        _ => self.grid_writes.push((table.clone(), at, groups.to_vec())),
                    }
                    Some((table.clone(), at))
                }
                None => None,
            };
            self.cmds.push(Cmd::Dispatch { kernel: kernel.clone(), bind, groups, indirect, stage: self.stage, cost });
        }
        if self.early_at.last().is_some_and(|&n| self.slots.len() >= n) {
            while self.early_at.last().is_some_and(|&n| self.slots.len() >= n) {
                self.early_at.pop();
            }
            self.submit_recorded()?;
        }
        Ok(())
    }

    /// Record a buffer-to-buffer copy (ordered with the dispatches around it).
    pub fn copy(&mut self, src: &wgpu::Buffer, src_off: u64, dst: &wgpu::Buffer, dst_off: u64, size: u64) {
        if size > 0 {
            self.cmds.push(Cmd::Copy { src: src.clone(), src_off, dst: dst.clone(), dst_off, size });
        }
    }

    /// Encode and submit everything recorded. With profiling on, each dispatch gets its own
    /// pass with timestamp writes and the times are added to `profile` (this waits for the
    /// GPU); otherwise consecutive dispatches share one pass (wgpu still orders each
    /// dispatch after the writes of the previous one) and `profile` gets counts and bytes.
    pub fn submit(mut self, profile: Option<&mut Profile>) -> Result<()> {
        let gpu = self.gpu;
        self.upload_params();
        let cmds = std::mem::take(&mut self.cmds);
        let timed = gpu.timing_dispatches() && profile.is_some();
        let mut enc = gpu.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("verbatim") });
        let mut timing: Vec<(&'static str, &'static str, Cost)> = Vec::new();
        let mut untimed: Vec<(&'static str, &'static str, Cost)> = std::mem::take(&mut self.submitted);
        let mut query: Option<(wgpu::QuerySet, wgpu::Buffer, wgpu::Buffer)> = None;
        if timed {
            let n = cmds.iter().filter(|c| matches!(c, Cmd::Dispatch { .. })).count().min(MAX_TIMED);
            if n > 0 {
                let qs = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("dispatch timestamps"),
                    ty: wgpu::QueryType::Timestamp,
                    count: (2 * n) as u32,
                });
                let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamps"),
                    size: (16 * n) as u64,
                    usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                    mapped_at_creation: false,
                });
                let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("timestamps readback"),
                    size: (16 * n) as u64,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                query = Some((qs, resolve, staging));
            }
        }
        // Timed: a pass per dispatch with timestamp writes (up to MAX_TIMED of them); the
        // rest (all of it untimed) as `encode_untimed` does: consecutive dispatches share a
        // pass, copies sit between passes.
        let mut i = 0;
        if let Some((qs, _, _)) = &query {
            while let Some(cmd) = cmds.get(i) {
                match cmd {
                    Cmd::Copy { src, src_off, dst, dst_off, size } => {
                        enc.copy_buffer_to_buffer(src, *src_off, dst, *dst_off, *size);
                    }
                    Cmd::Dispatch { .. } if timing.len() >= MAX_TIMED => break,
                    Cmd::Dispatch { kernel, bind, groups, indirect, stage, cost } => {
                        let q = timing.len() as u32 * 2;
                        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                            label: Some(kernel.name),
                            timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                                query_set: qs,
                                beginning_of_pass_write_index: Some(q),
                                end_of_pass_write_index: Some(q + 1),
                            }),
                        });
                        pass.set_pipeline(kernel.pipeline());
                        pass.set_bind_group(0, bind, &[]);
                        dispatch(&mut pass, groups, indirect);
                        timing.push((kernel.name, *stage, *cost));
                    }
                }
                i += 1;
            }
        }
        Self::encode_untimed(&mut enc, &cmds[i..], &mut untimed);
        if let Some((qs, resolve, staging)) = &query {
            let n = timing.len() as u32;
            enc.resolve_query_set(qs, 0..2 * n, resolve, 0);
            enc.copy_buffer_to_buffer(resolve, 0, staging, 0, 16 * n as u64);
        }
        gpu.queue.submit([enc.finish()]);
        // The arenas' contents are in the queue now; they can serve the next recorder.
        {
            let mut pool = gpu.arena_pool.lock().unwrap_or_else(|p| p.into_inner());
            for (buf, _, pooled) in self.arenas.drain(..) {
                if pooled {
                    pool.push(buf);
                }
            }
        }
        gpu.check()?;
        if let Some(profile) = profile {
            for (k, s, c) in &untimed {
                profile.add(k, s, *c, 0.0);
            }
            if let Some((_, _, staging)) = &query {
                gpu.map_and_wait(staging)?;
                let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(
                    &staging.get_mapped_range(..).map_err(|e| Error::Gpu(format!("reading timestamps failed: {e}")))?,
                );
                staging.unmap();
                let period = gpu.queue.get_timestamp_period() as f64;
                for (j, (k, s, c)) in timing.iter().enumerate() {
                    let (a, b) = (ticks[2 * j], ticks[2 * j + 1]);
                    let ns = if b >= a { (b - a) as f64 * period } else { 0.0 };
                    profile.add(k, s, *c, ns);
                }
                profile.timed = true;
            }
        }
        Ok(())
    }
}
