//! The weight dtype at load ([`LoadOptions`]): a bf16 / f16 checkpoint keeps 2-byte matrices,
//! `dtype` chooses another, widening is exact (a bf16 checkpoint loaded as f32 gives the same
//! bits), rounding to bf16 / f16 stays within its precision of the f32 model, and greedy
//! speculative decoding equals target-only greedy decoding in every dtype. All of it holds
//! on both kernel paths: under `DSPARK_KERNEL_PATH=tensor` (what a GPU runs) 2-byte weights
//! stay 2 bytes too.

use crate::targets_common::{Tiny, bundled_dir, chunked_logits, speculative_and_target_only};
use candle_core::{DType, Device};
use dspark::models::qwen3::Qwen3Target;
use dspark::speculator::{LogitRows, Request, SpeculatorOptions};
use dspark::{LoadOptions, WeightDtype};

fn options(dtype: WeightDtype) -> LoadOptions {
    LoadOptions {
        dtype: Some(dtype),
        ..LoadOptions::default()
    }
}

/// The last-position logits of `tokens` from an empty cache, and of one more cached step.
fn logits(t: &Qwen3Target, tokens: &[u32]) -> Vec<f32> {
    chunked_logits(
        t,
        &[(tokens, LogitRows::All), (&tokens[..1], LogitRows::Last)],
    )
}

fn max_abs(a: &[f32]) -> f32 {
    a.iter().fold(0f32, |m, v| m.max(v.abs()))
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()))
}

#[test]
fn a_bf16_checkpoint_stays_two_bytes_and_multiplies_bf16_activations() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny {
        dtype: "bf16",
        hidden: 32,
        inter: 40,
        ..Tiny::default()
    };
    tiny.write_with(dir.path(), |_| {}, |_| {});
    let own = Qwen3Target::load(dir.path(), &Device::Cpu).unwrap();
    let wide = Qwen3Target::load_with(dir.path(), &Device::Cpu, options(WeightDtype::F32)).unwrap();
    assert_eq!(wide.weight_dtype(), WeightDtype::F32);
    // Kept in its dtype on both kernel paths (the device-generic one too: a GPU reads 2 bytes
    // a weight).
    assert_eq!(own.weight_dtype(), WeightDtype::BF16);
    assert_eq!(
        own.weight_bytes_per_step() * 2,
        wide.weight_bytes_per_step()
    );
    // The embedding and head handed to a drafter are the kept ones, not f32 copies.
    assert_eq!(own.shared_weights().embed.unwrap().dtype(), DType::BF16);
    // A bf16 weight multiplies the activations rounded to bf16 (the `vdpbf16ps` rule of
    // `nn::packed` on the host, a bf16 product accumulated in f32 on the device path), as a
    // torch bf16 model does: within bf16 precision of the widened model, not its bits.
    let tokens = [3u32, 17, 9, 41, 2, 30, 5];
    let a = logits(&own, &tokens);
    let b = logits(&wide, &tokens);
    let (d, scale) = (max_diff(&a, &b), max_abs(&b).max(1.0));
    assert!(d > 0.0 && d <= 0.06 * scale, "{d} (scale {scale})");
}

#[test]
fn narrow_dtypes_stay_within_their_precision_of_f32() {
    let dir = tempfile::tempdir().unwrap();
    let tiny = Tiny {
        hidden: 48,
        inter: 64,
        ..Tiny::default()
    };
    tiny.write_with(dir.path(), |_| {}, |_| {});
    let f32_model = Qwen3Target::load(dir.path(), &Device::Cpu).unwrap();
    assert_eq!(f32_model.weight_dtype(), WeightDtype::F32);
    let tokens = [1u32, 2, 3, 44, 10, 7];
    let want = logits(&f32_model, &tokens);
    let scale = max_abs(&want).max(1.0);
    // Relative precision of one rounding: 2^-8 (bf16), 2^-11 (f16); errors add up over
    // the layers, so allow a few times that.
    for (dtype, tol) in [(WeightDtype::BF16, 0.06), (WeightDtype::F16, 0.01)] {
        let t = Qwen3Target::load_with(dir.path(), &Device::Cpu, options(dtype)).unwrap();
        assert_eq!(t.weight_dtype(), dtype);
        assert!(t.weight_bytes_per_step() * 2 <= f32_model.weight_bytes_per_step() + 64);
        let got = logits(&t, &tokens);
        let d = max_diff(&got, &want);
        assert!(
            d <= tol * scale,
            "{dtype}: logits differ by {d} (scale {scale})"
        );
        assert!(d > 0.0, "{dtype}: rounding should move the logits");
    }
}

#[test]
fn bad_dtype_names_are_typed_errors() {
    for bad in ["int8", "float64", "", "bf-16"] {
        let e = LoadOptions::with_dtype_name(Some(bad)).unwrap_err();
        assert_eq!(e.code(), "invalid-argument", "{bad}");
        assert!(e.to_string().contains("dtype"), "{e}");
    }
    for (name, d) in [
        ("bf16", WeightDtype::BF16),
        ("torch.float16", WeightDtype::F16),
        ("FLOAT32", WeightDtype::F32),
    ] {
        assert_eq!(
            LoadOptions::with_dtype_name(Some(name)).unwrap().dtype,
            Some(d)
        );
    }
}

#[test]
fn greedy_speculative_equals_target_only_in_every_dtype() {
    let prompts: [&[u32]; 2] = [&[5, 88, 301, 17, 1200, 42], &[900, 14, 2, 77]];
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request::new(p.to_vec(), 24))
        .collect();
    for dtype in WeightDtype::ALL {
        let target =
            Qwen3Target::load_with(&bundled_dir().join("target"), &Device::Cpu, options(dtype))
                .unwrap();
        let (spec, base) =
            speculative_and_target_only(target, SpeculatorOptions::default(), &requests);
        assert_eq!(spec.tokens, base.tokens, "{dtype}");
        assert!(spec.tokens.iter().all(|t| t.len() == 24), "{dtype}");
    }
}
