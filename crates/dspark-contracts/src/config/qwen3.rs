//! The `config.json` of a Hugging Face `Qwen3ForCausalLM`, normalized into [`Qwen3Config`].
//!
//! Defaults follow transformers' `Qwen3Config`: `head_dim` 128, `rms_norm_eps` 1e-6,
//! `tie_word_embeddings` false, `attention_bias` false, `hidden_act` silu, RoPE theta 10000
//! (`rope_theta` or `rope_parameters.rope_theta`; `default` or `linear` scaling). Sizes are
//! bounded by [`crate::limits`]; anything out of range or unsupported (sliding-window layers,
//! another activation) is `bad-config` naming the file and key.

use std::path::Path;

use serde_json::Value;

use super::fields::{Fields, describe};
use super::rope::read_rope;
use super::shape::ModelShape;
use super::target::TargetSpec;
use crate::error::Result;
use crate::limits::{MAX_HEADS, MAX_HIDDEN, MAX_LAYERS, MAX_VOCAB};

/// transformers' `Qwen3Config.head_dim` default (not `hidden_size / num_attention_heads`).
pub const DEFAULT_HEAD_DIM: usize = 128;

/// A Qwen3 causal LM's configuration, as the native target needs it: its [`ModelShape`]
/// (`vocab_size` is `V_t`, the logits width; the embedding may hold more rows).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Qwen3Config {
    /// The config file this came from (or `<dict>`), for error messages.
    pub source: String,
    /// The decoder stack.
    #[serde(flatten)]
    pub shape: ModelShape,
}

/// What needs the key.
const WHY: &str = "the Qwen3 target shape";

impl Qwen3Config {
    /// Read `config.json` from a model directory (or a config file path).
    pub fn from_path(path: &Path) -> Result<Self> {
        super::json::read_config(path, Self::from_value)
    }

    /// Normalize parsed JSON; `file` names the source in errors.
    pub fn from_value(value: &Value, file: &str) -> Result<Self> {
        let root = super::json::root_object(value, file)?;
        let f = Fields::new(file, root, "");
        if let Some(t) = f.string("model_type")?
            && t != "qwen3"
        {
            return Err(f.bad("model_type", format!("`{t}`: not a Qwen3 model (qwen3)")));
        }
        let act = f.string("hidden_act")?.unwrap_or("silu");
        if !matches!(act, "silu" | "swish") {
            return Err(f.bad("hidden_act", format!("`{act}`: the Qwen3 MLP needs silu")));
        }
        let num_hidden_layers = f.required_at_most("num_hidden_layers", WHY, MAX_LAYERS)?;
        let heads = f.required_at_most("num_attention_heads", WHY, MAX_HEADS)?;
        let kv = f
            .positive_at_most("num_key_value_heads", MAX_HEADS)?
            .unwrap_or(heads);
        if !heads.is_multiple_of(kv) {
            return Err(f.bad(
                "num_key_value_heads",
                format!("{kv} key/value heads do not divide {heads} attention heads"),
            ));
        }
        check_full_attention(&f, num_hidden_layers)?;
        Ok(Self {
            source: file.to_string(),
            shape: ModelShape {
                model_type: f.string("model_type")?.map(str::to_string),
                vocab_size: f.required_at_most("vocab_size", WHY, MAX_VOCAB)?,
                hidden_size: f.required_at_most("hidden_size", WHY, MAX_HIDDEN)?,
                num_hidden_layers,
                num_attention_heads: heads,
                num_key_value_heads: kv,
                head_dim: f
                    .positive_at_most("head_dim", MAX_HEADS)?
                    .unwrap_or(DEFAULT_HEAD_DIM),
                intermediate_size: f.required_at_most("intermediate_size", WHY, MAX_HIDDEN)?,
                rms_norm_eps: f.positive_float("rms_norm_eps")?.unwrap_or(1e-6),
                rope: read_rope(&f)?,
                max_position_embeddings: f.positive("max_position_embeddings")?,
                hidden_act: act.to_string(),
                attention_bias: f.boolean("attention_bias")?.unwrap_or(false),
                tie_word_embeddings: f.boolean("tie_word_embeddings")?.unwrap_or(false),
            },
        })
    }

    /// What a drafter needs to know about this target.
    pub fn target_spec(&self) -> TargetSpec {
        TargetSpec {
            source: self.source.clone(),
            vocab_size: self.shape.vocab_size,
            num_hidden_layers: self.shape.num_hidden_layers,
            hidden_size: self.shape.hidden_size,
            model_type: self.shape.model_type.clone(),
        }
    }
}

/// Every layer must be full (causal) attention: `layer_types`, when given, all
/// `full_attention`; otherwise `use_sliding_window` must not put layers at or above
/// `max_window_layers` on a sliding window (transformers' rule).
fn check_full_attention(f: &Fields<'_>, layers: usize) -> Result<()> {
    if let Some((value, key)) = f.raw("layer_types") {
        let items = value.as_array().ok_or_else(|| {
            f.bad(
                &key,
                format!("expected a list of strings, found {}", describe(value)),
            )
        })?;
        if items.len() != layers {
            return Err(f.bad(
                &key,
                format!("has {} entries for {layers} layers", items.len()),
            ));
        }
        if let Some((i, item)) = items
            .iter()
            .enumerate()
            .find(|(_, v)| v.as_str() != Some("full_attention"))
        {
            return Err(f.bad(
                &key,
                format!(
                    "entry {i} is {}: the native target runs full-attention layers only",
                    describe(item)
                ),
            ));
        }
        return Ok(());
    }
    if f.boolean("use_sliding_window")? == Some(true) && f.has("sliding_window") {
        let first = f.uint("max_window_layers")?.unwrap_or(28);
        if first < layers {
            return Err(f.bad(
                "use_sliding_window",
                format!(
                    "true with max_window_layers {first} < {layers} layers: sliding-window \
                     attention is not supported by the native target"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn base() -> Value {
        json!({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8,
               "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 2,
               "num_key_value_heads": 1, "head_dim": 4})
    }

    #[test]
    fn defaults_follow_transformers() {
        let mut v = base();
        v.as_object_mut().unwrap().remove("head_dim");
        let c = Qwen3Config::from_value(&v, "c.json").unwrap();
        assert_eq!(c.shape.head_dim, 128);
        assert!(!c.shape.tie_word_embeddings && !c.shape.attention_bias);
        assert_eq!((c.shape.rope.theta, c.shape.rms_norm_eps), (10_000.0, 1e-6));
        assert_eq!(c.target_spec().num_hidden_layers, 2);
    }

    #[test]
    fn bad_values_name_the_key() {
        for (key, val) in [
            ("vocab_size", json!(1u64 << 40)),
            ("hidden_act", json!("gelu")),
            ("num_key_value_heads", json!(3)),
            ("model_type", json!("llama")),
            (
                "layer_types",
                json!(["full_attention", "sliding_attention"]),
            ),
            ("head_dim", json!(0)),
        ] {
            let mut v = base();
            v[key] = val;
            let e = Qwen3Config::from_value(&v, "c.json").unwrap_err();
            assert_eq!(e.code(), "bad-config", "{key}: {e}");
            assert!(
                e.to_string().contains(key) && e.to_string().contains("c.json"),
                "{e}"
            );
        }
        let mut v = base();
        v["use_sliding_window"] = json!(true);
        v["sliding_window"] = json!(16);
        v["max_window_layers"] = json!(1);
        let e = Qwen3Config::from_value(&v, "c.json").unwrap_err();
        assert!(e.to_string().contains("use_sliding_window"), "{e}");
    }
}
