//! Repository Secrets in managed mode end to end on real control planes: a principal on the hub,
//! a managed agent on each of two spokes. A Secret labelled `argocd.argoproj.io/secret-type:
//! repository` in the principal's namespace goes to the spokes its `data.project` AppProject
//! applies to, follows changes of its data and of that AppProject, disappears when deleted on the
//! hub, and local edits on a spoke are reverted.

use std::time::Duration;

use base64::Engine;
use e2e::fleet::Fleet;
use e2e::gateway::{appproject_resource, SOURCE_UID};
use e2e::{shared_planes, wait_until};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// `data[key]` of a Secret, decoded.
fn data_of(secret: &Secret, key: &str) -> Option<String> {
    secret
        .data
        .as_ref()?
        .get(key)
        .map(|v| String::from_utf8_lossy(&v.0).into_owned())
}

async fn wait_data(
    api: &Api<Secret>,
    name: &str,
    key: &str,
    want: &str,
    what: &str,
) -> anyhow::Result<Secret> {
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(
            api.get_opt(name)
                .await?
                .filter(|s| data_of(s, key).as_deref() == Some(want)),
        )
    })
    .await
}

async fn wait_gone(api: &Api<Secret>, name: &str, what: &str) -> anyhow::Result<()> {
    wait_until(what, WAIT, || async {
        Ok::<_, kube::Error>(api.get_opt(name).await?.is_none().then_some(()))
    })
    .await
}

/// A hub AppProject for `agent`: upstream's rule under namespace mapping wants both a destination
/// naming the agent and a source namespace admitting the agent's hub namespace.
fn project(name: &str, agent: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": name},
        "spec": {"destinations": [{"name": agent, "namespace": "*"}],
                 "sourceNamespaces": [agent], "sourceRepos": ["*"]}
    }))?)
}

#[tokio::test]
async fn repository_secrets_follow_their_project_to_managed_agents() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let fleet = Fleet::start("repositories", planes).await?;
    let (principal, agents) = (&fleet.principal, &fleet.agents);
    let hub = planes.hub.client().await?;
    let hub_secrets: Api<Secret> = Api::namespaced(hub.clone(), &principal.namespace);
    let hub_projects: Api<DynamicObject> =
        Api::namespaced_with(hub.clone(), &principal.namespace, &appproject_resource());
    let mut spoke_secrets: Vec<Api<Secret>> = Vec::new();
    for (i, a) in agents.iter().enumerate() {
        spoke_secrets.push(Api::namespaced(
            planes.spokes[i].client().await?,
            &a.namespace,
        ));
    }

    hub_projects
        .create(&PostParams::default(), &project("team-a", &agents[0].name)?)
        .await?;
    let repo: Secret = serde_json::from_value(json!({
        "metadata": {"name": "repo-guestbook",
                     "labels": {"argocd.argoproj.io/secret-type": "repository"}},
        "type": "Opaque",
        "data": {"project": b64("team-a"), "type": b64("git"),
                 "url": b64("https://example.com/guestbook.git"), "password": b64("s3cret")}
    }))?;
    let created = hub_secrets.create(&PostParams::default(), &repo).await?;
    let hub_uid = created.metadata.uid.clone().expect("uid");

    // Reaches spoke 1 (the project names agent 1) with its data and the hub identity.
    let copy = wait_data(
        &spoke_secrets[0],
        "repo-guestbook",
        "url",
        "https://example.com/guestbook.git",
        "repository Secret on spoke 1",
    )
    .await?;
    assert_eq!(data_of(&copy, "password").as_deref(), Some("s3cret"));
    assert_eq!(
        copy.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SOURCE_UID)),
        Some(&hub_uid)
    );
    assert_eq!(
        copy.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("argocd.argoproj.io/secret-type"))
            .map(String::as_str),
        Some("repository")
    );
    // A Secret without the repository label never leaves the hub.
    let plain: Secret = serde_json::from_value(json!({
        "metadata": {"name": "not-a-repo"},
        "data": {"project": b64("team-a")}
    }))?;
    hub_secrets.create(&PostParams::default(), &plain).await?;

    // Changing its data on the hub propagates.
    let patch = json!({"data": {"url": b64("https://example.com/guestbook-v2.git")}});
    hub_secrets
        .patch(
            "repo-guestbook",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    wait_data(
        &spoke_secrets[0],
        "repo-guestbook",
        "url",
        "https://example.com/guestbook-v2.git",
        "data change on spoke 1",
    )
    .await?;
    assert!(
        spoke_secrets[1].get_opt("repo-guestbook").await?.is_none(),
        "the project does not apply to agent 2"
    );
    assert!(spoke_secrets[0].get_opt("not-a-repo").await?.is_none());

    // A local edit on the spoke is reverted to the hub's data.
    let edit = json!({"data": {"url": b64("https://evil.example.com/x.git")}});
    spoke_secrets[0]
        .patch(
            "repo-guestbook",
            &PatchParams::default(),
            &Patch::Merge(&edit),
        )
        .await?;
    wait_data(
        &spoke_secrets[0],
        "repo-guestbook",
        "url",
        "https://example.com/guestbook-v2.git",
        "local edit reverted on spoke 1",
    )
    .await?;

    // A local delete on the spoke is undone.
    spoke_secrets[0]
        .delete("repo-guestbook", &DeleteParams::default())
        .await?;
    wait_data(
        &spoke_secrets[0],
        "repo-guestbook",
        "url",
        "https://example.com/guestbook-v2.git",
        "local delete undone on spoke 1",
    )
    .await?;

    // Retargeting the project to agent 2 moves the Secret.
    let retarget = json!({"spec": {"destinations": [{"name": agents[1].name, "namespace": "*"}],
                                   "sourceNamespaces": [agents[1].name]}});
    hub_projects
        .patch("team-a", &PatchParams::default(), &Patch::Merge(&retarget))
        .await?;
    wait_data(
        &spoke_secrets[1],
        "repo-guestbook",
        "url",
        "https://example.com/guestbook-v2.git",
        "repository Secret moved to spoke 2",
    )
    .await?;
    wait_gone(
        &spoke_secrets[0],
        "repo-guestbook",
        "repository Secret left spoke 1",
    )
    .await?;

    // Deleting it on the hub removes it from the spoke.
    hub_secrets
        .delete("repo-guestbook", &DeleteParams::default())
        .await?;
    wait_gone(
        &spoke_secrets[1],
        "repo-guestbook",
        "repository Secret deleted on spoke 2",
    )
    .await?;
    Ok(())
}
