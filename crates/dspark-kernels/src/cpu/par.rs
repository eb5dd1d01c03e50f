//! When a kernel call is worth the thread pool, and loops that run on the pool or in order on
//! the calling thread.
//!
//! The decision is [`crate::threads::use_pool`] (one policy for the whole engine: small work
//! and work inside a speculative round run inline). Every loop computes each item
//! independently, so the results are the same bits either way.

use rayon::prelude::*;

/// Multiply-adds from which a small-row product is split over the thread pool (below, about
/// 0.2 ms of work on one core: less than a pool handoff costs on a busy machine).
pub const PAR_MIN_MACS: usize = 1 << 23;

/// `true` when `work` (multiply-adds or element visits, roughly) should use the pool
/// ([`crate::threads::use_pool`]).
pub(crate) fn worth_parallel(work: usize) -> bool {
    crate::threads::use_pool(work)
}

/// `f(i, chunk)` over `data.chunks_mut(size)`, collected in order.
pub(crate) fn map_chunks_mut<T, R, C, F>(par: bool, data: &mut [T], size: usize, f: F) -> C
where
    T: Send,
    R: Send,
    C: FromParallelIterator<R> + FromIterator<R>,
    F: Fn(usize, &mut [T]) -> R + Sync + Send,
{
    if par {
        data.par_chunks_mut(size)
            .enumerate()
            .map(|(i, c)| f(i, c))
            .collect()
    } else {
        data.chunks_mut(size)
            .enumerate()
            .map(|(i, c)| f(i, c))
            .collect()
    }
}

/// `f(i)` for `i < n`, collected in order.
pub(crate) fn map_range<R, C, F>(par: bool, n: usize, f: F) -> C
where
    R: Send,
    C: FromParallelIterator<R> + FromIterator<R>,
    F: Fn(usize) -> R + Sync + Send,
{
    if par {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// `f(scratch, i, chunk)` over `data.chunks_mut(size)`, with one `init()` scratch per worker.
pub(crate) fn for_each_chunk_init<T, S, I, F>(par: bool, data: &mut [T], size: usize, init: I, f: F)
where
    T: Send,
    I: Fn() -> S + Sync + Send,
    F: Fn(&mut S, usize, &mut [T]) + Sync + Send,
{
    if par {
        data.par_chunks_mut(size)
            .enumerate()
            .for_each_init(&init, |s, (i, c)| f(s, i, c));
    } else {
        let mut s = init();
        for (i, c) in data.chunks_mut(size).enumerate() {
            f(&mut s, i, c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_modes_give_the_same_results_in_order() {
        for par in [false, true] {
            let mut data: Vec<u32> = (0..10).collect();
            let sums: Vec<u32> = map_chunks_mut(par, &mut data, 3, |i, c| {
                c.iter_mut().for_each(|x| *x += 1);
                i as u32 * 100 + c.iter().sum::<u32>()
            });
            assert_eq!(sums, vec![6, 115, 224, 310]);
            assert_eq!(data, (1..11).collect::<Vec<u32>>());
            let sq: Result<Vec<usize>, String> = map_range(par, 4, |i| Ok(i * i));
            assert_eq!(sq, Ok(vec![0, 1, 4, 9]));
            let err: Result<Vec<usize>, String> =
                map_range(par, 4, |i| if i == 2 { Err("two".into()) } else { Ok(i) });
            assert_eq!(err, Err("two".to_string()));
            let mut out = vec![0usize; 6];
            for_each_chunk_init(par, &mut out, 2, || 7usize, |s, i, c| c.fill(*s + i));
            assert_eq!(out, vec![7, 7, 8, 8, 9, 9]);
        }
    }

    #[test]
    fn small_work_stays_inline() {
        assert!(!worth_parallel(crate::threads::POOL_MIN_WORK - 1));
    }
}
