//! Rows drawn by number in a shuffled order (the actor's prompt schedule): every file is opened
//! once, at indexing, and read through that handle (the file is deleted before the draws, so a
//! reader that opened it again per draw fails here); Parquet row groups are decoded once while
//! they fit the reader's cache, and the cache stays within its byte bound when they do not.

use cascade_shared::data::{DataReader, DataSpec, RawFile, Row};

fn fixture(name: &str) -> String {
    format!(
        "{}/../tests/fixtures/datasets/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// A seeded permutation of `0..n` (an LCG's keys, sorted).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut x = seed;
    let mut keyed: Vec<(u64, u64)> = (0..n)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11, i)
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, i)| i).collect()
}

/// `row_groups.parquet` (1000 rows `What is i + i?` / `2i`, 16 row groups of 64), copied to a
/// directory of its own, opened, and the copy deleted.
fn opened_then_deleted_parquet() -> (tempfile::TempDir, DataReader) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rg.parquet");
    std::fs::copy(fixture("row_groups.parquet"), &path).unwrap();
    let reader = DataReader::open(&DataSpec {
        path: path.display().to_string(),
        ..DataSpec::default()
    })
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    (dir, reader)
}

fn check_row(reader: &DataReader, i: u64) {
    match reader.get(i).unwrap() {
        Row::Rl(r) => {
            assert_eq!(r.messages[0].content, format!("What is {i} + {i}?"));
            assert_eq!(r.reference["answer"], (2 * i).to_string());
        }
        other => panic!("{other:?}"),
    }
}

fn counts(reader: &DataReader) -> (u64, u64) {
    let c = reader.files()[0].counts();
    (c.opens(), c.group_decodes())
}

#[test]
fn parquet_draws_reuse_the_open_file_and_decode_each_group_once() {
    let (_dir, reader) = opened_then_deleted_parquet();
    let RawFile::Parquet(p) = &reader.files()[0] else {
        panic!()
    };
    assert_eq!(p.row_groups(), 16);
    // Opening decoded the first group once (the rows probed for detection).
    let (opens, at_open) = counts(&reader);
    assert_eq!((opens, at_open), (1, 1));
    for i in shuffled(1000, 7) {
        check_row(&reader, i);
    }
    // All 16 groups fit the default bound: each was decoded once for the 1000 draws.
    assert_eq!(counts(&reader), (1, at_open + 16));
    assert_eq!(reader.cached_groups().1, 16);
    // A second shuffled epoch decodes nothing.
    for i in shuffled(1000, 8) {
        check_row(&reader, i);
    }
    assert_eq!(counts(&reader), (1, at_open + 16));
    // A sequential pass streams through the same handle, a decode per group.
    assert_eq!(reader.rows_from(0).unwrap().count(), 1000);
    assert_eq!(counts(&reader), (1, at_open + 32));
}

#[test]
fn the_group_cache_stays_within_its_bound() {
    let (_dir, mut reader) = opened_then_deleted_parquet();
    let RawFile::Parquet(p) = &reader.files()[0] else {
        panic!()
    };
    let one = p.decode_group(0).bytes;
    assert!(one > 64 * 20, "64 rows of two short strings: {one} bytes");
    // Room for three groups (rows differ by a digit or two, so not for four).
    let bound = one * 3 + one / 2;
    reader.set_group_cache_bytes(bound);
    let (_, before) = counts(&reader);
    let order = shuffled(1000, 9);
    for &i in &order {
        check_row(&reader, i);
        let (bytes, groups) = reader.cached_groups();
        assert!(bytes <= bound, "{bytes} > {bound}");
        assert!(groups <= 3, "{groups} groups cached");
    }
    let (opens, after) = counts(&reader);
    assert_eq!(opens, 1);
    let decodes = after - before;
    // Drawing 1000 rows of 16 groups in a shuffled order with 3 cached: most draws miss, but
    // the hits (about 3 in 16) decode nothing.
    assert!(decodes > 16 && decodes < 1000, "{decodes} decodes");
    assert_eq!(reader.cached_groups().1, 3);

    // No cache: every draw decodes its group (up to the row), still through the open file.
    reader.set_group_cache_bytes(0);
    let (_, before) = counts(&reader);
    for &i in &order[..100] {
        check_row(&reader, i);
    }
    assert_eq!(counts(&reader), (1, before + 100));
    assert_eq!(reader.cached_groups(), (0, 0));
}

#[test]
fn jsonl_draws_reuse_the_open_file_from_any_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.jsonl");
    let text: String = (0..1000u64)
        .map(|i| {
            let blank = if i % 9 == 0 { "\n" } else { "" };
            format!(
                "{blank}{{\"problem\": \"What is {i} + {i}?\", \"answer\": \"{}\"}}\n",
                2 * i
            )
        })
        .collect();
    std::fs::write(&path, text).unwrap();
    let reader = DataReader::open(&DataSpec {
        path: path.display().to_string(),
        ..DataSpec::default()
    })
    .unwrap();
    std::fs::remove_file(&path).unwrap();
    let order = shuffled(1000, 3);
    std::thread::scope(|s| {
        for half in order.chunks(500) {
            let reader = &reader;
            s.spawn(move || {
                for &i in half {
                    check_row(reader, i);
                }
            });
        }
    });
    let c = reader.files()[0].counts();
    assert_eq!(c.opens(), 1);
    assert!(reader.get(1000).is_err());
}
