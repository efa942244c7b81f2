//! Time as the pipeline sees it: real in production, driven by hand in tests (stall
//! timeouts are at least a minute).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;

pub trait Clock: Send + Sync {
    fn now(&self) -> Timestamp;
}

#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to.
#[derive(Clone, Debug)]
pub struct ManualClock(Arc<Mutex<Timestamp>>);

impl ManualClock {
    pub fn new(start: Timestamp) -> ManualClock {
        ManualClock(Arc::new(Mutex::new(start)))
    }

    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().expect("clock lock");
        *t += jiff::SignedDuration::try_from(by).expect("duration fits");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        *self.0.lock().expect("clock lock")
    }
}

/// Seconds from `earlier` to `later`, 0 when `later` is not after `earlier`.
pub fn seconds_between(earlier: Timestamp, later: Timestamp) -> u64 {
    later.duration_since(earlier).as_secs().max(0) as u64
}
