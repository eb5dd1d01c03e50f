//! [`Qwen3Target::load_gguf`]: a Qwen3 model from a GGUF file as llama.cpp's converter and
//! `llama-quantize` write it (any mix of F32, F16, BF16, Q8_0, Q4_K and Q6_K tensors: a Q4_K_M
//! file's Q4_K layers with Q6_K value, down and output maps included).
//!
//! The config comes from the file's `qwen3.*` metadata, normalized by the same parser as a
//! `config.json` ([`Qwen3Config::from_value`]); the tensors are GGUF's names for a
//! `Qwen3ForCausalLM` checkpoint's ([`gguf_name`]), checked for presence and shape (every
//! problem at once, by the file's names) before any is read. Quantized maps keep the file's
//! blocks ([`crate::nn::gguf`]), so a decode step reads the file's bytes; float maps follow the
//! [`LoadOptions`] as a safetensors checkpoint's do (and are quantized when they ask). A
//! quantized embedding and output head keep the stored blocks, once (a tied head's are the
//! embedding's): rows are looked up where they lie, with their exact values.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use candle_core::{Device, Tensor};
use serde_json::{Map, Value, json};

use super::model::{WHY, expected};
use super::{Qwen3Config, Qwen3Target};
use crate::checkpoint::shapes::{EMBED, LM_HEAD};
use crate::device::fast_on;
use crate::error::{Error, Result};
use crate::nn::decoder::Take;
use crate::nn::gguf::{GgufFile, GgufTensor, bad_gguf};
use crate::nn::{Linear, LoadOptions, Rope, VocabWeight};

/// GGUF's name for a `Qwen3ForCausalLM` tensor name (`None` for a name Qwen3 does not have).
pub fn gguf_name(hf: &str) -> Option<String> {
    match hf {
        EMBED => return Some("token_embd.weight".into()),
        LM_HEAD => return Some("output.weight".into()),
        "model.norm.weight" => return Some("output_norm.weight".into()),
        _ => {}
    }
    let (layer, field) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let (map, kind) = field.rsplit_once('.')?;
    let map = match map {
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        _ => return None,
    };
    Some(format!("blk.{layer}.{map}.{kind}"))
}

/// The `config.json` a GGUF file's metadata stands for. Errors: `bad-gguf` for another
/// architecture, a missing or mistyped key.
pub fn gguf_config_json(f: &GgufFile) -> Result<Value> {
    let arch = f.string("general.architecture")?.unwrap_or("<none>");
    if arch != "qwen3" {
        return Err(bad_gguf(
            f.path(),
            None,
            format!("architecture `{arch}`: dspark's native target runs Qwen3 (`qwen3`) models"),
        ));
    }
    let need = |key: &str| -> Result<u64> {
        f.uint(&format!("qwen3.{key}"))?
            .ok_or_else(|| bad_gguf(f.path(), None, format!("metadata `qwen3.{key}` is missing")))
    };
    let hidden = need("embedding_length")?;
    let heads = need("attention.head_count")?;
    // The vocabulary is the embedding's rows (the tokenizer's list may be shorter).
    let vocab = match f.shape("token_embd.weight") {
        Some(&[rows, _]) => rows as u64,
        _ => f
            .strings("tokenizer.ggml.tokens")?
            .map_or(0, |t| t.len() as u64),
    };
    let mut c = Map::new();
    c.insert("model_type".into(), json!("qwen3"));
    c.insert("architectures".into(), json!(["Qwen3ForCausalLM"]));
    c.insert("vocab_size".into(), json!(vocab));
    c.insert("hidden_size".into(), json!(hidden));
    c.insert("num_hidden_layers".into(), json!(need("block_count")?));
    c.insert(
        "intermediate_size".into(),
        json!(need("feed_forward_length")?),
    );
    c.insert("num_attention_heads".into(), json!(heads));
    let kv = f.uint("qwen3.attention.head_count_kv")?.unwrap_or(heads);
    c.insert("num_key_value_heads".into(), json!(kv));
    let head_dim = f
        .uint("qwen3.attention.key_length")?
        .unwrap_or(hidden / heads.max(1));
    c.insert("head_dim".into(), json!(head_dim));
    let optional = [
        ("rms_norm_eps", "qwen3.attention.layer_norm_rms_epsilon"),
        ("rope_theta", "qwen3.rope.freq_base"),
    ];
    for (name, key) in optional {
        if let Some(v) = f.float(key)? {
            c.insert(name.into(), json!(v));
        }
    }
    if let Some(n) = f.uint("qwen3.context_length")? {
        c.insert("max_position_embeddings".into(), json!(n));
    }
    let scaling = f.string("qwen3.rope.scaling.type")?;
    if let Some(kind) = scaling.filter(|k| *k != "none") {
        let mut s = Map::new();
        s.insert("rope_type".into(), json!(kind));
        if let Some(v) = f.float("qwen3.rope.scaling.factor")? {
            s.insert("factor".into(), json!(v));
        }
        if let Some(n) = f.uint("qwen3.rope.scaling.original_context_length")? {
            s.insert("original_max_position_embeddings".into(), json!(n));
        }
        c.insert("rope_scaling".into(), Value::Object(s));
    }
    c.insert("tie_word_embeddings".into(), json!(!f.has("output.weight")));
    c.insert("attention_bias".into(), json!(f.has("blk.0.attn_q.bias")));
    for (name, key) in [
        ("bos_token_id", "tokenizer.ggml.bos_token_id"),
        ("eos_token_id", "tokenizer.ggml.eos_token_id"),
    ] {
        if let Some(id) = f.uint(key)? {
            c.insert(name.into(), json!(id));
        }
    }
    Ok(Value::Object(c))
}

impl Qwen3Target {
    /// Load a Qwen3 GGUF file (see the module docs) onto `device`. `options.dtype` applies to
    /// the file's float matrices; `options.quant` quantizes them (quantized ones stay as
    /// stored). Errors: `missing-file`, `bad-gguf` (not GGUF, truncated, another architecture,
    /// an unsupported tensor type: naming the file and the tensor), `bad-config`,
    /// `missing-tensor` / `shape-mismatch` (by the file's names, all at once).
    pub fn load_gguf(path: &Path, device: &Device, options: LoadOptions) -> Result<Self> {
        let file = GgufFile::open(path)?;
        let source = path.display().to_string();
        let config = Qwen3Config::from_value(&gguf_config_json(&file)?, &source)?;
        let rope = Rope::new(&config.shape.rope, config.shape.head_dim, &config.source)?;
        let wants = expected(&config);
        let mut problems = Vec::new();
        let mut names = Vec::with_capacity(wants.len());
        for w in &wants {
            let Some(name) = gguf_name(&w.name) else {
                return Err(Error::Internal {
                    message: format!("no GGUF name for `{}`", w.name),
                });
            };
            match file.shape(&name) {
                None => problems.push(Error::MissingTensor {
                    tensor: name.clone(),
                    reason: format!("{WHY} (in {source})"),
                }),
                Some(shape) if !w.fits(shape) => problems.push(Error::ShapeMismatch {
                    tensor: name.clone(),
                    expected: w.shape.clone(),
                    found: shape.to_vec(),
                }),
                Some(_) => {}
            }
            names.push(name);
        }
        Error::collect(problems)?;

        let mut tensors = BTreeMap::new();
        let mut packed = BTreeMap::new();
        let mut vocab = BTreeMap::new();
        let mut head = None;
        for (w, name) in wants.iter().zip(&names) {
            let is_head =
                w.name == LM_HEAD || (w.name == EMBED && config.shape.tie_word_embeddings);
            let read = file.read(name, device, &options)?;
            match read {
                GgufTensor::Float(t) => {
                    tensors.insert(w.name.clone(), t);
                }
                GgufTensor::Quantized(q) if w.name == EMBED || w.name == LM_HEAD => {
                    if fast_on(device) {
                        // Kept as the file's blocks, once: looked up where they lie (and
                        // shared so with a drafter), and the head multiplies by them.
                        let q = Arc::new(q);
                        if is_head && q.rows() == config.shape.vocab_size {
                            head = Some(Linear::from_shared(q.clone()));
                        }
                        vocab.insert(w.name.clone(), VocabWeight::packed(q));
                    } else {
                        // The device-generic path computes with the blocks' exact values.
                        let values = Tensor::from_vec(q.unpack(), (q.rows(), q.cols()), device)?;
                        tensors.insert(w.name.clone(), values);
                    }
                }
                GgufTensor::Quantized(q) => {
                    packed.insert(w.name.clone(), q);
                }
            }
        }
        let quant = file.quant("blk.0.attn_q.weight").or(options.quant);
        let t = Take::new(tensors)
            .quantized(options.quant)
            .with_packed(packed, device);
        Self::assemble(config, rope, (t, vocab), head, quant, (device, options))
    }

    /// [`Self::load_gguf`] for a file, [`Self::load_with`] for a checkpoint directory.
    pub fn open(path: &Path, device: &Device, options: LoadOptions) -> Result<Self> {
        if path.is_file() {
            Self::load_gguf(path, device, options)
        } else {
            Self::load_with(path, device, options)
        }
    }
}
