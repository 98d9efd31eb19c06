//! Logging text a peer chose (event types, subjects, rejection reasons that quote them, error
//! reports): never more than [`MAX_LOGGED_CHARS`] characters of it, escaped so it cannot forge
//! log lines, and at WARN only a few times per interval ([`LogBudget`]), so a hostile peer can
//! neither fill the disk nor drown other messages.

use std::borrow::Cow;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Characters of peer-chosen text a log line keeps.
pub const MAX_LOGGED_CHARS: usize = 128;

/// `s` shortened to [`MAX_LOGGED_CHARS`] characters with control characters escaped; displays
/// how long the original was when it was cut.
pub struct Truncated<'a>(pub &'a str);

impl fmt::Display for Truncated<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(MAX_LOGGED_CHARS) {
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                fmt::Write::write_char(f, c)?;
            }
        }
        if chars.next().is_some() {
            write!(f, "…({} bytes)", self.0.len())?;
        }
        Ok(())
    }
}

/// `s` as [`Truncated`] text, owned (for fields that want a string).
pub fn truncated(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_LOGGED_CHARS && !s.chars().any(char::is_control) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(Truncated(s).to_string())
    }
}

/// Allows `per_interval` log lines per `interval`; the rest are counted and reported by the next
/// allowed line.
pub struct LogBudget {
    per_interval: u32,
    interval: Duration,
    state: Mutex<BudgetState>,
}

struct BudgetState {
    window_start: Option<Instant>,
    used: u32,
    suppressed: u64,
}

impl LogBudget {
    /// A budget of `per_interval` lines every `interval`.
    pub const fn new(per_interval: u32, interval: Duration) -> LogBudget {
        LogBudget {
            per_interval,
            interval,
            state: Mutex::new(BudgetState {
                window_start: None,
                used: 0,
                suppressed: 0,
            }),
        }
    }

    /// `Some(lines suppressed since the last allowed one)` when a line may be logged now.
    pub fn admit(&self) -> Option<u64> {
        let now = Instant::now();
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.window_start
            .is_none_or(|t| now.duration_since(t) >= self.interval)
        {
            s.window_start = Some(now);
            s.used = 0;
        }
        if s.used < self.per_interval {
            s.used += 1;
            Some(std::mem::take(&mut s.suppressed))
        } else {
            s.suppressed += 1;
            None
        }
    }
}

/// Budget of WARN lines about input refused from peers, shared by every stream of the process.
pub static REFUSED_INPUT: LogBudget = LogBudget::new(20, Duration::from_secs(10));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_or_control_text_is_cut_and_escaped() {
        let long = "x".repeat(10_000);
        let shown = truncated(&long);
        assert!(shown.len() < 200, "{shown}");
        assert!(shown.ends_with("…(10000 bytes)"), "{shown}");
        assert_eq!(truncated("plain"), "plain");
        assert_eq!(truncated("a\nfake line"), "a\\nfake line");
    }

    #[test]
    fn the_budget_allows_a_few_lines_then_counts_the_rest() {
        let budget = LogBudget::new(3, Duration::from_secs(3600));
        assert_eq!(
            (0..3).map(|_| budget.admit()).collect::<Vec<_>>(),
            [Some(0); 3]
        );
        assert_eq!((0..100).filter_map(|_| budget.admit()).count(), 0);
        let fresh = LogBudget::new(1, Duration::ZERO);
        assert_eq!(fresh.admit(), Some(0));
        assert_eq!(fresh.admit(), Some(0), "a new interval starts");
    }
}
