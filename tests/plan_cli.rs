//! `cascade plan` and the check `cascade run` makes at start: exit codes and messages.

use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn cascade(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
        .args(args)
        .current_dir(ROOT)
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn the_tiny_default_fits_and_exits_0() {
    let out = cascade(&["plan", "--device-memory", "16GB"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("plan: every stage fits"));
}

#[test]
fn the_8b_recipe_fits_on_8_h200s_with_4_learner_ranks_and_not_with_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        format!("{ROOT}/tests/fixtures/plan/qwen3-8b-config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let set = format!("model.path={:?}", dir.path().display().to_string());
    let out = cascade(&[
        "plan",
        "--config",
        "configs/qwen3-8b-base.toml",
        "--set",
        &set,
        "--device-memory",
        "141GB",
    ]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.contains("8190735360 parameters"), "{t}");
    assert!(t.contains("learner rank 3 on cuda:7"), "{t}");
    assert!(!t.contains("DOES NOT FIT"), "{t}");
    // What the learner writes per step: weights every step, optimizer state every 20th.
    assert!(
        t.contains("16.4 GB of weights every 1 step(s)")
            && t.contains("a checkpoint every 20 step(s) adds 98.3 GB")
            && t.contains("21.3 GB written per step"),
        "{t}"
    );
    // One learner process alone does not fit: exit 2, and the advice names the knob.
    let out = cascade(&[
        "plan",
        "--config",
        "configs/qwen3-8b-base.toml",
        "--set",
        &set,
        "--set",
        "devices.learner=cuda:7",
        "--device-memory",
        "141GB",
    ]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("stage sft-16k: DOES NOT FIT"), "{t}");
    assert!(
        t.contains("alone need") && t.contains("devices.learner_ranks"),
        "{t}"
    );
}

#[test]
fn a_bad_memory_size_is_refused_by_name() {
    let out = cascade(&["plan", "--device-memory", "80XB"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("--device-memory"), "{}", text(&out));
}

#[test]
fn cascade_run_refuses_a_run_that_cannot_fit_and_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let run_dir = dir.path().join("run");
    let out = cascade(&[
        "run",
        "--run-dir",
        run_dir.to_str().unwrap(),
        "--gen-batch",
        "100000000",
    ]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("does not fit"), "{t}");
    assert!(t.contains("actor.gen_batch"), "{t}");
    assert!(
        !run_dir.exists(),
        "nothing is created for a run that is refused"
    );
}
