//! Dataset entries of the config (`stages[i].dataset`, `stages[i].heldout`,
//! `reward_model.dataset`, `reward_model.heldout`).
//!
//! An entry is either a plain path (`dataset = "data/math.jsonl"`, as before) or a table naming
//! the file(s) and, optionally, how to read them:
//!
//! ```toml
//! dataset = { path = "data/train-*.parquet", schema = "verl" }
//! dataset = { path = "data/shards/", schema = { prompt = "question", answer = "json:meta.answer" } }
//! heldout = { path = "lcb.jsonl", schema = "livecodebench", since = "2024-08-01" }
//! ```
//!
//! `path` is a file, a glob or a directory of `.jsonl` / `.parquet` shards, relative to the
//! config file. `schema` is a preset name or a column mapping (a `FIELD=PATH,...` string or a
//! table of canonical field → column path), exactly as `cascade data inspect --schema` takes
//! it; without one the layout is recognised from the columns. `since` / `until` keep the
//! LiveCodeBench problems whose `contest_date` is in `[since, until)`.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::error::{invalid, Result};
use super::RunConfig;
use crate::data::{self, DataSpec, Kind, Schema};
use crate::StageKind;

/// One dataset entry: where the rows are and, optionally, their schema.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DatasetEntry {
    /// A file, a glob or a directory of shards (relative to the config file).
    pub path: PathBuf,
    /// A preset name or a `FIELD=PATH,...` column mapping; `None`: recognised from the columns.
    pub schema: Option<String>,
    /// LiveCodeBench: keep problems with `contest_date` ≥ this.
    pub since: Option<String>,
    /// LiveCodeBench: keep problems with `contest_date` < this.
    pub until: Option<String>,
}

impl DatasetEntry {
    /// A plain path entry.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        DatasetEntry {
            path: path.into(),
            ..DatasetEntry::default()
        }
    }

    /// Whether the entry is a bare path (written back as one).
    fn is_plain(&self) -> bool {
        self.schema.is_none() && self.since.is_none() && self.until.is_none()
    }

    /// Checks the schema text; `key` names the entry in the error.
    pub(crate) fn validate(&self, key: &str) -> Result<()> {
        if self.path.as_os_str().is_empty() {
            return Err(invalid(format!("{key}.path"), "must not be empty"));
        }
        if let Some(s) = &self.schema {
            Schema::parse(s).map_err(|e| invalid(format!("{key}.schema"), e.to_string()))?;
        }
        Ok(())
    }

    /// Whether `path` names several files (a glob or a directory) rather than one.
    pub fn is_pattern(&self) -> bool {
        self.path.to_string_lossy().contains(['*', '?', '['])
    }
}

impl AsRef<Path> for DatasetEntry {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl From<&str> for DatasetEntry {
    fn from(path: &str) -> Self {
        DatasetEntry::new(path)
    }
}

impl RunConfig {
    /// What [`crate::data::DataReader`] needs to read `entry`: its path resolved against the
    /// config's directory, its schema parsed, and the kind of rows (and RL domain) wanted.
    pub fn data_spec(
        &self,
        entry: &DatasetEntry,
        kind: Kind,
        domain: Option<StageKind>,
    ) -> data::Result<DataSpec> {
        Ok(DataSpec {
            path: self.resolve(&entry.path).display().to_string(),
            schema: entry.schema.as_deref().map(Schema::parse).transpose()?,
            kind: Some(kind),
            domain,
            since: entry.since.clone(),
            until: entry.until.clone(),
        })
    }
}

impl super::StageConfig {
    /// The kind of rows this stage's datasets hold, and the RL domain they are checked for.
    pub fn data_kind(&self) -> (Kind, Option<StageKind>) {
        if self.is_rl() {
            (Kind::Rl, Some(self.kind))
        } else {
            (Kind::Sft, None)
        }
    }
}

const FIELDS: &[&str] = &["path", "schema", "since", "until"];

impl<'de> Deserialize<'de> for DatasetEntry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = DatasetEntry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a path (a file, a glob or a directory) or a table { path, schema, since, \
                     until }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                Ok(DatasetEntry::new(v))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut out = DatasetEntry::default();
                let mut has_path = false;
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "path" => {
                            out.path = map.next_value::<PathBuf>()?;
                            has_path = true;
                        }
                        "schema" => out.schema = Some(map.next_value::<SchemaText>()?.0),
                        "since" => out.since = Some(map.next_value()?),
                        "until" => out.until = Some(map.next_value()?),
                        other => return Err(de::Error::unknown_field(other, FIELDS)),
                    }
                }
                if !has_path {
                    return Err(de::Error::missing_field("path"));
                }
                Ok(out)
            }
        }
        d.deserialize_any(Visit)
    }
}

/// A schema as written in the config: a string, or a table of canonical field → column path
/// (turned into the `FIELD=PATH,...` text, in the order the TOML reader gives, which does not
/// change the mapping).
struct SchemaText(String);

impl<'de> Deserialize<'de> for SchemaText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visit;
        impl<'de> Visitor<'de> for Visit {
            type Value = SchemaText;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a preset name, a \"FIELD=PATH,...\" mapping, or a table of FIELD = \"PATH\"",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<Self::Value, E> {
                Ok(SchemaText(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Self::Value, A::Error> {
                let mut parts = Vec::new();
                while let Some((field, path)) = map.next_entry::<String, String>()? {
                    if field.contains([',', '=']) || path.contains([',', '=']) {
                        return Err(de::Error::custom(format!(
                            "schema entry {field} = {path:?}: names cannot hold `,` or `=`"
                        )));
                    }
                    parts.push(format!("{field}={path}"));
                }
                if parts.is_empty() {
                    return Err(de::Error::custom("an empty schema table maps no column"));
                }
                Ok(SchemaText(parts.join(",")))
            }
        }
        d.deserialize_any(Visit)
    }
}

impl Serialize for DatasetEntry {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        if self.is_plain() {
            return self.path.serialize(s);
        }
        let mut map = s.serialize_map(None)?;
        map.serialize_entry("path", &self.path)?;
        if let Some(v) = &self.schema {
            map.serialize_entry("schema", v)?;
        }
        if let Some(v) = &self.since {
            map.serialize_entry("since", v)?;
        }
        if let Some(v) = &self.until {
            map.serialize_entry("until", v)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize, Serialize, PartialEq)]
    struct Doc {
        d: DatasetEntry,
    }

    fn parse(text: &str) -> std::result::Result<DatasetEntry, String> {
        toml::from_str::<Doc>(text)
            .map(|d| d.d)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn entries_are_paths_or_tables_and_round_trip() {
        assert_eq!(
            parse("d = \"a.jsonl\"").unwrap(),
            DatasetEntry::new("a.jsonl")
        );
        let e = parse("d = { path = \"x/*.parquet\", schema = \"verl\" }").unwrap();
        assert_eq!(e.path, PathBuf::from("x/*.parquet"));
        assert_eq!(e.schema.as_deref(), Some("verl"));
        assert!(e.is_pattern());
        let e = parse(
            "[d]\npath = \"x\"\nsince = \"2024-08-01\"\n[d.schema]\nprompt = \"question\"\nanswer = \"json:meta.answer\"\n",
        )
        .unwrap();
        assert_eq!(
            e.schema.as_deref(),
            Some("answer=json:meta.answer,prompt=question")
        );
        assert_eq!(e.since.as_deref(), Some("2024-08-01"));
        e.validate("d").unwrap();
        for entry in [DatasetEntry::new("p.jsonl"), e] {
            let text = toml::to_string(&Doc { d: entry.clone() }).unwrap();
            assert_eq!(parse(&text).unwrap(), entry, "{text}");
        }
        let err = parse("d = { path = \"x\", shema = \"verl\" }").unwrap_err();
        assert!(err.contains("shema") && err.contains("schema"), "{err}");
        let err = parse("d = { schema = \"verl\" }").unwrap_err();
        assert!(err.contains("path"), "{err}");
        let bad = DatasetEntry {
            schema: Some("no-such-preset".into()),
            ..DatasetEntry::new("x")
        };
        let err = bad.validate("stages[0].dataset").unwrap_err().to_string();
        assert!(
            err.contains("stages[0].dataset.schema") && err.contains("presets"),
            "{err}"
        );
    }
}
