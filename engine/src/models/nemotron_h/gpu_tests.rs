//! The GPU frame on the `nemotron-h-tiny` fixture: against transformers' logits, prefill
//! in passes against position-by-position decode, verify + rollback against fresh runs,
//! and the speculative loop against plain greedy.

use std::sync::{Arc, OnceLock};

use super::*;
use crate::models::nemotron_h::fixture::{fixture_dir, max_row_rel, Expected};

fn gpu() -> Arc<Gpu> {
    crate::testgpu::gpu_arc()
}

fn model() -> &'static NemotronGpu {
    static M: OnceLock<NemotronGpu> = OnceLock::new();
    M.get_or_init(|| {
        let ck = Checkpoint::open(&fixture_dir()).unwrap();
        NemotronGpu::load(gpu(), &ck).unwrap()
    })
}

fn expected() -> &'static Expected {
    static E: OnceLock<Expected> = OnceLock::new();
    E.get_or_init(Expected::load)
}

const LEN: u32 = 512;

#[test]
fn nh_gpu_prefill_matches_transformers_and_decode() {
    let m = model();
    let ex = expected();
    let v = m.config().vocab_size;
    let ids = ex.ids("prompt_ids");
    let mut ctx = m.context(LEN).unwrap();
    let got = ctx.prefill_tokens(&ids).unwrap();
    assert_eq!(ctx.position() as usize, ids.len());
    let (e, p) = max_row_rel(&got, ex.f32("prompt_logits"), v);
    eprintln!(
        "GPU prefill of {} in passes of 64 vs transformers: {e:.2e} (pos {p})",
        ids.len()
    );
    assert!(e < 1e-3, "prefill vs transformers: {e} at {p}");

    // Position by position: the same logits as the passes.
    let mut one = m.context(LEN).unwrap();
    let mut steps = Vec::with_capacity(got.len());
    for &t in &ids {
        steps.extend(one.decode(t).unwrap());
    }
    let (ed, pd) = max_row_rel(&steps, &got, v);
    let (et, _) = max_row_rel(&steps, ex.f32("prompt_logits"), v);
    eprintln!(
        "GPU decode position by position vs passes: {ed:.2e} (pos {pd}); vs transformers {et:.2e}"
    );
    assert!(
        ed < 1e-4 && et < 1e-3,
        "decode vs prefill {ed}, vs transformers {et}"
    );

    // Greedy continuation, where the fixture's top-2 gap is meaningful.
    let want = ex.ids("greedy_ids");
    let gap = ex.f32("greedy_top2_gap");
    let mut next = argmax(&got[(ids.len() - 1) * v..]);
    let mut agree = 0;
    for (i, &w) in want.iter().enumerate() {
        if gap[i] >= 1e-3 {
            assert_eq!(next, w, "greedy step {i} (gap {})", gap[i]);
            agree += 1;
        }
        // Follow the fixture's tokens so one tie cannot derail the rest.
        next = argmax(&ctx.decode(w).unwrap());
    }
    eprintln!("greedy: {agree} of {} steps checked and equal", want.len());
}

#[test]
fn nh_gpu_embeds_and_trace_match_transformers() {
    let m = model();
    let ex = expected();
    let c = m.config();
    let (v, hid) = (c.vocab_size, c.hidden_size);
    let emb = ex.f32("embeds_input");
    let mut ctx = m.context(LEN).unwrap();
    let got = ctx.prefill_embeds(emb).unwrap();
    let (e, p) = max_row_rel(&got, ex.f32("embeds_logits"), v);
    eprintln!("GPU embeds prefill vs transformers: {e:.2e} (pos {p})");
    assert!(e < 1e-3, "embeds prefill: {e} at {p}");
    let want = ex.ids("embeds_greedy_ids");
    let mut next = argmax(&got[(emb.len() / hid - 1) * v..]);
    let mut agree = 0;
    for &w in &want {
        agree += (next == w) as usize;
        next = argmax(&ctx.decode(w).unwrap());
    }
    eprintln!("embeds greedy: {agree} of {} equal", want.len());
    assert_eq!(agree, want.len());

    // A traced first pass: every layer's hidden state against transformers'.
    let ids = ex.ids("prompt_ids");
    let hs = ex.get("prompt_hidden_states");
    let (nl, len) = (hs.shape[0] - 1, hs.shape[1]);
    let mut ctx = m.context(LEN).unwrap();
    let (_, tr) = ctx.forward_traced(PassInput::Tokens(&ids[..64])).unwrap();
    assert_eq!(tr.layers.len(), nl);
    for l in 0..nl {
        // hidden_states[l + 1] is layer l's output, the last one after the final norm.
        let want = &hs.f32[(l + 1) * len * hid..][..64 * hid];
        let got = if l + 1 == nl {
            &tr.final_norm
        } else {
            &tr.layers[l]
        };
        let (e, p) = max_row_rel(got, want, hid);
        eprintln!("layer {l}: {e:.2e} (pos {p})");
        assert!(e < 1e-3, "layer {l}: {e} at {p}");
    }
}

#[test]
fn nh_gpu_verify_rollback_equals_fresh_runs() {
    let m = model();
    let ex = expected();
    let v = m.config().vocab_size;
    let ids = ex.ids("prompt_ids");
    let p = 70usize;
    for k in [1usize, 5, 8] {
        let mut ctx = m.context(LEN).unwrap();
        ctx.prefill_tokens(&ids[..p]).unwrap();
        let ver = ctx.verify(&ids[p..p + k]).unwrap();
        let full = ex.f32("prompt_logits");
        let (ev, _) = max_row_rel(&ver.logits, &full[p * v..(p + k) * v], v);
        assert!(ev < 1e-3, "verify of {k}: {ev}");
        for (i, &a) in ver.argmax.iter().enumerate() {
            assert_eq!(
                a,
                argmax(&ver.logits[i * v..(i + 1) * v]),
                "argmax of row {i}"
            );
        }
        // Every j, descending (each decode after a rollback overwrites only later KV rows).
        let mut worst = 0f64;
        for j in (0..k).rev() {
            ctx.rollback(j as u32).unwrap();
            assert_eq!(ctx.position() as usize, p + j + 1);
            let next = ids[p + j + 1];
            let step = ctx.decode(next).unwrap();
            let mut fresh = m.context(LEN).unwrap();
            fresh.prefill_tokens(&ids[..p + j + 1]).unwrap();
            let want = fresh.decode(next).unwrap();
            let (e, _) = max_row_rel(&step, &want, v);
            worst = worst.max(e);
        }
        eprintln!("verify of {k}: {ev:.2e} vs transformers; rollback(j) + decode vs fresh, worst {worst:.2e}");
        assert!(worst < 1e-5, "rollback after verify of {k}: {worst}");
    }
}

#[test]
fn nh_gpu_errors_are_values() {
    let m = model();
    let v = m.config().vocab_size as u32;
    let mut ctx = m.context(16).unwrap();
    assert!(
        matches!(ctx.rollback(0), Err(Error::Invalid(_))),
        "rollback before any verify"
    );
    assert!(
        matches!(ctx.decode(v), Err(Error::Invalid(_))),
        "token id out of range"
    );
    assert!(
        matches!(ctx.verify(&[1; 9]), Err(Error::Invalid(_))),
        "verify of 9"
    );
    assert!(
        matches!(ctx.verify(&[]), Err(Error::Invalid(_))),
        "verify of 0"
    );
    assert!(
        matches!(ctx.prefill_tokens(&[1; 17]), Err(Error::Invalid(_))),
        "past max_len"
    );
    assert!(
        matches!(ctx.prefill_embeds(&[0.0; 7]), Err(Error::Invalid(_))),
        "ragged embeds"
    );
    assert_eq!(ctx.position(), 0, "failed calls consume nothing");
    ctx.prefill_tokens(&[1, 2, 3]).unwrap();
    ctx.verify(&[4, 5, 6]).unwrap();
    assert!(
        matches!(ctx.rollback(3), Err(Error::Invalid(_))),
        "rollback past the verify pass"
    );
    ctx.rollback(1).unwrap();
    assert_eq!(ctx.position(), 5);
    ctx.decode(7).unwrap(); // overwrites KV row 5: slot 1 (rows ..=4) stays, slot 2 goes
    assert!(
        matches!(ctx.rollback(2), Err(Error::Invalid(_))),
        "slot overwritten"
    );
    ctx.rollback(0).unwrap();
    assert_eq!(ctx.position(), 4);
}

#[test]
fn nh_gpu_speculative_greedy_equals_plain_greedy() {
    let m = model();
    let ex = expected();
    let ids = ex.ids("prompt_ids");
    let v = m.config().vocab_size;
    let prompt = &ids[..100];
    let steps = 40usize;
    // Plain greedy.
    let mut ctx = m.context(LEN).unwrap();
    let logits = ctx.prefill_tokens(prompt).unwrap();
    let last = logits[(prompt.len() - 1) * v..].to_vec();
    let mut plain = vec![argmax(&last)];
    while plain.len() < steps {
        let l = ctx.decode(*plain.last().unwrap()).unwrap();
        plain.push(argmax(&l));
    }
    // Drafts from the true continuation, partly corrupted: right for a while, then wrong.
    let mut round = 0usize;
    let mut ctx = m.context(LEN).unwrap();
    ctx.prefill_tokens(prompt).unwrap();
    let truth = plain.clone();
    let spec = speculative_greedy(&mut ctx, &last, steps, |sofar, k| {
        round += 1;
        let good = round % (k + 1); // 0..=k right drafts, then wrong ones
        (0..k)
            .map(|i| {
                let t = truth.get(sofar.len() + i).copied().unwrap_or(0);
                if i < good {
                    t
                } else {
                    (t + 1 + i as u32) % v as u32
                }
            })
            .collect()
    })
    .unwrap();
    eprintln!("speculative: {round} verify passes for {steps} tokens");
    assert_eq!(spec, plain);
    assert!(round < steps, "drafts were accepted sometimes");
}

/// `moe_latent_size`: the fixture's frame with its MoE layers given a latent width (random
/// fc1/fc2 latent projections and experts of that width). The GPU frame (prefill in passes,
/// then decode) against the CPU reference on the same weights.
#[test]
fn nh_gpu_latent_moe_matches_reference() {
    use crate::reference::nemotron_h::{Linear, Mixer, Model, Relu2Mlp};
    let mut m = Model::load(&fixture_dir()).unwrap();
    let lat = 48usize;
    m.config.moe.latent_size = Some(lat);
    let hid = m.config.hidden_size;
    let inter = m.config.moe.intermediate_size;
    let mut r = crate::testgpu::rng("nh_gpu_latent_moe");
    let mut lin = |rows: usize, cols: usize| Linear {
        w: crate::testgpu::rand_vec(&mut r, rows * cols, 1.0 / (cols as f32).sqrt()),
        b: None,
        rows,
        cols,
    };
    let mut n_moe = 0;
    for l in &mut m.layers {
        if let Mixer::Moe(w) = &mut l.mixer {
            n_moe += 1;
            for x in &mut w.experts {
                *x = Relu2Mlp { up: lin(inter, lat), down: lin(lat, inter) };
            }
            w.latent = Some((lin(lat, hid), lin(hid, lat)));
        }
    }
    assert!(n_moe > 0);
    let g = NemotronGpu::from_model(gpu(), &m).unwrap();
    let vocab = m.config.vocab_size as u32;
    let prompt: Vec<u32> = (0..70u32).map(|i| (i * 53 + 11) % vocab).collect();
    let mut ctx = g.context(128).unwrap();
    let got = ctx.prefill_tokens(&prompt).unwrap();
    let next = ctx.decode(7 % vocab).unwrap();
    let mut rc = m.context();
    let want = rc.prefill(&prompt).unwrap();
    let want_next = rc.step(7 % vocab).unwrap();
    let (e1, e2) = (max_row_rel(&got, &want, vocab as usize).0, max_row_rel(&next, &want_next, vocab as usize).0);
    println!("latent MoE: prefill (70 positions, passes of 64) {e1:.2e}, decode {e2:.2e}");
    assert!(e1 < 1e-4 && e2 < 1e-4, "prefill {e1}, decode {e2}");
}
