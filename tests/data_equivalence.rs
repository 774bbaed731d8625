//! The dataset readers of `cascade_shared::data` give, on our canonical JSONL (the tiny
//! default's files), exactly what the current readers give: the actor's `Dataset::load` (RL
//! prompts of each domain and the held-out splits), the learner's `load_sft` (tokenized with
//! the tiny tokenizer) and `load_pairs`. Switching the trainer over is then a drop-in change.

use cascade_actor::dataset::Dataset;
use cascade_datagen::{write_tiny, Domain, TinySizes};
use cascade_learner::reward_train::load_pairs;
use cascade_learner::sft::load_sft;
use cascade_shared::chat::{Chat, ChatTemplate};
use cascade_shared::data::{DataReader, DataSpec, Kind, Outcome, Row};
use cascade_shared::tokenizer::{tiny_tokenizer, Tokenizer, TokenizerConfig};
use cascade_shared::StageKind;

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
            let expected = Dataset::load(&path, kind).unwrap();
            let (schema, got) = rows(&path, Kind::Rl, Some(kind));
            assert_eq!(schema, "cascade-rl", "{file}");
            assert_eq!(got.len(), expected.prompts.len(), "{file}");
            for (row, want) in got.iter().zip(&expected.prompts) {
                let Row::Rl(r) = row else { panic!("{row:?}") };
                assert_eq!(
                    (r.id, &r.messages, &r.reference),
                    (want.id, &want.messages, &want.reference),
                    "{file}"
                );
            }
            checked += 1;
        }
    }

    let tokenizer = Tokenizer::new(tiny_tokenizer(), TokenizerConfig::default(), "tiny").unwrap();
    let chat = Chat::new(tokenizer, ChatTemplate::chatml());
    let sft_path = dir.path().join("sft.jsonl");
    let expected = load_sft(&sft_path, &chat, usize::MAX).unwrap();
    let (schema, got) = rows(&sft_path, Kind::Sft, None);
    assert_eq!(schema, "cascade-sft");
    assert_eq!(got.len(), expected.examples.len());
    for (row, want) in got.iter().zip(&expected.examples) {
        let Row::Sft(s) = row else { panic!("{row:?}") };
        let enc = chat.encode_sft(&s.messages, s.mode).unwrap();
        assert_eq!(
            (&enc.ids, &enc.assistant_mask, s.mode),
            (&want.ids, &want.trained, want.mode)
        );
    }

    for file in ["prefs.jsonl", "prefs-heldout.jsonl"] {
        let path = dir.path().join(file);
        if !path.exists() {
            continue;
        }
        let expected = load_pairs(&path).unwrap();
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
        assert_eq!(got, want, "{file}");
        checked += 1;
    }
    assert_eq!(checked, 12, "files compared; written: {:?}", manifest.files);
}
