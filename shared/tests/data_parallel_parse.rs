//! A sequential pass over JSONL parses its lines a batch at a time on several threads: the rows,
//! their order, their numbers and every rejection (with its file and line) are the same for
//! any thread count, across files, from any start, with blank and broken lines, and when lines
//! are long enough to cut a batch by bytes.

use std::io::Write;
use std::path::Path;

use cascade_shared::data::{DataReader, DataSpec, Outcome, ReadRow};
use cascade_shared::StageKind;

/// Math rows `What is i + i?` / `2i`, with a blank line every 97 lines, a line that is not
/// JSON every 251, a row without `answer` every 389 and `pad` bytes of padding per row.
fn write_file(path: &Path, first: usize, rows: usize, pad: usize) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let padding = "x".repeat(pad);
    for i in first..first + rows {
        if i % 97 == 5 {
            writeln!(f).unwrap();
        }
        if i % 251 == 7 {
            writeln!(f, "{{\"problem\": \"broken").unwrap();
        } else if i % 389 == 11 {
            writeln!(
                f,
                "{{\"problem\": \"What is {i} + {i}?\", \"pad\": \"{padding}\"}}"
            )
            .unwrap();
        } else {
            writeln!(
                f,
                "{{\"problem\": \"What is {i} + {i}?\", \"answer\": \"{}\", \"pad\": \"{padding}\"}}",
                2 * i
            )
            .unwrap();
        }
    }
}

fn open(path: &str, threads: usize) -> DataReader {
    let mut reader = DataReader::open(&DataSpec {
        path: path.to_string(),
        domain: Some(StageKind::Math),
        ..DataSpec::default()
    })
    .unwrap();
    reader.set_parse_threads(threads);
    reader
}

fn pass(reader: &DataReader, range: std::ops::Range<u64>) -> Vec<ReadRow> {
    reader
        .rows_in(range)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

#[test]
fn rows_are_the_same_for_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("a.jsonl"), 0, 3000, 0);
    write_file(&dir.path().join("b.jsonl"), 3000, 1500, 0);
    let pattern = dir.path().display().to_string();
    let one = open(&pattern, 1);
    let all = pass(&one, 0..one.len());
    // Blank lines are not rows; every other line is.
    assert_eq!(all.len(), 4500);
    let rejected: Vec<_> = all
        .iter()
        .filter_map(|r| match &r.outcome {
            Outcome::Rejected(e) => Some(e),
            _ => None,
        })
        .collect();
    assert!(rejected.len() > 20, "{}", rejected.len());
    assert!(rejected
        .iter()
        .any(|e| e.reason.contains("not valid JSON") && e.path.ends_with("b.jsonl")));
    // Line numbers count blank lines: row 7 is on line 8 after the blank line before row 5.
    let broken = all.iter().find(|r| r.index == 7).unwrap();
    assert_eq!(broken.row_no, 9);
    assert!(matches!(&broken.outcome, Outcome::Rejected(e) if e.row == 9));
    for threads in [2, 3, 8] {
        let many = open(&pattern, threads);
        assert_eq!(pass(&many, 0..many.len()), all, "{threads} threads");
        // From inside a file, across the files' boundary, and a short range.
        for range in [1000..4200, 2990..3010, 4499..4500, 17..18] {
            assert_eq!(
                pass(&many, range.clone()),
                all[range.start as usize..range.end as usize],
                "{threads} threads, rows {range:?}"
            );
        }
    }
}

#[test]
fn long_lines_cut_batches_by_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.jsonl");
    // 300 rows of ~64 KiB: 8 MiB of lines is reached after about 128 rows.
    write_file(&path, 0, 300, 64 << 10);
    let pattern = path.display().to_string();
    let one = open(&pattern, 1);
    let all = pass(&one, 0..one.len());
    assert_eq!(all.len(), 300);
    assert_eq!(pass(&open(&pattern, 4), 0..300), all);
}
