//! End to end: `cascade run` through the real binary on CPU — a short cascade with every stage,
//! chaos (SIGKILLed actors and learner, then `--resume`), and bad configs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn cascade() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
}

const MODEL: &str = r#"{
  "model_type": "qwen3", "vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
  "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": true, "initializer_range": 0.02
}"#;

/// A short cascade: every stage, a few steps each.
fn config(rl_steps: usize, max_staleness: u64) -> String {
    let mut s = format!(
        r#"
[model]
init = {{ config = "model.json", tokenizer = "data/tokenizer/tokenizer.json", seed = 1 }}
[actor]
gen_batch = 4
max_new_tokens = 24
threads = 1
reward_workers = 1
[learner]
micro_batch = 8
publish_every = 1
max_staleness = {max_staleness}
threads = 1
keep_snapshots = 2
[replay]
segment_bytes = 65536
max_segments = 4
max_inflight = 8
[reward_model]
dataset = "data/prefs.jsonl"
heldout = "data/prefs-heldout.jsonl"
steps = 3
lr = 1e-3
batch_pairs = 8
max_len = 256
[eval]
samples = 1
max_prompts = 3
[[stages]]
name = "sft"
kind = "sft"
dataset = "data/sft.jsonl"
steps = 3
lr = 3e-3
batch_prompts = 2
token_budget = 256
"#
    );
    for kind in ["rlhf", "if", "math", "code", "swe"] {
        s.push_str(&format!(
            r#"
[[stages]]
name = "{kind}"
kind = "{kind}"
dataset = "data/{kind}.jsonl"
heldout = "data/{kind}-heldout.jsonl"
steps = {rl_steps}
lr = 1e-3
batch_prompts = 2
group_size = 2
max_response_tokens = 16
"#
        ));
    }
    s
}

/// Writes the model config, the data and the run config into `dir`; returns the config path.
fn inputs(dir: &Path, rl_steps: usize, max_staleness: u64) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("model.json"), MODEL).unwrap();
    let out = cascade()
        .args(["data", "tiny", "--out"])
        .arg(dir.join("data"))
        .args([
            "--sft",
            "100",
            "--prefs",
            "40",
            "--rl",
            "24",
            "--heldout",
            "4",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, config(rl_steps, max_staleness)).unwrap();
    path
}

fn events(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The `after_stage` of every row of a held-out table (`heldout.json` or `seeds.json`).
fn after_stages(table: &Value) -> Vec<&str> {
    table["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["after_stage"].as_str().unwrap())
        .collect()
}

fn show(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Every published snapshot passes its checksums and loads.
fn check_snapshots(run_dir: &Path) -> usize {
    let dir = run_dir.join("snapshots");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        if !name.starts_with('v') || name.contains('.') {
            continue;
        }
        cascade_shared::snapshot::load_snapshot(&p)
            .unwrap_or_else(|e| panic!("snapshot {name} is corrupt: {e}"));
        cascade_shared::snapshot::load_model(&p, &candle_core::Device::Cpu)
            .unwrap_or_else(|e| panic!("snapshot {name} does not load: {e}"));
        n += 1;
    }
    let leftovers: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with('v') && n.ends_with(".tmp"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporary snapshots left: {leftovers:?}"
    );
    n
}

/// The rollouts (actor, seq) of each optimizer step; a step redone after a learner crash
/// (its first attempt was never published) counts once, with its last attempt.
fn rollouts_by_step(run_dir: &Path) -> BTreeMap<u64, Vec<(String, u64)>> {
    let mut steps = BTreeMap::new();
    for e in events(run_dir) {
        if e["event"] != "learner_step" || e["skipped"] == true {
            continue;
        }
        let ids: Vec<(String, u64)> = e["rollouts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| (r[0].as_str().unwrap().to_string(), r[1].as_u64().unwrap()))
            .collect();
        steps.insert(e["step"].as_u64().unwrap(), ids);
    }
    steps
}

/// The learner's marker for the actors (`cascade_shared::intake`) names the version the run's
/// last RL step trained (its `learner_step` event has the version after).
fn assert_closed_at_last_step(run_dir: &Path) {
    let last_version = events(run_dir)
        .iter()
        .filter(|e| e["event"] == "learner_step")
        .filter_map(|e| e["policy_version"].as_u64())
        .max()
        .unwrap();
    let closed = std::fs::read_to_string(run_dir.join("replay/closed")).unwrap();
    assert_eq!(closed.trim(), (last_version - 1).to_string());
}

fn assert_no_rollout_used_twice(run_dir: &Path) {
    let mut seen = BTreeSet::new();
    for (step, ids) in rollouts_by_step(run_dir) {
        for id in ids {
            assert!(
                seen.insert(id.clone()),
                "rollout {id:?} trained twice (step {step})"
            );
        }
    }
}

#[test]
fn a_short_cascade_runs_every_stage_and_writes_snapshots_metrics_and_report() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = inputs(tmp.path(), 2, 1);
    let run_dir = tmp.path().join("run");
    // The rlhf stage mixes in SFT rows (its rewards are continuous: every step has signal);
    // the dataset path is relative to the config's directory, not the run directory.
    let out = cascade()
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(&run_dir)
        .args([
            "--set",
            r#"stages.rlhf.sft_mix={dataset="data/sft.jsonl", coef=0.5, rows=1}"#,
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let ev = events(&run_dir);
    for e in ev.iter().filter(|e| e["event"] == "learner_step") {
        let mixed = e["sft_mix_loss"].as_f64();
        if e["stage"] == "rlhf" && e["no_signal"] == false {
            assert!(mixed.is_some_and(|l| l > 0.0), "{e}");
        } else if e["stage"] != "rlhf" {
            assert!(mixed.is_none(), "{e}");
        }
    }
    assert!(ev.iter().any(|e| e["event"] == "learner_step"
        && e["stage"] == "rlhf"
        && e["sft_mix_loss"].as_f64().is_some()));
    let stage_ends: Vec<&str> = ev
        .iter()
        .filter(|e| e["event"] == "stage_end")
        .map(|e| e["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stage_ends, ["sft", "rlhf", "if", "math", "code", "swe"]);
    assert!(ev.iter().any(|e| e["event"] == "rm_done"));
    assert!(ev
        .iter()
        .any(|e| e["event"] == "run_end" && e["status"] == "completed"));
    // Every RL step trained on groups of its own stage, produced by the actor.
    let rl_steps = ev.iter().filter(|e| e["event"] == "learner_step").count();
    assert_eq!(rl_steps, 10);
    // With a staleness bound the learner closes a version only after a stage's last batch.
    assert_closed_at_last_step(&run_dir);
    // Every learner step (SFT and RL) logs its peak host memory next to its tokens: the RSS,
    // and the heap's peak (the counting allocator), which the weights alone exceed and the RSS
    // holds.
    for e in ev
        .iter()
        .filter(|e| e["event"] == "learner_step" || e["event"] == "sft_step")
    {
        let (rss, heap) = (
            e["peak_rss_mb"].as_f64().unwrap(),
            e["peak_heap_mb"].as_f64().unwrap(),
        );
        assert!(heap > 0.0 && heap <= rss, "{e}");
        assert!(e["train_tokens"].as_u64().unwrap() > 0, "{e}");
    }
    assert!(
        check_snapshots(&run_dir) >= 6,
        "stage-final snapshots are kept"
    );
    assert_no_rollout_used_twice(&run_dir);
    let heldout: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("heldout.json")).unwrap()).unwrap();
    assert_eq!(
        heldout["domains"],
        serde_json::json!(["rlhf", "if", "math", "code", "swe"])
    );
    assert_eq!(
        after_stages(&heldout),
        ["sft", "rlhf", "if", "math", "code", "swe"]
    );
    // Each RL stage's paired change on its own domain, over the prompts of both rows.
    let gains: Vec<(&str, &str)> = heldout["gains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["stage"].as_str().unwrap(), g["domain"].as_str().unwrap()))
        .collect();
    assert_eq!(
        gains,
        [
            ("rlhf", "rlhf"),
            ("if", "if"),
            ("math", "math"),
            ("code", "code"),
            ("swe", "swe")
        ]
    );
    for g in heldout["gains"].as_array().unwrap() {
        assert!(g["prompts"].as_u64().unwrap() > 0, "{g}");
        assert!(g["se"].as_f64().unwrap() >= 0.0, "{g}");
        let (b, a, d) = (
            g["before"].as_f64().unwrap(),
            g["after"].as_f64().unwrap(),
            g["diff"].as_f64().unwrap(),
        );
        // Every prompt is scored in both rows, so the paired mean is the change of the means.
        assert!((a - b - d).abs() < 1e-9, "{g}");
    }
    assert!(run_dir.join("report").join("index.html").exists());
    assert!(run_dir.join("logs").join("learner.log").exists());
    assert!(run_dir.join("logs").join("actor-0.log").exists());
    // The last snapshot loads in `cascade eval`.
    let latest = std::fs::read_to_string(run_dir.join("snapshots/LATEST")).unwrap();
    let snap = run_dir
        .join("snapshots")
        .join(format!("v{:06}", latest.trim().parse::<u64>().unwrap()));
    let out = cascade()
        .args(["eval", "--model"])
        .arg(&snap)
        .arg("--data")
        .arg(tmp.path().join("data/math-heldout.jsonl"))
        .args([
            "--samples",
            "2",
            "--max-new-tokens",
            "8",
            "--json",
            "--dump",
        ])
        .arg(tmp.path().join("samples.jsonl"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["all"]["prompts"], 4);
    assert_eq!(r["samples"], 2);
    let dumped: Vec<Value> = std::fs::read_to_string(tmp.path().join("samples.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(dumped.len(), 8, "4 prompts × 2 samples");
    for d in &dumped {
        assert!(d["response"].is_string() && d["reward"].is_number(), "{d}");
        assert!(
            ["think", "no_think"].contains(&d["mode"].as_str().unwrap()),
            "{d}"
        );
    }
}

fn pid_of(run_dir: &Path, name: &str) -> Option<i32> {
    events(run_dir)
        .iter()
        .rev()
        .find(|e| e["event"] == "process" && e["what"] == "start" && e["name"] == name)
        .and_then(|e| e["pid"].as_i64())
        .map(|p| p as i32)
}

fn kill(pid: i32) {
    signal(pid, libc::SIGKILL);
}

fn rl_steps_done(run_dir: &Path) -> usize {
    events(run_dir)
        .iter()
        .filter(|e| e["event"] == "learner_step")
        .count()
}

/// Starts `cascade run --no-eval --actors N` with `program` (a `cascade` command) and waits
/// until its learner has taken two RL steps; returns the child and the test's deadline.
fn start_until_rl(
    program: Command,
    cfg: &Path,
    run_dir: &Path,
    actors: usize,
) -> (std::process::Child, Instant) {
    let actors = actors.to_string();
    start_until_rl_steps(
        program,
        cfg,
        run_dir,
        &["--no-eval", "--actors", &actors],
        2,
    )
}

/// Starts `cascade run FLAGS` on `cfg` with `program` and waits until its learner has taken
/// `steps` RL steps; returns the child and the test's deadline.
fn start_until_rl_steps(
    mut program: Command,
    cfg: &Path,
    run_dir: &Path,
    flags: &[&str],
    steps: usize,
) -> (std::process::Child, Instant) {
    let mut child = program
        .arg("run")
        .args(flags)
        .arg("--config")
        .arg(cfg)
        .arg("--run-dir")
        .arg(run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while rl_steps_done(run_dir) < steps {
        assert!(Instant::now() < deadline, "RL never started");
        assert!(child.try_wait().unwrap().is_none(), "run ended early");
        std::thread::sleep(Duration::from_millis(200));
    }
    (child, deadline)
}

/// The `eval` events of the row after `stage`.
fn eval_events<'a>(ev: &'a [Value], stage: &str) -> Vec<&'a Value> {
    ev.iter()
        .filter(|e| e["event"] == "eval" && e["after_stage"] == stage)
        .collect()
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a pid this test's child started.
    unsafe {
        libc::kill(pid, sig);
    }
}

#[test]
fn heldout_rows_are_evaluated_while_later_stages_train_and_a_resumed_run_reuses_them() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = inputs(tmp.path(), 2, 1);
    let run_dir = tmp.path().join("run");
    let (child, _) = start_until_rl_steps(cascade(), &cfg, &run_dir, &[], 1);
    // The learner is frozen in the first RL stage: the row after the SFT stages (whose
    // stage-final snapshot is out) is evaluated and saved all the same.
    let learner = pid_of(&run_dir, "learner").unwrap();
    signal(learner, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(200));
    let frozen_at = rl_steps_done(&run_dir);
    let saved = |run_dir: &Path| -> Vec<PathBuf> {
        let mut rows: Vec<PathBuf> = std::fs::read_dir(run_dir.join("heldout"))
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default();
        rows.sort();
        rows
    };
    let wait = Instant::now() + Duration::from_secs(120);
    while saved(&run_dir).is_empty() {
        if Instant::now() > wait {
            signal(learner, libc::SIGCONT);
            panic!("the row after the SFT stages was not evaluated during training");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ev = events(&run_dir);
    assert_eq!(eval_events(&ev, "sft").len(), 5, "one event per domain");
    // The learner took no step meanwhile, and has stages left.
    assert_eq!(rl_steps_done(&run_dir), frozen_at);
    assert!(!ev
        .iter()
        .any(|e| e["event"] == "stage_end" && e["stage"] == "swe"));
    signal(learner, libc::SIGCONT);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("held-out after sft ("), "{stderr}");

    // One saved row per row of the table, each evaluated once.
    let table: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("heldout.json")).unwrap()).unwrap();
    let stages = ["sft", "rlhf", "if", "math", "code", "swe"];
    assert_eq!(after_stages(&table), stages);
    let rows = saved(&run_dir);
    assert_eq!(rows.len(), 6, "{rows:?}");
    let ev = events(&run_dir);
    for (i, stage) in stages.iter().enumerate() {
        let row: Value = serde_json::from_slice(&std::fs::read(&rows[i]).unwrap()).unwrap();
        assert_eq!(row["row"], table["rows"][i], "{}", rows[i].display());
        assert_eq!(eval_events(&ev, stage).len(), 5, "{stage}");
    }

    // A resumed run (here one that has nothing left to train) reuses the saved rows...
    std::fs::remove_file(run_dir.join("heldout.json")).unwrap();
    let resume = |extra: &[&str]| {
        let out = cascade()
            .args(["run", "--resume"])
            .arg(&run_dir)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
        serde_json::from_slice::<Value>(&std::fs::read(run_dir.join("heldout.json")).unwrap())
            .unwrap()
    };
    assert_eq!(resume(&[]), table);
    let evals = |run_dir: &Path| {
        events(run_dir)
            .iter()
            .filter(|e| e["event"] == "eval")
            .count()
    };
    assert_eq!(evals(&run_dir), 30, "no row was evaluated again");
    // ...but not those evaluated under other settings.
    let again = resume(&["--set", "eval.samples=2"]);
    assert_eq!(evals(&run_dir), 60, "every row evaluated again");
    assert_eq!(after_stages(&again), stages);
    assert_ne!(again, table);
}

#[test]
fn chaos_killed_actors_restart_a_killed_learner_resumes_and_nothing_is_lost_or_reused() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = inputs(tmp.path(), 6, 1);
    let run_dir = tmp.path().join("run");
    let (child, deadline) = start_until_rl(cascade(), &cfg, &run_dir, 2);
    // RL has started: kill a random actor 5 times, a second or so apart.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..5 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let name = format!("actor-{}", seed % 2);
        let before = rl_steps_done(&run_dir);
        let pid = pid_of(&run_dir, &name).expect("actor pid in metrics");
        kill(pid);
        // Wait until the supervisor restarted it and training moved on.
        while pid_of(&run_dir, &name) == Some(pid) || rl_steps_done(&run_dir) <= before {
            assert!(
                Instant::now() < deadline,
                "no progress after killing {name}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    // Kill the learner: the run stops and says how to resume.
    let before = rl_steps_done(&run_dir);
    while rl_steps_done(&run_dir) < before + 2 {
        std::thread::sleep(Duration::from_millis(100));
    }
    kill(pid_of(&run_dir, "learner").unwrap());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("cascade run --resume"), "{stderr}");
    // Resume to the end.
    let out = cascade()
        .args(["run", "--no-eval", "--resume"])
        .arg(&run_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let ev = events(&run_dir);
    let restarts = ev
        .iter()
        .filter(|e| e["event"] == "process" && e["what"] == "restart")
        .count();
    assert!(restarts >= 5, "{restarts} restarts in metrics");
    assert!(ev
        .iter()
        .any(|e| e["event"] == "run_end" && e["status"] == "completed"));
    let steps = rollouts_by_step(&run_dir);
    assert_eq!(steps.len(), 5 * 6, "every RL step of every stage ran once");
    assert_no_rollout_used_twice(&run_dir);
    check_snapshots(&run_dir);
}

#[test]
fn a_child_restarts_from_the_supervisors_own_image_after_its_file_is_removed() {
    // A rebuild or an upgrade during a run replaces the binary's file: the supervisor must still
    // start its children, and start them from the binary it runs itself.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = inputs(tmp.path(), 4, 1);
    let run_dir = tmp.path().join("run");
    let bin = tmp.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let exe = bin.join("cascade");
    std::fs::copy(env!("CARGO_BIN_EXE_cascade"), &exe).unwrap();
    let (child, _) = start_until_rl(Command::new(&exe), &cfg, &run_dir, 1);
    std::fs::remove_file(&exe).unwrap();
    let before = rl_steps_done(&run_dir);
    let pid = pid_of(&run_dir, "actor-0").expect("actor pid in metrics");
    kill(pid);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let ev = events(&run_dir);
    assert!(
        ev.iter()
            .any(|e| e["event"] == "process" && e["what"] == "restart" && e["name"] == "actor-0"),
        "the killed actor was not restarted: {stderr}"
    );
    assert!(
        rl_steps_done(&run_dir) > before,
        "no RL step after the restart"
    );
    assert!(ev
        .iter()
        .any(|e| e["event"] == "run_end" && e["status"] == "completed"));
}

fn bad(config: &str, extra: &[&str], expect: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = inputs(tmp.path(), 1, 1);
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{text}\n{config}")).unwrap();
    let run_dir = tmp.path().join("run");
    let out = cascade()
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(&run_dir)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(expect), "expected {expect:?} in {stderr}");
    assert!(!run_dir.exists(), "nothing created");
}

#[test]
fn bad_configs_fail_with_one_line_and_exit_code_2_creating_nothing() {
    bad("[bogus]\nx = 1", &[], "bogus");
    bad("", &["--set", "stages.0.steps=\"many\""], "stages[0].steps");
    bad("", &["--set", "stages=[]"], "stages");
    bad(
        "",
        &["--set", "stages.math.dataset=\"nope.jsonl\""],
        "nope.jsonl",
    );
    bad("", &["--learner-device", "cuda:3"], "cuda:3");
    bad("", &["--actor-devices", "tpu:0"], "tpu:0");
}

/// An RL-only cascade, strictly on-policy, one actor.
fn on_policy_config(dir: &Path) -> PathBuf {
    let cfg = inputs(dir, 1, 0);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    // Two RL stages on swe, whose patch-similarity reward varies between samples even for a
    // random model, so every step really changes the weights; the second replays the first's
    // best responses (`sft_mix.replay`), whose log the kill cuts into and the resume repairs.
    let start = text.find("[[stages]]").unwrap();
    text.truncate(start);
    text.push_str(
        r#"
[[stages]]
name = "swe"
kind = "swe"
dataset = "data/swe.jsonl"
steps = 5
lr = 3e-3
batch_prompts = 2
group_size = 4
max_response_tokens = 12

[[stages]]
name = "swe2"
kind = "swe"
dataset = "data/swe.jsonl"
steps = 3
lr = 3e-3
batch_prompts = 2
group_size = 4
max_response_tokens = 12
sft_mix = { dataset = "data/sft.jsonl", coef = 0.5, rows = 1, token_budget = 256, replay = ["swe"] }
"#,
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

fn final_weights(run_dir: &Path) -> Vec<u8> {
    let latest = std::fs::read_to_string(run_dir.join("snapshots/LATEST")).unwrap();
    let v: u64 = latest.trim().parse().unwrap();
    std::fs::read(
        run_dir
            .join("snapshots")
            .join(format!("v{v:06}"))
            .join("model.safetensors"),
    )
    .unwrap()
}

#[test]
fn on_policy_run_killed_and_resumed_ends_bit_identical_to_an_uninterrupted_one() {
    on_policy_kill_and_resume(1, "learner");
}

/// The same with the learner as 2 processes (issue 17), killing rank 1: rank 0 stops with an
/// error naming it, `cascade run` stops and says how to resume, and the resumed 2-rank run ends
/// bit-identical to an uninterrupted 2-rank run.
#[test]
fn on_policy_two_rank_learner_killed_and_resumed_ends_bit_identical_to_an_uninterrupted_one() {
    on_policy_kill_and_resume(2, "learner-1");
}

/// The same with checkpoints every 3 steps only (`--checkpoint-every 3`, issue 17): the
/// snapshots between are weights only, the resume goes back to the last checkpoint and
/// recomputes the steps after it from the replay log, and the run still ends bit-identical.
#[test]
fn on_policy_run_with_sparse_checkpoints_killed_and_resumed_ends_bit_identical() {
    on_policy_kill_and_resume_with(1, "learner", &["--checkpoint-every", "3"]);
}

fn on_policy_kill_and_resume(ranks: usize, victim: &str) {
    on_policy_kill_and_resume_with(ranks, victim, &[]);
}

fn on_policy_kill_and_resume_with(ranks: usize, victim: &str, extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = on_policy_config(tmp.path());
    let ranks_arg = ranks.to_string();
    let run = |dir: &Path| {
        cascade()
            .args([
                "run",
                "--no-eval",
                "--learner-ranks",
                &ranks_arg,
                "--config",
            ])
            .arg(&cfg)
            .args(extra)
            .arg("--run-dir")
            .arg(dir)
            .output()
            .unwrap()
    };
    let a = tmp.path().join("a");
    let out = run(&a);
    assert!(out.status.success(), "{}", show(&out));
    // The same run, with the learner SIGKILLed after its third step, then resumed.
    let b = tmp.path().join("b");
    let child = cascade()
        .args([
            "run",
            "--no-eval",
            "--learner-ranks",
            &ranks_arg,
            "--config",
        ])
        .arg(&cfg)
        .args(extra)
        .arg("--run-dir")
        .arg(&b)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(300);
    // With sparse checkpoints: killed once a weights-only snapshot is out (RL step 4 or 5), so
    // that the resume has to go back past it.
    let weights_only = |dir: &Path| {
        events(dir)
            .into_iter()
            .filter(|e| e["event"] == "snapshot" && e["checkpoint"] == false)
            .filter_map(|e| e["policy_version"].as_u64())
            .max()
    };
    while rl_steps_done(&b) < 3 || (!extra.is_empty() && weights_only(&b).is_none_or(|v| v < 4)) {
        assert!(Instant::now() < deadline, "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    kill(pid_of(&b, victim).unwrap());
    let newest_before_kill = weights_only(&b);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("Resume with: cascade run --resume"), "{err}");
    if ranks > 1 {
        assert!(err.contains(victim), "{err}");
    }
    let out = cascade()
        .args(["run", "--no-eval", "--resume"])
        .arg(&b)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    // Seq numbers differ (the actor kept writing while the learner was down), the training
    // does not: the same loss at every step, then the same weights.
    let losses = |dir: &Path| -> BTreeMap<u64, f64> {
        events(dir)
            .iter()
            .filter(|e| e["event"] == "learner_step")
            .map(|e| (e["step"].as_u64().unwrap(), e["loss"].as_f64().unwrap()))
            .collect()
    };
    assert_eq!(losses(&a).len(), 8);
    // Each step's batch was closed for the actors once decided.
    assert_closed_at_last_step(&a);
    assert_eq!(losses(&a), losses(&b), "per-step losses");
    // The first stage's best responses, replayed by the second: the same lines.
    let best = |dir: &Path| std::fs::read(dir.join("best/stage-0.jsonl")).unwrap();
    assert!(!best(&a).is_empty());
    assert!(best(&a) == best(&b), "best-response logs differ");
    assert!(
        final_weights(&a) == final_weights(&b),
        "final weights differ between the uninterrupted and the resumed run"
    );
    if !extra.is_empty() {
        // The resume started from a checkpoint.
        let resumed = events(&b)
            .into_iter()
            .find(|e| e["event"] == "resume")
            .expect("a resume event");
        let v = resumed["policy_version"].as_u64().unwrap();
        let published = events(&b)
            .into_iter()
            .find(|e| e["event"] == "snapshot" && e["policy_version"] == v)
            .expect("the snapshot resumed from was published");
        assert_eq!(published["checkpoint"], true, "resumed from v{v}");
        let newest = newest_before_kill.expect("a weights-only snapshot before the kill");
        assert!(
            v < newest,
            "resumed from v{v}, before the weights-only v{newest} published before the kill"
        );
    }
}

#[test]
fn seeds_runs_each_seed_summarises_across_them_and_continues_when_run_again() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = inputs(tmp.path(), 1, 1);
    let dir = tmp.path().join("seeds");
    let run = || {
        cascade()
            .args(["run", "--seeds", "2", "--seed-base", "7", "--config"])
            .arg(&cfg)
            .arg("--run-dir")
            .arg(&dir)
            .output()
            .unwrap()
    };
    let out = run();
    assert!(out.status.success(), "{}", show(&out));
    // Each seed is its own run, with its seed in the model's initialisation, the actor and the
    // learner.
    let mut weights = Vec::new();
    for seed in [7, 8] {
        let d = dir.join(format!("seed-{seed}"));
        let saved: toml::Value =
            toml::from_str(&std::fs::read_to_string(d.join("config.toml")).unwrap()).unwrap();
        assert_eq!(saved["model"]["init"]["seed"].as_integer(), Some(seed));
        assert_eq!(saved["actor"]["seed"].as_integer(), Some(seed));
        assert_eq!(saved["learner"]["seed"].as_integer(), Some(seed));
        assert!(d.join("heldout.json").exists());
        weights.push(final_weights(&d));
    }
    assert_ne!(
        weights[0], weights[1],
        "different seeds train different models"
    );
    let s: Value = serde_json::from_slice(&std::fs::read(dir.join("seeds.json")).unwrap()).unwrap();
    let seeds: Vec<u64> = s["seeds"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seed"].as_u64().unwrap())
        .collect();
    assert_eq!(seeds, [7, 8]);
    assert_eq!(
        after_stages(&s),
        ["sft", "rlhf", "if", "math", "code", "swe"]
    );
    // Every cell is the mean of the two seeds' tables.
    let t: Vec<Value> = [7, 8]
        .iter()
        .map(|seed| {
            serde_json::from_slice(
                &std::fs::read(dir.join(format!("seed-{seed}/heldout.json"))).unwrap(),
            )
            .unwrap()
        })
        .collect();
    let cell = &s["rows"][3]["scores"]["code"];
    let (a, b) = (
        t[0]["rows"][3]["scores"]["code"].as_f64().unwrap(),
        t[1]["rows"][3]["scores"]["code"].as_f64().unwrap(),
    );
    assert!(
        (cell["mean"].as_f64().unwrap() - (a + b) / 2.0).abs() < 1e-12,
        "{cell}"
    );
    assert_eq!(cell["n"], 2);
    assert_eq!(s["own_gains"].as_array().unwrap().len(), 5);
    assert_eq!(s["own_gains"][2]["per_seed"].as_array().unwrap().len(), 2);
    // 5 RL stages × 4 other domains.
    assert_eq!(s["other_changes"].as_array().unwrap().len(), 20);
    assert_eq!(
        s["checks"].as_array().unwrap().len(),
        3,
        "no wall-clock goal for a --config run"
    );
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("held-out scores over 2 seed(s) (7, 8)"),
        "{text}"
    );
    let page = std::fs::read_to_string(dir.join("report/index.html")).unwrap();
    assert!(
        page.contains("seed-8/report/index.html"),
        "links every seed's report"
    );

    // The same command again reads the completed seeds back instead of running them.
    let out = run();
    assert!(out.status.success(), "{}", show(&out));
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(text.matches("already completed").count(), 2, "{text}");
    assert_eq!(final_weights(&dir.join("seed-7")), weights[0]);
}
