//! ggml's block formats for Whisper's decoder weights: `q8_0` and `q4_0`, 32 weights along
//! the input dimension sharing one f16 scale.
//!
//! - `q8_0`: d = max|w| / 127, q = round(w / d) in [-127, 127]; w ≈ q·d (8.5 bits a weight).
//! - `q4_0`: d = m / -8 where m is the block's weight of largest magnitude (sign kept),
//!   q = min(15, trunc(w / d + 8.5)) in [0, 15]; w ≈ (q - 8)·d (4.5 bits a weight). The
//!   extreme weight lands exactly on the grid's end (-8·d = m), the rest within d/2.
//!
//! These are ggml's definitions (`quantize_row_q8_0_ref`, `quantize_row_q4_0_ref`), so a
//! word error rate measured here means what it means for whisper.cpp's quantized models.
//! The layout on the GPU is ours (gemv_q.wgsl): k-major like [`crate::kernels::F16Matrix`]
//! so that neighbouring threads (neighbouring output columns) read neighbouring words:
//! - q8_0 word `(kb·8 + j)·n + c` holds the 4 codes of k = 32·kb + 4j .. +3 of column c,
//!   byte i = k offset i (two's complement);
//! - q4_0 word `(kb·4 + j)·n + c` holds the 8 codes of k = 32·kb + 8j .. +7, nibble i at
//!   bits 4i..4i+3;
//! - scales: f16 `[kb][n]`, pairs packed along n (word `(kb·n + c) / 2`, even c low).
//!
//! A last block past k is padded with zero codes (q8_0: 0; q4_0: 8, which is 0 too).

use half::f16;

use crate::{Error, Result};

/// Weights per block (one scale each).
pub const BLOCK: usize = 32;

/// Which block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BlockFormat {
    Q8_0,
    Q4_0,
}

impl BlockFormat {
    pub const NAMES: [&'static str; 2] = ["q8_0", "q4_0"];

    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q4_0 => "q4_0",
        }
    }

    /// u32 code words per block of one column.
    pub fn words_per_block(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 8,
            BlockFormat::Q4_0 => 4,
        }
    }
}

impl std::str::FromStr for BlockFormat {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "q8_0" => Ok(BlockFormat::Q8_0),
            "q4_0" => Ok(BlockFormat::Q4_0),
            other => Err(Error::Invalid(format!(
                "unknown weight format {other:?} (one of: {})",
                BlockFormat::NAMES.join(", ")
            ))),
        }
    }
}

/// A `[n][k]` matrix (output-major, as a Linear's weight) quantized in blocks of 32 along
/// k, kept in the GPU's layout (see the module documentation).
#[derive(Clone, Debug)]
pub struct BlockQuant {
    pub format: BlockFormat,
    pub n: usize,
    pub k: usize,
    /// Code words, `[blocks·words_per_block][n]`.
    pub words: Vec<u32>,
    /// f16 scales `[blocks][n]`, two per word.
    pub scales: Vec<u32>,
}

/// The scale and codes of one block of up to 32 weights (ggml's reference quantizers).
fn quantize_block(format: BlockFormat, w: &[f32]) -> (f16, [u8; BLOCK]) {
    let mut q = [0u8; BLOCK];
    match format {
        BlockFormat::Q8_0 => {
            let amax = w.iter().fold(0f32, |a, &v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for (qi, &v) in q.iter_mut().zip(w) {
                *qi = ((v * id).round() as i8) as u8;
            }
            (f16::from_f32(d), q)
        }
        BlockFormat::Q4_0 => {
            let (mut amax, mut m) = (0f32, 0f32);
            for &v in w {
                if v.abs() > amax {
                    amax = v.abs();
                    m = v;
                }
            }
            let d = m / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            q.fill(8);
            for (qi, &v) in q.iter_mut().zip(w) {
                *qi = ((v * id + 8.5) as i8).clamp(0, 15) as u8;
            }
            (f16::from_f32(d), q)
        }
    }
}

/// Columns a worker quantizes as one piece (even: scales go in pairs along n).
const PIECE_COLUMNS: usize = 1024;

/// Columns `c0..c0 + cols` of a `[n][k]` matrix (`row(c)` its column c's k weights)
/// quantized: the piece's own words `[blocks·words_per_block][cols]` and scales
/// `[blocks][cols / 2]`, or the first non-finite weight as (column, k).
fn quantize_piece<'a>(
    format: BlockFormat,
    k: usize,
    c0: usize,
    cols: usize,
    row: impl Fn(usize) -> std::borrow::Cow<'a, [f32]>,
) -> std::result::Result<(Vec<u32>, Vec<u32>), (usize, usize, f32)> {
    let nb = k.div_ceil(BLOCK);
    let wpb = format.words_per_block();
    let mut words = vec![0u32; nb * wpb * cols];
    let mut scales = vec![0u32; nb * cols / 2];
    for c in 0..cols {
        let w = row(c0 + c);
        if let Some(i) = w.iter().position(|v| !v.is_finite()) {
            return Err((c0 + c, i, w[i]));
        }
        for kb in 0..nb {
            let blk = &w[kb * BLOCK..((kb + 1) * BLOCK).min(k)];
            let (d, q) = quantize_block(format, blk);
            scales[(kb * cols + c) / 2] |= (d.to_bits() as u32) << (16 * (c % 2));
            for j in 0..wpb {
                let word = match format {
                    BlockFormat::Q8_0 => u32::from_le_bytes([q[4 * j], q[4 * j + 1], q[4 * j + 2], q[4 * j + 3]]),
                    BlockFormat::Q4_0 => (0..8).fold(0u32, |acc, i| acc | (q[8 * j + i] as u32) << (4 * i)),
                };
                words[(kb * wpb + j) * cols + c] = word;
            }
        }
    }
    Ok((words, scales))
}

impl BlockQuant {
    /// Quantize f16 weights `[n][k]` (row-major bits, as the checkpoint stores them).
    /// n must be even (scales are packed in pairs along n).
    pub fn from_f16_bits(format: BlockFormat, bits: &[u16], n: usize, k: usize) -> Result<Self> {
        Self::quantize_with(format, bits.len(), n, k, |c| {
            std::borrow::Cow::Owned(bits[c * k..(c + 1) * k].iter().map(|&b| f16::from_bits(b).to_f32()).collect())
        })
    }

    /// Quantize f32 weights `[n][k]`. Non-finite weights are an error.
    pub fn quantize(format: BlockFormat, w: &[f32], n: usize, k: usize) -> Result<Self> {
        Self::quantize_with(format, w.len(), n, k, |c| std::borrow::Cow::Borrowed(&w[c * k..(c + 1) * k]))
    }

    /// `len` weights as `[n][k]`, column c's from `row(c)`, quantized in pieces of
    /// `PIECE_COLUMNS` columns side by side (each column's blocks depend on that column
    /// alone, so the pieces give one thread's words): a `--quant` load or a quantized
    /// draft quantizes tiny.en's 20-million-weight embedding table, ~0.2 s on one of the
    /// lent H100's host cores (2026-12-06, eighteenth session).
    fn quantize_with<'a>(
        format: BlockFormat,
        len: usize,
        n: usize,
        k: usize,
        row: impl Fn(usize) -> std::borrow::Cow<'a, [f32]> + Sync,
    ) -> Result<Self> {
        if n == 0 || k == 0 || n % 2 != 0 || len != n * k {
            return Err(Error::Invalid(format!(
                "{}: {len} weights for a [{n}][{k}] matrix (n even, neither zero)",
                format.name(),
            )));
        }
        let pieces = crate::threads::side_by_side(n.div_ceil(PIECE_COLUMNS), |p| {
            let c0 = p * PIECE_COLUMNS;
            let cols = PIECE_COLUMNS.min(n - c0);
            (c0, cols, quantize_piece(format, k, c0, cols, &row))
        })?;
        let nb = k.div_ceil(BLOCK);
        let wpb = format.words_per_block();
        let mut words = vec![0u32; nb * wpb * n];
        let mut scales = vec![0u32; nb * n / 2];
        for (c0, cols, piece) in pieces {
            // The pieces in column order: the first error is the first non-finite weight.
            let (pw, ps) = piece.map_err(|(c, i, v)| Error::Invalid(format!("{}: weight [{c}][{i}] is {v}", format.name())))?;
            for (r, src) in pw.chunks(cols).enumerate() {
                words[r * n + c0..r * n + c0 + cols].copy_from_slice(src);
            }
            for (kb, src) in ps.chunks(cols / 2).enumerate() {
                scales[(kb * n + c0) / 2..(kb * n + c0 + cols) / 2].copy_from_slice(src);
            }
        }
        Ok(BlockQuant { format, n, k, words, scales })
    }

    /// The scale of block `kb` of column `c`.
    pub fn scale(&self, kb: usize, c: usize) -> f32 {
        let word = self.scales[(kb * self.n + c) / 2];
        f16::from_bits((word >> (16 * (c % 2))) as u16).to_f32()
    }

    /// The code of weight (c, kk) as a signed integer (q4_0's offset of 8 taken off).
    pub fn code(&self, c: usize, kk: usize) -> i32 {
        let (kb, i) = (kk / BLOCK, kk % BLOCK);
        match self.format {
            BlockFormat::Q8_0 => {
                let word = self.words[(kb * 8 + i / 4) * self.n + c];
                ((word >> (8 * (i % 4))) & 0xff) as u8 as i8 as i32
            }
            BlockFormat::Q4_0 => {
                let word = self.words[(kb * 4 + i / 8) * self.n + c];
                ((word >> (4 * (i % 8))) & 0xf) as i32 - 8
            }
        }
    }

    /// The weights the GPU multiplies by, `[n][k]` row-major: code · scale.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        for c in 0..self.n {
            for kk in 0..self.k {
                out[c * self.k + kk] = self.code(c, kk) as f32 * self.scale(kk / BLOCK, c);
            }
        }
        out
    }

    /// Bytes on the GPU (codes and scales).
    pub fn bytes(&self) -> u64 {
        (self.words.len() + self.scales.len()) as u64 * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn weights(n: usize, k: usize, seed: u64) -> Vec<f32> {
        let mut r = rand::rngs::StdRng::seed_from_u64(seed);
        // Rows of different magnitudes, a few outliers.
        (0..n * k)
            .map(|i| {
                let v: f32 = r.random_range(-1.0..1.0) * (1 + i / k % 5) as f32 * 0.1;
                if r.random_range(0..97) == 0 { v * 20.0 } else { v }
            })
            .collect()
    }

    #[test]
    fn block_quantizers_keep_ggml_error_bounds() {
        for (n, k) in [(6, 32), (10, 45), (4, 131), (2, 7)] {
            let w = weights(n, k, (n * k) as u64);
            for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
                let q = BlockQuant::quantize(format, &w, n, k).unwrap();
                let deq = q.dequantize();
                for c in 0..n {
                    for kb in 0..k.div_ceil(BLOCK) {
                        let blk = kb * BLOCK..((kb + 1) * BLOCK).min(k);
                        let amax = blk.clone().map(|kk| w[c * k + kk].abs()).fold(0f32, f32::max);
                        let d = q.scale(kb, c).abs();
                        // The scale is amax / 127 (q8_0) or amax / 8 (q4_0), rounded to f16.
                        let want_d = match format {
                            BlockFormat::Q8_0 => amax / 127.0,
                            BlockFormat::Q4_0 => amax / 8.0,
                        };
                        assert!((d - want_d).abs() <= want_d * 1e-3 + 1e-7, "{format:?} [{c}] block {kb}: scale {d} vs {want_d}");
                        for kk in blk {
                            let err = (deq[c * k + kk] - w[c * k + kk]).abs();
                            // Half a step (q4_0: a whole step on the side opposite the
                            // extreme, whose grid ends at 7·d), plus the scale's f16 rounding.
                            let step = if format == BlockFormat::Q8_0 { 0.5 } else { 1.0 };
                            let bound = d * step + (amax * 1e-3) + 1e-7;
                            assert!(err <= bound, "{format:?} [{c}][{kk}]: |{} - {}| > {bound}", deq[c * k + kk], w[c * k + kk]);
                        }
                    }
                }
                // Padded codes in a partial last block are zero weights.
                if k % BLOCK != 0 {
                    let last = k.div_ceil(BLOCK) * BLOCK - 1;
                    let probe = BlockQuant { k: last + 1, ..q.clone() };
                    assert_eq!(probe.code(1, last), 0, "{format:?}: padding code");
                }
            }
        }
    }

    #[test]
    fn block_quantizers_match_ggml_on_known_blocks() {
        // One block: the largest magnitude is -2.0 (q4_0 keeps its sign: d = 0.25).
        let mut w = vec![0f32; 2 * 32];
        for i in 0..32 {
            w[i] = (i as f32 - 16.0) / 8.0; // -2.0 .. 1.875
            w[32 + i] = 0.0; // an all-zero row: scale 0, codes 0
        }
        let q4 = BlockQuant::quantize(BlockFormat::Q4_0, &w, 2, 32).unwrap();
        assert_eq!(q4.scale(0, 0), 0.25);
        assert_eq!(q4.code(0, 0), -8); // -2.0 / 0.25 = -8: the grid's end
        assert_eq!(q4.code(0, 16), 0);
        // 1.875 / 0.25 = 7.5 -> trunc(7.5 + 8.5) = 16 -> clamped to 15: code 7.
        assert_eq!(q4.code(0, 31), 7);
        assert_eq!(q4.scale(0, 1), 0.0);
        assert_eq!(q4.code(1, 5), 0);
        let q8 = BlockQuant::quantize(BlockFormat::Q8_0, &w, 2, 32).unwrap();
        assert_eq!(q8.code(0, 0), -127);
        assert_eq!(q8.code(0, 16), 0);
        assert_eq!(q8.code(0, 20), 32); // 0.5 / (2/127) = 31.75 -> 32
        assert!(BlockQuant::quantize(BlockFormat::Q8_0, &[f32::NAN, 0.0], 2, 1).is_err());
        assert!(BlockQuant::quantize(BlockFormat::Q8_0, &[1.0; 3], 3, 1).is_err());
    }

    /// Quantized in pieces side by side, a matrix of several pieces (and a last short one)
    /// has one thread's words: each code and scale where the layout says, read back by
    /// `code` and `scale` against each column quantized alone; f16 and f32 inputs agree;
    /// the first non-finite weight is the one named.
    #[test]
    fn pieces_side_by_side_give_one_pieces_words() {
        let (n, k) = (2 * PIECE_COLUMNS + 6, 45);
        let bits: Vec<u16> = weights(n, k, 7).iter().map(|&v| f16::from_f32(v).to_bits()).collect();
        let w: Vec<f32> = bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect();
        for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
            let q = BlockQuant::from_f16_bits(format, &bits, n, k).unwrap();
            let q32 = BlockQuant::quantize(format, &w, n, k).unwrap();
            assert_eq!((&q.words, &q.scales), (&q32.words, &q32.scales), "{format:?}: f16 and f32 inputs");
            // Every column again, as a [2][k] matrix of its own (the column and a zero one).
            for c in (0..n).step_by(7).chain([PIECE_COLUMNS - 1, PIECE_COLUMNS, n - 1]) {
                let mut alone = w[c * k..(c + 1) * k].to_vec();
                alone.extend(std::iter::repeat(0.0).take(k));
                let a = BlockQuant::quantize(format, &alone, 2, k).unwrap();
                for kb in 0..k.div_ceil(BLOCK) {
                    assert_eq!(q.scale(kb, c).to_bits(), a.scale(kb, 0).to_bits(), "{format:?} scale [{c}] block {kb}");
                }
                for kk in 0..k {
                    assert_eq!(q.code(c, kk), a.code(0, kk), "{format:?} code [{c}][{kk}]");
                }
            }
        }
        let mut bad = w.clone();
        bad[(PIECE_COLUMNS + 3) * k + 5] = f32::INFINITY;
        bad[(2 * PIECE_COLUMNS + 1) * k] = f32::NAN;
        let e = BlockQuant::quantize(BlockFormat::Q8_0, &bad, n, k).unwrap_err().to_string();
        assert!(e.contains(&format!("[{}][5] is inf", PIECE_COLUMNS + 3)), "{e}");
    }
}
