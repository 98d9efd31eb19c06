//! Autonomous mode end to end on real control planes: the spoke owns its Applications and
//! AppProjects; the principal mirrors them into the hub (namespace `<agent>`, projects renamed
//! `<agent>-<name>` with policies rewritten), reverts hub edits and deletions of mirrors, and
//! removes a mirror when the spoke deletes its object. One principal serves a managed and an
//! autonomous agent at the same time.
//!
//! Sync, refresh and terminate requested on a mirror with the real `argocd` CLI through the hub's
//! argocd-server, run by the spoke's real Argo CD, are `real_peers`'
//! `autonomous_sync_and_terminate_*` (every pairing with upstream's principal and agent).

use std::time::Duration;

use e2e::fleet::{Fleet, FleetAgent};
use e2e::gateway::{application, application_resource, appproject_resource, text, SOURCE_UID};
use e2e::{shared_planes, wait_until};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(30);

async fn get_json(api: &Api<DynamicObject>, name: &str) -> Result<Option<Value>, kube::Error> {
    Ok(api
        .get_opt(name)
        .await?
        .map(|o| serde_json::to_value(o).expect("object serialises")))
}

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

#[tokio::test]
async fn autonomous_spoke_objects_are_mirrored_protected_and_operable_from_the_hub(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start_with(
        "autonomous_flow",
        planes,
        &["--namespace-create-enable"],
        &[FleetAgent::autonomous("ship"), FleetAgent::managed("shop")],
    )
    .await?;
    let (principal, agent) = (&fleet.principal, &fleet.agents[0]);
    let (auto, managed) = (agent.name.clone(), fleet.agents[1].name.clone());
    let (principal_ns, spoke_ns) = (principal.namespace.clone(), agent.namespace.clone());
    let hub = planes.hub.client().await?;

    let spoke = planes.spokes[0].client().await?;
    let logs = || {
        format!(
            "agent:\n{}\nprincipal:\n{}",
            agent.process.log_tail(40),
            principal.process.log_tail(40)
        )
    };
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.clone(), &spoke_ns, &application_resource());
    let spoke_projects: Api<DynamicObject> =
        Api::namespaced_with(spoke.clone(), &spoke_ns, &appproject_resource());
    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &auto, &application_resource());
    let hub_projects: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &principal_ns, &appproject_resource());

    // The spoke creates a project with a role and an Application in it.
    let project: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "team", "namespace": spoke_ns},
        "spec": {"destinations": [{"server": "*", "namespace": "*"}],
                 "sourceRepos": ["*"],
                 "roles": [{"name": "ci", "policies": ["p, proj:team:ci, applications, sync, team/*, allow"]}]}
    }))?;
    spoke_projects
        .create(&PostParams::default(), &project)
        .await?;
    let mut app = application("web", &spoke_ns, "v1");
    app.data["spec"]["project"] = json!("team");
    let created = spoke_apps.create(&PostParams::default(), &app).await?;
    let spoke_uid = created.metadata.uid.clone().expect("uid");

    let mirror = wait_for(&hub_apps, "web", "hub mirror of the spoke app", |_| true)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    assert_eq!(
        mirror["metadata"]["annotations"][SOURCE_UID],
        spoke_uid.as_str()
    );
    assert_eq!(text(&mirror, "/spec/project"), format!("{auto}-team"));
    assert_eq!(text(&mirror, "/spec/destination/name"), auto);
    assert!(mirror.pointer("/spec/destination/server").is_none());
    let mirrored_project = wait_for(
        &hub_projects,
        &format!("{auto}-team"),
        "hub mirror of the spoke project",
        |_| true,
    )
    .await?;
    assert_eq!(mirrored_project["spec"]["sourceNamespaces"], json!([auto]));
    assert_eq!(
        mirrored_project["spec"]["destinations"],
        json!([{"name": auto, "server": "*", "namespace": "*"}])
    );
    assert_eq!(
        mirrored_project["spec"]["roles"][0]["policies"][0],
        format!("p, proj:{auto}-team:ci, applications, sync, {auto}-team/{auto}/*, allow")
    );

    // Spec changes on the spoke reach the mirror (status: the real operation state below, and
    // Synced/Healthy in `real_peers::autonomous_app_lifecycle_*`).
    spoke_apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"targetRevision": "v2"}}})),
        )
        .await?;
    wait_for(&hub_apps, "web", "spoke spec on the mirror", |v| {
        text(v, "/spec/source/targetRevision") == "v2"
    })
    .await?;

    // A hub edit of the mirror is reverted; so is a hub edit of the mirrored project.
    hub_apps
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"source": {"targetRevision": "hub-edit"}}})),
        )
        .await?;
    wait_for(&hub_apps, "web", "hub edit reverted", |v| {
        text(v, "/spec/source/targetRevision") == "v2"
    })
    .await?;
    hub_projects
        .patch(
            &format!("{auto}-team"),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"sourceRepos": ["https://evil.example.com"]}})),
        )
        .await?;
    wait_for(
        &hub_projects,
        &format!("{auto}-team"),
        "hub project edit reverted",
        |v| v["spec"]["sourceRepos"] == json!(["*"]),
    )
    .await?;

    // A hub deletion of the mirror is reverted.
    hub_apps.delete("web", &DeleteParams::default()).await?;
    wait_for(&hub_apps, "web", "deleted mirror recreated", |v| {
        text(v, "/spec/source/targetRevision") == "v2"
            && v["metadata"]["annotations"][SOURCE_UID] == spoke_uid.as_str()
    })
    .await?;

    // The managed agent is served by the same principal at the same time.
    let managed_hub: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &managed, &application_resource());
    managed_hub
        .create(
            &PostParams::default(),
            &application("shop-app", &managed, "v1"),
        )
        .await?;
    let managed_spoke: Api<DynamicObject> = Api::namespaced_with(
        planes.spokes[1].client().await?,
        &spoke_ns,
        &application_resource(),
    );
    wait_for(
        &managed_spoke,
        "shop-app",
        "managed app on its spoke",
        |_| true,
    )
    .await?;

    // Deleting on the spoke removes the mirror (and it stays gone).
    spoke_apps.delete("web", &DeleteParams::default()).await?;
    wait_until("mirror removed", WAIT, || async {
        Ok::<_, kube::Error>(get_json(&hub_apps, "web").await?.is_none().then_some(()))
    })
    .await?;
    spoke_projects
        .delete("team", &DeleteParams::default())
        .await?;
    let project_name = format!("{auto}-team");
    wait_until("project mirror removed", WAIT, || async {
        Ok::<_, kube::Error>(
            get_json(&hub_projects, &project_name)
                .await?
                .is_none()
                .then_some(()),
        )
    })
    .await?;
    drop(fleet);
    Ok(())
}
