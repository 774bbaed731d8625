//! `cascade init-model` and `cascade inspect` driven through the real binary.

use std::path::Path;
use std::process::Command;

use anyhow::Result;

fn cascade(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(args)
        .output()
        .expect("run cascade")
}

fn init(dir: &Path, seed: &str) -> Result<()> {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/tiny-model.json");
    let out = cascade(&[
        "init-model",
        "--config",
        cfg,
        "--seed",
        seed,
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(dir.join(f).exists(), "missing {f}");
    }
    Ok(())
}

#[test]
fn init_model_is_seeded_and_refuses_a_non_empty_dir() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let (a, b, c) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    init(&a, "3")?;
    init(&b, "3")?;
    init(&c, "4")?;
    let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_eq!(bytes(&a), bytes(&b), "same seed, same bytes");
    assert_ne!(bytes(&a), bytes(&c), "another seed, other weights");
    let again = cascade(&[
        "init-model",
        "--config",
        "configs/tiny-model.json",
        "--out",
        a.to_str().unwrap(),
    ]);
    assert!(!again.status.success());
    Ok(())
}

#[test]
fn logprobs_json_and_greedy_generation() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let model = tmp.path().join("m");
    init(&model, "1")?;
    let m = model.to_str().unwrap();
    let out = cascade(&[
        "inspect",
        "logprobs",
        "--model",
        m,
        "--text",
        "hello <think>",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let ids = v["ids"].as_array().unwrap();
    let lps = v["logprobs"].as_array().unwrap();
    assert_eq!(ids.len(), lps.len());
    assert!(lps[0].is_null());
    assert!(lps[1..]
        .iter()
        .all(|x| x.as_f64().is_some_and(|f| f < 0.0 && f.is_finite())));
    // The same ids given directly give the same log-probs.
    let id_list: Vec<String> = ids.iter().map(|x| x.to_string()).collect();
    let out2 = cascade(&[
        "inspect",
        "logprobs",
        "--model",
        m,
        "--ids",
        &id_list.join(","),
        "--json",
    ]);
    let v2: serde_json::Value = serde_json::from_slice(&out2.stdout)?;
    assert_eq!(v["logprobs"], v2["logprobs"]);

    let gen = |extra: &[&str]| -> serde_json::Value {
        let mut args = vec![
            "inspect",
            "generate",
            "--model",
            m,
            "--prompt",
            "2+2?",
            "--max-new-tokens",
            "8",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = cascade(&args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let g1 = gen(&["--mode", "no_think", "--ignore-eos"]);
    let g2 = gen(&["--mode", "no_think", "--ignore-eos"]);
    assert_eq!(g1, g2, "greedy is deterministic");
    assert_eq!(g1["generated_ids"].as_array().unwrap().len(), 8);
    let s1 = gen(&["--temperature", "1.0", "--seed", "1", "--ignore-eos"]);
    let s2 = gen(&["--temperature", "1.0", "--seed", "2", "--ignore-eos"]);
    assert_ne!(
        s1["generated_ids"], s2["generated_ids"],
        "different seeds sample differently"
    );
    Ok(())
}

#[test]
fn bad_inputs_are_clear_errors() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let model = tmp.path().join("m");
    init(&model, "1")?;
    let m = model.to_str().unwrap();
    let long: Vec<String> = (0..1100).map(|i| (i % 300).to_string()).collect();
    let out = cascade(&[
        "inspect",
        "logprobs",
        "--model",
        m,
        "--ids",
        &long.join(","),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("1024"), "{err}");
    let out = cascade(&[
        "inspect",
        "logprobs",
        "--model",
        tmp.path().to_str().unwrap(),
        "--ids",
        "1,2",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("config.json"),
        "{err}"
    );
    let out = cascade(&[
        "inspect", "logprobs", "--model", m, "--ids", "1,2", "--device", "tpu",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--device"), "{err}");
    Ok(())
}
