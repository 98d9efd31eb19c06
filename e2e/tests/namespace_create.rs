//! The principal's creation of autonomous agents' hub namespaces on a real kube-apiserver:
//! `--namespace-create-pattern` decides which names it creates (a refused agent is told why, and
//! connects once an operator creates the namespace), `--namespace-create-labels` labels what it
//! creates.

use std::time::Duration;

use e2e::gateway::Agent;
use e2e::raw_agent::LonePrincipal;
use e2e::{shared_planes, wait_until};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, ObjectMeta, PostParams};

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn only_names_matching_the_pattern_are_created_and_they_carry_the_labels(
) -> anyhow::Result<()> {
    let planes = shared_planes().await;
    let LonePrincipal {
        ctx,
        pki,
        principal,
    } = LonePrincipal::start(
        "namespace_create",
        &[
            "--namespace-create-enable",
            "--namespace-create-pattern=^edge-",
            "--namespace-create-labels=team=edge,example.com/tier=spoke",
        ],
    )
    .await?;
    let hub_namespaces: Api<Namespace> = Api::all(planes.hub.client().await?);
    let (edge, core) = (ctx.unique("edge"), ctx.unique("core"));
    let mut agents = Vec::new();
    for (name, spoke) in [(&edge, 0), (&core, 1)] {
        pki.issue_agent(name)?;
        agents.push(
            Agent::start(
                name,
                &ctx.dir,
                &planes.spokes[spoke],
                &pki,
                &principal.address(),
                &ctx.unique("spoke-argocd"),
                &["--mode=autonomous"],
            )
            .await?,
        );
    }
    let (edge_agent, core_agent) = (&agents[0], &agents[1]);

    // Positive control: the matching agent connects into a namespace the principal created,
    // labelled as asked.
    edge_agent.wait_connected().await?;
    let created = hub_namespaces.get(&edge).await?;
    let labels = created.metadata.labels.unwrap_or_default();
    assert_eq!(labels.get("team").map(String::as_str), Some("edge"));
    assert_eq!(
        labels.get("example.com/tier").map(String::as_str),
        Some("spoke")
    );

    // The other name does not match: refused with the reason, in both logs, and not created.
    wait_until("refusal explained in the agent log", WAIT, || async {
        Ok::<_, anyhow::Error>(
            core_agent
                .process
                .log_tail(200)
                .contains("does not match --namespace-create-pattern")
                .then_some(()),
        )
    })
    .await?;
    let principal_log = principal.process.log_tail(400);
    assert!(
        principal_log.contains("refusing an autonomous agent") && principal_log.contains(&core),
        "{principal_log}"
    );
    assert!(
        hub_namespaces.get_opt(&core).await?.is_none(),
        "the principal created {core} although the pattern refuses it"
    );

    // Once an operator creates the namespace, the refused agent connects.
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(core.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    hub_namespaces.create(&PostParams::default(), &ns).await?;
    core_agent.wait_connected().await?;
    Ok(())
}
