//! GGUF files of tiny checkpoints, as llama.cpp's converter names and lays them out (candle's
//! writer): every tensor in the type a test picks, quantized by dspark's own quantizer (to
//! compare with in-place quantization bit for bit) or by candle's (GGUF's reference one).

use std::borrow::Cow;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value as G};
use candle_core::quantized::{GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Tensor};
use dspark::models::qwen3::gguf_name;
use dspark::nn::packed::PackedWeight;
use dspark::nn::quant::Quant;
use dspark::view::Floats;
use serde_json::Value;

use super::Tensors;

/// How a test stores one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// As f32.
    F32,
    /// As bf16 (rounded to nearest even).
    BF16,
    /// In blocks by dspark's quantizer.
    Ours(Quant),
    /// In blocks by candle's quantizer.
    Candle(GgmlDType),
}

fn ggml(quant: Quant) -> GgmlDType {
    match quant {
        Quant::Q8_0 => GgmlDType::Q8_0,
        Quant::Q4K => GgmlDType::Q4K,
        Quant::Q6K => GgmlDType::Q6K,
    }
}

fn qtensor(values: &[f32], shape: &[usize], kind: Kind) -> QTensor {
    let x = Tensor::from_vec(values.to_vec(), shape, &Device::Cpu).unwrap();
    match kind {
        Kind::F32 => QTensor::quantize(&x, GgmlDType::F32).unwrap(),
        Kind::BF16 => {
            QTensor::quantize(&x.to_dtype(DType::BF16).unwrap(), GgmlDType::BF16).unwrap()
        }
        Kind::Candle(t) => QTensor::quantize(&x, t).unwrap(),
        Kind::Ours(q) => {
            let &[rows, cols] = shape else {
                panic!("only matrices are quantized")
            };
            let w = PackedWeight::quantize(Floats::F32(values), rows, cols, q).unwrap();
            let bytes = w.to_gguf().unwrap();
            let storage = QStorage::from_data(Cow::Owned(bytes), &Device::Cpu, ggml(q)).unwrap();
            QTensor::new(storage, shape).unwrap()
        }
    }
}

/// GGUF's `qwen3.*` metadata for a `config.json` value.
fn metadata(config: &Value) -> Vec<(String, G)> {
    let u = |k: &str| config[k].as_u64().map(|v| G::U32(v as u32));
    let rope = config["rope_parameters"]["rope_theta"]
        .as_f64()
        .or_else(|| config["rope_theta"].as_f64())
        .unwrap_or(10000.0);
    let mut out = vec![
        (
            "general.architecture".to_string(),
            G::String("qwen3".into()),
        ),
        ("qwen3.rope.freq_base".into(), G::F32(rope as f32)),
        (
            "qwen3.attention.layer_norm_rms_epsilon".into(),
            G::F32(config["rms_norm_eps"].as_f64().unwrap_or(1e-6) as f32),
        ),
    ];
    for (key, name) in [
        ("qwen3.block_count", "num_hidden_layers"),
        ("qwen3.embedding_length", "hidden_size"),
        ("qwen3.feed_forward_length", "intermediate_size"),
        ("qwen3.attention.head_count", "num_attention_heads"),
        ("qwen3.attention.head_count_kv", "num_key_value_heads"),
        ("qwen3.attention.key_length", "head_dim"),
        ("qwen3.attention.value_length", "head_dim"),
        ("qwen3.context_length", "max_position_embeddings"),
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.eos_token_id", "eos_token_id"),
    ] {
        if let Some(v) = u(name) {
            out.push((key.to_string(), v));
        }
    }
    out
}

/// Write `tensors` (a `Qwen3ForCausalLM` checkpoint's, by its names) with `config`'s metadata
/// as a GGUF file at `out`, each tensor as `kind(name, shape)` says (`extra` metadata added).
pub fn write_gguf(
    config: &Value,
    tensors: &Tensors,
    out: &Path,
    kind: impl Fn(&str, &[usize]) -> Kind,
    extra: &[(&str, G)],
) {
    let q: Vec<(String, QTensor)> = tensors
        .iter()
        .filter(|(name, _)| {
            // A tied checkpoint's stored head is not a GGUF tensor.
            !(name.as_str() == "lm_head.weight" && config["tie_word_embeddings"] == true)
        })
        .map(|(name, (v, shape))| {
            let g = gguf_name(name).unwrap_or_else(|| panic!("no GGUF name for {name}"));
            (g, qtensor(v, shape, kind(name, shape)))
        })
        .collect();
    let mut meta = metadata(config);
    meta.extend(extra.iter().map(|(k, v)| (k.to_string(), v.clone())));
    let meta_refs: Vec<(&str, &G)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let refs: Vec<(&str, &QTensor)> = q.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut file = std::fs::File::create(out).unwrap();
    gguf_file::write(&mut file, &meta_refs, &refs).unwrap();
}

/// A checkpoint directory's `model.safetensors` as f32 values.
pub fn read_safetensors(dir: &Path) -> Tensors {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let values: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => view
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                safetensors::Dtype::BF16 => view
                    .data()
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => panic!("{name}: {other:?}"),
            };
            (name, (values, view.shape().to_vec()))
        })
        .collect()
}
