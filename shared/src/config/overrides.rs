//! Generic `--set KEY=VALUE` overrides, applied to the TOML tree before it is typed, so that an
//! override is checked exactly like the file (unknown key, wrong type → an error naming it).

use std::str::FromStr;

use super::error::{ConfigError, Result};

/// One `KEY=VALUE` override. `KEY` is a dotted path: table keys, array indices, or (in
/// `stages`) a stage name: `actor.gen_batch=16`, `stages.2.lr=1e-6`, `stages.math.lr=1e-6`.
/// `VALUE` is a TOML value (`16`, `1e-6`, `true`, `"text"`, `[1, 2]`); anything that does not
/// parse as one is taken as a string (`dtype=bf16`).
#[derive(Debug, Clone, PartialEq)]
pub struct Override {
    spec: String,
    path: Vec<String>,
    value: toml::Value,
}

impl FromStr for Override {
    type Err = ConfigError;

    fn from_str(spec: &str) -> Result<Self> {
        let fail = |message: &str| ConfigError::Override {
            spec: spec.to_string(),
            message: message.to_string(),
        };
        let (key, raw) = spec
            .split_once('=')
            .ok_or_else(|| fail("expected KEY=VALUE"))?;
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        if path.iter().any(|p| p.is_empty()) {
            return Err(fail("empty key segment"));
        }
        let raw = raw.trim();
        let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
            Ok(mut t) => t.remove("v").expect("the table has v"),
            Err(_) => toml::Value::String(raw.to_string()),
        };
        Ok(Override {
            spec: spec.to_string(),
            path,
            value,
        })
    }
}

impl Override {
    /// An override from a key path and a value.
    pub fn new(key: &str, value: toml::Value) -> Self {
        Override {
            spec: format!("{key}={value}"),
            path: key.split('.').map(str::to_string).collect(),
            value,
        }
    }

    /// The override as written.
    pub fn spec(&self) -> &str {
        &self.spec
    }

    /// Writes the value into `root` (the document, a table), creating missing tables on the way.
    pub fn apply(&self, root: &mut toml::Value) -> Result<()> {
        let fail = |message: String| ConfigError::Override {
            spec: self.spec.clone(),
            message,
        };
        let (last, parents) = self.path.split_last().expect("the path is not empty");
        let mut node: &mut toml::Value = root;
        let mut walked = String::new();
        for segment in parents {
            node = step(node, segment, true).map_err(|m| fail(format!("{walked}{m}")))?;
            walked.push_str(segment);
            walked.push('.');
        }
        match node {
            toml::Value::Table(t) => {
                t.insert(last.clone(), self.value.clone());
            }
            toml::Value::Array(items) => {
                let slot = array_slot(items, last).map_err(|m| fail(format!("{walked}{m}")))?;
                *slot = self.value.clone();
            }
            other => {
                return Err(fail(format!(
                    "{walked} is a {}, not a table or array",
                    other.type_str()
                )))
            }
        }
        Ok(())
    }
}

fn step<'a>(
    node: &'a mut toml::Value,
    segment: &str,
    create: bool,
) -> std::result::Result<&'a mut toml::Value, String> {
    match node {
        toml::Value::Table(t) => {
            if create && !t.contains_key(segment) {
                t.insert(segment.to_string(), toml::Value::Table(toml::Table::new()));
            }
            t.get_mut(segment)
                .ok_or_else(|| format!("{segment}: no such key"))
        }
        toml::Value::Array(items) => array_slot(items, segment),
        other => Err(format!(
            "{segment}: parent is a {}, not a table",
            other.type_str()
        )),
    }
}

/// An array element by index, or (for arrays of tables) by its `name` field.
fn array_slot<'a>(
    items: &'a mut [toml::Value],
    segment: &str,
) -> std::result::Result<&'a mut toml::Value, String> {
    let len = items.len();
    if let Ok(i) = segment.parse::<usize>() {
        return items
            .get_mut(i)
            .ok_or_else(|| format!("index {i} out of range (the array has {len} entries)"));
    }
    let names: Vec<String> = items
        .iter()
        .filter_map(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_string))
        .collect();
    items
        .iter_mut()
        .find(|v| v.get("name").and_then(|n| n.as_str()) == Some(segment))
        .ok_or_else(|| {
            format!(
                "{segment}: no entry with that name or index (names: {})",
                names.join(", ")
            )
        })
}
