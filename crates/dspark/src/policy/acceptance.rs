//! What the rounds measured of acceptance, per draft position, over the engine's lifetime with
//! old rounds decaying: the schedulers read it to recalibrate each confidence and to predict
//! acceptance before a round's draws.

/// Weight of a round's observations after one more round (a half-life of about 350 rounds):
/// the text being served changes, and the head's calibration with it.
const DECAY: f64 = 0.998;

/// Observations a request's latest confidence counts as, against the measured acceptance at
/// the same position.
pub(crate) const PRIOR: f64 = 4.0;

/// Observations the record counts as at most when it bounds acceptance from above
/// ([`Acceptance::optimistic`]).
const OPTIMISM_EVIDENCE: f64 = 16.0;

/// A confidence as a probability: clamped to `[0, 1]`, NaN as `0` (as the schedulers read it).
pub(crate) fn unit(c: f32) -> f64 {
    if c.is_nan() {
        0.0
    } else {
        f64::from(c.clamp(0.0, 1.0))
    }
}

/// Per draft position `k`: decayed counts of the slots verified after every earlier draft was
/// accepted (`attempts`), of those accepted (`accepts`), and the confidences the head gave
/// them (`predicted`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Acceptance {
    attempts: Vec<f64>,
    accepts: Vec<f64>,
    predicted: Vec<f64>,
}

impl Acceptance {
    /// Age every count by one round.
    pub(crate) fn decay(&mut self) {
        for v in [&mut self.attempts, &mut self.accepts, &mut self.predicted] {
            v.iter_mut().for_each(|x| *x *= DECAY);
        }
    }

    /// One request-round: `verified` drafts sent, `accepted` accepted, the confidences of its
    /// block (`None` without a confidence head).
    pub(crate) fn record(&mut self, verified: usize, accepted: usize, confidence: Option<&[f32]>) {
        let slots = (accepted + 1).min(verified);
        if self.attempts.len() < slots {
            self.attempts.resize(slots, 0.0);
            self.accepts.resize(slots, 0.0);
            self.predicted.resize(slots, 0.0);
        }
        for k in 0..slots {
            self.attempts[k] += 1.0;
            if k < accepted {
                self.accepts[k] += 1.0;
            }
            if let Some(c) = confidence.and_then(|c| c.get(k)) {
                self.predicted[k] += unit(*c);
            }
        }
    }

    /// `c` (`[B·n]` confidences) rescaled per position by the record there:
    /// `c·(accepted + PRIOR) / (predicted + PRIOR)`, clamped to `[0, 1]`. A head that is right
    /// on average leaves it as it is; on text easier (or harder) than the head's training data
    /// the scheduler reads the acceptance it actually sees, and each request keeps its own
    /// ranking.
    pub(crate) fn recalibrated(&self, c: &[f32], n: usize) -> Vec<f32> {
        let scale: Vec<f64> = (0..n)
            .map(|k| {
                let accepted = self.accepts.get(k).copied().unwrap_or(0.0);
                let predicted = self.predicted.get(k).copied().unwrap_or(0.0);
                (accepted + PRIOR) / (predicted + PRIOR)
            })
            .collect();
        c.iter()
            .enumerate()
            .map(|(i, &x)| (unit(x) * scale[i % n]).min(1.0) as f32)
            .collect()
    }

    /// The acceptance expected at position `k` for a request whose latest confidence there is
    /// `c`: the measured rate, with `c` counted as [`PRIOR`] observations.
    pub(crate) fn expected(&self, k: usize, c: f64) -> f32 {
        let accepts = self.accepts.get(k).copied().unwrap_or(0.0);
        let attempts = self.attempts.get(k).copied().unwrap_or(0.0);
        ((accepts + PRIOR * c) / (attempts + PRIOR)) as f32
    }

    /// Decayed slots verified at position 0: how much of the record there is.
    pub(crate) fn evidence(&self) -> f64 {
        self.attempts.first().copied().unwrap_or(0.0)
    }

    /// The best acceptance at position `k` the record supports: its rate counted as at most
    /// [`OPTIMISM_EVIDENCE`] observations against a confidence of 1 counted as [`PRIOR`]. A
    /// long record of low acceptance keeps it low, yet it stays above the rate (the text can
    /// turn easier while no round drafts); without a record it is 1.
    pub(crate) fn optimistic(&self, k: usize) -> f32 {
        let accepts = self.accepts.get(k).copied().unwrap_or(0.0);
        let attempts = self.attempts.get(k).copied().unwrap_or(0.0);
        let w = if attempts > OPTIMISM_EVIDENCE {
            OPTIMISM_EVIDENCE / attempts
        } else {
            1.0
        };
        ((w * accepts + PRIOR) / (w * attempts + PRIOR)) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calibrated_head_is_left_alone_and_a_biased_one_rescaled() {
        let mut a = Acceptance::default();
        for _ in 0..1000 {
            // The head says 0.5 at position 0; the draft is accepted half the time.
            a.record(2, 1, Some(&[0.5, 0.5]));
            a.record(2, 0, Some(&[0.5, 0.5]));
        }
        let r = a.recalibrated(&[0.5, 0.5], 2);
        assert!((r[0] - 0.5).abs() < 0.01, "{r:?}");
        // Position 1: attempted once per pair, never accepted: scaled towards 0.
        assert!(r[1] < 0.05, "{r:?}");
        // Decay keeps the ratios.
        a.decay();
        let d = a.recalibrated(&[0.5, 0.5], 2);
        assert!((d[0] - r[0]).abs() < 1e-3);
        assert!((a.expected(0, 0.5) - 0.5).abs() < 0.01);
    }

    #[test]
    fn the_optimistic_bound_sits_between_the_rate_and_one() {
        let mut a = Acceptance::default();
        assert_eq!(a.optimistic(0), 1.0);
        for _ in 0..1000 {
            a.record(1, 0, None);
        }
        for _ in 0..1000 {
            a.record(1, 1, None);
        }
        // Rate 0.5 on 2000 attempts: 16 of them against 4 at 1 -> (8 + 4) / 20.
        let o = a.optimistic(0);
        assert!((o - 0.6).abs() < 1e-6, "{o}");
        assert!(o > a.expected(0, 1.0) && o < 1.0);
        // A position never attempted has no evidence: 1.
        assert_eq!(a.optimistic(3), 1.0);
        // A short record counts whole: 2 of 4 accepted -> (2 + 4) / 8.
        let mut s = Acceptance::default();
        for acc in [0, 1, 0, 1] {
            s.record(1, acc, None);
        }
        assert!((s.optimistic(0) - 0.75).abs() < 1e-6);
    }
}
