//! [`Engine`]: construction, the request API (add, abort) and what it reports. The step itself
//! is in `step.rs`, admission and preemption in `scheduler/`, a round in `round/`.

use super::config::EngineConfig;
use super::metrics::EngineMetrics;
use super::request::{RequestId, RequestSpec};
use super::scheduler::{AbortHandle, Compaction, Scheduler};
use crate::drafter::Drafter;
use crate::error::{Error, Result};
use crate::limits::MAX_POSITION;
use crate::models::TargetModel;
use crate::policy::{Planner, StepsPerSecond, VerifyPolicy};

/// The step-level serving engine: requests are added with their own prompt, sampling, seed,
/// stop ids, budget and speculation limit; each [`Engine::step`] runs one round over every
/// running request (a joining request's prefill rides the same forward where the target is
/// ragged); requests finish (stop, length) or are aborted between rounds; a KV budget admits
/// requests and preempts the newest running one, which later resumes by re-prefilling what it
/// committed (its position-keyed draws make it continue exactly as if never preempted).
///
/// It composes three rooms: the [`Scheduler`] (which requests run), the round (`round/`:
/// plan, forward, verify, commit) and the [`Planner`] (whether a round drafts and how much
/// it verifies, from what the rounds measured).
pub struct Engine<T: TargetModel, D: Drafter> {
    pub(super) target: T,
    pub(super) drafter: D,
    pub(super) config: EngineConfig,
    /// Drafts verified per round at most (the engine's limit).
    pub(super) num_speculative: usize,
    pub(super) cache: Option<T::Cache>,
    pub(super) sched: Scheduler<D::State>,
    pub(super) planner: Planner,
    pub(super) metrics: EngineMetrics,
}

fn mismatch(message: String) -> Error {
    Error::TargetMismatch { message }
}

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// An engine over `target` and `drafter`. Checks the pair (capture layers, feature
    /// width, vocabulary), the options and that the target can add and drop cache rows
    /// (continuous batching needs it: a target that cannot is an error here, not mid-serve).
    /// Errors: `target-mismatch`, `invalid-argument`, `bad-config` (a confidence policy for a
    /// drafter without a confidence head).
    pub fn new(target: T, drafter: D, config: EngineConfig) -> Result<Self> {
        if !target.resizable() {
            return Err(Error::invalid(
                "target",
                "the target cannot add or drop cache rows (TargetModel::grow / retain): \
                 continuous batching needs both",
            ));
        }
        Self::build(target, drafter, config, true)
    }

    /// An engine that runs static batches when the target cannot resize its cache: requests
    /// admitted together run until all of them finish before others join (the batch API).
    pub(crate) fn new_any(target: T, drafter: D, config: EngineConfig) -> Result<Self> {
        let continuous = target.resizable();
        Self::build(target, drafter, config, continuous)
    }

    fn build(target: T, drafter: D, config: EngineConfig, continuous: bool) -> Result<Self> {
        let layers = target.num_hidden_layers();
        for &c in drafter.info().capture_layer_ids.as_slice() {
            if c >= layers {
                return Err(mismatch(format!(
                    "drafter target layer id {} (capture id {c}) does not fit a {layers}-layer \
                     target (DeepSpec ids -1..={})",
                    c as i64 - 1,
                    layers as i64 - 2
                )));
            }
        }
        let width = drafter.info().capture_layer_ids.as_slice().len() * target.hidden_size();
        if drafter.info().context_width != width {
            return Err(mismatch(format!(
                "drafter fuses context features of width {}, the target gives {} layers × \
                 hidden_size {} = {width}",
                drafter.info().context_width,
                drafter.info().capture_layer_ids.as_slice().len(),
                target.hidden_size()
            )));
        }
        if drafter.info().vocab.target != target.vocab_size() {
            return Err(mismatch(format!(
                "drafter target vocab {} != target vocab {}",
                drafter.info().vocab.target,
                target.vocab_size()
            )));
        }
        let k = drafter.info().num_draft_tokens;
        let n = config.num_speculative_tokens.unwrap_or(k);
        if n > k {
            return Err(Error::invalid(
                "num_speculative_tokens",
                format!("{n}: must be in [0, {k}] (the drafter's block)"),
            ));
        }
        match &config.verify {
            VerifyPolicy::Full => {}
            VerifyPolicy::Threshold(t) if !(0.0..=1.0).contains(t) => {
                return Err(Error::invalid(
                    "verify",
                    format!("threshold {t}: must be in [0, 1]"),
                ));
            }
            // The default policy runs without confidences: it verifies whole blocks and
            // chooses between drafted and plain rounds from the measured acceptance.
            VerifyPolicy::ScheduledMeasured => {}
            policy if !drafter.info().has_confidence_head => {
                return Err(Error::bad_config(
                    "<drafter>",
                    "enable_confidence_head",
                    format!("verify={} needs a confidence head", policy.name()),
                ));
            }
            _ => {}
        }
        let b = config.budget;
        for (name, v) in [
            ("budget.max_running", b.max_running),
            ("budget.max_batched_tokens", b.max_batched_tokens),
            ("budget.kv_tokens", b.kv_tokens.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(Error::invalid(name, "0: must be at least 1"));
            }
        }
        let metrics = EngineMetrics {
            kv_tokens_capacity: b.kv_tokens,
            ..EngineMetrics::default()
        };
        Ok(Self {
            sched: Scheduler::new(b, continuous, n),
            planner: Planner::new(config.verify.clone(), n, drafter.info().has_confidence_head)
                .with_drafter_cost(
                    drafter.propose_cost()?,
                    drafter.info().block_size,
                    !target.device().is_cpu(),
                ),
            target,
            drafter,
            config,
            num_speculative: n,
            cache: None,
            metrics,
        })
    }

    /// Queue a request; it joins the running batch at a step when the budget has room.
    ///
    /// Errors (naming the field): `invalid-argument` (an empty prompt, sampling values out of
    /// range, `max_drafts` above the drafter's block), `token-out-of-range` (prompt or stop
    /// ids outside the target vocabulary), `too-large` (prompt plus budget past the largest
    /// position, a prompt longer than `max_batched_tokens`, or a request that could never fit
    /// `kv_tokens` even alone).
    pub fn add_request(&mut self, spec: RequestSpec) -> Result<RequestId> {
        let what = format!("request {}", self.sched.next_id());
        self.check_request(&spec, &what)?;
        let mut spec = spec;
        spec.penalties = std::mem::take(&mut spec.penalties).sorted();
        let id = self.sched.add(spec)?;
        self.metrics.requests_added += 1;
        Ok(id)
    }

    /// The checks of [`Engine::add_request`], errors naming `what` (e.g. `request 3`).
    pub(crate) fn check_request(&self, spec: &RequestSpec, what: &str) -> Result<()> {
        let vocab = self.target.vocab_size();
        if spec.prompt.is_empty() {
            return Err(Error::invalid(
                format!("{what}.prompt"),
                "empty: a prompt needs at least one token",
            ));
        }
        for (field, ids) in [
            ("prompt", &spec.prompt),
            ("stop_token_ids", &spec.stop_token_ids),
        ] {
            if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::TokenOutOfRange {
                    name: format!("{what}.{field}"),
                    id: i64::from(t),
                    vocab_size: vocab,
                });
            }
        }
        spec.sampling.check(what)?;
        spec.penalties.check(what, vocab)?;
        if let Some(n) = spec
            .logprobs
            .filter(|&n| n > crate::sampling::MAX_TOP_LOGPROBS)
        {
            return Err(Error::invalid(
                format!("{what}.logprobs"),
                format!(
                    "{n}: at most {} alternatives",
                    crate::sampling::MAX_TOP_LOGPROBS
                ),
            ));
        }
        let block = self.drafter.info().num_draft_tokens;
        if let Some(m) = spec.max_drafts.filter(|&m| m > block) {
            return Err(Error::invalid(
                format!("{what}.max_drafts"),
                format!("{m}: must be in [0, {block}] (the drafter's block)"),
            ));
        }
        let end = spec.prompt.len() as u128 + spec.max_new_tokens as u128;
        if end > u128::from(MAX_POSITION) {
            return Err(Error::too_large(
                format!("{what}: prompt + max_new_tokens"),
                end,
                MAX_POSITION,
                " positions",
            ));
        }
        let budget = self.config.budget;
        if spec.prompt.len() > budget.max_batched_tokens {
            return Err(Error::too_large(
                format!("{what}.prompt (budget.max_batched_tokens)"),
                spec.prompt.len() as u128,
                budget.max_batched_tokens as u64,
                " tokens",
            ));
        }
        if let Some(cap) = budget.kv_tokens {
            // At most: the prompt and every committed token but the last in the cache, plus
            // one round's verified block.
            let need = spec.prompt.len() as u128
                + spec.max_new_tokens as u128
                + self.sched.drafts_for(spec) as u128;
            if need > cap as u128 {
                return Err(Error::too_large(
                    format!("{what}: prompt + max_new_tokens + drafts (budget.kv_tokens)"),
                    need,
                    cap as u64,
                    " KV tokens",
                ));
            }
        }
        Ok(())
    }

    /// Drop every request and the target cache (after a failed step, for a caller that
    /// starts over).
    pub(crate) fn clear(&mut self) {
        self.sched.clear();
        self.cache = None;
    }

    /// Apply the scheduler's [`Compaction`] to the cache, then to its rows.
    pub(super) fn compact(&mut self) -> Result<()> {
        let c = self.sched.compaction();
        match &c {
            Compaction::Keep => {}
            Compaction::Clear => self.cache = None,
            Compaction::Retain(keep) => {
                if let Some(cache) = self.cache.as_mut() {
                    self.target.retain(cache, keep)?;
                }
            }
        }
        self.sched.compact(&c);
        Ok(())
    }

    /// Abort `id` now (it ends with `aborted` at the next step, where its row is freed).
    /// Errors: `invalid-argument` for an id the engine does not hold.
    pub fn abort(&mut self, id: RequestId) -> Result<()> {
        self.abort_handle().abort(id)
    }

    /// A handle that aborts requests from another thread (they take effect at the next step).
    pub fn abort_handle(&self) -> AbortHandle {
        self.sched.abort_handle()
    }

    /// Whether a step has anything to do: running or waiting requests, or aborts to apply.
    pub fn has_work(&self) -> bool {
        self.sched.has_work()
    }

    /// Requests in the running batch.
    pub fn num_running(&self) -> usize {
        self.sched.num_running()
    }

    /// Requests waiting for room (new, or preempted).
    pub fn num_waiting(&self) -> usize {
        self.sched.num_waiting()
    }

    /// The engine's counters since construction, with the current gauges.
    pub fn metrics(&self) -> EngineMetrics {
        let mut m = self.metrics.clone();
        m.requests_running = self.num_running();
        m.requests_waiting = self.num_waiting();
        m.kv_tokens_used = self.sched.kv_used();
        m
    }

    /// The target model.
    pub fn target(&self) -> &T {
        &self.target
    }

    /// The drafter.
    pub fn drafter(&self) -> &D {
        &self.drafter
    }

    /// The options.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Drafts verified per round at most.
    pub fn num_speculative_tokens(&self) -> usize {
        self.num_speculative
    }

    /// Under [`VerifyPolicy::ScheduledMeasured`], time the target's steps-per-second profile
    /// up to `batch` rows of `K + 1` tokens, in place of the prior from its shape (read past
    /// its end as tokens/s held constant). Optional: the prior and the rounds' own timings
    /// need no profile. Nothing under other policies.
    pub fn warm_up(&mut self, batch: usize) -> Result<()> {
        self.planner.warm_up(&self.target, batch)
    }

    /// The table [`VerifyPolicy::ScheduledMeasured`] uses, once built: the prior (or profile) refined
    /// by the forwards observed so far.
    pub fn measured_steps_per_second(&self) -> Option<StepsPerSecond> {
        self.planner.measured_steps_per_second()
    }
}
