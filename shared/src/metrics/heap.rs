//! Heap accounting: [`CountingAlloc`] wraps a binary's global allocator and counts the bytes
//! its allocations hold, and their peak. The peak resident set size also counts what the
//! allocator keeps after a free (the `cascade` binary's mimalloc keeps freed pages for reuse,
//! [`crate::device::keep_freed_memory`], and on the learner's CPU configs that was 20–40 % on top
//! of the live peak); the heap peak is what the program itself held at once, which is what
//! `cascade plan` models, as PyTorch's `max_memory_allocated` against `max_memory_reserved`.
//!
//! The counters are two relaxed atomics updated on every allocation and free. Without the
//! wrapper installed (a binary with another allocator) the readings are `None`.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// Bytes held by live allocations.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
/// Largest [`IN_USE`] since the start or the last [`reset_heap_peak`].
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// A global allocator that counts the bytes held through it (see the module docs):
/// `#[global_allocator] static A: CountingAlloc<mimalloc::MiMalloc> = CountingAlloc(mimalloc::MiMalloc);`
pub struct CountingAlloc<A>(pub A);

fn grew(bytes: usize) {
    let now = IN_USE.fetch_add(bytes, Relaxed) + bytes;
    if now > PEAK.load(Relaxed) {
        PEAK.fetch_max(now, Relaxed);
    }
}

fn shrank(bytes: usize) {
    IN_USE.fetch_sub(bytes, Relaxed);
}

// SAFETY: every call is forwarded unchanged to the wrapped allocator, which upholds the
// `GlobalAlloc` contract; the wrapper only updates counters (no allocation of its own).
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAlloc<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's guarantees for `layout` are passed on.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (hence the wrapped one) with `layout`.
        unsafe { self.0.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller's guarantees for `ptr`, `layout` and `new_size` are passed on.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                grew(new_size - layout.size());
            } else {
                shrank(layout.size() - new_size);
            }
        }
        p
    }
}

fn mib(bytes: usize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Peak bytes held by the heap since the start or the last [`reset_heap_peak`], MiB; `None`
/// without [`CountingAlloc`].
pub fn heap_peak_mb() -> Option<f64> {
    match PEAK.load(Relaxed) {
        0 => None,
        peak => Some(mib(peak)),
    }
}

/// Starts a new peak from what is held now.
pub fn reset_heap_peak() {
    PEAK.store(IN_USE.load(Relaxed), Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::System;

    /// The wrapper counts what its allocations hold, through alloc, realloc (both ways) and
    /// dealloc, and the peak is reset to what is held. (This test binary's own allocator is not
    /// the wrapper, so only these calls move the counters.)
    #[test]
    fn counts_bytes_held_and_their_peak() {
        let a = CountingAlloc(System);
        let mib = 1 << 20;
        let base = IN_USE.load(Relaxed);
        reset_heap_peak();
        let layout = Layout::from_size_align(4 * mib, 8).unwrap();
        // SAFETY: a non-zero-sized layout; the pointer is used with the same layout below.
        let p = unsafe { a.alloc(layout) };
        assert!(!p.is_null());
        assert_eq!(IN_USE.load(Relaxed), base + 4 * mib);
        // SAFETY: `p` came from `a` with `layout`; the new size is non-zero.
        let p = unsafe { a.realloc(p, layout, 6 * mib) };
        assert_eq!(IN_USE.load(Relaxed), base + 6 * mib);
        let layout = Layout::from_size_align(6 * mib, 8).unwrap();
        // SAFETY: as above, with the layout of the last size.
        let p = unsafe { a.realloc(p, layout, mib) };
        assert_eq!(IN_USE.load(Relaxed), base + mib);
        assert_eq!(PEAK.load(Relaxed), base + 6 * mib);
        assert!(heap_peak_mb().unwrap() >= 6.0);
        let layout = Layout::from_size_align(mib, 8).unwrap();
        // SAFETY: `p` came from `a` with this layout.
        unsafe { a.dealloc(p, layout) };
        assert_eq!(IN_USE.load(Relaxed), base);
        reset_heap_peak();
        assert_eq!(PEAK.load(Relaxed), base);
    }
}
