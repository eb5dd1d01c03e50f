//! The serving engine over the toy target (64 ids, 4 layers of 8, seed 17; continuous
//! batching) and the oracle drafter (6 slots, capturing layers 1 and 3), as the request-option
//! tests (log-probabilities, penalties, grammars) build it, and the runs they share.

use std::collections::HashMap;

use crate::speculator_common::{Mode, OracleDrafter, ToyLm, ToyTarget, mix};
use dspark::engine::{Budget, Engine, EngineConfig, RequestId, RequestSpec, SamplingParams};
use dspark::policy::VerifyPolicy;
use dspark::sampling::TokenLogprob;

/// Target vocabulary.
pub const V: usize = 64;
/// Draft slots.
pub const K: usize = 6;
/// The toy's layers.
pub const LAYERS: usize = 4;
/// The toy's hidden width.
pub const HIDDEN: usize = 8;
/// The layers the drafter captures.
pub const CAPTURE: [usize; 2] = [1, 3];

/// The toy target (fixed size).
pub fn toy() -> ToyTarget {
    ToyTarget::new(V, LAYERS, HIDDEN, 17)
}

/// The toy's language model (the logits every engine below serves).
pub fn lm() -> ToyLm {
    toy().lm
}

/// An engine drafting with `mode` under `config`.
pub fn engine(mode: Mode, config: EngineConfig) -> Engine<ToyTarget, OracleDrafter> {
    let t = toy().into_resizable();
    let d = OracleDrafter::new(&t, K, &CAPTURE, mode);
    Engine::new(t, d, config).unwrap()
}

/// A config verifying by `verify` with at most `max_running` requests, `max_batched_tokens`
/// tokens a step and `kv_tokens` of cache.
pub fn budgeted(
    verify: VerifyPolicy,
    max_running: usize,
    max_batched_tokens: usize,
    kv_tokens: Option<usize>,
) -> EngineConfig {
    EngineConfig {
        verify,
        budget: Budget {
            max_running,
            max_batched_tokens,
            kv_tokens,
        },
        ..EngineConfig::default()
    }
}

/// `len` ids below [`V`] from the stream keyed `key` (id `j` is `mix(key + j) mod V`).
pub fn mixed_ids(key: u64, len: usize) -> Vec<u32> {
    (0..len)
        .map(|j| (mix(key + j as u64) % V as u64) as u32)
        .collect()
}

/// What one request gave over a run.
#[derive(Debug, Default)]
pub struct Ran {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// Their log-probability entries (when asked for).
    pub logprobs: Vec<TokenLogprob>,
    /// Drafts verified for it.
    pub drafted: usize,
}

/// Step `e` until idle: what each request gave.
pub fn drain(e: &mut Engine<ToyTarget, OracleDrafter>) -> HashMap<RequestId, Ran> {
    let mut got: HashMap<RequestId, Ran> = HashMap::new();
    while e.has_work() {
        for o in e.step().unwrap().outputs {
            let r = got.entry(o.id).or_default();
            r.tokens.extend(&o.new_tokens);
            r.logprobs.extend(o.logprobs);
            r.drafted += o.drafted;
        }
    }
    got
}

/// The exact joint distribution `[V·V]` of the first two tokens, from the distribution
/// `probs(generated)` of the token after `generated`.
pub fn joint(probs: impl Fn(&[u32]) -> Vec<f64>) -> Vec<f64> {
    let mut exact = vec![0.0; V * V];
    for (a, &pa) in probs(&[]).iter().enumerate().filter(|(_, x)| **x > 0.0) {
        for (b, &pb) in probs(&[a as u32]).iter().enumerate() {
            exact[a * V + b] = pa * pb;
        }
    }
    exact
}

/// The first two tokens of `trials` two-token requests on `prompt` sampled at temperature `t`
/// (request `i` seeded `mix(i ^ salt)`, then finished by `with`).
pub fn sampled_pairs(
    e: &mut Engine<ToyTarget, OracleDrafter>,
    prompt: &[u32],
    t: f32,
    (trials, salt): (u64, u64),
    with: impl Fn(&mut RequestSpec),
) -> Vec<[u32; 2]> {
    for i in 0..trials {
        let mut s = RequestSpec::new(prompt.to_vec(), 2);
        s.sampling = SamplingParams {
            temperature: t,
            top_k: None,
            top_p: 1.0,
        };
        s.seed = mix(i ^ salt);
        with(&mut s);
        e.add_request(s).unwrap();
    }
    drain(e)
        .into_values()
        .map(|r| [r.tokens[0], r.tokens[1]])
        .collect()
}

/// Counts `[V·V]` of `pairs`.
pub fn pair_counts(pairs: &[[u32; 2]]) -> Vec<u64> {
    let mut counts = vec![0u64; V * V];
    for &[a, b] in pairs {
        counts[a as usize * V + b as usize] += 1;
    }
    counts
}
