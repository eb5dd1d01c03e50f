//! `dspark._native.Speculator`: the engine's speculative loop over a native or Python target
//! and a native or Python drafter, with the GIL released outside the Python calls.

use pyo3::prelude::*;
use pyo3::types::PyList;

use dspark::speculator::{Generation, Request, RoundUpdate, Speculator, SpeculatorOptions};
use dspark::{Error, TargetModel};

use crate::args;
use crate::errors::{callback_error, err, guard};
use crate::interrupt::Interrupts;
use crate::pair::{AnyDrafter, AnyTarget, drafter_of, policy, target_of};
use crate::stats::PyStats;

/// The engine's speculator (native half of `dspark.Speculator`).
#[pyclass(name = "Speculator", module = "dspark._native", frozen)]
pub struct PySpeculator {
    inner: Speculator<AnyTarget, AnyDrafter>,
}

/// `(tokens, stats)` of a generation.
fn result(g: Generation) -> (Vec<Vec<u32>>, PyStats) {
    (g.tokens, PyStats(g.stats))
}

/// Requests from prompts (lists of ids), one budget, one stop list, and seeds: one for every
/// request, one per request, or none (the speculator's own).
fn requests(
    prompts: &Bound<'_, PyAny>,
    max_new_tokens: &Bound<'_, PyAny>,
    stop_token_ids: Option<&Bound<'_, PyAny>>,
    seed: Option<&Bound<'_, PyAny>>,
    vocab: usize,
) -> PyResult<Vec<Request>> {
    let max_new_tokens = args::usize_at_most(max_new_tokens, "max_new_tokens", u64::MAX)?;
    let stops = match stop_token_ids.filter(|s| !s.is_none()) {
        Some(s) => {
            args::ids_in_vocab(&args::ids_1d(s, "stop_token_ids")?, "stop_token_ids", vocab)?
        }
        None => Vec::new(),
    };
    if !args::is_sequence(prompts) {
        return Err(err(Error::invalid(
            "input_ids",
            "expected a list of prompts (lists of ids)",
        )));
    }
    let mut out = Vec::new();
    for p in prompts.try_iter()? {
        let prompt = args::ids_in_vocab(&args::ids_1d(&p?, "input_ids")?, "input_ids", vocab)?;
        out.push(Request {
            prompt,
            max_new_tokens,
            stop_token_ids: stops.clone(),
            seed: None,
        });
    }
    match seed.filter(|s| !s.is_none()) {
        None => {}
        Some(s) if args::is_sequence(s) => {
            let seeds: Vec<u64> = s
                .try_iter()?
                .map(|x| args::uint(&x?, "seed", u64::MAX))
                .collect::<PyResult<_>>()?;
            if seeds.len() != out.len() {
                return Err(err(Error::bad_shape(
                    "seed",
                    format!("{} seeds for {} prompts", seeds.len(), out.len()),
                )));
            }
            for (r, s) in out.iter_mut().zip(seeds) {
                r.seed = Some(s);
            }
        }
        Some(s) => {
            // One seed for the call: each request its own stream, (seed, its index).
            let one = args::uint(s, "seed", u64::MAX)?;
            for (i, r) in out.iter_mut().enumerate() {
                r.seed = Some(dspark::engine::call_seed(one, i));
            }
        }
    }
    Ok(out)
}

/// Run `body` with the GIL released, streaming to `on_round` and answering Ctrl-C after each
/// round ([`Interrupts`]); re-raise a Python exception raised by a target, drafter, the
/// callback or a signal handler as itself.
fn run_detached(
    py: Python<'_>,
    on_round: Option<&Bound<'_, PyAny>>,
    body: impl FnOnce(
        Option<&mut dyn FnMut(&RoundUpdate<'_>) -> dspark::Result<()>>,
    ) -> dspark::Result<Generation>
    + Send,
) -> PyResult<Generation> {
    let hook = on_round
        .filter(|h| !h.is_none())
        .map(|h| h.clone().unbind());
    let out = py.detach(move || {
        let mut interrupts = Interrupts::new();
        let mut call = |u: &RoundUpdate<'_>| -> dspark::Result<()> {
            let Some(h) = &hook else {
                return interrupts.poll();
            };
            Python::attach(|py| {
                interrupts.check(py)?;
                let lists = PyList::new(py, u.new_tokens.iter().map(|t| t.to_vec()))
                    .and_then(|l| h.call1(py, (l,)));
                lists.map(|_| ()).map_err(|e| callback_error("on_round", e))
            })
        };
        body(Some(&mut call))
    });
    out.map_err(err)
}

/// The arguments of one generation call, as Python gave them.
struct Call<'a, 'py> {
    prompts: &'a Bound<'py, PyAny>,
    max_new_tokens: &'a Bound<'py, PyAny>,
    stop_token_ids: Option<&'a Bound<'py, PyAny>>,
    seed: Option<&'a Bound<'py, PyAny>>,
    on_round: Option<&'a Bound<'py, PyAny>>,
}

/// Which decoder a call runs.
#[derive(Clone, Copy)]
enum Decode {
    Speculative,
    TargetOnly,
}

impl PySpeculator {
    /// Read the requests, run the decoder with the GIL released, build the result.
    fn run<'py>(
        &self,
        py: Python<'py>,
        call: Call<'_, 'py>,
        decode: Decode,
    ) -> PyResult<(Vec<Vec<u32>>, PyStats)> {
        let vocab = self.inner.target().vocab_size();
        let reqs = requests(
            call.prompts,
            call.max_new_tokens,
            call.stop_token_ids,
            call.seed,
            vocab,
        )?;
        let inner = &self.inner;
        let g = run_detached(py, call.on_round, |hook| match decode {
            Decode::Speculative => inner.generate(&reqs, hook),
            Decode::TargetOnly => inner.generate_target_only(&reqs, hook),
        })?;
        Ok(result(g))
    }
}

#[pymethods]
impl PySpeculator {
    /// Build the engine speculator (checks the pair and the options).
    #[new]
    #[pyo3(signature = (target, drafter, *, num_speculative_tokens = None, temperature = 0.0,
        top_k = None, top_p = None, seed = None, verify = "scheduled", threshold = None,
        steps_per_second = None, steps_interpolation = None, record_confidence = false,
        presence_penalty = None, frequency_penalty = None, repetition_penalty = None,
        logit_bias = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        drafter: &Bound<'_, PyAny>,
        num_speculative_tokens: Option<&Bound<'_, PyAny>>,
        temperature: f64,
        top_k: Option<&Bound<'_, PyAny>>,
        top_p: Option<f64>,
        seed: Option<&Bound<'_, PyAny>>,
        verify: &str,
        threshold: Option<f64>,
        steps_per_second: Option<&Bound<'_, PyAny>>,
        steps_interpolation: Option<&Bound<'_, PyAny>>,
        record_confidence: bool,
        presence_penalty: Option<&Bound<'_, PyAny>>,
        frequency_penalty: Option<&Bound<'_, PyAny>>,
        repetition_penalty: Option<&Bound<'_, PyAny>>,
        logit_bias: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        guard(|| {
            let target = target_of(target)?;
            let drafter = drafter_of(drafter, target.hidden_size())?;
            let verify = policy(verify, threshold, steps_per_second, steps_interpolation)?;
            let options = SpeculatorOptions {
                num_speculative_tokens: args::opt_usize(
                    num_speculative_tokens,
                    "num_speculative_tokens",
                    u64::MAX,
                )?,
                temperature: temperature as f32,
                top_k: args::opt_usize(top_k, "top_k", u64::MAX)?,
                top_p: top_p.unwrap_or(1.0) as f32,
                seed: match seed.filter(|s| !s.is_none()) {
                    Some(s) => Some(args::uint(s, "seed", u64::MAX)?),
                    None => None,
                },
                verify,
                repeatable: true,
                record_confidence,
                penalties: dspark::engine::Penalties {
                    presence: args::opt_float32(presence_penalty, "presence_penalty", 0.0)?,
                    frequency: args::opt_float32(frequency_penalty, "frequency_penalty", 0.0)?,
                    repetition: args::opt_float32(repetition_penalty, "repetition_penalty", 1.0)?,
                    logit_bias: args::logit_bias(logit_bias, "logit_bias")?,
                },
            };
            let inner = py
                .detach(|| Speculator::new(target, drafter, options))
                .map_err(err)?;
            Ok(Self { inner })
        })
    }

    /// Generate for every prompt: `(tokens per prompt, stats)`, speculatively or, with
    /// `target_only`, by the target alone with the same options and seeds (the baseline).
    #[pyo3(signature = (prompts, max_new_tokens, stop_token_ids = None, on_round = None,
        seed = None, target_only = false))]
    #[allow(clippy::too_many_arguments)]
    fn generate<'py>(
        &self,
        py: Python<'py>,
        prompts: &Bound<'py, PyAny>,
        max_new_tokens: &Bound<'py, PyAny>,
        stop_token_ids: Option<&Bound<'py, PyAny>>,
        on_round: Option<&Bound<'py, PyAny>>,
        seed: Option<&Bound<'py, PyAny>>,
        target_only: bool,
    ) -> PyResult<(Vec<Vec<u32>>, PyStats)> {
        let call = Call {
            prompts,
            max_new_tokens,
            stop_token_ids,
            seed,
            on_round,
        };
        let decode = if target_only {
            Decode::TargetOnly
        } else {
            Decode::Speculative
        };
        guard(|| self.run(py, call, decode))
    }

    /// Under `verify="scheduled"` with no table, time the target's profile now for `batch`
    /// concurrent requests (the GIL released), in place of the prior from its shape
    /// (optional: the prior and the rounds' timings need no profile).
    fn warm_up(&self, py: Python<'_>, batch: &Bound<'_, PyAny>) -> PyResult<()> {
        guard(|| {
            let batch = args::usize_at_most(batch, "batch", 1 << 16)?;
            py.detach(|| self.inner.warm_up(batch).map_err(err))
        })
    }

    /// Drafts verified per round at most.
    #[getter]
    fn num_speculative_tokens(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.num_speculative_tokens()))
    }

    /// The target's vocabulary (prompt and stop ids lie below it).
    #[getter]
    fn vocab_size(&self) -> PyResult<usize> {
        guard(|| Ok(self.inner.target().vocab_size()))
    }
}
