//! The quantized expert GEMMs against the CPU reference (dequantize, then the f32 GEMM of
//! `reference::ops::linear`) on fresh random non-zero inputs of awkward sizes, outputs
//! poisoned with NaN first; and the residency map: a partly resident bank plus the host's
//! rows equals the all-resident bank and the reference.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;

use super::*;
use crate::kernels::nemotron::{ExpertLists, LinearOps, NemotronKernels, RowsF32, PASS_MAX};
use crate::quant::{QuantFormat, QuantMatrix};
use crate::reference::nemotron_h::relu2;
use crate::reference::ops::linear;
use crate::testgpu::{gpu, poisoned, rand_vec, rel_err, rng};

fn kernels() -> &'static NemotronKernels {
    static K: std::sync::OnceLock<NemotronKernels> = std::sync::OnceLock::new();
    K.get_or_init(|| NemotronKernels::load(gpu()).unwrap())
}

/// Random routing of `n` positions to `k` distinct experts of `ne`: (sel, lists, counts).
fn random_lists(
    r: &mut StdRng,
    n: usize,
    ne: usize,
    k: usize,
    cap: usize,
) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let mut sel = Vec::with_capacity(n * k);
    let mut ids: Vec<u32> = (0..ne as u32).collect();
    for _ in 0..n {
        ids.shuffle(r);
        sel.extend_from_slice(&ids[..k]);
    }
    let mut list = vec![u32::MAX; ne * cap];
    let mut cnt = vec![0u32; ne];
    for (j, &e) in sel.iter().enumerate() {
        let e = e as usize;
        list[e * cap + cnt[e] as usize] = j as u32;
        cnt[e] += 1;
    }
    (sel, list, cnt)
}

fn quantize_bank(
    r: &mut StdRng,
    format: QuantFormat,
    ne: usize,
    rows: usize,
    cols: usize,
) -> (Vec<QuantMatrix>, Vec<Vec<f32>>) {
    let mut mats = Vec::new();
    let mut deq = Vec::new();
    for _ in 0..ne {
        // Heavy-ish rows: a per-row magnitude spread, so the scales vary.
        let mut w = rand_vec(r, rows * cols, 0.5);
        for row in w.chunks_mut(cols) {
            let f: f32 = r.random_range(0.1..3.0);
            row.iter_mut().for_each(|v| *v *= f);
        }
        let q = QuantMatrix::quantize(format, &w, rows, cols).unwrap();
        deq.push(q.dequantize());
        mats.push(q);
    }
    (mats, deq)
}

/// (format, positions, experts, top-k, rows, cols, x row per position, relu², accumulate)
type Case = (
    QuantFormat,
    usize,
    usize,
    usize,
    usize,
    usize,
    bool,
    bool,
    bool,
);

#[test]
fn nh_expert_quant_matches_reference() {
    let mut r = rng("nh_expert_quant");
    let g = gpu();
    let kern = kernels();
    // (format, positions, experts, top-k, rows, cols, x row per position, relu², accumulate)
    let cases: &[Case] = &[
        (QuantFormat::Q4tp, 1, 16, 4, 37, 96, true, true, false),
        (QuantFormat::Q4tp, 37, 11, 3, 50, 160, true, false, false),
        (QuantFormat::Q4tp, 64, 16, 4, 33, 100, false, false, true),
        (QuantFormat::Q4tp, 20, 5, 2, 64, 1000, true, false, false),
        (QuantFormat::Q8_2f, 1, 16, 4, 37, 96, true, true, false),
        (QuantFormat::Q8_2f, 37, 11, 3, 50, 7, true, false, false),
        (QuantFormat::Q8_2f, 64, 16, 4, 33, 100, false, false, true),
        (QuantFormat::Q8_2f, 20, 5, 2, 65, 1001, true, true, false),
    ];
    for &(format, n, ne, k, rows, cols, per_pos, act, acc) in cases {
        let cap = PASS_MAX as usize;
        let (_, list, cnt) = random_lists(&mut r, n, ne, k, cap);
        let (mats, deq) = quantize_bank(&mut r, format, ne, rows, cols);
        let refs: Vec<&QuantMatrix> = mats.iter().collect();
        let bank = QuantBank::upload(g, "bank", &refs, &vec![true; ne]).unwrap();
        let xrows = if per_pos { n } else { n * k };
        let x = rand_vec(&mut r, xrows * cols, 1.0);
        // x and y in wider buffers at offsets: the strides are honoured.
        let (xo, xs, yo, ys) = (3usize, cols + 5, 1usize, rows + 3);
        let mut xw = rand_vec(&mut r, xo + xrows * xs, 1.0);
        for i in 0..xrows {
            xw[xo + i * xs..xo + i * xs + cols].copy_from_slice(&x[i * cols..(i + 1) * cols]);
        }
        let y0 = rand_vec(&mut r, n * k * rows, 1.0);
        let yb = poisoned(yo + n * k * ys);
        if acc {
            for j in 0..n * k {
                g.write(
                    &yb,
                    ((yo + j * ys) * 4) as u64,
                    bytemuck::cast_slice(&y0[j * rows..(j + 1) * rows]),
                );
            }
        }
        let (xb, lb, cb) = (
            g.upload_f32("x", &xw).unwrap(),
            g.upload_u32("list", &list).unwrap(),
            g.upload_u32("cnt", &cnt).unwrap(),
        );
        let lists = ExpertLists {
            list: &lb,
            cnt: &cb,
            cap: cap as u32,
            top_k: k as u32,
        };
        let mut rec = g.recorder();
        kern.expert_linear_quant(
            &mut rec,
            &lists,
            n as u32,
            RowsF32::at(&xb, xo as u32, xs as u32),
            if per_pos { k as u32 } else { 1 },
            &bank,
            RowsF32::at(&yb, yo as u32, ys as u32),
            LinearOps {
                relu2: act,
                accumulate: acc,
            },
        )
        .unwrap();
        rec.submit(None).unwrap();
        let all = g.read_f32(&yb, 0, yo + n * k * ys).unwrap();
        let mut got = Vec::with_capacity(n * k * rows);
        let mut want = Vec::with_capacity(n * k * rows);
        for j in 0..n * k {
            let e = (0..ne)
                .find(|&e| list[e * cap..e * cap + cnt[e] as usize].contains(&(j as u32)))
                .unwrap();
            let xr = if per_pos { j / k } else { j };
            let mut yv = linear(&x[xr * cols..(xr + 1) * cols], 1, cols, &deq[e], rows, None);
            for (i, v) in yv.iter_mut().enumerate() {
                if act {
                    *v = relu2(*v);
                }
                if acc {
                    *v += y0[j * rows + i];
                }
            }
            want.extend(yv);
            got.extend_from_slice(&all[yo + j * ys..yo + j * ys + rows]);
        }
        let e = rel_err(&got, &want);
        eprintln!(
            "{} n={n} experts={ne} top{k} [{rows}][{cols}] per_pos={per_pos} relu2={act} acc={acc}: rel err {e:.2e}",
            format.name()
        );
        assert!(e < 1e-5, "{} [{rows}][{cols}]: rel err {e}", format.name());
        // The stride gaps were not written.
        assert!(all[..yo].iter().all(|v| v.is_nan()));
        assert!(all[yo + rows..yo + ys].iter().all(|v| v.is_nan()));
    }
}

/// A layer's routed experts (up → relu² → down over the lists) with a partly resident bank
/// and the missing experts' rows from the host, against the all-resident bank and the
/// reference. `resident_share`: each expert's chance to be resident (0: all on the host).
#[allow(clippy::too_many_arguments)]
fn residency_case(
    r: &mut StdRng,
    format: QuantFormat,
    n: usize,
    ne: usize,
    k: usize,
    hidden: usize,
    inter: usize,
    resident_share: f64,
) {
    let g = gpu();
    let kern = kernels();
    let cap = PASS_MAX as usize;
    let (sel, list, cnt) = random_lists(r, n, ne, k, cap);
    let (ups, up_deq) = quantize_bank(r, format, ne, inter, hidden);
    let (downs, down_deq) = quantize_bank(r, format, ne, hidden, inter);
    let x = rand_vec(r, n * hidden, 1.0);
    let mut resident: Vec<bool> = (0..ne).map(|_| r.random_bool(resident_share)).collect();
    resident[0] = resident_share > 0.0;
    resident[ne - 1] = false;
    let (xb, lb, cb) = (
        g.upload_f32("x", &x).unwrap(),
        g.upload_u32("list", &list).unwrap(),
        g.upload_u32("cnt", &cnt).unwrap(),
    );
    let lists = ExpertLists {
        list: &lb,
        cnt: &cb,
        cap: cap as u32,
        top_k: k as u32,
    };
    let run = |res: &[bool]| -> Vec<f32> {
        let ur: Vec<&QuantMatrix> = ups.iter().collect();
        let dr: Vec<&QuantMatrix> = downs.iter().collect();
        let up = QuantBank::upload(g, "up", &ur, res).unwrap();
        let down = QuantBank::upload(g, "down", &dr, res).unwrap();
        let hmid = poisoned(n * k * inter);
        let eo = poisoned(n * k * hidden);
        let mut rec = g.recorder();
        let relu = LinearOps {
            relu2: true,
            accumulate: false,
        };
        kern.expert_linear_quant(
            &mut rec,
            &lists,
            n as u32,
            RowsF32::new(&xb, hidden as u32),
            k as u32,
            &up,
            RowsF32::new(&hmid, inter as u32),
            relu,
        )
        .unwrap();
        kern.expert_linear_quant(
            &mut rec,
            &lists,
            n as u32,
            RowsF32::new(&hmid, inter as u32),
            1,
            &down,
            RowsF32::new(&eo, hidden as u32),
            LinearOps::default(),
        )
        .unwrap();
        rec.submit(None).unwrap();
        let mut out = g.read_f32(&eo, 0, n * k * hidden).unwrap();
        // The kernel left the missing experts' rows alone; the host fills them in.
        for (j, &e) in sel.iter().enumerate() {
            let row = &mut out[j * hidden..(j + 1) * hidden];
            if !up.resident(e as usize) {
                assert!(
                    row.iter().all(|v| v.is_nan()),
                    "expert {e} is not resident but entry {j} was written"
                );
                let t = j / k;
                let h = host_expert(
                    &ups[e as usize],
                    &downs[e as usize],
                    &x[t * hidden..(t + 1) * hidden],
                    1,
                )
                .unwrap();
                row.copy_from_slice(&h);
            }
        }
        out
    };
    let all = run(&vec![true; ne]);
    let part = run(&resident);
    let mut want = Vec::with_capacity(n * k * hidden);
    for (j, &e) in sel.iter().enumerate() {
        let t = j / k;
        let mut h = linear(
            &x[t * hidden..(t + 1) * hidden],
            1,
            hidden,
            &up_deq[e as usize],
            inter,
            None,
        );
        h.iter_mut().for_each(|v| *v = relu2(*v));
        want.extend(linear(&h, 1, inter, &down_deq[e as usize], hidden, None));
    }
    let (ea, ep, epa) = (
        rel_err(&all, &want),
        rel_err(&part, &want),
        rel_err(&part, &all),
    );
    eprintln!(
        "{} residency {}/{ne} n={n} top{k} hidden={hidden} inter={inter}: all-resident vs ref {ea:.2e}, \
         partly resident vs ref {ep:.2e}, vs all-resident {epa:.2e}",
        format.name(),
        resident.iter().filter(|&&b| b).count()
    );
    assert!(ea < 1e-5 && ep < 1e-5 && epa < 1e-5, "{ea} {ep} {epa}");
}

#[test]
fn nh_expert_quant_residency_map_matches_all_resident() {
    let mut r = rng("nh_expert_residency");
    residency_case(&mut r, QuantFormat::Q4tp, 37, 16, 4, 96, 64, 0.5);
    residency_case(&mut r, QuantFormat::Q8_2f, 37, 16, 4, 72, 44, 0.5);
    residency_case(&mut r, QuantFormat::Q4tp, 1, 8, 2, 64, 32, 0.5);
    // Nothing resident: the bank is a placeholder, every entry comes from the host.
    residency_case(&mut r, QuantFormat::Q8_2f, 9, 6, 3, 40, 36, 0.0);
}

#[test]
fn quant_bank_rejects_bad_input() {
    let g = gpu();
    let a = QuantMatrix::quantize(QuantFormat::Q4tp, &[0.5; 64], 2, 32).unwrap();
    let b = QuantMatrix::quantize(QuantFormat::Q8_2f, &[0.5; 64], 2, 32).unwrap();
    let c = QuantMatrix::quantize(QuantFormat::Q4tp, &[0.5; 64], 1, 64).unwrap();
    assert!(QuantBank::upload(g, "b", &[], &[]).is_err());
    assert!(QuantBank::upload(g, "b", &[&a, &b], &[true, true]).is_err());
    assert!(QuantBank::upload(g, "b", &[&a, &c], &[true, true]).is_err());
    assert!(QuantBank::upload(g, "b", &[&a, &a], &[true]).is_err());
    let none = QuantBank::upload(g, "b", &[&a, &a], &[false, false]).unwrap();
    assert_eq!(none.resident_count(), 0);
    assert!(host_expert(&a, &a, &[1.0; 32], 1).is_err());
}
