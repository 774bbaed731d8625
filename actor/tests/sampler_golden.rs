//! Regression lock on the sampler's draws: the tokens (and log-probs to 1e-6) for fixed
//! logits and keys, recorded in `tests/fixtures/sampler_golden.txt`.
//!
//! The CUDA kernel reproduces the CPU sampler's integer draw bit for bit, and GPU checks are
//! rare (they need a lent machine); so any change to the CPU sampler, however it is computed
//! inside, must keep every token it draws. The logits are generated with integer hashing and
//! exact float operations (the same on every machine), with ties and masked tokens. Rewrite
//! the file (only after an intended change of the draw, and the kernel's with it) with
//! `CASCADE_UPDATE_GOLDEN=1 cargo test -p cascade-actor --test sampler_golden`.

use std::fmt::Write as _;

use cascade_actor::sampler::{sample_batch, SampleKey, SamplingParams};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/fixtures/sampler_golden.txt"
);

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Deterministic logits: a sum of four uniforms (bell-shaped), scaled; `kind` 1 rounds them to
/// quarters (many ties), `kind` 2 masks every seventh token with `-inf`.
fn logits(rows: usize, vocab: usize, seed: u64, scale: f32, kind: u32) -> Vec<f32> {
    (0..rows * vocab)
        .map(|i| {
            let mut s = 0.0f32;
            for j in 0..4u64 {
                let u = splitmix64(seed ^ ((i as u64) << 2 | j)) >> 40;
                s += u as f32 / (1u64 << 24) as f32;
            }
            let x = (s - 2.0) * scale;
            match kind {
                1 => (x * 4.0).round() / 4.0,
                2 if i % 7 == 3 => f32::NEG_INFINITY,
                _ => x,
            }
        })
        .collect()
}

fn settings() -> Vec<(&'static str, SamplingParams)> {
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

/// One line per draw: `case setting row token logprob`.
fn draws() -> String {
    let cases = [
        (8usize, 151_936usize, 11u64, 6.0f32, 0u32),
        (8, 151_936, 12, 3.0, 1),
        (64, 1000, 13, 8.0, 0),
        (64, 1000, 14, 4.0, 1),
        (64, 1000, 15, 5.0, 2),
        (16, 3, 16, 1.0, 0),
    ];
    let mut out = String::new();
    for (c, &(rows, vocab, seed, scale, kind)) in cases.iter().enumerate() {
        let l = logits(rows, vocab, seed, scale, kind);
        let keys: Vec<SampleKey> = (0..rows as u64)
            .map(|r| SampleKey::for_sample(seed, r / 4, 4, r % 4, r * 3))
            .collect();
        for (name, params) in settings() {
            for (r, s) in sample_batch(&l, vocab, &params, &keys)
                .unwrap()
                .into_iter()
                .enumerate()
            {
                writeln!(out, "{c}\t{name}\t{r}\t{}\t{:.7e}", s.token, s.logprob).unwrap();
            }
        }
    }
    out
}

#[test]
fn sampler_draws_match_the_recorded_ones() {
    let got = draws();
    if std::env::var_os("CASCADE_UPDATE_GOLDEN").is_some() {
        std::fs::write(FIXTURE, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(FIXTURE).expect("fixture (see the file's doc to create)");
    let (mut n, mut tokens) = (0, 0);
    for (g, w) in got.lines().zip(want.lines()) {
        let g: Vec<&str> = g.split('\t').collect();
        let w: Vec<&str> = w.split('\t').collect();
        assert_eq!(g[..3], w[..3], "fixture out of step with the cases");
        n += 1;
        assert_eq!(
            g[3], w[3],
            "case {} {} row {}: token changed",
            w[0], w[1], w[2]
        );
        tokens += 1;
        let (lg, lw): (f64, f64) = (g[4].parse().unwrap(), w[4].parse().unwrap());
        assert!(
            (lg - lw).abs() <= 1e-6 * lw.abs().max(1.0),
            "case {} {} row {}: log-prob {lg} vs recorded {lw}",
            w[0],
            w[1],
            w[2]
        );
    }
    assert_eq!(
        n,
        want.lines().count(),
        "fixture has another number of draws"
    );
    assert_eq!(n, got.lines().count());
    assert!(tokens > 1000);
}
