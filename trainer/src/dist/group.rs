//! A c10d process group from libtorch (csrc/dist.cpp): TCPStore rendezvous, then
//! Gloo for CPU tensors or NCCL for CUDA tensors. Collectives are async and return
//! a [`Work`]; every failure (a dead peer, a timeout) is an [`Error::Collective`].

use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use tch::{Device, Tensor};
use torch_sys::C_tensor;

use crate::Error;
use crate::ffi::take_message;

mod raw {
    use std::ffi::{c_char, c_int, c_void};

    use torch_sys::C_tensor;

    unsafe extern "C" {
        #[allow(clippy::too_many_arguments)]
        pub fn shim_pg_new(
            backend: *const c_char,
            host: *const c_char,
            port: c_int,
            rank: c_int,
            world: c_int,
            join_timeout_ms: i64,
            timeout_ms: i64,
            gloo_iface: *const c_char,
            gloo_host: *const c_char,
            cuda_device: c_int,
            out: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn shim_pg_free(g: *mut c_void);
        pub fn shim_pg_allreduce(g: *mut c_void, t: *mut C_tensor, op: c_int, work: *mut *mut c_void) -> *mut c_char;
        pub fn shim_pg_broadcast(g: *mut c_void, t: *mut C_tensor, root: c_int, work: *mut *mut c_void) -> *mut c_char;
        pub fn shim_pg_reduce_scatter(
            g: *mut c_void,
            out: *mut C_tensor,
            input: *mut C_tensor,
            op: c_int,
            work: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn shim_pg_all_gather(
            g: *mut c_void,
            out: *mut C_tensor,
            input: *mut C_tensor,
            work: *mut *mut c_void,
        ) -> *mut c_char;
        pub fn shim_pg_barrier(g: *mut c_void, cuda_device: c_int) -> *mut c_char;
        pub fn shim_work_wait(w: *mut c_void) -> *mut c_char;
        pub fn shim_work_free(w: *mut c_void);
    }
}

/// The c10d backend: Gloo for CPU tensors, NCCL for CUDA tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Gloo,
    Nccl,
}

impl Backend {
    /// NCCL on CUDA, Gloo on CPU, as torch.distributed's defaults.
    pub fn for_device(device: Device) -> Backend {
        if device.is_cuda() { Backend::Nccl } else { Backend::Gloo }
    }

    fn name(self) -> &'static str {
        match self {
            Backend::Gloo => "gloo",
            Backend::Nccl => "nccl",
        }
    }
}

/// Which network device Gloo binds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GlooDevice {
    /// libtorch's default: the address the hostname resolves to, else loopback.
    Default,
    /// A network interface, as `GLOO_SOCKET_IFNAME`.
    Interface(String),
    /// A hostname or address.
    Host(String),
}

/// How long a rank waits for its peers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// At the rendezvous, for every rank to join.
    pub rendezvous: Duration,
    /// For each collective once joined.
    pub collective: Duration,
}

impl Timeouts {
    /// The same bound on the rendezvous and on every collective.
    pub fn both(d: Duration) -> Timeouts {
        Timeouts { rendezvous: d, collective: d }
    }
}

/// Everything a rank needs to join the group.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    pub backend: Backend,
    /// Rank 0 hosts the TCPStore here; the others connect.
    pub master_addr: String,
    pub master_port: u16,
    pub rank: u32,
    pub world_size: u32,
    pub timeouts: Timeouts,
    pub gloo_device: GlooDevice,
    /// The CUDA device NCCL uses (the local rank).
    pub cuda_device: usize,
}

impl GroupOptions {
    /// Gloo's device as torch.distributed picks it: `GLOO_SOCKET_IFNAME`, else
    /// loopback when the master is local, else the default device.
    pub fn gloo_device_for(master_addr: &str) -> GlooDevice {
        if let Some(iface) = std::env::var("GLOO_SOCKET_IFNAME").ok().filter(|s| !s.is_empty()) {
            return GlooDevice::Interface(iface.split(',').next().unwrap_or_default().to_string());
        }
        let loopback =
            master_addr == "localhost" || master_addr.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
        if loopback { GlooDevice::Host("127.0.0.1".into()) } else { GlooDevice::Default }
    }
}

/// Reductions of [`ProcessGroup::allreduce`] and [`ProcessGroup::reduce_scatter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum = 0,
    /// The mean over ranks (a sum divided by the world size on Gloo).
    Avg = 1,
    Max = 2,
    Min = 3,
}

/// A joined c10d process group. Dropping it closes the backend and the store.
pub struct ProcessGroup {
    raw: NonNull<c_void>,
    rank: u32,
    world_size: u32,
    backend: Backend,
    cuda_device: usize,
    timeout: Duration,
}

// SAFETY: c10d backends are thread-safe (torch calls them from many threads), and
// the handle is only freed by Drop.
unsafe impl Send for ProcessGroup {}
unsafe impl Sync for ProcessGroup {}

fn c_string(what: &str, s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::InvalidSpec(format!("{what} {s:?} contains a NUL byte")))
}

impl ProcessGroup {
    /// Rendezvous at `master_addr:master_port` and create the backend. Blocks until
    /// every rank has joined or the rendezvous timeout passes.
    pub fn new(o: &GroupOptions) -> Result<ProcessGroup, Error> {
        flight_recorder_off_unless_asked();
        let (iface, host) = match &o.gloo_device {
            GlooDevice::Default => (String::new(), String::new()),
            GlooDevice::Interface(i) => (i.clone(), String::new()),
            GlooDevice::Host(h) => (String::new(), h.clone()),
        };
        let backend = c_string("backend", o.backend.name())?;
        let master = c_string("MASTER_ADDR", &o.master_addr)?;
        let (iface, host) = (c_string("GLOO_SOCKET_IFNAME", &iface)?, c_string("Gloo host", &host)?);
        let mut out = std::ptr::null_mut();
        // SAFETY: valid C strings and an out-pointer; the shim catches every exception.
        let err = unsafe {
            raw::shim_pg_new(
                backend.as_ptr(),
                master.as_ptr(),
                c_int::from(o.master_port),
                o.rank as c_int,
                o.world_size as c_int,
                o.timeouts.rendezvous.as_millis() as i64,
                o.timeouts.collective.as_millis() as i64,
                iface.as_ptr(),
                host.as_ptr(),
                o.cuda_device as c_int,
                &mut out,
            )
        };
        if let Some(message) = take_message(err) {
            return Err(Error::Rendezvous {
                addr: format!("{}:{}", o.master_addr, o.master_port),
                rank: o.rank,
                world_size: o.world_size,
                message,
            });
        }
        Ok(ProcessGroup {
            raw: NonNull::new(out).expect("shim_pg_new returns a group on success"),
            rank: o.rank,
            world_size: o.world_size,
            backend: o.backend,
            cuda_device: o.cuda_device,
            timeout: o.timeouts.collective,
        })
    }

    pub fn rank(&self) -> u32 {
        self.rank
    }

    pub fn world_size(&self) -> u32 {
        self.world_size
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub(crate) fn as_raw(&self) -> *mut c_void {
        self.raw.as_ptr()
    }

    fn collective_error(&self, op: &str, message: String) -> Error {
        Error::Collective { op: op.to_string(), rank: self.rank, timeout: self.timeout, message }
    }

    /// Starts an in-place all-reduce of `t` over every rank.
    pub fn allreduce(&self, t: &Tensor, op: ReduceOp) -> Result<Work<'_>, Error> {
        let mut work = std::ptr::null_mut();
        // SAFETY: t is a live tensor; the Work keeps its own reference to it.
        let err = unsafe { raw::shim_pg_allreduce(self.as_raw(), t.as_ptr() as *mut C_tensor, op as c_int, &mut work) };
        self.work(err, work, "allreduce")
    }

    /// Starts a reduce-scatter (c10d's `_reduce_scatter_base`, torch's
    /// `reduce_scatter_tensor`): `input` holds one equal chunk per rank, end to end, and
    /// this rank's `output` receives its chunk reduced over every rank. Both contiguous,
    /// of one dtype and device, `input` world size times `output`'s length.
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work<'_>, Error> {
        let mut work = std::ptr::null_mut();
        // SAFETY: live tensors; the Work keeps its own references to both.
        let err = unsafe {
            raw::shim_pg_reduce_scatter(
                self.as_raw(),
                output.as_ptr() as *mut C_tensor,
                input.as_ptr() as *mut C_tensor,
                op as c_int,
                &mut work,
            )
        };
        self.work(err, work, "reduce_scatter")
    }

    /// Starts an all-gather (c10d's `_allgather_base`, torch's
    /// `all_gather_into_tensor`): rank r's `input` becomes chunk r of every rank's
    /// `output`. Both contiguous, of one dtype and device, `output` world size times
    /// `input`'s length.
    pub fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work<'_>, Error> {
        let mut work = std::ptr::null_mut();
        // SAFETY: as in reduce_scatter.
        let err = unsafe {
            raw::shim_pg_all_gather(
                self.as_raw(),
                output.as_ptr() as *mut C_tensor,
                input.as_ptr() as *mut C_tensor,
                &mut work,
            )
        };
        self.work(err, work, "all_gather")
    }

    /// Starts an in-place broadcast of `t` from `root`.
    pub fn broadcast(&self, t: &Tensor, root: u32) -> Result<Work<'_>, Error> {
        let mut work = std::ptr::null_mut();
        // SAFETY: as in allreduce.
        let err =
            unsafe { raw::shim_pg_broadcast(self.as_raw(), t.as_ptr() as *mut C_tensor, root as c_int, &mut work) };
        self.work(err, work, "broadcast")
    }

    /// Blocks until every rank arrives.
    pub fn barrier(&self) -> Result<(), Error> {
        // SAFETY: a live group.
        let err = unsafe { raw::shim_pg_barrier(self.as_raw(), self.cuda_device as c_int) };
        take_message(err).map_or(Ok(()), |m| Err(self.collective_error("barrier", m)))
    }

    fn work(&self, err: *mut c_char, work: *mut c_void, op: &'static str) -> Result<Work<'_>, Error> {
        if let Some(m) = take_message(err) {
            return Err(self.collective_error(op, m));
        }
        Ok(Work { raw: NonNull::new(work).expect("the shim returns work on success"), group: self, op })
    }
}

/// c10d's flight recorder is a process-wide ring of collectives that the trainer never
/// dumps, and its `record` inserts into an unsynchronized map: process groups of ranks
/// that are threads of one process (tests, `bench-ddp`) crash there when their first
/// collectives race (a segfault in `FlightRecorder::recordWithResetEnabled`, about one
/// run in four of the collective tests). So it is off (`TORCH_FR_BUFFER_SIZE=0`) unless
/// the environment sets a size, before the first group reads it.
fn flight_recorder_off_unless_asked() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TORCH_FR_BUFFER_SIZE").is_none()
            && std::env::var_os("TORCH_NCCL_TRACE_BUFFER_SIZE").is_none()
        {
            // SAFETY: runs once, before this process's first process group: c10d reads
            // the variable when that group first records, after this write.
            unsafe { std::env::set_var("TORCH_FR_BUFFER_SIZE", "0") };
        }
    });
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        // SAFETY: created by shim_pg_new, freed once.
        unsafe { raw::shim_pg_free(self.raw.as_ptr()) }
    }
}

/// An in-flight collective; [`Work::wait`] completes it (dropping it does not cancel it).
pub struct Work<'g> {
    raw: NonNull<c_void>,
    group: &'g ProcessGroup,
    op: &'static str,
}

impl Work<'_> {
    /// Waits for completion: the host blocks on Gloo; on NCCL the current CUDA stream does.
    pub fn wait(self) -> Result<(), Error> {
        // SAFETY: a live work handle.
        let err = unsafe { raw::shim_work_wait(self.raw.as_ptr()) };
        take_message(err).map_or(Ok(()), |m| Err(self.group.collective_error(self.op, m)))
    }
}

impl Work<'_> {
    /// The same collective as a [`PendingWork`], which keeps `group` alive itself, to
    /// be waited for after this borrow ends (a prefetch).
    pub fn keep(self, group: &Arc<ProcessGroup>) -> PendingWork {
        assert!(std::ptr::eq(self.group, group.as_ref()), "work kept with the group that started it");
        let (raw, op) = (self.raw, self.op);
        std::mem::forget(self);
        PendingWork { raw, group: group.clone(), op }
    }
}

/// A collective in flight that owns a handle on its group.
pub struct PendingWork {
    raw: NonNull<c_void>,
    group: Arc<ProcessGroup>,
    op: &'static str,
}

// SAFETY: c10d work handles may be waited on from any thread.
unsafe impl Send for PendingWork {}

impl PendingWork {
    /// As [`Work::wait`].
    pub fn wait(self) -> Result<(), Error> {
        // SAFETY: a live work handle.
        let err = unsafe { raw::shim_work_wait(self.raw.as_ptr()) };
        take_message(err).map_or(Ok(()), |m| Err(self.group.collective_error(self.op, m)))
    }
}

impl Drop for PendingWork {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once.
        unsafe { raw::shim_work_free(self.raw.as_ptr()) }
    }
}

impl Drop for Work<'_> {
    fn drop(&mut self) {
        // SAFETY: created by the shim, freed once.
        unsafe { raw::shim_work_free(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tch::{Device, Kind, Tensor};

    use super::{Backend, GlooDevice, GroupOptions, ProcessGroup, ReduceOp, Timeouts};
    use crate::Error;
    use crate::dist::loopback::{gloo, on_ranks};

    /// Rank r's input to the collectives: element i of chunk c is `100·r + 10·c + i`.
    fn input(rank: u32, world: u32, chunk: i64, kind: Kind) -> Tensor {
        let i = Tensor::arange(chunk, (Kind::Double, Device::Cpu));
        let chunks: Vec<Tensor> = (0..world).map(|c| &i + (100 * rank + 10 * c) as f64).collect();
        Tensor::cat(&chunks, 0).to_kind(kind)
    }

    fn values(t: &Tensor) -> Vec<f64> {
        Vec::<f64>::try_from(t.to_kind(Kind::Double)).unwrap()
    }

    #[test]
    fn reduce_scatter_gives_each_rank_its_chunk_reduced_over_every_rank() {
        for world in [2u32, 3] {
            for (op, kind) in
                [(ReduceOp::Sum, Kind::Float), (ReduceOp::Avg, Kind::Double), (ReduceOp::Max, Kind::Float)]
            {
                on_ranks(world, |rank, port| {
                    let g = gloo(rank, world, port)?;
                    let chunk = 5;
                    let out = Tensor::full([chunk], -1.0, (kind, Device::Cpu));
                    g.reduce_scatter(&out, &input(rank, world, chunk, kind), op)?.wait()?;
                    let got = values(&out);
                    for (i, v) in got.iter().enumerate() {
                        let of = |r: u32| (100 * r + 10 * rank) as f64 + i as f64;
                        let want = match op {
                            ReduceOp::Sum => (0..world).map(of).sum::<f64>(),
                            ReduceOp::Avg => (0..world).map(of).sum::<f64>() / world as f64,
                            _ => of(world - 1),
                        };
                        assert_eq!(*v, want, "{op:?} {kind:?} world {world} rank {rank}: {got:?}");
                    }
                    Ok::<_, Error>(())
                })
                .unwrap();
            }
        }
    }

    /// ZeRO-2 reduce-scatters what DDP all-reduces; the two give the same training only
    /// if each element's sum over the ranks rounds the same way in both.
    #[test]
    fn reduce_scatter_sums_each_element_as_the_all_reduce_does_bit_for_bit() {
        for world in [2u32, 3, 4] {
            on_ranks(world, |rank, port| {
                let g = gloo(rank, world, port)?;
                let chunk = 4099;
                let data = |r: u32| {
                    let i = Tensor::arange(chunk * i64::from(world), (Kind::Double, Device::Cpu));
                    ((i * (0.731 + f64::from(r))).sin() * 10f64.powi(r as i32 - 1)).to_kind(Kind::Float)
                };
                let all = data(rank);
                let out = Tensor::zeros([chunk], (Kind::Float, Device::Cpu));
                g.reduce_scatter(&out, &all, ReduceOp::Sum)?.wait()?;
                g.allreduce(&all, ReduceOp::Sum)?.wait()?;
                let mine = all.narrow(0, i64::from(rank) * chunk, chunk);
                let differ = mine.ne_tensor(&out).sum(Kind::Int64).int64_value(&[]);
                assert_eq!(differ, 0, "world {world} rank {rank}: {differ} elements round differently");
                Ok::<_, Error>(())
            })
            .unwrap();
        }
    }

    #[test]
    fn all_gather_lays_every_ranks_input_out_in_rank_order() {
        for world in [2u32, 3] {
            on_ranks(world, |rank, port| {
                let g = gloo(rank, world, port)?;
                let mine = Tensor::arange(4, (Kind::Float, Device::Cpu)) + (10 * rank) as f64;
                let out = Tensor::zeros([4 * world as i64], (Kind::Float, Device::Cpu));
                g.all_gather(&out, &mine)?.wait()?;
                let want: Vec<f64> = (0..world).flat_map(|r| (0..4).map(move |i| (10 * r + i) as f64)).collect();
                assert_eq!(values(&out), want, "world {world} rank {rank}");
                Ok::<_, Error>(())
            })
            .unwrap();
        }
    }

    /// A rank that arrives after the collective timeout but within the rendezvous
    /// timeout joins; the collectives after it keep their own, shorter bound.
    #[test]
    fn a_late_rank_joins_within_the_rendezvous_timeout_not_the_collective_one() {
        let (rendezvous, collective) = (Duration::from_secs(60), Duration::from_secs(1));
        let late = collective * 3;
        let (sum, missing, waited) = on_ranks(2, |rank, port| {
            if rank == 1 {
                std::thread::sleep(late);
            }
            let g = ProcessGroup::new(&GroupOptions {
                backend: Backend::Gloo,
                master_addr: "127.0.0.1".into(),
                master_port: port,
                rank,
                world_size: 2,
                timeouts: Timeouts { rendezvous, collective },
                gloo_device: GlooDevice::Host("127.0.0.1".into()),
                cuda_device: 0,
            })?;
            assert_eq!(g.timeout(), collective);
            let t = Tensor::from_slice(&[f64::from(rank + 1)]);
            g.allreduce(&t, ReduceOp::Sum)?.wait()?;
            let sum = values(&t)[0];
            if rank == 1 {
                return Ok((sum, None, Duration::ZERO));
            }
            let started = std::time::Instant::now();
            let alone = g.allreduce(&t, ReduceOp::Sum).and_then(|w| w.wait());
            Ok::<_, Error>((sum, alone.err(), started.elapsed()))
        })
        .unwrap();
        assert_eq!(sum, 3.0, "both ranks joined and reduced");
        let missing = missing.expect("a collective the peer never joins fails");
        assert!(matches!(missing, Error::Collective { .. }), "{missing}");
        assert!(waited < rendezvous / 2, "the collective waited {waited:?}, not its own {collective:?}");
    }

    #[test]
    fn mismatched_sizes_are_a_collective_error_naming_the_op() {
        let err = on_ranks(1, |rank, port| {
            let g = gloo(rank, 1, port)?;
            let out = Tensor::zeros([3], (Kind::Float, Device::Cpu));
            let bad = Tensor::zeros([4], (Kind::Float, Device::Cpu));
            let scatter = g.reduce_scatter(&out, &bad, ReduceOp::Sum).err().expect("refused");
            let gather = g.all_gather(&bad, &out).err().expect("refused");
            Ok::<_, Error>((scatter.to_string(), gather.to_string()))
        })
        .unwrap();
        assert!(err.0.contains("reduce_scatter") && err.0.contains("world size"), "{}", err.0);
        assert!(err.1.contains("all_gather") && err.1.contains("world size"), "{}", err.1);
    }
}
