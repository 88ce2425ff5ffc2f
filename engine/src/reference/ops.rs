//! The plain CPU operators every GPU kernel is held to.
//!
//! Storage is f32 (what the kernels read and write); every reduction and dot product
//! accumulates in f64 so that the reference's own rounding error is far below anything a
//! kernel test bounds. The loops are the textbook ones. The only concessions to speed
//! (the whole CPU Whisper runs on these) are: dot products keep four independent f64
//! partial sums so the compiler can vectorise them, and [`linear`] / [`attention`] split
//! their rows over two threads when the work is large. Neither changes what a row's
//! result is: every output element is computed by the same code whatever the batch size,
//! so a batch of n rows gives bit-identical results to n single rows.

/// Work (multiply-adds) above which [`linear`] and [`attention`] use two threads. Below
/// it, spawning costs more than it saves.
const PARALLEL_MACS: usize = 1 << 22;

/// f64 dot product of two equal-length f32 slices.
///
/// Four partial sums rather than one: a single f64 accumulator forces a strictly serial
/// add chain that cannot vectorise; four independent chains can. The order is fixed, so
/// the result is deterministic and independent of where the slices come from.
#[inline]
pub(crate) fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f64; 4];
    let mut ca = a.chunks_exact(4);
    let mut cb = b.chunks_exact(4);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..4 {
            acc[l] += x[l] as f64 * y[l] as f64;
        }
    }
    let mut tail = 0f64;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += *x as f64 * *y as f64;
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// Run `f(first_row, rows_out)` over `out` (rows of `row_len` elements), on two threads
/// when `work` is large. Each row is computed by the same call whichever thread owns it.
fn par_rows<F>(out: &mut [f32], row_len: usize, work: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    let rows = if row_len == 0 { 0 } else { out.len() / row_len };
    if work < PARALLEL_MACS || rows < 2 {
        f(0, out);
        return;
    }
    let half = rows.div_ceil(2);
    let (a, b) = out.split_at_mut(half * row_len);
    std::thread::scope(|s| {
        s.spawn(|| f(0, a));
        f(half, b);
    });
}

/// y[m][n] = sum_k x[m][k] * w[n][k] + bias[n]   (w row-major [n][k], as CTranslate2/PyTorch Linear)
pub fn linear(
    x: &[f32],
    m: usize,
    k: usize,
    w: &[f32],
    n: usize,
    bias: Option<&[f32]>,
) -> Vec<f32> {
    assert_eq!(x.len(), m * k, "linear: x is not [m][k]");
    assert_eq!(w.len(), n * k, "linear: w is not [n][k]");
    if let Some(b) = bias {
        assert_eq!(b.len(), n, "linear: bias is not [n]");
    }
    let mut y = vec![0f32; m * n];
    par_rows(&mut y, n, m * n * k, |row0, out| {
        for (r, yrow) in out.chunks_exact_mut(n.max(1)).enumerate() {
            let xrow = &x[(row0 + r) * k..(row0 + r + 1) * k];
            for (j, yj) in yrow.iter_mut().enumerate() {
                let mut acc = dot_f64(xrow, &w[j * k..(j + 1) * k]);
                if let Some(b) = bias {
                    acc += b[j] as f64;
                }
                *yj = acc as f32;
            }
        }
    });
    y
}

/// The error function, to about 1e-16 absolute (f64).
///
/// std has no erf. This uses the everywhere-convergent series
/// erf(z) = 2/sqrt(pi) · exp(-z²) · Σ_{n≥0} 2ⁿ z^(2n+1) / (1·3·5···(2n+1)),
/// whose terms are all of one sign (no cancellation), summed until a term no longer
/// changes the sum. For |z| ≥ 6, 1 - |erf(z)| < 3e-17, below f64's resolution at 1.
pub fn erf(z: f64) -> f64 {
    if z.is_nan() {
        return f64::NAN;
    }
    if z.abs() >= 6.0 {
        return z.signum();
    }
    let z2 = z * z;
    let mut term = z; // n = 0: z / 1
    let mut sum = z;
    let mut n = 0u32;
    loop {
        n += 1;
        term *= 2.0 * z2 / (2 * n + 1) as f64;
        let next = sum + term;
        if next == sum {
            break;
        }
        sum = next;
    }
    2.0 / std::f64::consts::PI.sqrt() * (-z2).exp() * sum
}

/// exact GELU: 0.5 x (1 + erf(x / sqrt 2)), computed in f64 (Whisper's nn.GELU(), not
/// the tanh approximation).
pub fn gelu(x: f32) -> f32 {
    let x = x as f64;
    (0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2))) as f32
}

/// A transformer's feed-forward block with its residual, row-wise:
/// x + GELU(LayerNorm(x) · W1ᵀ + b1) · W2ᵀ + b2, with W1 [ffn][d] and W2 [d][ffn] row-major
/// (the hidden row in f32, as the GPU keeps it).
#[allow(clippy::too_many_arguments)]
pub fn ffn_residual(
    x: &[f32],
    rows: usize,
    d: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
    w1: &[f32],
    b1: &[f32],
    ffn: usize,
    w2: &[f32],
    b2: &[f32],
) -> Vec<f32> {
    let xn = layer_norm(x, rows, d, gamma, beta, eps);
    let mut h = linear(&xn, rows, d, w1, ffn, Some(b1));
    for v in h.iter_mut() {
        *v = gelu(*v);
    }
    let y = linear(&h, rows, ffn, w2, d, Some(b2));
    x.iter().zip(&y).map(|(a, b)| a + b).collect()
}

/// Row-wise LayerNorm over `cols`: (x - mean) / sqrt(var + eps) * gamma + beta, with the
/// biased variance (divide by cols) as PyTorch and CTranslate2 use. Two passes in f64.
pub fn layer_norm(
    x: &[f32],
    rows: usize,
    cols: usize,
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) -> Vec<f32> {
    assert_eq!(x.len(), rows * cols, "layer_norm: x is not [rows][cols]");
    assert_eq!(gamma.len(), cols, "layer_norm: gamma is not [cols]");
    assert_eq!(beta.len(), cols, "layer_norm: beta is not [cols]");
    let mut y = vec![0f32; rows * cols];
    for r in 0..rows {
        let row = &x[r * cols..(r + 1) * cols];
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for c in 0..cols {
            y[r * cols + c] =
                ((row[c] as f64 - mean) * inv * gamma[c] as f64 + beta[c] as f64) as f32;
        }
    }
    y
}

/// Conv1d, kernel 3, padding 1, given stride; input channel-major [cin][t_in]; weight [cout][cin][3];
/// output TIME-major [t_out][cout], t_out = (t_in + 2 - 3) / stride + 1; bias added, then GELU if `gelu`.
///
/// Written as im2col + [`linear`]: column t holds input[c][t·stride + r - 1] (0 outside the
/// signal) at index c·3 + r, which is exactly the weight's [cin][3] layout, so
/// out[t][o] = Σ_{c,r} w[o][c][r] · input[c][t·stride + r - 1] + bias[o].
pub fn conv1d_k3(
    input: &[f32],
    cin: usize,
    t_in: usize,
    w: &[f32],
    bias: &[f32],
    cout: usize,
    stride: usize,
    gelu: bool,
) -> Vec<f32> {
    assert!(stride >= 1, "conv1d_k3: stride 0");
    assert!(t_in >= 1, "conv1d_k3: empty input");
    assert_eq!(
        input.len(),
        cin * t_in,
        "conv1d_k3: input is not [cin][t_in]"
    );
    assert_eq!(
        w.len(),
        cout * cin * 3,
        "conv1d_k3: weight is not [cout][cin][3]"
    );
    let t_out = (t_in + 2 - 3) / stride + 1;
    let kk = cin * 3;
    let mut cols = vec![0f32; t_out * kk];
    for t in 0..t_out {
        for c in 0..cin {
            for r in 0..3 {
                // Input position t·stride + r - 1, with padding 1 on each side.
                let p = (t * stride + r) as isize - 1;
                if p >= 0 && (p as usize) < t_in {
                    cols[t * kk + c * 3 + r] = input[c * t_in + p as usize];
                }
            }
        }
    }
    let mut y = linear(&cols, t_out, kk, w, cout, Some(bias));
    if gelu {
        y.iter_mut().for_each(|v| *v = self::gelu(*v));
    }
    y
}

/// Multi-head scaled dot-product attention, scale 1/sqrt(d). q [tq][heads*d], k and v [tk][heads*d], out [tq][heads*d].
/// causal = Some(offset): query i may attend keys j <= i + offset (decoder self-attention with a KV cache of `offset` earlier positions).
///
/// Scores, softmax and the weighted sum of V are all in f64. A query with no key to
/// attend to (tk = 0) gets zeros.
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    tq: usize,
    tk: usize,
    heads: usize,
    d: usize,
    causal: Option<usize>,
) -> Vec<f32> {
    let w = heads * d;
    assert_eq!(q.len(), tq * w, "attention: q is not [tq][heads*d]");
    assert_eq!(k.len(), tk * w, "attention: k is not [tk][heads*d]");
    assert_eq!(v.len(), tk * w, "attention: v is not [tk][heads*d]");
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0f32; tq * w];
    par_rows(&mut out, w, tq * tk * w * 2, |row0, rows| {
        let mut scores = vec![0f64; tk];
        let mut acc = vec![0f64; d];
        for (r, orow) in rows.chunks_exact_mut(w.max(1)).enumerate() {
            let i = row0 + r;
            let n_keys = match causal {
                Some(offset) => (i + offset + 1).min(tk),
                None => tk,
            };
            if n_keys == 0 {
                continue;
            }
            for h in 0..heads {
                let qh = &q[i * w + h * d..i * w + (h + 1) * d];
                let mut max = f64::NEG_INFINITY;
                for j in 0..n_keys {
                    let s = dot_f64(qh, &k[j * w + h * d..j * w + (h + 1) * d]) * scale;
                    scores[j] = s;
                    max = max.max(s);
                }
                let mut sum = 0f64;
                for s in &mut scores[..n_keys] {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                acc.iter_mut().for_each(|a| *a = 0.0);
                for j in 0..n_keys {
                    let p = scores[j] / sum;
                    let vh = &v[j * w + h * d..j * w + (h + 1) * d];
                    for (a, &x) in acc.iter_mut().zip(vh) {
                        *a += p * x as f64;
                    }
                }
                for (o, a) in orow[h * d..(h + 1) * d].iter_mut().zip(&acc) {
                    *o = *a as f32;
                }
            }
        }
    });
    out
}

/// Softmax over the whole slice, max-subtracted, sums in f64. An empty slice is left
/// alone; if every element is -inf the result is NaN (there is no distribution).
pub fn softmax_in_place(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    for v in x.iter_mut() {
        *v = ((*v as f64 - max).exp() / sum) as f32;
    }
}

/// Round to f16 and back (half crate, round-to-nearest-even): tests feed the GPU and the
/// reference the same f16-rounded weights, so storage precision is not what they measure.
pub fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn linear_small_integers() {
        // x = [[1,2,3],[4,5,6]], w = [[1,0,-1],[2,1,0]], bias [10, 20]
        let x = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let w = [1.0, 0.0, -1.0, 2.0, 1.0, 0.0];
        let y = linear(&x, 2, 3, &w, 2, Some(&[10.0, 20.0]));
        assert_eq!(
            y,
            vec![
                1.0 - 3.0 + 10.0,
                2.0 + 2.0 + 20.0,
                4.0 - 6.0 + 10.0,
                8.0 + 5.0 + 20.0
            ]
        );
        let y = linear(&x, 2, 3, &w, 2, None);
        assert_eq!(y, vec![-2.0, 4.0, -2.0, 13.0]);
    }

    #[test]
    fn linear_threaded_matches_naive() {
        // Large enough to take the two-thread path; odd sizes; compared with a plain
        // triple loop (same f64 sums, so equal to rounding of the last add order).
        let (m, k, n) = (67, 129, 515);
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
            .collect();
        let w: Vec<f32> = (0..n * k)
            .map(|i| ((i * 53 % 97) as f32 - 48.0) / 29.0)
            .collect();
        let b: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
        assert!(m * n * k >= PARALLEL_MACS / 2);
        let y = linear(&x, m, k, &w, n, Some(&b));
        for i in 0..m {
            for j in 0..n {
                let mut s = b[j] as f64;
                for t in 0..k {
                    s += x[i * k + t] as f64 * w[j * k + t] as f64;
                }
                assert!(
                    close(y[i * n + j] as f64, s, 1e-5 * s.abs().max(1.0)),
                    "{i},{j}"
                );
            }
        }
        // Batch independence: one row alone gives the same bits as inside the batch.
        let row = linear(&x[5 * k..6 * k], 1, k, &w, n, Some(&b));
        assert_eq!(&row[..], &y[5 * n..6 * n]);
    }

    #[test]
    fn erf_and_gelu_known_values() {
        // High-precision values (mpmath).
        assert!(close(erf(0.5), 0.5204998778130465, 1e-15));
        assert!(close(erf(1.0), 0.8427007929497149, 1e-15));
        assert!(close(erf(-2.0), -0.9953222650189527, 1e-15));
        assert!(close(erf(3.5), 0.9999992569016276, 1e-15));
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(7.0), 1.0);
        assert!(close(gelu(1.0) as f64, 0.8413447460685429, 1e-7));
        assert!(close(gelu(-0.5) as f64, -0.15426876936299344, 1e-7));
        assert!(close(gelu(2.0) as f64, 1.9544997361036416, 1e-7));
        assert_eq!(gelu(0.0), 0.0);
        assert!(close(gelu(-10.0) as f64, 0.0, 1e-20));
        assert_eq!(gelu(10.0), 10.0);
    }

    #[test]
    fn layer_norm_normalises_then_applies_affine() {
        let (rows, cols) = (3, 7);
        let x: Vec<f32> = (0..rows * cols)
            .map(|i| (i as f32 * 1.7).sin() * 5.0 + i as f32)
            .collect();
        let ones = vec![1.0; cols];
        let zeros = vec![0.0; cols];
        let y = layer_norm(&x, rows, cols, &ones, &zeros, 0.0);
        for r in 0..rows {
            let row = &y[r * cols..(r + 1) * cols];
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / cols as f64;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / cols as f64;
            assert!(close(mean, 0.0, 1e-6), "mean {mean}");
            assert!(close(var, 1.0, 1e-5), "var {var}");
        }
        let gamma: Vec<f32> = (0..cols).map(|c| 0.5 + c as f32).collect();
        let beta: Vec<f32> = (0..cols).map(|c| c as f32 - 3.0).collect();
        let z = layer_norm(&x, rows, cols, &gamma, &beta, 0.0);
        for i in 0..rows * cols {
            let c = i % cols;
            assert!(close(z[i] as f64, (y[i] * gamma[c] + beta[c]) as f64, 1e-5));
        }
        // eps matters for a constant row: (x - mean) = 0 -> beta, no NaN.
        let flat = layer_norm(&[2.0; 4], 1, 4, &[1.0; 4], &[0.25; 4], 1e-5);
        assert_eq!(flat, vec![0.25; 4]);
    }

    #[test]
    fn attention_one_key_returns_v() {
        let (heads, d) = (2, 3);
        let q = [
            0.3, -1.0, 2.0, 5.0, 0.1, -0.2, 1.0, 1.0, 1.0, -3.0, 0.0, 4.0,
        ];
        let k = [0.7, 0.2, -0.4, 1.5, 2.5, -1.0];
        let v = [1.0, 2.0, 3.0, -4.0, 5.5, 6.25];
        let out = attention(&q, &k, &v, 2, 1, heads, d, None);
        assert_eq!(out, [&v[..], &v[..]].concat());
    }

    #[test]
    fn attention_matches_direct_formula_and_causal_offset() {
        let (tq, tk, heads, d) = (3, 5, 2, 4);
        let w = heads * d;
        let f = |i: usize, s: f32| ((i as f32 * s).sin() * 1.3) as f32;
        let q: Vec<f32> = (0..tq * w).map(|i| f(i, 0.7)).collect();
        let k: Vec<f32> = (0..tk * w).map(|i| f(i, 1.1)).collect();
        let v: Vec<f32> = (0..tk * w).map(|i| f(i, 0.37)).collect();
        // Direct: per head, softmax over allowed keys of q·k/sqrt(d), then Σ p v.
        let direct = |offset: Option<usize>| {
            let mut out = vec![0f64; tq * w];
            for i in 0..tq {
                for h in 0..heads {
                    let allowed: Vec<usize> = (0..tk)
                        .filter(|&j| offset.map_or(true, |o| j <= i + o))
                        .collect();
                    let s: Vec<f64> = allowed
                        .iter()
                        .map(|&j| {
                            (0..d)
                                .map(|c| q[i * w + h * d + c] as f64 * k[j * w + h * d + c] as f64)
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let z: f64 = s.iter().map(|x| x.exp()).sum();
                    for (a, &j) in allowed.iter().enumerate() {
                        for c in 0..d {
                            out[i * w + h * d + c] += s[a].exp() / z * v[j * w + h * d + c] as f64;
                        }
                    }
                }
            }
            out
        };
        for causal in [None, Some(0), Some(2)] {
            let got = attention(&q, &k, &v, tq, tk, heads, d, causal);
            let want = direct(causal);
            for i in 0..tq * w {
                assert!(
                    close(got[i] as f64, want[i], 1e-6),
                    "{causal:?} {i}: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
        // Causal offset 2 with tq 3, tk 5 is a KV cache of 2 plus 3 new positions: the
        // last query sees all 5 keys, so its row equals the non-causal result.
        let full = attention(&q, &k, &v, tq, tk, heads, d, None);
        let cached = attention(&q, &k, &v, tq, tk, heads, d, Some(2));
        assert_eq!(&full[2 * w..], &cached[2 * w..]);
        // Offset 0: the first query sees only key 0, so it gets v[0].
        let c0 = attention(&q, &k, &v, tq, tk, heads, d, Some(0));
        for c in 0..w {
            assert!(close(c0[c] as f64, v[c] as f64, 1e-7));
        }
    }

    #[test]
    fn conv1d_matches_direct_formula() {
        let (cin, t_in, cout) = (2, 7, 3);
        let input: Vec<f32> = (0..cin * t_in).map(|i| i as f32 * 0.5 - 2.0).collect();
        let w: Vec<f32> = (0..cout * cin * 3)
            .map(|i| ((i * 7) % 5) as f32 - 2.0)
            .collect();
        let bias = [0.5, -1.0, 2.0];
        for stride in [1, 2, 3] {
            for g in [false, true] {
                let y = conv1d_k3(&input, cin, t_in, &w, &bias, cout, stride, g);
                let t_out = (t_in - 1) / stride + 1;
                assert_eq!(y.len(), t_out * cout);
                for t in 0..t_out {
                    for o in 0..cout {
                        let mut s = bias[o] as f64;
                        for c in 0..cin {
                            for r in 0..3 {
                                let p = (t * stride + r) as i64 - 1;
                                let xv = if p < 0 || p >= t_in as i64 {
                                    0.0
                                } else {
                                    input[c * t_in + p as usize]
                                };
                                s += w[o * cin * 3 + c * 3 + r] as f64 * xv as f64;
                            }
                        }
                        let want = if g { gelu(s as f32) } else { s as f32 };
                        assert!(
                            close(y[t * cout + o] as f64, want as f64, 1e-6),
                            "s{stride} t{t} o{o}"
                        );
                    }
                }
            }
        }
        // Hand case: one channel [1,2,3], weight [1,1,1], no bias, stride 1 -> [3,6,5].
        assert_eq!(
            conv1d_k3(
                &[1.0, 2.0, 3.0],
                1,
                3,
                &[1.0, 1.0, 1.0],
                &[0.0],
                1,
                1,
                false
            ),
            vec![3.0, 6.0, 5.0]
        );
    }

    #[test]
    fn softmax_and_f16_round() {
        let mut x = [1.0f32, 2.0, 3.0];
        softmax_in_place(&mut x);
        let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
        assert!(close(x[2] as f64, 3f64.exp() / z, 1e-7));
        assert!(close(x.iter().map(|&v| v as f64).sum::<f64>(), 1.0, 1e-6));
        let mut big = [1000.0f32, 1000.0];
        softmax_in_place(&mut big);
        assert_eq!(big, [0.5, 0.5]);
        assert_eq!(f16_round(1.0), 1.0);
        assert_eq!(f16_round(0.1), 0.099975586);
        assert_eq!(f16_round(65520.0), f32::INFINITY);
    }
}
