//! The real test ground, each peer proven on its own and then together with ours: real Argo CD
//! (application-controller + repo-server with a password-protected Redis) syncing an app from a
//! local Git server on a spoke; upstream argocd-agent's principal and agent talking to each other;
//! and every managed pairing of {our, upstream} principal × {our, upstream} agent carrying a hub
//! Application to a spoke where the real Argo CD syncs it, with its real status back on the hub.
//! Nobody here writes what Argo CD or an agent would write.

use std::time::Duration;

use e2e::argocd::ArgoCd;
use e2e::gateway::{
    application_resource, appproject_resource, ensure_namespace, Agent, Pki, Principal,
};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::upstream::{UpstreamAgent, UpstreamPrincipal};
use e2e::{shared_planes, wait_until, ControlPlane, ManagedProcess, TestContext};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{json, Value};

/// Generous: a first sync clones, renders and applies (seconds), status then crosses the stream.
const SYNC_WAIT: Duration = Duration::from_secs(120);
const IN_CLUSTER: &str = "https://kubernetes.default.svc";

/// An Application of the demo manifests at `repo_url` (path `demo`), synced automatically into
/// `dest_namespace` of the cluster that runs it.
fn demo_application(
    name: &str,
    namespace: &str,
    repo_url: &str,
    dest_namespace: &str,
) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo_url, "path": "demo", "targetRevision": "main"},
            "destination": {"server": IN_CLUSTER, "namespace": dest_namespace},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true},
                           "syncOptions": ["PrunePropagationPolicy=background"]},
        }
    }))
    .expect("valid Application")
}

/// `(sync status, health status, synced revision)` of an Application as JSON.
fn sync_state(app: &Value) -> (String, String, String) {
    let s = |p: &str| {
        app.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    (
        s("/status/sync/status"),
        s("/status/health/status"),
        s("/status/sync/revision"),
    )
}

/// Waits until the Application `name` in `api` is Synced and Healthy at `revision`.
async fn wait_synced(
    api: &Api<DynamicObject>,
    name: &str,
    revision: &str,
    what: &str,
    logs: impl Fn() -> String,
) -> anyhow::Result<Value> {
    wait_until(what, SYNC_WAIT, || async {
        let app = api
            .get_opt(name)
            .await?
            .map(serde_json::to_value)
            .transpose()?;
        Ok::<_, anyhow::Error>(app.filter(|a| {
            let (sync, health, rev) = sync_state(a);
            sync == "Synced" && health == "Healthy" && rev == revision
        }))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))
}

/// Waits until ConfigMap `demo-config` in `namespace` of `plane` says `greeting`.
async fn wait_greeting(
    plane: &ControlPlane,
    namespace: &str,
    greeting: &str,
) -> anyhow::Result<()> {
    let cms: Api<ConfigMap> = Api::namespaced(plane.client().await?, namespace);
    wait_until(
        &format!(
            "demo-config in {namespace} on {} says {greeting}",
            plane.name
        ),
        SYNC_WAIT,
        || async {
            Ok::<_, kube::Error>(
                cms.get_opt("demo-config")
                    .await?
                    .and_then(|cm| cm.data)
                    .is_some_and(|d| d.get("greeting").map(String::as_str) == Some(greeting))
                    .then_some(()),
            )
        },
    )
    .await
}

#[tokio::test]
async fn argocd_syncs_a_git_app_on_a_spoke() -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let spoke = &planes.spokes[0];
    let ctx = TestContext::new("argocd_syncs_a_git_app_on_a_spoke")?;
    let git = GitServer::start(&ctx.unique("git"))?;
    let first = git.commit("apps", "demo", &demo_manifests("hello"), "demo v1")?;
    let ns = ctx.unique("argocd");
    let argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &ns, &[]).await?;
    let dest = ctx.unique("demo");
    ensure_namespace(&spoke.client().await?, &dest).await?;

    let apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.client().await?, &ns, &application_resource());
    apps.create(
        &PostParams::default(),
        &demo_application("demo", &ns, &git.url("apps"), &dest),
    )
    .await?;
    wait_greeting(spoke, &dest, "hello")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(40)))?;
    wait_synced(
        &apps,
        "demo",
        &first,
        "demo Synced+Healthy at the first commit",
        || argocd.log_tails(20),
    )
    .await?;

    // A new commit is picked up and applied by the controller on its own (automated sync).
    let second = git.commit("apps", "demo", &demo_manifests("again"), "demo v2")?;
    wait_greeting(spoke, &dest, "again")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", argocd.log_tails(40)))?;
    wait_synced(
        &apps,
        "demo",
        &second,
        "demo Synced+Healthy at the second commit",
        || argocd.log_tails(20),
    )
    .await?;
    Ok(())
}

/// Which implementation plays a part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Ours,
    Upstream,
}

/// Keeps whichever principal runs alive for the test.
enum AnyPrincipal {
    Ours(Principal),
    Upstream(UpstreamPrincipal),
}

impl AnyPrincipal {
    fn address(&self) -> String {
        match self {
            AnyPrincipal::Ours(p) => p.address(),
            AnyPrincipal::Upstream(p) => p.address(),
        }
    }
    fn process(&self) -> &ManagedProcess {
        match self {
            AnyPrincipal::Ours(p) => &p.process,
            AnyPrincipal::Upstream(p) => &p.process,
        }
    }
}

/// The managed user story across one pairing: an Application created on the hub reaches the agent's
/// spoke, the spoke's real Argo CD syncs it from Git, and its real status comes back to the hub.
async fn managed_app_syncs_through(principal: Side, agent: Side) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let (hub, spoke) = (&planes.hub, &planes.spokes[1]);
    let test = format!("managed_{principal:?}_principal_{agent:?}_agent").to_lowercase();
    let ctx = TestContext::new(&test)?;
    let pki = Pki::create(&ctx.dir.join("pki"))?;
    let name = ctx.unique("agent");
    pki.issue_agent(&name)?;
    let git = GitServer::start(&ctx.unique("git"))?;
    let revision = git.commit("apps", "demo", &demo_manifests("managed"), "demo")?;

    // Hub: the principal's namespace with the default project every agent gets, and the agent's
    // namespace holding its Applications.
    let hub_client = hub.client().await?;
    let principal_ns = ctx.unique("hub-argocd");
    ensure_namespace(&hub_client, &principal_ns).await?;
    ensure_namespace(&hub_client, &name).await?;
    let projects: Api<DynamicObject> =
        Api::namespaced_with(hub_client.clone(), &principal_ns, &appproject_resource());
    projects
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "default", "namespace": principal_ns},
                "spec": {"sourceRepos": ["*"], "sourceNamespaces": ["*"],
                         "destinations": [{"server": "*", "namespace": "*", "name": "*"}],
                         "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
            }))?,
        )
        .await?;

    // Spoke: Argo CD in the agent's namespace.
    let spoke_ns = ctx.unique("argocd");
    let argocd = ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?;
    let dest = ctx.unique("demo");
    ensure_namespace(&spoke.client().await?, &dest).await?;

    let principal = match principal {
        Side::Ours => AnyPrincipal::Ours(
            Principal::start(&ctx.suffix, &ctx.dir, hub, &pki, &principal_ns, &[]).await?,
        ),
        Side::Upstream => AnyPrincipal::Upstream(
            UpstreamPrincipal::start(&ctx.suffix, &ctx.dir, hub, &pki, &principal_ns, None, &[])
                .await?,
        ),
    };
    let redis = argocd.redis_endpoint().expect("spoke Argo CD has a Redis");
    let agent_process = match agent {
        Side::Ours => {
            Agent::start(
                &name,
                &ctx.dir,
                spoke,
                &pki,
                &principal.address(),
                &spoke_ns,
                &[],
            )
            .await?
            .process
        }
        Side::Upstream => {
            UpstreamAgent::start(
                &name,
                &ctx.dir,
                spoke,
                &pki,
                &principal.address(),
                "managed",
                &spoke_ns,
                Some((&redis.address, redis.password.as_deref())),
                &[],
            )
            .await?
            .process
        }
    };
    let logs = || {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}\n{}",
            principal.process().log_tail(25),
            agent_process.log_tail(25),
            argocd.log_tails(10)
        )
    };

    let hub_apps: Api<DynamicObject> =
        Api::namespaced_with(hub_client, &name, &application_resource());
    hub_apps
        .create(
            &PostParams::default(),
            &demo_application("demo", &name, &git.url("apps"), &dest),
        )
        .await?;
    let spoke_apps: Api<DynamicObject> =
        Api::namespaced_with(spoke.client().await?, &spoke_ns, &application_resource());
    wait_until("the hub Application on the spoke", SYNC_WAIT, || async {
        Ok::<_, kube::Error>(spoke_apps.get_opt("demo").await?.map(|_| ()))
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    wait_greeting(spoke, &dest, "managed")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", logs()))?;
    wait_synced(
        &hub_apps,
        "demo",
        &revision,
        "the spoke's real Synced+Healthy status on the hub Application",
        logs,
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn upstream_agent_and_upstream_principal_carry_a_managed_app() -> anyhow::Result<()> {
    managed_app_syncs_through(Side::Upstream, Side::Upstream).await
}

#[tokio::test]
async fn upstream_agent_on_our_principal_carries_a_managed_app() -> anyhow::Result<()> {
    managed_app_syncs_through(Side::Ours, Side::Upstream).await
}

#[tokio::test]
async fn our_agent_on_an_upstream_principal_carries_a_managed_app() -> anyhow::Result<()> {
    managed_app_syncs_through(Side::Upstream, Side::Ours).await
}

#[tokio::test]
async fn our_agent_on_our_principal_carries_a_managed_app_that_real_argocd_syncs(
) -> anyhow::Result<()> {
    managed_app_syncs_through(Side::Ours, Side::Ours).await
}
