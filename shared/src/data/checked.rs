//! Datasets as the trainer opens them: read once through at start, every rejected row counted
//! and logged (file, row, column, reason), and an error with the first reasons when no row is
//! usable, so that a run stops at start on a dataset it cannot use. This is the one place the
//! actor's RL prompts and held-out sets, the learner's SFT conversations and the reward model's
//! preference pairs all pass through.
//!
//! - [`scan`]: one sequential pass handing each accepted row to the consumer (SFT, pairs),
//!   which may still refuse a row (counted and logged the same way).
//! - [`Indexed`]: random access to the accepted rows by their position (the actor's prompt
//!   schedule), read through the file index on demand: what it keeps per dataset is the index
//!   and the numbers of the rows that are not usable, never the rows.

use std::ops::Range;

use super::error::{DataError, Result, RowError};
use super::reader::{DataReader, DataSpec, Outcome, ReadRow, ReadStats, FIRST_REASONS};
use super::record::{FieldError, Row};

/// Counts a pass's rows and logs its rejections.
struct Tally<'a> {
    reader: &'a DataReader,
    stats: ReadStats,
}

impl Tally<'_> {
    fn reject(&mut self, e: RowError) {
        tracing::warn!("rejected dataset row: {e}");
        self.stats.rejected += 1;
        if self.stats.first_rejections.len() < FIRST_REASONS {
            self.stats.first_rejections.push(e);
        }
    }

    fn skip(&mut self, e: RowError) {
        tracing::debug!("skipped dataset row: {e}");
        self.stats.skipped += 1;
    }

    fn finish(self) -> Result<ReadStats> {
        let stats = self.stats;
        let pattern = self.reader.pattern();
        if stats.accepted == 0 {
            return Err(DataError::AllRejected {
                pattern: pattern.to_string(),
                rejected: stats.rejected + stats.skipped,
                first: if stats.first_rejections.is_empty() {
                    format!(
                        "  (no row at all, or every row skipped on purpose: {} skipped)",
                        stats.skipped
                    )
                } else {
                    stats
                        .first_rejections
                        .iter()
                        .map(|e| format!("  {e}"))
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            });
        }
        if stats.rejected > 0 {
            tracing::warn!(
                "{pattern}: {} of {} rows rejected ({} used, {} skipped on purpose)",
                stats.rejected,
                stats.rows,
                stats.accepted,
                stats.skipped
            );
        } else {
            tracing::info!(
                "{pattern}: {} rows ({} used, {} skipped on purpose), schema {}",
                stats.rows,
                stats.accepted,
                stats.skipped,
                self.reader.schema().describe()
            );
        }
        Ok(stats)
    }
}

/// Reads the rows of `range` once, in order: each accepted row goes to `take` with its global
/// row number; a row `take` refuses (`Err`) counts as rejected. Rows not used (rejected,
/// refused, skipped) are pushed to `unusable` when given.
fn pass(
    reader: &DataReader,
    range: Range<u64>,
    mut take: impl FnMut(u64, Row) -> std::result::Result<(), FieldError>,
    mut unusable: Option<&mut Vec<u64>>,
) -> Result<ReadStats> {
    let mut tally = Tally {
        reader,
        stats: ReadStats::default(),
    };
    for r in reader.rows_in(range)? {
        let ReadRow {
            index,
            outcome,
            file,
            row_no,
        } = r?;
        tally.stats.rows += 1;
        let not_used = match outcome {
            Outcome::Accepted(row) => match take(index, row) {
                Ok(()) => {
                    tally.stats.accepted += 1;
                    false
                }
                Err(e) => {
                    tally.reject(reader.reject(file, row_no, e));
                    true
                }
            },
            Outcome::Rejected(e) => {
                tally.reject(e);
                true
            }
            Outcome::Skipped(e) => {
                tally.skip(e);
                true
            }
        };
        if not_used {
            if let Some(u) = unusable.as_deref_mut() {
                u.push(index);
            }
        }
    }
    tally.finish()
}

/// Reads every row of the dataset once, in order, handing each accepted row (with its global
/// row number) to `take`, which may refuse it with a reason. Every rejected or refused row is
/// counted and logged naming file, row and column; when no row is used the error lists the
/// first reasons.
pub fn scan(
    reader: &DataReader,
    take: impl FnMut(u64, Row) -> std::result::Result<(), FieldError>,
) -> Result<ReadStats> {
    pass(reader, 0..reader.len(), take, None)
}

/// Opens `spec` and [`scan`]s it.
pub fn open_and_scan(
    spec: &DataSpec,
    take: impl FnMut(u64, Row) -> std::result::Result<(), FieldError>,
) -> Result<(DataReader, ReadStats)> {
    let reader = DataReader::open(spec)?;
    let stats = scan(&reader, take)?;
    Ok((reader, stats))
}

/// A dataset whose accepted rows are reached by position (0 .. [`Indexed::len`]), read
/// through the file index when asked for.
#[derive(Debug, Clone)]
pub struct Indexed {
    reader: DataReader,
    stats: ReadStats,
    /// Global numbers of the rows that are not used, ascending.
    unusable: Vec<u64>,
    /// Every accepted RL row's id is its global row number (no explicit ids).
    ids_are_rows: bool,
}

impl Indexed {
    /// Opens `spec` and reads it once through ([`scan`]'s counting, logging and
    /// all-rejected error).
    pub fn open(spec: &DataSpec) -> Result<Indexed> {
        let reader = DataReader::open(spec)?;
        let mut unusable = Vec::new();
        let mut ids_are_rows = true;
        let stats = pass(
            &reader,
            0..reader.len(),
            |index, row| {
                if let Row::Rl(r) = &row {
                    ids_are_rows &= r.id == index;
                }
                Ok(())
            },
            Some(&mut unusable),
        )?;
        Ok(Indexed {
            reader,
            stats,
            unusable,
            ids_are_rows,
        })
    }

    /// The reader (files, schema, kind).
    pub fn reader(&self) -> &DataReader {
        &self.reader
    }

    /// The counts of the opening pass.
    pub fn stats(&self) -> &ReadStats {
        &self.stats
    }

    /// Number of usable rows.
    pub fn len(&self) -> u64 {
        self.reader.len() - self.unusable.len() as u64
    }

    /// Whether no row is usable (never, once opened).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The global row number of usable row `k` (`k < len`).
    pub fn row_of(&self, k: u64) -> u64 {
        // The smallest r with r = k + #{unusable ≤ r}: reached from below by iterating.
        let mut r = k;
        loop {
            let next = k + self.unusable.partition_point(|&u| u <= r) as u64;
            if next == r {
                return r;
            }
            r = next;
        }
    }

    /// The RL id of usable row `k` when it is known without reading the row (no row of the
    /// dataset has an explicit id, so each row's id is its row number).
    pub fn known_id(&self, k: u64) -> Option<u64> {
        self.ids_are_rows.then(|| self.row_of(k))
    }

    /// Usable row `k`, read through the index.
    pub fn get(&self, k: u64) -> Result<Row> {
        if k >= self.len() {
            return Err(DataError::Schema {
                path: self.reader.pattern().into(),
                reason: format!("usable row {k} is out of range ({} rows)", self.len()),
            });
        }
        self.reader.get(self.row_of(k))
    }

    /// The first `n` usable rows, in order (streamed through the index).
    pub fn head(&self, n: u64) -> Result<Vec<Row>> {
        let n = n.min(self.len());
        if n == 0 {
            return Ok(Vec::new());
        }
        let end = self.row_of(n - 1) + 1;
        let mut out = Vec::with_capacity(n as usize);
        for r in self.reader.rows_in(0..end)? {
            if let Outcome::Accepted(row) = r?.outcome {
                out.push(row);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Kind;
    use crate::StageKind;

    fn spec(dir: &std::path::Path, text: &str) -> DataSpec {
        let path = dir.join("p.jsonl");
        std::fs::write(&path, text).unwrap();
        DataSpec {
            path: path.display().to_string(),
            kind: Some(Kind::Rl),
            domain: Some(StageKind::Math),
            ..DataSpec::default()
        }
    }

    #[test]
    fn usable_rows_are_reached_by_position_past_rejected_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::new();
        for i in 0..600 {
            if i % 7 == 3 {
                text.push_str(&format!("{{\"prompt\": \"q{i}\"}}\n")); // no answer
            } else {
                text.push_str(&format!("{{\"prompt\": \"q{i}\", \"answer\": \"{i}\"}}\n"));
            }
        }
        let d = Indexed::open(&spec(dir.path(), &text)).unwrap();
        let good: Vec<u64> = (0..600).filter(|i| i % 7 != 3).collect();
        assert_eq!(d.len(), good.len() as u64);
        assert_eq!(d.stats().rejected, 600 - good.len() as u64);
        assert_eq!(d.stats().first_rejections[0].row, 4, "line 4 is row 3");
        for (k, &row) in good.iter().enumerate() {
            assert_eq!(d.row_of(k as u64), row);
        }
        for k in [0u64, 1, 2, 3, 255, 256, 300, good.len() as u64 - 1] {
            let Row::Rl(r) = d.get(k).unwrap() else {
                panic!()
            };
            assert_eq!(r.reference["answer"], good[k as usize].to_string());
            assert_eq!(d.known_id(k), Some(r.id));
        }
        assert!(d.get(good.len() as u64).is_err());
        let head = d.head(5).unwrap();
        assert_eq!(head.len(), 5);
        assert!(matches!(&head[4], Row::Rl(r) if r.id == 5));
    }

    #[test]
    fn a_dataset_with_no_usable_row_stops_with_the_first_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let e = Indexed::open(&spec(
            dir.path(),
            "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"answer\": 1, \"id\": -2}\nnot json\n",
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("all 3 rows rejected"), "{e}");
        assert!(e.contains("p.jsonl:1: ") && e.contains("`answer`"), "{e}");
        assert!(e.contains("p.jsonl:3: column `id`"), "{e}");
        assert!(e.contains("p.jsonl:4: not valid JSON"), "{e}");
        // A consumer's refusal counts as a rejection, with the row's file and line.
        let reader = DataReader::open(&spec(
            dir.path(),
            "{\"prompt\": \"a\", \"answer\": 1}\n{\"prompt\": \"b\", \"answer\": 2}\n",
        ))
        .unwrap();
        let e = scan(&reader, |_, _| Err(FieldError::col("prompt", "too odd")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("p.jsonl:2: column `prompt`: too odd"), "{e}");
        let mut seen = Vec::new();
        let stats = scan(&reader, |i, _| {
            seen.push(i);
            if i == 0 {
                Err(FieldError::row("refused"))
            } else {
                Ok(())
            }
        })
        .unwrap();
        assert_eq!((stats.accepted, stats.rejected, seen), (1, 1, vec![0, 1]));
    }
}
