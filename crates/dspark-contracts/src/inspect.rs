//! `dspark inspect`: will this drafter load against this target, and how.
//!
//! [`inspect`] never fails: it runs every check it can (config, target fit, checkpoint headers,
//! load plan) and lists all problems in the report. The report's JSON form is stable (see the
//! README); the CLI and the Python API both print it.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::checkpoint::{Inventory, LoadPlan, WeightSource};
use crate::config::{ConfigFormat, DraftSpec, STS_FILE, StsCalibration, TargetSpec};
use crate::error::Warning;
use crate::error::{Error, Result};
use crate::vocab::VocabLayout;

/// The outcome of inspecting a drafter against a target.
#[derive(Debug)]
pub struct Report {
    /// The normalized drafter, when its config parsed.
    pub spec: Option<DraftSpec>,
    /// The target, when its config parsed.
    pub target: Option<TargetSpec>,
    /// The load plan, when the checkpoint passed every rule.
    pub plan: Option<LoadPlan>,
    /// Every problem found (empty when the drafter will load).
    pub errors: Vec<Error>,
    /// Non-fatal findings.
    pub warnings: Vec<Warning>,
    /// The confidence calibration (`sts.json` next to the checkpoint), when present and valid.
    pub calibration: Option<StsCalibration>,
}

impl Report {
    /// `true` when the drafter will load.
    pub fn ok(&self) -> bool {
        self.errors.is_empty() && self.plan.is_some()
    }

    /// The stable JSON form.
    pub fn to_json(&self) -> Value {
        let spec = self.spec.as_ref();
        let target_vocab = self.target.as_ref().map(|t| t.vocab_size);
        let vocab = spec.zip(target_vocab).map(|(s, vt)| s.vocab(vt));
        let problems = |list: Vec<(&str, String)>| -> Value {
            list.into_iter()
                .map(|(code, message)| json!({"code": code, "message": message}))
                .collect()
        };
        json!({
            "ok": self.ok(),
            "draft": spec.map(|s| json!({
                "format": s.format.as_str(),
                "architecture": s.architecture,
                "block_size": s.block_size,
                "markov_rank": s.markov_rank,
                "confidence_head": self.plan.as_ref().map_or(s.confidence_head, |p| p.confidence_head),
            })),
            "vocab": vocab.map(|v| json!({
                "input": v.input,
                "draft": v.draft,
                "target": v.target,
                "layout": v.layout().as_str(),
                "expanded_input": v.expanded_input(),
            })),
            "id_map": match (&self.plan, vocab) {
                (Some(plan), _) => Some(plan.id_map.kind_str()),
                (None, Some(v)) => Some(if v.layout() == VocabLayout::Reduced { "offset-table" } else { "identity" }),
                (None, None) => None,
            },
            "noise_token": spec.map(|s| json!({"id": s.noise_token.id, "source": s.noise_token.source.key()})),
            "target_layer_ids": spec.map(|s| s.target_layer_ids.clone()),
            "capture_layer_ids": spec.map(|s| s.capture_layer_ids.clone()),
            "shares_target": self.plan.as_ref().map(|p| json!({
                "embed_tokens": p.embed_tokens == WeightSource::SharedTarget,
                "lm_head": p.lm_head == WeightSource::SharedTarget,
            })),
            "calibration": self.calibration.as_ref().map(|c| json!({
                "file": STS_FILE,
                "method": "sts",
                "temperatures": c.temperatures,
            })),
            "errors": problems(self.errors.iter().flat_map(Error::problems).map(|e| (e.code(), e.to_string())).collect()),
            "warnings": problems(self.warnings.iter().map(|w| (w.code, w.message.clone())).collect()),
        })
    }
}

/// Where a drafter's checkpoint lives: its directory (or the directory of its `config.json`).
fn checkpoint_dir(draft: &Path) -> PathBuf {
    if draft.is_dir() {
        draft.to_path_buf()
    } else {
        draft
            .parent()
            .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    }
}

/// Inspect the drafter at `draft` (a directory or its `config.json`) against the target config at
/// `target` (a directory with `config.json`, or the file). With `target = None` the drafter's own
/// config is the target's (DeepSeek-V4 drafters live inside their target checkpoint).
pub fn inspect(draft: &Path, target: Option<&Path>) -> Report {
    inspect_with(draft, target, &InspectOptions::default())
}

/// What [`inspect_with`] reads besides the configs and the checkpoint headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InspectOptions {
    /// Read and check the calibration (`sts.json` next to the checkpoint), as a default load
    /// does. Off for a caller that loads without it (its own table, none, or one it will
    /// rewrite): the file then neither fails the report nor appears in it.
    pub calibration: bool,
}

impl Default for InspectOptions {
    fn default() -> Self {
        Self { calibration: true }
    }
}

/// [`inspect`] with [`InspectOptions`].
pub fn inspect_with(draft: &Path, target: Option<&Path>, options: &InspectOptions) -> Report {
    let target = target.map(TargetSpec::from_path);
    inspect_with_target(draft, target, options)
}

/// [`inspect_with`] against a target whose spec the caller read (`None`: none given, the
/// drafter's own config stands for it; `Some(Err)`: the error reading it, reported).
pub fn inspect_with_target(
    draft: &Path,
    target: Option<Result<TargetSpec>>,
    options: &InspectOptions,
) -> Report {
    let mut report = Report {
        spec: None,
        target: None,
        plan: None,
        errors: Vec::new(),
        warnings: Vec::new(),
        calibration: None,
    };
    match DraftSpec::from_path(draft) {
        Ok(spec) => report.spec = Some(spec),
        Err(e) => report.errors.push(e),
    }
    let given = target.is_some();
    match target.unwrap_or_else(|| TargetSpec::from_path(draft)) {
        Ok(t) => report.target = Some(t),
        Err(e) => {
            // A DeepSeek-V4 drafter is its own target: the same file, so the same error twice helps nobody.
            let dsv4 = report
                .spec
                .as_ref()
                .is_some_and(|s| s.format == ConfigFormat::DeepSeekV4);
            if !(dsv4 && !given && !report.errors.is_empty()) {
                report.errors.push(e);
            }
        }
    }
    if !given
        && report
            .spec
            .as_ref()
            .is_some_and(|s| s.format != ConfigFormat::DeepSeekV4)
    {
        report.warnings.push(Warning::new(
            "no-target",
            "no target config given: the drafter's own config was used as the target's",
        ));
    }
    let (Some(spec), Some(target_spec)) = (&report.spec, &report.target) else {
        return report;
    };
    report.warnings.extend(spec.warnings.iter().cloned());
    report.errors.extend(spec.check_target(target_spec));
    let sts = checkpoint_dir(draft).join(STS_FILE);
    if options.calibration && sts.is_file() {
        match StsCalibration::from_json_path(&sts) {
            Ok(c) if c.temperatures.len() < spec.block_size => {
                report.errors.push(Error::bad_config(
                    sts.display().to_string(),
                    "temperatures",
                    format!(
                        "{} temperatures for a block of {} slots",
                        c.temperatures.len(),
                        spec.block_size
                    ),
                ))
            }
            Ok(c) => report.calibration = Some(c),
            Err(e) => report.errors.push(e),
        }
    }
    match Inventory::open(&checkpoint_dir(draft)) {
        Ok(inventory) => match LoadPlan::build(spec, target_spec, &inventory) {
            Ok(plan) => {
                report.warnings.extend(plan.warnings.iter().cloned());
                report.plan = Some(plan);
            }
            Err(e) => report.errors.push(e),
        },
        Err(e) => report.errors.push(e),
    }
    report
}
