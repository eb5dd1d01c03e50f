//! A round's proposals: one drafter call per draft temperature (each request drafts at its
//! own), checked against the target's vocabulary and the block's shape, and their draft logits
//! gathered for verification.
//!
//! A request whose own rows fail the drafter's checks (non-finite drafter logits from its
//! context) ends alone: the requests of that call propose once each to find which, those fail
//! ([`Slot::fail`](crate::engine::scheduler::Slot)), and the others propose again together. Their draws
//! depend on their own seeds and positions only, so what they propose is what they would have
//! proposed in the first call.

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor};

use super::Plan;
use super::verify::row_fault;
use crate::drafter::{Drafter, Guide, InBlockPenalty, Proposal, ProposeOptions};
use crate::engine::engine::Engine;
use crate::engine::seeds::{Use, request_seed};
use crate::error::{Error, Result};
use crate::models::TargetModel;
use crate::sampling::{Seeds, is_greedy_temperature};

/// A group's proposal, its device draft logits (if the drafter kept them there) and the
/// requests (indices into `plan.act`) that proposed.
type Proposed = (Proposal, Option<Tensor>, Vec<usize>);

impl<T: TargetModel, D: Drafter> Engine<T, D> {
    /// Propose for the requests `drafting` (indices into `plan.act`), one drafter call per
    /// draft temperature: each request drafts at its own temperature. Fills the plan's drafts,
    /// confidences and (when a request samples) draft logits; returns the block width `K`
    /// (`0` when every request failed).
    pub(super) fn propose(&mut self, plan: &mut Plan, drafting: &[usize]) -> Result<usize> {
        let vocab = self.target.vocab_size();
        let mut groups: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &j in drafting {
            if let Some(s) = &self.sched.rows[plan.act[j]] {
                groups
                    .entry(s.spec.sampling.temperature.to_bits())
                    .or_default()
                    .push(j);
            }
        }
        let mut k = 0;
        let mut q_parts: Vec<(Vec<usize>, Tensor)> = Vec::new();
        for (bits, members) in groups {
            let temperature = f32::from_bits(bits);
            let Some((mut proposal, device_q, members)) =
                self.propose_isolating(&plan.act, members, temperature)?
            else {
                continue;
            };
            let g = members.len();
            let gk = proposal.slots;
            check_proposal(&proposal, g, vocab)?;
            k = gk;
            for (r, &j) in members.iter().enumerate() {
                plan.drafts[j] = proposal.tokens[r * gk..(r + 1) * gk].to_vec();
                plan.confidence[j] = proposal
                    .confidence
                    .as_ref()
                    .map(|c| c[r * gk..(r + 1) * gk].to_vec());
                plan.drafted[j] = true;
            }
            if !is_greedy_temperature(temperature) {
                let bad =
                    || Error::bad_shape("drafter.propose", "draft logits are not [B, K, V_t]");
                let q = match device_q {
                    Some(t) if t.dims() == [g, gk, vocab] => t,
                    Some(_) => return Err(bad()),
                    None if proposal.draft_logits.len() == g * gk * vocab => {
                        let host = std::mem::take(&mut proposal.draft_logits);
                        Tensor::from_vec(host, (g, gk, vocab), &Device::Cpu)?
                    }
                    None => return Err(bad()),
                };
                q_parts.push((members, q));
            }
        }
        plan.q = merge_q(plan.act.len(), q_parts, k, vocab)?;
        Ok(k)
    }

    /// The drafter's proposal for `members` (indices into `act`) at `temperature`; when some
    /// of them fail their own checks, those end alone and the others propose without them
    /// (see the module docs). `None` when every member failed.
    fn propose_isolating(
        &mut self,
        act: &[usize],
        members: Vec<usize>,
        temperature: f32,
    ) -> Result<Option<Proposed>> {
        match self.propose_rows(act, &members, temperature) {
            Ok((p, q)) => return Ok(Some((p, q, members))),
            Err(e) if !row_fault(&e) => return Err(e),
            Err(e) if members.len() == 1 => {
                self.fail_row(act[members[0]], &e);
                return Ok(None);
            }
            Err(_) => {}
        }
        let mut survivors = Vec::with_capacity(members.len());
        for &j in &members {
            match self.propose_rows(act, &[j], temperature) {
                Ok(_) => survivors.push(j),
                Err(e) if row_fault(&e) => self.fail_row(act[j], &e),
                Err(e) => return Err(e),
            }
        }
        if survivors.is_empty() {
            return Ok(None);
        }
        let (p, q) = self.propose_rows(act, &survivors, temperature)?;
        Ok(Some((p, q, survivors)))
    }

    /// One drafter call for `members` (indices into `act`) at `temperature`.
    fn propose_rows(
        &self,
        act: &[usize],
        members: &[usize],
        temperature: f32,
    ) -> Result<(Proposal, Option<Tensor>)> {
        let mut states = Vec::with_capacity(members.len());
        let mut anchors = Vec::with_capacity(members.len());
        let mut seeds = Vec::with_capacity(members.len());
        let mut bias = Vec::with_capacity(members.len());
        let mut in_block = Vec::with_capacity(members.len());
        let mut guides = Vec::with_capacity(members.len());
        for &j in members {
            let Some(slot) = &self.sched.rows[act[j]] else {
                continue;
            };
            let Some(state) = &slot.state else { continue };
            states.push(state);
            anchors.push(slot.anchor);
            seeds.push(request_seed(slot.spec.seed, slot.len, Use::Draft));
            bias.push(slot.spec.penalties.draft_bias(&slot.out));
            in_block.push(slot.spec.penalties.in_block(&slot.out));
            guides.push(slot.spec.constraint.clone().map(Guide::new));
        }
        // Each block stays inside its request's grammar.
        let guided = guides.iter().any(Option::is_some);
        let biased = bias.iter().any(|b| !b.is_empty());
        let follows = in_block.iter().any(InBlockPenalty::is_active);
        // A device drafter keeps its draft logits where verification will read them.
        self.drafter.propose_for_verify(
            &states,
            &anchors,
            &ProposeOptions {
                logit_bias: biased.then_some(bias),
                in_block: follows.then_some(in_block),
                guides: guided.then_some(guides),
                temperature,
                seeds: Seeds::PerRequest(seeds),
                top_k: None,
            },
        )
    }

    /// End row `i`'s request with `e` (its own rows failed a check).
    pub(super) fn fail_row(&mut self, i: usize, e: &Error) {
        if let Some(s) = self.sched.rows[i].as_mut() {
            s.fail(e);
        }
    }
}

/// A group of `g` requests' proposal: ids inside the target's vocabulary, a `[g, K]` block
/// with `K > 0`, confidences (if any) `[g, K]`.
fn check_proposal(p: &Proposal, g: usize, vocab: usize) -> Result<()> {
    let gk = p.slots;
    if let Some(&t) = p.tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::TokenOutOfRange {
            name: "drafter.propose".into(),
            id: i64::from(t),
            vocab_size: vocab,
        });
    }
    if p.batch != g || p.tokens.len() != g * gk || gk == 0 {
        return Err(Error::bad_shape(
            "drafter.propose",
            format!("returned a [{}, {gk}] block for {g} requests", p.batch),
        ));
    }
    if let Some(c) = &p.confidence
        && c.len() != g * gk
    {
        return Err(Error::bad_shape(
            "drafter.propose",
            "confidences are not [B, K]",
        ));
    }
    Ok(())
}

/// The `[A, K, V_t]` draft logits of a round from its groups' parts (`None` when no request
/// samples). One part covering every request in order is used as it is; else the rows are
/// gathered (rows of requests without a part are zeros, never read).
fn merge_q(
    a: usize,
    parts: Vec<(Vec<usize>, Tensor)>,
    k: usize,
    vocab: usize,
) -> Result<Option<Tensor>> {
    if parts.is_empty() {
        return Ok(None);
    }
    if parts.len() == 1
        && parts[0].0.len() == a
        && parts[0].0.iter().enumerate().all(|(r, &j)| r == j)
    {
        return Ok(parts.into_iter().next().map(|(_, t)| t));
    }
    let device = parts[0].1.device().clone();
    let zero = Tensor::zeros((1, k, vocab), DType::F32, &device)?;
    let mut rows: Vec<Tensor> = vec![zero; a];
    for (members, q) in parts {
        let q = q.to_dtype(DType::F32)?;
        for (r, j) in members.into_iter().enumerate() {
            rows[j] = q.narrow(0, r, 1)?;
        }
    }
    Ok(Some(Tensor::cat(&rows, 0)?))
}
