//! Each rank's time per step before the collectives, gathered over the ranks at every
//! sync: what finds a straggler. A step's compute runs from its start to where the
//! gradient reducer starts to wait for its peers
//! ([`crate::dist::GradReducer::take_compute_end`]), less the time spent waiting for the
//! data loader: after the all-reduce every rank looks as slow as the slowest. On CUDA
//! both ends are events on the compute stream ([`StreamMark`]), read once the sync has
//! completed them.

use crds::contract::RankTiming;
use tch::{Device, Kind, Tensor};

use crate::Error;
use crate::dist::ProcessGroup;
use crate::ffi::StreamMark;

/// One step's marks on this rank.
pub(super) struct StepTiming {
    pub start: StreamMark,
    /// `None` where the step had no gradient all-reduce to wait for.
    pub end: Option<StreamMark>,
    /// Seconds the host waited for the data loader.
    pub data_wait: f64,
}

/// This rank's sums since the last gather.
#[derive(Debug, Default)]
pub(super) struct RankTotals {
    compute: f64,
    data_wait: f64,
    steps: u64,
}

impl RankTotals {
    /// Adds a step whose work has completed.
    pub fn add(&mut self, t: &StepTiming) -> Result<(), Error> {
        let Some(end) = &t.end else { return Ok(()) };
        self.compute += (t.start.seconds_until(end)? - t.data_wait).max(0.0);
        self.data_wait += t.data_wait;
        self.steps += 1;
        Ok(())
    }

    /// Every rank's means over its steps since the last gather, by rank: one all-gather
    /// of two numbers, so every rank calls it at the same syncs. Starts the next sums.
    pub fn gather(&mut self, group: &ProcessGroup, device: Device) -> Result<Vec<RankTiming>, Error> {
        let n = self.steps.max(1) as f64;
        let mine = Tensor::f_from_slice(&[self.compute / n, self.data_wait / n])?.f_to_device(device)?;
        let world = group.world_size() as i64;
        let all = Tensor::f_zeros([world * 2], (Kind::Double, device))?;
        group.all_gather(&all, &mine)?.wait()?;
        let values = Vec::<f64>::try_from(all.f_to_device(Device::Cpu)?.f_reshape([-1])?)?;
        *self = RankTotals::default();
        Ok(values
            .chunks_exact(2)
            .enumerate()
            .map(|(rank, v)| RankTiming { rank: rank as u32, compute_seconds: v[0], data_wait_seconds: v[1] })
            .collect())
    }
}
