//! Shared helpers for the drafter tests: tiny random DeepSpec-format checkpoints written to a
//! temporary directory, and matching target configs and target weights.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use dspark::{SharedWeights, TargetSpec};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::{Value, json};

/// Draft (= target) hidden size.
pub const H: usize = 16;
/// Attention heads, KV heads, head dim, MLP width, draft layers.
pub const HEADS: usize = 4;
pub const KV: usize = 2;
pub const HD: usize = 8;
pub const INTER: usize = 24;
pub const LAYERS: usize = 2;
/// Target decoder layers; the drafter fuses the outputs of layers 0 and 2.
pub const TARGET_LAYERS: usize = 4;
pub const TARGET_LAYER_IDS: [i64; 2] = [0, 2];
/// Width of one context feature row.
pub const WIDTH: usize = H * TARGET_LAYER_IDS.len();

/// A deterministic xorshift generator for test weights.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// Uniform in `[-1, 1)`.
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next() * scale).collect()
    }

    /// `n` values around 1 (norm weights).
    pub fn ones(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| 1.0 + 0.1 * self.next()).collect()
    }
}

/// What a tiny drafter looks like.
#[derive(Debug, Clone)]
pub struct Tiny {
    /// `V_in`.
    pub vocab: usize,
    /// `V_d` (`None` = same as `vocab`, key omitted).
    pub draft_vocab: Option<usize>,
    /// `V_t`.
    pub target_vocab: usize,
    pub rank: usize,
    pub own_embed: bool,
    pub own_lm_head: bool,
    /// Offsets written as `d2t` (I64).
    pub d2t: Option<Vec<i64>>,
    pub confidence: bool,
    pub sample_from_anchor: Option<bool>,
    pub block_size: usize,
    pub noise: usize,
    /// `"bf16"`, `"f16"` or `"f32"` on disk.
    pub dtype: &'static str,
    pub seed: u64,
}

impl Default for Tiny {
    fn default() -> Self {
        Self {
            vocab: 48,
            draft_vocab: None,
            target_vocab: 48,
            rank: 6,
            own_embed: true,
            own_lm_head: true,
            d2t: None,
            confidence: true,
            sample_from_anchor: None,
            block_size: 5,
            noise: 47,
            dtype: "f32",
            seed: 7,
        }
    }
}

fn dv(t: &Tiny) -> usize {
    t.draft_vocab.unwrap_or(t.vocab)
}

impl Tiny {
    /// The DeepSpec-format `config.json`.
    pub fn config(&self) -> Value {
        let mut c = json!({
            "architectures": ["Qwen3DSparkModel"],
            "model_type": "qwen3",
            "attention_bias": false,
            "head_dim": HD,
            "hidden_act": "silu",
            "hidden_size": H,
            "intermediate_size": INTER,
            "num_attention_heads": HEADS,
            "num_hidden_layers": LAYERS,
            "num_key_value_heads": KV,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": false,
            "vocab_size": self.vocab,
            "block_size": self.block_size,
            "mask_token_id": self.noise,
            "target_layer_ids": TARGET_LAYER_IDS,
            "num_target_layers": TARGET_LAYERS,
            "num_anchors": 8,
            "markov_rank": self.rank,
            "markov_head_type": "vanilla",
            "enable_confidence_head": self.confidence,
            "confidence_head_with_markov": self.confidence && self.rank > 0,
        });
        if let Some(d) = self.draft_vocab {
            c["draft_vocab_size"] = json!(d);
        }
        if let Some(s) = self.sample_from_anchor {
            c["sample_from_anchor"] = json!(s);
        }
        c
    }

    /// The target config JSON.
    pub fn target_config(&self) -> Value {
        json!({
            "model_type": "qwen3",
            "vocab_size": self.target_vocab,
            "num_hidden_layers": TARGET_LAYERS,
            "hidden_size": H,
        })
    }

    pub fn target(&self) -> TargetSpec {
        TargetSpec::from_value(&self.target_config(), "target/config.json").unwrap()
    }

    /// Every tensor, by checkpoint name, as f32 values + shape.
    pub fn tensors(&self) -> BTreeMap<String, (Vec<f32>, Vec<usize>)> {
        let mut rng = Rng::new(self.seed);
        let mut out = BTreeMap::new();
        let mut put = |name: String, shape: &[usize], v: Vec<f32>| {
            out.insert(name, (v, shape.to_vec()));
        };
        let w = |rng: &mut Rng, o: usize, i: usize| rng.vec(o * i, 1.0 / (i as f32).sqrt());
        if self.own_embed {
            put(
                "embed_tokens.weight".into(),
                &[self.vocab, H],
                rng.vec(self.vocab * H, 1.0),
            );
        }
        if self.own_lm_head {
            put(
                "lm_head.weight".into(),
                &[dv(self), H],
                w(&mut rng, dv(self), H),
            );
        }
        put("fc.weight".into(), &[H, WIDTH], w(&mut rng, H, WIDTH));
        put("hidden_norm.weight".into(), &[H], rng.ones(H));
        put("norm.weight".into(), &[H], rng.ones(H));
        for l in 0..LAYERS {
            let p = format!("layers.{l}");
            put(
                format!("{p}.self_attn.q_proj.weight"),
                &[HEADS * HD, H],
                w(&mut rng, HEADS * HD, H),
            );
            put(
                format!("{p}.self_attn.k_proj.weight"),
                &[KV * HD, H],
                w(&mut rng, KV * HD, H),
            );
            put(
                format!("{p}.self_attn.v_proj.weight"),
                &[KV * HD, H],
                w(&mut rng, KV * HD, H),
            );
            put(
                format!("{p}.self_attn.o_proj.weight"),
                &[H, HEADS * HD],
                w(&mut rng, H, HEADS * HD),
            );
            put(format!("{p}.self_attn.q_norm.weight"), &[HD], rng.ones(HD));
            put(format!("{p}.self_attn.k_norm.weight"), &[HD], rng.ones(HD));
            put(
                format!("{p}.mlp.gate_proj.weight"),
                &[INTER, H],
                w(&mut rng, INTER, H),
            );
            put(
                format!("{p}.mlp.up_proj.weight"),
                &[INTER, H],
                w(&mut rng, INTER, H),
            );
            put(
                format!("{p}.mlp.down_proj.weight"),
                &[H, INTER],
                w(&mut rng, H, INTER),
            );
            put(format!("{p}.input_layernorm.weight"), &[H], rng.ones(H));
            put(
                format!("{p}.post_attention_layernorm.weight"),
                &[H],
                rng.ones(H),
            );
        }
        if self.rank > 0 {
            let r = self.rank;
            put(
                "markov_head.markov_w1.weight".into(),
                &[self.vocab, r],
                rng.vec(self.vocab * r, 1.0),
            );
            put(
                "markov_head.markov_w2.weight".into(),
                &[dv(self), r],
                w(&mut rng, dv(self), r),
            );
        }
        if self.confidence {
            let width = H + if self.rank > 0 { self.rank } else { 0 };
            put(
                "confidence_head.proj.weight".into(),
                &[1, width],
                w(&mut rng, 1, width),
            );
            put("confidence_head.proj.bias".into(), &[1], vec![0.25]);
        }
        out
    }

    /// Write `config.json` and `model.safetensors` into `dir`.
    pub fn write(&self, dir: &Path) {
        self.write_with(dir, |_| {});
    }

    /// [`Tiny::write`] after `patch` edits the tensors.
    pub fn write_with(
        &self,
        dir: &Path,
        patch: impl FnOnce(&mut BTreeMap<String, (Vec<f32>, Vec<usize>)>),
    ) {
        std::fs::write(
            dir.join("config.json"),
            serde_json::to_vec_pretty(&self.config()).unwrap(),
        )
        .unwrap();
        let mut tensors = self.tensors();
        patch(&mut tensors);
        let mut bytes: BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> = tensors
            .into_iter()
            .map(|(name, (v, shape))| {
                let (dtype, data): (Dtype, Vec<u8>) = match self.dtype {
                    "bf16" => (
                        Dtype::BF16,
                        v.iter()
                            .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                            .collect(),
                    ),
                    "f16" => (
                        Dtype::F16,
                        v.iter()
                            .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                            .collect(),
                    ),
                    _ => (Dtype::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
                };
                (name, (dtype, shape, data))
            })
            .collect();
        if let Some(d2t) = &self.d2t {
            bytes.insert(
                "d2t".into(),
                (
                    Dtype::I64,
                    vec![d2t.len()],
                    d2t.iter().flat_map(|x| x.to_le_bytes()).collect(),
                ),
            );
        }
        let views: Vec<(String, TensorView<'_>)> = bytes
            .iter()
            .map(|(n, (dt, shape, data))| {
                (
                    n.clone(),
                    TensorView::new(*dt, shape.clone(), data).unwrap(),
                )
            })
            .collect();
        safetensors::tensor::serialize_to_file(views, None, &dir.join("model.safetensors"))
            .unwrap();
    }

    /// Random target embedding and lm_head `[V_t, H]`.
    pub fn target_weights(&self) -> SharedWeights {
        let mut rng = Rng::new(self.seed ^ 0xABCD);
        let v = self.target_vocab;
        SharedWeights {
            embed: Some(
                Tensor::from_vec(rng.vec(v * H, 1.0), (v, H), &Device::Cpu)
                    .unwrap()
                    .into(),
            ),
            lm_head: Some(
                Tensor::from_vec(rng.vec(v * H, 0.25), (v, H), &Device::Cpu)
                    .unwrap()
                    .into(),
            ),
            head: None,
        }
    }
}

/// Random context features `[B, T, WIDTH]`.
pub fn context(seed: u64, b: usize, t: usize) -> Tensor {
    let mut rng = Rng::new(seed);
    Tensor::from_vec(rng.vec(b * t * WIDTH, 1.0), (b, t, WIDTH), &Device::Cpu).unwrap()
}

/// Largest absolute difference between two equally long slices, treating equal infinities as 0.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| if x == y { 0.0 } else { (x - y).abs() })
        .fold(0.0, f32::max)
}

/// Write `tiny` to a fresh temp dir and load it with the target's weights.
pub fn load(tiny: &Tiny) -> (tempfile::TempDir, dspark::Qwen3Drafter) {
    let dir = tempfile::tempdir().unwrap();
    tiny.write(dir.path());
    let d = dspark::Qwen3Drafter::load(dir.path(), &tiny.target(), tiny.target_weights()).unwrap();
    (dir, d)
}
