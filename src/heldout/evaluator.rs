//! The evaluator of the held-out table.
//!
//! A row is the scores of one stage-final snapshot on every domain. While the run trains, a
//! background thread ([`Evaluator::start`]) evaluates each stage-final snapshot as soon as the
//! learner publishes it: the rows of the stages already done are ready when training ends, and
//! they use the cores that the actors and the learner leave idle (strictly on-policy the two
//! take turns). [`Evaluator::finish`] evaluates what is left, side by side, and writes the table.
//!
//! Every row is also saved on its own in `RUN_DIR/heldout/` with what it was evaluated under
//! (the eval settings, each domain's held-out set, verifier and token budget), so a resumed run
//! reuses the rows it has instead of evaluating them again.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use cascade_actor::dataset::Dataset;
use cascade_actor::eval::{evaluate, EvalOptions};
use cascade_actor::verifiers::verifier_for;
use cascade_rewards::Verifier;
use cascade_shared::chat::Chat;
use cascade_shared::config::{RunConfig, VerifierConfig, TRAINED_REWARD_MODEL_DIR};
use cascade_shared::data::Kind;
use cascade_shared::metrics::{Eval, HeldoutRow, HeldoutTable, MetricsLog, HELDOUT_FILE};
use cascade_shared::model::load_model;
use cascade_shared::snapshot;
use serde::{Deserialize, Serialize};

use super::{eval_scores, stage_gains};

/// Where the rows are saved one by one.
pub const ROWS_DIR: &str = "heldout";

/// How often the background thread looks for new stage-final snapshots.
const SCAN_EVERY: Duration = Duration::from_secs(2);

/// Prints a line above the run's progress bar.
pub type Printer = Arc<dyn Fn(&str) + Send + Sync>;

struct Domain {
    name: String,
    stage: usize,
    dataset: Dataset,
    verifier: Arc<dyn Verifier>,
}

/// One row to evaluate: the `pos`-th row of the table on the snapshot `version` in `dir`.
#[derive(Debug, Clone)]
struct Job {
    pos: usize,
    version: u64,
    dir: PathBuf,
}

/// A saved row and what it was evaluated under.
#[derive(Serialize, Deserialize)]
struct SavedRow {
    key: serde_json::Value,
    row: HeldoutRow,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Rows queued, running or done, by (position, version).
    claimed: BTreeSet<(usize, u64)>,
    done: BTreeMap<(usize, u64), Result<HeldoutRow, String>>,
    /// Snapshot versions the scan has looked at.
    seen: BTreeSet<u64>,
    /// Built once every reward model they need is complete.
    domains: Option<Arc<Vec<Domain>>>,
    /// No new jobs come: workers leave once the queue is empty.
    finishing: bool,
}

struct Shared {
    config: RunConfig,
    run_dir: PathBuf,
    device: candle_core::Device,
    /// The table's rows: their names and the stage index their stage-final snapshot points at.
    wanted: Vec<(String, u32)>,
    metrics: Arc<MetricsLog>,
    print: Printer,
    state: Mutex<State>,
    wake: Condvar,
    stop: AtomicBool,
}

/// The held-out evaluation of a run.
pub struct Evaluator {
    shared: Arc<Shared>,
    live: Option<JoinHandle<()>>,
}

impl Evaluator {
    /// The evaluator of `config`'s run in `run_dir`; `None` when no RL stage has a held-out set.
    pub fn new(
        config: &RunConfig,
        run_dir: &Path,
        metrics: Arc<MetricsLog>,
        print: Printer,
    ) -> anyhow::Result<Option<Evaluator>> {
        let device = cascade_shared::device::parse_device(&config.devices.learner.to_string())
            .map_err(|e| anyhow::anyhow!(e))?;
        if domain_stages(config).is_empty() {
            return Ok(None);
        }
        let first_rl = config.stages.iter().position(|s| s.is_rl()).unwrap_or(0) as u32;
        let mut wanted: Vec<(String, u32)> = vec![("sft".to_string(), first_rl)];
        for (i, s) in config.stages.iter().enumerate() {
            if s.is_rl() {
                wanted.push((s.name.clone(), i as u32 + 1));
            }
        }
        Ok(Some(Evaluator {
            shared: Arc::new(Shared {
                config: config.clone(),
                run_dir: run_dir.to_path_buf(),
                device,
                wanted,
                metrics,
                print,
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
                stop: AtomicBool::new(false),
            }),
            live: None,
        }))
    }

    /// Starts evaluating each stage-final snapshot as it is published.
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.live.is_none() {
            let shared = self.shared.clone();
            self.live = Some(
                std::thread::Builder::new()
                    .name("heldout".into())
                    .spawn(move || shared.live())
                    .context("starting the held-out evaluation thread")?,
            );
        }
        Ok(())
    }

    /// Evaluates the rows not evaluated yet (with the background thread, if it runs, and as
    /// many more workers as there are cores, up to 4), then writes and returns the table.
    pub fn finish(mut self) -> anyhow::Result<HeldoutTable> {
        let shared = &self.shared;
        let finals = stage_final_snapshots(&shared.run_dir)?;
        let mut jobs = Vec::new();
        for (pos, (after_stage, index)) in shared.wanted.iter().enumerate() {
            match finals.get(index) {
                Some((version, dir)) => jobs.push(Job {
                    pos,
                    version: *version,
                    dir: dir.clone(),
                }),
                None => {
                    tracing::warn!("held-out table: no stage-final snapshot after {after_stage}")
                }
            }
        }
        let pending = {
            let mut st = shared.lock();
            st.finishing = true;
            for job in &jobs {
                let at = (job.pos, job.version);
                // A row that failed during training gets one more try.
                if st.claimed.insert(at) || matches!(st.done.get(&at), Some(Err(_))) {
                    st.done.remove(&at);
                    st.queue.push_back(job.clone());
                }
            }
            st.queue.len()
        };
        shared.wake.notify_all();
        // Rows are independent: decoding a small model is mostly per-op overhead, so two rows
        // side by side use two cores where one row would leave the second idle.
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 4);
        let extra = cores
            .saturating_sub(usize::from(self.live.is_some()))
            .min(pending);
        std::thread::scope(|scope| {
            for _ in 0..extra {
                scope.spawn(|| while shared.work_one() {});
            }
        });
        if let Some(live) = self.live.take() {
            live.join()
                .map_err(|_| anyhow::anyhow!("the held-out evaluation thread panicked"))?;
        }
        let mut rows = Vec::new();
        {
            let st = shared.lock();
            for job in &jobs {
                match st.done.get(&(job.pos, job.version)) {
                    Some(Ok(row)) => rows.push(row.clone()),
                    Some(Err(e)) => {
                        return Err(anyhow::anyhow!("{e}")).with_context(|| {
                            format!(
                                "the held-out row after {} ({})",
                                shared.wanted[job.pos].0,
                                job.dir.display()
                            )
                        })
                    }
                    None => anyhow::bail!(
                        "the held-out row after {} was not evaluated",
                        shared.wanted[job.pos].0
                    ),
                }
            }
        }
        let kinds: BTreeMap<String, String> = shared
            .config
            .stages
            .iter()
            .filter(|s| s.is_rl())
            .map(|s| (s.name.clone(), s.kind.as_str().to_string()))
            .collect();
        let table = HeldoutTable {
            domains: domain_names(&shared.config),
            gains: stage_gains(&rows, &kinds),
            rows,
        };
        snapshot::durable::replace_file(
            &shared.run_dir.join(HELDOUT_FILE),
            &serde_json::to_vec_pretty(&table)?,
        )?;
        Ok(table)
    }
}

impl Drop for Evaluator {
    fn drop(&mut self) {
        // A run that stops early leaves the thread to end after its current row (saved, so a
        // resumed run does not evaluate it again); the process usually exits first.
        self.shared.stop.store(true, Ordering::Relaxed);
        self.shared.wake.notify_all();
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The background thread: evaluates queued rows, looks for new stage-final snapshots when
    /// none is queued, and leaves when told to stop or once the end's rows are all taken.
    fn live(&self) {
        let mut last_scan: Option<Instant> = None;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            if self.work_one() {
                continue;
            }
            if self.lock().finishing {
                return;
            }
            if last_scan.is_none_or(|t| t.elapsed() >= SCAN_EVERY) {
                self.scan();
                last_scan = Some(Instant::now());
                continue;
            }
            let st = self.lock();
            if st.queue.is_empty() && !st.finishing && !self.stop.load(Ordering::Relaxed) {
                drop(self.wake.wait_timeout(st, SCAN_EVERY));
            }
        }
    }

    /// Queues the rows of stage-final snapshots published since the last scan. A row waits
    /// while a reward model its domains need is still being trained.
    fn scan(&self) {
        if !self.reward_models_ready() {
            return;
        }
        let dir = self.run_dir.join("snapshots");
        let Ok(versions) = snapshot::list_versions(&dir) else {
            return;
        };
        let mut st = self.lock();
        // Oldest first: rows come out in the table's order.
        for (version, path) in versions.into_iter().rev() {
            if st.seen.contains(&version) {
                continue;
            }
            // A snapshot retention deletes under us, or one that does not read: looked at once;
            // the end's scan reads every snapshot again and warns about bad ones.
            st.seen.insert(version);
            let Ok(peek) = snapshot::peek_snapshot(&path) else {
                continue;
            };
            if !peek.info.manifest.stage_final {
                continue;
            }
            let index = peek.state.stage_index;
            for (pos, _) in self.wanted.iter().enumerate().filter(|w| w.1 .1 == index) {
                if st.claimed.insert((pos, version)) {
                    st.queue.push_back(Job {
                        pos,
                        version,
                        dir: path.clone(),
                    });
                }
            }
        }
    }

    /// Whether the reward models the domains' verifiers load are complete (the learner trains
    /// `[reward_model]` before the first stage that uses it).
    fn reward_models_ready(&self) -> bool {
        let trained = self.run_dir.join(TRAINED_REWARD_MODEL_DIR);
        domain_stages(&self.config).into_iter().all(|i| {
            self.config.reward_model_dir(i, &self.run_dir).as_ref() != Some(&trained)
                || cascade_learner::reward_train::is_complete(&trained)
        })
    }

    /// Takes the next queued row and evaluates it; `false` when none is queued.
    fn work_one(&self) -> bool {
        let Some(job) = self.lock().queue.pop_front() else {
            return false;
        };
        let t0 = Instant::now();
        let result = self.row(&job);
        let (after_stage, _) = &self.wanted[job.pos];
        match &result {
            Ok((row, false)) => {
                // In the table's column order.
                let scores: Vec<String> = domain_names(&self.config)
                    .iter()
                    .filter_map(|d| row.scores.get(d).map(|s| format!("{d} {s:.3}")))
                    .collect();
                (self.print)(&format!(
                    "held-out after {after_stage} (v{}, {:.0} s): {}",
                    job.version,
                    t0.elapsed().as_secs_f64(),
                    scores.join(", ")
                ));
            }
            Ok((_, true)) => {}
            Err(e) => (self.print)(&format!(
                "warning: the held-out row after {after_stage} failed: {e:#}"
            )),
        }
        self.lock().done.insert(
            (job.pos, job.version),
            result.map(|r| r.0).map_err(|e| format!("{e:#}")),
        );
        true
    }

    /// The row of `job`, saved earlier (`true`) or evaluated now and saved.
    fn row(&self, job: &Job) -> anyhow::Result<(HeldoutRow, bool)> {
        let domains = self.domains()?;
        let key = self.key(&domains);
        let path = self.run_dir.join(ROWS_DIR).join(format!(
            "row{:02}-{}.json",
            job.pos,
            snapshot::version_dir_name(job.version)
        ));
        if let Some(saved) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<SavedRow>(&b).ok())
        {
            if saved.key == key {
                return Ok((saved.row, true));
            }
        }
        snapshot::verify(&job.dir)
            .with_context(|| format!("the snapshot {}", job.dir.display()))?;
        let row = evaluate_row(
            &self.config,
            &domains,
            &self.wanted[job.pos].0,
            job.version,
            &job.dir,
            &self.device,
            &self.metrics,
        )?;
        std::fs::create_dir_all(self.run_dir.join(ROWS_DIR))?;
        snapshot::durable::replace_file(
            &path,
            &serde_json::to_vec_pretty(&SavedRow {
                key,
                row: row.clone(),
            })?,
        )?;
        Ok((row, false))
    }

    /// The domains, built on first use.
    fn domains(&self) -> anyhow::Result<Arc<Vec<Domain>>> {
        if let Some(d) = &self.lock().domains {
            return Ok(d.clone());
        }
        let built = Arc::new(build_domains(&self.config, &self.run_dir, &self.device)?);
        Ok(self.lock().domains.get_or_insert(built).clone())
    }

    /// What a row depends on besides its snapshot: a saved row is reused only under the same.
    fn key(&self, domains: &[Domain]) -> serde_json::Value {
        let c = &self.config;
        let per_domain: Vec<serde_json::Value> = domains
            .iter()
            .map(|d| {
                let stage = &c.stages[d.stage];
                serde_json::json!({
                    "name": d.name,
                    "stage": stage.name,
                    "heldout": stage.heldout,
                    "prompts": d.dataset.len(),
                    "verifier": stage.verifier,
                    "max_new_tokens": stage.max_response_tokens_at(stage.steps, c.actor.max_new_tokens),
                    "mode_mix": stage.mode_mix,
                    "gen_batch": gen_batch(c, d.stage),
                })
            })
            .collect();
        let e = &c.eval;
        serde_json::json!({
            "samples": e.samples,
            "temperature": e.temperature,
            "top_p": e.top_p,
            "max_prompts": e.max_prompts,
            "seed": e.seed,
            "domains": per_domain,
        })
    }
}

/// The stages that give the table its domains, in its column order: the first RL stage of each
/// kind with a held-out set.
fn domain_stages(config: &RunConfig) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    for (i, s) in config.stages.iter().enumerate() {
        if s.is_rl() && s.heldout.is_some() && !out.iter().any(|&j| config.stages[j].kind == s.kind)
        {
            out.push(i);
        }
    }
    out
}

/// The domains' names, in the table's order.
fn domain_names(config: &RunConfig) -> Vec<String> {
    domain_stages(config)
        .into_iter()
        .map(|i| config.stages[i].kind.as_str().to_string())
        .collect()
}

fn build_domains(
    config: &RunConfig,
    run_dir: &Path,
    device: &candle_core::Device,
) -> anyhow::Result<Vec<Domain>> {
    let mut domains: Vec<Domain> = Vec::new();
    for i in domain_stages(config) {
        let stage = &config.stages[i];
        let Some(heldout) = &stage.heldout else {
            continue;
        };
        let rm_dir = config.reward_model_dir(i, run_dir);
        let judge = stage.verifier.swe_judge.as_ref().map(|p| config.resolve(p));
        // Each column is its domain's own score: a stage that blends the reward model into its
        // reward (`rm_weight`) is still reported by its rule verifier (the RM score has its own
        // column, rlhf's).
        let own = VerifierConfig {
            rm_weight: 0.0,
            ..stage.verifier.clone()
        };
        let verifier = verifier_for(
            stage.kind,
            &own,
            rm_dir.as_deref(),
            judge.as_deref(),
            device,
        )
        .with_context(|| format!("the verifier of stage {}", stage.name))?;
        domains.push(Domain {
            name: stage.kind.as_str().to_string(),
            stage: i,
            dataset: Dataset::open(&config.data_spec(heldout, Kind::Rl, Some(stage.kind))?)?,
            verifier,
        });
    }
    Ok(domains)
}

/// Rows decoded together for stage `index`'s domain.
fn gen_batch(config: &RunConfig, index: usize) -> usize {
    (config.actor.gen_batch * config.stages[index].group_size).clamp(1, 64)
}

/// Stage-final snapshots by the stage index they point at (the stage after the one they end).
/// Snapshots are told apart by their manifests; only stage-final ones are verified whole.
fn stage_final_snapshots(run_dir: &Path) -> anyhow::Result<BTreeMap<u32, (u64, PathBuf)>> {
    let dir = run_dir.join("snapshots");
    let mut out: BTreeMap<u32, (u64, PathBuf)> = BTreeMap::new();
    for (version, path) in
        snapshot::list_versions(&dir).with_context(|| format!("reading {}", dir.display()))?
    {
        let loaded = match snapshot::peek_snapshot(&path) {
            Ok(p) if !p.info.manifest.stage_final => continue,
            Ok(_) => snapshot::load_snapshot(&path),
            Err(e) => Err(e),
        };
        let loaded = match loaded {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!("held-out table: skipping {}: {e}", path.display());
                continue;
            }
        };
        // The newest snapshot that points at a stage wins (a resumed run may repeat one).
        let e = out
            .entry(loaded.state.stage_index)
            .or_insert((version, path.clone()));
        if version > e.0 {
            *e = (version, path);
        }
    }
    Ok(out)
}

/// Scores one stage-final snapshot on every domain's held-out set.
fn evaluate_row(
    config: &RunConfig,
    domains: &[Domain],
    after_stage: &str,
    version: u64,
    dir: &Path,
    device: &candle_core::Device,
    metrics: &MetricsLog,
) -> anyhow::Result<HeldoutRow> {
    let model = load_model(dir, device).with_context(|| format!("loading {}", dir.display()))?;
    let chat = Chat::from_dir(dir)?;
    let mut scores = BTreeMap::new();
    let mut stderr = BTreeMap::new();
    let mut prompt_scores = BTreeMap::new();
    for d in domains {
        let stage = &config.stages[d.stage];
        let result = evaluate(
            model.clone(),
            &chat,
            &d.dataset,
            d.verifier.clone(),
            &EvalOptions {
                samples: config.eval.samples,
                temperature: config.eval.temperature,
                top_p: config.eval.top_p,
                max_new_tokens: stage
                    .max_response_tokens_at(stage.steps, config.actor.max_new_tokens),
                mode: None,
                mode_mix: stage.mode_mix,
                seed: config.eval.seed,
                gen_batch: gen_batch(config, d.stage),
                max_prompts: config.eval.max_prompts,
            },
        )?;
        metrics.record(&Eval {
            after_stage: Some(after_stage.to_string()),
            domain: Some(d.name.clone()),
            policy_version: Some(version),
            score: Some(result.all.mean_reward),
            score_se: Some(result.all.mean_reward_se),
            pass_at_1: Some(result.all.pass_at_1),
            prompts: Some(result.all.prompts as u64),
            by_mode: Some(
                result
                    .by_mode
                    .iter()
                    .map(|(mode, s)| (mode.clone(), eval_scores(s)))
                    .collect(),
            ),
        });
        scores.insert(d.name.clone(), result.all.mean_reward);
        stderr.insert(d.name.clone(), result.all.mean_reward_se);
        prompt_scores.insert(d.name.clone(), result.prompt_scores);
    }
    Ok(HeldoutRow {
        after_stage: after_stage.to_string(),
        scores,
        policy_version: Some(version),
        stderr,
        prompt_scores,
    })
}
