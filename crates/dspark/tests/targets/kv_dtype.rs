//! The KV cache's element type ([`LoadOptions::kv_dtype`]): f16 and bf16 caches stay within
//! their precision of an f32 cache at a long context, greedy speculative decoding equals
//! target-only decoding with the same cache dtype, and a bad name is a typed error that lists
//! the choices. Both kernel paths (the device-generic one rounds into f32 tensors).

use crate::targets_common::{bundled_dir, chunked_logits, speculative_and_target_only};
use candle_core::Device;
use dspark::models::qwen3::Qwen3Target;
use dspark::nn::DEFAULT_KV_DTYPE;
use dspark::speculator::{LogitRows, Request, SpeculatorOptions};
use dspark::{LoadOptions, WeightDtype};

fn bundled(kv: Option<WeightDtype>) -> Qwen3Target {
    let dir = bundled_dir();
    let options = LoadOptions {
        kv_dtype: kv,
        ..LoadOptions::default()
    };
    Qwen3Target::load_with(&dir.join("target"), &Device::Cpu, options).unwrap()
}

/// A prompt of `n` ids below 3000 (a fixed, irregular sequence).
fn prompt(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 7) % 2900 + 50)
        .collect()
}

/// Last-position logits after a prefill of `tokens` in two chunks (the second one reads the
/// first from the cache), then after one more cached step.
fn logits(t: &Qwen3Target, tokens: &[u32]) -> Vec<f32> {
    let half = tokens.len() / 2;
    let chunks = [
        (&tokens[..half], LogitRows::Last),
        (&tokens[half..], LogitRows::Last),
        (&tokens[..1], LogitRows::Last),
    ];
    chunked_logits(t, &chunks)
}

#[test]
fn half_caches_stay_within_their_precision_of_f32() {
    let f32_cache = bundled(Some(WeightDtype::F32));
    assert_eq!(bundled(None).kv_dtype(), DEFAULT_KV_DTYPE);
    let tokens = prompt(300, 1);
    let want = logits(&f32_cache, &tokens);
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    // One rounding of every key and value: 2^-11 (f16), 2^-8 (bf16, whose kernel also rounds
    // the queries and the probabilities); errors add up over the layers.
    for (kv, tol) in [(WeightDtype::F16, 0.01), (WeightDtype::BF16, 0.08)] {
        let t = bundled(Some(kv));
        assert_eq!(t.kv_dtype(), kv);
        let got = logits(&t, &tokens);
        let d = got
            .iter()
            .zip(&want)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(d > 0.0, "{kv}: rounding the cache should move the logits");
        assert!(
            d <= tol * scale,
            "{kv}: logits differ by {d} (scale {scale})"
        );
    }
}

#[test]
fn greedy_speculative_equals_target_only_with_each_cache_dtype() {
    let requests = vec![
        Request::new(prompt(40, 2), 24),
        Request::new(prompt(290, 3), 24),
    ];
    for kv in WeightDtype::ALL {
        let target = bundled(Some(kv));
        let (spec, base) =
            speculative_and_target_only(target, SpeculatorOptions::default(), &requests);
        assert_eq!(spec.tokens, base.tokens, "{kv}");
        assert!(spec.tokens.iter().all(|t| t.len() == 24), "{kv}");
    }
}

#[test]
fn bad_kv_dtype_names_are_typed_errors_that_list_the_choices() {
    for bad in ["int8", "q8_0", "", "float64"] {
        let e = LoadOptions::default()
            .with_kv_dtype_name(Some(bad))
            .unwrap_err();
        assert_eq!(e.code(), "invalid-argument", "{bad}");
        let text = e.to_string();
        assert!(
            text.contains("kv_dtype") && text.contains("float16") && text.contains("bfloat16"),
            "{text}"
        );
    }
    let q8 = LoadOptions::with_dtype_name(Some("q8_0")).unwrap();
    let both = q8.with_kv_dtype_name(Some("f16")).unwrap();
    assert_eq!(
        (both.quant, both.kv_dtype),
        (q8.quant, Some(WeightDtype::F16))
    );
    assert_eq!(both.with_kv_dtype_name(None).unwrap().kv_dtype, None);
}
