//! Managed mode's spoke side against a real kube-apiserver, without a principal: the event handler
//! is fed events built as the principal builds them, and the watcher's outbound events are read
//! from the Outbox. No Argo CD runs: where its application-controller would write status or drop a
//! finalizer, the test does it.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use argocd_agent_agent::config::{AdoptionPolicy, SourceUidMismatchPolicy};
use argocd_agent_agent::managed::{ManagedSettings, ManagedSync};
use argocd_agent_agent::spoke_copy::SyncedKind;
use argocd_agent_proto::event::{spec_checksum, Event, EventType, Target, SOURCE_UID_ANNOTATION};
use argocd_agent_proto::payload::RequestUpdate;
use argocd_agent_proto::sync::{EventHandler, HandleError, Outbox, OutboxConfig};
use e2e::{wait_until, ControlPlane};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

static PLANE: OnceLock<Result<ControlPlane, String>> = OnceLock::new();

/// One spoke plane for this test binary; each test works in its own namespace.
async fn plane() -> &'static ControlPlane {
    let plane = tokio::task::spawn_blocking(|| {
        PLANE.get_or_init(|| ControlPlane::start("spoke").map_err(|e| format!("{e:#}")))
    })
    .await
    .expect("plane start-up task");
    match plane {
        Ok(p) => p,
        Err(e) => panic!("spoke control plane failed to start: {e}"),
    }
}

/// A managed sync on its own namespace with its watchers running.
struct Spoke {
    namespace: String,
    sync: Arc<ManagedSync>,
    outbox: Arc<Outbox>,
    apps: Api<DynamicObject>,
    projects: Api<DynamicObject>,
    watchers: tokio::task::JoinHandle<()>,
}

impl Drop for Spoke {
    fn drop(&mut self) {
        self.watchers.abort();
    }
}

impl Spoke {
    async fn start(prefix: &str) -> anyhow::Result<Spoke> {
        let client = plane().await.client().await?;
        let namespace = format!("{prefix}-{}", &uuid_suffix());
        let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
        ns_api
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": namespace}}))?,
            )
            .await?;
        let outbox = Arc::new(Outbox::new(OutboxConfig::default()));
        outbox.set_connected(true);
        let sync = ManagedSync::new(
            client.clone(),
            ManagedSettings {
                namespace: namespace.clone(),
                adoption_policy: AdoptionPolicy::Always,
                source_uid_mismatch_policy: SourceUidMismatchPolicy::Recreate,
                label_selector: None,
                ..ManagedSettings::default()
            },
            outbox.clone(),
        );
        let watchers = tokio::spawn(sync.clone().run_watchers());
        Ok(Spoke {
            apps: Api::namespaced_with(
                client.clone(),
                &namespace,
                &SyncedKind::Application.api_resource(),
            ),
            projects: Api::namespaced_with(
                client,
                &namespace,
                &SyncedKind::AppProject.api_resource(),
            ),
            namespace,
            sync,
            outbox,
            watchers,
        })
    }

    async fn send(&self, t: EventType, target: Target, hub: &Value) -> Result<(), HandleError> {
        let ev = Event::for_object(t, target, "", hub).expect("event");
        self.sync.handle(ev).await
    }

    /// Every event the agent queued for the principal so far (ACKed as read, like the principal).
    fn drain(&self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(ev) = self.outbox.take_next(Instant::now()) {
            self.outbox.ack(&ev.ack());
            out.push(ev);
        }
        out
    }

    /// Waits until the agent has queued an event matching `pred`; returns it.
    async fn wait_event(&self, what: &str, pred: impl Fn(&Event) -> bool) -> anyhow::Result<Event> {
        let seen = std::sync::Mutex::new(Vec::<Event>::new());
        wait_until(what, WAIT, || async {
            let mut seen = seen.lock().unwrap();
            seen.extend(self.drain());
            Ok::<_, anyhow::Error>(seen.iter().find(|e| pred(e)).cloned())
        })
        .await
    }
}

fn uuid_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{:x}", nanos ^ std::process::id())
}

fn hub_app(name: &str, uid: &str, revision: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": name, "namespace": "agent-a", "uid": uid, "resourceVersion": "100",
            "labels": {"team": "blue"}
        },
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://example.com/repo.git", "path": "guestbook", "targetRevision": revision},
            "destination": {"server": "https://agent-a.example.com", "namespace": "guestbook"}
        }
    })
}

async fn get(api: &Api<DynamicObject>, name: &str) -> anyhow::Result<Option<Value>> {
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| serde_json::to_value(o).expect("json")))
}

async fn wait_for(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    wait_until(what, WAIT, || async {
        Ok::<_, anyhow::Error>(get(api, name).await?.filter(|v| pred(v)))
    })
    .await
}

async fn wait_gone(api: &Api<DynamicObject>, name: &str, what: &str) -> anyhow::Result<()> {
    wait_until(what, WAIT, || async {
        Ok::<_, anyhow::Error>(get(api, name).await?.is_none().then_some(()))
    })
    .await
}

fn text(v: &Value, ptr: &str) -> String {
    v.pointer(ptr)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

fn payload(ev: &Event) -> Value {
    ev.data_as().expect("json payload")
}

#[tokio::test]
async fn hub_events_drive_the_spoke_and_the_spoke_reports_back() -> anyhow::Result<()> {
    let spoke = Spoke::start("flow").await?;
    let hub = hub_app("guestbook", "hub-uid-1", "v1");

    // create → spoke copy with source-uid and in-cluster destination, no status reported yet.
    spoke
        .send(EventType::Create, Target::Application, &hub)
        .await
        .unwrap();
    let copy = get(&spoke.apps, "guestbook").await?.expect("created");
    assert_eq!(
        copy["metadata"]["annotations"][SOURCE_UID_ANNOTATION],
        "hub-uid-1"
    );
    assert_eq!(
        copy["spec"]["destination"],
        json!({"name": "in-cluster", "namespace": "guestbook"})
    );
    assert_eq!(copy["metadata"]["labels"]["team"], "blue");
    // Redelivery is harmless.
    spoke
        .send(EventType::Create, Target::Application, &hub)
        .await
        .unwrap();

    // spec-update → changed.
    let hub = hub_app("guestbook", "hub-uid-1", "v2");
    spoke
        .send(EventType::SpecUpdate, Target::Application, &hub)
        .await
        .unwrap();
    let copy = get(&spoke.apps, "guestbook").await?.expect("exists");
    assert_eq!(text(&copy, "/spec/source/targetRevision"), "v2");

    // Local spec edit → reverted from the hub copy.
    let edit = json!({"spec": {"source": {"targetRevision": "hacked"}}});
    spoke
        .apps
        .patch("guestbook", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    wait_for(&spoke.apps, "guestbook", "local edit reverted", |v| {
        text(v, "/spec/source/targetRevision") == "v2"
    })
    .await?;

    // Local delete → recreated (a new object).
    let before = get(&spoke.apps, "guestbook").await?.expect("exists");
    spoke
        .apps
        .delete("guestbook", &DeleteParams::background())
        .await?;
    let recreated = wait_for(&spoke.apps, "guestbook", "local delete undone", |v| {
        v["metadata"]["uid"] != before["metadata"]["uid"]
    })
    .await?;
    assert_eq!(
        recreated["metadata"]["annotations"][SOURCE_UID_ANNOTATION],
        "hub-uid-1"
    );
    assert!(
        !spoke
            .drain()
            .iter()
            .any(|e| e.event_type == EventType::Delete),
        "an unauthorised local delete is not reported as a deletion"
    );

    // Status written on the spoke (Argo CD's job) → status-update with the full spoke App.
    let status = json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}});
    spoke
        .apps
        .patch("guestbook", &PatchParams::default(), &Patch::Merge(&status))
        .await?;
    let ev = spoke
        .wait_event("status-update queued", |e| {
            e.event_type == EventType::StatusUpdate
                && payload(e)["status"]["health"]["status"] == "Healthy"
        })
        .await?;
    assert_eq!(ev.target, Target::Application);
    assert_eq!(
        ev.subject.as_deref(),
        Some(format!("{}/guestbook", spoke.namespace).as_str())
    );
    assert_eq!(
        payload(&ev)["metadata"]["annotations"][SOURCE_UID_ANNOTATION],
        "hub-uid-1"
    );

    // set-operation → `.operation` on the spoke, reported back with the status.
    let op = json!({"sync": {"revision": "v2"}, "initiatedBy": {"username": "admin"}});
    let mut with_op = hub.clone();
    with_op["operation"] = op.clone();
    spoke
        .send(EventType::SetOperation, Target::Application, &with_op)
        .await
        .unwrap();
    wait_for(&spoke.apps, "guestbook", "operation set", |v| {
        v.get("operation") == Some(&op)
    })
    .await?;
    spoke
        .wait_event("status-update with the operation", |e| {
            e.event_type == EventType::StatusUpdate && payload(e)["operation"] == op
        })
        .await?;
    // A later spec-update keeps the spoke's operation and status.
    spoke
        .send(
            EventType::SpecUpdate,
            Target::Application,
            &hub_app("guestbook", "hub-uid-1", "v3"),
        )
        .await
        .unwrap();
    let v = get(&spoke.apps, "guestbook").await?.expect("exists");
    assert_eq!(v["operation"], op);
    assert_eq!(text(&v, "/status/health/status"), "Healthy");
    assert_eq!(text(&v, "/spec/source/targetRevision"), "v3");

    // terminate-operation on a running operation → phase Terminating.
    let running = json!({"status": {"operationState": {"operation": op, "phase": "Running", "startedAt": "2024-01-01T00:00:00Z"}}});
    spoke
        .apps
        .patch(
            "guestbook",
            &PatchParams::default(),
            &Patch::Merge(&running),
        )
        .await?;
    spoke
        .send(EventType::TerminateOperation, Target::Application, &hub)
        .await
        .unwrap();
    wait_for(&spoke.apps, "guestbook", "operation terminating", |v| {
        text(v, "/status/operationState/phase") == "Terminating"
    })
    .await?;

    // request-resource-resync → one request-update per hub-created object, with the spec checksum.
    let local_only = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "local-only"},
        "spec": {"project": "default", "source": {"repoURL": "r"}, "destination": {"name": "in-cluster"}}
    });
    spoke
        .apps
        .create(&PostParams::default(), &serde_json::from_value(local_only)?)
        .await?;
    spoke.drain();
    let resync = Event::request_resource_resync("").unwrap();
    spoke.sync.handle(resync).await.unwrap();
    let requests: Vec<RequestUpdate> = spoke
        .drain()
        .iter()
        .filter(|e| e.event_type == EventType::RequestUpdate)
        .map(|e| e.data_as().unwrap())
        .collect();
    assert_eq!(requests.len(), 1, "{requests:?}");
    let live = get(&spoke.apps, "guestbook").await?.expect("exists");
    assert_eq!(requests[0].name, "guestbook");
    assert_eq!(requests[0].kind, "Application");
    assert_eq!(requests[0].uid, "hub-uid-1");
    assert_eq!(requests[0].namespace, spoke.namespace);
    assert_eq!(
        requests[0].checksum,
        spec_checksum(&live, Some("Application")).unwrap()
    );
    // Same checksum as the hub object's: the destination rewrite does not count.
    assert_eq!(
        requests[0].checksum,
        spec_checksum(&hub_app("guestbook", "hub-uid-1", "v3"), None).unwrap()
    );

    // delete → spoke copy gone, and the deletion confirmed to the principal.
    spoke
        .send(EventType::Delete, Target::Application, &hub)
        .await
        .unwrap();
    wait_gone(&spoke.apps, "guestbook", "spoke copy deleted").await?;
    let ev = spoke
        .wait_event("delete confirmation", |e| e.event_type == EventType::Delete)
        .await?;
    assert_eq!(ev.target, Target::Application);
    assert_eq!(payload(&ev)["metadata"]["name"], "guestbook");
    // Redelivered delete: nothing left, confirmed again, no error.
    spoke
        .send(EventType::Delete, Target::Application, &hub)
        .await
        .unwrap();
    assert!(
        get(&spoke.apps, "local-only").await?.is_some(),
        "local apps are left alone"
    );
    Ok(())
}

#[tokio::test]
async fn hub_deletion_with_finalizer_is_confirmed_once_the_spoke_copy_is_gone() -> anyhow::Result<()>
{
    let spoke = Spoke::start("fin").await?;
    let mut hub = hub_app("cascade", "hub-uid-2", "v1");
    hub["metadata"]["finalizers"] = json!(["resources-finalizer.argocd.argoproj.io"]);
    spoke
        .send(EventType::Create, Target::Application, &hub)
        .await
        .unwrap();

    // The hub app is being deleted: spec-update carrying deletionTimestamp.
    hub["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    spoke
        .send(EventType::SpecUpdate, Target::Application, &hub)
        .await
        .unwrap();
    wait_for(&spoke.apps, "cascade", "spoke copy terminating", |v| {
        v["metadata"].get("deletionTimestamp").is_some()
    })
    .await?;
    assert!(
        !spoke
            .drain()
            .iter()
            .any(|e| e.event_type == EventType::Delete),
        "not confirmed while Argo CD's finalizer holds the spoke copy"
    );
    // Argo CD on the spoke finishes the cascade and drops its finalizer.
    let release = json!({"metadata": {"finalizers": null}});
    spoke
        .apps
        .patch("cascade", &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    wait_gone(&spoke.apps, "cascade", "spoke copy gone").await?;
    spoke
        .wait_event("delete confirmation", |e| {
            e.event_type == EventType::Delete && e.target == Target::Application
        })
        .await?;
    // Not recreated: the deletion was the hub's.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        get(&spoke.apps, "cascade").await?.is_none(),
        "an expected deletion was undone"
    );
    Ok(())
}

#[tokio::test]
async fn appprojects_are_kept_like_applications() -> anyhow::Result<()> {
    let spoke = Spoke::start("proj").await?;
    let hub = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "team-a", "namespace": "argocd", "uid": "proj-uid-1"},
        "spec": {"sourceRepos": ["*"], "destinations": [{"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "guestbook"}]}
    });
    spoke
        .send(EventType::Create, Target::AppProject, &hub)
        .await
        .unwrap();
    let copy = get(&spoke.projects, "team-a").await?.expect("created");
    assert_eq!(
        copy["metadata"]["annotations"][SOURCE_UID_ANNOTATION],
        "proj-uid-1"
    );
    assert_eq!(copy["spec"], hub["spec"]);

    let edit = json!({"spec": {"sourceRepos": ["https://evil.example.com"]}});
    spoke
        .projects
        .patch("team-a", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    wait_for(&spoke.projects, "team-a", "local edit reverted", |v| {
        v["spec"]["sourceRepos"] == json!(["*"])
    })
    .await?;

    // A payload that cannot be a spoke copy is refused (ACKed with an error), not retried.
    let bad = json!({"metadata": {"name": "x"}, "spec": {}});
    assert!(matches!(
        spoke
            .send(EventType::Create, Target::AppProject, &bad)
            .await,
        Err(HandleError::Rejected(_))
    ));

    spoke
        .send(EventType::Delete, Target::AppProject, &hub)
        .await
        .unwrap();
    wait_gone(&spoke.projects, "team-a", "project deleted").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        get(&spoke.projects, "team-a").await?.is_none(),
        "an expected deletion was undone"
    );
    assert!(
        !spoke
            .drain()
            .iter()
            .any(|e| e.event_type == EventType::Delete),
        "AppProject deletions are not confirmed to the principal"
    );
    Ok(())
}
