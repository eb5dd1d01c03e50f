//! Log-probabilities of the serving engine's tokens: each one is the target's, under the
//! distribution the token was drawn from, at its own position, whatever the rounds were:
//! first tokens from the prefill, accepted drafts, bonus tokens, preempted and resumed
//! requests, greedy and sampled, full and scheduled verification.

use std::collections::HashMap;

use crate::sampling_common::reference_probs;
use crate::speculator_common::{Mode, mix};
use crate::toy_engine::{V, budgeted, drain, engine, lm, mixed_ids};
use dspark::engine::{EngineConfig, RequestId, RequestSpec, SamplingParams};
use dspark::policy::VerifyPolicy;
use dspark::sampling::{MAX_TOP_LOGPROBS, TokenLogprob};

const TOP: usize = 4;

fn request(i: u64, sampled: bool) -> RequestSpec {
    let len = 1 + (mix(i) % 8) as usize;
    let mut s = RequestSpec::new(mixed_ids(i * 1000, len), 6 + (mix(i + 40) % 20) as usize);
    s.logprobs = (i % 5 != 4).then_some(TOP);
    if sampled {
        s.sampling = SamplingParams {
            temperature: 0.8,
            top_k: i.is_multiple_of(2).then_some(9),
            top_p: if i.is_multiple_of(3) { 0.9 } else { 1.0 },
        };
        s.seed = i;
    }
    s
}

/// The reference entry of `token` after `ctx`: the target's distribution (the raw softmax for
/// a greedy request), `ln p` of the token and the `TOP` likeliest tokens of nonzero mass.
fn reference(e_lm: &crate::speculator_common::ToyLm, ctx: &[u32], s: &RequestSpec) -> Vec<f64> {
    let row = e_lm.next_logits(ctx);
    let p = &s.sampling;
    if p.is_greedy() {
        reference_probs(&row, 1.0, None, 1.0)
    } else {
        reference_probs(&row, p.temperature, p.top_k, p.top_p)
    }
}

fn check(
    lm: &crate::speculator_common::ToyLm,
    s: &RequestSpec,
    toks: &[u32],
    lps: &[TokenLogprob],
) {
    if s.logprobs.is_none() {
        assert!(lps.is_empty());
        return;
    }
    assert_eq!(lps.len(), toks.len(), "one entry per token");
    let mut ctx = s.prompt.clone();
    for (n, (lp, &t)) in lps.iter().zip(toks).enumerate() {
        assert_eq!(lp.token, t);
        let p = reference(lm, &ctx, s);
        assert!(p[t as usize] > 0.0, "token {n} was drawn from the kept set");
        let want = p[t as usize].ln();
        assert!(
            (f64::from(lp.logprob) - want).abs() < 1e-4,
            "token {n}: {lp:?} vs {want}"
        );
        let mut order: Vec<usize> = (0..V).filter(|&v| p[v] > 0.0).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        order.truncate(TOP);
        let ids: Vec<usize> = lp.top.iter().map(|&(id, _)| id as usize).collect();
        assert_eq!(ids, order, "token {n}: the likeliest tokens");
        for &(id, v) in &lp.top {
            assert!((f64::from(v) - p[id as usize].ln()).abs() < 1e-4);
        }
        ctx.push(t);
    }
}

#[test]
fn logprobs_are_the_targets_at_every_position_whatever_the_rounds() {
    let lm = lm();
    let cases = [
        (
            Mode::Greedy { corrupt_every: 3 },
            VerifyPolicy::Full,
            None,
            false,
        ),
        (
            Mode::Greedy { corrupt_every: 2 },
            VerifyPolicy::Full,
            Some(48),
            false,
        ),
        (Mode::Sampling, VerifyPolicy::Full, Some(48), true),
        (Mode::Sampling, VerifyPolicy::ScheduledMeasured, None, true),
    ];
    for (case, (mode, verify, kv, sampled)) in cases.into_iter().enumerate() {
        let mut e = engine(mode, budgeted(verify, 4, 64, kv));
        let mut specs: HashMap<RequestId, RequestSpec> = HashMap::new();
        for i in 0..10u64 {
            let s = request(i + 10 * case as u64, sampled && i % 4 != 1);
            specs.insert(e.add_request(s.clone()).unwrap(), s);
        }
        let got = drain(&mut e);
        for (id, s) in &specs {
            let r = &got[id];
            assert_eq!(r.tokens.len(), s.max_new_tokens, "case {case}");
            check(&lm, s, &r.tokens, &r.logprobs);
        }
        if kv.is_some() {
            assert!(
                e.metrics().preemptions > 0,
                "case {case}: the budget preempts"
            );
        }
    }
}

#[test]
fn too_many_alternatives_are_refused() {
    let mut e = engine(Mode::Greedy { corrupt_every: 0 }, EngineConfig::default());
    let mut s = request(1, false);
    s.logprobs = Some(MAX_TOP_LOGPROBS + 1);
    let err = e.add_request(s).unwrap_err();
    assert_eq!(err.code(), "invalid-argument");
    assert!(err.to_string().contains("logprobs"), "{err}");
}
