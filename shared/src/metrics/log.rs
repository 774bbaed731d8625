//! The writer of `metrics.jsonl`: one [`MetricsLog`] per process, appending one line per event
//! (the envelope `t`, `proc`, `event` plus the event's fields; see the [module docs](super)).

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

use super::events::MetricsEvent;

/// File name of the metrics log inside a run directory.
pub const METRICS_FILE: &str = "metrics.jsonl";

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// An appender of metric events for one process.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
    proc_name: String,
    file: Option<Mutex<File>>,
}

impl MetricsLog {
    /// Opens (creating) `path` for appending; events carry `"proc": proc_name`.
    pub fn open(path: impl AsRef<Path>, proc_name: impl Into<String>) -> std::io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        Ok(MetricsLog {
            path,
            proc_name: proc_name.into(),
            file: Some(Mutex::new(file)),
        })
    }

    /// A log that drops every event (tests, standalone tools).
    pub fn disabled() -> Self {
        MetricsLog {
            path: PathBuf::new(),
            proc_name: String::new(),
            file: None,
        }
    }

    /// Appends one typed event under its name ([`MetricsEvent::NAME`]).
    pub fn record<E: MetricsEvent>(&self, event: &E) {
        if self.file.is_none() {
            return;
        }
        match serde_json::to_value(event) {
            Ok(fields) => self.emit(E::NAME, fields),
            // Unreachable for the event types (plain structs of numbers, strings and maps with
            // string keys); a metrics line is never worth stopping a run for.
            Err(e) => tracing::warn!(event = E::NAME, "metrics event not serialisable: {e}"),
        }
    }

    /// Appends one untyped event. `fields` must be a JSON object (anything else is stored as
    /// `"value"`). Prefer [`MetricsLog::record`] with the event's type.
    pub fn emit(&self, event: &str, fields: Value) {
        let Some(file) = &self.file else { return };
        let mut obj = Map::new();
        obj.insert("t".into(), Value::from(unix_now()));
        obj.insert("proc".into(), Value::from(self.proc_name.clone()));
        obj.insert("event".into(), Value::from(event));
        match fields {
            Value::Object(map) => obj.extend(map),
            Value::Null => {}
            other => {
                obj.insert("value".into(), other);
            }
        }
        let mut line = Value::Object(obj).to_string();
        line.push('\n');
        let mut guard = match file.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Err(e) = guard.write_all(line.as_bytes()) {
            tracing::warn!(path = %self.path.display(), "metrics line dropped: {e}");
        }
    }
}

/// Reads every well-formed line of a metrics file (malformed lines are skipped).
pub fn read_events(path: impl AsRef<Path>) -> std::io::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)?;
    Ok(text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(Value::is_object)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_append_from_two_writers_without_interleaving() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(METRICS_FILE);
        let a = MetricsLog::open(&path, "learner").unwrap();
        let b = MetricsLog::open(&path, "actor-0").unwrap();
        for i in 0..50 {
            a.emit("learner_step", serde_json::json!({ "step": i }));
            b.emit(
                "actor",
                serde_json::json!({ "groups": i, "text": "x".repeat(1000) }),
            );
        }
        let events = read_events(&path).unwrap();
        assert_eq!(events.len(), 100);
        assert!(events.iter().all(|e| e["t"].as_f64().unwrap() > 0.0));
        let learner = events.iter().filter(|e| e["proc"] == "learner").count();
        assert_eq!(learner, 50);
        MetricsLog::disabled().emit("x", Value::Null);
    }
}
