//! The normalized drafter description.

use serde::Serialize;

pub use super::shape::{ModelShape, RopeSpec};
use crate::vocab::VocabSizes;

/// Which config shape a drafter was described in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum ConfigFormat {
    /// DeepSpec native (`Qwen3DSparkModel`, `Gemma4DSparkModel`): top-level DSpark keys.
    #[serde(rename = "deepspec")]
    DeepSpec,
    /// vllm-project/speculators (`speculators_model_type: "dspark"`).
    #[serde(rename = "speculators")]
    Speculators,
    /// DSpark keys nested under `dflash_config` (SpecForge-shaped).
    #[serde(rename = "dflash")]
    DFlash,
    /// DeepSeek-V4 in-checkpoint drafter (`dspark_*` keys, weights under `mtp.{stage}.*`).
    #[serde(rename = "deepseek-v4")]
    DeepSeekV4,
}

impl ConfigFormat {
    /// The stable name used in `inspect --json`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigFormat::DeepSpec => "deepspec",
            ConfigFormat::Speculators => "speculators",
            ConfigFormat::DFlash => "dflash",
            ConfigFormat::DeepSeekV4 => "deepseek-v4",
        }
    }
}

/// The Markov head variant (`markov_head_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MarkovHeadType {
    /// `bias = W2 · W1[x]` (all released checkpoints).
    Vanilla,
    /// `bias = W2 · (σ(gate([h; W1[x]])) ⊙ W1[x])`.
    Gated,
    /// Recurrent state head (paper eq. 6).
    Rnn,
}

impl MarkovHeadType {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MarkovHeadType::Vanilla => "vanilla",
            MarkovHeadType::Gated => "gated",
            MarkovHeadType::Rnn => "rnn",
        }
    }
}

/// The config key that supplied the noise (mask) token, in lookup order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum NoiseTokenSource {
    /// `dflash_config.mask_token_id`.
    #[serde(rename = "dflash_config.mask_token_id")]
    DflashConfigMaskTokenId,
    /// top-level `mask_token_id` (when not null).
    #[serde(rename = "mask_token_id")]
    MaskTokenId,
    /// `dspark_noise_token_id` (DeepSeek-V4).
    #[serde(rename = "dspark_noise_token_id")]
    DsparkNoiseTokenId,
    /// `pard_token`.
    #[serde(rename = "pard_token")]
    PardToken,
    /// `ptd_token_id`.
    #[serde(rename = "ptd_token_id")]
    PtdTokenId,
}

impl NoiseTokenSource {
    /// All sources in lookup order (first hit wins).
    pub const ORDER: [NoiseTokenSource; 5] = [
        NoiseTokenSource::DflashConfigMaskTokenId,
        NoiseTokenSource::MaskTokenId,
        NoiseTokenSource::DsparkNoiseTokenId,
        NoiseTokenSource::PardToken,
        NoiseTokenSource::PtdTokenId,
    ];

    /// The dotted config key.
    pub fn key(self) -> &'static str {
        match self {
            NoiseTokenSource::DflashConfigMaskTokenId => "dflash_config.mask_token_id",
            NoiseTokenSource::MaskTokenId => "mask_token_id",
            NoiseTokenSource::DsparkNoiseTokenId => "dspark_noise_token_id",
            NoiseTokenSource::PardToken => "pard_token",
            NoiseTokenSource::PtdTokenId => "ptd_token_id",
        }
    }
}

/// The resolved noise (mask) token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct NoiseToken {
    /// The token id, in `[0, V_in)`.
    pub id: u32,
    /// Which key supplied it.
    pub source: NoiseTokenSource,
}

/// A drafter, normalized from any accepted config shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DraftSpec {
    /// The config file this came from (or `<dict>`), for error messages.
    pub source: String,
    /// Which shape the config was in.
    pub format: ConfigFormat,
    /// `architectures[0]` as written (e.g. `Qwen3DSparkModel`).
    pub architecture: String,
    /// Trained block width: number of input slots and of draft tokens per round.
    pub block_size: usize,
    /// `true`: slot k predicts position n+k+1 (DeepSpec). `false`: 1+K layout (speculators).
    pub sample_from_anchor: bool,
    /// The noise token and where it came from.
    pub noise_token: NoiseToken,
    /// Target layer ids in DeepSpec semantics: id i = output of target layer i (= HF
    /// `hidden_states[i+1]`); -1 = the embedding output.
    pub target_layer_ids: Vec<i64>,
    /// The same layers in capture semantics: the *input* of layer j (vLLM/llama.cpp), i.e. `i + 1`.
    pub capture_layer_ids: Vec<usize>,
    /// Number of target layers, when the config says (`num_target_layers`, or the target's own
    /// `num_hidden_layers` for DeepSeek-V4).
    pub num_target_layers: Option<usize>,
    /// Markov head rank `r`; 0 = DFlash (no Markov head).
    pub markov_rank: usize,
    /// Markov head variant.
    pub markov_head_type: MarkovHeadType,
    /// `enable_confidence_head`.
    pub confidence_head: bool,
    /// `confidence_head_with_markov`: the head reads `[h ; W1[x]]` (`H + r` inputs) instead of `h`.
    pub confidence_head_with_markov: bool,
    /// The decoder stack: `vocab_size` is `V_in`, `hidden_size` is `H`, `num_hidden_layers`
    /// counts draft layers (DeepSeek-V4: MTP stages); `head_dim` falls back to `H / heads`.
    #[serde(flatten)]
    pub shape: ModelShape,
    /// `V_d` (`draft_vocab_size`, falling back to `vocab_size`).
    pub draft_vocab_size: usize,
    /// Target hidden size `H_t` per captured layer (`target_hidden_size`, falling back to `H`).
    pub target_hidden_size: usize,
    /// Multiplier on base logits and the Markov bias (`logit_scale`, 1.0 when absent).
    pub logit_scale: f32,
    /// `final_logit_softcapping` (Gemma4): base logits become `c · tanh(logits / c)` before the
    /// Markov bias. `None` when absent.
    pub final_logit_softcapping: Option<f64>,
    /// Non-fatal notes from normalization (e.g. a speculators config without
    /// `sample_from_anchor`, assumed false).
    pub warnings: Vec<crate::error::Warning>,
}

impl DraftSpec {
    /// The three vocabulary sizes against a target vocabulary of `target_vocab` ids.
    pub fn vocab(&self, target_vocab: usize) -> VocabSizes {
        VocabSizes::new(self.shape.vocab_size, self.draft_vocab_size, target_vocab)
    }

    /// Width of the fused context features: `len(target_layer_ids) * H_t`.
    pub fn context_width(&self) -> usize {
        self.target_layer_ids.len() * self.target_hidden_size
    }

    /// Input width of the confidence head: `H + r` with Markov conditioning, else `H`.
    pub fn confidence_input_width(&self) -> usize {
        if self.confidence_head_with_markov {
            self.shape.hidden_size + self.markov_rank
        } else {
            self.shape.hidden_size
        }
    }

    /// `true` when this is a DFlash drafter (no Markov head).
    pub fn is_dflash(&self) -> bool {
        self.markov_rank == 0
    }
}
