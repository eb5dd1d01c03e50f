//! The scheduler alone: admission, preemption, aborts and compaction, with no model (drafter
//! states are `()`).

use super::*;

fn sched(budget: Budget, continuous: bool, n: usize) -> Scheduler<()> {
    Scheduler::new(budget, continuous, n)
}

fn budget(max_running: usize, max_batched_tokens: usize, kv: Option<usize>) -> Budget {
    Budget {
        max_running,
        max_batched_tokens,
        kv_tokens: kv,
    }
}

/// Admit what fits and join it, as a step does; returns the joining count.
fn admit(s: &mut Scheduler<()>, out: &mut StepOutput, m: &mut EngineMetrics) -> usize {
    let rows = s.admit(out, m).unwrap();
    let n = rows.len();
    s.join(rows);
    n
}

#[test]
fn admission_stops_at_the_first_request_the_budget_cannot_take() {
    let (mut out, mut m) = (StepOutput::default(), EngineMetrics::default());
    // Two running at most.
    let mut s = sched(budget(2, 1000, None), true, 4);
    for _ in 0..3 {
        s.add(RequestSpec::new(vec![1; 8], 4)).unwrap();
    }
    assert_eq!(admit(&mut s, &mut out, &mut m), 2);
    assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
    assert_eq!(m.prompt_tokens, 16);
    // Batched tokens (15): two prefills of 10 do not fit one step; the next step's running
    // block (5) and the second prefill (the first joining one always fits) fill it, and a
    // third prefill of 1 waits.
    let mut s = sched(budget(8, 15, None), true, 4);
    for len in [10, 10, 1] {
        s.add(RequestSpec::new(vec![1; len], 4)).unwrap();
    }
    assert_eq!(admit(&mut s, &mut out, &mut m), 1);
    assert_eq!(admit(&mut s, &mut out, &mut m), 1);
    assert_eq!(s.num_waiting(), 1);
    // The KV budget: a prefill of 8 plus a block of 5 is 13 KV tokens per request.
    let mut s = sched(budget(8, 1000, Some(30)), true, 4);
    for _ in 0..3 {
        s.add(RequestSpec::new(vec![1; 8], 4)).unwrap();
    }
    assert_eq!(admit(&mut s, &mut out, &mut m), 2);
}

#[test]
fn the_newest_request_is_preempted_and_resumes_first() {
    let (mut out, mut m) = (StepOutput::default(), EngineMetrics::default());
    let mut s = sched(budget(8, 1000, Some(40)), true, 4);
    let ids: Vec<RequestId> = (0..3)
        .map(|_| s.add(RequestSpec::new(vec![1; 8], 20)).unwrap())
        .collect();
    assert_eq!(admit(&mut s, &mut out, &mut m), 3);
    // The rows grew: 3 × (12 + 5) = 51 > 40.
    for row in s.rows.iter_mut().flatten() {
        row.len = 12;
        row.out = vec![7, 7, 7];
    }
    assert!(s.preempt(&mut m));
    assert_eq!(m.preemptions, 1);
    let c = s.compaction();
    assert_eq!(c, Compaction::Retain(vec![true, true, false]));
    s.compact(&c);
    assert_eq!((s.num_running(), s.num_waiting()), (2, 1));
    let running: Vec<RequestId> = s.rows.iter().flatten().map(|r| r.id).collect();
    assert_eq!(running, ids[..2]);
    // It waits at the front with what it committed: its prefill re-runs the prompt and all
    // but its last token.
    assert_eq!(s.waiting[0].id, ids[2]);
    assert_eq!(s.waiting[0].prefill_tokens().len(), 8 + 2);
    assert_eq!(s.waiting[0].usage.preemptions, 1);
}

#[test]
fn aborts_reach_waiting_and_running_requests_once() {
    let (mut out, mut m) = (StepOutput::default(), EngineMetrics::default());
    let mut s = sched(budget(1, 1000, None), true, 2);
    let a = s.add(RequestSpec::new(vec![1; 4], 4)).unwrap();
    let b = s.add(RequestSpec::new(vec![1; 4], 4)).unwrap();
    admit(&mut s, &mut out, &mut m);
    let h = s.abort_handle();
    h.abort(a).unwrap();
    h.abort(a).unwrap();
    h.abort(b).unwrap();
    assert!(s.has_work());
    s.apply_aborts(&mut out, &mut m).unwrap();
    assert_eq!(m.requests_aborted, 2);
    assert_eq!(out.outputs.len(), 2);
    assert!(
        out.outputs
            .iter()
            .all(|o| o.finish == Some(FinishReason::Aborted))
    );
    // Neither is held any more; the freed row goes with the cache.
    assert!(h.abort(a).is_err());
    assert_eq!(s.compaction(), Compaction::Clear);
    s.compact(&Compaction::Clear);
    assert!(!s.has_work());
}

#[test]
fn a_static_batch_keeps_its_layout_until_every_row_is_free() {
    let (mut out, mut m) = (StepOutput::default(), EngineMetrics::default());
    let mut s = sched(budget(8, 1000, None), false, 2);
    s.add(RequestSpec::new(vec![1; 4], 4)).unwrap();
    s.add(RequestSpec::new(vec![1; 4], 0)).unwrap();
    s.add(RequestSpec::new(vec![1; 4], 4)).unwrap();
    // The empty request holds a row it never uses and ends at admission.
    assert_eq!(admit(&mut s, &mut out, &mut m), 3);
    assert_eq!(s.num_running(), 2);
    assert_eq!(m.requests_length, 1);
    // Nothing joins a running static batch.
    s.add(RequestSpec::new(vec![1; 4], 4)).unwrap();
    assert_eq!(admit(&mut s, &mut out, &mut m), 0);
    s.rows[0].as_mut().unwrap().finish = Some(FinishReason::Stop);
    s.finish(&mut out, &mut m).unwrap();
    assert_eq!(s.compaction(), Compaction::Keep);
    s.rows[2].as_mut().unwrap().finish = Some(FinishReason::Length);
    s.finish(&mut out, &mut m).unwrap();
    assert_eq!(s.compaction(), Compaction::Clear);
    assert_eq!((m.requests_stopped, m.requests_length), (1, 2));
}
