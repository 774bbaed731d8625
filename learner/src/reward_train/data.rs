//! Preference pairs: how they are read and the token ids of a pair's two conversations.

use std::path::Path;

use cascade_shared::data::{scan, DataReader, DataSpec, Kind, Row};
use serde::{Deserialize, Serialize};

use crate::error::{LearnerError, Result};

/// One preference pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreferencePair {
    /// The user prompt.
    pub prompt: String,
    /// The preferred response.
    pub chosen: String,
    /// The dispreferred response.
    pub rejected: String,
}

/// Reads preference pairs from a file, glob or directory, the layout recognised from the
/// columns; see [`load_pairs_from`].
pub fn load_pairs(path: &Path) -> Result<Vec<PreferencePair>> {
    load_pairs_from(&DataSpec::of_kind(path, Kind::Pairs))
}

/// Reads the preference pairs of `spec` through `cascade_shared::data`: our JSONL layout
/// (string `prompt`, `chosen`, `rejected`; other keys ignored; blank lines skipped) or a pairs
/// preset (HelpSteer3 with ties dropped, Skywork, TRL) or a column mapping, JSONL or Parquet. A
/// row that does not make a pair is counted and logged naming file, row and column; a dataset
/// with no usable pair is an error with the first reasons.
pub fn load_pairs_from(spec: &DataSpec) -> Result<Vec<PreferencePair>> {
    let reader = DataReader::open(spec)?;
    if reader.kind() != Kind::Pairs {
        return Err(LearnerError::InvalidConfig(format!(
            "{}: holds {} rows, not preference pairs",
            spec.path,
            reader.kind().as_str()
        )));
    }
    let mut out = Vec::new();
    scan(&reader, |_, row| match row {
        Row::Pair(p) => {
            out.push(PreferencePair {
                prompt: p.prompt,
                chosen: p.chosen,
                rejected: p.rejected,
            });
            Ok(())
        }
        _ => Err(cascade_shared::data::record::FieldError::row(
            "not a preference pair",
        )),
    })?;
    Ok(out)
}

/// The token ids of a pair's two conversations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncodedPair {
    /// `[user: prompt, assistant: chosen]`.
    pub chosen: Vec<u32>,
    /// `[user: prompt, assistant: rejected]`.
    pub rejected: Vec<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn malformed_lines_are_counted_and_named_and_no_usable_pair_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.jsonl");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"id\": 3}\n\n\
             {\"prompt\": \"p\", \"chosen\": \"a\"}\n",
        )
        .unwrap();
        // The bad line is rejected (and logged); the good one is used.
        let pairs = load_pairs(&path).unwrap();
        assert_eq!(pairs.len(), 1);
        assert_eq!(pairs[0].chosen, "a");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": 3, \"rejected\": \"b\"}\nnope\n",
        )
        .unwrap();
        let err = load_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("all 2 rows rejected"), "{err}");
        assert!(err.contains("pairs.jsonl:1: column `chosen`"), "{err}");
        assert!(err.contains("pairs.jsonl:2: not valid JSON"), "{err}");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n",
        )
        .unwrap();
        assert_eq!(load_pairs(&path).unwrap().len(), 1);
    }
}
