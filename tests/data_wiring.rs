//! Datasets wired into the trainer: public layouts (Parquet in a preset schema) train through
//! the same paths as our own JSONL — the learner's SFT stage, the actor's RL prompts and the
//! held-out evaluation of `cascade run` — and a dataset with no usable row stops the run at
//! start with its first reasons, at every entry point (run pre-flight, SFT, pairs, prompts).

use std::path::{Path, PathBuf};
use std::process::Command;

use cascade_actor::dataset::Dataset;
use cascade_learner::reward_train::{load_pairs, load_pairs_from};
use cascade_learner::sft::{load_sft, load_sft_from};
use cascade_shared::chat::{Chat, ChatTemplate};
use cascade_shared::config::RunConfig;
use cascade_shared::data::{DataSpec, Kind};
use cascade_shared::tokenizer::{tiny_tokenizer, Tokenizer, TokenizerConfig};
use cascade_shared::StageKind;
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/datasets")
        .join(name)
}

fn cascade() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cascade"))
}

fn tiny_chat() -> Chat {
    let tokenizer = Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny").unwrap();
    Chat::new(tokenizer, ChatTemplate::chatml())
}

const MODEL: &str = r#"{
  "model_type": "qwen3", "vocab_size": 1024, "hidden_size": 32, "intermediate_size": 64,
  "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
  "max_position_embeddings": 512, "rope_theta": 10000.0, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": true, "initializer_range": 0.02
}"#;

/// The model config and the tiny tokenizer (from `cascade data tiny`) in `dir`.
fn model_inputs(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("model.json"), MODEL).unwrap();
    let out = cascade()
        .args(["data", "tiny", "--out"])
        .arg(dir.join("data"))
        .args(["--sft", "4", "--prefs", "4", "--rl", "4", "--heldout", "2"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

const HEAD: &str = r#"
[model]
init = { config = "model.json", tokenizer = "data/tokenizer/tokenizer.json", seed = 1 }
[actor]
gen_batch = 4
max_new_tokens = 12
threads = 1
reward_workers = 1
[learner]
micro_batch = 4
publish_every = 1
max_staleness = 1
threads = 1
keep_snapshots = 2
[eval]
samples = 1
max_prompts = 2
"#;

fn events(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

#[test]
fn parquet_files_in_preset_schemas_train_through_sft_rl_and_heldout() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    model_inputs(dir);
    // The RL prompts as a directory of shards (one Parquet file in it), detected as DAPO-Math.
    let shards = dir.join("math-shards");
    std::fs::create_dir_all(&shards).unwrap();
    std::fs::copy(fixture("dapo_math.parquet"), shards.join("part-0.parquet")).unwrap();
    let config = format!(
        r#"{HEAD}
[[stages]]
name = "sft"
kind = "sft"
dataset = {{ path = "{sft}", schema = "nemotron-sft" }}
steps = 2
lr = 3e-3
batch_prompts = 2
token_budget = 256

[[stages]]
name = "math"
kind = "math"
dataset = "math-shards"
heldout = {{ path = "{heldout}", schema = {{ messages = "prompt", answer = "reward_model.ground_truth" }} }}
steps = 1
lr = 1e-3
batch_prompts = 2
group_size = 2
max_response_tokens = 8
"#,
        sft = fixture("nemotron_sft.parquet").display(),
        heldout = fixture("verl_gsm8k.parquet").display(),
    );
    let cfg = dir.join("run.toml");
    std::fs::write(&cfg, &config).unwrap();
    // The config reads as the trainer will read it.
    let loaded = RunConfig::load(&cfg, &[]).unwrap();
    let math = loaded.stage("math").unwrap();
    let (kind, domain) = math.data_kind();
    let prompts = Dataset::open(&loaded.data_spec(&math.dataset, kind, domain).unwrap()).unwrap();
    assert_eq!(prompts.len(), 2);
    assert_eq!(prompts.schema().describe(), "dapo-math");
    let first = prompts.get(0).unwrap();
    assert_eq!(first.reference["answer"], "5");
    assert!(first.messages[0].content.contains("triangle"));

    let run_dir = dir.join("run");
    let out = cascade()
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The pre-flight logs the rejected rows with file, row and column.
    assert!(
        stderr.contains("rejected dataset row") && stderr.contains("nemotron_sft.parquet:"),
        "{stderr}"
    );
    let ev = events(&run_dir);
    let stage_ends: Vec<&str> = ev
        .iter()
        .filter(|e| e["event"] == "stage_end")
        .map(|e| e["stage"].as_str().unwrap())
        .collect();
    assert_eq!(stage_ends, ["sft", "math"]);
    let sft_steps = ev.iter().filter(|e| e["event"] == "sft_step").count();
    assert_eq!(sft_steps, 2, "SFT steps on the Parquet conversations");
    assert_eq!(
        ev.iter()
            .filter(|e| e["event"] == "learner_step" && e["stage"] == "math")
            .count(),
        1
    );
    let heldout: Value =
        serde_json::from_slice(&std::fs::read(run_dir.join("heldout.json")).unwrap()).unwrap();
    assert_eq!(heldout["domains"], serde_json::json!(["math"]));
}

#[test]
fn a_dataset_with_no_usable_row_stops_the_run_at_start_with_the_first_reasons() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    model_inputs(dir);
    std::fs::write(
        dir.join("bad-math.jsonl"),
        "{\"prompt\": \"1+1?\"}\n{\"prompt\": \"2+2?\", \"solution\": \"4\"}\n",
    )
    .unwrap();
    let cfg = dir.join("run.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"{HEAD}
[[stages]]
name = "math"
kind = "math"
dataset = "bad-math.jsonl"
steps = 1
lr = 1e-3
batch_prompts = 2
group_size = 2
"#
        ),
    )
    .unwrap();
    let run_dir = dir.join("run");
    let out = cascade()
        .args(["run", "--config"])
        .arg(&cfg)
        .arg("--run-dir")
        .arg(&run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.trim().lines().last().unwrap();
    assert!(
        last.contains("stages.math.dataset")
            && last.contains("all 2 rows rejected")
            && last.contains("bad-math.jsonl:1:")
            && last.contains("bad-math.jsonl:2:")
            && last.contains("`answer`"),
        "{stderr}"
    );
    assert!(!run_dir.exists(), "nothing created");
}

#[test]
fn every_entry_point_counts_rejections_and_refuses_a_file_with_no_usable_row() {
    let tmp = tempfile::tempdir().unwrap();
    let chat = tiny_chat();
    // SFT: a bad row among good ones is counted; the good ones are used.
    let sft = tmp.path().join("sft.jsonl");
    std::fs::write(
        &sft,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"yo\"}]}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"no answer\"}]}\n\
         {\"messages\": \"not a list\", \"mode\": \"think\"}\n",
    )
    .unwrap();
    let data = load_sft(&sft, &chat, 1024).unwrap();
    assert_eq!(data.examples.len(), 1);
    std::fs::write(
        &sft,
        "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}], \"mode\": \"loud\"}\n\
         {\"messages\": [{\"role\": \"user\", \"content\": \"no answer\"}]}\n",
    )
    .unwrap();
    let e = load_sft(&sft, &chat, 1024).unwrap_err().to_string();
    assert!(e.contains("all 2 rows rejected"), "{e}");
    assert!(
        e.contains("sft.jsonl:2: column `messages`: no assistant turn"),
        "{e}"
    );
    assert!(e.contains("sft.jsonl:1: column `mode`"), "{e}");
    // Pairs.
    let pairs = tmp.path().join("pairs.jsonl");
    std::fs::write(
        &pairs,
        "{\"prompt\": \"p\", \"chosen\": 3, \"rejected\": \"r\"}\n",
    )
    .unwrap();
    let e = load_pairs(&pairs).unwrap_err().to_string();
    assert!(e.contains("pairs.jsonl:1: column `chosen`"), "{e}");
    // RL prompts.
    let rl = tmp.path().join("code.jsonl");
    std::fs::write(&rl, "{\"prompt\": \"write f\"}\n").unwrap();
    let e = Dataset::load(&rl, StageKind::Code).unwrap_err().to_string();
    assert!(e.contains("code.jsonl:1:") && e.contains("`tests`"), "{e}");
    // A file of the wrong kind for the entry point is named as such.
    let e = load_pairs_from(&DataSpec::of_kind(
        fixture("nemotron_sft.parquet"),
        Kind::Pairs,
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("nemotron_sft.parquet"), "{e}");
}

#[test]
fn parquet_sft_and_pairs_read_as_their_jsonl_twins() {
    // The same conversations as JSONL and as Parquet tokenize to the same examples.
    let chat = tiny_chat();
    let spec = |name: &str| DataSpec {
        schema: Some(cascade_shared::data::Schema::parse("nemotron-sft").unwrap()),
        ..DataSpec::of_kind(fixture(name), Kind::Sft)
    };
    let parquet = load_sft_from(&spec("nemotron_sft.parquet"), &chat, 4096).unwrap();
    let jsonl = load_sft_from(&spec("nemotron_sft.jsonl"), &chat, 4096).unwrap();
    assert_eq!(parquet.examples.len(), 3);
    for ex in &parquet.examples {
        assert!(
            jsonl.examples.contains(ex),
            "a Parquet conversation tokenizes as its JSONL twin"
        );
    }
    // Skywork pairs (Parquet, conversational chosen / rejected) through the reward model's
    // reader.
    let pairs = load_pairs(&fixture("skywork_preference.parquet")).unwrap();
    assert_eq!(pairs.len(), 2);
    assert!(pairs
        .iter()
        .all(|p| !p.prompt.is_empty() && p.chosen != p.rejected));
}
