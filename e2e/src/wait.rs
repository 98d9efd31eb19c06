//! Waiting for a condition instead of sleeping: poll a probe until it yields a value or a deadline
//! passes, then fail with a message that says what was awaited and the last observation.

use std::fmt::Debug;
use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `probe` every 100 ms until it returns `Ok(Some(v))`; fails after `timeout` with `what` and the
/// last error or "not yet" so the failure explains itself.
pub async fn wait_until<T, E, F, Fut>(
    what: &str,
    timeout: Duration,
    mut probe: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, E>>,
    E: Debug,
{
    let deadline = Instant::now() + timeout;
    loop {
        let last = match probe().await {
            Ok(Some(v)) => return Ok(v),
            Ok(None) => String::from("condition not met yet"),
            Err(e) => format!("{e:?}"),
        };
        if Instant::now() >= deadline {
            anyhow::bail!(
                "timed out after {timeout:?} waiting for {what}; last observation: {last}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
