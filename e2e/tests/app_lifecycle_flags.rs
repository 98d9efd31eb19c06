//! Upstream's Application lifecycle controls on the real ground (real kube-apiservers, the real
//! agents and principals, the spoke's real Argo CD where a status decides):
//! - the skip-sync label `argocd-agent.argoproj-labs.io/ignore-sync: "true"`: a labelled hub
//!   AppProject, repository Secret or Application never reaches the managed agent, and a labelled
//!   spoke Application never reaches the hub from an autonomous agent, while unlabelled ones do
//!   (the positive control); removing the label starts the sync, adding it deletes the other
//!   side's copy, as upstream. Run with upstream's Go agent and Go principal across the wire;
//! - `--adoption-policy` and `--ignore-unmanaged-apps`: a spoke Application the hub did not create
//!   is left alone by default, as upstream's agent does (the hub's Application of that name is
//!   refused with an `AgentError`), adopted with `--adoption-policy=always`, and left alone again
//!   when `--ignore-unmanaged-apps` is added;
//! - `--source-uid-mismatch-policy` and the per-object annotation
//!   `argocd.argoproj.io/source-uid-mismatch-policy`: a spoke copy whose source uid is not its
//!   hub object's is deleted and created again (`recreate`, a new spoke uid) or updated in place
//!   (`upsert`, the same uid); the copy carries the principal's identity
//!   (`argocd.argoproj.io/principal-uid`) as upstream's agent stamps it;
//! - `--on-application-recreate`: an Application deleted on the spoke with Argo CD's cascade
//!   finalizer comes back with its last status; `ignore` leaves it OutOfSync (its stale operation
//!   state keeps automated sync from running), `clear-status` lets automated sync redeploy it,
//!   `resync` redeploys it even without an automated sync policy.

use std::time::Duration;

use argocd_agent_kube::skip_sync::SKIP_SYNC_LABEL;
use argocd_agent_proto::event::{
    MISMATCH_POLICY_ANNOTATION, PRINCIPAL_UID_ANNOTATION, SOURCE_UID_ANNOTATION,
};
use e2e::argocd::ArgoCd;
use e2e::gateway::{application_resource, appproject_resource, ensure_namespace, Pki};
use e2e::git_server::{demo_manifests, GitServer};
use e2e::scenario::{self, register_agent_cluster, wait_synced, SYNC_WAIT};
use e2e::sides::{AnyAgent, AnyPrincipal, Mode, Side};
use e2e::{shared_planes, wait_until, ControlPlane, TestContext};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::ResourceExt;
use serde_json::{json, Value};

/// How long an object that should appear may take.
const WAIT: Duration = Duration::from_secs(60);
/// The finalizer that makes Argo CD delete an Application's resources before the Application.
const BACKGROUND_CASCADE: &str = "resources-finalizer.argocd.argoproj.io/background";

/// A principal, an agent (with the spoke's Argo CD when a test needs its status) and a Git
/// server with the demo app, on the shared planes.
struct Cell {
    ctx: TestContext,
    name: String,
    principal_ns: String,
    spoke_ns: String,
    /// The spoke namespace the demo app deploys into.
    dest: String,
    spoke: &'static ControlPlane,
    hub_client: kube::Client,
    spoke_client: kube::Client,
    git: GitServer,
    /// The commit of the demo app's first version.
    first: String,
    argocd: Option<ArgoCd>,
    principal: AnyPrincipal,
    agent: AnyAgent,
    /// Applications in the agent's hub namespace.
    hub_apps: Api<DynamicObject>,
    /// Applications in the agent's Argo CD namespace on the spoke.
    spoke_apps: Api<DynamicObject>,
}

impl Cell {
    async fn start(
        scenario: &str,
        (principal, agent): (Side, Side),
        mode: Mode,
        with_argocd: bool,
        agent_args: &[&str],
    ) -> anyhow::Result<Cell> {
        let planes = shared_planes().await;
        let (hub, spoke) = match mode {
            Mode::Managed => (&planes.hub, &planes.spokes[1]),
            Mode::Autonomous => (&planes.hub, &planes.spokes[0]),
        };
        let ctx = TestContext::new(scenario)?;
        let pki = Pki::create(&ctx.dir.join("pki"))?;
        let name = ctx.unique("agent");
        pki.issue_agent(&name)?;
        let git = GitServer::start(&ctx.unique("git"))?;
        let first = git.commit("apps", "demo", &demo_manifests("v1"), "demo v1")?;
        let hub_client = hub.client().await?;
        let principal_ns = ctx.unique("hub-argocd");
        ensure_namespace(&hub_client, &principal_ns).await?;
        ensure_namespace(&hub_client, &name).await?;
        create(
            &hub_client,
            &principal_ns,
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
                "metadata": {"name": "default"},
                "spec": {"sourceRepos": ["*"], "sourceNamespaces": ["*"],
                         "destinations": [{"server": "*", "namespace": "*", "name": "*"}],
                         "clusterResourceWhitelist": [{"group": "*", "kind": "*"}]},
            }),
        )
        .await?;
        if mode == Mode::Autonomous {
            register_agent_cluster(&hub_client, &principal_ns, &name).await?;
        }
        let spoke_ns = ctx.unique("argocd");
        let argocd = if with_argocd {
            Some(ArgoCd::start_spoke(&ctx.suffix, &ctx.dir, spoke, &spoke_ns, &[]).await?)
        } else {
            None
        };
        let spoke_client = spoke.client().await?;
        ensure_namespace(&spoke_client, &spoke_ns).await?;
        let dest = ctx.unique("demo");
        ensure_namespace(&spoke_client, &dest).await?;
        let principal = AnyPrincipal::start(
            principal,
            &ctx.suffix,
            &ctx.dir,
            hub,
            &pki,
            &principal_ns,
            &[],
        )
        .await?;
        let agent = AnyAgent::start(
            agent,
            &name,
            &ctx.dir,
            spoke,
            &pki,
            &principal.address(),
            mode,
            &spoke_ns,
            argocd.as_ref(),
            agent_args,
        )
        .await?;
        Ok(Cell {
            hub_apps: Api::namespaced_with(hub_client.clone(), &name, &application_resource()),
            spoke_apps: Api::namespaced_with(
                spoke_client.clone(),
                &spoke_ns,
                &application_resource(),
            ),
            ctx,
            name,
            principal_ns,
            spoke_ns,
            dest,
            spoke,
            hub_client,
            spoke_client,
            git,
            first,
            argocd,
            principal,
            agent,
        })
    }

    fn logs(&self) -> String {
        format!(
            "--- principal ---\n{}\n--- agent ---\n{}\n{}",
            self.principal.process().log_tail(40),
            self.agent.process().log_tail(40),
            self.argocd
                .as_ref()
                .map(|a| a.log_tails(10))
                .unwrap_or_default()
        )
    }

    /// Application `name` of the demo manifests into the cell's destination, in `namespace`
    /// (automated sync, pruning), with `labels`.
    fn app(&self, name: &str, namespace: &str, labels: Value, finalizer: bool) -> DynamicObject {
        let mut app = scenario::demo_application(
            name,
            namespace,
            &self.git.url("apps"),
            json!({"server": "https://kubernetes.default.svc", "namespace": self.dest}),
        );
        app.metadata.labels = serde_json::from_value(labels).ok();
        if finalizer {
            app.metadata.finalizers = Some(vec![BACKGROUND_CASCADE.to_string()]);
        }
        app
    }

    /// Waits until `get` finds something; the error carries the cell's logs.
    async fn wait_for<T, F, Fut>(&self, what: &str, get: F) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
    {
        wait_until(what, WAIT, get)
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.logs()))
    }
}

/// Creates `obj` (JSON) in `namespace`, its kind's resource taken from `apiVersion`/`kind`.
async fn create(client: &kube::Client, namespace: &str, obj: Value) -> anyhow::Result<()> {
    let resource = match obj["kind"].as_str() {
        Some("AppProject") => appproject_resource(),
        Some("Application") => application_resource(),
        other => anyhow::bail!("no resource for kind {other:?}"),
    };
    Api::<DynamicObject>::namespaced_with(client.clone(), namespace, &resource)
        .create(&PostParams::default(), &serde_json::from_value(obj)?)
        .await?;
    Ok(())
}

fn skip_sync() -> Value {
    json!({SKIP_SYNC_LABEL: "true"})
}

fn annotation(obj: &DynamicObject, key: &str) -> Option<String> {
    obj.annotations().get(key).cloned()
}

// ---- skip-sync ---------------------------------------------------------------------------------

/// A managed agent gets the hub AppProject and repository Secret without the label (the positive
/// control, created after the labelled ones) and never the labelled ones; the label removed, the
/// AppProject reaches the spoke; added again, the spoke's copy is deleted (upstream's semantics).
async fn skip_sync_keeps_hub_objects_from_a_managed_agent(
    sides: (Side, Side),
    test: &str,
) -> anyhow::Result<()> {
    let cell = Cell::start(test, sides, Mode::Managed, false, &[]).await?;
    let projects: Api<DynamicObject> = Api::namespaced_with(
        cell.hub_client.clone(),
        &cell.principal_ns,
        &appproject_resource(),
    );
    let project = |name: &str, labels: Value| {
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": name, "labels": labels},
            "spec": {"sourceRepos": ["*"], "sourceNamespaces": [cell.name],
                     "destinations": [{"name": cell.name, "namespace": "*"}]},
        })
    };
    let skipped = cell.ctx.unique("skipped");
    let kept = cell.ctx.unique("kept");
    create(
        &cell.hub_client,
        &cell.principal_ns,
        project(&skipped, skip_sync()),
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(cell.hub_client.clone(), &cell.principal_ns);
    let repo = |name: &str, labels: Value| -> anyhow::Result<Secret> {
        let mut labels = labels;
        labels["argocd.argoproj.io/secret-type"] = json!("repository");
        Ok(serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "labels": labels},
            "stringData": {"type": "git", "url": cell.git.url("apps"), "project": kept},
        }))?)
    };
    let skipped_repo = cell.ctx.unique("skipped-repo");
    let kept_repo = cell.ctx.unique("kept-repo");
    secrets
        .create(&PostParams::default(), &repo(&skipped_repo, skip_sync())?)
        .await?;
    create(
        &cell.hub_client,
        &cell.principal_ns,
        project(&kept, json!({})),
    )
    .await?;
    secrets
        .create(&PostParams::default(), &repo(&kept_repo, json!({}))?)
        .await?;

    let spoke_projects: Api<DynamicObject> = Api::namespaced_with(
        cell.spoke_client.clone(),
        &cell.spoke_ns,
        &appproject_resource(),
    );
    let spoke_secrets: Api<Secret> = Api::namespaced(cell.spoke_client.clone(), &cell.spoke_ns);
    cell.wait_for("the unlabelled AppProject on the spoke", || async {
        Ok(spoke_projects.get_opt(&kept).await?)
    })
    .await?;
    cell.wait_for("the unlabelled repository Secret on the spoke", || async {
        Ok(spoke_secrets.get_opt(&kept_repo).await?)
    })
    .await?;
    anyhow::ensure!(
        spoke_projects.get_opt(&skipped).await?.is_none(),
        "the AppProject labelled skip-sync reached the spoke\n{}",
        cell.logs()
    );
    anyhow::ensure!(
        spoke_secrets.get_opt(&skipped_repo).await?.is_none(),
        "the repository Secret labelled skip-sync reached the spoke\n{}",
        cell.logs()
    );

    // The label removed: the AppProject starts syncing.
    projects
        .patch(
            &skipped,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {SKIP_SYNC_LABEL: null}}})),
        )
        .await?;
    cell.wait_for(
        "the AppProject whose label was removed on the spoke",
        || async { Ok(spoke_projects.get_opt(&skipped).await?) },
    )
    .await?;
    // Added again: gone from the spoke, as upstream's watch treats it as deleted.
    projects
        .patch(
            &skipped,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {SKIP_SYNC_LABEL: "true"}}})),
        )
        .await?;
    cell.wait_for(
        "the AppProject labelled again gone from the spoke",
        || async {
            Ok(spoke_projects
                .get_opt(&skipped)
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    anyhow::ensure!(
        spoke_projects.get_opt(&kept).await?.is_some(),
        "the unlabelled AppProject went too\n{}",
        cell.logs()
    );
    Ok(())
}

#[tokio::test]
async fn skip_sync_keeps_hub_objects_from_a_managed_agent_ours_principal_upstream_agent(
) -> anyhow::Result<()> {
    skip_sync_keeps_hub_objects_from_a_managed_agent(
        (Side::Ours, Side::Upstream),
        "skip_sync_hub_ours_upstream",
    )
    .await
}

#[tokio::test]
async fn skip_sync_keeps_hub_objects_from_a_managed_agent_ours_principal_ours_agent(
) -> anyhow::Result<()> {
    skip_sync_keeps_hub_objects_from_a_managed_agent(
        (Side::Ours, Side::Ours),
        "skip_sync_hub_ours_ours",
    )
    .await
}

/// A labelled hub Application stays on the hub while an unlabelled one (created after it) reaches
/// the managed agent; labelling that one deletes its spoke copy.
#[tokio::test]
async fn skip_sync_keeps_a_hub_application_from_a_managed_agent() -> anyhow::Result<()> {
    let cell = Cell::start(
        "skip_sync_app_managed",
        (Side::Ours, Side::Ours),
        Mode::Managed,
        false,
        &[],
    )
    .await?;
    let post = PostParams::default();
    cell.hub_apps
        .create(&post, &cell.app("skipped", &cell.name, skip_sync(), false))
        .await?;
    cell.hub_apps
        .create(&post, &cell.app("kept", &cell.name, json!({}), false))
        .await?;
    cell.wait_for("the unlabelled Application on the spoke", || async {
        Ok(cell.spoke_apps.get_opt("kept").await?)
    })
    .await?;
    anyhow::ensure!(
        cell.spoke_apps.get_opt("skipped").await?.is_none(),
        "the Application labelled skip-sync reached the spoke\n{}",
        cell.logs()
    );
    cell.hub_apps
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": skip_sync()}})),
        )
        .await?;
    cell.wait_for(
        "the Application labelled later gone from the spoke",
        || async {
            Ok(cell
                .spoke_apps
                .get_opt("kept")
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// An autonomous agent mirrors the unlabelled spoke Application (created after the labelled one)
/// on the hub and never the labelled one; labelling the mirrored one removes its mirror.
async fn skip_sync_keeps_a_spoke_application_from_the_hub(
    sides: (Side, Side),
    test: &str,
) -> anyhow::Result<()> {
    let cell = Cell::start(test, sides, Mode::Autonomous, false, &[]).await?;
    let post = PostParams::default();
    cell.spoke_apps
        .create(
            &post,
            &cell.app("skipped", &cell.spoke_ns, skip_sync(), false),
        )
        .await?;
    cell.spoke_apps
        .create(&post, &cell.app("kept", &cell.spoke_ns, json!({}), false))
        .await?;
    cell.wait_for(
        "the unlabelled spoke Application mirrored on the hub",
        || async { Ok(cell.hub_apps.get_opt("kept").await?) },
    )
    .await?;
    anyhow::ensure!(
        cell.hub_apps.get_opt("skipped").await?.is_none(),
        "the spoke Application labelled skip-sync was mirrored on the hub\n{}",
        cell.logs()
    );
    cell.spoke_apps
        .patch(
            "kept",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": skip_sync()}})),
        )
        .await?;
    cell.wait_for(
        "the mirror of the Application labelled later gone",
        || async { Ok(cell.hub_apps.get_opt("kept").await?.is_none().then_some(())) },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn skip_sync_keeps_a_spoke_application_from_the_hub_upstream_principal_ours_agent(
) -> anyhow::Result<()> {
    skip_sync_keeps_a_spoke_application_from_the_hub(
        (Side::Upstream, Side::Ours),
        "skip_sync_spoke_upstream_ours",
    )
    .await
}

#[tokio::test]
async fn skip_sync_keeps_a_spoke_application_from_the_hub_ours_principal_ours_agent(
) -> anyhow::Result<()> {
    skip_sync_keeps_a_spoke_application_from_the_hub(
        (Side::Ours, Side::Ours),
        "skip_sync_spoke_ours_ours",
    )
    .await
}

// ---- --ignore-unmanaged-apps -------------------------------------------------------------------

/// A spoke Application named like a new hub Application, not created from the hub: left alone by
/// default (upstream's agent never adopts one; the hub Application shows an `AgentError` naming
/// `--adoption-policy`), adopted with `--adoption-policy=always` (the positive control: the hub's
/// source uid lands on it), left alone again when `--ignore-unmanaged-apps` is added (the
/// `AgentError` names that flag).
#[tokio::test]
async fn unmanaged_applications_are_left_alone_unless_adoption_is_asked() -> anyhow::Result<()> {
    let (default, adopting, ignoring) = tokio::try_join!(
        Cell::start(
            "unmanaged_default",
            (Side::Ours, Side::Ours),
            Mode::Managed,
            false,
            &[]
        ),
        Cell::start(
            "unmanaged_adopted",
            (Side::Ours, Side::Ours),
            Mode::Managed,
            false,
            &["--adoption-policy=always"]
        ),
        Cell::start(
            "unmanaged_ignored",
            (Side::Ours, Side::Ours),
            Mode::Managed,
            false,
            &["--adoption-policy=always", "--ignore-unmanaged-apps"]
        ),
    )?;
    for cell in [&default, &adopting, &ignoring] {
        let post = PostParams::default();
        cell.spoke_apps
            .create(&post, &cell.app("local", &cell.spoke_ns, json!({}), false))
            .await?;
        cell.hub_apps
            .create(
                &post,
                &cell.app("local", &cell.name, json!({"from": "hub"}), false),
            )
            .await?;
    }
    let hub_uid = adopting
        .hub_apps
        .get("local")
        .await?
        .uid()
        .unwrap_or_default();
    adopting
        .wait_for("the local Application adopted by the hub's", || async {
            let app = adopting.spoke_apps.get("local").await?;
            Ok(
                (annotation(&app, SOURCE_UID_ANNOTATION).as_deref() == Some(hub_uid.as_str()))
                    .then_some(()),
            )
        })
        .await?;
    for (cell, flag) in [
        (&default, "--adoption-policy=always"),
        (&ignoring, "--ignore-unmanaged-apps"),
    ] {
        let condition = cell
            .wait_for("an AgentError on the hub Application", || async {
                let app = serde_json::to_value(cell.hub_apps.get("local").await?)?;
                Ok(app["status"]["conditions"].as_array().and_then(|c| {
                    c.iter()
                        .find(|c| c["type"] == "AgentError")
                        .map(|c| c["message"].as_str().unwrap_or_default().to_string())
                }))
            })
            .await?;
        anyhow::ensure!(
            condition.contains(flag),
            "the refusal names {flag}: {condition}"
        );
        let local = cell.spoke_apps.get("local").await?;
        anyhow::ensure!(
            annotation(&local, SOURCE_UID_ANNOTATION).is_none()
                && local.labels().get("from").is_none(),
            "the local Application was left alone: {:?}\n{}",
            local.metadata,
            cell.logs()
        );
    }
    Ok(())
}

// ---- --source-uid-mismatch-policy ---------------------------------------------------------------

/// The principal's identity, as it keeps it (ConfigMap `argocd-agent-principal-identity`).
async fn principal_identity(cell: &Cell) -> anyhow::Result<String> {
    let cms: Api<ConfigMap> = Api::namespaced(cell.hub_client.clone(), &cell.principal_ns);
    cell.wait_for("the principal's identity", || async {
        Ok(cms
            .get_opt("argocd-agent-principal-identity")
            .await?
            .and_then(|cm| cm.data?.get("principal-uid").cloned()))
    })
    .await
}

/// A hub Application reaches the spoke stamped with the hub uid and the principal's identity;
/// then the spoke copy's source uid is changed (as a stale copy of an older hub object would
/// carry). Returns (spoke uid before, spoke uid once the hub's source uid is back).
async fn mismatch_replaces(
    cell: &Cell,
    hub_annotations: Value,
) -> anyhow::Result<(String, String)> {
    let mut app = cell.app("app", &cell.name, json!({}), false);
    app.metadata.annotations = serde_json::from_value(hub_annotations)?;
    cell.hub_apps.create(&PostParams::default(), &app).await?;
    let hub_uid = cell.hub_apps.get("app").await?.uid().unwrap_or_default();
    let identity = principal_identity(cell).await?;
    let copy = cell
        .wait_for(
            "the spoke copy stamped with the principal's identity",
            || async {
                Ok(cell.spoke_apps.get_opt("app").await?.filter(|a| {
                    annotation(a, PRINCIPAL_UID_ANNOTATION).as_deref() == Some(identity.as_str())
                }))
            },
        )
        .await?;
    anyhow::ensure!(
        annotation(&copy, SOURCE_UID_ANNOTATION).as_deref() == Some(hub_uid.as_str()),
        "the spoke copy names its hub object: {:?}",
        copy.metadata.annotations
    );
    let before = copy.uid().unwrap_or_default();
    cell.spoke_apps
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {SOURCE_UID_ANNOTATION: "stale"}}})),
        )
        .await?;
    let after = cell
        .wait_for("the hub's source uid back on the spoke copy", || async {
            Ok(cell.spoke_apps.get_opt("app").await?.and_then(|a| {
                (annotation(&a, SOURCE_UID_ANNOTATION).as_deref() == Some(hub_uid.as_str()))
                    .then(|| a.uid().unwrap_or_default())
            }))
        })
        .await?;
    Ok((before, after))
}

/// Default `recreate`: a new spoke object; `--source-uid-mismatch-policy=upsert`: the same one;
/// the hub object's annotation overrides the flag either way.
#[tokio::test]
async fn source_uid_mismatch_policy_recreates_or_updates_in_place() -> anyhow::Result<()> {
    let sides = (Side::Ours, Side::Ours);
    let (recreating, upserting) = tokio::try_join!(
        Cell::start("mismatch_recreate", sides, Mode::Managed, false, &[]),
        Cell::start(
            "mismatch_upsert",
            sides,
            Mode::Managed,
            false,
            &["--source-uid-mismatch-policy=upsert"]
        ),
    )?;
    let ((before, after), (kept_before, kept_after)) = tokio::try_join!(
        mismatch_replaces(&recreating, json!({})),
        mismatch_replaces(&upserting, json!({})),
    )?;
    anyhow::ensure!(
        before != after,
        "recreate: the spoke copy was deleted and created again ({before})\n{}",
        recreating.logs()
    );
    anyhow::ensure!(
        kept_before == kept_after,
        "upsert: the spoke copy was updated in place ({kept_before} -> {kept_after})\n{}",
        upserting.logs()
    );
    recreating
        .hub_apps
        .delete("app", &DeleteParams::default())
        .await?;
    upserting
        .hub_apps
        .delete("app", &DeleteParams::default())
        .await?;
    for cell in [&recreating, &upserting] {
        cell.wait_for("the spoke copy deleted with its hub object", || async {
            Ok(cell
                .spoke_apps
                .get_opt("app")
                .await?
                .is_none()
                .then_some(()))
        })
        .await?;
    }
    // The per-object annotation wins over each agent's flag.
    let ((before, after), (kept_before, kept_after)) = tokio::try_join!(
        mismatch_replaces(&recreating, json!({MISMATCH_POLICY_ANNOTATION: "upsert"})),
        mismatch_replaces(&upserting, json!({MISMATCH_POLICY_ANNOTATION: "recreate"})),
    )?;
    anyhow::ensure!(
        before == after,
        "annotation upsert over --source-uid-mismatch-policy=recreate: updated in place\n{}",
        recreating.logs()
    );
    anyhow::ensure!(
        kept_before != kept_after,
        "annotation recreate over --source-uid-mismatch-policy=upsert: created again\n{}",
        upserting.logs()
    );
    Ok(())
}

// ---- --on-application-recreate ------------------------------------------------------------------

/// The demo app (cascade finalizer) synced on the spoke, then its `automated` sync policy set on
/// the hub (`null`: none; self-heal, which would sync again whatever the last operation was, off
/// otherwise). The spoke's Application is deleted there (Argo CD deletes demo-config first), and
/// the agent recreates it. Returns the recreated Application and the operation state it had
/// last before it was gone.
async fn delete_on_the_spoke(cell: &Cell, automated: Value) -> anyhow::Result<(Value, Value)> {
    cell.hub_apps
        .create(
            &PostParams::default(),
            &cell.app("demo", &cell.name, json!({}), true),
        )
        .await?;
    scenario::wait_greeting(cell.spoke, &cell.dest, "v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    wait_synced(
        &cell.hub_apps,
        "demo",
        &cell.first,
        "the hub Application Synced",
        || cell.logs(),
    )
    .await?;
    cell.hub_apps
        .patch(
            "demo",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"syncPolicy": {"automated": automated}}})),
        )
        .await?;
    let wanted = if automated.is_null() {
        Value::Null
    } else {
        json!(false)
    };
    cell.wait_for("the spoke copy with the new sync policy", || async {
        let app = serde_json::to_value(cell.spoke_apps.get("demo").await?)?;
        let now = if automated.is_null() {
            app.pointer("/spec/syncPolicy/automated")
                .cloned()
                .unwrap_or(Value::Null)
        } else {
            app.pointer("/spec/syncPolicy/automated/selfHeal")
                .cloned()
                .unwrap_or(Value::Null)
        };
        Ok((now == wanted).then_some(()))
    })
    .await?;
    let synced = serde_json::to_value(cell.spoke_apps.get("demo").await?)?;
    anyhow::ensure!(
        !synced["status"]["operationState"].is_null(),
        "the first sync left an operation state"
    );
    let old_uid = cell.spoke_apps.get("demo").await?.uid().unwrap_or_default();
    // The operation state the deleted Application had last: Argo CD may still finish an automated
    // sync it started before it saw the new policy, so it is read until the object is gone.
    let last_operation = std::sync::Mutex::new(synced["status"]["operationState"].clone());
    let spoke_app = || async {
        let app = cell.spoke_apps.get_opt("demo").await?;
        match &app {
            Some(a) if a.uid().as_deref() == Some(old_uid.as_str()) => {
                *last_operation.lock().expect("not poisoned") =
                    serde_json::to_value(a)?["status"]["operationState"].clone();
                Ok::<_, anyhow::Error>(None)
            }
            _ => Ok(app),
        }
    };
    cell.spoke_apps
        .delete("demo", &DeleteParams::default())
        .await?;
    let cms: Api<ConfigMap> = Api::namespaced(cell.spoke_client.clone(), &cell.dest);
    wait_until(
        "Argo CD's cascade to delete demo-config",
        SYNC_WAIT,
        || async {
            spoke_app().await?;
            Ok::<_, anyhow::Error>(cms.get_opt("demo-config").await?.is_none().then_some(()))
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    let recreated = wait_until(
        "the Application recreated on the spoke",
        SYNC_WAIT,
        || async {
            Ok::<_, anyhow::Error>(spoke_app().await?.map(serde_json::to_value).transpose()?)
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))?;
    let operation = last_operation.into_inner().expect("not poisoned");
    Ok((recreated, operation))
}

/// Waits until demo-config is back on the cell's spoke.
async fn wait_redeployed(cell: &Cell) -> anyhow::Result<()> {
    scenario::wait_greeting(cell.spoke, &cell.dest, "v1")
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", cell.logs()))
}

/// Whether the spoke's Application `demo` is OutOfSync with `operation` as its last operation
/// state (no operation ran since).
async fn stuck_with(cell: &Cell, operation: &Value) -> anyhow::Result<bool> {
    let app = serde_json::to_value(cell.spoke_apps.get("demo").await?)?;
    let cms: Api<ConfigMap> = Api::namespaced(cell.spoke_client.clone(), &cell.dest);
    Ok(app["status"]["sync"]["status"] == "OutOfSync"
        && app["status"]["operationState"] == *operation
        && cms.get_opt("demo-config").await?.is_none())
}

/// Automated sync without self-heal: `ignore` leaves the recreated Application with its stale operation state,
/// OutOfSync and not redeployed, while `clear-status` (the positive control, same steps at the
/// same time) lets automated sync redeploy it.
#[tokio::test]
async fn on_application_recreate_clear_status_lets_automated_sync_run_again() -> anyhow::Result<()>
{
    let sides = (Side::Ours, Side::Ours);
    let (ignoring, clearing) = tokio::try_join!(
        Cell::start("recreate_ignore", sides, Mode::Managed, true, &[]),
        Cell::start(
            "recreate_clear",
            sides,
            Mode::Managed,
            true,
            &["--on-application-recreate=clear-status"]
        ),
    )?;
    let ((ignored, ignored_op), (cleared, _)) = tokio::try_join!(
        delete_on_the_spoke(&ignoring, json!({"selfHeal": false})),
        delete_on_the_spoke(&clearing, json!({"selfHeal": false})),
    )?;
    // Both came back with the status they had (as upstream's agent recreates them).
    anyhow::ensure!(
        ignored["status"]["operationState"] == ignored_op,
        "recreated with its last operation state: {}",
        ignored["status"]
    );
    anyhow::ensure!(
        !cleared["status"].is_null(),
        "recreated with its last status: {cleared}"
    );
    wait_redeployed(&clearing).await?;
    ignoring
        .wait_for(
            "ignore: the recreated Application OutOfSync with its stale operation",
            || async { Ok(stuck_with(&ignoring, &ignored_op).await?.then_some(())) },
        )
        .await?;
    Ok(())
}

/// Without automated sync: `clear-status` leaves the recreated Application undeployed (nothing
/// syncs it), `resync` (the positive control, same steps at the same time) redeploys it.
#[tokio::test]
async fn on_application_recreate_resync_syncs_without_an_automated_policy() -> anyhow::Result<()> {
    let sides = (Side::Ours, Side::Ours);
    let (clearing, resyncing) = tokio::try_join!(
        Cell::start(
            "recreate_clear_manual",
            sides,
            Mode::Managed,
            true,
            &["--on-application-recreate=clear-status"]
        ),
        Cell::start(
            "recreate_resync",
            sides,
            Mode::Managed,
            true,
            &["--on-application-recreate=resync"]
        ),
    )?;
    let ((_, _), (_, _)) = tokio::try_join!(
        delete_on_the_spoke(&clearing, Value::Null),
        delete_on_the_spoke(&resyncing, Value::Null),
    )?;
    wait_redeployed(&resyncing).await?;
    clearing
        .wait_for(
            "clear-status: the recreated Application OutOfSync, its state cleared",
            || async {
                let app = serde_json::to_value(clearing.spoke_apps.get("demo").await?)?;
                let cms: Api<ConfigMap> =
                    Api::namespaced(clearing.spoke_client.clone(), &clearing.dest);
                Ok((app["status"]["sync"]["status"] == "OutOfSync"
                    && app["status"]["operationState"].is_null()
                    && cms.get_opt("demo-config").await?.is_none())
                .then_some(()))
            },
        )
        .await?;
    Ok(())
}
