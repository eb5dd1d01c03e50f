//! Reading the rotary position embedding parameters of the draft layers.
//!
//! Accepted spellings, first hit wins per field:
//! * `rope_parameters.full_attention.{rope_theta, rope_type, partial_rotary_factor, factor,
//!   original_max_position_embeddings}` (Gemma4: draft layers are full-attention layers);
//! * `rope_parameters.{...}` (transformers ≥ 5);
//! * top-level `rope_theta` / `partial_rotary_factor`;
//! * legacy `rope_scaling.{rope_type | type, factor, original_max_position_embeddings}`.
//!
//! Defaults: theta 10000, type `"default"`, partial factor 1.0, `is_neox_style` true.

use super::fields::Fields;
use super::shape::RopeSpec;
use crate::error::Result;

/// Read the draft RoPE parameters from the backbone `fields`.
pub fn read_rope(backbone: &Fields<'_>) -> Result<RopeSpec> {
    let params = backbone.object("rope_parameters")?;
    let full = match &params {
        Some(p) => p.object("full_attention")?,
        None => None,
    };
    let scaling = backbone.object("rope_scaling")?;
    // Scopes in priority order for the per-field lookups below.
    let mut scopes: Vec<&Fields<'_>> = Vec::new();
    scopes.extend(full.as_ref());
    scopes.extend(params.as_ref());
    let mut with_top = scopes.clone();
    with_top.push(backbone);
    let mut with_scaling = scopes.clone();
    with_scaling.extend(scaling.as_ref());

    let theta = checked_float(backbone, &with_top, "rope_theta", Must::BePositive)?;
    let theta = theta.unwrap_or(10_000.0);
    let partial = checked_float(backbone, &with_top, "partial_rotary_factor", Must::BeInUnit)?;
    let mut rope_type = None;
    for f in scopes.iter().copied().chain(scaling.as_ref()) {
        if let Some(t) = f.string("rope_type")? {
            rope_type = Some(t);
            break;
        }
    }
    if let (None, Some(s)) = (rope_type, &scaling) {
        rope_type = s.string("type")?;
    }
    let factor = checked_float(backbone, &with_scaling, "factor", Must::BePositive)?;
    let mut original = None;
    for f in scopes.iter().copied().chain(scaling.as_ref()) {
        if let Some(n) = f.positive("original_max_position_embeddings")? {
            original = Some(n);
            break;
        }
    }
    Ok(RopeSpec {
        theta,
        rope_type: rope_type.unwrap_or("default").to_string(),
        partial_rotary_factor: partial.unwrap_or(1.0),
        factor,
        original_max_position_embeddings: original,
        neox_style: backbone.boolean("is_neox_style")?.unwrap_or(true),
    })
}

/// What a RoPE float must be.
#[derive(Clone, Copy)]
enum Must {
    /// Greater than 0.
    BePositive,
    /// In (0, 1].
    BeInUnit,
}

impl Must {
    fn refuses(self, x: f64) -> bool {
        match self {
            Must::BePositive => x <= 0.0,
            Must::BeInUnit => !(x > 0.0 && x <= 1.0),
        }
    }

    fn says(self) -> &'static str {
        match self {
            Must::BePositive => "must be greater than 0",
            Must::BeInUnit => "must be in (0, 1]",
        }
    }
}

/// The first `key` among `scopes` as a float; one that `must` refuses is `bad-config` naming
/// where it was found.
fn checked_float(
    backbone: &Fields<'_>,
    scopes: &[&Fields<'_>],
    key: &str,
    must: Must,
) -> Result<Option<f64>> {
    let value = first_float(scopes.iter().copied(), key)?;
    if let Some(x) = value.filter(|&x| must.refuses(x)) {
        let name = first_name(scopes.iter().copied(), key);
        return Err(backbone.bad(&name, format!("{}, found {x}", must.says())));
    }
    Ok(value)
}

fn first_float<'f, 'a: 'f>(
    scopes: impl Iterator<Item = &'f Fields<'a>>,
    key: &str,
) -> Result<Option<f64>> {
    for f in scopes {
        if let Some(x) = f.float(key)? {
            return Ok(Some(x));
        }
    }
    Ok(None)
}

fn first_name<'f, 'a: 'f>(mut scopes: impl Iterator<Item = &'f Fields<'a>>, key: &str) -> String {
    scopes
        .find(|f| f.has(key))
        .map_or_else(|| key.to_string(), |f| f.name_of(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn rope(v: Value) -> Result<RopeSpec> {
        let obj = v.as_object().unwrap().clone();
        let leaked: &'static serde_json::Map<String, Value> = Box::leak(Box::new(obj));
        read_rope(&Fields::new("d.json", leaked, ""))
    }

    #[test]
    fn defaults() {
        let r = rope(json!({})).unwrap();
        assert_eq!(r.theta, 10_000.0);
        assert_eq!(r.rope_type, "default");
        assert_eq!(r.partial_rotary_factor, 1.0);
        assert!(r.neox_style && r.factor.is_none() && r.original_max_position_embeddings.is_none());
    }

    #[test]
    fn gemma4_full_attention_wins_over_outer_and_sliding() {
        let r = rope(json!({"rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
            "rope_theta": null, "rope_type": "default",
            "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}}))
        .unwrap();
        assert_eq!((r.theta, r.partial_rotary_factor), (1e6, 0.25));
        assert_eq!(r.rope_type, "proportional");
    }

    #[test]
    fn legacy_rope_scaling_and_top_level_theta() {
        let r = rope(
            json!({"rope_theta": 10000, "is_neox_style": false, "rope_scaling":
            {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536}}),
        )
        .unwrap();
        assert_eq!(r.theta, 10_000.0);
        assert_eq!(r.rope_type, "yarn");
        assert_eq!(r.factor, Some(16.0));
        assert_eq!(r.original_max_position_embeddings, Some(65536));
        assert!(!r.neox_style);
    }

    #[test]
    fn bad_values_name_the_nested_key() {
        let e = rope(json!({"rope_parameters": {"rope_theta": "1e6"}})).unwrap_err();
        assert!(
            e.to_string().contains("`rope_parameters.rope_theta`"),
            "{e}"
        );
        let e =
            rope(json!({"rope_parameters": {"full_attention": {"partial_rotary_factor": 1.5}}}))
                .unwrap_err();
        assert!(
            e.to_string()
                .contains("`rope_parameters.full_attention.partial_rotary_factor`"),
            "{e}"
        );
        let e = rope(json!({"rope_theta": -1.0})).unwrap_err();
        assert!(e.to_string().contains("`rope_theta`"), "{e}");
        let e = rope(json!({"is_neox_style": 1})).unwrap_err();
        assert!(e.to_string().contains("`is_neox_style`"), "{e}");
        let e = rope(json!({"rope_parameters": [1]})).unwrap_err();
        assert!(e.to_string().contains("`rope_parameters`"), "{e}");
    }
}
