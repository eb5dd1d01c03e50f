//! The contract every [`TargetModel`] passes: [`check_target`], one call.
//!
//! The speculator relies on more than the trait's signatures: a prefill followed by one-token
//! steps must give the logits of one forward over the whole sequence, a ragged batch must give
//! each row what it would get alone, a rolled-back cache must behave like a fresh one, and a
//! failed forward must leave the cache alone; a resizable target's rows come and go
//! ([`TargetModel::grow`], [`TargetModel::retain`]) without changing the other rows' logits,
//! and a joining row's prefill rides a forward with the others' steps
//! ([`LogitRows::Tail`]). The suite runs small deterministic token
//! sequences (derived from `vocab_size`) through the target and returns the first violation as
//! an `invalid-argument` error on `target` naming the check; an error the target raises where
//! none is expected is reported the same way, with its code.

mod harness;

use candle_core::DType;

use super::{LogitRows, TargetInput, TargetModel};
use crate::error::Result;
use harness::{Case, Out, Suite, close, close_at, expect, fail, tokens};

/// Run the [`TargetModel`] contract suite on `target`, capturing `capture_layer_ids`
/// (each in `0..num_hidden_layers`). Returns the first violation as an `invalid-argument`
/// error on `target` whose message names the check. Tolerance: `1e-4` relative to the
/// largest reference value (at least 1) for f32/f64 outputs, `3e-2` for 16-bit ones.
pub fn check_target<T: TargetModel>(target: &T, capture_layer_ids: &[usize]) -> Result<()> {
    let (v, layers, h) = (
        target.vocab_size(),
        target.num_hidden_layers(),
        target.hidden_size(),
    );
    if v == 0 || layers == 0 || h == 0 {
        return Err(fail(
            "sizes",
            format!("vocab {v}, layers {layers}, hidden {h}: all must be positive"),
        ));
    }
    if let Some(&bad) = capture_layer_ids.iter().find(|&&c| c >= layers) {
        return Err(fail(
            "sizes",
            format!("capture id {bad} is outside 0..{layers}"),
        ));
    }
    let cap = capture_layer_ids;
    let s = Suite {
        t: target,
        vocab: v,
    };
    let tol_of = |o: &Out| {
        if matches!(o.dtype, DType::F16 | DType::BF16) {
            3e-2
        } else {
            1e-4
        }
    };

    // Whole sequence vs prefill + one-token steps (alternating All and Last).
    let check = "steps-equal-whole";
    let seq = tokens(v, 1, 12);
    let whole = s.run(check, &mut s.cache(check, 1)?, &[&seq], LogitRows::All, cap)?;
    let tol = tol_of(&whole);
    let mut c = s.cache(check, 1)?;
    let pre = s.run(check, &mut c, &[&seq[..5]], LogitRows::All, cap)?;
    for j in 0..5 {
        close_at(
            check,
            &format!("prefill at {j}"),
            (&pre, 0, j),
            (&whole, 0, j),
            tol,
        )?;
    }
    for j in 5..12 {
        let rows = if j % 2 == 0 {
            LogitRows::All
        } else {
            LogitRows::Last
        };
        let step = s.run(check, &mut c, &[&seq[j..=j]], rows, cap)?;
        close_at(
            check,
            &format!("step at {j}"),
            (&step, 0, 0),
            (&whole, 0, j),
            tol,
        )?;
    }

    // Last = the last row of All.
    let check = "last-equals-all";
    let last = s.run(
        check,
        &mut s.cache(check, 1)?,
        &[&seq],
        LogitRows::Last,
        cap,
    )?;
    close(
        check,
        "last logits",
        last.logit(0, 0),
        whole.logit(0, 11),
        tol,
    )?;

    // A ragged batch (one row sitting a forward out) = each row alone.
    let check = "ragged-equals-alone";
    let chunks: [[Vec<u32>; 3]; 3] = [
        [tokens(v, 2, 4), tokens(v, 3, 7), Vec::new()],
        [tokens(v, 4, 3), Vec::new(), tokens(v, 5, 2)],
        [tokens(v, 6, 1), tokens(v, 7, 2), tokens(v, 8, 1)],
    ];
    let modes = [LogitRows::All, LogitRows::All, LogitRows::Last];
    let mut batch = s.cache(check, 3)?;
    let mut alone: Vec<T::Cache> = (0..3).map(|_| s.cache(check, 1)).collect::<Result<_>>()?;
    for (round, (chunk, &mode)) in chunks.iter().zip(&modes).enumerate() {
        let rows: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
        let got = s.run(check, &mut batch, &rows, mode, cap)?;
        for (b, row) in rows.iter().enumerate() {
            let one = s.run(check, &mut alone[b], &[row], mode, cap)?;
            let n_logits = if mode == LogitRows::All {
                row.len()
            } else {
                usize::from(!row.is_empty())
            };
            for j in 0..n_logits {
                close(
                    check,
                    &format!("round {round} row {b} logits at {j}"),
                    got.logit(b, j),
                    one.logit(0, j),
                    tol,
                )?;
            }
            for j in 0..row.len() {
                close(
                    check,
                    &format!("round {round} row {b} hidden at {j}"),
                    got.hid(b, j),
                    one.hid(0, j),
                    tol,
                )?;
            }
        }
    }

    // Truncate then forward = a fresh cache holding the kept prefix.
    let check = "truncate-equals-fresh";
    let (long, other) = (tokens(v, 9, 10), tokens(v, 10, 3));
    let mut rolled = s.cache(check, 1)?;
    s.run(check, &mut rolled, &[&long], LogitRows::Last, cap)?;
    expect(
        check,
        "truncate to the held length",
        target.truncate(&mut rolled, &[10]),
    )?;
    expect(check, "truncate", target.truncate(&mut rolled, &[6]))?;
    if target.cache_lengths(&rolled) != [6] {
        return Err(fail(
            check,
            format!(
                "lengths {:?} after truncating to 6",
                target.cache_lengths(&rolled)
            ),
        ));
    }
    let a = s.run(check, &mut rolled, &[&other], LogitRows::All, cap)?;
    let mut fresh = s.cache(check, 1)?;
    s.run(check, &mut fresh, &[&long[..6]], LogitRows::Last, cap)?;
    let b = s.run(check, &mut fresh, &[&other], LogitRows::All, cap)?;
    for j in 0..other.len() {
        close_at(check, &format!("at {j}"), (&a, 0, j), (&b, 0, j), tol)?;
    }
    expect(check, "truncate to 0", target.truncate(&mut rolled, &[0]))?;
    let z = s.run(check, &mut rolled, &[&seq], LogitRows::All, cap)?;
    close(
        check,
        "logits after truncating to 0",
        &z.logits,
        &whole.logits,
        tol,
    )?;
    match target.truncate(&mut rolled, &[13]) {
        Ok(()) => return Err(fail(check, "truncating 12 tokens to 13 succeeded")),
        Err(e) if e.code() != "invalid-argument" => {
            return Err(fail(
                check,
                format!(
                    "truncating past the held length gave [{}], expected invalid-argument",
                    e.code()
                ),
            ));
        }
        Err(_) => {}
    }

    // Capture id 0 is the embedding: the same token gives the same features at any position.
    let check = "capture-0-is-embedding";
    let (x, y) = (seq[0], seq[1]);
    let rep = [x, y, x, y, x];
    let e = s.run(
        check,
        &mut s.cache(check, 1)?,
        &[&rep],
        LogitRows::Last,
        &[0],
    )?;
    let e2 = s.run(
        check,
        &mut s.cache(check, 1)?,
        &[&[x]],
        LogitRows::Last,
        &[0],
    )?;
    for j in [2, 4] {
        close(
            check,
            &format!("token {x} at positions 0 and {j}"),
            e.hid(0, j),
            e.hid(0, 0),
            tol,
        )?;
    }
    close(
        check,
        "token at position 0 alone",
        e2.hid(0, 0),
        e.hid(0, 0),
        tol,
    )?;
    close(
        check,
        &format!("token {y} at positions 1 and 3"),
        e.hid(0, 3),
        e.hid(0, 1),
        tol,
    )?;

    // Capture ids come back in the order asked.
    if cap.len() >= 2 {
        let check = "capture-order";
        let rev: Vec<usize> = cap.iter().rev().copied().collect();
        let r = s.run(
            check,
            &mut s.cache(check, 1)?,
            &[&seq],
            LogitRows::Last,
            &rev,
        )?;
        for j in 0..seq.len() {
            for (i, k) in (0..cap.len()).zip((0..cap.len()).rev()) {
                close(
                    check,
                    &format!("block {i} at {j}"),
                    &r.hid(0, j)[k * h..(k + 1) * h],
                    &whole.hid(0, j)[i * h..(i + 1) * h],
                    tol,
                )?;
            }
        }
    }

    if target.resizable() {
        rows_come_and_go(&s, cap, tol)?;
    }

    // Bad input is refused before any work, and the cache is left alone.
    let check = "refuses-bad-input";
    let mut c = s.cache(check, 2)?;
    s.run(check, &mut c, &[&seq[..3], &seq[..2]], LogitRows::Last, cap)?;
    let ok = &seq[..6];
    let bad_id = [seq[0], seq[1], seq[2], v as u32];
    let too_deep = [layers];
    let cases: [Case<'_>; 4] = [
        ("a token id >= vocab_size", &bad_id, 2, &[2, 2], cap),
        ("num_tokens > width", &ok[..4], 2, &[3, 1], cap),
        ("a batch other than the cache's", ok, 2, &[1, 1, 1], cap),
        (
            "a capture id >= num_hidden_layers",
            &ok[..4],
            2,
            &[2, 2],
            &too_deep,
        ),
    ];
    for (what, tokens, width, num_tokens, capture) in cases {
        let input = TargetInput {
            tokens,
            width,
            num_tokens,
            logits: LogitRows::Last,
        };
        s.refuse(&format!("{check}: {what}"), &mut c, &input, capture)?;
    }
    Ok(())
}

/// A resizable target: rows grow and leave between forwards, a joining row's prefill rides
/// the others' steps (`Tail` logits), and every row gets what it would alone.
fn rows_come_and_go<T: TargetModel>(s: &Suite<'_, T>, cap: &[usize], tol: f32) -> Result<()> {
    let check = "rows-come-and-go";
    let t = s.t;
    let seqs = [
        tokens(s.vocab, 11, 9),
        tokens(s.vocab, 12, 9),
        tokens(s.vocab, 13, 9),
    ];
    // Each sequence alone, every position.
    let mut alone = Vec::new();
    for q in &seqs {
        alone.push(s.run(check, &mut s.cache(check, 1)?, &[q], LogitRows::All, cap)?);
    }
    let mut c = s.cache(check, 2)?;
    s.run(
        check,
        &mut c,
        &[&seqs[0][..5], &seqs[1][..3]],
        LogitRows::All,
        cap,
    )?;
    expect(check, "grow", t.grow(&mut c, 1))?;
    if t.cache_lengths(&c) != [5, 3, 0] {
        return Err(fail(
            check,
            format!(
                "lengths {:?} after growing [5, 3] by one row",
                t.cache_lengths(&c)
            ),
        ));
    }
    // Row 0 one step, row 1 two, row 2 its whole prefill: each row's steps and the joining
    // row's last position.
    let tails = [1, 2, 1];
    let o = s.run(
        check,
        &mut c,
        &[&seqs[0][5..6], &seqs[1][3..5], &seqs[2][..6]],
        LogitRows::Tail(&tails),
        cap,
    )?;
    // (what, row, its step in `o`, the position alone).
    let steps = [
        ("row 0 step", 0, 0, 5),
        ("row 1 first step", 1, 0, 3),
        ("row 1 second step", 1, 1, 4),
    ];
    for (what, row, j, at) in steps {
        close_at(check, what, (&o, row, j), (&alone[row], 0, at), tol)?;
    }
    close(
        check,
        "row 2 prefill's last: logits",
        o.logit(2, 0),
        alone[2].logit(0, 5),
        tol,
    )?;
    for j in 0..6 {
        close(
            check,
            &format!("row 2 prefill features at {j}"),
            o.hid(2, j),
            alone[2].hid(0, j),
            tol,
        )?;
    }
    // Row 1 leaves; the others go on as if it had never been there.
    expect(check, "retain", t.retain(&mut c, &[true, false, true]))?;
    if t.cache_lengths(&c) != [6, 6] {
        return Err(fail(
            check,
            format!(
                "lengths {:?} after dropping row 1 of [6, 5, 6]",
                t.cache_lengths(&c)
            ),
        ));
    }
    let o = s.run(
        check,
        &mut c,
        &[&seqs[0][6..8], &seqs[2][6..8]],
        LogitRows::All,
        cap,
    )?;
    for (row, seq) in [(0, 0), (1, 2)] {
        for j in 0..2 {
            close_at(
                check,
                &format!("row {row} after a retain, step {j}"),
                (&o, row, j),
                (&alone[seq], 0, 6 + j),
                tol,
            )?;
        }
    }
    Ok(())
}
