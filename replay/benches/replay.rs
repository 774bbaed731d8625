//! Replay log benchmark: append+read throughput against memcpy of the same bytes in the same
//! run, and cross-process latency from `append` returning to `poll` returning the record.
//!
//! `cargo bench -p cascade-replay --bench replay`. Environment: `REPLAY_BENCH_MB` (default
//! 1024) bytes per throughput run; `REPLAY_BENCH_REPS` (default 5) interleaved runs per case,
//! the median is printed; `REPLAY_BENCH_SIZES` record sizes in bytes (default `4096,262144`);
//! `REPLAY_BENCH_CASES` a comma-separated subset of `serial,fresh,pipelined,kernels,latency`
//! (default all; `fresh` adds the fresh-log column and the fresh-memory baselines to `serial`);
//! `REPLAY_BENCH_VERBOSE` prints every run (and, for `serial`, append and poll GB/s apart);
//! `REPLAY_BENCH_NO_LATENCY` skips the latency part.
//!
//! Cases:
//! - `serial`: a writer and a reader in one thread, alternating (append 8 MiB, then poll it),
//!   so the time is the sum of the writer's pass (copy + CRC) and the reader's (CRC check);
//!   the writer's helper thread runs beside it. The reader publishes its consumed position
//!   every 64 MiB (a learner does after its snapshots, far less often), so retention recycles
//!   segments; "without publishing" subtracts that time. "Running log": warmed up through 16
//!   segments, so its files are recycled ones (an actor's steady state); "fresh log": a new
//!   directory per run, whose first segments are new files.
//! - `pipelined`: how actors and the learner run: a writer child process appends while this
//!   process polls, concurrently, on a running log (16-segment warm-up); each run starts on
//!   an empty pipeline and is timed from the first `append` (its timestamp travels in the
//!   record) to the last record returned by `poll`, CRC-checked.
//! - `kernels`: the CRC32C kernels alone against memcpy of the same records.
//! - `latency`: 3000 64-byte records 100-500 µs apart from a child process, the time from
//!   before `append` to `poll` returning them (doorbell wake-up).
//!
//! The memcpy baselines are single-threaded: memcpy into a pre-faulted 64 MiB buffer
//! ("reused") is the ratio's denominator. On the development machine (2-core Zen 5 KVM guest,
//! ext4, kernel 6.18, load average 1.1-1.3 from another agent's work), `REPLAY_BENCH_MB=512`,
//! median of three runs, GB/s (range of the runs' ratios to memcpy reused, 23-41 GB/s);
//! details and the code before for comparison in the crate docs (`replay/src/lib.rs`,
//! Performance):
//!
//! | record | serial, running log | without publishing | fresh log | two processes |
//! |---|---|---|---|---|
//! | 4 KiB | 8.97 (0.33-0.35×) | 9.85 (0.37-0.38×) | 5.38 | 14.50 (0.49-0.57×) |
//! | 256 KiB | 16.17 (0.41-0.51×) | 18.28 (0.47-0.57×) | 8.38 | 18.82 (0.49-0.87×) |
//!
//! Latency: median 9.7 µs, p99 37 µs. Kernels (256 KiB, memcpy 38 GB/s): CRC of a hot record
//! 64, of records from memory 42, copy + CRC 27.5, with streaming stores 41.

use std::hint::black_box;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cascade_replay::{ReaderOptions, RecordMeta, ReplayReader, ReplayWriter, WriterOptions};

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own; CLOCK_MONOTONIC is shared by all
    // processes of the machine, so timestamps compare across processes.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

const SEGMENT: usize = 64 << 20;

/// A writer and the reader following it, in a directory of their own.
struct Log {
    _root: tempfile::TempDir,
    w: ReplayWriter,
    r: ReplayReader,
}

impl Log {
    fn new() -> Log {
        let root = tempfile::tempdir().unwrap();
        let w = ReplayWriter::open(root.path().join("actor-0"), opts()).unwrap();
        let r = ReplayReader::open(root.path(), reader_opts(), None).unwrap();
        Log { _root: root, w, r }
    }
}

/// The bench's reader: batches of up to 1 MiB records.
fn reader_opts() -> ReaderOptions {
    ReaderOptions {
        max_batch: 1 << 20,
        ..Default::default()
    }
}

fn opts() -> WriterOptions {
    WriterOptions {
        segment_size: SEGMENT as u64,
        max_segments: 8,
        ..Default::default()
    }
}

/// GB/s of append (writer) + poll with CRC check (reader), one process, interleaved in batches,
/// continuing `log`; and the same without the time spent publishing the consumed position
/// (two fsyncs every 64 MiB, the consumer's cost, which grows with other I/O on the machine).
fn replay_throughput(log: &mut Log, size: usize, total: usize) -> (f64, f64) {
    let Log { w, r, .. } = log;
    let payload: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    let n = total / size;
    let batch = (8 << 20) / size;
    let start = Instant::now();
    let mut publishing = Duration::ZERO;
    let mut read = 0;
    let mut checksum = 0u64;
    let (mut writing, mut reading) = (Duration::ZERO, Duration::ZERO);
    while read < n {
        let t = Instant::now();
        for _ in 0..batch.min(n - read) {
            w.append(RecordMeta::default(), &payload).unwrap();
        }
        let t2 = Instant::now();
        writing += t2 - t;
        for rec in r.poll(Duration::from_secs(1)).unwrap() {
            checksum += rec.payload[size - 1] as u64;
            read += 1;
        }
        reading += t2.elapsed();
        // The learner publishes its consumed position rarely (after snapshots); every 64 MiB
        // here keeps retention (and so recycling) running without timing one fsync per batch.
        if read % ((64 << 20) / size) == 0 {
            let t = Instant::now();
            r.publish_consumed().unwrap();
            publishing += t.elapsed();
        }
    }
    black_box(checksum);
    let elapsed = start.elapsed();
    let gbs = |t: Duration| (n * size) as f64 / t.as_secs_f64() / 1e9;
    if std::env::var_os("REPLAY_BENCH_VERBOSE").is_some() {
        eprintln!(
            "  {size} B: append {:.2} GB/s, poll {:.2} GB/s, publishing {:.1} ms",
            gbs(writing),
            gbs(reading),
            publishing.as_secs_f64() * 1e3
        );
    }
    (gbs(elapsed), gbs(elapsed - publishing))
}

/// GB/s of copying the same number of records into one pre-faulted buffer as large as a segment
/// (64 MiB, twice the L3 of the machines we measure on), reused: the copy itself, with no page
/// faults. The strict baseline.
fn memcpy_reused(size: usize, total: usize) -> f64 {
    let src: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    let mut dst = vec![1u8; SEGMENT];
    let n = total / size;
    let start = Instant::now();
    let mut at = 0;
    for _ in 0..n {
        if at + size > dst.len() {
            at = 0;
        }
        dst[at..at + size].copy_from_slice(black_box(&src));
        at += size;
    }
    black_box(&dst);
    (n * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// GB/s of copying the same number of records into fresh memory, one new 64 MiB anonymous
/// mapping (with `MADV_HUGEPAGE`, as the log's segments) per 64 MiB, unmapped when full: what
/// any log that never reuses published memory pays for first-touch page faults.
fn memcpy_fresh(size: usize, total: usize) -> f64 {
    let src: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    let n = total / size;
    let per_buf = SEGMENT / size;
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        // SAFETY: a private anonymous mapping of SEGMENT bytes, written only through the slice
        // below while mapped, unmapped once at the end of this block.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                SEGMENT,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            libc::madvise(p, SEGMENT, libc::MADV_HUGEPAGE);
            let dst = std::slice::from_raw_parts_mut(p as *mut u8, SEGMENT);
            for i in 0..per_buf.min(n - done) {
                dst[i * size..(i + 1) * size].copy_from_slice(black_box(&src));
            }
            black_box(&dst[..]);
            libc::munmap(p, SEGMENT);
        }
        done += per_buf;
    }
    (n * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// GB/s of copying the same number of records into fresh page-cache pages, single-threaded:
/// per 64 MiB, create a file next to the log's, `posix_fallocate` it, map it (`MADV_HUGEPAGE`),
/// copy the records in, unmap and delete it. No header, CRC, reader or fsync: the kernel's cost
/// of new file pages plus the copy, i.e. the ceiling of any log that never reuses published
/// pages, on this filesystem and kernel.
fn memcpy_file(size: usize, total: usize) -> f64 {
    use std::os::unix::io::AsRawFd;
    let root = tempfile::tempdir().unwrap();
    let src: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    let n = total / size;
    let per_file = SEGMENT / size;
    let start = Instant::now();
    let mut done = 0;
    while done < n {
        let path = root.path().join("f");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        // SAFETY: plain syscall on a descriptor we own.
        assert_eq!(
            unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, SEGMENT as libc::off_t) },
            0
        );
        // SAFETY: the file is ours alone, SEGMENT bytes long, and is neither truncated nor
        // touched by anyone else while mapped.
        let mut map = unsafe { memmap2::MmapMut::map_mut(&file).unwrap() };
        let _ = map.advise(memmap2::Advice::HugePage);
        for i in 0..per_file.min(n - done) {
            map[i * size..(i + 1) * size].copy_from_slice(black_box(&src));
        }
        black_box(&map[..]);
        drop(map);
        drop(file);
        std::fs::remove_file(&path).unwrap();
        done += per_file;
    }
    (n * size) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// GB/s of the CRC32C kernels on the same records, single-threaded: `[memcpy into a reused
/// 64 MiB buffer, CRC of one hot record, CRC of the records in a 64 MiB buffer (as the reader
/// checks them), copy+CRC into a 64 MiB buffer (as append writes them), the same with streaming
/// stores]`. Records sit 32 bytes past an 8-byte-aligned slot start, as in a segment.
fn kernels(size: usize, total: usize) -> [f64; 5] {
    use cascade_replay::bench_internals::{crc32c_append, crc32c_copy};
    let src: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    let mut dst = vec![1u8; SEGMENT];
    let n = total / size;
    let stride = (size + 32 + 7) & !7;
    let slots = SEGMENT / stride;
    let gbs = |t: Instant| (n * size) as f64 / t.elapsed().as_secs_f64() / 1e9;
    let mut out = [0.0; 5];
    let t = Instant::now();
    for i in 0..n {
        let at = (i % slots) * stride + 32;
        dst[at..at + size].copy_from_slice(black_box(&src));
    }
    black_box(&dst);
    out[0] = gbs(t);
    let t = Instant::now();
    let mut x = 0u32;
    for _ in 0..n {
        x ^= crc32c_append(0, black_box(&src));
    }
    black_box(x);
    out[1] = gbs(t);
    let t = Instant::now();
    for i in 0..n {
        let at = (i % slots) * stride + 32;
        x ^= crc32c_append(0, black_box(&dst[at..at + size]));
    }
    black_box(x);
    out[2] = gbs(t);
    for (k, stream) in [(3, false), (4, true)] {
        let t = Instant::now();
        for i in 0..n {
            let at = (i % slots) * stride + 32;
            x ^= crc32c_copy(0, black_box(&src), &mut dst[at..], stream);
        }
        black_box(x);
        black_box(&dst);
        out[k] = gbs(t);
    }
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// Records per 64 MiB: the reader publishes its consumed position this often.
fn per_publish(size: usize) -> usize {
    ((64 << 20) / size).max(1)
}

/// The writer process of [`pipelined`]: `warm` records, then `reps` runs of `n` records, each
/// started once the reader has consumed everything before it (an empty pipeline); the first
/// record of a run carries the time just before its `append`.
fn pipeline_writer(dir: &str, size: usize, warm: usize, n: usize, reps: usize) {
    let mut w = ReplayWriter::open(dir, opts()).unwrap();
    let mut payload: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    for _ in 0..warm {
        w.append(RecordMeta::default(), &payload).unwrap();
    }
    for rep in 0..reps {
        let start = (warm + rep * n) as u64;
        while cascade_replay::read_min_consumed(w.dir()).unwrap() < Some(start) {
            std::thread::sleep(Duration::from_micros(200));
        }
        payload[..8].copy_from_slice(&now_ns().to_le_bytes());
        w.append(RecordMeta::default(), &payload).unwrap();
        for _ in 1..n {
            w.append(RecordMeta::default(), &payload).unwrap();
        }
    }
}

/// Two processes, as actors and the learner run: a child process appends `reps` runs of
/// `total` bytes of `size`-byte records, after a warm-up of 16 segments (so the log is a
/// running one, recycling its files), while this process polls them concurrently, publishing
/// its consumed position every 64 MiB. Per run: delivered GB/s from the first `append` (its
/// timestamp travels in the record) to the last record returned by `poll` (CRC-checked), and
/// this process's time spent publishing; then `after_run` (the interleaved memcpy baseline,
/// while the writer waits for the next run).
fn pipelined(
    size: usize,
    total: usize,
    reps: usize,
    mut after_run: impl FnMut(),
) -> Vec<(f64, Duration)> {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    let n = total / size;
    let warm = 16 * SEGMENT / size;
    // Create the directory (and doorbell) first so the reader finds it at once.
    drop(ReplayWriter::open(&dir, opts()).unwrap());
    let mut r = ReplayReader::open(root.path(), reader_opts(), None).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--pipeline-writer",
            dir.to_str().unwrap(),
            &size.to_string(),
            &warm.to_string(),
            &n.to_string(),
            &reps.to_string(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = Vec::new();
    let mut read = 0;
    let mut checksum = 0u64;
    let (mut t0, mut publishing) = (0u64, Duration::ZERO);
    while read < warm + reps * n {
        for rec in r.poll(Duration::from_secs(10)).unwrap() {
            if read >= warm && (read - warm).is_multiple_of(n) {
                t0 = u64::from_le_bytes(rec.payload[..8].try_into().unwrap());
                publishing = Duration::ZERO;
            }
            checksum += rec.payload[size - 1] as u64;
            read += 1;
            let run_end = read > warm && (read - warm).is_multiple_of(n);
            if run_end {
                let secs = (now_ns() - t0) as f64 / 1e9;
                out.push(((n * size) as f64 / secs / 1e9, publishing));
                // Before publishing the position, which lets the writer start the next run.
                after_run();
            }
            if read.is_multiple_of(per_publish(size)) || read == warm || run_end {
                let t = Instant::now();
                r.publish_consumed().unwrap();
                if read > warm && !run_end {
                    publishing += t.elapsed();
                }
            }
        }
    }
    black_box(checksum);
    assert!(child.wait().unwrap().success());
    out
}

fn latency_writer(dir: &str, count: usize) {
    let mut w = ReplayWriter::open(dir, opts()).unwrap();
    let mut x = 0x1234_5678u64;
    for _ in 0..count {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_micros(100 + x % 400));
        let mut payload = [0u8; 64];
        // The timestamp is taken before append and sent in the record; the latency measured
        // therefore includes the append itself.
        payload[..8].copy_from_slice(&now_ns().to_le_bytes());
        w.append(RecordMeta::default(), &payload).unwrap();
    }
}

fn latency(count: usize) -> (f64, f64) {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("actor-0");
    // Create the directory (and doorbell) first so the reader finds it at once.
    drop(ReplayWriter::open(&dir, opts()).unwrap());
    let mut reader = ReplayReader::open(root.path(), ReaderOptions::default(), None).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--latency-writer",
            dir.to_str().unwrap(),
            &count.to_string(),
        ])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lat = Vec::with_capacity(count);
    while lat.len() < count {
        for rec in reader.poll(Duration::from_secs(10)).unwrap() {
            let t = now_ns();
            let sent = u64::from_le_bytes(rec.payload[..8].try_into().unwrap());
            lat.push((t - sent) as f64 / 1e3);
        }
    }
    child.wait().unwrap();
    lat.sort_by(|a, b| a.partial_cmp(b).unwrap());
    (lat[lat.len() / 2], lat[lat.len() * 99 / 100])
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() >= 7 && args[1] == "--pipeline-writer" {
        let num = |i: usize| args[i].parse().unwrap();
        pipeline_writer(&args[2], num(3), num(4), num(5), num(6));
        return;
    }
    if args.len() >= 4 && args[1] == "--latency-writer" {
        latency_writer(&args[2], args[3].parse().unwrap());
        return;
    }
    if args.iter().any(|a| a == "--list") {
        return;
    }
    let env = |name: &str| std::env::var(name).ok();
    let total = env("REPLAY_BENCH_MB").map_or(1024, |v| v.parse().unwrap()) << 20;
    let reps: usize = env("REPLAY_BENCH_REPS").map_or(5, |v| v.parse().unwrap());
    let verbose = env("REPLAY_BENCH_VERBOSE").is_some();
    let sizes: Vec<usize> = env("REPLAY_BENCH_SIZES").map_or(vec![4 << 10, 256 << 10], |v| {
        v.split(',').map(|s| s.trim().parse().unwrap()).collect()
    });
    let cases =
        env("REPLAY_BENCH_CASES").unwrap_or("serial,fresh,pipelined,kernels,latency".into());
    let case = |name: &str| cases.split(',').any(|c| c.trim() == name);
    let with_latency = case("latency") && env("REPLAY_BENCH_NO_LATENCY").is_none();
    // Ratio of medians, and median of the per-run ratios (runs are interleaved, so a run's ratio
    // compares the log and memcpy under the same load).
    let ratios = |a: &[f64], b: &[f64]| {
        let per_run = median(a.iter().zip(b).map(|(x, y)| x / y).collect());
        (median(a.to_vec()) / median(b.to_vec()), per_run)
    };
    println!(
        "{} MiB per case, median of {reps} interleaved runs. memcpy baselines, the same records from \
         one hot source buffer: into one pre-faulted 64 MiB buffer (reused); into a fresh 64 MiB \
         MADV_HUGEPAGE anonymous mapping per 64 MiB (fresh); into a fresh fallocated, mapped, \
         then deleted 64 MiB file per 64 MiB (fresh file). Ratios: of the medians (median of \
         the per-run ratios in parentheses)",
        total >> 20
    );
    if case("serial") {
        println!();
        println!(
            "One thread, serially: append 8 MiB, then poll it (the sum of both passes' times)."
        );
        println!();
        println!(
            "| record size | running log GB/s | ratio to memcpy reused | same, without publishing | ratio | fresh log | memcpy reused GB/s | memcpy fresh GB/s | memcpy fresh file GB/s |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
    }
    for &size in sizes.iter().filter(|_| case("serial")) {
        let mut log = Log::new();
        let _ = replay_throughput(&mut log, size, 16 * SEGMENT); // warm-up: files recycled
        let mut runs: [Vec<f64>; 6] = Default::default();
        for _ in 0..reps {
            let (all, unpublished) = replay_throughput(&mut log, size, total);
            runs[0].push(all);
            runs[1].push(unpublished);
            runs[3].push(memcpy_reused(size, total));
            if case("fresh") {
                runs[2].push(replay_throughput(&mut Log::new(), size, total).0);
                runs[4].push(memcpy_fresh(size, total));
                runs[5].push(memcpy_file(size, total));
            }
        }
        if verbose {
            eprintln!(
                "{size} B: running, running without publishing, fresh log, reused, fresh, file: \
                 {runs:.2?}"
            );
        }
        let (all, unpublished) = (ratios(&runs[0], &runs[3]), ratios(&runs[1], &runs[3]));
        let [replay, without, new_log, reused, fresh, file] =
            runs.map(|r| if r.is_empty() { f64::NAN } else { median(r) });
        println!(
            "| {} KiB | {replay:.2} | {:.2} ({:.2}) | {without:.2} | {:.2} ({:.2}) | {new_log:.2} | {reused:.2} | {fresh:.2} | {file:.2} |",
            size >> 10,
            all.0,
            all.1,
            unpublished.0,
            unpublished.1,
        );
    }
    if case("pipelined") {
        println!();
        println!(
            "Two processes (a writer child process, the reader here), concurrently, running log: \
             GB/s delivered from the first append to the last record polled (CRC-checked); the \
             reader publishes its consumed position every 64 MiB, included (its median ms per \
             run shown); memcpy reused runs after each run, while the writer waits"
        );
        println!();
        println!("| record size | two processes GB/s | ratio to memcpy reused | publishing ms per run | memcpy reused GB/s |");
        println!("|---|---|---|---|---|");
    }
    for &size in sizes.iter().filter(|_| case("pipelined")) {
        let mut copies = Vec::new();
        let runs = pipelined(size, total, reps, || {
            copies.push(memcpy_reused(size, total))
        });
        if verbose {
            eprintln!("{size} B two processes (GB/s, publishing), memcpy: {runs:.2?} {copies:.2?}");
        }
        let gbs: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let (ratio, per_run) = ratios(&gbs, &copies);
        let publishing = median(runs.iter().map(|r| r.1.as_secs_f64() * 1e3).collect());
        println!(
            "| {} KiB | {:.2} | {ratio:.2} ({per_run:.2}) | {publishing:.1} | {:.2} |",
            size >> 10,
            median(gbs),
            median(copies),
        );
    }
    if case("kernels") {
        println!();
        println!(
            "CRC32C kernels alone, one thread, GB/s (ratio to memcpy of the same records, same run):"
        );
        println!();
        println!("| record size | memcpy GB/s | CRC, hot record | CRC, records in 64 MiB (reader) | copy+CRC into 64 MiB (append) | same, streaming stores |");
        println!("|---|---|---|---|---|---|");
    }
    for &size in sizes.iter().filter(|_| case("kernels")) {
        let mut runs: [Vec<f64>; 5] = Default::default();
        for _ in 0..reps {
            for (r, v) in runs.iter_mut().zip(kernels(size, total)) {
                r.push(v);
            }
        }
        if verbose {
            eprintln!("{size} B kernels: {runs:.1?}");
        }
        let m = runs.map(median);
        println!(
            "| {} KiB | {:.1} | {:.1} ({:.2}x) | {:.1} ({:.2}x) | {:.1} ({:.2}x) | {:.1} ({:.2}x) |",
            size >> 10,
            m[0],
            m[1],
            m[1] / m[0],
            m[2],
            m[2] / m[0],
            m[3],
            m[3] / m[0],
            m[4],
            m[4] / m[0]
        );
    }
    if with_latency {
        let (median, p99) = latency(3000);
        println!();
        println!(
            "cross-process latency (append → poll), 3000 records: median {median:.1} µs, p99 {p99:.1} µs"
        );
    }
}
