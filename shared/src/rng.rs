//! A seeded RNG whose exact position can be saved in `state.json` and restored, so that a
//! resumed run draws the same numbers as an uninterrupted one.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// The serialisable position of a [`ChaCha8Rng`]: seed, stream and word position (the
/// position as a decimal string because JSON numbers cannot hold a u128 exactly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RngState {
    /// The 32-byte seed as 64 hex digits.
    pub seed_hex: String,
    /// The ChaCha stream.
    pub stream: u64,
    /// 32-bit words consumed so far, in decimal.
    pub word_pos: String,
}

impl RngState {
    /// Captures `rng`'s position.
    pub fn capture(rng: &ChaCha8Rng) -> Self {
        RngState {
            seed_hex: rng.get_seed().iter().map(|b| format!("{b:02x}")).collect(),
            stream: rng.get_stream(),
            word_pos: rng.get_word_pos().to_string(),
        }
    }

    /// Rebuilds the generator at the captured position.
    pub fn restore(&self) -> Result<ChaCha8Rng, BadRngState> {
        let bad = BadRngState;
        if self.seed_hex.len() != 64 {
            return Err(bad("seed length"));
        }
        let mut seed = [0u8; 32];
        for (i, byte) in seed.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&self.seed_hex[2 * i..2 * i + 2], 16)
                .map_err(|_| bad("seed"))?;
        }
        let word_pos: u128 = self.word_pos.parse().map_err(|_| bad("word_pos"))?;
        let mut rng = ChaCha8Rng::from_seed(seed);
        rng.set_stream(self.stream);
        rng.set_word_pos(word_pos);
        Ok(rng)
    }
}

/// A saved RNG position that does not parse (a corrupt `state.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("saved RNG state: bad {0}")]
pub struct BadRngState(pub &'static str);

/// A ChaCha8 generator from a `u64` seed (the run config's seed, or derived from it).
pub fn seeded(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A uniform draw in `[0, 1)` with 53 bits of precision.
pub fn uniform(rng: &mut ChaCha8Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restored_rng_continues_the_sequence() {
        let mut rng = seeded(17);
        for _ in 0..5 {
            rng.next_u32();
        }
        let state = RngState::capture(&rng);
        let json = serde_json::to_string(&state).unwrap();
        let mut back = serde_json::from_str::<RngState>(&json)
            .unwrap()
            .restore()
            .unwrap();
        let a: Vec<u64> = (0..10).map(|_| rng.next_u64()).collect();
        let b: Vec<u64> = (0..10).map(|_| back.next_u64()).collect();
        assert_eq!(a, b);
        assert!(RngState {
            seed_hex: "zz".into(),
            stream: 0,
            word_pos: "0".into()
        }
        .restore()
        .is_err());
    }
}
