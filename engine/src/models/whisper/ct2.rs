//! Reader (and a small writer) for CTranslate2's `model.bin`, binary versions 4 to 6.
//!
//! Layout, all little-endian:
//!
//! ```text
//! u32 version                       (4..=6 accepted)
//! string spec name, u32 revision    (present since version 2)
//! u32 variable count, then per variable:
//!     string name, u8 rank, rank x u32 dims, u8 dtype id, u32 byte count, the bytes
//! u32 alias count, then per alias: string alias, string target
//! string = u16 length (counting a trailing NUL), then that many bytes
//! ```
//!
//! The file is memory-mapped and parsed once into a table of byte ranges, so a
//! [`TensorView`] is a borrowed window into the map: no tensor is ever copied by this
//! module. Every length read from the file is checked against what remains before it is
//! used (with checked arithmetic), so a truncated or corrupt file gives an
//! [`Error::Model`] naming the variable at fault, never a panic, an over-read or an
//! allocation sized by a bad length.
//!
//! Data is not aligned in the file (names have odd lengths), so consumers that want typed
//! slices must handle unaligned data; see `Checkpoint::f16_bits`.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::{Error, Result};

/// Oldest and newest binary versions this reader understands. Version 4 introduced the
/// explicit dtype id + byte count per variable, which the parser relies on; 6 is what
/// CTranslate2 4.x writes.
pub const MIN_VERSION: u32 = 4;
pub const MAX_VERSION: u32 = 6;
/// The version [`write_ct2`] writes.
pub const WRITE_VERSION: u32 = 6;

/// Element type of a stored variable, numbered as CTranslate2's `DataType` enum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
    I8,
    I16,
    I32,
    F16,
    BF16,
}

impl DType {
    /// The id stored in the file, or `None` for an id this reader does not know.
    pub fn from_id(id: u8) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::I8,
            2 => DType::I16,
            3 => DType::I32,
            4 => DType::F16,
            5 => DType::BF16,
            _ => return None,
        })
    }

    pub fn id(self) -> u8 {
        match self {
            DType::F32 => 0,
            DType::I8 => 1,
            DType::I16 => 2,
            DType::I32 => 3,
            DType::F16 => 4,
            DType::BF16 => 5,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 => 1,
            DType::I16 | DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// CTranslate2's name for the type, as users see it in converter options.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::I8 => "int8",
            DType::I16 => "int16",
            DType::I32 => "int32",
            DType::F16 => "float16",
            DType::BF16 => "bfloat16",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A borrowed view of one variable's stored bytes. `bytes.len()` is always
/// `numel() * dtype.size()` for views handed out by [`Ct2File::get`].
#[derive(Clone, Copy)]
pub struct TensorView<'a> {
    /// The variable's stored name (the target's name when `get` resolved an alias).
    pub name: &'a str,
    pub dims: &'a [usize],
    pub dtype: DType,
    /// Little-endian elements, row-major; not necessarily aligned.
    pub bytes: &'a [u8],
}

impl TensorView<'_> {
    /// Number of elements (1 for a scalar). Saturates rather than overflowing; for views
    /// from a parsed file the product is known to fit.
    pub fn numel(&self) -> usize {
        self.dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// The value of a one-element integer variable (CTranslate2 stores flags and
    /// `num_heads` this way); `None` for floats or anything with more than one element.
    pub fn scalar_i64(&self) -> Option<i64> {
        if self.numel() != 1 || self.bytes.len() != self.dtype.size() {
            return None;
        }
        let b = self.bytes;
        match self.dtype {
            DType::I8 => Some(b[0] as i8 as i64),
            DType::I16 => Some(i16::from_le_bytes([b[0], b[1]]) as i64),
            DType::I32 => Some(i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as i64),
            DType::F32 | DType::F16 | DType::BF16 => None,
        }
    }
}

impl fmt::Debug for TensorView<'_> {
    // Not derived: printing megabytes of weight bytes helps nobody.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorView")
            .field("name", &self.name)
            .field("dims", &self.dims)
            .field("dtype", &self.dtype)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// One variable of the table: where its bytes live in the map.
#[derive(Debug)]
struct Var {
    name: String,
    dims: Vec<usize>,
    dtype: DType,
    data: Range<usize>,
}

/// What parsing the file yields: everything but the bytes themselves.
#[derive(Debug)]
struct Layout {
    version: u32,
    spec: String,
    revision: u32,
    vars: Vec<Var>,
    aliases: Vec<(String, String)>,
    /// Variable and alias names -> index into `vars`.
    index: HashMap<String, usize>,
}

/// A memory-mapped CTranslate2 `model.bin`.
pub struct Ct2File {
    path: PathBuf,
    map: Mmap,
    layout: Layout,
}

impl Ct2File {
    /// Maps and parses `path`. Fails with [`Error::Io`] when the file cannot be opened and
    /// [`Error::Model`] when it is not a well-formed CTranslate2 model of version 4..=6.
    pub fn open(path: &Path) -> Result<Ct2File> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let meta = file.metadata().map_err(|e| Error::io(path, e))?;
        if !meta.is_file() {
            return Err(Error::model(path, "this is not a regular file"));
        }
        if meta.len() == 0 {
            // Checked here because mapping an empty file is an error on some platforms.
            return Err(Error::model(path, "the file is empty"));
        }
        // SAFETY: the map is read-only and lives as long as `self`. The one hazard of a
        // file mapping is another process truncating or rewriting the file while it is
        // mapped (SIGBUS / changing bytes); model files are written once by a converter
        // or the fetch script and never edited in place, which is the contract we rely on.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(path, e))?;
        let layout = parse(path, &map)?;
        Ok(Ct2File {
            path: path.to_path_buf(),
            map,
            layout,
        })
    }

    /// The file this was read from (for error messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The spec name, e.g. `WhisperSpec`.
    pub fn spec(&self) -> &str {
        &self.layout.spec
    }

    /// The spec's revision (3 for the current WhisperSpec).
    pub fn revision(&self) -> u32 {
        self.layout.revision
    }

    /// The binary format version (4..=6).
    pub fn version(&self) -> u32 {
        self.layout.version
    }

    /// The stored variables' names, in file order (aliases are not listed).
    pub fn names(&self) -> impl Iterator<Item = &str> + '_ {
        self.layout.vars.iter().map(|v| v.name.as_str())
    }

    /// `(alias, target)` pairs, in file order.
    pub fn aliases(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.layout
            .aliases
            .iter()
            .map(|(a, t)| (a.as_str(), t.as_str()))
    }

    /// The variable called `name`, following an alias if `name` is one.
    pub fn get(&self, name: &str) -> Option<TensorView<'_>> {
        let var = &self.layout.vars[*self.layout.index.get(name)?];
        Some(TensorView {
            name: &var.name,
            dims: &var.dims,
            dtype: var.dtype,
            // In bounds: `parse` checked every range against this very map.
            bytes: &self.map[var.data.clone()],
        })
    }
}

impl fmt::Debug for Ct2File {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ct2File")
            .field("path", &self.path)
            .field("version", &self.layout.version)
            .field("spec", &self.layout.spec)
            .field("revision", &self.layout.revision)
            .field("variables", &self.layout.vars.len())
            .field("aliases", &self.layout.aliases.len())
            .finish()
    }
}

/// A bounds-checked reader over the mapped bytes. Reads return `None` at end of data;
/// the caller turns that into an error that says *what* was being read.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.remaining() {
            return None;
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Some(s)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Why a string could not be read; the caller adds which string it was.
enum StrError {
    Truncated,
    Empty,
    NoNul,
    InnerNul,
    NotUtf8,
}

impl StrError {
    fn describe(&self) -> &'static str {
        match self {
            StrError::Truncated => "the file ends inside it (the file is truncated)",
            StrError::Empty => "it has length 0 (a stored string always ends with a NUL byte)",
            StrError::NoNul => "it does not end with a NUL byte (the file is corrupt)",
            StrError::InnerNul => "it contains a NUL byte (the file is corrupt)",
            StrError::NotUtf8 => "it is not valid UTF-8 (the file is corrupt)",
        }
    }
}

fn read_str<'a>(c: &mut Cursor<'a>) -> std::result::Result<&'a str, StrError> {
    let n = c.u16().ok_or(StrError::Truncated)? as usize;
    let raw = c.take(n).ok_or(StrError::Truncated)?;
    let (&last, body) = raw.split_last().ok_or(StrError::Empty)?;
    if last != 0 {
        return Err(StrError::NoNul);
    }
    if body.contains(&0) {
        return Err(StrError::InnerNul);
    }
    std::str::from_utf8(body).map_err(|_| StrError::NotUtf8)
}

/// Smallest possible stored variable: a 1-character name (2 + 2 bytes), rank 0, dtype,
/// byte count 0. Bounds how many variables a file of a given size can hold, so the
/// table is never pre-sized from a corrupt count.
const MIN_VAR_BYTES: usize = 2 + 2 + 1 + 1 + 4;

/// Parses the whole table of `buf` (the mapped file at `path`, named in errors).
fn parse(path: &Path, buf: &[u8]) -> Result<Layout> {
    let err = |reason: String| Error::model(path, reason);
    let mut c = Cursor { buf, pos: 0 };

    let version = c.u32().ok_or_else(|| {
        err(format!(
            "the file is {} bytes long, too short to be a CTranslate2 model",
            buf.len()
        ))
    })?;
    if !(MIN_VERSION..=MAX_VERSION).contains(&version) {
        return Err(err(format!(
            "CTranslate2 binary version {version} is not supported (this reader knows \
             versions {MIN_VERSION} to {MAX_VERSION}); is this a CTranslate2 model.bin?"
        )));
    }
    // Versions before 2 had no spec name; they are rejected above, so it is always here.
    let spec = read_str(&mut c)
        .map_err(|e| err(format!("the spec name cannot be read: {}", e.describe())))?
        .to_string();
    let revision = c
        .u32()
        .ok_or_else(|| err("the file ends inside its header (the file is truncated)".into()))?;

    let count = c.u32().ok_or_else(|| {
        err("the file ends before its variable count (the file is truncated)".into())
    })? as usize;
    let mut vars: Vec<Var> = Vec::with_capacity(count.min(c.remaining() / MIN_VAR_BYTES));
    let mut index: HashMap<String, usize> = HashMap::with_capacity(vars.capacity());

    for i in 0..count {
        // Before the name is known, locate the variable by its position and predecessor.
        let name = read_str(&mut c).map_err(|e| {
            let after = match vars.last() {
                Some(prev) => format!(" (after `{}`)", prev.name),
                None => String::new(),
            };
            err(format!(
                "the name of variable #{i} of {count}{after} cannot be read: {}",
                e.describe()
            ))
        })?;
        let var_err = |what: &str| err(format!("variable `{name}`: {what}"));
        let truncated = |what: &str| {
            var_err(&format!(
                "the file ends inside its {what} (the file is truncated)"
            ))
        };

        let rank = c.u8().ok_or_else(|| truncated("rank"))? as usize;
        // A u8 rank bounds this allocation at 255 entries.
        let mut dims = Vec::with_capacity(rank);
        for _ in 0..rank {
            dims.push(c.u32().ok_or_else(|| truncated("shape"))? as usize);
        }
        let dtype_id = c.u8().ok_or_else(|| truncated("dtype"))?;
        let dtype = DType::from_id(dtype_id).ok_or_else(|| {
            var_err(&format!(
                "unknown dtype id {dtype_id} (known: 0 float32, 1 int8, 2 int16, 3 int32, \
                 4 float16, 5 bfloat16)"
            ))
        })?;
        let stored = c.u32().ok_or_else(|| truncated("byte count"))? as usize;
        let needed = dims
            .iter()
            .try_fold(dtype.size(), |n, &d| n.checked_mul(d))
            .ok_or_else(|| {
                var_err(&format!(
                    "shape {dims:?} of {dtype} is too large to address (the file is corrupt)"
                ))
            })?;
        if stored != needed {
            return Err(var_err(&format!(
                "{stored} bytes stored but shape {dims:?} of {dtype} needs {needed} \
                 (the file is corrupt)"
            )));
        }
        let start = c.pos;
        if c.take(stored).is_none() {
            return Err(var_err(&format!(
                "its data needs {stored} bytes at offset {start} but only {} remain \
                 (the file is truncated)",
                buf.len() - start
            )));
        }
        if index.contains_key(name) {
            return Err(var_err("the name is stored twice (the file is corrupt)"));
        }
        index.insert(name.to_string(), vars.len());
        vars.push(Var {
            name: name.to_string(),
            dims,
            dtype,
            data: start..start + stored,
        });
    }

    let alias_count = c
        .u32()
        .ok_or_else(|| err("the file ends before its alias count (the file is truncated)".into()))?
        as usize;
    let mut aliases = Vec::new();
    for i in 0..alias_count {
        let alias = read_str(&mut c).map_err(|e| {
            err(format!(
                "alias #{i} of {alias_count} cannot be read: {}",
                e.describe()
            ))
        })?;
        let target = read_str(&mut c).map_err(|e| {
            err(format!(
                "the target of alias `{alias}` cannot be read: {}",
                e.describe()
            ))
        })?;
        if index.contains_key(alias) {
            return Err(err(format!(
                "alias `{alias}` has the name of another variable or alias (the file is corrupt)"
            )));
        }
        // Targets may be variables or earlier aliases; both are in `index` by now.
        let Some(&target_index) = index.get(target) else {
            return Err(err(format!(
                "alias `{alias}` points to `{target}`, which is not in the file \
                 (the file is corrupt)"
            )));
        };
        index.insert(alias.to_string(), target_index);
        aliases.push((alias.to_string(), target.to_string()));
    }

    if c.remaining() != 0 {
        return Err(err(format!(
            "{} unexpected bytes follow the last alias at offset {} (the file is corrupt, \
             or not a CTranslate2 model.bin)",
            c.remaining(),
            c.pos
        )));
    }
    Ok(Layout {
        version,
        spec,
        revision,
        vars,
        aliases,
        index,
    })
}

/// Writes a version-6 `model.bin`. Used by tests (here and in other modules) to build
/// model files; `bytes` are written as given, so a test can store a byte count that
/// disagrees with `dims` on purpose.
pub fn write_ct2(
    path: &Path,
    spec: &str,
    revision: u32,
    vars: &[(String, Vec<usize>, DType, Vec<u8>)],
    aliases: &[(String, String)],
) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(File::create(path)?);
    out.write_all(&WRITE_VERSION.to_le_bytes())?;
    write_str(&mut out, spec)?;
    out.write_all(&revision.to_le_bytes())?;
    out.write_all(&to_u32(vars.len(), "variable count")?.to_le_bytes())?;
    for (name, dims, dtype, bytes) in vars {
        write_str(&mut out, name)?;
        let rank =
            u8::try_from(dims.len()).map_err(|_| invalid(format!("`{name}`: rank > 255")))?;
        out.write_all(&[rank])?;
        for &d in dims {
            out.write_all(&to_u32(d, "dimension")?.to_le_bytes())?;
        }
        out.write_all(&[dtype.id()])?;
        out.write_all(&to_u32(bytes.len(), "byte count")?.to_le_bytes())?;
        out.write_all(bytes)?;
    }
    out.write_all(&to_u32(aliases.len(), "alias count")?.to_le_bytes())?;
    for (alias, target) in aliases {
        write_str(&mut out, alias)?;
        write_str(&mut out, target)?;
    }
    out.flush()
}

fn invalid(msg: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, msg)
}

fn to_u32(n: usize, what: &str) -> std::io::Result<u32> {
    u32::try_from(n).map_err(|_| invalid(format!("{what} {n} does not fit in 32 bits")))
}

fn write_str(out: &mut impl Write, s: &str) -> std::io::Result<()> {
    let n = u16::try_from(s.len() + 1)
        .map_err(|_| invalid(format!("string of {} bytes is too long to store", s.len())))?;
    out.write_all(&n.to_le_bytes())?;
    out.write_all(s.as_bytes())?;
    out.write_all(&[0])
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A fresh, empty directory under the system temp dir (no tempfile crate here).
    /// Unique per process and call, so tests running in parallel never collide.
    pub(crate) fn temp_dir(tag: &str) -> PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "verbatim-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn small_vars() -> Vec<(String, Vec<usize>, DType, Vec<u8>)> {
        vec![
            (
                "a/weight".into(),
                vec![3, 4],
                DType::F32,
                f32_bytes(&[1.5; 12]),
            ),
            (
                "a/bias".into(),
                vec![3],
                DType::F16,
                vec![0x00, 0x3c, 0x00, 0x40, 0x00, 0xc2],
            ),
            ("a/q".into(), vec![2, 2], DType::I8, vec![1, 255, 3, 128]),
            (
                "num_heads".into(),
                vec![],
                DType::I16,
                (-6i16).to_le_bytes().to_vec(),
            ),
            ("flag".into(), vec![], DType::I8, vec![1]),
            (
                "big".into(),
                vec![],
                DType::I32,
                70000i32.to_le_bytes().to_vec(),
            ),
        ]
    }

    fn small_file(dir: &Path) -> (PathBuf, Vec<u8>) {
        let path = dir.join("model.bin");
        let aliases = vec![("b/weight".to_string(), "a/weight".to_string())];
        write_ct2(&path, "TestSpec", 7, &small_vars(), &aliases).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        (path, bytes)
    }

    fn msg(e: Error) -> String {
        e.to_string()
    }

    /// Parses `bytes` written to a file (through `open`, the real path) and returns the
    /// error text, failing the test if it parsed.
    fn open_err(dir: &Path, bytes: &[u8]) -> String {
        let path = dir.join("bad.bin");
        std::fs::write(&path, bytes).unwrap();
        match Ct2File::open(&path) {
            Ok(f) => panic!("corrupt file parsed: {f:?}"),
            Err(e) => msg(e),
        }
    }

    /// Offset of the first occurrence of `needle` in `hay`.
    fn find(hay: &[u8], needle: &[u8]) -> usize {
        hay.windows(needle.len())
            .position(|w| w == needle)
            .expect("needle present")
    }

    #[test]
    fn round_trip_small_file() {
        let dir = temp_dir("ct2-rt");
        let (path, _) = small_file(&dir);
        let f = Ct2File::open(&path).unwrap();
        assert_eq!(f.version(), 6);
        assert_eq!(f.spec(), "TestSpec");
        assert_eq!(f.revision(), 7);
        let names: Vec<&str> = f.names().collect();
        assert_eq!(
            names,
            ["a/weight", "a/bias", "a/q", "num_heads", "flag", "big"]
        );
        assert_eq!(f.aliases().collect::<Vec<_>>(), [("b/weight", "a/weight")]);
        for (name, dims, dtype, bytes) in small_vars() {
            let v = f.get(&name).unwrap();
            assert_eq!(
                (v.name, v.dims, v.dtype, v.bytes),
                (name.as_str(), &dims[..], dtype, &bytes[..])
            );
            assert_eq!(v.numel(), dims.iter().product::<usize>());
        }
        let w = f.get("a/weight").unwrap();
        let alias = f.get("b/weight").unwrap();
        assert_eq!(alias.name, "a/weight", "an alias resolves to its target");
        assert_eq!(
            alias.bytes.as_ptr(),
            w.bytes.as_ptr(),
            "an alias shares the target's bytes"
        );
        assert!(f.get("nope").is_none());
        assert_eq!(f.get("num_heads").unwrap().scalar_i64(), Some(-6));
        assert_eq!(f.get("flag").unwrap().scalar_i64(), Some(1));
        assert_eq!(f.get("big").unwrap().scalar_i64(), Some(70000));
        assert_eq!(
            f.get("a/weight").unwrap().scalar_i64(),
            None,
            "not a scalar"
        );
        assert_eq!(f.get("a/q").unwrap().scalar_i64(), None, "not a scalar");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_truncation_is_an_error() {
        let dir = temp_dir("ct2-trunc");
        let (path, bytes) = small_file(&dir);
        // Every prefix, in memory through `parse` (what `open` runs on the map)...
        for len in 0..bytes.len() {
            assert!(
                parse(&path, &bytes[..len]).is_err(),
                "prefix of {len} bytes parsed"
            );
        }
        assert!(parse(&path, &bytes).is_ok());
        // ...and a few through real files, including the empty one.
        for len in [0, 1, 4, 9, 30, bytes.len() / 2, bytes.len() - 1] {
            open_err(&dir, &bytes[..len]);
        }
        // Inside a variable's data, the error names it.
        let inside = find(&bytes, &f32_bytes(&[1.5; 12])) + 5;
        let e = msg(parse(&path, &bytes[..inside]).unwrap_err());
        assert!(e.contains("`a/weight`") && e.contains("truncated"), "{e}");
        // Inside an alias, the error names the alias position.
        let e = msg(parse(&path, &bytes[..bytes.len() - 3]).unwrap_err());
        assert!(e.contains("alias `b/weight`"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn corrupt_headers_are_errors() {
        let dir = temp_dir("ct2-corrupt");
        let (_, good) = small_file(&dir);

        for v in [0u32, 3, 7, u32::MAX] {
            let mut b = good.clone();
            b[..4].copy_from_slice(&v.to_le_bytes());
            let e = open_err(&dir, &b);
            assert!(e.contains(&format!("version {v} is not supported")), "{e}");
        }

        // Offsets of `a/q`'s fields: name, rank, 2 dims, dtype, byte count.
        let q_name = find(&good, b"a/q\0");
        let rank_at = q_name + 4;
        let dtype_at = rank_at + 1 + 8;
        let count_at = dtype_at + 1;

        let mut b = good.clone();
        b[dtype_at] = 9;
        let e = open_err(&dir, &b);
        assert!(e.contains("variable `a/q`: unknown dtype id 9"), "{e}");

        // Byte count disagreeing with the shape (here: claims more than int8 [2, 2] needs).
        let mut b = good.clone();
        b[count_at..count_at + 4].copy_from_slice(&5u32.to_le_bytes());
        let e = open_err(&dir, &b);
        assert!(
            e.contains("variable `a/q`: 5 bytes stored but shape [2, 2] of int8 needs 4"),
            "{e}"
        );

        // Absurd dims whose product overflows.
        let mut b = good.clone();
        b[rank_at + 1..rank_at + 9].copy_from_slice(&[0xff; 8]);
        b[rank_at] = 2;
        let e = open_err(&dir, &b);
        assert!(e.contains("`a/q`"), "{e}");
        let mut b = good.clone();
        // rank 255: the dims run into the following bytes and the file ends in the shape
        // or fails a later check; either way an error naming `a/q`.
        b[rank_at] = 255;
        let e = open_err(&dir, &b);
        assert!(e.contains("`a/q`"), "{e}");

        // A huge byte count matching a huge shape: must be a truncation, not an allocation.
        let mut b = good.clone();
        b[rank_at + 1..rank_at + 5].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        b[rank_at + 5..rank_at + 9].copy_from_slice(&1u32.to_le_bytes());
        b[count_at..count_at + 4].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
        let e = open_err(&dir, &b);
        assert!(e.contains("`a/q`") && e.contains("truncated"), "{e}");

        // A huge variable count: runs out of file, no giant pre-allocation.
        let count_off = 4 + 2 + "TestSpec".len() + 1 + 4;
        let mut b = good.clone();
        b[count_off..count_off + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        open_err(&dir, &b);

        // A non-UTF-8 name names its predecessor.
        let mut b = good.clone();
        b[q_name + 1] = 0xff;
        let e = open_err(&dir, &b);
        assert!(e.contains("UTF-8") && e.contains("after `a/bias`"), "{e}");

        // A name without its NUL, and a zero-length name.
        let mut b = good.clone();
        b[q_name + 3] = b'x';
        let e = open_err(&dir, &b);
        assert!(e.contains("NUL"), "{e}");
        let mut b = good.clone();
        b[q_name - 2..q_name].copy_from_slice(&0u16.to_le_bytes());
        open_err(&dir, &b);

        // Trailing garbage.
        let mut b = good.clone();
        b.extend_from_slice(b"junk");
        let e = open_err(&dir, &b);
        assert!(e.contains("4 unexpected bytes"), "{e}");

        // A directory is not a model file.
        assert!(Ct2File::open(&dir).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_aliases_and_duplicates_are_errors() {
        let dir = temp_dir("ct2-alias");
        let path = dir.join("model.bin");
        let vars = small_vars();

        let aliases = vec![("x/weight".to_string(), "missing/weight".to_string())];
        write_ct2(&path, "S", 1, &vars, &aliases).unwrap();
        let e = msg(Ct2File::open(&path).unwrap_err());
        assert!(
            e.contains("alias `x/weight` points to `missing/weight`"),
            "{e}"
        );

        let aliases = vec![("a/bias".to_string(), "a/weight".to_string())];
        write_ct2(&path, "S", 1, &vars, &aliases).unwrap();
        let e = msg(Ct2File::open(&path).unwrap_err());
        assert!(e.contains("alias `a/bias`"), "{e}");

        // An alias of an alias resolves to the variable.
        let aliases = vec![
            ("b".to_string(), "a/weight".to_string()),
            ("c".to_string(), "b".to_string()),
        ];
        write_ct2(&path, "S", 1, &vars, &aliases).unwrap();
        assert_eq!(
            Ct2File::open(&path).unwrap().get("c").unwrap().name,
            "a/weight"
        );

        let mut dup = vars.clone();
        dup.push(vars[1].clone());
        write_ct2(&path, "S", 1, &dup, &[]).unwrap();
        let e = msg(Ct2File::open(&path).unwrap_err());
        assert!(
            e.contains("variable `a/bias`: the name is stored twice"),
            "{e}"
        );

        // A shape whose byte size overflows 64 bits.
        let huge = vec![(
            "huge".to_string(),
            vec![u32::MAX as usize; 3],
            DType::F32,
            vec![],
        )];
        write_ct2(&path, "S", 1, &huge, &[]).unwrap();
        let e = msg(Ct2File::open(&path).unwrap_err());
        assert!(
            e.contains("variable `huge`: shape") && e.contains("too large"),
            "{e}"
        );

        // A byte count that disagrees with the shape, written directly.
        let mut short = vars.clone();
        short[0].3.truncate(24);
        write_ct2(&path, "S", 1, &short, &[]).unwrap();
        let e = msg(Ct2File::open(&path).unwrap_err());
        assert!(
            e.contains("variable `a/weight`: 24 bytes stored but shape [3, 4] of float32 needs 48"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn random_byte_flips_never_panic() {
        use rand::{Rng, SeedableRng};
        let dir = temp_dir("ct2-flip");
        let (path, good) = small_file(&dir);
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
        for _ in 0..20_000 {
            let mut b = good.clone();
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            // Either outcome is fine; what matters is no panic, and that whatever parsed
            // hands out views inside the buffer (checked by slicing them here).
            if let Ok(layout) = parse(&path, &b) {
                for v in &layout.vars {
                    let _ = &b[v.data.clone()];
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
