//! Loads that stream past the caches: SPIR-V's `Nontemporal` memory operand on every load
//! through a binding a kernel declares as [`Access::Stream`](super::Access::Stream).
//!
//! Why: a tiny.en decode step's logits GEMV reads the 40 MB embedding table once a step,
//! and that read pushes the layers' weights and the cross-attention's K|V out of the GPU's
//! L2 (~50 MB): the step ran ~22 us faster with a 5 MB table (bench/RESULTS.md 2026-12-04),
//! of which the table's own read is ~10. A load marked Nontemporal tells the driver the data
//! will not be read again soon, so it may keep it from evicting what will. WGSL has no way
//! to say so and naga never writes the operand, so the kernel's SPIR-V (as wgpu-hal would
//! write it, `pipeline_stats::spirv`) is patched here and handed to wgpu as a passthrough
//! module. The operand needs SPIR-V 1.4 (Vulkan 1.2 devices get 1.5 from naga); what a driver
//! does with it is its own choice: only a measurement says whether it helps.

use crate::{Error, Result};

const MAGIC: u32 = 0x0723_0203;
const OP_DECORATE: u32 = 71;
const OP_LOAD: u32 = 61;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_COPY_OBJECT: u32 = 83;
const DECORATION_BINDING: u32 = 33;
const DECORATION_DESCRIPTOR_SET: u32 = 34;
const MEMORY_ACCESS_NONTEMPORAL: u32 = 0x4;

/// Every OpLoad through a pointer into bindings `bindings` of descriptor set 0 gets the
/// Nontemporal memory operand. Returns how many loads were marked; an error where the
/// module is not SPIR-V 1.4 or later, or where no load was marked (the binding unused or
/// reached some way this walk does not follow: the patch would silently do nothing).
pub fn mark_loads(words: &mut Vec<u32>, bindings: &[u32]) -> Result<usize> {
    let bad = |what: String| Error::Gpu(format!("marking loads nontemporal: {what}"));
    if words.len() < 5 || words[0] != MAGIC {
        return Err(bad("not a SPIR-V module".into()));
    }
    if words[1] < 0x0001_0400 {
        return Err(bad(format!("SPIR-V {}.{} has no Nontemporal operand (1.4 and later)", words[1] >> 16 & 0xff, words[1] >> 8 & 0xff)));
    }
    // Instructions as (start, word count, opcode).
    let mut ins = Vec::new();
    let mut at = 5;
    while at < words.len() {
        let n = (words[at] >> 16) as usize;
        if n == 0 || at + n > words.len() {
            return Err(bad(format!("a malformed instruction at word {at}")));
        }
        ins.push((at, n, words[at] & 0xffff));
        at += n;
    }
    let mut binding = std::collections::HashMap::new();
    let mut set = std::collections::HashMap::new();
    for &(i, n, op) in &ins {
        if op == OP_DECORATE && n == 4 {
            match words[i + 2] {
                DECORATION_BINDING => {
                    binding.insert(words[i + 1], words[i + 3]);
                }
                DECORATION_DESCRIPTOR_SET => {
                    set.insert(words[i + 1], words[i + 3]);
                }
                _ => {}
            }
        }
    }
    // The variables, then every pointer derived from them (definitions precede uses).
    let mut ptrs: std::collections::HashSet<u32> =
        binding.iter().filter(|(id, b)| bindings.contains(b) && set.get(id) == Some(&0)).map(|(id, _)| *id).collect();
    if ptrs.len() != bindings.len() {
        return Err(bad(format!("bindings {bindings:?} of set 0 not all declared")));
    }
    let mut marks = Vec::new();
    for &(i, n, op) in &ins {
        match op {
            OP_ACCESS_CHAIN | OP_IN_BOUNDS_ACCESS_CHAIN | OP_PTR_ACCESS_CHAIN | OP_COPY_OBJECT if n >= 4 => {
                if ptrs.contains(&words[i + 3]) {
                    ptrs.insert(words[i + 2]);
                }
            }
            OP_LOAD if n >= 4 && ptrs.contains(&words[i + 3]) => marks.push((i, n)),
            _ => {}
        }
    }
    if marks.is_empty() {
        return Err(bad(format!("no load through bindings {bindings:?}")));
    }
    let mut out = Vec::with_capacity(words.len() + marks.len());
    out.extend_from_slice(&words[..5]);
    let mut next = marks.iter().peekable();
    for &(i, n, _) in &ins {
        if next.peek().is_some_and(|m| m.0 == i) {
            next.next();
            if n == 4 {
                // OpLoad type result pointer: the operand mask added as a fifth word.
                out.push((5 << 16) | OP_LOAD);
                out.extend_from_slice(&words[i + 1..i + 4]);
                out.push(MEMORY_ACCESS_NONTEMPORAL);
            } else {
                let mask = out.len() + 4;
                out.extend_from_slice(&words[i..i + n]);
                out[mask] |= MEMORY_ACCESS_NONTEMPORAL;
            }
        } else {
            out.extend_from_slice(&words[i..i + n]);
        }
    }
    *words = out;
    Ok(marks.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wgpu::naga;

    const SRC: &str = "
@group(0) @binding(1) var<storage, read> a: array<u32>;
@group(0) @binding(2) var<storage, read> b: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<u32>;
fn from_b(i: u32) -> vec4<u32> { return b[i]; }
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    let v = from_b(g.x) + b[g.x + 1u];
    y[g.x] = a[g.x] + v.x + v.w;
}
";

    fn spirv(version: (u8, u8)) -> Vec<u32> {
        let module = naga::front::wgsl::parse_str(SRC).unwrap();
        let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), naga::valid::Capabilities::all()).validate(&module).unwrap();
        let options = naga::back::spv::Options { lang_version: version, ..Default::default() };
        naga::back::spv::write_vec(&module, &info, &options, None).unwrap()
    }

    /// The memory operand mask of every load in `words` (0 where it has none).
    fn loads(words: &[u32]) -> Vec<u32> {
        let mut out = Vec::new();
        let mut at = 5;
        while at < words.len() {
            let n = (words[at] >> 16) as usize;
            if words[at] & 0xffff == OP_LOAD {
                out.push(if n > 4 { words[at + 4] } else { 0 });
            }
            at += n;
        }
        out
    }

    #[test]
    fn loads_through_the_binding_are_marked_and_no_others() {
        let plain = spirv((1, 5));
        let mut words = plain.clone();
        let marked = mark_loads(&mut words, &[2]).unwrap();
        // b is read twice (once inside a function); a and y's reads stay as they were.
        assert_eq!(marked, 2, "loads of binding 2");
        let (before, after) = (loads(&plain), loads(&words));
        assert_eq!(before.len(), after.len());
        assert_eq!(after.iter().filter(|m| *m & MEMORY_ACCESS_NONTEMPORAL != 0).count(), 2);
        assert_eq!(words.len(), plain.len() + 2, "one operand word a marked load");
        // Marking both read bindings marks the third load too.
        let mut both = plain.clone();
        assert_eq!(mark_loads(&mut both, &[1, 2]).unwrap(), 3);
    }

    #[test]
    fn refuses_what_it_cannot_mark() {
        let mut old = spirv((1, 3));
        assert!(mark_loads(&mut old, &[2]).is_err(), "SPIR-V 1.3 has no Nontemporal");
        let mut words = spirv((1, 5));
        assert!(mark_loads(&mut words, &[7]).is_err(), "an undeclared binding");
        assert!(mark_loads(&mut vec![1, 2, 3], &[2]).is_err(), "not SPIR-V");
    }
}
