//! Top-k / top-p thresholds without sorting: an MSB-first radix select over the logits' order
//! keys, four 8-bit digits, carrying exact integer counts and masses.
//!
//! For a target `t`, the threshold is the largest key `v` with `F(v) >= t`, where
//! `F(v) = sum of weight_i over tokens with key_i >= v` (weight 1 for top-k, the integer
//! probability weight for top-p). The kept set `{key_i >= v}` is then the smallest top set that
//! reaches the target, with every token tied at the threshold value kept (so ties never depend
//! on token order). The first digit's histogram comes from a full pass over the row (fused into
//! the sampler's weight pass); later digits look only at the candidates left in the chosen bin.
//! The CUDA kernel runs the same digits with shared-memory histograms (integer atomics, so the
//! order of additions does not matter) and gets the same key.

/// Number of bins of one radix digit.
pub const BINS: usize = 256;

/// Token counts and integer masses per value of one radix digit.
#[derive(Clone)]
pub struct Histogram {
    /// Tokens per bin.
    pub count: [u64; BINS],
    /// Sum of integer weights per bin.
    pub mass: [u64; BINS],
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            count: [0; BINS],
            mass: [0; BINS],
        }
    }
}

impl Histogram {
    /// Adds a token to the bin of `digit`.
    #[inline(always)]
    pub fn add(&mut self, digit: u32, weight: u64) {
        let b = (digit & 0xff) as usize;
        self.count[b] += 1;
        self.mass[b] += weight;
    }
}

/// What the threshold's target counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum By {
    /// Number of tokens (top-k).
    Count,
    /// Integer probability mass (top-p).
    Mass,
}

/// A threshold and what it keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Threshold {
    /// Keep tokens whose order key is `>=` this.
    pub key: u32,
    /// Number of tokens kept.
    pub count: u64,
    /// Integer mass kept.
    pub mass: u64,
}

/// Picks the highest bin at which the running total from the top reaches `target`. Returns the
/// bin and the count and mass of the bins above it, or `None` if the whole histogram falls short.
fn pick_bin(h: &Histogram, by: By, target: u64, above: (u64, u64)) -> Option<(u32, (u64, u64))> {
    let (mut count, mut mass) = above;
    for b in (0..BINS).rev() {
        let here = match by {
            By::Count => count + h.count[b],
            By::Mass => mass + h.mass[b],
        };
        if here >= target {
            return Some((b as u32, (count, mass)));
        }
        count += h.count[b];
        mass += h.mass[b];
    }
    None
}

/// The threshold for `target`, among tokens with key `>= floor`.
///
/// `top` is the histogram of the top digit (`key >> 24`) over exactly those tokens; `tokens`
/// yields every `(key, w)` of the row again (it is filtered here, and only the candidates' `w`
/// go through `weight` to become integer weights), and `candidates` is scratch space. If the
/// tokens fall short of the target, everything `>= floor` is kept.
pub fn threshold<W, I, F>(
    top: &Histogram,
    by: By,
    target: u64,
    floor: u32,
    tokens: I,
    weight: F,
    candidates: &mut Vec<(u32, u64)>,
) -> Threshold
where
    W: Copy,
    I: Iterator<Item = (u32, W)>,
    F: Fn(W) -> u64,
{
    let Some((bin, mut above)) = pick_bin(top, by, target, (0, 0)) else {
        return Threshold {
            key: floor,
            count: top.count.iter().sum(),
            mass: top.mass.iter().sum(),
        };
    };
    let mut prefix = bin << 24;
    candidates.clear();
    candidates.extend(
        tokens
            .filter(|&(k, _)| k >> 24 == bin && k >= floor)
            .map(|(k, w)| (k, weight(w))),
    );
    for shift in [16u32, 8, 0] {
        let mut h = Histogram::default();
        for &(k, w) in candidates.iter() {
            h.add(k >> shift, w);
        }
        // The candidates' totals reach the target by construction of the previous digit.
        let (bin, a) = pick_bin(&h, by, target, above).expect("previous digit reached target");
        above = a;
        prefix |= bin << shift;
        candidates.retain(|&(k, _)| (k >> shift) & 0xff == bin);
    }
    Threshold {
        key: prefix,
        count: above.0 + candidates.len() as u64,
        mass: above.1 + candidates.iter().map(|&(_, w)| w).sum::<u64>(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn brute(tokens: &[(u32, u64)], by: By, target: u64, floor: u32) -> u32 {
        let mut keys: Vec<u32> = tokens.iter().map(|t| t.0).filter(|&k| k >= floor).collect();
        keys.sort_unstable();
        keys.dedup();
        for &v in keys.iter().rev() {
            let f: u64 = tokens
                .iter()
                .filter(|t| t.0 >= v)
                .map(|t| if by == By::Count { 1 } else { t.1 })
                .sum();
            if f >= target {
                return v;
            }
        }
        floor
    }

    #[test]
    fn matches_brute_force() {
        // Deterministic pseudo-random keys with many ties and shared high digits.
        let mut state = 0x1234_5678u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u32
        };
        for case in 0..200 {
            let n = 1 + (next() % 300) as usize;
            let tokens: Vec<(u32, u64)> = (0..n)
                .map(|_| {
                    let k = 0xC000_0000 | (next() % 4) << 20 | (next() % 16) << 4;
                    (k, u64::from(next() % 1000))
                })
                .collect();
            let floor = if case % 3 == 0 { tokens[0].0 } else { 0 };
            for by in [By::Count, By::Mass] {
                let mut top = Histogram::default();
                for &(k, w) in tokens.iter().filter(|t| t.0 >= floor) {
                    top.add(k >> 24, w);
                }
                let total = match by {
                    By::Count => top.count.iter().sum::<u64>(),
                    By::Mass => top.mass.iter().sum::<u64>(),
                };
                let target = 1 + u64::from(next()) % total.max(1);
                let mut cands = Vec::new();
                let t = threshold(
                    &top,
                    by,
                    target,
                    floor,
                    tokens.iter().copied(),
                    |w| w,
                    &mut cands,
                );
                assert_eq!(
                    t.key,
                    brute(&tokens, by, target, floor),
                    "case {case} {by:?}"
                );
                let kept: Vec<_> = tokens.iter().filter(|x| x.0 >= t.key).collect();
                assert_eq!(t.count, kept.len() as u64);
                assert_eq!(t.mass, kept.iter().map(|x| x.1).sum::<u64>());
            }
        }
    }
}
