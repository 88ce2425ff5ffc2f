//! `verbatim lm-check MODEL_DIR EXPECTED.safetensors`: runs an outside fixture's prompts
//! through the GPU Nemotron-H frame and holds the results to the fixture's (transformers')
//! outputs.
//!
//! For each input set the fixture has (`prompt_ids`, `embeds_input`): prefill in passes of
//! up to 64 positions and position by position, the max relative logit error (per pass and
//! overall; `--every-position` prints each position), the per-layer hidden-state error when
//! the fixture has `prompt_hidden_states`, and how many greedy tokens equal the fixture's,
//! skipping steps whose top-2 gap is below `--min-gap` (the fixture's `greedy_top2_gap`
//! where it has one, else our own gap). Exit 0 only when everything is within bounds,
//! 1 when anything is not (or fails), 2 for a usage error.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use engine::gpu::{Gpu, GpuOptions};
use engine::kernels::nemotron::PASS_MAX;
use engine::models::nemotron_h::fixture::{max_row_rel, Expected};
use engine::models::nemotron_h::gpu::{argmax, NemotronGpu, PassInput};
use engine::models::nemotron_h::Checkpoint;

#[derive(clap::Args)]
pub struct Args {
    /// A Hugging Face Nemotron-H checkpoint directory (config.json + safetensors).
    #[arg(value_name = "MODEL_DIR")]
    model: PathBuf,

    /// The fixture's expected outputs (prompt_ids, prompt_logits, greedy_ids, ...).
    #[arg(value_name = "EXPECTED")]
    expected: PathBuf,

    /// Largest max-over-positions relative logit (and hidden-state) error that passes.
    #[arg(long, default_value_t = 1e-3, value_name = "REL")]
    tolerance: f64,

    /// Greedy steps whose top-2 logit gap is below this are not compared (ties).
    #[arg(long, default_value_t = 1e-3, value_name = "GAP")]
    min_gap: f32,

    /// Print the relative logit error at every position, not only per pass.
    #[arg(long)]
    every_position: bool,

    /// Use the adapter whose name contains this text.
    #[arg(long, value_name = "NAME")]
    adapter: Option<String>,
}

/// One input set of the fixture.
struct Set {
    name: &'static str,
    input: Input,
    logits: &'static str,
    greedy: &'static str,
    gap: Option<&'static str>,
    hidden: Option<&'static str>,
}

enum Input {
    Ids(&'static str),
    Embeds(&'static str),
}

const SETS: [Set; 2] = [
    Set {
        name: "prompt_ids",
        input: Input::Ids("prompt_ids"),
        logits: "prompt_logits",
        greedy: "greedy_ids",
        gap: Some("greedy_top2_gap"),
        hidden: Some("prompt_hidden_states"),
    },
    Set {
        name: "embeds_input",
        input: Input::Embeds("embeds_input"),
        logits: "embeds_logits",
        greedy: "embeds_greedy_ids",
        gap: None,
        hidden: None,
    },
];

pub fn run(args: Args) -> ExitCode {
    match check(&args) {
        Ok(true) => {
            println!("lm-check: PASS");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("lm-check: FAIL");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("verbatim lm-check: {e}");
            ExitCode::from(1)
        }
    }
}

fn top2_gap(row: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in row {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

fn check(args: &Args) -> engine::Result<bool> {
    let gpu = Arc::new(Gpu::new(&GpuOptions {
        adapter: args.adapter.clone(),
        ..Default::default()
    })?);
    let ck = Checkpoint::open(&args.model)?;
    let ex = Expected::open(&args.expected)?;
    let model = NemotronGpu::load(gpu.clone(), &ck)?;
    let c = model.config();
    let (v, hid) = (c.vocab_size, c.hidden_size);
    println!(
        "model {} ({}, {} layers `{}`, hidden {hid}, vocab {v}) on {}",
        args.model.display(),
        ck.files()
            .first()
            .map(|f| f.display().to_string())
            .unwrap_or_default(),
        c.num_layers(),
        c.pattern(),
        gpu.info.name
    );
    let tol = args.tolerance;
    let mut ok = true;
    let mut any = false;
    let bad = |what: String| engine::Error::Invalid(format!("{}: {what}", args.expected.display()));
    for set in &SETS {
        let (ids, embeds);
        let input = match set.input {
            Input::Ids(name) => match ex.try_get(name) {
                Some(t) => {
                    ids = t.i32.iter().map(|&x| x as u32).collect::<Vec<u32>>();
                    PassInput::Tokens(&ids)
                }
                None => continue,
            },
            Input::Embeds(name) => match ex.try_get(name) {
                Some(t) => {
                    if t.shape.last() != Some(&hid) {
                        return Err(bad(format!(
                            "{name} has shape {:?}, hidden size is {hid}",
                            t.shape
                        )));
                    }
                    embeds = &t.f32;
                    PassInput::Embeds(embeds)
                }
                None => continue,
            },
        };
        any = true;
        let n = match input {
            PassInput::Tokens(t) => t.len(),
            PassInput::Embeds(e) => e.len() / hid,
        };
        let want = ex
            .try_get(set.logits)
            .ok_or_else(|| bad(format!("no `{}`", set.logits)))?;
        if want.f32.len() != n * v {
            return Err(bad(format!(
                "{} has shape {:?}, expected [{n}, {v}]",
                set.logits, want.shape
            )));
        }
        let want = &want.f32;
        let greedy: Vec<u32> = ex
            .try_get(set.greedy)
            .map(|t| t.i32.iter().map(|&x| x as u32).collect())
            .unwrap_or_default();
        let gaps: Option<&[f32]> = set
            .gap
            .and_then(|g| ex.try_get(g))
            .map(|t| t.f32.as_slice());
        let max_len = (n + greedy.len() + 1) as u32;
        println!("\n{} ({n} positions):", set.name);

        // Prefill in passes.
        let mut ctx = model.context(max_len)?;
        let got = ctx.prefill(input)?;
        let p = PASS_MAX as usize;
        for (i, start) in (0..n).step_by(p).enumerate() {
            let end = (start + p).min(n);
            let (e, at) = max_row_rel(&got[start * v..end * v], &want[start * v..end * v], v);
            println!(
                "  pass {i} (positions {start}..{end}): max rel logit error {e:.3e} at {}",
                start + at
            );
        }
        if args.every_position {
            for t in 0..n {
                let (e, _) = max_row_rel(&got[t * v..(t + 1) * v], &want[t * v..(t + 1) * v], v);
                println!("    position {t}: {e:.3e}");
            }
        }
        let (ep, pp) = max_row_rel(&got, want, v);
        let pass_ok = ep <= tol;
        ok &= pass_ok;
        println!(
            "  prefill in passes of {p}: max rel logit error {ep:.3e} at position {pp} {}",
            verdict(pass_ok)
        );

        // Position by position.
        let mut one = model.context(max_len)?;
        let mut steps = Vec::with_capacity(n * v);
        for t in 0..n {
            steps.extend(match input {
                PassInput::Tokens(ids) => one.decode(ids[t])?,
                PassInput::Embeds(e) => one.decode_embed(&e[t * hid..(t + 1) * hid])?,
            });
        }
        let (es, ps) = max_row_rel(&steps, want, v);
        let (ec, _) = max_row_rel(&steps, &got, v);
        let step_ok = es <= tol;
        ok &= step_ok;
        println!(
            "  position by position: max rel logit error {es:.3e} at position {ps} {} (vs passes {ec:.3e})",
            verdict(step_ok)
        );

        // Per-layer hidden states (traced passes).
        if let Some(hs) = set.hidden.and_then(|h| ex.try_get(h)) {
            let nl = c.num_layers();
            if hs.shape != [nl + 1, n, hid] {
                return Err(bad(format!(
                    "{} has shape {:?}, expected [{}, {n}, {hid}]",
                    set.hidden.unwrap(),
                    hs.shape,
                    nl + 1
                )));
            }
            let mut tctx = model.context(max_len)?;
            let mut layers: Vec<Vec<f32>> = vec![Vec::with_capacity(n * hid); nl];
            for start in (0..n).step_by(p) {
                let end = (start + p).min(n);
                let part = match input {
                    PassInput::Tokens(t) => PassInput::Tokens(&t[start..end]),
                    PassInput::Embeds(e) => PassInput::Embeds(&e[start * hid..end * hid]),
                };
                let (_, tr) = tctx.forward_traced(part)?;
                for (l, out) in layers.iter_mut().enumerate() {
                    // transformers' last hidden state is after the final norm.
                    out.extend(if l + 1 == nl {
                        &tr.final_norm
                    } else {
                        &tr.layers[l]
                    });
                }
            }
            for (l, got) in layers.iter().enumerate() {
                let w = &hs.f32[(l + 1) * n * hid..(l + 2) * n * hid];
                let (e, at) = max_row_rel(got, w, hid);
                let l_ok = e <= tol;
                ok &= l_ok;
                let kind = c.layers[l].pattern_char();
                let tail = if l + 1 == nl {
                    " (after the final norm)"
                } else {
                    ""
                };
                println!("  layer {l} ({kind}){tail}: max rel hidden-state error {e:.3e} at position {at} {}", verdict(l_ok));
            }
        }

        // Greedy continuation, following the fixture's tokens.
        if !greedy.is_empty() {
            let mut row = got[(n - 1) * v..].to_vec();
            let (mut checked, mut equal, mut skipped) = (0, 0, 0);
            let mut first_bad = None;
            for (i, &w) in greedy.iter().enumerate() {
                let gap = gaps
                    .and_then(|g| g.get(i).copied())
                    .unwrap_or_else(|| top2_gap(&row));
                if gap < args.min_gap {
                    skipped += 1;
                } else {
                    checked += 1;
                    let mine = argmax(&row);
                    if mine == w {
                        equal += 1;
                    } else if first_bad.is_none() {
                        first_bad = Some((i, mine, w));
                    }
                }
                if i + 1 < greedy.len() {
                    row = ctx.decode(w)?;
                }
            }
            let g_ok = equal == checked;
            ok &= g_ok;
            print!(
                "  greedy: {equal} of {checked} tokens equal ({skipped} skipped, top-2 gap < {:e}{}) {}",
                args.min_gap,
                if gaps.is_some() { "" } else { ", our gap" },
                verdict(g_ok)
            );
            match first_bad {
                Some((i, mine, w)) => {
                    println!(": first difference at step {i}, {mine} instead of {w}")
                }
                None => println!(),
            }
        }
    }
    if !any {
        return Err(bad(
            "neither `prompt_ids` nor `embeds_input` is in it".into()
        ));
    }
    Ok(ok)
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "ok"
    } else {
        "OUT OF BOUNDS"
    }
}
