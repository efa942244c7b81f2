//! When rank 0 is asked for its `/status`, and when a refused answer raises an event.

use std::time::Duration;

use jiff::Timestamp;

use crate::clock::seconds_between;
use crate::observed::Memory;
use crate::settings::Settings;

/// A refused answer raises a Warning event at most this often per run, so that a pod
/// answering garbage on every poll cannot flood the run's events; the log has each.
pub const REFUSAL_EVENT_INTERVAL: Duration = Duration::from_secs(600);
/// The reason of that Warning event.
pub const STATUS_REFUSED: &str = "TrainerStatusRefused";

/// Whether rank 0 is due a poll at `now`: once per `statusPollInterval` per run.
pub fn poll_due(memory: &Memory, now: Timestamp, settings: &Settings) -> bool {
    memory.last_poll.is_none_or(|t| seconds_between(t, now) >= settings.status_poll_interval.as_secs())
}

/// Whether a refused answer at `now` raises a Warning event, the last one having been
/// raised at `last`.
pub fn refusal_event_due(last: Option<Timestamp>, now: Timestamp) -> bool {
    last.is_none_or(|t| seconds_between(t, now) >= REFUSAL_EVENT_INTERVAL.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        format!("2026-01-01T{s}Z").parse().unwrap()
    }

    #[test]
    fn refusals_raise_an_event_at_most_every_ten_minutes() {
        let cases = [
            (None, "00:00:00", true),
            (Some("00:00:00"), "00:00:20", false),
            (Some("00:00:00"), "00:09:59", false),
            (Some("00:00:00"), "00:10:00", true),
            (Some("00:00:00"), "01:00:00", true),
            // A clock that went back raises nothing until the interval has passed.
            (Some("00:10:00"), "00:05:00", false),
        ];
        for (last, now, due) in cases {
            assert_eq!(refusal_event_due(last.map(t), t(now)), due, "last {last:?}, now {now}");
        }
    }

    #[test]
    fn rank0_is_polled_once_per_interval() {
        let settings = Settings { status_poll_interval: Duration::from_secs(20), ..Settings::default() };
        let cases = [
            (None, "00:00:00", true),
            (Some("00:00:00"), "00:00:19", false),
            (Some("00:00:00"), "00:00:20", true),
            (Some("00:00:30"), "00:00:10", false),
        ];
        for (last, now, due) in cases {
            let memory = Memory { last_poll: last.map(t), ..Memory::default() };
            assert_eq!(poll_due(&memory, t(now), &settings), due, "last {last:?}, now {now}");
        }
    }
}
