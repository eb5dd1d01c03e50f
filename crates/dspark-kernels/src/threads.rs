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
//! - **Products that stream a large weight from memory** (a decode or verify step's matrix
//!   products: a few rows against megabytes of weights) split the weight over the pool
//!   ([`split_stream`]) from [`STREAM_POOL_MIN_BYTES`], inside a round too, when the caller is
//!   a pool worker: a step's time is the time to read its weights, and one core alone does not
//!   reach the machine's read bandwidth. A product of several rows counts its weight bytes
//!   once per row ([`split_product`]): a verification against weights that stay in the caches
//!   is bound by its multiplies, which a second core halves. The native target's forward and
//!   the drafter's passes run on a worker ([`on_pool`]: one handoff per forward, not per
//!   product), so their splits are rayon joins from inside the pool: a worker whose peers are
//!   busy (another process holds the other cores) finds its halves unstolen and runs them
//!   itself, with no wait.
//!   Meanwhile the other workers stay awake between the forward's products for as long as
//!   they keep finding work and are not preempted ([`on_pool`]'s helpers), instead of
//!   sleeping after each product and being woken for the next.
//! - **Attention's key/value heads** split over the pool the same way ([`split_reads`]) from
//!   [`READS_POOL_MIN_BYTES`] of cache: a decode step reads its whole KV cache once per layer,
//!   a growing share of the step as the context grows.
//! - **A torch target keeps its own threads** (`torch.set_num_threads`); the engine calls it
//!   once per round and does nothing in parallel meanwhile.
//!
//! Results never depend on the placement: every parallel loop computes each item
//! independently, so the bits are the same inline or on the pool.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Work below which a call never uses the pool.
pub const POOL_MIN_WORK: usize = 1 << 20;

/// Work below which a call made inside a speculative round stays on the calling thread.
pub const ROUND_POOL_MIN_WORK: usize = 1 << 25;

/// Weight bytes from which a streamed product splits over the pool ([`split_stream`]): about
/// 0.1 ms of reading on one core, against microseconds for a join inside the pool.
pub const STREAM_POOL_MIN_BYTES: usize = 1 << 20;

/// Bytes from which reads that split into independent pieces (attention's key/value heads) go
/// to the pool ([`split_reads`]): about 20 µs of one core's reading, where the split's join
/// inside the pool costs a few microseconds.
pub const READS_POOL_MIN_BYTES: usize = 1 << 18;

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

/// `true` when a product that streams `bytes` of weights (see the module docs) should split
/// them over the pool: at least [`STREAM_POOL_MIN_BYTES`], the pool has more than one thread,
/// and either no round is running here or this thread is a pool worker (inside a round, a
/// caller outside the pool would park on every product).
pub fn split_stream(bytes: usize) -> bool {
    split_from(bytes, STREAM_POOL_MIN_BYTES)
}

/// `true` when a product of `rows` activation rows against `bytes` of weights should split
/// over the pool: [`split_stream`]'s rule for its work counted in weight bytes, `bytes · rows`.
/// One row streams its weights and is bound by their reads; each further row multiplies them
/// again while they sit in this core's caches, so a verification of K = 8 (9 rows) against a
/// weight that fits there is as much work as streaming nine times its bytes, and splits from a
/// ninth of [`STREAM_POOL_MIN_BYTES`]. Measured on the bundled pair (`cargo bench --bench
/// engine`, AMD EPYC Zen 4, AVX-512, 2 threads, alternated with the bytes-only rule): a
/// 9-row target forward 1.00-1.02 → 0.81-0.95 ms, 4 rows 0.48-0.49 → 0.39-0.54 ms, a drafter
/// proposal 0.44-0.45 → 0.37-0.38 ms; one row, where the rule is the same, unchanged.
///
/// On a quiet machine, target-only decoding of 4 requests went 78.2 → 73.4 ms and of 16
/// 226.8 → 201.9 ms (medians of 6 and 4 batches, alternated); under two busy processes that
/// hold both cores, a split's stolen half can wait for a preempted worker, and 4 requests
/// measured 1-6% slower (209.6 → 212.7 ms, 231.9 → 245.9 ms), within that run's noise.
pub fn split_product(bytes: usize, rows: usize) -> bool {
    split_from(bytes.saturating_mul(rows.max(1)), STREAM_POOL_MIN_BYTES)
}

/// [`split_stream`]'s rule for reads of `bytes` that split into a few independent pieces with no
/// weight to stream (attention's heads over a KV cache), from [`READS_POOL_MIN_BYTES`].
pub fn split_reads(bytes: usize) -> bool {
    split_from(bytes, READS_POOL_MIN_BYTES)
}

/// At least `min` bytes, more than one pool thread, and no round here or a pool worker.
fn split_from(bytes: usize, min: usize) -> bool {
    bytes >= min
        && rayon::current_num_threads() > 1
        && (!round_active() || rayon::current_thread_index().is_some())
}

/// Run `f` on a worker of the pool, keeping this thread's [`in_round`] state, so the streamed
/// products inside it split with joins from inside the pool ([`split_stream`]), while the
/// pool's other workers stay awake ([`help_until`]) until `f` returns. Runs `f` right here
/// when this thread is already a worker or the pool has one thread. Results do not depend on
/// where `f` runs.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() || rayon::current_num_threads() <= 1 {
        return f();
    }
    let round = round_active();
    let done = AtomicBool::new(false);
    rayon::scope(|s| {
        let owner = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let done = &done;
            s.spawn(move |_| help_until(done, owner));
        }
        // Set even when `f` unwinds, so that the helpers (and the scope) end.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let _done = Done(&done);
        if round { in_round(f) } else { f() }
    })
}

thread_local! {
    static HELPING: Cell<bool> = const { Cell::new(false) };
}

/// A pool worker's share of an [`on_pool`] call: run the pool's pending jobs (the call's
/// product halves) as they appear, spinning in between, until `done`, or until the pool has
/// had nothing for it for [`HELP_IDLE`], or until it finds it was preempted for
/// [`HELP_PREEMPTED`] (the machine has more runnable threads than cores: spinning there takes
/// the core from the thread it waits for). Then it goes back to the pool's own idling (sleep
/// until woken).
///
/// A forward is a chain of products with short one-thread steps between them (norms, rope,
/// attention). A worker that finds no job sleeps after some tens of microseconds, and the next
/// product must wake it (a futex, then the scheduler): measured on the memory-bound pair, about
/// one wake per product, and the second core idle ~20% of a speculative round. Kept awake for
/// the call, it takes its half at once.
///
/// A helper that lands on the owner's own thread (or on a thread already helping) returns at
/// once: spinning there would sit on top of the call it waits for.
fn help_until(done: &AtomicBool, owner: Option<usize>) {
    if rayon::current_thread_index() == owner || HELPING.with(Cell::get) {
        return;
    }
    HELPING.with(|h| h.set(true));
    let (mut busy, mut polled) = (Instant::now(), Instant::now());
    let mut idle = 0u32;
    while !done.load(Ordering::Acquire) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {
                (idle, busy) = (0, Instant::now());
                polled = busy;
            }
            Some(rayon::Yield::Idle) => {
                idle = idle.wrapping_add(1);
                if idle.is_multiple_of(HELP_SPINS_PER_CHECK) {
                    let now = Instant::now();
                    if now - busy > HELP_IDLE || now - polled > HELP_PREEMPTED {
                        break;
                    }
                    polled = now;
                }
                std::hint::spin_loop();
            }
            None => break,
        }
    }
    HELPING.with(|h| h.set(false));
}

/// Idle polls of a helper between two looks at the clock ([`help_until`]).
const HELP_SPINS_PER_CHECK: u32 = 16;

/// How long a helper waits for a job before it goes back to sleep: longer than the one-thread
/// steps between a forward's products (tens of microseconds), short beside a forward.
const HELP_IDLE: Duration = Duration::from_micros(1000);

/// A gap between two looks at the clock that means the helper was preempted.
const HELP_PREEMPTED: Duration = Duration::from_micros(500);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_product_of_rows_splits_as_its_bytes_times_its_rows_would() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let small = STREAM_POOL_MIN_BYTES / 8;
        pool.install(|| {
            in_round(|| {
                // Bytes alone: as split_stream, whatever the rows.
                assert!(split_product(STREAM_POOL_MIN_BYTES, 1));
                assert!(!split_product(small, 1));
                // Nine rows of an eighth: split.
                assert!(split_product(small, 9));
                assert!(!split_product(small, 7));
            })
        });
    }

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
    fn on_pool_keeps_the_round_and_streams_split_only_from_workers() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let big = STREAM_POOL_MIN_BYTES;
        pool.install(|| {
            // `install` already runs on a worker: splits are allowed in a round.
            assert!(in_round(|| split_stream(big)));
            assert!(!split_stream(big - 1));
            assert!(in_round(|| split_reads(READS_POOL_MIN_BYTES)));
            assert!(!split_reads(READS_POOL_MIN_BYTES - 1));
        });
        // A thread outside the pool, in a round: never (it would park on every product).
        let outside =
            std::thread::spawn(move || in_round(|| split_stream(big) || split_reads(big)));
        assert!(!outside.join().unwrap());
        let (on_worker, round) =
            in_round(|| on_pool(|| (rayon::current_thread_index().is_some(), round_active())));
        assert!(round);
        assert_eq!(on_worker, rayon::current_num_threads() > 1);
        assert!(!on_pool(round_active));
    }

    #[test]
    fn on_pool_helpers_end_with_the_call_even_when_it_panics() {
        // From outside the pool (the helpers spin on the other workers): the call's parallel
        // work is done by whoever takes it, the result is the serial one, and a panic inside
        // the call reaches the caller instead of leaving the helpers (and the scope) waiting.
        use rayon::prelude::*;
        for _ in 0..50 {
            let sum: u64 = on_pool(|| {
                (0..10_000u32)
                    .into_par_iter()
                    .with_max_len(64)
                    .map(|i| u64::from(i) * u64::from(i))
                    .sum()
            });
            assert_eq!(sum, (0..10_000u64).map(|i| i * i).sum::<u64>());
        }
        let r = std::panic::catch_unwind(|| {
            on_pool(|| {
                (0..64)
                    .into_par_iter()
                    .for_each(|i| assert!(i < 63, "boom"));
            })
        });
        assert!(r.is_err());
        // And the pool still works afterwards.
        assert_eq!(on_pool(|| (0..100u32).into_par_iter().sum::<u32>()), 4950);
        // Nested: a call made on a worker runs in place, with no helpers of its own.
        assert_eq!(on_pool(|| on_pool(|| 7)), 7);
    }

    #[test]
    fn the_flag_is_reset_after_a_panic() {
        let r = std::panic::catch_unwind(|| in_round(|| panic!("boom")));
        assert!(r.is_err());
        assert!(!round_active());
    }
}
