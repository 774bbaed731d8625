//! The GPU backend of [`Collective`]: NCCL through cudarc (issue 17; the `nccl` feature, which
//! with `cuda-kernels` alone builds without CUDA: NCCL is loaded at run time, `libnccl.so.2`).
//!
//! [`NcclGroup`] runs over a control group (the TCP group of the rendezvous): rank 0 makes the
//! NCCL unique id and the control group's broadcast, which has a timeout, carries it to the other
//! ranks; `broadcast` of bytes and `barrier` stay on the control group (small control messages),
//! and the reductions and the gather run on the device through NCCL.
//!
//! The learner's sharded optimizer hands the collectives tensors on its device, one bucket at a
//! time, laid out as equal chunks (every rank's next piece of its own shard, padded; see
//! `cascade_learner::zero`): with candle's `cuda` feature a CUDA tensor's buffer goes to NCCL
//! as it is, on the device, and the result is a new device tensor
//! ([`Collective::reduce_scatter_sum_tensor`], [`Collective::all_gather_tensor`]). Host slices
//! (the slice operations, and tensors that are not on a CUDA device) are copied to the device
//! in buckets of at most [`BUCKET`] elements per rank, reduced there on a stream of the group's
//! own, and copied back. Shards are [`shard_range`]'s (sizes differ by one at most).
//!
//! Every operation waits for its completion with the group's timeout (polling an event
//! recorded after it), so a rank that died or hangs stops the others with
//! [`CollectiveError::Timeout`] instead of a hang; dropping the group aborts the communicator.
//! Not yet run on a GPU: `scripts/gpu-check.sh` runs its test (`learner/tests/learner_cuda.rs`)
//! where a GPU is lent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::safe::{Comm, Id, NcclType, ReduceOp};

use crate::collective::{check_len, shard_range, Collective, CollectiveError, Result, BUCKET};

/// A learner group's collectives on NCCL (see the module docs).
pub struct NcclGroup {
    comm: Comm,
    stream: Arc<CudaStream>,
    control: Box<dyn Collective>,
    rank: usize,
    world: usize,
    timeout: Duration,
}

// SAFETY: the communicator and the stream are owned by this value and used only through
// `&mut self` (one thread at a time); NCCL and the CUDA driver allow a communicator to be used
// from another thread than the one that created it as long as calls are not concurrent (the
// context is bound to the calling thread before each use by cudarc).
unsafe impl Send for NcclGroup {}

fn error(rank: usize, op: &'static str, what: impl std::fmt::Debug) -> CollectiveError {
    CollectiveError::Io {
        rank,
        op,
        source: std::io::Error::other(format!("{what:?}")),
    }
}

impl NcclGroup {
    /// Joins the NCCL group of `control`'s ranks on CUDA device `ordinal`. Fails with an error
    /// (not a panic) where no CUDA driver or no NCCL library is present.
    pub fn new(
        mut control: Box<dyn Collective>,
        ordinal: usize,
        timeout: Duration,
    ) -> Result<NcclGroup> {
        let (rank, world) = (control.rank(), control.world_size());
        let op = "nccl init";
        // Loaded at run time (without candle's `cuda`, which links the libraries instead).
        #[cfg(not(feature = "cuda"))]
        {
            // SAFETY: `is_culib_present` only tries `dlopen` on the driver's library names and
            // drops the handle.
            if !unsafe { cudarc::driver::sys::is_culib_present() } {
                return Err(error(rank, op, "no CUDA driver (libcuda.so.1)"));
            }
            // SAFETY: as above, on NCCL's library names.
            if !unsafe { cudarc::nccl::sys::is_culib_present() } {
                return Err(error(rank, op, "no NCCL library (libnccl.so.2)"));
            }
        }
        let mut id = [0u8; 128];
        if rank == 0 {
            let made = Id::new().map_err(|e| error(rank, op, e))?;
            for (b, c) in id.iter_mut().zip(made.internal()) {
                *b = *c as u8;
            }
        }
        control.broadcast(&mut id, 0)?;
        let id = Id::uninit(id.map(|b| b as std::ffi::c_char));
        let ctx = CudaContext::new(ordinal).map_err(|e| error(rank, op, e))?;
        let stream = ctx.new_stream().map_err(|e| error(rank, op, e))?;
        let comm =
            Comm::from_rank(stream.clone(), rank, world, id).map_err(|e| error(rank, op, e))?;
        Ok(NcclGroup {
            comm,
            stream,
            control,
            rank,
            world,
            timeout,
        })
    }

    /// Waits for the work queued on the stream, at most the timeout.
    fn wait(&self, op: &'static str) -> Result<()> {
        let event = self
            .stream
            .record_event(None)
            .map_err(|e| error(self.rank, op, e))?;
        let deadline = Instant::now() + self.timeout;
        loop {
            if event
                .try_is_complete()
                .map_err(|e| error(self.rank, op, e))?
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(CollectiveError::Timeout {
                    rank: self.rank,
                    peer: "the NCCL group".into(),
                    op,
                    timeout: self.timeout,
                });
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    fn to_device<T: DeviceRepr>(&self, op: &'static str, host: &[T]) -> Result<CudaSlice<T>> {
        self.stream
            .clone_htod(host)
            .map_err(|e| error(self.rank, op, e))
    }

    fn to_host<T: DeviceRepr>(
        &self,
        op: &'static str,
        dev: &CudaSlice<T>,
        host: &mut [T],
    ) -> Result<()> {
        self.stream
            .memcpy_dtoh(dev, host)
            .map_err(|e| error(self.rank, op, e))
    }

    /// `send` to the device, `run` (one NCCL operation) into a zeroed `recv_len`-element device
    /// buffer, a wait for it with the timeout, and the buffer back on the host.
    fn round_trip<T>(
        &self,
        op: &'static str,
        send: &[T],
        recv_len: usize,
        run: impl FnOnce(
            &Comm,
            &CudaSlice<T>,
            &mut CudaSlice<T>,
        ) -> std::result::Result<NcclStatus, NcclError>,
    ) -> Result<Vec<T>>
    where
        T: DeviceRepr + ValidAsZeroBits + Copy + Default,
    {
        let send = self.to_device(op, send)?;
        let mut recv = self
            .stream
            .alloc_zeros::<T>(recv_len)
            .map_err(|e| error(self.rank, op, e))?;
        run(&self.comm, &send, &mut recv).map_err(|e| error(self.rank, op, e))?;
        self.wait(op)?;
        let mut host = vec![T::default(); recv_len];
        self.to_host(op, &recv, &mut host)?;
        Ok(host)
    }

    fn all_reduce<T>(&mut self, op: &'static str, buf: &mut [T]) -> Result<()>
    where
        T: NcclType + DeviceRepr + Copy,
    {
        for part in buf.chunks_mut(BUCKET) {
            let mut dev = self.to_device(op, part)?;
            self.comm
                .all_reduce_in_place(&mut dev, &ReduceOp::Sum)
                .map_err(|e| error(self.rank, op, e))?;
            self.wait(op)?;
            self.to_host(op, &dev, part)?;
        }
        Ok(())
    }

    /// The pieces of bucket `k`: for each rank, the range of its shard of `len` elements that
    /// falls in the bucket (possibly empty), relative to the whole buffer; and the bucket's
    /// width per rank (the largest piece). `None` past the last bucket.
    fn bucket(&self, len: usize, k: usize) -> Option<(Vec<std::ops::Range<usize>>, usize)> {
        let pieces: Vec<_> = (0..self.world)
            .map(|r| {
                let s = shard_range(len, r, self.world);
                let start = (s.start + k * BUCKET).min(s.end);
                start..(start + BUCKET).min(s.end)
            })
            .collect();
        let width = pieces.iter().map(|p| p.len()).max().unwrap_or(0);
        (width > 0).then_some((pieces, width))
    }

    fn buckets(&self, len: usize) -> usize {
        shard_range(len, 0, self.world).len().div_ceil(BUCKET)
    }

    fn reduce_scatter<T>(&mut self, op: &'static str, input: &[T], out: &mut [T]) -> Result<()>
    where
        T: NcclType + DeviceRepr + ValidAsZeroBits + Copy + Default,
    {
        let mine = shard_range(input.len(), self.rank, self.world);
        check_len(self.rank, op, out.len(), mine.len())?;
        for k in 0..self.buckets(input.len()) {
            let Some((pieces, width)) = self.bucket(input.len(), k) else {
                break;
            };
            let mut send = vec![T::default(); width * self.world];
            for (r, p) in pieces.iter().enumerate() {
                send[r * width..r * width + p.len()].copy_from_slice(&input[p.clone()]);
            }
            let host = self.round_trip(op, &send, width, |comm, send, recv| {
                comm.reduce_scatter(send, recv, &ReduceOp::Sum)
            })?;
            let p = &pieces[self.rank];
            let local = p.start - mine.start..p.end - mine.start;
            out[local].copy_from_slice(&host[..p.len()]);
        }
        Ok(())
    }
}

impl Collective for NcclGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world
    }

    fn all_reduce_sum(&mut self, buf: &mut [f32]) -> Result<()> {
        self.all_reduce("all_reduce (nccl)", buf)
    }

    fn all_reduce_sum_f64(&mut self, buf: &mut [f64]) -> Result<()> {
        self.all_reduce("all_reduce f64 (nccl)", buf)
    }

    fn reduce_scatter_sum(&mut self, input: &[f32], out: &mut [f32]) -> Result<()> {
        self.reduce_scatter("reduce_scatter (nccl)", input, out)
    }

    fn reduce_scatter_sum_f64(&mut self, input: &[f64], out: &mut [f64]) -> Result<()> {
        self.reduce_scatter("reduce_scatter f64 (nccl)", input, out)
    }

    fn all_gather(&mut self, shard: &[f32], out: &mut [f32]) -> Result<()> {
        let op = "all_gather (nccl)";
        let mine = shard_range(out.len(), self.rank, self.world);
        check_len(self.rank, op, shard.len(), mine.len())?;
        for k in 0..self.buckets(out.len()) {
            let Some((pieces, width)) = self.bucket(out.len(), k) else {
                break;
            };
            let p = &pieces[self.rank];
            let mut send = vec![0f32; width];
            send[..p.len()].copy_from_slice(&shard[p.start - mine.start..p.end - mine.start]);
            let host = self.round_trip(op, &send, width * self.world, |comm, send, recv| {
                comm.all_gather(send, recv)
            })?;
            for (r, p) in pieces.iter().enumerate() {
                out[p.clone()].copy_from_slice(&host[r * width..r * width + p.len()]);
            }
        }
        Ok(())
    }

    #[cfg(feature = "cuda")]
    fn reduce_scatter_sum_tensor(
        &mut self,
        input: &candle_core::Tensor,
    ) -> Result<candle_core::Tensor> {
        if !input.device().is_cuda() {
            return crate::collective::reduce_scatter_via_host(self, input);
        }
        self.on_device(input, device::Kind::ReduceScatter)
    }

    #[cfg(feature = "cuda")]
    fn all_gather_tensor(&mut self, chunk: &candle_core::Tensor) -> Result<candle_core::Tensor> {
        if !chunk.device().is_cuda() {
            return crate::collective::all_gather_via_host(self, chunk);
        }
        self.on_device(chunk, device::Kind::AllGather)
    }

    fn broadcast(&mut self, buf: &mut [u8], root: usize) -> Result<()> {
        self.control.broadcast(buf, root)
    }

    fn barrier(&mut self) -> Result<()> {
        self.control.barrier()
    }
}

#[cfg(feature = "cuda")]
impl NcclGroup {
    /// One NCCL operation on a CUDA tensor, on the device: candle's queued work is finished
    /// first (the input is complete), the operation runs on the group's stream into a new
    /// buffer owned by candle's stream, and the wait with the timeout makes the result complete
    /// before candle uses it (a dead or hung rank is a [`CollectiveError::Timeout`] here).
    fn on_device(
        &mut self,
        input: &candle_core::Tensor,
        kind: device::Kind,
    ) -> Result<candle_core::Tensor> {
        let op = kind.name();
        if input.rank() != 1
            || (kind.is_scatter() && !input.elem_count().is_multiple_of(self.world))
        {
            return Err(CollectiveError::Desync {
                rank: self.rank,
                detail: format!(
                    "{op}: a tensor of shape {:?} is not {} equal chunks",
                    input.dims(),
                    self.world
                ),
            });
        }
        let out = input
            .contiguous()
            .and_then(|t| t.apply_op1_no_bwd(&device::NcclOp { group: self, kind }))
            .map_err(|source| CollectiveError::Tensor {
                rank: self.rank,
                op,
                source,
            })?;
        self.wait(op)?;
        Ok(out)
    }
}

/// The CUDA side of the tensor collectives: a candle op whose CUDA forward hands the input's
/// device buffer to NCCL.
#[cfg(feature = "cuda")]
mod device {
    use candle_core::backend::{BackendDevice, BackendStorage};
    use candle_core::cuda_backend::CudaStorageSlice as S;
    use candle_core::{CpuStorage, CudaStorage, Layout, Shape};
    use cudarc::driver::{CudaSlice, CudaStream, CudaView, DeviceRepr, ValidAsZeroBits};
    use cudarc::nccl::safe::{NcclType, ReduceOp};

    use super::NcclGroup;

    #[derive(Clone, Copy)]
    pub(super) enum Kind {
        /// Equal chunks in, this rank's chunk summed over ranks out.
        ReduceScatter,
        /// This rank's chunk in, every rank's chunk in rank order out.
        AllGather,
    }

    impl Kind {
        pub(super) fn name(self) -> &'static str {
            match self {
                Kind::ReduceScatter => "reduce_scatter (nccl, device)",
                Kind::AllGather => "all_gather (nccl, device)",
            }
        }

        pub(super) fn is_scatter(self) -> bool {
            matches!(self, Kind::ReduceScatter)
        }
    }

    pub(super) struct NcclOp<'a> {
        pub(super) group: &'a NcclGroup,
        pub(super) kind: Kind,
    }

    impl NcclOp<'_> {
        /// The operation on `input` (`n` elements) into a new buffer of candle's stream
        /// `home`, which owns it from then on (and frees it there, after candle's last use).
        fn run<T>(
            &self,
            input: CudaView<'_, T>,
            n: usize,
            home: &std::sync::Arc<CudaStream>,
        ) -> candle_core::Result<CudaSlice<T>>
        where
            T: NcclType + DeviceRepr + ValidAsZeroBits,
        {
            let world = self.group.world;
            let out_len = match self.kind {
                Kind::ReduceScatter => n / world,
                Kind::AllGather => n * world,
            };
            let mut out = home
                .alloc_zeros::<T>(out_len)
                .map_err(candle_core::Error::wrap)?;
            // The buffer is zeroed on `home`: finished before NCCL writes it on the group's.
            home.synchronize().map_err(candle_core::Error::wrap)?;
            let done = match self.kind {
                Kind::ReduceScatter => {
                    self.group
                        .comm
                        .reduce_scatter(&input, &mut out, &ReduceOp::Sum)
                }
                Kind::AllGather => self.group.comm.all_gather(&input, &mut out),
            };
            done.map_err(|e| candle_core::Error::Msg(format!("{}: {e:?}", self.kind.name())))?;
            Ok(out)
        }
    }

    impl candle_core::CustomOp1 for NcclOp<'_> {
        fn name(&self) -> &'static str {
            self.kind.name()
        }

        fn cpu_fwd(&self, _: &CpuStorage, _: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
            candle_core::bail!("{}: the tensor is not on a CUDA device", self.kind.name())
        }

        fn cuda_fwd(
            &self,
            s: &CudaStorage,
            l: &Layout,
        ) -> candle_core::Result<(CudaStorage, Shape)> {
            let Some((o0, o1)) = l.contiguous_offsets() else {
                candle_core::bail!("{}: a non-contiguous tensor", self.kind.name())
            };
            // The input is written by candle's stream: let it finish before NCCL reads it.
            s.device.synchronize()?;
            let home = s.device.cuda_stream();
            let n = o1 - o0;
            let (storage, len) = match &s.slice {
                S::F32(x) => {
                    let out = self.run(x.slice(o0..o1), n, &home)?;
                    let len = out.len();
                    (CudaStorage::wrap_cuda_slice(out, s.device.clone()), len)
                }
                S::F64(x) if self.kind.is_scatter() => {
                    let out = self.run(x.slice(o0..o1), n, &home)?;
                    let len = out.len();
                    (CudaStorage::wrap_cuda_slice(out, s.device.clone()), len)
                }
                _ => candle_core::bail!(
                    "{}: takes f32 (and f64 to reduce), not {:?}",
                    self.kind.name(),
                    s.dtype()
                ),
            };
            Ok((storage, Shape::from(len)))
        }
    }
}
