//! Simulated agents for load benchmarks: many managed-mode agent sessions in one process, each a
//! real protocol client of the principal.
//!
//! Every simulated agent has its own client certificate (CN `<prefix>-NNNN`, signed in-process by
//! the test PKI's CA, as `argocd-agentctl pki issue agent` would), dials the principal over mutual
//! TLS (ALPN h2), calls `Version`, `Authenticate` (method mtls, mode managed, with the version
//! string that principal accepts: ours, or an upstream principal's own release, as the real agent
//! picks it) and opens `Subscribe` with the access token, so the same agents serve our principal
//! and upstream argocd-agent's; the stream then runs on the shared delivery engine
//! (`proto::sync::{Outbox, Lanes, run_stream}`), exactly as the real agent's does. Instead of a
//! spoke apiserver each agent keeps an in-memory object set: it applies `create`/`spec-update`/
//! `delete` of Applications (and AppProjects, repositories), ACKs every event, runs the checksum
//! resync as the real agent does (after start and on the principal's `request-resource-resync`:
//! one `request-update` per object and the checksum of its key set; asks for every announced key
//! it lacks), and (optionally)
//! reports a `status-update` for every Application it receives. Lost streams are reopened with
//! jittered backoff. What the owner of a [`SimFleet`] observes is in [`FleetCounters`] and the
//! per-agent state queries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_proto::event::{
    set_checksum, spec_checksum, Event, EventType, ResourceKey, Target, AGENT_SOURCE,
    SOURCE_UID_ANNOTATION,
};
use argocd_agent_proto::payload::{RequestUpdate, SyncedResource};
use argocd_agent_proto::pb::authapi::authentication_client::AuthenticationClient;
use argocd_agent_proto::pb::authapi::AuthRequest;
use argocd_agent_proto::pb::eventstreamapi::event_stream_client::EventStreamClient;
use argocd_agent_proto::pb::eventstreamapi::Event as WireEvent;
use argocd_agent_proto::pb::versionapi::version_client::VersionClient;
use argocd_agent_proto::pb::versionapi::VersionRequest;
use argocd_agent_proto::sync::resync::{needs_object, request_update_key, RESYNC_REQUEST_KEY};
use argocd_agent_proto::sync::{
    keyed_request, run_stream, EventHandler, HandleError, Lanes, Outbox, OutboxConfig,
};
use argocd_agent_proto::version::auth_version_for;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use crate::gateway::Pki;

/// Time allowed for each step of opening a session (TCP+TLS, Version, Authenticate, Subscribe).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// A simulated agent's name and client certificate.
#[derive(Clone)]
pub struct SimIdentity {
    /// Agent name (certificate CN, hub namespace).
    pub name: String,
    cert_pem: String,
    key_pem: String,
}

/// The name of simulated agent `index`: `sim-0042`.
pub fn sim_name(index: usize) -> String {
    format!("sim-{index:04}")
}

/// Issues client certificates `sim-NNNN` for every index in `range`, signed by `pki`'s CA (ECDSA
/// P-256, client-auth usage, valid for a day).
pub fn issue_identities(
    pki: &Pki,
    range: std::ops::Range<usize>,
) -> anyhow::Result<Vec<SimIdentity>> {
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.dir.join("ca.key"))?)?;
    let issuer = rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.ca())?, ca_key)?;
    let now = time::OffsetDateTime::now_utc();
    range
        .map(|i| {
            let name = sim_name(i);
            let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name.as_str());
            params.not_before = now - time::Duration::minutes(5);
            params.not_after = now + time::Duration::days(1);
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            let key = rcgen::KeyPair::generate()?;
            let cert = params.signed_by(&key, &issuer)?;
            Ok(SimIdentity {
                name,
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
            })
        })
        .collect()
}

/// Fleet-wide counters (monotonic unless said otherwise).
#[derive(Debug, Default)]
pub struct FleetCounters {
    /// Events received from the principal and handled (ACKs, pings excluded).
    pub events_received: AtomicU64,
    /// ACKs received from the principal (for status updates and resync answers).
    pub acks_received: AtomicU64,
    /// `status-update` events queued for the principal.
    pub status_queued: AtomicU64,
    /// `request-update` events queued in answer to resync requests.
    pub resync_answers: AtomicU64,
    /// Authenticate or Subscribe refused with Unauthenticated / PermissionDenied.
    pub auth_failures: AtomicU64,
    /// Attempts that failed otherwise (connection refused, timeouts, transport errors).
    pub connect_failures: AtomicU64,
    /// Streams opened.
    pub streams_opened: AtomicU64,
    /// Streams that ended (for any reason other than the fleet stopping).
    pub streams_lost: AtomicU64,
}

impl FleetCounters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Current value of `c`.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// How the simulated agents behave.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Report a `status-update` (Synced/Healthy at the received revision) for every Application
    /// the principal sends.
    pub report_status: bool,
    /// At most this many agents open a session at the same time (the rest wait their turn).
    pub connect_concurrency: usize,
    /// First reconnect delay after a lost stream or failed attempt (doubles up to `reconnect_max`,
    /// with up to 100% random jitter).
    pub reconnect_min: Duration,
    /// Upper bound of the reconnect delay.
    pub reconnect_max: Duration,
    /// How long `Subscribe` may take to answer. A Go agent's stream opens without waiting for
    /// the principal's response headers, and upstream's principal sends none until its
    /// one-at-a-time connect handler has run for the agent (100 ms apart): under hundreds of
    /// agents connecting at once, a short limit here would measure the simulated agents' give-ups
    /// instead of the principal.
    pub subscribe_timeout: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            report_status: true,
            connect_concurrency: 1024,
            reconnect_min: Duration::from_millis(200),
            reconnect_max: Duration::from_secs(2),
            subscribe_timeout: STEP_TIMEOUT,
        }
    }
}

/// One simulated agent: its identity, TLS settings, outbox and in-memory objects.
struct SimAgent {
    name: String,
    tls: Arc<rustls::ClientConfig>,
    outbox: Outbox,
    counters: Arc<FleetCounters>,
    report_status: bool,
    /// Applications by name (the payload the principal sent).
    apps: Mutex<HashMap<String, Value>>,
    /// Other objects (AppProjects, repositories) by `<target>/<name>`.
    others: Mutex<HashMap<String, Value>>,
    /// Number of the current (or last) stream.
    stream_no: AtomicU64,
    /// A stream is open.
    live: AtomicBool,
    /// Stream number during which the last resync request was answered.
    resync_answered_in: AtomicU64,
    /// Spoke-side resourceVersion counter of status reports.
    status_version: AtomicU64,
    /// See [`SimOptions::subscribe_timeout`].
    subscribe_timeout: Duration,
}

fn name_of(v: &Value) -> Result<String, HandleError> {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| HandleError::Rejected("object has no metadata.name".into()))
}

impl SimAgent {
    fn push(&self, ev: Event) -> Result<(), HandleError> {
        self.outbox
            .push(ev)
            .map_err(|e| HandleError::Retryable(e.to_string()))
    }

    /// The spoke copy of hub Application `app` as Argo CD would have left it after syncing.
    fn status_report(&self, app: &Value) -> Result<Event, HandleError> {
        let hub_uid = app
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let revision = app
            .pointer("/spec/source/targetRevision")
            .cloned()
            .unwrap_or(Value::Null);
        let rv = self.status_version.fetch_add(1, Ordering::Relaxed) + 1;
        let spoke = json!({
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Application",
            "metadata": {
                "name": name_of(app)?,
                "namespace": "argocd",
                "uid": format!("spoke-{hub_uid}"),
                "resourceVersion": rv.to_string(),
                "annotations": {SOURCE_UID_ANNOTATION: hub_uid},
            },
            "spec": app.get("spec").cloned().unwrap_or(Value::Null),
            "status": {
                "sync": {"status": "Synced", "revision": revision},
                "health": {"status": "Healthy"},
            },
        });
        Event::for_object(
            EventType::StatusUpdate,
            Target::Application,
            AGENT_SOURCE,
            &spoke,
        )
        .map_err(|e| HandleError::Rejected(e.to_string()))
    }

    fn apply_application(&self, ev: &Event) -> Result<(), HandleError> {
        let app: Value = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let name = name_of(&app)?;
        if ev.event_type == EventType::Delete
            || (ev.event_type == EventType::SpecUpdate
                && app.pointer("/metadata/deletionTimestamp").is_some())
        {
            self.apps.lock().expect("apps lock").remove(&name);
            return Ok(());
        }
        if self.report_status && ev.event_type != EventType::TerminateOperation {
            let report = self.status_report(&app)?;
            self.push(report)?;
            FleetCounters::add(&self.counters.status_queued, 1);
        }
        self.apps.lock().expect("apps lock").insert(name, app);
        Ok(())
    }

    fn apply_other(&self, ev: &Event) -> Result<(), HandleError> {
        let obj: Value = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        let key = format!("{}/{}", ev.target.as_str(), name_of(&obj)?);
        let mut others = self.others.lock().expect("others lock");
        if ev.event_type == EventType::Delete {
            others.remove(&key);
        } else {
            others.insert(key, obj);
        }
        Ok(())
    }

    /// The resync answer the real agent gives (after start and on `request-resource-resync`):
    /// one `request-update` per Application held, carrying its spec checksum, then the checksum
    /// of the held keys (`request-synced-resource-list`).
    fn answer_resync(&self) -> Result<(), HandleError> {
        let apps: Vec<Value> = self
            .apps
            .lock()
            .expect("apps lock")
            .values()
            .cloned()
            .collect();
        let mut keys = Vec::with_capacity(apps.len());
        for app in &apps {
            let req = RequestUpdate {
                name: name_of(app)?,
                namespace: "argocd".into(),
                uid: app
                    .pointer("/metadata/uid")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
                kind: "Application".into(),
                checksum: spec_checksum(app, Some("Application"))
                    .map_err(|e| HandleError::Rejected(e.to_string()))?,
            };
            keys.push(ResourceKey::new("Application", &req.name, "", &req.uid));
            let ev = Event::request_update(AGENT_SOURCE, &req)
                .map_err(|e| HandleError::Rejected(e.to_string()))?;
            self.push(keyed_request(
                ev,
                request_update_key("Application", &req.name),
            ))?;
        }
        let ev = Event::request_synced_resource_list(AGENT_SOURCE, set_checksum(&keys))
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.push(keyed_request(ev, RESYNC_REQUEST_KEY))?;
        FleetCounters::add(&self.counters.resync_answers, apps.len() as u64 + 1);
        self.resync_answered_in
            .store(self.stream_no.load(Ordering::SeqCst), Ordering::SeqCst);
        Ok(())
    }

    /// `response-synced-resource`: the principal has this key; ask for the object (empty
    /// checksum) unless it is held already.
    fn answer_synced_resource(&self, ev: &Event) -> Result<(), HandleError> {
        let key: SyncedResource = ev
            .data_as()
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        if key.kind != "Application" {
            return Ok(());
        }
        let held = self
            .apps
            .lock()
            .expect("apps lock")
            .get(&key.name)
            .and_then(|a| a.pointer("/metadata/uid").and_then(Value::as_str))
            .map(str::to_string);
        if !needs_object(held.as_deref(), &key.uid) {
            return Ok(());
        }
        let req = RequestUpdate {
            name: key.name.clone(),
            namespace: "argocd".into(),
            uid: key.uid.clone(),
            kind: "Application".into(),
            checksum: Vec::new(),
        };
        let ev = Event::request_update(AGENT_SOURCE, &req)
            .map_err(|e| HandleError::Rejected(e.to_string()))?;
        self.push(keyed_request(
            ev,
            request_update_key("Application", &key.name),
        ))
    }

    /// Subscribed on a stream numbered above `after`, a resync answered since then (or, for
    /// `after` = 0, the one after start), and every answer and status report ACKed.
    fn is_resynced(&self, after: u64) -> bool {
        let answered = self.resync_answered_in.load(Ordering::SeqCst);
        self.live.load(Ordering::SeqCst)
            && self.stream_no.load(Ordering::SeqCst) > after
            && answered != u64::MAX
            && (after == 0 || answered > after)
            && self.outbox.resources() == 0
    }
}

impl EventHandler for SimAgent {
    async fn handle(&self, ev: Event) -> Result<(), HandleError> {
        let counted = !matches!(
            ev.event_type,
            EventType::Ping | EventType::Pong | EventType::Processed
        );
        if counted {
            FleetCounters::add(&self.counters.events_received, 1);
        }
        match (&ev.event_type, &ev.target) {
            (EventType::RequestResourceResync, _) => self.answer_resync(),
            (EventType::ResponseSyncedResource, _) => self.answer_synced_resource(&ev),
            (
                EventType::Create
                | EventType::SpecUpdate
                | EventType::SetOperation
                | EventType::TerminateOperation
                | EventType::Delete,
                Target::Application,
            ) => self.apply_application(&ev),
            (EventType::Create | EventType::SpecUpdate | EventType::Delete, _) => {
                self.apply_other(&ev)
            }
            _ => Ok(()),
        }
    }
}

/// Why opening a session failed.
enum OpenFailure {
    /// The principal refused the agent's credentials.
    Auth(String),
    /// Anything else (the principal is down, timeouts, transport errors).
    Transport(String),
}

fn classify(status: tonic::Status) -> OpenFailure {
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => {
            OpenFailure::Auth(status.message().to_string())
        }
        _ => OpenFailure::Transport(format!("{:?}: {}", status.code(), status.message())),
    }
}

async fn step<T>(
    what: &str,
    fut: impl std::future::Future<Output = Result<T, OpenFailure>>,
) -> Result<T, OpenFailure> {
    step_within(what, STEP_TIMEOUT, fut).await
}

async fn step_within<T>(
    what: &str,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, OpenFailure>>,
) -> Result<T, OpenFailure> {
    tokio::time::timeout(limit, fut)
        .await
        .map_err(|_| OpenFailure::Transport(format!("{what}: no answer within {limit:?}")))?
}

/// Dials `address` with the agent's TLS settings (ALPN h2, server name localhost).
async fn dial(
    address: &str,
    tls: Arc<rustls::ClientConfig>,
) -> Result<tonic::transport::Channel, OpenFailure> {
    crate::gateway::grpc_channel(address, tls)
        .await
        .map_err(|e| OpenFailure::Transport(format!("{e:#}")))
}

/// Version → Authenticate → Subscribe on a fresh connection.
async fn open_session(
    address: &str,
    agent: &SimAgent,
    out_rx: mpsc::Receiver<WireEvent>,
) -> Result<tonic::Streaming<WireEvent>, OpenFailure> {
    let channel = step("connect", dial(address, agent.tls.clone())).await?;
    // Upstream principals accept only their own release string, which Version tells (as the
    // real agent does it).
    let principal_version = step("Version", async {
        VersionClient::new(channel.clone())
            .version(VersionRequest {})
            .await
            .map_err(classify)
    })
    .await?
    .into_inner()
    .version;
    let auth = step("Authenticate", async {
        AuthenticationClient::new(channel.clone())
            .authenticate(AuthRequest {
                method: "mtls".into(),
                credentials: Default::default(),
                mode: "managed".into(),
                version: auth_version_for(Some(&principal_version)),
                agent_namespace: "argocd".into(),
            })
            .await
            .map_err(classify)
    })
    .await?
    .into_inner();
    let mut request = tonic::Request::new(ReceiverStream::new(out_rx));
    let token = auth
        .access_token
        .parse()
        .map_err(|_| OpenFailure::Auth("the access token is not valid metadata".into()))?;
    request.metadata_mut().insert("authorization", token);
    step_within("Subscribe", agent.subscribe_timeout, async {
        EventStreamClient::new(channel)
            .subscribe(request)
            .await
            .map_err(classify)
    })
    .await
    .map(tonic::Response::into_inner)
}

/// Runs one agent until the fleet stops: open a session, stream, reconnect.
async fn run_agent(
    agent: Arc<SimAgent>,
    address: String,
    gate: Arc<Semaphore>,
    options: SimOptions,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = options.reconnect_min;
    let mut logged_auth = false;
    loop {
        if *stop.borrow() {
            return;
        }
        let (out_tx, out_rx) = mpsc::channel::<WireEvent>(64);
        let opened = {
            let Ok(_permit) = gate.acquire().await else {
                return;
            };
            tokio::select! {
                r = open_session(&address, &agent, out_rx) => r,
                _ = stop.wait_for(|s| *s) => return,
            }
        };
        match opened {
            Ok(inbound) => {
                delay = options.reconnect_min;
                agent.stream_no.fetch_add(1, Ordering::SeqCst);
                agent.live.store(true, Ordering::SeqCst);
                FleetCounters::add(&agent.counters.streams_opened, 1);
                let (ctl_tx, mut ctl_rx) = mpsc::channel(64);
                let lanes = Lanes::start(agent.clone(), 1, 16, ctl_tx);
                let counters = agent.counters.clone();
                let mut stop_stream = stop.clone();
                let end = run_stream(
                    inbound,
                    out_tx,
                    &agent.outbox,
                    &mut ctl_rx,
                    &lanes,
                    async move {
                        let _ = stop_stream.wait_for(|s| *s).await;
                    },
                    |ev| {
                        if ev.is_ack() {
                            FleetCounters::add(&counters.acks_received, 1);
                        }
                    },
                )
                .await;
                agent.live.store(false, Ordering::SeqCst);
                drop(ctl_rx);
                lanes.drain().await;
                if *stop.borrow() {
                    return;
                }
                FleetCounters::add(&agent.counters.streams_lost, 1);
                tracing::debug!(agent = %agent.name, ?end, "simulated agent lost its stream");
            }
            Err(OpenFailure::Auth(msg)) => {
                FleetCounters::add(&agent.counters.auth_failures, 1);
                if !logged_auth {
                    eprintln!("simulated agent {}: refused: {msg}", agent.name);
                    logged_auth = true;
                }
            }
            Err(OpenFailure::Transport(msg)) => {
                FleetCounters::add(&agent.counters.connect_failures, 1);
                tracing::debug!(agent = %agent.name, error = %msg, "simulated agent cannot connect");
            }
        }
        let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as f64 / 1000.0;
        let wait = delay.mul_f64(1.0 + jitter);
        delay = (delay * 2).min(options.reconnect_max);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// A set of simulated agents running against one principal address.
pub struct SimFleet {
    agents: Vec<Arc<SimAgent>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    stop: watch::Sender<bool>,
    /// Counters of this fleet.
    pub counters: Arc<FleetCounters>,
}

impl SimFleet {
    /// Starts one simulated agent per identity against `address` (`host:port` whose certificate
    /// is valid for `localhost`), trusting `pki`'s CA.
    pub fn start(
        address: &str,
        pki: &Pki,
        identities: Vec<SimIdentity>,
        options: SimOptions,
    ) -> anyhow::Result<SimFleet> {
        let counters = Arc::new(FleetCounters::default());
        let gate = Arc::new(Semaphore::new(options.connect_concurrency.max(1)));
        let (stop, stop_rx) = watch::channel(false);
        let mut agents = Vec::with_capacity(identities.len());
        let mut tasks = Vec::with_capacity(identities.len());
        for id in identities {
            let tls = crate::gateway::client_tls(
                pki,
                Some((id.cert_pem.as_str(), id.key_pem.as_str())),
                &[b"h2"],
            )?;
            let agent = Arc::new(SimAgent {
                name: id.name,
                tls: Arc::new(tls),
                outbox: Outbox::new(OutboxConfig::default()),
                counters: counters.clone(),
                report_status: options.report_status,
                apps: Mutex::new(HashMap::new()),
                others: Mutex::new(HashMap::new()),
                stream_no: AtomicU64::new(0),
                live: AtomicBool::new(false),
                resync_answered_in: AtomicU64::new(u64::MAX),
                status_version: AtomicU64::new(0),
                subscribe_timeout: options.subscribe_timeout,
            });
            // The resync after start, as the real agent sends once it listed its objects.
            agent
                .answer_resync()
                .map_err(|e| anyhow::anyhow!("queueing the resync after start: {e}"))?;
            tasks.push(tokio::spawn(run_agent(
                agent.clone(),
                address.to_string(),
                gate.clone(),
                options.clone(),
                stop_rx.clone(),
            )));
            agents.push(agent);
        }
        Ok(SimFleet {
            agents,
            tasks,
            stop,
            counters,
        })
    }

    /// Number of agents.
    pub fn len(&self) -> usize {
        self.agents.len()
    }

    /// Whether the fleet has no agents.
    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Agents with an open stream.
    pub fn subscribed(&self) -> usize {
        self.agents
            .iter()
            .filter(|a| a.live.load(Ordering::SeqCst))
            .count()
    }

    /// Agents subscribed whose current stream's resync is answered and fully ACKed.
    pub fn resynced(&self) -> usize {
        self.agents.iter().filter(|a| a.is_resynced(0)).count()
    }

    /// Agents resynced on a newer stream than the one numbered in `previous` (from
    /// [`SimFleet::stream_numbers`] taken before a cut or restart).
    pub fn resynced_after(&self, previous: &[u64]) -> usize {
        self.agents
            .iter()
            .zip(previous)
            .filter(|(a, prev)| a.is_resynced(**prev))
            .count()
    }

    /// Each agent's current stream number (see [`SimFleet::resynced_after`]).
    pub fn stream_numbers(&self) -> Vec<u64> {
        self.agents
            .iter()
            .map(|a| a.stream_no.load(Ordering::SeqCst))
            .collect()
    }

    /// Applications held, over all agents.
    pub fn applications(&self) -> usize {
        self.agents
            .iter()
            .map(|a| a.apps.lock().expect("apps lock").len())
            .sum()
    }

    /// Applications held whose `spec.source.targetRevision` is `revision`, over all agents.
    pub fn applications_at(&self, revision: &str) -> usize {
        self.agents
            .iter()
            .map(|a| {
                a.apps
                    .lock()
                    .expect("apps lock")
                    .values()
                    .filter(|v| {
                        v.pointer("/spec/source/targetRevision")
                            .and_then(Value::as_str)
                            == Some(revision)
                    })
                    .count()
            })
            .sum()
    }

    /// Resources with un-ACKed outbound events, over all agents.
    pub fn pending(&self) -> usize {
        self.agents.iter().map(|a| a.outbox.resources()).sum()
    }

    /// Stops every agent (their streams close) and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}
