//! Reconnection delays: exponential from 1 s with jitter, never above the configured maximum,
//! restarted after a stream that stayed up for a while. Built on `backon`'s
//! [`ExponentialBuilder`] (the `backoff` crate is unmaintained, RUSTSEC-2025-0012).

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// First reconnection delay (before jitter).
pub const INITIAL_DELAY: Duration = Duration::from_secs(1);
/// A stream that stayed up at least this long restarts the backoff from [`INITIAL_DELAY`].
pub const STABLE_AFTER: Duration = Duration::from_secs(30);

/// The delay schedule between reconnection attempts.
#[derive(Debug)]
pub struct ReconnectBackoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl ReconnectBackoff {
    /// A schedule capped at `max` (at least 1 ms).
    pub fn new(max: Duration) -> Self {
        let max = max.max(Duration::from_millis(1));
        // backon's jitter adds up to 100 % of the base delay; capping the base at half the
        // maximum keeps jittered delays within [max/2, max] once the cap is reached.
        let base_cap = max / 2;
        let builder = ExponentialBuilder::default()
            .with_min_delay(INITIAL_DELAY.min(base_cap))
            .with_max_delay(base_cap)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        ReconnectBackoff {
            delays: builder.build(),
            builder,
            max,
        }
    }

    /// The delay before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        self.delays.next().unwrap_or(self.max).min(self.max)
    }

    /// The maximum delay (used after a permanent refusal).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Starts over from the initial delay.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_with_jitter_and_never_exceed_the_cap() {
        let max = Duration::from_secs(60);
        let mut b = ReconnectBackoff::new(max);
        let delays: Vec<Duration> = (0..20).map(|_| b.next_delay()).collect();
        let first = delays[0];
        assert!(
            first >= INITIAL_DELAY && first <= 2 * INITIAL_DELAY,
            "{first:?}"
        );
        assert!(delays.iter().all(|d| *d <= max), "{delays:?}");
        // Past the cap the delay stays jittered within [max/2, max].
        assert!(delays[10..].iter().all(|d| *d >= max / 2), "{delays:?}");
        // Doubling: attempt 5 waits at least 16 s.
        assert!(delays[4] >= Duration::from_secs(16), "{delays:?}");
    }

    #[test]
    fn reset_starts_over_and_a_tiny_cap_is_honoured() {
        let mut b = ReconnectBackoff::new(Duration::from_secs(60));
        for _ in 0..10 {
            b.next_delay();
        }
        b.reset();
        assert!(b.next_delay() <= 2 * INITIAL_DELAY);

        let mut tiny = ReconnectBackoff::new(Duration::from_secs(1));
        assert!((0..10).all(|_| tiny.next_delay() <= Duration::from_secs(1)));
        assert_eq!(tiny.max(), Duration::from_secs(1));
    }
}
