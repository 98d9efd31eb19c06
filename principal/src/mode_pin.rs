//! Pins each agent's mode (managed or autonomous): an agent cannot declare at login another mode
//! than the one the hub trusts it with (a managed agent claiming to be autonomous would own, and
//! could overwrite or delete, the hub's Applications in its namespace).
//!
//! Owns: where a pin comes from and which wins, the check at every login, token refresh and stream
//! open, recording the pin at an agent's first successful login, and the refusal that tells the
//! agent how an admin changes its pin. Sources, first wins:
//!
//! 1. The registration: label `argocd-agent.argoproj-labs.io/agent-mode` on the agent's Argo CD
//!    cluster Secret in the principal's namespace (the Secret labelled
//!    `argocd-agent.argoproj-labs.io/agent-name=<agent>`), e.g. set at registration with
//!    `argocd-agentctl agent create <agent> --label argocd-agent.argoproj-labs.io/agent-mode=managed`
//!    or later with `kubectl -n <ns> label secret cluster-<agent>
//!    argocd-agent.argoproj-labs.io/agent-mode=autonomous --overwrite`.
//! 2. The ConfigMap `argocd-agent-modes` in the principal's namespace, one data key per agent,
//!    which the principal fills at an agent's first successful login. An admin changes a pin with
//!    `kubectl -n <ns> patch configmap argocd-agent-modes --type merge
//!    -p '{"data":{"<agent>":"autonomous"}}'` (or removes the key to let the next login pin
//!    again). A value that is neither `managed` nor `autonomous` refuses every login (fail closed).
//!
//! Both are watched (the Secrets' metadata only: no key material is held), so a login of a pinned
//! agent costs no apiserver call; first logins arriving together share one ConfigMap write.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_kube::informer::{Informer, InformerReader};
use argocd_agent_operator::registration::AGENT_NAME_LABEL;
use argocd_agent_proto::identity::AgentName;
use argocd_agent_proto::mode::AgentMode;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use kube::ResourceExt;
use tokio::sync::{oneshot, Notify};
use tonic::Status;

/// The ConfigMap in the principal's namespace recording pins taken at first login.
pub const MODE_PINS_CONFIGMAP: &str = "argocd-agent-modes";
/// Label on an agent's cluster Secret that pins its mode (wins over the ConfigMap).
pub const AGENT_MODE_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-mode";
/// How long a login waits for the first read of the pins before it is refused (fail closed).
const SYNC_WAIT: Duration = Duration::from_secs(10);

/// Where an agent's pin was read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinSource {
    /// The [`AGENT_MODE_LABEL`] of this cluster Secret.
    Registration {
        /// The Secret's name.
        secret: String,
    },
    /// The agent's key in [`MODE_PINS_CONFIGMAP`].
    Recorded,
}

/// An agent's pinned mode, as written (an admin may have written something invalid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// The pinned value.
    pub value: String,
    /// Where it was read.
    pub source: PinSource,
}

/// Outcome of checking a requested mode against a pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PinCheck {
    /// The agent asked for its pinned mode.
    Matches,
    /// No pin yet: this login's mode becomes the pin.
    Unpinned,
    /// Refused with this message.
    Refused(String),
}

/// Checks `requested` against `agent`'s `pin` (pins live in the principal's `namespace`).
pub fn check(pin: Option<&Pin>, agent: &str, requested: AgentMode, namespace: &str) -> PinCheck {
    let Some(pin) = pin else {
        return PinCheck::Unpinned;
    };
    if pin.value == requested.as_str() {
        return PinCheck::Matches;
    }
    let how = match &pin.source {
        PinSource::Registration { secret } => format!(
            "its cluster Secret {namespace}/{secret} (label {AGENT_MODE_LABEL}); an admin changes it with \
             `kubectl -n {namespace} label secret {secret} {AGENT_MODE_LABEL}={requested} --overwrite`"
        ),
        PinSource::Recorded => format!(
            "its first login (ConfigMap {namespace}/{MODE_PINS_CONFIGMAP}); an admin changes it with \
             `kubectl -n {namespace} patch configmap {MODE_PINS_CONFIGMAP} --type merge -p '{{\"data\":{{\"{agent}\":\"{requested}\"}}}}'`"
        ),
    };
    PinCheck::Refused(format!(
        "agent {agent:?} is pinned to mode {:?} by {how}; it may not log in as {requested}",
        pin.value
    ))
}

/// First logins waiting for their pins to be written.
#[derive(Default)]
struct PendingWrites {
    pins: BTreeMap<String, String>,
    waiters: Vec<oneshot::Sender<Result<(), String>>>,
}

/// The pins of every agent, kept current from the hub.
pub struct ModePins {
    namespace: String,
    configmaps: Option<Api<ConfigMap>>,
    recorded: InformerReader<ConfigMap>,
    registrations: InformerReader<PartialObjectMeta<Secret>>,
    /// Pins this process wrote that its watch has not shown yet.
    written: Mutex<HashMap<String, String>>,
    /// Serialises first logins so two of one agent cannot pin two modes.
    first_login: tokio::sync::Mutex<()>,
    pending: Mutex<PendingWrites>,
    kick: Notify,
}

impl ModePins {
    /// Pins read from (and recorded in) `namespace` through `client`; watches start now.
    pub fn spawn(client: kube::Client, namespace: &str) -> Arc<ModePins> {
        let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
        // Metadata only: the Secrets' key material is never held here.
        let secrets: Api<PartialObjectMeta<Secret>> = Api::namespaced(client, namespace);
        let cm_config =
            watcher::Config::default().fields(&format!("metadata.name={MODE_PINS_CONFIGMAP}"));
        let cm_informer = Informer::new(
            "ConfigMap argocd-agent-modes",
            configmaps.clone(),
            cm_config,
        );
        let secret_config = watcher::Config::default().labels(AGENT_MODE_LABEL);
        let secret_informer = Informer::new("cluster Secrets' mode labels", secrets, secret_config);
        let pins = Arc::new(ModePins {
            namespace: namespace.to_string(),
            configmaps: Some(configmaps),
            recorded: cm_informer.reader(),
            registrations: secret_informer.reader(),
            written: Mutex::default(),
            first_login: tokio::sync::Mutex::new(()),
            pending: Mutex::default(),
            kick: Notify::new(),
        });
        tokio::spawn(cm_informer.run(None));
        tokio::spawn(secret_informer.run(None));
        tokio::spawn(pins.clone().write_loop());
        pins
    }

    async fn synced(&self) -> Result<(), Status> {
        let ready = async {
            // Not kube's `Store::wait_until_ready`: with several logins waiting at once it wakes
            // only the last of them, and the others would time out here.
            self.recorded.wait_listed().await;
            self.registrations.wait_listed().await;
        };
        tokio::time::timeout(SYNC_WAIT, ready).await.map_err(|_| {
            Status::unavailable(
                "agent mode pins not read from the hub yet (principal starting or apiserver unreachable): retry",
            )
        })
    }

    /// `agent`'s pin, if it has one.
    pub fn pin_of(&self, agent: &str) -> Option<Pin> {
        let registered = self.registrations.state().into_iter().find_map(|m| {
            let labels = m.labels();
            (labels.get(AGENT_NAME_LABEL).map(String::as_str) == Some(agent))
                .then(|| labels.get(AGENT_MODE_LABEL).cloned())
                .flatten()
                .map(|value| Pin {
                    value,
                    source: PinSource::Registration {
                        secret: m.name_any(),
                    },
                })
        });
        if registered.is_some() {
            return registered;
        }
        let recorded = self
            .recorded
            .get(Some(&self.namespace), MODE_PINS_CONFIGMAP)
            .and_then(|cm| cm.data.as_ref()?.get(agent).cloned());
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let value = match recorded {
            // The hub shows it now: an admin's later change or removal is what counts.
            Some(v) => {
                written.remove(agent);
                Some(v)
            }
            None => written.get(agent).cloned(),
        };
        value.map(|value| Pin {
            value,
            source: PinSource::Recorded,
        })
    }

    /// Refuses `requested` unless it is `agent`'s pinned mode; never records (stream open, token
    /// refresh).
    pub async fn verify(&self, agent: &AgentName, requested: AgentMode) -> Result<(), Status> {
        self.synced().await?;
        let pin = self.pin_of(agent.as_str());
        match check(pin.as_ref(), agent.as_str(), requested, &self.namespace) {
            PinCheck::Refused(msg) => Err(Status::permission_denied(msg)),
            PinCheck::Matches | PinCheck::Unpinned => Ok(()),
        }
    }

    /// Admits a login of `agent` as `requested`: refused unless it is the pinned mode; an agent
    /// without a pin is pinned to `requested` (written to the hub before the login succeeds).
    pub async fn admit(&self, agent: &AgentName, requested: AgentMode) -> Result<(), Status> {
        self.synced().await?;
        let name = agent.as_str();
        match check(self.pin_of(name).as_ref(), name, requested, &self.namespace) {
            PinCheck::Matches => return Ok(()),
            PinCheck::Refused(msg) => return Err(Status::permission_denied(msg)),
            PinCheck::Unpinned => {}
        }
        let _first = self.first_login.lock().await;
        match check(self.pin_of(name).as_ref(), name, requested, &self.namespace) {
            PinCheck::Matches => return Ok(()),
            PinCheck::Refused(msg) => return Err(Status::permission_denied(msg)),
            PinCheck::Unpinned => {}
        }
        self.record(name, requested).await.map_err(|e| {
            Status::unavailable(format!(
                "cannot record agent {name:?}'s mode in {}/{MODE_PINS_CONFIGMAP}: {e}",
                self.namespace
            ))
        })?;
        self.written
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), requested.as_str().to_string());
        tracing::info!(
            agent = name,
            mode = requested.as_str(),
            "agent mode pinned at its first login"
        );
        Ok(())
    }

    async fn record(&self, agent: &str, mode: AgentMode) -> Result<(), String> {
        let (tx, rx) = oneshot::channel();
        {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            pending
                .pins
                .insert(agent.to_string(), mode.as_str().to_string());
            pending.waiters.push(tx);
        }
        self.kick.notify_one();
        rx.await
            .unwrap_or_else(|_| Err("the pin writer stopped".into()))
    }

    /// Writes pending pins in batches: first logins arriving together share one write.
    async fn write_loop(self: Arc<Self>) {
        let Some(api) = self.configmaps.clone() else {
            return;
        };
        loop {
            self.kick.notified().await;
            let batch =
                std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
            if batch.waiters.is_empty() {
                continue;
            }
            let result = write_pins(&api, &batch.pins).await;
            for waiter in batch.waiters {
                let _ = waiter.send(result.clone());
            }
        }
    }
}

/// Adds `pins` to the ConfigMap, creating it when absent.
async fn write_pins(api: &Api<ConfigMap>, pins: &BTreeMap<String, String>) -> Result<(), String> {
    let patch = serde_json::json!({ "data": pins });
    for _ in 0..3 {
        match api
            .patch(
                MODE_PINS_CONFIGMAP,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.to_string()),
        }
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(MODE_PINS_CONFIGMAP.into()),
                ..ObjectMeta::default()
            },
            data: Some(pins.clone()),
            ..ConfigMap::default()
        };
        match api.create(&PostParams::default(), &cm).await {
            Ok(_) => return Ok(()),
            // Created meanwhile (another replica): patch it.
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Err("the ConfigMap kept appearing and disappearing".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(v: &str) -> Pin {
        Pin {
            value: v.into(),
            source: PinSource::Recorded,
        }
    }

    #[test]
    fn no_pin_lets_the_first_login_pin() {
        assert_eq!(
            check(None, "a", AgentMode::Autonomous, "argocd"),
            PinCheck::Unpinned
        );
    }

    #[test]
    fn the_pinned_mode_is_admitted_and_the_other_refused_with_the_admin_command() {
        let pin = recorded("managed");
        assert_eq!(
            check(Some(&pin), "a", AgentMode::Managed, "argocd"),
            PinCheck::Matches
        );
        let PinCheck::Refused(msg) = check(Some(&pin), "a", AgentMode::Autonomous, "argocd") else {
            panic!("autonomous admitted")
        };
        assert!(msg.contains("pinned to mode \"managed\""), "{msg}");
        assert!(
            msg.contains(
                r#"kubectl -n argocd patch configmap argocd-agent-modes --type merge -p '{"data":{"a":"autonomous"}}'"#
            ),
            "{msg}"
        );
    }

    #[test]
    fn a_registration_pin_names_its_secret_and_label() {
        let pin = Pin {
            value: "autonomous".into(),
            source: PinSource::Registration {
                secret: "cluster-a".into(),
            },
        };
        let PinCheck::Refused(msg) = check(Some(&pin), "a", AgentMode::Managed, "argocd") else {
            panic!("managed admitted")
        };
        assert!(
            msg.contains("kubectl -n argocd label secret cluster-a argocd-agent.argoproj-labs.io/agent-mode=managed --overwrite"),
            "{msg}"
        );
    }

    #[test]
    fn an_invalid_pin_refuses_every_mode() {
        let pin = recorded("Managed ");
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            assert!(matches!(
                check(Some(&pin), "a", mode, "argocd"),
                PinCheck::Refused(_)
            ));
        }
    }

    /// A watch's first list of `objects`, as the informers' seam takes it.
    fn listed<K>(
        objects: Vec<K>,
    ) -> impl futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
    where
        K: Send,
    {
        let events = std::iter::once(watcher::Event::Init)
            .chain(objects.into_iter().map(watcher::Event::InitApply))
            .chain(std::iter::once(watcher::Event::InitDone));
        futures::stream::iter(events.map(Ok).collect::<Vec<_>>())
    }

    /// Pins whose watches have listed nothing yet, with the informers that feed them.
    fn unlisted_pins() -> (
        ModePins,
        Informer<ConfigMap>,
        Informer<PartialObjectMeta<Secret>>,
    ) {
        let client = crate::hub::testing::offline_client();
        let cms = Informer::new(
            "test ConfigMap",
            Api::<ConfigMap>::namespaced(client.clone(), "argocd"),
            watcher::Config::default(),
        );
        let secrets = Informer::new(
            "test Secrets",
            Api::<PartialObjectMeta<Secret>>::namespaced(client, "argocd"),
            watcher::Config::default(),
        );
        let pins = ModePins {
            namespace: "argocd".into(),
            configmaps: None,
            recorded: cms.reader(),
            registrations: secrets.reader(),
            written: Mutex::default(),
            first_login: tokio::sync::Mutex::new(()),
            pending: Mutex::default(),
            kick: Notify::new(),
        };
        (pins, cms, secrets)
    }

    /// Pins whose watches listed `cm` and `secrets`, fed through the informers' seam.
    async fn pins_with(cm: Option<ConfigMap>, secrets: Vec<PartialObjectMeta<Secret>>) -> ModePins {
        let (pins, cm_informer, secret_informer) = unlisted_pins();
        cm_informer.consume(listed(cm.into_iter().collect())).await;
        secret_informer.consume(listed(secrets)).await;
        pins
    }

    #[tokio::test]
    async fn logins_waiting_together_for_the_first_list_all_go_on_once_it_arrives() {
        // kube's Store::wait_until_ready woke only the last of several waiters: the others timed
        // out as "unavailable" although the list had arrived.
        let (pins, cms, secrets) = unlisted_pins();
        let pins = Arc::new(pins);
        let waiters: Vec<_> = (0..8)
            .map(|_| {
                let pins = pins.clone();
                tokio::spawn(async move { pins.synced().await })
            })
            .collect();
        // Every waiter is polled (and parked) before the lists arrive.
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        cms.consume(listed(vec![])).await;
        secrets.consume(listed(vec![])).await;
        for waiter in waiters {
            tokio::time::timeout(Duration::from_secs(2), waiter)
                .await
                .expect("a login waiting for the first list was never woken")
                .unwrap()
                .unwrap();
        }
    }

    fn secret_meta(agent: &str, mode: &str) -> PartialObjectMeta<Secret> {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "PartialObjectMetadata",
            "metadata": {
                "name": format!("cluster-{agent}"),
                "namespace": "argocd",
                "labels": {AGENT_NAME_LABEL: agent, AGENT_MODE_LABEL: mode},
            },
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn the_registration_label_wins_over_the_recorded_pin() {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": MODE_PINS_CONFIGMAP, "namespace": "argocd"},
            "data": {"a": "autonomous", "b": "managed"}
        }))
        .unwrap();
        let pins = pins_with(Some(cm), vec![secret_meta("a", "managed")]).await;
        let a = AgentName::new("a").unwrap();
        let b = AgentName::new("b").unwrap();
        pins.admit(&a, AgentMode::Managed).await.unwrap();
        let err = pins.admit(&a, AgentMode::Autonomous).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        pins.verify(&b, AgentMode::Managed).await.unwrap();
        assert!(pins.verify(&b, AgentMode::Autonomous).await.is_err());
    }

    #[tokio::test]
    async fn a_pin_written_here_counts_until_the_watch_shows_the_hubs_value() {
        let pins = pins_with(None, vec![]).await;
        pins.written
            .lock()
            .unwrap()
            .insert("c".into(), "managed".into());
        assert_eq!(pins.pin_of("c"), Some(recorded("managed")));
        assert_eq!(pins.pin_of("d"), None);
    }
}
