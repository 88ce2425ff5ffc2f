//! The speech-LM front end: Whisper's encoder (tiny.en in the product) → a projector that
//! stacks 4 consecutive encoder frames and maps them to the decoder's width → the
//! `inputs_embeds` of the audio positions (375 for a 30 s window), followed by the text
//! prompt, prefilled into the Nemotron-H frame in passes (≈420 positions in all).
//!
//! Stacking 4 frames of `[frames][d]` row-major data *is* a reshape to `[frames/4][4·d]`:
//! no copy, the projector's first linear simply reads the encoder output with a row
//! stride of 4·d. The projector (our definition; the weights come from safetensors):
//!
//! ```text
//! h = stack4(enc) · W1ᵀ + b1          W1: [hidden][4·d_enc]   ("projector.linear1.*")
//! out = relu²(h) · W2ᵀ + b2            W2: [hidden][hidden]    ("projector.linear2.*", optional)
//! ```
//!
//! With only `linear1` present the projector is that single linear map. bf16/f16/f32 are
//! widened exactly as the decoder's weights are.

use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::{Dtype, SafeTensors};

use crate::gpu::Gpu;
use crate::kernels::nemotron::{F32Weights, LinearOps, NemotronKernels, RowsF32};
use crate::models::nemotron_h::checkpoint::{widen_to_f32, WeightDtype};
use crate::{Error, Result};

/// Encoder frames stacked into one audio position.
pub const STACK: usize = 4;

/// One linear layer `[n][k]` + bias `[n]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Linear {
    pub w: Vec<f32>,
    pub b: Vec<f32>,
    pub n: usize,
    pub k: usize,
}

/// The projector's weights (CPU side).
#[derive(Clone, Debug, PartialEq)]
pub struct Projector {
    /// Width of one encoder frame.
    pub d_enc: usize,
    /// The decoder's hidden size.
    pub hidden: usize,
    pub l1: Linear,
    pub l2: Option<Linear>,
}

impl Projector {
    /// Random weights of the right shapes (tests), scaled like a default initialisation.
    pub fn random(d_enc: usize, hidden: usize, two_layers: bool, seed: u64) -> Projector {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64) as f32 * 2.0 - 1.0
        };
        let mut lin = |n: usize, k: usize| {
            let scale = 1.0 / (k as f32).sqrt();
            Linear { w: (0..n * k).map(|_| next() * scale).collect(), b: (0..n).map(|_| next() * 0.1).collect(), n, k }
        };
        let l1 = lin(hidden, STACK * d_enc);
        let l2 = two_layers.then(|| lin(hidden, hidden));
        Projector { d_enc, hidden, l1, l2 }
    }

    /// Load `projector.linear1.{weight,bias}` (+ optional `linear2`) from a safetensors file.
    pub fn load(path: &Path) -> Result<Projector> {
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let st = SafeTensors::deserialize(&bytes).map_err(|e| Error::model(path, format!("not a safetensors file: {e}")))?;
        let get = |name: &str| -> Result<Option<(Vec<usize>, Vec<f32>)>> {
            let t = match st.tensor(name) {
                Ok(t) => t,
                Err(_) => return Ok(None),
            };
            let dt = match t.dtype() {
                Dtype::BF16 => WeightDtype::BF16,
                Dtype::F16 => WeightDtype::F16,
                Dtype::F32 => WeightDtype::F32,
                other => return Err(Error::model(path, format!("{name} is {other:?}; bf16, f16 or f32 expected"))),
            };
            let mut v = Vec::new();
            widen_to_f32(dt, t.data(), &mut v);
            Ok(Some((t.shape().to_vec(), v)))
        };
        let linear = |prefix: &str, required: bool| -> Result<Option<Linear>> {
            let (w, b) = (get(&format!("{prefix}.weight"))?, get(&format!("{prefix}.bias"))?);
            match (w, b) {
                (None, None) if !required => Ok(None),
                (Some((ws, w)), Some((bs, b))) => {
                    if ws.len() != 2 || bs != [ws[0]] {
                        return Err(Error::model(path, format!("{prefix}: weight {ws:?} and bias {bs:?} do not form a linear layer")));
                    }
                    Ok(Some(Linear { w, b, n: ws[0], k: ws[1] }))
                }
                _ => Err(Error::model(path, format!("{prefix}.weight and {prefix}.bias must both be present"))),
            }
        };
        let l1 = linear("projector.linear1", true)?.ok_or_else(|| Error::model(path, "projector.linear1 is missing"))?;
        let l2 = linear("projector.linear2", false)?;
        if l1.k % STACK != 0 {
            return Err(Error::model(path, format!("projector.linear1 takes {} inputs, not a multiple of {STACK} frames", l1.k)));
        }
        if let Some(l2) = &l2 {
            if l2.k != l1.n || l2.n != l1.n {
                return Err(Error::model(path, format!("projector.linear2 is [{}, {}]; [{}, {}] expected", l2.n, l2.k, l1.n, l1.n)));
            }
        }
        Ok(Projector { d_enc: l1.k / STACK, hidden: l1.n, l1, l2 })
    }

    /// Audio positions for `frames` encoder frames (a trailing partial stack is dropped).
    pub fn positions(&self, frames: usize) -> usize {
        frames / STACK
    }

    /// The CPU reference: `[frames][d_enc]` → `[frames/4][hidden]` (f64 accumulation).
    pub fn apply_cpu(&self, enc: &[f32], frames: usize) -> Result<Vec<f32>> {
        if enc.len() != frames * self.d_enc {
            return Err(Error::Invalid(format!("{} encoder values are not {frames} frames of {}", enc.len(), self.d_enc)));
        }
        let p = self.positions(frames);
        let lin = |x: &[f32], l: &Linear, relu2_in: bool| -> Vec<f32> {
            let rows = x.len() / l.k;
            let mut y = vec![0f32; rows * l.n];
            for r in 0..rows {
                let xr = &x[r * l.k..(r + 1) * l.k];
                for o in 0..l.n {
                    let wr = &l.w[o * l.k..(o + 1) * l.k];
                    let mut acc = l.b[o] as f64;
                    for (a, w) in xr.iter().zip(wr) {
                        let a = if relu2_in { crate::reference::nemotron_h::relu2(*a) } else { *a };
                        acc += a as f64 * *w as f64;
                    }
                    y[r * l.n + o] = acc as f32;
                }
            }
            y
        };
        let h = lin(&enc[..p * STACK * self.d_enc], &self.l1, false);
        Ok(match &self.l2 {
            Some(l2) => lin(&h, l2, true),
            None => h,
        })
    }
}

/// The projector on the GPU, run on the encoder's output buffer in place.
pub struct GpuProjector {
    gpu: Arc<Gpu>,
    kern: NemotronKernels,
    d_enc: u32,
    hidden: u32,
    w1: F32Weights,
    b1: wgpu::Buffer,
    l2: Option<(F32Weights, wgpu::Buffer)>,
    h: wgpu::Buffer,
    out: wgpu::Buffer,
    max_positions: u32,
}

impl GpuProjector {
    /// Upload the weights; room for up to `max_positions` audio positions.
    pub fn new(gpu: Arc<Gpu>, p: &Projector, max_positions: usize) -> Result<GpuProjector> {
        let g: &Gpu = &gpu;
        let kern = NemotronKernels::load(g)?;
        let w1 = F32Weights::upload(g, "projector.linear1", &p.l1.w, p.l1.n, p.l1.k)?;
        let b1 = g.upload_f32("projector.linear1.bias", &p.l1.b)?;
        let l2 = match &p.l2 {
            Some(l) => Some((F32Weights::upload(g, "projector.linear2", &l.w, l.n, l.k)?, g.upload_f32("projector.linear2.bias", &l.b)?)),
            None => None,
        };
        let bytes = (max_positions.max(1) * p.hidden * 4) as u64;
        let h = g.buffer("projector hidden", bytes)?;
        let out = g.buffer("projector out", bytes)?;
        Ok(GpuProjector {
            gpu,
            kern,
            d_enc: p.d_enc as u32,
            hidden: p.hidden as u32,
            w1,
            b1,
            l2,
            h,
            out,
            max_positions: max_positions as u32,
        })
    }

    /// Project `frames` rows of `enc` (`[frames][d_enc]` f32 from offset 0, e.g. the Whisper
    /// encoder's output buffer) and read back `[frames/4][hidden]`.
    pub fn project(&self, enc: &wgpu::Buffer, frames: usize) -> Result<Vec<f32>> {
        let p = (frames / STACK) as u32;
        if p > self.max_positions {
            return Err(Error::Invalid(format!("{p} audio positions; the projector was sized for {}", self.max_positions)));
        }
        if enc.size() < (frames as u64 * self.d_enc as u64 * 4) {
            return Err(Error::Invalid(format!("the encoder buffer holds fewer than {frames} frames of {}", self.d_enc)));
        }
        let mut rec = self.gpu.recorder();
        rec.stage("projector");
        let stacked = RowsF32::new(enc, STACK as u32 * self.d_enc);
        match &self.l2 {
            None => self.kern.linear(&mut rec, stacked, p, &self.w1, Some(&self.b1), RowsF32::new(&self.out, self.hidden), LinearOps::default())?,
            Some((w2, b2)) => {
                self.kern.linear(&mut rec, stacked, p, &self.w1, Some(&self.b1), RowsF32::new(&self.h, self.hidden), LinearOps::default())?;
                // relu² belongs to linear2's input; the kernel applies it after a product,
                // so run it on h in place first (relu2(h), then the plain product).
                self.kern.relu2(&mut rec, &self.h, p * self.hidden)?;
                self.kern.linear(&mut rec, RowsF32::new(&self.h, self.hidden), p, w2, Some(b2), RowsF32::new(&self.out, self.hidden), LinearOps::default())?;
            }
        }
        rec.submit(None)?;
        self.gpu.read_f32(&self.out, 0, p as usize * self.hidden as usize)
    }
}

#[cfg(test)]
mod tests;
