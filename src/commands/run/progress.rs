//! The live view of a run: follows `metrics.jsonl` as the children append to it and shows the
//! current stage's progress bar (on a terminal) or a line every 10 s (otherwise), plus stage
//! ends, the reward model's accuracy and actor restarts.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cascade_shared::metrics::{Event, EventKind, LearnerStep, SftStep, METRICS_FILE};
use indicatif::{ProgressBar, ProgressStyle};

/// Live view of the run from `metrics.jsonl`.
pub(super) struct Progress {
    file: Option<File>,
    path: PathBuf,
    offset: u64,
    /// Complete lines read so far (the next line's number is `lines + 1`).
    lines: usize,
    partial: String,
    bar: ProgressBar,
    stage: Option<(usize, String)>,
    actor_rate: BTreeMap<String, f64>,
    last_plain: Instant,
    tty: bool,
    last_line: String,
    printed: String,
}

/// What the bar shows of a step, RL or SFT.
struct StepView<'a> {
    stage: Option<&'a str>,
    stage_index: Option<u64>,
    stage_step: Option<u64>,
    stage_steps: Option<u64>,
}

impl<'a> From<&'a LearnerStep> for StepView<'a> {
    fn from(s: &'a LearnerStep) -> Self {
        StepView {
            stage: s.stage.as_deref(),
            stage_index: s.stage_index,
            stage_step: s.stage_step,
            stage_steps: s.stage_steps,
        }
    }
}

impl<'a> From<&'a SftStep> for StepView<'a> {
    fn from(s: &'a SftStep) -> Self {
        StepView {
            stage: s.stage.as_deref(),
            stage_index: s.stage_index,
            stage_step: s.stage_step,
            stage_steps: s.stage_steps,
        }
    }
}

impl Progress {
    pub(super) fn new(run_dir: &Path) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = if tty {
            ProgressBar::new(1)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>8} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}",
            )
            .expect("a valid template")
            .progress_chars("=> "),
        );
        Progress {
            file: None,
            path: run_dir.join(METRICS_FILE),
            offset: 0,
            lines: 0,
            partial: String::new(),
            bar,
            stage: None,
            actor_rate: BTreeMap::new(),
            last_plain: Instant::now(),
            tty,
            last_line: String::new(),
            printed: String::new(),
        }
    }

    /// Reads what was appended since the last call and shows it.
    pub(super) fn update(&mut self) {
        if self.file.is_none() {
            self.file = File::open(&self.path).ok();
        }
        let Some(f) = self.file.as_mut() else { return };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut buf = String::new();
        if let Ok(n) = f.read_to_string(&mut buf) {
            self.offset += n as u64;
        }
        self.partial.push_str(&buf);
        let Some(end) = self.partial.rfind('\n') else {
            return;
        };
        let lines: Vec<String> = self.partial[..end].lines().map(str::to_string).collect();
        self.partial = self.partial[end + 1..].to_string();
        for line in lines {
            self.lines += 1;
            // Malformed lines are the report's to count; the live view skips them.
            if let Some(event) = Event::parse_line(&line, self.lines) {
                self.event(&event);
            }
        }
        if !self.tty
            && self.last_plain.elapsed() > Duration::from_secs(10)
            && !self.last_line.is_empty()
        {
            eprintln!("{}", self.last_line);
            self.last_plain = Instant::now();
        }
    }

    fn event(&mut self, event: &Event) {
        match &event.kind {
            EventKind::SftStep(s) => {
                let tok = s.tokens_per_s.unwrap_or(0.0);
                let msg = format!(
                    "loss {:.3} | learner {:.0} tok/s",
                    s.loss.unwrap_or(f64::NAN),
                    tok
                );
                self.step(s.into(), msg);
            }
            EventKind::LearnerStep(s) => {
                let tok = s.tokens_per_s.unwrap_or(0.0);
                let mode = |m: &str| match s.by_mode.as_ref().and_then(|b| b.get(m)) {
                    None => "-".to_string(),
                    Some(b) => format!(
                        "{:.2}/{:.0}%",
                        b.reward_mean.unwrap_or(f64::NAN),
                        100.0 * b.pass_rate.unwrap_or(f64::NAN)
                    ),
                };
                let lags = s.policy_lag.as_deref().unwrap_or_default();
                let lag = lags.iter().map(|&l| l as f64).sum::<f64>() / lags.len().max(1) as f64;
                let msg = format!(
                    "reward {:.3} | think {} no_think {} | learner {:.0} tok/s, actors {:.0} tok/s | lag {:.1} | queue {}",
                    s.reward_mean.unwrap_or(f64::NAN),
                    mode("think"),
                    mode("no_think"),
                    tok,
                    self.actor_rate.values().sum::<f64>(),
                    lag,
                    s.queue_depth.unwrap_or(0)
                );
                self.step(s.into(), msg);
            }
            EventKind::Actor(a) => {
                if let Some(r) = a.tokens_per_s {
                    self.actor_rate.insert(event.proc_name.clone(), r);
                }
            }
            EventKind::StageEnd(s) => {
                let line = format!(
                    "stage {} done at step {}",
                    s.stage.as_deref().unwrap_or("?"),
                    s.step.unwrap_or(0)
                );
                self.bar.println(&line);
                if !self.tty {
                    if self.last_line != self.printed {
                        eprintln!("{}", self.last_line);
                        self.printed = self.last_line.clone();
                    }
                    eprintln!("{line}");
                }
            }
            EventKind::RmDone(d) => {
                let mut line = format!(
                    "reward model trained: held-out pairwise accuracy {:.3}",
                    d.heldout_accuracy.unwrap_or(f64::NAN)
                );
                if let Some(m) = d.heldout_prompt_match {
                    line.push_str(&format!(", prompt match {m:.3} (0.5: prompt ignored)"));
                }
                self.println(&line);
            }
            EventKind::Process(p) => {
                let what = match p.what.as_deref() {
                    Some("restart") => "restarted",
                    Some("give_up") => "given up",
                    _ => return,
                };
                let line = format!(
                    "{} {what} ({}), restarts {}",
                    p.name.as_deref().unwrap_or("?"),
                    p.status.as_deref().unwrap_or(""),
                    // As the untyped view printed a missing count.
                    p.restarts
                        .map_or_else(|| "null".to_string(), |n| n.to_string())
                );
                self.println(&line);
            }
            _ => {}
        }
    }

    /// Moves the bar to a step of the current stage (a new stage resets it) with `msg`.
    fn step(&mut self, view: StepView<'_>, msg: String) {
        let index = view.stage_index.unwrap_or(0) as usize;
        let name = view.stage.unwrap_or("?").to_string();
        if self.stage.as_ref().map(|s| s.0) != Some(index) {
            self.bar.set_length(view.stage_steps.unwrap_or(1));
            self.bar.reset();
            self.bar.set_prefix(name.clone());
            self.stage = Some((index, name.clone()));
        }
        self.bar.set_position(view.stage_step.unwrap_or(0));
        self.last_line = format!(
            "{name} {}/{}: {msg}",
            view.stage_step.unwrap_or(0),
            view.stage_steps.unwrap_or(0)
        );
        self.bar.set_message(msg);
    }

    /// A line above the bar (and on stderr without a terminal).
    fn println(&self, line: &str) {
        self.bar.println(line);
        if !self.tty {
            eprintln!("{line}");
        }
    }

    /// Prints lines for another thread, as [`Self::println`].
    pub(super) fn printer(&self) -> crate::heldout::Printer {
        let bar = self.bar.clone();
        let tty = self.tty;
        std::sync::Arc::new(move |line: &str| {
            bar.println(line);
            if !tty {
                eprintln!("{line}");
            }
        })
    }

    pub(super) fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
