//! RL prompt datasets, read through [`cascade_shared::data`]: JSONL or Parquet, one file, a glob
//! or a directory of shards, in our canonical layout or a public one (a preset, or a column
//! mapping, given or recognised from the columns).
//!
//! In our own layout each row holds the prompt as `prompt` (a user message string) or
//! `messages` (a list of `{"role", "content"}`), an optional `id` (a non-negative integer;
//! default: the row's 0-based number in the dataset), and the domain's reference fields exactly
//! as `cascade score` takes them: `answer` (math), `instruction_id_list` + `kwargs` (if),
//! `tests` or `test_code` + `entry_point` (code, with `fn_name`, `call_tests` and the starter
//! code passed on as they are), `gold_patch` (swe), nothing extra for rm. The whole canonical
//! object is kept as the verifier's reference.
//!
//! The dataset is read once through at start (every rejected row counted and logged with its
//! file, row and column; no usable row at all is an error with the first reasons), then rows
//! are read through the file index as the prompt schedule asks for them: the prompts are never
//! held in memory together.

use std::path::{Path, PathBuf};

use cascade_shared::data::{self, DataError, DataSpec, Indexed, Kind, ReadStats, Row, Schema};
use cascade_shared::StageKind;

use crate::error::{ActorError, Result};

/// One RL prompt: the canonical RL row of [`cascade_shared::data`] (`id`, `messages`, and the
/// canonical object as `reference`).
pub type PromptRecord = data::RlRow;

/// An opened prompt dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Where it came from (a file, a glob or a directory).
    pub path: PathBuf,
    data: Indexed,
}

/// A dataset error as the actor reports it.
fn actor_err(e: DataError) -> ActorError {
    ActorError::Invalid(format!("dataset {e}"))
}

impl Dataset {
    /// Opens a prompt dataset for a stage of `kind`, its layout recognised from the columns.
    pub fn load(path: impl AsRef<Path>, kind: StageKind) -> Result<Dataset> {
        let path = path.as_ref();
        Dataset::open(&DataSpec {
            path: path.display().to_string(),
            kind: Some(Kind::Rl),
            domain: Some(kind),
            ..DataSpec::default()
        })
    }

    /// Opens a dataset as the config describes it (path, schema, kind and domain).
    pub fn open(spec: &DataSpec) -> Result<Dataset> {
        let data = Indexed::open(spec).map_err(actor_err)?;
        if data.reader().kind() != Kind::Rl {
            return Err(ActorError::Invalid(format!(
                "dataset {}: holds {} rows, not RL prompts",
                spec.path,
                data.reader().kind().as_str()
            )));
        }
        Ok(Dataset {
            path: PathBuf::from(&spec.path),
            data,
        })
    }

    /// Number of usable prompts.
    pub fn len(&self) -> usize {
        self.data.len() as usize
    }

    /// Whether there is no usable prompt (never, once opened).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The schema the rows are read with.
    pub fn schema(&self) -> &Schema {
        self.data.reader().schema()
    }

    /// Counts of the opening pass (rows, used, rejected, skipped).
    pub fn stats(&self) -> &ReadStats {
        self.data.stats()
    }

    /// Prompt `i` (`i < len`), read through the index.
    pub fn get(&self, i: usize) -> Result<PromptRecord> {
        match self.data.get(i as u64).map_err(actor_err)? {
            Row::Rl(r) => Ok(r),
            other => Err(ActorError::Invalid(format!(
                "dataset {}: row {i} is not an RL prompt: {other:?}",
                self.path.display()
            ))),
        }
    }

    /// The id of prompt `i`: known without reading when no row has an explicit id.
    pub fn id(&self, i: usize) -> Result<u64> {
        match self.data.known_id(i as u64) {
            Some(id) => Ok(id),
            None => self.get(i).map(|r| r.id),
        }
    }

    /// The first `n` prompts, in order.
    pub fn head(&self, n: usize) -> Result<Vec<PromptRecord>> {
        self.data
            .head(n as u64)
            .map_err(actor_err)?
            .into_iter()
            .map(|r| match r {
                Row::Rl(r) => Ok(r),
                other => Err(ActorError::Invalid(format!(
                    "dataset {}: not an RL prompt: {other:?}",
                    self.path.display()
                ))),
            })
            .collect()
    }

    /// Every prompt, in order (for small sets: held-out evaluation, tests).
    pub fn all(&self) -> Result<Vec<PromptRecord>> {
        self.head(self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cascade_shared::chat::Message;

    /// The dataset and its directory (rows are read from the file as they are asked for, so
    /// it must outlive the dataset).
    fn load(text: &str, kind: StageKind) -> Result<(tempfile::TempDir, Dataset)> {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("data.jsonl");
        std::fs::write(&p, text).unwrap();
        Dataset::load(&p, kind).map(|ds| (d, ds))
    }

    #[test]
    fn lines_parse_with_ids_and_references() {
        let (_dir, ds) = load(
            "{\"prompt\": \"1+1?\", \"answer\": \"2\"}\n\n{\"id\": 40, \"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": \"q\"}], \"answer\": \"3\"}\n",
            StageKind::Math,
        )
        .unwrap();
        let prompts = ds.all().unwrap();
        assert_eq!(prompts.len(), 2);
        assert_eq!(prompts[0].id, 0);
        assert_eq!(prompts[0].messages, vec![Message::user("1+1?")]);
        assert_eq!(prompts[1].id, 40);
        assert_eq!(prompts[1].messages.len(), 2);
        assert_eq!(prompts[1].reference["answer"], "3");
        assert_eq!((ds.id(0).unwrap(), ds.id(1).unwrap()), (0, 40));
    }

    #[test]
    fn a_malformed_line_is_counted_and_named_and_no_usable_line_is_an_error() {
        // A bad row among good ones: counted, named by file and line, the rest used.
        let (_dir, ds) = load(
            "{\"prompt\": \"a\", \"answer\": \"1\"}\n{\"prompt\": \"b\"\n",
            StageKind::Math,
        )
        .unwrap();
        assert_eq!(ds.len(), 1);
        assert_eq!(ds.stats().rejected, 1);
        let msg = ds.stats().first_rejections[0].to_string();
        assert!(
            msg.contains("data.jsonl:2") && msg.contains("JSON"),
            "{msg}"
        );
        // A file whose every row is rejected stops at start with the reasons.
        let e = load("{\"prompt\": \"a\"}\n", StageKind::Math)
            .unwrap_err()
            .to_string();
        assert!(e.contains(":1:") && e.contains("answer"), "{e}");
        let e = load(
            "{\"prompt\": \"a\", \"test_code\": \"x\"}\n",
            StageKind::Code,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("entry_point"), "{e}");
        let e = load("{\"messages\": [{\"role\": \"user\"}]}\n", StageKind::Rlhf)
            .unwrap_err()
            .to_string();
        assert!(e.contains("messages[0]"), "{e}");
        let e = load("{\"prompt\": \"a\", \"id\": -1}\n", StageKind::Rlhf)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`id`"), "{e}");
        assert!(load(
            "{\"prompt\": \"a\", \"instruction_id_list\": [\"punctuation:no_comma\"], \"kwargs\": [{}]}\n",
            StageKind::If
        )
        .is_ok());
    }

    #[test]
    fn call_based_code_fields_flow_through_unchanged() {
        let (_dir, ds) = load(
            "{\"prompt\": \"write f\", \"tests\": [], \"fn_name\": \"f\", \"call_tests\": [{\"args\": [1], \"expected\": 2}], \"starter_code\": \"def f(x):\\n\"}\n",
            StageKind::Code,
        )
        .unwrap();
        let r = ds.get(0).unwrap();
        assert_eq!(r.reference["fn_name"], "f");
        assert_eq!(r.reference["call_tests"][0]["expected"], 2);
        assert_eq!(r.reference["starter_code"], "def f(x):\n");
    }
}
