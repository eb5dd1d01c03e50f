//! The one resolver between DeepSpec and capture semantics for target layer ids.
//!
//! * **DeepSpec semantics** ("output of"): id `i` is the output of target decoder layer `i`,
//!   i.e. Hugging Face `hidden_states[i + 1]`; `-1` is the embedding output.
//! * **Capture semantics** ("input of", vLLM / llama.cpp): id `j` is the input of layer `j`.
//!
//! They relate by `capture = deepspec + 1`. [`DraftSpec`] stores both.
//!
//! Validation: a non-empty array of integers (never booleans), strictly increasing, DeepSpec
//! ids `>= -1` (capture ids `>= 0`), and, once the number of target layers `n` is known,
//! DeepSpec ids `< n`. Formats whose ids are written in DeepSpec semantics (DeepSpec native
//! and `dflash_config`) additionally may not use the final layer `n - 1`: HF's last
//! `hidden_states` entry is post-norm, which the drafter was not trained on. Capture-semantics
//! formats and DeepSeek-V4 (whose drafter legitimately reads the last target layer, e.g.
//! `[40, 41, 42]` of 43) are exempt.

use serde_json::Value;

use super::fields::describe;
use super::spec::{ConfigFormat, DraftSpec};
use super::target::TargetSpec;
use crate::error::{Error, Result};
use crate::limits::MAX_LAYERS;

/// How the layer ids in a config are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerIdSemantics {
    /// Id `i` = output of layer `i` (DeepSpec); `-1` = embeddings.
    OutputOf,
    /// Id `j` = input of layer `j` (vLLM `aux_hidden_state_layer_ids`, llama.cpp).
    InputOf,
}

/// Target layer ids resolved into both semantics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetLayers {
    /// DeepSpec semantics (output of layer `i`).
    pub target_layer_ids: Vec<i64>,
    /// Capture semantics (input of layer `j = i + 1`).
    pub capture_layer_ids: Vec<usize>,
}

/// The capture id (input of layer `j`) of DeepSpec id `i` (output of layer `i`): `i + 1`.
/// `None` for ids below `-1`.
pub fn capture_of(deepspec_id: i64) -> Option<usize> {
    deepspec_id
        .checked_add(1)
        .and_then(|c| usize::try_from(c).ok())
}

/// The DeepSpec id (output of layer `i`) of capture id `j`: `j - 1`.
pub fn deepspec_of(capture_id: usize) -> i64 {
    i64::try_from(capture_id).map_or(i64::MAX, |c| c - 1)
}

/// `true` when `format` writes its ids in DeepSpec semantics and therefore may not name the
/// final target layer (see the module docs).
pub fn forbids_final_layer(format: ConfigFormat) -> bool {
    matches!(format, ConfigFormat::DeepSpec | ConfigFormat::DFlash)
}

/// Parse and validate the layer-id list `value` found at `key`, written in `semantics`.
///
/// `num_target_layers`, when known, bounds the ids (and with `forbid_final` excludes the
/// final layer). Errors are `bad-config` naming `file` and `key`.
pub fn resolve_target_layers(
    value: &Value,
    semantics: LayerIdSemantics,
    num_target_layers: Option<usize>,
    forbid_final: bool,
    file: &str,
    key: &str,
) -> Result<TargetLayers> {
    let bad = |message: String| Error::bad_config(file, key, message);
    let items = value.as_array().ok_or_else(|| {
        bad(format!(
            "expected a list of layer ids, found {}",
            describe(value)
        ))
    })?;
    if items.is_empty() {
        return Err(bad("must name at least one target layer".into()));
    }
    let mut raw = Vec::with_capacity(items.len());
    for (pos, item) in items.iter().enumerate() {
        let id = super::fields::as_int(item).ok_or_else(|| {
            bad(format!(
                "entry {pos} must be an integer, found {}",
                describe(item)
            ))
        })?;
        raw.push(id);
    }
    if let Some(w) = raw.windows(2).find(|w| w[0] >= w[1]) {
        return Err(bad(format!(
            "layer ids must be strictly increasing, found {} before {} in {raw:?}",
            w[0], w[1]
        )));
    }
    let target_layer_ids: Vec<i64> = match semantics {
        LayerIdSemantics::OutputOf => raw.clone(),
        LayerIdSemantics::InputOf => raw.iter().map(|&j| j.saturating_sub(1)).collect(),
    };
    let floor = match semantics {
        LayerIdSemantics::OutputOf => -1,
        LayerIdSemantics::InputOf => 0,
    };
    if let Some(&low) = raw.first().filter(|&&first| first < floor) {
        return Err(bad(format!(
            "layer id {low} is below {floor} (the embedding output)"
        )));
    }
    // Ids past any real target are refused even when the layer count is unknown: they size
    // the fused context (`L · H_t`) and name tensors.
    let ceiling = i64::try_from(MAX_LAYERS).unwrap_or(i64::MAX);
    if let Some(&high) = raw.last().filter(|&&last| last >= ceiling) {
        return Err(bad(format!(
            "layer id {high} is above the supported limit of {} layers",
            MAX_LAYERS
        )));
    }
    if let Some(n) = num_target_layers {
        check_range(&target_layer_ids, n, forbid_final).map_err(bad)?;
    }
    let capture_layer_ids = target_layer_ids
        .iter()
        .filter_map(|&i| capture_of(i))
        .collect();
    Ok(TargetLayers {
        target_layer_ids,
        capture_layer_ids,
    })
}

/// Check DeepSpec-semantics ids against a target of `n` layers: every id `< n`, and with
/// `forbid_final` none equal to `n - 1`. The message names the ids in both semantics.
pub fn check_range(ids: &[i64], n: usize, forbid_final: bool) -> std::result::Result<(), String> {
    let n_i = i64::try_from(n).unwrap_or(i64::MAX);
    if let Some(&bad) = ids.iter().find(|&&i| i >= n_i) {
        return Err(format!(
            "target layer id {bad} (capture id {}) does not exist: the target has {n} layers \
             (DeepSpec ids -1..={})",
            bad.saturating_add(1),
            n_i - 1
        ));
    }
    if forbid_final && ids.contains(&(n_i - 1)) {
        return Err(format!(
            "target layer id {} is the final layer of a {n}-layer target: its HF hidden state \
             is post-norm and cannot feed a drafter (use at most {})",
            n_i - 1,
            n_i - 2
        ));
    }
    Ok(())
}

impl DraftSpec {
    /// Check this drafter against its target: layer ids within the target's
    /// `num_hidden_layers` (with the final-layer rule for DeepSpec-semantics formats),
    /// `num_target_layers` equal to the target's layer count, and `target_hidden_size` equal to
    /// the target's `hidden_size`. Returns every problem found (empty when the pair fits).
    pub fn check_target(&self, target: &TargetSpec) -> Vec<Error> {
        let mut problems = Vec::new();
        let mismatch = |message: String| Error::TargetMismatch { message };
        if let Err(why) = check_range(
            &self.target_layer_ids,
            target.num_hidden_layers,
            forbids_final_layer(self.format),
        ) {
            problems.push(mismatch(format!(
                "{}: target_layer_ids {:?} vs target {}: {why}",
                self.source, self.target_layer_ids, target.source
            )));
        }
        if let Some(n) = self
            .num_target_layers
            .filter(|&n| n != target.num_hidden_layers)
        {
            problems.push(mismatch(format!(
                "{}: the drafter was trained on a {n}-layer target (num_target_layers), but {} \
                 has num_hidden_layers = {}",
                self.source, target.source, target.num_hidden_layers
            )));
        }
        if self.target_hidden_size != target.hidden_size {
            problems.push(mismatch(format!(
                "{}: the drafter fuses target features of width {} (target_hidden_size), but {} \
                 has hidden_size = {}",
                self.source, self.target_hidden_size, target.source, target.hidden_size
            )));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn resolve(
        v: Value,
        sem: LayerIdSemantics,
        n: Option<usize>,
        ff: bool,
    ) -> Result<TargetLayers> {
        resolve_target_layers(&v, sem, n, ff, "d.json", "ids")
    }

    #[test]
    fn semantics_round_trip() {
        for i in -1..50 {
            let c = capture_of(i).unwrap();
            assert_eq!(c as i64, i + 1);
            assert_eq!(deepspec_of(c), i);
        }
        assert_eq!(capture_of(-2), None);
    }

    #[test]
    fn output_and_input_semantics() {
        let out = resolve(
            json!([-1, 1, 9]),
            LayerIdSemantics::OutputOf,
            Some(36),
            true,
        )
        .unwrap();
        assert_eq!(out.target_layer_ids, [-1, 1, 9]);
        assert_eq!(out.capture_layer_ids, [0, 2, 10]);
        let inp = resolve(
            json!([0, 2, 10]),
            LayerIdSemantics::InputOf,
            Some(36),
            false,
        )
        .unwrap();
        assert_eq!(inp.target_layer_ids, [-1, 1, 9]);
        assert_eq!(inp.capture_layer_ids, [0, 2, 10]);
    }

    #[test]
    fn final_layer_rule_only_when_asked() {
        let e = resolve(json!([1, 35]), LayerIdSemantics::OutputOf, Some(36), true).unwrap_err();
        assert!(e.to_string().contains("final layer"), "{e}");
        assert!(resolve(json!([1, 35]), LayerIdSemantics::OutputOf, Some(36), false).is_ok());
        assert!(resolve(json!([1, 34]), LayerIdSemantics::OutputOf, Some(36), true).is_ok());
        let e = resolve(json!([1, 36]), LayerIdSemantics::OutputOf, Some(36), false).unwrap_err();
        assert!(e.to_string().contains("does not exist"), "{e}");
        // Capture id n = output of the last layer (pre-norm): allowed; n + 1 is not.
        assert!(resolve(json!([36]), LayerIdSemantics::InputOf, Some(36), false).is_ok());
        assert!(resolve(json!([37]), LayerIdSemantics::InputOf, Some(36), false).is_err());
    }

    #[test]
    fn malformed_lists() {
        for (v, needle) in [
            (json!([]), "at least one"),
            (json!("1,2"), "list of layer ids"),
            (json!([1, true]), "entry 1"),
            (json!([1, 2.5]), "entry 1"),
            (json!([1, "2"]), "entry 1"),
            (json!([3, 3]), "strictly increasing"),
            (json!([4, 2]), "strictly increasing"),
            (json!([-2, 1]), "below -1"),
        ] {
            let e = resolve(v, LayerIdSemantics::OutputOf, None, true).unwrap_err();
            assert_eq!(e.code(), "bad-config");
            assert!(
                e.to_string().contains(needle) && e.to_string().contains("`ids`"),
                "{e}"
            );
        }
        let e = resolve(json!([-1, 2]), LayerIdSemantics::InputOf, None, false).unwrap_err();
        assert!(e.to_string().contains("below 0"), "{e}");
    }
}
