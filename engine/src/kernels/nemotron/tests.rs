//! The Nemotron-H kernels against `crate::reference::nemotron_h` on fresh random, non-zero
//! inputs of awkward sizes, outputs poisoned with NaN first so an unwritten element fails.
//! The seed is printed (`VERBATIM_TEST_SEED=...` replays it).

use rand::rngs::StdRng;
use rand::Rng;

use super::*;
use crate::models::nemotron_h::{MambaConfig, MoeConfig};
use crate::reference::nemotron_h::{self as nh, DtClamp, Linear, MambaWeights};
use crate::testgpu::{gpu, poisoned, rand_vec, rel_err, rng};





fn kernels() -> &'static NemotronKernels {
    static K: std::sync::OnceLock<NemotronKernels> = std::sync::OnceLock::new();
    K.get_or_init(|| NemotronKernels::load(gpu()).unwrap())
}

#[test]
fn nh_add_rmsnorm_matches_reference() {
    let mut r = rng("nh_add_rmsnorm");
    let g = gpu();
    let k = kernels();
    for &(rows, cols, add) in &[
        (1usize, 7usize, true),
        (7, 300, true),
        (64, 1000, false),
        (13, 257, true),
        (3, 2688, true),
    ] {
        // A common offset: the residual stream's rows have a large mean.
        let h: Vec<f32> = rand_vec(&mut r, rows * cols, 2.0)
            .iter()
            .map(|v| v + 5.0)
            .collect();
        let d = rand_vec(&mut r, rows * cols, 1.0);
        let w = rand_vec(&mut r, cols, 1.5);
        let hb = g.upload_f32("h", &h).unwrap();
        let db = g.upload_f32("d", &d).unwrap();
        let wb = g.upload_f32("w", &w).unwrap();
        let yb = poisoned(rows * cols);
        let mut rec = g.recorder();
        k.add_rmsnorm(
            &mut rec,
            &hb,
            add.then_some(&db),
            &wb,
            &yb,
            rows as u32,
            cols as u32,
            1e-5,
        )
        .unwrap();
        rec.submit(None).unwrap();
        let hs: Vec<f32> = if add {
            h.iter().zip(&d).map(|(a, b)| a + b).collect()
        } else {
            h.clone()
        };
        let want = nh::rms_norm(&hs, cols, &w, 1e-5);
        let got_h = g.read_f32(&hb, 0, rows * cols).unwrap();
        assert_eq!(got_h, hs, "residual stream after the add");
        let e = rel_err(&g.read_f32(&yb, 0, rows * cols).unwrap(), &want);
        eprintln!("add_rmsnorm {rows}x{cols} add={add}: rel err {e:.2e}");
        assert!(e < 2e-6, "add_rmsnorm {rows}x{cols}: rel err {e}");
    }
}

/// A random Mamba-2 mixer whose out_proj is the identity, so the reference's output is the
/// gated-normed y the kernels produce.
fn mamba_setup(
    r: &mut StdRng,
    heads: usize,
    head_dim: usize,
    state: usize,
    groups: usize,
    hidden: usize,
    conv_bias: bool,
) -> (MambaConfig, MambaWeights) {
    let m = MambaConfig {
        num_heads: heads,
        head_dim,
        state_size: state,
        n_groups: groups,
        conv_kernel: 4,
        conv_bias,
        proj_bias: false,
        time_step_min: 0.05,
        time_step_limit: (0.0, 0.8),
        chunk_size: 128,
    };
    let inner = m.inner();
    let mut eye = vec![0f32; inner * inner];
    for i in 0..inner {
        eye[i * inner + i] = 1.0;
    }
    let w = MambaWeights {
        in_proj: Linear {
            w: rand_vec(r, m.in_proj_rows() * hidden, 0.3),
            b: None,
            rows: m.in_proj_rows(),
            cols: hidden,
        },
        out_proj: Linear {
            w: eye,
            b: None,
            rows: inner,
            cols: inner,
        },
        conv_w: rand_vec(r, m.conv_dim() * 4, 0.7),
        conv_b: conv_bias.then(|| rand_vec(r, m.conv_dim(), 0.3)),
        a_log: rand_vec(r, heads, 1.5),
        d: rand_vec(r, heads, 1.0),
        dt_bias: rand_vec(r, heads, 2.0),
        norm: rand_vec(r, inner, 1.5),
    };
    (m, w)
}

/// Runs passes of the given sizes through conv + scan + gated norm on the GPU and
/// through the reference; the last pass writes snapshots. Compares y of every pass, the
/// final ring and state, and every snapshot with the reference state after that position.
fn run_mamba(
    r: &mut StdRng,
    heads: usize,
    head_dim: usize,
    state: usize,
    groups: usize,
    passes: &[usize],
    clamp: DtClamp,
) {
    let g = gpu();
    let k = kernels();
    let hidden = 24;
    let (m, w) = mamba_setup(
        r,
        heads,
        head_dim,
        state,
        groups,
        hidden,
        passes.len() % 2 == 1,
    );
    let s = MambaShape::from_config(&m).unwrap();
    let (inner, cdim, rows) = (m.inner(), m.conv_dim(), m.in_proj_rows());
    let (lo, hi) = clamp.bounds(&m);
    let eps = 1e-5;
    // Start from a non-zero state, as after an earlier prompt.
    let mut conv = rand_vec(r, m.conv_state_len(), 1.0);
    let mut ssm = rand_vec(r, m.ssm_state_len(), 0.5);
    let ring = g.upload_f32("ring", &conv).unwrap();
    let st = g.upload_f32("ssm", &ssm).unwrap();
    let cw = g.upload_f32("conv_w", &w.conv_w).unwrap();
    let cb = w
        .conv_b
        .as_ref()
        .map(|b| g.upload_f32("conv_b", b).unwrap());
    let par = g
        .upload_f32("par", &scan_params(&w.a_log, &w.d, &w.dt_bias))
        .unwrap();
    let nw = g.upload_f32("norm", &w.norm).unwrap();
    for (pi, &n) in passes.iter().enumerate() {
        let last = pi + 1 == passes.len();
        let x = rand_vec(r, n * hidden, 1.0);
        let proj = w.in_proj.apply(&x, n);
        let pb = g.upload_f32("proj", &proj).unwrap();
        let xbc = poisoned(n * cdim);
        let y = poisoned(n * inner);
        let (cs, ss) = (poisoned(n * 3 * cdim), poisoned(n * m.ssm_state_len()));
        let mut rec = g.recorder();
        k.mamba_conv(
            &mut rec,
            &s,
            n as u32,
            &pb,
            inner as u32,
            rows as u32,
            &cw,
            cb.as_ref(),
            &ring,
            &xbc,
            last.then_some(&cs),
        )
        .unwrap();
        k.mamba_scan(
            &mut rec,
            &s,
            n as u32,
            &pb,
            (inner + cdim) as u32,
            rows as u32,
            &xbc,
            &par,
            (lo as f32, hi as f32),
            &st,
            &y,
            last.then_some(&ss),
        )
        .unwrap();
        k.gated_norm(
            &mut rec,
            &s,
            n as u32,
            &y,
            &pb,
            0,
            rows as u32,
            &nw,
            eps as f32,
        )
        .unwrap();
        rec.submit(None).unwrap();

        // The reference one position at a time, keeping the state after each.
        let mut want = Vec::with_capacity(n * inner);
        let (mut snap_conv, mut snap_ssm) = (Vec::new(), Vec::new());
        for t in 0..n {
            want.extend(nh::mamba(
                &m,
                clamp,
                eps,
                &w,
                &mut conv,
                &mut ssm,
                &x[t * hidden..(t + 1) * hidden],
                1,
            ));
            snap_conv.extend_from_slice(&conv);
            snap_ssm.extend_from_slice(&ssm);
        }
        let ey = rel_err(&g.read_f32(&y, 0, n * inner).unwrap(), &want);
        let er = rel_err(&g.read_f32(&ring, 0, conv.len()).unwrap(), &conv);
        let es = rel_err(&g.read_f32(&st, 0, ssm.len()).unwrap(), &ssm);
        eprintln!(
            "mamba h{heads} p{head_dim} n{state} g{groups} {clamp:?} pass {pi} (n={n}): y {ey:.2e}, ring {er:.2e}, state {es:.2e}"
        );
        assert!(
            ey < 1e-5 && er < 1e-6 && es < 1e-5,
            "mamba pass {pi}: y {ey}, ring {er}, state {es}"
        );
        if last {
            let ec = rel_err(&g.read_f32(&cs, 0, n * 3 * cdim).unwrap(), &snap_conv);
            let esn = rel_err(
                &g.read_f32(&ss, 0, n * m.ssm_state_len()).unwrap(),
                &snap_ssm,
            );
            eprintln!("  snapshots: ring {ec:.2e}, state {esn:.2e}");
            assert!(ec < 1e-6 && esn < 1e-5, "snapshots: ring {ec}, state {esn}");
        }
    }
}

#[test]
fn nh_mamba_conv_scan_norm_and_snapshots_match_reference() {
    let mut r = rng("nh_mamba");
    run_mamba(&mut r, 6, 40, 20, 3, &[37, 9], DtClamp::TimeStepMin);
    run_mamba(&mut r, 4, 16, 64, 1, &[1, 64, 3], DtClamp::TimeStepLimit);
    run_mamba(&mut r, 8, 32, 32, 2, &[13, 5], DtClamp::None);
    run_mamba(&mut r, 2, 70, 129, 2, &[11], DtClamp::TimeStepMin);
}

fn read_u32(b: &wgpu::Buffer, n: usize) -> Vec<u32> {
    gpu().read_u32(b, 0, n).unwrap()
}

#[test]
fn nh_linear_f32_matches_reference() {
    let mut r = rng("nh_linear_f32");
    let g = gpu();
    let k = kernels();
    for &(m, n, kk, bias, relu2, acc) in &[
        (1usize, 7usize, 5usize, false, false, false),
        (37, 70, 45, true, false, false),
        (64, 130, 300, false, true, false),
        (5, 33, 17, true, true, true),
        (17, 16, 1000, false, false, true),
    ] {
        let x = rand_vec(&mut r, m * kk, 1.0);
        let w = rand_vec(&mut r, n * kk, 0.5);
        let b = rand_vec(&mut r, n, 0.5);
        let y0 = rand_vec(&mut r, m * n, 1.0);
        // x in a wider buffer at an offset, y likewise: the strides are honoured.
        let (xs, ys) = (kk + 3, n + 5);
        let mut xw = rand_vec(&mut r, 2 + m * xs, 1.0);
        for i in 0..m {
            xw[2 + i * xs..2 + i * xs + kk].copy_from_slice(&x[i * kk..(i + 1) * kk]);
        }
        let xb = g.upload_f32("x", &xw).unwrap();
        let wm = F32Weights::upload(g, "w", &w, n, kk).unwrap();
        let bb = g.upload_f32("b", &b).unwrap();
        let yb = poisoned(1 + m * ys);
        if acc {
            for i in 0..m {
                g.write(
                    &yb,
                    ((1 + i * ys) * 4) as u64,
                    bytemuck::cast_slice(&y0[i * n..(i + 1) * n]),
                );
            }
        }
        let mut rec = g.recorder();
        k.linear(
            &mut rec,
            RowsF32::at(&xb, 2, xs as u32),
            m as u32,
            &wm,
            bias.then_some(&bb),
            RowsF32::at(&yb, 1, ys as u32),
            LinearOps {
                relu2,
                accumulate: acc,
            },
        )
        .unwrap();
        rec.submit(None).unwrap();
        let all = g.read_f32(&yb, 0, 1 + m * ys).unwrap();
        let got: Vec<f32> = (0..m)
            .flat_map(|i| all[1 + i * ys..1 + i * ys + n].to_vec())
            .collect();
        let mut want = crate::reference::ops::linear(&x, m, kk, &w, n, bias.then_some(&b[..]));
        for (i, v) in want.iter_mut().enumerate() {
            if relu2 {
                *v = nh::relu2(*v);
            }
            if acc {
                *v += y0[i];
            }
        }
        let e = rel_err(&got, &want);
        eprintln!(
            "linear_f32 m={m} n={n} k={kk} bias={bias} relu2={relu2} acc={acc}: rel err {e:.2e}"
        );
        assert!(e < 1e-5, "linear_f32 m={m} n={n} k={kk}: rel err {e}");
    }
}

fn moe_config(
    ne: usize,
    k: usize,
    n_group: usize,
    topk_group: usize,
    inter: usize,
    shared: usize,
) -> MoeConfig {
    MoeConfig {
        n_routed_experts: ne,
        top_k: k,
        intermediate_size: inter,
        shared_intermediate_size: shared,
        n_shared_experts: 1,
        latent_size: None,
        n_group,
        topk_group,
        norm_topk_prob: true,
        routed_scaling_factor: 2.5,
    }
}

/// The router's choice value of expert i, as the reference computes it.
fn choice_value(logit: f32, bias: f32) -> f64 {
    1.0 / (1.0 + (-(logit as f64)).exp()) + bias as f64
}

/// Compares the GPU's selections and weights with `nh::route`, position by position.
/// A differing pick must be a near-tie in the reference's own choice values.
fn check_routes(
    e: &MoeConfig,
    n: usize,
    logits: &[f32],
    bias: &[f32],
    sel: &[u32],
    wts: &[f32],
) -> f64 {
    let (ne, k) = (e.n_routed_experts, e.top_k);
    let mut worst = 0f64;
    for t in 0..n {
        let lg = &logits[t * ne..(t + 1) * ne];
        let want = nh::route(lg, bias, e);
        let got = &sel[t * k..(t + 1) * k];
        let mut same = true;
        for (s, &(wi, _)) in want.iter().enumerate() {
            let gi = got[s] as usize;
            if gi != wi {
                same = false;
                let (a, b) = (
                    choice_value(lg[wi], bias[wi]),
                    choice_value(lg[gi], bias[gi]),
                );
                assert!(
                    (a - b).abs() < 1e-6,
                    "position {t} slot {s}: GPU chose {gi}, reference {wi} (choice {b} vs {a})"
                );
            }
        }
        if same {
            let ww: Vec<f32> = want.iter().map(|p| p.1).collect();
            worst = worst.max(rel_err(&wts[t * k..(t + 1) * k], &ww));
        }
    }
    worst
}

#[test]
fn nh_route_and_lists_match_reference() {
    let mut r = rng("nh_route");
    let g = gpu();
    let kern = kernels();
    for &(n, ne, k, ng, tg, ties) in &[
        (1usize, 16usize, 4usize, 1usize, 1usize, false),
        (64, 128, 6, 1, 1, false),
        (23, 12, 3, 4, 2, false),
        (9, 300, 8, 1, 1, false),
        (17, 16, 4, 1, 1, true),
        (5, 24, 5, 8, 2, true),
    ] {
        let e = moe_config(ne, k, ng, tg, 1, 1);
        let mut logits = rand_vec(&mut r, n * ne, 3.0);
        let mut bias = rand_vec(&mut r, ne, 0.5);
        if ties {
            // Exact ties: groups of four experts share a logit and a bias.
            for t in 0..n {
                for i in 0..ne {
                    logits[t * ne + i] = logits[t * ne + i / 4 * 4];
                }
            }
            for i in 0..ne {
                bias[i] = bias[i / 4 * 4];
            }
        }
        let lb = g.upload_f32("logits", &logits).unwrap();
        let bb = g.upload_f32("bias", &bias).unwrap();
        let sel = poisoned(n * k);
        let wts = poisoned(n * k);
        let cap = n as u32 + 3;
        let list = poisoned(ne * cap as usize);
        let cnt = poisoned(ne);
        let mut rec = g.recorder();
        kern.route(&mut rec, &e, n as u32, &lb, &bb, &sel, &wts)
            .unwrap();
        kern.expert_lists(
            &mut rec, n as u32, ne as u32, k as u32, &sel, &list, &cnt, cap,
        )
        .unwrap();
        rec.submit(None).unwrap();
        let got_sel = read_u32(&sel, n * k);
        let got_w = g.read_f32(&wts, 0, n * k).unwrap();
        let ew = check_routes(&e, n, &logits, &bias, &got_sel, &got_w);
        eprintln!(
            "route n={n} experts={ne} k={k} groups={ng}/{tg} ties={ties}: weights rel err {ew:.2e}"
        );
        assert!(ew < 1e-6, "route weights: rel err {ew}");
        // Lists: the entries choosing each expert, ascending.
        let got_list = read_u32(&list, ne * cap as usize);
        let got_cnt = read_u32(&cnt, ne);
        for x in 0..ne {
            let want: Vec<u32> = (0..(n * k) as u32)
                .filter(|&j| got_sel[j as usize] == x as u32)
                .collect();
            assert_eq!(got_cnt[x] as usize, want.len(), "expert {x} count");
            assert_eq!(
                &got_list[x * cap as usize..x * cap as usize + want.len()],
                &want[..],
                "expert {x} list"
            );
        }
    }
}

/// The whole MoE mixer on the GPU (router GEMM, top-k, lists, expert GEMMs up → relu² →
/// down over the lists, shared expert, weighted combine) against the reference's route
/// and experts, summed per position in expert order as transformers' loop.
fn run_moe(
    r: &mut StdRng,
    n: usize,
    hidden: usize,
    ne: usize,
    k: usize,
    inter: usize,
    shared: usize,
) {
    let g = gpu();
    let kern = kernels();
    let e = moe_config(ne, k, 1, 1, inter, shared);
    let x = rand_vec(r, n * hidden, 1.0);
    let gate = rand_vec(r, ne * hidden, 0.4);
    let bias = rand_vec(r, ne, 0.1);
    let up = rand_vec(r, ne * inter * hidden, 0.3);
    let down = rand_vec(r, ne * hidden * inter, 0.3);
    let sup = rand_vec(r, shared * hidden, 0.3);
    let sdown = rand_vec(r, hidden * shared, 0.3);

    let xb = g.upload_f32("x", &x).unwrap();
    let gw = F32Weights::upload(g, "gate", &gate, ne, hidden).unwrap();
    let bb = g.upload_f32("bias", &bias).unwrap();
    let upw = F32Weights::upload_bank(g, "up", &up, ne, inter, hidden).unwrap();
    let downw = F32Weights::upload_bank(g, "down", &down, ne, hidden, inter).unwrap();
    let supw = F32Weights::upload(g, "shared up", &sup, shared, hidden).unwrap();
    let sdownw = F32Weights::upload(g, "shared down", &sdown, hidden, shared).unwrap();
    let logits = poisoned(n * ne);
    let (sel, wts) = (poisoned(n * k), poisoned(n * k));
    let cap = PASS_MAX;
    let (list, cnt) = (poisoned(ne * cap as usize), poisoned(ne));
    let hmid = poisoned(n * k * inter);
    let eo = poisoned(n * k * hidden);
    let smid = poisoned(n * shared);
    let out = poisoned(n * hidden);
    let lists = ExpertLists {
        list: &list,
        cnt: &cnt,
        cap,
        top_k: k as u32,
    };
    let (nu, hu) = (n as u32, hidden as u32);
    let mut rec = g.recorder();
    kern.linear(
        &mut rec,
        RowsF32::new(&xb, hu),
        nu,
        &gw,
        None,
        RowsF32::new(&logits, ne as u32),
        LinearOps::default(),
    )
    .unwrap();
    kern.route(&mut rec, &e, nu, &logits, &bb, &sel, &wts)
        .unwrap();
    kern.expert_lists(&mut rec, nu, ne as u32, k as u32, &sel, &list, &cnt, cap)
        .unwrap();
    let relu2 = LinearOps {
        relu2: true,
        accumulate: false,
    };
    kern.expert_linear(
        &mut rec,
        &lists,
        nu,
        RowsF32::new(&xb, hu),
        k as u32,
        &upw,
        RowsF32::new(&hmid, inter as u32),
        relu2,
    )
    .unwrap();
    kern.expert_linear(
        &mut rec,
        &lists,
        nu,
        RowsF32::new(&hmid, inter as u32),
        1,
        &downw,
        RowsF32::new(&eo, hu),
        LinearOps::default(),
    )
    .unwrap();
    // The shared expert, with relu² as its own pass to cover that kernel too.
    kern.linear(
        &mut rec,
        RowsF32::new(&xb, hu),
        nu,
        &supw,
        None,
        RowsF32::new(&smid, shared as u32),
        LinearOps::default(),
    )
    .unwrap();
    kern.relu2(&mut rec, &smid, (n * shared) as u32).unwrap();
    kern.linear(
        &mut rec,
        RowsF32::new(&smid, shared as u32),
        nu,
        &sdownw,
        None,
        RowsF32::new(&out, hu),
        LinearOps::default(),
    )
    .unwrap();
    kern.moe_combine(&mut rec, nu, hu, k as u32, &wts, &eo, &out, true)
        .unwrap();
    rec.submit(None).unwrap();

    // Reference.
    let lg = crate::reference::ops::linear(&x, n, hidden, &gate, ne, None);
    let got_sel = read_u32(&sel, n * k);
    let got_w = g.read_f32(&wts, 0, n * k).unwrap();
    let ew = check_routes(&e, n, &lg, &bias, &got_sel, &got_w);
    let routes: Vec<Vec<(usize, f32)>> = (0..n)
        .map(|t| nh::route(&lg[t * ne..(t + 1) * ne], &bias, &e))
        .collect();
    let mut sum = vec![0f64; n * hidden];
    for ei in 0..ne {
        let mlp = nh::Relu2Mlp {
            up: Linear {
                w: up[ei * inter * hidden..(ei + 1) * inter * hidden].to_vec(),
                b: None,
                rows: inter,
                cols: hidden,
            },
            down: Linear {
                w: down[ei * hidden * inter..(ei + 1) * hidden * inter].to_vec(),
                b: None,
                rows: hidden,
                cols: inter,
            },
        };
        for t in 0..n {
            if let Some(&(_, wt)) = routes[t].iter().find(|p| p.0 == ei) {
                let yv = mlp.apply(&x[t * hidden..(t + 1) * hidden], 1);
                for (s, v) in sum[t * hidden..(t + 1) * hidden].iter_mut().zip(&yv) {
                    *s += wt as f64 * *v as f64;
                }
            }
        }
    }
    let sh = nh::Relu2Mlp {
        up: Linear {
            w: sup,
            b: None,
            rows: shared,
            cols: hidden,
        },
        down: Linear {
            w: sdown,
            b: None,
            rows: hidden,
            cols: shared,
        },
    }
    .apply(&x, n);
    let want: Vec<f32> = sum.iter().zip(&sh).map(|(&a, &b)| a as f32 + b).collect();
    let eout = rel_err(&g.read_f32(&out, 0, n * hidden).unwrap(), &want);
    eprintln!(
        "moe n={n} hidden={hidden} experts={ne} top{k} inter={inter} shared={shared}: weights {ew:.2e}, output {eout:.2e}"
    );
    assert!(eout < 1e-5, "moe output: rel err {eout}");
}

#[test]
fn nh_moe_experts_over_lists_match_reference() {
    let mut r = rng("nh_moe");
    run_moe(&mut r, 1, 40, 16, 4, 24, 36);
    run_moe(&mut r, 37, 72, 16, 4, 40, 56);
    run_moe(&mut r, 64, 33, 11, 3, 19, 21);
}

fn run_gqa(r: &mut StdRng, n: usize, pos0: usize, heads: usize, kv: usize, d: usize) {
    let g = gpu();
    let kern = kernels();
    let len = pos0 + n;
    let q = rand_vec(r, n * heads * d, 1.0);
    let kc = rand_vec(r, len * kv * d, 1.0);
    let vc = rand_vec(r, len * kv * d, 1.0);
    // q in a wider fused buffer (as a fused projection would write it), out likewise.
    let qs = heads * d + 7;
    let mut qw = rand_vec(r, 3 + n * qs, 1.0);
    for t in 0..n {
        qw[3 + t * qs..3 + t * qs + heads * d]
            .copy_from_slice(&q[t * heads * d..(t + 1) * heads * d]);
    }
    // The cache buffer has room beyond the pass (stale rows the kernel must not read).
    let mut kcb = kc.clone();
    kcb.extend(rand_vec(r, 5 * kv * d, 50.0));
    let mut vcb = vc.clone();
    vcb.extend(rand_vec(r, 5 * kv * d, 50.0));
    let qb = g.upload_f32("q", &qw).unwrap();
    let kb = g.upload_f32("k", &kcb).unwrap();
    let vb = g.upload_f32("v", &vcb).unwrap();
    let out = poisoned(n * heads * d);
    let a = GqaShape {
        n: n as u32,
        pos0: pos0 as u32,
        heads: heads as u32,
        kv_heads: kv as u32,
        head_dim: d as u32,
    };
    let mut rec = g.recorder();
    kern.gqa(
        &mut rec,
        &a,
        RowsF32::at(&qb, 3, qs as u32),
        &kb,
        &vb,
        RowsF32::new(&out, (heads * d) as u32),
    )
    .unwrap();
    rec.submit(None).unwrap();
    let want = nh::gqa_attention(&q, &kc, &vc, n, pos0, heads, kv, d);
    let e = rel_err(&g.read_f32(&out, 0, n * heads * d).unwrap(), &want);
    eprintln!("gqa n={n} pos0={pos0} heads={heads}/{kv} d={d}: rel err {e:.2e}");
    assert!(
        e < 1e-5,
        "gqa n={n} pos0={pos0} heads={heads}/{kv} d={d}: rel err {e}"
    );
    // Split over workgroups and merged; chunk 37 leaves empty splits for early queries.
    for chunk in [64u32, 37] {
        let part = poisoned(NemotronKernels::gqa_part_len(&a, chunk) as usize);
        let out = poisoned(n * heads * d);
        let mut rec = g.recorder();
        kern.gqa_split(
            &mut rec,
            &a,
            RowsF32::at(&qb, 3, qs as u32),
            &kb,
            &vb,
            RowsF32::new(&out, (heads * d) as u32),
            &part,
            chunk,
        )
        .unwrap();
        rec.submit(None).unwrap();
        let e = rel_err(&g.read_f32(&out, 0, n * heads * d).unwrap(), &want);
        eprintln!("  split in chunks of {chunk}: rel err {e:.2e}");
        assert!(
            e < 1e-5,
            "gqa split {chunk} n={n} pos0={pos0} heads={heads}/{kv} d={d}: rel err {e}"
        );
    }
}

#[test]
fn nh_gqa_matches_reference() {
    let mut r = rng("nh_gqa");
    run_gqa(&mut r, 1, 0, 4, 1, 8);
    run_gqa(&mut r, 13, 0, 8, 2, 32);
    run_gqa(&mut r, 64, 100, 6, 3, 40);
    run_gqa(&mut r, 1, 419, 32, 2, 128);
    run_gqa(&mut r, 7, 70, 5, 5, 100);
}

#[test]
fn nh_argmax_matches_reference() {
    let mut r = rng("nh_argmax");
    let g = gpu();
    let kern = kernels();
    for &(n, vocab) in &[(1usize, 7usize), (64, 1000), (5, 131072), (9, 257)] {
        let mut l = rand_vec(&mut r, n * vocab, 4.0);
        // Ties: row 0's maximum repeated at a later id must not win.
        let (bi, _) = nh::argmax(&l[..vocab]);
        if bi + 1 < vocab {
            l[bi + 1 + (vocab - bi - 1) / 2] = l[bi];
        }
        let lb = g.upload_f32("logits", &l).unwrap();
        let ids = poisoned(n);
        let mut rec = g.recorder();
        kern.argmax(
            &mut rec,
            n as u32,
            vocab as u32,
            RowsF32::new(&lb, vocab as u32),
            &ids,
        )
        .unwrap();
        rec.submit(None).unwrap();
        let got = read_u32(&ids, n);
        let want: Vec<u32> = (0..n)
            .map(|t| nh::argmax(&l[t * vocab..(t + 1) * vocab]).0 as u32)
            .collect();
        assert_eq!(got, want, "argmax n={n} vocab={vocab}");
    }
}

#[test]
fn nh_embed_gathers_rows() {
    let mut r = rng("nh_embed");
    let g = gpu();
    let kern = kernels();
    let (vocab, hidden, n) = (37usize, 70usize, 13usize);
    let emb = rand_vec(&mut r, vocab * hidden, 1.0);
    let mut ids: Vec<u32> = (0..n + 2)
        .map(|_| r.random_range(0..vocab as u32))
        .collect();
    ids[5] = vocab as u32 + 3; // out of range: a zero row
    let ib = g.upload_u32("ids", &ids).unwrap();
    let eb = g.upload_f32("emb", &emb).unwrap();
    let h = poisoned(n * hidden);
    let mut rec = g.recorder();
    kern.embed(
        &mut rec,
        n as u32,
        &ib,
        2,
        &eb,
        vocab as u32,
        hidden as u32,
        &h,
    )
    .unwrap();
    rec.submit(None).unwrap();
    let got = g.read_f32(&h, 0, n * hidden).unwrap();
    for t in 0..n {
        let id = ids[2 + t] as usize;
        let want: Vec<f32> = if id < vocab {
            emb[id * hidden..(id + 1) * hidden].to_vec()
        } else {
            vec![0.0; hidden]
        };
        assert_eq!(
            &got[t * hidden..(t + 1) * hidden],
            &want[..],
            "position {t}"
        );
    }
}

#[test]
fn nh_add_moe_rmsnorm_matches_reference() {
    let mut r = rng("nh_add_moe_rmsnorm");
    let g = gpu();
    let k = kernels();
    for &(rows, cols, tk) in &[(1usize, 40usize, 4usize), (64, 257, 6), (9, 1000, 3)] {
        let h: Vec<f32> = rand_vec(&mut r, rows * cols, 2.0)
            .iter()
            .map(|v| v + 5.0)
            .collect();
        let shared = rand_vec(&mut r, rows * cols, 1.0);
        let wts = rand_vec(&mut r, rows * tk, 1.0);
        let eo = rand_vec(&mut r, rows * tk * cols, 1.0);
        let w = rand_vec(&mut r, cols, 1.5);
        let (hb, sb, wb, eb, nb) = (
            g.upload_f32("h", &h).unwrap(),
            g.upload_f32("shared", &shared).unwrap(),
            g.upload_f32("wts", &wts).unwrap(),
            g.upload_f32("eo", &eo).unwrap(),
            g.upload_f32("w", &w).unwrap(),
        );
        let yb = poisoned(rows * cols);
        let mut rec = g.recorder();
        k.add_moe_rmsnorm(
            &mut rec,
            &hb,
            &sb,
            &wb,
            &eb,
            tk as u32,
            &nb,
            &yb,
            rows as u32,
            cols as u32,
            1e-5,
        )
        .unwrap();
        rec.submit(None).unwrap();
        // The reference's MoE output: routed sum in f64, then + shared.
        let mut hs = h.clone();
        for t in 0..rows {
            for c in 0..cols {
                let routed: f64 = (0..tk)
                    .map(|s| wts[t * tk + s] as f64 * eo[(t * tk + s) * cols + c] as f64)
                    .sum();
                hs[t * cols + c] += routed as f32 + shared[t * cols + c];
            }
        }
        let eh = rel_err(&g.read_f32(&hb, 0, rows * cols).unwrap(), &hs);
        let ey = rel_err(
            &g.read_f32(&yb, 0, rows * cols).unwrap(),
            &nh::rms_norm(&hs, cols, &w, 1e-5),
        );
        eprintln!("add_moe_rmsnorm {rows}x{cols} top{tk}: h {eh:.2e}, y {ey:.2e}");
        assert!(
            eh < 1e-6 && ey < 1e-6,
            "add_moe_rmsnorm {rows}x{cols}: h {eh}, y {ey}"
        );
    }
}
