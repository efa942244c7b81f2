//! The operator's own writes that a run's next reconcile must see in the stores, and
//! where that reconcile reads until they show.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Caches;

/// The kinds the operator writes that a reconcile reads back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Run,
    Job,
    Pod,
    ConfigMap,
    Claim,
    Service,
    NetworkPolicy,
}

/// A write of the operator's that the next reconcile of its run must see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// Written at `version` (the resourceVersion the API server answered).
    Written { kind: Kind, name: String, version: u64 },
    /// Deleted: gone from the store, or being deleted there.
    Gone { kind: Kind, name: String },
    /// The next reconcile reads the API (a write refused as planned on an older run,
    /// or an answer without a resourceVersion).
    Live,
}

impl Expected {
    /// A write answered with `resource_version`.
    pub fn written(kind: Kind, name: &str, resource_version: Option<&str>) -> Expected {
        match resource_version.and_then(|rv| rv.parse::<u64>().ok()) {
            Some(version) => Expected::Written { kind, name: name.to_string(), version },
            None => Expected::Live,
        }
    }
}

/// How long a store may lag one of the operator's writes before a reconcile reads the
/// API instead: a watch event late by this much is not on its way.
pub const STORE_LAG_LIMIT: Duration = Duration::from_secs(30);

/// Where a run's reconcile reads, by what the stores show of its writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// The stores show every write: read them.
    Caches,
    /// A store lags a write of less than [`STORE_LAG_LIMIT`] ago: reconcile again when
    /// its event arrives (it triggers one), or shortly.
    Deferred,
    /// Read the API: a write asked for it, or a store lags by more than the limit.
    Api,
}

impl Reading {
    /// The `source` label of `trainingrun_reconcile_reads_total`.
    pub fn label(self) -> &'static str {
        match self {
            Reading::Caches => "cache",
            Reading::Deferred => "deferred",
            Reading::Api => "api",
        }
    }
}

/// A run's writes the stores have yet to show, since the oldest of them.
#[derive(Debug)]
struct Pending {
    since: Instant,
    writes: Vec<Expected>,
}

impl Pending {
    /// Forgets the writes `shown`; where the reconcile reads at `now`.
    fn reading(&mut self, shown: impl Fn(&Expected) -> bool, now: Instant) -> Reading {
        self.writes.retain(|e| !shown(e));
        if self.writes.is_empty() {
            Reading::Caches
        } else if self.writes.contains(&Expected::Live) || now.duration_since(self.since) >= STORE_LAG_LIMIT {
            Reading::Api
        } else {
            Reading::Deferred
        }
    }
}

/// The operator's writes of each run (by uid) that the stores have yet to show.
#[derive(Default)]
pub struct Expectations(Mutex<HashMap<String, Pending>>);

impl Expectations {
    pub fn expect(&self, uid: &str, expected: Expected) {
        let mut all = self.0.lock().expect("expectations lock");
        let pending =
            all.entry(uid.to_string()).or_insert_with(|| Pending { since: Instant::now(), writes: Vec::new() });
        // A later write of the same object supersedes the earlier one.
        pending.writes.retain(|e| !same_object(e, &expected));
        pending.writes.push(expected);
    }

    /// Where a reconcile of the run `uid` in `ns` reads at `now`; the writes the stores
    /// show are forgotten.
    pub fn reading(&self, caches: &Caches, ns: &str, uid: &str, now: Instant) -> Reading {
        let mut all = self.0.lock().expect("expectations lock");
        let Some(pending) = all.get_mut(uid) else { return Reading::Caches };
        let reading = pending.reading(|e| caches.shows(ns, e), now);
        if reading == Reading::Caches {
            all.remove(uid);
        }
        reading
    }

    /// After a reconcile that read the API: what it read is newer than any write
    /// before it, but `Live` asked for exactly one such read.
    pub fn read_live(&self, uid: &str) {
        let mut all = self.0.lock().expect("expectations lock");
        if let Some(pending) = all.get_mut(uid) {
            pending.writes.retain(|e| *e != Expected::Live);
        }
    }

    pub fn forget(&self, uid: &str) {
        self.0.lock().expect("expectations lock").remove(uid);
    }
}

fn same_object(a: &Expected, b: &Expected) -> bool {
    let key = |e: &Expected| match e {
        Expected::Written { kind, name, .. } | Expected::Gone { kind, name } => Some((*kind, name.clone())),
        Expected::Live => None,
    };
    key(a).is_some() && key(a) == key(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(version: u64) -> Expected {
        Expected::Written { kind: Kind::Job, name: "llm-a1".into(), version }
    }

    fn status(version: u64) -> Expected {
        Expected::Written { kind: Kind::Run, name: "llm".into(), version }
    }

    #[test]
    fn a_store_behind_a_write_defers_the_reconcile_until_the_lag_limit_then_the_api_is_read() {
        let t0 = Instant::now();
        let shows_up_to = |v: u64| {
            move |e: &Expected| match e {
                Expected::Written { version, .. } => *version <= v,
                _ => false,
            }
        };
        let second = Duration::from_secs(1);
        let cases: Vec<(&str, Vec<Expected>, u64, Duration, Reading)> = vec![
            ("every write shown", vec![status(5), job(6)], 6, second, Reading::Caches),
            ("the Job's event on its way", vec![status(5), job(6)], 5, second, Reading::Deferred),
            ("nothing shown yet", vec![status(5), job(6)], 4, second, Reading::Deferred),
            ("just under the limit", vec![job(6)], 5, STORE_LAG_LIMIT - second, Reading::Deferred),
            ("at the limit", vec![job(6)], 5, STORE_LAG_LIMIT, Reading::Api),
            ("a write that asked for a live read", vec![job(6), Expected::Live], 6, second, Reading::Api),
        ];
        for (what, writes, shown, after, want) in cases {
            let mut pending = Pending { since: t0, writes };
            assert_eq!(pending.reading(shows_up_to(shown), t0 + after), want, "{what}");
            assert!(pending.writes.iter().all(|e| !shows_up_to(shown)(e)), "{what}: the writes shown are forgotten");
        }
    }

    #[test]
    fn a_later_write_of_an_object_supersedes_its_earlier_one_and_the_oldest_write_dates_the_lag() {
        let e = Expectations::default();
        e.expect("u", job(6));
        let since = e.0.lock().unwrap()["u"].since;
        e.expect("u", status(7));
        e.expect("u", job(8));
        let all = e.0.lock().unwrap();
        assert_eq!(all["u"].writes, [status(7), job(8)]);
        assert_eq!(all["u"].since, since);
    }
}
