//! The loader on the fixture and on broken or re-encoded copies of it.

use std::path::Path;

use super::fixture::{fixture_dir, read_raw, write_raw, RawTensor, TempDir};
use super::*;
use crate::reference::nemotron_h::Model;
use crate::Error;

/// Copies the fixture checkpoint into a temp dir, letting `tensors` and `config` edit it.
fn copy_fixture(
    tag: &str,
    tensors: impl FnOnce(&mut Vec<RawTensor>),
    config: impl FnOnce(String) -> String,
) -> TempDir {
    let src = fixture_dir();
    let dir = TempDir::new(tag);
    let mut t = read_raw(&src.join(SINGLE));
    tensors(&mut t);
    write_raw(&dir.path().join(SINGLE), &t);
    let cfg = std::fs::read_to_string(src.join("config.json")).unwrap();
    std::fs::write(dir.path().join("config.json"), config(cfg)).unwrap();
    dir
}

const SINGLE: &str = checkpoint::SINGLE_FILE;

/// The error's sentence, panicking when `r` is not a model error.
fn model_err<T: std::fmt::Debug>(r: crate::Result<T>) -> String {
    match r {
        Err(e @ Error::Model { .. }) => {
            eprintln!("{e}");
            e.to_string()
        }
        other => panic!("expected a model error, got {other:?}"),
    }
}

fn bf16_bits(bytes: &[u8]) -> Vec<u16> {
    bytes
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect()
}

#[test]
fn nemotron_fixture_checkpoint_opens() {
    let ck = Checkpoint::open(&fixture_dir()).unwrap();
    assert_eq!(ck.config.pattern(), "ME*-ME");
    assert_eq!(ck.config.hidden_size, 256);
    assert_eq!(ck.embeddings_name(), "backbone.embeddings.weight");
    assert_eq!(ck.final_norm_name(), "backbone.norm_f.weight");
    assert_eq!(ck.lm_head_name(), "lm_head.weight");
    assert!(!ck.stacked_experts());
    // Every tensor of the checkpoint is one the loader reads (none silently ignored).
    let mut expect: Vec<String> = vec![
        ck.embeddings_name().to_string(),
        ck.final_norm_name().to_string(),
        ck.lm_head_name().to_string(),
    ];
    for (i, &kind) in ck.config.layers.iter().enumerate() {
        for (suffix, _) in layer_tensors(&ck.config, kind) {
            expect.push(ck.layer_name(i, &suffix));
        }
        if kind == LayerKind::Moe {
            for e in 0..ck.config.moe.n_routed_experts {
                for p in [ExpertProj::Up, ExpertProj::Down] {
                    expect.push(ck.expert(i, e, p).unwrap().name.to_string());
                }
            }
        }
    }
    expect.sort();
    assert_eq!(ck.names(), expect);
    assert_eq!(expect.len(), 103);
    let up = ck.expert(1, 15, ExpertProj::Up).unwrap();
    assert_eq!(
        (up.name, up.shape, up.dtype),
        (
            "backbone.layers.1.mixer.experts.15.up_proj.weight",
            &[128usize, 256][..],
            WeightDtype::BF16
        )
    );
    // bf16 widens exactly: the 16 stored bits are the f32's high half.
    let w = ck.tensor("backbone.layers.0.mixer.A_log").unwrap();
    let bits = bf16_bits(w.bytes);
    for (v, b) in w.to_f32().iter().zip(&bits) {
        assert_eq!(v.to_bits(), (*b as u32) << 16);
    }
    assert_eq!(bf16_to_f32(0x3F80), 1.0);
    assert_eq!(bf16_to_f32(0xC0A0), -5.0);
    assert!(bf16_to_f32(0x7F80).is_infinite());
    // The first bf16 value above 1 is 1 + 2^-7 exactly (f16 would also hold it, but a
    // value like 2^100 shows widening never passes through f16).
    assert_eq!(bf16_to_f32(0x3F81), 1.0 + 1.0 / 128.0);
    assert_eq!(bf16_to_f32(0x7180), 2f32.powi(100));
}

#[test]
fn nemotron_missing_tensor_is_an_error_naming_it() {
    let name = "backbone.layers.4.mixer.D";
    let dir = copy_fixture("missing", |t| t.retain(|x| x.name != name), |c| c);
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(e.contains(name) && e.contains("missing"), "{e}");

    let expert = "backbone.layers.5.mixer.experts.7.down_proj.weight";
    let dir = copy_fixture("missing-expert", |t| t.retain(|x| x.name != expert), |c| c);
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(e.contains(expert), "{e}");

    let dir = copy_fixture(
        "missing-head",
        |t| t.retain(|x| x.name != "lm_head.weight"),
        |c| c,
    );
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(e.contains("lm_head.weight"), "{e}");
}

#[test]
fn nemotron_wrong_shape_is_an_error_naming_it() {
    let name = "backbone.layers.0.mixer.in_proj.weight";
    let dir = copy_fixture(
        "shape",
        |t| {
            let x = t.iter_mut().find(|x| x.name == name).unwrap();
            x.shape = vec![640, 256];
            x.bytes.truncate(640 * 256 * 2);
        },
        |c| c,
    );
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(
        e.contains(name) && e.contains("[640, 256]") && e.contains("[648, 256]"),
        "{e}"
    );

    // The config disagreeing with the weights is the same error, seen from the other side.
    let dir = copy_fixture(
        "shape-config",
        |_| {},
        |c| c.replace("\"ssm_state_size\": 32", "\"ssm_state_size\": 16"),
    );
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(e.contains("in_proj.weight") || e.contains("conv1d"), "{e}");
}

#[test]
fn nemotron_wrong_dtype_is_an_error_naming_it() {
    let name = "backbone.layers.2.mixer.k_proj.weight";
    let dir = copy_fixture(
        "dtype",
        |t| {
            let x = t.iter_mut().find(|x| x.name == name).unwrap();
            x.dtype = "I16".into();
        },
        |c| c,
    );
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(e.contains(name) && e.contains("I16"), "{e}");
}

#[test]
fn nemotron_unknown_layer_kind_is_an_error() {
    let dir = copy_fixture(
        "kind",
        |_| {},
        |c| c.replacen("\"mlp\"", "\"retention\"", 1),
    );
    let e = model_err(Checkpoint::open(dir.path()));
    assert!(e.contains("retention") && e.contains("config.json"), "{e}");
}

#[test]
fn nemotron_truncated_or_garbage_safetensors_is_an_error() {
    let src = fixture_dir();
    let bytes = std::fs::read(src.join(SINGLE)).unwrap();
    for (tag, cut) in [
        ("half", bytes.len() / 2),
        ("one-byte", bytes.len() - 1),
        ("header", 100),
        ("tiny", 5),
    ] {
        let dir = TempDir::new(tag);
        std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
        std::fs::write(dir.path().join(SINGLE), &bytes[..cut]).unwrap();
        let e = model_err(Checkpoint::open(dir.path()));
        assert!(e.contains("safetensors"), "{tag}: {e}");
    }
    let dir = TempDir::new("garbage");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join(SINGLE),
        b"\x10\0\0\0\0\0\0\0{not json at all",
    )
    .unwrap();
    model_err(Checkpoint::open(dir.path()));
}

#[test]
fn nemotron_missing_files_are_errors() {
    let dir = TempDir::new("empty");
    assert!(model_err(Checkpoint::open(dir.path())).contains("config.json"));
    std::fs::copy(
        fixture_dir().join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    assert!(model_err(Checkpoint::open(dir.path())).contains(SINGLE));
    assert!(model_err(Checkpoint::open(&dir.path().join("nope"))).contains("does not exist"));
}

/// Writes the fixture as `shards` shards with an index.
fn write_sharded(dir: &Path, tensors: Vec<RawTensor>, shards: usize) {
    let per = tensors.len().div_ceil(shards);
    let mut map = serde_json::Map::new();
    let mut it = tensors.into_iter().peekable();
    for s in 0..shards {
        let file = format!("model-{:05}-of-{:05}.safetensors", s + 1, shards);
        let part: Vec<RawTensor> = it.by_ref().take(per).collect();
        for t in &part {
            map.insert(t.name.clone(), file.clone().into());
        }
        write_raw(&dir.join(&file), &part);
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(
        dir.join(checkpoint::INDEX_FILE),
        serde_json::to_vec_pretty(&index).unwrap(),
    )
    .unwrap();
}

#[test]
fn nemotron_sharded_checkpoint_loads_the_same_weights() {
    let src = fixture_dir();
    let dir = TempDir::new("sharded");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    write_sharded(dir.path(), read_raw(&src.join(SINGLE)), 3);
    let a = Checkpoint::open(&src).unwrap();
    let b = Checkpoint::open(dir.path()).unwrap();
    assert_eq!(b.files().len(), 3);
    assert_eq!(a.names(), b.names());
    for n in a.names() {
        assert_eq!(
            a.tensor(n).unwrap().bytes,
            b.tensor(n).unwrap().bytes,
            "{n}"
        );
    }

    // An index naming a shard that is not there, or a tensor its shard lacks.
    let idx = dir.path().join(checkpoint::INDEX_FILE);
    let text = std::fs::read_to_string(&idx).unwrap();
    std::fs::write(
        &idx,
        text.replacen("model-00003-of-00003", "model-00004-of-00003", 1),
    )
    .unwrap();
    assert!(model_err(Checkpoint::open(dir.path())).contains("model-00004-of-00003"));
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["weight_map"]["backbone.layers.9.norm.weight"] = "model-00001-of-00003.safetensors".into();
    std::fs::write(&idx, v.to_string()).unwrap();
    assert!(model_err(Checkpoint::open(dir.path())).contains("backbone.layers.9.norm.weight"));
}

#[test]
fn nemotron_f32_f16_and_stacked_encodings_load() {
    let src = fixture_dir();
    let reference = Model::load(&src).unwrap();

    // F32: every bf16 value widens exactly, so the weights are bit-identical.
    let dir = copy_fixture(
        "f32",
        |t| {
            for x in t.iter_mut() {
                x.bytes = bf16_bits(&x.bytes)
                    .into_iter()
                    .flat_map(|b| bf16_to_f32(b).to_le_bytes())
                    .collect();
                x.dtype = "F32".into();
            }
        },
        |c| c,
    );
    let m = Model::load(dir.path()).unwrap();
    assert_eq!(m.embeddings, reference.embeddings);
    assert_eq!(m.lm_head, reference.lm_head);
    let ids: Vec<u32> = (0..24).map(|i| (i * 37 % 512) as u32).collect();
    assert_eq!(
        m.context().prefill(&ids).unwrap(),
        reference.context().prefill(&ids).unwrap()
    );

    // F16: read exactly as stored (f16 → f32 is exact); the values are the bf16 ones
    // rounded to f16, so only close.
    let dir = copy_fixture(
        "f16",
        |t| {
            for x in t.iter_mut() {
                x.bytes = bf16_bits(&x.bytes)
                    .into_iter()
                    .flat_map(|b| half::f16::from_f32(bf16_to_f32(b)).to_bits().to_le_bytes())
                    .collect();
                x.dtype = "F16".into();
            }
        },
        |c| c,
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let v = ck.tensor("backbone.norm_f.weight").unwrap();
    assert_eq!(v.dtype, WeightDtype::F16);
    for (a, b) in v.to_f32().iter().zip(&reference.norm_f) {
        assert!((a - b).abs() <= b.abs() * 1e-3 + 1e-7, "{a} vs {b}");
    }

    // Routed experts stacked as [E, out, in] (transformers 5's in-memory layout).
    let dir = copy_fixture(
        "stacked",
        |t| {
            for layer in [1, 5] {
                for proj in ["up_proj", "down_proj"] {
                    let mut bytes = Vec::new();
                    let mut shape = Vec::new();
                    for e in 0..16 {
                        let name =
                            format!("backbone.layers.{layer}.mixer.experts.{e}.{proj}.weight");
                        let i = t.iter().position(|x| x.name == name).unwrap();
                        let x = t.remove(i);
                        bytes.extend(x.bytes);
                        shape = x.shape;
                    }
                    t.push(RawTensor {
                        name: format!("backbone.layers.{layer}.mixer.experts.{proj}"),
                        dtype: "BF16".into(),
                        shape: vec![16, shape[0], shape[1]],
                        bytes,
                    });
                }
            }
        },
        |c| c,
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    assert!(ck.stacked_experts());
    let m = Model::from_checkpoint(&ck).unwrap();
    assert_eq!(
        m.context().prefill(&ids).unwrap(),
        reference.context().prefill(&ids).unwrap()
    );
}

#[test]
fn nemotron_legacy_config_loads_the_fixture() {
    // The fixture's weights under an older config: pattern string, legacy key names,
    // Python's bare Infinity.
    let dir = copy_fixture(
        "legacy",
        |_| {},
        |c| {
            let mut v: serde_json::Value = serde_json::from_str(&c).unwrap();
            let o = v.as_object_mut().unwrap();
            o.remove("layers_block_type");
            o.remove("time_step_limit");
            let g = o.remove("n_groups").unwrap();
            let k = o.remove("conv_kernel").unwrap();
            o.insert("hybrid_override_pattern".into(), "ME*-ME".into());
            o.insert("mamba_n_groups".into(), g);
            o.insert("mamba_d_conv".into(), k);
            let text = serde_json::to_string_pretty(&v).unwrap();
            text.replacen('{', "{\n  \"mamba_dt_limit\": [0.0, Infinity],", 1)
        },
    );
    let ck = Checkpoint::open(dir.path()).unwrap();
    let base = Checkpoint::open(&fixture_dir()).unwrap();
    assert_eq!(ck.config, base.config);
}
