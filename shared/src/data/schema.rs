//! Column paths and explicit column mappings.
//!
//! A column path names a value inside a row: `question`, a nested field `reward_model.
//! ground_truth`, a list element `prompt.0.content`. Prefixed with `json:` the value found there
//! must be a string holding JSON, which is decoded (LiveCodeBench's `public_test_cases`, APPS'
//! `input_output`). A mapping is a comma-separated list of `FIELD=PATH`, FIELD being a key of
//! our canonical layout (`prompt`, `messages`, `answer`, `gold_patch`, `chosen`, ...):
//! `prompt=question,answer=reward_model.ground_truth,tests=json:extra.tests`.

use std::borrow::Cow;
use std::fmt;

use serde_json::{Map, Value};

use super::error::{DataError, Result};
use super::presets::Preset;
use super::record::{kind_of, FieldError, FieldResult};

/// A path to a value inside a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnPath {
    /// The segments (`a.b.0` → `["a", "b", "0"]`).
    pub segments: Vec<String>,
    /// The value is a JSON-encoded string, decoded on access.
    pub json: bool,
}

impl ColumnPath {
    /// Parses `a.b.c` or `json:a.b`.
    pub fn parse(text: &str) -> std::result::Result<ColumnPath, String> {
        let (json, path) = match text.strip_prefix("json:") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let segments: Vec<String> = path.split('.').map(str::to_string).collect();
        if segments.iter().any(|s| s.is_empty()) {
            return Err(format!("empty segment in column path {text:?}"));
        }
        Ok(ColumnPath { segments, json })
    }

    /// The value at this path, `None` when absent or null. A `json:` path whose value is not a
    /// string holding JSON is an error naming the column.
    pub fn get<'a>(&self, row: &'a Map<String, Value>) -> FieldResult<Option<Cow<'a, Value>>> {
        let mut cur = match row.get(&self.segments[0]) {
            Some(v) => v,
            None => return Ok(None),
        };
        for seg in &self.segments[1..] {
            let next = match cur {
                Value::Object(o) => o.get(seg),
                Value::Array(a) => seg.parse::<usize>().ok().and_then(|i| a.get(i)),
                _ => None,
            };
            match next {
                Some(v) => cur = v,
                None => return Ok(None),
            }
        }
        if cur.is_null() {
            return Ok(None);
        }
        if !self.json {
            return Ok(Some(Cow::Borrowed(cur)));
        }
        match cur {
            Value::String(s) => serde_json::from_str(s)
                .map(|v: Value| Some(Cow::Owned(v)))
                .map_err(|e| FieldError::col(self.to_string(), format!("not valid JSON: {e}"))),
            other => Err(FieldError::col(
                self.to_string(),
                format!("expected a JSON-encoded string, got {}", kind_of(other)),
            )),
        }
    }
}

impl fmt::Display for ColumnPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.json {
            f.write_str("json:")?;
        }
        f.write_str(&self.segments.join("."))
    }
}

/// An explicit mapping: canonical field ← column path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// `(canonical field, where it comes from)`, in the order written.
    pub fields: Vec<(String, ColumnPath)>,
}

impl Mapping {
    /// Parses `FIELD=PATH[,FIELD=PATH...]`.
    pub fn parse(spec: &str) -> Result<Mapping> {
        let bad = |reason: String| DataError::Mapping {
            spec: spec.to_string(),
            reason,
        };
        let mut fields = Vec::new();
        for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, path) = part
                .split_once('=')
                .ok_or_else(|| bad(format!("{part:?} is not FIELD=PATH")))?;
            let field = field.trim();
            if field.is_empty() || field.contains('.') {
                return Err(bad(format!("{field:?} is not a canonical field name")));
            }
            if fields
                .iter()
                .any(|(f, _): &(String, ColumnPath)| f == field)
            {
                return Err(bad(format!("`{field}` is mapped twice")));
            }
            fields.push((
                field.to_string(),
                ColumnPath::parse(path.trim()).map_err(bad)?,
            ));
        }
        if fields.is_empty() {
            return Err(bad("no FIELD=PATH pair".into()));
        }
        Ok(Mapping { fields })
    }

    /// Builds the canonical object of a row: each mapped field from its column (absent or null
    /// columns are left out, so that the kind's own checks name what is missing).
    pub fn apply(&self, row: &Map<String, Value>) -> FieldResult<Map<String, Value>> {
        let mut out = Map::new();
        for (field, path) in &self.fields {
            if let Some(v) = path.get(row)? {
                out.insert(field.clone(), v.into_owned());
            }
        }
        Ok(out)
    }

    /// The columns the mapping reads (top-level names), for detection messages.
    pub fn columns(&self) -> impl Iterator<Item = &str> {
        self.fields.iter().map(|(_, p)| p.segments[0].as_str())
    }
}

/// How a dataset's rows are mapped: a built-in preset or an explicit mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schema {
    /// A built-in layout.
    Preset(Preset),
    /// Canonical fields taken from the named columns.
    Mapping(Mapping),
}

impl Schema {
    /// Parses `--schema`: a preset name, or a mapping (anything with `=`).
    pub fn parse(text: &str) -> Result<Schema> {
        if text.contains('=') {
            return Mapping::parse(text).map(Schema::Mapping);
        }
        Preset::from_name(text)
            .map(Schema::Preset)
            .ok_or_else(|| DataError::Mapping {
                spec: text.to_string(),
                reason: format!(
                    "neither a FIELD=PATH mapping nor a preset; presets: {}",
                    Preset::ALL
                        .iter()
                        .map(|p| p.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }

    /// The schema's name, as `inspect` prints it.
    pub fn describe(&self) -> String {
        match self {
            Schema::Preset(p) => p.name().to_string(),
            Schema::Mapping(m) => m
                .fields
                .iter()
                .map(|(f, p)| format!("{f}={p}"))
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_reach_nested_fields_list_items_and_json_strings() {
        let row = json!({
            "reward_model": {"ground_truth": "42", "style": "rule"},
            "prompt": [{"role": "user", "content": "q"}],
            "io": "{\"inputs\": [\"1\"], \"outputs\": [\"2\"]}",
            "bad": "{nope",
            "n": null,
        });
        let row = row.as_object().unwrap();
        let get = |p: &str| {
            ColumnPath::parse(p)
                .unwrap()
                .get(row)
                .map(|v| v.map(Cow::into_owned))
        };
        assert_eq!(get("reward_model.ground_truth").unwrap(), Some(json!("42")));
        assert_eq!(get("prompt.0.content").unwrap(), Some(json!("q")));
        assert_eq!(get("json:io").unwrap().unwrap()["outputs"], json!(["2"]));
        assert_eq!(get("n").unwrap(), None);
        assert_eq!(get("missing.x").unwrap(), None);
        let e = get("json:bad").unwrap_err();
        assert_eq!(e.column.as_deref(), Some("json:bad"));
        let e = get("json:reward_model").unwrap_err();
        assert!(e.reason.contains("an object"), "{e:?}");
    }

    #[test]
    fn mappings_parse_and_apply() {
        let m = Mapping::parse("prompt=question, answer=reward_model.ground_truth").unwrap();
        let row = json!({"question": "q", "reward_model": {"ground_truth": "1"}});
        let out = m.apply(row.as_object().unwrap()).unwrap();
        assert_eq!(Value::Object(out), json!({"prompt": "q", "answer": "1"}));
        assert!(Mapping::parse("prompt").is_err());
        assert!(Mapping::parse("a=x,a=y").is_err());
        assert!(Mapping::parse("a=x..y").is_err());
        assert!(matches!(
            Schema::parse("verl").unwrap(),
            Schema::Preset(Preset::Verl)
        ));
        assert!(Schema::parse("no-such")
            .unwrap_err()
            .to_string()
            .contains("presets"));
    }
}
