//! Shared helpers for the dspark criterion benchmarks.

/// Sum of `data` over `threads` threads (each a contiguous share), 16 lanes per thread: the
/// read-bandwidth floor the kernels are compared to.
pub fn parallel_sum(data: &[f32], threads: usize) -> f32 {
    let chunk = data.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = data
            .chunks(chunk)
            .map(|c| {
                s.spawn(move || {
                    let mut acc = [0f32; 16];
                    let it = c.chunks_exact(16);
                    let tail: f32 = it.remainder().iter().sum();
                    for v in it {
                        for (a, x) in acc.iter_mut().zip(v) {
                            *a += x;
                        }
                    }
                    acc.iter().sum::<f32>() + tail
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .sum()
    })
}
