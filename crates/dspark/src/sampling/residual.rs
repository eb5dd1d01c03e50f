//! Sampling from the residual `norm(max(p − q, 0))` after a rejected draft.

use super::dist::Dist;
use super::view::{BLOCK, for_each_block};

/// The proposal a rejected draft was drawn from.
pub(crate) enum Proposal<'a, 'b> {
    /// One-hot at the rejected token (no draft logits were given).
    OneHot(usize),
    /// A recorded draft distribution.
    Dist(&'b Dist<'a>),
}

/// Residual mass below which the residual counts as empty (sampling then falls back to `p`).
/// The rejection probability equals this mass, so the fallback changes the output law by at
/// most this much.
const EMPTY_RESIDUAL: f64 = 1e-9;

/// Call `visit(v, max(p(v) − q(v), 0))` for every token with a positive residual, in id order,
/// until `visit` returns `true`.
fn for_each_residual(
    p: &Dist<'_>,
    q: &Proposal<'_, '_>,
    mut visit: impl FnMut(usize, f64) -> bool,
) {
    let mut qbuf = [0f32; BLOCK];
    let mut stop = false;
    for_each_block(p.row, |start, block| {
        if stop {
            return;
        }
        let qb = &mut qbuf[..block.len()];
        if let Proposal::Dist(d) = q {
            d.row.read_into(start, qb);
        }
        for (j, &x) in block.iter().enumerate() {
            let v = start + j;
            let pv = p.weight(x, v) / p.z;
            let qv = match q {
                Proposal::OneHot(t) => f64::from(u8::from(*t == v)),
                Proposal::Dist(d) => d.weight(qb[j], v) / d.z,
            };
            let r = pv - qv;
            if r > 0.0 && visit(v, r) {
                stop = true;
                return;
            }
        }
    });
}

/// Draw from `norm(max(p − q, 0))` with uniform `u`; `None` when the residual is empty.
pub(crate) fn sample_residual(p: &Dist<'_>, q: &Proposal<'_, '_>, u: f64) -> Option<usize> {
    let mut total = 0f64;
    for_each_residual(p, q, |_, r| {
        total += r;
        false
    });
    if total <= EMPTY_RESIDUAL {
        return None;
    }
    let target = u * total;
    let (mut acc, mut last, mut found) = (0f64, None, None);
    for_each_residual(p, q, |v, r| {
        acc += r;
        last = Some(v);
        if acc > target {
            found = Some(v);
        }
        found.is_some()
    });
    found.or(last)
}
