//! Shared helpers for the native target tests: tiny random `Qwen3ForCausalLM` checkpoints
//! (f32 or bf16, one file or two shards) written to a temporary directory.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::Device;
use dspark::models::qwen3::Qwen3Target;
use dspark::speculator::LogitRows;
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value, json};

use crate::drafter_common::Rng;

pub mod gguf;

/// A tiny random Qwen3ForCausalLM.
#[derive(Debug, Clone)]
pub struct Tiny {
    pub vocab: usize,
    /// Embedding (and lm_head) rows, `>= vocab` (padded).
    pub rows: usize,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv: usize,
    pub hd: usize,
    pub inter: usize,
    pub tie: bool,
    pub bias: bool,
    /// `"f32"` or `"bf16"` on disk.
    pub dtype: &'static str,
    /// Write two shards and an index instead of one file.
    pub sharded: bool,
    pub seed: u64,
}

impl Default for Tiny {
    fn default() -> Self {
        Self {
            vocab: 50,
            rows: 56,
            hidden: 16,
            layers: 3,
            heads: 4,
            kv: 2,
            hd: 8,
            inter: 24,
            tie: false,
            bias: false,
            dtype: "f32",
            sharded: false,
            seed: 3,
        }
    }
}

pub type Tensors = BTreeMap<String, (Vec<f32>, Vec<usize>)>;

impl Tiny {
    pub fn config(&self) -> Value {
        json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.inter,
            "num_hidden_layers": self.layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv,
            "head_dim": self.hd,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "rope_parameters": {"rope_theta": 1000.0, "rope_type": "default"},
            "tie_word_embeddings": self.tie,
            "attention_bias": self.bias,
            "max_position_embeddings": 256,
        })
    }

    pub fn tensors(&self) -> Tensors {
        let mut rng = Rng::new(self.seed);
        let mut out = BTreeMap::new();
        let (h, q, kv) = (self.hidden, self.heads * self.hd, self.kv * self.hd);
        let mut put = |rng: &mut Rng, name: String, shape: &[usize], scale: Option<f32>| {
            let n = shape.iter().product();
            let v = match scale {
                Some(s) => rng.vec(n, s),
                None => rng.ones(n),
            };
            out.insert(name, (v, shape.to_vec()));
        };
        let w = |i: usize| Some(1.0 / (i as f32).sqrt());
        put(
            &mut rng,
            "model.embed_tokens.weight".into(),
            &[self.rows, h],
            Some(1.0),
        );
        put(&mut rng, "model.norm.weight".into(), &[h], None);
        if !self.tie {
            put(&mut rng, "lm_head.weight".into(), &[self.rows, h], w(h));
        }
        for l in 0..self.layers {
            let p = format!("model.layers.{l}");
            put(
                &mut rng,
                format!("{p}.self_attn.q_proj.weight"),
                &[q, h],
                w(h),
            );
            put(
                &mut rng,
                format!("{p}.self_attn.k_proj.weight"),
                &[kv, h],
                w(h),
            );
            put(
                &mut rng,
                format!("{p}.self_attn.v_proj.weight"),
                &[kv, h],
                w(h),
            );
            put(
                &mut rng,
                format!("{p}.self_attn.o_proj.weight"),
                &[h, q],
                w(q),
            );
            put(
                &mut rng,
                format!("{p}.self_attn.q_norm.weight"),
                &[self.hd],
                None,
            );
            put(
                &mut rng,
                format!("{p}.self_attn.k_norm.weight"),
                &[self.hd],
                None,
            );
            put(
                &mut rng,
                format!("{p}.mlp.gate_proj.weight"),
                &[self.inter, h],
                w(h),
            );
            put(
                &mut rng,
                format!("{p}.mlp.up_proj.weight"),
                &[self.inter, h],
                w(h),
            );
            put(
                &mut rng,
                format!("{p}.mlp.down_proj.weight"),
                &[h, self.inter],
                w(self.inter),
            );
            put(&mut rng, format!("{p}.input_layernorm.weight"), &[h], None);
            put(
                &mut rng,
                format!("{p}.post_attention_layernorm.weight"),
                &[h],
                None,
            );
            if self.bias {
                put(
                    &mut rng,
                    format!("{p}.self_attn.q_proj.bias"),
                    &[q],
                    Some(0.1),
                );
                put(
                    &mut rng,
                    format!("{p}.self_attn.k_proj.bias"),
                    &[kv],
                    Some(0.1),
                );
                put(
                    &mut rng,
                    format!("{p}.self_attn.v_proj.bias"),
                    &[kv],
                    Some(0.1),
                );
                put(
                    &mut rng,
                    format!("{p}.self_attn.o_proj.bias"),
                    &[h],
                    Some(0.1),
                );
            }
        }
        out
    }

    /// Write `config.json` (after `cfg` edits it) and the weights (after `patch`).
    pub fn write_with(
        &self,
        dir: &Path,
        cfg: impl FnOnce(&mut Value),
        patch: impl FnOnce(&mut Tensors),
    ) {
        let mut config = self.config();
        cfg(&mut config);
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        let mut tensors = self.tensors();
        patch(&mut tensors);
        let encoded: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, (v, shape))| {
                let (dt, bytes) = match self.dtype {
                    "bf16" => (
                        Dtype::BF16,
                        v.iter()
                            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                            .collect(),
                    ),
                    _ => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                };
                (name, dt, shape, bytes)
            })
            .collect();
        let shards = if self.sharded { 2 } else { 1 };
        let mut index = serde_json::Map::new();
        for s in 0..shards {
            let file = if self.sharded {
                format!("model-{:05}-of-{shards:05}.safetensors", s + 1)
            } else {
                "model.safetensors".to_string()
            };
            let views: Vec<(String, TensorView<'_>)> = encoded
                .iter()
                .enumerate()
                .filter(|(i, _)| i % shards == s)
                .map(|(_, (n, dt, shape, data))| {
                    index.insert(n.clone(), json!(file));
                    (
                        n.clone(),
                        TensorView::new(*dt, shape.clone(), data).unwrap(),
                    )
                })
                .collect();
            safetensors::tensor::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        }
        if self.sharded {
            let idx = json!({"metadata": {}, "weight_map": index});
            std::fs::write(dir.join("model.safetensors.index.json"), idx.to_string()).unwrap();
        }
    }

    pub fn try_load_with(
        &self,
        cfg: impl FnOnce(&mut Value),
        patch: impl FnOnce(&mut Tensors),
    ) -> (tempfile::TempDir, dspark::Result<Qwen3Target>) {
        let dir = tempfile::tempdir().unwrap();
        self.write_with(dir.path(), cfg, patch);
        let t = Qwen3Target::load(dir.path(), &Device::Cpu);
        (dir, t)
    }

    pub fn load(&self) -> (tempfile::TempDir, Qwen3Target) {
        let (dir, t) = self.try_load_with(|_| {}, |_| {});
        (dir, t.unwrap())
    }
}

/// The bundled tiny pair's directory (`target/`, `drafter/`).
pub fn bundled_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/dspark/models/tiny")
}

/// Greedy decoding of `requests` by a speculator over `target` and the bundled drafter (its
/// weights shared with `target`) under `options`: the speculative generation, then the
/// target-only one.
pub fn speculative_and_target_only(
    target: Qwen3Target,
    options: dspark::speculator::SpeculatorOptions,
    requests: &[dspark::speculator::Request],
) -> (
    dspark::speculator::Generation,
    dspark::speculator::Generation,
) {
    use dspark::speculator::Speculator;
    let drafter = dspark::Qwen3Drafter::builder(&target.target_spec())
        .shared(target.shared_weights())
        .load(&bundled_dir().join("drafter"))
        .unwrap();
    let s = Speculator::new(target, drafter, options).unwrap();
    let spec = s.generate(requests, None).unwrap();
    let base = s.generate_target_only(requests, None).unwrap();
    (spec, base)
}

/// Every position's logits of `tokens` from an empty cache, as f32.
pub fn all_logits(t: &Qwen3Target, tokens: &[u32]) -> Vec<f32> {
    chunked_logits(t, &[(tokens, LogitRows::All)])
}

/// The logits (as f32, one after the other) of forwarding each `(tokens, rows)` in turn
/// through one cache, empty at the start.
pub fn chunked_logits(t: &Qwen3Target, chunks: &[(&[u32], LogitRows)]) -> Vec<f32> {
    use dspark::TargetModel;
    use dspark::speculator::TargetInput;
    let mut cache = t.new_cache(1).unwrap();
    let mut out = Vec::new();
    for &(tokens, logits) in chunks {
        let input = TargetInput {
            tokens,
            width: tokens.len(),
            num_tokens: &[tokens.len()],
            logits,
        };
        let o = t.forward(&mut cache, &input, &[]).unwrap();
        let v = o.logits.to_dtype(candle_core::DType::F32).unwrap();
        out.extend(v.flatten_all().unwrap().to_vec1::<f32>().unwrap());
    }
    out
}
