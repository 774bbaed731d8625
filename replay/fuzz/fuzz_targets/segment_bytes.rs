//! Arbitrary bytes as a segment file: the reader, `inspect` and `dump` must not panic or read
//! out of bounds. Run: `cd replay/fuzz && cargo +nightly fuzz run segment_bytes -- -max_total_time=600`.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    std::fs::create_dir_all(&dir).unwrap();
    // The same bytes as the first and a later segment: the reader treats the first as finished.
    std::fs::write(dir.join(cascade_replay::segment_file_name(0)), bytes).unwrap();
    std::fs::write(dir.join(cascade_replay::segment_file_name(1)), bytes).unwrap();
    if let Ok(mut reader) = cascade_replay::ReplayReader::open(root.path(), Default::default(), None) {
        for _ in 0..4 {
            match reader.poll(Duration::ZERO) {
                Ok(batch) => batch.iter().for_each(|r| assert!(r.payload.len() <= bytes.len())),
                Err(_) => break,
            }
        }
    }
    let _ = cascade_replay::inspect(root.path());
    let _ = cascade_replay::dump(root.path(), 16);
});
