//! Rows drawn by number in a seeded shuffled order, as the actor's prompt schedule draws them:
//! draws/s, what the file reads did (opens, row groups decoded), the group cache's size, and
//! the process's peak RSS (`VmHWM`), to check that random access stays bounded in memory.
//!
//!   cargo run --release -p cascade-shared --example draw_rows -- FILE [DRAWS] [--domain D]

use std::time::Instant;

use cascade_shared::data::{DataReader, DataSpec};
use cascade_shared::StageKind;

fn peak_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let path = args
        .first()
        .ok_or("usage: draw_rows FILE [DRAWS] [--domain D]")?;
    let draws: Option<u64> = args.get(1).and_then(|a| a.parse().ok());
    let domain = args
        .iter()
        .position(|a| a == "--domain")
        .and_then(|i| args.get(i + 1))
        .map(|d| StageKind::parse(d).ok_or(format!("unknown domain {d}")))
        .transpose()?;
    let reader = DataReader::open(&DataSpec {
        path: path.clone(),
        domain,
        ..DataSpec::default()
    })?;
    let n = reader.len();
    let draws = draws.unwrap_or(n).min(n);
    // A seeded permutation (an LCG's keys, sorted), cut to `draws`.
    let mut x = 42u64;
    let mut order: Vec<(u64, u64)> = (0..n)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 11, i)
        })
        .collect();
    order.sort_unstable();
    order.truncate(draws as usize);
    let rss_open = peak_rss_kb();
    let t = Instant::now();
    let mut failed = 0u64;
    for &(_, i) in &order {
        if reader.get(i).is_err() {
            failed += 1;
        }
    }
    let dt = t.elapsed().as_secs_f64();
    let c = reader.files()[0].counts();
    let (cache_bytes, cache_groups) = reader.cached_groups();
    println!(
        "{path}: {n} rows, {draws} draws in {dt:.2} s ({:.0} draws/s), {failed} not accepted; \
         opens {}, row groups decoded {}, cache {cache_groups} groups / {} KB; peak RSS {} KB \
         after opening, {} KB after the draws",
        draws as f64 / dt,
        c.opens(),
        c.group_decodes(),
        cache_bytes / 1024,
        rss_open,
        peak_rss_kb()
    );
    Ok(())
}
