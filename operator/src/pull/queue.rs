//! The coalescing work queue of the event-loop controllers ([`cleanup`](super::cleanup),
//! [`cluster_secret`](super::cluster_secret), [`report`](super::report)): watch events mark keys
//! dirty, a burst of events for one key becomes one piece of work, and failed work is marked
//! again for later. Owns nothing but timing; the controllers decide what a key means.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Keys waiting to be processed, each with the earliest time it is due.
#[derive(Debug)]
pub struct DirtyQueue<K: Ord> {
    due: BTreeMap<K, Instant>,
}

impl<K: Ord> Default for DirtyQueue<K> {
    fn default() -> Self {
        DirtyQueue {
            due: BTreeMap::new(),
        }
    }
}

impl<K: Ord + Clone> DirtyQueue<K> {
    /// Marks `key` to be processed after `delay`; an earlier pending time wins.
    pub fn mark(&mut self, key: K, delay: Duration) {
        let at = Instant::now() + delay;
        self.due
            .entry(key)
            .and_modify(|t| *t = (*t).min(at))
            .or_insert(at);
    }

    /// When the next key is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.values().min().copied()
    }

    /// Removes and returns every key due at `now`, in key order.
    pub fn take_due(&mut self, now: Instant) -> Vec<K> {
        let ready: Vec<K> = self
            .due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| k.clone())
            .collect();
        for k in &ready {
            self.due.remove(k);
        }
        ready
    }

    /// Number of pending keys.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// Sleeps until the next key is due (forever when the queue is empty).
    pub async fn wait_due(&self) {
        match self.next_due() {
            Some(at) => tokio::time::sleep_until(at.into()).await,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_marks_is_one_key_and_the_earliest_time_wins() {
        let mut q = DirtyQueue::default();
        q.mark("a", Duration::from_secs(60));
        q.mark("a", Duration::ZERO);
        q.mark("b", Duration::from_secs(60));
        assert_eq!(q.len(), 2);
        assert_eq!(q.take_due(Instant::now()), vec!["a"]);
        assert_eq!(q.len(), 1);
        assert!(q.take_due(Instant::now()).is_empty());
        assert_eq!(
            q.take_due(Instant::now() + Duration::from_secs(61)),
            vec!["b"]
        );
        assert!(q.is_empty());
    }
}
