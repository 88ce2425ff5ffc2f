//! `q8_2f`: int8 weights, an f16 scale per row and an f16 field per column that scales the
//! input: `w[r][k] ≈ row[r] · q[r][k] · col[k]`, so `y[r] = row[r] · Σ_k q[r][k] · (x[k]·col[k])`.
//!
//! ## Layout (the seed's; what `moe_quant.wgsl` reads)
//!
//! For a `[rows][cols]` matrix, with `cols4` = cols rounded up to a multiple of 4 (padding
//! columns hold zero weights and a column field of 1):
//!
//! 1. `rows · cols4` int8 weights, row-major, four to a little-endian word (word
//!    `r·cols4/4 + k/4`, byte `k % 4`);
//! 2. from half `rows·cols4/2` on (halves: the low half of a word first): `rows` f16 row
//!    scales, then `cols4` f16 column-field values (the field starts at an odd half when
//!    `rows` is odd);
//! 3. zero padding to a multiple of 4 words, with at least one spare word (a reader fetches
//!    the column field three words at a time).
//!
//! ## The quantizer and its bound
//!
//! The column field is `col[k] = f16(√(colmax_k / 127))` (SmoothQuant's migration strength
//! ½: a column with larger weights gets a larger field, so an outlier column no longer sets
//! its rows' grids; the 127 keeps row scales and field both near `√(|w|/127)`, in f16's
//! normal range for weights from ~5·10⁻⁷ to ~5·10¹¹; a zero column's field is 1, and no
//! field is below f16's smallest normal, 2^−14). Then
//! `row[r] = f16↑(R_r / 127)` with `R_r = max_k |w[r][k]| / col[k]`, rounded *up* so no
//! weight leaves ±127, and `q = round(w / (row·col))`. Hence, a priori:
//!
//! `|w − deq| ≤ ½ · row[r] · col[k] ≤ ½ · col[k] · R_r / 127 · (1 + 2^−10)`
//!
//! (f16's rounding of the row scale; plus 2^−24·|w| for the f32 product; a row scale in f16's
//! subnormal range, for rows under ~10⁻⁶, is rounded up by at most 2^−24, which the bound
//! adds to the row scale), and per row the
//! root-sum-square of those element bounds over ‖w_r‖.

use half::f16;

use super::{byte_of, check_shape, f16_up, half_of, set_byte, set_half, ErrorReport};
use crate::{Error, Result};

/// Where the parts of a `q8_2f` matrix sit (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8_2fLayout {
    pub rows: usize,
    pub cols: usize,
    /// Columns rounded up to a multiple of 4 (the stored row length).
    pub cols4: usize,
    /// First half (16-bit unit) of the row scales.
    pub row_scales_half: usize,
    /// First half of the column field.
    pub col_field_half: usize,
    /// Total words, a multiple of 4.
    pub words: usize,
}

impl Q8_2fLayout {
    pub fn new(rows: usize, cols: usize) -> Q8_2fLayout {
        let cols4 = cols.next_multiple_of(4);
        let row_scales_half = rows * cols4 / 2;
        let col_field_half = row_scales_half + rows;
        let end_words = (col_field_half + cols4).div_ceil(2) + 1;
        Q8_2fLayout {
            rows,
            cols,
            cols4,
            row_scales_half,
            col_field_half,
            words: end_words.next_multiple_of(4),
        }
    }
}

/// A `[rows][cols]` matrix in `q8_2f` (see the module documentation).
#[allow(non_camel_case_types)]
#[derive(Clone, Debug)]
pub struct Q8_2f {
    lay: Q8_2fLayout,
    words: Vec<u32>,
}

/// The quantizer's column field from the column maxima.
fn col_field(colmax: f64) -> f16 {
    if colmax > 0.0 {
        // Not below f16's smallest normal: a column of tiny weights keeps a usable field.
        let h = f16::from_f32((colmax / 127.0).sqrt() as f32);
        if h < f16::MIN_POSITIVE {
            f16::MIN_POSITIVE
        } else {
            h
        }
    } else {
        f16::ONE
    }
}

fn col_maxima(w: &[f32], rows: usize, cols: usize) -> Vec<f64> {
    let mut m = vec![0f64; cols];
    for r in 0..rows {
        for (k, mk) in m.iter_mut().enumerate() {
            *mk = mk.max(w[r * cols + k].abs() as f64);
        }
    }
    m
}

impl Q8_2f {
    /// Quantize a row-major `[rows][cols]` matrix (see the module documentation).
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Result<Q8_2f> {
        check_shape("q8_2f", w, rows, cols)?;
        let lay = Q8_2fLayout::new(rows, cols);
        let mut q = Q8_2f {
            lay,
            words: vec![0; lay.words],
        };
        let cm = col_maxima(w, rows, cols);
        let field: Vec<f16> = (0..lay.cols4)
            .map(|k| if k < cols { col_field(cm[k]) } else { f16::ONE })
            .collect();
        if let Some(k) = field
            .iter()
            .position(|h| !h.is_finite() || h.to_f32() == 0.0)
        {
            return Err(Error::Invalid(format!(
                "q8_2f: column {k}'s weights (up to {}) are outside what an f16 column field can scale",
                cm[k]
            )));
        }
        for (k, &h) in field.iter().enumerate() {
            set_half(&mut q.words, lay.col_field_half + k, h);
        }
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            let rmax = row
                .iter()
                .zip(&field)
                .fold(0f64, |a, (&v, c)| a.max(v.abs() as f64 / c.to_f64()));
            let rs = f16_up((rmax / 127.0) as f32);
            if !rs.is_finite() {
                return Err(Error::Invalid(format!(
                    "q8_2f: row {r}'s weights are too large for an f16 row scale"
                )));
            }
            set_half(&mut q.words, lay.row_scales_half + r, rs);
            for (k, &v) in row.iter().enumerate() {
                let s = rs.to_f64() * field[k].to_f64();
                let qv = if s > 0.0 {
                    (v as f64 / s).round().clamp(-127.0, 127.0) as i32
                } else {
                    0
                };
                q.set_q(r, k, qv);
            }
        }
        Ok(q)
    }

    /// A matrix from its words; checks the length only.
    pub fn from_words(rows: usize, cols: usize, words: Vec<u32>) -> Result<Q8_2f> {
        let lay = Q8_2fLayout::new(rows, cols);
        if rows == 0 || cols == 0 || words.len() != lay.words {
            return Err(Error::Invalid(format!(
                "q8_2f [{rows}][{cols}] takes {} words, got {}",
                lay.words,
                words.len()
            )));
        }
        Ok(Q8_2f { lay, words })
    }

    pub fn rows(&self) -> usize {
        self.lay.rows
    }
    pub fn cols(&self) -> usize {
        self.lay.cols
    }
    pub fn layout(&self) -> Q8_2fLayout {
        self.lay
    }
    pub fn words(&self) -> &[u32] {
        &self.words
    }

    /// The int8 weight at row r, column k.
    pub fn q(&self, r: usize, k: usize) -> i32 {
        byte_of(&self.words, r * self.lay.cols4 + k) as u8 as i8 as i32
    }

    pub(crate) fn set_q(&mut self, r: usize, k: usize, v: i32) {
        set_byte(
            &mut self.words,
            r * self.lay.cols4 + k,
            v.clamp(-127, 127) as i8 as u8 as u32,
        );
    }

    pub fn row_scale(&self, r: usize) -> f16 {
        half_of(&self.words, self.lay.row_scales_half + r)
    }

    #[cfg(test)]
    pub(crate) fn set_row_scale(&mut self, r: usize, h: f16) {
        set_half(&mut self.words, self.lay.row_scales_half + r, h);
    }

    pub fn col_field(&self, k: usize) -> f16 {
        half_of(&self.words, self.lay.col_field_half + k)
    }

    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let rs = self.row_scale(r).to_f64();
        for (k, o) in out[..self.lay.cols].iter_mut().enumerate() {
            *o = (rs * self.q(r, k) as f64 * self.col_field(k).to_f64()) as f32;
        }
    }

    /// Against the weights `w` it came from: every element within its a-priori bound (with
    /// the column field the quantizer prescribes for `w`, so a field that would widen the
    /// grid cannot pass), every row within the root-sum-square of its element bounds.
    pub fn check(&self, w: &[f32]) -> Result<ErrorReport> {
        let (rows, cols) = (self.lay.rows, self.lay.cols);
        check_shape("q8_2f check", w, rows, cols)?;
        let cm = col_maxima(w, rows, cols);
        let field: Vec<f64> = cm.iter().map(|&m| col_field(m).to_f64()).collect();
        let mut rep = ErrorReport::default();
        let mut deq = vec![0f32; cols];
        let (mut tot_e, mut tot_w) = (0f64, 0f64);
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            self.dequantize_row(r, &mut deq);
            let rmax = row
                .iter()
                .zip(&field)
                .fold(0f64, |a, (&v, &c)| a.max(v.abs() as f64 / c));
            let rs_bound = rmax / 127.0 * (1.0 + 1.0 / 1024.0) + 1.0 / 16_777_216.0;
            let half_step = 0.5 * self.row_scale(r).to_f64();
            let (mut ee, mut ww, mut bb) = (0f64, 0f64, 0f64);
            for (k, (&wv, &dv)) in row.iter().zip(&deq).enumerate() {
                let e = (wv as f64 - dv as f64).abs();
                let slack = wv.abs() as f64 / 16_777_216.0;
                let bound = 0.5 * rs_bound * field[k] + slack;
                let r_e = if bound > 0.0 {
                    e / bound
                } else if e > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                };
                rep.worst_element = rep.worst_element.max(r_e);
                let hs = half_step * self.col_field(k).to_f64() + slack;
                if hs > 0.0 && wv != 0.0 {
                    rep.worst_half_step = rep.worst_half_step.max(e / hs);
                }
                ee += e * e;
                ww += wv as f64 * wv as f64;
                bb += bound * bound;
            }
            tot_e += ee;
            tot_w += ww;
            if ww > 0.0 {
                let rel = (ee / ww).sqrt();
                rep.worst_row_rel = rep.worst_row_rel.max(rel);
                let row_bound = (bb / ww).sqrt();
                rep.worst_row_vs_bound = rep.worst_row_vs_bound.max(if row_bound > 0.0 {
                    rel / row_bound
                } else if rel > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                });
            }
        }
        rep.rel_frobenius = (tot_e / tot_w.max(1e-300)).sqrt();
        Ok(rep)
    }
}
