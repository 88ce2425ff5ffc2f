//! The quantizers against their bounds on uniform, Gaussian, heavy-tailed (Student-t, ν = 3)
//! and "real-ish" rows (group magnitudes spread log-normally, a few outlier columns, zero
//! and tiny rows); the layouts against hand-built words; and the checks against broken
//! quantizers, so a bound that cannot fail would show.

use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::testgpu::rng;

fn normal(r: &mut StdRng) -> f64 {
    // Box–Muller.
    let u: f64 = r.random_range(1e-300..1.0);
    let v: f64 = r.random();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

#[derive(Clone, Copy, Debug)]
enum Dist {
    Uniform,
    Gaussian,
    StudentT3,
    /// Gaussian times a log-normal factor per group of 32, with four columns ×30.
    RealIsh,
}

fn matrix(r: &mut StdRng, d: Dist, rows: usize, cols: usize, scale: f64) -> Vec<f32> {
    let outliers: Vec<usize> = (0..4).map(|_| r.random_range(0..cols)).collect();
    let gfac: Vec<f64> = (0..rows * cols.div_ceil(32))
        .map(|_| (1.5 * normal(r)).exp())
        .collect();
    let mut w = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for k in 0..cols {
            let v = match d {
                Dist::Uniform => r.random_range(-1.0..1.0),
                Dist::Gaussian => normal(r),
                Dist::StudentT3 => {
                    let chi: f64 = (0..3).map(|_| normal(r).powi(2)).sum();
                    normal(r) / (chi / 3.0).sqrt()
                }
                Dist::RealIsh => {
                    let o = if outliers.contains(&k) { 30.0 } else { 1.0 };
                    normal(r) * gfac[i * cols.div_ceil(32) + k / 32] * o
                }
            };
            w.push((v * scale) as f32);
        }
    }
    w
}

const SHAPES: &[(usize, usize)] = &[(7, 32), (13, 96), (5, 100), (3, 7), (9, 2688)];
const DISTS: &[Dist] = &[
    Dist::Uniform,
    Dist::Gaussian,
    Dist::StudentT3,
    Dist::RealIsh,
];

fn check_all(format: QuantFormat) {
    let mut r = rng(format.name());
    for &(rows, cols) in SHAPES {
        for &d in DISTS {
            for &scale in &[0.02f64, 3.0] {
                let mut w = matrix(&mut r, d, rows, cols, scale);
                // A zero row and a row of tiny weights among the others.
                if rows > 3 {
                    w[cols..2 * cols].iter_mut().for_each(|v| *v = 0.0);
                    w[2 * cols..3 * cols].iter_mut().for_each(|v| *v *= 1e-6);
                }
                let q = QuantMatrix::quantize(format, &w, rows, cols).unwrap();
                assert_eq!(q.words().len() % 4, 0);
                let rep = q.check(&w).unwrap();
                eprintln!(
                    "{} [{rows}][{cols}] {d:?} ×{scale}: worst element/bound {:.3}, worst |e|/half-step {:.3}, \
                     worst row rel {:.4} (/bound {:.3}), matrix rel {:.4}",
                    format.name(),
                    rep.worst_element,
                    rep.worst_half_step,
                    rep.worst_row_rel,
                    rep.worst_row_vs_bound,
                    rep.rel_frobenius
                );
                assert!(
                    rep.within_bounds(),
                    "{} {d:?} [{rows}][{cols}]: {rep:?}",
                    format.name()
                );
                // The rounding reaches (nearly) its half step on any matrix of some size:
                // the bound is not vacuous.
                if rows * cols >= 1000 {
                    assert!(rep.worst_half_step > 0.9, "{d:?}: {rep:?}");
                }
                // Typical errors, as measured (a regression guard, not a bound).
                if let (Dist::Gaussian, true) = (d, rows * cols >= 1000) {
                    let (lo, hi) = match format {
                        QuantFormat::Q4tp => (0.05, 0.12),
                        QuantFormat::Q8_2f => (0.002, 0.012),
                    };
                    assert!(
                        rep.rel_frobenius > lo && rep.rel_frobenius < hi,
                        "{} Gaussian rel error {}",
                        format.name(),
                        rep.rel_frobenius
                    );
                }
                // Dequantize and apply agree with the check's view.
                let deq = q.dequantize();
                assert_eq!(deq.len(), rows * cols);
                assert!(deq.iter().all(|v| v.is_finite()));
            }
        }
    }
}

#[test]
fn q4tp_within_bounds_on_random_and_heavy_tailed_rows() {
    check_all(QuantFormat::Q4tp);
}

#[test]
fn q8_2f_within_bounds_on_random_and_heavy_tailed_rows() {
    check_all(QuantFormat::Q8_2f);
}

#[test]
fn q4tp_layout_is_the_seeds() {
    // [2][40]: two groups per row (the second padded), so the codes of a row take 2 bytes.
    let lay = Q4tpLayout::new(2, 40);
    assert_eq!(lay.gpr, 2);
    assert_eq!(lay.params_word, 2 * 2 * 4);
    assert_eq!(lay.codes_byte, (16 + 2) * 4);
    assert_eq!(lay.code_stride, 2);
    assert_eq!(lay.words, (72 + 4 + 1usize).div_ceil(4).next_multiple_of(4));
    let mut words = vec![0u32; lay.words];
    // Row 1, group 1, element 5 → word (1·2 + 1)·4 + 0, bits 20..24: nibble 11 (= +3).
    words[12] = 11 << 20;
    // Row 1: base −3, step 0.25.
    words[17] = f16::from_f32(-3.0).to_bits() as u32 | (f16::from_f32(0.25).to_bits() as u32) << 16;
    // Row 1, group 1: code 6 at bits 5..10 of the row's bytes 74, 75 (word 18, bytes 2, 3).
    let codes = 6u32 << 5;
    words[18] = (codes & 0xff) << 16 | (codes >> 8) << 24;
    let q = Q4tp::from_words(2, 40, words).unwrap();
    assert_eq!(q.nibble(1, 32 + 5), 3);
    assert_eq!(q.nibble(1, 32 + 4), -8);
    assert_eq!(q.code(1, 1), 6);
    assert_eq!(q.code(1, 0), 0);
    let s = 2f32.powf(-3.0 + 6.0 * 0.25);
    assert!((q.scale(1, 1) - s).abs() < 1e-6 * s);
    let mut row = vec![0f32; 40];
    q.dequantize_row(1, &mut row);
    assert!((row[32 + 5] - 3.0 * s).abs() < 1e-6);
    assert!((row[32 + 4] + 8.0 * s).abs() < 1e-6);
    // Quantize → words → from_words round-trips.
    let mut r = rng("q4tp_layout");
    let w = matrix(&mut r, Dist::Gaussian, 5, 72, 1.0);
    let a = Q4tp::quantize(&w, 5, 72).unwrap();
    let b = Q4tp::from_words(5, 72, a.words().to_vec()).unwrap();
    assert_eq!(
        QuantMatrix::Q4tp(a).dequantize(),
        QuantMatrix::Q4tp(b).dequantize()
    );
    assert!(Q4tp::from_words(5, 72, vec![0; 3]).is_err());
}

#[test]
fn q8_2f_layout_is_the_seeds() {
    // [3][6]: rows padded to 8 bytes; the column field starts at an odd half.
    let lay = Q8_2fLayout::new(3, 6);
    assert_eq!(lay.cols4, 8);
    assert_eq!(lay.row_scales_half, 12);
    assert_eq!(lay.col_field_half, 15);
    let mut words = vec![0u32; lay.words];
    // q[2][5] = −3: byte 2·8 + 5 = 21 → word 5, byte 1.
    words[5] = ((-3i8) as u8 as u32) << 8;
    // Row 2's scale: half 14 → word 7, low half. Column 5's field: half 20 → word 10, low.
    words[7] = f16::from_f32(0.5).to_bits() as u32;
    words[10] = f16::from_f32(1.5).to_bits() as u32;
    let q = Q8_2f::from_words(3, 6, words).unwrap();
    assert_eq!(q.q(2, 5), -3);
    assert_eq!(q.row_scale(2).to_f32(), 0.5);
    assert_eq!(q.col_field(5).to_f32(), 1.5);
    let mut row = vec![0f32; 6];
    q.dequantize_row(2, &mut row);
    assert_eq!(row[5], -3.0 * 0.5 * 1.5);
    assert!(Q8_2f::from_words(3, 6, vec![0; 5]).is_err());
}

#[test]
fn quantizers_reject_bad_input() {
    for f in [QuantFormat::Q4tp, QuantFormat::Q8_2f] {
        let mut w = vec![0.5f32; 64];
        assert!(QuantMatrix::quantize(f, &w, 2, 33).is_err(), "shape");
        assert!(QuantMatrix::quantize(f, &w, 0, 0).is_err(), "empty");
        w[7] = f32::NAN;
        assert!(QuantMatrix::quantize(f, &w, 2, 32).is_err(), "NaN");
        w[7] = f32::INFINITY;
        assert!(QuantMatrix::quantize(f, &w, 2, 32).is_err(), "inf");
        let q = QuantMatrix::quantize(f, &[1.0; 64], 2, 32).unwrap();
        assert!(q.apply(&[1.0; 31], 1).is_err(), "apply shape");
    }
    // Beyond what an f16 column field can hold.
    assert!(Q8_2f::quantize(&[1e13; 8], 2, 4).is_err());
}

/// The element whose quantization error is smallest relative to its half step: moving its
/// nibble (or int8) by one then costs at least ¾ of a step, beyond any correct bound.
fn min_error_index(w: &[f32], deq: &[f32]) -> usize {
    (0..w.len())
        .filter(|&i| w[i].abs() > 1e-3)
        .min_by(|&a, &b| {
            let ea = ((w[a] - deq[a]) / w[a]).abs();
            let eb = ((w[b] - deq[b]) / w[b]).abs();
            ea.total_cmp(&eb)
        })
        .unwrap()
}

#[test]
fn q4tp_check_catches_broken_quantizers() {
    let mut r = rng("q4tp_broken");
    let (rows, cols) = (16, 256);
    let w = matrix(&mut r, Dist::RealIsh, rows, cols, 0.05);
    let good = Q4tp::quantize(&w, rows, cols).unwrap();
    assert!(good.check(&w).unwrap().within_bounds());
    let deq = QuantMatrix::Q4tp(good.clone()).dequantize();

    // A nibble off by one.
    let mut q = good.clone();
    let i = min_error_index(&w, &deq);
    let (rr, k) = (i / cols, i % cols);
    let n = q.nibble(rr, k);
    q.set_nibble(rr, k, if n < 7 { n + 1 } else { n - 1 });
    let rep = q.check(&w).unwrap();
    eprintln!("q4tp nibble off by one: {rep:?}");
    assert!(!rep.within_bounds());

    // Truncation instead of rounding.
    let mut q = good.clone();
    for rr in 0..rows {
        for k in 0..cols {
            let s = q.scale(rr, k / 32) as f64;
            q.set_nibble(
                rr,
                k,
                (w[rr * cols + k] as f64 / s).floor().clamp(-8.0, 7.0) as i32,
            );
        }
    }
    let rep = q.check(&w).unwrap();
    eprintln!("q4tp truncating: {rep:?}");
    assert!(!rep.within_bounds());

    // A coarser code grid (step ×4, codes and nibbles redone for it): scales overshoot.
    let mut q = good.clone();
    for rr in 0..rows {
        let (b, s) = q.params(rr);
        q.fill_row(
            rr,
            &w[rr * cols..(rr + 1) * cols],
            b,
            f16::from_f32(s.to_f32() * 4.0),
        );
    }
    let rep = q.check(&w).unwrap();
    eprintln!("q4tp step ×4: {rep:?}");
    assert!(!rep.within_bounds());

    // One group's code raised to the top, its nibbles kept: the group with the lowest code
    // among those with a non-zero nibble (a fixed group could already be at the top, or
    // all zeros, on some seeds).
    let mut q = good.clone();
    let groups = (0..rows).flat_map(|rr| (0..cols / 32).map(move |g| (rr, g)));
    let (rr, g) = groups
        .filter(|&(rr, g)| (g * 32..g * 32 + 32).any(|k| good.nibble(rr, k) != 0))
        .min_by_key(|&(rr, g)| good.code(rr, g))
        .unwrap();
    assert!(good.code(rr, g) < 31, "every group already at the top code");
    q.set_code(rr, g, 31);
    assert!(!q.check(&w).unwrap().within_bounds());
}

#[test]
fn q8_2f_check_catches_broken_quantizers() {
    let mut r = rng("q8_2f_broken");
    let (rows, cols) = (16, 200);
    let w = matrix(&mut r, Dist::RealIsh, rows, cols, 0.05);
    let good = Q8_2f::quantize(&w, rows, cols).unwrap();
    assert!(good.check(&w).unwrap().within_bounds());
    let deq = QuantMatrix::Q8_2f(good.clone()).dequantize();

    // An int8 off by one.
    let mut q = good.clone();
    let i = min_error_index(&w, &deq);
    let (rr, k) = (i / cols, i % cols);
    let v = q.q(rr, k);
    q.set_q(rr, k, if v < 127 { v + 1 } else { v - 1 });
    let rep = q.check(&w).unwrap();
    eprintln!("q8_2f int8 off by one: {rep:?}");
    assert!(!rep.within_bounds());

    // Row scales rounded down by 10% with the weights clamped to ±127.
    let mut q = good.clone();
    for rr in 0..rows {
        let rs = f16::from_f32(q.row_scale(rr).to_f32() * 0.9);
        q.set_row_scale(rr, rs);
        for k in 0..cols {
            let s = rs.to_f64() * q.col_field(k).to_f64();
            q.set_q(
                rr,
                k,
                (w[rr * cols + k] as f64 / s).round().clamp(-127.0, 127.0) as i32,
            );
        }
    }
    let rep = q.check(&w).unwrap();
    eprintln!("q8_2f row scales low: {rep:?}");
    assert!(!rep.within_bounds());

    // Plain per-row int8 (no column field) on rows with outlier columns: the grid the
    // outliers set is too coarse for the other columns.
    let lay = good.layout();
    let mut words = good.words().to_vec();
    for k in 0..lay.cols4 {
        super::set_half(&mut words, lay.col_field_half + k, f16::ONE);
    }
    let mut q = Q8_2f::from_words(rows, cols, words).unwrap();
    for rr in 0..rows {
        let row = &w[rr * cols..(rr + 1) * cols];
        let m = row.iter().fold(0f32, |a, v| a.max(v.abs()));
        let rs = super::f16_up(m / 127.0);
        q.set_row_scale(rr, rs);
        for (k, &v) in row.iter().enumerate() {
            q.set_q(rr, k, (v as f64 / rs.to_f64()).round() as i32);
        }
    }
    let rep = q.check(&w).unwrap();
    eprintln!("q8_2f without column field: {rep:?}");
    assert!(!rep.within_bounds());
}

#[test]
fn f16_directed_rounding() {
    for &x in &[0.1f32, -0.1, 1.0, 3.3, -7.77e-6, 1e-8, 65000.0, 0.0] {
        let (u, d) = (f16_up(x), f16_down(x));
        assert!(u.to_f32() >= x && d.to_f32() <= x, "{x}: {u} {d}");
        assert!(
            u.to_f32() - d.to_f32() <= (x.abs() * 2e-3).max(6e-8),
            "{x}: {u} {d}"
        );
    }
}
