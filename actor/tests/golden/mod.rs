//! Sampler test data: the recorded draws (`tests/fixtures/sampler_golden.txt`) with the logits,
//! keys and settings they were drawn with, and the Gaussian logits of the other sampler tests
//! and of the sampler benchmark. Shared by `sampler_golden.rs` (the CPU
//! sampler must keep every draw) and `sampler_kernel_emulated.rs` (the CUDA kernel, run on the
//! CPU, must draw the same).
//!
//! The logits are generated with integer hashing and exact float operations (the same on every
//! machine), with ties and masked tokens.
#![allow(dead_code)]

use cascade_actor::sampler::{SampleKey, SamplingParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Gaussian logits with standard deviation `std` (Box-Muller on a seeded RNG): `std` 3 gives a
/// peaked, LM-like softmax.
pub fn gaussian_logits(n: usize, std: f32, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random::<f64>().max(1e-300);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32 * std
        })
        .collect()
}

pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sampler_golden.txt"
);

/// One batch of the fixture.
#[derive(Debug, Clone, Copy)]
pub struct Case {
    pub rows: usize,
    pub vocab: usize,
    pub seed: u64,
    pub scale: f32,
    /// 0: bell-shaped logits; 1: rounded to quarters (many ties); 2: every seventh `-inf`.
    pub kind: u32,
}

const fn case(rows: usize, vocab: usize, seed: u64, scale: f32, kind: u32) -> Case {
    Case {
        rows,
        vocab,
        seed,
        scale,
        kind,
    }
}

pub const CASES: [Case; 6] = [
    case(8, 151_936, 11, 6.0, 0),
    case(8, 151_936, 12, 3.0, 1),
    case(64, 1000, 13, 8.0, 0),
    case(64, 1000, 14, 4.0, 1),
    case(64, 1000, 15, 5.0, 2),
    case(16, 3, 16, 1.0, 0),
];

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

impl Case {
    /// The batch's logits, row-major: a sum of four uniforms (bell-shaped), scaled.
    pub fn logits(&self) -> Vec<f32> {
        (0..self.rows * self.vocab)
            .map(|i| {
                let mut s = 0.0f32;
                for j in 0..4u64 {
                    let u = splitmix64(self.seed ^ ((i as u64) << 2 | j)) >> 40;
                    s += u as f32 / (1u64 << 24) as f32;
                }
                let x = (s - 2.0) * self.scale;
                match self.kind {
                    1 => (x * 4.0).round() / 4.0,
                    2 if i % 7 == 3 => f32::NEG_INFINITY,
                    _ => x,
                }
            })
            .collect()
    }

    /// Row `r`'s key: sample `r % 4` of prompt `r / 4`, position `3 r`.
    pub fn key(&self, r: usize) -> SampleKey {
        let r = r as u64;
        SampleKey::for_sample(self.seed, r / 4, 4, r % 4, r * 3)
    }

    pub fn keys(&self) -> Vec<SampleKey> {
        (0..self.rows).map(|r| self.key(r)).collect()
    }
}

/// The eight settings every case is drawn with, by name.
pub fn settings() -> Vec<(&'static str, SamplingParams)> {
    let p = |temperature, top_k, top_p| SamplingParams {
        temperature,
        top_k,
        top_p,
    };
    vec![
        ("top-p 0.95 T 1", p(1.0, None, Some(0.95))),
        ("top-k 50 top-p 0.95 T 0.7", p(0.7, Some(50), Some(0.95))),
        ("plain T 1", SamplingParams::plain()),
        ("greedy", SamplingParams::greedy()),
        ("top-k 1 T 1", p(1.0, Some(1), None)),
        ("top-k 20 T 1.3", p(1.3, Some(20), None)),
        ("top-p 0.5 T 0.6", p(0.6, None, Some(0.5))),
        ("top-k 400 top-p 0.8 T 1", p(1.0, Some(400), Some(0.8))),
    ]
}

/// `n` keys with every word of the Philox counter and key in use (for the device Philox checks).
pub fn philox_test_keys(n: u64) -> Vec<SampleKey> {
    (0..n)
        .map(|i| SampleKey {
            seed: i.wrapping_mul(0x9E37_79B9_7F4A_7C15),
            stream: i * 7,
            position: i << 33 | i,
        })
        .collect()
}

/// One line of the fixture: `case setting row token logprob`, tab-separated.
pub fn line(case: usize, setting: &str, row: usize, token: u32, logprob: f32) -> String {
    format!("{case}\t{setting}\t{row}\t{token}\t{logprob:.7e}")
}

/// One recorded draw.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub case: usize,
    pub setting: String,
    pub row: usize,
    pub token: u32,
    pub logprob: f64,
}

/// The fixture's records, in file order.
pub fn records() -> Vec<Record> {
    let text = std::fs::read_to_string(FIXTURE)
        .expect("fixture (see tests/sampler_golden.rs to create it)");
    text.lines()
        .enumerate()
        .map(|(n, l)| {
            let f: Vec<&str> = l.split('\t').collect();
            let bad = || -> ! { panic!("{FIXTURE}:{}: malformed record {l:?}", n + 1) };
            if f.len() != 5 {
                bad();
            }
            Record {
                case: f[0].parse().unwrap_or_else(|_| bad()),
                setting: f[1].to_string(),
                row: f[2].parse().unwrap_or_else(|_| bad()),
                token: f[3].parse().unwrap_or_else(|_| bad()),
                logprob: f[4].parse().unwrap_or_else(|_| bad()),
            }
        })
        .collect()
}
