//! The usual cast of a gateway test on the shared planes: one `argocd-principal` on the hub and
//! one `argocd-agent` per spoke, all connected, with the test's context and PKI kept alive beside
//! them. Tests that need other shapes (HA replicas, raw-protocol clients) build their own.

use kube::api::{Api, DynamicObject};

use crate::gateway::{application_resource, ensure_namespace, Agent, Pki, Principal};
use crate::raw_agent::LonePrincipal;
use crate::shared::{SharedPlanes, TestContext};

/// One agent of a [`Fleet`]: its name is `<prefix>-<test suffix>`.
#[derive(Debug, Clone, Copy)]
pub struct FleetAgent<'a> {
    /// Name prefix (the agent's certificate CN and hub namespace are the unique name made of it).
    pub prefix: &'a str,
    /// Autonomous (`--mode=autonomous`, hub namespace left for the principal to create) rather
    /// than managed (hub namespace created by the test, as an operator would).
    pub autonomous: bool,
}

impl<'a> FleetAgent<'a> {
    /// A managed agent named after `prefix`.
    pub fn managed(prefix: &'a str) -> Self {
        FleetAgent {
            prefix,
            autonomous: false,
        }
    }

    /// An autonomous agent named after `prefix`.
    pub fn autonomous(prefix: &'a str) -> Self {
        FleetAgent {
            prefix,
            autonomous: true,
        }
    }
}

/// A principal and its agents (agent `i` on spoke `i`) for one test; every process stops when
/// it is dropped.
pub struct Fleet {
    /// The test's context (names, directory, log tails on failure).
    pub ctx: TestContext,
    /// The PKI the principal and agents use.
    pub pki: Pki,
    /// The principal, in namespace `argocd-<suffix>` on the hub.
    pub principal: Principal,
    /// The agents, in spoke order; each keeps its Applications in `spoke-argocd-<suffix>`.
    pub agents: Vec<Agent>,
}

impl Fleet {
    /// A principal and two managed agents, `agent1` and `agent2`, connected.
    pub async fn start(test: &str, planes: &'static SharedPlanes) -> anyhow::Result<Fleet> {
        Self::start_with(
            test,
            planes,
            &[],
            &[FleetAgent::managed("agent1"), FleetAgent::managed("agent2")],
        )
        .await
    }

    /// A principal started with `principal_extra` flags and `agents` (at most one per spoke),
    /// and waits until every agent is connected.
    pub async fn start_with(
        test: &str,
        planes: &'static SharedPlanes,
        principal_extra: &[&str],
        agents: &[FleetAgent<'_>],
    ) -> anyhow::Result<Fleet> {
        anyhow::ensure!(
            agents.len() <= planes.spokes.len(),
            "{} agents for {} spokes",
            agents.len(),
            planes.spokes.len()
        );
        let LonePrincipal {
            ctx,
            pki,
            principal,
        } = LonePrincipal::start(test, principal_extra).await?;
        let hub = planes.hub.client().await?;
        let mut started = Vec::new();
        for (plan, spoke) in agents.iter().zip(&planes.spokes) {
            let name = ctx.unique(plan.prefix);
            pki.issue_agent(&name)?;
            if !plan.autonomous {
                ensure_namespace(&hub, &name).await?;
            }
            let mode: &[&str] = if plan.autonomous {
                &["--mode=autonomous"]
            } else {
                &[]
            };
            let agent = Agent::start(
                &name,
                &ctx.dir,
                spoke,
                &pki,
                &principal.address(),
                &ctx.unique("spoke-argocd"),
                mode,
            )
            .await?;
            started.push(agent);
        }
        for a in &started {
            a.wait_connected().await?;
        }
        Ok(Fleet {
            ctx,
            pki,
            principal,
            agents: started,
        })
    }

    /// Applications of agent `agent` on the hub (its namespace there).
    pub async fn hub_apps(
        &self,
        planes: &SharedPlanes,
        agent: usize,
    ) -> anyhow::Result<Api<DynamicObject>> {
        Ok(Api::namespaced_with(
            planes.hub.client().await?,
            &self.agents[agent].name,
            &application_resource(),
        ))
    }

    /// Applications of agent `agent` on its spoke.
    pub async fn spoke_apps(
        &self,
        planes: &SharedPlanes,
        agent: usize,
    ) -> anyhow::Result<Api<DynamicObject>> {
        Ok(Api::namespaced_with(
            planes.spokes[agent].client().await?,
            &self.agents[agent].namespace,
            &application_resource(),
        ))
    }
}
