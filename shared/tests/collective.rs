//! The CPU collectives (issue 17) with real sockets, ranks as threads: every operation against
//! the same sums computed here in rank order (bit-identical on every rank), uneven shards, and
//! the failures a learner group must survive with a clear error instead of a hang: a dead rank,
//! a silent rank, another config or world size, a rank given twice, a rendezvous that never answers, ranks that
//! call operations in different orders.

use std::thread;
use std::time::{Duration, Instant};

use cascade_shared::collective::{
    shard_range, Collective, CollectiveError, Rendezvous, Single, TcpGroup,
};

const HASH: u64 = 0x5eed;
const T: Duration = Duration::from_secs(10);

/// Starts `world` ranks running `body(group)`; returns each rank's result in rank order.
fn group<R: Send + 'static>(
    world: usize,
    hash_of: impl Fn(usize) -> u64,
    timeout: Duration,
    body: impl Fn(Box<dyn Collective>) -> R + Send + Sync + Clone + 'static,
) -> Vec<Result<R, CollectiveError>> {
    let rv = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = rv.local_addr().unwrap();
    let mut handles = Vec::new();
    for rank in 1..world {
        let (body, hash) = (body.clone(), hash_of(rank));
        handles.push(thread::spawn(move || {
            TcpGroup::connect(addr, rank, world, hash, timeout).map(|g| body(Box::new(g)))
        }));
    }
    let first = rv
        .accept(world, hash_of(0), timeout)
        .map(|g| body(Box::new(g)));
    let mut out = vec![first];
    out.extend(handles.into_iter().map(|h| h.join().unwrap()));
    out
}

/// Rank `r`'s data: distinct, with fractions, so that the order of additions shows in the bits.
fn data(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + rank * 104_729) % 1000) as f32 / 7.0 - 60.0 + 1e-3 * rank as f32)
        .collect()
}

/// Rank `r`'s f64 data: f32 data plus a part below f32's precision, which an f32 sum would lose.
fn data64(rank: usize, len: usize) -> Vec<f64> {
    data(rank, len)
        .into_iter()
        .enumerate()
        .map(|(i, x)| f64::from(x) + 1e-12 * (i + rank) as f64)
        .collect()
}

fn rank_order_sum64(world: usize, len: usize) -> Vec<f64> {
    let mut sum = data64(0, len);
    for r in 1..world {
        for (s, x) in sum.iter_mut().zip(data64(r, len)) {
            *s += x;
        }
    }
    sum
}

fn rank_order_sum(world: usize, len: usize) -> Vec<f32> {
    let mut sum = data(0, len);
    for r in 1..world {
        for (s, x) in sum.iter_mut().zip(data(r, len)) {
            *s += x;
        }
    }
    sum
}

#[test]
fn every_operation_matches_the_rank_order_sum_on_every_rank() {
    for world in [1, 2, 3] {
        for len in [0, 1, 5, 1000] {
            let results = group(
                world,
                |_| HASH,
                T,
                move |mut g: Box<dyn Collective>| {
                    let (rank, world) = (g.rank(), g.world_size());
                    let mut all = data(rank, len);
                    g.all_reduce_sum(&mut all).unwrap();
                    let mine = shard_range(len, rank, world);
                    let mut shard = vec![0f32; mine.len()];
                    g.reduce_scatter_sum(&data(rank, len), &mut shard).unwrap();
                    let mut gathered = vec![f32::NAN; len];
                    g.all_gather(&shard, &mut gathered).unwrap();
                    let mut bytes = vec![rank as u8; 3];
                    g.broadcast(&mut bytes, world - 1).unwrap();
                    g.barrier().unwrap();
                    let mut all64 = data64(rank, len);
                    g.all_reduce_sum_f64(&mut all64).unwrap();
                    let mut shard64 = vec![0f64; mine.len()];
                    g.reduce_scatter_sum_f64(&data64(rank, len), &mut shard64)
                        .unwrap();
                    (all, shard, gathered, bytes, all64, shard64)
                },
            );
            let sum = rank_order_sum(world, len);
            let sum64 = rank_order_sum64(world, len);
            for (rank, r) in results.into_iter().enumerate() {
                let (all, shard, gathered, bytes, all64, shard64) = r.unwrap();
                let bits64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let mine = shard_range(len, rank, world);
                assert_eq!(
                    bits64(&all64),
                    bits64(&sum64),
                    "f64, world {world} rank {rank}"
                );
                assert_eq!(
                    bits64(&shard64),
                    bits64(&sum64[mine.clone()]),
                    "f64, world {world} rank {rank}"
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&all),
                    bits(&sum),
                    "world {world} len {len} rank {rank}"
                );
                assert_eq!(bits(&shard), bits(&sum[mine]), "world {world} rank {rank}");
                assert_eq!(bits(&gathered), bits(&sum), "world {world} rank {rank}");
                assert_eq!(bytes, vec![(world - 1) as u8; 3]);
            }
        }
    }
}

#[test]
fn single_is_the_identity_and_checks_lengths() {
    let mut s = Single;
    let mut v = vec![1.5f32, 2.0];
    s.all_reduce_sum(&mut v).unwrap();
    assert_eq!(v, [1.5, 2.0]);
    let mut out = [0f32; 2];
    s.reduce_scatter_sum(&v, &mut out).unwrap();
    assert_eq!(out, [1.5, 2.0]);
    assert!(matches!(
        s.all_gather(&v, &mut [0f32; 3]),
        Err(CollectiveError::Desync { .. })
    ));
    assert!(s.broadcast(&mut [0u8; 1], 1).is_err());
    let mut v64 = vec![1.5f64, 1e-300];
    s.all_reduce_sum_f64(&mut v64).unwrap();
    let mut out64 = [0f64; 2];
    s.reduce_scatter_sum_f64(&v64, &mut out64).unwrap();
    assert_eq!(out64, [1.5, 1e-300]);
}

#[test]
fn ranks_that_reduce_in_different_precisions_fail_with_desync() {
    let results = group(
        2,
        |_| HASH,
        T,
        |mut g: Box<dyn Collective>| {
            if g.rank() == 0 {
                g.all_reduce_sum(&mut [1f32; 4]).map_err(|e| e.to_string())
            } else {
                g.all_reduce_sum_f64(&mut [1f64; 4])
                    .map_err(|e| e.to_string())
            }
        },
    );
    let e0 = results[0].as_ref().unwrap().as_ref().unwrap_err();
    assert!(
        e0.contains("all_reduce (f64)") && e0.contains("different orders"),
        "{e0}"
    );
}

#[test]
fn a_rank_that_dies_mid_run_stops_the_others_with_its_name() {
    let start = Instant::now();
    let results = group(
        3,
        |_| HASH,
        Duration::from_secs(5),
        |mut g: Box<dyn Collective>| {
            let mut v = vec![1f32; 16];
            g.all_reduce_sum(&mut v).unwrap();
            if g.rank() == 2 {
                // Rank 2 exits: its socket closes.
                return Ok(());
            }
            g.all_reduce_sum(&mut v).map_err(|e| e.to_string())
        },
    );
    let (r0, r1) = (results[0].as_ref().unwrap(), results[1].as_ref().unwrap());
    let e0 = r0.as_ref().unwrap_err();
    assert!(
        e0.contains("rank 2") && e0.contains("closed its connection"),
        "{e0}"
    );
    // Rank 1 hears nothing back from rank 0, which stopped at rank 2: closed or timed out.
    let e1 = r1.as_ref().unwrap_err();
    assert!(e1.contains("rank 0"), "{e1}");
    assert!(start.elapsed() < Duration::from_secs(20));
}

#[test]
fn a_silent_rank_times_out_with_its_name() {
    let timeout = Duration::from_millis(400);
    let results = group(
        2,
        |_| HASH,
        timeout,
        |mut g: Box<dyn Collective>| {
            if g.rank() == 1 {
                // Alive but never calls the collective.
                thread::sleep(Duration::from_millis(1500));
                return Ok(());
            }
            let t = Instant::now();
            let e = g.barrier().unwrap_err();
            Err((e.to_string(), t.elapsed()))
        },
    );
    let (msg, waited) = results[0].as_ref().unwrap().as_ref().unwrap_err();
    assert!(
        msg.contains("no answer from rank 1") && msg.contains("barrier"),
        "{msg}"
    );
    assert!(*waited < Duration::from_secs(3), "{waited:?}");
}

#[test]
fn rendezvous_refuses_another_config_a_rank_twice_and_another_world_size() {
    // Another config hash on rank 1.
    let results = group(2, |r| HASH + r as u64, T, |_g: Box<dyn Collective>| ());
    let e = results[0].as_ref().unwrap_err().to_string();
    assert!(e.contains("rank 1") && e.contains("another config"), "{e}");
    assert!(results[1].is_err());

    // Rank 1 twice.
    let rv = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = rv.local_addr().unwrap();
    let a = thread::spawn(move || TcpGroup::connect(addr, 1, 3, HASH, T));
    let b = thread::spawn(move || TcpGroup::connect(addr, 1, 3, HASH, T));
    let e = rv.accept(3, HASH, T).unwrap_err().to_string();
    assert!(e.contains("rank 1 connected twice"), "{e}");
    let refused = [a.join().unwrap(), b.join().unwrap()];
    assert!(refused.iter().any(|r| r.is_err()));

    // A rank that counts three ranks where rank 0 counts two.
    let rv = Rendezvous::bind("127.0.0.1:0").unwrap();
    let addr = rv.local_addr().unwrap();
    let c = thread::spawn(move || TcpGroup::connect(addr, 2, 3, HASH, T));
    let e = rv.accept(2, HASH, T).unwrap_err().to_string();
    assert!(e.contains("3 ranks") && e.contains("rank 0 has 2"), "{e}");
    assert!(c.join().unwrap().is_err());
}

#[test]
fn a_rendezvous_that_never_answers_and_ranks_that_never_come_are_errors() {
    // Nobody listens at this port (bound, then dropped).
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let t = Instant::now();
    let e = TcpGroup::connect(addr, 1, 2, HASH, Duration::from_millis(300)).unwrap_err();
    assert!(matches!(e, CollectiveError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains("rendezvous"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5));

    let rv = Rendezvous::bind("127.0.0.1:0").unwrap();
    let e = rv.accept(3, HASH, Duration::from_millis(300)).unwrap_err();
    assert!(
        e.to_string().contains("rank(s) 1, 2 did not connect"),
        "{e}"
    );
}

#[test]
fn ranks_calling_different_operations_fail_instead_of_mixing_buffers() {
    let results = group(
        2,
        |_| HASH,
        T,
        |mut g: Box<dyn Collective>| {
            if g.rank() == 0 {
                g.barrier().map_err(|e| e.to_string())
            } else {
                g.all_reduce_sum(&mut [1.0]).map_err(|e| e.to_string())
            }
        },
    );
    let e0 = results[0].as_ref().unwrap().as_ref().unwrap_err();
    assert!(e0.contains("different orders"), "{e0}");
}

/// Where a learner process sits: flags first, then torchrun's variables, then Slurm's; every
/// inconsistency names the flag or variable.
#[test]
fn group_spec_from_flags_torchrun_and_slurm() {
    use cascade_shared::collective::{GroupFlags, GroupSpec};
    use std::collections::HashMap;
    let env = |pairs: &[(&str, &str)]| {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k: &str| map.get(k).cloned()
    };
    let none = GroupFlags::default();
    // Alone.
    let alone = GroupSpec::resolve(&none, env(&[])).unwrap();
    assert_eq!((alone.rank, alone.world), (0, 1));
    // torchrun.
    let t = GroupSpec::resolve(
        &none,
        env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node7"),
            ("MASTER_PORT", "29500"),
        ]),
    )
    .unwrap();
    assert_eq!(
        t,
        GroupSpec {
            rank: 3,
            world: 4,
            local_rank: Some(1),
            rendezvous: "node7:29500".into()
        }
    );
    // Slurm (srun), the rendezvous from the flag.
    let flags = GroupFlags {
        rendezvous: Some("head:4000".into()),
        ..GroupFlags::default()
    };
    let s = GroupSpec::resolve(
        &flags,
        env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "5"),
        ]),
    )
    .unwrap();
    assert_eq!((s.rank, s.world, s.local_rank), (5, 8, Some(5)));
    assert_eq!(s.rendezvous, "head:4000");
    // Flags win over the environment.
    let flags = GroupFlags {
        rank: Some(1),
        world_size: Some(2),
        rendezvous: Some("127.0.0.1:5000".into()),
    };
    let f = GroupSpec::resolve(&flags, env(&[("RANK", "0"), ("WORLD_SIZE", "9")])).unwrap();
    assert_eq!((f.rank, f.world), (1, 2));
    // Errors.
    let err = |flags: &GroupFlags, pairs: &[(&str, &str)]| {
        GroupSpec::resolve(flags, env(pairs)).unwrap_err()
    };
    let e = err(&none, &[("RANK", "1")]);
    assert!(e.contains("RANK") && e.contains("world size"), "{e}");
    let e = err(
        &none,
        &[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ],
    );
    assert!(e.contains("RANK 4") && e.contains("0..3"), "{e}");
    let e = err(&none, &[("RANK", "x"), ("WORLD_SIZE", "4")]);
    assert!(e.contains("RANK=\"x\""), "{e}");
    let e = err(&none, &[("RANK", "0"), ("WORLD_SIZE", "2")]);
    assert!(e.contains("--rendezvous"), "{e}");
    let e = err(
        &none,
        &[("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
    );
    assert!(e.contains("MASTER_PORT"), "{e}");
    let flags = GroupFlags {
        rank: Some(0),
        world_size: Some(2),
        rendezvous: Some("nohost".into()),
    };
    let e = GroupSpec::resolve(&flags, env(&[])).unwrap_err();
    assert!(e.contains("HOST:PORT"), "{e}");
    let flags = GroupFlags {
        rank: Some(0),
        world_size: Some(0),
        rendezvous: None,
    };
    let e = GroupSpec::resolve(&flags, env(&[])).unwrap_err();
    assert!(e.contains("--world-size must be at least 1"), "{e}");
}
