//! Reading `metrics.jsonl` into typed events.
//!
//! Every line is parsed on its own: a line that is not a JSON object with a numeric `t`, a
//! string `proc` and a string `event`, or a known event whose fields have the wrong JSON types,
//! is counted as malformed and skipped. Unknown events are kept as [`EventKind::Other`];
//! unknown fields are ignored.

use serde::Deserialize;

use super::events::*;

/// All events of one `metrics.jsonl`, in file order, plus what was skipped.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metrics {
    /// Parsed events in the order they appear in the file (not sorted by `t`: several
    /// processes append to the same file).
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
// `learner_step` is the largest and, with `actor`, the commonest event of a run: boxing it
// would add an allocation per line to save space only on the rarer small events.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// `run_start`.
    RunStart(RunStart),
    /// `process`: supervisor lifecycle event.
    Process(ProcessEvent),
    /// `resume`: the learner continues from a snapshot.
    Resume(Resume),
    /// `rm_step`: one reward-model training step.
    RmStep(RmStep),
    /// `rm_done`: reward-model training finished.
    RmDone(RmDone),
    /// `sft_step`: one supervised fine-tuning step.
    SftStep(SftStep),
    /// `learner_step`: one RL optimizer step.
    LearnerStep(LearnerStep),
    /// `warning`: groups with nothing to learn from.
    Warning(Warning),
    /// `replay_error`: an undecodable replay record skipped.
    ReplayError(ReplayErrorEvent),
    /// `replay_skip`: replay records lost before a restart.
    ReplaySkip(ReplaySkip),
    /// `snapshot`: a snapshot published.
    Snapshot(Snapshot),
    /// `stage_end`: a cascade stage finished.
    StageEnd(StageEnd),
    /// `learner_exit`: the learner stopped.
    LearnerExit(LearnerExit),
    /// `actor`: periodic actor throughput report.
    Actor(ActorEvent),
    /// `eval`: one held-out score.
    Eval(Eval),
    /// `run_end`.
    RunEnd(RunEnd),
    /// Any other event name (kept so callers can count them, otherwise ignored).
    Other(String),
}

impl EventKind {
    /// The fields of event `name` (the line's object, envelope included: unknown fields are
    /// ignored); `Other(name)` for an unknown name, an error for a known event whose fields
    /// have the wrong JSON types.
    pub fn from_fields(name: &str, fields: &serde_json::Value) -> serde_json::Result<Self> {
        fn typed<E: MetricsEvent>(v: &serde_json::Value) -> serde_json::Result<E> {
            E::deserialize(v)
        }
        Ok(match name {
            RunStart::NAME => EventKind::RunStart(typed(fields)?),
            ProcessEvent::NAME => EventKind::Process(typed(fields)?),
            Resume::NAME => EventKind::Resume(typed(fields)?),
            RmStep::NAME => EventKind::RmStep(typed(fields)?),
            RmDone::NAME => EventKind::RmDone(typed(fields)?),
            SftStep::NAME => EventKind::SftStep(typed(fields)?),
            LearnerStep::NAME => EventKind::LearnerStep(typed(fields)?),
            Warning::NAME => EventKind::Warning(typed(fields)?),
            ReplayErrorEvent::NAME => EventKind::ReplayError(typed(fields)?),
            ReplaySkip::NAME => EventKind::ReplaySkip(typed(fields)?),
            Snapshot::NAME => EventKind::Snapshot(typed(fields)?),
            StageEnd::NAME => EventKind::StageEnd(typed(fields)?),
            LearnerExit::NAME => EventKind::LearnerExit(typed(fields)?),
            ActorEvent::NAME => EventKind::Actor(typed(fields)?),
            Eval::NAME => EventKind::Eval(typed(fields)?),
            RunEnd::NAME => EventKind::RunEnd(typed(fields)?),
            other => EventKind::Other(other.to_string()),
        })
    }
}

/// The fields every line has.
#[derive(Deserialize)]
struct Envelope {
    t: f64,
    #[serde(rename = "proc")]
    proc_name: String,
    event: String,
}

impl Event {
    /// Parses one line (without its newline; `line` is its 1-based number); `None` if it is
    /// malformed.
    pub fn parse_line(text: &str, line: usize) -> Option<Event> {
        let value: serde_json::Value = serde_json::from_str(text).ok()?;
        if !value.is_object() {
            return None;
        }
        let env = Envelope::deserialize(&value).ok()?;
        if !env.t.is_finite() {
            return None;
        }
        let kind = EventKind::from_fields(&env.event, &value).ok()?;
        Some(Event {
            line,
            t: env.t,
            proc_name: env.proc_name,
            kind,
        })
    }
}

/// Parses the contents of a `metrics.jsonl` file. Never fails: bad lines (including invalid
/// UTF-8 and a torn last line) are counted in [`Metrics::malformed`]. Blank lines are ignored.
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
        match Event::parse_line(text, line) {
            Some(ev) => metrics.events.push(ev),
            None => {
                metrics.malformed += 1;
                metrics.first_malformed_line.get_or_insert(line);
            }
        }
    }
    metrics
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsLog;

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

    /// A typed record writes the line `emit` with `json!` wrote (same keys, `null` for a
    /// missing value the writer always writes, nothing for one it leaves out) and reads back
    /// as the same value.
    #[test]
    fn recorded_events_have_the_json_shape_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.jsonl");
        let log = MetricsLog::open(&path, "supervisor").unwrap();
        let start = ProcessEvent {
            what: Some("start".into()),
            name: Some("actor-0".into()),
            pid: Some(42),
            restarts: Some(0),
            ..Default::default()
        };
        let end = RunEnd {
            wall_s: Some(1.5),
            status: Some("stopped".into()),
            max_staleness: Some(2),
            ..Default::default()
        };
        let step = SftStep {
            step: Some(3),
            grad_norm: None,
            ..Default::default()
        };
        log.record(&start);
        log.record(&end);
        log.record(&step);
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let keys = |v: &serde_json::Value| -> Vec<String> {
            v.as_object().unwrap().keys().cloned().collect()
        };
        assert_eq!(
            keys(&lines[0]),
            ["event", "name", "pid", "proc", "restarts", "t", "what"]
        );
        assert_eq!(
            keys(&lines[1]),
            ["event", "max_staleness", "proc", "status", "t", "wall_s"]
        );
        assert_eq!(lines[2]["grad_norm"], serde_json::Value::Null);
        assert!(lines[2].as_object().unwrap().contains_key("grad_norm"));
        let m = parse_metrics(text.as_bytes());
        assert_eq!(m.malformed, 0);
        assert_eq!(m.events[0].kind, EventKind::Process(start));
        assert_eq!(m.events[0].proc_name, "supervisor");
        assert_eq!(m.events[1].kind, EventKind::RunEnd(end));
        assert_eq!(m.events[2].kind, EventKind::SftStep(step));
    }
}
