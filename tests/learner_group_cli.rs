//! `cascade learner` as a group of processes (issue 17) through the real binary: ranks placed
//! by flags or by the launchers' variables (torchrun's RANK / WORLD_SIZE / MASTER_ADDR /
//! MASTER_PORT), a SIGKILLed rank that stops the others with an error naming it, a rank with
//! another config refused at the rendezvous, and bad flags.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn cascade() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
}

const MODEL: &str = r#"{
  "model_type": "qwen3", "vocab_size": 320, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
  "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": true, "initializer_range": 0.02
}"#;

/// A run directory with an SFT stage of `sft_steps` and, with `rl`, a math stage whose
/// rollouts never come (no actor): rank 0 waits in it.
fn setup(root: &Path, name: &str, sft_steps: usize, rl: bool) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let tokenizer = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/chat/tiny-tokenizer/tokenizer.json");
    std::fs::write(dir.join("model.json"), MODEL).unwrap();
    let mut sft = String::new();
    for i in 0..8 {
        sft.push_str(&format!(
            "{{\"messages\": [{{\"role\": \"user\", \"content\": \"count to {i}\"}}, \
             {{\"role\": \"assistant\", \"content\": \"{}\"}}], \"mode\": \"no_think\"}}\n",
            (0..=i).map(|k| k.to_string()).collect::<Vec<_>>().join(" ")
        ));
    }
    std::fs::write(dir.join("sft.jsonl"), sft).unwrap();
    std::fs::write(
        dir.join("math.jsonl"),
        "{\"problem\": \"1+1\", \"answer\": \"2\"}\n",
    )
    .unwrap();
    let mut config = format!(
        r#"
[model]
init = {{ config = "model.json", tokenizer = "{}", seed = 2 }}
dtype = "f32"
[learner]
micro_batch = 1
publish_every = 1
threads = 1
[[stages]]
name = "sft"
kind = "sft"
dataset = "sft.jsonl"
steps = {sft_steps}
lr = 1e-3
batch_prompts = 2
token_budget = 64
"#,
        tokenizer.display()
    );
    if rl {
        config.push_str(
            r#"
[[stages]]
name = "math"
kind = "math"
dataset = "math.jsonl"
steps = 2
lr = 1e-3
batch_prompts = 2
group_size = 2
max_response_tokens = 8
"#,
        );
    }
    std::fs::write(dir.join("run.toml"), config).unwrap();
    dir
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `cascade learner` on `dir` with `extra` flags (`--group-timeout 20` unless given).
fn learner(dir: &Path, extra: &[&str]) -> Command {
    let mut c = cascade();
    c.args(["learner", "--run-dir"])
        .arg(dir)
        .arg("--config")
        .arg(dir.join("run.toml"))
        .args(extra)
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("MASTER_ADDR")
        .env_remove("MASTER_PORT")
        .env_remove("SLURM_PROCID")
        .env_remove("SLURM_NTASKS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if !extra.contains(&"--group-timeout") {
        c.args(["--group-timeout", "20"]);
    }
    c
}

fn wait_for(child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    let mut child = child;
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {limit:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn two_learner_processes_placed_by_flags_or_by_torchrun_variables_train_as_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = setup(root.path(), "pair", 3, false);
    let port = free_port().to_string();
    let addr = format!("127.0.0.1:{port}");
    let rank0 = learner(
        &dir,
        &["--rank", "0", "--world-size", "2", "--rendezvous", &addr],
    )
    .spawn()
    .unwrap();
    let rank1 = learner(&dir, &[])
        .env("RANK", "1")
        .env("WORLD_SIZE", "2")
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", &port)
        .spawn()
        .unwrap();
    let (o0, o1) = (
        wait_for(rank0, Duration::from_secs(120)),
        wait_for(rank1, Duration::from_secs(120)),
    );
    assert!(o0.status.success(), "rank 0: {}", stderr(&o0));
    assert!(o1.status.success(), "rank 1: {}", stderr(&o1));
    assert!(
        stderr(&o0).contains("rank 0 of 2 completed: 3 steps"),
        "{}",
        stderr(&o0)
    );
    assert!(
        stderr(&o1).contains("rank 1 of 2 completed: 3 steps"),
        "{}",
        stderr(&o1)
    );
    // Rank 0 alone logged the steps.
    let metrics = std::fs::read_to_string(dir.join("metrics.jsonl")).unwrap();
    assert_eq!(
        metrics.matches("\"event\":\"sft_step\"").count(),
        3,
        "{metrics}"
    );
    cascade_shared::snapshot::verify(&dir.join("snapshots/v000003")).unwrap();
}

#[test]
fn a_killed_rank_stops_the_other_with_an_error_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let dir = setup(root.path(), "kill", 2, true);
    let addr = format!("127.0.0.1:{}", free_port());
    let rank0 = learner(
        &dir,
        &["--rank", "0", "--world-size", "2", "--rendezvous", &addr],
    )
    .spawn()
    .unwrap();
    let mut rank1 = learner(
        &dir,
        &["--rank", "1", "--world-size", "2", "--rendezvous", &addr],
    )
    .spawn()
    .unwrap();
    // Past the SFT stage, rank 0 waits for rollouts that never come; rank 1 waits with it.
    let start = Instant::now();
    while !dir.join("snapshots/v000002/COMPLETE").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "no stage-final snapshot"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(1500));
    rank1.kill().unwrap();
    let _ = rank1.wait();
    let killed_at = Instant::now();
    let o0 = wait_for(rank0, Duration::from_secs(60));
    assert!(!o0.status.success());
    let e = stderr(&o0);
    assert!(e.contains("rank 1"), "{e}");
    // Within the heartbeat, not the 20 s timeout.
    assert!(
        killed_at.elapsed() < Duration::from_secs(15),
        "{:?}",
        killed_at.elapsed()
    );
    // What was published is complete and verifies.
    cascade_shared::snapshot::verify(&dir.join("snapshots/v000002")).unwrap();
    cascade_shared::snapshot::verify(&dir.join("snapshots/v000001")).unwrap();
}

#[test]
fn ranks_with_different_configs_or_bad_placement_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let dir = setup(root.path(), "mismatch", 2, false);
    let addr = format!("127.0.0.1:{}", free_port());
    let rank0 = learner(
        &dir,
        &["--rank", "0", "--world-size", "2", "--rendezvous", &addr],
    )
    .spawn()
    .unwrap();
    let rank1 = learner(
        &dir,
        &[
            "--rank",
            "1",
            "--world-size",
            "2",
            "--rendezvous",
            &addr,
            "--set",
            "stages.sft.lr=2e-3",
        ],
    )
    .spawn()
    .unwrap();
    let o0 = wait_for(rank0, Duration::from_secs(60));
    let o1 = wait_for(rank1, Duration::from_secs(60));
    assert!(!o0.status.success() && !o1.status.success());
    assert!(
        stderr(&o0).contains("rank 1") && stderr(&o0).contains("another config"),
        "{}",
        stderr(&o0)
    );
    assert!(stderr(&o1).contains("refused"), "{}", stderr(&o1));

    let bad = learner(
        &dir,
        &["--rank", "2", "--world-size", "2", "--rendezvous", &addr],
    )
    .output()
    .unwrap();
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("--rank 2") && stderr(&bad).contains("0..1"),
        "{}",
        stderr(&bad)
    );
    let bad = learner(&dir, &["--rank", "1", "--world-size", "2"])
        .output()
        .unwrap();
    assert!(stderr(&bad).contains("--rendezvous"), "{}", stderr(&bad));
    // A rendezvous that never answers: the rank gives up within the timeout, naming it.
    let silent = format!("127.0.0.1:{}", free_port());
    let start = Instant::now();
    let alone = learner(
        &dir,
        &[
            "--rank",
            "1",
            "--world-size",
            "2",
            "--rendezvous",
            &silent,
            "--group-timeout",
            "2",
        ],
    )
    .output()
    .unwrap();
    assert!(!alone.status.success());
    assert!(stderr(&alone).contains(&silent), "{}", stderr(&alone));
    assert!(start.elapsed() < Duration::from_secs(30));
    // NCCL collectives for a CPU learner: refused, naming the flag, before any training.
    let nccl = learner(&dir, &["--collectives", "nccl"]).output().unwrap();
    assert!(!nccl.status.success());
    assert!(
        stderr(&nccl).contains("--collectives nccl needs a CUDA learner"),
        "{}",
        stderr(&nccl)
    );
    let bad = learner(&dir, &["--collectives", "mpi"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("--collectives"), "{}", stderr(&bad));
}
