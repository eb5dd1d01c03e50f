//! The tensors a drafter config implies, with their expected shapes.
//!
//! Shapes are `[out, in]` as stored by PyTorch. Symbols: `H` draft hidden, `H_t` target hidden
//! per captured layer, `L` captured layers, `V_in`/`V_d` input/output vocab, `r` Markov rank,
//! `hd` head dim, `I` MLP intermediate size.

use crate::config::DraftSpec;

/// Whether a tensor must be present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Absent → `missing-tensor` with this reason.
    Required(&'static str),
    /// Absent is fine (the plan decides what that means: shared weight, disabled head).
    Optional,
}

/// One tensor the config implies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    /// Canonical parameter name (as produced by [`super::names::classify`]).
    pub canonical: String,
    /// Checkpoint name to report when it is missing.
    pub checkpoint: String,
    /// Expected shape.
    pub shape: Vec<usize>,
    /// Whether it must be present.
    pub need: Need,
}

impl Expected {
    fn new(
        canonical: impl Into<String>,
        checkpoint: impl Into<String>,
        shape: &[usize],
        need: Need,
    ) -> Self {
        Self {
            canonical: canonical.into(),
            checkpoint: checkpoint.into(),
            shape: shape.to_vec(),
            need,
        }
    }

    /// A Qwen3-shaped tensor: the checkpoint name is the canonical one without `model.`.
    fn qwen3(canonical: String, shape: &[usize], need: Need) -> Self {
        let checkpoint = canonical
            .strip_prefix("model.")
            .unwrap_or(&canonical)
            .to_string();
        Self::new(canonical, checkpoint, shape, need)
    }
}

/// Reason: the backbone needs it.
pub const WHY_BACKBONE: &str = "part of the draft backbone";
/// Reason: the Markov head needs it (`markov_rank > 0`).
pub const WHY_MARKOV: &str = "markov_rank > 0 needs the Markov head";
/// Reason: the confidence head ships its weight with a bias.
pub const WHY_CONFIDENCE_BIAS: &str = "the confidence head weight is present without its bias";

/// Canonical name of the input embedding.
pub const EMBED: &str = "model.embed_tokens.weight";
/// Canonical name of the output head.
pub const LM_HEAD: &str = "lm_head.weight";
/// Canonical name of the confidence head weight.
pub const CONFIDENCE_WEIGHT: &str = "model.confidence_head.proj.weight";
/// Canonical name of the confidence head bias.
pub const CONFIDENCE_BIAS: &str = "model.confidence_head.proj.bias";

/// `L · H_t`, saturating (configs are untrusted input).
fn context_width(spec: &DraftSpec) -> usize {
    spec.target_layer_ids
        .len()
        .saturating_mul(spec.target_hidden_size)
}

/// `H + r` with Markov conditioning, else `H`, saturating.
fn confidence_width(spec: &DraftSpec) -> usize {
    if spec.confidence_head_with_markov {
        spec.shape.hidden_size.saturating_add(spec.markov_rank)
    } else {
        spec.shape.hidden_size
    }
}

/// Every tensor a Qwen3-shaped drafter (DeepSpec, speculators, dflash) may hold, except
/// `d2t` (checked by the id map). `embed_tokens`, `lm_head` and the confidence head are
/// [`Need::Optional`]: the plan applies the vocabulary and confidence rules to them.
pub fn qwen3_expected(spec: &DraftSpec) -> Vec<Expected> {
    let h = spec.shape.hidden_size;
    let q = spec
        .shape
        .num_attention_heads
        .saturating_mul(spec.shape.head_dim);
    let kv = spec
        .shape
        .num_key_value_heads
        .saturating_mul(spec.shape.head_dim);
    let (hd, inter, r) = (
        spec.shape.head_dim,
        spec.shape.intermediate_size,
        spec.markov_rank,
    );
    let req = Need::Required(WHY_BACKBONE);
    let mut out = vec![
        Expected::qwen3(EMBED.into(), &[spec.shape.vocab_size, h], Need::Optional),
        Expected::new(
            LM_HEAD,
            LM_HEAD,
            &[spec.draft_vocab_size, h],
            Need::Optional,
        ),
        Expected::qwen3("model.fc.weight".into(), &[h, context_width(spec)], req),
        Expected::qwen3("model.hidden_norm.weight".into(), &[h], req),
        Expected::qwen3("model.norm.weight".into(), &[h], req),
    ];
    for i in 0..spec.shape.num_hidden_layers {
        let p = format!("model.layers.{i}");
        let mut layer = |name: &str, shape: &[usize]| {
            out.push(Expected::qwen3(format!("{p}.{name}"), shape, req));
        };
        layer("self_attn.q_proj.weight", &[q, h]);
        layer("self_attn.k_proj.weight", &[kv, h]);
        layer("self_attn.v_proj.weight", &[kv, h]);
        layer("self_attn.o_proj.weight", &[h, q]);
        layer("self_attn.q_norm.weight", &[hd]);
        layer("self_attn.k_norm.weight", &[hd]);
        layer("mlp.gate_proj.weight", &[inter, h]);
        layer("mlp.up_proj.weight", &[inter, h]);
        layer("mlp.down_proj.weight", &[h, inter]);
        layer("input_layernorm.weight", &[h]);
        layer("post_attention_layernorm.weight", &[h]);
        if spec.shape.attention_bias {
            layer("self_attn.q_proj.bias", &[q]);
            layer("self_attn.k_proj.bias", &[kv]);
            layer("self_attn.v_proj.bias", &[kv]);
            layer("self_attn.o_proj.bias", &[h]);
        }
    }
    if r > 0 {
        let why = Need::Required(WHY_MARKOV);
        out.push(Expected::qwen3(
            "model.markov_head.markov_w1.weight".into(),
            &[spec.shape.vocab_size, r],
            why,
        ));
        out.push(Expected::qwen3(
            "model.markov_head.markov_w2.weight".into(),
            &[spec.draft_vocab_size, r],
            why,
        ));
    }
    out.push(Expected::qwen3(
        CONFIDENCE_WEIGHT.into(),
        &[1, confidence_width(spec)],
        Need::Optional,
    ));
    out.push(Expected::qwen3(
        CONFIDENCE_BIAS.into(),
        &[1],
        Need::Optional,
    ));
    out
}

/// The shape-checked model-level tensors of a DeepSeek-V4 drafter with `n` stages
/// (`spec.num_hidden_layers`). Decoder-layer internals (MoE, attention) are presence-only.
pub fn dsv4_expected(spec: &DraftSpec) -> Vec<Expected> {
    let h = spec.shape.hidden_size;
    let r = spec.markov_rank;
    let last = spec.shape.num_hidden_layers.saturating_sub(1);
    let req = Need::Required(WHY_BACKBONE);
    let mut out = vec![
        Expected::new(
            "model.main_proj.weight",
            "mtp.0.main_proj.weight",
            &[h, context_width(spec)],
            req,
        ),
        Expected::new(
            "model.main_norm.weight",
            "mtp.0.main_norm.weight",
            &[h],
            req,
        ),
        Expected::new(
            "model.norm.weight",
            format!("mtp.{last}.norm.weight"),
            &[h],
            req,
        ),
    ];
    if r > 0 {
        let why = Need::Required(WHY_MARKOV);
        out.push(Expected::new(
            "model.markov_head.markov_w1.weight",
            format!("mtp.{last}.markov_head.markov_w1.weight"),
            &[spec.shape.vocab_size, r],
            why,
        ));
        out.push(Expected::new(
            "model.markov_head.markov_w2.weight",
            format!("mtp.{last}.markov_head.markov_w2.weight"),
            &[spec.draft_vocab_size, r],
            why,
        ));
    }
    out.push(Expected::new(
        CONFIDENCE_WEIGHT,
        format!("mtp.{last}.confidence_head.proj.weight"),
        &[1, h.saturating_add(r)],
        Need::Optional,
    ));
    out.push(Expected::new(
        CONFIDENCE_BIAS,
        format!("mtp.{last}.confidence_head.proj.bias"),
        &[1],
        Need::Optional,
    ));
    out
}
