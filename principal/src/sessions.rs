//! Per-agent sessions: the state the principal keeps for each agent across its connections — the
//! agent's mode, its [`Outbox`] of undelivered events, and whether the resync after this
//! principal's start was done (upstream's per-agent `resyncStatus`, lost on restart by design) —
//! and which stream is the live one (a new stream from the same agent supersedes the old one).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use argocd_agent_proto::identity::AgentName;
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::sync::{Outbox, OutboxConfig};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

/// One agent's session.
#[derive(Debug)]
pub struct AgentSession {
    /// The agent.
    pub name: AgentName,
    /// Mode it authenticated with most recently.
    mode: RwLock<AgentMode>,
    /// Events waiting for delivery or ACK; kept while the agent is away.
    pub outbox: Outbox,
    /// Generation of the live stream; bumping it ends older streams.
    generation: watch::Sender<u64>,
    /// Set once the resync after this principal's start was queued for the agent.
    resynced_since_start: AtomicBool,
}

impl AgentSession {
    /// The agent's mode.
    pub fn mode(&self) -> AgentMode {
        *self.mode.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the caller's stream the live one; returns its generation.
    pub fn take_over(&self, mode: AgentMode) -> u64 {
        *self.mode.write().unwrap_or_else(|e| e.into_inner()) = mode;
        let mut generation = 0;
        self.generation.send_modify(|g| {
            *g += 1;
            generation = *g;
        });
        generation
    }

    /// True exactly once per principal process: on the first call, meaning the agent has not
    /// been resynced since this principal started (its undelivered events may have been lost).
    pub fn begin_first_resync(&self) -> bool {
        !self.resynced_since_start.swap(true, Ordering::SeqCst)
    }

    /// Whether the stream of `generation` is still the live one.
    pub fn is_live(&self, generation: u64) -> bool {
        *self.generation.borrow() == generation
    }

    /// Resolves when a newer stream has taken over from `generation`.
    pub async fn superseded(&self, generation: u64) {
        let mut rx = self.generation.subscribe();
        let _ = rx.wait_for(|g| *g != generation).await;
    }
}

/// All sessions known since the principal started.
#[derive(Debug)]
pub struct AgentRegistry {
    sessions: RwLock<HashMap<String, Arc<AgentSession>>>,
    outbox: OutboxConfig,
    depth: QueueDepth,
}

/// Per-agent queue-depth gauges (`argocd_principal_outbox_resources{agent_name}`): each agent's
/// outbox sets its own on every change.
pub type QueueDepth = Family<Vec<(String, String)>, Gauge>;

impl AgentRegistry {
    /// An empty registry whose outboxes use `outbox` and report their size into `depth`.
    pub fn new(outbox: OutboxConfig, depth: QueueDepth) -> AgentRegistry {
        AgentRegistry {
            sessions: RwLock::new(HashMap::new()),
            outbox,
            depth,
        }
    }

    /// The session of `name`, created on first use.
    pub fn get_or_create(&self, name: &AgentName, mode: AgentMode) -> Arc<AgentSession> {
        if let Some(s) = self.get(name.as_str()) {
            return s;
        }
        let mut map = self.sessions.write().unwrap_or_else(|e| e.into_inner());
        map.entry(name.as_str().to_string())
            .or_insert_with(|| {
                Arc::new(AgentSession {
                    name: name.clone(),
                    mode: RwLock::new(mode),
                    outbox: Outbox::new(OutboxConfig {
                        size: self
                            .depth
                            .get_or_create(&vec![("agent_name".into(), name.as_str().into())])
                            .clone(),
                        ..self.outbox.clone()
                    }),
                    generation: watch::channel(0).0,
                    resynced_since_start: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// The session of `name`, if the agent ever connected.
    pub fn get(&self, name: &str) -> Option<Arc<AgentSession>> {
        self.sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every session.
    pub fn all(&self) -> Vec<Arc<AgentSession>> {
        self.sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_new_stream_supersedes_the_old_one_and_keeps_the_outbox() {
        let reg = AgentRegistry::new(OutboxConfig::default(), QueueDepth::default());
        let name = AgentName::new("a1").unwrap();
        let s = reg.get_or_create(&name, AgentMode::Managed);
        let g1 = s.take_over(AgentMode::Managed);
        let s2 = reg.get_or_create(&name, AgentMode::Managed);
        assert!(Arc::ptr_eq(&s, &s2));
        let waiter = {
            let s = s.clone();
            tokio::spawn(async move { s.superseded(g1).await })
        };
        s2.take_over(AgentMode::Managed);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
    }

    #[test]
    fn the_resync_after_principal_start_happens_once_per_agent() {
        let reg = AgentRegistry::new(OutboxConfig::default(), QueueDepth::default());
        let a = reg.get_or_create(&AgentName::new("a1").unwrap(), AgentMode::Managed);
        let b = reg.get_or_create(&AgentName::new("b1").unwrap(), AgentMode::Managed);
        assert!(a.begin_first_resync());
        assert!(
            !a.begin_first_resync(),
            "a reconnect needs no restart resync"
        );
        assert!(b.begin_first_resync(), "each agent gets its own");
    }
}
