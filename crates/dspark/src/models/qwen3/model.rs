//! [`Qwen3Target`]: a Hugging Face `Qwen3ForCausalLM` checkpoint run natively on candle.
//!
//! Weights (safetensors, single file or sharded; f32, f16, bf16 or f64 on disk) are
//! shape-checked against the config before anything is read, then kept in the dtype the
//! [`LoadOptions`] choose (by default the checkpoint's: a bf16 checkpoint's matrices, embedding
//! and head stay 2 bytes a weight, widened in registers by the kernels; see
//! [`crate::nn::dtype`]). The decoder layers are the drafter's ([`crate::drafter`]'s shared
//! `Layer`); the forward is in `forward.rs`.

use std::collections::BTreeMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::cache::Qwen3Cache;
use crate::checkpoint::Inventory;
use crate::checkpoint::shapes::{EMBED, LM_HEAD};
use crate::config::Qwen3Config;
use crate::config::TargetSpec;
use crate::device::fast_on;
use crate::error::{Error, Result};
use crate::models::{ForwardCost, TargetInput, TargetModel, TargetOutput};
use crate::nn::decoder::{Heads, Layer, Take};
use crate::nn::quant::Quant;
use crate::nn::weights::TensorReader;
use crate::nn::{Linear, Rope, output_head};
use crate::nn::{LoadOptions, SharedWeights, VocabWeight};

/// A Qwen3 causal LM on candle: the native [`TargetModel`].
#[derive(Debug, Clone)]
pub struct Qwen3Target {
    pub(crate) config: Qwen3Config,
    pub(crate) device: Device,
    /// The layers' maps' quantized format (on the device-generic path, the values they hold).
    pub(crate) quant: Option<Quant>,
    /// `[rows >= V_t, H]` as stored (a GGUF file's quantized blocks: looked up where they lie).
    pub(crate) embed: VocabWeight,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    /// `[rows >= V_t, H]` as stored (the embedding itself when tied).
    pub(crate) lm_head: VocabWeight,
    /// The first `V_t` rows of `lm_head` (a view) as a tensor, where `head` does not multiply
    /// by packed rows (`None` beside a GGUF file's quantized head: no widened copy).
    pub(crate) lm_head_logical: Option<Tensor>,
    /// `lm_head_logical` packed for the CPU kernel (see [`output_head`]), or quantized with the
    /// layers.
    pub(crate) head: Option<Linear>,
    pub(crate) rope: Rope,
    /// Rope tables on the device, for the device-generic path.
    pub(crate) rope_cache: crate::nn::rope::RopeCache,
    /// The causal mask's key index on the device, for the device-generic path.
    pub(crate) key_index: crate::nn::attention::IotaCache,
    /// The element type of its caches' keys and values ([`LoadOptions::kv_dtype`]).
    pub(crate) kv_dtype: crate::nn::WeightDtype,
}

/// Why a tensor is required.
pub(super) const WHY: &str = "part of the Qwen3 target";

/// One tensor the config implies: name, shape, and whether more rows are fine (padded
/// vocabularies).
pub(super) struct Want {
    pub(super) name: String,
    pub(super) shape: Vec<usize>,
    pub(super) more_rows: bool,
}

impl Want {
    /// Whether a tensor of `shape` is this one's.
    pub(super) fn fits(&self, shape: &[usize]) -> bool {
        if self.more_rows {
            shape.len() == 2 && shape[0] >= self.shape[0] && shape[1] == self.shape[1]
        } else {
            shape == self.shape
        }
    }
}

/// Every tensor a Qwen3 checkpoint with `c` must hold (`lm_head` only when untied).
pub(super) fn expected(c: &Qwen3Config) -> Vec<Want> {
    let h = c.shape.hidden_size;
    let q = c.shape.num_attention_heads * c.shape.head_dim;
    let kv = c.shape.num_key_value_heads * c.shape.head_dim;
    let (hd, inter) = (c.shape.head_dim, c.shape.intermediate_size);
    let mut out = vec![
        Want {
            name: EMBED.into(),
            shape: vec![c.shape.vocab_size, h],
            more_rows: true,
        },
        Want {
            name: "model.norm.weight".into(),
            shape: vec![h],
            more_rows: false,
        },
    ];
    if !c.shape.tie_word_embeddings {
        out.push(Want {
            name: LM_HEAD.into(),
            shape: vec![c.shape.vocab_size, h],
            more_rows: true,
        });
    }
    for i in 0..c.shape.num_hidden_layers {
        let mut put = |name: &str, shape: &[usize]| {
            out.push(Want {
                name: format!("model.layers.{i}.{name}"),
                shape: shape.to_vec(),
                more_rows: false,
            });
        };
        put("self_attn.q_proj.weight", &[q, h]);
        put("self_attn.k_proj.weight", &[kv, h]);
        put("self_attn.v_proj.weight", &[kv, h]);
        put("self_attn.o_proj.weight", &[h, q]);
        put("self_attn.q_norm.weight", &[hd]);
        put("self_attn.k_norm.weight", &[hd]);
        put("mlp.gate_proj.weight", &[inter, h]);
        put("mlp.up_proj.weight", &[inter, h]);
        put("mlp.down_proj.weight", &[h, inter]);
        put("input_layernorm.weight", &[h]);
        put("post_attention_layernorm.weight", &[h]);
        if c.shape.attention_bias {
            put("self_attn.q_proj.bias", &[q]);
            put("self_attn.k_proj.bias", &[kv]);
            put("self_attn.v_proj.bias", &[kv]);
            put("self_attn.o_proj.bias", &[h]);
        }
    }
    out
}

impl Qwen3Target {
    /// Load a `Qwen3ForCausalLM` directory (`config.json` + `model.safetensors` or a sharded
    /// `model.safetensors.index.json`) onto `device`.
    pub fn load(dir: &Path, device: &Device) -> Result<Self> {
        Self::load_with(dir, device, LoadOptions::default())
    }

    /// [`Qwen3Target::load`] with [`LoadOptions`] (the weight dtype).
    pub fn load_with(dir: &Path, device: &Device, options: LoadOptions) -> Result<Self> {
        let config = Qwen3Config::from_path(dir)?;
        let inventory = Inventory::open(dir)?;
        Self::from_checkpoint_with(config, &inventory, device, options)
    }

    /// Build from a parsed config and an opened checkpoint. Every tensor is checked (present:
    /// `missing-tensor`; shape: `shape-mismatch`, all problems at once) before any is read.
    /// `lm_head.weight` is the embedding when `tie_word_embeddings` (as in transformers, a
    /// stored one is then ignored); the embedding and lm_head may hold more rows than
    /// `vocab_size` (padded), logits keep the first `vocab_size`.
    pub fn from_checkpoint(
        config: Qwen3Config,
        inventory: &Inventory,
        device: &Device,
    ) -> Result<Self> {
        Self::from_checkpoint_with(config, inventory, device, LoadOptions::default())
    }

    /// [`Qwen3Target::from_checkpoint`] with [`LoadOptions`] (the weight dtype).
    pub fn from_checkpoint_with(
        config: Qwen3Config,
        inventory: &Inventory,
        device: &Device,
        options: LoadOptions,
    ) -> Result<Self> {
        let rope = Rope::new(&config.shape.rope, config.shape.head_dim, &config.source)?;
        let wants = expected(&config);
        let mut problems = Vec::new();
        for w in &wants {
            let Some(info) = inventory.get(&w.name) else {
                problems.push(Error::MissingTensor {
                    tensor: w.name.clone(),
                    reason: if w.name == LM_HEAD {
                        format!("{WHY} (tie_word_embeddings is false)")
                    } else {
                        WHY.into()
                    },
                });
                continue;
            };
            if !w.fits(&info.shape) {
                problems.push(Error::ShapeMismatch {
                    tensor: w.name.clone(),
                    expected: w.shape.clone(),
                    found: info.shape.clone(),
                });
            }
        }
        Error::collect(problems)?;
        let mut reader = TensorReader::new(device, options);
        let mut tensors = BTreeMap::new();
        for w in &wants {
            if let Some(info) = inventory.get(&w.name) {
                tensors.insert(w.name.clone(), reader.read(info)?);
            }
        }
        let t = Take::new(tensors).quantized(options.quant);
        let vocab = BTreeMap::new();
        Self::assemble(
            config,
            rope,
            (t, vocab),
            None,
            options.quant,
            (device, options),
        )
    }

    /// The target from its loaded tensors and maps (`t`, by the checkpoint's names) and its
    /// packed embedding or head (`vocab`: a GGUF file's quantized ones, by the same names),
    /// `head` the output head when the loader built it (a GGUF file's quantized one, kept as
    /// stored), `quant` the layers' maps' format.
    pub(super) fn assemble(
        config: Qwen3Config,
        rope: Rope,
        (mut t, mut vocab): (Take, BTreeMap<String, VocabWeight>),
        head: Option<Linear>,
        quant: Option<Quant>,
        (device, options): (&Device, LoadOptions),
    ) -> Result<Self> {
        let mut take = |name: &str| match vocab.remove(name) {
            Some(w) => Ok(w),
            None => t.get(name).map(VocabWeight::Tensor),
        };
        let embed = take(EMBED)?;
        let lm_head = if config.shape.tie_word_embeddings {
            embed.clone()
        } else {
            take(LM_HEAD)?
        };
        let mut layers = Vec::with_capacity(config.shape.num_hidden_layers);
        for i in 0..config.shape.num_hidden_layers {
            layers.push(Layer::load(
                &mut t,
                &format!("model.layers.{i}"),
                config.shape.attention_bias,
            )?);
        }
        let v = config.shape.vocab_size;
        let (head, lm_head_logical) = match head {
            Some(head) => (Some(head), None),
            None => {
                // A view of the stored head's first `V_t` rows (packed rows without a packed
                // head: their values, once).
                let logical = match &lm_head {
                    VocabWeight::Tensor(w) => w.narrow(0, 0, v)?,
                    VocabWeight::Packed { .. } => lm_head.dense(v, device, DType::F32)?,
                };
                let head = match options.quant {
                    // The head quantized too, where the host kernels run.
                    Some(q) if fast_on(device) => {
                        Some(Linear::quantized(logical.clone(), None, q.head())?)
                    }
                    _ => output_head(&logical)?,
                };
                (head, Some(logical))
            }
        };
        let (embed, lm_head, lm_head_logical) = match options.quant {
            Some(q) if fast_on(device) => {
                let (embed, lm_head) = quantized_vocab(embed, lm_head, head.as_ref(), q, &config)?;
                (embed, lm_head, None)
            }
            _ => (embed, lm_head, lm_head_logical),
        };
        Ok(Self {
            norm: t.get("model.norm.weight")?,
            head,
            lm_head_logical,
            lm_head,
            embed,
            layers,
            rope,
            rope_cache: Default::default(),
            key_index: Default::default(),
            device: device.clone(),
            quant,
            kv_dtype: options.kv_dtype_or_default(),
            config,
        })
    }

    /// The normalized config.
    pub fn config(&self) -> &Qwen3Config {
        &self.config
    }

    /// What a drafter needs to know about this target (for
    /// [`crate::Qwen3Drafter::builder`]).
    pub fn target_spec(&self) -> TargetSpec {
        self.config.target_spec()
    }

    /// The dtype the decoder layers' matrices are kept in ([`LoadOptions::dtype`], by default
    /// the checkpoint's; `float32` on the device-generic path, which computes in f32).
    pub fn weight_dtype(&self) -> crate::nn::WeightDtype {
        self.layers
            .first()
            .map_or(crate::nn::WeightDtype::F32, Layer::weight_dtype)
    }

    /// The element type its KV caches keep keys and values in ([`LoadOptions::kv_dtype`]).
    pub fn kv_dtype(&self) -> crate::nn::WeightDtype {
        self.kv_dtype
    }

    /// The quantized format of the layers' linear maps (`dtype="q8_0"` or `"q4_k"` at load), if
    /// any.
    pub fn quant(&self) -> Option<Quant> {
        self.quant
    }

    /// Bytes of weights one forward step reads whatever its rows (what bounds a decode step
    /// from below): every layer's matrices and the output head, in their kept dtype (norms
    /// and the embedding rows looked up aside).
    pub fn weight_bytes_per_step(&self) -> usize {
        let layers: usize = self.layers.iter().map(Layer::weight_bytes).sum();
        let head = match (&self.head, &self.lm_head_logical) {
            (Some(h), _) => h.weight_bytes(),
            (None, Some(w)) => w.elem_count() * w.dtype().size_in_bytes(),
            (None, None) => 0,
        };
        layers + head
    }

    /// The embedding and output head as kept, and the head as its kernels read it (cheap
    /// handle copies: a drafter loaded with them shares their memory and, for the head, the
    /// same packed or quantized bytes).
    pub fn shared_weights(&self) -> SharedWeights {
        SharedWeights {
            embed: Some(self.embed.clone()),
            lm_head: Some(self.lm_head.clone()),
            head: self.head.clone(),
        }
    }

    /// The attention shape of every layer.
    pub(crate) fn heads(&self) -> Heads {
        Heads {
            heads: self.config.shape.num_attention_heads,
            kv_heads: self.config.shape.num_key_value_heads,
            head_dim: self.config.shape.head_dim,
            eps: self.config.shape.rms_norm_eps,
        }
    }
}

impl TargetModel for Qwen3Target {
    type Cache = Qwen3Cache;

    fn vocab_size(&self) -> usize {
        self.config.shape.vocab_size
    }

    fn num_hidden_layers(&self) -> usize {
        self.config.shape.num_hidden_layers
    }

    fn hidden_size(&self) -> usize {
        self.config.shape.hidden_size
    }

    fn device(&self) -> Device {
        self.device.clone()
    }

    fn new_cache(&self, batch: usize) -> Result<Qwen3Cache> {
        crate::limits::at_most("batch", batch as u64, crate::limits::MAX_BATCH)?;
        Ok(Qwen3Cache::new(
            batch,
            self.config.shape.num_hidden_layers,
            self.config.shape.num_key_value_heads,
            self.config.shape.head_dim,
            self.kv_dtype,
            &self.device,
        ))
    }

    fn forward(
        &self,
        cache: &mut Qwen3Cache,
        input: &TargetInput<'_>,
        capture_layer_ids: &[usize],
    ) -> Result<TargetOutput> {
        self.forward_packed(cache, input, capture_layer_ids)
    }

    fn truncate(&self, cache: &mut Qwen3Cache, lengths: &[usize]) -> Result<()> {
        cache.truncate(lengths)
    }

    fn cache_lengths(&self, cache: &Qwen3Cache) -> Vec<usize> {
        cache.lengths().to_vec()
    }

    fn resizable(&self) -> bool {
        true
    }

    fn grow(&self, cache: &mut Qwen3Cache, n: usize) -> Result<()> {
        cache.grow(n)
    }

    fn retain(&self, cache: &mut Qwen3Cache, keep: &[bool]) -> Result<()> {
        cache.retain(keep)
    }

    fn ragged(&self) -> bool {
        true
    }

    fn forward_cost(&self) -> Result<Option<ForwardCost>> {
        let c = &self.config.shape;
        let layer = ForwardCost::layer_weights(c);
        let weights = c.num_hidden_layers * layer + c.vocab_size * c.hidden_size;
        Ok(Some(ForwardCost {
            weight_bytes: self.weight_bytes_per_step() as f64,
            flops_per_token: 2.0 * weights as f64,
            layers: c.num_hidden_layers,
            dtype: self.weight_dtype(),
            quant: self.quant(),
            layer_seconds: None,
        }))
    }
}

/// In-place quantization's embedding and stored head on the host: the embedding in the
/// head's format ([`Quant::head`]; rows looked up from its blocks), held once with a head of
/// the same rows (tied, or an untied head's stored rows all logical), so neither stays in its
/// stored dtype beside the blocks. Already packed ones (a GGUF file's) stay as they are.
fn quantized_vocab(
    embed: VocabWeight,
    lm_head: VocabWeight,
    head: Option<&Linear>,
    quant: Quant,
    config: &Qwen3Config,
) -> Result<(VocabWeight, VocabWeight)> {
    let head_rows = head.and_then(Linear::packed_weight);
    let all_rows = |w: &VocabWeight| -> Option<VocabWeight> {
        let h = head_rows?;
        (w.dims().map(|d| d.0) == Some(h.rows())).then(|| VocabWeight::packed(h.clone()))
    };
    let lm_head = match &lm_head {
        VocabWeight::Tensor(_) => all_rows(&lm_head).unwrap_or(lm_head),
        VocabWeight::Packed { .. } => lm_head,
    };
    let tied = config.shape.tie_word_embeddings;
    let embed = match &embed {
        VocabWeight::Tensor(_) if tied && lm_head.as_packed().is_some() => lm_head.clone(),
        VocabWeight::Tensor(e) => {
            let q = Linear::quantized(e.clone(), None, quant.head())?;
            match q.packed_weight() {
                Some(rows) => VocabWeight::packed(rows.clone()),
                None => embed,
            }
        }
        VocabWeight::Packed { .. } => embed,
    };
    let lm_head = if tied { embed.clone() } else { lm_head };
    Ok((embed, lm_head))
}
