//! CPU sampler against independent references: frequencies vs the truncated distribution
//! (chi-square), behaviour log-probs vs a direct f64 log-softmax, determinism and per-sample
//! streams.

mod golden;
use golden::gaussian_logits;

use cascade_actor::sampler::{sample_batch, sample_cpu, SampleKey, SamplerError, SamplingParams};

/// log_softmax(logits / T) in f64, computed directly.
fn direct_log_softmax(logits: &[f32], temperature: f64) -> Vec<f64> {
    let z: Vec<f64> = logits.iter().map(|&l| f64::from(l) / temperature).collect();
    let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let lse = m + z.iter().map(|&v| (v - m).exp()).sum::<f64>().ln();
    z.iter().map(|&v| v - lse).collect()
}

/// The truncated, renormalised distribution by sorting (the textbook definition): top-k keeps
/// every token >= the k-th largest logit, top-p then keeps the smallest top set (whole tie
/// groups) of the top-k distribution with mass >= p. Panics if p falls within `margin` of a
/// cumulative mass, where f64 and the sampler's fixed point could disagree.
fn truncated_distribution(logits: &[f32], params: &SamplingParams, margin: f64) -> Vec<f64> {
    let probs: Vec<f64> = direct_log_softmax(logits, f64::from(params.temperature))
        .iter()
        .map(|l| l.exp())
        .collect();
    let mut sorted: Vec<f32> = logits.to_vec();
    sorted.sort_by(|a, b| b.partial_cmp(a).unwrap());
    let mut cut = f32::NEG_INFINITY;
    if let Some(k) = params.top_k {
        if k < logits.len() {
            cut = sorted[k - 1];
        }
    }
    if let Some(p) = params.top_p {
        let kept_mass: f64 = (0..logits.len())
            .filter(|&i| logits[i] >= cut)
            .map(|i| probs[i])
            .sum();
        let mut distinct: Vec<f32> = sorted.iter().cloned().filter(|&v| v >= cut).collect();
        distinct.dedup();
        let mut acc = 0.0;
        for &v in &distinct {
            acc += (0..logits.len())
                .filter(|&i| logits[i] == v)
                .map(|i| probs[i])
                .sum::<f64>()
                / kept_mass;
            assert!(
                (acc - f64::from(p)).abs() > margin,
                "top_p {p} is on a boundary ({acc})"
            );
            if acc >= f64::from(p) {
                cut = v;
                break;
            }
        }
    }
    let kept: f64 = (0..logits.len())
        .filter(|&i| logits[i] >= cut)
        .map(|i| probs[i])
        .sum();
    (0..logits.len())
        .map(|i| {
            if logits[i] >= cut {
                probs[i] / kept
            } else {
                0.0
            }
        })
        .collect()
}

/// Chi-square critical value for `df` degrees of freedom at upper tail 1e-4 (Wilson-Hilferty).
fn chi_square_critical(df: usize) -> f64 {
    let z = 3.719; // standard normal quantile at 1 - 1e-4
    let d = df as f64;
    d * (1.0 - 2.0 / (9.0 * d) + z * (2.0 / (9.0 * d)).sqrt()).powi(3)
}

fn keys(seed: u64, stream: u64, n: usize) -> Vec<SampleKey> {
    (0..n as u64)
        .map(|position| SampleKey {
            seed,
            stream,
            position,
        })
        .collect()
}

#[test]
fn frequencies_match_truncated_distribution() {
    let mut logits = gaussian_logits(48, 1.5, 11);
    // Ties, including one across the top-k boundary, and a masked token.
    logits[5] = logits[7];
    logits[20] = logits[21];
    logits[30] = f32::NEG_INFINITY;
    let cases = [
        SamplingParams {
            temperature: 1.0,
            top_k: None,
            top_p: None,
        },
        SamplingParams {
            temperature: 0.7,
            top_k: Some(10),
            top_p: None,
        },
        SamplingParams {
            temperature: 1.3,
            top_k: None,
            top_p: Some(0.8),
        },
        SamplingParams {
            temperature: 1.0,
            top_k: Some(16),
            top_p: Some(0.9),
        },
        SamplingParams {
            temperature: 2.0,
            top_k: Some(3),
            top_p: Some(0.97),
        },
    ];
    let draws = 60_000;
    for (c, params) in cases.iter().enumerate() {
        let want = truncated_distribution(&logits, params, 1e-5);
        let rows: Vec<f32> = (0..draws).flat_map(|_| logits.iter().cloned()).collect();
        let out = sample_batch(&rows, logits.len(), params, &keys(99, c as u64, draws)).unwrap();
        let mut counts = vec![0usize; logits.len()];
        for s in &out {
            counts[s.token as usize] += 1;
        }
        let mut chi2 = 0.0;
        let mut df = 0usize;
        for (i, &p) in want.iter().enumerate() {
            if p == 0.0 {
                assert_eq!(counts[i], 0, "case {c}: token {i} is outside the kept set");
                continue;
            }
            let expected = p * draws as f64;
            chi2 += (counts[i] as f64 - expected).powi(2) / expected;
            df += 1;
        }
        let df = df - 1;
        assert!(df >= 1, "case {c}: need at least two kept tokens");
        let critical = chi_square_critical(df);
        assert!(
            chi2 < critical,
            "case {c} {params:?}: chi2 {chi2:.1} >= {critical:.1} (df {df})"
        );
    }
}

#[test]
fn top_k_keeps_exactly_k_without_ties() {
    let logits = gaussian_logits(1000, 2.0, 3);
    let params = SamplingParams {
        temperature: 1.0,
        top_k: Some(5),
        top_p: None,
    };
    let mut top: Vec<usize> = (0..logits.len()).collect();
    top.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap());
    let allowed: Vec<u32> = top[..5].iter().map(|&i| i as u32).collect();
    let rows: Vec<f32> = (0..2000).flat_map(|_| logits.iter().cloned()).collect();
    let out = sample_batch(&rows, logits.len(), &params, &keys(1, 2, 2000)).unwrap();
    let mut seen = std::collections::HashSet::new();
    for s in out {
        assert!(
            allowed.contains(&s.token),
            "token {} not in the top 5",
            s.token
        );
        seen.insert(s.token);
    }
    assert_eq!(
        seen.len(),
        5,
        "all five top tokens should be drawn in 2000 tries"
    );
}

#[test]
fn behaviour_logprob_equals_direct_computation() {
    for (seed, std, temperature) in [(5u64, 3.0f32, 1.0f32), (6, 2.0, 0.6), (7, 4.0, 1.7)] {
        let vocab = 151_936;
        let logits = gaussian_logits(vocab, std, seed);
        let direct = direct_log_softmax(&logits, f64::from(temperature));
        for params in [
            SamplingParams {
                temperature,
                top_k: None,
                top_p: None,
            },
            SamplingParams {
                temperature,
                top_k: Some(50),
                top_p: Some(0.95),
            },
            SamplingParams {
                temperature,
                top_k: None,
                top_p: Some(0.3),
            },
        ] {
            for position in 0..4 {
                let key = SampleKey {
                    seed,
                    stream: 1,
                    position,
                };
                let s = sample_cpu(&logits, &params, &key).unwrap();
                let want = direct[s.token as usize];
                assert!(
                    (f64::from(s.logprob) - want).abs() < 1e-6,
                    "{params:?}: logprob {} vs direct {want}",
                    s.logprob
                );
            }
        }
        // Greedy: the argmax, log-prob at T = 1.
        let g = sample_cpu(
            &logits,
            &SamplingParams::greedy(),
            &SampleKey {
                seed,
                stream: 0,
                position: 0,
            },
        )
        .unwrap();
        let argmax = (0..vocab)
            .max_by(|&a, &b| logits[a].partial_cmp(&logits[b]).unwrap())
            .unwrap();
        assert_eq!(g.token as usize, argmax);
        let at_t1 = direct_log_softmax(&logits, 1.0);
        assert!((f64::from(g.logprob) - at_t1[argmax]).abs() < 1e-6);
    }
}

#[test]
fn same_key_same_token_whatever_the_batch() {
    let vocab = 5000;
    let rows = 24;
    let logits: Vec<f32> = gaussian_logits(vocab * rows, 1.0, 21);
    let params = SamplingParams {
        temperature: 0.9,
        top_k: Some(200),
        top_p: Some(0.9),
    };
    let ks: Vec<SampleKey> = (0..rows as u64)
        .map(|r| SampleKey::for_sample(42, r / 4, 4, r % 4, 17 + r))
        .collect();
    let batch = sample_batch(&logits, vocab, &params, &ks).unwrap();
    // Reverse the batch order: each row keeps its draw.
    let mut rev_logits = Vec::with_capacity(logits.len());
    for r in (0..rows).rev() {
        rev_logits.extend_from_slice(&logits[r * vocab..(r + 1) * vocab]);
    }
    let rev_keys: Vec<SampleKey> = ks.iter().rev().cloned().collect();
    let rev = sample_batch(&rev_logits, vocab, &params, &rev_keys).unwrap();
    for r in 0..rows {
        assert_eq!(batch[r], rev[rows - 1 - r]);
        let single = sample_cpu(&logits[r * vocab..(r + 1) * vocab], &params, &ks[r]).unwrap();
        assert_eq!(batch[r], single);
        assert_eq!(
            single,
            sample_cpu(&logits[r * vocab..(r + 1) * vocab], &params, &ks[r]).unwrap()
        );
    }
}

#[test]
fn group_samples_differ() {
    // G samples of one prompt see the same logits at each step; only the stream differs.
    let vocab = 2000;
    let group = 8u64;
    let steps = 12u64;
    let params = SamplingParams {
        temperature: 1.0,
        top_k: None,
        top_p: Some(0.95),
    };
    let step_logits: Vec<Vec<f32>> = (0..steps)
        .map(|s| gaussian_logits(vocab, 2.0, 100 + s))
        .collect();
    let mut sequences = vec![Vec::new(); group as usize];
    for (position, logits) in step_logits.iter().enumerate() {
        let rows: Vec<f32> = (0..group).flat_map(|_| logits.iter().cloned()).collect();
        let ks: Vec<SampleKey> = (0..group)
            .map(|j| SampleKey::for_sample(7, 3, group, j, position as u64))
            .collect();
        for (j, s) in sample_batch(&rows, vocab, &params, &ks)
            .unwrap()
            .into_iter()
            .enumerate()
        {
            sequences[j].push(s.token);
        }
    }
    for a in 0..sequences.len() {
        for b in a + 1..sequences.len() {
            assert_ne!(
                sequences[a], sequences[b],
                "samples {a} and {b} of the group are identical"
            );
        }
    }
    // Different seeds give different draws for the same stream and position.
    let by_seed: std::collections::HashSet<u32> = (0..16)
        .map(|seed| {
            sample_cpu(
                &step_logits[0],
                &params,
                &SampleKey::for_sample(seed, 3, group, 0, 0),
            )
            .unwrap()
            .token
        })
        .collect();
    assert!(by_seed.len() > 1, "16 seeds drew the same token");
}

#[test]
fn masked_tokens_ties_and_greedy() {
    // -inf tokens are never drawn, even without truncation.
    let mut logits = vec![f32::NEG_INFINITY; 64];
    logits[10] = 0.0;
    logits[40] = 0.5;
    let out = sample_batch(
        &logits.repeat(500),
        64,
        &SamplingParams::plain(),
        &keys(3, 0, 500),
    )
    .unwrap();
    assert!(out.iter().all(|s| s.token == 10 || s.token == 40));
    assert!(out.iter().any(|s| s.token == 10) && out.iter().any(|s| s.token == 40));

    // Greedy takes the first of tied maxima; top-k keeps every token tied at the k-th value.
    let tied = [1.0f32, 3.0, 2.0, 3.0, 2.0, 2.0, -1.0];
    let g = sample_cpu(&tied, &SamplingParams::greedy(), &keys(0, 0, 1)[0]).unwrap();
    assert_eq!(g.token, 1);
    let top3 = SamplingParams {
        temperature: 1.0,
        top_k: Some(3),
        top_p: None,
    };
    let out = sample_batch(&tied.repeat(3000), tied.len(), &top3, &keys(5, 5, 3000)).unwrap();
    let mut seen = [0usize; 7];
    for s in out {
        seen[s.token as usize] += 1;
    }
    assert_eq!(seen[0] + seen[6], 0);
    assert!(seen[1] > 0 && seen[2] > 0 && seen[3] > 0 && seen[4] > 0 && seen[5] > 0);
}

#[test]
fn bad_input_is_refused() {
    let key = SampleKey {
        seed: 0,
        stream: 0,
        position: 0,
    };
    let logits = [0.0f32, 1.0, 2.0];
    let bad = |p: SamplingParams| sample_cpu(&logits, &p, &key).unwrap_err();
    assert!(matches!(
        bad(SamplingParams {
            temperature: -1.0,
            ..SamplingParams::plain()
        }),
        SamplerError::Temperature(_)
    ));
    assert!(matches!(
        bad(SamplingParams {
            top_k: Some(0),
            ..SamplingParams::plain()
        }),
        SamplerError::TopK
    ));
    assert!(matches!(
        bad(SamplingParams {
            top_p: Some(0.0),
            ..SamplingParams::plain()
        }),
        SamplerError::TopP(_)
    ));
    assert!(matches!(
        bad(SamplingParams {
            top_p: Some(1.5),
            ..SamplingParams::plain()
        }),
        SamplerError::TopP(_)
    ));
    assert!(matches!(
        sample_cpu(&[0.0, f32::NAN], &SamplingParams::plain(), &key),
        Err(SamplerError::NonFinite { row: 0 })
    ));
    assert!(matches!(
        sample_cpu(&[f32::NEG_INFINITY; 4], &SamplingParams::plain(), &key),
        Err(SamplerError::NonFinite { .. })
    ));
    assert!(matches!(
        sample_cpu(&[], &SamplingParams::plain(), &key),
        Err(SamplerError::Vocab(0))
    ));
    let two_rows = [0.0f32; 6];
    assert!(matches!(
        sample_batch(&two_rows, 4, &SamplingParams::plain(), &[key, key]),
        Err(SamplerError::Shape { .. })
    ));
    let mut rows = vec![0.0f32; 8];
    rows[6] = f32::INFINITY;
    assert!(matches!(
        sample_batch(&rows, 4, &SamplingParams::plain(), &[key, key]),
        Err(SamplerError::NonFinite { row: 1 })
    ));
}
