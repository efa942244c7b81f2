//! The clusters' places: at most `PT_REAL_CLUSTERS` clusters at once, the longest test
//! first.
//!
//! libtest starts tests in the order of their names, as many at once as it has threads.
//! Were it given one thread a cluster, a long test whose name sorts late would start
//! last and run alone at the end while the other places stood idle. `make test` gives it
//! a thread for every test instead, so every test asks for a place at once, and a place
//! that frees goes to the waiting test expected to take longest ([`LONGEST_FIRST`]).
//! The first places, too: they go to the tests of [`LONGEST_FIRST`] that this run will
//! start (the suite's own `--list` with this process's arguments), in its order,
//! whichever threads ask first; a place is kept for such a test until it asks.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How many clusters may run at once: `PT_REAL_CLUSTERS`, 3 unless set. A test spends
/// most of its time waiting for controllers, leases and grace periods, which three
/// clusters overlap; the training in them shares the cores.
pub const CLUSTERS_ENV: &str = "PT_REAL_CLUSTERS";

/// The tests that take longest, longest first, as `make test`'s log gives their times
/// (`real-cluster: <test> passed after holding a cluster <n> s`). The others follow in
/// the order they asked.
pub const LONGEST_FIRST: &[&str] = &[
    "operator::a_killed_leader_hands_over_without_a_spurious_restart",
    "kueue::kueue_admits_queues_and_preempts_our_runs",
    "run::the_chart_installs_and_a_two_node_run_trains_end_to_end",
    "run::ranks_orphaned_by_their_job_are_deleted_under_the_charts_rbac",
    "scenarios::a_run_rides_out_the_api_server_and_etcd_going_away",
    "network_faults::a_lost_node_is_a_disruption_and_the_gang_restarts_on_the_other_nodes",
    "failures::a_refused_edit_leaves_the_attempt_alone_and_a_killed_rank_restarts_the_gang_from_its_checkpoint",
    "alerts::alerts_fire_from_live_metrics_and_the_dashboard_has_data",
    "scenarios::a_run_trains_to_succeeded_and_a_killed_trainer_resumes_to_the_same_losses",
    "scenarios::a_paused_trainer_is_reported_stalled_until_it_continues",
];

/// A test's place for its cluster, held for the whole test. When the test ends it says
/// how long the test held it and waited for it, on stderr past libtest's capture, so
/// that `make test`'s log shows where the suite's time went.
pub struct ClusterSlot {
    test: String,
    waited: Duration,
    held: Instant,
}

/// A place for one cluster, held for the whole test (see the module's documentation).
pub async fn cluster_slot() -> ClusterSlot {
    let asked = Instant::now();
    let test = std::thread::current().name().unwrap_or("a test").to_string();
    let granted = places().lock().expect("the places' lock").ask(rank(&test));
    if let Err(turn) = granted {
        turn.await.expect("a waiting test's turn is never dropped");
    }
    ClusterSlot { test, waited: asked.elapsed(), held: Instant::now() }
}

impl Drop for ClusterSlot {
    fn drop(&mut self) {
        places().lock().unwrap_or_else(|poisoned| poisoned.into_inner()).give_back();
        let outcome = if std::thread::panicking() { "failed" } else { "passed" };
        let line = format!(
            "real-cluster: {} {outcome} after holding a cluster {} s (it waited {} s for one)\n",
            self.test,
            self.held.elapsed().as_secs(),
            self.waited.as_secs()
        );
        let _ = std::io::stderr().write_all(line.as_bytes());
    }
}

/// Where `test` stands in [`LONGEST_FIRST`]; after all of it when not there.
fn rank(test: &str) -> usize {
    LONGEST_FIRST.iter().position(|t| *t == test).unwrap_or(LONGEST_FIRST.len())
}

fn places() -> &'static Mutex<Places> {
    static PLACES: OnceLock<Mutex<Places>> = OnceLock::new();
    PLACES.get_or_init(|| {
        let free = match std::env::var(CLUSTERS_ENV) {
            Ok(v) => v
                .parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .unwrap_or_else(|| panic!("{CLUSTERS_ENV}={v:?}: expected a number of clusters, 1 or more")),
            Err(_) => 3,
        };
        Mutex::new(Places::new(free).keeping(long_tests_to_start()))
    })
}

/// The ranks of the [`LONGEST_FIRST`] tests that this run will start: the suite lists its
/// tests under this process's own filters.
fn long_tests_to_start() -> Vec<usize> {
    let listed = std::env::current_exe()
        .and_then(|exe| std::process::Command::new(exe).arg("--list").args(std::env::args().skip(1)).output());
    let Ok(out) = listed else { return Vec::new() };
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().filter_map(|l| l.strip_suffix(": test")).map(rank).filter(|&r| r < LONGEST_FIRST.len()).collect()
}

/// The free places, the long tests that have yet to ask (a free place is kept for each),
/// and the tests waiting for one, by rank and then by arrival.
struct Places {
    free: usize,
    expected: BTreeSet<usize>,
    arrivals: u64,
    waiting: BTreeMap<(usize, u64), oneshot::Sender<()>>,
}

impl Places {
    fn new(free: usize) -> Places {
        Places { free, expected: BTreeSet::new(), arrivals: 0, waiting: BTreeMap::new() }
    }

    /// Keeps places for the tests of these ranks until they ask.
    fn keeping(self, ranks: Vec<usize>) -> Places {
        Places { expected: ranks.into_iter().collect(), ..self }
    }

    /// How many of the expected tests still to ask rank before `rank`: the places they
    /// are kept.
    fn kept_before(&self, rank: usize) -> usize {
        self.expected.range(..rank).count()
    }

    /// A place now, or the turn to wait for: a free place beyond those kept for the
    /// expected tests that rank before this one.
    fn ask(&mut self, rank: usize) -> Result<(), oneshot::Receiver<()>> {
        self.expected.remove(&rank);
        if self.free > self.kept_before(rank) {
            self.free -= 1;
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        self.arrivals += 1;
        self.waiting.insert((rank, self.arrivals), tx);
        Err(rx)
    }

    /// Hands a place to the first waiting test, or frees it: it stays free while it is
    /// kept for an expected test that ranks before the first waiting one.
    fn give_back(&mut self) {
        while let Some(&(rank, arrival)) = self.waiting.keys().next() {
            if self.free < self.kept_before(rank) {
                break;
            }
            let turn = self.waiting.remove(&(rank, arrival)).expect("the first waiting test");
            if turn.send(()).is_ok() {
                return;
            }
        }
        self.free += 1;
    }
}

#[test]
fn a_freed_place_goes_to_the_longest_waiting_test_then_to_the_first_to_ask() {
    let mut places = Places::new(1);
    assert!(places.ask(5).is_ok(), "a free place is taken at once");
    let mut short_first = places.ask(5).unwrap_err();
    let mut long = places.ask(0).unwrap_err();
    let mut short_second = places.ask(5).unwrap_err();
    places.give_back();
    assert!(long.try_recv().is_ok(), "the longest test goes first");
    assert!(short_first.try_recv().is_err());
    places.give_back();
    assert!(short_first.try_recv().is_ok(), "then the first of the rest to ask");
    assert!(short_second.try_recv().is_err());
    drop(short_second);
    places.give_back();
    assert_eq!(places.free, 1, "a place nobody waits for any more is free again");
}

#[test]
fn the_first_places_are_kept_for_the_long_tests_that_will_start_whoever_asks_first() {
    let mut places = Places::new(2).keeping(vec![0, 1]);
    let mut short = places.ask(5).unwrap_err();
    assert!(places.ask(1).is_ok(), "a kept place");
    assert!(short.try_recv().is_err(), "the other place is still kept for rank 0");
    assert!(places.ask(0).is_ok(), "the last kept place");
    places.give_back();
    assert!(short.try_recv().is_ok(), "nothing is kept any more: the short test's turn");

    let mut places = Places::new(3).keeping(vec![0]);
    assert!(places.ask(7).is_ok() && places.ask(8).is_ok(), "places beyond the kept one are free to take");
    let mut third = places.ask(9).unwrap_err();
    assert!(places.ask(0).is_ok(), "rank 0's kept place");
    places.give_back();
    assert!(third.try_recv().is_ok());
}

#[test]
fn the_first_places_go_to_the_long_tests_in_their_order_whatever_order_they_ask_in() {
    let mut places = Places::new(1).keeping(vec![0, 1]);
    let mut second = places.ask(1).unwrap_err();
    assert!(places.ask(0).is_ok(), "rank 0 first, though it asked second");
    places.give_back();
    assert!(second.try_recv().is_ok(), "then rank 1");
}

#[test]
fn the_longest_first_are_tests_of_this_suite() {
    let exe = std::env::current_exe().expect("the suite's path");
    let out = std::process::Command::new(&exe)
        .args(["--list", "--format", "terse"])
        .output()
        .expect("the suite lists its tests");
    let listed = String::from_utf8_lossy(&out.stdout);
    let tests: Vec<&str> = listed.lines().filter_map(|l| l.strip_suffix(": test")).collect();
    for name in LONGEST_FIRST {
        assert!(tests.contains(name), "LONGEST_FIRST names {name}, which is not a test of this suite: {tests:?}");
    }
}
