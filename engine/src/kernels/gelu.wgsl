// Exact GELU, 0.5 x (1 + erf(x / sqrt 2)), as Whisper uses it. WGSL has no erf: this is
// Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), enough for f32. Prepended to the kernels
// that apply GELU in their epilogue (WGSL has no includes).

fn erf_approx(v: f32) -> f32 {
    let s = sign(v);
    let a = abs(v);
    let t = 1.0 / (1.0 + 0.3275911 * a);
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    return s * (1.0 - poly * exp(-a * a));
}

fn gelu(v: f32) -> f32 {
    return 0.5 * v * (1.0 + erf_approx(v * 0.70710678118654752));
}
