//! The frame with quantized experts on the `nemotron-h-tiny` fixture: all-resident banks
//! against the CPU reference run with the same (dequantized) expert weights and against the
//! f32 frame (the quantization's effect, reported); a random residency map (some experts on
//! the host) against the all-resident run, through prefill passes, decode, verify and
//! rollback.

use std::sync::{Arc, OnceLock};

use rand::Rng;

use super::*;
use crate::models::nemotron_h::fixture::{fixture_dir, max_row_rel, Expected};
use crate::reference::nemotron_h::Mixer;

fn gpu() -> Arc<Gpu> {
    crate::testgpu::gpu_arc()
}

fn reference() -> &'static Model {
    static M: OnceLock<Model> = OnceLock::new();
    M.get_or_init(|| Model::from_checkpoint(&Checkpoint::open(&fixture_dir()).unwrap()).unwrap())
}

fn prompt() -> Vec<u32> {
    static E: OnceLock<Expected> = OnceLock::new();
    // 130 positions: passes of 64, 64 and 2.
    E.get_or_init(Expected::load).ids("prompt_ids")[..130].to_vec()
}

const LEN: u32 = 256;

/// The reference model with every routed expert's weights replaced by their quantized
/// values: what the quantized frame computes, in the reference's arithmetic.
fn dequantized(m: &Model, format: QuantFormat) -> Model {
    let mut d = m.clone();
    for l in &mut d.layers {
        if let Mixer::Moe(w) = &mut l.mixer {
            for x in &mut w.experts {
                for lin in [&mut x.up, &mut x.down] {
                    lin.w = QuantMatrix::quantize(format, &lin.w, lin.rows, lin.cols)
                        .unwrap()
                        .dequantize();
                }
            }
        }
    }
    d
}

#[test]
fn nh_gpu_quantized_experts_match_reference_and_track_f32() {
    let m = reference();
    let ids = prompt();
    let v = m.config.vocab_size;
    let f32m = NemotronGpu::from_model(gpu(), m).unwrap();
    let base = f32m.context(LEN).unwrap().prefill_tokens(&ids).unwrap();
    // Bounds on the quantization's effect on the logits: regression guards over what was
    // measured (q8_2f 1.1e-2, q4tp 0.31 at the worst of 130 positions: random weights give
    // the logits no margin).
    for (format, bound) in [(QuantFormat::Q8_2f, 0.03), (QuantFormat::Q4tp, 0.5)] {
        let opts = ExpertOptions {
            format: Some(format),
            resident: Vec::new(),
        };
        let q = NemotronGpu::from_model_with(gpu(), m, &opts).unwrap();
        let got = q.context(LEN).unwrap().prefill_tokens(&ids).unwrap();
        let want = dequantized(m, format).context().prefill(&ids).unwrap();
        let (er, pr) = max_row_rel(&got, &want, v);
        let (ef, pf) = max_row_rel(&got, &base, v);
        let mean = (0..ids.len())
            .map(|t| max_row_rel(&got[t * v..(t + 1) * v], &base[t * v..(t + 1) * v], v).0)
            .sum::<f64>()
            / ids.len() as f64;
        let agree = (0..ids.len())
            .filter(|&t| argmax(&got[t * v..(t + 1) * v]) == argmax(&base[t * v..(t + 1) * v]))
            .count();
        eprintln!(
            "{} experts, {} positions: vs the reference with the same weights {er:.2e} (pos {pr}); \
             vs the f32 frame {ef:.2e} (pos {pf}, mean over positions {mean:.2e}), argmax equal at {agree} of {}",
            format.name(),
            ids.len(),
            ids.len()
        );
        assert!(
            er < 1e-4,
            "{} frame vs reference: {er} at {pr}",
            format.name()
        );
        assert!(ef < bound, "{} frame vs f32: {ef} at {pf}", format.name());
    }
}

#[test]
fn nh_gpu_partly_resident_experts_equal_all_resident() {
    let m = reference();
    let ids = prompt();
    let v = m.config.vocab_size;
    let ne = m.config.moe.n_routed_experts;
    let mut r = crate::testgpu::rng("nh_gpu_residency");
    for format in [QuantFormat::Q4tp, QuantFormat::Q8_2f] {
        let resident: Vec<Vec<bool>> = m
            .layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Moe(_) => {
                    let mut v: Vec<bool> = (0..ne).map(|_| r.random_bool(0.5)).collect();
                    v[0] = false; // at least one on the host
                    v
                }
                _ => Vec::new(),
            })
            .collect();
        let all = NemotronGpu::from_model_with(
            gpu(),
            m,
            &ExpertOptions {
                format: Some(format),
                resident: Vec::new(),
            },
        )
        .unwrap();
        let part = NemotronGpu::from_model_with(
            gpu(),
            m,
            &ExpertOptions {
                format: Some(format),
                resident: resident.clone(),
            },
        )
        .unwrap();
        // Prefill in passes, then decode.
        let (mut ca, mut cp) = (all.context(LEN).unwrap(), part.context(LEN).unwrap());
        let mut la = ca.prefill_tokens(&ids).unwrap();
        let mut lp = cp.prefill_tokens(&ids).unwrap();
        for &t in &[7u32, 300, 41] {
            la.extend(ca.decode(t).unwrap());
            lp.extend(cp.decode(t).unwrap());
        }
        let (e, p) = max_row_rel(&lp, &la, v);
        // Verify 5, roll back to position 2 of it, decode: against a plain run to there.
        let mut cv = part.context(LEN).unwrap();
        cv.prefill_tokens(&ids[..100]).unwrap();
        let ver = cv.verify(&ids[100..105]).unwrap();
        cv.rollback(2).unwrap();
        let after = cv.decode(ids[103]).unwrap();
        let fresh = all
            .context(LEN)
            .unwrap()
            .prefill_tokens(&ids[..105])
            .unwrap();
        let (ev, _) = max_row_rel(&ver.logits, &fresh[100 * v..105 * v], v);
        let (er0, _) = max_row_rel(&after, &fresh[103 * v..104 * v], v);
        eprintln!(
            "{} with {:?} resident: partly vs all resident {e:.2e} (pos {p}); verify {ev:.2e}, after rollback {er0:.2e}",
            format.name(),
            resident.iter().filter(|x| !x.is_empty()).map(|x| x.iter().filter(|&&b| b).count()).collect::<Vec<_>>()
        );
        assert!(e < 1e-5 && ev < 1e-5 && er0 < 1e-5, "{e} {ev} {er0}");
    }
}

#[test]
fn nh_gpu_expert_options_are_checked() {
    let m = reference();
    let g = gpu();
    // A residency map of the wrong size, and one without quantized experts.
    let bad = ExpertOptions {
        format: Some(QuantFormat::Q4tp),
        resident: vec![Vec::new(); 2],
    };
    assert!(NemotronGpu::from_model_with(g.clone(), m, &bad).is_err());
    let ne = m.config.moe.n_routed_experts;
    let layers = m.layers.len();
    let half: Vec<Vec<bool>> = (0..layers)
        .map(|_| (0..ne).map(|e| e % 2 == 0).collect())
        .collect();
    let f32_partial = ExpertOptions {
        format: None,
        resident: half.clone(),
    };
    assert!(NemotronGpu::from_model_with(g.clone(), m, &f32_partial).is_err());
    let wrong = ExpertOptions {
        format: Some(QuantFormat::Q8_2f),
        resident: (0..layers).map(|_| vec![true; ne + 1]).collect(),
    };
    assert!(NemotronGpu::from_model_with(g, m, &wrong).is_err());
}
