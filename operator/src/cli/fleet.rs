//! `argocd-agentctl fleet status`: one line per agent of the fleet, joined from the Argo CD
//! cluster secrets (registration, resource-proxy certificate expiry), the GitOpsClusters' status
//! (mode, onboarding phase, agent readiness) and, when `--metrics-url` is given, the principal's
//! metrics (connection, undelivered events per agent).
//!
//! Owns the join and its text/JSON rendering; reading is all it does.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::{kubeconfig, CliError, OutputFormat};
use crate::gitops::crd::GitOpsCluster;
use crate::registration::AgentRegistry;

/// `fleet` subcommands.
#[derive(Subcommand, Debug)]
pub enum FleetCommand {
    /// Show every agent: connected, mode, phase, queue depth, certificate expiry.
    Status(FleetStatusArgs),
}

/// `fleet status` flags.
#[derive(Args, Debug)]
pub struct FleetStatusArgs {
    /// Kubeconfig of the hub cluster.
    #[arg(long, env = "ARGOCD_AGENTCTL_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context of the hub cluster.
    #[arg(long, env = "ARGOCD_AGENTCTL_CONTEXT", value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of the hub Argo CD (where the cluster secrets are).
    #[arg(
        long,
        short = 'n',
        env = "ARGOCD_AGENTCTL_NAMESPACE",
        default_value = "argocd",
        value_name = "NS"
    )]
    pub namespace: String,
    /// The principal's metrics endpoint, e.g. http://127.0.0.1:8000/metrics.
    #[arg(long, value_name = "URL")]
    pub metrics_url: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// One agent of the fleet.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct FleetAgent {
    /// Agent (= managed cluster) name.
    pub name: String,
    /// Connected to the principal, if metrics were read and say so.
    pub connected: Option<bool>,
    /// Agent mode from the GitOpsCluster.
    pub mode: String,
    /// Onboarding phase from the GitOpsCluster.
    pub phase: String,
    /// Owning GitOpsCluster.
    pub gitops_cluster: String,
    /// Whether a cluster secret exists.
    pub registered: bool,
    /// Resources with undelivered events (principal outbox), if metrics were read.
    pub queue_depth: Option<u64>,
    /// Last event the principal sent or received for the agent, if the metrics have it.
    pub last_event: Option<String>,
    /// End of validity of the resource-proxy client certificate.
    pub cert_expiry: Option<String>,
}

/// Per-agent values from a Prometheus text exposition: `metric{...agent_name="x"...} value`.
pub fn per_agent_metric(text: &str, metric: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(metric)) {
        let Some((labels, value)) = line[metric.len()..].rsplit_once(' ') else {
            continue;
        };
        if !labels.starts_with('{') {
            continue;
        }
        let agent = labels
            .split("agent_name=\"")
            .nth(1)
            .and_then(|r| r.split('"').next());
        if let (Some(agent), Ok(v)) = (agent, value.trim().parse::<f64>()) {
            *out.entry(agent.to_owned()).or_default() += v;
        }
    }
    out
}

async fn fetch_metrics(url: &str) -> Result<String, CliError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        CliError::usage(format!(
            "--metrics-url {url}: only http:// URLs are supported"
        ))
    })?;
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/metrics".into()));
    let mut s = tokio::net::TcpStream::connect(host)
        .await
        .map_err(|e| CliError::runtime(format!("--metrics-url {url}: {e}")))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .map_err(|e| CliError::runtime(format!("--metrics-url {url}: {e}")))?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .await
        .map_err(|e| CliError::runtime(format!("--metrics-url {url}: {e}")))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// Collects the fleet.
pub async fn fleet_status(
    client: &kube::Client,
    argocd_namespace: &str,
    metrics: Option<&str>,
) -> Result<Vec<FleetAgent>, CliError> {
    let mut agents: BTreeMap<String, FleetAgent> = BTreeMap::new();
    for c in AgentRegistry::new(client.clone(), argocd_namespace)
        .list()
        .await?
    {
        let a = agents.entry(c.agent.to_string()).or_default();
        a.registered = true;
        a.cert_expiry = c.client_cert.map(|i| i.not_after.to_rfc3339());
    }
    let gocs: Api<GitOpsCluster> = Api::all(client.clone());
    // A hub without the GitOpsCluster CRD has agents registered by hand only.
    if let Ok(list) = gocs.list(&ListParams::default()).await {
        for g in list.items {
            let owner = format!(
                "{}/{}",
                g.metadata.namespace.clone().unwrap_or_default(),
                g.metadata.name.clone().unwrap_or_default()
            );
            for c in g.status.map(|s| s.clusters).unwrap_or_default() {
                if c.phase == "Conflict" {
                    continue;
                }
                let a = agents.entry(c.name.clone()).or_default();
                a.mode = c.mode;
                a.phase = c.phase;
                a.gitops_cluster = owner.clone();
                if a.cert_expiry.is_none() {
                    a.cert_expiry = c.certificate_not_after;
                }
            }
        }
    }
    if let Some(url) = metrics {
        let text = fetch_metrics(url).await?;
        let queue = per_agent_metric(&text, "argocd_principal_outbox_resources");
        let connected = per_agent_metric(&text, "argocd_principal_agent_connected");
        for (name, a) in agents.iter_mut() {
            a.queue_depth = Some(queue.get(name).copied().unwrap_or(0.0) as u64);
            a.connected = connected.get(name).map(|v| *v > 0.0);
        }
    }
    Ok(agents
        .into_iter()
        .map(|(name, mut a)| {
            a.name = name;
            a
        })
        .collect())
}

fn dash<T: ToString>(v: &Option<T>) -> String {
    v.as_ref()
        .map(|v| v.to_string())
        .unwrap_or_else(|| "-".into())
}

/// Renders the fleet as a table.
pub fn render_text(agents: &[FleetAgent]) -> String {
    let mut out = format!(
        "{:<24} {:<10} {:<11} {:<10} {:<11} {:<6} {:<12} {}\n",
        "AGENT", "CONNECTED", "MODE", "PHASE", "REGISTERED", "QUEUE", "LAST EVENT", "CERT EXPIRY"
    );
    for a in agents {
        out.push_str(&format!(
            "{:<24} {:<10} {:<11} {:<10} {:<11} {:<6} {:<12} {}\n",
            a.name,
            dash(&a.connected),
            if a.mode.is_empty() { "-" } else { &a.mode },
            if a.phase.is_empty() { "-" } else { &a.phase },
            a.registered,
            dash(&a.queue_depth),
            dash(&a.last_event),
            dash(&a.cert_expiry)
        ));
    }
    out
}

/// Runs a `fleet` command.
pub async fn run(cmd: FleetCommand) -> Result<(), CliError> {
    match cmd {
        FleetCommand::Status(args) => {
            let client =
                kubeconfig::client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
            let agents =
                fleet_status(&client, &args.namespace, args.metrics_url.as_deref()).await?;
            match args.output {
                OutputFormat::Text => print!("{}", render_text(&agents)),
                OutputFormat::Json => println!(
                    "{}",
                    serde_json::to_string_pretty(&agents).expect("serialises")
                ),
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_agent_values_are_read_from_labels() {
        let text = "# HELP x\nargocd_principal_outbox_resources{agent_name=\"a\"} 3\nargocd_principal_outbox_resources{agent_name=\"b\"} 0\nargocd_principal_outbox_resources_other 9\n";
        let m = per_agent_metric(text, "argocd_principal_outbox_resources");
        assert_eq!(m.get("a"), Some(&3.0));
        assert_eq!(m.get("b"), Some(&0.0));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn table_shows_dashes_for_unknowns() {
        let t = render_text(&[FleetAgent {
            name: "c1".into(),
            registered: true,
            ..Default::default()
        }]);
        assert!(t.lines().nth(1).unwrap().starts_with("c1"), "{t}");
        assert!(t.contains("CERT EXPIRY"));
    }
}
