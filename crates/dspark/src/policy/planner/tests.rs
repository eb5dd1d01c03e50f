//! The planner's choices on synthetic tables, costs and acceptance records.

use super::*;
use crate::nn::WeightDtype;
use crate::policy::StepsPerSecond;
use crate::policy::learned::MIN_SAMPLES;

#[test]
fn a_close_choice_times_the_plain_size_before_trusting_the_prior() {
    // A flat table (1 ms a forward); one request, one draft at 0.5: drafted 1.5 tokens in
    // 1 ms + 0.3 ms of drafting against plain 1 token in 1 ms: drafting wins, closely
    // (plain at 0.87 of it).
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (8, 1000.0)]).unwrap();
    let mut p = Planner::new(VerifyPolicy::ScheduledMeasured, 1, true);
    for _ in 0..2 {
        p.observe_round(1, false, true, 3e-4, 0.0, 0.0);
    }
    for _ in 0..64 {
        p.observe_acceptance(1, 0, Some(&[0.5]));
        p.observe_acceptance(1, 1, Some(&[0.5]));
    }
    let conf = [0.5f32];
    let stale = [Some(&conf[..])];
    // The plain size (1 token) has no timing: plain rounds time it, three of them, each
    // followed by the refresh the streak asks for.
    let mut plain = 0;
    for _ in 0..12 {
        if p.drafts(&stale, Some(&flat), 64).unwrap() != Drafting::Plain {
            p.observe_forward(2, 1e-3);
        } else {
            plain += 1;
            p.observe_forward(1, 1e-3);
        }
    }
    assert_eq!(
        plain, MIN_SAMPLES,
        "plain rounds taken to time the plain size"
    );
    // Timed as the prior said: drafting from then on.
    assert_eq!(p.drafts(&stale, Some(&flat), 64).unwrap(), Drafting::All);
    // A user's table is never second-guessed.
    let mut given = Planner::new(VerifyPolicy::Scheduled(flat.clone()), 1, true);
    for _ in 0..2 {
        given.observe_round(1, false, true, 3e-4, 0.0, 0.0);
    }
    assert_eq!(given.drafts(&stale, None, 64).unwrap(), Drafting::All);
}

#[test]
fn a_plain_size_no_timing_or_line_prices_is_timed_whatever_the_margin() {
    // The prior prices a decode step at 2 ms and a 9-token verification at 2.2 ms (a read-bound
    // guess); this target, small enough to live in the caches, takes 0.2 ms a forward and
    // 0.1 ms a token: a decode step 0.3 ms, a verification 1.1 ms. Scaled by the verifications
    // alone, the prior prices the decode step at 1 ms: drafting 8 at 0.6 (about 2.4 tokens in
    // 1.4 ms) looks twice as fast as a plain round, which really commits 3.3 tokens a ms.
    let prior = StepsPerSecond::linear(vec![(1, 500.0), (9, 1.0 / 2.2e-3)]).unwrap();
    let forward = |tokens: usize| 2e-4 + 1e-4 * tokens as f64;
    let mut p = learned(8, &prior, None);
    for _ in 0..MIN_SAMPLES {
        p.observe_round(1, false, true, 3e-4, 0.0, 0.0);
        p.observe_forward(9, forward(9));
    }
    let choices = lone_rounds(&mut p, &[0.6; 8], 2, 3e-4, 24, forward);
    // The plain size is timed first (a refresh aside), however clear the prior's choice was...
    let first = choices[..=MIN_SAMPLES]
        .iter()
        .filter(|&&d| d == Drafting::Plain)
        .count();
    assert!(first >= MIN_SAMPLES, "{choices:?}");
    // ...and then priced by the line through the round sizes: plain rounds from then on, but
    // for the refreshes the streak takes.
    let plain = choices[8..]
        .iter()
        .filter(|&&d| d == Drafting::Plain)
        .count();
    assert!(plain >= 13, "{plain} of 16 plain: {choices:?}");
}

#[test]
fn one_timing_prices_the_plain_size_where_drafting_wins_by_far() {
    // A target that reads 1 GB of weights from memory at 25 GB/s and multiplies 5 ms a token:
    // a decode step takes 40 ms (the read bound), a 9-token verification 45 ms (the
    // multiplies), each 5% over its bound; proposing 5 ms.
    let machine = crate::policy::machine::Machine {
        read_bytes_per_s: 25e9,
        cache_bytes: 0.0,
        cache_read_bytes_per_s: 25e9,
        flops_f32: 4e11,
        flops_bf16: 4e11,
        flops_q8_0: 4e11,
        flops_q4_k: 4e11,
    };
    let cost = ForwardCost {
        weight_bytes: 1e9,
        flops_per_token: 2e9,
        layers: 24,
        dtype: WeightDtype::F32,
        quant: None,
        layer_seconds: None,
    };
    let prior = crate::policy::prior::prior_table(&cost, &machine, false, 64, 9).unwrap();
    let split = crate::policy::prior::Split::new(&cost, &machine, false);
    let forward = |tokens: usize| {
        let (read, multiply) = split.parts(tokens);
        1.05 * read.max(multiply)
    };
    // The plain rounds of 24 choices after two drafted rounds, each drafting 8 at confidence
    // `c` with `accepted` of them accepted.
    let plain_rounds = |c: f32, accepted: usize| {
        let mut p = learned(8, &prior, None);
        p.base.as_mut().unwrap().split = Some(split);
        let conf = [c; 8];
        for _ in 0..2 {
            p.observe_round(1, false, true, 5e-3, 0.0, 0.0);
            p.observe_acceptance(8, accepted, Some(&conf));
            p.observe_forward(9, forward(9));
        }
        let choices = lone_rounds(&mut p, &conf, accepted, 5e-3, 24, forward);
        choices.iter().filter(|&&d| d == Drafting::Plain).count()
    };
    // About 4 tokens a round at 50 ms against 1 at 40: drafting would win with a decode step
    // 1.5 times faster than timed, and one timing prices it: one plain round.
    assert_eq!(plain_rounds(0.8, 4), 1);
    // Confidences of 1/4, one draft in eight accepted: drafting still wins, but not by that
    // much: the decode step is timed MIN_SAMPLES times before its price is trusted, and the
    // rounds draft after.
    assert_eq!(plain_rounds(0.25, 1), MIN_SAMPLES);
}

/// `rounds` choices of `p` for one request drafting 8 at confidences `conf`, `accepted` of them
/// accepted in each drafted round, which proposes in `propose` seconds; a forward of `t`
/// tokens takes `forward(t)`.
fn lone_rounds(
    p: &mut Planner,
    conf: &[f32],
    accepted: usize,
    propose: f64,
    rounds: usize,
    forward: impl Fn(usize) -> f64,
) -> Vec<Drafting> {
    let stale = [Some(conf)];
    (0..rounds)
        .map(|_| {
            let table = p.measured_steps_per_second().unwrap();
            let d = p.drafts(&stale, Some(&table), 1000).unwrap();
            let plain = d == Drafting::Plain;
            p.observe_round(
                1,
                plain,
                !plain,
                if plain { 0.0 } else { propose },
                0.0,
                0.0,
            );
            if !plain {
                p.observe_acceptance(8, accepted, Some(conf));
            }
            p.observe_forward(
                if plain { 1 } else { 9 },
                forward(if plain { 1 } else { 9 }),
            );
            d
        })
        .collect()
}

/// A planner under the learned table whose base is `table` (as `measured_table` would
/// keep it), with a drafter whose block pass costs `cost`.
fn learned(n: usize, table: &StepsPerSecond, cost: Option<ForwardCost>) -> Planner {
    let mut p =
        Planner::new(VerifyPolicy::ScheduledMeasured, n, true).with_drafter_cost(cost, n + 1, true);
    p.base = Some(Base {
        max: 64,
        table: table.clone(),
        profiled: false,
        split: None,
    });
    p
}

/// A drafter whose block pass costs `seconds` on a nominal accelerator, whatever its rows.
fn pass(seconds: f64) -> ForwardCost {
    ForwardCost {
        weight_bytes: 1.0,
        flops_per_token: 1.0,
        layers: 1,
        dtype: WeightDtype::F32,
        quant: None,
        layer_seconds: Some(seconds),
    }
}

#[test]
fn the_drafter_s_shape_prices_proposing_before_a_proposal_is_timed() {
    // 1 ms a forward of up to 64 tokens: 4 requests with 4 drafts each would verify 20
    // tokens for the price of 4, if proposing cost nothing.
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
    let stale = [None; 4];
    // Cheap to propose: the first round explores, one request drafting (to learn the
    // acceptance and the confidences at one request's price).
    let mut cheap = learned(4, &flat, Some(pass(1e-5)));
    assert_eq!(
        cheap.drafts(&stale, Some(&flat), 64).unwrap(),
        Drafting::Probe
    );
    // Alone, a request explores as the whole batch.
    let mut one = learned(4, &flat, Some(pass(1e-5)));
    assert_eq!(one.drafts(&[None], Some(&flat), 64).unwrap(), Drafting::All);
    // A pass at 20 ms: no drafted round beats the plain one, even with every draft
    // accepted; the rounds stay plain, and no refresh is taken.
    let mut dear = learned(4, &flat, Some(pass(2e-2)));
    for _ in 0..40 {
        assert_eq!(
            dear.drafts(&stale, Some(&flat), 64).unwrap(),
            Drafting::Plain
        );
    }
    // At best a tie (a pass at 4 ms: 20 tokens in 5 ms against 4 in 1): plain rounds, which
    // are never slower.
    let mut tie = learned(4, &flat, Some(pass(4e-3)));
    assert_eq!(
        tie.drafts(&stale, Some(&flat), 64).unwrap(),
        Drafting::Plain
    );
    // The target's timings scale the prior: a pass at 3.5 ms could gain 11% (20 tokens in
    // 4.5 ms), and the batch explores, until forwards run at twice the target's prior; then
    // it is priced at 7 ms.
    let mut close = learned(4, &flat, Some(pass(3.5e-3)));
    assert_eq!(
        close.drafts(&stale, Some(&flat), 64).unwrap(),
        Drafting::Probe
    );
    let mut slow = learned(4, &flat, Some(pass(3.5e-3)));
    for _ in 0..4 {
        slow.observe_forward(4, 2e-3);
    }
    assert_eq!(
        slow.drafts(&stale, Some(&flat), 64).unwrap(),
        Drafting::Plain
    );
    // A drafter that states no cost: the first rounds draft, to time a proposal.
    let mut unknown = learned(4, &flat, None);
    assert_eq!(
        unknown.drafts(&stale, Some(&flat), 64).unwrap(),
        Drafting::All
    );
    // Once proposals are timed, the timings price them, not the shape.
    for _ in 0..2 {
        dear.observe_round(4, false, true, 4.0 * 1e-5, 0.0, 0.0);
    }
    assert_eq!(
        dear.drafts(&stale, Some(&flat), 64).unwrap(),
        Drafting::Probe
    );
}

#[test]
fn a_batch_explores_with_one_request_then_weighs_the_others_by_the_record() {
    // Two requests, two drafts each: a forward of 2 tokens costs 1 ms, of 6 tokens 2 ms.
    let table = StepsPerSecond::linear(vec![(1, 1000.0), (2, 1000.0), (6, 500.0)]).unwrap();
    let mut p = learned(2, &table, Some(pass(1e-5)));
    let none = [None, None];
    // No record: every draft accepted would pay, so one request drafts to find out.
    assert_eq!(p.drafts(&none, Some(&table), 64).unwrap(), Drafting::Probe);
    assert_eq!(p.next_probe(), 0);
    // Its drafts were rejected, round after round: the others, still without
    // confidences, are weighed by that record and not explored for again.
    for _ in 0..200 {
        p.observe_acceptance(2, 0, Some(&[0.9, 0.9]));
    }
    assert_eq!(p.drafts(&none, Some(&table), 64).unwrap(), Drafting::Plain);
}

/// The rounds (of `rounds`) that draft for one request with `n` drafts whose stale confidences
/// are all 0.1, forwards of 1 ms at any size, proposing `propose` seconds (timed twice), and
/// `remaining` tokens left at every round.
fn drafted_rounds(n: usize, propose: f64, remaining: usize, rounds: usize) -> Vec<usize> {
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (2 * n, 1000.0)]).unwrap();
    let mut p = learned(n, &flat, None);
    for _ in 0..2 {
        p.observe_round(1, false, true, propose, 0.0, 0.0);
    }
    let conf = vec![0.1f32; n];
    let stale = [Some(&conf[..])];
    (0..rounds)
        .filter(|_| p.drafts(&stale, Some(&flat), remaining).unwrap() != Drafting::Plain)
        .collect()
}

#[test]
fn a_refresh_is_not_taken_with_fewer_tokens_left_than_its_streak() {
    // One draft, proposing 0.3 ms. The stale confidences say drafting does not pay; a fresh
    // block (every draft accepted, the optimistic bound) would: the streak of plain rounds ends
    // in a refresh, 1 round, then 4 (a lone request's refresh would commit 2 tokens at that
    // bound in its 1.3 ms: it costs nothing).
    assert_eq!(drafted_rounds(1, 3e-4, 64, 10), [1, 6]);
    // Three tokens left: the streak of 4 would not be repaid.
    assert_eq!(drafted_rounds(1, 3e-4, 3, 10), [1]);
}

#[test]
fn a_long_streak_still_ends_in_a_refresh_within_a_short_request() {
    // Eight drafts, proposing 6 ms. Every draft accepted would pay, and a refresh's extra time
    // prices the streak before it at REFRESH_ROUNDS_MAX (64) rounds. A request with 20 tokens
    // left still takes the refresh that ends it (the streak paid for it); one with 10 left,
    // fewer than REFRESH_ROUNDS, does not. (Asking for the whole streak left, no request of 64
    // tokens or fewer ever refreshed.)
    assert_eq!(drafted_rounds(8, 6e-3, 20, 100), [REFRESH_ROUNDS_MAX]);
    assert!(drafted_rounds(8, 6e-3, 10, 100).is_empty());
}

#[test]
fn a_probe_s_streak_is_long_enough_to_pay_for_it() {
    // Two requests, four drafts, 1 ms a forward of any size, proposing 0.3 ms a request; stale
    // confidences of 0.1 say drafting does not pay, fresh blocks would. A probe (one request
    // drafts) costs its time beyond the plain rounds that would commit as many tokens, and the
    // plain rounds after it are at least enough for that to be REFRESH_SHARE of them.
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
    let gaps = |probe: Option<f64>| -> Vec<usize> {
        let mut p = learned(4, &flat, None);
        for _ in 0..2 {
            p.observe_round(2, false, true, 6e-4, 0.0, 0.0);
        }
        if let Some(s) = probe {
            p.observe_probe(2, s);
        }
        let conf = [0.1f32; 4];
        let stale = [Some(&conf[..]), Some(&conf[..])];
        let choices: Vec<Drafting> = (0..200)
            .map(|_| p.drafts(&stale, Some(&flat), 1000).unwrap())
            .collect();
        let probes: Vec<usize> = (0..200)
            .filter(|&i| choices[i] != Drafting::Plain)
            .collect();
        assert!(probes.iter().all(|&i| choices[i] == Drafting::Probe));
        probes.windows(2).map(|w| w[1] - w[0] - 1).collect()
    };
    // With no record, its drafting request is expected to commit 1 + 1/2 + ... + 1/16 (the
    // prior's acceptance) = 1.9375 tokens: the probe, 2.9375 tokens, is worth 1.47 plain rounds.
    // Untimed, it is priced as a drafted round of one request: 1.3 ms, within those.
    assert_eq!(gaps(None)[..3], [4, 16, 16]);
    // A probe timed at 1.5 ms outside its forward: 2.5 ms, 1.03 ms beyond them: at least
    // 1.03 / (0.05 · 1) plain rounds after it, more than the growth's 4 and 16.
    assert_eq!(gaps(Some(1.5e-3))[..3], [21, 21, 21]);
    // At 3 ms: (4 − 1.47) / 0.05 = 51.
    assert_eq!(gaps(Some(3e-3))[..2], [51, 51]);
    // Dearer still: at most REFRESH_ROUNDS_MAX.
    assert_eq!(
        gaps(Some(1.0))[..2],
        [REFRESH_ROUNDS_MAX, REFRESH_ROUNDS_MAX]
    );
    assert!((REFRESH_ROUNDS..=200).contains(&REFRESH_ROUNDS_MAX));
}

#[test]
fn a_batch_drafts_on_prior_priced_costs_only_on_a_clear_gain_after_a_plain_timing() {
    // Two requests, two drafts each, 1 ms a forward of any size; their confidences and the
    // record say 0.95 a draft: a drafted round expects 5.7 tokens against the plain 2.
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
    let conf = [0.9f32, 0.9];
    let stale = [Some(&conf[..]), Some(&conf[..])];
    let run = |pass_seconds: f64, timed: usize, drafted: bool| {
        let mut p = learned(2, &flat, Some(pass(pass_seconds)));
        for _ in 0..4 {
            p.observe_acceptance(2, 2, Some(&conf));
        }
        for _ in 0..timed {
            p.observe_forward(2, 1e-3);
        }
        if drafted {
            for _ in 0..2 {
                p.observe_round(2, false, true, pass_seconds, 0.0, 0.0);
            }
        }
        p.drafts(&stale, Some(&flat), 64).unwrap()
    };
    // A cheap proposal: a clear gain, once the plain size is timed.
    assert_eq!(run(1e-5, 0, false), Drafting::Plain);
    assert_eq!(run(1e-5, 1, false), Drafting::All);
    // A proposal at 1.7 ms: drafting ahead by 5.5% on the prior's price is no bet for the
    // batch (UNPROVEN_MARGIN); timed, the same 5.5% drafts (past PLAIN_MARGIN), once the plain
    // size has its own MIN_SAMPLES timings (before, plain rounds time it).
    assert_eq!(run(1.7e-3, 1, false), Drafting::Plain);
    assert_eq!(run(1.7e-3, 1, true), Drafting::Plain);
    assert_eq!(run(1.7e-3, MIN_SAMPLES, true), Drafting::All);
    // Priced at 0.25 ms, proposing looks cheap; a probe's one proposal took 1.7 ms (6.8 times
    // its price): the batch's is priced at 6.8 times its own, the 1.7 ms case above.
    let probed = |timed: Option<f64>| {
        let mut p = learned(2, &flat, Some(pass(2.5e-4)));
        for _ in 0..4 {
            p.observe_acceptance(2, 2, Some(&conf));
        }
        p.observe_forward(2, 1e-3);
        if let Some(t) = timed {
            p.observe_proposal(1, t);
        }
        p.drafts(&stale, Some(&flat), 64).unwrap()
    };
    assert_eq!(probed(None), Drafting::All);
    assert_eq!(probed(Some(1.7e-3)), Drafting::Plain);
    // A proposal timed below its price makes the batch's cheaper, by at most 8 times.
    assert_eq!(probed(Some(1e-6)), Drafting::All);
}

#[test]
fn a_refresh_is_priced_at_the_measured_acceptance() {
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
    let mut p = learned(4, &flat, None);
    // An empty record: each draft at the prior's 1/2: 1 + 1/2 + 1/4 + 1/8 + 1/16.
    assert!((p.explore_tokens(4) - 1.9375).abs() < 1e-9);
    // One round whose first draft was rejected: 2 / 5 there (the prior counts as 4 rounds),
    // the later slots still at 1/2: 1 + 0.4 + 0.2 + 0.1 + 0.05. One round of bad luck moves
    // the price only part of the way.
    p.observe_acceptance(4, 0, Some(&[0.5; 4]));
    let one = p.explore_tokens(4);
    assert!((one - 1.75).abs() < 1e-6, "{one}");
    // 64 of them: about 1.04 tokens, so a refresh's price, and the streak after it, follow
    // what drafting is measured to give.
    for _ in 0..63 {
        p.observe_acceptance(4, 0, Some(&[0.5; 4]));
    }
    let many = p.explore_tokens(4);
    assert!(many < 1.1, "{many}");
    // A record of every draft accepted: close to all five tokens.
    let mut q = learned(4, &flat, None);
    for _ in 0..64 {
        q.observe_acceptance(4, 4, Some(&[0.9; 4]));
    }
    assert!(q.explore_tokens(4) > 4.5);
}

#[test]
fn a_streak_priced_on_the_prior_is_priced_again_when_it_falls_due() {
    // One request, four drafts, proposing 0.5 ms; stale confidences of 0.1: drafting does not
    // pay, refreshes are taken as they fall due. The prior prices every forward at 1 ms, so a
    // refresh (1.5 ms for 1.94 tokens at the record's prior) looks free and the streaks only
    // grow 1, 4, 16.
    let prior = StepsPerSecond::linear(vec![(1, 1000.0), (64, 1000.0)]).unwrap();
    let mut p = learned(4, &prior, None);
    for _ in 0..2 {
        p.observe_round(1, false, true, 5e-4, 0.0, 0.0);
    }
    let conf = [0.1f32; 4];
    let stale = [Some(&conf[..])];
    let refreshes = |p: &mut Planner, table: &StepsPerSecond, rounds: usize| -> Vec<usize> {
        (0..rounds)
            .filter(|_| p.drafts(&stale, Some(table), 1000).unwrap() != Drafting::Plain)
            .collect()
    };
    assert_eq!(refreshes(&mut p, &prior, 7), [1, 6]);
    // The plain rounds are timed at 0.3 ms, a 5-token forward at 0.8 ms: a refresh (1.3 ms,
    // drafting 15% ahead at best) costs 0.72 ms beyond the plain rounds that commit its 1.94
    // tokens, 48 plain rounds' 5%. The streak due now (16 rounds) is priced again before it
    // ends, and runs to 48.
    let timed = StepsPerSecond::linear(vec![(1, 1.0 / 3e-4), (5, 1250.0), (64, 1000.0)]).unwrap();
    let later = refreshes(&mut p, &timed, 80);
    assert_eq!(later.first(), Some(&48), "{later:?}");
}

#[test]
fn a_lone_request_drafts_past_the_margin_and_rounds_timing_the_plain_size_keep_it() {
    // One request, four drafts at 0.8, 1 ms a forward of any size, a decode step timed once,
    // proposals timed at 2.1 ms.
    let flat = StepsPerSecond::linear(vec![(1, 1000.0), (8, 1000.0)]).unwrap();
    let mut p = learned(4, &flat, Some(pass(1e-3)));
    p.observe_forward(1, 1e-3);
    let time_proposal = |p: &mut Planner| {
        p.observe_proposal(1, 2.1e-3);
        p.observe_round(1, false, true, 2.1e-3, 0.0, 0.0);
    };
    time_proposal(&mut p);
    let conf = [0.8f32; 4];
    let stale = [Some(&conf[..])];
    // One proposal timed (the costs still priced by the drafter's shape): about 3.4 tokens in
    // 3.1 ms against 1 in 1 ms, a gain of 8%. Past the margin, and a lone request needs no
    // more (its probe would be the whole round); a batch would need twice the margin.
    assert_eq!(p.drafts(&stale, Some(&flat), 64).unwrap(), Drafting::All);
    // One of its drafts accepted: drafting now leads by less than the margin (3.15 tokens in
    // 3.1 ms), but it led, so the choice holds. The costs are timed and no line prices the
    // decode step: plain rounds time it (MIN_SAMPLES timings in all). They leave the choice
    // where it was: drafting resumes after them, where it used to need the margin again and
    // stayed plain until a refresh.
    time_proposal(&mut p);
    p.observe_acceptance(4, 1, Some(&conf));
    p.observe_forward(5, 1e-3);
    let mut choices = Vec::new();
    for _ in 0..4 {
        let d = p.drafts(&stale, Some(&flat), 64).unwrap();
        p.observe_forward(if d == Drafting::Plain { 1 } else { 5 }, 1e-3);
        choices.push(d);
    }
    assert_eq!(
        choices,
        [
            Drafting::Plain,
            Drafting::Plain,
            Drafting::All,
            Drafting::All
        ],
        "two rounds time the decode step (one was timed), then drafting goes on"
    );
}
