//! Every kernel against its CPU reference (`crate::reference`) on fresh random, non-zero
//! inputs of awkward sizes, the output poisoned with NaN first so an unwritten element
//! fails the comparison. The seed is printed so a failure can be replayed
//! (`VERBATIM_TEST_SEED=...`).

use half::f16;
use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::decode::StepRules;
use crate::gpu::Profile;
use crate::quant::block::{BlockFormat, BlockQuant};
use crate::reference::{ops, select as ref_select};
use crate::testgpu::{gpu, poisoned, rand_vec, rel_err, rng, NAN_BITS};



fn f16_bits(v: &[f32]) -> Vec<u16> {
    v.iter().map(|&x| f16::from_f32(x).to_bits()).collect()
}

fn f16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| ops::f16_round(x)).collect()
}



/// The GEMV/GEMM epilogue on the reference: GELU, then + the previous output.
fn epilogue_ref(want: &mut [f32], gelu: bool, accumulate: bool, y0: &[f32]) {
    for (v, y) in want.iter_mut().zip(y0) {
        if gelu {
            *v = ops::gelu(*v);
        }
        if accumulate {
            *v += y;
        }
    }
}

/// The kernels with the GEMMs on cooperative matrices (`coop`) or on CUDA cores; None
/// (the test says it skipped) where the device has no cooperative matrices: lavapipe has
/// none, so that path is tested on a GPU (bench/RESULTS.md records where).
fn gemm_kernels(g: &Gpu, coop: bool, test: &str) -> Option<Kernels> {
    let k = Kernels::load(g).unwrap();
    match (coop, k.uses_coop()) {
        (false, _) => Some(k.without_coop()),
        (true, true) => Some(k),
        (true, false) => {
            eprintln!("{test}: SKIPPED the cooperative-matrix GEMM: {} has no usable cooperative matrices", g.info.name);
            None
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn run_linear(r: &mut StdRng, coop: bool, m: usize, n: usize, k: usize, bias: bool, gelu: bool, accumulate: bool) {
    let Some(kern) = gemm_kernels(gpu(), coop, "linear") else {
        return;
    };
    run_linear_with(&kern, r, m, n, k, bias, gelu, accumulate);
}

#[allow(clippy::too_many_arguments)]
fn run_linear_with(kern: &Kernels, r: &mut StdRng, m: usize, n: usize, k: usize, bias: bool, gelu: bool, accumulate: bool) {
    let g = gpu();
    let coop = kern.uses_coop();
    let x = rand_vec(r, m * k, 1.0);
    let w = f16_round(&rand_vec(r, n * k, 0.5));
    let b = rand_vec(r, n, 0.5);
    let y0 = rand_vec(r, m * n, 1.0);
    let xb = g.upload_f32("x", &x).unwrap();
    let wm = F16Matrix::from_bits(g, "w", &f16_bits(&w), n, k).unwrap();
    let bb = g.upload_f32("b", &b).unwrap();
    let yb = poisoned(m * n);
    if accumulate {
        g.write(&yb, 0, bytemuck::cast_slice(&y0));
    }
    let mut rec = g.recorder();
    kern.linear(&mut rec, Rows::new(&xb, k), m as u32, &wm, bias.then_some(&bb), Rows::new(&yb, n), Epilogue { gelu, accumulate })
        .unwrap();
    rec.submit(None).unwrap();
    let got = g.read_f32(&yb, 0, m * n).unwrap();
    let mut want = ops::linear(&x, m, k, &w, n, bias.then_some(&b[..]));
    epilogue_ref(&mut want, gelu, accumulate, &y0);
    let e = rel_err(&got, &want);
    // On a failure, how far the result is from the same GEMM with x rounded to f16 (tells
    // an f16-precision activation path from a wrong one).
    let f16_x = || {
        let mut w16 = ops::linear(&f16_round(&x), m, k, &w, n, bias.then_some(&b[..]));
        epilogue_ref(&mut w16, gelu, accumulate, &y0);
        rel_err(&got, &w16)
    };
    assert!(e < 1e-5, "linear coop={coop} m={m} n={n} k={k} bias={bias} gelu={gelu} acc={accumulate}: rel err {e} (against f16 x: {})", f16_x());
}

/// The row limits the WGSL sources declare are the Rust ones: a verify pass's rows index
/// select.wgsl's parameter sets and ffn_decode.wgsl's final-norm counters by row.
#[test]
fn wgsl_row_limits_follow_verify_max_rows() {
    let select = include_str!("select.wgsl");
    assert!(select.contains(&format!("const SELECT_ROWS: u32 = {SELECT_ROWS}u;")), "select.wgsl's SELECT_ROWS is not {SELECT_ROWS}");
    assert!(FFN_DECODE_SOURCE.contains(&format!("const FIN_ROWS: u32 = {VERIFY_MAX_ROWS}u;")), "ffn_decode.wgsl's FIN_ROWS is not {VERIFY_MAX_ROWS}");
}

#[test]
fn linear_gemv_matches_reference() {
    let mut r = rng("linear_gemv");
    for &(m, n, k) in &[(1, 6, 3), (1, 130, 45), (3, 70, 17), (8, 66, 131), (2, 258, 384), (1, 2100, 7), (1, 4098, 1025), (1, 4104, 1025)] {
        // (the last two are over 8 MiB: N = 4098 is no multiple of 8 and stays on main_m1,
        // N = 4104 takes the streaming GEMV, its last workgroup one column group wide)
        run_linear(&mut r, false, m, n, k, true, false, false);
    }
    // The streaming GEMV's epilogue: GELU and the residual, K shorter than its slices.
    run_linear(&mut r, false, 1, 104_864, 40, true, true, true);
    run_linear(&mut r, false, 1, 78, 61, true, true, false);
    run_linear(&mut r, false, 5, 34, 39, false, false, true);
    // One row: the epilogue's bias and residual are loaded ahead in main_m1.
    run_linear(&mut r, false, 1, 34, 39, true, false, true);
    run_linear(&mut r, false, 1, 40, 50, false, true, true);
}

fn run_linear_ln(r: &mut StdRng, m: usize, n: usize, k: usize, gelu: bool, accumulate: bool) {
    run_linear_ln_with(&Kernels::load(gpu()).unwrap(), r, m, n, k, gelu, accumulate);
}

fn run_linear_ln_with(kern: &Kernels, r: &mut StdRng, m: usize, n: usize, k: usize, gelu: bool, accumulate: bool) {
    let g = gpu();
    // A large mean, as a transformer's residual stream has.
    let x: Vec<f32> = rand_vec(r, m * k, 1.0).iter().map(|v| v + 3.0).collect();
    let gm = rand_vec(r, k, 1.0);
    let bt = rand_vec(r, k, 0.5);
    let w = f16_round(&rand_vec(r, n * k, 0.5));
    let b = rand_vec(r, n, 0.5);
    let y0 = rand_vec(r, m * n, 1.0);
    let xb = g.upload_f32("x", &x).unwrap();
    let gb = g.upload_f32("gamma", &gm).unwrap();
    let bb_ = g.upload_f32("beta", &bt).unwrap();
    let wm = F16Matrix::from_bits(g, "w", &f16_bits(&w), n, k).unwrap();
    let bb = g.upload_f32("b", &b).unwrap();
    let scratch = poisoned(m * k);
    let yb = poisoned(m * n);
    if accumulate {
        g.write(&yb, 0, bytemuck::cast_slice(&y0));
    }
    let mut rec = g.recorder();
    let norm = NormArgs { gamma: &gb, beta: &bb_, eps: 1e-5 };
    kern.linear_ln(&mut rec, Rows::new(&xb, k), m as u32, norm, &scratch, &wm, Some(&bb), Rows::new(&yb, n), Epilogue { gelu, accumulate })
        .unwrap();
    rec.submit(None).unwrap();
    let got = g.read_f32(&yb, 0, m * n).unwrap();
    let xn = ops::layer_norm(&x, m, k, &gm, &bt, 1e-5);
    let mut want = ops::linear(&xn, m, k, &w, n, Some(&b[..]));
    epilogue_ref(&mut want, gelu, accumulate, &y0);
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "linear_ln m={m} n={n} k={k} gelu={gelu} acc={accumulate}: rel err {e}");
}

#[test]
fn linear_ln_matches_reference() {
    let mut r = rng("linear_ln");
    // GEMV with the norm folded in (M = 1 and a few rows), and the LayerNorm + GEMM path;
    // rows wider than 4 x 256 (the statistics' loops past the round kept in registers).
    for &(m, n, k) in &[(1, 6, 3), (1, 130, 45), (1, 1154, 384), (3, 70, 300), (8, 66, 131), (11, 34, 77), (1, 4098, 1025), (1, 4104, 1025), (1, 70, 2100), (2, 38, 1300)] {
        run_linear_ln(&mut r, m, n, k, false, false);
    }
    run_linear_ln(&mut r, 1, 78, 61, true, false);
    run_linear_ln(&mut r, 2, 34, 39, false, true);
}

/// Both shapes of the streaming GEMV (the device's limits pick one for the engine), with
/// the LayerNorm folded in, GELU and the residual, on a matrix over 8 MiB whose last
/// workgroup is one column group wide; and a shape it does not have is refused.
#[test]
fn gemv_stream_both_shapes_match_reference() {
    let mut r = rng("gemv_stream");
    let g = gpu();
    for slices in [32, 64] {
        let kern = Kernels::load(g).unwrap().with_stream_slices(g, slices).unwrap();
        run_linear_ln_with(&kern, &mut r, 1, 4104, 1025, true, true);
        run_linear_ln_with(&kern, &mut r, 1, 104_864, 40, false, false);
    }
    assert!(Kernels::load(g).unwrap().with_stream_slices(g, 48).is_err());
    // What the device's limits choose: 32 under wgpu's defaults (256 invocations, 16 KiB).
    assert_eq!(super::gemv_stream_slices(&wgpu::Limits::default()), 32);
    let big = wgpu::Limits { max_compute_invocations_per_workgroup: 1024, max_compute_workgroup_storage_size: 32 << 10, ..Default::default() };
    assert_eq!(super::gemv_stream_slices(&big), 64);
    let narrow = wgpu::Limits { max_compute_invocations_per_workgroup: 1024, ..Default::default() };
    assert_eq!(super::gemv_stream_slices(&narrow), 32);
}

#[test]
fn linear_rows_matches_reference_and_rows_equal_lone_rows() {
    let mut r = rng("linear_rows");
    let (rows, biased) = (TestWeights::Rows { bias: false }, TestWeights::Rows { bias: true });
    run_rows_equal_lone(&mut r, rows, 1, 1003, 390, true, false, false);
    run_rows_equal_lone(&mut r, biased, 3, 70, 46, false, false, true);
    // K past 512 takes the kernel's loop (with several rows too).
    run_rows_equal_lone(&mut r, biased, 2, 37, 1030, true, true, false);
    run_rows_equal_lone(&mut r, rows, 5, 45, 1030, true, false, false);
    run_rows_equal_lone(&mut r, rows, 1, 33, 2, false, false, false);
    run_rows_equal_lone(&mut r, rows, 4, 64, 512, true, false, false);
    run_rows_equal_lone(&mut r, biased, 8, 99, 384, true, false, false);
    run_rows_equal_lone(&mut r, rows, 11, 65, 70, true, false, true);
    // A verify pass's logits: 8 and 16 rows already normalised (the LayerNorm is its own
    // dispatch), one workgroup's rows in main_rows.
    run_rows_equal_lone(&mut r, rows, 8, 1003, 390, false, false, false);
    run_rows_equal_lone(&mut r, rows, VERIFY_MAX_ROWS as usize, 1003, 390, false, false, false);
    // More rows than main_rows takes in a workgroup (a second grid layer, a last round of
    // one row), with K past 512.
    run_rows_equal_lone(&mut r, biased, 21, 77, 1030, false, true, true);
}

/// Weights of a per-row GEMV test: f16, or quantized in a block format.
#[derive(Clone, Copy, Debug)]
enum TestWeights {
    F16,
    Q(BlockFormat),
    /// f16 stored row-major (`linear_rows`, the logits: which have no bias).
    Rows { bias: bool },
}

/// The per-row GEMVs (a verify pass's f16 `linear_per_row`, `linear_q` for prompts, steps
/// and verify passes alike, and `linear_rows` for the logits; N not a multiple of its 32
/// outputs per workgroup clamps rows): every row of an m-row call equals, bit for bit, the same
/// row computed alone (as a decode step does), and the reference within rounding. X sits
/// at an offset in a longer buffer with poison around it: a row (or a quantized last
/// block's padding) must not read past K.
#[allow(clippy::too_many_arguments)]
fn run_rows_equal_lone(r: &mut StdRng, wt: TestWeights, m: usize, n: usize, k: usize, with_norm: bool, gelu: bool, accumulate: bool) {
    let kern = Kernels::load(gpu()).unwrap();
    run_rows_equal_lone_on(&kern, r, wt, m, n, k, with_norm, gelu, accumulate);
}

/// [`run_rows_equal_lone`] with the kernels given (a verify pass's variants set in them).
#[allow(clippy::too_many_arguments)]
fn run_rows_equal_lone_on(kern: &Kernels, r: &mut StdRng, wt: TestWeights, m: usize, n: usize, k: usize, with_norm: bool, gelu: bool, accumulate: bool) {
    let g = gpu();
    let x: Vec<f32> = rand_vec(r, m * k, 1.0).iter().map(|v| v + 2.0).collect();
    let gm = rand_vec(r, k, 1.0);
    let bt = rand_vec(r, k, 0.5);
    let (fm, qm, rm, w) = match wt {
        TestWeights::F16 => {
            let w = f16_round(&rand_vec(r, n * k, 0.5));
            (Some(F16Matrix::from_bits(g, "w", &f16_bits(&w), n, k).unwrap()), None, None, w)
        }
        TestWeights::Q(format) => {
            let q = BlockQuant::quantize(format, &rand_vec(r, n * k, 0.5), n, k).unwrap();
            (None, Some(QMatrix::upload(g, "w", &q).unwrap()), None, q.dequantize())
        }
        TestWeights::Rows { .. } => {
            let w = f16_round(&rand_vec(r, n * k, 0.5));
            (None, None, Some(F16Rows::from_bits(g, "w", &f16_bits(&w), n, k).unwrap()), w)
        }
    };
    let bias = !matches!(wt, TestWeights::Rows { bias: false });
    let b = rand_vec(r, n, 0.5);
    let y0 = rand_vec(r, m * n, 1.0);
    let mut xs = vec![f32::NAN; 3];
    xs.extend_from_slice(&x);
    xs.extend_from_slice(&[f32::NAN; 40]);
    let xb = g.upload_f32("x", &xs).unwrap();
    let gb = g.upload_f32("gamma", &gm).unwrap();
    let bb_ = g.upload_f32("beta", &bt).unwrap();
    let bb = g.upload_f32("b", &b).unwrap();
    let ep = Epilogue { gelu, accumulate };
    let norm = || with_norm.then_some(NormArgs { gamma: &gb, beta: &bb_, eps: 1e-5 });
    let together = poisoned(m * n);
    let alone = poisoned(m * n);
    if accumulate {
        g.write(&together, 0, bytemuck::cast_slice(&y0));
        g.write(&alone, 0, bytemuck::cast_slice(&y0));
    }
    let mut rec = g.recorder();
    let (xm, ym) = (Rows::at(&xb, 3, k), Rows::new(&together, n));
    let bo = bias.then_some(&bb);
    match (&fm, &qm, &rm) {
        (Some(f), _, _) => kern.linear_per_row(&mut rec, xm, m as u32, norm(), f, bo, ym, ep).unwrap(),
        (_, Some(q), _) => kern.linear_q(&mut rec, xm, m as u32, norm(), q, bo, ym, ep).unwrap(),
        (_, _, Some(rw)) => kern.linear_rows(&mut rec, xm, m as u32, norm(), rw, bo, ym, ep, true).unwrap(),
        _ => unreachable!(),
    }
    for i in 0..m {
        let (x1, y1) = (Rows::at(&xb, 3 + i * k, k), Rows::at(&alone, i * n, n));
        let scratch = poisoned(k);
        match (&fm, &qm, &rm, norm()) {
            (Some(f), _, _, Some(nm)) => kern.linear_ln(&mut rec, x1, 1, nm, &scratch, f, bo, y1, ep).unwrap(),
            (Some(f), _, _, None) => kern.linear(&mut rec, x1, 1, f, bo, y1, ep).unwrap(),
            (_, Some(q), _, nm) => kern.linear_q(&mut rec, x1, 1, nm, q, bo, y1, ep).unwrap(),
            (_, _, Some(rw), nm) => kern.linear_rows(&mut rec, x1, 1, nm, rw, bo, y1, ep, false).unwrap(),
            _ => unreachable!(),
        }
    }
    rec.submit(None).unwrap();
    let got = g.read_f32(&together, 0, m * n).unwrap();
    let lone = g.read_f32(&alone, 0, m * n).unwrap();
    let what = format!("{wt:?} m={m} n={n} k={k} norm={with_norm} gelu={gelu} acc={accumulate}");
    for (i, (a, b)) in got.iter().zip(&lone).enumerate() {
        assert_eq!(a.to_bits(), b.to_bits(), "{what}: element {i} is {a}, alone {b}");
    }
    let xn = if with_norm { ops::layer_norm(&x, m, k, &gm, &bt, 1e-5) } else { x.clone() };
    let mut want = ops::linear(&xn, m, k, &w, n, bias.then_some(&b[..]));
    epilogue_ref(&mut want, gelu, accumulate, &y0);
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "{what}: rel err {e}");
}

#[test]
fn linear_per_row_equals_lone_rows_bit_for_bit() {
    let mut r = rng("linear_per_row");
    // (A pass's rows with the norm go through main_m1's late variant below 9 rows, a step's
    // through main_m1; main_rows from GEMV_PASS_ROWS_MIN's rows on: 9 with the norm, 13
    // plain, so the cases of 16 rows below take it.)
    let kern = Kernels::load(gpu()).unwrap();
    assert!(kern.gemv_m1_ln_pass.is_some(), "passes take the late LayerNorm GEMV by default");
    assert_eq!(kern.gemv_pass_rows_min, GEMV_PASS_ROWS_MIN, "main_rows from its default rows");
    assert!(kern.gemv_pass_rows.iter().all(|k| k.is_some()), "both main_rows kernels built");
    run_rows_equal_lone(&mut r, TestWeights::F16, 3, 130, 45, false, false, false);
    run_rows_equal_lone(&mut r, TestWeights::F16, 5, 66, 131, true, true, true);
    run_rows_equal_lone(&mut r, TestWeights::F16, 8, 34, 77, true, false, true);
    // tiny.en's verify-pass shapes: the QKV GEMV with its LayerNorm (a pass's most rows),
    // fc2 accumulating.
    run_rows_equal_lone(&mut r, TestWeights::F16, VERIFY_MAX_ROWS as usize, 1152, 384, true, false, false);
    run_rows_equal_lone(&mut r, TestWeights::F16, 6, 384, 1536, false, false, true);
    // Slices of 19 and 41 with the norm (the late variant's rounds of eight and its tail).
    run_rows_equal_lone(&mut r, TestWeights::F16, 3, 66, 600, true, true, true);
    run_rows_equal_lone(&mut r, TestWeights::F16, 2, 40, 1300, true, false, false);
    // Over 8 MiB: main_m1 (N = 4098, no multiple of 8) and the streaming GEMV (4104).
    run_rows_equal_lone(&mut r, TestWeights::F16, 2, 4098, 1025, true, false, false);
    run_rows_equal_lone(&mut r, TestWeights::F16, 3, 4104, 1025, true, true, true);
}

/// gemv.wgsl's `main_rows` (a pass's rows four to a workgroup, from [`gemv_pass_rows_min`]
/// rows): every row equal bit for bit to the step's kernel on the same row alone, and to
/// the reference within rounding. (Lavapipe contracts nothing; on NVIDIA the bench's guard
/// is what holds it, see gemv_common.wgsl's note on `ln_stats`.)
#[test]
fn pass_rows_kernel_keeps_the_bits() {
    let g = gpu();
    let mut r = rng("pass_rows");
    {
        let mut kern = Kernels::load(g).unwrap();
        kern.gemv_pass_rows = gemv_pass_rows_kernels(g, [1, 1]).unwrap();
        kern.gemv_pass_rows_min = [1, 1];
        assert!(kern.gemv_pass_rows.iter().all(|k| k.is_some()), "both kernels");
        // tiny.en's Q|K|V with a pass's most rows (slices of 12); its output projection.
        run_rows_equal_lone_on(&kern, &mut r, TestWeights::F16, VERIFY_MAX_ROWS as usize, 1152, 384, true, false, false);
        run_rows_equal_lone_on(&kern, &mut r, TestWeights::F16, 6, 384, 384, false, false, true);
        // Slices of 19 (two rounds of eight, three alone; groups of four and one), every
        // epilogue flag; of 41 and K > 1024 (the statistics' longer loops); of 5 and 2.
        run_rows_equal_lone_on(&kern, &mut r, TestWeights::F16, 5, 66, 600, true, true, true);
        run_rows_equal_lone_on(&kern, &mut r, TestWeights::F16, 2, 40, 1300, true, false, false);
        run_rows_equal_lone_on(&kern, &mut r, TestWeights::F16, 3, 130, 131, true, false, true);
        run_rows_equal_lone_on(&kern, &mut r, TestWeights::F16, 1, 34, 45, false, true, false);
    }
}

/// Which kernel a verify pass's GEMV takes by its rows: main_rows from each variant's
/// threshold on (GEMV_PASS_ROWS_MIN's by default: 9 rows with the norm, 13 plain; the
/// switch's otherwise), main_m1 below it.
#[test]
fn pass_gemvs_take_main_rows_from_their_thresholds() {
    let g = gpu();
    let mut r = rng("pass_rows_min");
    let (n, k) = (66, 40);
    let wm = F16Matrix::from_bits(g, "w", &f16_bits(&rand_vec(&mut r, n * k, 0.5)), n, k).unwrap();
    let x = g.upload_f32("x", &rand_vec(&mut r, VERIFY_MAX_ROWS as usize * k, 1.0)).unwrap();
    let gb = g.upload_f32("g", &rand_vec(&mut r, k, 1.0)).unwrap();
    let y = poisoned(VERIFY_MAX_ROWS as usize * n);
    let ran = |kern: &Kernels, m: u32, ln: bool| {
        let mut rec = g.recorder();
        let norm = ln.then_some(NormArgs { gamma: &gb, beta: &gb, eps: 1e-5 });
        kern.linear_per_row(&mut rec, Rows::new(&x, k), m, norm, &wm, None, Rows::new(&y, n), Epilogue::default()).unwrap();
        let mut prof = Profile::default();
        rec.submit(Some(&mut prof)).unwrap();
        kernels_ran(&prof)
    };
    let mut kern = Kernels::load(g).unwrap();
    let min = gemv_pass_rows_min("9,13").unwrap();
    assert_eq!((kern.gemv_pass_rows_min, min), (GEMV_PASS_ROWS_MIN, GEMV_PASS_ROWS_MIN), "9,13 by default");
    let [plain, with_norm] = min;
    assert_eq!(ran(&kern, with_norm - 1, true), ["gemv_m1_f16_ln_late"]);
    assert_eq!(ran(&kern, with_norm, true), ["gemv_pass_rows_f16_ln"]);
    assert_eq!(ran(&kern, plain - 1, false), ["gemv_m1_f16_plain"]);
    assert_eq!(ran(&kern, plain, false), ["gemv_pass_rows_f16_plain"]);
    let min = gemv_pass_rows_min("0").unwrap();
    (kern.gemv_pass_rows, kern.gemv_pass_rows_min) = (gemv_pass_rows_kernels(g, min).unwrap(), min);
    assert_eq!(ran(&kern, VERIFY_MAX_ROWS, true), ["gemv_m1_f16_ln_late"], "0: never");
    assert_eq!(ran(&kern, VERIFY_MAX_ROWS, false), ["gemv_m1_f16_plain"], "0: never");
}

/// The pass GEMVs' switches: a value they do not know is an error naming what they take.
#[test]
fn pass_gemv_switches_refuse_unknown_values() {
    assert_eq!(GemvLnPass::parse("").unwrap(), GemvLnPass::Late);
    assert_eq!(GemvLnPass::parse("main").unwrap(), GemvLnPass::Main);
    let e = GemvLnPass::parse("eight").unwrap_err().to_string();
    assert!(e.contains("VERBATIM_GEMV_LN_PASS=eight") && e.contains("main or late"), "{e}");
    assert_eq!(gemv_pass_rows_min("").unwrap(), GEMV_PASS_ROWS_MIN);
    assert_eq!(gemv_pass_rows_min("0").unwrap(), [u32::MAX; 2]);
    assert_eq!(gemv_pass_rows_min("12").unwrap(), [12, 12]);
    assert_eq!(gemv_pass_rows_min("9,13").unwrap(), [13, 9], "with the norm first, then plain");
    let past = (VERIFY_MAX_ROWS + 1).to_string();
    for v in ["yes", &past, "-1", "9,", ",9", "9,0", "1,2,3"] {
        let e = gemv_pass_rows_min(v).unwrap_err().to_string();
        assert!(e.contains(&format!("VERBATIM_GEMV_PASS_ROWS={v}:")) && e.contains(&format!("from 1 to {VERIFY_MAX_ROWS}")), "{e}");
    }
    let g = gpu();
    assert!(gemv_pass_rows_kernels(g, [u32::MAX; 2]).unwrap().iter().all(|k| k.is_none()));
    let ln_only = gemv_pass_rows_kernels(g, [u32::MAX, 9]).unwrap();
    assert!(ln_only[0].is_none() && ln_only[1].is_some(), "only the kernel a threshold asks for");
}

/// ffn_decode.wgsl against LayerNorm, fc1, GELU, fc2 and the residual on the CPU, for `m`
/// rows at an offset and a stride wider than d (the words between the rows must stay as
/// they were). Twice on fresh rows with the same scratch (the first run's partials must
/// not leak into the second). Then each row alone, which must give the same bits. Where the
/// device fuses the final norm, every run also writes it (main_sum_norm, into a poisoned
/// buffer): against the CPU's LayerNorm of the updated rows, and bit for bit against the
/// LayerNorm kernel it replaces; each run after the first needs the counters it left at 0.
/// A decoder feed-forward block of random f16 weights (d x ffn) on the GPU, with its
/// LayerNorm, biases and ffn_decode's scratch, and the CPU's answer for rows of it.
struct FfnCase {
    d: usize,
    ffn: usize,
    gm: Vec<f32>,
    bt: Vec<f32>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    b2: Vec<f32>,
    w1m: F16Matrix,
    w2m: F16Matrix,
    gb: Buffer,
    bb: Buffer,
    b1b: Buffer,
    b2b: Buffer,
    scratch: Buffer,
}

impl FfnCase {
    fn new(g: &Gpu, r: &mut StdRng, d: usize, ffn: usize) -> FfnCase {
        let gm: Vec<f32> = rand_vec(r, d, 0.5).iter().map(|v| v + 1.0).collect();
        let bt = rand_vec(r, d, 0.5);
        let w1 = f16_round(&rand_vec(r, ffn * d, 0.5));
        let b1 = rand_vec(r, ffn, 0.5);
        let w2 = f16_round(&rand_vec(r, d * ffn, 0.5));
        let b2 = rand_vec(r, d, 0.5);
        FfnCase {
            d,
            ffn,
            w1m: F16Matrix::from_bits(g, "w1", &f16_bits(&w1), ffn, d).unwrap(),
            w2m: F16Matrix::from_bits(g, "w2", &f16_bits(&w2), d, ffn).unwrap(),
            gb: g.upload_f32("gamma", &gm).unwrap(),
            bb: g.upload_f32("beta", &bt).unwrap(),
            b1b: g.upload_f32("b1", &b1).unwrap(),
            b2b: g.upload_f32("b2", &b2).unwrap(),
            scratch: g.buffer("ffn scratch", ffn_scratch_words(d as u32, ffn as u32) * 4).unwrap(),
            gm,
            bt,
            w1,
            b1,
            w2,
            b2,
        }
    }

    fn norm(&self) -> NormArgs<'_> {
        NormArgs { gamma: &self.gb, beta: &self.bb, eps: 1e-5 }
    }

    /// ffn_decode over `m` rows of `x` (final norm as given), as a verify pass's (`pass`: the
    /// pass's chunk kernel) or a decode step's.
    fn run(&self, k: &Kernels, rec: &mut Recorder, x: Rows, m: usize, fin: Option<(NormArgs, &Buffer)>, pass: bool) {
        k.ffn_decode(rec, x, m as u32, self.norm(), &self.w1m, &self.b1b, &self.w2m, &self.b2b, &self.scratch, fin, pass).unwrap();
    }

    /// The CPU's rows for the `m` rows of `x` (row-major, d each).
    fn reference(&self, x: &[f32], m: usize) -> Vec<f32> {
        ops::ffn_residual(x, m, self.d, &self.gm, &self.bt, 1e-5, &self.w1, &self.b1, self.ffn, &self.w2, &self.b2)
    }
}

/// `len` random words with `m` rows of `d` at `off`, `stride` apart, shifted by 2 (a
/// residual stream's mean): the buffer, and the rows alone.
fn offset_rows(r: &mut StdRng, len: usize, m: usize, d: usize, off: usize, stride: usize) -> (Vec<f32>, Vec<f32>) {
    let mut buf = rand_vec(r, len, 1.0);
    let mut x = Vec::with_capacity(m * d);
    for i in 0..m {
        for c in 0..d {
            buf[off + i * stride + c] += 2.0;
            x.push(buf[off + i * stride + c]);
        }
    }
    (buf, x)
}

/// Kernels whose feed-forward chunk kernels load b1 where it is used (ffn_decode.wgsl
/// `EARLY_BIAS = false`), to hold the shipped early load to its bits.
fn kernels_with_late_bias(g: &Gpu) -> Kernels {
    use Access::{Read as R, ReadWrite as W};
    let mut k = Kernels::load(g).unwrap();
    let late = |src: &str| {
        let out = switched(src, "EARLY_BIAS", false).unwrap();
        assert!(out.contains("const EARLY_BIAS: bool = false;"));
        out
    };
    k.ffn_decode = g.kernel("ffn_decode_late_bias", &late(FFN_DECODE_SOURCE), &[W, R, R, R, R, R, R, W]).unwrap();
    if k.ffn_decode_pass.is_some() {
        k.ffn_decode_pass = Some(g.kernel("ffn_decode_pass_late_bias", &late(&ffn_decode_late_source().unwrap()), &[W, R, R, R, R, R, R, W]).unwrap());
    }
    k
}

fn run_ffn_decode(r: &mut StdRng, m: usize, d: usize, ffn: usize) {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let late_bias = kernels_with_late_bias(g);
    let (off, stride) = (5, d + 3);
    let case = FfnCase::new(g, r, d, ffn);
    let what = format!("m={m} d={d} ffn={ffn}");
    let len = off + m * stride + 7;
    let fused = kern.final_norm_fused();
    let (fg, fb): (Vec<f32>, Vec<f32>) = (rand_vec(r, d, 0.5).iter().map(|v| v + 1.0).collect(), rand_vec(r, d, 0.5));
    let (fgb, fbb) = (g.upload_f32("final gamma", &fg).unwrap(), g.upload_f32("final beta", &fb).unwrap());
    let fin_norm = || NormArgs { gamma: &fgb, beta: &fbb, eps: 1e-5 };
    let xn_len = m * d + 5;
    let poisoned = || g.upload_f32("normalised rows", &vec![f32::NAN; xn_len]).unwrap();
    for round in 0..2 {
        // Rows with an offset mean (a residual stream's), the words around them random too.
        let (buf, x) = offset_rows(r, len, m, d, off, stride);
        let xb = g.upload_f32("x", &buf).unwrap();
        let xn = poisoned();
        let mut rec = g.recorder();
        let fin = fused.then(|| (fin_norm(), &xn));
        // Round 0 as a step's kernel, round 1 as a verify pass's (compared below with steps).
        case.run(&kern, &mut rec, Rows::at(&xb, off, stride), m, fin, round == 1);
        rec.submit(None).unwrap();
        let got = g.read_f32(&xb, 0, len).unwrap();
        let want = case.reference(&x, m);
        let mut rows = Vec::with_capacity(m * d);
        for (i, (a, b)) in got.iter().zip(&buf).enumerate() {
            let in_row = i >= off && (i - off) / stride < m && (i - off) % stride < d;
            if in_row {
                rows.push(*a);
            } else {
                assert_eq!(a.to_bits(), b.to_bits(), "{what}, round {round}: word {i} outside the rows changed");
            }
        }
        let e = rel_err(&rows, &want);
        assert!(e < 1e-5, "{what}, round {round}: rel err {e}");
        let normed = g.read_f32(&xn, 0, xn_len).unwrap();
        // The same rows with b1 loaded where it is used.
        let xl = g.upload_f32("x, late bias", &buf).unwrap();
        let xnl = poisoned();
        let mut rec = g.recorder();
        case.run(&late_bias, &mut rec, Rows::at(&xl, off, stride), m, fused.then(|| (fin_norm(), &xnl)), round == 1);
        rec.submit(None).unwrap();
        let (got_l, normed_l) = (g.read_f32(&xl, 0, len).unwrap(), g.read_f32(&xnl, 0, xn_len).unwrap());
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same(&got, &got_l) && same(&normed, &normed_l), "{what}, round {round}: early and late bias loads differ");
        if fused {
            let want = ops::layer_norm(&rows, m, d, &fg, &fb, 1e-5);
            let e = rel_err(&normed[..m * d], &want);
            assert!(e < 1e-5, "{what}, round {round}: the final norm's rel err {e}");
            assert!(normed[m * d..].iter().all(|v| v.is_nan()), "{what}, round {round}: words past the normalised rows written");
            // The LayerNorm kernel over the same updated rows: the same bits.
            let ln_out = poisoned();
            let mut rec = g.recorder();
            for i in 0..m {
                kern.layer_norm(&mut rec, &xb, (off + i * stride) as u32, 1, d as u32, &fgb, &fbb, &ln_out, (i * d) as u32, 1e-5).unwrap();
            }
            rec.submit(None).unwrap();
            let by_kernel = g.read_f32(&ln_out, 0, m * d).unwrap();
            for (i, (a, b)) in normed.iter().zip(&by_kernel).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "{what}, round {round}: normalised word {i} is {a}, the LayerNorm kernel's {b}");
            }
        }
        if round == 1 {
            let together = rows;
            // Each row alone (its own dispatch), from the same inputs.
            let mut rec = g.recorder();
            let xa = g.upload_f32("x alone", &buf).unwrap();
            let xna: Vec<Buffer> = (0..m).map(|_| poisoned()).collect();
            for (i, xn) in xna.iter().enumerate() {
                let row = Rows::at(&xa, off + i * stride, stride);
                let fin = fused.then(|| (fin_norm(), xn));
                case.run(&kern, &mut rec, row, 1, fin, false);
            }
            rec.submit(None).unwrap();
            let alone = g.read_f32(&xa, 0, len).unwrap();
            for i in 0..m {
                for c in 0..d {
                    let (a, b) = (together[i * d + c], alone[off + i * stride + c]);
                    assert_eq!(a.to_bits(), b.to_bits(), "{what}: row {i} element {c} is {a}, alone {b}");
                }
                if fused {
                    let lone = g.read_f32(&xna[i], 0, d).unwrap();
                    for c in 0..d {
                        let (a, b) = (normed[i * d + c], lone[c]);
                        assert_eq!(a.to_bits(), b.to_bits(), "{what}: row {i}'s normalised element {c} is {a}, alone {b}");
                    }
                }
            }
        }
    }
}

#[test]
fn ffn_decode_matches_reference_and_lone_rows() {
    let mut r = rng("ffn_decode");
    // A ragged last chunk (406 = 25 x 16 + 6) and a ragged last group (26 chunks).
    run_ffn_decode(&mut r, 3, 136, 406);
    // More output pairs than threads (300), K slices of 19 words, a group of one chunk.
    run_ffn_decode(&mut r, 1, 600, 520);
    // tiny.en's shape with a verify pass's most rows.
    run_ffn_decode(&mut r, VERIFY_MAX_ROWS as usize, 384, 1536);
    // Rows past 4 x 256 (the final norm's fifth element a thread), near large-v3's 1280.
    run_ffn_decode(&mut r, 2, 1102, 74);
    // K slices of 17 words (main's loop past its first 16).
    run_ffn_decode(&mut r, 5, 520, 100);
}

#[test]
fn ffn_decode_refuses_what_it_cannot_do() {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let v = |n: usize| g.upload_f32("v", &vec![1.0; n]).unwrap();
    let most = VERIFY_MAX_ROWS;
    let (x, gm, bt, b1, b2) = (v(64 * (most as usize + 1)), v(64), v(64), v(96), v(64));
    let w = |n: usize, k: usize| F16Matrix::from_bits(g, "w", &vec![0x3c00; n * k], n, k).unwrap();
    let (w1, w2) = (w(96, 64), w(64, 96));
    let scratch = g.buffer("s", ffn_scratch_words(64, 96) * 4).unwrap();
    let small = g.buffer("s", ffn_scratch_words(64, 96) * 4 - 4).unwrap();
    let norm = NormArgs { gamma: &gm, beta: &bt, eps: 1e-5 };
    let mut rec = g.recorder();
    let x_rows = Rows::new(&x, 64);
    assert!(kern.ffn_decode(&mut rec, x_rows, 0, norm, &w1, &b1, &w2, &b2, &scratch, None, false).is_err(), "no rows");
    assert!(kern.ffn_decode(&mut rec, x_rows, most + 1, norm, &w1, &b1, &w2, &b2, &scratch, None, false).is_err(), "too many rows");
    assert!(kern.ffn_decode(&mut rec, x_rows, 1, norm, &w1, &b1, &w2, &b2, &small, None, false).is_err(), "short scratch");
    assert!(kern.ffn_decode(&mut rec, x_rows, 1, norm, &w1, &b1, &w1, &b2, &scratch, None, false).is_err(), "W2 of W1's shape");
    assert!(kern.ffn_decode(&mut rec, Rows::new(&x, 32), 1, norm, &w1, &b1, &w2, &b2, &scratch, None, false).is_err(), "rows narrower than d");
    assert!(kern.ffn_decode(&mut rec, x_rows, most, norm, &w1, &b1, &w2, &b2, &scratch, None, false).is_ok());
    if kern.final_norm_fused() {
        let short = g.buffer("normalised rows", 64 * most as u64 * 4 - 4).unwrap();
        assert!(kern.ffn_decode(&mut rec, x_rows, most, norm, &w1, &b1, &w2, &b2, &scratch, Some((norm, &short)), false).is_err(), "a short output");
    }
}

#[test]
fn linear_gemm_matches_reference() {
    let mut r = rng("linear_gemm");
    for coop in [false, true] {
        for &(m, n, k) in &[(9, 6, 3), (67, 70, 45), (130, 130, 17), (65, 64, 96)] {
            run_linear(&mut r, coop, m, n, k, true, false, false);
        }
        run_linear(&mut r, coop, 71, 38, 49, true, true, false);
        run_linear(&mut r, coop, 33, 66, 35, true, false, true);
        run_linear(&mut r, coop, 17, 20, 23, false, true, true);
    }
    // Several K slices and tiles on the tensor-core path (on lavapipe it skips).
    run_linear(&mut r, true, 203, 134, 101, true, true, true);
}

/// The linear layers' tensor-core GEMM over pre-split planes (split_f16.wgsl +
/// gemm_planes.wgsl): every epilogue, ragged row counts, several tiles and K slices, and
/// shapes it does not take (n not a multiple of 64, k not of the slice, more rows than the planes hold) falling
/// back to gemm_coop.wgsl. Runs where the device has cooperative matrices (the H200);
/// lavapipe skips it (the split itself is tested everywhere, below).
#[test]
fn linear_gemm_on_planes_matches_reference() {
    let mut r = rng("linear_planes");
    let g = gpu();
    let Some(mut kern) = gemm_kernels(g, true, "linear_planes") else {
        return;
    };
    kern.reserve_gemm_planes(g, 300, 512).unwrap();
    // Up to 512 columns over 32-row tiles, more over 64-row ones: both kernels run.
    kern.narrow_max_n = 512;
    let cases = [
        (9, 64, 32, true, false, false),
        (67, 128, 96, true, true, false),
        (130, 192, 64, false, false, true),
        (203, 64, 416, true, true, true),
        (300, 128, 512, true, false, true),
        (77, 64, 192, true, true, false),
        // more than 512 columns: 64-row tiles
        (203, 576, 416, true, true, true),
        (70, 640, 64, true, false, false),
    ];
    for (m, n, k, bias, gelu, acc) in cases {
        let probe = F16Matrix::from_bits(g, "probe", &vec![0u16; n * k], n, k).unwrap();
        assert!(kern.uses_planes(m as u32, &probe), "m={m} n={n} k={k} should take the planes GEMM");
        run_linear_with(&kern, &mut r, m, n, k, bias, gelu, acc);
    }
    // The wide tile (`GemmTile::WIDE`, 8 subgroups) on every epilogue, awkward row counts:
    // once as every 32-row GEMM's tile, once by its width rule.
    for forced in [true, false] {
        let mut kt = Kernels::load(g).unwrap();
        if forced {
            kt = kt.with_gemm_tile(g, GemmTile::WIDE).unwrap();
        } else {
            kt.wide_tile_min_n = 256;
        }
        kt.reserve_gemm_planes(g, 300, 512).unwrap();
        for (m, n, k, bias, gelu, acc) in [(67, 128, 96, true, true, false), (300, 384, 512, true, false, true), (203, 256, 416, false, false, true), (9, 128, 32, true, false, false)] {
            let probe = F16Matrix::from_bits(g, "probe", &vec![0u16; n * k], n, k).unwrap();
            assert!(kt.uses_planes(m as u32, &probe), "forced {forced}: m={m} n={n} k={k} should take the planes GEMM");
            run_linear_with(&kt, &mut r, m, n, k, bias, gelu, acc);
        }
    }
    // Not multiples of the tile or the slice: the staged GEMM instead, still right.
    let odd = F16Matrix::from_bits(g, "odd", &vec![0u16; 70 * 96], 70, 96).unwrap();
    assert!(!kern.uses_planes(33, &odd));
    run_linear_with(&kern, &mut r, 33, 70, 96, true, false, true);
    let ragged_k = F16Matrix::from_bits(g, "ragged k", &vec![0u16; 64 * 80], 64, 80).unwrap();
    assert!(!kern.uses_planes(90, &ragged_k));
    run_linear_with(&kern, &mut r, 90, 64, 80, false, true, false);
    // More rows of that width than the planes hold: the staged GEMM.
    let wide = F16Matrix::from_bits(g, "wide", &vec![0u16; 64 * 512], 64, 512).unwrap();
    assert!(!kern.uses_planes(400, &wide) && kern.uses_planes(300, &wide));
    run_linear_with(&kern, &mut r, 400, 64, 512, true, false, false);
}

/// The wide tile (`GemmTile::WIDE`) computes each output as the 32 x 64 tile does (the same
/// 16x16x16 products of the same K slices in the same order): the same bits, into rows with
/// every epilogue and into planes, on the same inputs. Runs where the device has cooperative
/// matrices (the H200).
#[test]
fn gemm_wide_tile_equals_narrow_bit_for_bit() {
    let mut r = rng("gemm_wide_tile");
    let g = gpu();
    let Some(mut narrow) = gemm_kernels(g, true, "gemm_wide_tile") else {
        return;
    };
    let mut wide = Kernels::load(g).unwrap();
    narrow.wide_tile_min_n = u32::MAX;
    wide.wide_tile_min_n = 0;
    for kern in [&mut narrow, &mut wide] {
        kern.reserve_gemm_planes(g, 300, 512).unwrap();
    }
    for (m, n, k, bias, gelu, acc) in [(67usize, 128usize, 96usize, true, true, false), (300, 384, 512, true, false, true), (203, 256, 416, false, false, false)] {
        let x = rand_vec(&mut r, m * k, 1.0);
        let w = f16_round(&rand_vec(&mut r, n * k, 0.5));
        let b = rand_vec(&mut r, n, 0.5);
        let y0 = rand_vec(&mut r, m * n, 1.0);
        let xb = g.upload_f32("x", &x).unwrap();
        let wm = F16Matrix::from_bits(g, "w", &f16_bits(&w), n, k).unwrap();
        let bb = g.upload_f32("b", &b).unwrap();
        let mut rows = Vec::new();
        let mut planes = Vec::new();
        for kern in [&narrow, &wide] {
            let yb = poisoned(m * n);
            if acc {
                g.write(&yb, 0, bytemuck::cast_slice(&y0));
            }
            let out = kern.planes_out.as_ref().unwrap();
            g.fill_u32(out, NAN_BITS);
            let mut rec = g.recorder();
            kern.linear(&mut rec, Rows::new(&xb, k), m as u32, &wm, bias.then_some(&bb), Rows::new(&yb, n), Epilogue { gelu, accumulate: acc }).unwrap();
            kern.linear_planes_to_planes(&mut rec, m as u32, &wm, bias.then_some(&bb), gelu).unwrap();
            let mut prof = Profile::default();
            rec.submit(Some(&mut prof)).unwrap();
            let ran = kernels_ran(&prof);
            let want = if std::ptr::eq(kern, &wide) { GemmTile::WIDE.names() } else { GemmTile::NARROW.names() };
            assert!(ran.contains(&want.0) && ran.contains(&want.1), "m={m} n={n}: ran {ran:?}");
            rows.push(g.read_f32(&yb, 0, m * n).unwrap().iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
            planes.push(plane_words(out, 0, 2 * m.next_multiple_of(64) * n / 2));
        }
        assert!(rows[0] == rows[1], "m={m} n={n} k={k}: rows differ between the tiles");
        assert!(planes[0] == planes[1], "m={m} n={n} k={k}: planes differ between the tiles");
    }
}

/// `linear_segments`: Y's columns in segments stored one after the other ([n / seg][m][seg],
/// every decoder layer's cross K|V from one GEMM), output poisoned first, against the CPU:
/// from f32 rows (gemm.wgsl on lavapipe, the staged or planes GEMM on the H200) and from
/// planes split beforehand (the H200).
#[test]
fn linear_segments_matches_reference() {
    let mut r = rng("linear_segments");
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.reserve_gemm_planes(g, 300, 512).unwrap();
    for &(m, k, n, seg) in &[(70usize, 64usize, 256usize, 64usize), (131, 96, 384, 192), (300, 37, 66, 22)] {
        let x = rand_vec(&mut r, m * k, 1.0);
        let w = f16_round(&rand_vec(&mut r, n * k, 0.5));
        let b = rand_vec(&mut r, n, 0.5);
        let (xb, bb) = (g.upload_f32("x", &x).unwrap(), g.upload_f32("b", &b).unwrap());
        let wm = F16Matrix::from_bits(g, "w", &f16_bits(&w), n, k).unwrap();
        let rows = ops::linear(&x, m, k, &w, n, Some(&b[..]));
        let mut want = vec![0.0f32; m * n];
        for row in 0..m {
            for c in 0..n {
                want[(c / seg) * m * seg + row * seg + c % seg] = rows[row * n + c];
            }
        }
        let from_planes = kern.uses_planes(m as u32, &wm);
        for planes_first in [false, true] {
            if planes_first && !from_planes {
                continue;
            }
            let yb = poisoned(m * n);
            let mut rec = g.recorder();
            if planes_first {
                kern.split_into_planes(&mut rec, Rows::new(&xb, k), m as u32, k as u32).unwrap();
                kern.linear_segments(&mut rec, None, m as u32, &wm, Some(&bb), &yb, seg as u32).unwrap();
            } else {
                kern.linear_segments(&mut rec, Some(Rows::new(&xb, k)), m as u32, &wm, Some(&bb), &yb, seg as u32).unwrap();
            }
            rec.submit(None).unwrap();
            let got = g.read_f32(&yb, 0, m * n).unwrap();
            let e = rel_err(&got, &want);
            assert!(e < 1e-5, "linear_segments m={m} k={k} n={n} seg={seg} planes={planes_first}: rel err {e}");
        }
    }
    // A segment that does not divide the columns is refused.
    let wm = F16Matrix::from_bits(g, "w", &vec![0u16; 64 * 32], 64, 32).unwrap();
    let (xb, yb) = (g.buffer("x", 100 * 32 * 4).unwrap(), g.buffer("y", 100 * 64 * 4).unwrap());
    assert!(kern.linear_segments(&mut g.recorder(), Some(Rows::new(&xb, 32)), 100, &wm, None, &yb, 48).is_err());
}

/// Element `i` of [rows][cols] f16 planes read as words (`plane` words a plane): its hi and
/// lo halves.
fn plane_halves(words: &[u32], plane: usize, i: usize) -> (f32, f32) {
    let half = |w: u32| half::f16::from_bits((w >> (16 * (i % 2))) as u16).to_f32();
    (half(words[i / 2]), half(words[plane + i / 2]))
}

/// Words of a planes buffer (`n` f16 pairs from `at`).
fn plane_words(b: &wgpu::Buffer, at: usize, n: usize) -> Vec<u32> {
    bytemuck::cast_slice(&gpu().read(b, at as u64 * 4, n as u64 * 4).unwrap()).to_vec()
}

/// gemm_emit_planes.wgsl: a GEMM writing its output as f16 planes (fc1 -> the planes fc2
/// reads; a fused Q|K|V -> attention_coop's head planes). Against the CPU: the planes' hi +
/// lo / 2^12 within 1e-5 of the reference GEMM (GELU, bias; q scaled), padding rows zero
/// (outputs poisoned first). Against the f32 path they replace (GEMM into rows, then
/// split_f16): the same words, and fc2 and the attention read from them the same bits.
/// Runs where the device has cooperative matrices (the H200).
#[test]
fn gemm_into_planes_matches_reference_and_the_split() {
    let mut r = rng("gemm_into_planes");
    let g = gpu();
    if gemm_kernels(g, true, "gemm_into_planes").is_none() {
        return;
    }
    let half = |w: u32, i: usize| half::f16::from_bits((w >> (16 * i)) as u16).to_f32() as f64;
    // 32 x 64 tiles and 64-row ones (32-row tiles write the padding rows past their last
    // tile too), then the wide tile (`GemmTile::WIDE`, columns a multiple of 128) for all.
    let (rows_any, heads_any): (&[(usize, usize, usize, usize)], &[(usize, usize, usize)]) = (&[(70, 64, 128, 64), (300, 96, 512, 192)], &[(70, 2, 64), (300, 3, 96)]);
    let (rows_128, heads_128): (&[(usize, usize, usize, usize)], &[(usize, usize, usize)]) = (&[(70, 64, 128, 128), (300, 96, 512, 256)], &[(70, 2, 64), (300, 4, 96)]);
    let tiles = [
        (GemmTile::NARROW, u32::MAX, rows_any, heads_any),
        (GemmTile::NARROW, 0, rows_any, heads_any),
        (GemmTile::WIDE, u32::MAX, rows_128, heads_128),
    ];
    for (tile, max_n, rows_cases, head_cases) in tiles {
        let mut kern = Kernels::load(g).unwrap().with_gemm_tile(g, tile).unwrap();
        kern.reserve_gemm_planes(g, 300, 512).unwrap();
        kern.narrow_max_n = max_n;
        // Rows planes: fc1 (GELU) into planes, then fc2 (residual) from them.
        for &(m, k, n, n2) in rows_cases {
            let m_pad = m.next_multiple_of(64);
            let x = rand_vec(&mut r, m * k, 1.0);
            let w1 = f16_round(&rand_vec(&mut r, n * k, 0.5));
            let b1 = rand_vec(&mut r, n, 0.5);
            let w2 = f16_round(&rand_vec(&mut r, n2 * n, 0.5));
            let b2 = rand_vec(&mut r, n2, 0.5);
            let y0 = rand_vec(&mut r, m * n2, 1.0);
            let xb = g.upload_f32("x", &x).unwrap();
            let (w1m, w2m) = (F16Matrix::from_bits(g, "w1", &f16_bits(&w1), n, k).unwrap(), F16Matrix::from_bits(g, "w2", &f16_bits(&w2), n2, n).unwrap());
            let (b1b, b2b) = (g.upload_f32("b1", &b1).unwrap(), g.upload_f32("b2", &b2).unwrap());
            assert!(kern.planes_to_planes(m as u32, &w1m) && kern.takes_second_planes(m as u32, &w2m));
            let gelu = Epilogue { gelu: true, accumulate: false };
            let acc = Epilogue { gelu: false, accumulate: true };
            // The old path: rows, split, rows.
            let (hb, ya, split) = (poisoned(m * n), poisoned(m * n2), g.buffer("split", (m_pad * n * 4) as u64).unwrap());
            g.write(&ya, 0, bytemuck::cast_slice(&y0));
            g.fill_u32(&split, NAN_BITS);
            let mut rec = g.recorder();
            kern.linear(&mut rec, Rows::new(&xb, k), m as u32, &w1m, Some(&b1b), Rows::new(&hb, n), gelu).unwrap();
            kern.split_f16_rows(&mut rec, Rows::new(&hb, n), m as u32, n as u32, &split).unwrap();
            kern.linear(&mut rec, Rows::new(&hb, n), m as u32, &w2m, Some(&b2b), Rows::new(&ya, n2), acc).unwrap();
            rec.submit(None).unwrap();
            // The new one: planes, planes, rows.
            let yb = poisoned(m * n2);
            g.write(&yb, 0, bytemuck::cast_slice(&y0));
            g.fill_u32(kern.planes_out.as_ref().unwrap(), NAN_BITS);
            let mut rec = g.recorder();
            kern.split_into_planes(&mut rec, Rows::new(&xb, k), m as u32, k as u32).unwrap();
            kern.linear_planes_to_planes(&mut rec, m as u32, &w1m, Some(&b1b), true).unwrap();
            kern.linear_on_second_planes(&mut rec, m as u32, &w2m, Some(&b2b), Rows::new(&yb, n2), acc).unwrap();
            rec.submit(None).unwrap();
            let words = m_pad * n / 2;
            let got = plane_words(kern.planes_out.as_ref().unwrap(), 0, 2 * words);
            let want: Vec<f32> = ops::linear(&x, m, k, &w1, n, Some(&b1[..])).into_iter().map(ops::gelu).collect();
            for row in 0..m_pad {
                for c in 0..n {
                    let (wi, hi_i) = (row * n / 2 + c / 2, c % 2);
                    let v = half(got[wi], hi_i) + half(got[words + wi], hi_i) / 4096.0;
                    if row >= m {
                        assert_eq!(v, 0.0, "padding row {row} col {c}, narrow max {max_n}");
                    } else {
                        let w = want[row * n + c] as f64;
                        assert!((v - w).abs() <= 1e-5 * (1.0 + w.abs()), "m={m} n={n} row {row} col {c}: {v} against {w}");
                    }
                }
            }
            assert_eq!(got, plane_words(&split, 0, 2 * words), "fc1 planes against rows + split, m={m} n={n}");
            let (old, new) = (g.read_f32(&ya, 0, m * n2).unwrap(), g.read_f32(&yb, 0, m * n2).unwrap());
            assert!(old.iter().zip(&new).all(|(a, b)| a.to_bits() == b.to_bits()), "fc2 from planes against from rows, m={m}");
        }
        // Head planes: LayerNorm into planes, the fused Q|K|V into head planes, the attention.
        for &(m, heads, k) in head_cases {
            let n = 3 * heads * 64;
            let m_pad = m.next_multiple_of(64);
            kern.reserve_blocked_attention(g, m as u32, heads as u32).unwrap();
            let x = rand_vec(&mut r, m * k, 1.0);
            let w = f16_round(&rand_vec(&mut r, n * k, 0.3));
            let b = rand_vec(&mut r, n, 0.5);
            let xb = g.upload_f32("x", &x).unwrap();
            let wm = F16Matrix::from_bits(g, "wqkv", &f16_bits(&w), n, k).unwrap();
            let bb = g.upload_f32("b", &b).unwrap();
            assert!(kern.qkv_to_heads(m as u32, heads as u32, &wm));
            let qkv = poisoned(m * n);
            let args = |out| AttentionArgs {
                q: Rows::at(&qkv, 0, n),
                k: Rows::at(&qkv, heads * 64, n),
                v: Rows::at(&qkv, 2 * heads * 64, n),
                out: Rows::new(out, heads * 64),
                tq: m as u32,
                tk: m as u32,
                heads: heads as u32,
                head_dim: 64,
                causal: None,
            };
            let (oa, ob) = (poisoned(m * heads * 64), poisoned(m * heads * 64));
            let hp = kern.head_planes.as_ref().unwrap();
            let hp_words = 3 * heads * m_pad * 32;
            g.fill_u32(hp, NAN_BITS);
            let mut rec = g.recorder();
            kern.linear(&mut rec, Rows::new(&xb, k), m as u32, &wm, Some(&bb), Rows::new(&qkv, n), Epilogue::default()).unwrap();
            kern.attention(&mut rec, &args(&oa)).unwrap();
            rec.submit(None).unwrap();
            let old_planes = plane_words(hp, 0, 2 * hp_words);
            g.fill_u32(hp, NAN_BITS);
            let mut rec = g.recorder();
            kern.split_into_planes(&mut rec, Rows::new(&xb, k), m as u32, k as u32).unwrap();
            kern.linear_planes_to_heads(&mut rec, m as u32, heads as u32, &wm, Some(&bb)).unwrap();
            kern.attention_on_head_planes(&mut rec, &args(&ob)).unwrap();
            rec.submit(None).unwrap();
            let got = plane_words(hp, 0, 2 * hp_words);
            let want = ops::linear(&x, m, k, &w, n, Some(&b[..]));
            let plane = heads * m_pad * 32;
            for which in 0..3 {
                for h in 0..heads {
                    for row in 0..m_pad {
                        for dd in 0..64 {
                            let wi = 2 * which * plane + (h * m_pad + row) * 32 + dd / 2;
                            let v = half(got[wi], dd % 2) + half(got[wi + plane], dd % 2) / 4096.0;
                            if row >= m {
                                assert_eq!(v, 0.0, "padding row {row}, narrow max {max_n}");
                                continue;
                            }
                            let scale = if which == 0 { 0.125 } else { 1.0 };
                            let w = want[row * n + (which * heads + h) * 64 + dd] as f64 * scale;
                            assert!((v - w).abs() <= 1e-5 * (1.0 + w.abs()), "m={m} which {which} head {h} row {row} dim {dd}: {v} against {w}");
                        }
                    }
                }
            }
            assert_eq!(got, old_planes, "head planes against rows + split, m={m} heads={heads}");
            let (a, bn) = (g.read_f32(&oa, 0, m * heads * 64).unwrap(), g.read_f32(&ob, 0, m * heads * 64).unwrap());
            assert!(a.iter().zip(&bn).all(|(p, q)| p.to_bits() == q.to_bits()), "attention from head planes, m={m}");
            // The attention merged into the out projection's planes: the split of its rows.
            let gp = kern.planes.clone().unwrap();
            let words = m_pad * heads * 32;
            g.fill_u32(&gp, NAN_BITS);
            let mut rec = g.recorder();
            kern.split_into_planes(&mut rec, Rows::new(&xb, k), m as u32, k as u32).unwrap();
            kern.linear_planes_to_heads(&mut rec, m as u32, heads as u32, &wm, Some(&bb)).unwrap();
            kern.attention_into_planes(&mut rec, &args(&ob)).unwrap();
            rec.submit(None).unwrap();
            let merged = plane_words(&gp, 0, 2 * words);
            let mut rec = g.recorder();
            kern.split_into_planes(&mut rec, Rows::new(&oa, heads * 64), m as u32, (heads * 64) as u32).unwrap();
            rec.submit(None).unwrap();
            assert_eq!(merged, plane_words(&gp, 0, 2 * words), "attention merged into planes against its rows split, m={m}");
        }
    }
}

/// split_f16.wgsl's `main_rows` against the CPU: rows at an offset and stride, hi exactly x
/// with its 13 low mantissa bits cleared, hi + lo / 2^12 within 2^-20 of x (lo is rounded to
/// f16's 11 bits), and the padding rows zero (output poisoned first).
#[test]
fn split_f16_rows_match_the_cpu_split() {
    let mut r = rng("split_f16");
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    for &(rows, cols, off, stride) in &[(37usize, 70usize, 5usize, 75usize), (64, 32, 0, 32), (3, 1030, 11, 1040)] {
        let rows_pad = rows.next_multiple_of(64);
        // Magnitudes over several binades (the split's scale must hold for all of them), and
        // rows past the last one: the padding must not read them.
        let x: Vec<f32> = (0..off + (rows + 2) * stride)
            .map(|_| {
                let v: f32 = r.random_range(0.5..1.0) * if r.random_range(0..2) == 0 { -1.0 } else { 1.0 };
                v * 2f32.powi(r.random_range(-6..6))
            })
            .collect();
        let xb = g.upload_f32("x", &x).unwrap();
        let words = rows_pad * cols / 2;
        let out = g.buffer("planes", words as u64 * 8).unwrap();
        g.fill_u32(&out, 0x7e00_7e00);
        let mut rec = g.recorder();
        kern.split_f16_rows(&mut rec, Rows { buf: &xb, off: off as u32, stride: stride as u32 }, rows as u32, cols as u32, &out).unwrap();
        rec.submit(None).unwrap();
        let got = plane_words(&out, 0, 2 * words);
        for row in 0..rows_pad {
            for c in 0..cols {
                let (h, l) = plane_halves(&got, words, row * cols + c);
                if row >= rows {
                    assert!(h == 0.0 && l == 0.0, "padding row {row} col {c}: {h} {l}");
                    continue;
                }
                let v = x[off + row * stride + c];
                let want_hi = f32::from_bits(v.to_bits() & 0xffff_e000);
                assert_eq!(h, want_hi, "row {row} col {c}: hi of {v}");
                let back = h as f64 + l as f64 / 4096.0;
                assert!((back - v as f64).abs() <= v.abs() as f64 * 2f64.powi(-20), "row {row} col {c}: {v} split into {h} + {l} / 4096");
            }
        }
    }
}

fn run_conv(r: &mut StdRng, coop: bool, cin: usize, t_in: usize, cout: usize, stride: usize, time_major: bool) {
    let Some(kern) = gemm_kernels(gpu(), coop, "conv_k3") else {
        return;
    };
    run_conv_with(&kern, r, cin, t_in, cout, stride, time_major, false, None);
}

/// The kernels that ran, sorted.
#[allow(clippy::too_many_arguments)]
/// `pad_k`: the weight given zero rows up to that K (conv_k3_cols).
fn run_conv_with(
    kern: &Kernels,
    r: &mut StdRng,
    cin: usize,
    t_in: usize,
    cout: usize,
    stride: usize,
    time_major: bool,
    accumulate: bool,
    pad_k: Option<usize>,
) -> Vec<&'static str> {
    let g = gpu();
    let coop = kern.uses_coop();
    let input = rand_vec(r, cin * t_in, 1.0); // channel-major [cin][t]
    let w = f16_round(&rand_vec(r, cout * cin * 3, 0.5));
    let b = rand_vec(r, cout, 0.5);
    let t_out = (t_in - 1) / stride + 1;
    let y0 = rand_vec(r, t_out * cout, 1.0);
    let (upload, cs, ts) = if time_major {
        let mut tm = vec![0.0f32; cin * t_in];
        for c in 0..cin {
            for t in 0..t_in {
                tm[t * cin + c] = input[c * t_in + t];
            }
        }
        (tm, 1, cin)
    } else {
        (input.clone(), t_in, 1)
    };
    let ib = g.upload_f32("in", &upload).unwrap();
    let kp = pad_k.unwrap_or(cin * 3);
    let mut wp = vec![0u16; cout * kp];
    for (row, src) in wp.chunks_mut(kp).zip(f16_bits(&w).chunks(cin * 3)) {
        row[..cin * 3].copy_from_slice(src);
    }
    let wm = F16Matrix::from_bits(g, "w", &wp, cout, kp).unwrap();
    let bb = g.upload_f32("b", &b).unwrap();
    let ob = poisoned(t_out * cout);
    if accumulate {
        g.write(&ob, 0, bytemuck::cast_slice(&y0));
    }
    let mut rec = g.recorder();
    let got_t = kern
        .conv_k3_cols(&mut rec, &ib, t_in as u32, cs as u32, ts as u32, stride as u32, &wm, (cin * 3) as u32, &bb, &ob, Epilogue { gelu: true, accumulate })
        .unwrap();
    let mut prof = Profile::default();
    rec.submit(Some(&mut prof)).unwrap();
    assert_eq!(got_t as usize, t_out);
    let got = g.read_f32(&ob, 0, t_out * cout).unwrap();
    let mut want = ops::conv1d_k3(&input, cin, t_in, &w, &b, cout, stride, true);
    if accumulate {
        want.iter_mut().zip(&y0).for_each(|(v, y)| *v += y);
    }
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "conv coop={coop} cin={cin} t={t_in} cout={cout} stride={stride} time_major={time_major} acc={accumulate}: rel err {e}");
    kernels_ran(&prof)
}

/// A convolution weight padded past its im2col columns (conv1 for the planes GEMM) is
/// refused where that GEMM does not run (the staged GEMMs would read past the channels).
#[test]
fn padded_conv_weight_needs_the_planes_gemm() {
    let g = gpu();
    let kern = Kernels::load(g).unwrap().without_coop();
    let wm = F16Matrix::from_bits(g, "w", &vec![0u16; 64 * 32], 64, 32).unwrap();
    let (ib, bb, ob) = (g.buffer("in", 10 * 70 * 4).unwrap(), g.buffer("b", 64 * 4).unwrap(), g.buffer("out", 70 * 64 * 4).unwrap());
    let err = kern.conv_k3_cols(&mut g.recorder(), &ib, 70, 70, 1, 1, &wm, 30, &bb, &ob, Epilogue::default());
    assert!(matches!(err, Err(Error::Invalid(_))), "{err:?}");
    assert_eq!(kern.conv_padded_k(30), None);
}

/// The planes writers refuse what they cannot hold, as errors: no planes reserved, planes
/// too small for the rows, a head size other than 64, partials that the splits overrun,
/// an odd row width, rows that do not fit their output.
#[test]
fn planes_writers_refuse_what_does_not_fit() {
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.planes = None;
    let (xb, yb, gb) = (g.buffer("x", 100 * 128 * 4).unwrap(), g.buffer("y", 100 * 128 * 4).unwrap(), g.buffer("g", 128 * 4).unwrap());
    let invalid = |r: Result<()>| assert!(matches!(r, Err(Error::Invalid(_))), "{r:?}");
    invalid(kern.layer_norm_planes_and_rows(&mut g.recorder(), &xb, 100, 128, &gb, &gb, 1e-5, &yb));
    let args = |hd: u32, heads: u32, tq: u32| AttentionArgs {
        q: Rows::at(&xb, 0, 128),
        k: Rows::at(&xb, 0, 128),
        v: Rows::at(&xb, 0, 128),
        out: Rows::new(&yb, 128),
        tq,
        tk: tq,
        heads,
        head_dim: hd,
        causal: None,
    };
    kern.blocked_partials = Some(g.buffer("partials", 100 * 2 * 4 * 66 * 4).unwrap());
    invalid(kern.merge_partials_into_planes(&mut g.recorder(), &args(64, 2, 100), 32));
    // Planes for 128 rows of 128 columns.
    kern.planes = Some(g.buffer("planes", 2 * 128 * 128 * 2).unwrap());
    invalid(kern.layer_norm_planes_and_rows(&mut g.recorder(), &xb, 100, 127, &gb, &gb, 1e-5, &yb));
    invalid(kern.layer_norm_planes_and_rows(&mut g.recorder(), &xb, 129, 128, &gb, &gb, 1e-5, &yb));
    invalid(kern.layer_norm_planes_and_rows(&mut g.recorder(), &xb, 100, 128, &gb, &gb, 1e-5, &gb));
    invalid(kern.merge_partials_into_planes(&mut g.recorder(), &args(32, 4, 100), 32));
    invalid(kern.merge_partials_into_planes(&mut g.recorder(), &args(64, 2, 129), 32));
    invalid(kern.merge_partials_into_planes(&mut g.recorder(), &args(64, 2, 100), 20));
    // And what fits is taken.
    kern.layer_norm_planes_and_rows(&mut g.recorder(), &xb, 100, 128, &gb, &gb, 1e-5, &yb).unwrap();
    kern.merge_partials_into_planes(&mut g.recorder(), &args(64, 2, 100), 32).unwrap();
}

/// The kernels a profiled submission ran, sorted.
fn kernels_ran(prof: &Profile) -> Vec<&'static str> {
    let mut ran: Vec<&'static str> = prof.stats().iter().map(|s| s.kernel).collect();
    ran.sort_unstable();
    ran
}

/// The convolution through gemm_planes.wgsl (split_f16.wgsl main_rows writes the im2col
/// rows as planes; conv2's shape: K a multiple of 32, cout of 64; conv1's: K padded to the
/// slice with zero weight rows), GELU and the residual, both input layouts and strides,
/// against the CPU; shapes it does not take stay on the staged GEMM. Runs where the device
/// has cooperative matrices (the H200).
#[test]
fn conv_k3_on_planes_matches_reference() {
    let mut r = rng("conv_k3_planes");
    let g = gpu();
    let Some(mut kern) = gemm_kernels(g, true, "conv_k3_planes") else {
        return;
    };
    kern.reserve_gemm_planes(g, 200, 384).unwrap();
    // (gemm_planes_f16 over 32-row tiles, 64-row where
    // VERBATIM_GEMM_NARROW=0)
    let narrow = ["gemm_planes_f16 (32-row tiles)", "split_f16_conv"];
    let planes = if kern.gemm_planes_narrow.is_some() { narrow.to_vec() } else { vec!["gemm_planes_f16", "split_f16_conv"] };
    assert_eq!(run_conv_with(&kern, &mut r, 32, 70, 64, 2, true, true, None), planes);
    assert_eq!(run_conv_with(&kern, &mut r, 64, 129, 128, 1, false, true, None), planes);
    assert_eq!(run_conv_with(&kern, &mut r, 96, 399, 64, 2, true, false, None), planes);
    // K padded to the slice (conv1: 240 -> 256): 30 -> 32, 240 -> 256 (channel-major, as the mel)
    assert_eq!(kern.conv_padded_k(30), Some(32));
    assert_eq!(run_conv_with(&kern, &mut r, 10, 70, 64, 2, true, true, Some(32)), planes);
    assert_eq!(run_conv_with(&kern, &mut r, 80, 190, 64, 1, false, false, Some(256)), planes);
    // cin x 3 not a multiple of 32, or more rows than the planes hold: gemm_coop.
    assert_eq!(run_conv_with(&kern, &mut r, 10, 70, 64, 2, true, true, None), ["conv_k3_coop_f16"]);
    assert_eq!(run_conv_with(&kern, &mut r, 64, 600, 64, 1, false, true, None), ["conv_k3_coop_f16"]);
}

#[test]
fn conv_k3_matches_reference() {
    let mut r = rng("conv_k3");
    // cout must be even (f16 pairs are packed along the outputs); the rest is awkward.
    for coop in [false, true] {
        run_conv(&mut r, coop, 5, 23, 8, 1, false);
        run_conv(&mut r, coop, 13, 70, 66, 2, true);
        run_conv(&mut r, coop, 3, 2, 10, 2, false);
        run_conv(&mut r, coop, 11, 129, 18, 1, true);
        run_conv(&mut r, coop, 26, 75, 34, 2, false);
    }
}

#[test]
fn layer_norm_matches_reference() {
    let mut r = rng("layer_norm");
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    for &(rows, cols) in &[(1, 7), (7, 83), (5, 384), (3, 1000)] {
        // A large common offset: the two-pass variance must not lose it.
        let x: Vec<f32> = rand_vec(&mut r, rows * cols, 2.0).iter().map(|v| v + 30.0).collect();
        let gm = rand_vec(&mut r, cols, 1.5);
        let bt = rand_vec(&mut r, cols, 0.5);
        let (xb, gb, bb) = (g.upload_f32("x", &x).unwrap(), g.upload_f32("g", &gm).unwrap(), g.upload_f32("b", &bt).unwrap());
        let yb = poisoned(rows * cols);
        let mut rec = g.recorder();
        kern.layer_norm(&mut rec, &xb, 0, rows as u32, cols as u32, &gb, &bb, &yb, 0, 1e-5).unwrap();
        rec.submit(None).unwrap();
        let got = g.read_f32(&yb, 0, rows * cols).unwrap();
        let want = ops::layer_norm(&x, rows, cols, &gm, &bt, 1e-5);
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "layer_norm {rows}x{cols}: rel err {e}");
    }
}

/// split_f16.wgsl's `main_norm_rows` (the LayerNorm writing a GEMM's planes) against
/// layernorm.wgsl's rows on the same device and the CPU: hi + lo / 2^12 within 2^-20 of the
/// rows' value, padding rows zero (output poisoned first); rows at an offset, widths past
/// one pass of the threads.
#[test]
fn layer_norm_into_planes_matches_layer_norm_rows() {
    let mut r = rng("layer_norm_planes");
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    // The same LayerNorms with the loads in loops (NORM_AHEAD = false): the same words.
    let mut looped = Kernels::load(g).unwrap();
    {
        use Access::{Read as R, ReadWrite as W};
        let src = switched(SPLIT_F16_SOURCE, "NORM_AHEAD", false).unwrap();
        assert!(src.contains("const NORM_AHEAD: bool = false;"));
        looped.norm_planes = g.kernel_entry("layernorm_planes_looped", &src, "main_norm_rows", &[R, W, R, R]).unwrap();
    }
    for &(rows, cols, off) in &[(7usize, 82usize, 0usize), (70, 384, 3 * 384), (3, 1030, 5), (5, 768, 1), (4, 766, 2)] {
        let rows_pad = rows.next_multiple_of(64);
        let x: Vec<f32> = rand_vec(&mut r, off + rows * cols, 2.0).iter().map(|v| v + 7.0).collect();
        let gm = rand_vec(&mut r, cols, 1.5);
        let bt = rand_vec(&mut r, cols, 0.5);
        let (xb, gb, bb) = (g.upload_f32("x", &x).unwrap(), g.upload_f32("g", &gm).unwrap(), g.upload_f32("b", &bt).unwrap());
        let yb = poisoned(rows * cols);
        let words = rows_pad * cols / 2;
        let out = g.buffer("planes", words as u64 * 8).unwrap();
        g.fill_u32(&out, 0x7e00_7e00);
        let mut rec = g.recorder();
        kern.layer_norm(&mut rec, &xb, off as u32, rows as u32, cols as u32, &gb, &bb, &yb, 0, 1e-5).unwrap();
        kern.layer_norm_f16_rows(&mut rec, &xb, off as u32, rows as u32, cols as u32, &gb, &bb, 1e-5, &out).unwrap();
        rec.submit(None).unwrap();
        let rows_f32 = g.read_f32(&yb, 0, rows * cols).unwrap();
        let want = ops::layer_norm(&x[off..], rows, cols, &gm, &bt, 1e-5);
        let e = rel_err(&rows_f32, &want);
        assert!(e < 1e-5, "layer_norm {rows}x{cols}: rel err {e}");
        let got = plane_words(&out, 0, 2 * words);
        let out_looped = g.buffer("planes, looped", words as u64 * 8).unwrap();
        g.fill_u32(&out_looped, 0x7e00_7e00);
        let mut rec = g.recorder();
        looped.layer_norm_f16_rows(&mut rec, &xb, off as u32, rows as u32, cols as u32, &gb, &bb, 1e-5, &out_looped).unwrap();
        rec.submit(None).unwrap();
        assert_eq!(plane_words(&out_looped, 0, 2 * words), got, "{rows}x{cols}: loads ahead against the loops");
        for row in 0..rows_pad {
            for c in 0..cols {
                let (h, l) = plane_halves(&got, words, row * cols + c);
                if row >= rows {
                    assert!(h == 0.0 && l == 0.0, "padding row {row} col {c}: {h} {l}");
                    continue;
                }
                let v = rows_f32[row * cols + c];
                let back = h as f64 + l as f64 / 4096.0;
                // (below 2^-14 hi is an f16 subnormal, on a grid of 2^-24: split_f16.wgsl's
                // planes hold such values to that absolute step, as the split's own do)
                assert!(
                    (back - v as f64).abs() <= v.abs() as f64 * 2f64.powi(-20) + 2f64.powi(-24),
                    "{rows}x{cols} row {row} col {c}: LayerNorm {v} split into {h} + {l} / 4096"
                );
            }
        }
        // main_norm_rows_out (rows from 0): the same planes and the same rows at once.
        let (x0, y2) = (g.upload_f32("x0", &x[off..]).unwrap(), poisoned(rows * cols));
        let planes2 = g.buffer("planes2", words as u64 * 8).unwrap();
        g.fill_u32(&planes2, NAN_BITS);
        kern.planes = Some(planes2.clone());
        let mut rec = g.recorder();
        kern.layer_norm_planes_and_rows(&mut rec, &x0, rows as u32, cols as u32, &gb, &bb, 1e-5, &y2).unwrap();
        rec.submit(None).unwrap();
        assert_eq!(plane_words(&planes2, 0, 2 * words), got, "{rows}x{cols}: planes with the rows");
        let rows2 = g.read_f32(&y2, 0, rows * cols).unwrap();
        assert!(rows2.iter().zip(&rows_f32).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows}x{cols}: rows with the planes");
    }
}

/// Q, K, V packed in one fused buffer [t][3·h·d] as the QKV projection writes them.
fn run_attention(r: &mut StdRng, tq: usize, tk: usize, heads: usize, d: usize, causal: Option<usize>) {
    run_attention_with(r, tq, tk, heads, d, causal, AttentionPath::Launcher);
}

/// Which attention kernel a test runs.
#[derive(Clone, Copy, PartialEq)]
enum AttentionPath {
    /// The one `Kernels::attention` picks (as without `VERBATIM_ATTENTION_TILED`).
    Launcher,
    /// `Kernels::attention` as with `VERBATIM_ATTENTION_TILED=1`.
    LauncherTiled,
    /// The general fallback (`attention_chunked`).
    Chunked,
    /// The register-blocked kernel (`attention_blocked`: ATTENTION_BLOCKED_SPLITS splits).
    Blocked,
    /// The register-blocked kernel with this many keys per split (`attention_blocked_keys`).
    BlockedKeys(u32),
    /// `Blocked` without partials reserved (one split, or as many as this many queries'
    /// worth of partials hold when Some).
    BlockedRoom(Option<usize>),
}

/// Returns the names of the kernels dispatched, sorted.
fn run_attention_with(
    r: &mut StdRng,
    tq: usize,
    tk: usize,
    heads: usize,
    d: usize,
    causal: Option<usize>,
    path: AttentionPath,
) -> Vec<&'static str> {
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.force_tiled_attention = path == AttentionPath::LauncherTiled;
    // Partials for the blocked kernel's key splits as GpuWhisper::load reserves them, poisoned:
    // a partial the merge reads but no split wrote shows as NaN.
    let room = match path {
        AttentionPath::BlockedRoom(room) => room,
        _ => Some(tq),
    };
    if let Some(queries) = room {
        kern.reserve_blocked_attention(g, queries as u32, heads as u32).unwrap();
        // (None reserved where the launcher would not pick the blocked kernel.)
        if let Some(part) = kern.blocked_partials.as_ref() {
            g.fill_u32(part, NAN_BITS);
        }
    }
    let hd = heads * d;
    let q = rand_vec(r, tq * hd, 1.0);
    let k = rand_vec(r, tk * hd, 1.0);
    let v = rand_vec(r, tk * hd, 1.0);
    // q in a fused [tq][3hd] buffer at column 0; k|v in a fused [tk][2hd] buffer.
    let mut qf = rand_vec(r, tq * 3 * hd, 1.0);
    for i in 0..tq {
        qf[i * 3 * hd..i * 3 * hd + hd].copy_from_slice(&q[i * hd..(i + 1) * hd]);
    }
    let mut kv = vec![0.0f32; tk * 2 * hd];
    for j in 0..tk {
        kv[j * 2 * hd..j * 2 * hd + hd].copy_from_slice(&k[j * hd..(j + 1) * hd]);
        kv[j * 2 * hd + hd..(j + 1) * 2 * hd].copy_from_slice(&v[j * hd..(j + 1) * hd]);
    }
    let qb = g.upload_f32("q", &qf).unwrap();
    let kvb = g.upload_f32("kv", &kv).unwrap();
    let ob = poisoned(tq * hd);
    let mut rec = g.recorder();
    let args = AttentionArgs {
            q: Rows::at(&qb, 0, 3 * hd),
            k: Rows::at(&kvb, 0, 2 * hd),
            v: Rows::at(&kvb, hd, 2 * hd),
            out: Rows::new(&ob, hd),
            tq: tq as u32,
            tk: tk as u32,
            heads: heads as u32,
            head_dim: d as u32,
            causal: causal.map(|c| c as u32),
    };
    match path {
        AttentionPath::Launcher | AttentionPath::LauncherTiled => kern.attention(&mut rec, &args).unwrap(),
        AttentionPath::Chunked => kern.attention_chunked(&mut rec, &args).unwrap(),
        AttentionPath::Blocked | AttentionPath::BlockedRoom(_) => kern.attention_blocked(&mut rec, &args).unwrap(),
        AttentionPath::BlockedKeys(sk) => kern.attention_blocked_keys(&mut rec, &args, sk).unwrap(),
    }
    let mut prof = Profile::default();
    rec.submit(Some(&mut prof)).unwrap();
    let got = g.read_f32(&ob, 0, tq * hd).unwrap();
    let want = ops::attention(&q, &k, &v, tq, tk, heads, d, causal);
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "attention tq={tq} tk={tk} h={heads} d={d} causal={causal:?}: rel err {e}");
    // The profile lists kernels by time, not in dispatch order.
    kernels_ran(&prof)
}

#[test]
fn attention_matches_reference() {
    let mut r = rng("attention");
    // Few queries: the decode kernel (keys in workgroup memory).
    run_attention(&mut r, 5, 37, 3, 20, None);
    run_attention(&mut r, 1, 1500, 6, 64, None);
    run_attention(&mut r, 2, 300, 2, 100, Some(297));
    run_attention(&mut r, 1, 150, 2, 64, None);
    run_attention(&mut r, 9, 9, 2, 100, Some(0));
    run_attention(&mut r, 3, 70, 4, 16, Some(67));
    run_attention(&mut r, 130, 131, 1, 8, Some(1));
    // head_dim 64 (the coalesced key loads): split + merge with a causal horizon, and
    // a split cut short by the keys.
    run_attention(&mut r, 3, 300, 3, 64, Some(297));
    run_attention(&mut r, 2, 530, 2, 64, None);
    // Last splits of one to three keys.
    run_attention(&mut r, 1, 514, 2, 64, None);
    run_attention(&mut r, 3, 260, 3, 64, Some(256));
    // Many queries: the blocked kernel (head_dim 64, no mask) and the tiled one (the rest):
    // partial chunks, partial workgroups, causal.
    run_attention(&mut r, 70, 45, 3, 64, None);
    run_attention(&mut r, 67, 100, 2, 24, Some(33));
    run_attention(&mut r, 129, 129, 2, 64, Some(0));
    // Encoder-sized key counts: lavapipe stops any loop past 65535 iterations per
    // invocation, which a naive per-dimension loop reaches here.
    run_attention(&mut r, 40, 1500, 2, 64, None);
    run_attention(&mut r, 12, 30, 2, 20, None);
    // The chunked fallback (any key count, head_dim up to 128).
    run_attention_with(&mut r, 3, 300, 2, 100, Some(297), AttentionPath::Chunked);
    run_attention_with(&mut r, 20, 70, 3, 36, None, AttentionPath::Chunked);
}

/// A verify pass's self-attention (`attention_rows`): `m` query rows from position `p0` of
/// a decoder's fused [pos][q|k|v] cache, causal; each row bit for bit what its query gets
/// alone from `attention` (a decode step: keys up to its own position), and all of them
/// the reference within rounding.
fn run_attention_rows(r: &mut StdRng, m: usize, p0: usize, heads: usize) {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let (d, hd) = (64, heads * 64);
    let (tk, s3) = (p0 + m, 3 * hd);
    let cache = rand_vec(r, tk * s3, 1.0);
    let cols = |c: usize, rows: std::ops::Range<usize>| -> Vec<f32> { rows.flat_map(|i| cache[i * s3 + c * hd..i * s3 + (c + 1) * hd].to_vec()).collect() };
    let cb = g.upload_f32("qkv cache", &cache).unwrap();
    fn args<'a>(cb: &'a wgpu::Buffer, out: &'a wgpu::Buffer, from: usize, rows: usize, heads: usize) -> AttentionArgs<'a> {
        let (hd, s3) = (heads * 64, heads * 192);
        AttentionArgs {
            q: Rows::at(cb, from * s3, s3),
            k: Rows::at(cb, hd, s3),
            v: Rows::at(cb, 2 * hd, s3),
            out: Rows::new(out, hd),
            tq: rows as u32,
            tk: (from + rows) as u32,
            heads: heads as u32,
            head_dim: 64,
            causal: Some(from as u32),
        }
    }
    let together = poisoned(m * hd);
    let mut rec = g.recorder();
    kern.attention_rows(&mut rec, &args(&cb, &together, p0, m, heads)).unwrap();
    rec.submit(None).unwrap();
    let got = g.read_f32(&together, 0, m * hd).unwrap();
    let want = ops::attention(&cols(0, p0..tk), &cols(1, 0..tk), &cols(2, 0..tk), m, tk, heads, d, Some(p0));
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "attention rows m={m} p0={p0} h={heads}: rel err {e}");
    for i in 0..m {
        let alone = poisoned(hd);
        let mut rec = g.recorder();
        kern.attention(&mut rec, &args(&cb, &alone, p0 + i, 1, heads)).unwrap();
        rec.submit(None).unwrap();
        let lone = g.read_f32(&alone, 0, hd).unwrap();
        for (c, (a, b)) in got[i * hd..(i + 1) * hd].iter().zip(&lone).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "attention rows m={m} p0={p0}: row {i} element {c} is {a}, alone {b}");
        }
    }
}

/// A verify pass's cross-attention through `attention_rows` (no mask: main_split_rows,
/// then main_merge): each of `m` rows bit for bit what its query alone gets from
/// `attention` (main_split and its merge, a decode step), all of them the reference within
/// rounding; outputs and partials poisoned first.
/// Cross-attention inputs (no mask, head_dim 64): `m` random query rows and `tk` key|value
/// rows interleaved as the decoder's encoder K|V, on the GPU, and the CPU's answer.
struct CrossCase {
    m: usize,
    tk: usize,
    heads: usize,
    q: Vec<f32>,
    kv: Vec<f32>,
    qb: Buffer,
    kvb: Buffer,
}

impl CrossCase {
    fn new(g: &Gpu, r: &mut StdRng, m: usize, tk: usize, heads: usize) -> CrossCase {
        let hd = heads * 64;
        let q = rand_vec(r, m * hd, 1.0);
        let kv = rand_vec(r, tk * 2 * hd, 1.0);
        CrossCase { m, tk, heads, qb: g.upload_f32("q", &q).unwrap(), kvb: g.upload_f32("k|v", &kv).unwrap(), q, kv }
    }

    /// Query rows `rows` through `attention_rows` (`pass`) or `attention` (a query a
    /// workgroup), the partials and the output poisoned first.
    fn run(&self, g: &Gpu, kern: &Kernels, rows: std::ops::Range<usize>, pass: bool) -> Vec<f32> {
        let hd = self.heads * 64;
        g.fill_u32(&kern.attention_partials, NAN_BITS);
        let out = poisoned(rows.len() * hd);
        let args = AttentionArgs {
            q: Rows::at(&self.qb, rows.start * hd, hd),
            k: Rows::at(&self.kvb, 0, 2 * hd),
            v: Rows::at(&self.kvb, hd, 2 * hd),
            out: Rows::new(&out, hd),
            tq: rows.len() as u32,
            tk: self.tk as u32,
            heads: self.heads as u32,
            head_dim: 64,
            causal: None,
        };
        let mut rec = g.recorder();
        match pass {
            true => kern.attention_rows(&mut rec, &args).unwrap(),
            false => kern.attention(&mut rec, &args).unwrap(),
        }
        rec.submit(None).unwrap();
        g.read_f32(&out, 0, rows.len() * hd).unwrap()
    }

    fn reference(&self) -> Vec<f32> {
        let hd = self.heads * 64;
        let col = |c: usize| -> Vec<f32> { (0..self.tk).flat_map(|j| self.kv[j * 2 * hd + c * hd..j * 2 * hd + (c + 1) * hd].to_vec()).collect() };
        ops::attention(&self.q, &col(0), &col(1), self.m, self.tk, self.heads, 64, None)
    }
}

fn run_cross_rows(r: &mut StdRng, m: usize, tk: usize, heads: usize) {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let hd = heads * 64;
    let case = CrossCase::new(g, r, m, tk, heads);
    let got = case.run(g, &kern, 0..m, true);
    let e = rel_err(&got, &case.reference());
    assert!(e < 1e-5, "cross-attention rows m={m} tk={tk} h={heads}: rel err {e}");
    for i in 0..m {
        let lone = case.run(g, &kern, i..i + 1, false);
        for (c, (a, b)) in got[i * hd..(i + 1) * hd].iter().zip(&lone).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "cross-attention rows m={m} tk={tk}: row {i} element {c} is {a}, alone {b}");
        }
    }
}

#[test]
fn attention_rows_equal_lone_queries() {
    let mut r = rng("attention_rows");
    let most = VERIFY_MAX_ROWS as usize;
    // Unmasked (cross-attention): groups of four rows with a short last one, a last split
    // of one key and of 220 (tiny.en's 1500 frames); one row alone in its group.
    run_cross_rows(&mut r, 6, 513, 2);
    run_cross_rows(&mut r, 1, 300, 1);
    run_cross_rows(&mut r, most, 1500, 3);
    // Keys in one split for every row; a pass whose last rows cross into a second split
    // (256 keys a split) while its first rows' steps alone have one; every row split.
    run_attention_rows(&mut r, most, 21, 3);
    run_attention_rows(&mut r, 13, 250, 2);
    run_attention_rows(&mut r, most, 300, 1);
    // More rows than a verify pass: an error, not another kernel's bits.
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let buf = poisoned(64 * 3 * (most + 1));
    let args = AttentionArgs {
        q: Rows::new(&buf, 192),
        k: Rows::at(&buf, 64, 192),
        v: Rows::at(&buf, 128, 192),
        out: Rows::new(&buf, 64),
        tq: most as u32 + 1,
        tk: most as u32 + 1,
        heads: 1,
        head_dim: 64,
        causal: Some(0),
    };
    let mut rec = g.recorder();
    assert!(kern.attention_rows(&mut rec, &args).is_err());
    assert!(rec.is_empty());
}

/// The encoder's self-attention as the encoder calls it: Q, K and V side by side in one
/// fused [t][3·h·64] buffer (the QKV projection's output, at a row offset), no mask. Where
/// the device has cooperative matrices that takes attention_coop.wgsl (head planes split
/// first, key splits of 384 merged after); elsewhere the blocked kernel. Returns the kernels
/// dispatched, sorted.
fn run_attention_fused_with(kern: Kernels, r: &mut StdRng, t: usize, heads: usize) -> Vec<&'static str> {
    let (ran, e) = run_attention_sharpened(kern, r, t, heads, false);
    assert!(e < 1e-5, "fused attention t={t} h={heads}: rel err {e}");
    ran
}

/// As [`run_attention_fused_with`], returning the relative error; `sharp` scales each key
/// by 0.3 at the start of its key split to 12 at the end (a sawtooth over attention_coop's
/// splits), so a row's running max climbs by tens across a split's blocks and main_held
/// must move its scale several times.
fn run_attention_sharpened(mut kern: Kernels, r: &mut StdRng, t: usize, heads: usize, sharp: bool) -> (Vec<&'static str>, f64) {
    let g = gpu();
    kern.reserve_blocked_attention(g, t as u32, heads as u32).unwrap();
    if let Some(part) = kern.blocked_partials.as_ref() {
        g.fill_u32(part, NAN_BITS);
    }
    if let Some(planes) = kern.head_planes.as_ref() {
        g.fill_u32(planes, NAN_BITS);
    }
    let (d, hd) = (64, heads * 64);
    let (off, stride) = (5 * 3 * hd, 3 * hd); // five rows of something else first
    let mut qkv = rand_vec(r, off + t * stride, 1.5);
    if sharp {
        sharpen_keys(&mut qkv, t, off + hd, stride, hd);
    }
    let part = |c: usize| -> Vec<f32> { (0..t).flat_map(|i| qkv[off + i * stride + c * hd..off + i * stride + (c + 1) * hd].to_vec()).collect() };
    let (q, k, v) = (part(0), part(1), part(2));
    let qb = g.upload_f32("qkv", &qkv).unwrap();
    let ob = poisoned(t * hd);
    let args = AttentionArgs {
        q: Rows::at(&qb, off, stride),
        k: Rows::at(&qb, off + hd, stride),
        v: Rows::at(&qb, off + 2 * hd, stride),
        out: Rows::new(&ob, hd),
        tq: t as u32,
        tk: t as u32,
        heads: heads as u32,
        head_dim: d as u32,
        causal: None,
    };
    let mut rec = g.recorder();
    kern.attention(&mut rec, &args).unwrap();
    let mut prof = Profile::default();
    rec.submit(Some(&mut prof)).unwrap();
    let got = g.read_f32(&ob, 0, t * hd).unwrap();
    let want = ops::attention(&q, &k, &v, t, t, heads, d, None);
    // (infinite where a value is not finite, which rel_err refuses outright)
    let e = if got.iter().all(|x| x.is_finite()) { rel_err(&got, &want) } else { f64::INFINITY };
    (kernels_ran(&prof), e)
}

/// Keys of t rows of `hd` dims in `qkv` (row stride `stride`, keys at `k_off`) scaled by the
/// sawtooth of [`run_attention_sharpened`]: 0.3 at the start of each of attention_coop's
/// key splits to 12 at its end.
fn sharpen_keys(qkv: &mut [f32], t: usize, k_off: usize, stride: usize, hd: usize) {
    let split = super::ATTENTION_COOP_SPLIT_KEYS as usize;
    for i in 0..t {
        let c = 0.3 + 11.7 * (i % split) as f32 / (split.min(t) - 1) as f32;
        qkv[k_off + i * stride..k_off + i * stride + hd].iter_mut().for_each(|x| *x *= c);
    }
}

/// attention_coop.wgsl's `main_held` as arithmetic on the CPU, a query row at a time: Q
/// (scaled by 1/8), K, V and P as f16 hi/lo halves (f16_split.wgsl's split), scores and
/// P·V as hi·hi + (hi·lo + lo·hi) / 2^12 in f32, blocks of 32 keys in splits of `split`,
/// P·V held across blocks and rescaled only where a block's max passes the row's scale by
/// more than `headroom`; the splits merged as attention.wgsl's main_merge does. Returns the
/// rows ([t][heads * 64]) and how many times a row moved its scale after a split's first
/// block.
fn held_attention_model(q: &[f32], k: &[f32], v: &[f32], t: usize, heads: usize, split: usize, headroom: f32) -> (Vec<f32>, usize) {
    let hd = heads * 64;
    let halves = |x: f32| -> (f32, f32) {
        let hi = f32::from_bits(x.to_bits() & 0xffff_e000);
        (f16::from_f32(hi).to_f32(), f16::from_f32((x - hi) * 4096.0).to_f32())
    };
    let plane = |m: &[f32], scale: f32| -> Vec<(f32, f32)> { m.iter().map(|&x| halves(x * scale)).collect() };
    let (qp, kp, vp) = (plane(q, 0.125), plane(k, 1.0), plane(v, 1.0));
    let mut out = vec![0f32; t * hd];
    let mut moves = 0;
    for h in 0..heads {
        for i in 0..t {
            let qr = &qp[i * hd + h * 64..i * hd + h * 64 + 64];
            let mut parts = Vec::new(); // (m, l, o) a split
            for j_begin in (0..t).step_by(split) {
                let j_end = (j_begin + split).min(t);
                let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
                let (mut oh, mut ol) = (vec![0f32; 64], vec![0f32; 64]);
                for j0 in (j_begin..j_end).step_by(32) {
                    let keys = j0..(j0 + 32).min(j_end);
                    let s: Vec<f32> = keys
                        .clone()
                        .map(|j| {
                            let kr = &kp[j * hd + h * 64..j * hd + h * 64 + 64];
                            let sh: f32 = qr.iter().zip(kr).map(|(a, b)| a.0 * b.0).sum();
                            let sl: f32 = qr.iter().zip(kr).map(|(a, b)| a.0 * b.1 + a.1 * b.0).sum();
                            sh + sl / 4096.0
                        })
                        .collect();
                    let bm = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let mut mn = m;
                    if j0 == j_begin {
                        mn = bm;
                    } else if bm > m + headroom {
                        mn = bm;
                        moves += 1;
                        let alpha = (m - mn).exp();
                        for c in 0..64 {
                            oh[c] = (oh[c] + ol[c] / 4096.0) * alpha;
                            ol[c] = 0.0;
                        }
                        l *= alpha;
                    }
                    m = mn;
                    for (jj, j) in keys.enumerate() {
                        let e = (s[jj] - m).exp();
                        l += e;
                        let (ph, pl) = halves(e);
                        let vr = &vp[j * hd + h * 64..j * hd + h * 64 + 64];
                        for c in 0..64 {
                            oh[c] += ph * vr[c].0;
                            ol[c] += ph * vr[c].1 + pl * vr[c].0;
                        }
                    }
                }
                parts.push((m, l, (0..64).map(|c| oh[c] + ol[c] / 4096.0).collect::<Vec<f32>>()));
            }
            let mx = parts.iter().map(|p| p.0).fold(f32::NEG_INFINITY, f32::max);
            let den: f32 = parts.iter().map(|p| (p.0 - mx).exp() * p.1).sum();
            for c in 0..64 {
                let num: f32 = parts.iter().map(|p| (p.0 - mx).exp() * p.2[c]).sum();
                out[i * hd + h * 64 + c] = num / den;
            }
        }
    }
    (out, moves)
}

/// The arithmetic of main_held (its headroom read from the kernel's source) against the
/// plain attention on keys that sharpen across each split, on any machine (the kernel itself
/// runs only where cooperative matrices are: attention_coop_matches_reference): within
/// 1e-5, with scales moved along the way; never moving them (P past f16), or a headroom past
/// what P's lo half holds (P's halves past f16), gives values that are not finite.
#[test]
fn held_attention_arithmetic_matches_reference() {
    let mut r = rng("held_model");
    let src = super::ATTENTION_COOP_SOURCE;
    let line = src.lines().find(|l| l.starts_with("const HEADROOM: f32 = ")).expect("HEADROOM in attention_coop.wgsl");
    let headroom: f32 = line.trim_start_matches("const HEADROOM: f32 = ").trim_end_matches(';').parse().unwrap();
    let (t, heads) = (1500, 1);
    let hd = heads * 64;
    let mut qkv = rand_vec(&mut r, t * 3 * hd, 1.5);
    sharpen_keys(&mut qkv, t, hd, 3 * hd, hd);
    let col = |w: usize| -> Vec<f32> { (0..t).flat_map(|i| qkv[i * 3 * hd + w * hd..i * 3 * hd + (w + 1) * hd].to_vec()).collect() };
    let (q, k, v) = (col(0), col(1), col(2));
    let want = ops::attention(&q, &k, &v, t, t, heads, 64, None);
    let split = super::ATTENTION_COOP_SPLIT_KEYS as usize;
    let (got, moves) = held_attention_model(&q, &k, &v, t, heads, split, headroom);
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "main_held's arithmetic: rel err {e}");
    assert!(moves > t / 4, "only {moves} scales moved over {t} rows");
    for bad in [1.0e30f32, 12.0] {
        let (got, _) = held_attention_model(&q, &k, &v, t, heads, split, bad);
        assert!(got.iter().any(|x| !x.is_finite()), "headroom {bad}: every value finite");
    }
}

/// The encoder's self-attention on tensor cores (attention_coop.wgsl) against the CPU on the
/// H200: a partial query tile, a partial last key block, several key splits with a short
/// last one (1500 = 3 x 384 + 348), one head and several, planes and partials poisoned
/// first; each shape of the kernel (4 subgroups x 32-dim rounds, shipped; 2 x 32; 2 x 64;
/// 4 x 64), each also on keys that sharpen across their split (main_held's test below
/// holds its shapes the same way). Where the device has no cooperative matrices (lavapipe)
/// the same calls take the blocked kernel and are held to the same reference.
#[test]
fn attention_coop_matches_reference() {
    let mut r = rng("attention_coop");
    // Each shape of the kernel (subgroups x dims a P·V round): the shipped one and the lab's.
    for (nsg, od, name) in [
        (4, 32, "attention_coop"),
        (2, 32, "attention_coop (2 subgroups, 32-dim rounds)"),
        (2, 64, "attention_coop (2 subgroups, 64-dim rounds)"),
        (4, 64, "attention_coop (64-dim rounds)"),
    ] {
        check_attention_coop_shape(&mut r, nsg, od, false, name);
    }
}

/// main_held (P·V's accumulators held over a key split): first a table of its error on
/// plain keys of several lengths beside main's and beside its own without rescales (where
/// the fault lies), then three shapes as main's test holds main's, then shown wrong without
/// its rescales on the sharpened keys. Ignored: on the lent H100 main_held failed
/// its first case (t = 37, rel err 1.4) and every transcript differed (bench/RESULTS.md,
/// 2026-12-08); it is off by default. Run it with `--ignored` where cooperative matrices
/// are, while finding the fault (on lavapipe it checks only the blocked kernel).
#[test]
#[ignore = "attention_coop's main_held is wrong on the GPU (bench/RESULTS.md, 2026-12-08) and off"]
fn attention_coop_held_matches_reference() {
    let mut r = rng("attention_coop_held");
    let g = gpu();
    let coop = Kernels::load(g).unwrap().attention_coop.is_some();
    let still = || {
        let src = rewrite_source("attention_coop.wgsl", &super::attention_coop_source(4, 32).unwrap(), &[("const HEADROOM: f32 = 8.0;", "const HEADROOM: f32 = 1.0e30;")]).unwrap();
        let mut kern = Kernels::load(g).unwrap();
        kern.attention_coop = Some(g.kernel_entry("attention_coop_held (no rescale)", &src, "main_held", &[Access::Read, Access::ReadWrite]).unwrap());
        kern
    };
    if coop {
        // Where the fault is, in one run: plain keys (no scale should move) over one block
        // (16, 32 keys), two (33, 64), a split's worth (384), more splits (385, 1500), for
        // main, main_held and main_held that never rescales; all printed, then asserted.
        let mut errs = Vec::new();
        for t in [16, 32, 33, 64, 384, 385, 1500] {
            let main = run_attention_sharpened(Kernels::load(g).unwrap().with_attention_coop_kernel(g, 4, 32, false).unwrap(), &mut r, t, 1, false).1;
            let held = run_attention_sharpened(Kernels::load(g).unwrap().with_attention_coop_kernel(g, 4, 32, true).unwrap(), &mut r, t, 1, false).1;
            let held_still = run_attention_sharpened(still(), &mut r, t, 1, false).1;
            eprintln!("t={t:4}: main {main:.2e}, main_held {held:.2e}, main_held without rescales {held_still:.2e}");
            errs.push((t, main, held, held_still));
        }
        assert!(errs.iter().all(|&(_, a, b, c)| a < 1e-5 && b < 1e-5 && c < 1e-5), "plain keys, rel err (t, main, held, held without rescales): {errs:?}");
    }
    for (nsg, od, name) in [
        (4, 32, "attention_coop_held"),
        (2, 32, "attention_coop_held (2 subgroups, 32-dim tile)"),
        (4, 64, "attention_coop_held (64-dim tile)"),
    ] {
        check_attention_coop_shape(&mut r, nsg, od, true, name);
    }
    // The sharpened keys do reach the rescale: main_held that never moves a row's scale
    // (its headroom rewritten to 1e30) is wrong on them (P past f16, or its scale wrong).
    if coop {
        let (ran, e) = run_attention_sharpened(still(), &mut r, 1500, 1, true);
        assert!(ran.contains(&"attention_coop_held (no rescale)"));
        assert!(!(e < 1e-3), "main_held without rescales: rel err {e} on sharpened keys");
    }
}

/// One shape of attention_coop.wgsl (`main` or `main_held`) against the CPU: the encoder's
/// calls of three lengths, tiny.en's 1500 frames, and keys that sharpen across each split
/// (main_held's rescales). Where the device has no cooperative matrices the blocked kernel
/// runs instead (its sharpened keys only for the shipped shape's name: once).
fn check_attention_coop_shape(r: &mut StdRng, nsg: u32, od: u32, held: bool, name: &str) {
    let g = gpu();
    let coop = Kernels::load(g).unwrap().attention_coop.is_some();
    let want: Vec<&str> = if coop { vec![name, "attention_merge", "split_f16_heads"] } else { vec!["attention_blocked", "attention_merge"] };
    let kern = || Kernels::load(g).unwrap().with_attention_coop_kernel(g, nsg, od, held).unwrap();
    for (t, heads) in [(37, 3), (70, 2), (300, 2)] {
        let mut ran = run_attention_fused_with(kern(), r, t, heads);
        ran.sort_unstable();
        let mut w = want.clone();
        w.sort_unstable();
        assert_eq!(ran, w, "t={t} heads={heads}, {nsg} x {od}");
    }
    if coop {
        // (lavapipe: the blocked kernel on this shape is in attention_blocked_matches_reference)
        assert_eq!(run_attention_fused_with(kern(), r, 1500, 1).len(), 3);
    }
    if !coop && name != "attention_coop" {
        return;
    }
    for (t, heads) in [(300, 2), (1500, 1)] {
        let (_, e) = run_attention_sharpened(kern(), r, t, heads, true);
        assert!(e < 1e-5, "sharpened keys t={t} h={heads}, {name}: rel err {e}");
    }
}

/// attention.wgsl's main_merge_planes: key splits' partials (written by the blocked kernel,
/// the coop kernel's format) merged into the GEMM planes, against main_merge's rows of the
/// same partials split by split_f16: the same words, padding rows zero, and hi + lo / 2^12
/// within 1e-5 of the CPU's attention (planes poisoned first). Splits of whole blocks, one
/// starting inside a block, a short last one; runs on lavapipe too.
#[test]
fn attention_merged_into_planes_matches_the_split() {
    let mut r = rng("merge_planes");
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    let half = |w: u32, i: usize| half::f16::from_bits((w >> (16 * i)) as u16).to_f32() as f64;
    // The merge with its loops (MERGE_ONE_TRIP = false): the same words.
    let mut looped = Kernels::load(g).unwrap();
    {
        use Access::{Read as R, ReadWrite as W};
        let src = switched(ATTENTION_SOURCE, "MERGE_ONE_TRIP", false).unwrap();
        assert!(src.contains("const MERGE_ONE_TRIP: bool = false;"));
        looped.attention_merge_planes = g.kernel_entry("attention_merge_planes_looped", &src, "main_merge_planes", &[R, R, R, W, W]).unwrap();
    }
    // Three, four and seven splits (past the one trip's four).
    for &(t, heads, split_keys) in &[(70usize, 2usize, 32u32), (37, 3, 10), (129, 1, 45), (70, 1, 10)] {
        let (hd, t_pad) = (heads * 64, t.next_multiple_of(64));
        let plane = t_pad * hd / 2;
        kern.reserve_blocked_attention(g, t as u32, heads as u32).unwrap();
        if kern.blocked_partials.as_ref().is_none_or(|b| b.size() < (t * heads * t.div_ceil(split_keys as usize) * 66 * 4) as u64) {
            kern.blocked_partials = Some(g.buffer("partials", (t * heads * t.div_ceil(split_keys as usize) * 66 * 4) as u64).unwrap());
        }
        let planes = g.buffer("planes", (2 * plane * 4) as u64).unwrap();
        kern.planes = Some(planes.clone());
        let qkv = rand_vec(&mut r, t * 3 * hd, 1.0);
        let col = |which: usize| -> Vec<f32> { (0..t).flat_map(|i| qkv[i * 3 * hd + which * hd..i * 3 * hd + (which + 1) * hd].to_vec()).collect() };
        let qb = g.upload_f32("qkv", &qkv).unwrap();
        let ob = poisoned(t * hd);
        let args = AttentionArgs {
            q: Rows::at(&qb, 0, 3 * hd),
            k: Rows::at(&qb, hd, 3 * hd),
            v: Rows::at(&qb, 2 * hd, 3 * hd),
            out: Rows::new(&ob, hd),
            tq: t as u32,
            tk: t as u32,
            heads: heads as u32,
            head_dim: 64,
            causal: None,
        };
        g.fill_u32(&planes, NAN_BITS);
        let mut rec = g.recorder();
        kern.attention_blocked_keys(&mut rec, &args, split_keys).unwrap();
        kern.merge_partials_into_planes(&mut rec, &args, split_keys).unwrap();
        rec.submit(None).unwrap();
        let got = plane_words(&planes, 0, 2 * plane);
        g.fill_u32(&planes, NAN_BITS);
        looped.planes = Some(planes.clone());
        looped.blocked_partials = kern.blocked_partials.clone();
        let mut rec = g.recorder();
        looped.merge_partials_into_planes(&mut rec, &args, split_keys).unwrap();
        rec.submit(None).unwrap();
        assert_eq!(got, plane_words(&planes, 0, 2 * plane), "one trip against the loops, t={t} heads={heads} split {split_keys}");
        g.fill_u32(&planes, NAN_BITS);
        let mut rec = g.recorder();
        kern.split_into_planes(&mut rec, Rows::new(&ob, hd), t as u32, hd as u32).unwrap();
        rec.submit(None).unwrap();
        assert_eq!(got, plane_words(&planes, 0, 2 * plane), "merged planes against rows + split, t={t} heads={heads} split {split_keys}");
        let want = ops::attention(&col(0), &col(1), &col(2), t, t, heads, 64, None);
        for row in 0..t_pad {
            for c in 0..hd {
                let wi = row * hd / 2 + c / 2;
                let v = half(got[wi], c % 2) + half(got[plane + wi], c % 2) / 4096.0;
                if row >= t {
                    assert_eq!(v, 0.0, "padding row {row} col {c}");
                } else {
                    let w = want[row * hd + c] as f64;
                    assert!((v - w).abs() <= 1e-5 * (1.0 + w.abs()), "t={t} row {row} col {c}: {v} against {w}");
                }
            }
        }
    }
}

/// The register-blocked encoder attention (head_dim 64, no causal mask), called directly so
/// that `VERBATIM_ATTENTION_TILED` cannot send it to the tiled kernel: partial query tiles
/// (rows past tq unwritten) and partial key blocks (keys past tk uncounted) of its 32 x 32
/// tiles, a single key, fewer queries than a tile, and the encoder's 1500 keys (47 blocks:
/// the online softmax's rescaling, and lavapipe's loop cap); then its key splits merged by
/// `main_merge`, partials poisoned: 1 to 8 splits, a last split of one key or of a partial
/// block, splits that start inside a block (keys per split not a multiple of 32), and fewer
/// splits where the reserved partials do not hold the ones asked for.
#[test]
fn attention_blocked_matches_reference() {
    let mut r = rng("attention_blocked");
    let b = AttentionPath::Blocked;
    let one = ["attention_blocked"];
    let merged = ["attention_blocked", "attention_merge"];
    // ATTENTION_BLOCKED_SPLITS (4) asked for: 77 keys in 3 splits (32 + 32 + 13), 33 in 2
    // (32 + 1), 1 and 32 in one (no merge), 1500 in 4 (3 x 384 + 348).
    assert_eq!(run_attention_with(&mut r, 70, 77, 3, 64, None, b), merged);
    assert_eq!(run_attention_with(&mut r, 129, 33, 3, 64, None, b), merged);
    assert_eq!(run_attention_with(&mut r, 65, 1, 3, 64, None, b), one);
    assert_eq!(run_attention_with(&mut r, 5, 40, 2, 64, None, b), merged);
    assert_eq!(run_attention_with(&mut r, 32, 32, 1, 64, None, b), one);
    assert_eq!(run_attention_with(&mut r, 33, 1500, 2, 64, None, b), merged);
    // Keys per split given: 1 split (exactly tk, more than tk), 2 (32 + 1), 3 (96 + 96 + 8),
    // 4 (3 x 32 + 4), 8 (7 x 192 + 156), and splits that start inside a block: 77 keys as
    // 20 + 20 + 20 + 17, 9 as 3 x 3.
    let bk = AttentionPath::BlockedKeys;
    assert_eq!(run_attention_with(&mut r, 70, 77, 3, 64, None, bk(77)), one);
    assert_eq!(run_attention_with(&mut r, 37, 45, 2, 64, None, bk(1000)), one);
    assert_eq!(run_attention_with(&mut r, 40, 33, 2, 64, None, bk(32)), merged);
    assert_eq!(run_attention_with(&mut r, 40, 200, 2, 64, None, bk(attention_blocked_split_keys(200, 3))), merged);
    assert_eq!(run_attention_with(&mut r, 65, 100, 2, 64, None, bk(32)), merged);
    assert_eq!(run_attention_with(&mut r, 33, 1500, 1, 64, None, bk(attention_blocked_split_keys(1500, 8))), merged);
    assert_eq!(run_attention_with(&mut r, 37, 77, 2, 64, None, bk(20)), merged);
    assert_eq!(run_attention_with(&mut r, 5, 9, 1, 64, None, bk(3)), merged);
    // Where the partials do not hold the splits asked for: none reserved (one split), room
    // for 4 when 26 are asked for (77 keys as 32 + 32 + 13), room for 2 when 4 are (64 + 13).
    let room = AttentionPath::BlockedRoom;
    assert_eq!(run_attention_with(&mut r, 40, 77, 2, 64, None, room(None)), one);
    assert_eq!(run_attention_with(&mut r, 40, 77, 2, 64, None, bk(3)), merged);
    assert_eq!(run_attention_with(&mut r, 40, 77, 2, 64, None, room(Some(20))), merged);
    // The launcher sends the encoder's shape there (in splits), and to the tiled kernel
    // when told to (which is then still right on that shape).
    let ran = run_attention_with(&mut r, 40, 45, 2, 64, None, AttentionPath::Launcher);
    assert_eq!(ran, merged);
    let ran = run_attention_with(&mut r, 40, 1500, 2, 64, None, AttentionPath::LauncherTiled);
    assert_eq!(ran, ["attention_tiled"]);
    let ran = run_attention_with(&mut r, 70, 45, 3, 64, None, AttentionPath::LauncherTiled);
    assert_eq!(ran, ["attention_tiled"]);
    // With workgroups enough for the tiled kernel (41 query tiles x 8 heads), that one.
    let ran = run_attention_with(&mut r, 1300, 45, 8, 64, None, AttentionPath::Launcher);
    assert_eq!(ran, ["attention_tiled"]);
}

/// Cross-attention whose key splits the output projection merges (`attention_unmerged`,
/// then `linear_merged`): against attention + linear on the CPU, and each row bit-identical
/// to the same query alone as a decode step takes it (a verify pass, main_split_rows where
/// the shape has it, against main_split a query).
#[allow(clippy::too_many_arguments)]
fn run_merged(r: &mut StdRng, tq: usize, tk: usize, heads: usize, d: usize, n: usize, bias: bool, accumulate: bool) {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let hd = heads * d;
    let q = rand_vec(r, tq * hd, 1.0);
    let k = rand_vec(r, tk * hd, 1.0);
    let v = rand_vec(r, tk * hd, 1.0);
    let mut kv = vec![0.0f32; tk * 2 * hd];
    for j in 0..tk {
        kv[j * 2 * hd..j * 2 * hd + hd].copy_from_slice(&k[j * hd..(j + 1) * hd]);
        kv[j * 2 * hd + hd..(j + 1) * 2 * hd].copy_from_slice(&v[j * hd..(j + 1) * hd]);
    }
    let w = f16_round(&rand_vec(r, n * hd, 0.5));
    let b = rand_vec(r, n, 0.5);
    let y0 = rand_vec(r, tq * n, 1.0);
    let qb = g.upload_f32("q", &q).unwrap();
    let kvb = g.upload_f32("kv", &kv).unwrap();
    let wm = F16Matrix::from_bits(g, "w", &f16_bits(&w), n, hd).unwrap();
    let bb = g.upload_f32("b", &b).unwrap();
    let unused = poisoned(tq * hd);
    let ep = Epilogue { gelu: false, accumulate };
    let run = |rows: std::ops::Range<usize>, pass: bool| -> Vec<f32> {
        let m = rows.len();
        let yb = poisoned(m * n);
        if accumulate {
            g.write(&yb, 0, bytemuck::cast_slice(&y0[rows.start * n..rows.end * n]));
        }
        let mut rec = g.recorder();
        let args = AttentionArgs {
            q: Rows::at(&qb, rows.start * hd, hd),
            k: Rows::at(&kvb, 0, 2 * hd),
            v: Rows::at(&kvb, hd, 2 * hd),
            out: Rows::new(&unused, hd),
            tq: m as u32,
            tk: tk as u32,
            heads: heads as u32,
            head_dim: d as u32,
            causal: None,
        };
        let splits = kern.attention_unmerged(&mut rec, &args, pass).unwrap().expect("left unmerged");
        kern.linear_merged(&mut rec, m as u32, heads as u32, d as u32, splits, &wm, bias.then_some(&bb), Rows::new(&yb, n), ep)
            .unwrap();
        rec.submit(None).unwrap();
        g.read_f32(&yb, 0, m * n).unwrap()
    };
    let got = run(0..tq, true);
    let att = ops::attention(&q, &k, &v, tq, tk, heads, d, None);
    let mut want = ops::linear(&att, tq, hd, &w, n, bias.then_some(&b[..]));
    epilogue_ref(&mut want, false, accumulate, &y0);
    let e = rel_err(&got, &want);
    assert!(e < 1e-5, "merged attention tq={tq} tk={tk} h={heads} d={d} n={n}: rel err {e}");
    for i in 0..tq {
        let lone = run(i..i + 1, false);
        let same = lone.iter().zip(&got[i * n..(i + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "merged attention: row {i} of {tq} differs from the query alone");
    }
}

#[test]
fn attention_merged_into_the_projection_matches_reference() {
    let mut r = rng("attention_merged");
    run_merged(&mut r, 1, 1500, 6, 64, 384, true, true);
    // small.en's row (12 heads): 768 values, three for some threads of the merge.
    run_merged(&mut r, 2, 1500, 12, 64, 70, true, false);
    run_merged(&mut r, 3, 530, 2, 20, 46, false, false);
    run_merged(&mut r, 8, 300, 4, 16, 66, true, false);
    // A verify pass's most rows (past the prompt GEMV's eight).
    run_merged(&mut r, VERIFY_MAX_ROWS as usize, 520, 3, 64, 70, true, true);
    // main_split_rows' groups of four with a short last group (7 and 13 rows), over
    // tiny.en's 1500 frames and 6 heads (a last split of 220 keys) and over a last split of
    // 9 keys.
    run_merged(&mut r, 7, 1500, 6, 64, 384, false, false);
    run_merged(&mut r, 13, 777, 2, 64, 96, true, false);
    // More than eight splits (2300 keys: nine): the merge's loop rather than its unrolled
    // loads.
    run_merged(&mut r, 1, 2300, 2, 64, 128, true, false);
    // A projection over 8 MiB: the merge stays in main_m1 at any size.
    run_merged(&mut r, 2, 700, 20, 64, 4098, false, true);
    // Keys in one split: nothing to merge, the attention runs whole.
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let buf = poisoned(64 * 6);
    let mut rec = g.recorder();
    let args = AttentionArgs {
        q: Rows::new(&buf, 64),
        k: Rows::new(&buf, 64),
        v: Rows::new(&buf, 64),
        out: Rows::new(&buf, 64),
        tq: 1,
        tk: 100,
        heads: 1,
        head_dim: 64,
        causal: None,
    };
    assert_eq!(kern.attention_unmerged(&mut rec, &args, true).unwrap(), None);
    // More than a prompt's eight queries split only as a verify pass's rows.
    let nine = poisoned(9 * 64 * 2);
    let rows9 = AttentionArgs { q: Rows::new(&nine, 64), tq: 9, tk: 300, ..args };
    assert_eq!(kern.attention_unmerged(&mut rec, &rows9, false).unwrap(), None);
    assert_eq!(kern.attention_unmerged(&mut rec, &rows9, true).unwrap(), Some(2));
    let too_many = AttentionArgs { tq: VERIFY_MAX_ROWS + 1, ..rows9 };
    assert!(kern.attention_rows(&mut rec, &too_many).is_err());
    // Shapes the merge cannot take are errors, not wrong outputs: no rows, a width that is
    // not heads x head_dim, too many (head, split) pairs, more rows than a verify pass.
    let w = F16Matrix::from_bits(g, "w", &vec![0u16; 8 * 64], 8, 64).unwrap();
    let y = poisoned((VERIFY_MAX_ROWS as usize + 1) * 8);
    let ep = Epilogue::default();
    assert!(kern.linear_merged(&mut rec, 0, 1, 64, 2, &w, None, Rows::new(&y, 8), ep).is_err());
    assert!(kern.linear_merged(&mut rec, 1, 2, 64, 2, &w, None, Rows::new(&y, 8), ep).is_err());
    assert!(kern.linear_merged(&mut rec, 1, 1, 64, GEMV_MERGE_MAX_PARTS + 1, &w, None, Rows::new(&y, 8), ep).is_err());
    assert!(kern.linear_merged(&mut rec, VERIFY_MAX_ROWS + 1, 1, 64, 2, &w, None, Rows::new(&y, 8), ep).is_err());
    let rw = F16Rows::from_bits(g, "rw", &[0u16; 6], 2, 3);
    assert!(rw.is_err(), "rows of an odd width cannot be packed in pairs");
    let rw = F16Rows::from_bits(g, "rw", &[0u16; 8], 2, 4).unwrap();
    assert!(kern.linear_rows(&mut rec, Rows::new(&y, 4), 0, None, &rw, None, Rows::new(&y, 2), ep, false).is_err());
    // The blocked attention takes head_dim 64 without a causal mask over at least one key:
    // anything else is an error, not a wrong output.
    let blocked = AttentionArgs { tq: 40, ..args };
    assert!(kern.attention_blocked(&mut rec, &blocked).is_ok());
    assert!(kern.attention_blocked(&mut rec, &AttentionArgs { head_dim: 32, ..blocked }).is_err());
    assert!(kern.attention_blocked(&mut rec, &AttentionArgs { causal: Some(0), ..blocked }).is_err());
    assert!(kern.attention_blocked(&mut rec, &AttentionArgs { tk: 0, ..blocked }).is_err());
}

#[test]
fn embed_matches_reference() {
    let mut r = rng("embed");
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let (vocab, d, ctx, n_tok, pos0) = (98, 46, 13, 5, 4);
    let emb = f16_round(&rand_vec(&mut r, vocab * d, 1.0));
    let pos = rand_vec(&mut r, ctx * d, 1.0);
    let tokens: Vec<u32> = (0..n_tok).map(|_| r.random_range(0..vocab as u32)).collect();
    let em = F16Rows::from_bits(g, "emb", &f16_bits(&emb), vocab, d).unwrap();
    let pb = g.upload_f32("pos", &pos).unwrap();
    let xb = poisoned(n_tok * d);
    // The tokens from offset 2 of the buffer (a draft model keeps them by position).
    let tok_off = 2;
    let mut stored: Vec<u32> = vec![vocab as u32 + 7; tok_off];
    stored.extend_from_slice(&tokens);
    let tb = g.upload_u32("tok at 2", &stored).unwrap();
    let xb2 = poisoned(n_tok * d);
    let mut rec = g.recorder();
    kern.embed(&mut rec, &tb, 0, n_tok as u32, &em, &pb, pos0 as u32, &xb, None).unwrap();
    kern.embed(&mut rec, &tb, tok_off as u32, n_tok as u32, &em, &pb, pos0 as u32, &xb2, None).unwrap();
    rec.submit(None).unwrap();
    let got = g.read_f32(&xb2, 0, n_tok * d).unwrap();
    let want: Vec<f32> = (0..n_tok)
        .flat_map(|i| (0..d).map(move |c| (i, c)))
        .map(|(i, c)| emb[tokens[i] as usize * d + c] + pos[(pos0 + i) * d + c])
        .collect();
    assert!(rel_err(&got, &want) < 1e-7);
    // From offset 0 the first two ids are out of range (clamped to the last row), the
    // rest are shifted: different rows than the offset read.
    let got0 = g.read_f32(&xb, 0, n_tok * d).unwrap();
    assert_eq!(got0[0], emb[(vocab - 1) * d] + pos[pos0 * d]);
    assert_ne!(got0, got);
}

#[test]
fn copy_rows_matches_reference() {
    let mut r = rng("copy_rows");
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let (rows, width, ss, so, ds, dof) = (7, 45, 140, 50, 60, 3 * 60 + 5);
    let src = rand_vec(&mut r, rows * ss, 1.0);
    let sb = g.upload_f32("src", &src).unwrap();
    let dst_len = dof + rows * ds;
    let db = poisoned(dst_len);
    let mut rec = g.recorder();
    kern.copy_rows(&mut rec, Rows::at(&sb, so, ss), Rows::at(&db, dof, ds), rows as u32, width as u32).unwrap();
    rec.submit(None).unwrap();
    let got = g.read_u32(&db, 0, dst_len).unwrap();
    for i in 0..rows {
        for c in 0..ds {
            let idx = dof + i * ds + c;
            if c < width {
                assert_eq!(f32::from_bits(got[idx]), src[so + i * ss + c], "row {i} col {c}");
            } else {
                assert_eq!(got[idx], NAN_BITS, "wrote outside the rows at row {i} col {c}");
            }
        }
    }
    assert!(got[..dof].iter().all(|&w| w == NAN_BITS), "wrote before the destination offset");
}

/// A selection test with the fused kernels and with the pairs (select.wgsl): each must hold
/// its checks on the same random inputs, and every word either reads back must be the same
/// bits.
fn select_both_ways(name: &str, test: fn(bool, StdRng) -> Vec<u32>) {
    let r = rng(name);
    let (fused, pairs) = (test(true, r.clone()), test(false, r));
    assert_eq!(fused.len(), pairs.len());
    for (i, (a, b)) in fused.iter().zip(&pairs).enumerate() {
        assert_eq!(a, b, "word {i} read back: {a:#x} fused, {b:#x} as a pair of dispatches");
    }
}

#[test]
fn select_matches_reference() {
    select_both_ways("select", select_matches_reference_with);
}

fn select_matches_reference_with(fused: bool, mut r: StdRng) -> Vec<u32> {
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.select_fused = fused;
    let mut seen: Vec<u32> = Vec::new();
    let (vocab, eot, ts_begin) = (1013u32, 600u32, 700u32);
    for trial in 0..12 {
        let mut logits = rand_vec(&mut r, vocab as usize, 8.0);
        if trial == 3 {
            // Ties: the lowest id must win.
            let top = 20.0;
            logits[17] = top;
            logits[400] = top;
            logits[800] = top;
            logits[900] = top;
        }
        let suppress: Vec<u32> = (0..40).map(|_| r.random_range(0..vocab)).collect();
        let lo = ts_begin + r.random_range(0..200);
        let rules = StepRules {
            mask_text: trial % 3 == 1,
            mask_non_timestamps: trial % 4 == 2,
            ts_lo: lo,
            ts_hi: if trial == 5 { lo } else { lo + r.random_range(1..400) },
            extra_suppress: [r.random_range(0..vocab), if trial % 2 == 0 { u32::MAX } else { eot }],
            probe: r.random_range(0..vocab),
        };
        let lb = g.upload_f32("logits", &logits).unwrap();
        let sb = g.upload_u32("suppress", &suppress_bitmask(&suppress, vocab)).unwrap();
        // Odd trials write at word 8 (a verify pass's second row), leaving words 0..8 alone.
        let out_off = 8 * (trial % 2);
        let ob = poisoned(16);
        let mut rec = g.recorder();
        let params = SelectParams { out_off, ..select_params(&rules, vocab, ts_begin, eot, 0) };
        kern.select(&mut rec, &lb, &sb, &params, &ob).unwrap();
        rec.submit(None).unwrap();
        let words = g.read_u32(&ob, 0, 16).unwrap();
        seen.extend_from_slice(&words);
        if out_off > 0 {
            assert!(words[..8].iter().all(|&w| w == NAN_BITS), "trial {trial}: words before out_off written");
        }
        let got = scores_from_words(&words[out_off as usize..out_off as usize + 8]);
        let want = ref_select::masked_scores(&logits, &suppress, &rules, ts_begin, eot);
        assert_eq!(got.text_best, want.text_best, "trial {trial}: text argmax");
        assert_eq!(got.ts_best, want.ts_best, "trial {trial}: timestamp argmax");
        for (name, a, b) in [
            ("text_max", got.text_max, want.text_max),
            ("text_lse", got.text_lse, want.text_lse),
            ("ts_max", got.ts_max, want.ts_max),
            ("ts_lse", got.ts_lse, want.ts_lse),
            ("raw_lse", got.raw_lse, want.raw_lse),
            ("probe", got.probe_logit, want.probe_logit),
        ] {
            let ok = (a == b) || (a - b).abs() <= 1e-4 * b.abs().max(1.0);
            assert!(ok, "trial {trial}: {name} gpu {a} ref {b}");
        }
    }
    seen
}

/// A verify pass's selection: several rows, each under its own masks, in one pair of
/// dispatches; every row's 8 words bit for bit what `select` gives the row alone (and
/// within the reference's tolerance), nothing written between or after the rows.
#[test]
fn select_rows_matches_select_row_by_row() {
    select_both_ways("select_rows", select_rows_matches_select_row_by_row_with);
}

fn select_rows_matches_select_row_by_row_with(fused: bool, mut r: StdRng) -> Vec<u32> {
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.select_fused = fused;
    let mut seen: Vec<u32> = Vec::new();
    let (vocab, eot, ts_begin) = (1013u32, 600u32, 700u32);
    for rows in [2usize, 5, SELECT_ROWS] {
        let logits = rand_vec(&mut r, rows * vocab as usize, 8.0);
        let suppress: Vec<u32> = (0..40).map(|_| r.random_range(0..vocab)).collect();
        let sb = g.upload_u32("suppress", &suppress_bitmask(&suppress, vocab)).unwrap();
        let lb = g.upload_f32("logits", &logits).unwrap();
        let rules: Vec<StepRules> = (0..rows)
            .map(|i| {
                let lo = ts_begin + r.random_range(0..200);
                StepRules {
                    mask_text: i % 3 == 1,
                    mask_non_timestamps: i == 0,
                    ts_lo: lo,
                    ts_hi: if i == 4 { lo } else { lo + r.random_range(1..400) },
                    extra_suppress: [r.random_range(0..vocab), if i == 0 { eot } else { u32::MAX }],
                    probe: r.random_range(0..vocab),
                }
            })
            .collect();
        // Rows written with a gap of 8 words after each (poison must survive there).
        let params: Vec<SelectParams> = (0..rows)
            .map(|i| SelectParams {
                out_off: 16 * i as u32,
                ..select_params(&rules[i], vocab, ts_begin, eot, i as u32 * vocab)
            })
            .collect();
        let ob = poisoned(16 * rows + 8);
        let mut rec = g.recorder();
        kern.select_rows(&mut rec, &lb, &sb, &params, &ob).unwrap();
        rec.submit(None).unwrap();
        let words = g.read_u32(&ob, 0, 16 * rows + 8).unwrap();
        seen.extend_from_slice(&words);
        for i in 0..rows {
            let one = poisoned(8);
            let mut rec = g.recorder();
            kern.select(&mut rec, &lb, &sb, &SelectParams { out_off: 0, ..params[i] }, &one).unwrap();
            rec.submit(None).unwrap();
            let alone = g.read_u32(&one, 0, 8).unwrap();
            seen.extend_from_slice(&alone);
            assert_eq!(&words[16 * i..16 * i + 8], &alone[..], "{rows} rows: row {i} differs from the row alone");
            assert!(words[16 * i + 8..16 * i + 16].iter().all(|&w| w == NAN_BITS), "{rows} rows: wrote after row {i}");
            let row = &logits[i * vocab as usize..(i + 1) * vocab as usize];
            let want = ref_select::masked_scores(row, &suppress, &rules[i], ts_begin, eot);
            let got = scores_from_words(&alone);
            assert_eq!((got.text_best, got.ts_best), (want.text_best, want.ts_best), "{rows} rows: row {i} argmax");
            let close = |a: f32, b: f32| a == b || (a - b).abs() <= 1e-4 * b.abs().max(1.0);
            assert!(close(got.text_lse, want.text_lse) && close(got.raw_lse, want.raw_lse), "{rows} rows: row {i} sums");
        }
    }
    // Shapes it refuses: no rows, more than SELECT_ROWS, the timestamp state.
    let lb = g.upload_f32("logits", &[1.0; 64]).unwrap();
    let sb = g.upload_u32("suppress", &[0; 2]).unwrap();
    let ob = poisoned(8);
    let one = select_params(&StepRules { mask_text: false, mask_non_timestamps: false, ts_lo: 40, ts_hi: 64, extra_suppress: [u32::MAX; 2], probe: 0 }, 64, 40, 30, 0);
    let mut rec = g.recorder();
    assert!(kern.select_rows(&mut rec, &lb, &sb, &[], &ob).is_err());
    assert!(kern.select_rows(&mut rec, &lb, &sb, &[one; SELECT_ROWS + 1], &ob).is_err());
    let state = SelectParams { flags: SELECT_FLAG_RULES_FROM_STATE, ..one };
    assert!(kern.select_rows(&mut rec, &lb, &sb, &[one, state], &ob).is_err());
    assert!(rec.is_empty(), "a refused selection recorded dispatches");
    seen
}

/// The pick: the same scores as `select`, and the choice written as a token id
/// (timestamp when its best logit beats the best text token's; eot when nothing is allowed).
#[test]
fn select_pick_writes_scores_and_the_choice() {
    select_both_ways("select_pick", select_pick_writes_scores_and_the_choice_with);
}

fn select_pick_writes_scores_and_the_choice_with(fused: bool, mut r: StdRng) -> Vec<u32> {
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.select_fused = fused;
    let mut seen: Vec<u32> = Vec::new();
    let (vocab, eot, ts_begin) = (1013u32, 600u32, 700u32);
    for trial in 0..8 {
        let mut logits = rand_vec(&mut r, vocab as usize, 8.0);
        if trial % 2 == 0 {
            logits[ts_begin as usize + 50 + trial] = 40.0; // a timestamp on top
        }
        let suppress: Vec<u32> = (0..40).map(|_| r.random_range(0..vocab)).collect();
        let rules = StepRules {
            mask_text: trial == 7,
            mask_non_timestamps: trial == 5,
            ts_lo: ts_begin,
            ts_hi: if trial == 3 || trial == 5 { ts_begin } else { vocab },
            extra_suppress: [u32::MAX, u32::MAX],
            probe: 9,
        };
        let lb = g.upload_f32("logits", &logits).unwrap();
        let sb = g.upload_u32("suppress", &suppress_bitmask(&suppress, vocab)).unwrap();
        let ids = poisoned(4);
        let out = poisoned(16);
        let mut rec = g.recorder();
        let params = SelectParams { out_off: 8, tok_out: 2, ..select_params(&rules, vocab, ts_begin, eot, 0) };
        kern.select_pick(&mut rec, &lb, &sb, &params, &out, &ids).unwrap();
        rec.submit(None).unwrap();
        let got = g.read_u32(&ids, 0, 4).unwrap();
        seen.extend_from_slice(&got);
        assert_eq!([got[0], got[1], got[3]], [NAN_BITS; 3], "trial {trial}: wrote beside tok_out");
        let words = g.read_u32(&out, 0, 16).unwrap();
        seen.extend_from_slice(&words);
        assert!(words[..8].iter().all(|&w| w == NAN_BITS), "trial {trial}: scores before out_off");
        let s = ref_select::masked_scores(&logits, &suppress, &rules, ts_begin, eot);
        let sc = scores_from_words(&words[8..]);
        assert_eq!((sc.text_best, sc.ts_best), (s.text_best, s.ts_best), "trial {trial}: scores");
        let want = match (s.text_best != u32::MAX, s.ts_best != u32::MAX) {
            (_, true) if s.text_best == u32::MAX || s.ts_max > s.text_max => s.ts_best,
            (true, _) => s.text_best,
            _ => eot,
        };
        assert_eq!(got[2], want, "trial {trial}");
    }
    seen
}

/// A gated decode step (`Kernels::embed` + `Recorder::gate`): a pick of eot with
/// flag 32 sets the done flag; the next step's embedding then zeroes its grids and its
/// gated dispatches run empty (outputs left as they were, poisoned); a pick of anything
/// else leaves the flag clear and the step computes: the embedding and a gated copy as
/// without the gate. Twice over one table, as a decode batch reuses it: the second round's
/// grids are written again before it runs.
#[test]
fn a_pick_of_eot_gates_off_the_next_step() {
    let mut r = rng("gated_step");
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let (vocab, eot, ts_begin) = (1013u32, 600u32, 700u32);
    let (d, n_pos) = (70usize, 9usize);
    let emb = f16_round(&rand_vec(&mut r, vocab as usize * d, 1.0));
    let em = F16Rows::from_bits(g, "emb", &f16_bits(&emb), vocab as usize, d).unwrap();
    let pos = rand_vec(&mut r, n_pos * d, 1.0);
    let pb = g.upload_f32("pos", &pos).unwrap();
    let table = g.grid_table("grids", 4 * 12).unwrap();
    let rules = StepRules { mask_text: false, mask_non_timestamps: false, ts_lo: ts_begin, ts_hi: vocab, extra_suppress: [u32::MAX; 2], probe: 9 };
    for (round, top) in [eot, 321, eot, 17].into_iter().enumerate() {
        let mut logits = rand_vec(&mut r, vocab as usize, 4.0);
        logits[top as usize] = 30.0;
        let lb = g.upload_f32("logits", &logits).unwrap();
        let sb = g.upload_u32("suppress", &suppress_bitmask(&[], vocab)).unwrap();
        // ids: [fed token, the pick, -, done flag]
        let ids = g.upload_u32("ids", &[5, NAN_BITS, NAN_BITS, 0]).unwrap();
        let out = poisoned(8);
        let (x, copied) = (poisoned(d), poisoned(d));
        let src = g.upload_f32("src", &rand_vec(&mut r, d, 1.0)).unwrap();
        let mut rec = g.recorder();
        let sp = SelectParams { tok_out: 1, done_off: 3, flags: select_params(&rules, vocab, ts_begin, eot, 0).flags | SELECT_FLAG_MARK_DONE, ..select_params(&rules, vocab, ts_begin, eot, 0) };
        kern.select_pick(&mut rec, &lb, &sb, &sp, &out, &ids).unwrap();
        // The next step: its embedding (the pick, at position 4), then a gated copy.
        kern.embed(&mut rec, &ids, 1, 1, &em, &pb, 4, &x, Some((&table, 0..12, 3))).unwrap();
        rec.gate(Some((&table, 0, 48)));
        kern.copy_rows(&mut rec, Rows::new(&src, d), Rows::new(&copied, d), 1, d as u32).unwrap();
        rec.gate(None);
        rec.submit(None).unwrap();
        let flag = g.read_u32(&ids, 0, 4).unwrap();
        assert_eq!(flag[1], top, "round {round}: the pick");
        let (xs, cs) = (g.read_f32(&x, 0, d).unwrap(), g.read_f32(&copied, 0, d).unwrap());
        let grids = g.read_u32(&table, 0, 12).unwrap();
        if top == eot {
            assert_eq!(flag[3], 1, "round {round}: eot sets the done flag");
            assert!(xs.iter().chain(&cs).all(|v| v.to_bits() == NAN_BITS), "round {round}: the gated step ran");
            assert!(grids.iter().all(|&w| w == 0), "round {round}: grids {grids:?}");
        } else {
            assert_eq!(flag[3], 0, "round {round}: the flag set without eot");
            let want_x: Vec<f32> = (0..d).map(|c| emb[top as usize * d + c] + pos[4 * d + c]).collect();
            assert_eq!(xs, want_x, "round {round}: the embedding");
            assert_eq!(cs, g.read_f32(&src, 0, d).unwrap(), "round {round}: the gated copy");
            assert_eq!(&grids[..3], &[(d as u32).div_ceil(64), 1, 1], "round {round}: the copy's grid");
        }
    }
}

/// A gate's range holds as many grids as the caller made room for: one dispatch more is an
/// error when recorded, not a grid written over the next step's.
#[test]
fn a_gate_too_small_for_its_dispatches_is_an_error() {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let table = g.grid_table("grids", 24).unwrap();
    let (src, dst) = (g.upload_f32("src", &[1.0; 8]).unwrap(), poisoned(8));
    let mut rec = g.recorder();
    rec.gate(Some((&table, 0, 12)));
    kern.copy_rows(&mut rec, Rows::new(&src, 8), Rows::new(&dst, 8), 1, 8).unwrap();
    let e = kern.copy_rows(&mut rec, Rows::new(&src, 8), Rows::new(&dst, 8), 1, 8);
    assert!(matches!(e, Err(crate::Error::Invalid(ref m)) if m.contains("range is full")), "{e:?}");
}

/// The selection with the timestamp state (flags 8 and 16): the masks come from the state
/// in `ids` as decode::TsState::step derives them (scores against the CPU under those
/// masks), the pick applies "timestamps beat text" where they say so, the masks used are
/// reported, and the choice is pushed into the state as TsState::push does.
#[test]
fn select_pick_with_timestamp_state_matches_reference() {
    select_both_ways("select_pick_state", select_pick_with_timestamp_state_matches_reference_with);
}

fn select_pick_with_timestamp_state_matches_reference_with(fused: bool, mut r: StdRng) -> Vec<u32> {
    use crate::decode::TsState;
    let g = gpu();
    let mut kern = Kernels::load(g).unwrap();
    kern.select_fused = fused;
    let mut seen: Vec<u32> = Vec::new();
    let (vocab, eot, ts_begin) = (1013u32, 600u32, 700u32);
    let base = StepRules { mask_text: true, mask_non_timestamps: true, ts_lo: 0, ts_hi: vocab, extra_suppress: [601, u32::MAX], probe: 9 };
    // After text, after a lone timestamp, after a closed pair, after one timestamp.
    let states = [
        TsState::new(&[ts_begin + 20, 300], ts_begin).unwrap(),
        TsState::new(&[300, ts_begin + 40], ts_begin).unwrap(),
        TsState::new(&[ts_begin + 40, ts_begin + 41], ts_begin).unwrap(),
        TsState::new(&[ts_begin + 3], ts_begin).unwrap(),
    ];
    for (trial, st) in states.iter().enumerate() {
        for boost in [None, Some(ts_begin + 60), Some(100)] {
            let mut logits = rand_vec(&mut r, vocab as usize, 4.0);
            if let Some(id) = boost {
                logits[id as usize] = 12.0;
            }
            let suppress: Vec<u32> = (0..20).map(|_| r.random_range(0..vocab)).collect();
            let lb = g.upload_f32("logits", &logits).unwrap();
            let sb = g.upload_u32("suppress", &suppress_bitmask(&suppress, vocab)).unwrap();
            // ids: [poison, the choice, state (3 words), poison]
            let ids = poisoned(6);
            g.write(&ids, 8, bytemuck::cast_slice(&[st.last, st.penultimate, st.ts_lo_after_text]));
            let out = poisoned(12);
            let params = SelectParams {
                flags: SELECT_FLAG_RULES_FROM_STATE | SELECT_FLAG_TRACK_STATE,
                tok_out: 1,
                state_off: 2,
                rules_off: 8,
                ..select_params(&base, vocab, ts_begin, eot, 0)
            };
            let mut rec = g.recorder();
            kern.select_pick(&mut rec, &lb, &sb, &params, &out, &ids).unwrap();
            rec.submit(None).unwrap();
            let what = format!("state {trial} ({st:?}), boost {boost:?}");
            let step = st.step(base, ts_begin, vocab);
            let words = g.read_u32(&out, 0, 12).unwrap();
            seen.extend_from_slice(&words);
            let used_bits = step.rules.mask_text as u32 | (step.check_ts_over_text as u32) << 1;
            assert_eq!([words[8], words[9]], [step.rules.ts_lo, used_bits], "{what}: the masks reported");
            assert_eq!([words[10], words[11]], [NAN_BITS; 2], "{what}: wrote past the masks");
            let s = ref_select::masked_scores(&logits, &suppress, &step.rules, ts_begin, eot);
            let sc = scores_from_words(&words[..8]);
            assert_eq!((sc.text_best, sc.ts_best), (s.text_best, s.ts_best), "{what}: scores");
            let (text_ok, ts_ok) = (sc.text_best != u32::MAX, sc.ts_best != u32::MAX);
            let want = if ts_ok && ((step.check_ts_over_text && sc.ts_lse > sc.text_max) || !text_ok || sc.ts_max > sc.text_max) {
                sc.ts_best
            } else if text_ok {
                sc.text_best
            } else {
                eot
            };
            let got = g.read_u32(&ids, 0, 6).unwrap();
            seen.extend_from_slice(&got);
            assert_eq!(got[1], want, "{what}: the choice");
            let next = st.push(want, ts_begin);
            assert_eq!(got[2..5], [next.last, next.penultimate, next.ts_lo_after_text], "{what}: the state after");
            assert_eq!([got[0], got[5]], [NAN_BITS; 2], "{what}: wrote beside");
        }
    }
    seen
}

#[test]
fn linear_q_matches_reference_and_rows_equal_lone_rows() {
    let mut r = rng("linear_q");
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0] {
        // K a multiple of 32 and not (a padded last block), N odd-sized against the
        // workgroup's 16 columns, one row and several (a prompt goes through it too).
        run_rows_equal_lone(&mut r, TestWeights::Q(format), 1, 34, 64, false, false, false);
        run_rows_equal_lone(&mut r, TestWeights::Q(format), 3, 130, 45, true, false, false);
        run_rows_equal_lone(&mut r, TestWeights::Q(format), 1, 66, 131, true, true, true);
        run_rows_equal_lone(&mut r, TestWeights::Q(format), 11, 20, 384, false, false, true);
        run_rows_equal_lone(&mut r, TestWeights::Q(format), 2, 6, 7, true, false, false);
    }
    // Over 8 MiB of codes: the wide form.
    run_rows_equal_lone(&mut r, TestWeights::Q(BlockFormat::Q8_0), 2, 8210, 1040, true, false, false);
    run_rows_equal_lone(&mut r, TestWeights::Q(BlockFormat::Q4_0), 1, 16402, 1056, false, false, false);
}

#[test]
fn wrong_buffer_count_is_an_error_not_a_panic() {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let b = g.buffer("b", 64).unwrap();
    let mut rec = g.recorder();
    let err = rec.dispatch(&kern.copy_rows, &[0u8; 32], &[&b], [1, 1, 1], Cost::default());
    assert!(err.is_err());
}

/// A cached recording replayed with new parameters and new buffers: reused bind groups
/// must see the new parameter bytes, and a changed buffer must get a new bind group.
#[test]
fn dispatch_cache_replays_with_new_parameters() {
    let mut r = rng("dispatch_cache");
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    let src = rand_vec(&mut r, 40 * 8, 1.0);
    let sb = g.upload_f32("src", &src).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    for (round, rows) in [(0, 3usize), (1, 5), (2, 2)] {
        let db = poisoned(40 * 8);
        let mut rec = g.recorder_cached(&mut cache);
        // Two dispatches so slot 1 is reused too; rows and offsets change every round.
        kern.copy_rows(&mut rec, Rows::at(&sb, round, 8), Rows::new(&db, 8), rows as u32, 8).unwrap();
        kern.copy_rows(&mut rec, Rows::at(&sb, 160 + round, 8), Rows::at(&db, 160, 8), rows as u32, 8).unwrap();
        rec.submit(None).unwrap();
        let got = g.read_f32(&db, 0, 40 * 8).unwrap();
        for i in 0..rows * 8 {
            assert_eq!(got[i], src[round + i], "round {round} first copy at {i}");
            assert_eq!(got[160 + i], src[160 + round + i], "round {round} second copy at {i}");
        }
        assert!(got[rows * 8].is_nan(), "round {round}: copied more rows than asked");
    }
}

/// A recording submitted in parts (`submit_early_at`, as a verify pass is, or `flush` at
/// chosen points, as the encoder is) computes what one submission does: a chain of
/// dependent copies, replayed from a cache with new parameters each round, split after 1,
/// 2, or 1 and 3 of its 4 dispatches, after every one or not at all, by counts, by flushes
/// or both (each part uploads only the parameters it added; a stale or missing upload
/// shows as a wrong or NaN row).
#[test]
fn recording_submitted_in_parts_equals_one_submission() {
    let mut r = rng("submit_early");
    // The device without profiling: timed dispatches are never submitted early.
    let ga = crate::testgpu::gpu_arc();
    let g = &*ga;
    assert!(!g.timing_dispatches());
    let kern = Kernels::load(g).unwrap();
    let poisoned = |n: usize| {
        let b = g.buffer("out", (n * 4) as u64).unwrap();
        g.fill_u32(&b, NAN_BITS);
        b
    };
    let src = rand_vec(&mut r, 40 * 6, 1.0);
    let sb = g.upload_f32("src", &src).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    // (counts for submit_early_at, dispatches after which to flush)
    let splits: [(&[usize], &[usize]); 8] = [
        (&[1], &[]),
        (&[2], &[]),
        (&[3, 1], &[]),
        (&[], &[]),
        (&[1, 2, 3, 4], &[]),
        (&[], &[1]),
        (&[], &[1, 3, 4]),
        (&[2], &[3]),
    ];
    for (round, (rows, (early, flushes))) in [3usize, 5, 2, 4, 1, 6, 3, 2].into_iter().zip(splits).enumerate() {
        let hops: Vec<wgpu::Buffer> = (0..4).map(|_| poisoned(40 * 6)).collect();
        let mut rec = g.recorder_cached(&mut cache);
        rec.submit_early_at(early);
        // src (from row `round`) -> hop 0 -> hop 1 (one row down) -> hop 2 -> hop 3.
        let from = [Rows::at(&sb, round * 6, 6), Rows::new(&hops[0], 6), Rows::at(&hops[1], 6, 6), Rows::new(&hops[2], 6)];
        let to = [Rows::new(&hops[0], 6), Rows::at(&hops[1], 6, 6), Rows::new(&hops[2], 6), Rows::new(&hops[3], 6)];
        for (i, (x, y)) in from.into_iter().zip(to).enumerate() {
            kern.copy_rows(&mut rec, x, y, rows as u32, 6).unwrap();
            if flushes.contains(&(i + 1)) {
                rec.flush().unwrap();
            }
        }
        rec.submit(None).unwrap();
        let got = g.read_f32(&hops[3], 0, 40 * 6).unwrap();
        for i in 0..rows * 6 {
            assert_eq!(got[i], src[round * 6 + i], "round {round} (split after {early:?}, flushed after {flushes:?}) at {i}");
        }
        assert!(got[rows * 6].is_nan(), "round {round}: copied more rows than asked");
    }
}

/// `upload_only` queues a cached recording's parameters for an encoded twin; a recording
/// without a cache (its arenas go back to the pool with it) is refused, not uploaded into
/// buffers nothing will read.
#[test]
fn upload_only_needs_a_dispatch_cache() {
    let ga = crate::testgpu::gpu_arc();
    let g = &*ga;
    let kern = Kernels::load(g).unwrap();
    let src = g.upload_f32("src", &[1.0; 12]).unwrap();
    let dst = g.buffer("dst", 48).unwrap();
    let mut rec = g.recorder();
    kern.copy_rows(&mut rec, Rows::new(&src, 6), Rows::new(&dst, 6), 2, 6).unwrap();
    assert!(rec.upload_only().is_err());
    let mut cache = crate::gpu::DispatchCache::default();
    let mut rec = g.recorder_cached(&mut cache);
    kern.copy_rows(&mut rec, Rows::new(&src, 6), Rows::new(&dst, 6), 2, 6).unwrap();
    let sig = rec.signature();
    assert_eq!(sig.0.len(), 1);
    assert_eq!(sig.1.len(), 1);
    rec.upload_only().unwrap();
}

/// gemm_planes.wgsl's tiles: each one it builds has its rows, subgroups, workgroup size and
/// emit tile rewritten (the source as written is the 64-row kernel); any other tile is
/// refused, not built wrong.
#[test]
fn gemm_planes_tiles_rewrite_or_refuse() {
    for t in [GemmTile::NARROW, GemmTile::WIDE] {
        let src = super::gemm_planes_tile_source(t).unwrap();
        let subgroups = (t.rows / 16) * (t.cols / 32);
        for want in [
            format!("const TM: u32 = {}u;", t.rows),
            format!("const WR: u32 = {}u;", t.rows / 16),
            format!("const WC: u32 = {}u;", t.cols / 32),
            format!("@workgroup_size({})", 32 * subgroups),
            format!("var<workgroup> cs: array<f32, {}>;", 320 * subgroups),
        ] {
            assert!(src.contains(&want), "{t:?}: no {want}");
        }
        assert!(super::gemm_planes_out_tile_source(t).unwrap().contains("emit_planes(c00"), "{t:?}: planes output not rewritten");
    }
    for (rows, cols) in [(64, 64), (64, 128), (32, 256), (16, 64), (32, 96)] {
        assert!(super::gemm_planes_tile_source(GemmTile { rows, cols }).is_err(), "{rows} x {cols} was built");
    }
}

/// attention_coop.wgsl's shapes: each one it builds has its subgroups, its P·V round width
/// and its workgroup size rewritten (the source as written is 4 x 32); any other shape is
/// refused, not built wrong.
#[test]
fn attention_coop_shapes_rewrite_or_refuse() {
    for (nsg, od) in [(2u32, 32u32), (2, 64), (4, 32), (4, 64)] {
        let src = super::attention_coop_source(nsg, od).unwrap();
        for want in [format!("const NSG: u32 = {nsg}u;"), format!("const OD: u32 = {od}u;"), format!("@workgroup_size({})", 32 * nsg)] {
            assert!(src.contains(&want), "{nsg} x {od}: no {want}");
        }
    }
    for (nsg, od) in [(1, 32), (3, 32), (8, 32), (4, 16), (2, 48), (4, 128)] {
        assert!(super::attention_coop_source(nsg, od).is_err(), "{nsg} x {od} was built");
    }
}

/// The cooperative-matrix kernels cannot run on lavapipe, but their sources can still be parsed
/// and validated here (with every capability allowed), so CI catches a WGSL mistake.
#[test]
fn coop_sources_are_valid_wgsl() {
    use wgpu::naga;
    // (and the kernel lab's probes of them)
    let lab = concat!("enable f16;\nenable wgpu_cooperative_matrix;\n", include_str!("../bin/kernel_lab/coop.wgsl"));
    let gemm_direct = concat!(
        "enable f16;\nenable wgpu_cooperative_matrix;\n",
        include_str!("../bin/kernel_lab/gemm_direct.wgsl"),
        include_str!("gelu.wgsl"),
        include_str!("gemm_epilogue.wgsl"),
        include_str!("gemm_coop_emit.wgsl")
    );
    let staged = super::ATTENTION_COOP_SOURCE;
    let split = super::SPLIT_F16_SOURCE;
    let put4 = gemm_direct.replace(
        "    emit(c00, d00, cb, lane, row0, col0);\n    emit(c01, d01, cb, lane, row0, col0 + 16u);\n    emit(c10, d10, cb, lane, row0 + 16u, col0);\n    emit(c11, d11, cb, lane, row0 + 16u, col0 + 16u);\n",
        "    let blk = ((wg.y * (p.n / 64u) + wg.x) * 4u + sg) * 2048u;\n    put4(c00, c01, c10, c11, blk);\n    put4(d00, d01, d10, d11, blk + 1024u);\n",
    );
    assert!(super::GEMM_PLANES_SOURCE.contains(&format!("const CK: u32 = {}u;", super::GEMM_PLANES_CK)));
    let nsg = super::ATTENTION_COOP_QUERIES / 16;
    assert!(staged.contains(&format!("const NSG: u32 = {nsg}u;")) && staged.contains(&format!("@workgroup_size({})", 32 * nsg)));
    let attention_variants: Vec<String> = [(2u32, 32u32), (2, 64), (4, 64)].iter().map(|&(n, od)| super::attention_coop_source(n, od).unwrap()).collect();
    let mut sources = vec![GEMM_COOP_SOURCE, super::GEMM_PLANES_SOURCE, lab, gemm_direct, staged, split, put4.as_str()];
    sources.extend(attention_variants.iter().map(|s| s.as_str()));
    let narrow = super::gemm_planes_narrow_source().unwrap();
    let (planes_out, planes_out_narrow) = (super::gemm_planes_out_source(false).unwrap(), super::gemm_planes_out_source(true).unwrap());
    sources.extend([narrow.as_str(), planes_out.as_str(), planes_out_narrow.as_str()]);
    let tiles: Vec<String> = [GemmTile::WIDE]
        .iter()
        .flat_map(|&t| [super::gemm_planes_tile_source(t).unwrap(), super::gemm_planes_out_tile_source(t).unwrap()])
        .collect();
    sources.extend(tiles.iter().map(|s| s.as_str()));
    for (i, src) in sources.into_iter().enumerate() {
        eprintln!("source {i}");
        let module = naga::front::wgsl::parse_str(src).unwrap_or_else(|e| panic!("{}", e.emit_to_string(src)));
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(src)));
        // and through naga's SPIR-V writer, as wgpu's Vulkan backend will (it has panicked on
        // forms the validator takes)
        let opts = naga::back::spv::Options::default();
        naga::back::spv::write_vec(&module, &info, &opts, None).expect("SPIR-V");
    }
}

/// A replay (`Recorder::replay`) computes what the recording says: a copy_rows dispatch and
/// a buffer copy after it, run three times with new source rows (the first through wgpu,
/// building the program; then replayed, the rows written by the prologue), outputs poisoned
/// before each; a recording without a dispatch cache or with a part submitted early is
/// refused.
#[test]
fn replay_runs_the_recording_again_with_new_writes() {
    // A device of its own: it counts the programs built, which other tests on the shared
    // device build beside it (CI failed once so, 2026-12-07).
    let ga = crate::gpu::Gpu::new(&Default::default()).unwrap();
    let g = &ga;
    if !g.replay_available() {
        return; // not a Vulkan device the engine opened (the window's, or Metal)
    }
    let kern = Kernels::load(g).unwrap();
    let mut rng = rng("replay");
    // 7 rows of 13 of a stride-13 source; rows 2..7 (5 of them) copied to dst, then dst's
    // first 11 words copied to `tail` at word 3.
    let (width, rows) = (13u32, 5u32);
    let src = g.upload_f32("src", &vec![0.0; 7 * 13]).unwrap();
    let dst = g.buffer("dst", 4 * 5 * 13).unwrap();
    let tail = g.buffer("tail", 4 * 16).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    let before = g.replay_programs();
    for round in 0..3 {
        let data: Vec<f32> = (0..7 * 13).map(|_| rng.random_range(0.5f32..2.0) * if rng.random_bool(0.5) { -1.0 } else { 1.0 }).collect();
        g.write(&dst, 0, bytemuck::cast_slice(&vec![f32::NAN; 5 * 13]));
        g.write(&tail, 0, bytemuck::cast_slice(&vec![f32::NAN; 16]));
        // Queued writes land with wgpu's next submission, which a replay is not.
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::at(&src, 2 * 13, 13), Rows::new(&dst, 13), rows, width).unwrap();
        rec.copy(&dst, 0, &tail, 12, 44);
        let t = rec.replay(&[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap();
        assert_eq!(t.is_some(), round > 0, "round {round}: replayed from the second recording on");
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        let got = g.read_f32(&dst, 0, 5 * 13).unwrap();
        assert_eq!(got, data[2 * 13..7 * 13].to_vec(), "round {round}: the copied rows");
        let got_tail = g.read_f32(&tail, 3, 11).unwrap();
        assert_eq!(got_tail, data[2 * 13..2 * 13 + 11].to_vec(), "round {round}: the buffer copy after the dispatch");
    }
    assert_eq!(g.replay_programs() - before, 1, "one program for one signature");
    let mut rec = g.recorder();
    kern.copy_rows(&mut rec, Rows::new(&src, 13), Rows::new(&dst, 13), rows, width).unwrap();
    assert!(rec.replay(&[], None).is_err(), "a recording without a dispatch cache");
    let mut rec = g.recorder_cached(&mut cache);
    kern.copy_rows(&mut rec, Rows::new(&src, 13), Rows::new(&dst, 13), rows, width).unwrap();
    rec.flush().unwrap();
    kern.copy_rows(&mut rec, Rows::new(&src, 13), Rows::new(&dst, 13), rows, width).unwrap();
    assert!(rec.replay(&[], None).is_err(), "a recording with a part submitted early");
}

/// A replay's big writes (`STAGE_MIN` bytes and more) go up through its entry's staging
/// buffer and a copy in the prologue, small ones inline: rounds of a big write at offset 0,
/// a second big one at an odd word offset of another buffer, and a small one, of lengths
/// that straddle the threshold and outgrow the first staging buffers (1 MiB), more rounds
/// than the replayer has entries; every written word read back, and a dispatch after the
/// writes reads them (the copies land before the program runs). Outputs poisoned first.
#[test]
fn replay_stages_big_writes() {
    let ga = crate::testgpu::gpu_arc();
    let g = &*ga;
    if !g.replay_available() {
        return;
    }
    let kern = Kernels::load(g).unwrap();
    let mut rng = rng("replay-stage");
    let big_words = 300_000usize; // 1.2 MB: past the first staging buffers' 1 MiB
    let (width, rows) = (13u32, 5u32);
    let src = g.upload_f32("src", &vec![0.0; big_words]).unwrap();
    let other = g.upload_f32("other", &vec![0.0; 20_000]).unwrap();
    let small = g.upload_f32("small", &vec![0.0; 16]).unwrap();
    let dst = g.buffer("dst", 4 * 5 * 13).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    // Word counts of the first write: 64 KiB exactly (staged), a word less (inline), a
    // little more, all of it; then again past the replayer's eight entries.
    let lens = [16_384usize, 16_383, 70_001, big_words, 20_000, 16_384, 250_000, 16_383, 100_000, big_words, 17_000, 16_384];
    for (round, &n) in lens.iter().enumerate() {
        let data: Vec<f32> = (0..n).map(|_| rng.random_range(0.5f32..2.0) * if rng.random_bool(0.5) { -1.0 } else { 1.0 }).collect();
        let n2 = 16_384 + round * 101;
        let data2: Vec<f32> = (0..n2).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        let data3: Vec<f32> = (0..7).map(|_| rng.random_range(-3.0f32..3.0)).collect();
        g.write(&src, 0, bytemuck::cast_slice(&vec![f32::NAN; big_words]));
        g.write(&other, 0, bytemuck::cast_slice(&vec![f32::NAN; 20_000]));
        g.write(&small, 0, bytemuck::cast_slice(&vec![f32::NAN; 16]));
        g.write(&dst, 0, bytemuck::cast_slice(&vec![f32::NAN; 5 * 13]));
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::at(&src, 2 * 13, 13), Rows::new(&dst, 13), rows, width).unwrap();
        let writes: [(&wgpu::Buffer, u64, &[u8]); 3] = [
            (&src, 0, bytemuck::cast_slice(&data)),
            (&other, 4 * 123, bytemuck::cast_slice(&data2)),
            (&small, 4 * 5, bytemuck::cast_slice(&data3)),
        ];
        let t = rec.replay(&writes, None).unwrap();
        assert_eq!(t.is_some(), round > 0, "round {round}: replayed from the second recording on");
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        assert_eq!(g.read_f32(&src, 0, n).unwrap(), data, "round {round}: the first write ({n} words)");
        assert!(g.read_f32(&src, n as u64, big_words - n).unwrap().iter().all(|v| v.is_nan()), "round {round}: past the first write");
        assert_eq!(g.read_f32(&other, 123, n2).unwrap(), data2, "round {round}: the second write ({n2} words at word 123)");
        let around = g.read_f32(&other, 0, 20_000).unwrap();
        assert!(around[..123].iter().chain(&around[123 + n2..]).all(|v| v.is_nan()), "round {round}: around the second write");
        let got3 = g.read_f32(&small, 0, 16).unwrap();
        assert_eq!(got3[5..12].to_vec(), data3, "round {round}: the small write");
        assert!(got3[..5].iter().chain(&got3[12..]).all(|v| v.is_nan()), "round {round}: around the small write");
        assert_eq!(g.read_f32(&dst, 0, 5 * 13).unwrap(), data[2 * 13..7 * 13].to_vec(), "round {round}: the dispatch after the writes");
    }
}

/// Past the program bound every program is dropped and rebuilt as it recurs: two
/// signatures, each run twice in turn (built through wgpu, then replayed), on a replayer
/// that keeps one, each result still right.
#[test]
fn replay_programs_dropped_at_the_bound_are_rebuilt() {
    let g = crate::gpu::Gpu::new(&Default::default()).unwrap();
    if !g.replay_available() {
        return;
    }
    g.set_replay_max_programs(1).unwrap();
    let kern = Kernels::load(&g).unwrap();
    let mut rng = rng("replay bound");
    let src = g.upload_f32("src", &vec![0.0; 6 * 7]).unwrap();
    let dst = g.buffer("dst", 4 * 6 * 7).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    for round in 0..6 {
        let rows = if round % 4 < 2 { 6 } else { 3 };
        let data: Vec<f32> = (0..6 * 7).map(|_| rng.random_range(-2.0f32..2.0) + 3.0).collect();
        g.write(&dst, 0, bytemuck::cast_slice(&vec![f32::NAN; 6 * 7]));
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::new(&src, 7), Rows::new(&dst, 7), rows, 7).unwrap();
        let t = rec.replay(&[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap();
        assert_eq!(t.is_some(), round % 2 == 1, "round {round}: built, then replayed");
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        let got = g.read_f32(&dst, 0, rows as usize * 7).unwrap();
        assert_eq!(got, data[..rows as usize * 7].to_vec(), "round {round} ({rows} rows)");
        assert_eq!(g.replay_programs(), 1, "round {round}: one program kept");
    }
}

/// A kept recording (`Recorder::replay_kept`) submitted again unrecorded computes what the
/// recording says with each submission's new writes, and once its program has been dropped
/// at the bound (another signature built on a replayer that keeps one) `Kept::submit`
/// answers `None`, so the caller records anew. Outputs poisoned before each round.
#[test]
fn kept_replay_resubmits_until_its_program_is_dropped() {
    let g = crate::gpu::Gpu::new(&Default::default()).unwrap();
    if !g.replay_available() {
        return;
    }
    g.set_replay_max_programs(1).unwrap();
    let kern = Kernels::load(&g).unwrap();
    let mut rng = rng("replay kept");
    let src = g.upload_f32("src", &vec![0.0; 6 * 7]).unwrap();
    let dst = g.buffer("dst", 4 * 6 * 7).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    let mut fresh = |g: &crate::gpu::Gpu| {
        g.write(&dst, 0, bytemuck::cast_slice(&vec![f32::NAN; 6 * 7]));
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
        (0..6 * 7).map(|_| rng.random_range(-2.0f32..2.0) + 3.0).collect::<Vec<f32>>()
    };
    let check = |g: &crate::gpu::Gpu, data: &[f32], rows: usize, what: &str| {
        assert_eq!(g.read_f32(&dst, 0, rows * 7).unwrap(), data[..rows * 7].to_vec(), "{what}");
    };
    // Built (through wgpu), then replayed and kept.
    let mut kept = None;
    for round in 0..2 {
        let data = fresh(&g);
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::new(&src, 7), Rows::new(&dst, 7), 6, 7).unwrap();
        let (t, k) = rec.replay_kept(&[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap();
        assert_eq!(t.is_some(), round == 1, "round {round}: built, then replayed");
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        check(&g, &data, 6, &format!("round {round}"));
        kept = Some(k);
    }
    let kept = kept.unwrap();
    for round in 0..3 {
        let data = fresh(&g);
        let t = kept.submit(&g, &[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap().expect("the program is there");
        g.replay_wait(t).unwrap();
        check(&g, &data, 6, &format!("kept, submission {round}"));
    }
    // Another signature (3 rows) built: the kept one's program goes.
    for _ in 0..2 {
        let data = fresh(&g);
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::new(&src, 7), Rows::new(&dst, 7), 3, 7).unwrap();
        if let Some(t) = rec.replay(&[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap() {
            g.replay_wait(t).unwrap();
        }
        check(&g, &data, 3, "the other signature");
    }
    let data = fresh(&g);
    assert!(kept.submit(&g, &[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap().is_none(), "a dropped program: record anew");
    assert!(g.read_f32(&dst, 0, 6 * 7).unwrap().iter().all(|v| v.is_nan()), "nothing submitted for a dropped program");
}

/// A kept replay's prologue moves (`Kept::submit_with`): copies from a host buffer the host
/// wrote (`Gpu::write_host`) and zero fills, all before
/// the program reads what they wrote; rounds of fresh values, the source and output
/// poisoned first. Ranges a raw command would take past a buffer's end, fills and writes
/// not in whole words, and a host buffer of another device are refused before anything
/// is submitted, and the replay still runs after them.
#[test]
fn kept_replay_moves_from_host_buffers_and_refuses_bad_ranges() {
    let ga = crate::testgpu::gpu_arc();
    let g = &*ga;
    if !g.replay_available() {
        return;
    }
    let kern = Kernels::load(g).unwrap();
    let mut rng = rng("replay moves");
    let (rows, width) = (6usize, 7usize);
    let words = rows * width; // 42
    let src = g.upload_f32("src", &vec![0.0; words]).unwrap();
    let dst = g.buffer("dst", 4 * words as u64).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    let poison = |g: &crate::gpu::Gpu| {
        g.write(&src, 0, bytemuck::cast_slice(&vec![f32::NAN; words]));
        g.write(&dst, 0, bytemuck::cast_slice(&vec![f32::NAN; words]));
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
    };
    let values = |rng: &mut StdRng, n: usize| -> Vec<f32> { (0..n).map(|_| rng.random_range(-2.0f32..2.0) + 3.0).collect() };
    // Built through wgpu, then replayed and kept.
    let mut kept = None;
    for round in 0..2 {
        poison(g);
        let data = values(&mut rng, words);
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::new(&src, width), Rows::new(&dst, width), rows as u32, width as u32).unwrap();
        let (t, k) = rec.replay_kept(&[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap();
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        assert_eq!(g.read_f32(&dst, 0, words).unwrap(), data, "round {round}");
        kept = Some(k);
    }
    let kept = kept.unwrap();
    let hb = g.host_buffer(4 * 100).unwrap();
    assert!(hb.size() >= 400, "{} bytes", hb.size());
    // src words 0..20 from host words 3..23, 20..35 from host words 60..75, 35..42 zero.
    let moves = crate::gpu::Moves {
        host_copies: vec![(&hb, &src, vec![(4 * 3, 0, 4 * 20), (4 * 60, 4 * 20, 4 * 15)])],
        zeros: vec![(&src, 4 * 35, 4 * 7)],
    };
    let run = |g: &crate::gpu::Gpu, rng: &mut StdRng, what: &str| {
        poison(g);
        let host = values(rng, 100);
        // in two writes, the second at an odd word
        g.write_host(&hb, &[(0, bytemuck::cast_slice(&host[..47])), (4 * 47, bytemuck::cast_slice(&host[47..]))]).unwrap();
        let t = kept.submit_with(g, &[], &moves, None).unwrap().expect("the program is there");
        g.replay_wait(t).unwrap();
        let want: Vec<f32> = host[3..23].iter().chain(&host[60..75]).copied().chain(std::iter::repeat_n(0.0, 7)).collect();
        assert_eq!(g.read_f32(&dst, 0, words).unwrap(), want, "{what}");
    };
    for round in 0..3 {
        run(g, &mut rng, &format!("moves, round {round}"));
    }
    // Refused, nothing submitted: each case leaves the poisoned output as it was.
    let other_gpu = crate::gpu::Gpu::new(&Default::default()).unwrap();
    let foreign = other_gpu.host_buffer(400).unwrap();
    let end = hb.size();
    let cases: Vec<(&str, crate::gpu::Moves, Vec<(&wgpu::Buffer, u64, &[u8])>)> = vec![
        ("a zero fill at a byte offset", crate::gpu::Moves { zeros: vec![(&src, 2, 4)], ..Default::default() }, vec![]),
        ("a zero fill of part of a word", crate::gpu::Moves { zeros: vec![(&src, 4, 6)], ..Default::default() }, vec![]),
        ("a zero fill past the end", crate::gpu::Moves { zeros: vec![(&src, 4 * 40, 4 * 3)], ..Default::default() }, vec![]),
        ("a write of part of a word", Default::default(), vec![(&src, 0, &[1u8, 2, 3, 4, 5, 6][..])]),
        ("a write past the end", Default::default(), vec![(&src, 4 * 41, &[0u8; 8][..])]),
        ("a host copy past the host buffer", crate::gpu::Moves { host_copies: vec![(&hb, &src, vec![(end - 4, 0, 8)])], ..Default::default() }, vec![]),
        ("a host copy past the destination", crate::gpu::Moves { host_copies: vec![(&hb, &src, vec![(0, 4 * 40, 12)])], ..Default::default() }, vec![]),
        ("another device's host buffer", crate::gpu::Moves { host_copies: vec![(&foreign, &src, vec![(0, 0, 4)])], ..Default::default() }, vec![]),
    ];
    for (what, mv, writes) in &cases {
        poison(g);
        assert!(kept.submit_with(g, writes, mv, None).is_err(), "{what}: refused");
        assert!(g.read_f32(&dst, 0, words).unwrap().iter().all(|v| v.is_nan()), "{what}: nothing ran");
        assert!(g.read_f32(&src, 0, words).unwrap().iter().all(|v| v.is_nan()), "{what}: nothing written");
    }
    assert!(g.write_host(&hb, &[(0, &[0u8; 4][..]), (end - 4, &[0u8; 8][..])]).is_err(), "a host write past the end");
    assert!(g.write_host(&foreign, &[(0, &[0u8; 4][..])]).is_err(), "a host write into another device's buffer");
    run(g, &mut rng, "moves after the refusals");
    other_gpu.free_host_buffer(foreign).unwrap();
    g.free_host_buffer(hb).unwrap();
}

/// The decode kernels' raw pipelines built at load (`Gpu::prebuild_replay`) are the ones
/// a program then takes: one per kernel, none compiled again when a pass with one of them
/// is built, and its replay right.
#[test]
fn prebuilt_replay_pipelines_are_the_ones_programs_take() {
    let g = crate::gpu::Gpu::new(&Default::default()).unwrap();
    if !g.replay_available() {
        return;
    }
    let kern = Kernels::load(&g).unwrap();
    let decode = kern.decode_kernels(false);
    assert!(decode.iter().any(|k| k.name == "copy_rows"), "copy_rows is a decode kernel");
    assert!(!decode.iter().any(|k| k.name == "gemv_q4_0"), "no block-quantized GEMV without quant");
    assert_eq!(g.replay_pipelines(), 0);
    g.prebuild_replay(&decode).unwrap();
    assert_eq!(g.replay_pipelines(), decode.len(), "one raw pipeline a decode kernel");
    // Again: all there, nothing built twice.
    g.prebuild_replay(&decode).unwrap();
    assert_eq!(g.replay_pipelines(), decode.len());
    let with_q = kern.decode_kernels(true);
    assert_eq!(with_q.len(), decode.len() + 4, "the four block-quantized GEMVs with quant");

    let mut rng = rng("prebuilt replay");
    let (rows, width) = (5u32, 11u32);
    let src = g.upload_f32("src", &vec![0.0; (rows * width) as usize]).unwrap();
    let dst = g.buffer("dst", 4 * (rows * width) as u64).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    for round in 0..2 {
        let data: Vec<f32> = (0..rows * width).map(|_| rng.random_range(-2.0f32..2.0) + 3.0).collect();
        g.write(&dst, 0, bytemuck::cast_slice(&vec![f32::NAN; (rows * width) as usize]));
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
        let mut rec = g.recorder_cached(&mut cache);
        kern.copy_rows(&mut rec, Rows::new(&src, width as usize), Rows::new(&dst, width as usize), rows, width).unwrap();
        let t = rec.replay(&[(&src, 0, bytemuck::cast_slice(&data))], None).unwrap();
        assert_eq!(t.is_some(), round == 1, "round {round}: built, then replayed");
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        assert_eq!(g.read_f32(&dst, 0, (rows * width) as usize).unwrap(), data, "round {round}");
        assert_eq!(g.replay_pipelines(), decode.len(), "round {round}: no pipeline built for the program");
    }
}

/// Passes on either side of main_rows' threshold share dispatch slots with different
/// kernels: each slot keeps both bind groups, so each length keeps its signature and its
/// program (built once, then replayed; with one bind group a slot every pass after the
/// first two was built anew), each result right.
#[test]
fn replay_keeps_programs_across_the_pass_rows_threshold() {
    let g = crate::gpu::Gpu::new(&Default::default()).unwrap();
    if !g.replay_available() {
        return;
    }
    let mut kern = Kernels::load(&g).unwrap();
    let min = gemv_pass_rows_min("9,13").unwrap();
    (kern.gemv_pass_rows, kern.gemv_pass_rows_min) = (gemv_pass_rows_kernels(&g, min).unwrap(), min);
    let mut r = rng("replay threshold");
    let (n, k, most) = (34, 45, 9);
    let w = rand_vec(&mut r, n * k, 0.5);
    let wm = F16Matrix::from_bits(&g, "w", &f16_bits(&w), n, k).unwrap();
    let w16: Vec<f32> = f16_bits(&w).iter().map(|&b| f16::from_bits(b).to_f32()).collect();
    let (gm, bt) = (rand_vec(&mut r, k, 1.0), rand_vec(&mut r, k, 0.5));
    let (gb, bb) = (g.upload_f32("g", &gm).unwrap(), g.upload_f32("b", &bt).unwrap());
    let x = g.upload_f32("x", &vec![0.0; most * k]).unwrap();
    let y = g.buffer("y", (4 * most * n) as u64).unwrap();
    let mut cache = crate::gpu::DispatchCache::default();
    for (round, m) in [8usize, 9, 8, 9, 8, 9].into_iter().enumerate() {
        let data = rand_vec(&mut r, m * k, 1.0);
        g.write(&y, 0, bytemuck::cast_slice(&vec![f32::NAN; most * n]));
        g.queue.submit(std::iter::empty::<wgpu::CommandBuffer>());
        g.wait().unwrap();
        let mut rec = g.recorder_cached(&mut cache);
        let norm = NormArgs { gamma: &gb, beta: &bb, eps: 1e-5 };
        kern.linear_per_row(&mut rec, Rows::new(&x, k), m as u32, Some(norm), &wm, None, Rows::new(&y, n), Epilogue::default()).unwrap();
        let t = rec.replay(&[(&x, 0, bytemuck::cast_slice(&data))], None).unwrap();
        assert_eq!(t.is_some(), round >= 2, "round {round} ({m} rows): built on a length's first pass, then replayed");
        if let Some(t) = t {
            g.replay_wait(t).unwrap();
        }
        let got = g.read_f32(&y, 0, m * n).unwrap();
        let want = ops::linear(&ops::layer_norm(&data, m, k, &gm, &bt, 1e-5), m, k, &w16, n, None);
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "round {round} ({m} rows): rel err {e}");
    }
    assert_eq!(g.replay_programs(), 2, "one program a length");
}

/// The verify passes' feed-forward chunk kernel ([`ffn_decode_late_source`]) against `main`
/// on the same inputs: the same loads and the same arithmetic issued later, so the same bits
/// (on lavapipe; a GPU's compiler is checked by the bench's verify-against-steps guard), and
/// the reference within rounding.
fn run_late_loads(r: &mut StdRng, m: usize, d: usize, ffn: usize) {
    let g = gpu();
    let kern = Kernels::load(g).unwrap();
    assert!(kern.ffn_decode_pass.is_some(), "verify passes take the late kernel by default");
    let what = format!("late loads m={m} d={d} ffn={ffn}");

    // The feed-forward block, rows at an offset and stride, the final norm off.
    let case = FfnCase::new(g, r, d, ffn);
    let (off, stride) = (3, d + 5);
    let len = off + m * stride + 2;
    let (buf, x) = offset_rows(r, len, m, d, off, stride);
    let ffn_out = |pass: bool| -> Vec<f32> {
        let xb = g.upload_f32("x", &buf).unwrap();
        g.fill_u32(&case.scratch, NAN_BITS);
        let mut rec = g.recorder();
        case.run(&kern, &mut rec, Rows::at(&xb, off, stride), m, None, pass);
        rec.submit(None).unwrap();
        g.read_f32(&xb, 0, len).unwrap()
    };
    let (a, b) = (ffn_out(false), ffn_out(true));
    for (i, (x0, x1)) in a.iter().zip(&b).enumerate() {
        assert_eq!(x0.to_bits(), x1.to_bits(), "{what}: ffn word {i} is {x1} late, {x0} by main");
    }
    let rows: Vec<f32> = (0..m).flat_map(|i| b[off + i * stride..off + i * stride + d].to_vec()).collect();
    let e = rel_err(&rows, &case.reference(&x, m));
    assert!(e < 1e-5, "{what}: ffn rel err {e}");
}

#[test]
fn late_loads_keep_the_bits() {
    let mut r = rng("late_loads");
    // tiny.en's shapes with a verify pass's most rows.
    run_late_loads(&mut r, VERIFY_MAX_ROWS as usize, 384, 1536);
    // A ragged last chunk, more output pairs than threads.
    run_late_loads(&mut r, 7, 600, 406);
    // One row (a pass of one position).
    run_late_loads(&mut r, 1, 136, 100);
}
