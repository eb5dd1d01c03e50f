//! What a round spends outside the target forward, per request and by batch size, kept by the
//! [`Planner`](super::Planner) for its lifetime beside the forward timings
//! ([`ForwardTimes`](super::learned::ForwardTimes)).
//!
//! [`RoundCosts`] keeps, per batch size, the latest per-request seconds of proposing, of the
//! rest of a drafted round (kernels, cache truncation, the drafter's context extension) and of
//! the rest of a plain round (kernels, cache truncation). The drafting decision weighs two
//! regimes: drafting, which keeps each drafter context current, against target-only steps,
//! which need no context at all; so a plain round is not charged the extension its rows may
//! get later, nor a proposal the rows it appends first (the cost of switching back, paid
//! once). Medians, not means: a call's first proposal can cost twice a later one, and a short
//! call (one request, a few rounds) must not be priced by it.

use super::learned::Keyed;

/// Drafted rounds a batch size needs timed before its costs price the drafting choice.
const MIN_DRAFTED: usize = 2;

/// Per-request seconds of a round outside the target forward (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Costs {
    /// Proposing, per request.
    pub(crate) propose: f64,
    /// The rest of a drafted round, per request.
    pub(crate) drafted_rest: f64,
    /// The rest of a plain round, per request (a drafted round's kernels until a plain round
    /// is timed: an over-estimate, its verification reads more rows).
    pub(crate) plain_rest: f64,
}

/// The latest per-request costs outside the forward, by batch size (see the module docs).
#[derive(Debug, Default, Clone)]
pub(crate) struct RoundCosts {
    propose: Keyed,
    drafted_rest: Keyed,
    plain_rest: Keyed,
    /// A drafted round's rest without its extension: a plain round's until one is timed.
    drafted_kernels: Keyed,
    /// Every timed proposal, a probe's included: seconds for all its requests, by how many
    /// proposed (what rescales the drafter's prior before a batch size has its own).
    proposals: Keyed,
    /// Probe rounds: all their seconds outside the forward (the probing request's context
    /// catch-up and proposal, every request's kernels), by batch size.
    probes: Keyed,
}

impl RoundCosts {
    /// A drafted round of `batch` requests spent `propose` seconds proposing, `kernels`
    /// outside the forward, the proposal and the drafter, and `extension` appending to the
    /// drafter contexts.
    pub(crate) fn record_drafted(
        &mut self,
        batch: usize,
        propose: f64,
        kernels: f64,
        extension: f64,
    ) {
        let b = batch.max(1) as f64;
        self.propose.record(batch, propose / b);
        self.drafted_rest.record(batch, (kernels + extension) / b);
        self.drafted_kernels.record(batch, kernels / b);
    }

    /// `requests` requests proposed in one call, in `seconds` (a drafted round's or a probe's).
    pub(crate) fn record_proposal(&mut self, requests: usize, seconds: f64) {
        self.proposals.record(requests, seconds);
    }

    /// The timed proposal nearest `requests` requests: how many proposed, and the median
    /// seconds of such a call.
    pub(crate) fn proposal_near(&self, requests: usize) -> Option<(usize, f64)> {
        self.proposals.nearest(requests).map(|(k, m, _)| (k, m))
    }

    /// A probe round of `batch` requests spent `seconds` outside its forward.
    pub(crate) fn record_probe(&mut self, batch: usize, seconds: f64) {
        self.probes.record(batch, seconds);
    }

    /// The median seconds outside the forward of a probe round of the batch size nearest
    /// `batch`, if one was timed.
    pub(crate) fn probe_near(&self, batch: usize) -> Option<f64> {
        self.probes.near(batch)
    }

    /// A plain round of `batch` requests spent `rest` seconds outside the forward.
    pub(crate) fn record_plain(&mut self, batch: usize, rest: f64) {
        self.plain_rest.record(batch, rest / batch.max(1) as f64);
    }

    /// The costs for a batch of `batch` requests, from the nearest batch size timed; `None`
    /// until [`MIN_DRAFTED`] drafted rounds have been timed there (a first proposal also pays
    /// one-time costs, and one timing alone would price it).
    pub(crate) fn get(&self, batch: usize) -> Option<Costs> {
        let (propose, timed) = self.propose.near_counted(batch)?;
        if timed < MIN_DRAFTED {
            return None;
        }
        let drafted_rest = self.drafted_rest.near(batch)?;
        let plain_rest = match self.plain_rest.near(batch) {
            Some(s) => s,
            None => self.drafted_kernels.near(batch)?,
        };
        Some(Costs {
            propose,
            drafted_rest,
            plain_rest,
        })
    }

    /// [`RoundCosts::get`], or before a batch size near `batch` has its drafted rounds timed,
    /// `propose`: a prior's per-request seconds of proposing (`None`: no prior, and no costs).
    /// Either round's rest is then what plain rounds timed (a drafted round's kernels where
    /// one was timed; 0 before any round).
    pub(crate) fn get_or_prior(&self, batch: usize, propose: Option<f64>) -> Option<Costs> {
        self.get(batch).or_else(|| {
            let rest = self
                .plain_rest
                .near(batch)
                .or_else(|| self.drafted_kernels.near(batch))
                .unwrap_or(0.0);
            Some(Costs {
                propose: propose.filter(|p| p.is_finite() && *p >= 0.0)?,
                drafted_rest: rest,
                plain_rest: rest,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
    }

    #[test]
    fn costs_are_per_request_medians_of_the_nearest_batch_size() {
        let mut c = RoundCosts::default();
        assert_eq!(c.get(1), None);
        c.record_plain(1, 1e-4);
        assert_eq!(c.get(1), None, "no drafted round timed yet");
        // One slow first proposal among normal ones: the median ignores it.
        c.record_drafted(1, 5e-3, 1.5e-4, 0.5e-4);
        c.record_drafted(1, 1e-3, 1.5e-4, 0.5e-4);
        c.record_drafted(1, 1e-3, 1.5e-4, 0.5e-4);
        // Batch 16: 16 requests' worth, per request a quarter of a lone request's.
        for _ in 0..3 {
            c.record_drafted(16, 16.0 * 2.5e-4, 16.0 * 3e-5, 16.0 * 2e-5);
        }
        let one = c.get(1).unwrap();
        assert!(
            close(one.propose, 1e-3) && close(one.drafted_rest, 2e-4),
            "{one:?}"
        );
        assert!(close(one.plain_rest, 1e-4), "{one:?}");
        // Batch 12 reads batch 16 (nearer by ratio than 1); batch 1's plain round is the only
        // one timed: it is read.
        let twelve = c.get(12).unwrap();
        assert!(close(twelve.propose, 2.5e-4), "{twelve:?}");
        assert!(close(twelve.drafted_rest, 5e-5), "{twelve:?}");
        assert!(close(twelve.plain_rest, 1e-4), "{twelve:?}");
        // Ties by ratio go to the larger batch: 4 is as far from 1 as from 16.
        assert!(close(c.get(4).unwrap().propose, 2.5e-4));
        // Before a plain round is timed, a plain round is priced as a drafted round's
        // kernels, without its drafter context extension.
        let mut d = RoundCosts::default();
        d.record_drafted(2, 2e-3, 2.0 * 3e-5, 2.0 * 2e-5);
        assert_eq!(d.get(2), None, "one drafted round is not enough");
        d.record_drafted(2, 2e-3, 2.0 * 3e-5, 2.0 * 2e-5);
        let two = d.get(2).unwrap();
        assert!(
            close(two.drafted_rest, 5e-5) && close(two.plain_rest, 3e-5),
            "{two:?}"
        );
    }
}
