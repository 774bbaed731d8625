//! CRC32C (Castagnoli), the checksum of records and segment headers.
//!
//! [`crc32c_append`] computes exactly what `crc32c::crc32c_append` does. On x86-64 CPUs with
//! AVX-512 and VPCLMULQDQ (Intel Ice Lake and later, AMD Zen 4 and later) inputs of 256 bytes
//! or more are folded 256 bytes per step with carry-less multiplications (the method of Intel's
//! "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ", on 512-bit registers), then
//! finished with the SSE4.2 `crc32` instruction; that is several times faster than the `crc32`
//! instruction alone, which the `crc32c` crate uses (also for short inputs and on other CPUs).
//! [`crc32c_append_copy`] is the same fold that also stores each 64-byte block it loaded to a
//! destination: `append` computes a record's CRC and copies its payload into the segment in one
//! pass over the payload instead of two.
//!
//! The folding constants are `x^(D+32) mod P` and `x^(D-32) mod P` for a fold distance of `D`
//! bits, bit-reflected and shifted left by one (the convention of the reflected algorithm); the
//! unit test recomputes them from the polynomial.

/// CRC32C of `data` appended to a CRC `crc` of earlier bytes (0 for none).
#[inline]
pub(crate) fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if data.len() >= x86::MIN_LEN && x86::available() {
            // SAFETY: `available` checked at run time that the CPU has every feature the
            // function is compiled for; the function reads only inside `data`.
            return unsafe { x86::crc32c_avx512(crc, data) };
        }
    }
    crc32c::crc32c_append(crc, data)
}

/// CRC32C of `data`.
#[inline]
pub(crate) fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// [`crc32c_append`] of `data` that also copies `data` to `dst`, in one pass over `data` where
/// the folding path applies (each 64-byte block is stored from the register it was loaded into
/// for the CRC), else as a copy and a CRC.
///
/// # Safety
/// `dst` must be valid for writes of `data.len()` bytes and must not overlap `data`.
#[inline]
pub(crate) unsafe fn crc32c_append_copy(crc: u32, data: &[u8], dst: *mut u8) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if data.len() >= x86::MIN_LEN && x86::available() {
            // SAFETY: `available` checked the CPU features at run time; the function reads only
            // inside `data` and writes only `dst[..data.len()]`, valid by this function's
            // contract.
            return unsafe { x86::crc32c_copy_avx512(crc, data, dst) };
        }
    }
    // SAFETY: `dst` is valid for `data.len()` bytes and does not overlap `data` (contract).
    unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
    crc32c::crc32c_append(crc, data)
}

/// [`crc32c_append_copy`] whose stores bypass the cache (non-temporal) where the folding path
/// applies: for copies into memory that this thread will not read again soon (a large record
/// going into the mapped segment). A normal store first reads the destination's cache line
/// from memory (read for ownership) and later writes it back; a streaming store writes the line
/// without reading it, so the copy moves two thirds of the bytes through memory. The first
/// bytes up to the destination's next 64-byte boundary, and the last ones after the last full
/// 64-byte block, are stored normally. Ends with a store fence: every byte is globally visible,
/// in order with later stores (the writer's release store of the record's length), when it
/// returns.
///
/// # Safety
/// As [`crc32c_append_copy`].
#[inline]
pub(crate) unsafe fn crc32c_append_copy_nt(crc: u32, data: &[u8], dst: *mut u8) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if x86::available() {
            // Bytes until `dst` is 64-byte aligned: copied and checksummed on their own, so
            // that every block of the fold below is stored to an aligned line.
            let head = (dst as usize).wrapping_neg() % 64;
            if data.len() >= head + x86::MIN_LEN {
                let (first, rest) = data.split_at(head);
                // SAFETY: `dst` is valid for `data.len()` bytes, not overlapping `data`
                // (contract); `first` and `rest` split `data`, and `dst + head` is 64-byte
                // aligned, as the streaming fold requires; the CPU features were checked.
                return unsafe {
                    std::ptr::copy_nonoverlapping(first.as_ptr(), dst, head);
                    let crc = crc32c::crc32c_append(crc, first);
                    x86::crc32c_copy_nt_avx512(crc, rest, dst.add(head))
                };
            }
        }
    }
    // SAFETY: as this function's contract.
    unsafe { crc32c_append_copy(crc, data, dst) }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Shortest input for the folding path (four 64-byte registers).
    pub(super) const MIN_LEN: usize = 256;

    /// How far ahead the checksum-only fold prefetches.
    const PREFETCH: usize = 8 << 10;

    /// Fold constants `(x^(D+32), x^(D-32))` for distance `D` bits (see the module docs).
    pub(super) const K2048: (u64, u64) = (0xdcb1_7aa4, 0xb9e0_2b86);
    pub(super) const K512: (u64, u64) = (0x740e_ef02, 0x9e4a_ddf8);
    pub(super) const K384: (u64, u64) = (0x1c29_1d04, 0x1_d82c_63da);
    pub(super) const K256: (u64, u64) = (0x1_384a_a63a, 0xba4f_c28e);
    pub(super) const K128: (u64, u64) = (0xf20c_0dfe, 0x1_4cd0_0bd6);

    /// 0 = not checked yet, 1 = no, 2 = yes.
    static AVAILABLE: AtomicU8 = AtomicU8::new(0);

    pub(super) fn available() -> bool {
        match AVAILABLE.load(Ordering::Relaxed) {
            0 => {
                let yes = is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("vpclmulqdq")
                    && is_x86_feature_detected!("pclmulqdq")
                    && is_x86_feature_detected!("sse4.2");
                AVAILABLE.store(if yes { 2 } else { 1 }, Ordering::Relaxed);
                yes
            }
            v => v == 2,
        }
    }

    /// The 64 bytes at `p`.
    ///
    /// # Safety
    /// `p` must be valid for reads of 64 bytes; the CPU must have AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(p: *const u8) -> __m512i {
        // SAFETY: `p` is readable for 64 bytes (contract); the unaligned load has no alignment
        // requirement.
        unsafe { _mm512_loadu_si512(p.cast()) }
    }

    /// The fold constants `k` broadcast to every 128-bit lane. Safe to call wherever the
    /// features are enabled: it touches registers only.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq")]
    fn keys512(k: (u64, u64)) -> __m512i {
        _mm512_broadcast_i32x4(_mm_set_epi64x(k.1 as i64, k.0 as i64))
    }

    /// `z` moved forward by the distance of `k`, plus `next`, in each 128-bit lane (registers
    /// only).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq")]
    fn fold512(z: __m512i, k: __m512i, next: __m512i) -> __m512i {
        let lo = _mm512_clmulepi64_epi128(z, k, 0x00);
        let hi = _mm512_clmulepi64_epi128(z, k, 0x11);
        // a ^ b ^ c
        _mm512_ternarylogic_epi64(lo, hi, next, 0x96)
    }

    /// `x` moved forward by the distance of `k` (128-bit register; registers only).
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse2")]
    fn fold128(x: __m128i, k: (u64, u64)) -> __m128i {
        let k = _mm_set_epi64x(k.1 as i64, k.0 as i64);
        _mm_xor_si128(
            _mm_clmulepi64_si128(x, k, 0x00),
            _mm_clmulepi64_si128(x, k, 0x11),
        )
    }

    /// What the fold does with each 64-byte block besides checksumming it.
    const READ: u8 = 0;
    /// Also stores it at the same offset from `dst`.
    const COPY: u8 = 1;
    /// Also stores it at the same offset from `dst` (64-byte aligned) with a streaming store.
    const STREAM: u8 = 2;

    /// The 64 bytes at `p` (inside `data`, which starts at `base`), stored to `dst` as `MODE`
    /// says.
    ///
    /// # Safety
    /// `p..p + 64` must lie inside the slice that starts at `base`; for `COPY` and `STREAM`,
    /// `dst` must be valid for writes of that slice's length and not overlap it, and for
    /// `STREAM` be 64-byte aligned; the CPU must have AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn take<const MODE: u8>(p: *const u8, base: *const u8, dst: *mut u8) -> __m512i {
        // SAFETY: `p` is readable for 64 bytes (contract).
        let v = unsafe { load(p) };
        // SAFETY: `p` and `base` point into the same slice with `base <= p` (contract), so the
        // offset is in range, and `dst` has room for the whole slice.
        let to = || unsafe { dst.add(p.offset_from(base) as usize) };
        if MODE == COPY {
            // SAFETY: the 64 bytes at `to()` are inside `dst`'s valid range (above).
            unsafe { _mm512_storeu_si512(to().cast(), v) };
        } else if MODE == STREAM {
            // SAFETY: as for `COPY`; `dst` and every block offset are multiples of 64 (the
            // blocks start at multiples of 64 from `base`), as the aligned streaming store needs.
            unsafe { _mm512_stream_si512(to().cast(), v) };
        }
        v
    }

    /// CRC32C of `data` (at least [`MIN_LEN`] bytes) appended to `crc`.
    ///
    /// # Safety
    /// The CPU must have AVX-512F/VL, VPCLMULQDQ, PCLMULQDQ and SSE4.2 ([`available`]).
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(super) unsafe fn crc32c_avx512(crc: u32, data: &[u8]) -> u32 {
        // SAFETY: `READ` never touches `dst`; the CPU features are this function's contract.
        unsafe { fold::<READ>(crc, data, std::ptr::null_mut()) }
    }

    /// [`crc32c_avx512`] that also copies `data` to `dst`.
    ///
    /// # Safety
    /// As [`crc32c_avx512`]; `dst` must be valid for writes of `data.len()` bytes and must not
    /// overlap `data`.
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(super) unsafe fn crc32c_copy_avx512(crc: u32, data: &[u8], dst: *mut u8) -> u32 {
        // SAFETY: `dst` is valid for `data.len()` bytes and does not overlap `data` (contract).
        unsafe { fold::<COPY>(crc, data, dst) }
    }

    /// [`crc32c_copy_avx512`] with streaming stores, followed by a store fence.
    ///
    /// # Safety
    /// As [`crc32c_copy_avx512`]; `dst` must also be 64-byte aligned.
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.2")]
    pub(super) unsafe fn crc32c_copy_nt_avx512(crc: u32, data: &[u8], dst: *mut u8) -> u32 {
        debug_assert_eq!(dst as usize % 64, 0);
        // SAFETY: `dst` is valid for `data.len()` bytes, not overlapping `data`, and 64-byte
        // aligned (contract).
        let crc = unsafe { fold::<STREAM>(crc, data, dst) };
        // Streaming stores are weakly ordered: without the fence a later (release) store could
        // become visible before them.
        _mm_sfence();
        crc
    }

    /// The CRC of `data` appended to `crc`, each 64-byte block also stored to `dst` as `MODE`
    /// says.
    ///
    /// # Safety
    /// `data` has at least [`MIN_LEN`] bytes; for `COPY` and `STREAM`, `dst` must be valid for
    /// writes of `data.len()` bytes and not overlap `data`, and for `STREAM` be 64-byte
    /// aligned; the CPU must have every feature the function is compiled for.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.2")]
    unsafe fn fold<const MODE: u8>(crc: u32, data: &[u8], dst: *mut u8) -> u32 {
        assert!(data.len() >= MIN_LEN, "the fold needs {MIN_LEN} bytes");
        let base = data.as_ptr();
        // SAFETY: every `load` below reads a block inside `data`: `left` is the number of bytes
        // from `p` to the end of `data`, every step loads only blocks it has checked `left`
        // for, and `p` advances by what it consumed; `dst` satisfies `take`'s contract by this
        // function's contract; the CPU features are this function's contract.
        let load = |p| unsafe { take::<MODE>(p, base, dst) };
        let mut p = data.as_ptr();
        let mut left = data.len();
        // The CRC register (!crc, as the crc32c crate keeps it) enters as the first 4 bytes'
        // xor; from then on the fold works as if from a zero register.
        let init = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128(!crc as i32), 0);
        let mut z0 = _mm512_xor_si512(load(p), init);
        let mut z1 = load(p.wrapping_add(64));
        let mut z2 = load(p.wrapping_add(128));
        let mut z3 = load(p.wrapping_add(192));
        p = p.wrapping_add(256);
        left -= 256;
        let k2048 = keys512(K2048);
        if MODE == READ {
            // A reader checks records that usually come from memory (written by another core,
            // or with streaming stores): asking for the lines `PREFETCH` bytes ahead keeps more
            // misses in flight than the hardware prefetcher does (about +25 % on 64 MiB of
            // 256 KiB records, see the bench's kernel table). Only inside `data`.
            while left >= 256 + PREFETCH {
                for ahead in [0, 64, 128, 192] {
                    // A hint only: it never faults.
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH + ahead).cast());
                }
                z0 = fold512(z0, k2048, load(p));
                z1 = fold512(z1, k2048, load(p.wrapping_add(64)));
                z2 = fold512(z2, k2048, load(p.wrapping_add(128)));
                z3 = fold512(z3, k2048, load(p.wrapping_add(192)));
                p = p.wrapping_add(256);
                left -= 256;
            }
        }
        while left >= 256 {
            z0 = fold512(z0, k2048, load(p));
            z1 = fold512(z1, k2048, load(p.wrapping_add(64)));
            z2 = fold512(z2, k2048, load(p.wrapping_add(128)));
            z3 = fold512(z3, k2048, load(p.wrapping_add(192)));
            p = p.wrapping_add(256);
            left -= 256;
        }
        let k512 = keys512(K512);
        let mut z = fold512(z0, k512, z1);
        z = fold512(z, k512, z2);
        z = fold512(z, k512, z3);
        while left >= 64 {
            z = fold512(z, k512, load(p));
            p = p.wrapping_add(64);
            left -= 64;
        }
        if MODE != READ {
            // What the 16-byte steps and the tail below read is not stored from registers.
            let done = data.len() - left;
            // SAFETY: the last `left` bytes of `data` (at `p`), to the same offset of `dst`,
            // which is valid for `data.len()` bytes (contract).
            unsafe { std::ptr::copy_nonoverlapping(p, dst.add(done), left) };
        }
        // Four 128-bit lanes to one: lane i moves forward by (3 - i) × 128 bits.
        let l0 = _mm512_extracti32x4_epi32(z, 0);
        let l1 = _mm512_extracti32x4_epi32(z, 1);
        let l2 = _mm512_extracti32x4_epi32(z, 2);
        let l3 = _mm512_extracti32x4_epi32(z, 3);
        let mut x = _mm_xor_si128(
            _mm_xor_si128(fold128(l0, K384), fold128(l1, K256)),
            _mm_xor_si128(fold128(l2, K128), l3),
        );
        while left >= 16 {
            // SAFETY: 16 bytes of `data` are left at `p`.
            x = _mm_xor_si128(fold128(x, K128), unsafe { _mm_loadu_si128(p.cast()) });
            p = p.wrapping_add(16);
            left -= 16;
        }
        // The 16 bytes left stand for everything so far: run them through the CRC register
        // from zero, then the last bytes.
        let lo = _mm_cvtsi128_si64(x) as u64;
        let hi = _mm_extract_epi64(x, 1) as u64;
        let reg = _mm_crc32_u64(_mm_crc32_u64(0, lo), hi) as u32;
        crc32c::crc32c_append(!reg, &data[data.len() - left..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `x^n mod P` (normal bit order, P with its x^32 term), reflected and shifted left by one.
    fn fold_constant(n: u32) -> u64 {
        let poly: u64 = 0x1_1EDC_6F41;
        let mut r: u64 = 1;
        for _ in 0..n {
            r <<= 1;
            if r >> 32 & 1 == 1 {
                r ^= poly;
            }
        }
        ((r as u32).reverse_bits() as u64) << 1
    }

    /// A CRC + copy function: `crc32c_append_copy` or its streaming-store twin.
    type CopyFn = unsafe fn(u32, &[u8], *mut u8) -> u32;

    proptest! {
        /// The one-pass CRC + copy, with normal and with streaming stores, gives the `crc32c`
        /// crate's CRC and an exact copy (the unaligned head, the folded or streamed blocks and
        /// the tail land exactly where they belong), at every length around the folding path's
        /// steps and at unaligned source and destination.
        #[test]
        fn crc_and_copy_in_one_pass(data in proptest::collection::vec(any::<u8>(), 0..3000),
                                    crc: u32, src_at in 0usize..64, dst_at in 0usize..64) {
            let src = &data[src_at.min(data.len())..];
            let copies: [CopyFn; 2] = [crc32c_append_copy, crc32c_append_copy_nt];
            for copy in copies {
                let mut dst = vec![0xa5u8; src.len() + 128];
                // SAFETY: `dst[dst_at..]` has room for `src.len()` bytes and is a separate vector.
                let got = unsafe { copy(crc, src, dst.as_mut_ptr().add(dst_at)) };
                prop_assert_eq!(got, crc32c::crc32c_append(crc, src));
                prop_assert_eq!(&dst[dst_at..dst_at + src.len()], src);
                prop_assert!(dst[..dst_at].iter().all(|&b| b == 0xa5));
                prop_assert!(dst[dst_at + src.len()..].iter().all(|&b| b == 0xa5));
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fold_constants_follow_from_the_polynomial() {
        for (d, k) in [
            (2048, x86::K2048),
            (512, x86::K512),
            (384, x86::K384),
            (256, x86::K256),
            (128, x86::K128),
        ] {
            assert_eq!(k, (fold_constant(d + 32), fold_constant(d - 32)), "D = {d}");
        }
    }

    #[test]
    fn known_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        let long: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        assert_eq!(crc32c(&long), crc32c::crc32c(&long));
    }

    proptest! {
        #[test]
        fn same_as_the_crc32c_crate(crc: u32, skip in 0usize..64,
                                    data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            // Unaligned starts too.
            let data = &data[skip.min(data.len())..];
            prop_assert_eq!(crc32c_append(crc, data), crc32c::crc32c_append(crc, data));
        }
    }
}
