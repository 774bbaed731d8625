//! The run configuration: committed configs load, bad input names the key, overrides work.

use std::path::{Path, PathBuf};

use cascade_shared::config::{
    ConfigArgs, ConfigError, Device, MaxResponseTokens, Override, RunConfig,
};
use cascade_shared::StageKind;
use clap::Parser;

fn configs() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

const MINIMAL: &str = r#"
[model]
path = "ckpt"

[[stages]]
name = "math"
kind = "math"
dataset = "math.jsonl"
steps = 10
lr = 1e-6
"#;

fn parse(text: &str) -> Result<RunConfig, ConfigError> {
    RunConfig::parse(text, "test.toml", Path::new("/base"), &[])
}

fn parse_with(text: &str, sets: &[&str]) -> Result<RunConfig, ConfigError> {
    let overrides: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
    RunConfig::parse(text, "test.toml", Path::new("/base"), &overrides)
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn committed_configs_parse_and_validate() {
    let tiny = RunConfig::load(configs().join("tiny.toml"), &[]).unwrap();
    let kinds: Vec<&str> = tiny.stages.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(kinds, ["sft", "sft", "rlhf", "if", "math", "code", "swe"]);
    assert_eq!(tiny.stages[0].kind, StageKind::Sft);
    assert!(
        tiny.reward_model.is_some(),
        "the tiny default trains its reward model"
    );
    let math = tiny.stage("math").unwrap();
    assert_eq!(math.max_response_tokens_at(0, 1), 24);
    assert_eq!(math.max_response_tokens_at(17, 1), 24);
    assert_eq!(math.max_response_tokens_at(18, 1), 32);
    assert!(
        tiny.stages
            .iter()
            .filter(|s| s.is_rl())
            .all(|s| s.sft_mix.is_some()),
        "every RL stage of the tiny default mixes in SFT rows (issue 19)"
    );
    assert_eq!(
        math.temperature, 0.6,
        "RL samples at the evaluation temperature"
    );
    assert_eq!(tiny.devices.actor_assignment(), vec![Device::Cpu]);

    let big = RunConfig::load(configs().join("qwen3-8b-base.toml"), &[]).unwrap();
    let kinds: Vec<&str> = big.stages.iter().map(|s| s.kind.as_str()).collect();
    assert_eq!(
        kinds,
        ["sft", "sft", "rlhf", "if", "math", "math", "code", "swe"]
    );
    assert_eq!(
        big.devices.learner_devices(),
        (4..8).map(Device::Cuda).collect::<Vec<_>>()
    );
    assert_eq!(
        big.devices.actor_assignment(),
        (0..4).map(Device::Cuda).collect::<Vec<_>>()
    );
    assert_eq!(big.stage("swe").unwrap().group_size, 16);
    assert_eq!(big.resolve("x"), configs().join("x"));
}

#[test]
fn defaults_follow_the_recipe() {
    let cfg = parse(MINIMAL).unwrap();
    let s = &cfg.stages[0];
    assert_eq!(s.betas, [0.9, 0.95]);
    assert_eq!(s.temperature, 1.0);
    assert_eq!(s.group_size, 8);
    assert_eq!(s.loss_agg, cascade_shared::config::LossAgg::Token);
    assert_eq!(s.kl_coef, 0.0);
    assert_eq!(
        s.max_response_tokens_at(5, cfg.actor.max_new_tokens),
        cfg.actor.max_new_tokens
    );
}

#[test]
fn unknown_key_is_named_with_allowed_keys() {
    let e = err(&MINIMAL.replace("lr = 1e-6", "lr = 1e-6\nlearning_rate = 1"));
    assert!(
        e.contains("stages[0]") && e.contains("unknown field `learning_rate`"),
        "{e}"
    );
    assert!(e.contains("warmup_steps"), "lists the allowed keys: {e}");
    let e = err(&format!("{MINIMAL}\n[actor]\ngen_batchh = 3\n"));
    assert!(e.contains("actor") && e.contains("gen_batchh"), "{e}");
    let e = err(&format!("[bogus]\nx = 1\n{MINIMAL}"));
    assert!(e.contains("bogus") && e.contains("stages"), "{e}");
}

#[test]
fn wrong_type_names_key_and_expected_type() {
    let e = err(&MINIMAL.replace("steps = 10", "steps = \"ten\""));
    assert!(
        e.contains("stages[0].steps") && e.contains("expected usize"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("lr = 1e-6", "lr = [1]"));
    assert!(e.contains("stages[0].lr") && e.contains("f64"), "{e}");
    let e = err(&MINIMAL.replace("kind = \"math\"", "kind = \"chemistry\""));
    assert!(
        e.contains("stages[0].kind") && e.contains("`math`") && e.contains("`swe`"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("steps = 10", "steps = 10\nmax_response_tokens = \"long\""));
    assert!(
        e.contains("max_response_tokens") && e.contains("list of token counts"),
        "{e}"
    );
    let e = err(&MINIMAL.replace("steps = 10", "steps = 10\nloss_agg = \"mean\""));
    assert!(e.contains("`token`") && e.contains("`sequence`"), "{e}");
}

#[test]
fn syntax_error_names_the_file_and_line() {
    let e = err("[model\npath = 1");
    assert!(e.contains("test.toml") && e.contains("line 1"), "{e}");
}

#[test]
fn empty_stage_list_is_an_error() {
    let e = err("[model]\npath = \"ckpt\"\n");
    assert!(
        e.starts_with("stages:") && e.contains("at least one"),
        "{e}"
    );
}

#[test]
fn cross_field_checks() {
    let sft_after_rl = format!(
        "{MINIMAL}\n[[stages]]\nname = \"sft\"\nkind = \"sft\"\ndataset = \"d\"\nsteps = 1\nlr = 1e-5\n"
    );
    let e = err(&sft_after_rl);
    assert!(
        e.contains("stages[1].kind") && e.contains("SFT stages must come first"),
        "{e}"
    );
    let cases = [
        ("group_size = 1", "stages[0].group_size"),
        ("top_p = 0.0", "stages[0].top_p"),
        ("top_p = 1.5", "0 < top_p ≤ 1"),
        ("mode_mix = 2.0", "stages[0].mode_mix"),
        (
            "max_response_tokens = [8, 16]",
            "stages[0].curriculum_steps",
        ),
        (
            "max_response_tokens = [8, 16]\ncurriculum_steps = [20]",
            "within (0, 10)",
        ),
        (
            "curriculum_steps = [2]",
            "needs max_response_tokens to be a list",
        ),
        ("warmup_steps = 11", "stages[0].warmup_steps"),
        ("token_budget = 100", "SFT stages only"),
        ("betas = [0.9, 1.0]", "stages[0].betas[1]"),
        (
            "sft_mix = { dataset = \"sft.jsonl\", coef = 0.0 }",
            "stages[0].sft_mix.coef",
        ),
        (
            "sft_mix = { dataset = \"sft.jsonl\", coef = 0.5, rows = 0 }",
            "stages[0].sft_mix.rows",
        ),
        ("sft_mix = { coef = 0.5 }", "dataset"),
        (
            "verifier = { rule_weight = 2.0 }",
            "stages[0].verifier.rule_weight",
        ),
        (
            "verifier = { rm_weight = 0.5 }",
            "rm_weight > 0 needs a reward model",
        ),
        ("verifier = { rm_weight = -1.0 }", "must be ≥ 0"),
    ];
    for (line, needle) in cases {
        let e = err(&MINIMAL.replace("steps = 10", &format!("steps = 10\n{line}")));
        assert!(e.contains(needle), "{line}: {e}");
    }
    let e = err(&MINIMAL.replace(
        "path = \"ckpt\"",
        "path = \"ckpt\"\ninit = { config = \"c.json\" }",
    ));
    assert!(e.contains("model") && e.contains("not both"), "{e}");
    let e = err(&MINIMAL.replace("kind = \"math\"", "kind = \"rlhf\""));
    assert!(e.contains("reward_model"), "{e}");
    let e = err(&MINIMAL.replace(
        "path = \"ckpt\"",
        "path = \"ckpt\"\n[devices]\nactors = [\"gpu:0\"]",
    ));
    assert!(
        e.contains("devices.actors[0]") && e.contains("cuda:A-B"),
        "{e}"
    );
    let devices = |body: &str| {
        MINIMAL.replace(
            "path = \"ckpt\"",
            &format!("path = \"ckpt\"\n[devices]\n{body}"),
        )
    };
    for (body, needle) in [
        ("learner = \"gpu:0\"", "allowed"),
        (
            "learner = [\"cuda:4-7\", \"cuda:5\"]",
            "cuda:5 is listed twice",
        ),
        ("learner = [\"cpu\", \"cpu\"]", "learner_ranks"),
        ("learner = []", "no device listed"),
        (
            "learner = \"cuda:4-7\"\nlearner_ranks = 2",
            "lists 4 devices",
        ),
        (
            "learner = [\"cuda:1\", \"cuda:3\"]\nactors = [\"cuda:0-1\"]",
            "rank 0 would run on cuda:1",
        ),
    ] {
        let e = err(&devices(body));
        assert!(
            e.contains("devices.learner") && e.contains(needle),
            "{body}: {e}"
        );
    }
}

/// `devices.learner` names one device, a range or a list: one learner rank per device, which
/// survives the config's round trip (the run directory's `config.toml`).
#[test]
fn learner_devices_as_a_range_or_a_list() {
    use cascade_shared::config::Device;
    let with = |body: &str| {
        parse(&MINIMAL.replace(
            "path = \"ckpt\"",
            &format!("path = \"ckpt\"\n[devices]\nactors = [\"cuda:0-3\"]\n{body}"),
        ))
        .unwrap()
    };
    let range = with("learner = \"cuda:4-7\"");
    assert_eq!(
        range.devices.learner_devices(),
        (4..8).map(Device::Cuda).collect::<Vec<_>>()
    );
    assert_eq!(range.devices.learner, Device::Cuda(4));
    let list = with("learner = [\"cuda:6\", \"cuda:4-5\"]");
    assert_eq!(
        list.devices.learner_devices(),
        vec![Device::Cuda(6), Device::Cuda(4), Device::Cuda(5)]
    );
    let agreeing = with("learner = \"cuda:4-5\"\nlearner_ranks = 2");
    assert_eq!(agreeing.devices.learner_devices().len(), 2);
    let one = with("learner = [\"cuda:7\"]");
    assert_eq!(one.devices.learner_devices(), vec![Device::Cuda(7)]);
    assert_eq!(one.devices.learner_list, None);
    // The old form: a first device and a rank count.
    let counted = with("learner = \"cuda:4\"\nlearner_ranks = 3");
    assert_eq!(
        counted.devices.learner_devices(),
        (4..7).map(Device::Cuda).collect::<Vec<_>>()
    );
    for cfg in [range, list, counted] {
        let text = toml::to_string(&cfg).unwrap();
        let back = RunConfig::parse(&text, "back.toml", Path::new("/base"), &[]).unwrap();
        assert_eq!(back.devices, cfg.devices, "{text}");
    }
}

#[test]
fn overrides_by_index_name_and_new_table() {
    let two = format!(
        "{}\n[[stages]]\nname = \"code\"\nkind = \"code\"\ndataset = \"c\"\nsteps = 5\nlr = 1e-6\n",
        MINIMAL
    );
    let cfg = parse_with(
        &two,
        &[
            "stages.1.lr=3e-7",
            "stages.math.group_size=16",
            "actor.gen_batch=32",
            "model.dtype=bf16",
            "devices.actors=[\"cuda:0-3\"]",
            "stages.code.max_response_tokens=[8, 16]",
            "stages.code.curriculum_steps=[2]",
        ],
    )
    .unwrap();
    assert_eq!(cfg.stages[1].lr, 3e-7);
    assert_eq!(cfg.stages[0].group_size, 16);
    assert_eq!(cfg.actor.gen_batch, 32);
    assert_eq!(cfg.model.dtype, cascade_shared::config::DtypeChoice::Bf16);
    assert_eq!(cfg.devices.actor_devices().len(), 4);
    assert_eq!(
        cfg.stages[1].max_response_tokens,
        Some(MaxResponseTokens::Curriculum(vec![8, 16]))
    );

    let e = parse_with(MINIMAL, &["stages.0.lrr=1"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown field `lrr`"), "{e}");
    let e = parse_with(MINIMAL, &["stages.5.lr=1"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of range"), "{e}");
    let e = parse_with(MINIMAL, &["stages.nope.lr=1"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("names: math"), "{e}");
    let e = parse_with(MINIMAL, &["actor.gen_batch=many"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("actor.gen_batch") && e.contains("usize"), "{e}");
    assert!("no-equals".parse::<Override>().is_err());
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    config: ConfigArgs,
}

#[test]
fn cli_flags_override_the_file_in_order() {
    let path = configs().join("tiny.toml");
    let cli = Cli::parse_from([
        "cascade",
        "--config",
        path.to_str().unwrap(),
        "--set",
        "actor.gen_batch=7",
        "--gen-batch",
        "9",
        "--learner-threads",
        "3",
        "--set",
        "stages.sft1.steps=50",
    ]);
    let cfg = cli.config.load("", Path::new(".")).unwrap();
    assert_eq!(cfg.actor.gen_batch, 9, "typed flags win over --set");
    assert_eq!(cfg.learner.threads, 3);
    assert_eq!(cfg.stages[0].steps, 50);
    assert_eq!(cfg.actor.top_k, 0);

    let embedded = std::fs::read_to_string(&path).unwrap();
    let cli = Cli::parse_from(["cascade", "--top-p", "0"]);
    let e = cli
        .config
        .load(&embedded, &configs())
        .unwrap_err()
        .to_string();
    assert!(e.contains("actor.top_p"), "{e}");
}

#[test]
fn check_files_names_the_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ckpt")).unwrap();
    let file = dir.path().join("run.toml");
    std::fs::write(&file, MINIMAL).unwrap();
    let cfg = RunConfig::load(&file, &[]).unwrap();
    let e = cfg.check_files().unwrap_err().to_string();
    assert!(
        e.contains("stages[0].dataset") && e.contains("math.jsonl"),
        "{e}"
    );
    std::fs::write(dir.path().join("math.jsonl"), "{}\n").unwrap();
    cfg.check_files().unwrap();
}

/// An RL stage's `sft_mix` (SFT rows mixed into its steps): parsed with its defaults, refused on
/// an SFT stage, and its dataset is one of the files the run checks.
#[test]
fn sft_mix_is_parsed_checked_and_its_dataset_required() {
    let with_mix = MINIMAL.replace(
        "steps = 10",
        "steps = 10\nsft_mix = { dataset = \"sft.jsonl\", coef = 0.25 }",
    );
    let cfg = parse(&with_mix).unwrap();
    let mix = cfg.stages[0].sft_mix.as_ref().unwrap();
    assert_eq!((mix.coef, mix.rows, mix.token_budget), (0.25, 2, None));
    let on_sft =
        "[model]\npath = \"ckpt\"\n[[stages]]\nname = \"s\"\nkind = \"sft\"\ndataset = \"d\"\n\
                  steps = 1\nlr = 1e-5\nsft_mix = { dataset = \"d\", coef = 1.0 }\n";
    let e = err(on_sft);
    assert!(
        e.contains("stages[0].sft_mix") && e.contains("RL stages only"),
        "{e}"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ckpt")).unwrap();
    std::fs::write(dir.path().join("math.jsonl"), "{}\n").unwrap();
    let file = dir.path().join("run.toml");
    std::fs::write(&file, &with_mix).unwrap();
    let cfg = RunConfig::load(&file, &[]).unwrap();
    let e = cfg.check_files().unwrap_err().to_string();
    assert!(
        e.contains("stages[0].sft_mix.dataset") && e.contains("sft.jsonl"),
        "{e}"
    );
}

/// `sft_mix.replay` names earlier RL stages only; the learner records the best responses of
/// the stages a later stage replays.
#[test]
fn sft_mix_replay_names_earlier_rl_stages() {
    let stages = |replay: &str| {
        format!(
            "[model]\npath = \"ckpt\"\n\
             [[stages]]\nname = \"s\"\nkind = \"sft\"\ndataset = \"d\"\nsteps = 1\nlr = 1e-5\n\
             [[stages]]\nname = \"chat\"\nkind = \"rlhf\"\ndataset = \"d\"\nsteps = 1\nlr = 1e-6\n\
             verifier = {{ reward_model = \"rm\" }}\n\
             [[stages]]\nname = \"math\"\nkind = \"math\"\ndataset = \"d\"\nsteps = 1\nlr = 1e-6\n\
             sft_mix = {{ dataset = \"d\", coef = 0.1, {replay} }}\n\
             [[stages]]\nname = \"code\"\nkind = \"code\"\ndataset = \"d\"\nsteps = 1\nlr = 1e-6\n"
        )
    };
    let cfg = parse(&stages("replay = [\"chat\"]")).unwrap();
    let mix = cfg.stages[2].sft_mix.as_ref().unwrap();
    assert_eq!(
        (mix.replay.clone(), mix.replay_rows),
        (vec!["chat".to_string()], 1)
    );
    let recorded: Vec<bool> = (0..4).map(|i| cfg.replayed_later(i)).collect();
    assert_eq!(recorded, [false, true, false, false]);
    for (replay, what) in [
        (
            "replay = [\"code\"]",
            "\"code\" is not an RL stage before \"math\"",
        ),
        ("replay = [\"s\"]", "\"s\" is not an RL stage"),
        ("replay = [\"math\"]", "\"math\" is not an RL stage before"),
        ("replay = [\"nope\"]", "\"nope\""),
        (
            "replay = [\"chat\"], replay_rows = 0",
            "stages[2].sft_mix.replay_rows",
        ),
    ] {
        let e = err(&stages(replay));
        assert!(
            e.contains("stages[2].sft_mix.replay") && e.contains(what),
            "{replay}: {e}"
        );
    }
    // Without replay, no stage records.
    let cfg = parse(&stages("rows = 1")).unwrap();
    assert!((0..4).all(|i| !cfg.replayed_later(i)));
}

#[test]
fn swe_judge_and_sandbox_memory_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ckpt")).unwrap();
    std::fs::write(dir.path().join("swe.jsonl"), "{}\n").unwrap();
    let text = MINIMAL
        .replace("kind = \"math\"", "kind = \"swe\"")
        .replace("math.jsonl", "swe.jsonl")
        + "verifier = { swe_judge = \"judge\" }\n";
    let file = dir.path().join("run.toml");
    std::fs::write(&file, &text).unwrap();
    let cfg = RunConfig::load(&file, &[]).unwrap();
    assert_eq!(
        cfg.stages[0].verifier.swe_judge.as_deref(),
        Some(Path::new("judge"))
    );
    let e = cfg.check_files().unwrap_err().to_string();
    assert!(e.contains("stages[0].verifier.swe_judge"), "{e}");
    std::fs::create_dir(dir.path().join("judge")).unwrap();
    cfg.check_files().unwrap();

    let e = parse(&(MINIMAL.to_string() + "verifier = { code_memory_mb = 8 }\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("code_memory_mb"), "{e}");
}

#[test]
fn missing_config_file_names_it() {
    let e = RunConfig::load("/no/such/run.toml", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("/no/such/run.toml"), "{e}");
}
