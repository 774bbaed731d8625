//! From prompts to the replay log: the actor loop writes complete groups that decode, scored
//! by the stage's verifier; the reward pool assembles groups whatever order samples finish in.

mod common;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::Device;
use cascade_actor::engine::{Engine, Finished, GenParams, Job};
use cascade_actor::rewards::{Detokenize, GroupContext, RewardPipeline, ScoreTask};
use cascade_actor::run::{choose_mode, run_actor_with, ActorOptions, RolloutOverrides, RunSummary};
use cascade_actor::sampler::SamplingParams;
use cascade_replay::ReaderOptions;
use cascade_rewards::{Reward, SplitResponse, Verifier, VerifyError};
use cascade_shared::config::RunConfig;
use cascade_shared::intake;
use cascade_shared::snapshot::LearnerState;
use cascade_shared::transport::{ReplaySource, RolloutSink, RolloutSource, TransportError};
use cascade_shared::{FinishReason, Mode, RolloutGroup, StageKind, VersionSpan};

/// Reward = number of characters of the answer; rejects references without `ok`.
struct LenVerifier;

impl Verifier for LenVerifier {
    fn name(&self) -> &'static str {
        "len"
    }
    fn verify(
        &self,
        reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        if reference.get("ok").is_none() {
            return Err(VerifyError::BadReference {
                field: "ok".into(),
                problem: "missing".into(),
            });
        }
        let n = response.full.chars().count() as f32;
        Ok(Reward {
            reward: n,
            details: serde_json::json!({ "chars": n }),
        })
    }
}

/// Token `i` decodes to the letter `i mod 26`.
fn letters() -> Detokenize {
    Arc::new(|ids: &[u32]| {
        Ok::<String, String>(
            ids.iter()
                .map(|i| char::from(b'a' + (i % 26) as u8))
                .collect(),
        )
    })
}

#[derive(Clone, Default)]
struct MemSink(Arc<Mutex<Vec<RolloutGroup>>>);

impl RolloutSink for MemSink {
    fn send(&mut self, group: &RolloutGroup) -> Result<u64, TransportError> {
        let mut v = self.0.lock().unwrap();
        v.push(group.clone());
        Ok(v.len() as u64 - 1)
    }
    fn flush(&mut self) -> Result<(), TransportError> {
        Ok(())
    }
}

#[test]
fn the_reward_pool_assembles_groups() {
    let mut engine = Engine::new(common::tiny_model(8, 256), 2, 3, vec![7, 9, 13, 20, 40]).unwrap();
    let sink = MemSink::default();
    let detok = letters();
    let pool = RewardPipeline::start(2, 2, detok, Box::new(sink.clone())).unwrap();
    let mut ctxs = Vec::new();
    for p in 0..4u64 {
        engine
            .submit(Job {
                tag: p,
                prompt_id: 100 + p,
                prompt_ids: vec![1, 2, 3 + p as u32],
                mode: Mode::Think,
                group_size: 3,
                params: GenParams {
                    sampling: SamplingParams::plain(),
                    max_new_tokens: 5 + 3 * p as usize,
                    seed: 4,
                },
            })
            .unwrap();
        let reference = if p == 3 {
            serde_json::json!({})
        } else {
            serde_json::json!({"ok": true})
        };
        ctxs.push(Arc::new(GroupContext::new(
            StageKind::If,
            2,
            5,
            reference,
            Arc::new(LenVerifier),
        )));
    }
    for f in engine.run_to_completion().unwrap() {
        let ctx = ctxs[f.job.tag as usize].clone();
        pool.submit(ScoreTask { sample: f, ctx }).unwrap();
    }
    let stats = pool.finish().unwrap();
    assert_eq!(
        (
            stats.groups,
            stats.samples,
            stats.verify_errors,
            stats.incomplete_groups
        ),
        (4, 12, 3, 0)
    );
    let mut groups = sink.0.lock().unwrap().clone();
    groups.sort_by_key(|g| g.prompt_id);
    for (p, g) in groups.iter().enumerate() {
        assert_eq!(g.prompt_id, 100 + p as u64);
        assert_eq!(
            (g.stage, g.stage_index, g.actor_id, g.mode),
            (StageKind::If, 2, 5, Mode::Think)
        );
        assert_eq!(g.samples.len(), 3);
        assert_eq!(g.temperature, 1.0, "plain sampling records T = 1");
        for s in &g.samples {
            assert_eq!(s.behaviour_logprobs.len(), s.response_ids.len());
            if p == 3 {
                assert_eq!(s.reward, 0.0);
                assert!(s.reward_breakdown.iter().any(|(k, _)| k == "verify_error"));
            } else {
                assert_eq!(
                    s.reward,
                    s.response_ids.len() as f32,
                    "reward of this sample's own text"
                );
            }
        }
    }
}

/// Counts its calls; reward = the answer's length.
#[derive(Default)]
struct CountingVerifier(std::sync::atomic::AtomicUsize);

impl Verifier for CountingVerifier {
    fn name(&self) -> &'static str {
        "counting"
    }
    fn verify(
        &self,
        _reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Reward {
            reward: response.full.len() as f32,
            details: serde_json::Value::Null,
        })
    }
}

/// Scores one group of `responses` with `verifier` through a one-worker pipeline (with several,
/// two copies scored at the same moment may both be verified); the rewards and breakdowns.
fn score_group(
    verifier: Arc<dyn Verifier>,
    responses: &[&[u32]],
) -> Vec<(f32, Vec<(String, f32)>)> {
    let sink = MemSink::default();
    let pool = RewardPipeline::start(1, 8, letters(), Box::new(sink.clone())).unwrap();
    let job = Arc::new(Job {
        tag: 0,
        prompt_id: 7,
        prompt_ids: vec![1],
        mode: Mode::NoThink,
        group_size: responses.len(),
        params: GenParams {
            sampling: SamplingParams {
                temperature: 1.0,
                top_k: None,
                top_p: None,
            },
            max_new_tokens: 4,
            seed: 0,
        },
    });
    let ctx = Arc::new(GroupContext::new(
        StageKind::Code,
        0,
        0,
        serde_json::json!({}),
        verifier,
    ));
    for (i, ids) in responses.iter().enumerate() {
        let sample = Finished {
            job: job.clone(),
            sample_index: i,
            response_ids: ids.to_vec(),
            logprobs: vec![-1.0; ids.len()],
            versions: vec![VersionSpan {
                start_token: 0,
                version: 0,
            }],
            finish_reason: FinishReason::Stop,
            generate_ms: 0.0,
        };
        pool.submit(ScoreTask {
            sample,
            ctx: ctx.clone(),
        })
        .unwrap();
    }
    let stats = pool.finish().unwrap();
    assert_eq!((stats.groups, stats.samples), (1, responses.len() as u64));
    let groups = sink.0.lock().unwrap().clone();
    groups[0]
        .samples
        .iter()
        .map(|s| (s.reward, s.reward_breakdown.clone()))
        .collect()
}

/// A response a group has already had is not verified again, and gets the same reward.
#[test]
fn repeated_responses_of_a_group_are_verified_once() {
    let verifier = Arc::new(CountingVerifier::default());
    let responses: [&[u32]; 5] = [&[1, 2, 3], &[1, 2, 3], &[4], &[1, 2, 3], &[4]];
    let scored = score_group(verifier.clone(), &responses);
    assert_eq!(verifier.0.load(std::sync::atomic::Ordering::SeqCst), 2);
    let rewards: Vec<f32> = scored.iter().map(|s| s.0).collect();
    assert_eq!(rewards, [3.0, 3.0, 1.0, 3.0, 1.0]);
}

/// Fails its first call as the environment would (a sandbox that could not start); then as
/// [`CountingVerifier`].
#[derive(Default)]
struct FlakyVerifier(CountingVerifier);

impl Verifier for FlakyVerifier {
    fn name(&self) -> &'static str {
        "flaky"
    }
    fn verify(
        &self,
        reference: &serde_json::Value,
        response: &SplitResponse<'_>,
    ) -> Result<Reward, VerifyError> {
        if (self.0).0.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            (self.0).0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            return Err(VerifyError::Environment("sandbox did not start".into()));
        }
        self.0.verify(reference, response)
    }
}

/// A verification that failed for the environment is not memoised: a repeat of the response
/// is verified again rather than given the failure.
#[test]
fn a_failed_verification_is_not_copied_to_repeats() {
    let verifier = Arc::new(FlakyVerifier::default());
    let scored = score_group(verifier.clone(), &[&[1, 2, 3], &[1, 2, 3], &[1, 2, 3]]);
    // The failure, then one verification that the third copy reuses.
    assert_eq!((verifier.0).0.load(std::sync::atomic::Ordering::SeqCst), 2);
    let rewards: Vec<f32> = scored.iter().map(|s| s.0).collect();
    assert_eq!(rewards, [0.0, 3.0, 3.0]);
    assert!(scored[0]
        .1
        .iter()
        .any(|(k, v)| k == "verify_error" && *v == 1.0));
    assert!(scored[1].1.iter().all(|(k, _)| k != "verify_error"));
}

#[test]
fn the_actor_loop_writes_groups_that_decode() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let mut data: String = (0..5)
        .map(|i| math_line(10 + i, &format!("What is {i}+{i}?"), 2 * i))
        .collect();
    // One prompt longer than the context: skipped and counted, never a crash.
    data.push_str(&math_line(99, &"x".repeat(200), 1));
    let config = math_run(
        base,
        &data,
        r#"
[actor]
gen_batch = 4
max_new_tokens = 16
reward_workers = 2
seed = 5
[[stages]]
name = "math"
kind = "math"
dataset = "math.jsonl"
steps = 10
lr = 1e-4
group_size = 3
mode_mix = 0.5
max_response_tokens = [8, 16]
curriculum_steps = [5]
"#,
    );
    let (summary, got) = run_and_read(&base.join("run"), config, 1, 7);
    assert_eq!(summary.groups, 7);
    assert!(summary.skipped_prompts >= 1, "the long prompt was skipped");
    assert_eq!(got.len(), 7);
    for (actor, g) in &got {
        assert_eq!(actor, "actor-1");
        assert_eq!(
            (g.stage, g.stage_index, g.actor_id),
            (StageKind::Math, 0, 1)
        );
        assert!((10..15).contains(&g.prompt_id), "prompt {}", g.prompt_id);
        assert_eq!(g.samples.len(), 3);
        for s in &g.samples {
            assert!(
                !s.response_ids.is_empty() && s.response_ids.len() <= 8,
                "curriculum: 8 tokens at step 0"
            );
            assert_eq!(s.behaviour_logprobs.len(), s.response_ids.len());
            assert_eq!(s.policy_versions[0].version, 0);
            assert!(s.reward == 0.0 || s.reward == 1.0);
            assert_eq!(s.reward_breakdown[0].0, "math");
        }
    }
    // The think/no-think draw is seeded per prompt and follows mode_mix on average.
    let think = (0..2000)
        .filter(|p| choose_mode(5, *p, 0, 0.25) == Mode::Think)
        .count();
    assert!(
        (400..600).contains(&think),
        "{think} of 2000 in think mode at mix 0.25"
    );
    assert_eq!(choose_mode(5, 17, 0, 0.5), choose_mode(5, 17, 0, 0.5));
}

/// Strictly on-policy, the draws of a new policy version start after every group the learner
/// decided on in the stage (`StageProgress::groups_decided`: kept, or dropped for equal
/// rewards), not at `stage_step × batch_prompts`. Dynamic filtering makes the learner decide on
/// several batches' worth of groups a step; with the old rule each version re-drew the prompts
/// its predecessor had just trained on or filtered out (issue 19: the tiny default's on-policy
/// math stage trained each prompt in about 4 consecutive steps).
#[test]
fn on_policy_draws_of_a_new_version_start_after_the_groups_the_learner_decided() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let config = math_stage(base, 60, 0);
    // The prompts an actor draws at the learner's `state`, `groups` of them.
    let drawn = |name: &str, state: LearnerState, groups: u64| -> Vec<u64> {
        let run_dir = base.join(name);
        common::publish_tiny_with(
            &run_dir.join("snapshots"),
            &common::tiny_config(128),
            11,
            &state,
        );
        let (_, got) = run_and_read(&run_dir, config.clone(), 0, groups);
        let mut ids: Vec<u64> = got.iter().map(|(_, g)| g.prompt_id).collect();
        ids.sort_unstable();
        assert_eq!(ids.len() as u64, groups, "{name}: every group written");
        ids
    };
    // Version 1 (the stage's start): 8 prompts drawn, all decided on by the learner's first
    // step (2 kept, 6 dropped for equal rewards), which publishes version 2.
    let first = drawn("v1", state_at(1, 0, 0), 8);
    let next = drawn("v2", state_at(2, 1, 8), 4);
    let both = drawn("v1-more", state_at(1, 0, 0), 12);
    assert!(
        next.iter().all(|p| !first.contains(p)),
        "version 2 re-drew prompts decided at version 1: {first:?} then {next:?}"
    );
    let mut union: Vec<u64> = first.iter().chain(&next).copied().collect();
    union.sort_unstable();
    assert_eq!(
        union, both,
        "version 2 goes on where version 1's decided groups end"
    );
    // A state of an earlier build (no count) keeps the old rule: step × batch_prompts.
    let old = drawn("old", state_at(2, 4, 0), 4);
    assert!(old.iter().all(|p| both.contains(p) && !first.contains(p)));
}

/// Strictly on-policy, an actor whose version's batch the learner has closed
/// (`cascade_shared::intake`) writes nothing. It goes on when the learner reopens the version
/// (a skipped step, a restarted learner), writing exactly what an actor that never paused
/// writes, and with the next version's prompts once that snapshot is out; stopped while
/// holding, it exits; it counts its holds.
#[test]
fn on_policy_actor_holds_while_the_learner_has_closed_its_versions_batch() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let config = math_stage(base, 200, 0);
    let cfg = common::tiny_config(128);
    // What an actor that never pauses writes first. (Many more than 12 groups, so that the rows
    // of the first 12 are decoded in the same batches as in a run that goes on.)
    let reference_dir = base.join("reference");
    common::publish_tiny_with(
        &reference_dir.join("snapshots"),
        &cfg,
        11,
        &state_at(1, 0, 0),
    );
    let (_, reference) = run_and_read(&reference_dir, config.clone(), 0, 40);
    let key = |g: &RolloutGroup| {
        let responses: Vec<Vec<u32>> = g.samples.iter().map(|s| s.response_ids.clone()).collect();
        (g.prompt_id, responses)
    };
    let reference: Vec<_> = reference.iter().take(12).map(|(_, g)| key(g)).collect();
    assert_eq!(reference.len(), 12);

    let run = HeldRun::start(base.join("run"), config, &state_at(1, 0, 0), 1);
    let mut source = run.source();
    let mut receive = |quiet, at_least| receive(&mut source, quiet, at_least);
    let (quiet, long) = (Duration::from_millis(1500), Duration::from_secs(120));
    // Closed from the start: nothing.
    let got = receive(quiet, usize::MAX);
    assert!(got.is_empty(), "{} groups of a closed version", got.len());
    // Reopened (the learner waits for more of version 1): version 1's prompts.
    assert!(intake::reopen(&run.replay, 1).unwrap());
    let mut written = receive(long, 3);
    assert!(
        written.len() >= 3,
        "{} groups after the reopen",
        written.len()
    );
    assert!(written.iter().all(|g| g.min_policy_version() == 1));
    // Closed again: the groups already in the reward pool arrive, then nothing.
    intake::close(&run.replay, 1).unwrap();
    written.extend(receive(Duration::from_millis(1000), usize::MAX));
    let got = receive(quiet, usize::MAX);
    assert!(got.is_empty(), "{} groups after the close", got.len());
    // Reopened once more: the actor goes on where it paused.
    assert!(intake::reopen(&run.replay, 1).unwrap());
    written.extend(receive(long, 12usize.saturating_sub(written.len())));
    let written: Vec<_> = written.iter().map(key).collect();
    assert!(written.len() >= 12, "{} groups of version 1", written.len());
    assert!(
        written[..12] == reference[..],
        "the paused actor wrote other groups than one that never paused"
    );
    intake::close(&run.replay, 1).unwrap();
    let _in_flight = receive(Duration::from_millis(1000), usize::MAX);
    // Version 2 is out: its prompts, although the marker still names version 1.
    common::publish_tiny_with(&run.snapshots, &cfg, 12, &state_at(2, 1, 0));
    let got = receive(long, 2);
    assert!(got.len() >= 2, "{} groups of version 2", got.len());
    assert!(got.iter().all(|g| g.min_policy_version() == 2));
    // Stopped while holding, with rows in flight: it exits without finishing them.
    intake::close(&run.replay, 2).unwrap();
    let _in_flight = receive(Duration::from_millis(1000), usize::MAX);
    let (summary, last) = run.stop();
    assert_eq!(summary.holds, 4, "{summary:?}");
    assert!(summary.held_s > 0.0);
    assert_eq!(
        last["held"], 4,
        "the totals at exit are in the metrics: {last}"
    );
}

/// With a staleness bound, the learner closes a version only after a stage's last batch: the
/// actor pauses the same way (nothing written) and goes on with the next snapshot.
#[test]
fn an_asynchronous_actor_holds_while_its_version_is_closed_too() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let config = math_stage(base, 50, 2);
    let run = HeldRun::start(base.join("run"), config, &state_at(4, 4, 0), 4);
    let mut source = run.source();
    let got = receive(&mut source, Duration::from_millis(1500), usize::MAX);
    assert!(got.is_empty(), "{} groups of a closed version", got.len());
    let cfg = common::tiny_config(128);
    common::publish_tiny_with(&run.snapshots, &cfg, 12, &state_at(5, 5, 0));
    let got = receive(&mut source, Duration::from_secs(120), 2);
    assert!(
        got.len() >= 2,
        "{} groups after the next snapshot",
        got.len()
    );
    assert!(got.iter().all(|g| g.min_policy_version() == 5));
    let (summary, _) = run.stop();
    assert_eq!(summary.holds, 1, "{summary:?}");
}

/// A run config of one math stage of `prompts` prompts at staleness bound `max_staleness`.
fn math_stage(base: &std::path::Path, prompts: u64, max_staleness: u64) -> RunConfig {
    let data: String = (0..prompts)
        .map(|i| math_line(100 + i, &format!("What is {i}+1?"), i + 1))
        .collect();
    math_run(
        base,
        &data,
        &format!(
            r#"
[actor]
gen_batch = 4
max_new_tokens = 4
reward_workers = 1
seed = 5
[learner]
max_staleness = {max_staleness}
[[stages]]
name = "math"
kind = "math"
dataset = "math.jsonl"
steps = 10
lr = 1e-4
batch_prompts = 2
group_size = 2
"#
        ),
    )
}

/// The learner's state at `version`, stage step `stage_step`, `decided` groups decided.
fn state_at(version: u64, stage_step: u64, decided: u64) -> LearnerState {
    let mut s = LearnerState::initial(serde_json::json!({}));
    s.step = version;
    s.policy_version = version;
    s.stage_step = stage_step;
    s.stage_progress.groups_decided = decided;
    s
}

/// An actor started on a snapshot at `state` whose version the learner has already closed.
struct HeldRun {
    run_dir: std::path::PathBuf,
    snapshots: std::path::PathBuf,
    replay: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    actor: std::thread::JoinHandle<cascade_actor::error::Result<RunSummary>>,
}

impl HeldRun {
    fn start(
        run_dir: std::path::PathBuf,
        config: RunConfig,
        state: &LearnerState,
        closed: u64,
    ) -> Self {
        let snapshots = run_dir.join("snapshots");
        let replay = run_dir.join("replay");
        common::publish_tiny_with(&snapshots, &common::tiny_config(128), 11, state);
        intake::close(&replay, closed).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let opts = ActorOptions {
            run_dir: run_dir.clone(),
            actor_id: 0,
            device: Device::Cpu,
            config,
            overrides: RolloutOverrides::default(),
            max_groups: None,
        };
        let actor = {
            let stop = stop.clone();
            std::thread::spawn(move || run_actor_with(opts, stop))
        };
        HeldRun {
            run_dir,
            snapshots,
            replay,
            stop,
            actor,
        }
    }

    fn source(&self) -> ReplaySource {
        ReplaySource::open(&self.replay, ReaderOptions::default(), None).unwrap()
    }

    /// Stops the actor (which must exit within a minute) and returns its summary and its last
    /// `actor` metrics event.
    fn stop(self) -> (RunSummary, serde_json::Value) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !self.actor.is_finished() {
            assert!(
                std::time::Instant::now() < deadline,
                "the actor did not stop"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let summary = self.actor.join().unwrap().unwrap();
        let last = std::fs::read_to_string(self.run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .rfind(|e| e["event"] == "actor")
            .expect("an actor event");
        (summary, last)
    }
}

/// Groups from `source` until `at_least` have come, or `quiet` has passed since the last one
/// (or the start), or two minutes.
fn receive(source: &mut ReplaySource, quiet: Duration, at_least: usize) -> Vec<RolloutGroup> {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut got = Vec::new();
    let mut last = std::time::Instant::now();
    while got.len() < at_least && last.elapsed() < quiet && std::time::Instant::now() < deadline {
        let batch = source.recv(Duration::from_millis(20)).unwrap();
        if !batch.is_empty() {
            last = std::time::Instant::now();
        }
        got.extend(batch.into_iter().map(|r| r.group));
    }
    got
}

/// One line of a math dataset.
fn math_line(id: u64, prompt: &str, answer: u64) -> String {
    format!(
        "{}\n",
        serde_json::json!({"id": id, "prompt": prompt, "answer": answer.to_string()})
    )
}

/// Writes `model.json` (the tests' tiny config) and `math.jsonl` (`lines`) into `base`, and
/// parses a run config of `[model]` (a random init of it), `[replay]` and `rest`.
fn math_run(base: &std::path::Path, lines: &str, rest: &str) -> RunConfig {
    std::fs::write(
        base.join("model.json"),
        serde_json::to_string(&common::tiny_config(128).to_hf_json("float32")).unwrap(),
    )
    .unwrap();
    std::fs::write(base.join("math.jsonl"), lines).unwrap();
    let toml = format!(
        r#"
[model]
init = {{ config = "model.json", seed = 3 }}
[replay]
segment_bytes = 1048576
max_segments = 4
max_inflight = 64
{rest}"#
    );
    RunConfig::parse(&toml, "test.toml", base, &[]).unwrap()
}

/// Runs actor `actor_id` of `config` in `run_dir` until it has written `groups` groups, and
/// reads them back from the replay log (actor name, group).
fn run_and_read(
    run_dir: &std::path::Path,
    config: RunConfig,
    actor_id: u32,
    groups: u64,
) -> (RunSummary, Vec<(String, RolloutGroup)>) {
    let opts = ActorOptions {
        run_dir: run_dir.to_path_buf(),
        actor_id,
        device: Device::Cpu,
        config,
        overrides: RolloutOverrides::default(),
        max_groups: Some(groups),
    };
    let summary = run_actor_with(opts, Arc::new(AtomicBool::new(false))).unwrap();
    let mut source =
        ReplaySource::open(run_dir.join("replay"), ReaderOptions::default(), None).unwrap();
    let mut got = Vec::new();
    for _ in 0..100 {
        got.extend(
            source
                .recv(Duration::from_millis(20))
                .unwrap()
                .into_iter()
                .map(|r| (r.actor, r.group)),
        );
        if got.len() as u64 >= groups {
            break;
        }
    }
    (summary, got)
}
