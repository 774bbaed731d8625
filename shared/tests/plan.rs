//! The memory plan against figures we did not compute with it: Qwen3-8B's published parameter
//! count, the per-parameter state of AdamW with an f32 master (SCALE.md), the 8B KV cache per
//! token, and the verdicts for the 8B recipe on one H200 and for the tiny default.

use std::collections::BTreeMap;
use std::path::Path;

use cascade_shared::config::{Device, RunConfig};
use cascade_shared::model::ModelConfig;
use cascade_shared::plan::{plan, Plan, PlanOptions};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

fn qwen3_8b() -> ModelConfig {
    ModelConfig::from_file(&Path::new(ROOT).join("tests/fixtures/plan/qwen3-8b-config.json"))
        .unwrap()
}

fn tiny() -> ModelConfig {
    ModelConfig::from_file(&Path::new(ROOT).join("configs/tiny-model.json")).unwrap()
}

fn config(name: &str) -> RunConfig {
    let path = Path::new(ROOT).join("configs").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    RunConfig::parse(&text, name, path.parent().unwrap(), &[]).unwrap()
}

fn options(capacity: &[(Device, u64)]) -> PlanOptions {
    PlanOptions {
        prompt_tokens: 2048,
        capacity: capacity.iter().copied().collect(),
        headroom: 0.05,
    }
}

fn item(plan: &Plan, stage: &str, process: &str, what: &str) -> u64 {
    let s = plan.stages.iter().find(|s| s.stage == stage).unwrap();
    let p = s.processes.iter().find(|p| p.process == process).unwrap();
    p.items
        .iter()
        .filter(|i| i.what.starts_with(what))
        .map(|i| i.bytes)
        .sum()
}

const H200: u64 = 141_000_000_000;

#[test]
fn qwen3_8b_has_its_published_parameter_count() {
    // Hugging Face's model card: 8.2B parameters; the safetensors index of Qwen/Qwen3-8B
    // holds 8 190 735 360 elements.
    assert_eq!(qwen3_8b().num_parameters(), 8_190_735_360);
}

#[test]
fn the_8b_recipe_on_one_h200_learner_does_not_fit_and_says_why() {
    // The recipe's config as it was before learner groups: one learner process on cuda:7.
    let mut cfg = config("qwen3-8b-base.toml");
    cfg.devices.set_learner(&["cuda:7".to_string()]).unwrap();
    cfg.devices.learner_ranks = None;
    cfg.devices.actors =
        vec![cascade_shared::config::DeviceSpec::try_from("cuda:0-6".to_string()).unwrap()];
    let gpus: Vec<(Device, u64)> = (0..8).map(|i| (Device::Cuda(i), H200)).collect();
    let p = plan(&cfg, &qwen3_8b(), &BTreeMap::new(), &options(&gpus));
    let params = 8_190_735_360u64;
    // bf16 weights 2 + f32 master 4 + m, v 8 + f64 accumulator 8 (the default grad_accum) +
    // bf16 micro-batch grads 2.
    let state: u64 = [
        "weights",
        "f32 master",
        "Adam",
        "gradient acc",
        "one micro-batch",
    ]
    .iter()
    .map(|w| item(&p, "sft-16k", "learner", w))
    .sum();
    assert_eq!(state, 24 * params);
    assert!(!p.fits());
    let sft = &p.stages[0];
    let learner = sft
        .devices
        .iter()
        .find(|d| d.device == Device::Cuda(7))
        .unwrap();
    assert_eq!(learner.fits, Some(false));
    assert!(
        learner.advice.iter().any(|a| a.contains("alone need")
            && a.contains("devices.learner_ranks")
            && a.contains("learner.grad_accum = \"f32\"")),
        "{:?}",
        learner.advice
    );
    // The KL reference model is counted only where kl_coef > 0 (rlhf).
    assert_eq!(item(&p, "rlhf", "learner", "KL reference"), 2 * params);
    assert_eq!(item(&p, "if", "learner", "KL reference"), 0);
    // SFT stages have no actors.
    assert_eq!(sft.processes.len(), 1);
    assert!(p.render().contains("DOES NOT FIT"));
}

#[test]
fn the_8b_actor_kv_cache_is_147_kb_per_token() {
    let mut cfg = config("qwen3-8b-base.toml");
    cfg.actor.gen_batch = 64;
    let gpus: Vec<(Device, u64)> = (0..8).map(|i| (Device::Cuda(i), H200)).collect();
    let p = plan(&cfg, &qwen3_8b(), &BTreeMap::new(), &options(&gpus));
    // 36 layers × 8 kv heads × 128 × (k, v) × 2 bytes = 147 456 bytes per token (SCALE.md);
    // the paged cache's automatic budget: 64 rows × min(2048 + 40960, 40960) tokens, the same
    // in every RL stage (it is allocated once, for the longest response of the run).
    let kv = item(&p, "code", "actor 0", "KV cache");
    assert_eq!(kv, 64 * 40_960 * 147_456);
    assert_eq!(item(&p, "rlhf", "actor 0", "KV cache"), kv);
    let code = p.stages.iter().find(|s| s.stage == "code").unwrap();
    let actor = code
        .devices
        .iter()
        .find(|d| d.device == Device::Cuda(0))
        .unwrap();
    assert_eq!(
        actor.fits,
        Some(false),
        "64 rows of 40K tokens do not fit an H200"
    );
    assert!(
        actor
            .advice
            .iter()
            .any(|a| a.contains("actor.gen_batch = 64")),
        "{:?}",
        actor.advice
    );
    // Each stage's advice names a cache size that fits it; with the smallest (one cache serves
    // every stage; rlhf and if also hold a reward model), the same 64 rows fit every stage
    // (they wait for blocks or are preempted when the cache fills).
    let advised = p
        .stages
        .iter()
        .flat_map(|s| &s.devices)
        .flat_map(|d| &d.advice)
        .filter_map(|a| {
            let rest = a.split("about ").nth(1)?;
            rest.split(' ').next()?.parse::<usize>().ok()
        })
        .min()
        .expect("a cache size in the advice");
    assert!(advised > 40_960 && advised < 64 * 40_960, "{advised}");
    cfg.actor.kv_cache_tokens = advised;
    let p = plan(&cfg, &qwen3_8b(), &BTreeMap::new(), &options(&gpus));
    assert_eq!(
        item(&p, "code", "actor 0", "KV cache"),
        advised as u64 * 147_456
    );
    // A cache smaller than every row at its longest counts the prefill of a preempted row
    // (prompt + response, 40 960 tokens) instead of 4 prompts of 2048. It runs in chunks of
    // 8192 tokens: the activations of 4 prompts of 2048, plus a block table of 8192 queries ×
    // 2560 blocks.
    assert_eq!(
        item(&p, "code", "actor 0", "prefill"),
        item_of_auto_prefill() + 8192 * 2560 * 4
    );
    assert!(p.fits(), "{}", p.render());
}

/// The prefill the automatic cache size plans for: 4 prompts of 2048 tokens per call.
fn item_of_auto_prefill() -> u64 {
    let mut cfg = config("qwen3-8b-base.toml");
    cfg.actor.gen_batch = 64;
    let gpus: Vec<(Device, u64)> = (0..8).map(|i| (Device::Cuda(i), H200)).collect();
    let p = plan(&cfg, &qwen3_8b(), &BTreeMap::new(), &options(&gpus));
    item(&p, "code", "actor 0", "prefill")
}

#[test]
fn the_tiny_default_fits_a_laptop_and_processes_on_one_device_add_up() {
    let cfg = config("tiny.toml");
    let p = plan(
        &cfg,
        &tiny(),
        &BTreeMap::new(),
        &options(&[(Device::Cpu, 8 << 30)]),
    );
    assert!(p.fits(), "{}", p.render());
    let rl = p
        .stages
        .iter()
        .find(|s| s.stage != "sft" && s.processes.len() > 1)
        .unwrap();
    let total: u64 = rl.processes.iter().map(|p| p.total()).sum();
    assert_eq!(rl.devices.len(), 1);
    assert_eq!(rl.devices[0].used, total);
    // Rows never exceed the model's context (1024 tokens), whatever --prompt-tokens says.
    let long = PlanOptions {
        prompt_tokens: 1 << 20,
        ..options(&[(Device::Cpu, 8 << 30)])
    };
    let q = plan(&cfg, &tiny(), &BTreeMap::new(), &long);
    assert!(q.render().contains("× 1024 tokens"), "{}", q.render());
    // And a device that is too small is reported with what to change.
    let small = plan(
        &cfg,
        &tiny(),
        &BTreeMap::new(),
        &options(&[(Device::Cpu, 20 << 20)]),
    );
    assert!(!small.fits());
    assert!(small
        .stages
        .iter()
        .flat_map(|s| &s.devices)
        .any(|d| !d.advice.is_empty()));
}

#[test]
fn unknown_memory_is_not_a_fit() {
    let cfg = config("tiny.toml");
    let p = plan(&cfg, &tiny(), &BTreeMap::new(), &options(&[]));
    assert!(!p.fits());
    assert_eq!(p.unknown_devices(), vec![Device::Cpu]);
    assert!(p.render().contains("--device-memory"));
}

#[test]
fn an_rl_stage_with_sft_mix_counts_the_larger_of_its_grpo_and_sft_micro_batches() {
    let path = Path::new(ROOT).join("configs/tiny.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let overrides = [
        "learner.token_budget=128",
        r#"stages.rlhf.sft_mix={dataset="data/sft.jsonl", coef=0.1, rows=16, token_budget=1024}"#,
        r#"stages.if.sft_mix={dataset="data/sft.jsonl", coef=0.1, rows=1, token_budget=64}"#,
    ]
    .map(|o| o.parse().unwrap());
    let cfg = RunConfig::parse(&text, "tiny.toml", path.parent().unwrap(), &overrides).unwrap();
    let p = plan(
        &cfg,
        &tiny(),
        &BTreeMap::new(),
        &options(&[(Device::Cpu, 8 << 30)]),
    );
    let learner = |stage: &str| {
        let s = p.stages.iter().find(|s| s.stage == stage).unwrap();
        s.processes
            .iter()
            .find(|p| p.process == "learner")
            .unwrap()
            .clone()
    };
    // rlhf: 16 SFT rows of 1024 tokens outweigh 16 GRPO rows of 128.
    let rlhf = learner("rlhf");
    assert!(
        rlhf.items.iter().any(|i| i.what.contains("sft_mix rows")),
        "{}",
        p.render()
    );
    // if: one SFT row of 64 tokens is smaller; the GRPO rows stay; math has no mix.
    let (if_, math) = (learner("if"), learner("math"));
    assert!(!if_.items.iter().any(|i| i.what.contains("sft_mix")));
    let acts = |u: &cascade_shared::plan::ProcessUse| {
        u.items
            .iter()
            .filter(|i| !i.what.contains("KL reference"))
            .map(|i| i.bytes)
            .sum::<u64>()
    };
    assert_eq!(acts(&if_), acts(&math));
    assert!(acts(&rlhf) > acts(&if_));
}

/// The committed 8B config (4 learner ranks on cuda:4-7, 4 actors at gen_batch 8) fits every
/// stage on 8 H200s, as its comments say.
#[test]
fn the_committed_8b_config_fits_eight_h200s() {
    let cfg = config("qwen3-8b-base.toml");
    let gpus: Vec<(Device, u64)> = (0..8).map(|i| (Device::Cuda(i), H200)).collect();
    let p = plan(&cfg, &qwen3_8b(), &BTreeMap::new(), &options(&gpus));
    assert!(p.fits(), "{}", p.render());
    let gb = |stage: &str, process: &str| {
        let s = p.stages.iter().find(|s| s.stage == stage).unwrap();
        let q = s.processes.iter().find(|q| q.process == process).unwrap();
        q.total() as f64 / 1e9
    };
    let (sft, code, actor, rlhf_actor) = (
        gb("sft-16k", "learner rank 0"),
        gb("code", "learner rank 3"),
        gb("code", "actor 0"),
        gb("rlhf", "actor 0"),
    );
    eprintln!(
        "sft-16k learner rank 0 {sft:.1} GB, code learner rank 3 {code:.1} GB, actor 0 {actor:.1} \
         GB (rlhf, with the reward model: {rlhf_actor:.1} GB)"
    );
    assert!((sft - 93.1).abs() < 0.1, "{sft}");
    assert!((code - 121.6).abs() < 1.0, "{code}");
    // gen_batch 16: 16.4 GB of weights + 16 × 40 960 × 147 456 bytes of paged cache + the
    // prefill of 4 prompts; rlhf and if also hold the 16.4 GB reward model.
    assert!((actor - 115.1).abs() < 1.0, "{actor}");
    assert!((rlhf_actor - 131.5).abs() < 1.0, "{rlhf_actor}");
}

/// Learner ranks (issue 17): one learner entry per rank on consecutive GPUs, each keeping the
/// full weights and one micro-batch's gradients but only its 1/W shard of the f32 master
/// weights, the moments and the gradient sum.
#[test]
fn learner_ranks_shard_the_optimizer_state_in_the_plan() {
    let mut cfg = config("qwen3-8b-base.toml");
    // The committed config lists cuda:4-7; the same as a first device and a rank count.
    assert_eq!(
        cfg.devices.learner_devices(),
        (4..8).map(Device::Cuda).collect::<Vec<_>>()
    );
    cfg.devices.set_learner(&["cuda:4".to_string()]).unwrap();
    cfg.devices.actors =
        vec![cascade_shared::config::DeviceSpec::try_from("cuda:0-3".to_string()).unwrap()];
    cfg.devices.learner_ranks = Some(4);
    cfg.validate().unwrap();
    let gpus: Vec<(Device, u64)> = (0..8).map(|i| (Device::Cuda(i), H200)).collect();
    let p = plan(&cfg, &qwen3_8b(), &BTreeMap::new(), &options(&gpus));
    let params = 8_190_735_360u64;
    let sft = &p.stages[0];
    let ranks: Vec<_> = sft
        .processes
        .iter()
        .filter(|q| q.process.starts_with("learner"))
        .map(|q| (q.process.clone(), q.device))
        .collect();
    assert_eq!(
        ranks,
        (0..4)
            .map(|r| (format!("learner rank {r}"), Device::Cuda(4 + r)))
            .collect::<Vec<_>>()
    );
    let shard = params.div_ceil(4);
    assert_eq!(item(&p, "sft-16k", "learner rank 2", "Adam"), 8 * shard);
    assert_eq!(
        item(&p, "sft-16k", "learner rank 2", "f32 master"),
        4 * shard
    );
    assert_eq!(item(&p, "sft-16k", "learner rank 2", "weights"), 2 * params);
    assert_eq!(
        item(&p, "sft-16k", "learner rank 2", "gradient acc"),
        8 * shard
    );
    // A learner rank on an actor's GPU is refused.
    cfg.devices.set_learner(&["cuda:3".to_string()]).unwrap();
    let e = cfg.validate().unwrap_err().to_string();
    assert!(e.contains("learner rank 0") && e.contains("cuda:3"), "{e}");
}
