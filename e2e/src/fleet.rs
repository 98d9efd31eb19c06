//! The usual cast of a gateway test on the shared planes: one `argocd-principal` on the hub and
//! one `argocd-agent` per spoke, all connected, with the test's context and PKI kept alive beside
//! them, under either of upstream's two ways of mapping hub Applications to agents ([`Mapping`]).
//! Tests that need other shapes (HA replicas, raw-protocol clients) build their own.

use kube::api::{Api, DynamicObject};
use serde_json::json;

use crate::gateway::{application, application_resource, ensure_namespace, Agent, Pki, Principal};
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

/// How the principal and its managed agents map hub Applications to agents (upstream's CI runs its
/// managed suite under both).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// The default: an agent's Applications live in the hub namespace named after it, and the
    /// agent keeps them in its own `--namespace` on the spoke.
    Namespace,
    /// `--destination-based-mapping` on the principal and the managed agents: every agent's
    /// Applications live in one hub namespace of the test's (`apps-<suffix>`, no agent's name),
    /// `spec.destination.name` picks the agent, and the agent keeps each Application in that
    /// namespace on its spoke, creating it (`--create-namespace`, admitted by
    /// `--allowed-namespaces`).
    Destination,
}

impl Mapping {
    /// The principal's flags for this mapping.
    pub fn principal_args(self) -> &'static [&'static str] {
        match self {
            Mapping::Namespace => &[],
            Mapping::Destination => &["--destination-based-mapping"],
        }
    }

    /// A managed agent's flags for this mapping, its Applications living in hub namespace
    /// `apps_namespace` (destination mapping).
    pub fn managed_agent_args(self, apps_namespace: &str) -> Vec<String> {
        match self {
            Mapping::Namespace => Vec::new(),
            Mapping::Destination => vec![
                "--destination-based-mapping".into(),
                "--create-namespace".into(),
                format!("--allowed-namespaces={apps_namespace}"),
            ],
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
    /// The agents, in spoke order; each runs in `spoke-argocd-<suffix>` on its spoke.
    pub agents: Vec<Agent>,
    /// How hub Applications map to the agents.
    pub mapping: Mapping,
    /// The hub namespace of every agent's Applications under [`Mapping::Destination`]
    /// (`apps-<suffix>`, created on the hub only: each agent creates it on its spoke).
    pub apps_namespace: String,
}

impl Fleet {
    /// A principal and two managed agents, `agent1` and `agent2`, connected (namespace mapping).
    pub async fn start(test: &str, planes: &'static SharedPlanes) -> anyhow::Result<Fleet> {
        Self::start_mapped(test, planes, Mapping::Namespace).await
    }

    /// [`Fleet::start`] under `mapping`.
    pub async fn start_mapped(
        test: &str,
        planes: &'static SharedPlanes,
        mapping: Mapping,
    ) -> anyhow::Result<Fleet> {
        Self::start_in(
            test,
            planes,
            mapping,
            &[],
            &[FleetAgent::managed("agent1"), FleetAgent::managed("agent2")],
        )
        .await
    }

    /// A principal started with `principal_extra` flags and `agents` (at most one per spoke),
    /// and waits until every agent is connected (namespace mapping).
    pub async fn start_with(
        test: &str,
        planes: &'static SharedPlanes,
        principal_extra: &[&str],
        agents: &[FleetAgent<'_>],
    ) -> anyhow::Result<Fleet> {
        Self::start_in(test, planes, Mapping::Namespace, principal_extra, agents).await
    }

    /// [`Fleet::start_with`] under `mapping` (autonomous agents get no mapping flags: upstream
    /// refuses destination mapping for them).
    pub async fn start_in(
        test: &str,
        planes: &'static SharedPlanes,
        mapping: Mapping,
        principal_extra: &[&str],
        agents: &[FleetAgent<'_>],
    ) -> anyhow::Result<Fleet> {
        anyhow::ensure!(
            agents.len() <= planes.spokes.len(),
            "{} agents for {} spokes",
            agents.len(),
            planes.spokes.len()
        );
        let principal_args: Vec<&str> = mapping
            .principal_args()
            .iter()
            .chain(principal_extra)
            .copied()
            .collect();
        let LonePrincipal {
            ctx,
            pki,
            principal,
        } = LonePrincipal::start(test, &principal_args).await?;
        let hub = planes.hub.client().await?;
        let apps_namespace = ctx.unique("apps");
        if mapping == Mapping::Destination {
            ensure_namespace(&hub, &apps_namespace).await?;
        }
        let managed_args = mapping.managed_agent_args(&apps_namespace);
        let mut started = Vec::new();
        for (plan, spoke) in agents.iter().zip(&planes.spokes) {
            let name = ctx.unique(plan.prefix);
            pki.issue_agent(&name)?;
            if !plan.autonomous && mapping == Mapping::Namespace {
                ensure_namespace(&hub, &name).await?;
            }
            let args: Vec<&str> = if plan.autonomous {
                vec!["--mode=autonomous"]
            } else {
                managed_args.iter().map(String::as_str).collect()
            };
            let agent = Agent::start(
                &name,
                &ctx.dir,
                spoke,
                &pki,
                &principal.address(),
                &ctx.unique("spoke-argocd"),
                &args,
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
            mapping,
            apps_namespace,
        })
    }

    /// The hub namespace of agent `agent`'s Applications: its name (namespace mapping) or the
    /// shared Applications' namespace (destination mapping).
    pub fn hub_namespace(&self, agent: usize) -> &str {
        match self.mapping {
            Mapping::Namespace => &self.agents[agent].name,
            Mapping::Destination => &self.apps_namespace,
        }
    }

    /// The spoke namespace where agent `agent` keeps its Applications: its `--namespace`
    /// (namespace mapping) or, the hub namespace being kept, the Applications' namespace.
    pub fn spoke_namespace(&self, agent: usize) -> &str {
        match self.mapping {
            Mapping::Namespace => &self.agents[agent].namespace,
            Mapping::Destination => &self.apps_namespace,
        }
    }

    /// A minimal hub Application `name` for agent `agent` at `revision`: in the agent's hub
    /// namespace, or (destination mapping) in the Applications' namespace with
    /// `spec.destination.name` naming the agent.
    pub fn application(&self, name: &str, agent: usize, revision: &str) -> DynamicObject {
        let mut app = application(name, self.hub_namespace(agent), revision);
        if self.mapping == Mapping::Destination {
            app.data["spec"]["destination"]["name"] = json!(self.agents[agent].name);
        }
        app
    }

    /// Applications of agent `agent` on the hub (see [`Fleet::hub_namespace`]).
    pub async fn hub_apps(
        &self,
        planes: &SharedPlanes,
        agent: usize,
    ) -> anyhow::Result<Api<DynamicObject>> {
        Ok(Api::namespaced_with(
            planes.hub.client().await?,
            self.hub_namespace(agent),
            &application_resource(),
        ))
    }

    /// Applications of agent `agent` on its spoke (see [`Fleet::spoke_namespace`]).
    pub async fn spoke_apps(
        &self,
        planes: &SharedPlanes,
        agent: usize,
    ) -> anyhow::Result<Api<DynamicObject>> {
        Ok(Api::namespaced_with(
            planes.spokes[agent].client().await?,
            self.spoke_namespace(agent),
            &application_resource(),
        ))
    }
}
