//! A deterministic [`ServingEngine`] for tests of the HTTP layer: it echoes the prompt.
//!
//! Output token `i` of a request is `prompt[(i + shift) % prompt.len()]`, where `shift` is
//! `0` for greedy requests and `seed % prompt.len()` for sampled ones (so seeds reproduce and
//! different seeds differ). The first token comes from the "prefill" step; every later step
//! commits `1 + accepted` tokens with `drafts` drafted (both limited by the request's
//! `max_drafts`), like a speculative round. A stop id ends the request (kept as its last
//! token). At most `max_running` requests run; others wait. Each step with running requests
//! sleeps `step_delay`, so tests can catch requests mid-flight. With `poison`, a request whose
//! prompt holds that id fails alone at its first round.
//!
//! Log-probabilities (when asked for) are those of a fixed distribution around each emitted
//! token `t`: `t` itself at `-ln 2`, then ids `t + 1, t + 2, ...` (mod the vocabulary) at
//! `-2 ln 2, -3 ln 2, ...`; `top` alternatives list the first `top` of that order.

use std::collections::VecDeque;
use std::time::Duration;

use dspark::Error;
use dspark::engine::{
    EngineMetrics, FinishReason, RequestError, RequestId, RequestOutput, RequestSpec, RequestUsage,
    StepOutput,
};

use crate::engine::ServingEngine;

/// How the fake engine behaves.
#[derive(Debug, Clone)]
pub struct FakeConfig {
    /// The vocabulary ids must stay below.
    pub vocab_size: usize,
    /// Requests running at once.
    pub max_running: usize,
    /// Draft tokens per round (before the request's `max_drafts`).
    pub drafts: usize,
    /// Of those, accepted per round.
    pub accepted: usize,
    /// Sleep of each step with running requests.
    pub step_delay: Duration,
    /// Prompt + new tokens a request may need at most (`too-large` above).
    pub kv_tokens: Option<usize>,
    /// A request whose prompt holds this id fails alone at its first round, after its first
    /// token (as if its rows went non-finite: `FinishReason::Error`, code `non-finite`).
    pub poison: Option<u32>,
}

impl Default for FakeConfig {
    /// 3000 ids (the bundled pair's), 8 running, 4 drafts with 2 accepted, 2 ms steps.
    fn default() -> Self {
        Self {
            vocab_size: 3000,
            max_running: 8,
            drafts: 4,
            accepted: 2,
            step_delay: Duration::from_millis(2),
            kv_tokens: None,
            poison: None,
        }
    }
}

struct Request {
    id: RequestId,
    spec: RequestSpec,
    generated: Vec<u32>,
    usage: RequestUsage,
}

impl Request {
    fn next_token(&self) -> u32 {
        let p = &self.spec.prompt;
        let shift = if self.spec.sampling.is_greedy() {
            0
        } else {
            (self.spec.seed % p.len() as u64) as usize
        };
        p[(self.generated.len() + shift) % p.len()]
    }
}

/// The echo engine; see the module docs.
pub struct FakeEngine {
    config: FakeConfig,
    next_id: u64,
    waiting: VecDeque<Request>,
    running: Vec<Request>,
    aborted: Vec<(RequestId, RequestUsage)>,
    metrics: EngineMetrics,
}

impl FakeEngine {
    /// An idle engine.
    pub fn new(config: FakeConfig) -> Self {
        let metrics = EngineMetrics {
            num_accepted_tokens_per_pos: vec![0; config.drafts],
            kv_tokens_capacity: config.kv_tokens,
            ..EngineMetrics::default()
        };
        Self {
            config,
            next_id: 0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            aborted: Vec::new(),
            metrics,
        }
    }

    fn gauges(&mut self) {
        self.metrics.requests_running = self.running.len();
        self.metrics.requests_waiting = self.waiting.len();
        self.metrics.kv_tokens_used = self
            .running
            .iter()
            .map(|r| r.spec.prompt.len() + r.generated.len())
            .sum();
    }

    /// Commit this step's tokens of `r`; its output entry.
    fn advance(&mut self, r: &mut Request) -> RequestOutput {
        let first = r.generated.is_empty();
        if !first
            && self
                .config
                .poison
                .is_some_and(|p| r.spec.prompt.contains(&p))
        {
            self.metrics.requests_failed += 1;
            return RequestOutput {
                error: Some(RequestError {
                    code: "non-finite",
                    message: format!("target_logits: row of {} is NaN", r.id),
                }),
                id: r.id,
                new_tokens: Vec::new(),
                logprobs: Vec::new(),
                drafted: 0,
                accepted: 0,
                finish: Some(FinishReason::Error),
                usage: r.usage,
            };
        }
        let drafts = r
            .spec
            .max_drafts
            .map_or(self.config.drafts, |d| d.min(self.config.drafts));
        let accepted = self.config.accepted.min(drafts);
        let want = if first { 1 } else { 1 + accepted };
        let mut new_tokens = Vec::new();
        let mut finish = None;
        for _ in 0..want {
            let t = r.next_token();
            r.generated.push(t);
            new_tokens.push(t);
            if r.spec.stop_token_ids.contains(&t) {
                finish = Some(FinishReason::Stop);
                break;
            }
            if r.generated.len() >= r.spec.max_new_tokens {
                finish = Some(FinishReason::Length);
                break;
            }
        }
        let (drafted, accepted) = if first || drafts == 0 {
            (0, 0)
        } else {
            (drafts, (new_tokens.len() - 1).min(accepted))
        };
        if !first {
            r.usage.rounds += 1;
        }
        r.usage.generated_tokens = r.generated.len();
        r.usage.drafted_tokens += drafted;
        r.usage.accepted_tokens += accepted;
        let m = &mut self.metrics;
        m.generation_tokens += new_tokens.len() as u64;
        if drafted > 0 {
            m.num_drafts += 1;
            m.num_draft_tokens += drafted as u64;
            m.num_accepted_tokens += accepted as u64;
            for pos in m.num_accepted_tokens_per_pos.iter_mut().take(accepted) {
                *pos += 1;
            }
        }
        match finish {
            Some(FinishReason::Stop) => m.requests_stopped += 1,
            Some(FinishReason::Length) => m.requests_length += 1,
            _ => {}
        }
        let vocab = self.config.vocab_size as u32;
        let logprobs = match r.spec.logprobs {
            None => Vec::new(),
            Some(top) => new_tokens
                .iter()
                .map(|&t| fake_logprob(t, top, vocab))
                .collect(),
        };
        RequestOutput {
            error: None,
            id: r.id,
            logprobs,
            new_tokens,
            drafted,
            accepted,
            finish,
            usage: r.usage,
        }
    }
}

/// The fake distribution's entry for emitted token `t` (see the module docs).
fn fake_logprob(t: u32, top: usize, vocab: u32) -> dspark::sampling::TokenLogprob {
    let ln2 = std::f32::consts::LN_2;
    dspark::sampling::TokenLogprob {
        token: t,
        logprob: -ln2,
        top: (0..top as u32)
            .map(|k| ((t + k) % vocab, -ln2 * (k + 1) as f32))
            .collect(),
    }
}

impl ServingEngine for FakeEngine {
    fn add_request(&mut self, spec: RequestSpec) -> dspark::Result<RequestId> {
        if spec.prompt.is_empty() {
            return Err(Error::invalid("prompt", "empty"));
        }
        if let Some(&t) = spec
            .prompt
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::TokenOutOfRange {
                name: "prompt".into(),
                id: i64::from(t),
                vocab_size: self.config.vocab_size,
            });
        }
        spec.sampling.check("request")?;
        let need = spec.prompt.len().saturating_add(spec.max_new_tokens);
        if let Some(limit) = self.config.kv_tokens.filter(|&l| need > l) {
            return Err(Error::too_large("request", need, limit, " tokens"));
        }
        let id = RequestId(self.next_id);
        self.next_id += 1;
        self.metrics.requests_added += 1;
        let usage = RequestUsage {
            prompt_tokens: spec.prompt.len(),
            ..RequestUsage::default()
        };
        self.waiting.push_back(Request {
            id,
            spec,
            generated: Vec::new(),
            usage,
        });
        self.gauges();
        Ok(id)
    }

    fn abort(&mut self, id: RequestId) -> dspark::Result<()> {
        let usage = if let Some(i) = self.running.iter().position(|r| r.id == id) {
            self.running.remove(i).usage
        } else if let Some(i) = self.waiting.iter().position(|r| r.id == id) {
            self.waiting.remove(i).map(|r| r.usage).unwrap_or_default()
        } else {
            return Err(Error::invalid(
                "id",
                format!("{id} is not running or waiting"),
            ));
        };
        self.metrics.requests_aborted += 1;
        self.aborted.push((id, usage));
        self.gauges();
        Ok(())
    }

    fn step(&mut self) -> dspark::Result<StepOutput> {
        let mut outputs: Vec<RequestOutput> = self
            .aborted
            .drain(..)
            .map(|(id, usage)| RequestOutput {
                error: None,
                id,
                new_tokens: Vec::new(),
                logprobs: Vec::new(),
                drafted: 0,
                accepted: 0,
                finish: Some(FinishReason::Aborted),
                usage,
            })
            .collect();
        while self.running.len() < self.config.max_running {
            let Some(r) = self.waiting.pop_front() else {
                break;
            };
            self.metrics.prompt_tokens += r.spec.prompt.len() as u64;
            self.running.push(r);
        }
        if !self.running.is_empty() {
            std::thread::sleep(self.config.step_delay);
        }
        let mut running = std::mem::take(&mut self.running);
        for mut r in running.drain(..) {
            let out = self.advance(&mut r);
            let done = out.finish.is_some();
            outputs.push(out);
            if !done {
                self.running.push(r);
            }
        }
        self.metrics.steps += 1;
        self.gauges();
        Ok(StepOutput {
            outputs,
            round: true,
            ..StepOutput::default()
        })
    }

    fn has_work(&self) -> bool {
        !(self.running.is_empty() && self.waiting.is_empty() && self.aborted.is_empty())
    }

    fn metrics(&self) -> EngineMetrics {
        self.metrics.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &mut FakeEngine) -> Vec<RequestOutput> {
        let mut all = Vec::new();
        while engine.has_work() {
            all.extend(engine.step().unwrap().outputs);
        }
        all
    }

    #[test]
    fn echoes_with_rounds_and_stops() {
        let mut e = FakeEngine::new(FakeConfig {
            step_delay: Duration::ZERO,
            ..FakeConfig::default()
        });
        let mut spec = RequestSpec::new(vec![5, 6, 7], 7);
        let a = e.add_request(spec.clone()).unwrap();
        spec.stop_token_ids = vec![7];
        let b = e.add_request(spec).unwrap();
        let out = run(&mut e);
        let tokens = |id| -> Vec<u32> {
            out.iter()
                .filter(|o| o.id == id)
                .flat_map(|o| o.new_tokens.clone())
                .collect()
        };
        assert_eq!(tokens(a), [5, 6, 7, 5, 6, 7, 5]);
        assert_eq!(tokens(b), [5, 6, 7]);
        let last = out.iter().rfind(|o| o.id == a).unwrap();
        assert_eq!(last.finish, Some(FinishReason::Length));
        // 1 (prefill) + 3 + 3: two rounds of 1 + 2 accepted.
        assert_eq!(last.usage.rounds, 2);
        assert_eq!(last.usage.acceptance_length(), 3.0);
        let m = e.metrics();
        assert_eq!((m.requests_running, m.requests_waiting), (0, 0));
        assert_eq!(m.generation_tokens, 10);
    }

    #[test]
    fn seeds_shift_sampled_output_and_abort_frees() {
        let mut e = FakeEngine::new(FakeConfig {
            step_delay: Duration::ZERO,
            ..FakeConfig::default()
        });
        let mut spec = RequestSpec::new(vec![1, 2, 3, 4], 2);
        spec.sampling.temperature = 1.0;
        spec.seed = 2;
        let a = e.add_request(spec).unwrap();
        let out = run(&mut e);
        assert_eq!(out[0].new_tokens, [3]);
        let b = e.add_request(RequestSpec::new(vec![1], 100)).unwrap();
        e.step().unwrap();
        e.abort(b).unwrap();
        assert!(e.abort(b).is_err());
        assert!(e.abort(a).is_err());
        let out = run(&mut e);
        assert_eq!(out[0].finish, Some(FinishReason::Aborted));
        assert_eq!(e.metrics().requests_aborted, 1);
        assert!(!e.has_work());
    }
}
