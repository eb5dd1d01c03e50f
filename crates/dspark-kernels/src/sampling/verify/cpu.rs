//! The host slice kernel of verification: each request's rows read in place, statistics taken
//! in one pass per row, rows a round is least likely to reach validated early so errors do
//! not depend on the draws.

use super::residual::{Proposal, sample_residual};
use super::{HostRows, Plan, Request, Verification, greedy_check};
use crate::cpu::par::{map_range, worth_parallel};
use crate::error::Result;
use crate::sampling::categorical::{BlockSum, Check, row_argmax};
use crate::sampling::dist::{Dist, nan_in};
use crate::sampling::rng::Tag;
use crate::view::{Floats, Rows3};

/// The host slice kernel over a validated call (`plan`): every request of the batch, on the
/// pool when the call is large enough.
pub(super) fn run(plan: &Plan, rows: HostRows<'_>) -> Result<Verification> {
    let (target, draft_tokens, draft_logits) = (rows.target, rows.tokens, rows.draft);
    let [batch, width, vocab] = target.dims;
    let k = width - 1;
    let (requests, stops) = (&plan.requests, &plan.stops);
    // Small calls stay on this thread (see `par`). Fewer requests than threads: also split each
    // request's target/draft row pair.
    let rows_read = 1 + usize::from(draft_logits.is_some());
    let par = worth_parallel(batch * width * vocab * rows_read);
    let split = par && batch < rayon::current_num_threads();
    let rows: Vec<(Vec<i64>, u32)> = map_range::<_, Result<_>, _>(par, batch, |r| {
        let (req, drafts) = (&requests[r], &draft_tokens[r * k..(r + 1) * k]);
        if split {
            verify_one::<true>(r, req, target, drafts, draft_logits, stops)
        } else {
            verify_one::<false>(r, req, target, drafts, draft_logits, stops)
        }
    })?;
    let mut tokens = Vec::with_capacity(batch * width);
    let mut num_accepted = Vec::with_capacity(batch);
    for (t, a) in rows {
        tokens.extend(t);
        num_accepted.push(a);
    }
    Ok(Verification {
        batch,
        width,
        tokens,
        num_accepted,
    })
}

/// A row of one request: `(is_draft, position)`.
type RowId = (bool, usize);

/// Early validation of the rows a round is least likely to reach, latest first.
struct Ahead {
    /// The rows not yet taken, earliest first (so `pop` gives the latest).
    queue: Vec<RowId>,
    /// Early checks of target rows `0..=n`.
    target: Vec<Option<Check>>,
    /// Early checks of draft rows `0..n`.
    draft: Vec<Option<Check>>,
}

impl Ahead {
    fn new(n: usize, with_draft: bool) -> Self {
        let mut queue = Vec::with_capacity(2 * n + 1);
        for i in 0..=n {
            if with_draft && i < n {
                queue.push((true, i));
            }
            queue.push((false, i));
        }
        // Order: ..., T_{n-1}, D_{n-1}, T_n; popped T_n first.
        queue.sort_by_key(|&(d, i)| (i, !d));
        Ahead {
            queue,
            target: vec![None; n + 1],
            draft: vec![None; n],
        }
    }

    /// The next row to check alongside a pass over position `i` (only rows after `i`).
    fn next(&mut self, i: usize) -> Option<RowId> {
        match self.queue.last() {
            Some(&(d, j)) if j > i => {
                self.queue.pop();
                Some((d, j))
            }
            _ => None,
        }
    }

    /// The logits of row `id` of request `r`.
    fn row<'a>(
        &self,
        (d, j): RowId,
        r: usize,
        target: Rows3<'a>,
        draft: Option<Rows3<'a>>,
    ) -> Option<Floats<'a>> {
        if d {
            draft.map(|x| x.row(r, j))
        } else {
            Some(target.row(r, j))
        }
    }

    /// Record the check of row `id`.
    fn store(&mut self, id: Option<RowId>, check: Option<Check>) {
        match id {
            Some((true, j)) => self.draft[j] = check,
            Some((false, j)) => self.target[j] = check,
            None => {}
        }
    }
}

/// Verify request `r`; returns its `K+1` output ids and the number accepted.
/// With `SPLIT`, a request's target and draft row statistics are computed in parallel (a
/// separate instance, so that the usual path is compiled without the fork).
fn verify_one<'a, const SPLIT: bool>(
    r: usize,
    req: &Request,
    target: Rows3<'a>,
    drafts: &[i64],
    draft_logits: Option<Rows3<'a>>,
    stops: &[u32],
) -> Result<(Vec<i64>, u32)> {
    let width = target.dims[1];
    let n = req.num_draft;
    let mut out = vec![-1i64; width];
    let mut blocks: Vec<BlockSum> = Vec::new();
    let mut dblocks: Vec<BlockSum> = Vec::new();
    let where_t = |i: usize| move || format!("target row (request {r}, position {i})");
    let mut accepted = 0usize;
    let mut ended = false; // round ended before the bonus row
    let mut checked = 0usize; // rows 0..checked of the target were validated
    let mut dchecked = 0usize; // rows 0..dchecked of the draft logits were validated
    // After a rejection, one row the round did not reach is validated inside the residual pass
    // (its memory traffic then overlaps that pass's exponentials; doing the same inside the
    // row-statistics passes, on rows that might still be reached, measured slower). The result
    // is only looked at in the final validation, in the same order as without it, so the error
    // reported never depends on which row was read early.
    let mut ahead = Ahead::new(n, draft_logits.is_some());
    for (i, &x) in drafts.iter().take(n).enumerate() {
        let x = x as usize;
        checked = i + 1;
        let ok = if req.greedy() {
            let st = row_argmax(target.row(r, i));
            greedy_check(&Check::of(&st), where_t(i))?;
            if st.argmax != x {
                out[i] = st.argmax as i64;
                ended = true;
                break;
            }
            true
        } else {
            let target_dist = |blocks: &mut Vec<BlockSum>| {
                Dist::new(
                    target.row(r, i),
                    1.0 / req.temperature,
                    req.top_k,
                    req.top_p,
                    blocks,
                    "target_logits",
                    where_t(i),
                )
            };
            let draft_dist = |d: Rows3<'a>, blocks: &mut Vec<BlockSum>| {
                Dist::new(d.row(r, i), 1.0, None, 1.0, blocks, "draft_logits", || {
                    format!("draft row (request {r}, position {i})")
                })
            };
            let (p, q) = match draft_logits {
                Some(d) => {
                    dchecked = i + 1;
                    if SPLIT {
                        // Few requests for the threads: the two rows' statistics in parallel
                        // (the target's error, if any, still wins).
                        let (p, q) = rayon::join(
                            || target_dist(&mut blocks),
                            || draft_dist(d, &mut dblocks),
                        );
                        (p?, Some(q?))
                    } else {
                        let p = target_dist(&mut blocks)?;
                        (p, Some(draft_dist(d, &mut dblocks)?))
                    }
                }
                None => (target_dist(&mut blocks)?, None),
            };
            let px = p.prob(x);
            let qx = q.as_ref().map_or(1.0, |q| q.prob(x));
            let u = req.stream.uniform(Tag::Accept, i as u64, 0);
            if u * qx < px {
                true
            } else {
                let proposal = match &q {
                    Some(q) => Proposal::Dist(q),
                    None => Proposal::OneHot(x),
                };
                let u = req.stream.uniform(Tag::Residual, i as u64, 0);
                let side = ahead.next(i);
                let rw = side.and_then(|rw| ahead.row(rw, r, target, draft_logits));
                let (y, check) = sample_residual(&p, &proposal, u, rw);
                ahead.store(side, check);
                let y = match y {
                    Some(y) => y,
                    None => p.sample(&blocks, u),
                };
                out[i] = y as i64;
                ended = true;
                break;
            }
        };
        if ok {
            out[i] = x as i64;
            accepted += 1;
            if u32::try_from(x).is_ok_and(|x| stops.binary_search(&x).is_ok()) {
                ended = true;
                break;
            }
        }
    }
    if !ended {
        // Bonus token from row n.
        checked = n + 1;
        let row = target.row(r, n);
        let y = if req.greedy() {
            let st = row_argmax(row);
            greedy_check(&Check::of(&st), where_t(n))?;
            st.argmax
        } else {
            let p = Dist::new(
                row,
                1.0 / req.temperature,
                req.top_k,
                req.top_p,
                &mut blocks,
                "target_logits",
                where_t(n),
            )?;
            p.sample(&blocks, req.stream.uniform(Tag::Residual, n as u64, 0))
        };
        out[n] = y as i64;
    }
    // Validate the rows the round did not reach, so errors never depend on the random draws.
    for i in checked..=n {
        let st = ahead.target[i].unwrap_or_else(|| Check::of(&row_argmax(target.row(r, i))));
        greedy_check(&st, where_t(i))?;
    }
    if let Some(d) = draft_logits {
        for i in dchecked..n {
            let st = ahead.draft[i].unwrap_or_else(|| Check::of(&row_argmax(d.row(r, i))));
            if st.non_finite() {
                let at = format!("draft row (request {r}, position {i})");
                return Err(nan_in("draft_logits", &at));
            }
        }
    }
    Ok((out, accepted as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::verify::{VerifyOptions, verify_slices};
    use crate::view::{Seeds, Tokens};

    /// Invalid rows anywhere give the same error whatever the draws, also when the rows are
    /// validated early alongside reached ones (f32 and bf16, with and without draft logits).
    #[test]
    fn errors_do_not_depend_on_the_draws() {
        let (b, k, v) = (2usize, 4usize, 700usize);
        let target: Vec<f32> = (0..b * (k + 1) * v)
            .map(|i| ((i * 7919 % 613) as f32) / 97.0 - 3.0)
            .collect();
        let draft: Vec<f32> = (0..b * k * v)
            .map(|i| ((i * 104_729 % 617) as f32) / 101.0 - 3.0)
            .collect();
        let drafts: Vec<i64> = (0..b * k).map(|i| (i * 31 % v) as i64).collect();
        let row = |r: usize, i: usize| (r * (k + 1) + i) * v;
        let drow = |r: usize, i: usize| (r * k + i) * v;
        // (target edits, draft edits, expected message fragment)
        type Edit = (usize, usize, f32);
        let cases: Vec<(Vec<Edit>, Vec<Edit>, &str)> = vec![
            (
                vec![(row(1, 4), v, f32::NEG_INFINITY)],
                vec![],
                "position 4) has no finite",
            ),
            (
                vec![(row(0, 3) + 5, 1, f32::NAN)],
                vec![],
                "target row (request 0, position 3)",
            ),
            (
                vec![],
                vec![(drow(1, 3) + 699, 1, f32::INFINITY)],
                "draft row (request 1, position 3)",
            ),
            (
                vec![(row(1, 2), v, f32::NEG_INFINITY), (row(1, 4), 1, f32::NAN)],
                vec![],
                "position 2) has no finite",
            ),
        ];
        for (tedits, dedits, want) in cases {
            let (mut t, mut d) = (target.clone(), draft.clone());
            for (at, n, val) in tedits {
                t[at..at + n].fill(val);
            }
            for (at, n, val) in dedits {
                d[at..at + n].fill(val);
            }
            let tb: Vec<half::bf16> = t.iter().map(|&x| half::bf16::from_f32(x)).collect();
            let mut seen = None;
            for seed in 0..24u64 {
                for tf in [Floats::F32(&t), Floats::BF16(&tb)] {
                    let opts = VerifyOptions {
                        seeds: Seeds::Scalar(seed),
                        ..VerifyOptions::default()
                    };
                    let tr = Rows3::new(tf, [b, k + 1, v]).unwrap();
                    let dr = Rows3::new(Floats::F32(&d), [b, k, v]).unwrap();
                    let toks = Tokens::new(&drafts, [b, k]).unwrap();
                    let e = verify_slices(tr, toks, Some(dr), &opts).unwrap_err();
                    let msg = e.to_string();
                    assert!(msg.contains(want), "{msg} lacks {want}");
                    assert_eq!(seen.get_or_insert(msg.clone()), &msg, "seed {seed}");
                }
            }
        }
    }
}
