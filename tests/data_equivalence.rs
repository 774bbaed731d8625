//! The trainer's dataset readers (`cascade_shared::data`, as the actor's `Dataset`, the
//! learner's `load_sft` and `load_pairs` use it) give, on our canonical JSONL (the tiny
//! default's files), exactly what the readers they replaced gave. Those former readers are kept
//! here verbatim ([`former`]) as the reference: RL prompts of each domain and the held-out splits,
//! SFT conversations (tokenized with the tiny tokenizer) and preference pairs.

use cascade_actor::dataset::Dataset;
use cascade_datagen::{write_tiny, Domain, TinySizes};
use cascade_learner::reward_train::load_pairs;
use cascade_learner::sft::load_sft;
use cascade_shared::chat::{Chat, ChatTemplate};
use cascade_shared::data::{DataReader, DataSpec, Kind, Outcome, Row};
use cascade_shared::tokenizer::{tiny_tokenizer, Tokenizer, TokenizerConfig};
use cascade_shared::StageKind;

/// The readers the trainer used before `cascade_shared::data` (actor `dataset.rs`, learner
/// `sft.rs` / `reward_train/data.rs` at the merge of the data core), errors reduced to strings.
mod former {
    use cascade_shared::chat::{Chat, Message};
    use cascade_shared::{Mode, StageKind};
    use serde_json::Value;

    pub struct PromptRecord {
        pub id: u64,
        pub messages: Vec<Message>,
        pub reference: Value,
    }

    fn required_fields(kind: StageKind) -> &'static [&'static [&'static str]] {
        match kind {
            StageKind::Math => &[&["answer"]],
            StageKind::If => &[&["instruction_id_list"], &["kwargs"]],
            StageKind::Code => &[&["tests", "test_code"]],
            StageKind::Swe => &[&["gold_patch"]],
            StageKind::Rlhf | StageKind::Sft => &[],
        }
    }

    fn parse_line(text: &str, default_id: u64, kind: StageKind) -> Result<PromptRecord, String> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        let obj = value.as_object().ok_or("expected a JSON object")?;
        let messages = match (obj.get("prompt"), obj.get("messages")) {
            (Some(Value::String(p)), None) => vec![Message::user(p.clone())],
            (None, Some(Value::Array(list))) => {
                let mut out = Vec::with_capacity(list.len());
                for (i, m) in list.iter().enumerate() {
                    let role = m.get("role").and_then(Value::as_str);
                    let content = m.get("content").and_then(Value::as_str);
                    match (role, content) {
                        (Some(r), Some(c)) => out.push(Message::new(r, c)),
                        _ => {
                            return Err(format!("messages[{i}] needs string `role` and `content`"))
                        }
                    }
                }
                if out.last().map(|m| m.role.as_str()) != Some("user") {
                    return Err("`messages` must end with a user turn".into());
                }
                out
            }
            _ => return Err("no usable `prompt` or `messages`".into()),
        };
        let id = match obj.get("id") {
            None => default_id,
            Some(v) => v.as_u64().ok_or("`id` must be a non-negative integer")?,
        };
        if kind == StageKind::Code
            && obj.contains_key("test_code")
            && !obj.contains_key("entry_point")
        {
            return Err("`test_code` needs `entry_point`".into());
        }
        for alternatives in required_fields(kind) {
            if !alternatives.iter().any(|f| obj.contains_key(*f)) {
                return Err(format!(
                    "a {kind} prompt needs `{}`",
                    alternatives.join("` or `")
                ));
            }
        }
        Ok(PromptRecord {
            id,
            messages,
            reference: value,
        })
    }

    pub fn load_prompts(text: &str, kind: StageKind) -> Vec<PromptRecord> {
        let mut prompts = Vec::new();
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            let default_id = prompts.len() as u64;
            prompts.push(parse_line(line, default_id, kind).unwrap());
        }
        prompts
    }

    /// `(ids, trained, mode)` of each conversation.
    pub fn load_sft(text: &str, chat: &Chat) -> Vec<(Vec<u32>, Vec<bool>, Mode)> {
        let mut out = Vec::new();
        for line in text.lines() {
            if line.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(line).unwrap();
            let list = value.get("messages").and_then(Value::as_array).unwrap();
            let messages: Vec<Message> = list
                .iter()
                .map(|m| {
                    Message::new(
                        m.get("role").and_then(Value::as_str).unwrap(),
                        m.get("content").and_then(Value::as_str).unwrap(),
                    )
                })
                .collect();
            assert!(messages.iter().any(|m| m.role == "assistant"));
            let mode = match value.get("mode") {
                None => Mode::Think,
                Some(Value::String(s)) => Mode::parse(s).unwrap(),
                Some(other) => panic!("mode {other}"),
            };
            let enc = chat.encode_sft(&messages, mode).unwrap();
            out.push((enc.ids, enc.assistant_mask, mode));
        }
        out
    }

    #[derive(serde::Deserialize)]
    pub struct PreferencePair {
        pub prompt: String,
        pub chosen: String,
        pub rejected: String,
    }

    pub fn load_pairs(text: &str) -> Vec<PreferencePair> {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn rows(path: &std::path::Path, kind: Kind, domain: Option<StageKind>) -> (String, Vec<Row>) {
    let reader = DataReader::open(&DataSpec {
        path: path.display().to_string(),
        kind: Some(kind),
        domain,
        ..DataSpec::default()
    })
    .unwrap();
    let rows = reader
        .rows_from(0)
        .unwrap()
        .map(|r| match r.unwrap().outcome {
            Outcome::Accepted(row) => row,
            other => panic!("{}: {other:?}", path.display()),
        })
        .collect();
    (reader.schema().describe(), rows)
}

#[test]
fn canonical_files_read_exactly_as_the_current_readers_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let manifest = write_tiny(dir.path(), 0, &TinySizes::default()).unwrap();
    let mut checked = 0;

    for d in Domain::ALL {
        let kind = StageKind::parse(d.name()).unwrap_or(StageKind::Rlhf);
        for file in [
            format!("{}.jsonl", d.name()),
            format!("{}-heldout.jsonl", d.name()),
        ] {
            let path = dir.path().join(&file);
            if !path.exists() {
                continue;
            }
            let expected = former::load_prompts(&std::fs::read_to_string(&path).unwrap(), kind);
            let (schema, got) = rows(&path, Kind::Rl, Some(kind));
            assert_eq!(schema, "cascade-rl", "{file}");
            assert_eq!(got.len(), expected.len(), "{file}");
            for (row, want) in got.iter().zip(&expected) {
                let Row::Rl(r) = row else { panic!("{row:?}") };
                assert_eq!(
                    (r.id, &r.messages, &r.reference),
                    (want.id, &want.messages, &want.reference),
                    "{file}"
                );
            }
            // The actor's dataset, read through the index by position, gives the same prompts.
            let dataset = Dataset::load(&path, kind).unwrap();
            assert_eq!(dataset.len(), expected.len(), "{file}");
            assert_eq!(dataset.stats().rejected, 0, "{file}");
            for (i, want) in expected.iter().enumerate().rev() {
                let r = dataset.get(i).unwrap();
                assert_eq!(
                    (r.id, &r.messages, &r.reference),
                    (want.id, &want.messages, &want.reference),
                    "{file}"
                );
                assert_eq!(dataset.id(i).unwrap(), want.id);
            }
            checked += 1;
        }
    }

    let tokenizer = Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny").unwrap();
    let chat = Chat::new(tokenizer, ChatTemplate::chatml());
    let sft_path = dir.path().join("sft.jsonl");
    let expected = former::load_sft(&std::fs::read_to_string(&sft_path).unwrap(), &chat);
    let (schema, got) = rows(&sft_path, Kind::Sft, None);
    assert_eq!(schema, "cascade-sft");
    assert_eq!(got.len(), expected.len());
    for (row, want) in got.iter().zip(&expected) {
        let Row::Sft(s) = row else { panic!("{row:?}") };
        let enc = chat.encode_sft(&s.messages, s.mode).unwrap();
        assert_eq!(
            (&enc.ids, &enc.assistant_mask, s.mode),
            (&want.0, &want.1, want.2)
        );
    }
    // The learner's loader gives the same examples, in the same order.
    let loaded = load_sft(&sft_path, &chat, usize::MAX).unwrap();
    assert_eq!(loaded.examples.len(), expected.len());
    for (ex, want) in loaded.examples.iter().zip(&expected) {
        assert_eq!((&ex.ids, &ex.trained, ex.mode), (&want.0, &want.1, want.2));
    }

    for file in ["prefs.jsonl", "prefs-heldout.jsonl"] {
        let path = dir.path().join(file);
        if !path.exists() {
            continue;
        }
        let expected = former::load_pairs(&std::fs::read_to_string(&path).unwrap());
        let (schema, got) = rows(&path, Kind::Pairs, None);
        assert_eq!(schema, "cascade-pairs");
        let got: Vec<_> = got
            .into_iter()
            .map(|r| match r {
                Row::Pair(p) => (p.prompt, p.chosen, p.rejected),
                other => panic!("{other:?}"),
            })
            .collect();
        let want: Vec<_> = expected
            .into_iter()
            .map(|p| (p.prompt, p.chosen, p.rejected))
            .collect();
        let loaded: Vec<_> = load_pairs(&path)
            .unwrap()
            .into_iter()
            .map(|p| (p.prompt, p.chosen, p.rejected))
            .collect();
        assert_eq!(loaded, want, "{file}");
        assert_eq!(got, want, "{file}");
        checked += 1;
    }
    assert_eq!(checked, 12, "files compared; written: {:?}", manifest.files);
}
