//! The JSONL scoring driver behind `cascade score`: one JSON line in, one JSON line out, in
//! input order, with up to `workers` verifications running at once.
//!
//! Input lines are `{"domain": "...", "response": "...", ...reference fields}`. Output lines are
//! `{"line": n, "domain": d, "reward": r, "details": {...}}`, or `{"line": n, "domain": d|null,
//! "reward": null, "error": "..."}` for a line that could not be scored (malformed JSON, unknown
//! domain, bad reference data); the other lines are still scored.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::panic::{catch_unwind, AssertUnwindSafe};

use serde_json::{json, Value};

use cascade_shared::chat::split_response;

use crate::Verifier;

/// Domain name → verifier, plus domains known to be unavailable and why.
#[derive(Default)]
pub struct Scorer {
    verifiers: HashMap<String, Box<dyn Verifier>>,
    unavailable: HashMap<String, String>,
}

impl std::fmt::Debug for Scorer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut names: Vec<&String> = self.verifiers.keys().collect();
        names.sort();
        f.debug_struct("Scorer")
            .field("domains", &names)
            .field("unavailable", &self.unavailable)
            .finish()
    }
}

/// Counts of one scoring pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScoreSummary {
    /// Lines that got a reward.
    pub scored: usize,
    /// Lines reported as errors.
    pub errors: usize,
}

impl Scorer {
    /// An empty scorer; add domains with [`Scorer::register`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Routes lines of `domain` to `verifier` (replacing any earlier registration).
    pub fn register(&mut self, domain: &str, verifier: Box<dyn Verifier>) {
        self.unavailable.remove(domain);
        self.verifiers.insert(domain.to_string(), verifier);
    }

    /// Declares `domain` known but unavailable in this run; its lines get `reason` as error.
    pub fn mark_unavailable(&mut self, domain: &str, reason: impl Into<String>) {
        self.verifiers.remove(domain);
        self.unavailable.insert(domain.to_string(), reason.into());
    }

    /// Scores one input line (1-based `line`) into its output object.
    pub fn score_line(&self, line: usize, text: &str) -> Value {
        let error = |domain: Value, msg: String| json!({"line": line, "domain": domain, "reward": null, "error": msg});
        let obj: Value = match serde_json::from_str(text) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => return error(Value::Null, "line is not a JSON object".into()),
            Err(e) => return error(Value::Null, format!("malformed JSON: {e}")),
        };
        let Some(domain) = obj.get("domain").and_then(Value::as_str) else {
            return error(Value::Null, "missing string field `domain`".into());
        };
        let Some(response) = obj.get("response").and_then(Value::as_str) else {
            return error(json!(domain), "missing string field `response`".into());
        };
        let Some(verifier) = self.verifiers.get(domain) else {
            let msg = match self.unavailable.get(domain) {
                Some(reason) => reason.clone(),
                None => format!("unknown domain `{domain}`"),
            };
            return error(json!(domain), msg);
        };
        let split = split_response(response);
        match catch_unwind(AssertUnwindSafe(|| verifier.verify(&obj, &split))) {
            Ok(Ok(r)) => {
                json!({"line": line, "domain": domain, "reward": r.reward, "details": r.details})
            }
            Ok(Err(e)) => error(json!(domain), e.to_string()),
            Err(_) => error(
                json!(domain),
                format!("verifier `{}` panicked", verifier.name()),
            ),
        }
    }

    /// Reads JSONL from `input` and writes one output line per non-blank input line, in input
    /// order, running up to `workers` verifications at once. At most `4 × workers` lines are
    /// in flight, so memory stays bounded however slow one line is.
    pub fn score_stream<R: BufRead, W: Write>(
        &self,
        input: R,
        mut output: W,
        workers: usize,
    ) -> std::io::Result<ScoreSummary> {
        let workers = workers.max(1);
        let window = 4 * workers;
        let (job_tx, job_rx) = crossbeam::channel::bounded::<(usize, String)>(window);
        let (done_tx, done_rx) = crossbeam::channel::bounded::<(usize, Value)>(window);
        let mut summary = ScoreSummary::default();
        std::thread::scope(|scope| -> std::io::Result<()> {
            for _ in 0..workers {
                let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
                scope.spawn(move || {
                    for (line, text) in job_rx.iter() {
                        let value = self.score_line(line, &text);
                        if done_tx.send((line, value)).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(done_tx);
            let mut pending: BTreeMap<usize, Value> = BTreeMap::new();
            let mut order: VecDeque<usize> = VecDeque::new();
            let mut lines = input.lines().enumerate();
            let mut exhausted = false;
            let mut result = Ok(());
            loop {
                // Top up the in-flight window.
                while !exhausted && order.len() < window {
                    match lines.next() {
                        None => exhausted = true,
                        Some((_, Err(e))) => {
                            result = Err(e);
                            exhausted = true;
                        }
                        Some((i, Ok(text))) => {
                            if text.trim().is_empty() {
                                continue;
                            }
                            order.push_back(i + 1);
                            if job_tx.send((i + 1, text)).is_err() {
                                exhausted = true;
                            }
                        }
                    }
                }
                if order.is_empty() {
                    break;
                }
                let Ok((line, value)) = done_rx.recv() else {
                    break;
                };
                pending.insert(line, value);
                while let Some(next) = order.front() {
                    let Some(value) = pending.remove(next) else {
                        break;
                    };
                    order.pop_front();
                    if value.get("error").is_some() {
                        summary.errors += 1;
                    } else {
                        summary.scored += 1;
                    }
                    if let Err(e) = writeln!(output, "{value}") {
                        result = Err(e);
                        order.clear();
                        break;
                    }
                }
            }
            drop(job_tx);
            result
        })?;
        output.flush()?;
        Ok(summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Reward, SplitResponse, VerifyError};

    /// Reward = the answer parsed as a number; sleeps a little on odd values so completions
    /// arrive out of order.
    struct Echo;
    impl Verifier for Echo {
        fn name(&self) -> &'static str {
            "echo"
        }
        fn verify(
            &self,
            reference: &Value,
            response: &SplitResponse<'_>,
        ) -> Result<Reward, VerifyError> {
            if reference.get("bad").is_some() {
                return Err(VerifyError::BadReference {
                    field: "bad".into(),
                    problem: "present".into(),
                });
            }
            let x: f32 = response.answer.unwrap_or("").parse().unwrap_or(-1.0);
            if x as i64 % 2 == 1 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Ok(Reward {
                reward: x,
                details: json!({}),
            })
        }
    }

    #[test]
    fn keeps_order_and_reports_bad_lines() {
        let mut s = Scorer::new();
        s.register("e", Box::new(Echo));
        s.mark_unavailable("rm", "domain rm needs --reward-model DIR");
        let mut input = String::new();
        for i in 0..20 {
            input.push_str(&format!("{{\"domain\": \"e\", \"response\": \"{i}\"}}\n"));
        }
        input.push_str("{not json\n\n{\"domain\": \"rm\", \"response\": \"x\"}\n");
        input.push_str("{\"domain\": \"e\", \"response\": \"1\", \"bad\": 1}\n[1]\n{\"domain\": \"zz\", \"response\": \"\"}\n");
        let mut out = Vec::new();
        let summary = s.score_stream(input.as_bytes(), &mut out, 3).unwrap();
        assert_eq!(
            summary,
            ScoreSummary {
                scored: 20,
                errors: 5
            }
        );
        let rows: Vec<Value> = String::from_utf8(out)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        for (i, row) in rows.iter().take(20).enumerate() {
            assert_eq!(row["line"], json!(i + 1));
            assert_eq!(row["reward"], json!(i as f32));
        }
        assert_eq!(rows[20]["line"], json!(21));
        assert!(rows[20]["error"]
            .as_str()
            .unwrap()
            .starts_with("malformed JSON"));
        assert_eq!(rows[21]["line"], json!(23), "blank line 22 is skipped");
        assert_eq!(
            rows[21]["error"],
            json!("domain rm needs --reward-model DIR")
        );
        assert!(rows[22]["error"]
            .as_str()
            .unwrap()
            .contains("reference field `bad`"));
        assert_eq!(rows[23]["error"], json!("line is not a JSON object"));
        assert_eq!(rows[24]["error"], json!("unknown domain `zz`"));
    }
}
