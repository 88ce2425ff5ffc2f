//! Weight formats of the MoE expert banks, as the seed (cortiq-engine's Nemotron-H frame)
//! lays them out for its GPU kernels: pack (quantize) from f32 rows, unpack (dequantize) to
//! f32, the word layout the kernels read, and the error bounds each quantizer keeps.
//!
//! - [`Q4tp`]: 4-bit weights in groups of 32, a 5-bit log-scale code per group and a per-row
//!   f16 `(base, step)`: the group's scale is `2^(base + code·step)`. Fits rows whose groups
//!   differ in magnitude by orders of magnitude (heavy tails) at 4.5 + 32/cols bits a weight.
//! - [`Q8_2f`]: int8 weights, an f16 scale per row and an f16 field per column that scales
//!   the input: `w[r][k] ≈ row[r] · q[r][k] · col[k]`. The column field takes the input
//!   channels' magnitude differences out of the rows, so a row's int8 grid is not set by
//!   the one column that carries an outlier.
//!
//! Both quantizers are deterministic, reject non-finite weights with an error, and come
//! with [`ErrorReport`]s: a check of the quantized matrix against the weights it came from
//! and the format's bounds (see each type's documentation for the bound and why it holds).
//!
//! [`block`] holds ggml's q8_0 / q4_0 block formats, used for Whisper's decoder weights
//! (`--quant`, and the quantized draft model of speculative decoding).
//!
//! [`QuantMatrix`] is either format behind one interface (the expert banks and the host's
//! share of a partly resident MoE layer use it).

pub mod block;
mod q4tp;
mod q8_2f;
#[cfg(test)]
mod tests;

pub use q4tp::{Q4tp, Q4tpLayout};
pub use q8_2f::{Q8_2f, Q8_2fLayout};

use half::f16;

use crate::{Error, Result};

/// Which quantized format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QuantFormat {
    Q4tp,
    Q8_2f,
}

impl QuantFormat {
    pub fn name(self) -> &'static str {
        match self {
            QuantFormat::Q4tp => "q4tp",
            QuantFormat::Q8_2f => "q8_2f",
        }
    }
}

/// How far a quantized matrix is from the weights it came from, measured against its
/// format's bounds. `worst_element` ≤ 1 is the quantizer's guarantee; the rest describe.
#[derive(Clone, Copy, Debug, Default)]
pub struct ErrorReport {
    /// max over elements of |w − deq(q(w))| / (the element's a-priori bound).
    pub worst_element: f64,
    /// max over elements of |w − deq| / (half the step of the grid actually used): how
    /// close the rounding comes to its half-step (≈ 1 on any matrix of some size).
    pub worst_half_step: f64,
    /// max over rows of ‖w − deq‖ / ‖w‖.
    pub worst_row_rel: f64,
    /// max over rows of (‖w − deq‖ / ‖w‖) / (the row's closed-form bound): ≤ 1.
    pub worst_row_vs_bound: f64,
    /// ‖W − deq‖ / ‖W‖ over the whole matrix.
    pub rel_frobenius: f64,
}

impl ErrorReport {
    /// Both the per-element and the per-row bound hold.
    pub fn within_bounds(&self) -> bool {
        self.worst_element <= 1.0 && self.worst_row_vs_bound <= 1.0
    }
}

/// A quantized `[rows][cols]` matrix in either format.
#[derive(Clone, Debug)]
pub enum QuantMatrix {
    Q4tp(Q4tp),
    Q8_2f(Q8_2f),
}

impl QuantMatrix {
    /// Quantize a row-major `[rows][cols]` f32 matrix.
    pub fn quantize(format: QuantFormat, w: &[f32], rows: usize, cols: usize) -> Result<Self> {
        Ok(match format {
            QuantFormat::Q4tp => QuantMatrix::Q4tp(Q4tp::quantize(w, rows, cols)?),
            QuantFormat::Q8_2f => QuantMatrix::Q8_2f(Q8_2f::quantize(w, rows, cols)?),
        })
    }

    pub fn format(&self) -> QuantFormat {
        match self {
            QuantMatrix::Q4tp(_) => QuantFormat::Q4tp,
            QuantMatrix::Q8_2f(_) => QuantFormat::Q8_2f,
        }
    }

    pub fn rows(&self) -> usize {
        match self {
            QuantMatrix::Q4tp(q) => q.rows(),
            QuantMatrix::Q8_2f(q) => q.rows(),
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            QuantMatrix::Q4tp(q) => q.cols(),
            QuantMatrix::Q8_2f(q) => q.cols(),
        }
    }

    /// The words the GPU reads (a multiple of 4 words: banks stack them back to back).
    pub fn words(&self) -> &[u32] {
        match self {
            QuantMatrix::Q4tp(q) => q.words(),
            QuantMatrix::Q8_2f(q) => q.words(),
        }
    }

    /// Row `r`, dequantized into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self {
            QuantMatrix::Q4tp(q) => q.dequantize_row(r, out),
            QuantMatrix::Q8_2f(q) => q.dequantize_row(r, out),
        }
    }

    /// The whole matrix, dequantized, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let (rows, cols) = (self.rows(), self.cols());
        let mut out = vec![0f32; rows * cols];
        for (r, row) in out.chunks_exact_mut(cols.max(1)).enumerate().take(rows) {
            self.dequantize_row(r, row);
        }
        out
    }

    /// `y = x · deq(W)ᵀ` for `n` rows of x (`[n][cols]` → `[n][rows]`), sums in f64 as the
    /// CPU reference's linear: what the host computes for an expert not on the GPU.
    pub fn apply(&self, x: &[f32], n: usize) -> Result<Vec<f32>> {
        let (rows, cols) = (self.rows(), self.cols());
        if x.len() != n * cols {
            return Err(Error::Invalid(format!(
                "{} input values are not {n} rows of {cols}",
                x.len()
            )));
        }
        let w = self.dequantize();
        Ok(crate::reference::ops::linear(x, n, cols, &w, rows, None))
    }

    /// Compare with the weights `w` it was quantized from (see [`ErrorReport`]).
    pub fn check(&self, w: &[f32]) -> Result<ErrorReport> {
        match self {
            QuantMatrix::Q4tp(q) => q.check(w),
            QuantMatrix::Q8_2f(q) => q.check(w),
        }
    }
}

fn check_shape(name: &str, w: &[f32], rows: usize, cols: usize) -> Result<()> {
    if rows == 0 || cols == 0 || w.len() != rows * cols {
        return Err(Error::Invalid(format!(
            "{name}: {} weights for a [{rows}][{cols}] matrix",
            w.len()
        )));
    }
    if u32::try_from(rows * cols).is_err() {
        return Err(Error::Invalid(format!(
            "{name}: a [{rows}][{cols}] matrix is too large for one bank slot"
        )));
    }
    if let Some(i) = w.iter().position(|v| !v.is_finite()) {
        return Err(Error::Invalid(format!(
            "{name}: weight [{}][{}] is {} (only finite weights can be quantized)",
            i / cols,
            i % cols,
            w[i]
        )));
    }
    Ok(())
}

/// The next f16 above `h` (toward +∞); finite inputs only.
fn f16_next_up(h: f16) -> f16 {
    let b = h.to_bits();
    if b & 0x7fff == 0 {
        f16::from_bits(1) // ±0 → the smallest positive subnormal
    } else if b & 0x8000 == 0 {
        f16::from_bits(b + 1)
    } else {
        f16::from_bits(b - 1)
    }
}

/// The smallest f16 ≥ x (x finite, within f16's range).
pub(crate) fn f16_up(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.to_f32() < x {
        f16_next_up(h)
    } else {
        h
    }
}

/// The largest f16 ≤ x.
pub(crate) fn f16_down(x: f32) -> f16 {
    let h = f16::from_f32(x);
    if h.to_f32() > x {
        -f16_next_up(-h)
    } else {
        h
    }
}

/// Word `i`'s byte `b` in a little-endian word array.
fn byte_of(words: &[u32], byte: usize) -> u32 {
    (words[byte / 4] >> ((byte % 4) * 8)) & 0xff
}

fn set_byte(words: &mut [u32], byte: usize, v: u32) {
    let sh = (byte % 4) * 8;
    words[byte / 4] = (words[byte / 4] & !(0xff << sh)) | ((v & 0xff) << sh);
}

/// Half `i` of a word array (low half first).
fn half_of(words: &[u32], i: usize) -> f16 {
    f16::from_bits((words[i / 2] >> ((i % 2) * 16)) as u16)
}

fn set_half(words: &mut [u32], i: usize, h: f16) {
    let sh = (i % 2) * 16;
    words[i / 2] = (words[i / 2] & !(0xffff << sh)) | ((h.to_bits() as u32) << sh);
}
