//! The circuit breaker's window: a success counted in the bucket the
//! ticker last set (a tick late at most) against a failure, counted at the
//! clock's bucket, that rotates the same slot of the ring.

use std::sync::Arc;
use std::time::Duration;

use loom::thread;

use super::model;
use crate::breaker::window::{Tally, Window};

// A success stamped with the ticker's bucket 3 (late: the clock is in 13,
// which reuses its slot) racing a failure at 13 that rotates the slot: the
// failure is always counted; the late success is out of the window either
// way (counted in 3 and rotated away, or dropped), never written over the
// newer bucket.
#[test]
fn a_late_success_racing_a_failure_that_rotates_the_bucket_keeps_the_failure() {
    model(|| {
        let window = Arc::new(Window::new(Duration::from_secs(10)));
        window.record_in(3, false);
        let late = {
            let window = window.clone();
            thread::spawn(move || window.record_in(3, false))
        };
        window.record_in(13, true);
        late.join().unwrap();
        assert_eq!(
            window.tally_at(13),
            Tally {
                calls: 1,
                failures: 1
            }
        );
    });
}

// Two failures rotating one stale bucket at once: both are counted (the
// one that loses the compare-and-swap counts into the rotated bucket).
#[test]
fn two_failures_rotating_one_bucket_both_count() {
    model(|| {
        let window = Arc::new(Window::new(Duration::from_secs(10)));
        window.record_in(4, false);
        let other = {
            let window = window.clone();
            thread::spawn(move || window.record_in(14, true))
        };
        window.record_in(14, true);
        other.join().unwrap();
        assert_eq!(
            window.tally_at(14),
            Tally {
                calls: 2,
                failures: 2
            }
        );
    });
}
