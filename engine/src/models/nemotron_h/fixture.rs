//! The `nemotron-h-tiny` fixture (a tiny checkpoint with random weights and what
//! transformers computed for it in float64): the reader of its `expected.safetensors`
//! ([`Expected`], also used by `verbatim lm-check`) and [`max_row_rel`]; for tests, small
//! helpers to write broken or re-encoded copies of a checkpoint.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype, SafeTensors};

/// `shared/fixtures/nemotron-h-tiny`: beside the repository (`../shared` from the
/// workspace root, as CI lays it out), else `/work/shared`. Panics loudly when absent: a
/// silently skipped fixture test proves nothing.
pub fn fixture_dir() -> PathBuf {
    let rel = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/fixtures/nemotron-h-tiny");
    let abs = Path::new("/work/shared/fixtures/nemotron-h-tiny");
    for p in [rel.as_path(), abs] {
        if p.join("config.json").is_file() && p.join("expected.safetensors").is_file() {
            return p.to_path_buf();
        }
    }
    panic!(
        "the nemotron-h-tiny fixture is missing: looked in {} and {}",
        rel.display(),
        abs.display()
    );
}

/// A tensor of `expected.safetensors`.
pub struct Tensor {
    pub shape: Vec<usize>,
    pub f32: Vec<f32>,
    pub i32: Vec<i32>,
}

/// `expected.safetensors`, read whole (F32 and I32 tensors).
pub struct Expected(pub HashMap<String, Tensor>);

impl Expected {
    /// The fixture's `expected.safetensors` (panics when absent: for tests).
    pub fn load() -> Expected {
        let path = fixture_dir().join("expected.safetensors");
        Expected::open(&path).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Any `expected.safetensors` of this layout (F32 and I32 tensors).
    pub fn open(path: &Path) -> crate::Result<Expected> {
        let bytes = std::fs::read(path).map_err(|e| crate::Error::io(path, e))?;
        let bad = |r: String| crate::Error::Invalid(format!("{}: {r}", path.display()));
        let st = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
        let mut m = HashMap::new();
        for (name, v) in st.tensors() {
            let d = v.data();
            let (f, i) = match v.dtype() {
                Dtype::F32 => (
                    d.chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                    Vec::new(),
                ),
                Dtype::I32 => (
                    Vec::new(),
                    d.chunks_exact(4)
                        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .collect(),
                ),
                Dtype::I64 => (
                    Vec::new(),
                    d.chunks_exact(8)
                        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as i32)
                        .collect(),
                ),
                other => return Err(bad(format!("{name}: unexpected dtype {other:?}"))),
            };
            m.insert(
                name,
                Tensor {
                    shape: v.shape().to_vec(),
                    f32: f,
                    i32: i,
                },
            );
        }
        Ok(Expected(m))
    }

    /// The tensor `name`, if present.
    pub fn try_get(&self, name: &str) -> Option<&Tensor> {
        self.0.get(name)
    }

    pub fn get(&self, name: &str) -> &Tensor {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("expected.safetensors has no `{name}`"))
    }

    pub fn f32(&self, name: &str) -> &[f32] {
        &self.get(name).f32
    }

    pub fn ids(&self, name: &str) -> Vec<u32> {
        self.get(name).i32.iter().map(|&v| v as u32).collect()
    }
}

#[cfg(test)]
/// One tensor to write: name, dtype string (`BF16`, `F16`, `F32`, ...), shape, raw bytes.
pub struct RawTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

#[cfg(test)]
/// Every tensor of a safetensors file, in offset order.
pub fn read_raw(path: &Path) -> Vec<RawTensor> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut out: Vec<(usize, RawTensor)> = header
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, v)| {
            let off = v["data_offsets"].as_array().unwrap();
            let (s, e) = (
                off[0].as_u64().unwrap() as usize,
                off[1].as_u64().unwrap() as usize,
            );
            (
                s,
                RawTensor {
                    name: k.clone(),
                    dtype: v["dtype"].as_str().unwrap().to_string(),
                    shape: v["shape"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect(),
                    bytes: bytes[8 + n + s..8 + n + e].to_vec(),
                },
            )
        })
        .collect();
    out.sort_by_key(|(s, _)| *s);
    out.into_iter().map(|(_, t)| t).collect()
}

#[cfg(test)]
/// Writes a well-formed safetensors file of `tensors` (in the given order).
pub fn write_raw(path: &Path, tensors: &[RawTensor]) {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
    let mut off = 0usize;
    for t in tensors {
        header.insert(
            t.name.clone(),
            serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [off, off + t.bytes.len()]}),
        );
        off += t.bytes.len();
    }
    let mut h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = Vec::with_capacity(8 + h.len() + off);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for t in tensors {
        out.extend_from_slice(&t.bytes);
    }
    std::fs::write(path, out).unwrap();
}

#[cfg(test)]
/// A fresh, empty directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

#[cfg(test)]
impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "verbatim-nemotron-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

#[cfg(test)]
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Max over rows of ‖a − b‖ / ‖b‖ (rows of `dim`), f64, and the row where it is reached.
pub fn max_row_rel(a: &[f32], b: &[f32], dim: usize) -> (f64, usize) {
    assert_eq!(a.len(), b.len(), "lengths differ");
    let mut worst = (0f64, 0usize);
    for (r, (x, y)) in a.chunks_exact(dim).zip(b.chunks_exact(dim)).enumerate() {
        let mut num = 0f64;
        let mut den = 0f64;
        for (&u, &v) in x.iter().zip(y) {
            num += (u as f64 - v as f64).powi(2);
            den += (v as f64).powi(2);
        }
        let rel = num.sqrt() / den.sqrt().max(1e-30);
        // A NaN row counts as the worst.
        if rel.is_nan() || rel > worst.0 {
            worst = (rel, r);
        }
    }
    worst
}
