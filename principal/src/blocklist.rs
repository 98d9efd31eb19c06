//! The TLS certificate blocklist (upstream's `internal/blocklist`): the ConfigMap
//! `argocd-agent-tls-blocklist` in the principal's namespace lists refused client certificates,
//! one data key per certificate, the key being the uppercase hex SHA-256 of the certificate's DER
//! (`argocd_agent_proto::identity::cert_fingerprint`; values are free text, e.g. a reason).
//!
//! Owns: watching that ConfigMap (a missing ConfigMap is an empty list), the current set of
//! fingerprints, and telling holders of a connection when its certificate becomes listed
//! ([`Blocklist::listed`]). The listeners ([`crate::listener`], the resource proxy) refuse listed
//! certificates after the handshake and close live connections whose certificate gets listed.
//! Because the list lives in the hub's apiserver it survives principal restarts; connections wait
//! for the first complete read of it (fail closed).

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher::{self, watcher, Event as WatchEvent};
use kube::runtime::WatchStreamExt;
use kube::Api;
use tokio::sync::watch;

/// Name of the blocklist ConfigMap in the principal's namespace.
pub const BLOCKLIST_CONFIGMAP: &str = "argocd-agent-tls-blocklist";

/// The fingerprints a ConfigMap's data keys list, normalised to uppercase; keys that are not a
/// 64-digit hex SHA-256 are ignored with a warning (they could never match a certificate).
pub fn fingerprints_of(cm: &ConfigMap) -> BTreeSet<String> {
    let keys = cm
        .data
        .iter()
        .flat_map(|d| d.keys())
        .chain(cm.binary_data.iter().flat_map(|d| d.keys()));
    let mut out = BTreeSet::new();
    for key in keys {
        match normalize_fingerprint(key) {
            Some(fp) => {
                out.insert(fp);
            }
            None => tracing::warn!(
                key = %key,
                "{BLOCKLIST_CONFIGMAP}: ignoring a key that is not a SHA-256 certificate fingerprint (64 hex digits)"
            ),
        }
    }
    out
}

/// `fp` as an uppercase 64-digit hex fingerprint (colons allowed and dropped), if it is one.
pub fn normalize_fingerprint(fp: &str) -> Option<String> {
    let hex: String = fp.chars().filter(|c| *c != ':').collect();
    (hex.len() == 64 && hex.chars().all(|c| c.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_uppercase())
}

/// The current blocklist; cheap to share.
#[derive(Debug)]
pub struct Blocklist {
    /// Listed fingerprints; `None` until the ConfigMap was read once.
    listed: watch::Sender<Option<Arc<BTreeSet<String>>>>,
}

impl Default for Blocklist {
    fn default() -> Self {
        Blocklist {
            listed: watch::channel(None).0,
        }
    }
}

impl Blocklist {
    /// An empty blocklist that is already complete (no ConfigMap is watched).
    pub fn empty() -> Arc<Blocklist> {
        let b = Blocklist::default();
        b.replace(BTreeSet::new());
        Arc::new(b)
    }

    /// Whether `fingerprint` is listed (false until the first read).
    pub fn contains(&self, fingerprint: &str) -> bool {
        self.listed
            .borrow()
            .as_ref()
            .is_some_and(|s| s.contains(fingerprint))
    }

    /// Whether the ConfigMap has been read at least once.
    pub fn is_synced(&self) -> bool {
        self.listed.borrow().is_some()
    }

    /// Resolves once the ConfigMap has been read at least once.
    pub async fn synced(&self) {
        let mut rx = self.listed.subscribe();
        let _ = rx.wait_for(Option::is_some).await;
    }

    /// Resolves when `fingerprint` is (or becomes) listed; never otherwise.
    pub async fn listed(self: Arc<Self>, fingerprint: String) {
        let mut rx = self.listed.subscribe();
        if rx
            .wait_for(|s| s.as_ref().is_some_and(|s| s.contains(&fingerprint)))
            .await
            .is_err()
        {
            std::future::pending::<()>().await;
        }
    }

    /// Replaces the list, logging each fingerprint added or removed once.
    pub fn replace(&self, next: BTreeSet<String>) {
        let previous = self.listed.borrow().clone();
        let empty = BTreeSet::new();
        let before = previous.as_deref().unwrap_or(&empty);
        for fp in next.difference(before) {
            tracing::warn!(fingerprint = %fp, "certificate blocklisted: its connections are closed and new ones refused");
        }
        for fp in before.difference(&next) {
            tracing::info!(fingerprint = %fp, "certificate removed from the blocklist");
        }
        if previous.is_none() {
            tracing::info!(
                listed = next.len(),
                "{BLOCKLIST_CONFIGMAP} read; blocklist in force"
            );
        }
        self.listed.send_replace(Some(Arc::new(next)));
    }

    /// Watches `argocd-agent-tls-blocklist` in `namespace` and keeps the list current until the
    /// process ends.
    pub fn spawn_watch(
        self: &Arc<Self>,
        client: kube::Client,
        namespace: &str,
    ) -> tokio::task::JoinHandle<()> {
        let api: Api<ConfigMap> = Api::namespaced(client, namespace);
        let config =
            watcher::Config::default().fields(&format!("metadata.name={BLOCKLIST_CONFIGMAP}"));
        let list = self.clone();
        let namespace = namespace.to_string();
        tokio::spawn(async move {
            let mut events = watcher(api, config).default_backoff().boxed();
            let mut initial: BTreeSet<String> = BTreeSet::new();
            let mut failing = false;
            while let Some(event) = events.next().await {
                match event {
                    Ok(ev) => {
                        if failing {
                            failing = false;
                            tracing::info!("watching {namespace}/{BLOCKLIST_CONFIGMAP} again");
                        }
                        match ev {
                            WatchEvent::Init => initial.clear(),
                            WatchEvent::InitApply(cm) => initial = fingerprints_of(&cm),
                            WatchEvent::InitDone => list.replace(std::mem::take(&mut initial)),
                            WatchEvent::Apply(cm) => list.replace(fingerprints_of(&cm)),
                            WatchEvent::Delete(_) => list.replace(BTreeSet::new()),
                        }
                    }
                    Err(e) => {
                        if !failing {
                            failing = true;
                            tracing::error!(error = %e, "cannot watch {namespace}/{BLOCKLIST_CONFIGMAP}; agents wait until it is readable (retrying)");
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const FP: &str = "ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01ab01";

    #[test]
    fn keys_are_normalised_and_junk_ignored() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": BLOCKLIST_CONFIGMAP},
            "data": {FP: "stolen laptop", "not-a-fingerprint": ""}
        }))
        .unwrap();
        let set = fingerprints_of(&cm);
        assert_eq!(set.len(), 1);
        assert!(set.contains(&FP.to_ascii_uppercase()));
        assert_eq!(normalize_fingerprint("AB:01"), None);
    }

    #[tokio::test]
    async fn holders_are_told_when_their_certificate_gets_listed() {
        let list = Arc::new(Blocklist::default());
        assert!(!list.is_synced());
        let fp = FP.to_ascii_uppercase();
        let waiter = tokio::spawn(list.clone().listed(fp.clone()));
        list.replace(BTreeSet::new());
        assert!(list.is_synced());
        assert!(!waiter.is_finished());
        list.replace(BTreeSet::from([fp.clone()]));
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert!(list.contains(&fp));
        list.replace(BTreeSet::new());
        assert!(!list.contains(&fp));
    }
}
