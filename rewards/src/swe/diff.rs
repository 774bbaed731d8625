//! Unified-diff parsing: files, hunks and their changed lines.

use std::sync::OnceLock;

use regex::Regex;

/// One file of a patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilePatch {
    /// The path the patch applies to (`b/` side; the `a/` side for deletions), without the
    /// `a/`/`b/` prefix.
    pub path: String,
    /// The hunks, in order.
    pub hunks: Vec<Hunk>,
}

/// One `@@ -l,s +l,s @@` hunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hunk {
    /// First line in the old file.
    pub old_start: usize,
    /// First line in the new file.
    pub new_start: usize,
    /// The hunk's body lines with their ` `/`+`/`-` prefix.
    pub lines: Vec<String>,
}

/// A parsed patch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Patch {
    /// The files, in order of appearance.
    pub files: Vec<FilePatch>,
}

/// Why a diff could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {problem}")]
pub struct DiffError {
    /// 1-based line number in the diff text.
    pub line: usize,
    /// What is wrong.
    pub problem: String,
}

impl Patch {
    /// Per-file normalised change: the `+`/`-` lines of every hunk, trailing whitespace
    /// removed, joined by `\n` (what the lexical similarity compares).
    pub fn normalised_changes(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for file in &self.files {
            let changed: Vec<&str> = file
                .hunks
                .iter()
                .flat_map(|h| h.lines.iter())
                .filter(|l| l.starts_with('+') || l.starts_with('-'))
                .map(|l| l.trim_end())
                .collect();
            let text = changed.join("\n");
            // A path patched twice in one diff counts as one file.
            match out.iter_mut().find(|(p, _)| *p == file.path) {
                Some((_, existing)) if !text.is_empty() => {
                    if !existing.is_empty() {
                        existing.push('\n');
                    }
                    existing.push_str(&text);
                }
                Some(_) => {}
                None => out.push((file.path.clone(), text)),
            }
        }
        out
    }

    /// No file has a changed line.
    pub fn is_empty(&self) -> bool {
        self.normalised_changes().iter().all(|(_, c)| c.is_empty())
    }
}

/// Why a patch does not apply to a file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}, hunk {hunk}: {problem}")]
pub struct ApplyError {
    /// The file.
    pub path: String,
    /// 1-based hunk number within the file's hunks.
    pub hunk: usize,
    /// What did not match.
    pub problem: String,
}

impl FilePatch {
    /// Applies the hunks to `text`, the file before the patch, as `git apply --unidiff-zero`
    /// does (no fuzz, and a hunk without context is not pinned to the file's start or end;
    /// checked against git in `rewards/tests/swe_tests.rs`): a hunk's context and removed
    /// lines must all be in the file, in order (trailing whitespace is ignored), at the line
    /// its header names (shifted by what earlier hunks added or removed) or else at the nearest
    /// line that matches, each hunk applied to the file as the earlier ones left it. The result
    /// ends with a newline when the file did.
    pub fn apply(&self, text: &str) -> Result<String, ApplyError> {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let ends_with_newline = text.is_empty() || text.ends_with('\n');
        let mut shift = 0isize;
        for (h, hunk) in self.hunks.iter().enumerate() {
            let err = |problem: String| ApplyError {
                path: self.path.clone(),
                hunk: h + 1,
                problem,
            };
            let old: Vec<&str> = hunk
                .lines
                .iter()
                .filter(|l| !l.starts_with('+'))
                .map(|l| l[1..].trim_end())
                .collect();
            // `@@ -0,0` inserts before the first line; `@@ -l,0` inserts after line l.
            let named = if old.is_empty() {
                hunk.old_start
            } else {
                hunk.old_start.saturating_sub(1)
            };
            let expected = (named as isize + shift).max(0) as usize;
            let fits = |at: usize| {
                at + old.len() <= lines.len()
                    && old
                        .iter()
                        .zip(&lines[at..])
                        .all(|(o, l)| *o == l.trim_end())
            };
            if old.is_empty() && expected > lines.len() {
                return Err(err(format!(
                    "inserts after line {expected}, past the file's {} lines",
                    lines.len()
                )));
            }
            let last = lines.len().saturating_sub(old.len());
            let at = (0..=lines.len())
                .flat_map(|d| [expected.checked_add(d), expected.checked_sub(d)])
                .flatten()
                .filter(|&at| at <= last)
                .find(|&at| fits(at))
                .ok_or_else(|| {
                    err(format!(
                        "its {} context/removed line(s) are not in the file (expected at line {})",
                        old.len(),
                        expected + 1
                    ))
                })?;
            // Context lines keep the file's text (its trailing whitespace included).
            let mut new = Vec::with_capacity(hunk.lines.len());
            let mut k = at;
            for l in &hunk.lines {
                match l.as_bytes().first() {
                    Some(b'+') => new.push(l[1..].to_string()),
                    Some(b'-') => k += 1,
                    _ => {
                        new.push(lines[k].clone());
                        k += 1;
                    }
                }
            }
            let added = new.len();
            lines.splice(at..at + old.len(), new);
            shift += added as isize - old.len() as isize;
        }
        let mut out = lines.join("\n");
        if ends_with_newline && !lines.is_empty() {
            out.push('\n');
        }
        Ok(out)
    }
}

fn strip_path(raw: &str) -> String {
    // `--- a/x.py\t2024-01-01 ...`: drop the timestamp, then the one-letter side prefix.
    let p = raw.split('\t').next().unwrap_or("").trim();
    match p.split_once('/') {
        Some(("a" | "b", rest)) if !rest.is_empty() => rest.to_string(),
        _ => p.to_string(),
    }
}

fn hunk_header() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@").expect("valid regex")
    })
}

/// Lines that may appear between files in `git diff` output.
fn is_git_metadata(line: &str) -> bool {
    const PREFIXES: [&str; 12] = [
        "diff ",
        "index ",
        "new file mode",
        "deleted file mode",
        "old mode",
        "new mode",
        "similarity index",
        "dissimilarity index",
        "rename from",
        "rename to",
        "copy from",
        "copy to",
    ];
    PREFIXES.iter().any(|p| line.starts_with(p))
}

/// Parses a unified diff. Text before the first file header that is not git metadata is
/// rejected, as are hunks outside a file, malformed headers, hunks whose line counts do not
/// match their body, and files without hunks.
pub fn parse(text: &str) -> Result<Patch, DiffError> {
    let lines: Vec<&str> = text.lines().collect();
    let mut patch = Patch::default();
    let mut i = 0;
    let err = |line: usize, problem: &str| DiffError {
        line: line + 1,
        problem: problem.into(),
    };
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() || is_git_metadata(line) {
            i += 1;
            continue;
        }
        if let Some(old) = line.strip_prefix("--- ") {
            let new = lines
                .get(i + 1)
                .and_then(|l| l.strip_prefix("+++ "))
                .ok_or_else(|| err(i + 1, "`---` header not followed by `+++`"))?;
            let new_path = strip_path(new);
            let path = if new_path == "/dev/null" {
                strip_path(old)
            } else {
                new_path
            };
            patch.files.push(FilePatch {
                path,
                hunks: Vec::new(),
            });
            i += 2;
            continue;
        }
        if line.starts_with("@@") {
            let file = patch
                .files
                .last_mut()
                .ok_or_else(|| err(i, "hunk before any file header"))?;
            let caps = hunk_header()
                .captures(line)
                .ok_or_else(|| err(i, "malformed hunk header"))?;
            let num = |k: usize, default: usize| -> Result<usize, DiffError> {
                caps.get(k).map_or(Ok(default), |m| {
                    m.as_str()
                        .parse()
                        .map_err(|_| err(i, "hunk header number too large"))
                })
            };
            let (old_start, mut old_left) = (num(1, 0)?, num(2, 1)?);
            let (new_start, mut new_left) = (num(3, 0)?, num(4, 1)?);
            let mut body = Vec::new();
            i += 1;
            while old_left > 0 || new_left > 0 {
                let Some(&l) = lines.get(i) else {
                    return Err(err(i, "hunk shorter than its header says"));
                };
                match l.chars().next() {
                    // Some tools strip the space of an empty context line.
                    Some(' ') | None if old_left > 0 && new_left > 0 => {
                        old_left -= 1;
                        new_left -= 1;
                    }
                    Some('-') if old_left > 0 => old_left -= 1,
                    Some('+') if new_left > 0 => new_left -= 1,
                    Some('\\') => {}
                    _ => return Err(err(i, "line does not fit the hunk")),
                }
                if !l.starts_with('\\') {
                    body.push(if l.is_empty() {
                        " ".to_string()
                    } else {
                        l.to_string()
                    });
                }
                i += 1;
            }
            while lines.get(i).is_some_and(|l| l.starts_with('\\')) {
                i += 1;
            }
            file.hunks.push(Hunk {
                old_start,
                new_start,
                lines: body,
            });
            continue;
        }
        if line.starts_with("Binary files ") {
            i += 1;
            continue;
        }
        return Err(err(i, "not part of a unified diff"));
    }
    if let Some(file) = patch.files.iter().find(|f| f.hunks.is_empty()) {
        return Err(DiffError {
            line: lines.len(),
            problem: format!("file {} has no hunk", file.path),
        });
    }
    Ok(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "diff --git a/src/x.py b/src/x.py\nindex 1..2 100644\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1,3 +1,3 @@\n def f():\n-    return 1\n+    return 2   \n \n@@ -10 +10,2 @@\n-a\n+b\n+c\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+hello\n\\ No newline at end of file\n";

    #[test]
    fn parses_files_and_hunks() {
        let p = parse(GOOD).unwrap();
        assert_eq!(p.files.len(), 2);
        assert_eq!(p.files[0].path, "src/x.py");
        assert_eq!(p.files[0].hunks.len(), 2);
        assert_eq!(p.files[1].path, "new.txt");
        let changes = p.normalised_changes();
        assert_eq!(changes[0].1, "-    return 1\n+    return 2\n-a\n+b\n+c");
        assert_eq!(changes[1].1, "+hello");
    }

    #[test]
    fn rejects_broken_diffs() {
        assert!(parse("just some prose").is_err());
        assert!(parse("@@ -1 +1 @@\n-a\n+b\n").is_err());
        assert!(parse("--- a/x\n+++ b/x\n@@ -1,2 +1,2 @@\n-a\n+b\n").is_err());
        assert!(parse("--- a/x\n+++ b/x\n").is_err());
        assert!(parse("--- a/x\n@@ -1 +1 @@\n").is_err());
    }

    #[test]
    fn applies_hunks_where_they_match() {
        let file = "def f(x):\n    return x - 3\n\ndef g():\n    pass\n";
        let p =
            parse("--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x - 3\n+    return x + 3\n")
                .unwrap();
        assert_eq!(
            p.files[0].apply(file).unwrap(),
            "def f(x):\n    return x + 3\n\ndef g():\n    pass\n"
        );
        // A wrong line number is found at the nearest match; trailing spaces are ignored.
        let p = parse("--- a/f.py\n+++ b/f.py\n@@ -4,2 +4,3 @@\n def g():  \n-    pass\n+    x = 1\n+    return x\n")
            .unwrap();
        assert_eq!(
            p.files[0].apply(file).unwrap(),
            "def f(x):\n    return x - 3\n\ndef g():\n    x = 1\n    return x\n"
        );
        // Two hunks: the second one's header counts the first one's added line.
        let p = parse("--- a/f.py\n+++ b/f.py\n@@ -1 +1,2 @@\n def f(x):\n+    y = x\n@@ -5 +6 @@\n-    pass\n+    return 0\n")
            .unwrap();
        assert_eq!(
            p.files[0].apply(file).unwrap(),
            "def f(x):\n    y = x\n    return x - 3\n\ndef g():\n    return 0\n"
        );
        // Insertion into an empty file (a new file).
        let p = parse("--- /dev/null\n+++ b/n.py\n@@ -0,0 +1 @@\n+x = 1\n").unwrap();
        assert_eq!(p.files[0].apply("").unwrap(), "x = 1\n");
    }

    #[test]
    fn refuses_hunks_that_do_not_match() {
        let file = "def f(x):\n    return x - 3\n";
        // The removed line is not in the file (the model misread the bug).
        let p =
            parse("--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x * 3\n+    return x + 3\n")
                .unwrap();
        let e = p.files[0].apply(file).unwrap_err();
        assert_eq!((e.path.as_str(), e.hunk), ("f.py", 1));
        assert!(e.to_string().contains("not in the file"), "{e}");
        // Each hunk applies to the file as the earlier ones left it: the second hunk's removed
        // line was the first one's.
        let p = parse("--- a/f.py\n+++ b/f.py\n@@ -2 +2 @@\n-    return x - 3\n+    return x\n@@ -2 +2 @@\n-    return x - 3\n+    return 0\n")
            .unwrap();
        assert!(p.files[0].apply(file).is_err());
    }

    #[test]
    fn empty_text_is_an_empty_patch() {
        assert!(parse("").unwrap().is_empty());
        assert!(parse("\n  \n").unwrap().files.is_empty());
    }
}
