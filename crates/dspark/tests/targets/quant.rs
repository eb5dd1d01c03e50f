//! Quantized targets (`dtype="q8_0"`, `"q4_k"`): the layers' linear maps in 8-bit blocks or 4-bit
//! super-blocks and the output head in 8-bit blocks, read as such (about a quarter, or an eighth,
//! of their f32 bytes), logits within the format's precision of the f32 model, the target
//! contract, and greedy speculative decoding equal to target-only greedy decoding token for token:
//! every row of a verification quantizes its own activations, so its logits are the bits of a
//! one-row decode step. On the device-generic path (`DSPARK_KERNEL_PATH=tensor`) the maps hold the
//! blocks' values as f32 tensors, and the same holds.

use crate::targets_common::{Tiny, all_logits as logits, bundled_dir, speculative_and_target_only};
use candle_core::Device;
use dspark::models::qwen3::Qwen3Target;
use dspark::nn::quant::Quant;
use dspark::speculator::contract::check_target;
use dspark::speculator::{Request, Speculator, SpeculatorOptions, VerifyPolicy};
use dspark::{LoadOptions, Qwen3Drafter};

fn q8() -> LoadOptions {
    quantized(Quant::Q8_0)
}

fn quantized(quant: Quant) -> LoadOptions {
    LoadOptions::with_dtype_name(Some(quant.as_str())).unwrap()
}

/// A tiny model of whole Q4_K super-blocks (widths of 256), as real models have.
fn k_quant_tiny() -> Tiny {
    Tiny {
        hidden: 256,
        inter: 512,
        heads: 4,
        hd: 64,
        ..Tiny::default()
    }
}

#[test]
fn quantized_layers_read_their_format_s_bytes_and_stay_close_to_f32() {
    let dir = tempfile::tempdir().unwrap();
    // Widths of whole Q4_K super-blocks (256), as real models have.
    k_quant_tiny().write_with(dir.path(), |_| {}, |_| {});
    let wide = Qwen3Target::load(dir.path(), &Device::Cpu).unwrap();
    let tokens = [1u32, 2, 3, 44, 10, 7];
    let want = logits(&wide, &tokens);
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    // (format, logit tolerance: two 8-bit roundings per product, or a 4-bit and an 8-bit one,
    // over a few layers; bytes read against f32: 34 per 32 weights, or 144 per 256 for the
    // layers and 34 per 32 for the head, against 128 and 1024, each with its padding).
    for (quant, tol, bytes) in [
        (Quant::Q8_0, 0.08, 0.24..=0.3),
        (Quant::Q4K, 0.15, 0.13..=0.2),
    ] {
        let q = Qwen3Target::load_with(dir.path(), &Device::Cpu, quantized(quant)).unwrap();
        assert_eq!((wide.quant(), q.quant()), (None, Some(quant)));
        let got = logits(&q, &tokens);
        let d = want
            .iter()
            .zip(&got)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(
            d <= tol * scale,
            "{quant:?}: logits differ by {d} (scale {scale})"
        );
        assert!(d > 0.0, "quantization should move the logits");
        if dspark::device::fast_on(&Device::Cpu) {
            let ratio = q.weight_bytes_per_step() as f64 / wide.weight_bytes_per_step() as f64;
            assert!(bytes.contains(&ratio), "{quant:?}: {ratio}");
        }
        check_target(&q, &[0, 1]).unwrap();
    }
}

#[test]
fn the_embedding_is_quantized_too_and_held_once_with_a_tied_head() {
    if !dspark::device::fast_on(&Device::Cpu) {
        return; // The device-generic path keeps the stored embedding and head.
    }
    // (tied, stored rows): a padded tied embedding keeps its own blocks beside the head's.
    for (tie, rows) in [(false, 50), (true, 50), (true, 56)] {
        let dir = tempfile::tempdir().unwrap();
        let tiny = Tiny {
            tie,
            vocab: 50,
            rows,
            ..k_quant_tiny()
        };
        tiny.write_with(dir.path(), |_| {}, |_| {});
        let q = Qwen3Target::load_with(dir.path(), &Device::Cpu, q8()).unwrap();
        let w = q.shared_weights();
        let (embed, head) = (w.embed.unwrap(), w.head.unwrap());
        let packed = embed.as_packed().expect("a quantized embedding");
        assert_eq!((packed.quant(), packed.rows()), (Some(Quant::Q8_0), rows));
        let shared = std::sync::Arc::ptr_eq(packed, head.packed_weight().unwrap());
        assert_eq!(shared, tie && rows == 50, "tie={tie} rows={rows}");
    }
}

#[test]
fn greedy_speculative_equals_target_only_on_quantized_targets() {
    for quant in [Quant::Q8_0, Quant::Q4K] {
        greedy_speculative_equals_target_only(quant);
    }
}

fn greedy_speculative_equals_target_only(quant: Quant) {
    // Prompts of 1 to 1,000 tokens (the long one: a deterministic walk over the vocabulary).
    let long: Vec<u32> = (0..1000u32).map(|i| (i * 7919 + 13) % 2999 + 1).collect();
    let prompts: [&[u32]; 4] = [&[5, 88, 301, 17, 1200, 42], &[900, 14, 2, 77], &[3], &long];
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request::new(p.to_vec(), 32))
        .collect();
    let target = Qwen3Target::load_with(
        &bundled_dir().join("target"),
        &Device::Cpu,
        quantized(quant),
    )
    .unwrap();
    // Every round drafts and verifies its whole block (the default policy may choose plain
    // rounds on a target this small): the verification's rows are what is under test.
    let options = SpeculatorOptions {
        verify: VerifyPolicy::Full,
        ..SpeculatorOptions::default()
    };
    let (spec, base) = speculative_and_target_only(target, options, &requests);
    assert_eq!(spec.tokens, base.tokens, "{quant:?}");
    assert!(spec.tokens.iter().all(|t| t.len() == 32));
    // The drafter still drafts for its quantized target: drafts are accepted.
    let tau = spec.stats.acceptance_length();
    assert!(tau > 1.5, "{quant:?}: acceptance length {tau}");
}

/// The bundled drafter without its own output head, in a temporary directory: a DSpark
/// checkpoint that borrows its target's (the bundled target has the drafter's width; the
/// drafter keeps its embedding, whose rows past the target's hold its mask token).
fn borrowing_drafter() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let src = bundled_dir().join("drafter");
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    let path = src.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(path, &Device::Cpu).unwrap();
    tensors.remove("lm_head.weight").unwrap();
    candle_core::safetensors::save(&tensors, dir.path().join("model.safetensors")).unwrap();
    dir
}

#[test]
fn a_drafter_without_a_head_borrows_the_quantized_target_s() {
    let dir = borrowing_drafter();
    let prompts: [&[u32]; 2] = [&[5, 88, 301, 17, 1200, 42], &[900, 14, 2, 77]];
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request::new(p.to_vec(), 24))
        .collect();
    for quant in [Quant::Q8_0, Quant::Q4K] {
        let target = Qwen3Target::load_with(
            &bundled_dir().join("target"),
            &Device::Cpu,
            quantized(quant),
        )
        .unwrap();
        let shared = target.shared_weights();
        let load = |options: LoadOptions| {
            Qwen3Drafter::builder(&target.target_spec())
                .shared(shared.clone())
                .options(options)
                .load(dir.path())
                .unwrap()
        };
        // The target's quantized head, not a packed copy of its own (where the host kernels
        // run); a drafter asked for f32 weights packs its own.
        if dspark::device::fast_on(&Device::Cpu) {
            let head = load(LoadOptions::default()).head().and_then(|h| h.quant());
            assert_eq!(head, Some(quant.head()), "{quant:?}");
        }
        let f32s = LoadOptions::with_dtype_name(Some("float32")).unwrap();
        assert_eq!(load(f32s).head().and_then(|h| h.quant()), None);
        // Its padded draft vocabulary's rows past the target's are never drafted, and greedy
        // speculative decoding is still target-only decoding.
        let drafter = load(LoadOptions::default());
        let options = SpeculatorOptions {
            verify: VerifyPolicy::Full,
            ..SpeculatorOptions::default()
        };
        let s = Speculator::new(target, drafter, options).unwrap();
        let spec = s.generate(&requests, None).unwrap();
        let base = s.generate_target_only(&requests, None).unwrap();
        assert_eq!(spec.tokens, base.tokens, "{quant:?}");
    }
}

#[test]
fn a_drafter_refuses_quantized_layers() {
    let target = Qwen3Target::load(&bundled_dir().join("target"), &Device::Cpu).unwrap();
    let e = Qwen3Drafter::builder(&target.target_spec())
        .shared(target.shared_weights())
        .options(q8())
        .load(&bundled_dir().join("drafter"))
        .unwrap_err();
    assert_eq!(e.code(), "invalid-argument");
    assert!(e.to_string().contains("q8_0"), "{e}");
}
