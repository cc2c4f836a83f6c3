//! How long the drain may take: the bounds it adds to `shutdown_timeout`
//! and `abandon_after`.

use std::time::Duration;

use super::closes::CLOSES_WORST_CASE;

/// The longest a drain can take: `shutdown_timeout`, then `abandon_after`
/// (and the grace the drain adds to it), then the close bounds: consumer
/// channels (together), the publisher's channel, the publishing connection,
/// the consumers' connection ([`super::closes::CLOSE_STEPS`]).
pub(crate) fn worst_case(config: &crate::config::Config) -> Duration {
    config.longest_handler_wait() + ABANDON_GRACE + CLOSES_WORST_CASE
}

/// Added to `abandon_after` before the drain stops waiting for abandoned
/// handlers to be dropped.
pub(super) const ABANDON_GRACE: Duration = Duration::from_millis(250);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_case_counts_every_close_the_drain_awaits_and_fits_the_default_host_timeout() {
        let config = crate::config::Config::new([crate::config::QueueConfig::new("q")]);
        let worst = worst_case(&config);
        assert_eq!(
            worst,
            config.shutdown_timeout
                + config.abandon_after
                + ABANDON_GRACE
                + crate::connection::CLOSE_BOUND * 4,
            "consumer channels, the publisher's channel, two connections"
        );
        assert!(
            worst < config.host_timeout,
            "the defaults must not warn at start: {worst:?} vs {:?}",
            config.host_timeout
        );
    }
}
