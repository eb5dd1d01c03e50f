//! Penalties and logit bias: speculative output follows the changed target distribution
//! exactly (greedy equal to a target-only loop under the same penalties; sampled tokens by
//! chi-square), log-probabilities are the changed distribution's, and bad values are typed.

use std::collections::HashMap;

use crate::sampling_common::{assert_follows, reference_probs};
use crate::speculator_common::{Mode, ToyLm, argmax, mix};
use crate::toy_engine::{
    V, budgeted, drain, engine, joint, lm, mixed_ids, pair_counts, sampled_pairs,
};
use dspark::engine::{Budget, EngineConfig, Penalties, RequestId, RequestSpec};
use dspark::policy::VerifyPolicy;

/// An independent reading of the rules: repetition (prompt or generated), then presence and
/// frequency (generated), then the bias.
fn penalize(row: &mut [f32], prompt: &[u32], generated: &[u32], p: &Penalties) {
    for (v, x) in row.iter_mut().enumerate() {
        let c = generated.iter().filter(|&&t| t as usize == v).count() as f32;
        if p.repetition != 1.0 && (c > 0.0 || prompt.contains(&(v as u32))) {
            *x = if *x > 0.0 {
                *x / p.repetition
            } else {
                *x * p.repetition
            };
        }
        if c > 0.0 {
            *x -= p.presence + p.frequency * c;
        }
        for &(id, b) in &p.logit_bias {
            if id as usize == v {
                *x += b;
            }
        }
    }
}

fn row(lm: &ToyLm, prompt: &[u32], generated: &[u32], p: &Penalties) -> Vec<f32> {
    let mut ctx = prompt.to_vec();
    ctx.extend_from_slice(generated);
    let mut r = lm.next_logits(&ctx);
    penalize(&mut r, prompt, generated, p);
    r
}

fn penalties(i: u64) -> Penalties {
    match i % 4 {
        0 => Penalties::default(),
        1 => Penalties {
            frequency: 2.0,
            ..Penalties::default()
        },
        2 => Penalties {
            presence: 1.5,
            repetition: 1.4,
            ..Penalties::default()
        },
        _ => Penalties {
            frequency: 0.5,
            repetition: 0.8,
            logit_bias: vec![((i * 7 % V as u64) as u32, 3.0), (5, -100.0), (2, 1.0)],
            ..Penalties::default()
        },
    }
}

fn prompt(i: u64) -> Vec<u32> {
    mixed_ids(i * 1000, 1 + (mix(i) % 7) as usize)
}

#[test]
fn greedy_under_penalties_equals_the_penalized_target_with_its_logprobs() {
    let lm = lm();
    for (case, (verify, kv)) in [
        (VerifyPolicy::Full, None),
        (VerifyPolicy::Full, Some(56)),
        (VerifyPolicy::ScheduledMeasured, None),
    ]
    .into_iter()
    .enumerate()
    {
        let mut e = engine(
            Mode::Greedy { corrupt_every: 4 },
            budgeted(verify, 4, 64, kv),
        );
        let mut specs: HashMap<RequestId, RequestSpec> = HashMap::new();
        for i in 0..10u64 {
            let mut s = RequestSpec::new(prompt(i + 31 * case as u64), 20);
            s.penalties = penalties(i);
            s.logprobs = Some(2);
            specs.insert(e.add_request(s.clone()).unwrap(), s);
        }
        let got = drain(&mut e);
        for (id, s) in &specs {
            let toks = &got[id].tokens;
            let lps: Vec<f32> = got[id].logprobs.iter().map(|l| l.logprob).collect();
            let mut want = Vec::new();
            for _ in 0..s.max_new_tokens {
                let r = row(&lm, &s.prompt, &want, &s.penalties);
                want.push(argmax(&r));
            }
            assert_eq!(toks, &want, "case {case}: {:?}", s.penalties);
            for (n, &lp) in lps.iter().enumerate() {
                let r = row(&lm, &s.prompt, &toks[..n], &s.penalties);
                let p = reference_probs(&r, 1.0, None, 1.0);
                let ln = p[toks[n] as usize].ln();
                assert!((f64::from(lp) - ln).abs() < 1e-4, "case {case}, token {n}");
            }
        }
        if kv.is_some() {
            assert!(e.metrics().preemptions > 0);
        }
    }
}

#[test]
fn sampled_tokens_follow_the_penalized_distribution() {
    // The first two tokens over many seeds against the exact joint distribution: the second
    // token's row is penalized by the first (frequency, presence) and both by the prompt
    // (repetition) and the bias.
    let lm = lm();
    let p = prompt(5);
    let pen = Penalties {
        presence: 0.5,
        frequency: 1.0,
        repetition: 1.3,
        logit_bias: vec![(p[0], 2.0), (9, -3.0)],
    };
    let t = 0.9;
    let probs = |generated: &[u32]| reference_probs(&row(&lm, &p, generated, &pen), t, None, 1.0);
    let exact = joint(probs);
    let mut e = engine(
        Mode::Sampling,
        EngineConfig {
            verify: VerifyPolicy::Full,
            budget: Budget {
                max_running: 32,
                max_batched_tokens: 512,
                kv_tokens: None,
            },
            ..EngineConfig::default()
        },
    );
    let trials = 20_000u64;
    let pairs = sampled_pairs(&mut e, &p, t, (trials, 0xFACE), |s| {
        s.penalties = pen.clone();
    });
    let counts = pair_counts(&pairs);
    assert_follows(&counts, &exact, "first two tokens under penalties");
    // The penalties' own effect, with power: how often the second token repeats the first
    // (its row is penalized by the first), against the exact probability (5 sigma).
    let repeat: f64 = (0..V).map(|a| exact[a * V + a]).sum();
    let seen: u64 = (0..V).map(|a| counts[a * V + a]).sum();
    let n = trials as f64;
    let sd = (n * repeat * (1.0 - repeat)).sqrt();
    assert!(
        (seen as f64 - n * repeat).abs() < 5.0 * sd + 1.0,
        "repeats: {seen} vs {:.1} expected",
        n * repeat
    );
    assert!(n * repeat > 30.0, "the check has power: {:.1}", n * repeat);
}

#[test]
fn bad_penalties_are_refused_naming_the_field() {
    let mut e = engine(Mode::Greedy { corrupt_every: 0 }, EngineConfig::default());
    for (pen, code, field) in [
        (
            Penalties {
                frequency: -2.5,
                ..Penalties::default()
            },
            "invalid-argument",
            "frequency_penalty",
        ),
        (
            Penalties {
                presence: f32::NAN,
                ..Penalties::default()
            },
            "invalid-argument",
            "presence_penalty",
        ),
        (
            Penalties {
                logit_bias: vec![(V as u32, 1.0)],
                ..Penalties::default()
            },
            "token-out-of-range",
            "logit_bias",
        ),
    ] {
        let mut s = RequestSpec::new(vec![1, 2], 3);
        s.penalties = pen;
        let err = e.add_request(s).unwrap_err();
        assert_eq!(err.code(), code);
        assert!(err.to_string().contains(field), "{err}");
    }
}
