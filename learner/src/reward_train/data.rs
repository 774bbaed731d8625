//! Preference pairs: the JSONL file format and the token ids of a pair's two conversations.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

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

/// Reads preference pairs from a JSONL file. Blank lines are skipped; unknown keys ignored. A
/// line that is not a JSON object with string `prompt`, `chosen` and `rejected` is an error
/// naming the file and the 1-based line.
pub fn load_pairs(path: &Path) -> Result<Vec<PreferencePair>> {
    let file = File::open(path).map_err(|e| LearnerError::io(path, e))?;
    let bad_line = |line: usize, reason: String| {
        LearnerError::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line {line}: {reason}"),
            ),
        )
    };
    let mut out = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let line_no = i + 1;
        let line = line.map_err(|e| bad_line(line_no, e.to_string()))?;
        if line.trim().is_empty() {
            continue;
        }
        let pair: PreferencePair = serde_json::from_str(&line).map_err(|e| {
            bad_line(
                line_no,
                format!("not a {{\"prompt\", \"chosen\", \"rejected\"}} object: {e}"),
            )
        })?;
        out.push(pair);
    }
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
    fn malformed_line_names_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pairs.jsonl");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\", \"id\": 3}\n\n\
             {\"prompt\": \"p\", \"chosen\": \"a\"}\n",
        )
        .unwrap();
        let err = load_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("pairs.jsonl"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("rejected"), "{err}");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\nnope\n",
        )
        .unwrap();
        let err = load_pairs(&path).unwrap_err().to_string();
        assert!(err.contains("line 2"), "{err}");
        fs::write(
            &path,
            "{\"prompt\": \"p\", \"chosen\": \"a\", \"rejected\": \"b\"}\n",
        )
        .unwrap();
        assert_eq!(load_pairs(&path).unwrap().len(), 1);
    }
}
