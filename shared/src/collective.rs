//! Collectives for a learner that spans several processes (issue 17): the five operations a
//! data-parallel, sharded-optimizer learner needs — all-reduce, reduce-scatter, all-gather,
//! broadcast, barrier — behind one small trait, and its CPU backend over TCP.
//!
//! The CPU backend ([`TcpGroup`]) is a star: rank 0 listens at the rendezvous address, every
//! other rank connects to it and says who it is (rank, world size, a hash of its config). Rank 0
//! refuses a rank twice, a rank out of range, another world size or another config hash, naming
//! the rank. Every operation sends each rank's buffer to rank 0, which combines them **in rank
//! order** (`((x₀ + x₁) + x₂) + …`, so the result does not depend on arrival order and is the
//! same bits on every rank) and sends back what each rank needs. Every socket read and write
//! has a timeout: a rank that died or stopped answering stops the group with
//! [`CollectiveError::Timeout`] or [`CollectiveError::PeerGone`] naming it, instead of a hang.
//! Each message carries the operation and a sequence number, so ranks that call operations in
//! different orders fail with [`CollectiveError::Desync`] instead of mixing buffers.
//!
//! Shards: [`shard_range`] cuts `len` elements into `world` contiguous pieces whose sizes differ
//! by at most one (the first `len % world` ranks take one more), so any length works with any
//! number of ranks.
//!
//! The GPU backend (NCCL through cudarc) implements the same trait; the learner sees only
//! [`Collective`].

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::ops::Range;
use std::time::{Duration, Instant};

use candle_core::{DType, Tensor};

/// What can go wrong in a collective.
#[derive(Debug, thiserror::Error)]
pub enum CollectiveError {
    /// No answer from a rank (or from the rendezvous) within the timeout.
    #[error("rank {rank}: no answer from {peer} within {timeout:?} during {op}")]
    Timeout {
        /// This rank.
        rank: usize,
        /// Who did not answer (`rank N` or the rendezvous address).
        peer: String,
        /// The operation.
        op: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// A rank closed its connection (it exited or was killed).
    #[error("rank {rank}: {peer} closed its connection during {op} (exited or killed)")]
    PeerGone {
        /// This rank.
        rank: usize,
        /// Who went away.
        peer: String,
        /// The operation.
        op: &'static str,
    },
    /// The ranks disagree at rendezvous (world size, config hash, a rank given twice or out of
    /// range).
    #[error("rendezvous: {0}")]
    Rendezvous(String),
    /// Ranks called different operations, or buffers of different lengths.
    #[error("rank {rank}: {detail}")]
    Desync {
        /// This rank.
        rank: usize,
        /// What differed.
        detail: String,
    },
    /// A tensor operation around a collective failed (a copy between host and device, a
    /// dtype the operation does not take).
    #[error("rank {rank}: {op}: {source}")]
    Tensor {
        /// This rank.
        rank: usize,
        /// The operation.
        op: &'static str,
        /// The cause.
        source: candle_core::Error,
    },
    /// Another I/O error.
    #[error("rank {rank}: {op}: {source}")]
    Io {
        /// This rank.
        rank: usize,
        /// The operation.
        op: &'static str,
        /// The cause.
        source: std::io::Error,
    },
}

/// Result of a collective.
pub type Result<T> = std::result::Result<T, CollectiveError>;

/// Elements per rank in one bucket of a learner group's gradient reduce-scatter and weight
/// all-gather (the sharded optimizer's, and the NCCL backend's for host slices): each bucket is
/// every rank's next piece of its own shard, at most this long, padded to the longest, so that
/// the collective cuts equal chunks. 4 Mi elements: 32 MiB per rank in f64.
pub const BUCKET: usize = 1 << 22;

/// The width per rank of the buckets of a `len`-element vector sharded over `world` ranks
/// with buckets of at most `bucket` elements: the longest shard's, or `bucket`.
pub fn bucket_width(len: usize, world: usize, bucket: usize) -> usize {
    shard_range(len, 0, world.max(1)).len().min(bucket)
}

/// The elements of a `len`-element buffer that rank `rank` of `world` owns: contiguous, sizes
/// differing by at most one, the first `len % world` ranks one larger.
pub fn shard_range(len: usize, rank: usize, world: usize) -> Range<usize> {
    assert!(world > 0 && rank < world, "rank {rank} of {world}");
    let (base, extra) = (len / world, len % world);
    let start = rank * base + rank.min(extra);
    start..start + base + usize::from(rank < extra)
}

/// The operations a learner group needs. Every rank calls the same operations in the same order
/// with buffers of the same length.
pub trait Collective: Send {
    /// This process's rank.
    fn rank(&self) -> usize;
    /// Number of ranks.
    fn world_size(&self) -> usize;
    /// Every rank's `buf` becomes the element-wise sum over ranks.
    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()>;
    /// [`Collective::all_reduce_sum`] in f64.
    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()>;
    /// `out` (this rank's [`shard_range`] of `input`'s length) becomes the element-wise sum over
    /// ranks of that shard of `input`.
    fn reduce_scatter_sum(&mut self, input: &[f32], out: &mut [f32]) -> Result<()>;
    /// [`Collective::reduce_scatter_sum`] in f64: the learner's exact gradient sums (f32
    /// gradients added in f64 are exact in practice, so the sum does not depend on how the
    /// micro-batches are spread over the ranks; NCCL: `ncclFloat64`).
    fn reduce_scatter_sum_f64(&mut self, input: &[f64], out: &mut [f64]) -> Result<()>;
    /// `out` becomes every rank's `shard` concatenated in rank order; `shard` must be this
    /// rank's [`shard_range`] of `out`'s length.
    fn all_gather(&mut self, shard: &[f32], out: &mut [f32]) -> Result<()>;
    /// Every rank's `buf` becomes rank `root`'s.
    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()>;
    /// Returns once every rank has called it.
    fn barrier(&mut self) -> Result<()>;

    /// The tensor form of [`Collective::reduce_scatter_sum`] over equal chunks: `input` is a
    /// 1-D f32 or f64 tensor of `world × w` elements on any device; the result is the `w`
    /// elements of chunk `rank`, summed over ranks, on `input`'s device. The learner's sharded
    /// optimizer lays out each bucket of its gradient this way, so that the tensors stay on the
    /// device where the backend can reduce them there (NCCL); this default goes through host
    /// slices.
    fn reduce_scatter_sum_tensor(&mut self, input: &Tensor) -> Result<Tensor> {
        reduce_scatter_via_host(self, input)
    }

    /// The tensor form of [`Collective::all_gather`] over equal chunks: `chunk` is a 1-D f32
    /// tensor of `w` elements; the result is every rank's chunk in rank order (`world × w`
    /// elements) on `chunk`'s device. This default goes through host slices.
    fn all_gather_tensor(&mut self, chunk: &Tensor) -> Result<Tensor> {
        all_gather_via_host(self, chunk)
    }
}

/// [`Collective::reduce_scatter_sum_tensor`] through host slices and
/// [`Collective::reduce_scatter_sum`] (or its f64 form).
pub fn reduce_scatter_via_host<C: Collective + ?Sized>(
    c: &mut C,
    input: &Tensor,
) -> Result<Tensor> {
    let (rank, world) = (c.rank(), c.world_size());
    let op = "reduce_scatter (tensor)";
    let len = input.elem_count();
    if input.rank() != 1 || !len.is_multiple_of(world) {
        return Err(desync(
            rank,
            format!(
                "{op}: a tensor of shape {:?} is not {world} equal chunks",
                input.dims()
            ),
        ));
    }
    let wrap = |source| CollectiveError::Tensor { rank, op, source };
    let out = match input.dtype() {
        DType::F32 => {
            let host = input.to_vec1::<f32>().map_err(wrap)?;
            let mut out = vec![0f32; len / world];
            c.reduce_scatter_sum(&host, &mut out)?;
            Tensor::from_vec(out, len / world, input.device())
        }
        DType::F64 => {
            let host = input.to_vec1::<f64>().map_err(wrap)?;
            let mut out = vec![0f64; len / world];
            c.reduce_scatter_sum_f64(&host, &mut out)?;
            Tensor::from_vec(out, len / world, input.device())
        }
        other => Err(candle_core::Error::Msg(format!(
            "takes f32 or f64, not {other:?}"
        ))),
    };
    out.map_err(wrap)
}

/// [`Collective::all_gather_tensor`] through host slices and [`Collective::all_gather`].
pub fn all_gather_via_host<C: Collective + ?Sized>(c: &mut C, chunk: &Tensor) -> Result<Tensor> {
    let (rank, world) = (c.rank(), c.world_size());
    let op = "all_gather (tensor)";
    let wrap = |source| CollectiveError::Tensor { rank, op, source };
    if chunk.rank() != 1 || chunk.dtype() != DType::F32 {
        return Err(wrap(candle_core::Error::Msg(format!(
            "takes a 1-D f32 tensor, not {:?} {:?}",
            chunk.dtype(),
            chunk.dims()
        ))));
    }
    let host = chunk.to_vec1::<f32>().map_err(wrap)?;
    let mut out = vec![0f32; host.len() * world];
    c.all_gather(&host, &mut out)?;
    Tensor::from_vec(out, host.len() * world, chunk.device()).map_err(wrap)
}

/// One process alone: every operation is the identity.
#[derive(Debug, Default, Clone, Copy)]
pub struct Single;

impl Collective for Single {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&mut self, _buf: &mut [f32]) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter_sum(&mut self, input: &[f32], out: &mut [f32]) -> Result<()> {
        check_len(0, "reduce_scatter", out.len(), input.len())?;
        out.copy_from_slice(input);
        Ok(())
    }
    fn all_reduce_sum_f64(&mut self, _buf: &mut [f64]) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter_sum_f64(&mut self, input: &[f64], out: &mut [f64]) -> Result<()> {
        check_len(0, "reduce_scatter", out.len(), input.len())?;
        out.copy_from_slice(input);
        Ok(())
    }
    fn all_gather(&mut self, shard: &[f32], out: &mut [f32]) -> Result<()> {
        check_len(0, "all_gather", shard.len(), out.len())?;
        out.copy_from_slice(shard);
        Ok(())
    }
    fn broadcast(&mut self, _buf: &mut [u8], root: usize) -> Result<()> {
        if root != 0 {
            return Err(desync(0, format!("broadcast from rank {root} of 1")));
        }
        Ok(())
    }
    fn barrier(&mut self) -> Result<()> {
        Ok(())
    }
    fn reduce_scatter_sum_tensor(&mut self, input: &Tensor) -> Result<Tensor> {
        Ok(input.clone())
    }
    fn all_gather_tensor(&mut self, chunk: &Tensor) -> Result<Tensor> {
        Ok(chunk.clone())
    }
}

/// [`CollectiveError::Desync`] unless a buffer of `got` elements is the `want` expected.
pub(crate) fn check_len(rank: usize, op: &str, got: usize, want: usize) -> Result<()> {
    if got == want {
        Ok(())
    } else {
        Err(desync(
            rank,
            format!("{op}: buffer of {got} elements where {want} were expected"),
        ))
    }
}

fn desync(rank: usize, detail: String) -> CollectiveError {
    CollectiveError::Desync { rank, detail }
}

/// Operation tags on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Op {
    AllReduce = 1,
    ReduceScatter = 2,
    AllGather = 3,
    Broadcast = 4,
    Barrier = 5,
    AllReduceF64 = 6,
    ReduceScatterF64 = 7,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::AllReduce,
        Op::ReduceScatter,
        Op::AllGather,
        Op::Broadcast,
        Op::Barrier,
        Op::AllReduceF64,
        Op::ReduceScatterF64,
    ];

    /// The name of the operation tagged `tag` on the wire.
    fn name_of(tag: u8) -> String {
        match Op::ALL.iter().find(|op| **op as u8 == tag) {
            Some(op) => op.name().into(),
            None => format!("unknown operation {tag}"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "all_reduce",
            Op::ReduceScatter => "reduce_scatter",
            Op::AllGather => "all_gather",
            Op::Broadcast => "broadcast",
            Op::Barrier => "barrier",
            Op::AllReduceF64 => "all_reduce (f64)",
            Op::ReduceScatterF64 => "reduce_scatter (f64)",
        }
    }
}

const MAGIC: &[u8; 8] = b"cascdcl1";

/// The CPU backend: ranks connected to rank 0 over TCP (see the module docs).
#[derive(Debug)]
pub struct TcpGroup {
    rank: usize,
    world: usize,
    timeout: Duration,
    seq: u64,
    /// Rank 0: the connection of rank `i + 1` at `i`. Other ranks: the one to rank 0.
    peers: Vec<TcpStream>,
}

/// Rank 0's listening socket, bound before the other ranks are started (so that a test or a
/// launcher can bind port 0 and hand out the port).
#[derive(Debug)]
pub struct Rendezvous {
    listener: TcpListener,
}

impl Rendezvous {
    /// Binds the rendezvous address.
    pub fn bind(addr: impl ToSocketAddrs) -> std::io::Result<Self> {
        Ok(Rendezvous {
            listener: TcpListener::bind(addr)?,
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Waits up to `timeout` for ranks `1..world` to connect, checks what each says, and returns
    /// rank 0 of the group.
    pub fn accept(self, world: usize, config_hash: u64, timeout: Duration) -> Result<TcpGroup> {
        assert!(world >= 1);
        let io = |source| CollectiveError::Io {
            rank: 0,
            op: "rendezvous",
            source,
        };
        let deadline = Instant::now() + timeout;
        let mut slots: Vec<Option<TcpStream>> = (1..world).map(|_| None).collect();
        self.listener.set_nonblocking(true).map_err(io)?;
        while slots.iter().any(Option::is_none) {
            match self.listener.accept() {
                Ok((mut stream, from)) => {
                    stream.set_nonblocking(false).map_err(io)?;
                    stream.set_nodelay(true).map_err(io)?;
                    set_timeouts(&stream, timeout).map_err(io)?;
                    let hello = read_hello(&mut stream).map_err(|e| {
                        CollectiveError::Rendezvous(format!("a connection from {from}: {e}"))
                    })?;
                    let (rank, their_world, their_hash) = hello;
                    if their_world != world as u64 {
                        return Err(CollectiveError::Rendezvous(format!(
                            "rank {rank} (from {from}) says the world has {their_world} ranks; rank 0 has {world}"
                        )));
                    }
                    if their_hash != config_hash {
                        return Err(CollectiveError::Rendezvous(format!(
                            "rank {rank} (from {from}) runs another config (hash {their_hash:016x}, rank 0 has {config_hash:016x})"
                        )));
                    }
                    let slot = match (rank as usize).checked_sub(1).and_then(|i| slots.get_mut(i)) {
                        Some(slot) => slot,
                        None => {
                            return Err(CollectiveError::Rendezvous(format!(
                                "a connection from {from} says it is rank {rank}; the ranks that connect are 1..{world}"
                            )))
                        }
                    };
                    if slot.is_some() {
                        return Err(CollectiveError::Rendezvous(format!(
                            "rank {rank} connected twice (again from {from})"
                        )));
                    }
                    stream.write_all(MAGIC).map_err(io)?;
                    *slot = Some(stream);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        let missing: Vec<String> = slots
                            .iter()
                            .enumerate()
                            .filter(|(_, s)| s.is_none())
                            .map(|(i, _)| (i + 1).to_string())
                            .collect();
                        return Err(CollectiveError::Rendezvous(format!(
                            "rank(s) {} did not connect within {timeout:?}",
                            missing.join(", ")
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io(e)),
            }
        }
        Ok(TcpGroup {
            rank: 0,
            world,
            timeout,
            seq: 0,
            peers: slots.into_iter().flatten().collect(),
        })
    }
}

fn set_timeouts(stream: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}

fn read_hello(stream: &mut TcpStream) -> std::io::Result<(u64, u64, u64)> {
    let mut buf = [0u8; 32];
    stream.read_exact(&mut buf)?;
    if &buf[..8] != MAGIC {
        return Err(std::io::Error::new(
            ErrorKind::InvalidData,
            "not a cascade learner rank",
        ));
    }
    let word = |i: usize| u64::from_le_bytes(buf[i..i + 8].try_into().unwrap());
    Ok((word(8), word(16), word(24)))
}

impl TcpGroup {
    /// Rank `rank` (≥ 1) of `world` joins the group at `addr`, retrying until rank 0 listens
    /// or `timeout` has passed.
    pub fn connect(
        addr: impl ToSocketAddrs + std::fmt::Debug,
        rank: usize,
        world: usize,
        config_hash: u64,
        timeout: Duration,
    ) -> Result<TcpGroup> {
        assert!(rank >= 1 && rank < world, "rank {rank} of {world}");
        let io = |source| CollectiveError::Io {
            rank,
            op: "rendezvous",
            source,
        };
        let deadline = Instant::now() + timeout;
        let addrs: Vec<SocketAddr> = addr.to_socket_addrs().map_err(io)?.collect();
        let mut stream = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let attempt = addrs.iter().find_map(|a| {
                TcpStream::connect_timeout(a, left.max(Duration::from_millis(1))).ok()
            });
            match attempt {
                Some(s) => break s,
                None if Instant::now() >= deadline => {
                    return Err(CollectiveError::Timeout {
                        rank,
                        peer: format!("the rendezvous {addr:?}"),
                        op: "rendezvous",
                        timeout,
                    })
                }
                None => std::thread::sleep(Duration::from_millis(20)),
            }
        };
        stream.set_nodelay(true).map_err(io)?;
        set_timeouts(&stream, timeout).map_err(io)?;
        let mut hello = Vec::with_capacity(32);
        hello.extend_from_slice(MAGIC);
        for w in [rank as u64, world as u64, config_hash] {
            hello.extend_from_slice(&w.to_le_bytes());
        }
        stream.write_all(&hello).map_err(io)?;
        let mut ack = [0u8; 8];
        match stream.read_exact(&mut ack) {
            Ok(()) if &ack == MAGIC => {}
            Ok(()) => {
                return Err(CollectiveError::Rendezvous(format!(
                    "rank {rank}: {addr:?} is not a cascade rendezvous"
                )))
            }
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => {
                return Err(CollectiveError::Rendezvous(format!(
                    "rank {rank}: rank 0 refused this rank (see rank 0's error)"
                )))
            }
            Err(e) => return Err(classify(rank, "rank 0".into(), "rendezvous", timeout, e)),
        }
        Ok(TcpGroup {
            rank,
            world,
            timeout,
            seq: 0,
            peers: vec![stream],
        })
    }

    fn peer_name(&self, index: usize) -> String {
        if self.rank == 0 {
            format!("rank {}", index + 1)
        } else {
            "rank 0".into()
        }
    }

    fn send(&mut self, index: usize, op: Op, payload: &[u8]) -> Result<()> {
        let mut header = [0u8; 17];
        header[0] = op as u8;
        header[1..9].copy_from_slice(&self.seq.to_le_bytes());
        header[9..17].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        let (rank, timeout, peer) = (self.rank, self.timeout, self.peer_name(index));
        let stream = &mut self.peers[index];
        stream
            .write_all(&header)
            .and_then(|()| stream.write_all(payload))
            .map_err(|e| classify(rank, peer, op.name(), timeout, e))
    }

    fn recv(&mut self, index: usize, op: Op) -> Result<Vec<u8>> {
        let (rank, timeout, peer) = (self.rank, self.timeout, self.peer_name(index));
        let stream = &mut self.peers[index];
        let mut header = [0u8; 17];
        stream
            .read_exact(&mut header)
            .map_err(|e| classify(rank, peer.clone(), op.name(), timeout, e))?;
        let seq = u64::from_le_bytes(header[1..9].try_into().unwrap());
        let len = u64::from_le_bytes(header[9..17].try_into().unwrap());
        if header[0] != op as u8 || seq != self.seq {
            return Err(desync(
                rank,
                format!(
                    "{peer} sent {} #{seq} where {} #{} was expected (the ranks call collectives in different orders)",
                    Op::name_of(header[0]),
                    op.name(),
                    self.seq
                ),
            ));
        }
        let mut payload = vec![0u8; len as usize];
        stream
            .read_exact(&mut payload)
            .map_err(|e| classify(rank, peer, op.name(), timeout, e))?;
        Ok(payload)
    }

    /// Rank 0: each other rank's payload, in rank order. Others: sends theirs.
    fn gather(&mut self, op: Op, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        if self.rank == 0 {
            (0..self.peers.len()).map(|i| self.recv(i, op)).collect()
        } else {
            self.send(0, op, mine)?;
            Ok(Vec::new())
        }
    }

    /// Rank 0: the sum of every rank's `mine`, added in rank order, one rank's buffer received
    /// at a time (rank 0 holds the sum and one payload, not every rank's). Others: send
    /// theirs, `None`.
    fn sum_at_root<T: Elem>(&mut self, op: Op, mine: &[T]) -> Result<Option<Vec<T>>> {
        if self.rank != 0 {
            self.send(0, op, &to_bytes(mine))?;
            return Ok(None);
        }
        let mut sum = mine.to_vec();
        for i in 0..self.peers.len() {
            let part = self.recv(i, op)?;
            add_into(0, op.name(), &mut sum, &part)?;
        }
        Ok(Some(sum))
    }

    fn finish(&mut self) {
        self.seq += 1;
    }
}

fn classify(
    rank: usize,
    peer: String,
    op: &'static str,
    timeout: Duration,
    e: std::io::Error,
) -> CollectiveError {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => CollectiveError::Timeout {
            rank,
            peer,
            op,
            timeout,
        },
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => CollectiveError::PeerGone { rank, peer, op },
        _ => CollectiveError::Io {
            rank,
            op,
            source: e,
        },
    }
}

/// An element type the reductions add: f32 or f64, little-endian on the wire.
trait Elem: Copy + std::ops::AddAssign {
    const SIZE: usize;
    const NAME: &'static str;
    fn put(self, out: &mut Vec<u8>);
    fn get(bytes: &[u8]) -> Self;
}

impl Elem for f32 {
    const SIZE: usize = 4;
    const NAME: &'static str = "f32";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> Self {
        f32::from_le_bytes(bytes.try_into().unwrap())
    }
}

impl Elem for f64 {
    const SIZE: usize = 8;
    const NAME: &'static str = "f64";
    fn put(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_le_bytes());
    }
    fn get(bytes: &[u8]) -> Self {
        f64::from_le_bytes(bytes.try_into().unwrap())
    }
}

fn to_bytes<T: Elem>(v: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * T::SIZE);
    v.iter().for_each(|x| x.put(&mut out));
    out
}

/// Checks that `bytes` holds `want` elements of `T`.
fn check_bytes<T: Elem>(rank: usize, op: &str, bytes: &[u8], want: usize) -> Result<()> {
    if !bytes.len().is_multiple_of(T::SIZE) {
        return Err(desync(
            rank,
            format!("{op}: {} bytes is not {}s", bytes.len(), T::NAME),
        ));
    }
    check_len(rank, op, bytes.len() / T::SIZE, want)
}

fn from_bytes<T: Elem>(rank: usize, op: &str, bytes: &[u8], out: &mut [T]) -> Result<()> {
    check_bytes::<T>(rank, op, bytes, out.len())?;
    for (o, c) in out.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
        *o = T::get(c);
    }
    Ok(())
}

/// Adds `bytes` (`T`s) into `acc`, element by element.
fn add_into<T: Elem>(rank: usize, op: &str, acc: &mut [T], bytes: &[u8]) -> Result<()> {
    check_bytes::<T>(rank, op, bytes, acc.len())?;
    for (a, c) in acc.iter_mut().zip(bytes.chunks_exact(T::SIZE)) {
        *a += T::get(c);
    }
    Ok(())
}

impl TcpGroup {
    fn all_reduce<T: Elem>(&mut self, op: Op, buf: &mut [T]) -> Result<()> {
        match self.sum_at_root(op, buf)? {
            Some(sum) => {
                let bytes = to_bytes(&sum);
                for i in 0..self.peers.len() {
                    self.send(i, op, &bytes)?;
                }
                buf.copy_from_slice(&sum);
            }
            None => {
                let sum = self.recv(0, op)?;
                from_bytes(self.rank, op.name(), &sum, buf)?;
            }
        }
        self.finish();
        Ok(())
    }

    fn reduce_scatter<T: Elem>(&mut self, op: Op, input: &[T], out: &mut [T]) -> Result<()> {
        let mine = shard_range(input.len(), self.rank, self.world);
        check_len(self.rank, op.name(), out.len(), mine.len())?;
        match self.sum_at_root(op, input)? {
            Some(sum) => {
                for i in 0..self.peers.len() {
                    let r = shard_range(sum.len(), i + 1, self.world);
                    self.send(i, op, &to_bytes(&sum[r]))?;
                }
                out.copy_from_slice(&sum[mine]);
            }
            None => {
                let shard = self.recv(0, op)?;
                from_bytes(self.rank, op.name(), &shard, out)?;
            }
        }
        self.finish();
        Ok(())
    }
}

impl Collective for TcpGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce(Op::AllReduce, buf)
    }

    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce(Op::AllReduceF64, buf)
    }

    fn reduce_scatter_sum(&mut self, input: &[f32], out: &mut [f32]) -> Result<()> {
        self.reduce_scatter(Op::ReduceScatter, input, out)
    }

    fn reduce_scatter_sum_f64(&mut self, input: &[f64], out: &mut [f64]) -> Result<()> {
        self.reduce_scatter(Op::ReduceScatterF64, input, out)
    }

    fn all_gather(&mut self, shard: &[f32], out: &mut [f32]) -> Result<()> {
        let op = Op::AllGather;
        let mine = shard_range(out.len(), self.rank, self.world);
        check_len(self.rank, op.name(), shard.len(), mine.len())?;
        let parts = self.gather(op, &to_bytes(shard))?;
        if self.rank == 0 {
            out[mine].copy_from_slice(shard);
            for (i, part) in parts.iter().enumerate() {
                let r = shard_range(out.len(), i + 1, self.world);
                from_bytes(0, op.name(), part, &mut out[r])?;
            }
            let all = to_bytes(out);
            for i in 0..self.peers.len() {
                self.send(i, op, &all)?;
            }
        } else {
            let all = self.recv(0, op)?;
            from_bytes(self.rank, op.name(), &all, out)?;
        }
        self.finish();
        Ok(())
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        let op = Op::Broadcast;
        if root >= self.world {
            return Err(desync(
                self.rank,
                format!("broadcast from rank {root} of {}", self.world),
            ));
        }
        // The root's bytes reach rank 0 first (unless rank 0 is the root), then every rank.
        let data = if self.rank == 0 {
            let data = if root == 0 {
                buf.to_vec()
            } else {
                self.recv(root - 1, op)?
            };
            for i in 0..self.peers.len() {
                if i + 1 != root {
                    self.send(i, op, &data)?;
                }
            }
            data
        } else if self.rank == root {
            self.send(0, op, buf)?;
            buf.to_vec()
        } else {
            self.recv(0, op)?
        };
        check_len(self.rank, op.name(), data.len(), buf.len())?;
        buf.copy_from_slice(&data);
        self.finish();
        Ok(())
    }

    fn barrier(&mut self) -> Result<()> {
        let op = Op::Barrier;
        self.gather(op, &[])?;
        if self.rank == 0 {
            for i in 0..self.peers.len() {
                self.send(i, op, &[])?;
            }
        } else {
            self.recv(0, op)?;
        }
        self.finish();
        Ok(())
    }
}

/// Where a learner process sits in its group: from `--rank`, `--world-size`, `--rendezvous`, or
/// else the launchers' variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
/// `MASTER_PORT` as torchrun sets them; Slurm's `SLURM_PROCID`, `SLURM_NTASKS`,
/// `SLURM_LOCALID` under `srun`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Rank within this node (picks the device of `cuda`), when known.
    pub local_rank: Option<usize>,
    /// `HOST:PORT` where rank 0 listens (unused with one rank).
    pub rendezvous: String,
}

/// The flags of a learner process that place it in a group (`None`: not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GroupFlags {
    /// `--rank`.
    pub rank: Option<usize>,
    /// `--world-size`.
    pub world_size: Option<usize>,
    /// `--rendezvous HOST:PORT`.
    pub rendezvous: Option<String>,
}

impl GroupSpec {
    /// The group of this process from `flags`, else from the environment `env` (a lookup such
    /// as `|k| std::env::var(k).ok()`). Without flags or launcher variables the process is
    /// alone (rank 0 of 1). Every inconsistency is an error naming the flag or variable.
    pub fn resolve(
        flags: &GroupFlags,
        env: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<GroupSpec, String> {
        let num = |name: &str| -> std::result::Result<Option<usize>, String> {
            match env(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse()
                    .map(Some)
                    .map_err(|_| format!("{name}={v:?} is not a number")),
            }
        };
        // Flags first, then torchrun's variables, then Slurm's.
        let (rank, rank_from) = match (flags.rank, num("RANK")?, num("SLURM_PROCID")?) {
            (Some(r), ..) => (Some(r), "--rank"),
            (None, Some(r), _) => (Some(r), "RANK"),
            (None, None, Some(r)) => (Some(r), "SLURM_PROCID"),
            _ => (None, "--rank"),
        };
        let (world, world_from) = match (flags.world_size, num("WORLD_SIZE")?, num("SLURM_NTASKS")?)
        {
            (Some(w), ..) => (Some(w), "--world-size"),
            (None, Some(w), _) => (Some(w), "WORLD_SIZE"),
            (None, None, Some(w)) => (Some(w), "SLURM_NTASKS"),
            _ => (None, "--world-size"),
        };
        let local_rank = match (num("LOCAL_RANK")?, num("SLURM_LOCALID")?) {
            (Some(l), _) | (None, Some(l)) => Some(l),
            _ => None,
        };
        let (rank, world) = match (rank, world) {
            (None, None) => (0, 1),
            (Some(r), Some(w)) => (r, w),
            (Some(_), None) => {
                return Err(format!(
                    "{rank_from} is given but not the world size (--world-size or WORLD_SIZE)"
                ))
            }
            (None, Some(_)) => {
                return Err(format!(
                    "{world_from} is given but not this process's rank (--rank or RANK)"
                ))
            }
        };
        if world == 0 {
            return Err(format!("{world_from} must be at least 1"));
        }
        if rank >= world {
            return Err(format!(
                "{rank_from} {rank} is not a rank of a group of {world} ({world_from}): ranks are 0..{}",
                world - 1
            ));
        }
        let rendezvous = match (&flags.rendezvous, env("MASTER_ADDR"), env("MASTER_PORT")) {
            (Some(r), ..) => r.clone(),
            (None, Some(a), Some(p)) => format!("{a}:{p}"),
            (None, Some(_), None) => return Err("MASTER_ADDR is set but not MASTER_PORT".into()),
            (None, None, Some(_)) => return Err("MASTER_PORT is set but not MASTER_ADDR".into()),
            (None, None, None) if world > 1 => {
                return Err(format!(
                    "a group of {world} ranks needs rank 0's address: --rendezvous HOST:PORT \
                     (or MASTER_ADDR and MASTER_PORT)"
                ))
            }
            (None, None, None) => String::new(),
        };
        if world > 1 {
            let port_ok = rendezvous
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
            if !port_ok {
                return Err(format!(
                    "rendezvous {rendezvous:?} is not HOST:PORT (a port number 0-65535)"
                ));
            }
        }
        Ok(GroupSpec {
            rank,
            world,
            local_rank,
            rendezvous,
        })
    }

    /// Joins the group: rank 0 listens at the rendezvous address and waits for the others;
    /// the others connect to it. `config_hash` must be the same on every rank. One rank alone
    /// gets [`Single`].
    pub fn join(&self, config_hash: u64, timeout: Duration) -> Result<Box<dyn Collective>> {
        if self.world == 1 {
            return Ok(Box::new(Single));
        }
        if self.rank == 0 {
            let rendezvous =
                Rendezvous::bind(self.rendezvous.as_str()).map_err(|e| CollectiveError::Io {
                    rank: 0,
                    op: "rendezvous (listening)",
                    source: e,
                })?;
            Ok(Box::new(rendezvous.accept(
                self.world,
                config_hash,
                timeout,
            )?))
        } else {
            Ok(Box::new(TcpGroup::connect(
                self.rendezvous.as_str(),
                self.rank,
                self.world,
                config_hash,
                timeout,
            )?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_the_buffer_once_and_differ_by_at_most_one() {
        for len in [0, 1, 5, 7, 64, 101] {
            for world in 1..6 {
                let ranges: Vec<_> = (0..world).map(|r| shard_range(len, r, world)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[world - 1].end, len);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].end, w[1].start);
                    assert!(w[0].len() >= w[1].len() && w[0].len() - w[1].len() <= 1);
                }
            }
        }
    }
}
