//! Buffers for weights that every decode step streams: backed by 2 MiB pages where the OS
//! gives them.
//!
//! A decode step of a memory-bound target reads every packed weight once, a gigabyte or more
//! in 4 KiB pages: one TLB miss and page walk every 4 KiB of each stream, hundreds of thousands
//! a step. Linux's transparent huge pages map 2 MiB at a time, but most distributions enable
//! them only for regions that ask (`/sys/kernel/mm/transparent_hugepage/enabled` =
//! `madvise`), so [`streamed_vec`] asks (`madvise(MADV_HUGEPAGE)`) before the buffer's first
//! touch. Where the OS says no (THP off, another OS, no free huge page) the buffer is an
//! ordinary one: the advice only changes how memory is mapped, never a value.
//!
//! `DSPARK_HUGEPAGES=0` turns the advice off (to measure it, or on a machine where huge-page
//! compaction stalls loading).

/// Buffers from this size ask for huge pages (smaller ones span too few to matter).
pub(crate) const STREAMED_MIN_BYTES: usize = 4 << 20;

/// Huge page size the advice aligns to (x86-64 and aarch64 with 4 KiB base pages).
const HUGE_PAGE: usize = 2 << 20;

/// Bytes each pool task first-touches of a large buffer (whole huge pages).
const TOUCH_BYTES: usize = 4 * HUGE_PAGE;

/// `len` copies of `T::default()`, in memory advised for huge pages when it is at least
/// [`STREAMED_MIN_BYTES`] (see the module docs). Same values as `vec![T::default(); len]`.
///
/// A large buffer's first touch runs over the pool: each page fault costs the OS a page's
/// zeroing (and, in a virtual machine, an exit), several microseconds a 4 KiB page, so one
/// thread filling a 64 MiB buffer took 150 ms on a 2-core VM.
pub fn streamed_vec<T: Copy + Default + Send>(len: usize) -> Vec<T> {
    use rayon::prelude::*;

    let mut v: Vec<T> = Vec::with_capacity(len);
    let size = std::mem::size_of::<T>().max(1);
    let bytes = len.saturating_mul(size);
    if bytes < STREAMED_MIN_BYTES {
        v.resize(len, T::default());
        return v;
    }
    if enabled() {
        advise_huge(v.as_ptr().cast(), bytes);
    }
    // The first touch, after the advice: each fault can map a whole huge page.
    v.spare_capacity_mut()[..len]
        .par_chunks_mut((TOUCH_BYTES / size).max(1))
        .for_each(|chunk| {
            for x in chunk {
                x.write(T::default());
            }
        });
    // SAFETY: the first `len` elements were written just above (capacity is at least `len`).
    unsafe { v.set_len(len) };
    v
}

/// Whether the advice is on (`DSPARK_HUGEPAGES` unset or not `0`).
fn enabled() -> bool {
    std::env::var_os("DSPARK_HUGEPAGES").is_none_or(|v| v != "0")
}

/// Ask the OS to back the 2 MiB-aligned part of `[ptr, ptr + bytes)` with huge pages; errors
/// (THP compiled out, an old kernel) are ignored: the memory stays ordinary.
#[cfg(target_os = "linux")]
fn advise_huge(ptr: *const u8, bytes: usize) {
    let start = (ptr as usize).next_multiple_of(HUGE_PAGE);
    let end = (ptr as usize).saturating_add(bytes) / HUGE_PAGE * HUGE_PAGE;
    if end > start {
        // SAFETY: `[start, end)` lies inside the allocation `ptr` points to (rounded inwards),
        // which this function's caller owns and has not handed out; MADV_HUGEPAGE changes no
        // contents and no permissions.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

/// Other OSes: no advice.
#[cfg(not(target_os = "linux"))]
fn advise_huge(_ptr: *const u8, _bytes: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_the_defaults_at_every_size() {
        for len in [0, 1, 1000, STREAMED_MIN_BYTES / 4 + 3] {
            let v: Vec<f32> = streamed_vec(len);
            assert_eq!(v.len(), len);
            assert!(v.iter().all(|&x| x.to_bits() == 0));
        }
        let v: Vec<half::bf16> = streamed_vec(STREAMED_MIN_BYTES);
        assert!(v.iter().all(|x| x.to_bits() == 0));
    }

    /// The `VmFlags` of the mapping of this process that holds `addr` (Linux).
    #[cfg(target_os = "linux")]
    fn vm_flags(addr: usize) -> Option<String> {
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'));
            let bounds = range
                .map(|(lo, hi)| (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16)));
            if let Some((Ok(lo), Ok(hi))) = bounds {
                inside = (lo..hi).contains(&addr);
                continue;
            }
            if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return Some(flags.to_string());
            }
        }
        None
    }

    /// A buffer from the size on carries the advice (`hg` in its mapping's flags, whatever
    /// pages the kernel then found), a small one does not ask; skipped where the kernel has no
    /// transparent huge pages or the advice is turned off.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_advised_for_huge_pages() {
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled");
        if !thp.exists() || !enabled() {
            return;
        }
        let v: Vec<f32> = streamed_vec(4 * STREAMED_MIN_BYTES / 4);
        let aligned = (v.as_ptr() as usize).next_multiple_of(HUGE_PAGE);
        let flags = vm_flags(aligned).unwrap_or_default();
        assert!(
            flags.split_whitespace().any(|f| f == "hg"),
            "no huge-page advice on the buffer's mapping: {flags}"
        );
        drop(v);
    }
}
