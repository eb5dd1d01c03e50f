//! Qwen3 targets from GGUF files (`Qwen3Target::load_gguf`, files the tests write as llama.cpp
//! names and lays them out): float files are their checkpoint bit for bit; quantized maps made
//! by dspark's quantizer are in-place quantization bit for bit (the file's blocks are read as
//! they are); a Q4_K_M-like mix of Q4_K and Q6_K (candle's quantizer) keeps its blocks, stays
//! within its precision of f32 and keeps the target contract; greedy speculative decoding equals
//! target-only decoding on a Q8_0 file of the bundled pair; bad files are typed errors naming the
//! file and the tensor.
use std::path::{Path, PathBuf};

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::Value as G;
use dspark::LoadOptions;
use dspark::models::qwen3::Qwen3Target;
use dspark::nn::quant::Quant;
use dspark::speculator::contract::check_target;
use dspark::speculator::{Request, SpeculatorOptions, VerifyPolicy};

use crate::targets_common::gguf::{Kind, read_safetensors, write_gguf};
use crate::targets_common::{Tiny, all_logits, bundled_dir, speculative_and_target_only};

/// Every position's logits, as bits.
fn logits(t: &Qwen3Target, tokens: &[u32]) -> Vec<u32> {
    all_logits(t, tokens).iter().map(|x| x.to_bits()).collect()
}

fn keep() -> LoadOptions {
    LoadOptions::default()
}

/// A tiny model of whole K-quant super-blocks (widths of 256), its vocabulary unpadded (a GGUF
/// file's vocabulary is its embedding's rows).
fn tiny(tie: bool) -> Tiny {
    Tiny {
        vocab: 64,
        rows: 64,
        hidden: 256,
        inter: 512,
        heads: 4,
        kv: 2,
        hd: 64,
        tie,
        ..Tiny::default()
    }
}

/// Write `t` as a safetensors directory under `dir` and as GGUF `name` beside it.
fn both(t: &Tiny, dir: &Path, name: &str, kind: impl Fn(&str, &[usize]) -> Kind) -> PathBuf {
    t.write_with(dir, |_| {}, |_| {});
    let out = dir.join(name);
    write_gguf(&t.config(), &t.tensors(), &out, kind, &[]);
    out
}

#[test]
fn a_float_file_is_its_checkpoint_bit_for_bit() {
    let tokens = [1u32, 2, 3, 44, 10, 7];
    for (dtype, kind) in [("f32", Kind::F32), ("bf16", Kind::BF16)] {
        for tie in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let t = Tiny { dtype, ..tiny(tie) };
            let path = both(&t, dir.path(), "m.gguf", |_, _| kind);
            let st = Qwen3Target::load(dir.path(), &Device::Cpu).unwrap();
            let g = Qwen3Target::load_gguf(&path, &Device::Cpu, keep()).unwrap();
            assert_eq!(g.config().shape, st.config().shape, "{dtype} tie={tie}");
            assert_eq!(g.weight_dtype(), st.weight_dtype());
            assert_eq!(
                logits(&g, &tokens),
                logits(&st, &tokens),
                "{dtype} tie={tie}"
            );
            // `open` picks the loader by what the path is.
            let o = Qwen3Target::open(&path, &Device::Cpu, keep()).unwrap();
            assert_eq!(logits(&o, &tokens), logits(&st, &tokens));
        }
    }
}

#[test]
fn quantized_maps_from_a_file_are_in_place_quantization_bit_for_bit() {
    // The maps in dspark's blocks, the embedding and head in Q8_0 (in-place quantization's
    // format for them on the host path; the device-generic path keeps the stored ones), the
    // norms in f32: the file holds what in-place quantization makes.
    let host = dspark::device::fast_on(&Device::Cpu);
    let tokens = [5u32, 8, 30, 17, 12, 42, 3];
    for quant in [Quant::Q8_0, Quant::Q4K] {
        let dir = tempfile::tempdir().unwrap();
        let t = tiny(false);
        let path = both(&t, dir.path(), "q.gguf", |name, shape| {
            match (name, shape.len()) {
                (_, 1) => Kind::F32,
                ("model.embed_tokens.weight" | "lm_head.weight", _) if host => {
                    Kind::Ours(quant.head())
                }
                ("model.embed_tokens.weight" | "lm_head.weight", _) => Kind::F32,
                _ => Kind::Ours(quant),
            }
        });
        let options = LoadOptions::with_dtype_name(Some(quant.as_str())).unwrap();
        let inplace = Qwen3Target::load_with(dir.path(), &Device::Cpu, options).unwrap();
        let g = Qwen3Target::load_gguf(&path, &Device::Cpu, keep()).unwrap();
        assert_eq!((g.quant(), inplace.quant()), (Some(quant), Some(quant)));
        assert_eq!(g.weight_bytes_per_step(), inplace.weight_bytes_per_step());
        assert_eq!(logits(&g, &tokens), logits(&inplace, &tokens), "{quant:?}");
    }
}

#[test]
fn a_q4_k_m_mix_keeps_its_blocks_and_the_target_contract() {
    // llama-quantize's Q4_K_M: Q4_K maps, Q6_K value and down maps (here all of them) and a
    // Q6_K tied embedding (the head), by candle's quantizer.
    let dir = tempfile::tempdir().unwrap();
    let t = tiny(true);
    let path = both(&t, dir.path(), "m.gguf", |name, shape| {
        if shape.len() == 1 {
            Kind::F32
        } else if name.contains("v_proj") || name.contains("down_proj") || name.contains("embed") {
            Kind::Candle(GgmlDType::Q6K)
        } else {
            Kind::Candle(GgmlDType::Q4K)
        }
    });
    let g = Qwen3Target::load_gguf(&path, &Device::Cpu, keep()).unwrap();
    assert_eq!(g.quant(), Some(Quant::Q4K));
    let wide = Qwen3Target::load(dir.path(), &Device::Cpu).unwrap();
    let tokens = [1u32, 2, 3, 44, 10, 7];
    let f = |b: Vec<u32>| b.into_iter().map(f32::from_bits).collect::<Vec<_>>();
    let (want, got) = (f(logits(&wide, &tokens)), f(logits(&g, &tokens)));
    let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
    let d = want
        .iter()
        .zip(&got)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        d <= 0.15 * scale && d > 0.0,
        "logits differ by {d} (scale {scale})"
    );
    if dspark::device::fast_on(&Device::Cpu) {
        // The file's blocks, not a widened copy: 144 bytes per 256 weights for Q4_K and 210
        // for Q6_K, against 1024 in f32 (the head included, in Q6_K).
        let ratio = g.weight_bytes_per_step() as f64 / wide.weight_bytes_per_step() as f64;
        assert!((0.14..=0.21).contains(&ratio), "{ratio}");
        // The tied embedding is the head's blocks, once: looked up where they lie, and handed
        // so to a drafter.
        let w = g.shared_weights();
        let (embed, head) = (w.embed.unwrap(), w.head.unwrap());
        let rows = embed.as_packed().unwrap();
        assert!(std::sync::Arc::ptr_eq(rows, head.packed_weight().unwrap()));
        assert_eq!(rows.quant(), Some(Quant::Q6K));
    }
    check_target(&g, &[0, 1]).unwrap();
}

#[test]
fn greedy_speculative_equals_target_only_on_a_q8_0_file_of_the_bundled_pair() {
    let src = bundled_dir().join("target");
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("target-q8_0.gguf");
    let kind = |_: &str, shape: &[usize]| match shape.len() {
        2 => Kind::Candle(GgmlDType::Q8_0),
        _ => Kind::F32,
    };
    write_gguf(&config, &read_safetensors(&src), &path, kind, &[]);
    let target = Qwen3Target::load_gguf(&path, &Device::Cpu, keep()).unwrap();
    assert_eq!(target.quant(), Some(Quant::Q8_0));
    let options = SpeculatorOptions {
        verify: VerifyPolicy::Full,
        ..SpeculatorOptions::default()
    };
    let prompts: [&[u32]; 3] = [&[5, 88, 301, 17, 1200, 42], &[900, 14, 2, 77], &[3]];
    let requests: Vec<Request> = prompts
        .iter()
        .map(|p| Request::new(p.to_vec(), 32))
        .collect();
    let (spec, base) = speculative_and_target_only(target, options, &requests);
    assert_eq!(spec.tokens, base.tokens);
    let tau = spec.stats.acceptance_length();
    assert!(tau > 1.5, "acceptance length {tau}");
}

#[test]
fn bad_files_are_typed_errors_naming_the_file_and_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let t = tiny(false);
    let f32s = |_: &str, _: &[usize]| Kind::F32;

    // Another architecture.
    let llama = dir.path().join("llama.gguf");
    let arch = [("general.architecture", G::String("llama".into()))];
    write_gguf(&t.config(), &t.tensors(), &llama, f32s, &arch);
    let e = Qwen3Target::load_gguf(&llama, &Device::Cpu, keep()).unwrap_err();
    assert_eq!(e.code(), "bad-gguf");
    assert!(
        e.to_string().contains("llama") && e.to_string().contains("llama.gguf"),
        "{e}"
    );

    // A missing map and a misshapen one, both named as the file names them.
    let mut tensors = t.tensors();
    tensors.remove("model.layers.1.mlp.up_proj.weight");
    let (_, shape) = tensors
        .get_mut("model.layers.0.self_attn.k_proj.weight")
        .unwrap();
    shape.reverse();
    let broken = dir.path().join("broken.gguf");
    write_gguf(&t.config(), &tensors, &broken, f32s, &[]);
    let e = Qwen3Target::load_gguf(&broken, &Device::Cpu, keep()).unwrap_err();
    let codes: Vec<(&str, Option<&str>)> = e
        .problems()
        .iter()
        .map(|p| (p.code(), p.argument()))
        .collect();
    assert!(
        codes.contains(&("missing-tensor", Some("blk.1.ffn_up.weight"))),
        "{e}"
    );
    assert!(
        codes.contains(&("shape-mismatch", Some("blk.0.attn_k.weight"))),
        "{e}"
    );

    // A truncated file.
    let good = both(&t, dir.path(), "good.gguf", f32s);
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let e = Qwen3Target::load_gguf(&cut, &Device::Cpu, keep()).unwrap_err();
    assert!(e.problems().iter().all(|p| p.code() == "bad-gguf"), "{e}");
    assert!(e.problems().iter().all(|p| p.argument().is_some()), "{e}");
    assert!(e.to_string().contains("cut.gguf"), "{e}");

    // An unsupported type, named with its tensor.
    let q5 = dir.path().join("q5.gguf");
    write_gguf(
        &t.config(),
        &t.tensors(),
        &q5,
        |name, shape| match (name, shape.len()) {
            ("model.layers.2.mlp.gate_proj.weight", _) => Kind::Candle(GgmlDType::Q5K),
            _ => Kind::F32,
        },
        &[],
    );
    let e = Qwen3Target::load_gguf(&q5, &Device::Cpu, keep()).unwrap_err();
    assert_eq!(
        (e.code(), e.argument()),
        ("bad-gguf", Some("blk.2.ffn_gate.weight")),
        "{e}"
    );
    assert!(e.to_string().contains("Q5_K"), "{e}");
}
