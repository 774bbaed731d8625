//! The best responses of an RL stage, kept for later stages to replay (`sft_mix.replay`).
//!
//! Of every group a stage trains on, the response with the highest reward, when it is above
//! the group's mean, is appended to `RUN_DIR/best/stage-{index}.jsonl` with the global step
//! that trained on it: the prompt's and the response's tokens as the policy sampled them, and
//! the reward. Lines carry a CRC-32C of their content. The lines of a step are synced before
//! that step can be published, so a checkpoint never has fewer lines than it trained on; at
//! the start (or resumption) of the stage the file is cut back to the lines of the steps the
//! resumed state has, and retrained steps append theirs again. A line that is torn or fails
//! its checksum is refused when read, with the file and line named.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use cascade_shared::snapshot::durable::{fsync_dir, replace_file};
use cascade_shared::RolloutGroup;
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};
use crate::sft::SftExample;

/// Directory of the best-response files, under the run directory.
pub const BEST_DIR: &str = "best";

/// One kept response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Best {
    /// The global optimizer step that trained on its group.
    pub step: u64,
    /// The rendered prompt's tokens.
    pub prompt_ids: Vec<u32>,
    /// The response's tokens.
    pub response_ids: Vec<u32>,
    /// Its reward.
    pub reward: f32,
    /// Thinking mode of the prompt.
    pub think: bool,
}

#[derive(Serialize, Deserialize)]
struct Line {
    #[serde(flatten)]
    best: Best,
    crc: u32,
}

impl Best {
    fn crc(&self) -> u32 {
        let mut bytes =
            Vec::with_capacity(4 * (self.prompt_ids.len() + self.response_ids.len()) + 24);
        bytes.extend_from_slice(&self.step.to_le_bytes());
        bytes.extend_from_slice(&(self.prompt_ids.len() as u64).to_le_bytes());
        bytes.extend(self.prompt_ids.iter().flat_map(|t| t.to_le_bytes()));
        bytes.extend(self.response_ids.iter().flat_map(|t| t.to_le_bytes()));
        bytes.extend_from_slice(&self.reward.to_bits().to_le_bytes());
        bytes.push(u8::from(self.think));
        crc32c::crc32c(&bytes)
    }

    /// The response as an SFT example: the prompt is context, the response is trained.
    pub fn example(&self) -> SftExample {
        let mut ids = self.prompt_ids.clone();
        ids.extend_from_slice(&self.response_ids);
        let mut trained = vec![false; self.prompt_ids.len()];
        trained.resize(ids.len(), true);
        SftExample {
            ids,
            trained,
            mode: if self.think {
                cascade_shared::Mode::Think
            } else {
                cascade_shared::Mode::NoThink
            },
        }
    }
}

/// The best response of each group that has one above its group's mean (ties: the first;
/// non-finite rewards count for neither).
pub fn best_of(step: u64, groups: &[RolloutGroup]) -> Vec<Best> {
    groups
        .iter()
        .filter_map(|g| {
            let finite: Vec<_> = g.samples.iter().filter(|s| s.reward.is_finite()).collect();
            let mean = finite.iter().map(|s| f64::from(s.reward)).sum::<f64>()
                / finite.len().max(1) as f64;
            let top = finite
                .into_iter()
                .reduce(|a, b| if b.reward > a.reward { b } else { a })?;
            (f64::from(top.reward) > mean && !top.response_ids.is_empty()).then(|| Best {
                step,
                prompt_ids: g.prompt_ids.clone(),
                response_ids: top.response_ids.clone(),
                reward: top.reward,
                think: g.mode == cascade_shared::Mode::Think,
            })
        })
        .collect()
}

/// The file of stage `index`.
pub fn path(run_dir: &Path, index: usize) -> PathBuf {
    run_dir.join(BEST_DIR).join(format!("stage-{index}.jsonl"))
}

/// Appends `entries` to stage `index`'s file and syncs it.
pub fn append(run_dir: &Path, index: usize, entries: &[Best]) -> Result<()> {
    if entries.is_empty() {
        return Ok(());
    }
    let path = path(run_dir, index);
    let mut text = String::new();
    for best in entries {
        let line = Line {
            best: best.clone(),
            crc: best.crc(),
        };
        text.push_str(&serde_json::to_string(&line).map_err(|e| {
            LearnerError::InvalidConfig(format!("{}: cannot encode: {e}", path.display()))
        })?);
        text.push('\n');
    }
    let created = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| LearnerError::io(&path, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_data())
        .map_err(|e| LearnerError::io(&path, e))?;
    if created {
        // The new file's directory entry is durable too.
        fsync_dir(&run_dir.join(BEST_DIR))?;
    }
    Ok(())
}

/// One line, its checksum verified.
fn parse(line: &str) -> std::result::Result<Best, String> {
    let parsed: Line =
        serde_json::from_str(line).map_err(|e| format!("not a best-response line: {e}"))?;
    if parsed.best.crc() != parsed.crc {
        return Err("checksum mismatch (the file is corrupt)".into());
    }
    Ok(parsed.best)
}

/// The lines of stage `index`'s file (none if it does not exist). A torn or corrupt line is
/// an error naming the file and line.
pub fn read(run_dir: &Path, index: usize) -> Result<Vec<Best>> {
    let path = path(run_dir, index);
    let f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(LearnerError::io(&path, e)),
    };
    let mut out = Vec::new();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| LearnerError::io(&path, e))?;
        let bad = |reason: String| LearnerError::Dataset {
            path: path.clone(),
            line: i + 1,
            reason,
        };
        out.push(parse(&line).map_err(bad)?);
    }
    Ok(out)
}

/// Cuts stage `index`'s file back to the lines of steps `<= step` (the state a stage starts or
/// resumes from), through a temporary file and a rename. A torn last line (a crash while
/// appending, of a step that was never published) is dropped; corruption anywhere else is an
/// error.
pub fn truncate_after(run_dir: &Path, index: usize, step: u64) -> Result<()> {
    let path = path(run_dir, index);
    let dir = run_dir.join(BEST_DIR);
    std::fs::create_dir_all(&dir).map_err(|e| LearnerError::io(&dir, e))?;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(LearnerError::io(&path, e)),
    };
    let lines: Vec<&str> = text.lines().collect();
    let torn_tail = !text.is_empty() && !text.ends_with('\n');
    let mut kept = String::new();
    let mut dropped = 0;
    for (i, line) in lines.iter().enumerate() {
        match parse(line).ok() {
            Some(b) if b.step <= step => {
                kept.push_str(line);
                kept.push('\n');
            }
            Some(_) => dropped += 1,
            None if torn_tail && i + 1 == lines.len() => dropped += 1,
            None => {
                return Err(LearnerError::Dataset {
                    path,
                    line: i + 1,
                    reason: "not a valid best-response line (torn or corrupt)".into(),
                })
            }
        }
    }
    if dropped == 0 {
        return Ok(());
    }
    tracing::info!(
        "{}: {dropped} lines of steps after {step} dropped (they are trained again)",
        path.display()
    );
    Ok(replace_file(&path, kept.as_bytes())?)
}
