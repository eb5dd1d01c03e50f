//! `dspark._native.Engine`: the serving engine over a native or Python target and drafter.
//! `step()` runs one round with the GIL released; `abort` works from any thread (it takes
//! effect at the next step) and the counts are read without waiting for a running step.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyDict;

use dspark::TargetModel;
use dspark::engine::{
    AbortHandle, Budget, Engine, EngineConfig, EngineMetrics, RequestId, RequestOutput,
    RequestSpec, RequestUsage, SamplingParams, StepTiming,
};
use dspark::sync::Held;

use crate::args;
use crate::errors::{err, guard};
use crate::pair::{AnyDrafter, AnyTarget, drafter_of, policy, target_of};

/// The serving engine (native half of `dspark.Engine`).
#[pyclass(name = "Engine", module = "dspark._native", frozen)]
pub struct PyEngine {
    inner: Mutex<Engine<AnyTarget, AnyDrafter>>,
    aborts: AbortHandle,
    vocab: usize,
    running: AtomicUsize,
    waiting: AtomicUsize,
    busy: AtomicBool,
    last: Mutex<(StepTiming, bool)>,
    grammars: crate::grammar::PyGrammars,
}

/// One request's part of a step.
#[pyclass(name = "RequestUpdate", module = "dspark._native", frozen)]
pub struct PyRequestUpdate(RequestOutput);

fn usage_dict<'py>(py: Python<'py>, u: &RequestUsage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("prompt_tokens", u.prompt_tokens)?;
    d.set_item("generated_tokens", u.generated_tokens)?;
    d.set_item("rounds", u.rounds)?;
    d.set_item("drafted_tokens", u.drafted_tokens)?;
    d.set_item("accepted_tokens", u.accepted_tokens)?;
    d.set_item("preemptions", u.preemptions)?;
    d.set_item("acceptance_length", u.acceptance_length())?;
    Ok(d)
}

/// One token's log-probability entry as Python sees it: `(token, logprob, [(id, logprob)])`.
type TokenEntry = (u32, f32, Vec<(u32, f32)>);

#[pymethods]
impl PyRequestUpdate {
    /// The request's id (from `add_request`).
    #[getter]
    fn request_id(&self) -> u64 {
        self.0.id.0
    }

    /// Tokens it committed in this step.
    #[getter]
    fn new_tokens(&self) -> Vec<u32> {
        self.0.new_tokens.clone()
    }

    /// With `logprobs` asked for: per new token `(token, logprob, [(id, logprob), ...])`, the
    /// alternatives most likely first (else empty).
    #[getter]
    fn logprobs(&self) -> Vec<TokenEntry> {
        self.0
            .logprobs
            .iter()
            .map(|l| (l.token, l.logprob, l.top.clone()))
            .collect()
    }

    /// Drafts verified for it in this step.
    #[getter]
    fn drafted(&self) -> usize {
        self.0.drafted
    }

    /// Of those, accepted.
    #[getter]
    fn accepted(&self) -> usize {
        self.0.accepted
    }

    /// `None` while it runs; `"stop"`, `"length"`, `"aborted"` or `"error"` when it ended in
    /// this step.
    #[getter]
    fn finish_reason(&self) -> Option<&'static str> {
        self.0.finish.map(|f| f.as_str())
    }

    /// With `finish_reason == "error"`: why it failed (its rows only; the others ran on).
    #[getter]
    fn error(&self) -> Option<String> {
        self.0.error.as_ref().map(|e| e.message.clone())
    }

    /// With `finish_reason == "error"`: the failure's stable code (`non-finite`, ...).
    #[getter]
    fn error_code(&self) -> Option<&'static str> {
        self.0.error.as_ref().map(|e| e.code)
    }

    /// What it used so far (final when it finished): prompt and generated tokens, rounds,
    /// drafted and accepted tokens, preemptions and its acceptance length.
    #[getter]
    fn usage<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        usage_dict(py, &self.0.usage)
    }

    fn __repr__(&self) -> String {
        format!(
            "RequestUpdate(request_id={}, new_tokens={:?}, finish_reason={:?})",
            self.0.id.0,
            self.0.new_tokens,
            self.0.finish.map(|f| f.as_str())
        )
    }
}

fn metrics_dict<'py>(py: Python<'py>, m: &EngineMetrics) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("requests_running", m.requests_running)?;
    d.set_item("requests_waiting", m.requests_waiting)?;
    d.set_item("kv_tokens_used", m.kv_tokens_used)?;
    d.set_item("kv_tokens_capacity", m.kv_tokens_capacity)?;
    d.set_item("steps", m.steps)?;
    d.set_item("requests_added", m.requests_added)?;
    d.set_item("requests_stopped", m.requests_stopped)?;
    d.set_item("requests_length", m.requests_length)?;
    d.set_item("requests_aborted", m.requests_aborted)?;
    d.set_item("requests_failed", m.requests_failed)?;
    d.set_item("preemptions", m.preemptions)?;
    d.set_item("prompt_tokens", m.prompt_tokens)?;
    d.set_item("generation_tokens", m.generation_tokens)?;
    d.set_item("num_drafts", m.num_drafts)?;
    d.set_item("num_draft_tokens", m.num_draft_tokens)?;
    d.set_item("num_accepted_tokens", m.num_accepted_tokens)?;
    d.set_item(
        "num_accepted_tokens_per_pos",
        m.num_accepted_tokens_per_pos.clone(),
    )?;
    d.set_item("mean_acceptance_length", m.mean_acceptance_length())?;
    Ok(d)
}

impl PyEngine {
    /// The engine, locked for this thread. Callers release the GIL first (a step holds the
    /// lock and needs the GIL for a Python target: waiting for the lock with the GIL held
    /// would deadlock), and a call back into the engine from inside its own step on the same
    /// thread (a Python target calling `add_request`) is `invalid-argument`.
    fn engine(&self) -> PyResult<Held<'_, Engine<AnyTarget, AnyDrafter>>> {
        Held::lock(&self.inner, "engine").map_err(err)
    }

    fn publish(&self, e: &Engine<AnyTarget, AnyDrafter>) {
        self.running.store(e.num_running(), Ordering::Relaxed);
        self.waiting.store(e.num_waiting(), Ordering::Relaxed);
        self.busy.store(e.has_work(), Ordering::Relaxed);
    }
}

#[pymethods]
impl PyEngine {
    /// Build the engine (checks the pair, the options and that the target can add and drop
    /// cache rows).
    #[new]
    #[pyo3(signature = (target, drafter, *, num_speculative_tokens = None, verify = "scheduled",
        threshold = None, steps_per_second = None, steps_interpolation = None,
        record_confidence = false, max_running = None, max_batched_tokens = None,
        kv_tokens = None, tokenizer_dir = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        drafter: &Bound<'_, PyAny>,
        num_speculative_tokens: Option<&Bound<'_, PyAny>>,
        verify: &str,
        threshold: Option<f64>,
        steps_per_second: Option<&Bound<'_, PyAny>>,
        steps_interpolation: Option<&Bound<'_, PyAny>>,
        record_confidence: bool,
        max_running: Option<&Bound<'_, PyAny>>,
        max_batched_tokens: Option<&Bound<'_, PyAny>>,
        kv_tokens: Option<&Bound<'_, PyAny>>,
        tokenizer_dir: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(|| {
            let target = target_of(target)?;
            let drafter = drafter_of(drafter, target.hidden_size())?;
            let defaults = Budget::default();
            let config = EngineConfig {
                verify: policy(verify, threshold, steps_per_second, steps_interpolation)?,
                num_speculative_tokens: args::opt_usize(
                    num_speculative_tokens,
                    "num_speculative_tokens",
                    u64::MAX,
                )?,
                record_confidence,
                budget: Budget {
                    max_running: args::opt_usize(max_running, "max_running", u64::MAX)?
                        .unwrap_or(defaults.max_running),
                    max_batched_tokens: args::opt_usize(
                        max_batched_tokens,
                        "max_batched_tokens",
                        u64::MAX,
                    )?
                    .unwrap_or(defaults.max_batched_tokens),
                    kv_tokens: args::opt_usize(kv_tokens, "kv_tokens", u64::MAX)?,
                },
            };
            let vocab = target.vocab_size();
            let engine = py
                .detach(|| Engine::new(target, drafter, config))
                .map_err(err)?;
            Ok(Self {
                aborts: engine.abort_handle(),
                inner: Mutex::new(engine),
                vocab,
                running: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                busy: AtomicBool::new(false),
                last: Mutex::new((StepTiming::default(), false)),
                grammars: crate::grammar::PyGrammars::new(match tokenizer_dir {
                    Some(d) if !d.is_none() => Some(args::path(d, "tokenizer_dir")?),
                    _ => None,
                }),
            })
        })
    }

    /// Queue a request; returns its id. Every value is checked here (typed errors naming the
    /// request and the field).
    #[pyo3(signature = (prompt, max_new_tokens, *, temperature = None, top_k = None,
        top_p = None, seed = None, stop_token_ids = None, max_drafts = None, logprobs = None,
        presence_penalty = None, frequency_penalty = None, repetition_penalty = None,
        logit_bias = None, response_format = None))]
    #[allow(clippy::too_many_arguments)]
    fn add_request(
        &self,
        prompt: &Bound<'_, PyAny>,
        max_new_tokens: &Bound<'_, PyAny>,
        temperature: Option<&Bound<'_, PyAny>>,
        top_k: Option<&Bound<'_, PyAny>>,
        top_p: Option<&Bound<'_, PyAny>>,
        seed: Option<&Bound<'_, PyAny>>,
        stop_token_ids: Option<&Bound<'_, PyAny>>,
        max_drafts: Option<&Bound<'_, PyAny>>,
        logprobs: Option<&Bound<'_, PyAny>>,
        presence_penalty: Option<&Bound<'_, PyAny>>,
        frequency_penalty: Option<&Bound<'_, PyAny>>,
        repetition_penalty: Option<&Bound<'_, PyAny>>,
        logit_bias: Option<&Bound<'_, PyAny>>,
        response_format: Option<&str>,
    ) -> PyResult<u64> {
        guard(|| {
            let prompt_ids = args::ids_1d(prompt, "prompt")?;
            let prompt_ids = args::ids_in_vocab(&prompt_ids, "prompt", self.vocab)?;
            let stops = match stop_token_ids.filter(|s| !s.is_none()) {
                Some(s) => args::ids_in_vocab(
                    &args::ids_1d(s, "stop_token_ids")?,
                    "stop_token_ids",
                    self.vocab,
                )?,
                None => Vec::new(),
            };
            let spec = RequestSpec {
                prompt: prompt_ids,
                max_new_tokens: args::usize_at_most(max_new_tokens, "max_new_tokens", u64::MAX)?,
                stop_token_ids: stops,
                sampling: SamplingParams {
                    temperature: args::opt_float32(temperature, "temperature", 0.0)?,
                    top_k: args::opt_usize(top_k, "top_k", u64::MAX)?,
                    top_p: args::opt_float32(top_p, "top_p", 1.0)?,
                },
                // An unseeded request draws fresh entropy (an independent sample).
                seed: match seed.filter(|s| !s.is_none()) {
                    Some(s) => args::uint(s, "seed", u64::MAX)?,
                    None => dspark::engine::fresh_seed(),
                },
                max_drafts: args::opt_usize(max_drafts, "max_drafts", u64::MAX)?,
                repeatable: seed.is_some_and(|s| !s.is_none()),
                logprobs: args::opt_usize(logprobs, "logprobs", u64::MAX)?,
                penalties: dspark::engine::Penalties {
                    presence: args::opt_float32(presence_penalty, "presence_penalty", 0.0)?,
                    frequency: args::opt_float32(frequency_penalty, "frequency_penalty", 0.0)?,
                    repetition: args::opt_float32(repetition_penalty, "repetition_penalty", 1.0)?,
                    logit_bias: args::logit_bias(logit_bias, "logit_bias")?,
                },
                constraint: match response_format {
                    Some(f) => self.grammars.constraint(f).map_err(err)?,
                    None => None,
                },
            };
            // The lock is taken with the GIL released (see `engine`).
            let id = prompt.py().detach(|| {
                let mut engine = self.engine()?;
                let id = engine.add_request(spec).map_err(err)?;
                self.publish(&engine);
                Ok::<_, PyErr>(id)
            })?;
            Ok(id.0)
        })
    }

    /// One step (one round over every running request), with the GIL released; a list of
    /// `RequestUpdate`.
    fn step(&self, py: Python<'_>) -> PyResult<Vec<PyRequestUpdate>> {
        guard(|| {
            let out = py.detach(|| {
                let mut engine = self.engine()?;
                let out = engine.step().map_err(err);
                self.publish(&engine);
                out
            })?;
            *self.last.lock().unwrap_or_else(|e| e.into_inner()) = (out.timing, out.round);
            Ok(out.outputs.into_iter().map(PyRequestUpdate).collect())
        })
    }

    /// Abort a request (from any thread); it ends with `"aborted"` at the next step. An id
    /// the engine does not hold (unknown, or finished) is an `InputError`.
    fn abort(&self, request_id: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let id = RequestId(args::uint(request_id, "request_id", u64::MAX)?);
            self.aborts.abort(id).map_err(err)?;
            self.busy.store(true, Ordering::Relaxed);
            Ok(())
        })
    }

    /// Under `verify="scheduled"` with no table, time the target's profile now for `batch`
    /// concurrent requests (the GIL released), in place of the prior from its shape
    /// (optional: the prior and the rounds' timings need no profile).
    fn warm_up(&self, py: Python<'_>, batch: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let batch = args::usize_at_most(batch, "batch", 1 << 16)?;
            py.detach(|| self.engine()?.warm_up(batch).map_err(err))
        })
    }

    /// Whether a step has anything to do.
    fn has_work(&self) -> bool {
        self.busy.load(Ordering::Relaxed)
    }

    /// Requests in the running batch (as of the last step or add).
    #[getter]
    fn num_running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Requests waiting for room (as of the last step or add).
    #[getter]
    fn num_waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Where the last step's time went, in seconds: `drafter`, `target` (forwards),
    /// `kernels` (verify lengths, verification, commit), `overhead` (the rest: aborts,
    /// admission, planning, cache edits), `total`, and `round` (whether it ran a round).
    fn last_step_timing<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(|| {
            let (t, round) = *self.last.lock().unwrap_or_else(|e| e.into_inner());
            let d = PyDict::new(py);
            d.set_item("drafter", t.drafter_seconds)?;
            d.set_item("target", t.target_seconds)?;
            d.set_item("kernels", t.kernel_seconds)?;
            d.set_item("overhead", t.overhead_seconds)?;
            d.set_item("total", t.total_seconds())?;
            d.set_item("round", round)?;
            Ok(d)
        })
    }

    /// The engine's counters (waits for a running step).
    fn metrics<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        guard(|| {
            let m = py.detach(|| self.engine().map(|e| e.metrics()))?;
            metrics_dict(py, &m)
        })
    }
}
