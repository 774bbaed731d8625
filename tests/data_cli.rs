//! `cascade data inspect` and `cascade data convert` end to end: the real binary on the
//! dataset fixtures (`tests/fixtures/datasets/`).

use std::process::{Command, Output};

use serde_json::Value;

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/datasets/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn cascade(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn inspect_shows_schema_rows_as_the_trainer_sees_them_and_every_rejection() {
    let out = cascade(&["data", "inspect", &fixture("livecodebench.jsonl")]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("schema: livecodebench (detected)"),
        "{stdout}"
    );
    assert!(stdout.contains("kind: rl (domain: code)"), "{stdout}");
    assert!(stdout.contains("rows: 4"), "{stdout}");
    assert!(
        stdout.contains("accepted: 3, rejected: 1, skipped: 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("<|im_start|>user\n") && stdout.contains("/think"),
        "rendered prompt: {stdout}"
    );
    assert!(
        stdout.contains("\"tests\":[{\"stdin\":\"2\\n1 2\\n\""),
        "{stdout}"
    );
    // Row 2 has only call-based (LeetCode "functional") tests, which the code verifier runs.
    assert!(!stdout.contains("livecodebench.jsonl:2:"), "{stdout}");
    assert!(
        stdout.contains("livecodebench.jsonl:3: column `private_test_cases`"),
        "{stdout}"
    );

    let out = cascade(&[
        "data",
        "inspect",
        &fixture("helpsteer3.jsonl"),
        "--kind",
        "pairs",
    ]);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("skipped rows:") && stdout.contains("tie"),
        "{stdout}"
    );

    // An ambiguous file names what it found and the candidates; exit status non-zero.
    let out = cascade(&["data", "inspect", &fixture("ambiguous_swe.jsonl")]);
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("swe-bench") && stderr.contains("swe-smith"),
        "{stderr}"
    );

    // A truncated Parquet file is a clear error, not a crash.
    let out = cascade(&["data", "inspect", &fixture("truncated.parquet")]);
    let stderr = text(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("truncated.parquet: not a readable Parquet file"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn convert_writes_canonical_jsonl_in_input_order_and_reports_rejections() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("if.jsonl");
    let out = cascade(&[
        "data",
        "convert",
        &fixture("nemotron_if.parquet"),
        "--out",
        out_path.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("nemotron_if.parquet:3: column `kwargs`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("2 rows written (nemotron-if schema), 1 rejected"),
        "{stderr}"
    );
    let lines: Vec<Value> = std::fs::read_to_string(&out_path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["prompt"], "Describe a cat in under 50 words.");
    assert_eq!(
        lines[1]["kwargs"][1],
        serde_json::json!({"end_phrase": "Stay dry."})
    );

    // The converted file reads back as our canonical layout, to the same rows.
    let again = dir.path().join("again.jsonl");
    let out = cascade(&[
        "data",
        "convert",
        out_path.to_str().unwrap(),
        "--out",
        again.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("(cascade-rl schema)"));
    assert_eq!(
        std::fs::read_to_string(&again).unwrap(),
        std::fs::read_to_string(&out_path).unwrap()
    );

    // SFT and pairs.
    for (fixture_name, first_key) in [
        ("nemotron_sft.parquet", "messages"),
        ("skywork_preference.parquet", "chosen"),
    ] {
        let p = dir.path().join(format!("{fixture_name}.jsonl"));
        let out = cascade(&[
            "data",
            "convert",
            &fixture(fixture_name),
            "--out",
            p.to_str().unwrap(),
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let first: Value =
            serde_json::from_str(std::fs::read_to_string(&p).unwrap().lines().next().unwrap())
                .unwrap();
        assert!(first.get(first_key).is_some(), "{first}");
    }

    // Every row rejected: nothing written, exit status non-zero, the reasons on stderr.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"problem\": \"x\", \"answer\": null}\n").unwrap();
    let target = dir.path().join("never.jsonl");
    let out = cascade(&[
        "data",
        "convert",
        bad.to_str().unwrap(),
        "--out",
        target.to_str().unwrap(),
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("bad.jsonl:1: column `answer`"),
        "{}",
        text(&out.stderr)
    );
    assert!(!target.exists());
}

#[test]
fn a_converted_rl_row_with_a_response_is_a_score_line() {
    let dir = tempfile::tempdir().unwrap();
    let conv = dir.path().join("math.jsonl");
    let out = cascade(&[
        "data",
        "convert",
        &fixture("aime_2025.jsonl"),
        "--out",
        conv.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut lines = String::new();
    for l in std::fs::read_to_string(&conv).unwrap().lines() {
        let mut v: Value = serde_json::from_str(l).unwrap();
        let answer = v["answer"].as_str().unwrap().to_string();
        v["response"] = Value::String(format!("<think>\nok\n</think>\n\\boxed{{{answer}}}"));
        lines.push_str(&format!("{v}\n"));
    }
    let scored = dir.path().join("score.jsonl");
    std::fs::write(&scored, lines).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(["score", "--workers", "1", "--input"])
        .arg(&scored)
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let rewards: Vec<f64> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["reward"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(rewards, [1.0, 1.0]);
}

/// A `--schema` that does not parse is a usage error (exit 2) naming the flag, for `inspect` and
/// `convert` as for `eval`, before the file is looked at.
#[test]
fn a_schema_that_does_not_parse_is_a_usage_error_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    let out_file = tmp.path().join("out.jsonl");
    let missing = tmp.path().join("no.jsonl").display().to_string();
    for cmd in [
        vec!["data", "inspect", missing.as_str()],
        vec![
            "data",
            "convert",
            missing.as_str(),
            "--out",
            out_file.to_str().unwrap(),
        ],
    ] {
        for (schema, why) in [
            ("no-such-preset", "presets: cascade-sft"),
            ("prompt=q,prompt=x", "mapped twice"),
        ] {
            let mut args = cmd.clone();
            args.extend(["--schema", schema]);
            let out = cascade(&args);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{args:?}: {}",
                text(&out.stderr)
            );
            let err = text(&out.stderr);
            assert!(
                err.contains("--schema") && err.contains(why),
                "{args:?}: {err}"
            );
        }
    }
}

/// `convert` writes the same file whatever `--threads` parses the JSONL lines.
#[test]
fn convert_output_does_not_depend_on_parse_threads() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.jsonl");
    let mut text_in = String::new();
    for i in 0..2500 {
        if i % 300 == 1 {
            text_in.push_str("{\"problem\": \"truncated\n");
        }
        text_in.push_str(&format!(
            "{{\"problem\": \"What is {i} + {i}?\", \"answer\": \"{}\"}}\n",
            2 * i
        ));
    }
    std::fs::write(&input, text_in).unwrap();
    let mut outputs = Vec::new();
    for threads in ["1", "3"] {
        let out_file = tmp.path().join(format!("out-{threads}.jsonl"));
        let out = cascade(&[
            "data",
            "convert",
            input.to_str().unwrap(),
            "--domain",
            "math",
            "--threads",
            threads,
            "--out",
            out_file.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("2500 rows written") && err.contains("9 rejected"),
            "{err}"
        );
        let rejections: Vec<String> = err
            .lines()
            .filter(|l| l.starts_with("rejected:"))
            .map(str::to_string)
            .collect();
        outputs.push((std::fs::read(&out_file).unwrap(), rejections));
    }
    assert!(outputs[0].0 == outputs[1].0, "the converted files differ");
    assert_eq!(outputs[0].1, outputs[1].1);
}

/// A dataset of more shards than the soft open-file limit the process starts with: every shard
/// stays open from its indexing on, so `cascade` raises the soft limit to the hard one.
#[test]
fn more_shards_than_the_soft_open_file_limit_are_read() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shards");
    std::fs::create_dir(&dir).unwrap();
    for s in 0..150 {
        std::fs::write(
            dir.join(format!("part-{s:05}.jsonl")),
            format!(
                "{{\"problem\": \"What is {s} + {s}?\", \"answer\": \"{}\"}}\n",
                2 * s
            ),
        )
        .unwrap();
    }
    // The hard limit stays; only the soft one starts low (as a login shell's 1024 would).
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -Sn 64 && exec \"$0\" data inspect {} --domain math --show 0",
            dir.display()
        ))
        .arg(env!("CARGO_BIN_EXE_cascade"))
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("accepted: 150, rejected: 0"), "{stdout}");
}
