//! The projector against its CPU reference, and the whole front end (tiny.en's encoder on
//! real speech → projector → 375 audio embeddings + a text prompt) prefilled into the
//! Nemotron-H GPU frame in passes, against the CPU reference frame fed the same inputs.

use std::sync::Arc;

use super::*;
use crate::decode::LogitSource;
use crate::testgpu::{rand_vec, rel_err, rng, NAN_BITS};

fn gpu() -> Arc<Gpu> {
    crate::testgpu::gpu_arc()
}

#[test]
fn projector_matches_reference_one_and_two_layers() {
    let g = gpu();
    let mut r = rng("projector_matches_reference");
    // Awkward sizes: 4·d_enc = 92 inputs, 37 outputs, 23 frames (the last 3 dropped: 5 positions).
    for (two, d_enc, hidden, frames) in [(false, 23, 37, 23), (true, 23, 38, 23), (true, 24, 64, 64)] {
        let p = Projector::random(d_enc, hidden, two, 7 + frames as u64);
        let enc = rand_vec(&mut r, frames * d_enc, 1.0);
        let want = p.apply_cpu(&enc, frames).unwrap();
        assert_eq!(want.len(), frames / STACK * hidden);
        let gp = GpuProjector::new(g.clone(), &p, 16).unwrap();
        g.fill_u32(&gp.out, NAN_BITS);
        g.fill_u32(&gp.h, NAN_BITS);
        let buf = g.upload_f32("enc", &enc).unwrap();
        let got = gp.project(&buf, frames).unwrap();
        let e = rel_err(&got, &want);
        assert!(e < 1e-5, "two layers {two}, {frames}x{d_enc} -> {hidden}: rel err {e}");
    }
    // Too many positions for the buffers is an error, not an overrun.
    let p = Projector::random(8, 8, false, 1);
    let gp = GpuProjector::new(g.clone(), &p, 2).unwrap();
    let buf = g.upload_f32("enc", &vec![0.5; 8 * 16]).unwrap();
    assert!(gp.project(&buf, 16).is_err());
}

#[test]
fn projector_loads_from_safetensors_and_rejects_bad_shapes() {
    let dir = std::env::temp_dir().join(format!("verbatim-projector-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = Projector::random(6, 10, true, 3);
    let save = |path: &Path, tensors: Vec<(&str, Vec<usize>, &[f32])>| {
        let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(n, s, v)| (n.to_string(), s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
            .collect();
        let views: Vec<(String, safetensors::tensor::TensorView)> = data
            .iter()
            .map(|(n, s, b)| (n.clone(), safetensors::tensor::TensorView::new(Dtype::F32, s.clone(), b).unwrap()))
            .collect();
        safetensors::serialize_to_file(views, None, path).unwrap();
    };
    let good = dir.join("good.safetensors");
    let l2 = p.l2.as_ref().unwrap();
    save(
        &good,
        vec![
            ("projector.linear1.weight", vec![10, 24], &p.l1.w),
            ("projector.linear1.bias", vec![10], &p.l1.b),
            ("projector.linear2.weight", vec![10, 10], &l2.w),
            ("projector.linear2.bias", vec![10], &l2.b),
        ],
    );
    assert_eq!(Projector::load(&good).unwrap(), p);
    let bad = dir.join("bad.safetensors");
    save(&bad, vec![("projector.linear1.weight", vec![10, 22], &p.l1.w[..220]), ("projector.linear1.bias", vec![10], &p.l1.b)]);
    let e = Projector::load(&bad).unwrap_err().to_string();
    assert!(e.contains("multiple of 4"), "{e}");
    let missing = dir.join("missing.safetensors");
    save(&missing, vec![("projector.linear1.weight", vec![10, 24], &p.l1.w)]);
    assert!(Projector::load(&missing).unwrap_err().to_string().contains("bias"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// tiny.en's encoder on the JFK sample, the projector (random weights) to the fixture
/// decoder's width, 375 audio positions + 45 text tokens = 420 positions prefilled in
/// passes of 64 on the GPU; the same embeddings and tokens through the CPU reference frame.
#[test]
fn speech_prompt_of_420_positions_prefills_like_the_reference() {
    use crate::models::nemotron_h::checkpoint::Checkpoint as NhCheckpoint;
    use crate::models::nemotron_h::fixture::fixture_dir;
    use crate::models::nemotron_h::gpu::NemotronGpu;
    use crate::models::whisper::checkpoint::Checkpoint;
    use crate::models::whisper::gpu::GpuWhisper;

    let g = gpu();
    let ck = Checkpoint::open(&crate::models::whisper::default_model_dir()).expect("the default model (packaging/fetch-model.sh)");
    let mut whisper = GpuWhisper::load(g.clone(), &ck, 50256, 50363).unwrap();
    let audio = crate::audio::decode_wav_file(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../assets/jfk.wav")).unwrap();
    let samples = crate::audio::resample::to_16k(&audio.to_mono(), audio.sample_rate).unwrap();
    let mel = crate::audio::mel::log_mel_spectrogram(&samples, ck.dims.n_mels, 160);
    whisper.begin_window(&mel.window(0, mel.n_frames - 1)).unwrap();
    let (frames, d_enc) = whisper.encoder_shape();
    assert_eq!((frames, d_enc), (1500, 384));

    let lm_ck = NhCheckpoint::open(&fixture_dir()).unwrap();
    let lm = NemotronGpu::load(g.clone(), &lm_ck).unwrap();
    let hidden = lm.config().hidden_size;
    let p = Projector::random(d_enc, hidden, true, 11);
    let gp = GpuProjector::new(g.clone(), &p, frames / STACK).unwrap();
    let embeds = gp.project(whisper.encoder_buffer(), frames).unwrap();
    assert_eq!(embeds.len(), 375 * hidden);
    // The projector on the GPU against the reference on the same encoder output.
    let enc = whisper.encoder_output().unwrap();
    let want = p.apply_cpu(&enc, frames).unwrap();
    let e = rel_err(&embeds, &want);
    assert!(e < 1e-5, "projector rel err {e}");

    let vocab = lm.config().vocab_size as u32;
    let text: Vec<u32> = (0..45u32).map(|i| (i * 37 + 5) % vocab).collect();
    let mut ctx = lm.context(512).unwrap();
    let audio_logits = ctx.prefill_embeds(&embeds).unwrap();
    let text_logits = ctx.prefill_tokens(&text).unwrap();
    assert_eq!(ctx.position(), 420);

    let reference = crate::reference::nemotron_h::Model::load(&fixture_dir()).unwrap();
    let mut rctx = reference.context();
    let r_audio = rctx.prefill_embeds(&embeds).unwrap();
    let r_text = rctx.prefill(&text).unwrap();
    let v = vocab as usize;
    let last = |l: &[f32]| l[l.len() - v..].to_vec();
    let e_audio = rel_err(&last(&audio_logits), &last(&r_audio));
    let e_text = rel_err(&text_logits, &r_text);
    println!("420-position speech prompt: audio-end logits rel err {e_audio:.2e}, text logits rel err {e_text:.2e}");
    assert!(e_audio < 1e-4 && e_text < 1e-4, "audio {e_audio}, text {e_text}");
}
