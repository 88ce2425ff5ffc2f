//! `q4tp`: 4-bit weights in groups of 32 with a 5-bit log-scale code per group and a per-row
//! f16 `(base, step)`: group g of row r has the scale `s = 2^(base + code·step)` and its
//! weights are `s · (nibble − 8)`, nibble 0..15.
//!
//! ## Layout (the seed's; what `moe_quant.wgsl` reads), in 32-bit little-endian words
//!
//! For a `[rows][cols]` matrix with `gpr = ⌈cols / 32⌉` groups per row (a row whose `cols`
//! is not a multiple of 32 is padded with zero weights; the kernels never read past `cols`
//! of the input):
//!
//! 1. nibbles: `rows · gpr` groups of 4 words (one `vec4<u32>`), row-major; element j of a
//!    group sits in word `j / 8`, bits `4·(j % 8)..+4`;
//! 2. `rows` words at word `rows·gpr·4`: `base` in the low half, `step` in the high half
//!    (`unpack2x16float`);
//! 3. the codes from byte `(rows·gpr·4 + rows)·4`: row r at `r·⌈5·gpr / 8⌉` bytes on, code g
//!    at bit `5·g` of the row's bytes, least significant bit first;
//! 4. zero padding to a multiple of 4 words (a bank stacks matrices and reads `vec4<u32>`s;
//!    a reader may fetch the byte after the last code).
//!
//! ## The quantizer and its bound
//!
//! Each group needs a scale `need = max(pmax / 7.5, nmax / 8.5)` (its largest positive and
//! negative weights): then every `w / s` with `s ≥ need` lies in `[−8.5, 7.5]`, rounds into
//! −8..7 (7.5 rounds to 8 and is clamped to 7: still half a step) and
//! **`|w − s·q| ≤ s / 2`**. The row's `base` is `log2` of its smallest need rounded down to
//! f16, `step` spans to the largest need in 31 codes (rounded up to f16), and each group takes
//! the *smallest* code whose scale reaches its need: so `s < need · 2^step`, the code's
//! rounding. Together, a priori, from the weights alone:
//!
//! `|w − deq| ≤ ½ · need_g · 2^step*`, with `step* = (log2 need_max − log2 need_min + ulp) / 31`
//!
//! (a few parts in 10⁴ of slack cover the f16 roundings and f32's `exp2`), and per row, since
//! `need_g ≤ m_g / 7.5` for the group's largest magnitude `m_g` and `‖w‖² ≥ Σ m_g²`:
//!
//! `‖w − deq‖ / ‖w‖ ≤ (√32 / 15) · 2^step* ≈ 0.377 · 2^step*`.
//!
//! The per-row bound is loose by design (it holds for any row); measured errors on Gaussian
//! rows are ≈ 0.09 and the tests hold the quantizer to that too. Groups whose need is below
//! 2^−120 (weights under ~10⁻³⁵) are stored as zeros: GPUs flush the f32 subnormal scales
//! they would need, and their error is their own size.

use half::f16;

use super::{byte_of, check_shape, f16_down, f16_up, set_byte, ErrorReport};
use crate::Result;

/// Weights per group.
pub const GROUP: usize = 32;
/// Needs below this are stored as zero groups (see the module documentation).
const TINY: f64 = 7.52316384526264e-37; // 2^-120
/// The code search accepts a scale this close below the need: f32's `exp2` is not exact,
/// and the clamp's extra error from it (15 parts in 2^22) is inside the bound's slack.
const NEED_TOL: f64 = 1.0 - 1.0 / 4194304.0; // 1 − 2^-22

/// Where the parts of a `q4tp` matrix sit (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q4tpLayout {
    pub rows: usize,
    pub cols: usize,
    /// Groups per row.
    pub gpr: usize,
    /// First word of the per-row `(base, step)` pairs.
    pub params_word: usize,
    /// First byte of the codes.
    pub codes_byte: usize,
    /// Bytes of codes per row.
    pub code_stride: usize,
    /// Total words, a multiple of 4.
    pub words: usize,
}

impl Q4tpLayout {
    pub fn new(rows: usize, cols: usize) -> Q4tpLayout {
        let gpr = cols.div_ceil(GROUP);
        let params_word = rows * gpr * 4;
        let codes_byte = (params_word + rows) * 4;
        let code_stride = (gpr * 5).div_ceil(8);
        // One spare byte: a reader fetches two bytes per code.
        let end = codes_byte + rows * code_stride + 1;
        Q4tpLayout {
            rows,
            cols,
            gpr,
            params_word,
            codes_byte,
            code_stride,
            words: end.div_ceil(4).next_multiple_of(4),
        }
    }
}

/// A `[rows][cols]` matrix in `q4tp` (see the module documentation).
#[derive(Clone, Debug)]
pub struct Q4tp {
    lay: Q4tpLayout,
    words: Vec<u32>,
}

/// `2^(base + code·step)` in f32, as the kernel computes it.
pub(crate) fn scale_of(base: f32, step: f32, code: u32) -> f32 {
    (base + code as f32 * step).exp2()
}

/// A group's need: the smallest scale that keeps its weights within half a step.
fn group_need(w: &[f32]) -> f64 {
    let (mut pmax, mut nmax) = (0f64, 0f64);
    for &v in w {
        let v = v as f64;
        pmax = pmax.max(v);
        nmax = nmax.max(-v);
    }
    let need = (pmax / 7.5).max(nmax / 8.5);
    if need < TINY {
        0.0
    } else {
        need
    }
}

/// The a-priori bound on a row's code step: `(log2 need_max − log2 need_min + ulp) / 31`
/// with slack for the f16 roundings of base and step.
fn step_bound(lo: f64, hi: f64) -> f64 {
    let ulp = (lo.abs() / 1024.0).max(1.0 / 16_777_216.0);
    (hi - lo + ulp) / 31.0 * (1.0 + 1.0 / 128.0) + 1.0 / 1_048_576.0
}

impl Q4tp {
    /// Quantize a row-major `[rows][cols]` matrix (see the module documentation).
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Result<Q4tp> {
        check_shape("q4tp", w, rows, cols)?;
        let lay = Q4tpLayout::new(rows, cols);
        let mut q = Q4tp {
            lay,
            words: vec![0; lay.words],
        };
        let mut needs = vec![0f64; lay.gpr];
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            for (g, need) in needs.iter_mut().enumerate() {
                *need = group_need(&row[g * GROUP..((g + 1) * GROUP).min(cols)]);
            }
            let live = needs.iter().filter(|&&n| n > 0.0);
            let lo = live.clone().fold(f64::INFINITY, |a, &n| a.min(n.log2()));
            let hi = live.fold(f64::NEG_INFINITY, |a, &n| a.max(n.log2()));
            let (base, mut step) = if lo.is_finite() {
                let base = f16_down(lo as f32);
                let span = (hi - base.to_f32() as f64) / 31.0;
                (base, f16_up(span as f32))
            } else {
                (f16::ZERO, f16::ZERO) // an all-zero row
            };
            // Make sure the top code reaches the largest need (f32's exp2 may land a hair
            // short); a few f16 steps up at most.
            if lo.is_finite() {
                let max_need = hi.exp2();
                for _ in 0..16 {
                    if scale_of(base.to_f32(), step.to_f32(), 31) as f64 >= max_need * NEED_TOL {
                        break;
                    }
                    step = super::f16_next_up(step);
                }
            }
            q.fill_row(r, row, base, step);
        }
        Ok(q)
    }

    /// Row r from its weights with the given `(base, step)`: each group takes the smallest
    /// code whose scale reaches its need, then its weights round to that scale's grid.
    pub(crate) fn fill_row(&mut self, r: usize, row: &[f32], base: f16, step: f16) {
        let cols = self.lay.cols;
        self.set_params(r, base, step);
        let (bf, sf) = (base.to_f32(), step.to_f32());
        for g in 0..self.lay.gpr {
            let need = group_need(&row[g * GROUP..((g + 1) * GROUP).min(cols)]);
            let code = if need == 0.0 {
                0
            } else {
                // A guess a code or two low (floating point), then up to the first that fits.
                let guess = if sf > 0.0 {
                    (((need.log2() - bf as f64) / sf as f64).floor() as i64 - 1).clamp(0, 31)
                } else {
                    0
                } as u32;
                (guess..32)
                    .find(|&c| scale_of(bf, sf, c) as f64 >= need * NEED_TOL)
                    .unwrap_or(31)
            };
            self.set_code(r, g, code);
            let s = scale_of(bf, sf, code) as f64;
            for j in 0..GROUP {
                let i = g * GROUP + j;
                let v = if i < cols && need > 0.0 {
                    (row[i] as f64 / s).round().clamp(-8.0, 7.0) as i32
                } else {
                    0
                };
                self.set_nibble(r, i, v);
            }
        }
    }

    /// A matrix from its words (as stored or read back); checks the length only.
    pub fn from_words(rows: usize, cols: usize, words: Vec<u32>) -> Result<Q4tp> {
        let lay = Q4tpLayout::new(rows, cols);
        if rows == 0 || cols == 0 || words.len() != lay.words {
            return Err(crate::Error::Invalid(format!(
                "q4tp [{rows}][{cols}] takes {} words, got {}",
                lay.words,
                words.len()
            )));
        }
        Ok(Q4tp { lay, words })
    }

    pub fn rows(&self) -> usize {
        self.lay.rows
    }
    pub fn cols(&self) -> usize {
        self.lay.cols
    }
    pub fn layout(&self) -> Q4tpLayout {
        self.lay
    }
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// Row r's `(base, step)`.
    pub fn params(&self, r: usize) -> (f16, f16) {
        let w = self.words[self.lay.params_word + r];
        (f16::from_bits(w as u16), f16::from_bits((w >> 16) as u16))
    }

    fn set_params(&mut self, r: usize, base: f16, step: f16) {
        self.words[self.lay.params_word + r] =
            base.to_bits() as u32 | (step.to_bits() as u32) << 16;
    }

    /// The 5-bit code of group g of row r.
    pub fn code(&self, r: usize, g: usize) -> u32 {
        let b0 = self.lay.codes_byte + r * self.lay.code_stride;
        let bit = g * 5;
        let two = byte_of(&self.words, b0 + bit / 8) | byte_of(&self.words, b0 + bit / 8 + 1) << 8;
        (two >> (bit % 8)) & 31
    }

    pub(crate) fn set_code(&mut self, r: usize, g: usize, code: u32) {
        let b0 = self.lay.codes_byte + r * self.lay.code_stride;
        let bit = g * 5;
        let at = b0 + bit / 8;
        let mut two = byte_of(&self.words, at) | byte_of(&self.words, at + 1) << 8;
        let sh = bit % 8;
        two = (two & !(31 << sh)) | ((code & 31) << sh);
        set_byte(&mut self.words, at, two);
        set_byte(&mut self.words, at + 1, two >> 8);
    }

    /// Group g of row r's scale, as the kernel computes it.
    pub fn scale(&self, r: usize, g: usize) -> f32 {
        let (b, s) = self.params(r);
        scale_of(b.to_f32(), s.to_f32(), self.code(r, g))
    }

    fn nibble_at(&self, r: usize, i: usize) -> (usize, u32) {
        let (g, j) = (i / GROUP, i % GROUP);
        ((r * self.lay.gpr + g) * 4 + j / 8, ((j % 8) * 4) as u32)
    }

    /// Element i of row r as stored: −8..7.
    pub fn nibble(&self, r: usize, i: usize) -> i32 {
        let (w, sh) = self.nibble_at(r, i);
        ((self.words[w] >> sh) & 15) as i32 - 8
    }

    pub(crate) fn set_nibble(&mut self, r: usize, i: usize, q: i32) {
        let (w, sh) = self.nibble_at(r, i);
        let v = (q + 8).clamp(0, 15) as u32;
        self.words[w] = (self.words[w] & !(15 << sh)) | (v << sh);
    }

    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let cols = self.lay.cols;
        for (g, chunk) in out[..cols].chunks_mut(GROUP).enumerate() {
            let s = self.scale(r, g);
            for (j, o) in chunk.iter_mut().enumerate() {
                *o = s * self.nibble(r, g * GROUP + j) as f32;
            }
        }
    }

    /// Against the weights `w` it came from: every element within its a-priori bound, every
    /// row within `0.377 · 2^step*` (see the module documentation).
    pub fn check(&self, w: &[f32]) -> Result<ErrorReport> {
        let (rows, cols) = (self.lay.rows, self.lay.cols);
        check_shape("q4tp check", w, rows, cols)?;
        let mut rep = ErrorReport::default();
        let mut deq = vec![0f32; cols];
        let (mut tot_e, mut tot_w) = (0f64, 0f64);
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            self.dequantize_row(r, &mut deq);
            let needs: Vec<f64> = row.chunks(GROUP).map(group_need).collect();
            let live = needs.iter().filter(|&&n| n > 0.0);
            let lo = live.clone().fold(f64::INFINITY, |a, &n| a.min(n.log2()));
            let hi = live.fold(f64::NEG_INFINITY, |a, &n| a.max(n.log2()));
            let sb = if lo.is_finite() {
                step_bound(lo, hi)
            } else {
                0.0
            };
            let grow = sb.exp2() * (1.0 + 1.0 / 16384.0);
            let (mut ee, mut ww) = (0f64, 0f64);
            for (i, (&wv, &dv)) in row.iter().zip(&deq).enumerate() {
                let g = i / GROUP;
                let e = (wv as f64 - dv as f64).abs();
                let slack = wv.abs() as f64 / 16_777_216.0;
                let bound = if needs[g] > 0.0 {
                    0.5 * needs[g] * grow + slack
                } else {
                    // A zero group (or one below 2^-120): stored as zeros.
                    row[g * GROUP..((g + 1) * GROUP).min(cols)]
                        .iter()
                        .fold(0f64, |a, v| a.max(v.abs() as f64))
                };
                let r_e = if bound > 0.0 {
                    e / bound
                } else if e > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                };
                rep.worst_element = rep.worst_element.max(r_e);
                let half = 0.5 * self.scale(r, g) as f64;
                if half > 0.0 && needs[g] > 0.0 {
                    rep.worst_half_step = rep.worst_half_step.max(e / (half + slack));
                }
                ee += e * e;
                ww += wv as f64 * wv as f64;
            }
            tot_e += ee;
            tot_w += ww;
            if ww > 0.0 {
                let rel = (ee / ww).sqrt();
                rep.worst_row_rel = rep.worst_row_rel.max(rel);
                let row_bound = if lo.is_finite() {
                    (32f64).sqrt() / 15.0 * grow * (1.0 + 1.0 / 8192.0)
                } else {
                    1.0 // only groups below 2^-120: stored as zeros
                };
                rep.worst_row_vs_bound = rep.worst_row_vs_bound.max(rel / row_bound);
            }
        }
        rep.rel_frobenius = (tot_e / tot_w.max(1e-300)).sqrt();
        Ok(rep)
    }
}
