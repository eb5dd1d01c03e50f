//! Reading the draft backbone (transformer shape, vocabulary, norms, RoPE) from a config.

use super::fields::{Fields, describe};
use super::rope::read_rope;
use super::shape::ModelShape;
use super::spec::ConfigFormat;
use crate::error::Result;
use crate::limits::{MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB};

/// The backbone part of a [`super::DraftSpec`]: the stack's [`ModelShape`] and what only a
/// drafter has.
#[derive(Debug, Clone, PartialEq)]
pub struct Backbone {
    /// The decoder stack.
    pub shape: ModelShape,
    /// `V_d` (falls back to `V_in`).
    pub draft_vocab_size: usize,
    /// `H_t` (falls back to `H`).
    pub target_hidden_size: usize,
    /// `logit_scale`.
    pub logit_scale: f32,
    /// `final_logit_softcapping` (Gemma4).
    pub final_logit_softcapping: Option<f64>,
}

/// What the backbone needs for the model's own configuration.
const WHY: &str = "the draft backbone shape";

/// Read the backbone keys from `f`. For DeepSeek-V4 the config is the target's:
/// `num_hidden_layers` there counts target layers, so the draft layer count
/// (`n_mtp_layers`, default 3) is passed in as `draft_layers`; the MLP width is
/// `moe_intermediate_size` (the MTP stages are MoE layers), falling back to
/// `intermediate_size`, and `layer_types` (the target's) is not checked.
///
/// Sizes are bounded by [`crate::limits`] (`bad-config` naming the key) before anything is
/// sized from them.
pub fn read_backbone(
    format: ConfigFormat,
    f: &Fields<'_>,
    draft_layers: Option<usize>,
) -> Result<Backbone> {
    let vocab_size = f.required_at_most("vocab_size", WHY, MAX_VOCAB)?;
    let draft_vocab_size = f
        .positive_at_most("draft_vocab_size", MAX_VOCAB)?
        .unwrap_or(vocab_size);
    let hidden_size = f.required_at_most("hidden_size", WHY, MAX_HIDDEN)?;
    let target_hidden_size = f
        .positive_at_most("target_hidden_size", MAX_HIDDEN)?
        .unwrap_or(hidden_size);
    // Required in every shape (for DeepSeek-V4 it is the target's layer count, read by the
    // caller, but it must still be a valid positive integer here).
    let own_layers = f.required_at_most("num_hidden_layers", WHY, MAX_LAYERS)?;
    let num_hidden_layers = draft_layers.unwrap_or(own_layers);
    let num_attention_heads = f.required_at_most("num_attention_heads", WHY, MAX_HEADS)?;

    // Gemma4 full-attention layers (all DSpark draft layers) use the "global" head shape.
    let (kv_key, dim_key) = if f.has("global_head_dim") {
        ("num_global_key_value_heads", "global_head_dim")
    } else {
        ("num_key_value_heads", "head_dim")
    };
    let kv_key = if f.has(kv_key) {
        kv_key
    } else {
        "num_key_value_heads"
    };
    let num_key_value_heads = f
        .positive_at_most(kv_key, MAX_HEADS)?
        .unwrap_or(num_attention_heads);
    if num_attention_heads % num_key_value_heads != 0 {
        return Err(f.bad(
            &f.name_of(kv_key),
            format!(
                "{num_key_value_heads} key/value heads do not divide {num_attention_heads} \
                 attention heads"
            ),
        ));
    }
    let head_dim = match f.positive_at_most(dim_key, MAX_HEADS)? {
        Some(d) => d,
        None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
        None => {
            return Err(f.bad(
                &f.name_of("num_attention_heads"),
                format!(
                    "{num_attention_heads} heads do not divide hidden_size {hidden_size} and no \
                     head_dim is given"
                ),
            ));
        }
    };
    let intermediate_size = match format {
        ConfigFormat::DeepSeekV4 => {
            match f.positive_at_most("moe_intermediate_size", MAX_HIDDEN)? {
                Some(n) => n,
                None => {
                    f.required_at_most("intermediate_size", "the MTP stage MLP width", MAX_HIDDEN)?
                }
            }
        }
        _ => f.required_at_most("intermediate_size", WHY, MAX_HIDDEN)?,
    };
    if format != ConfigFormat::DeepSeekV4 {
        check_layer_types(f, num_hidden_layers)?;
    }
    let hidden_act = match f.string("hidden_act")? {
        Some(a) => a,
        None => f.string("hidden_activation")?.unwrap_or("silu"),
    };
    let logit_scale = f.positive_float("logit_scale")?.unwrap_or(1.0);
    Ok(Backbone {
        shape: ModelShape {
            model_type: f.string("model_type")?.map(str::to_string),
            vocab_size,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size,
            rms_norm_eps: f.positive_float("rms_norm_eps")?.unwrap_or(1e-6),
            rope: read_rope(f)?,
            max_position_embeddings: f.positive("max_position_embeddings")?,
            hidden_act: hidden_act.to_string(),
            attention_bias: f.boolean("attention_bias")?.unwrap_or(false),
            tie_word_embeddings: f.boolean("tie_word_embeddings")?.unwrap_or(false),
        },
        draft_vocab_size,
        target_hidden_size,
        logit_scale: logit_scale as f32,
        final_logit_softcapping: f.positive_float("final_logit_softcapping")?,
    })
}

/// `layer_types`, when given, must be one entry per draft layer, all `full_attention`
/// (non-causal draft attention). Mixing in `sliding_attention` layers is not supported.
fn check_layer_types(f: &Fields<'_>, num_layers: usize) -> Result<()> {
    let Some((value, key)) = f.raw("layer_types") else {
        return Ok(());
    };
    let bad = |message: String| f.bad(&key, message);
    let items = value.as_array().ok_or_else(|| {
        bad(format!(
            "expected a list of strings, found {}",
            describe(value)
        ))
    })?;
    let mut sliding = 0;
    for (pos, item) in items.iter().enumerate() {
        match item.as_str() {
            Some("full_attention") => {}
            Some("sliding_attention") => sliding += 1,
            _ => {
                return Err(bad(format!(
                    "entry {pos} must be \"full_attention\" or \"sliding_attention\", found {}",
                    describe(item)
                )));
            }
        }
    }
    if items.len() != num_layers {
        return Err(bad(format!(
            "has {} entries for {num_layers} draft layers (num_hidden_layers)",
            items.len()
        )));
    }
    if sliding > 0 && sliding < items.len() {
        return Err(bad(format!(
            "mixes full_attention and sliding_attention layers ({sliding} of {} sliding): \
             mixed-attention drafters are not supported",
            items.len()
        )));
    }
    if sliding > 0 {
        return Err(bad(
            "all layers are sliding_attention: sliding-window (causal) drafters are not \
             supported, DSpark draft layers attend without a mask"
                .into(),
        ));
    }
    Ok(())
}
