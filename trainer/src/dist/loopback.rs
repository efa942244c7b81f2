//! Ranks as threads of this process, talking Gloo over loopback: for benchmarks and
//! tests of collectives without launching processes.

use std::time::Duration;

use super::{Backend, GlooDevice, GroupOptions, ProcessGroup, Timeouts, free_port};
use crate::Error;

/// Runs `f(rank, port)` on `world` threads and returns rank 0's result.
pub fn on_ranks<T: Send>(world: u32, f: impl Fn(u32, u16) -> Result<T, Error> + Sync) -> Result<T, Error> {
    let port = free_port()?;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                s.spawn({
                    let f = &f;
                    move || f(rank, port)
                })
            })
            .collect();
        let mut results: Vec<Result<T, Error>> =
            handles.into_iter().map(|h| h.join().expect("bench rank panicked")).collect();
        results.swap_remove(0)
    })
}

/// Rank `rank` of a `world`-rank Gloo group on 127.0.0.1:`port`.
pub fn gloo(rank: u32, world: u32, port: u16) -> Result<ProcessGroup, Error> {
    ProcessGroup::new(&GroupOptions {
        backend: Backend::Gloo,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank,
        world_size: world,
        timeouts: Timeouts::both(Duration::from_secs(120)),
        gloo_device: GlooDevice::Host("127.0.0.1".into()),
        cuda_device: 0,
    })
}
