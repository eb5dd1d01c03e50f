//! Who runs where: one policy for the thread pool, for every kernel, the drafter and the native
//! target.
//!
//! dspark's parallel work goes to rayon's global pool, the same pool candle's CPU matmul uses;
//! a torch target has its own intra-op pool. Starting pool work parks the caller and wakes a
//! worker. On a quiet machine that costs microseconds, but on a loaded one a woken worker may
//! not run for a whole scheduler slice (milliseconds), and idle workers spin against whatever
//! runs next: a speculative round that hands its ~20 small drafter and kernel calls to the pool
//! measured 0.70× target-only under two busy processes, against 1.95× with a 1-thread pool.
//!
//! The policy:
//! - **Small work runs inline** on the calling thread: below [`POOL_MIN_WORK`] multiply-adds
//!   (or element visits), always.
//! - **Inside a speculative round** ([`in_round`]) the bar is [`ROUND_POOL_MIN_WORK`]: the
//!   drafter's block pass, the Markov sampler, the confidence head, verification and the
//!   native target's decode forward stay on the calling thread unless one call is large enough
//!   (tens of milliseconds of work) to amortize a handoff even on a busy machine. Prefill (the
//!   prompt through the target and the drafter's first context extension) runs outside the round
//!   and keeps the normal bar, where parallelism pays.
//! - **A torch target keeps its own threads** (`torch.set_num_threads`); the engine calls it
//!   once per round and does nothing in parallel meanwhile.
//!
//! Results never depend on the placement: every parallel loop computes each item
//! independently, so the bits are the same inline or on the pool.

use std::cell::Cell;

/// Work below which a call never uses the pool.
pub const POOL_MIN_WORK: usize = 1 << 20;

/// Work below which a call made inside a speculative round stays on the calling thread.
pub const ROUND_POOL_MIN_WORK: usize = 1 << 25;

thread_local! {
    static IN_ROUND: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` as part of a speculative round on this thread (see the module docs); nests.
pub fn in_round<R>(f: impl FnOnce() -> R) -> R {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            IN_ROUND.with(|c| c.set(self.0));
        }
    }
    let _reset = Reset(IN_ROUND.with(|c| c.replace(true)));
    f()
}

/// Whether this thread is inside [`in_round`].
pub fn round_active() -> bool {
    IN_ROUND.with(Cell::get)
}

/// `true` when a call of `work` should use the pool: above the bar that applies here, and the
/// pool has more than one thread.
pub fn use_pool(work: usize) -> bool {
    let bar = if round_active() {
        ROUND_POOL_MIN_WORK
    } else {
        POOL_MIN_WORK
    };
    work >= bar && rayon::current_num_threads() > 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_raise_the_bar_and_nest() {
        let work = POOL_MIN_WORK * 2;
        let outside = use_pool(work);
        assert_eq!(outside, rayon::current_num_threads() > 1);
        in_round(|| {
            assert!(round_active());
            assert!(!use_pool(work));
            in_round(|| assert!(round_active()));
            assert!(round_active());
        });
        assert!(!round_active());
    }

    #[test]
    fn the_flag_is_reset_after_a_panic() {
        let r = std::panic::catch_unwind(|| in_round(|| panic!("boom")));
        assert!(r.is_err());
        assert!(!round_active());
    }
}
