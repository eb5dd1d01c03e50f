//! Structured output in the engine, on the toy target with a toy grammar: greedy output is
//! the target's greedy decoding restricted to the grammar (with the allowed sets computed
//! lazily after the forward for a greedy row, with the right log-probabilities), sampled
//! output stays in it and follows the restricted distribution, drafts the grammar refuses are
//! cut before verification, and a grammar that dead-ends ends the request with `stop`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::sampling_common::{assert_follows, reference_probs};
use crate::speculator_common::{Mode, OracleDrafter, ToyLm, ToyTarget, argmax, mix};
use crate::toy_engine::{V, budgeted, drain, joint, lm, mixed_ids, pair_counts, sampled_pairs};
use dspark::engine::{Constraint, Engine, FinishReason, RequestId, RequestSpec, TokenConstraint};
use dspark::policy::VerifyPolicy;

/// The toy grammar: each token in the residue class `(previous + 1) % modulus` (the first:
/// class 0); with `limit`, nothing is allowed after that many tokens.
#[derive(Clone)]
struct Modular {
    modulus: u32,
    seen: Vec<u32>,
    limit: Option<usize>,
    /// How many full allowed sets were asked for (shared by the clones).
    sets: Arc<AtomicUsize>,
}

impl Modular {
    fn ok(&self, prev: Option<u32>, t: u32, at: usize) -> bool {
        if self.limit.is_some_and(|l| at >= l) || t as usize >= V {
            return false;
        }
        let want = prev.map_or(0, |p| (p + 1) % self.modulus);
        t % self.modulus == want
    }
}

impl TokenConstraint for Modular {
    fn allowed(&mut self) -> Result<Vec<u32>, String> {
        self.sets.fetch_add(1, Ordering::Relaxed);
        let mut mask = vec![0u32; V.div_ceil(32)];
        for t in 0..V as u32 {
            if self.ok(self.seen.last().copied(), t, self.seen.len()) {
                mask[t as usize / 32] |= 1 << (t % 32);
            }
        }
        Ok(mask)
    }
    fn validate(&mut self, tokens: &[u32]) -> usize {
        let mut prev = self.seen.last().copied();
        let mut n = 0;
        for &t in tokens {
            if !self.ok(prev, t, self.seen.len() + n) {
                break;
            }
            prev = Some(t);
            n += 1;
        }
        n
    }
    fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
        if self.validate(tokens) != tokens.len() {
            return Err("refused".into());
        }
        self.seen.extend_from_slice(tokens);
        Ok(())
    }
    fn rollback(&mut self, n: usize) -> Result<(), String> {
        let keep = self.seen.len() - n;
        self.seen.truncate(keep);
        Ok(())
    }
}

fn grammar(modulus: u32, limit: Option<usize>) -> Modular {
    Modular {
        modulus,
        seen: Vec::new(),
        limit,
        sets: Arc::new(AtomicUsize::new(0)),
    }
}

fn engine(mode: Mode, verify: VerifyPolicy) -> Engine<ToyTarget, OracleDrafter> {
    crate::toy_engine::engine(mode, budgeted(verify, 8, 512, None))
}

/// The target's row after `ctx` restricted to `g`'s allowed set after `generated`.
fn restricted(lm: &ToyLm, prompt: &[u32], generated: &[u32], g: &Modular) -> Vec<f32> {
    let mut ctx = prompt.to_vec();
    ctx.extend_from_slice(generated);
    let mut row = lm.next_logits(&ctx);
    let prev = generated.last().copied();
    for (t, x) in row.iter_mut().enumerate() {
        if !g.ok(prev, t as u32, generated.len()) {
            *x = f32::NEG_INFINITY;
        }
    }
    row
}

fn prompt(i: u64) -> Vec<u32> {
    mixed_ids(i * 100, 2 + (mix(i) % 6) as usize)
}

#[test]
fn greedy_is_the_targets_greedy_within_the_grammar() {
    let lm = lm();
    for verify in [VerifyPolicy::Full, VerifyPolicy::ScheduledMeasured] {
        // Without log-probabilities a set is computed only where the target's greedy token is
        // refused; with them, also at every position a token is emitted.
        let mut sets = [0usize; 2];
        for (lazy, logprobs) in [(false, Some(1)), (true, None)] {
            let mut e = engine(Mode::Greedy { corrupt_every: 5 }, verify.clone());
            let mut specs: HashMap<RequestId, (RequestSpec, Modular)> = HashMap::new();
            for i in 0..8u64 {
                // Modulus 1 allows every token: the lazy rows never ask for a set.
                let g = grammar(1 + (i % 4) as u32, None);
                let mut s = RequestSpec::new(prompt(i), 16);
                s.constraint = Some(Constraint::new(g.clone()));
                s.logprobs = logprobs;
                specs.insert(e.add_request(s.clone()).unwrap(), (s, g));
            }
            let got = drain(&mut e);
            let drafted: usize = got.values().map(|r| r.drafted).sum();
            assert!(
                got.values()
                    .flat_map(|r| &r.logprobs)
                    .all(|lp| lp.logprob.is_finite())
            );
            for (id, (s, g)) in &specs {
                let mut want = Vec::new();
                for _ in 0..s.max_new_tokens {
                    want.push(argmax(&restricted(&lm, &s.prompt, &want, g)));
                }
                assert_eq!(&got[id].tokens, &want, "{verify:?} lazy {lazy}");
                // Each emitted token's log-probability is the restricted target's.
                for (m, lp) in got[id].logprobs.iter().enumerate() {
                    let row = restricted(&lm, &s.prompt, &want[..m], g);
                    let top = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let z: f32 = row.iter().map(|x| (x - top).exp()).sum();
                    let expect = row[want[m] as usize] - top - z.ln();
                    assert!(
                        (lp.logprob - expect).abs() < 1e-4,
                        "{verify:?} position {m}: {} vs {expect}",
                        lp.logprob
                    );
                    assert_eq!(lp.token, want[m]);
                }
                assert_eq!(got[id].logprobs.len(), logprobs.map_or(0, |_| want.len()));
                sets[usize::from(lazy)] += g.sets.load(Ordering::Relaxed);
                if lazy && g.modulus == 1 {
                    assert_eq!(g.sets.load(Ordering::Relaxed), 0, "all allowed: no set");
                }
            }
            if verify == VerifyPolicy::Full {
                assert!(drafted > 0, "the grammar's drafts are verified");
            }
        }
        assert!(
            sets[1] < sets[0],
            "{verify:?}: sets eager {} lazy {}",
            sets[0],
            sets[1]
        );
    }
}

#[test]
fn sampled_tokens_follow_the_target_restricted_to_the_grammar() {
    let lm = lm();
    let p = prompt(3);
    let g = grammar(3, None);
    let t = 0.9;
    let probs = |done: &[u32]| reference_probs(&restricted(&lm, &p, done, &g), t, None, 1.0);
    let exact = joint(probs);
    let mut e = engine(Mode::Sampling, VerifyPolicy::Full);
    let pairs = sampled_pairs(&mut e, &p, t, (4000, 0xABC), |s| {
        s.constraint = Some(Constraint::new(g.clone()));
    });
    for &[a, b] in &pairs {
        assert!(
            g.ok(None, a, 0) && g.ok(Some(a), b, 1),
            "in the grammar: {a} {b}"
        );
    }
    let counts = pair_counts(&pairs);
    assert_follows(&counts, &exact, "first two tokens under a grammar");
}

#[test]
fn a_grammar_that_dead_ends_stops_the_request() {
    // Eager (log-probabilities asked for) and lazy rows; the dead end at a draft and at the
    // first position of a round.
    for (logprobs, corrupt_every) in [(Some(0), 0), (None, 0), (None, 3)] {
        let mut e = engine(Mode::Greedy { corrupt_every }, VerifyPolicy::Full);
        let mut s = RequestSpec::new(prompt(1), 20);
        s.constraint = Some(Constraint::new(grammar(2, Some(5))));
        s.logprobs = logprobs;
        let id = e.add_request(s).unwrap();
        let mut n = 0;
        let mut finish = None;
        while e.has_work() {
            for o in e.step().unwrap().outputs {
                assert_eq!(o.id, id);
                n += o.new_tokens.len();
                finish = finish.or(o.finish);
            }
        }
        assert_eq!(n, 5, "{logprobs:?} {corrupt_every}");
        assert_eq!(finish, Some(FinishReason::Stop));
    }
}

/// A grammar of one sentence, `seq`, token by token (nothing after it), that forces the rest
/// of the sentence when `forces`.
struct Literal {
    seq: Vec<u32>,
    at: usize,
    forces: bool,
}

impl TokenConstraint for Literal {
    fn allowed(&mut self) -> Result<Vec<u32>, String> {
        let mut mask = vec![0u32; V.div_ceil(32)];
        if let Some(&t) = self.seq.get(self.at) {
            mask[t as usize / 32] |= 1 << (t % 32);
        }
        Ok(mask)
    }
    fn validate(&mut self, tokens: &[u32]) -> usize {
        let rest = self.seq.get(self.at..).unwrap_or_default();
        tokens.iter().zip(rest).take_while(|(a, b)| a == b).count()
    }
    fn consume(&mut self, tokens: &[u32]) -> Result<(), String> {
        if self.validate(tokens) != tokens.len() {
            return Err("refused".into());
        }
        self.at += tokens.len();
        Ok(())
    }
    fn rollback(&mut self, n: usize) -> Result<(), String> {
        self.at -= n;
        Ok(())
    }
    fn forced(&mut self) -> Vec<u32> {
        if self.forces {
            self.seq[self.at.min(self.seq.len())..].to_vec()
        } else {
            Vec::new()
        }
    }
}

#[test]
fn what_the_grammar_forces_is_verified_in_place_of_refused_drafts() {
    // The drafter proposes the target's free greedy tokens, which the sentence refuses: without
    // forced tokens every round commits one token; with them, a whole block.
    let seq: Vec<u32> = (0..24u32).map(|i| (i * 7 + 3) % V as u32).collect();
    let mut rounds = [0usize; 2];
    for forces in [false, true] {
        let mut e = engine(Mode::Greedy { corrupt_every: 0 }, VerifyPolicy::Full);
        let mut s = RequestSpec::new(prompt(2), seq.len());
        s.constraint = Some(Constraint::new(Literal {
            seq: seq.clone(),
            at: 0,
            forces,
        }));
        let id = e.add_request(s).unwrap();
        let mut got = Vec::new();
        while e.has_work() {
            let out = e.step().unwrap();
            rounds[usize::from(forces)] += usize::from(out.round);
            for o in out.outputs {
                assert_eq!(o.id, id);
                got.extend(o.new_tokens);
            }
        }
        assert_eq!(got, seq, "forces {forces}");
    }
    assert!(
        rounds[1] * 3 <= rounds[0],
        "rounds without forced tokens {} with {}",
        rounds[0],
        rounds[1]
    );
}
