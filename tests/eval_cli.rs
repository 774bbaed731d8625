//! `cascade eval --schema`: a prompt file whose layout is not recognised (or is ambiguous) is
//! read with the schema given, as a config's `schema` reads it; a schema that does not parse is
//! a usage error (exit 2) naming the flag. The real binary on a seeded tiny model.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn cascade(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(args)
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        text(&out.stdout),
        text(&out.stderr)
    )
}

fn init_model(dir: &Path) {
    let cfg = concat!(env!("CARGO_MANIFEST_DIR"), "/configs/tiny-model.json");
    let out = cascade(&[
        "init-model",
        "--config",
        cfg,
        "--seed",
        "0",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", show(&out));
}

/// `cascade eval` of `model` on `data` with `extra` flags (greedy, 4 new tokens).
fn eval(model: &Path, data: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "eval",
        "--model",
        model.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-new-tokens",
        "4",
    ];
    args.extend_from_slice(extra);
    cascade(&args)
}

#[test]
fn eval_reads_an_undetected_or_ambiguous_layout_with_schema() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tmp.path().join("model");
    init_model(&model);

    // Columns no preset knows: without --schema the error says what to give.
    let data = tmp.path().join("quiz.jsonl");
    std::fs::write(
        &data,
        "{\"q\": \"What is 1 + 1?\", \"gold\": \"2\"}\n\
         {\"q\": \"What is 2 + 2?\"}\n\
         {\"q\": \"What is 3 + 3?\", \"gold\": \"6\"}\n",
    )
    .unwrap();
    let out = eval(&model, &data, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = text(&out.stderr);
    assert!(
        err.contains("no built-in schema") && err.contains("[gold, q]") && err.contains("--schema"),
        "{err}"
    );

    // With a mapping: math (from the mapped `answer`), the row without `gold` rejected, the
    // other two read as prompts 0 and 2.
    let dump = tmp.path().join("samples.jsonl");
    let out = eval(
        &model,
        &data,
        &[
            "--schema",
            "prompt=q,answer=gold",
            "--dump",
            dump.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("2 prompts × 1 samples (math)"),
        "{stdout}"
    );
    let ids: Vec<u64> = std::fs::read_to_string(&dump)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["prompt_id"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, [0, 2]);
    // The same through --json.
    let out = eval(
        &model,
        &data,
        &["--schema", "prompt=q,answer=gold", "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["all"]["prompts"], 2, "{r}");

    // A file two presets fit: an error naming both, read with --schema naming one.
    let ambiguous = format!(
        "{}/tests/fixtures/datasets/ambiguous_swe.jsonl",
        env!("CARGO_MANIFEST_DIR")
    );
    let ambiguous = Path::new(&ambiguous);
    let out = eval(&model, ambiguous, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", show(&out));
    let err = text(&out.stderr);
    assert!(
        err.contains("ambiguous") && err.contains("swe-bench") && err.contains("swe-smith"),
        "{err}"
    );
    let out = eval(&model, ambiguous, &["--schema", "swe-bench"]);
    assert_eq!(out.status.code(), Some(0), "{}", show(&out));
    assert!(
        text(&out.stdout).starts_with("1 prompts × 1 samples (swe)"),
        "{}",
        show(&out)
    );
}

#[test]
fn a_schema_that_does_not_parse_is_a_usage_error_naming_the_flag() {
    let tmp = tempfile::tempdir().unwrap();
    // Never reached: the flag is refused before the model or the data is looked at.
    let (model, data) = (tmp.path().join("no-model"), tmp.path().join("no.jsonl"));
    for (schema, why) in [
        ("no-such-preset", "presets: cascade-sft"),
        ("prompt=q,prompt=x", "mapped twice"),
        ("prompt=q..x", "empty segment"),
    ] {
        let out = eval(&model, &data, &["--schema", schema]);
        assert_eq!(out.status.code(), Some(2), "{schema}: {}", show(&out));
        let err = text(&out.stderr);
        assert!(
            err.contains("--schema") && err.contains(why),
            "{schema}: {err}"
        );
    }
}
