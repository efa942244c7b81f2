//! Data parallelism through libtorch's own c10d: the process group and its
//! collectives ([`group`]), the bucketed, overlapped gradient all-reduce ([`reducer`]),
//! ZeRO's partition of the parameters over ranks ([`shard`]), fsdp's sharded parameters
//! ([`fsdp`]) and the in-pod launcher ([`launch`]), like torchrun. The strategies the
//! training loop calls over them are [`crate::parallel`]'s.

pub mod fsdp;
pub mod group;
pub mod launch;
pub mod loopback;
pub mod reducer;
pub mod shard;

use crds::contract::env;
use tch::{Device, Kind, Tensor};

pub use group::{Backend, GlooDevice, GroupOptions, ProcessGroup, ReduceOp, Timeouts};
pub use reducer::{DEFAULT_BUCKET_CAP_BYTES, GradReducer};

use crate::Error;

/// Where this process sits in the gang, as the launcher's environment says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub rank: u32,
    pub local_rank: u32,
    pub world_size: u32,
    pub master_addr: String,
    pub master_port: u16,
}

impl Placement {
    /// A single process: rank 0 of 1.
    pub fn single() -> Placement {
        Placement {
            rank: 0,
            local_rank: 0,
            world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: crds::contract::RENDEZVOUS_PORT,
        }
    }

    /// RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT, as `trainer launch`
    /// (or torchrun) sets them; all absent means a single process.
    pub fn from_env() -> Result<Placement, Error> {
        let get = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        if get(env::RANK).is_none() && get(env::WORLD_SIZE).is_none() {
            return Ok(Placement::single());
        }
        let num = |name: &str| -> Result<u32, Error> {
            let v = get(name)
                .ok_or_else(|| Error::InvalidSpec(format!("{name} is not set (RANK and WORLD_SIZE come together)")))?;
            v.parse().map_err(|_| Error::InvalidSpec(format!("{name}={v:?} is not a non-negative integer")))
        };
        let p = Placement {
            rank: num(env::RANK)?,
            local_rank: get(env::LOCAL_RANK).map_or(Ok(0), |_| num(env::LOCAL_RANK))?,
            world_size: num(env::WORLD_SIZE)?,
            master_addr: get(env::MASTER_ADDR).unwrap_or_else(|| "127.0.0.1".into()),
            master_port: match get(env::MASTER_PORT) {
                None => crds::contract::RENDEZVOUS_PORT,
                Some(v) => v.parse().map_err(|_| Error::InvalidSpec(format!("MASTER_PORT={v:?} is not a port")))?,
            },
        };
        if p.world_size == 0 || p.rank >= p.world_size {
            return Err(Error::InvalidSpec(format!("RANK={} is outside WORLD_SIZE={}", p.rank, p.world_size)));
        }
        Ok(p)
    }

    /// Joins the process group of this placement.
    pub fn join(&self, device: Device, timeouts: Timeouts) -> Result<ProcessGroup, Error> {
        ProcessGroup::new(&GroupOptions {
            backend: Backend::for_device(device),
            master_addr: self.master_addr.clone(),
            master_port: self.master_port,
            rank: self.rank,
            world_size: self.world_size,
            timeouts,
            gloo_device: GroupOptions::gloo_device_for(&self.master_addr),
            cuda_device: self.local_rank as usize,
        })
    }
}

/// The lowest port the kernel hands out for `bind(0)` and outgoing connections.
const EPHEMERAL_RANGE: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Where [`free_port`] looks below the ephemeral range.
const FIRST_FIXED_PORT: u16 = 10_000;

/// A TCP port on 127.0.0.1 that was free a moment ago, for a local rendezvous. It is
/// taken below the kernel's ephemeral range, from a random start: a port of that range
/// could be handed to any connection or `bind(0)` between this check and the TCPStore's
/// own bind (an EADDRINUSE seen in CI), one below it only to another explicit picker.
pub fn free_port() -> Result<u16, Error> {
    let ephemeral_low = std::fs::read_to_string(EPHEMERAL_RANGE)
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|p| p.parse::<u16>().ok()))
        .unwrap_or(32_768);
    if ephemeral_low > FIRST_FIXED_PORT {
        let span = u64::from(ephemeral_low - FIRST_FIXED_PORT);
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let start = crate::rng::splitmix64(nanos as u64 ^ u64::from(std::process::id())) % span;
        for i in 0..span {
            let port = FIRST_FIXED_PORT + ((start + i) % span) as u16;
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return Ok(port);
            }
        }
    }
    let addr = std::path::Path::new("127.0.0.1:0");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(crate::io_err(addr))?;
    Ok(listener.local_addr().map_err(crate::io_err(addr))?.port())
}

/// Makes every rank's parameters rank 0's, in place.
pub fn broadcast_parameters(group: &ProcessGroup, params: &[Tensor]) -> Result<(), Error> {
    tch::no_grad(|| {
        for p in params {
            group.broadcast(p, 0)?.wait()?;
        }
        Ok(())
    })
}

/// A cheap fingerprint of the parameters: (Σ x, Σ x², Σ i·x over a stride), in f64.
pub fn parameter_checksum(params: &[Tensor]) -> Result<[f64; 3], Error> {
    tch::no_grad(|| {
        let mut sums = [0.0; 3];
        for p in params {
            let x = p.f_detach()?.f_to_kind(Kind::Double)?.f_flatten(0, -1)?;
            let n = x.size()[0];
            let weights = Tensor::f_arange(n, (Kind::Double, x.device()))?.f_remainder(977)?;
            sums[0] += x.f_sum(Kind::Double)?.f_double_value(&[])?;
            sums[1] += x.f_square()?.f_sum(Kind::Double)?.f_double_value(&[])?;
            sums[2] += x.f_mul(&weights)?.f_sum(Kind::Double)?.f_double_value(&[])?;
        }
        Ok(sums)
    })
}

/// Fails unless every rank holds the same parameters (by [`parameter_checksum`]),
/// naming what was loaded.
pub fn check_parameters_agree(group: &ProcessGroup, params: &[Tensor], what: &str) -> Result<(), Error> {
    let sums = parameter_checksum(params)?;
    let device = params.first().map_or(Device::Cpu, |p| p.device());
    let hi = Tensor::f_from_slice(&sums)?.f_to_device(device)?;
    let lo = hi.f_neg()?;
    group.allreduce(&hi, ReduceOp::Max)?.wait()?;
    group.allreduce(&lo, ReduceOp::Max)?.wait()?;
    let (hi, lo) =
        (Vec::<f64>::try_from(hi.f_to_device(Device::Cpu)?)?, Vec::<f64>::try_from(lo.f_to_device(Device::Cpu)?)?);
    for (i, (&h, &l)) in hi.iter().zip(&lo).enumerate() {
        let (max, min) = (h, -l);
        if (max - min).abs() > 1e-9 * max.abs().max(min.abs()).max(1.0) {
            return Err(Error::Checkpoint {
                path: what.into(),
                message: format!(
                    "the ranks loaded different parameters (checksum {i}: {min} on one rank, {max} on another); \
                     was the checkpoint changed while they read it?"
                ),
            });
        }
    }
    Ok(())
}

/// Sums `values`, a `#[repr(C)]` struct of `f64` fields, over the group's ranks in
/// place, in one all-reduce on `device`.
pub fn allreduce_sum<T: bytemuck::Pod>(group: &ProcessGroup, values: &mut T, device: Device) -> Result<(), Error> {
    let fields = bytemuck::cast_slice_mut::<T, f64>(std::slice::from_mut(values));
    let t = Tensor::f_from_slice(fields)?.f_to_device(device)?;
    group.allreduce(&t, ReduceOp::Sum)?.wait()?;
    fields.copy_from_slice(&Vec::<f64>::try_from(t.f_to_device(Device::Cpu)?)?);
    Ok(())
}

#[cfg(test)]
mod free_port_tests {
    use super::*;

    #[test]
    fn a_free_port_is_below_the_ephemeral_range_and_free() {
        let low: u16 =
            std::fs::read_to_string(EPHEMERAL_RANGE).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        let port = free_port().unwrap();
        assert!((FIRST_FIXED_PORT..low).contains(&port), "{port} outside {FIRST_FIXED_PORT}..{low}");
        std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    }
}
