//! [`Speculator`]: a batch of requests decoded to the end on the serving engine — add every
//! request, then step until done.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::options::{Request, SpeculatorOptions};
use super::stats::Stats;
use super::{Generation, OnRound, RoundUpdate};
use crate::drafter::Drafter;
use crate::engine::{
    Budget, Engine, EngineConfig, RequestId, RequestSpec, SamplingParams, call_seed, fresh_seed,
};
use crate::error::{Error, Result};
use crate::limits::{MAX_BATCH, at_most};
use crate::models::TargetModel;
use crate::policy::StepsPerSecond;
use crate::sync::Held;

/// Speculative decoding of a [`TargetModel`] with a [`Drafter`], one batch at a time, on the
/// serving [`Engine`] (which it keeps across calls, with what its scheduling policies learn).
pub struct Speculator<T: TargetModel, D: Drafter> {
    target: Arc<T>,
    drafter: Arc<D>,
    options: SpeculatorOptions,
    engine: Mutex<Engine<Arc<T>, Arc<D>>>,
}

impl<T: TargetModel, D: Drafter> std::fmt::Debug for Speculator<T, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Speculator")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Check the sampling options shared by every request of a call.
pub(crate) fn check_sampling(o: &SpeculatorOptions) -> Result<()> {
    SamplingParams {
        temperature: o.temperature,
        top_k: o.top_k,
        top_p: o.top_p,
    }
    .check("options")
    .map_err(unprefixed)
}

/// The options' fields are named as they always were (`temperature`, not a path).
fn unprefixed(e: Error) -> Error {
    match e {
        Error::InvalidArgument { name, message } => Error::InvalidArgument {
            name: name.trim_start_matches("options.").to_string(),
            message,
        },
        Error::TokenOutOfRange {
            name,
            id,
            vocab_size,
        } => Error::TokenOutOfRange {
            name: name.trim_start_matches("options.").to_string(),
            id,
            vocab_size,
        },
        e => e,
    }
}

/// The engine options of a speculator: its policy, and a budget that admits a whole call.
fn engine_config(options: &SpeculatorOptions) -> EngineConfig {
    EngineConfig {
        verify: options.verify.clone(),
        num_speculative_tokens: options.num_speculative_tokens,
        record_confidence: options.record_confidence,
        budget: Budget {
            max_running: usize::MAX,
            max_batched_tokens: usize::MAX,
            kv_tokens: None,
        },
    }
}

impl<T: TargetModel, D: Drafter> Speculator<T, D> {
    /// Check the pair (capture layers, feature width, vocabulary) and the options; nothing
    /// runs yet. Errors: `target-mismatch`, `invalid-argument`, `bad-config` (a confidence
    /// policy for a drafter without a confidence head).
    pub fn new(target: T, drafter: D, options: SpeculatorOptions) -> Result<Self> {
        check_sampling(&options)?;
        options
            .penalties
            .check("options", target.vocab_size())
            .map_err(unprefixed)?;
        let (target, drafter) = (Arc::new(target), Arc::new(drafter));
        let engine = Engine::new_any(
            Arc::clone(&target),
            Arc::clone(&drafter),
            engine_config(&options),
        )?;
        Ok(Self {
            target,
            drafter,
            options,
            engine: Mutex::new(engine),
        })
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
    pub fn options(&self) -> &SpeculatorOptions {
        &self.options
    }

    /// Drafts verified per round at most.
    pub fn num_speculative_tokens(&self) -> usize {
        self.engine().map_or(0, |e| e.num_speculative_tokens())
    }

    /// The table [`VerifyPolicy::ScheduledMeasured`](crate::policy::VerifyPolicy) uses,
    /// once built: the prior (or the profile [`Speculator::warm_up`] timed) refined by the
    /// forwards observed so far.
    pub fn measured_steps_per_second(&self) -> Option<StepsPerSecond> {
        self.engine().ok()?.measured_steps_per_second()
    }

    /// Under [`VerifyPolicy::ScheduledMeasured`](crate::policy::VerifyPolicy) without a
    /// table: time the target's profile now for `batch` concurrent requests
    /// ([`Engine::warm_up`]) in place of the prior from its shape (optional). Nothing under
    /// other policies.
    pub fn warm_up(&self, batch: usize) -> Result<()> {
        self.engine()?.warm_up(batch)
    }

    /// The engine, locked for this thread: calls from other threads wait their turn; a call
    /// from inside one of this speculator's own calls on the same thread (an `on_round` hook
    /// that calls back into it) is refused with `invalid-argument` instead of deadlocking.
    fn engine(&self) -> Result<Held<'_, Engine<Arc<T>, Arc<D>>>> {
        Held::lock(&self.engine, "speculator")
    }

    /// Generate for every request (prompts of any lengths, each its own budget, stop tokens
    /// and seed). `on_round`, if given, is called after the prefill and after every round with
    /// what each request committed since the previous call; its time is not counted in the
    /// stats, and an error it returns aborts the call.
    pub fn generate(
        &self,
        requests: &[Request],
        on_round: Option<OnRound<'_>>,
    ) -> Result<Generation> {
        let mut engine = self.engine()?;
        run(&mut engine, &self.options, requests, None, on_round)
    }

    /// Decode every request with the target alone (no drafts), on the same seeds: the
    /// baseline of [`Speculator::generate`] (greedy output is identical).
    pub fn generate_target_only(
        &self,
        requests: &[Request],
        on_round: Option<OnRound<'_>>,
    ) -> Result<Generation> {
        let mut engine = self.engine()?;
        run(&mut engine, &self.options, requests, Some(0), on_round)
    }
}

/// Decode `requests` to the end on `engine` (`max_drafts`: every request's own limit).
pub(crate) fn run<T: TargetModel, D: Drafter>(
    engine: &mut Engine<T, D>,
    options: &SpeculatorOptions,
    requests: &[Request],
    max_drafts: Option<usize>,
    mut on_round: Option<OnRound<'_>>,
) -> Result<Generation> {
    let t0 = Instant::now();
    at_most("requests", requests.len() as u64, MAX_BATCH)?;
    let specs: Vec<RequestSpec> = requests
        .iter()
        .enumerate()
        .map(|(i, r)| RequestSpec {
            prompt: r.prompt.clone(),
            max_new_tokens: r.max_new_tokens,
            stop_token_ids: r.stop_token_ids.clone(),
            sampling: SamplingParams {
                temperature: options.temperature,
                top_k: options.top_k,
                top_p: options.top_p,
            },
            seed: r
                .seed
                .or_else(|| options.seed.map(|s| call_seed(s, i)))
                .unwrap_or_else(fresh_seed),
            max_drafts,
            repeatable: options.repeatable && (r.seed.is_some() || options.seed.is_some()),
            logprobs: None,
            penalties: options.penalties.clone(),
            constraint: None,
        })
        .collect();
    // Every request is checked before any runs.
    for (i, spec) in specs.iter().enumerate() {
        engine.check_request(spec, &format!("requests[{i}]"))?;
    }
    let mut index: HashMap<RequestId, usize> = HashMap::with_capacity(requests.len());
    for (i, spec) in specs.into_iter().enumerate() {
        index.insert(engine.add_request(spec)?, i);
    }
    let result = drive(engine, &index, requests.len(), &mut on_round);
    if result.is_err() {
        // A failed call leaves nothing behind for the next one.
        engine.clear();
    }
    let (tokens, mut stats, hook) = result?;
    stats.total_seconds = t0.elapsed().as_secs_f64() - hook;
    Ok(Generation { tokens, stats })
}

/// Step `engine` until the call's requests finish, gathering tokens and statistics.
fn drive<T: TargetModel, D: Drafter>(
    engine: &mut Engine<T, D>,
    index: &HashMap<RequestId, usize>,
    n: usize,
    on_round: &mut Option<OnRound<'_>>,
) -> Result<(Vec<Vec<u32>>, Stats, f64)> {
    let t0 = Instant::now();
    let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); n];
    let mut shown = vec![0usize; n];
    let mut finished = vec![false; n];
    let mut prefilled: HashSet<RequestId> = HashSet::new();
    let mut stats = Stats::default();
    let mut hook = 0.0;
    let mut reported_prefill = false;
    while engine.has_work() {
        let step = engine.step()?;
        stats.drafter_seconds += step.timing.drafter_seconds;
        stats.target_seconds += step.timing.target_seconds;
        stats.kernel_seconds += step.timing.kernel_seconds + step.timing.overhead_seconds;
        if step.round {
            stats.rounds += 1;
            stats.plain_rounds += usize::from(step.plain);
        }
        stats.confidence_records.extend(step.confidence_records);
        for o in &step.outputs {
            let Some(&i) = index.get(&o.id) else { continue };
            if let Some(e) = &o.error {
                // One request's own rows failed: a batch call has no per-request answer, so
                // the call fails with its error.
                return Err(e.to_error(&format!("requests[{i}]")));
            }
            tokens[i].extend_from_slice(&o.new_tokens);
            if o.finish.is_some() {
                finished[i] = true;
            }
            if o.new_tokens.is_empty() {
                continue;
            }
            if prefilled.insert(o.id) {
                // Its first token came from the prefill, not from a round.
                continue;
            }
            stats.record(o.drafted, o.accepted, o.new_tokens.len());
        }
        if !step.round && !reported_prefill {
            reported_prefill = true;
            stats.prefill_seconds = t0.elapsed().as_secs_f64() - hook;
        }
        if let Some(f) = on_round.as_mut() {
            let t = Instant::now();
            let update = RoundUpdate {
                round: stats.rounds,
                new_tokens: tokens.iter().zip(&shown).map(|(o, &s)| &o[s..]).collect(),
                finished: &finished,
            };
            f(&update)?;
            hook += t.elapsed().as_secs_f64();
        }
        for (s, o) in shown.iter_mut().zip(&tokens) {
            *s = o.len();
        }
    }
    Ok((tokens, stats, hook))
}
