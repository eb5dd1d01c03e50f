//! The serving engine: requests join, leave, are aborted and preempted between rounds; greedy
//! output equals the target's own, a seeded request's sampled tokens do not depend on its
//! batch or arrival, sampled output follows the target distribution, and bad input is a typed
//! error. Doubles: the toy target (resizable) and the oracle drafter of `speculator_common`.

use std::collections::HashMap;

use crate::sampling_common::{assert_follows, reference_probs};
use crate::speculator_common::{Fault, Mode, OracleDrafter, ToyTarget, mix};
use crate::toy_engine::{CAPTURE, HIDDEN, K, LAYERS, V, budgeted, mixed_ids};
use dspark::engine::{
    Budget, Engine, EngineConfig, FinishReason, RequestId, RequestSpec, SamplingParams,
};
use dspark::policy::VerifyPolicy;
use dspark::speculator::{Request, Speculator, SpeculatorOptions, TargetModel};

fn toy() -> ToyTarget {
    crate::toy_engine::toy().into_resizable()
}

fn engine(mode: Mode, config: EngineConfig) -> Engine<ToyTarget, OracleDrafter> {
    let t = toy();
    let d = OracleDrafter::new(&t, K, &CAPTURE, mode);
    Engine::new(t, d, config).unwrap()
}

fn prompt(seed: u64, len: usize) -> Vec<u32> {
    mixed_ids(seed * 1000, len)
}

fn spec(seed: u64, len: usize, max: usize) -> RequestSpec {
    RequestSpec::new(prompt(seed, len), max)
}

fn sampled(mut s: RequestSpec, seed: u64) -> RequestSpec {
    s.sampling = SamplingParams {
        temperature: 0.9,
        top_k: None,
        top_p: 1.0,
    };
    s.seed = seed;
    s.repeatable = true;
    s
}

/// Every request's tokens and finish reason.
type Done = HashMap<RequestId, (Vec<u32>, FinishReason)>;

/// Step until idle, adding `later[s]` before step `s`; returns the requests added and what
/// each did.
fn serve(
    e: &mut Engine<ToyTarget, OracleDrafter>,
    mut later: HashMap<usize, Vec<RequestSpec>>,
    abort_at: &[(usize, usize)],
) -> (Vec<(RequestId, RequestSpec)>, Done) {
    let mut added: Vec<(RequestId, RequestSpec)> = Vec::new();
    let mut tokens: HashMap<RequestId, Vec<u32>> = HashMap::new();
    let mut done = HashMap::new();
    let mut step = 0;
    loop {
        for s in later.remove(&step).unwrap_or_default() {
            let id = e.add_request(s.clone()).unwrap();
            added.push((id, s));
        }
        for &(at, which) in abort_at {
            if at == step
                && let Some((id, _)) = added.get(which)
                && !done.contains_key(id)
            {
                e.abort(*id).unwrap();
            }
        }
        if !e.has_work() && later.is_empty() {
            break;
        }
        let out = e.step().unwrap();
        for o in out.outputs {
            tokens.entry(o.id).or_default().extend(o.new_tokens);
            if let Some(f) = o.finish {
                done.insert(o.id, (tokens.remove(&o.id).unwrap_or_default(), f));
            }
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    (added, done)
}

#[test]
fn greedy_equals_the_target_under_random_arrivals_aborts_and_preemptions() {
    let lm = toy().lm;
    for (case, (policy, kv)) in [
        (VerifyPolicy::Full, None),
        (VerifyPolicy::Full, Some(60)),
        (VerifyPolicy::Threshold(0.5), Some(52)),
    ]
    .into_iter()
    .enumerate()
    {
        let config = budgeted(policy, 5, 64, kv);
        let mut e = engine(Mode::Greedy { corrupt_every: 3 }, config);
        let mut later: HashMap<usize, Vec<RequestSpec>> = HashMap::new();
        for i in 0..14u64 {
            let at = (mix(i * 7 + case as u64) % 12) as usize;
            let mut s = spec(
                i + 1,
                1 + (mix(i) % 9) as usize,
                3 + (mix(i + 50) % 30) as usize,
            );
            s.max_drafts = Some((mix(i + 9) % (K as u64 + 1)) as usize);
            later.entry(at).or_default().push(s);
        }
        let (added, done) = serve(&mut e, later, &[(6, 2), (9, 5)]);
        assert_eq!(done.len(), added.len(), "every request ends");
        for (id, s) in &added {
            let (toks, finish) = &done[id];
            if *finish == FinishReason::Aborted {
                let want = lm.greedy(&s.prompt, s.max_new_tokens);
                assert!(want.starts_with(toks), "aborted mid-way keeps a prefix");
                continue;
            }
            assert_eq!(*finish, FinishReason::Length);
            assert_eq!(
                toks,
                &lm.greedy(&s.prompt, s.max_new_tokens),
                "case {case}: {id}"
            );
        }
        let m = e.metrics();
        assert_eq!(m.requests_running + m.requests_waiting, 0);
        assert_eq!(m.requests_added, added.len() as u64);
        assert_eq!(
            m.requests_length + m.requests_aborted,
            added.len() as u64,
            "{m:?}"
        );
        if kv.is_some() {
            assert!(m.preemptions > 0, "case {case}: the budget preempts: {m:?}");
        }
        assert!(m.num_accepted_tokens <= m.num_draft_tokens);
        let per_pos: u64 = m.num_accepted_tokens_per_pos.iter().sum();
        assert_eq!(per_pos, m.num_accepted_tokens);
    }
}

/// A seeded sampled request's tokens, served alone.
fn alone(s: &RequestSpec, kv: Option<usize>) -> Vec<u32> {
    let config = EngineConfig {
        budget: Budget {
            kv_tokens: kv,
            ..Budget::default()
        },
        ..EngineConfig::default()
    };
    let mut e = engine(Mode::Sampling, config);
    let id = e.add_request(s.clone()).unwrap();
    let (_, done) = serve(&mut e, HashMap::new(), &[]);
    done[&id].0.clone()
}

#[test]
fn a_seeded_request_ignores_its_batch_its_arrival_and_preemption() {
    let probe = sampled(spec(3, 5, 30), 4242);
    let want = alone(&probe, None);
    assert_eq!(want.len(), 30);
    // In a batch of 16 with mates of other seeds and temperatures, in any position.
    for position in [0usize, 7, 15] {
        let mut e = engine(Mode::Sampling, EngineConfig::default());
        let mut now = Vec::new();
        for j in 0..16u64 {
            if j as usize == position {
                now.push(probe.clone());
            } else {
                let mut mate = sampled(spec(100 + j, 1 + j as usize % 7, 10 + j as usize), j);
                mate.sampling.temperature = [0.0, 0.5, 1.3][j as usize % 3];
                now.push(mate);
            }
        }
        let (added, done) = serve(&mut e, HashMap::from([(0, now)]), &[]);
        let id = added[position].0;
        assert_eq!(done[&id].0, want, "in a batch at {position}");
    }
    // Joining a running batch mid-run.
    let mut e = engine(Mode::Sampling, EngineConfig::default());
    let first: Vec<RequestSpec> = (0..6).map(|j| sampled(spec(200 + j, 4, 25), j)).collect();
    let (added, done) = serve(
        &mut e,
        HashMap::from([(0, first), (5, vec![probe.clone()])]),
        &[],
    );
    assert_eq!(done[&added[6].0].0, want, "joining at step 5");
    // Preempted and resumed under a tight KV budget: the same tokens.
    let config = EngineConfig {
        budget: Budget {
            max_running: 8,
            max_batched_tokens: 64,
            kv_tokens: Some(70),
        },
        ..EngineConfig::default()
    };
    let mut e = engine(Mode::Sampling, config);
    let mates: Vec<RequestSpec> = (0..3).map(|j| sampled(spec(300 + j, 3, 30), j)).collect();
    let (added, done) = serve(
        &mut e,
        HashMap::from([(0, mates), (2, vec![probe.clone()])]),
        &[],
    );
    assert!(e.metrics().preemptions > 0, "the budget preempts");
    assert_eq!(done[&added[3].0].0, want, "preempted and resumed");
    let usage: usize = done.len();
    assert_eq!(usage, 4);
}

#[test]
fn sampled_output_follows_the_target_under_continuous_batching() {
    // The first two tokens of a request joining a busy batch, over many seeds, against the
    // exact joint distribution of the toy target at temperature 0.9.
    let lm = toy().lm;
    let p = prompt(77, 3);
    let temperature = 0.9;
    let probs = |ctx: &[u32]| reference_probs(&lm.next_logits(ctx), temperature, None, 1.0);
    let mut exact = vec![0.0; V * V];
    let p1 = probs(&p);
    for (a, &pa) in p1.iter().enumerate().filter(|(_, x)| **x > 0.0) {
        let mut ctx = p.clone();
        ctx.push(a as u32);
        for (b, &pb) in probs(&ctx).iter().enumerate() {
            exact[a * V + b] = pa * pb;
        }
    }
    let trials = 3000u64;
    let mut counts = vec![0u64; V * V];
    let mut e = engine(
        Mode::Sampling,
        EngineConfig {
            budget: Budget {
                max_running: 24,
                max_batched_tokens: 256,
                kv_tokens: Some(400),
            },
            ..EngineConfig::default()
        },
    );
    let mut later: HashMap<usize, Vec<RequestSpec>> = HashMap::new();
    for i in 0..trials {
        let s = sampled(
            RequestSpec::new(p.clone(), 2 + (i % 5) as usize),
            mix(i ^ 0xBEEF),
        );
        later.entry((i / 20) as usize).or_default().push(s);
    }
    let (_, done) = serve(&mut e, later, &[]);
    for (toks, _) in done.values() {
        counts[toks[0] as usize * V + toks[1] as usize] += 1;
    }
    assert_follows(
        &counts,
        &exact,
        "first two tokens under continuous batching",
    );
}

#[test]
fn the_batch_api_runs_on_the_engine_with_the_same_tokens() {
    // Speculator::generate over a resizable target (continuous engine) and a fixed one
    // (static batch) give the same tokens, greedy and seeded sampled.
    let reqs: Vec<Request> = (0..5)
        .map(|i| Request {
            seed: Some(90 + i),
            ..Request::new(prompt(i + 40, 2 + i as usize), 12 + i as usize)
        })
        .collect();
    for temperature in [0.0, 0.8] {
        let options = SpeculatorOptions {
            temperature,
            ..SpeculatorOptions::default()
        };
        let run = |t: ToyTarget| {
            let d = OracleDrafter::new(&t, K, &CAPTURE, Mode::Sampling);
            Speculator::new(t, d, options.clone())
                .unwrap()
                .generate(&reqs, None)
                .unwrap()
                .tokens
        };
        let fixed = run(ToyTarget::new(V, LAYERS, HIDDEN, 17));
        let resizable = run(toy());
        assert_eq!(fixed, resizable, "T = {temperature}");
    }
}

#[test]
fn bad_requests_and_ids_are_typed_errors() {
    let mut e = engine(
        Mode::Greedy { corrupt_every: 0 },
        EngineConfig {
            budget: Budget {
                max_running: 4,
                max_batched_tokens: 32,
                kv_tokens: Some(100),
            },
            ..EngineConfig::default()
        },
    );
    let code = |r: dspark::Result<RequestId>| r.unwrap_err().code();
    assert_eq!(
        code(e.add_request(RequestSpec::new(vec![], 3))),
        "invalid-argument"
    );
    assert_eq!(
        code(e.add_request(RequestSpec::new(vec![V as u32], 3))),
        "token-out-of-range"
    );
    let mut s = spec(1, 3, 5);
    s.sampling.temperature = f32::NAN;
    let err = e.add_request(s).unwrap_err();
    assert_eq!(err.code(), "invalid-argument");
    assert!(err.to_string().contains("temperature"), "{err}");
    let mut s = spec(1, 3, 5);
    s.sampling.top_p = 0.0;
    assert!(e.add_request(s).unwrap_err().to_string().contains("top_p"));
    let mut s = spec(1, 3, 5);
    s.max_drafts = Some(K + 1);
    assert!(
        e.add_request(s)
            .unwrap_err()
            .to_string()
            .contains("max_drafts")
    );
    // Never fits the KV budget, even alone; a prompt past max_batched_tokens.
    let err = e.add_request(spec(1, 10, 95)).unwrap_err();
    assert_eq!(err.code(), "too-large");
    assert!(err.to_string().contains("kv_tokens"), "{err}");
    let err = e.add_request(spec(1, 40, 2)).unwrap_err();
    assert!(err.to_string().contains("max_batched_tokens"), "{err}");
    // Unknown and finished ids.
    assert_eq!(
        e.abort(RequestId(999)).unwrap_err().code(),
        "invalid-argument"
    );
    let id = e.add_request(spec(2, 2, 2)).unwrap();
    while e.has_work() {
        e.step().unwrap();
    }
    assert_eq!(e.abort(id).unwrap_err().code(), "invalid-argument");
    // Nothing was left behind by the refused requests.
    assert_eq!(e.metrics().requests_added, 1);
    // A target that cannot resize its cache is refused at construction.
    let t = ToyTarget::new(V, LAYERS, HIDDEN, 17);
    assert!(!TargetModel::resizable(&t));
    let d = OracleDrafter::new(&t, K, &CAPTURE, Mode::Sampling);
    let err = Engine::new(t, d, EngineConfig::default()).err().unwrap();
    assert_eq!(err.code(), "invalid-argument");
}

#[test]
fn an_abort_from_another_thread_takes_effect_at_the_next_step() {
    let mut e = engine(Mode::Greedy { corrupt_every: 0 }, EngineConfig::default());
    let id = e.add_request(spec(5, 3, 500)).unwrap();
    let other = e.add_request(spec(6, 3, 20)).unwrap();
    e.step().unwrap();
    let handle = e.abort_handle();
    std::thread::spawn(move || handle.abort(id).unwrap())
        .join()
        .unwrap();
    let out = e.step().unwrap();
    let o = out.outputs.iter().find(|o| o.id == id).unwrap();
    assert_eq!(o.finish, Some(FinishReason::Aborted));
    assert!(o.new_tokens.is_empty());
    assert_eq!(e.num_running(), 1);
    // Its row is gone from the target's cache.
    let mut finished = false;
    while e.has_work() {
        for o in e.step().unwrap().outputs {
            finished |= o.id == other && o.finish == Some(FinishReason::Length);
        }
    }
    assert!(finished);
    assert_eq!(e.metrics().requests_aborted, 1);
}

#[test]
fn the_resizable_toy_passes_the_target_contract() {
    dspark::speculator::contract::check_target(&toy(), &CAPTURE).unwrap();
}

#[test]
fn warm_up_profiles_the_scheduler_before_any_request() {
    let config = EngineConfig {
        verify: VerifyPolicy::ScheduledMeasured,
        ..EngineConfig::default()
    };
    let mut e = engine(Mode::Greedy { corrupt_every: 3 }, config);
    assert!(e.measured_steps_per_second().is_none());
    e.warm_up(4).unwrap();
    let table = e.measured_steps_per_second().expect("profiled");
    let largest = table.points().iter().map(|p| p.0).max().unwrap_or(0);
    assert!(largest >= 4 * (K + 1), "{table:?}");
    // Serving after it gives the target's greedy tokens, like any other engine.
    let id = e.add_request(spec(3, 5, 12)).unwrap();
    let mut tokens = Vec::new();
    while e.has_work() {
        for out in e.step().unwrap().outputs {
            assert_eq!(out.id, id);
            tokens.extend(out.new_tokens);
        }
    }
    assert_eq!(tokens.len(), 12);
    // Under a policy that does not schedule it measures nothing.
    let mut full = engine(
        Mode::Greedy { corrupt_every: 3 },
        EngineConfig {
            verify: VerifyPolicy::Full,
            ..EngineConfig::default()
        },
    );
    full.warm_up(4).unwrap();
    assert!(full.measured_steps_per_second().is_none());
}

/// A request whose rows go non-finite (at its prefill, rounds later, or in the drafter) ends
/// alone with `FinishReason::Error` and a typed code; every other request's tokens are its
/// solo run's.
#[test]
fn a_request_whose_rows_fail_ends_alone_and_the_others_run_on() {
    const POISON: u32 = 61;
    let good = |seed: u64, len: usize, max: usize| {
        let mut s = sampled(spec(seed, len, max), seed * 31);
        if s.prompt[0] == POISON {
            s.prompt[0] = 0;
        }
        s
    };
    // At the prefill, in a round (its third position's), in the drafter (its first proposal).
    for (case, (from, drafter)) in [(0usize, false), (9, false), (7, true)]
        .into_iter()
        .enumerate()
    {
        let mut t = toy();
        let mut d = OracleDrafter::new(&t, K, &CAPTURE, Mode::Sampling);
        if drafter {
            d.fault = Fault::NonFiniteFor(POISON);
        } else {
            t.poison = Some((POISON, from));
        }
        let mut e = Engine::new(t, d, EngineConfig::default()).unwrap();
        let mut goods = Vec::new();
        let mut bad = Vec::new();
        for j in 0..9u64 {
            if j % 3 == 1 {
                // Six prompt tokens: with `from = 9` it fails in its third position's round.
                let mut s = sampled(spec(200 + j, 6, 20), j);
                s.prompt[0] = POISON;
                bad.push(e.add_request(s).unwrap());
            } else {
                let mut s = good(300 + j, 2 + j as usize % 5, 12 + j as usize);
                if j == 4 {
                    s.sampling.temperature = 0.0;
                }
                goods.push((e.add_request(s.clone()).unwrap(), s));
            }
        }
        let mut tokens: HashMap<RequestId, Vec<u32>> = HashMap::new();
        let mut ended = HashMap::new();
        let mut steps = 0;
        while e.has_work() {
            for o in e.step().unwrap().outputs {
                tokens.entry(o.id).or_default().extend(&o.new_tokens);
                assert_eq!(o.finish == Some(FinishReason::Error), o.error.is_some());
                if let Some(f) = o.finish {
                    ended.insert(o.id, (f, o.error));
                }
            }
            steps += 1;
            assert!(steps < 1000, "the engine does not finish");
        }
        for id in &bad {
            let (f, err) = &ended[id];
            assert_eq!(*f, FinishReason::Error, "case {case}: {id}");
            let err = err.as_ref().unwrap();
            assert!(
                ["non-finite", "invalid-argument"].contains(&err.code),
                "{err:?}"
            );
            let n = tokens.get(id).map_or(0, Vec::len);
            assert!(
                n <= from.saturating_sub(6) + 1,
                "case {case}: kept {n} tokens"
            );
        }
        for (id, s) in &goods {
            assert_eq!(ended[id].0, FinishReason::Length, "case {case}: {id}");
            assert_eq!(tokens[id], alone(s, None), "case {case}: {id} as alone");
        }
        let m = e.metrics();
        assert_eq!(m.requests_failed, bad.len() as u64, "{m:?}");
        assert_eq!(m.requests_length, goods.len() as u64, "{m:?}");
        assert_eq!(m.requests_running + m.requests_waiting, 0);
    }
}
