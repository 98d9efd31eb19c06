//! Liveness and readiness of a process, as served on `/healthz` and `/readyz`.
//!
//! Owns: [`HealthState`], a cheap-clone handle any component may flip. Liveness says "the process
//! is not wedged, do not restart it"; readiness says "this instance can do its job right now" (the
//! principal: accepting agents; the agent: connected to its principal) and carries a reason when
//! it cannot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Shared liveness/readiness flags. Starts live and not ready (reason "starting").
#[derive(Debug, Clone)]
pub struct HealthState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    live: AtomicBool,
    ready: AtomicBool,
    not_ready_reason: Mutex<String>,
    /// High-availability role shown in the `X-HA-State` header (None: not replicated).
    role: Mutex<Option<String>>,
}

impl Default for HealthState {
    fn default() -> Self {
        Self::new()
    }
}

impl HealthState {
    /// A new state: live, not ready because it is starting.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                live: AtomicBool::new(true),
                ready: AtomicBool::new(false),
                not_ready_reason: Mutex::new("starting".to_string()),
                role: Mutex::new(None),
            }),
        }
    }

    /// Marks the process live (or not: `/healthz` then answers 503).
    pub fn set_live(&self, live: bool) {
        self.inner.live.store(live, Ordering::SeqCst);
    }

    /// Marks the process ready, or not ready with `reason` (served as the `/readyz` body).
    /// The reason is ignored when `ready` is true.
    pub fn set_ready(&self, ready: bool, reason: impl Into<String>) {
        if !ready {
            *self.lock_reason() = reason.into();
        }
        self.inner.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is live.
    pub fn is_live(&self) -> bool {
        self.inner.live.load(Ordering::SeqCst)
    }

    /// `Ok(())` when ready, otherwise the reason it is not.
    pub fn readiness(&self) -> Result<(), String> {
        if self.inner.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(self.lock_reason().clone())
        }
    }

    /// Sets the high-availability role (e.g. `active`, `standby`) served in the `X-HA-State`
    /// header of `/healthz` and `/readyz`.
    pub fn set_role(&self, role: impl Into<String>) {
        *self.inner.role.lock().unwrap_or_else(|p| p.into_inner()) = Some(role.into());
    }

    /// The high-availability role, if this process is one of several replicas.
    pub fn role(&self) -> Option<String> {
        self.inner
            .role
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn lock_reason(&self) -> std::sync::MutexGuard<'_, String> {
        // A panic while holding this lock cannot leave a String half-written; keep serving.
        self.inner
            .not_ready_reason
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_live_and_not_ready() {
        let health = HealthState::new();
        assert!(health.is_live());
        assert_eq!(health.readiness(), Err("starting".to_string()));
    }

    #[test]
    fn clones_share_state() {
        let health = HealthState::new();
        let other = health.clone();
        other.set_ready(true, "");
        assert_eq!(health.readiness(), Ok(()));
        other.set_ready(false, "principal unreachable");
        assert_eq!(health.readiness(), Err("principal unreachable".to_string()));
        other.set_live(false);
        assert!(!health.is_live());
    }
}
