//! Regression lock on the sampler's draws: the tokens (and log-probs to 1e-6) for fixed
//! logits and keys, recorded in `tests/fixtures/sampler_golden.txt`.
//!
//! The CUDA kernel reproduces the CPU sampler's integer draw bit for bit, and GPU checks are
//! rare (they need a lent machine); so any change to the CPU sampler, however it is computed
//! inside, must keep every token it draws (and `sampler_kernel_emulated.rs` checks the kernel,
//! run on the CPU, against the same file). The cases are in `golden/mod.rs`. Rewrite
//! the file (only after an intended change of the draw, and the kernel's with it) with
//! `CASCADE_UPDATE_GOLDEN=1 cargo test -p cascade-actor --test sampler_golden`.

use std::fmt::Write as _;

use cascade_actor::sampler::sample_batch;

mod golden;
use golden::{settings, CASES, FIXTURE};

/// One line per draw: `case setting row token logprob`.
fn draws() -> String {
    let mut out = String::new();
    for (c, case) in CASES.iter().enumerate() {
        let (l, keys, vocab) = (case.logits(), case.keys(), case.vocab);
        for (name, params) in settings() {
            for (r, s) in sample_batch(&l, vocab, &params, &keys)
                .unwrap()
                .into_iter()
                .enumerate()
            {
                writeln!(out, "{}", golden::line(c, name, r, s.token, s.logprob)).unwrap();
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
