//! Quantized expert banks on the GPU (`moe_quant.wgsl`) and the residency map.
//!
//! A [`QuantBank`] holds one projection (up or down) of the routed experts of a layer in
//! `q4tp` or `q8_2f` ([`crate::quant`]), but only of the experts marked resident: their
//! matrices lie back to back in one buffer, and a small map `[experts]` gives each expert
//! its slot or [`MISS`]. [`NemotronKernels::expert_linear_quant`] runs the expert GEMM over
//! the per-expert lists like [`NemotronKernels::expert_linear`]; a missing expert's entries
//! are left alone, for the host to compute with the same quantized weights
//! ([`crate::quant::QuantMatrix::apply`]) and write in.

use wgpu::Buffer;

use super::{ExpertLists, LinearOps, NemotronKernels, RowsF32};
use crate::gpu::{Cost, Gpu, Recorder};
use crate::quant::{QuantFormat, QuantMatrix};
use crate::{Error, Result};

/// The map's value for an expert that is not on the GPU.
pub const MISS: u32 = u32::MAX;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct QuantParams {
    rows: u32,
    cols: u32,
    gpr: u32,
    flags: u32,
    x_off: u32,
    x_stride: u32,
    y_off: u32,
    y_stride: u32,
    cap: u32,
    xdiv: u32,
    slot_words: u32,
    _p0: u32,
}

/// One projection of a layer's routed experts, quantized, the resident ones on the GPU.
pub struct QuantBank {
    pub format: QuantFormat,
    /// The resident experts' words, `slot_words` apart.
    pub buf: Buffer,
    /// `[experts]`: the bank slot of each expert or [`MISS`].
    pub map: Buffer,
    /// Output rows and input columns of each expert's matrix.
    pub rows: u32,
    pub cols: u32,
    pub experts: u32,
    pub slot_words: u32,
    slots: Vec<u32>,
}

impl QuantBank {
    /// Upload the matrices of the experts with `resident[e]`; `mats` has one per expert,
    /// all of one format and shape.
    pub fn upload(
        gpu: &Gpu,
        label: &str,
        mats: &[&QuantMatrix],
        resident: &[bool],
    ) -> Result<QuantBank> {
        let first = mats
            .first()
            .ok_or_else(|| Error::Invalid(format!("{label}: a bank of no experts")))?;
        if resident.len() != mats.len() {
            return Err(Error::Invalid(format!(
                "{label}: a residency map of {} for {} experts",
                resident.len(),
                mats.len()
            )));
        }
        let (format, rows, cols) = (first.format(), first.rows(), first.cols());
        if let Some(e) = mats
            .iter()
            .position(|m| m.format() != format || m.rows() != rows || m.cols() != cols)
        {
            return Err(Error::Invalid(format!(
                "{label}: expert {e} is not {} [{rows}][{cols}] like expert 0",
                format.name()
            )));
        }
        let slot_words = first.words().len();
        let mut slots = Vec::with_capacity(mats.len());
        let mut words: Vec<u32> = Vec::new();
        let mut next = 0u32;
        for (m, &res) in mats.iter().zip(resident) {
            if res {
                words.extend_from_slice(m.words());
                slots.push(next);
                next += 1;
            } else {
                slots.push(MISS);
            }
        }
        let bytes = words.len() as u64 * 4;
        let limit = gpu.device.limits().max_storage_buffer_binding_size;
        if bytes > limit {
            return Err(Error::Unsupported(format!(
                "{label}: {next} resident experts take {bytes} bytes; one binding holds at most {limit} \
                 (keep fewer experts resident)"
            )));
        }
        let slot_words = u32::try_from(slot_words)
            .map_err(|_| Error::Unsupported(format!("{label}: an expert of {slot_words} words")))?;
        if words.is_empty() {
            words.resize(4, 0); // nothing resident: a placeholder the kernel never reads
        }
        Ok(QuantBank {
            format,
            buf: gpu.upload_u32(label, &words)?,
            map: gpu.upload_u32(label, &slots)?,
            rows: rows as u32,
            cols: cols as u32,
            experts: mats.len() as u32,
            slot_words,
            slots,
        })
    }

    /// A bank of `experts` resident experts whose words are already in `buf`, expert e at
    /// word `e · slot_words` (a harness that fills its banks on the GPU; the words are the
    /// caller's to vouch for).
    #[allow(clippy::too_many_arguments)]
    pub fn from_buffer(
        gpu: &Gpu,
        label: &str,
        format: QuantFormat,
        buf: Buffer,
        rows: u32,
        cols: u32,
        experts: u32,
        slot_words: u32,
    ) -> Result<QuantBank> {
        let need = experts as u64 * slot_words as u64 * 4;
        let limit = gpu.device.limits().max_storage_buffer_binding_size;
        if experts == 0 || buf.size() < need || need > limit {
            return Err(Error::Invalid(format!(
                "{label}: {experts} experts of {slot_words} words in a buffer of {} bytes (binding limit {limit})",
                buf.size()
            )));
        }
        let slots: Vec<u32> = (0..experts).collect();
        Ok(QuantBank {
            format,
            buf,
            map: gpu.upload_u32(label, &slots)?,
            rows,
            cols,
            experts,
            slot_words,
            slots,
        })
    }

    /// Whether expert `e` is on the GPU.
    pub fn resident(&self, e: usize) -> bool {
        self.slots.get(e).is_some_and(|&s| s != MISS)
    }

    /// How many experts are on the GPU.
    pub fn resident_count(&self) -> usize {
        self.slots.iter().filter(|&&s| s != MISS).count()
    }

    /// Bytes of one expert's matrix.
    pub fn expert_bytes(&self) -> u64 {
        self.slot_words as u64 * 4
    }
}

impl NemotronKernels {
    /// As [`expert_linear`](Self::expert_linear), the weights from a quantized bank:
    /// for every resident expert e and entry j of its list,
    /// `y[j] (=|+=) act(x[j / x_per_entry] · deq(W_e)ᵀ)`. Entries of experts the bank's map
    /// marks missing are not written.
    #[allow(clippy::too_many_arguments)]
    pub fn expert_linear_quant(
        &self,
        rec: &mut Recorder,
        lists: &ExpertLists,
        rows_bound: u32,
        x: RowsF32,
        x_per_entry: u32,
        bank: &QuantBank,
        y: RowsF32,
        ops: LinearOps,
    ) -> Result<()> {
        if x_per_entry == 0 {
            return Err(Error::Invalid("expert_linear_quant: x_per_entry 0".into()));
        }
        let (kernel, gpr) = match bank.format {
            QuantFormat::Q4tp => (&self.q4tp, bank.cols.div_ceil(32)),
            QuantFormat::Q8_2f => (&self.q8_2f, bank.cols.next_multiple_of(4)),
        };
        let rows = rows_bound.min(lists.cap);
        let params = QuantParams {
            rows: bank.rows,
            cols: bank.cols,
            gpr,
            flags: (ops.relu2 as u32) | (ops.accumulate as u32) << 1,
            x_off: x.off,
            x_stride: x.stride,
            y_off: y.off,
            y_stride: y.stride,
            cap: lists.cap,
            xdiv: x_per_entry,
            slot_words: bank.slot_words,
            _p0: 0,
        };
        // At most top_k experts per position are read; book the upper bound.
        let (r64, n64, k64) = (
            rows as u64 * lists.top_k as u64,
            bank.rows as u64,
            bank.cols as u64,
        );
        let read = (bank.resident_count() as u64).min(r64);
        let cost = Cost {
            bytes: read * bank.expert_bytes() + r64 * (k64 + n64) * 4,
            flops: 2 * r64 * n64 * k64,
        };
        rec.dispatch(
            kernel,
            bytemuck::bytes_of(&params),
            &[x.buf, &bank.buf, &bank.map, lists.list, lists.cnt, y.buf],
            [bank.rows.div_ceil(32), rows.div_ceil(8), bank.experts],
            cost,
        )
    }
}

/// A routed expert on the host: `down(relu²(up(x)))` for `n` rows of x, with the quantized
/// weights dequantized (f64 sums): the rows of an expert the residency map keeps off the GPU.
pub fn host_expert(up: &QuantMatrix, down: &QuantMatrix, x: &[f32], n: usize) -> Result<Vec<f32>> {
    if down.cols() != up.rows() {
        return Err(Error::Invalid(format!(
            "an expert whose up projection gives {} values and down projection takes {}",
            up.rows(),
            down.cols()
        )));
    }
    let mut h = up.apply(x, n)?;
    h.iter_mut()
        .for_each(|v| *v = crate::reference::nemotron_h::relu2(*v));
    down.apply(&h, n)
}

#[cfg(test)]
#[path = "moe_quant_tests.rs"]
mod tests;
