//! The Qwen3-shaped DSpark drafter (DeepSpec `Qwen3DSparkModel`) in candle.
//!
//! Forward (DeepSpec semantics, f32 math): the context features are fused once,
//! `ctx = hidden_norm(fc(features))` (the context does NOT pass through a layer's
//! `input_layernorm`); every decoder layer projects `ctx` with its own `k_proj`/`v_proj` (keys
//! through `k_norm` and RoPE at the context positions) and the block queries attend
//! non-causally over `[ctx keys ; block keys]`; final `norm`; `lm_head` (own or the target's);
//! the Markov head, padded-row mask, sampling and id mapping in the kernels'
//! [`sample_block_slices`](crate::sampling::sample_block_slices); the confidence head in
//! [`confidence_slices`](crate::sampling::confidence_slices). DFlash drafters
//! (`markov_rank = 0`) run the same path with a rank-0 Markov head (no bias).

use std::path::Path;

use candle_core::{Device, Tensor};

use super::cache::DraftState;
use super::{Drafter, DrafterInfo, Proposal, ProposeOptions};
use crate::checkpoint::{Inventory, LoadPlan, WeightSource, shapes};
use crate::config::{ConfigFormat, DraftSpec, MarkovHeadType, TargetSpec};
use crate::error::Warning;
use crate::error::{Error, Result};
use crate::idmap::IdMap;
use crate::nn::decoder::{Layer, Take};
use crate::nn::weights::{SharedWeights, load_planned, shared_weight};
use crate::nn::{Linear, LoadOptions, Rope, VocabWeight, f32_of};
use crate::sampling::StsCalibration;

/// The confidence head: `sigmoid(w·[h ; e] + b)`.
#[derive(Debug, Clone)]
pub(crate) struct ConfidenceHead {
    pub(crate) weight: Vec<f32>,
    pub(crate) bias: f32,
}

/// The Markov and confidence heads as tensors on the drafter's device, kept when the drafter
/// runs the device-generic path ([`crate::device::use_tensor_path`]): the sampling kernels'
/// tensor fronts then read them where they are.
#[derive(Debug, Clone)]
pub(crate) struct DeviceHeads {
    /// `markov_w1` `[V_in, r]`.
    pub(crate) w1: Tensor,
    /// `markov_w2` `[V_d, r]`.
    pub(crate) w2: Tensor,
    /// The confidence head's weight `[H (+ r)]` and bias `[1]`, when the drafter has it.
    pub(crate) confidence: Option<(Tensor, Tensor)>,
}

pub use crate::config::STS_FILE;

/// A loaded Qwen3-shaped DSpark (or DFlash) drafter.
#[derive(Debug, Clone)]
pub struct Qwen3Drafter {
    pub(crate) spec: DraftSpec,
    pub(crate) info: DrafterInfo,
    pub(crate) id_map: IdMap,
    /// The draft id of each target id (`u32::MAX`: none), for per-request logit biases.
    pub(crate) to_draft: std::sync::Arc<Vec<u32>>,
    pub(crate) device: Device,
    /// `[V_in, H]`.
    pub(crate) embed: VocabWeight,
    pub(crate) fc: Linear,
    pub(crate) hidden_norm: Tensor,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Tensor,
    /// `[V_d, H]` as a tensor, where `head` is not the target's (borrowed: `None`).
    pub(crate) lm_head: Option<Tensor>,
    /// `lm_head` packed for the CPU kernel (see [`crate::nn::output_head`]), or the target's
    /// head ([`SharedWeights::head`]).
    pub(crate) head: Option<Linear>,
    /// `[V_in · r]` on the host (the Markov kernel reads host memory).
    pub(crate) markov_w1: Vec<f32>,
    /// `[V_d · r]` on the host.
    pub(crate) markov_w2: Vec<f32>,
    pub(crate) confidence: Option<ConfidenceHead>,
    /// The heads on the device, for the tensor path (`None` on the host fast path).
    pub(crate) device_heads: Option<DeviceHeads>,
    pub(crate) rope: Rope,
    /// The rope tables on the device, for the tensor path ([`crate::nn::rope::RopeCache`]).
    pub(crate) rope_cache: crate::nn::rope::RopeCache,
    pub(crate) warnings: Vec<Warning>,
    /// Per-position temperatures for the confidence head (`sts.json`), if any.
    pub(crate) sts: Option<StsCalibration>,
}

/// Reject configs this backend cannot run, naming the key.
fn check_supported(spec: &DraftSpec) -> Result<()> {
    let bad = |key: &str, msg: String| Err(Error::bad_config(&spec.source, key, msg));
    if spec.format == ConfigFormat::DeepSeekV4 {
        return bad(
            "architectures",
            "a DeepSeek-V4 in-checkpoint drafter is not Qwen3-shaped".into(),
        );
    }
    if spec.markov_rank > 0 && spec.markov_head_type != MarkovHeadType::Vanilla {
        return bad(
            "markov_head_type",
            format!(
                "`{}`: the candle drafter implements the vanilla Markov head only",
                spec.markov_head_type.as_str()
            ),
        );
    }
    if !matches!(spec.shape.hidden_act.as_str(), "silu" | "swish") {
        return bad(
            "hidden_act",
            format!("`{}`: the Qwen3 MLP needs silu", spec.shape.hidden_act),
        );
    }
    let (h, kv) = (
        spec.shape.num_attention_heads,
        spec.shape.num_key_value_heads,
    );
    if h == 0 || kv == 0 || !h.is_multiple_of(kv) {
        return bad(
            "num_key_value_heads",
            format!("{kv} does not divide num_attention_heads {h}"),
        );
    }
    Ok(())
}

/// How to load a [`Qwen3Drafter`] ([`Qwen3Drafter::builder`]): the target it drafts for, the
/// weights it shares with that target, the device, the weight dtypes and whether `sts.json`
/// calibrates its confidences.
#[derive(Debug, Clone)]
pub struct Qwen3DrafterBuilder<'a> {
    target: &'a TargetSpec,
    shared: SharedWeights,
    device: Device,
    options: LoadOptions,
    calibrated: bool,
}

impl Qwen3DrafterBuilder<'_> {
    /// The target's embedding and lm_head, for a checkpoint that has none of its own.
    pub fn shared(mut self, shared: SharedWeights) -> Self {
        self.shared = shared;
        self
    }

    /// The device (default: the CPU).
    pub fn device(mut self, device: &Device) -> Self {
        self.device = device.clone();
        self
    }

    /// The weight dtypes (by default each matrix keeps its checkpoint dtype and the shared
    /// weights the target's).
    pub fn options(mut self, options: LoadOptions) -> Self {
        self.options = options;
        self
    }

    /// Whether [`Qwen3DrafterBuilder::load`] reads `sts.json` next to the checkpoint (the
    /// default). Without, confidences are raw until [`Qwen3Drafter::set_sts`]: a caller that
    /// brings its own calibration, or none, never depends on that file.
    pub fn calibrated(mut self, calibrated: bool) -> Self {
        self.calibrated = calibrated;
        self
    }

    /// Load a drafter directory (`config.json` + safetensors; `sts.json` when present and
    /// [`calibrated`](Qwen3DrafterBuilder::calibrated): a file that does not fit the block is
    /// an error).
    pub fn load(self, dir: &Path) -> Result<Qwen3Drafter> {
        let spec = DraftSpec::from_path(dir)?;
        let inventory = Inventory::open(dir)?;
        let calibrated = self.calibrated;
        let mut drafter = self.from_checkpoint(spec, &inventory)?;
        let path = dir.join(STS_FILE);
        if calibrated && drafter.confidence.is_some() && path.is_file() {
            let table = StsCalibration::from_json_path(&path)?;
            let k = drafter.spec.block_size;
            if table.temperatures.len() < k {
                // The file's fault, as `inspect` reports it: name it and the ways out.
                return Err(Error::bad_config(
                    path.display().to_string(),
                    "temperatures",
                    format!(
                        "{} temperatures for a block of {k} slots (stale: rerun `dspark \
                         calibrate`, or load with sts=False or a table of your own)",
                        table.temperatures.len()
                    ),
                ));
            }
            drafter.set_sts(Some(table))?;
        }
        Ok(drafter)
    }

    /// Build from a parsed config and an opened checkpoint (never calibrated: there is no
    /// directory to read `sts.json` from). Checks the pair against the target (layers, hidden
    /// size), applies the load plan (vocabulary rules, shapes, `d2t`), takes shared weights
    /// (shape-checked; absent when needed → `missing-tensor`).
    pub fn from_checkpoint(self, spec: DraftSpec, inventory: &Inventory) -> Result<Qwen3Drafter> {
        Qwen3Drafter::build(
            spec,
            self.target,
            inventory,
            self.shared,
            &self.device,
            self.options,
        )
    }
}

impl Qwen3Drafter {
    /// Load a drafter directory (`config.json` + safetensors, `sts.json` when present) on the
    /// CPU. `shared` supplies the target's embed / lm_head where the checkpoint has none.
    /// Other devices, dtypes and calibrations: [`Qwen3Drafter::builder`].
    pub fn load(dir: &Path, target: &TargetSpec, shared: SharedWeights) -> Result<Self> {
        Self::builder(target).shared(shared).load(dir)
    }

    /// A loader for a drafter of `target` (CPU, checkpoint dtypes, calibrated by default).
    pub fn builder(target: &TargetSpec) -> Qwen3DrafterBuilder<'_> {
        Qwen3DrafterBuilder {
            target,
            shared: SharedWeights::default(),
            device: Device::Cpu,
            options: LoadOptions::default(),
            calibrated: true,
        }
    }

    /// The confidence calibration in use (loaded from `sts.json` next to the checkpoint, or
    /// set with [`Qwen3Drafter::set_sts`]).
    pub fn sts(&self) -> Option<&StsCalibration> {
        self.sts.as_ref()
    }

    /// Use `sts` for the confidence head (`None`: raw confidences). Errors
    /// (`invalid-argument`) when the table has fewer positions than the block, or the drafter
    /// has no confidence head.
    pub fn set_sts(&mut self, sts: Option<StsCalibration>) -> Result<()> {
        if let Some(t) = &sts {
            if self.confidence.is_none() {
                return Err(Error::invalid(
                    "sts",
                    "this drafter has no confidence head to calibrate",
                ));
            }
            let k = self.spec.block_size;
            if t.temperatures.len() < k {
                return Err(Error::invalid(
                    "sts",
                    format!(
                        "{} temperatures for a block of {k} slots",
                        t.temperatures.len()
                    ),
                ));
            }
        }
        self.sts = sts;
        Ok(())
    }

    fn build(
        spec: DraftSpec,
        target: &TargetSpec,
        inventory: &Inventory,
        shared: SharedWeights,
        device: &Device,
        options: LoadOptions,
    ) -> Result<Self> {
        check_supported(&spec)?;
        if let Some(q) = options.quant {
            return Err(Error::invalid(
                "dtype",
                format!(
                    "{}: a drafter's own layers stay float32, bfloat16 or float16 (quantize \
                     its target instead; the drafter borrows the target's embedding and head \
                     as they are)",
                    q.as_str()
                ),
            ));
        }
        Error::collect(spec.check_target(target))?;
        let plan = LoadPlan::build(&spec, target, inventory)?;
        let rope = Rope::new(&spec.shape.rope, spec.shape.head_dim, &spec.source)?;
        let vocab = plan.vocab;
        let h = spec.shape.hidden_size;
        let mut t = Take::new(load_planned(&plan, inventory, device, options)?);
        let embed = match shared_weight(
            shapes::EMBED,
            shared.embed.as_ref(),
            plan.embed_tokens,
            [vocab.input, vocab.input, h],
            device,
            options,
        )? {
            Some(w) => w,
            None => VocabWeight::Tensor(t.get(shapes::EMBED)?),
        };
        let lm_head = match shared_weight(
            shapes::LM_HEAD,
            shared.lm_head.as_ref(),
            plan.lm_head,
            [vocab.draft.min(vocab.target), vocab.draft, h],
            device,
            options,
        )? {
            Some(w) => w,
            None => VocabWeight::Tensor(t.get(shapes::LM_HEAD)?),
        };
        let (head, lm_head) = match borrowed_head(shared.head.as_ref(), &plan, options, device) {
            Some(head) => (Some(head.clone()), None),
            None => {
                let lm_head = lm_head.into_dense(device)?;
                (crate::nn::output_head(&lm_head)?, Some(lm_head))
            }
        };
        let bias = spec.shape.attention_bias;
        let mut layers = Vec::with_capacity(spec.shape.num_hidden_layers);
        for i in 0..spec.shape.num_hidden_layers {
            layers.push(Layer::load(&mut t, &format!("model.layers.{i}"), bias)?);
        }
        let host = |x: Tensor| -> Result<Vec<f32>> { Ok(f32_of(&x.flatten_all()?)?.to_vec1()?) };
        let (markov_w1, markov_w2) = if spec.markov_rank > 0 {
            (
                host(t.get("model.markov_head.markov_w1.weight")?)?,
                host(t.get("model.markov_head.markov_w2.weight")?)?,
            )
        } else {
            (Vec::new(), Vec::new())
        };
        let confidence = if plan.confidence_head {
            let weight = host(t.get(shapes::CONFIDENCE_WEIGHT)?)?;
            let bias = match t.take(shapes::CONFIDENCE_BIAS) {
                Some(b) => host(b)?.first().copied().unwrap_or(0.0),
                None => 0.0,
            };
            Some(ConfidenceHead { weight, bias })
        } else {
            None
        };
        let device_heads = if crate::device::use_tensor_path(device)? {
            let r = spec.markov_rank;
            let confidence = match &confidence {
                None => None,
                Some(c) => Some((
                    Tensor::from_slice(&c.weight, c.weight.len(), device)?,
                    Tensor::new(&[c.bias], device)?,
                )),
            };
            Some(DeviceHeads {
                w1: Tensor::from_slice(&markov_w1, (vocab.input, r), device)?,
                w2: Tensor::from_slice(&markov_w2, (vocab.draft, r), device)?,
                confidence,
            })
        } else {
            None
        };
        let mut warnings = spec.warnings.clone();
        warnings.extend(plan.warnings.iter().cloned());
        Ok(Self {
            fc: t.linear("model.fc", false)?,
            hidden_norm: t.get("model.hidden_norm.weight")?,
            norm: t.get("model.norm.weight")?,
            info: DrafterInfo {
                block_size: spec.block_size,
                num_draft_tokens: spec.block_size,
                noise_token: spec.noise_token.id,
                vocab,
                embed_source: plan.embed_tokens,
                lm_head_source: plan.lm_head,
                target_layer_ids: spec.target_layer_ids.clone(),
                capture_layer_ids: spec.capture_layer_ids.clone(),
                sample_from_anchor: spec.sample_from_anchor,
                has_confidence_head: confidence.is_some(),
                context_width: spec.context_width(),
            },
            id_map: plan.id_map.clone(),
            to_draft: std::sync::Arc::new(super::bias::inverse(&plan.id_map)),
            device: device.clone(),
            embed,
            layers,
            head,
            lm_head,
            markov_w1,
            markov_w2,
            confidence,
            device_heads,
            rope,
            rope_cache: crate::nn::rope::RopeCache::default(),
            warnings,
            sts: None,
            spec,
        })
    }

    /// The normalized config.
    pub fn spec(&self) -> &DraftSpec {
        &self.spec
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Non-fatal findings from the config and the load plan.
    pub fn warnings(&self) -> &[Warning] {
        &self.warnings
    }

    /// The output head as the CPU kernels multiply by it: the target's own (packed, or
    /// quantized as the target keeps it) when borrowed ([`SharedWeights::head`]); `None` where
    /// candle's product over `lm_head` runs.
    pub fn head(&self) -> Option<&Linear> {
        self.head.as_ref()
    }

    /// Markov rank `r` (0 = DFlash).
    pub fn markov_rank(&self) -> usize {
        self.spec.markov_rank
    }

    /// Run a pass on a pool worker on the host fast path ([`crate::threads::on_pool`]), as the
    /// native target's forward does: one handoff per pass, and its weight-streaming products
    /// split over the pool inside a speculative round too (from a thread outside the pool they
    /// would run on that one core). Elsewhere (the tensor path) `f` runs here.
    fn on_host_pool<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        if crate::device::fast_on(&self.device) {
            crate::threads::on_pool(f)
        } else {
            f()
        }
    }
}

impl Drafter for Qwen3Drafter {
    type State = DraftState;

    fn info(&self) -> &DrafterInfo {
        &self.info
    }

    fn id_map(&self) -> &IdMap {
        &self.id_map
    }

    fn new_state(&self) -> Result<DraftState> {
        Ok(DraftState::new(self.layers.len()))
    }

    fn truncate(&self, state: &mut DraftState, len: usize) -> Result<()> {
        state.truncate(len)
    }

    fn state_end(&self, state: &DraftState) -> usize {
        state.end()
    }

    fn extend(
        &self,
        state: &mut DraftState,
        features: &Tensor,
        start_position: usize,
    ) -> Result<()> {
        self.on_host_pool(|| self.extend_state(state, features, start_position))
    }

    fn propose_cached(
        &self,
        states: &[&DraftState],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        Ok(self
            .on_host_pool(|| self.propose_states_kept(states, anchors, opts, false))?
            .0)
    }

    fn propose_for_verify(
        &self,
        states: &[&DraftState],
        anchors: &[u32],
        opts: &ProposeOptions,
    ) -> Result<(Proposal, Option<Tensor>)> {
        self.on_host_pool(|| self.propose_states_kept(states, anchors, opts, true))
    }

    fn propose_cost(&self) -> Result<Option<crate::models::ForwardCost>> {
        Ok(Some(self.block_cost()))
    }

    /// Stateless drafting. On the device-generic path every request's context and block go
    /// through one batched pass ([`super::batched`]); on the host fast path a state per
    /// request, as the default.
    fn propose(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<Proposal> {
        let (mut p, kept) = self.propose_kept(context, anchors, start_positions, opts)?;
        if let Some(logits) = kept {
            p.draft_logits = crate::trace::download_f32(&logits)?;
        }
        Ok(p)
    }
}

impl Qwen3Drafter {
    /// [`Drafter::propose`] for a caller that keeps working on the drafter's device: there the
    /// draft logits stay on the device, returned as `Some([B, K, V_t])` beside a proposal whose
    /// `draft_logits` is empty (tokens and confidences come to the host). On the host fast
    /// path, the host proposal and `None`. `context` may already be on the drafter's device
    /// (no copy is made then); on another accelerator it is `device-mismatch`.
    pub fn propose_kept(
        &self,
        context: &Tensor,
        anchors: &[u32],
        start_positions: &[usize],
        opts: &ProposeOptions,
    ) -> Result<(Proposal, Option<Tensor>)> {
        crate::device::kernel_path()?;
        if !context.device().is_cpu() {
            // A host context is uploaded; one on another accelerator is a mismatch.
            crate::device::same_device(&self.device, &[("context_hidden_states", context)])?;
        }
        if self.device_heads.is_some() {
            return self.propose_stateless_batched(context, anchors, start_positions, opts);
        }
        let p = super::propose_through_states(self, context, anchors, start_positions, opts)?;
        Ok((p, None))
    }
}

/// The target's output head ([`SharedWeights::head`], packed or quantized as the target keeps
/// it), when the drafter takes `lm_head` from the target, drafts over all of its `V_t` rows (a
/// padded draft vocabulary's further rows are zeros: their logits are padded with 0, see
/// `base_logits`), its options keep the target's dtype and the host kernels run on `device`.
fn borrowed_head<'a>(
    target_head: Option<&'a Linear>,
    plan: &LoadPlan,
    options: LoadOptions,
    device: &Device,
) -> Option<&'a Linear> {
    target_head.filter(|h| {
        plan.lm_head != WeightSource::Own
            && h.out_dim() == plan.vocab.target
            && plan.vocab.target <= plan.vocab.draft
            && options
                .dtype
                .is_none_or(|d| h.quant().is_none() && d == h.weight_dtype())
            && crate::device::fast_on(device)
    })
}
