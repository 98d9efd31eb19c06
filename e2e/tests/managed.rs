//! Managed mode end to end on real control planes: a principal on the hub, agents on two spokes,
//! Applications and AppProjects created on the hub arriving on the right spoke only, sync requests
//! forwarded, deletion with and without finalizers, drift revert, and restarts of either side.
//!
//! Every scenario runs under both of upstream's mappings, as upstream's CI runs its managed suite
//! (`in_both_mappings!`: `<scenario>::namespace_mapping` and `<scenario>::destination_mapping`):
//! namespace mapping (an agent's Applications in the hub namespace named after it, kept in the
//! agent's namespace on the spoke) and destination-based mapping (every agent's Applications in one
//! hub namespace, `spec.destination.name` picking the agent, the namespace kept on the spoke and
//! created there by the agent). Where a scenario means something else under destination mapping
//! the assertion says what that mapping does (AppProjects route by destination only and keep
//! their source namespaces).
//!
//! No Argo CD runs here. What only Argo CD can show (its real status coming back, a hub sync run and
//! terminated on the spoke, a cascade delete) is proven with the real one in `real_peers` and
//! `real_live_view`. Two tests still write what the spoke's application-controller would, and say
//! why in their names: one removes Argo CD's finalizer to hold a deletion open while it looks at the
//! hub, one writes status to count exactly the status-updates an agent restart sends.

use std::time::Duration;

use e2e::fleet::{Fleet, Mapping};
use e2e::gateway::{appproject_resource, text, Agent, Pki, Principal, SOURCE_UID};
use e2e::metrics::Scrape;
use e2e::{shared_planes, wait_until, TestContext};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

/// Generates, for each scenario `async fn scenario(mapping: Mapping)`, a module of that name with
/// the tests `namespace_mapping` and `destination_mapping` running it under each.
macro_rules! in_both_mappings {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            use e2e::fleet::Mapping;

            #[tokio::test]
            async fn namespace_mapping() -> anyhow::Result<()> {
                super::$scenario(Mapping::Namespace).await
            }

            #[tokio::test]
            async fn destination_mapping() -> anyhow::Result<()> {
                super::$scenario(Mapping::Destination).await
            }
        }
    )*};
}

in_both_mappings!(
    managed_applications_and_sync_requests_reach_only_their_spoke,
    hub_deletion_with_finalizer_waits_for_the_spoke_whose_finalizer_the_test_removes_since_real_argocd_would_not_hold_the_deletion_open,
    local_changes_to_managed_apps_on_the_spoke_are_reverted,
    appprojects_reach_the_agents_they_name,
    principal_exits_promptly_on_sigterm_with_agents_connected,
    agent_and_principal_restarts_converge,
    autonomous_agent_without_a_hub_namespace_is_refused_with_a_clear_reason,
    application_the_spoke_refuses_is_reported_on_the_hub_and_blocks_nothing,
    agent_restart_with_nothing_changed_sends_no_status_and_writes_nothing_on_the_hub_with_status_written_by_the_test_since_real_argocd_rewrites_status_on_its_own_clock,
    labels_and_annotations_edited_while_the_agent_was_down_are_reverted,
);

async fn get_json(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>, kube::Error> {
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| serde_json::to_value(o).expect("object serialises")))
}

/// Waits until `name` exists in `api` and satisfies `pred`; returns it.
async fn wait_for(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(get_json(api, name).await?.filter(|v| pred(v)))
    })
    .await
}

async fn wait_gone(api: &Api<DynamicObject>, name: &str, what: &str) -> anyhow::Result<()> {
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(get_json(api, name).await?.is_none().then_some(()))
    })
    .await
}

async fn managed_applications_and_sync_requests_reach_only_their_spoke(
    mapping: Mapping,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start_mapped("managed_flow", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    let hub2 = fleet.hub_apps(planes, 1).await?;
    let spoke2 = fleet.spoke_apps(planes, 1).await?;

    // Create on the hub → appears on spoke 1 with identity and in-cluster destination, in the
    // agent's namespace (namespace mapping) or in the hub namespace, kept and created on the
    // spoke by the agent (destination mapping).
    let created = hub1
        .create(
            &PostParams::default(),
            &fleet.application("guestbook", 0, "v1"),
        )
        .await?;
    let hub_uid = created.metadata.uid.clone().expect("uid");
    let copy = wait_for(&spoke1, "guestbook", "hub app on spoke 1", |_| true).await?;
    assert_eq!(
        copy["metadata"]["annotations"][SOURCE_UID],
        hub_uid.as_str()
    );
    assert_eq!(text(&copy, "/metadata/namespace"), fleet.spoke_namespace(0));
    assert_eq!(text(&copy, "/spec/destination/name"), "in-cluster");
    assert_eq!(text(&copy, "/spec/destination/namespace"), "guestbook");
    assert_eq!(text(&copy, "/spec/source/targetRevision"), "v1");

    // Spec update on the hub → updated on the spoke.
    let patch = json!({"spec": {"source": {"targetRevision": "v2"}}});
    hub1.patch("guestbook", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_for(&spoke1, "guestbook", "spec update on spoke 1", |v| {
        text(v, "/spec/source/targetRevision") == "v2"
    })
    .await?;

    // A sync requested on the hub reaches the spoke as `.operation`. Running it, the status it
    // writes and a terminate from the hub are Argo CD's part and are proven with the real one:
    // `real_peers::managed_app_lifecycle_*` (the spoke's real status on the hub) and
    // `real_live_view::hub_argocd_refreshes_diffs_syncs_terminates_acts_on_and_deletes_an_app_on_a_spoke`
    // (a hub sync run on the spoke and done on the hub, a running sync terminated from the hub).
    let op = json!({"sync": {"revision": "v2", "syncStrategy": {"hook": {}}}, "initiatedBy": {"username": "admin"}});
    hub1.patch(
        "guestbook",
        &PatchParams::default(),
        &Patch::Merge(&json!({"operation": op})),
    )
    .await?;
    wait_for(&spoke1, "guestbook", "operation on spoke 1", |v| {
        v.get("operation") == Some(&op)
    })
    .await?;

    // Agent 2's Application (in the same hub namespace as agent 1's under destination mapping)
    // reaches agent 2 only, and agent 2's spoke never saw agent 1's.
    hub2.create(&PostParams::default(), &fleet.application("other", 1, "v1"))
        .await?;
    wait_for(&spoke2, "other", "agent 2's app on spoke 2", |_| true).await?;
    assert!(
        get_json(&spoke2, "guestbook").await?.is_none(),
        "an app of agent 1 reached agent 2"
    );
    assert!(
        get_json(&spoke1, "other").await?.is_none(),
        "an app of agent 2 reached agent 1"
    );

    // Delete without finalizer → gone on the spoke.
    hub1.delete("guestbook", &DeleteParams::default()).await?;
    wait_gone(&spoke1, "guestbook", "spoke copy deleted").await?;
    drop(fleet);
    Ok(())
}

async fn hub_deletion_with_finalizer_waits_for_the_spoke_whose_finalizer_the_test_removes_since_real_argocd_would_not_hold_the_deletion_open(
    mapping: Mapping,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start_mapped("managed_finalizer", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    let mut app = fleet.application("cascade", 0, "v1");
    app.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    hub1.create(&PostParams::default(), &app).await?;
    wait_for(&spoke1, "cascade", "app on spoke", |v| {
        v["metadata"]["finalizers"][0] == "resources-finalizer.argocd.argoproj.io"
    })
    .await?;

    hub1.delete("cascade", &DeleteParams::default()).await?;
    // The spoke copy is being deleted, held by Argo CD's finalizer; the hub object waits for it.
    wait_for(&spoke1, "cascade", "spoke copy marked for deletion", |v| {
        v["metadata"].get("deletionTimestamp").is_some()
    })
    .await?;
    assert!(
        get_json(&hub1, "cascade").await?.is_some(),
        "hub app vanished before the spoke confirmed"
    );
    // Stand-in for the spoke's Argo CD finishing the cascade: it drops its finalizer.
    spoke1
        .patch(
            "cascade",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    wait_gone(&spoke1, "cascade", "spoke copy gone").await?;
    wait_gone(
        &hub1,
        "cascade",
        "hub app released after the spoke confirmed",
    )
    .await?;
    drop(fleet);
    Ok(())
}

async fn local_changes_to_managed_apps_on_the_spoke_are_reverted(
    mapping: Mapping,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start_mapped("managed_drift", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    hub1.create(&PostParams::default(), &fleet.application("drift", 0, "v1"))
        .await?;
    wait_for(&spoke1, "drift", "app on spoke", |_| true).await?;

    let edit = json!({"spec": {"source": {"targetRevision": "hacked"}}});
    spoke1
        .patch("drift", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    wait_for(&spoke1, "drift", "local spec edit reverted", |v| {
        text(v, "/spec/source/targetRevision") == "v1"
    })
    .await?;

    let before = get_json(&spoke1, "drift").await?.expect("exists");
    spoke1.delete("drift", &DeleteParams::default()).await?;
    wait_for(&spoke1, "drift", "local delete undone", |v| {
        v["metadata"]["uid"] != before["metadata"]["uid"]
    })
    .await?;
    drop(fleet);
    Ok(())
}

async fn appprojects_reach_the_agents_they_name(mapping: Mapping) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start_mapped("managed_projects", planes, mapping).await?;
    let hub = planes.hub.client().await?;
    let projects: Api<DynamicObject> =
        Api::namespaced_with(hub, &fleet.principal.namespace, &appproject_resource());
    let agent1 = fleet.agents[0].name.clone();
    let agent2 = fleet.agents[1].name.clone();
    // Upstream's rule (DoesAgentMatchWithProject). Namespace mapping: a destination names the agent
    // AND a source namespace admits the agent's hub namespace; agent 2's namespace is admitted too,
    // so only the destination keeps the project off spoke 2. Destination mapping: the destination
    // alone; the source namespaces admit the hub namespace the Applications all live in.
    let source_namespaces: Vec<&str> = match mapping {
        Mapping::Namespace => vec![agent1.as_str(), agent2.as_str()],
        Mapping::Destination => vec![fleet.apps_namespace.as_str()],
    };
    let spoke1: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[0].client().await?,
        &fleet.agents[0].namespace,
        &appproject_resource(),
    );
    if mapping == Mapping::Namespace {
        // A destination without a source namespace is not enough: "no-source" is made first and
        // the agent's events arrive in order, so once "team-a" is on spoke 1 "no-source" would be.
        let no_source: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "no-source", "namespace": fleet.principal.namespace},
            "spec": {"destinations": [{"name": agent1, "namespace": "*"}], "sourceRepos": ["*"]}
        }))?;
        projects.create(&PostParams::default(), &no_source).await?;
    }
    let proj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "team-a", "namespace": fleet.principal.namespace},
        "spec": {"destinations": [{"name": agent1, "namespace": "guestbook"}],
                 "sourceNamespaces": source_namespaces,
                 "sourceRepos": ["*"], "roles": [{"name": "ci", "policies": ["p, proj:team-a:ci, applications, get, team-a/*, allow"]}]}
    }))?;
    projects.create(&PostParams::default(), &proj).await?;
    let spoke2: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[1].client().await?,
        &fleet.agents[1].namespace,
        &appproject_resource(),
    );
    let copy = wait_for(&spoke1, "team-a", "project on spoke 1", |_| true).await?;
    assert_eq!(
        copy["spec"]["destinations"],
        json!([{"name": "in-cluster", "server": "https://kubernetes.default.svc", "namespace": "guestbook"}])
    );
    assert!(
        copy["spec"].get("roles").is_none(),
        "hub-only roles leaked to the spoke"
    );
    let kept: Vec<&str> = copy["spec"]["sourceNamespaces"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let expected: &[&str] = match mapping {
        Mapping::Namespace => &[],
        Mapping::Destination => &source_namespaces,
    };
    assert_eq!(
        kept, expected,
        "destination mapping keeps the source namespaces (the spoke's Argo CD admits Applications \
         there); namespace mapping drops them"
    );
    if mapping == Mapping::Namespace {
        assert!(
            get_json(&spoke1, "no-source").await?.is_none(),
            "a project whose source namespaces do not admit the agent reached it"
        );
        // Positive control: admitting agent 1's namespace sends it.
        let admit = json!({"spec": {"sourceNamespaces": [agent1]}});
        projects
            .patch("no-source", &PatchParams::default(), &Patch::Merge(&admit))
            .await?;
        wait_for(&spoke1, "no-source", "no-source once admitted", |_| true).await?;
    }

    // Re-targeting the project to agent 2 moves it: spoke 1 loses it although its source
    // namespaces still admit agent 1 (namespace mapping) or its Applications (destination mapping).
    let retarget = json!({"spec": {"destinations": [{"name": agent2, "namespace": "guestbook"}]}});
    projects
        .patch("team-a", &PatchParams::default(), &Patch::Merge(&retarget))
        .await?;
    wait_for(&spoke2, "team-a", "project on spoke 2", |_| true).await?;
    wait_gone(&spoke1, "team-a", "project removed from spoke 1").await?;
    drop(fleet);
    Ok(())
}

async fn principal_exits_promptly_on_sigterm_with_agents_connected(
    mapping: Mapping,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let mut fleet = Fleet::start_mapped("managed_sigterm", planes, mapping).await?;
    // Fleet::start waited until both agents' streams were open: those are what a graceful stop
    // could wait for (they never end by themselves).
    let grace = Duration::from_secs(3);
    let exited = fleet.principal.process.stop_within(grace);
    let log = fleet.principal.process.log_tail(40);
    assert!(
        exited,
        "the principal did not exit within {grace:?} of SIGTERM with two agents connected:\n{log}"
    );
    assert!(log.contains("shutting down"), "no orderly shutdown:\n{log}");
    let closed = log
        .matches("agent stream closed (superseded or shutting down)")
        .count();
    assert_eq!(closed, 2, "both agents' streams end at shutdown:\n{log}");
    for agent in &mut fleet.agents {
        agent.process.stop();
    }
    Ok(())
}

async fn agent_and_principal_restarts_converge(mapping: Mapping) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let mut fleet = Fleet::start_mapped("managed_restarts", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    for name in ["keep", "change", "remove"] {
        hub1.create(&PostParams::default(), &fleet.application(name, 0, "v1"))
            .await?;
        wait_for(&spoke1, name, "initial sync", |_| true).await?;
    }

    // Agent down: the hub changes; the agent catches up after it restarts.
    fleet.agents[0].process.kill();
    hub1.patch(
        "change",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"source": {"targetRevision": "v2"}}})),
    )
    .await?;
    hub1.delete("remove", &DeleteParams::default()).await?;
    hub1.create(&PostParams::default(), &fleet.application("added", 0, "v1"))
        .await?;
    fleet.agents[0].process.start_again()?;
    wait_for(
        &spoke1,
        "change",
        "update made while the agent was down",
        |v| text(v, "/spec/source/targetRevision") == "v2",
    )
    .await?;
    wait_for(
        &spoke1,
        "added",
        "create made while the agent was down",
        |_| true,
    )
    .await?;
    wait_gone(&spoke1, "remove", "delete made while the agent was down").await?;

    // Agent restart with nothing changed: the resync is checksums only, so the principal does not
    // resend the N objects (before: one spec-update per object on every connect).
    const UNCHANGED: usize = 20;
    for i in 0..UNCHANGED {
        hub1.create(
            &PostParams::default(),
            &fleet.application(&format!("same-{i}"), 0, "v1"),
        )
        .await?;
    }
    for i in 0..UNCHANGED {
        wait_for(
            &spoke1,
            &format!("same-{i}"),
            "unchanged set synced",
            |_| true,
        )
        .await?;
    }
    let port = fleet.principal.ops_port;
    let sent = |s: &Scrape, t: &str| s.value("principal_events_sent", &[("event_type", t)]);
    let received = |s: &Scrape, t: &str| s.value("principal_events_received", &[("event_type", t)]);
    let before = Scrape::of(port).await?;
    fleet.agents[0].process.kill();
    fleet.agents[0].process.start_again()?;
    fleet.agents[0].wait_connected().await?;
    wait_until("the restarted agent's checksum resync", WAIT, || async {
        let now = Scrape::of(port).await?;
        let grew = |t: &str| Ok::<_, anyhow::Error>(received(&now, t)? - received(&before, t)?);
        Ok::<_, anyhow::Error>(
            (grew("request-synced-resource-list")? >= 1.0
                && grew("request-update")? >= UNCHANGED as f64)
                .then_some(()),
        )
    })
    .await?;
    // A later change still flows, and by then the resync answers were sent.
    hub1.create(
        &PostParams::default(),
        &fleet.application("marker", 0, "v1"),
    )
    .await?;
    wait_for(&spoke1, "marker", "change after the resync", |_| true).await?;
    let after = Scrape::of(port).await?;
    assert!(
        sent(&after, "create")? > sent(&before, "create")?,
        "the principal counts the events it sends (the marker's create)"
    );
    let resent = sent(&after, "spec-update")? - sent(&before, "spec-update")?;
    assert!(
        resent < UNCHANGED as f64,
        "an agent restart with nothing changed made the principal send {resent} spec-updates for {UNCHANGED} unchanged Applications"
    );

    // Principal down: the hub changes; agents reconnect to the new principal and converge.
    fleet.principal.process.kill();
    hub1.patch(
        "change",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"source": {"targetRevision": "v3"}}})),
    )
    .await?;
    hub1.delete("added", &DeleteParams::default()).await?;
    hub1.create(&PostParams::default(), &fleet.application("late", 0, "v1"))
        .await?;
    fleet.principal.process.start_again()?;
    fleet.principal.wait_ready().await?;
    wait_for(
        &spoke1,
        "change",
        "update made while the principal was down",
        |v| text(v, "/spec/source/targetRevision") == "v3",
    )
    .await?;
    wait_for(
        &spoke1,
        "late",
        "create made while the principal was down",
        |_| true,
    )
    .await?;
    wait_gone(&spoke1, "added", "delete made while the principal was down").await?;
    assert!(get_json(&spoke1, "keep").await?.is_some());
    drop(fleet);
    Ok(())
}

async fn autonomous_agent_without_a_hub_namespace_is_refused_with_a_clear_reason(
    mapping: Mapping,
) -> anyhow::Result<()> {
    // The principal may not create namespaces (no --namespace-create-enable) and the agent's hub
    // namespace does not exist: the agent is told why, and keeps retrying. Destination mapping
    // changes nothing for autonomous agents: their Applications are mirrored into the hub
    // namespace named after them, as upstream does.
    let planes = shared_planes().await;
    let ctx = TestContext::new("autonomous_refused")?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let principal = Principal::start(
        "p",
        &ctx.dir,
        &planes.hub,
        &pki,
        &ctx.unique("argocd"),
        mapping.principal_args(),
    )
    .await?;
    let name = ctx.unique("auto");
    pki.issue_agent(&name)?;
    let agent = Agent::start(
        &name,
        &ctx.dir,
        &planes.spokes[0],
        &pki,
        &principal.address(),
        &ctx.unique("ns"),
        &["--mode=autonomous"],
    )
    .await?;
    wait_until("refusal explained in the agent log", WAIT, || async {
        Ok::<_, anyhow::Error>(
            agent
                .process
                .log_tail(200)
                .contains("--namespace-create-enable")
                .then_some(()),
        )
    })
    .await?;
    drop(agent);
    drop(principal);
    Ok(())
}

async fn application_the_spoke_refuses_is_reported_on_the_hub_and_blocks_nothing(
    mapping: Mapping,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start_mapped("managed_refused", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    // Annotations just under the apiserver's 256 KiB total: the hub accepts the object, but the
    // spoke copy carries one more annotation (the source UID) and the spoke apiserver refuses it.
    let mut big = fleet.application("too-big", 0, "v1");
    let key = "example.com/padding";
    let limit = 256 * 1024;
    big.metadata.annotations = Some([(key.to_string(), "x".repeat(limit - key.len() - 10))].into());
    hub1.create(&PostParams::default(), &big).await?;
    hub1.create(&PostParams::default(), &fleet.application("fine", 0, "v1"))
        .await?;

    let refused = wait_for(&hub1, "too-big", "AgentError condition on the hub", |v| {
        v.pointer("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|c| c.iter().any(|c| c["type"] == "AgentError"))
    })
    .await?;
    let message = refused["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "AgentError"))
        .map(|c| text(c, "/message"))
        .unwrap_or_default();
    assert!(
        message.to_lowercase().contains("too long"),
        "condition should carry the spoke's reason: {message}"
    );
    assert!(get_json(&spoke1, "too-big").await?.is_none());

    // Everything else keeps flowing.
    wait_for(&spoke1, "fine", "other app delivered", |_| true).await?;
    let patch = json!({"spec": {"source": {"targetRevision": "v2"}}});
    hub1.patch("fine", &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    wait_for(&spoke1, "fine", "other app updated", |v| {
        text(v, "/spec/source/targetRevision") == "v2"
    })
    .await?;
    drop(fleet);
    Ok(())
}

/// `metadata.resourceVersion` of hub Application `name`.
async fn resource_version(api: &Api<DynamicObject>, name: &str) -> anyhow::Result<String> {
    let obj = get_json(api, name)
        .await?
        .ok_or_else(|| anyhow::anyhow!("{name} is missing"))?;
    Ok(text(&obj, "/metadata/resourceVersion").to_string())
}

async fn agent_restart_with_nothing_changed_sends_no_status_and_writes_nothing_on_the_hub_with_status_written_by_the_test_since_real_argocd_rewrites_status_on_its_own_clock(
    mapping: Mapping,
) -> anyhow::Result<()> {
    // Counting exactly one status-update needs statuses that change only when the test says so;
    // the real application-controller rewrites status on every periodic refresh.
    const APPS: usize = 8;
    let planes = shared_planes().await;
    let mut fleet = Fleet::start_mapped("managed_status_resync", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    let names: Vec<String> = (0..APPS).map(|i| format!("st-{i}")).collect();
    for name in &names {
        hub1.create(&PostParams::default(), &fleet.application(name, 0, "v1"))
            .await?;
    }
    let healthy =
        json!({"status": {"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}});
    for name in &names {
        wait_for(&spoke1, name, "app on the spoke", |_| true).await?;
        // Stand-in for the spoke's application-controller writing status.
        spoke1
            .patch(name, &PatchParams::default(), &Patch::Merge(&healthy))
            .await?;
    }
    for name in &names {
        wait_for(&hub1, name, "status on the hub", |v| {
            text(v, "/status/health/status") == "Healthy"
        })
        .await?;
    }

    // Every status ACKed before the kill: one still in flight would rightly be sent again.
    let agent_port = fleet.agents[0].ops_port;
    wait_until("the agent's outbox to drain", WAIT, || async {
        let queued = Scrape::of(agent_port)
            .await?
            .value("argocd_agent_outbox_resources", &[])?;
        Ok::<_, anyhow::Error>((queued == 0.0).then_some(()))
    })
    .await?;
    // Agent down; one status changes meanwhile, the others do not.
    fleet.agents[0].process.kill();
    let degraded = json!({"status": {"health": {"status": "Degraded"}}});
    // Stand-in for the spoke's application-controller writing status.
    spoke1
        .patch(&names[0], &PatchParams::default(), &Patch::Merge(&degraded))
        .await?;
    let mut versions = Vec::new();
    for name in &names[1..] {
        versions.push(resource_version(&hub1, name).await?);
    }
    let port = fleet.principal.ops_port;
    let received = |s: &Scrape, t: &str| s.value("principal_events_received", &[("event_type", t)]);
    let before = Scrape::of(port).await?;
    fleet.agents[0].process.start_again()?;
    fleet.agents[0].wait_connected().await?;
    wait_for(
        &hub1,
        &names[0],
        "status changed while the agent was down",
        |v| text(v, "/status/health/status") == "Degraded",
    )
    .await?;
    wait_until("the restarted agent's checksum resync", WAIT, || async {
        let now = Scrape::of(port).await?;
        Ok::<_, anyhow::Error>(
            (received(&now, "request-update")? - received(&before, "request-update")?
                >= APPS as f64)
                .then_some(()),
        )
    })
    .await?;
    // A later change flows after everything the restart queued.
    hub1.create(
        &PostParams::default(),
        &fleet.application("st-marker", 0, "v1"),
    )
    .await?;
    wait_for(&spoke1, "st-marker", "change after the resync", |_| true).await?;

    let after = Scrape::of(port).await?;
    let sent = received(&after, "status-update")? - received(&before, "status-update")?;
    assert_eq!(
        sent, 1.0,
        "a restart where one of {APPS} statuses changed sent {sent} status-updates"
    );
    for (name, version) in names[1..].iter().zip(&versions) {
        assert_eq!(
            &resource_version(&hub1, name).await?,
            version,
            "hub Application {name} was written although nothing changed"
        );
    }
    drop(fleet);
    Ok(())
}

async fn labels_and_annotations_edited_while_the_agent_was_down_are_reverted(
    mapping: Mapping,
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let mut fleet = Fleet::start_mapped("managed_offline_drift", planes, mapping).await?;
    let hub1 = fleet.hub_apps(planes, 0).await?;
    let spoke1 = fleet.spoke_apps(planes, 0).await?;
    let mut app = fleet.application("meta", 0, "v1");
    app.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    app.metadata.annotations = Some([("note".to_string(), "hub".to_string())].into());
    hub1.create(&PostParams::default(), &app).await?;
    wait_for(&spoke1, "meta", "app on the spoke", |_| true).await?;

    fleet.agents[0].process.kill();
    let edit = json!({"metadata": {
        "labels": {"team": "b", "extra": "x"},
        "annotations": {"note": "spoke", "local": "y"}}});
    spoke1
        .patch("meta", &PatchParams::default(), &Patch::Merge(&edit))
        .await?;
    fleet.agents[0].process.start_again()?;
    fleet.agents[0].wait_connected().await?;
    let reverted = wait_for(&spoke1, "meta", "offline metadata edit reverted", |v| {
        text(v, "/metadata/labels/team") == "a"
            && v.pointer("/metadata/labels/extra").is_none()
            && text(v, "/metadata/annotations/note") == "hub"
            && v.pointer("/metadata/annotations/local").is_none()
    })
    .await?;
    assert_eq!(
        text(&reverted, "/spec/source/targetRevision"),
        "v1",
        "the spec is kept"
    );
    drop(fleet);
    Ok(())
}
