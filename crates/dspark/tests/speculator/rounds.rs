//! The speculative loop end to end on test doubles ([`ToyTarget`], [`OracleDrafter`]) and on the
//! real candle `Qwen3Drafter`: greedy output equals target-only decoding for every policy and
//! verify length, stop tokens and budgets per request, the streaming callback, per-request seeds,
//! statistical losslessness (chi-square on the exact toy distribution), statistics, the cache
//! bookkeeping (the drafter context holds exactly the committed tokens at their positions), and
//! typed errors.
use crate::sampling_common::{assert_differs, assert_follows, reference_probs};
use crate::speculator_common::{Fault, Mode, OracleDrafter, Rows, ToyTarget, mix};
use crate::toy_engine::{CAPTURE, HIDDEN, K, LAYERS, V, mixed_ids, toy};
use dspark::Error;
use dspark::policy::StepsPerSecond;
use dspark::speculator::{
    Generation, LogitRows, Request, RoundUpdate, Speculator, SpeculatorOptions, Stats, TargetModel,
    VerifyPolicy, target_only,
};

fn oracle(target: &ToyTarget, mode: Mode) -> OracleDrafter {
    OracleDrafter::new(target, K, &CAPTURE, mode)
}

/// Full verification (the figures these tests pin are the whole block's).
fn greedy_oracle(corrupt_every: usize) -> Speculator<ToyTarget, OracleDrafter> {
    speculator(Mode::Greedy { corrupt_every }, full_options())
}

fn full_options() -> SpeculatorOptions {
    SpeculatorOptions {
        verify: VerifyPolicy::Full,
        ..SpeculatorOptions::default()
    }
}

fn speculator(mode: Mode, options: SpeculatorOptions) -> Speculator<ToyTarget, OracleDrafter> {
    let t = toy();
    let d = oracle(&t, mode);
    Speculator::new(t, d, options).unwrap()
}

fn prompt(seed: u64, len: usize) -> Vec<u32> {
    mixed_ids(seed * 1000, len)
}

/// Prompts of lengths 1, 4, 9, 2 with budgets 23, 1, 40, 7.
fn batch() -> Vec<Request> {
    [(1, 23), (4, 1), (9, 40), (2, 7)]
        .iter()
        .enumerate()
        .map(|(i, &(len, max))| Request::new(prompt(i as u64 + 1, len), max))
        .collect()
}

fn sps() -> StepsPerSecond {
    StepsPerSecond::linear(vec![(1, 100.0), (8, 90.0), (32, 50.0)]).unwrap()
}

fn policies() -> Vec<VerifyPolicy> {
    vec![
        VerifyPolicy::Full,
        VerifyPolicy::Threshold(0.5),
        VerifyPolicy::Scheduled(sps()),
        VerifyPolicy::ScheduledMeasured,
    ]
}

/// The toy's greedy continuations, computed directly.
fn greedy_reference(requests: &[Request]) -> Vec<Vec<u32>> {
    let lm = toy().lm;
    requests
        .iter()
        .map(|r| lm.greedy(&r.prompt, r.max_new_tokens))
        .collect()
}

/// The loop's bookkeeping, checked from the doubles' logs: the drafter context of request `i` is
/// `prompt ++ out[..len-1]` (a prefix of it after plain rounds, whose features wait for the next
/// proposal), extended contiguously (prompt first, then anchor + accepted drafts of each round)
/// and never truncated; every proposal's anchor is the committed token at the
/// state's end; the target cache ends as the drafter context; a row is charged only in the
/// forwards where it has tokens; rounds and committed tokens add up.
fn check_bookkeeping(s: &Speculator<ToyTarget, OracleDrafter>, reqs: &[Request], g: &Generation) {
    let dl = s.drafter().log.borrow();
    let tl = s.target().log.borrow();
    // A context for every request that runs and may draft, made in request order when the
    // batch is admitted: state `s` belongs to the `s`-th such request.
    let drafts = s.num_speculative_tokens() > 0;
    let owners: Vec<usize> = (0..reqs.len())
        .filter(|&i| drafts && reqs[i].max_new_tokens > 0)
        .collect();
    assert_eq!(dl.states, owners.len());
    let state_of = |i: usize| owners.iter().position(|&o| o == i);
    assert_eq!(
        dl.truncates, 0,
        "the loop never needs to roll a drafter back"
    );
    let mut rounds_of = vec![0usize; reqs.len()];
    for p in &dl.proposals {
        for ((&sid, &end), &anchor) in p.states.iter().zip(&p.ends).zip(&p.anchors) {
            let id = owners[sid];
            let full: Vec<u32> = reqs[id]
                .prompt
                .iter()
                .chain(&g.tokens[id])
                .copied()
                .collect();
            assert_eq!(full[end], anchor, "request {id}: anchor at position {end}");
            rounds_of[id] += 1;
        }
    }
    for (i, r) in reqs.iter().enumerate() {
        let out = &g.tokens[i];
        let mut ctx: Vec<u32> = Vec::new();
        for e in dl.extends.iter().filter(|e| Some(e.state) == state_of(i)) {
            assert_eq!(e.start, ctx.len(), "request {i}: extends are contiguous");
            ctx.extend(&e.tokens);
        }
        let want: Vec<u32> = match out.split_last() {
            Some((_, head)) => r.prompt.iter().chain(head).copied().collect(),
            None => Vec::new(),
        };
        if state_of(i).is_none() {
            assert!(ctx.is_empty(), "request {i}: no drafter context");
        } else {
            // Features of rounds in which the request did not propose (plain rounds, its last
            // rounds with no draft left in its budget) join the context before its next
            // proposal: those after its last proposal may never be needed. Every proposal saw
            // the whole context up to its anchor (checked above).
            assert!(ctx.len() <= want.len(), "request {i}: drafter context");
            assert_eq!(ctx, want[..ctx.len()], "request {i}: drafter context");
            if rounds_of[i] > 0 {
                let last = dl
                    .proposals
                    .iter()
                    .rev()
                    .find_map(|p| {
                        p.states
                            .iter()
                            .zip(&p.ends)
                            .find(|(s, _)| Some(**s) == state_of(i))
                    })
                    .map(|(_, &e)| e);
                assert!(last.is_some_and(|e| ctx.len() >= e), "request {i}: context");
            }
        }
        assert_eq!(tl.cache[i], want, "request {i}: target cache");
        // Plain rounds, and rounds with no draft left in its budget (no proposal), charge a
        // forward too: counted in total below.
        let charged = usize::from(!out.is_empty()) + rounds_of[i];
        assert!(
            tl.row_forwards[i] >= charged,
            "request {i}: forwards charged"
        );
    }
    let plain_request_rounds = g.stats.request_rounds - rounds_of.iter().sum::<usize>();
    assert_eq!(
        tl.row_forwards.iter().sum::<usize>(),
        g.tokens.iter().filter(|t| !t.is_empty()).count()
            + rounds_of.iter().sum::<usize>()
            + plain_request_rounds,
        "every forward row is a prefill, a drafted or a plain request-round"
    );
    assert!(
        g.stats.plain_rounds <= plain_request_rounds,
        "a plain round serves one request at least"
    );
    if let Some(first) = tl.calls.first() {
        assert_eq!(
            first.logits,
            Rows::Last,
            "the prefill needs the last row only"
        );
        assert!(tl.calls[1..].iter().all(|c| c.logits == Rows::All));
        assert!(tl.calls.iter().all(|c| c.capture == CAPTURE));
    }
    let st = &g.stats;
    // A round in which no request had a draft left in its budget proposes nothing.
    assert!(st.rounds >= dl.proposals.len() + st.plain_rounds);
    assert_eq!(
        st.rounds + usize::from(!tl.calls.is_empty()),
        tl.calls.len()
    );
    assert!(st.request_rounds >= rounds_of.iter().sum::<usize>());
    let prefilled = g.tokens.iter().filter(|t| !t.is_empty()).count();
    let total: usize = g.tokens.iter().map(Vec::len).sum();
    assert_eq!(st.committed_tokens + prefilled, total);
    assert_eq!(
        st.position_accepts.iter().sum::<usize>(),
        st.accepted_tokens
    );
    for k in 0..st.position_attempts.len() {
        assert!(st.position_accepts[k] <= st.position_attempts[k]);
        if k + 1 < st.position_attempts.len() {
            assert!(st.position_attempts[k + 1] <= st.position_accepts[k]);
        }
    }
}

#[test]
fn greedy_equals_target_only_for_every_policy_and_length() {
    let reqs = batch();
    let reference = greedy_reference(&reqs);
    let base = target_only(&toy(), &SpeculatorOptions::default(), &reqs, None).unwrap();
    assert_eq!(base.tokens, reference);
    for policy in policies() {
        for n in [Some(0), Some(1), Some(3), None] {
            for corrupt_every in [0, 3, 1] {
                let options = SpeculatorOptions {
                    num_speculative_tokens: n,
                    verify: policy.clone(),
                    ..SpeculatorOptions::default()
                };
                let s = speculator(Mode::Greedy { corrupt_every }, options);
                if policy == VerifyPolicy::ScheduledMeasured {
                    // The table is profiled on the target at first use (forwards of its own
                    // that the bookkeeping below must not count): measure it first.
                    s.generate(&reqs, None).unwrap();
                    *s.target().log.borrow_mut() = Default::default();
                    *s.drafter().log.borrow_mut() = Default::default();
                }
                let g = s.generate(&reqs, None).unwrap();
                let what = format!("{} n={n:?} corrupt={corrupt_every}", policy.name());
                assert_eq!(g.tokens, reference, "{what}");
                check_bookkeeping(&s, &reqs, &g);
                let verified = g.stats.position_attempts.len();
                assert!(
                    verified <= n.unwrap_or(K),
                    "{what}: verified {verified} drafts"
                );
                if corrupt_every == 0 && policy == VerifyPolicy::Full {
                    assert_eq!(g.stats.accepted_tokens, g.stats.drafted_tokens, "{what}");
                }
            }
        }
    }
}

#[test]
fn a_scheduler_that_cannot_afford_drafts_takes_plain_steps_and_keeps_the_output() {
    // A table where a token verified with others costs a quarter more than a single step's
    // (held tokens/s past 2 tokens): a drafted round (survival <= 1) runs at least 20% below
    // a plain step, past the PLAIN_MARGIN, so the scheduler stops drafting after its first
    // round, drafting again only to refresh (or for a request without confidences yet).
    let linear = StepsPerSecond::linear(vec![(1, 1000.0), (2, 400.0)]).unwrap();
    const { assert!(dspark::speculator::PLAIN_MARGIN < 0.2) };
    let reqs: Vec<Request> = (0..5)
        .map(|i| Request::new(prompt(i + 40, 2 + i as usize), 45))
        .collect();
    let reference = greedy_reference(&reqs);
    for policy in [
        VerifyPolicy::Scheduled(linear.clone()),
        VerifyPolicy::Pipelined(linear.clone()),
    ] {
        let options = SpeculatorOptions {
            verify: policy.clone(),
            ..SpeculatorOptions::default()
        };
        let s = speculator(Mode::Greedy { corrupt_every: 3 }, options);
        let g = s.generate(&reqs, None).unwrap();
        assert_eq!(g.tokens, reference, "{}", policy.name());
        check_bookkeeping(&s, &reqs, &g);
        let st = &g.stats;
        let drafted = st.rounds - st.plain_rounds;
        assert!(st.plain_rounds > 0, "{}: {st:?}", policy.name());
        // The first round drafts (no confidences yet), then refreshes after plain streaks of
        // 1, 2, 4... up to REFRESH_ROUNDS.
        let refresh = dspark::speculator::REFRESH_ROUNDS;
        let mut bound = (1, 0, 1);
        while bound.1 < st.rounds {
            bound = (
                bound.0 + 1,
                bound.1 + 1 + bound.2,
                (bound.2 * 2).min(refresh),
            );
        }
        assert!(drafted >= 1);
        assert!(
            drafted <= bound.0,
            "{}: {drafted} drafted rounds of {}",
            policy.name(),
            st.rounds
        );
        assert!(st.plain_rounds >= 3 * drafted, "{st:?}");
    }
    // The same batch on a flat table (a forward costs the same for any size): drafting pays,
    // every round drafts.
    let flat = StepsPerSecond::linear(vec![(1, 100.0), (4096, 100.0)]).unwrap();
    let options = SpeculatorOptions {
        verify: VerifyPolicy::Scheduled(flat),
        ..SpeculatorOptions::default()
    };
    let s = speculator(Mode::Greedy { corrupt_every: 3 }, options);
    let g = s.generate(&reqs, None).unwrap();
    assert_eq!(g.tokens, reference);
    assert_eq!(g.stats.plain_rounds, 0);
    check_bookkeeping(&s, &reqs, &g);
}

#[test]
fn no_refresh_where_even_perfect_acceptance_cannot_pay_and_pending_rows_are_capped() {
    // One request on a table where two tokens cost ten times one: a drafted round cannot pay
    // even if every draft were accepted. After its first two rounds (its costs are not known
    // yet, it drafts) every round is plain: no refresh is taken.
    let steep = StepsPerSecond::linear(vec![(1, 1000.0), (2, 100.0)]).unwrap();
    let cap = dspark::speculator::PENDING_CAP;
    let reqs = vec![Request::new(prompt(77, 5), 2 * cap + 40)];
    let options = SpeculatorOptions {
        verify: VerifyPolicy::Scheduled(steep),
        ..SpeculatorOptions::default()
    };
    let s = speculator(Mode::Greedy { corrupt_every: 0 }, options);
    let g = s.generate(&reqs, None).unwrap();
    assert_eq!(g.tokens, greedy_reference(&reqs));
    check_bookkeeping(&s, &reqs, &g);
    // Two proposals (a batch size's costs need two drafted rounds timed); the only other
    // round that is not plain is its last (no draft left in its budget).
    let st = &g.stats;
    let dl = s.drafter().log.borrow();
    assert_eq!(dl.proposals.len(), 2, "{st:?}");
    assert_eq!(st.rounds - st.plain_rounds, 3, "{st:?}");
    // Its plain rounds' features wait for a proposal that never comes, until they pass the
    // cap: then they join the drafter context in calls of at most the cap (plus one round).
    let big: Vec<usize> = dl.extends.iter().map(|e| e.tokens.len()).collect();
    assert!(big.iter().all(|&n| n <= cap + K + 1), "{big:?}");
    assert!(big.iter().filter(|&&n| n >= cap).count() >= 1, "{big:?}");
    let ctx: usize = big.iter().sum();
    assert!(
        ctx >= cap && ctx + cap + K + 1 >= 5 + g.tokens[0].len(),
        "{big:?}"
    );
}

#[test]
fn warm_up_profiles_before_the_first_call_and_keeps_the_tokens() {
    let reqs = batch();
    let options = SpeculatorOptions {
        verify: VerifyPolicy::ScheduledMeasured,
        ..SpeculatorOptions::default()
    };
    let s = speculator(Mode::Greedy { corrupt_every: 3 }, options);
    s.warm_up(reqs.len()).unwrap();
    let table = s.measured_steps_per_second().expect("profiled by warm_up");
    let largest = table.points().iter().map(|p| p.0).max().unwrap_or(0);
    assert!(largest >= reqs.len() * (K + 1), "{table:?}");
    let g = s.generate(&reqs, None).unwrap();
    assert_eq!(g.tokens, greedy_reference(&reqs));
    // Under full verification it measures nothing.
    let full = speculator(Mode::Greedy { corrupt_every: 3 }, full_options());
    full.warm_up(4).unwrap();
    assert!(full.measured_steps_per_second().is_none());
}

#[test]
fn the_default_table_is_a_prior_that_runs_no_forward_of_its_own() {
    let reqs = batch();
    let options = SpeculatorOptions::default();
    assert_eq!(
        options.verify,
        VerifyPolicy::ScheduledMeasured,
        "the default policy"
    );
    let s = speculator(Mode::Greedy { corrupt_every: 3 }, options);
    assert!(s.measured_steps_per_second().is_none(), "nothing built yet");
    let g = s.generate(&reqs, None).unwrap();
    assert_eq!(g.tokens, greedy_reference(&reqs));
    // Every forward the target ran is one of the call's own: its prefill and one per round
    // (no profile, no throwaway cache).
    let calls = s.target().log.borrow().calls.len();
    assert_eq!(
        calls,
        1 + g.stats.rounds,
        "{calls} forwards, {} rounds",
        g.stats.rounds
    );
    let table = s.measured_steps_per_second().unwrap();
    let sizes: Vec<usize> = table.points().iter().map(|p| p.0).collect();
    // The prior's sizes: every size up to two rows of K + 1 tokens (the batch's rows here),
    // then sizes at most 50% apart, up to the first round's B·(K + 1) (a budget of 1 ends at
    // the prefill), and every count a round timed.
    let first_round = reqs.iter().filter(|r| r.max_new_tokens > 1).count();
    let max = first_round * (K + 1);
    let dense = (2 * (K + 1)).min(max);
    for n in 1..=dense {
        assert!(sizes.contains(&n), "{n} not priced: {sizes:?}");
    }
    assert!(sizes.contains(&max), "{sizes:?}");
    assert!(
        table.points().iter().all(|p| p.1.is_finite() && p.1 > 0.0),
        "{table:?}"
    );
    // A second call keeps the profile's sizes and the table stays valid. (The sizes a line
    // through the round timings adds move with those timings, so a loaded machine may add or
    // drop some of them: only the profile's are asserted.)
    s.generate(&reqs, None).unwrap();
    let again = s.measured_steps_per_second().unwrap();
    for n in (1..=dense).chain([max]) {
        assert!(again.points().iter().any(|p| p.0 == n), "{n}: {again:?}");
    }
    assert!(again.points().iter().all(|p| p.1.is_finite() && p.1 > 0.0));
    // A batch past MAX_PROFILE_TOKENS verified tokens prices up to that size only (a budget
    // of 3 leaves one draft to verify after the prefill: every request drafts once).
    let many: Vec<Request> = (0..600)
        .map(|i| Request::new(prompt(i + 100, 1), 3))
        .collect();
    let big = speculator(
        Mode::Greedy { corrupt_every: 3 },
        SpeculatorOptions {
            verify: VerifyPolicy::ScheduledMeasured,
            ..SpeculatorOptions::default()
        },
    );
    big.generate(&many, None).unwrap();
    let cap = dspark::speculator::MAX_PROFILE_TOKENS;
    assert!(many.len() * (K + 1) > cap);
    let last = big
        .measured_steps_per_second()
        .unwrap()
        .points()
        .last()
        .unwrap()
        .0;
    assert_eq!(last, cap);
    // A table given by the caller is used as given: nothing is measured.
    let given = speculator(
        Mode::Greedy { corrupt_every: 3 },
        SpeculatorOptions {
            verify: VerifyPolicy::Scheduled(sps()),
            ..SpeculatorOptions::default()
        },
    );
    given.generate(&reqs, None).unwrap();
    assert!(given.measured_steps_per_second().is_none());
}

#[test]
fn profiling_sizes_out_of_range_are_typed_errors() {
    use dspark::limits::{MAX_BATCH, MAX_BLOCK};
    use dspark::speculator::measure_steps_per_second;
    let t = toy();
    let code = |max: usize, row: usize| measure_steps_per_second(&t, max, row).unwrap_err();
    assert_eq!(code(0, 7).code(), "invalid-argument");
    assert_eq!(code(7, 0).code(), "invalid-argument");
    let e = code(MAX_BATCH as usize + 1, 7);
    assert_eq!(e.code(), "too-large");
    assert!(e.to_string().contains("max_tokens"), "{e}");
    let e = code(7, MAX_BLOCK as usize + 2);
    assert_eq!(e.code(), "too-large");
    assert!(e.to_string().contains("row_tokens"), "{e}");
    // In range: every size the profile names, each priced.
    let table = measure_steps_per_second(&t, 7, 7).unwrap();
    assert_eq!(table.points().len(), 7);
}

#[test]
fn greedy_equals_target_only_with_sampling_drafter_and_bf16_logits() {
    let reqs = batch();
    for mode in [Mode::Sampling, Mode::Greedy { corrupt_every: 2 }] {
        let mut t = toy();
        t.dtype = candle_core::DType::BF16;
        let d = oracle(&t, mode);
        let s = Speculator::new(t, d, SpeculatorOptions::default()).unwrap();
        let g = s.generate(&reqs, None).unwrap();
        let mut t = toy();
        t.dtype = candle_core::DType::BF16;
        let base = target_only(&t, &SpeculatorOptions::default(), &reqs, None).unwrap();
        assert_eq!(g.tokens, base.tokens, "{mode:?}");
        check_bookkeeping(&s, &reqs, &g);
    }
}

#[test]
fn honest_threshold_verifies_only_correct_drafts() {
    // The oracle's confidence is 0.1 on a corrupted slot, 0.9 otherwise: a 0.5 threshold stops
    // right before the first wrong draft, so every verified draft is accepted.
    let options = SpeculatorOptions {
        verify: VerifyPolicy::Threshold(0.5),
        ..SpeculatorOptions::default()
    };
    let s = speculator(Mode::Greedy { corrupt_every: 4 }, options);
    let reqs = batch();
    let g = s.generate(&reqs, None).unwrap();
    assert_eq!(g.tokens, greedy_reference(&reqs));
    assert!(g.stats.drafted_tokens > 0);
    assert_eq!(g.stats.accepted_tokens, g.stats.drafted_tokens);
    assert!(g.stats.position_attempts.len() <= 3);
}

#[test]
fn stop_tokens_are_per_request() {
    let plain: Vec<Request> = (0..4)
        .map(|i| Request::new(prompt(40 + i, 3 + i as usize), 30))
        .collect();
    let reference = greedy_reference(&plain);
    let first = |out: &[u32], t: u32| out.iter().position(|&x| x == t).unwrap();
    let stop0 = reference[0][5];
    let stop1 = reference[1][12];
    let absent = (0..V as u32).find(|t| !reference[3].contains(t)).unwrap();
    let mut reqs = plain.clone();
    reqs[0].stop_token_ids = vec![stop0];
    reqs[1].stop_token_ids = vec![stop1, absent];
    reqs[3].stop_token_ids = vec![absent];
    let want = vec![
        reference[0][..=first(&reference[0], stop0)].to_vec(),
        reference[1][..=first(&reference[1], stop1)].to_vec(),
        reference[2].clone(),
        reference[3].clone(),
    ];
    assert!(want[0].len() <= 6 && want[1].len() <= 13);
    for corrupt_every in [0, 3] {
        let s = greedy_oracle(corrupt_every);
        let g = s.generate(&reqs, None).unwrap();
        assert_eq!(g.tokens, want, "corrupt={corrupt_every}");
        check_bookkeeping(&s, &reqs, &g);
    }
    let base = target_only(&toy(), &SpeculatorOptions::default(), &reqs, None).unwrap();
    assert_eq!(base.tokens, want);
}

#[test]
fn budget_is_never_exceeded() {
    for corrupt_every in [0, 2] {
        for max in 0..=K + 3 {
            let s = greedy_oracle(corrupt_every);
            let reqs = vec![Request::new(prompt(9, 5), max)];
            let g = s.generate(&reqs, None).unwrap();
            assert_eq!(g.tokens[0], greedy_reference(&reqs)[0], "max {max}");
            check_bookkeeping(&s, &reqs, &g);
        }
    }
    // Sampled: exactly the budget (no stop ids), whatever is accepted.
    let options = SpeculatorOptions {
        temperature: 1.0,
        ..SpeculatorOptions::default()
    };
    let s = speculator(Mode::Sampling, options);
    let reqs: Vec<Request> = (0..=K + 3)
        .map(|m| Request::new(prompt(m as u64, 2), m))
        .collect();
    let g = s.generate(&reqs, None).unwrap();
    for (m, out) in g.tokens.iter().enumerate() {
        assert_eq!(out.len(), m);
    }
    check_bookkeeping(&s, &reqs, &g);
}

#[test]
fn zero_budget_runs_nothing() {
    let s = greedy_oracle(0);
    let reqs = vec![Request::new(vec![1, 2], 0), Request::new(vec![3], 0)];
    let g = s.generate(&reqs, None).unwrap();
    assert_eq!(g.tokens, vec![Vec::<u32>::new(); 2]);
    assert_eq!(s.target().forwards(), 0);
    assert_eq!(g.stats.rounds, 0);
    assert!(s.drafter().log.borrow().proposals.is_empty());
    let t = toy();
    let base = target_only(&t, &SpeculatorOptions::default(), &reqs, None).unwrap();
    assert_eq!(base.tokens, g.tokens);
    assert_eq!(t.forwards(), 0);
    // Also no requests at all.
    let g = s.generate(&[], None).unwrap();
    assert!(g.tokens.is_empty());
    assert_eq!(s.target().forwards(), 0);

    // A zero-budget request in a batch is never charged (num_tokens 0 in every forward).
    let s = greedy_oracle(3);
    let mut reqs = batch();
    reqs[2].max_new_tokens = 0;
    let g = s.generate(&reqs, None).unwrap();
    assert!(g.tokens[2].is_empty());
    let log = s.target().log.borrow();
    assert_eq!(log.row_forwards[2], 0);
    assert!(log.calls.iter().all(|c| c.num_tokens[2] == 0));
    assert_eq!(g.tokens, greedy_reference(&reqs));
    drop(log);
    check_bookkeeping(&s, &reqs, &g);
    // Target-only: a request charged once per token, prefill included.
    let t = toy();
    let base = target_only(&t, &SpeculatorOptions::default(), &reqs, None).unwrap();
    assert_eq!(base.tokens, g.tokens);
    let log = t.log.borrow();
    for (i, r) in reqs.iter().enumerate() {
        assert_eq!(log.row_forwards[i], r.max_new_tokens, "request {i}");
    }
    assert_eq!(log.calls.len(), 23);
    assert_eq!(base.stats.rounds, 22);
}

/// Run `f` with a callback that records every update; returns the per-request concatenation.
fn streamed(
    f: impl FnOnce(&mut dyn FnMut(&RoundUpdate<'_>) -> dspark::Result<()>) -> Generation,
) -> (Generation, Vec<Vec<u32>>, Vec<usize>, Vec<bool>) {
    let mut seen: Vec<Vec<u32>> = Vec::new();
    let mut rounds = Vec::new();
    let mut finished = Vec::new();
    let g = f(&mut |u: &RoundUpdate<'_>| {
        seen.resize(u.new_tokens.len(), Vec::new());
        for (s, t) in seen.iter_mut().zip(&u.new_tokens) {
            s.extend_from_slice(t);
        }
        rounds.push(u.round);
        finished = u.finished.to_vec();
        Ok(())
    });
    (g, seen, rounds, finished)
}

#[test]
fn streaming_concatenates_to_the_output() {
    let reqs = batch();
    for options in [
        SpeculatorOptions::default(),
        SpeculatorOptions {
            temperature: 1.0,
            seed: Some(3),
            ..SpeculatorOptions::default()
        },
    ] {
        let s = speculator(Mode::Sampling, options.clone());
        let (g, seen, rounds, finished) = streamed(|cb| s.generate(&reqs, Some(cb)).unwrap());
        assert_eq!(seen, g.tokens);
        assert_eq!(rounds, (0..=g.stats.rounds).collect::<Vec<_>>());
        assert!(finished.iter().all(|&f| f));
        let (b, seen, rounds, _) =
            streamed(|cb| target_only(&toy(), &options, &reqs, Some(cb)).unwrap());
        assert_eq!(seen, b.tokens);
        assert_eq!(rounds, (0..=b.stats.rounds).collect::<Vec<_>>());
    }
}

#[test]
fn callback_error_aborts_and_is_returned_as_is() {
    let s = greedy_oracle(3);
    let mut calls = 0;
    let mut cb = |u: &RoundUpdate<'_>| {
        calls += 1;
        if u.round == 2 {
            Err(Error::invalid("client", "went away"))
        } else {
            Ok(())
        }
    };
    let err = s.generate(&batch(), Some(&mut cb)).unwrap_err();
    assert_eq!(err.code(), "invalid-argument");
    assert_eq!(err.to_string(), "invalid `client`: went away");
    assert_eq!(calls, 3);
    assert_eq!(s.target().forwards(), 3, "prefill + 2 rounds, then nothing");

    let t = toy();
    let mut cb = |u: &RoundUpdate<'_>| {
        if u.round == 4 {
            Err(Error::callback("on_round", "stop"))
        } else {
            Ok(())
        }
    };
    let err = target_only(&t, &SpeculatorOptions::default(), &batch(), Some(&mut cb)).unwrap_err();
    assert!(
        matches!(&err, Error::Callback { context, source } if context == "on_round" && source.to_string() == "stop")
    );
    assert_eq!(t.forwards(), 5);
}

fn sampled(seed: u64, policy: VerifyPolicy) -> SpeculatorOptions {
    SpeculatorOptions {
        temperature: 1.0,
        seed: Some(seed),
        verify: policy,
        ..SpeculatorOptions::default()
    }
}

#[test]
fn own_seed_makes_a_request_independent_of_its_batch() {
    let a = Request {
        seed: Some(1234),
        ..Request::new(prompt(1, 4), 40)
    };
    let mate1 = Request::new(prompt(2, 7), 13);
    let mate2 = Request {
        seed: Some(99),
        ..Request::new(prompt(3, 1), 50)
    };
    for policy in [VerifyPolicy::Full, VerifyPolicy::Threshold(0.6)] {
        for mode in [Mode::Sampling, Mode::Greedy { corrupt_every: 3 }] {
            let run = |reqs: &[Request], seed: u64| {
                let s = speculator(mode, sampled(seed, policy.clone()));
                let g = s.generate(reqs, None).unwrap();
                check_bookkeeping(&s, reqs, &g);
                g.tokens
            };
            let alone = run(std::slice::from_ref(&a), 0);
            assert_eq!(alone[0].len(), 40);
            let what = format!("{} {mode:?}", policy.name());
            let batched = run(&[mate1.clone(), a.clone(), mate2.clone()], 0);
            assert_eq!(batched[1], alone[0], "{what}: in a batch");
            let other = run(&[mate2.clone(), mate1.clone(), a.clone()], 7);
            assert_eq!(
                other[2], alone[0],
                "{what}: other position, other options seed"
            );
            assert_eq!(other[0], batched[2], "{what}: mate with its own seed");
        }
    }
    // Target-only draws from the same per-request streams.
    let run = |reqs: &[Request]| target_only(&toy(), &sampled(0, VerifyPolicy::Full), reqs, None);
    let alone = run(std::slice::from_ref(&a)).unwrap().tokens;
    let batched = run(&[mate1, a]).unwrap().tokens;
    assert_eq!(batched[1], alone[0]);
}

/// A batch mate's stop ids must not change a request's draws either (a shared stop list in
/// the verify kernel would end this request's round early and move its seed positions).
#[test]
fn mate_stop_ids_do_not_change_an_own_seed_request() {
    let a = Request {
        seed: Some(1234),
        ..Request::new(prompt(1, 4), 60)
    };
    let run = |reqs: &[Request]| {
        speculator(Mode::Sampling, sampled(0, VerifyPolicy::Full))
            .generate(reqs, None)
            .unwrap()
            .tokens
    };
    let alone = run(std::slice::from_ref(&a));
    // The mate stops on every token `a` emits except its first (so the mate runs on).
    let mut mate = Request::new(prompt(2, 3), 20);
    mate.stop_token_ids = alone[0][1..].to_vec();
    mate.stop_token_ids.sort_unstable();
    mate.stop_token_ids.dedup();
    let batched = run(&[a, mate]);
    assert_eq!(batched[0], alone[0]);
}

#[test]
fn options_seed_selects_the_sample() {
    let reqs = batch();
    let run = |seed: u64| {
        speculator(Mode::Sampling, sampled(seed, VerifyPolicy::Full))
            .generate(&reqs, None)
            .unwrap()
            .tokens
    };
    let a = run(5);
    assert_eq!(run(5), a);
    let b = run(6);
    assert_ne!(b[0], a[0]);
    assert_ne!(b[2], a[2]);
    // num_speculative_tokens = 0 consumes exactly target-only's draws.
    let options = SpeculatorOptions {
        num_speculative_tokens: Some(0),
        ..sampled(5, VerifyPolicy::Full)
    };
    let zero = speculator(Mode::Sampling, options.clone())
        .generate(&reqs, None)
        .unwrap();
    let base = target_only(&toy(), &options, &reqs, None).unwrap();
    assert_eq!(zero.tokens, base.tokens);
    assert_eq!(zero.stats.drafted_tokens, 0);
}

// ---- losslessness -------------------------------------------------------------------------

const SV: usize = 12;
const TRIALS: usize = 20_000;

/// The toy's exact joint of the first three generated tokens after `prompt`.
fn exact_joint(
    lm: &crate::speculator_common::ToyLm,
    prompt: &[u32],
    o: &SpeculatorOptions,
) -> Vec<f64> {
    let probs =
        |ctx: &[u32]| reference_probs(&lm.next_logits(ctx), o.temperature, o.top_k, o.top_p);
    let mut joint = vec![0.0; SV * SV * SV];
    let mut ctx = prompt.to_vec();
    let p1 = probs(&ctx);
    for (x1, &a) in p1.iter().enumerate().filter(|(_, a)| **a > 0.0) {
        ctx.push(x1 as u32);
        let p2 = probs(&ctx);
        for (x2, &b) in p2.iter().enumerate().filter(|(_, b)| **b > 0.0) {
            ctx.push(x2 as u32);
            for (x3, &c) in probs(&ctx).iter().enumerate() {
                joint[(x1 * SV + x2) * SV + x3] = a * b * c;
            }
            ctx.pop();
        }
        ctx.pop();
    }
    joint
}

/// Marginalize the `[SV³]` joint (or counts) onto the token pair `(i, j)` (`0`-based slots).
fn pair<T: Copy + Default + std::ops::AddAssign>(joint: &[T], (i, j): (usize, usize)) -> Vec<T> {
    let mut out = vec![T::default(); SV * SV];
    for (idx, &p) in joint.iter().enumerate() {
        let x = [idx / (SV * SV), (idx / SV) % SV, idx % SV];
        out[x[i] * SV + x[j]] += p;
    }
    out
}

/// `TRIALS` requests (own seeds) of 4 tokens each, in one batch; the counts of their first three
/// tokens against the exact joint, on pairs (1, 2) and (2, 3).
fn lossless(mode: Mode, options: SpeculatorOptions, label: &str) -> Stats {
    let t = ToyTarget::new(SV, LAYERS, HIDDEN, 23);
    // A prompt whose next-token row is not peaked (the first token is then far from certain).
    let prompt = (0..SV as u32)
        .map(|a| vec![5, a])
        .find(|p| {
            let p1 = reference_probs(&t.lm.next_logits(p), 1.0, None, 1.0);
            p1.iter().copied().fold(0.0, f64::max) < 0.4
        })
        .unwrap();
    let exact = exact_joint(&t.lm, &prompt, &options);
    let d = OracleDrafter::new(&t, 4, &CAPTURE, mode);
    let s = Speculator::new(t, d, options).unwrap();
    let reqs: Vec<Request> = (0..TRIALS as u64)
        .map(|i| Request {
            seed: Some(mix(i ^ 0xABCDEF)),
            ..Request::new(prompt.clone(), 4)
        })
        .collect();
    let g = s.generate(&reqs, None).unwrap();
    let mut counts = vec![0u64; SV * SV * SV];
    for out in &g.tokens {
        assert_eq!(out.len(), 4);
        counts[(out[0] as usize * SV + out[1] as usize) * SV + out[2] as usize] += 1;
    }
    assert!(g.stats.rounds > 0, "{label}: no round");
    for slots in [(0, 1), (1, 2)] {
        assert_follows(
            &pair(&counts, slots),
            &pair(&exact, slots),
            &format!("{label} {slots:?}"),
        );
    }
    g.stats
}

#[test]
fn sampled_output_has_the_target_distribution() {
    let t1 = sampled(0, VerifyPolicy::Full);
    let full = lossless(Mode::Sampling, t1.clone(), "T=1");
    lossless(
        Mode::Greedy { corrupt_every: 2 },
        t1.clone(),
        "T=1, deterministic drafter",
    );
    // The confidence policies verify a varying number of drafts (some rounds none at all).
    let partial = |st: Stats| {
        assert!(st.position_attempts[0] > 0 && st.position_attempts[0] < st.request_rounds);
    };
    partial(lossless(
        Mode::Sampling,
        sampled(0, VerifyPolicy::Threshold(0.6)),
        "T=1 threshold",
    ));
    // The scheduler's own choices for seeded requests (not held to repeat their tokens).
    let scheduled = |policy| SpeculatorOptions {
        repeatable: false,
        ..sampled(0, policy)
    };
    // A steps-per-second table at this batch's scale (so that some slots are admitted).
    let big = StepsPerSecond::linear(vec![(1, 100.0), (20_000, 90.0), (60_000, 30.0)]).unwrap();
    partial(lossless(
        Mode::Sampling,
        scheduled(VerifyPolicy::Scheduled(big)),
        "T=1 scheduled",
    ));
    // A table no draft can pay for: its first rounds draft (nothing is timed yet) and verify
    // nothing, the rest are plain target-only steps (`plain_rounds_are_target_only_steps`).
    let linear = StepsPerSecond::linear(vec![(1, 1000.0), (2, 500.0)]).unwrap();
    lossless(
        Mode::Sampling,
        scheduled(VerifyPolicy::Scheduled(linear.clone())),
        "T=1 scheduled, nothing verified",
    );
    // The default policy: exact too.
    lossless(
        Mode::Sampling,
        scheduled(VerifyPolicy::ScheduledMeasured),
        "T=1 default policy",
    );
    // Held to repeat with its seed (the default), a seeded request verifies its whole
    // block in drafted rounds even on a table no draft pays for: the rounds of full
    // verification, draw for draw.
    let st = lossless(
        Mode::Sampling,
        sampled(0, VerifyPolicy::Scheduled(linear)),
        "T=1 scheduled, repeatable",
    );
    assert_eq!(st.plain_rounds, 0, "{st:?}");
    assert_eq!(
        (
            st.position_attempts,
            st.position_accepts,
            st.committed_tokens
        ),
        (
            full.position_attempts,
            full.position_accepts,
            full.committed_tokens
        )
    );
}

#[test]
fn plain_rounds_are_target_only_steps() {
    // Sampled, seeded, on a table no draft pays for: the rounds that draft verify nothing and
    // the others are plain, and each is the target-only step with the same seed, so every
    // token equals target-only's (whose distribution the suites above check).
    let linear = StepsPerSecond::linear(vec![(1, 1000.0), (2, 500.0)]).unwrap();
    let options = SpeculatorOptions {
        repeatable: false,
        ..sampled(11, VerifyPolicy::Scheduled(linear))
    };
    let reqs: Vec<Request> = (0..4)
        .map(|i| Request::new(prompt(i + 40, 3), 24))
        .collect();
    let s = speculator(Mode::Sampling, options.clone());
    let g = s.generate(&reqs, None).unwrap();
    let base = target_only(&toy(), &options, &reqs, None).unwrap();
    assert_eq!(g.tokens, base.tokens);
    let st = &g.stats;
    assert!(st.plain_rounds > 0 && st.plain_rounds < st.rounds, "{st:?}");
    assert_eq!(st.drafted_tokens, 0, "{st:?}");
}

#[test]
fn sampled_output_has_the_target_distribution_with_top_k_top_p() {
    let top_k = SpeculatorOptions {
        temperature: 0.7,
        top_k: Some(4),
        ..sampled(0, VerifyPolicy::Full)
    };
    lossless(Mode::Sampling, top_k, "T=0.7 top_k=4");
    let top_p = SpeculatorOptions {
        top_p: 0.7,
        ..sampled(0, VerifyPolicy::Full)
    };
    lossless(Mode::Sampling, top_p, "T=1 top_p=0.7");
}

#[test]
fn a_lying_drafter_is_caught_by_the_chi_square() {
    // Power check: draft logits that are not the distribution the drafter sampled from.
    let t = ToyTarget::new(SV, LAYERS, HIDDEN, 23);
    let prompt = vec![5, 1];
    let options = sampled(0, VerifyPolicy::Full);
    let exact = exact_joint(&t.lm, &prompt, &options);
    let d = OracleDrafter::new(&t, 4, &CAPTURE, Mode::Lying);
    let s = Speculator::new(t, d, options).unwrap();
    let reqs: Vec<Request> = (0..TRIALS as u64)
        .map(|i| Request {
            seed: Some(i),
            ..Request::new(prompt.clone(), 4)
        })
        .collect();
    let g = s.generate(&reqs, None).unwrap();
    let mut counts = vec![0u64; SV * SV * SV];
    for out in &g.tokens {
        counts[(out[0] as usize * SV + out[1] as usize) * SV + out[2] as usize] += 1;
    }
    assert_differs(
        &pair(&counts, (0, 1)),
        &pair(&exact, (0, 1)),
        "lying drafter",
    );
}

// ---- statistics ---------------------------------------------------------------------------

#[test]
fn stats_of_a_perfect_and_a_corrupted_oracle() {
    let reqs: Vec<Request> = (0..3)
        .map(|i| Request::new(prompt(i, 2 + i as usize), 1 + 4 * (K + 1)))
        .collect();
    let s = greedy_oracle(0);
    let g = s.generate(&reqs, None).unwrap();
    let st = &g.stats;
    assert_eq!(st.rounds, 4);
    assert_eq!(st.request_rounds, 12);
    assert_eq!(st.committed_tokens, 12 * (K + 1));
    assert_eq!(st.acceptance_length(), (K + 1) as f64);
    assert_eq!(st.position_attempts, vec![12; K]);
    assert_eq!(st.position_accepts, vec![12; K]);
    assert_eq!(st.per_position_acceptance(), vec![1.0; K]);
    assert!(st.total_seconds >= st.target_seconds);
    // The prefill is part of the call, and of the target's time; rounds came after it.
    assert!(st.prefill_seconds > 0.0 && st.prefill_seconds <= st.total_seconds);
    assert!(st.prefill_seconds < st.total_seconds || st.rounds == 0);

    // Slot 2 always wrong: two accepted + the correction per round. Budget 16 = 1 + 5 rounds
    // of 3, the last round verifies only 2 drafts.
    let reqs: Vec<Request> = (0..3).map(|i| Request::new(prompt(i, 3), 16)).collect();
    let s = greedy_oracle(3);
    let g = s.generate(&reqs, None).unwrap();
    let st = &g.stats;
    assert_eq!(st.rounds, 5);
    assert_eq!(st.request_rounds, 15);
    assert_eq!(st.acceptance_length(), 3.0);
    assert_eq!(st.accepted_tokens, 30);
    assert_eq!(st.drafted_tokens, 3 * (6 + 6 + 6 + 5 + 2));
    assert_eq!(st.position_attempts, vec![15, 15, 12, 0, 0, 0]);
    assert_eq!(st.position_accepts, vec![15, 15, 0, 0, 0, 0]);
    let acc = st.per_position_acceptance();
    assert_eq!(acc[..3], [1.0, 1.0, 0.0]);
    assert!(acc[3..].iter().all(|a| a.is_nan()));
    check_bookkeeping(&s, &reqs, &g);

    let base = target_only(&toy(), &SpeculatorOptions::default(), &reqs, None).unwrap();
    assert_eq!(base.stats.rounds, 15);
    assert_eq!(base.stats.committed_tokens, 45);
    assert_eq!(base.stats.acceptance_length(), 1.0);
    assert!(base.stats.prefill_seconds > 0.0);
    assert!(base.stats.prefill_seconds <= base.stats.total_seconds);
    assert_eq!(base.tokens, g.tokens);
}

// ---- errors -------------------------------------------------------------------------------

fn new_err(d: OracleDrafter, options: SpeculatorOptions) -> Error {
    Speculator::new(toy(), d, options).unwrap_err()
}

#[test]
fn bad_pairs_and_options_are_typed_errors() {
    let t = toy();
    let greedy = Mode::Greedy { corrupt_every: 0 };
    // Capture layers past the target's.
    let e = new_err(
        OracleDrafter::new(&t, K, &[1, 4], greedy),
        SpeculatorOptions::default(),
    );
    assert_eq!(e.code(), "target-mismatch", "{e}");
    // Feature width.
    let mut d = oracle(&t, greedy);
    d.hidden = HIDDEN + 1;
    d.info.context_width = d.capture.len() * d.hidden;
    let e = new_err(d, SpeculatorOptions::default());
    assert_eq!(e.code(), "target-mismatch", "{e}");
    // Vocabulary.
    let d = oracle(&ToyTarget::new(V + 1, LAYERS, HIDDEN, 17), greedy);
    let e = new_err(d, SpeculatorOptions::default());
    assert_eq!(e.code(), "target-mismatch", "{e}");
    // Options.
    let bad = [
        SpeculatorOptions {
            num_speculative_tokens: Some(K + 1),
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            verify: VerifyPolicy::Threshold(1.5),
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            verify: VerifyPolicy::Threshold(-0.1),
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            verify: VerifyPolicy::Threshold(f32::NAN),
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            temperature: -1.0,
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            temperature: f32::INFINITY,
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            top_k: Some(0),
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            top_p: 0.0,
            ..SpeculatorOptions::default()
        },
        SpeculatorOptions {
            top_p: 1.5,
            ..SpeculatorOptions::default()
        },
    ];
    for o in bad {
        let e = new_err(oracle(&t, greedy), o.clone());
        assert_eq!(e.code(), "invalid-argument", "{o:?}: {e}");
        if o.verify == VerifyPolicy::Full && o.num_speculative_tokens.is_none() {
            let e = target_only(&toy(), &o, &batch(), None).unwrap_err();
            assert_eq!(e.code(), "invalid-argument", "target_only {o:?}: {e}");
        }
    }
    // A confidence policy without a confidence head.
    for verify in [VerifyPolicy::Threshold(0.5), VerifyPolicy::Scheduled(sps())] {
        let o = SpeculatorOptions {
            verify,
            ..SpeculatorOptions::default()
        };
        let e = new_err(oracle(&t, greedy).without_confidence(), o);
        assert_eq!(e.code(), "bad-config", "{e}");
    }
    // ... while full verification does not need one.
    let s = Speculator::new(
        toy(),
        oracle(&t, greedy).without_confidence(),
        SpeculatorOptions::default(),
    )
    .unwrap();
    assert_eq!(
        s.generate(&batch(), None).unwrap().tokens,
        greedy_reference(&batch())
    );
}

#[test]
fn bad_requests_are_typed_errors() {
    let s = greedy_oracle(0);
    let t = toy();
    let o = SpeculatorOptions::default();
    let cases: [(Vec<Request>, &str); 3] = [
        (
            vec![Request::new(vec![1], 4), Request::new(vec![], 4)],
            "invalid-argument",
        ),
        (
            vec![Request::new(vec![1, V as u32], 4)],
            "token-out-of-range",
        ),
        (
            vec![Request {
                stop_token_ids: vec![V as u32 + 7],
                ..Request::new(vec![1], 4)
            }],
            "token-out-of-range",
        ),
    ];
    for (reqs, code) in cases {
        let e = s.generate(&reqs, None).unwrap_err();
        assert_eq!(e.code(), code, "{e}");
        let e = target_only(&t, &o, &reqs, None).unwrap_err();
        assert_eq!(e.code(), code, "{e}");
    }
    assert_eq!(s.target().forwards(), 0, "validated before any forward");
    assert_eq!(t.forwards(), 0);
}

#[test]
fn misbehaving_drafters_are_typed_errors() {
    let t = toy();
    for (fault, temperature, verify, code) in [
        (Fault::WrongBatch, 0.0, VerifyPolicy::Full, "bad-shape"),
        (
            Fault::ShortDraftLogits,
            1.0,
            VerifyPolicy::Full,
            "bad-shape",
        ),
        (
            Fault::ShortConfidence,
            0.0,
            VerifyPolicy::Threshold(0.5),
            "bad-shape",
        ),
        // The loop checks drafted ids before the target sees them, naming the drafter.
        (
            Fault::OutOfRangeToken,
            0.0,
            VerifyPolicy::Full,
            "token-out-of-range",
        ),
    ] {
        let d = oracle(&t, Mode::Sampling).with_fault(fault);
        let o = SpeculatorOptions {
            temperature,
            verify,
            ..SpeculatorOptions::default()
        };
        let s = Speculator::new(toy(), d, o).unwrap();
        let e = s.generate(&batch(), None).unwrap_err();
        assert_eq!(e.code(), code, "{fault:?}: {e}");
        assert!(e.to_string().contains("drafter.propose"), "{fault:?}: {e}");
    }
}

#[test]
fn toy_target_rolls_back_and_never_grows() {
    let t = toy();
    let mut cache = t.new_cache(2).unwrap();
    let input = dspark::speculator::TargetInput {
        tokens: &[1, 2, 3, 4, 0, 0],
        width: 3,
        num_tokens: &[3, 1],
        logits: LogitRows::Last,
    };
    let out = t.forward(&mut cache, &input, &CAPTURE).unwrap();
    assert_eq!(out.logits.dims(), [2, 1, V]);
    assert_eq!(out.hidden_states.dims(), [2, 3, 2 * HIDDEN]);
    assert_eq!(t.cache_lengths(&cache), vec![3, 1]);
    t.truncate(&mut cache, &[2, 1]).unwrap();
    assert_eq!(t.cache_lengths(&cache), vec![2, 1]);
    let e = t.truncate(&mut cache, &[3, 1]).unwrap_err();
    assert_eq!(e.code(), "invalid-argument");
    assert_eq!(t.cache_lengths(&cache), vec![2, 1]);
}

// ---- the real candle drafter --------------------------------------------------------------

#[test]
fn real_qwen3_drafter_greedy_equals_target_only() {
    use crate::drafter_common::{H, TARGET_LAYERS, Tiny, load};
    let tiny = Tiny::default();
    let (_dir, drafter) = load(&tiny);
    let make = || ToyTarget::new(tiny.target_vocab, TARGET_LAYERS, H, 31);
    let reqs: Vec<Request> = [(1, 20), (6, 9), (3, 33)]
        .iter()
        .enumerate()
        .map(|(i, &(len, max))| {
            let p = (0..len)
                .map(|j| (mix(i as u64 * 77 + j) % tiny.target_vocab as u64) as u32)
                .collect();
            Request::new(p, max)
        })
        .collect();
    let base = target_only(&make(), &SpeculatorOptions::default(), &reqs, None).unwrap();
    for verify in policies() {
        let o = SpeculatorOptions {
            verify: verify.clone(),
            ..SpeculatorOptions::default()
        };
        let s = Speculator::new(make(), drafter.clone(), o).unwrap();
        let g = s.generate(&reqs, None).unwrap();
        assert_eq!(g.tokens, base.tokens, "{}", verify.name());
        assert!(g.stats.rounds > 0);
        let t = s.target().log.borrow();
        for (i, r) in reqs.iter().enumerate() {
            let want: Vec<u32> = r
                .prompt
                .iter()
                .chain(&g.tokens[i][..r.max_new_tokens - 1])
                .copied()
                .collect();
            assert_eq!(t.cache[i], want);
        }
    }
    // Sampled: runs, respects budgets, is reproducible.
    let o = SpeculatorOptions {
        temperature: 1.0,
        seed: Some(5),
        ..SpeculatorOptions::default()
    };
    let s = Speculator::new(make(), drafter, o).unwrap();
    let g = s.generate(&reqs, None).unwrap();
    for (out, r) in g.tokens.iter().zip(&reqs) {
        assert_eq!(out.len(), r.max_new_tokens);
    }
    assert_eq!(s.generate(&reqs, None).unwrap().tokens, g.tokens);
}

#[test]
fn toy_target_passes_the_target_contract() {
    dspark::speculator::contract::check_target(&toy(), &CAPTURE).unwrap();
    let mut t = toy();
    t.dtype = candle_core::DType::BF16;
    dspark::speculator::contract::check_target(&t, &[0, 2]).unwrap();
}
