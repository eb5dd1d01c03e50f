//! [`ModelShape`]: the shape of a Qwen3-style decoder stack, the one description both a
//! drafter's backbone ([`super::DraftSpec::shape`]) and a native target
//! ([`super::Qwen3Config::shape`]) are built from.

use serde::Serialize;

/// A decoder stack's shape: vocabulary, widths, depth, heads, norms, RoPE.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelShape {
    /// `model_type`, if given.
    pub model_type: Option<String>,
    /// Input vocabulary: embedding rows (`V_in` for a drafter, `V_t` for a target).
    pub vocab_size: usize,
    /// Hidden width `H`.
    pub hidden_size: usize,
    /// Decoder layers (a DeepSeek-V4 drafter: its MTP stages).
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (they divide the query heads).
    pub num_key_value_heads: usize,
    /// Per-head dimension.
    pub head_dim: usize,
    /// MLP intermediate width.
    pub intermediate_size: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// Rotary embedding parameters.
    pub rope: RopeSpec,
    /// `max_position_embeddings`, if given (informational: positions are bounded by
    /// [`crate::limits::MAX_POSITION`]).
    pub max_position_embeddings: Option<usize>,
    /// `hidden_act` (`silu` when absent).
    pub hidden_act: String,
    /// The attention projections carry biases.
    pub attention_bias: bool,
    /// `lm_head` is the input embedding.
    pub tie_word_embeddings: bool,
}

/// Rotary position embedding parameters of a decoder stack.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RopeSpec {
    /// Base frequency (`rope_theta`, or `rope_parameters.rope_theta`).
    pub theta: f64,
    /// `rope_type` (`"default"` when absent).
    pub rope_type: String,
    /// Fraction of each head's dims that rotate (1.0 when absent).
    pub partial_rotary_factor: f64,
    /// Scaling factor for `linear`/`yarn`-style rope types (`None` when absent).
    pub factor: Option<f64>,
    /// `original_max_position_embeddings` for yarn/llama3 scaling.
    pub original_max_position_embeddings: Option<usize>,
    /// `true` for the NeoX (rotate-half) layout, the Qwen3 default.
    pub neox_style: bool,
}

impl RopeSpec {
    /// What a Qwen3 config without RoPE options reads as: base frequency `theta`, the `default`
    /// type, every dim rotating, no scaling, the NeoX layout.
    pub fn neox(theta: f64) -> Self {
        Self {
            theta,
            rope_type: "default".into(),
            partial_rotary_factor: 1.0,
            factor: None,
            original_max_position_embeddings: None,
            neox_style: true,
        }
    }
}
