#!/usr/bin/env python3
"""Make the log-mel fixtures that engine/src/audio/mel.rs is tested against.

Run with a Python that has numpy (faster-whisper optional):
    /tmp/refenv/bin/python engine/tests/data/mel/make_fixture.py

The expected values are computed here independently of the Rust code path: a plain
float64 numpy STFT (explicit framing + np.fft.rfft) and a Slaney mel filter bank written
out from its definition (librosa's `mel(htk=False, norm="slaney")`), following the recipe
Whisper / faster-whisper 1.2 use: append `pad` zeros, reflect-pad n_fft/2 both sides,
periodic Hann window, |X|^2, drop the last frame, filters @ power, log10(max(., 1e-10)),
clamp to (global max - 8), (x + 4) / 4.

Every file is raw little-endian float32, row-major:
  filters_80.bin, filters_128.bin   [n_mels][201]
  chirp_in.bin                      1.3 s chirp + seeded noise with a near-silent gap (20800 samples)
  chirp_mel80.bin, chirp_mel128.bin [n_mels][131]   (pad 160: 20960 / 160 frames)
  short_in.bin                      0.2 s two tones + a click (3200 samples)
  short_mel80.bin                   [80][21]        (pad 160: 3360 / 160 frames)
  short_mel80_nopad.bin             [80][20]        (pad 0: 3200 / 160 = 20 frames)
  tiny_in.bin                       100 samples of seeded noise
  tiny_mel80.bin                    [80][1]         (pad 80: 180 samples, shorter than
                                                     the 200-sample reflect pad, which
                                                     numpy then reflects repeatedly)
  jfk_fw_mel80_every8.bin           [80][138]: faster-whisper's FeatureExtractor on
                                    shared/samples/jfk.wav (pad 160: 1101 frames), every
                                    8th frame (0, 8, ..., 1096) to keep the file small.
  fw_sr_english_16k_1s.bin          faster-whisper's decode_audio (PyAV/libswresample) of
                                    shared/samples/orig/sr_english.wav (44.1 kHz): output
                                    samples 16000..32000 (1 s), to hold our resampler's
                                    alignment and level to the reference's.
"""
import importlib.util
import os
import sys
import wave

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SR = 16000
N_FFT = 400
HOP = 160


# --- Slaney mel scale, from its definition -------------------------------------------
# Linear below 1 kHz (3 mels per 200 Hz), logarithmic above (27 mels per factor 6.4).
F_SP = 200.0 / 3.0
MIN_LOG_HZ = 1000.0
MIN_LOG_MEL = MIN_LOG_HZ / F_SP
LOGSTEP = np.log(6.4) / 27.0


def hz_to_mel(f):
    if f < MIN_LOG_HZ:
        return f / F_SP
    return MIN_LOG_MEL + np.log(f / MIN_LOG_HZ) / LOGSTEP


def mel_to_hz(m):
    if m < MIN_LOG_MEL:
        return m * F_SP
    return MIN_LOG_HZ * np.exp(LOGSTEP * (m - MIN_LOG_MEL))


def slaney_filters(n_mels, fmin=0.0, fmax=SR / 2):
    """Triangles between consecutive mel-spaced edge frequencies, each scaled by
    2 / (upper - lower) so every filter has the same area (Slaney normalisation)."""
    lo, hi = hz_to_mel(fmin), hz_to_mel(fmax)
    edges = [mel_to_hz(lo + (hi - lo) * i / (n_mels + 1)) for i in range(n_mels + 2)]
    bins = np.arange(N_FFT // 2 + 1) * SR / N_FFT
    w = np.zeros((n_mels, len(bins)))
    for m in range(n_mels):
        left, centre, right = edges[m], edges[m + 1], edges[m + 2]
        for k, f in enumerate(bins):
            if left < f <= centre:
                w[m, k] = (f - left) / (centre - left)
            elif centre < f < right:
                w[m, k] = (right - f) / (right - centre)
        w[m] *= 2.0 / (right - left)
    return w


# --- log-mel ---------------------------------------------------------------------------
def log_mel(x, filters, pad):
    x = np.concatenate([np.asarray(x, np.float64), np.zeros(pad)])
    xp = np.pad(x, N_FFT // 2, mode="reflect")
    n_frames = len(x) // HOP  # 1 + len(x) // HOP frames, the last one dropped
    k = np.arange(N_FFT)
    window = 0.5 - 0.5 * np.cos(2.0 * np.pi * k / N_FFT)  # periodic Hann
    power = np.empty((N_FFT // 2 + 1, n_frames))
    for t in range(n_frames):
        spec = np.fft.rfft(xp[t * HOP : t * HOP + N_FFT] * window)
        power[:, t] = spec.real ** 2 + spec.imag ** 2
    logm = np.log10(np.maximum(filters @ power, 1e-10))
    logm = np.maximum(logm, logm.max() - 8.0)
    return (logm + 4.0) / 4.0


def save(name, arr):
    a = np.ascontiguousarray(arr, dtype="<f4")
    a.tofile(os.path.join(HERE, name))
    print(f"{name:28s} {str(a.shape):12s} {a.nbytes:7d} bytes")
    return a


def main():
    f80, f128 = slaney_filters(80), slaney_filters(128)
    save("filters_80.bin", f80)
    save("filters_128.bin", f128)

    rng = np.random.default_rng(20240601)

    # Chirp 100 Hz -> 7 kHz plus noise, with a near-silent gap (x 1e-5) so that the
    # clamp at (max - 8) is exercised.
    n = int(1.3 * SR)
    t = np.arange(n) / SR
    f0, f1, dur = 100.0, 7000.0, 1.3
    chirp = 0.4 * np.sin(2 * np.pi * (f0 * t + 0.5 * (f1 - f0) / dur * t * t))
    x = chirp + 0.05 * rng.standard_normal(n)
    x[int(0.6 * SR) : int(0.8 * SR)] *= 1e-5
    x = save("chirp_in.bin", x)  # the float32 samples both sides see
    save("chirp_mel80.bin", log_mel(x, f80, 160))
    save("chirp_mel128.bin", log_mel(x, f128, 160))

    n = int(0.2 * SR)
    t = np.arange(n) / SR
    x = 0.3 * np.sin(2 * np.pi * 440 * t) + 0.1 * np.sin(2 * np.pi * 3100 * t + 1.0)
    x += 0.8 * np.exp(-((np.arange(n) - 1234) / 6.0) ** 2)
    x = save("short_in.bin", x)
    save("short_mel80.bin", log_mel(x, f80, 160))
    save("short_mel80_nopad.bin", log_mel(x, f80, 0))

    x = save("tiny_in.bin", 0.2 * rng.standard_normal(100))
    save("tiny_mel80.bin", log_mel(x, f80, 80))

    # faster-whisper itself on jfk.wav (optional: skipped where it is not installed).
    try:
        import faster_whisper

        # Load only feature_extractor.py: the package's __init__ pulls in ctranslate2.
        path = os.path.join(os.path.dirname(faster_whisper.__file__), "feature_extractor.py")
        spec = importlib.util.spec_from_file_location("fw_fe", path)
        fe = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fe)
    except ImportError:
        print("faster-whisper not installed: jfk fixture not regenerated", file=sys.stderr)
        return
    samples = os.path.join(HERE, "../../../../../shared/samples/jfk.wav")
    if not os.path.exists(samples):
        samples = "/work/shared/samples/jfk.wav"
    with wave.open(samples) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SR, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    audio = pcm.astype(np.float32) / 32768.0  # what faster_whisper.decode_audio yields
    mel = fe.FeatureExtractor(feature_size=80)(audio, padding=160)
    assert mel.shape == (80, 1101), mel.shape
    # Cross-check our independent recipe against faster-whisper before saving either.
    ours = log_mel(audio, f80, 160)
    print("independent vs faster-whisper, jfk: max abs diff", np.abs(ours - mel).max())
    save("jfk_fw_mel80_every8.bin", mel[:, ::8])

    try:
        path = os.path.join(os.path.dirname(faster_whisper.__file__), "audio.py")
        spec = importlib.util.spec_from_file_location("fw_audio", path)
        fa = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fa)  # needs PyAV
    except ImportError:
        print("PyAV not installed: resample fixture not regenerated", file=sys.stderr)
        return
    src = os.path.join(os.path.dirname(samples), "orig/sr_english.wav")
    audio = fa.decode_audio(src, sampling_rate=SR)
    assert len(audio) == 43919, len(audio)  # round(121052 * 16000 / 44100)
    save("fw_sr_english_16k_1s.bin", audio[16000:32000])


if __name__ == "__main__":
    main()
