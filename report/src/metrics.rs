//! Parsing of `metrics.jsonl` into typed events.
//!
//! Every line is parsed on its own: a line that is not a JSON object with a
//! numeric `t`, a string `proc` and a string `event`, or a known event whose
//! fields have the wrong JSON types, is counted as malformed and skipped.
//! Unknown events are kept as [`EventKind::Other`]; unknown fields are ignored.
//! Every field of a known event is optional (`null` or absent reads as `None`),
//! so a writer that omits a field, or writes `null` for a NaN, still parses.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::ReportError;

/// All events of one `metrics.jsonl`, in file order, plus what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Parsed events in the order they appear in the file (not sorted by `t`:
    /// several processes append to the same file).
    pub events: Vec<Event>,
    /// Number of non-empty lines that could not be parsed.
    pub malformed: usize,
    /// 1-based line number of the first malformed line.
    pub first_malformed_line: Option<usize>,
    /// Number of non-empty lines in the file.
    pub lines: usize,
}

/// One line of `metrics.jsonl`.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// 1-based line number in the file.
    pub line: usize,
    /// Unix time in seconds.
    pub t: f64,
    /// Writing process (`"learner"`, `"actor-0"`, `"supervisor"`, ...).
    pub proc_name: String,
    /// The event payload.
    pub kind: EventKind,
}

/// The payload of an event, by its `event` field.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// `learner_step`: one RL optimizer step.
    LearnerStep(LearnerStep),
    /// `sft_step`: one supervised fine-tuning step.
    SftStep(SftStep),
    /// `rm_step`: one reward-model training step.
    RmStep(RmStep),
    /// `rm_done`: reward-model training finished.
    RmDone(RmDone),
    /// `actor`: periodic actor throughput report.
    Actor(ActorEvent),
    /// `process`: supervisor lifecycle event.
    Process(ProcessEvent),
    /// `stage_end`: a cascade stage finished.
    StageEnd(StageEnd),
    /// `run_start`.
    RunStart(RunStart),
    /// `run_end`.
    RunEnd(RunEnd),
    /// Any other event name (kept so callers can count them, otherwise ignored).
    Other(String),
}

/// Per-mode statistics of a `learner_step` (`by_mode.think`, `by_mode.no_think`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ModeStats {
    pub groups: Option<u64>,
    pub reward_mean: Option<f64>,
    pub pass_rate: Option<f64>,
    pub response_len: Option<f64>,
}

/// `learner_step` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct LearnerStep {
    pub stage: Option<String>,
    pub stage_kind: Option<String>,
    pub stage_index: Option<u64>,
    pub stage_step: Option<u64>,
    pub stage_steps: Option<u64>,
    pub step: Option<u64>,
    pub policy_version: Option<u64>,
    pub loss: Option<f64>,
    pub grad_norm: Option<f64>,
    pub lr: Option<f64>,
    pub train_tokens: Option<u64>,
    pub tokens_per_s: Option<f64>,
    pub step_s: Option<f64>,
    pub idle_s: Option<f64>,
    pub reward_mean: Option<f64>,
    pub by_mode: Option<BTreeMap<String, ModeStats>>,
    pub policy_lag: Option<Vec<u64>>,
    pub groups_kept: Option<u64>,
    pub dropped: Option<BTreeMap<String, u64>>,
    pub queue_depth: Option<u64>,
    pub skipped: Option<bool>,
}

/// `sft_step` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct SftStep {
    pub stage: Option<String>,
    pub stage_index: Option<u64>,
    pub stage_step: Option<u64>,
    pub stage_steps: Option<u64>,
    pub step: Option<u64>,
    pub loss: Option<f64>,
    pub lr: Option<f64>,
    pub grad_norm: Option<f64>,
    pub train_tokens: Option<u64>,
    pub tokens_per_s: Option<f64>,
    pub step_s: Option<f64>,
}

/// `rm_step` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RmStep {
    pub step: Option<u64>,
    pub steps: Option<u64>,
    pub loss: Option<f64>,
    pub accuracy: Option<f64>,
}

/// `rm_done` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RmDone {
    pub heldout_accuracy: Option<f64>,
    pub pairs: Option<u64>,
}

/// `actor` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ActorEvent {
    /// Actor id (a number or a string).
    pub actor: Option<serde_json::Value>,
    pub stage: Option<String>,
    pub policy_version: Option<u64>,
    pub groups: Option<u64>,
    /// Cumulative generated tokens.
    pub tokens: Option<u64>,
    /// Generation throughput over the last reporting interval.
    pub tokens_per_s: Option<f64>,
}

/// `process` fields (written by the supervisor).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ProcessEvent {
    /// `"start"`, `"exit"`, `"restart"` or `"give_up"`.
    pub what: Option<String>,
    /// Supervised process name (`"learner"`, `"actor-1"`).
    pub name: Option<String>,
    pub pid: Option<u64>,
    /// Exit status as text (`"killed by signal 9"`).
    pub status: Option<String>,
    /// Restarts of this process so far.
    pub restarts: Option<u64>,
}

/// `stage_end` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct StageEnd {
    pub stage: Option<String>,
    pub stage_index: Option<u64>,
    pub step: Option<u64>,
    pub policy_version: Option<u64>,
}

/// `run_start` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunStart {
    /// Path of the run configuration.
    pub config: Option<String>,
    pub max_staleness: Option<u64>,
    /// Number of actors (or a list describing them).
    pub actors: Option<serde_json::Value>,
}

/// `run_end` fields.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RunEnd {
    pub wall_s: Option<f64>,
    /// `"completed"`, `"stopped"` or `"failed"`.
    pub status: Option<String>,
    pub max_staleness: Option<u64>,
}

#[derive(Deserialize)]
struct Envelope {
    t: f64,
    #[serde(rename = "proc")]
    proc_name: String,
    event: String,
}

/// Parses one line; `None` if it is malformed.
fn parse_line(text: &str, line: usize) -> Option<Event> {
    let value: serde_json::Value = serde_json::from_str(text).ok()?;
    if !value.is_object() {
        return None;
    }
    let env = Envelope::deserialize(&value).ok()?;
    if !env.t.is_finite() {
        return None;
    }
    fn typed<'a, T: Deserialize<'a>>(v: &'a serde_json::Value) -> Option<T> {
        T::deserialize(v).ok()
    }
    let kind = match env.event.as_str() {
        "learner_step" => EventKind::LearnerStep(typed(&value)?),
        "sft_step" => EventKind::SftStep(typed(&value)?),
        "rm_step" => EventKind::RmStep(typed(&value)?),
        "rm_done" => EventKind::RmDone(typed(&value)?),
        "actor" => EventKind::Actor(typed(&value)?),
        "process" => EventKind::Process(typed(&value)?),
        "stage_end" => EventKind::StageEnd(typed(&value)?),
        "run_start" => EventKind::RunStart(typed(&value)?),
        "run_end" => EventKind::RunEnd(typed(&value)?),
        _ => EventKind::Other(env.event),
    };
    Some(Event {
        line,
        t: env.t,
        proc_name: env.proc_name,
        kind,
    })
}

/// Parses the contents of a `metrics.jsonl` file. Never fails: bad lines
/// (including invalid UTF-8 and a torn last line) are counted in
/// [`Metrics::malformed`]. Blank lines are ignored.
pub fn parse_metrics(bytes: &[u8]) -> Metrics {
    let mut metrics = Metrics::default();
    for (i, raw) in bytes.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let text = match std::str::from_utf8(raw) {
            Ok(s) => s.trim(),
            Err(_) => {
                metrics.lines += 1;
                metrics.malformed += 1;
                metrics.first_malformed_line.get_or_insert(line);
                continue;
            }
        };
        if text.is_empty() {
            continue;
        }
        metrics.lines += 1;
        match parse_line(text, line) {
            Some(ev) => metrics.events.push(ev),
            None => {
                metrics.malformed += 1;
                metrics.first_malformed_line.get_or_insert(line);
            }
        }
    }
    metrics
}

/// Reads and parses a `metrics.jsonl` file. Fails only if the file cannot be
/// read (including when it does not exist); content problems are counted,
/// not returned as errors.
pub fn read_metrics(path: impl AsRef<Path>) -> Result<Metrics, ReportError> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|source| ReportError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(parse_metrics(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_malformed_and_keeps_unknown() {
        let text = b"{\"t\":1,\"proc\":\"learner\",\"event\":\"learner_step\",\"step\":1,\"loss\":null,\"extra\":[1]}\n\
                     not json\n\
                     \n\
                     {\"t\":2,\"proc\":\"x\",\"event\":\"mystery\",\"whatever\":3}\n\
                     {\"t\":3,\"proc\":\"learner\",\"event\":\"learner_step\",\"step\":\"two\"}\n\
                     [1,2]\n\
                     {\"t\":4,\"proc\":\"learner\"}\n";
        let m = parse_metrics(text);
        assert_eq!(m.events.len(), 2);
        assert_eq!(m.malformed, 4);
        assert_eq!(m.first_malformed_line, Some(2));
        assert_eq!(m.lines, 6);
        match &m.events[0].kind {
            EventKind::LearnerStep(s) => {
                assert_eq!(s.step, Some(1));
                assert_eq!(s.loss, None);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(m.events[1].kind, EventKind::Other("mystery".into()));
    }

    #[test]
    fn invalid_utf8_is_malformed() {
        let m = parse_metrics(
            b"\xff\xfe\n{\"t\":1,\"proc\":\"a\",\"event\":\"run_end\",\"wall_s\":5.5}",
        );
        assert_eq!(m.malformed, 1);
        assert_eq!(m.first_malformed_line, Some(1));
        assert_eq!(
            m.events[0].kind,
            EventKind::RunEnd(RunEnd {
                wall_s: Some(5.5),
                ..Default::default()
            })
        );
    }
}
