//! `argocd-agentctl fleet status`: one line per agent of the fleet, joined from the Argo CD
//! cluster secrets (registration, resource-proxy certificate expiry), the GitOpsClusters' status
//! (mode, onboarding phase, agent readiness) and, when `--principal-metrics` is given, the
//! principal's metrics (`argocd_principal_agent_connected{agent_name,agent_mode}`,
//! `argocd_principal_agent_last_event_timestamp_seconds{agent_name}`,
//! `argocd_principal_outbox_resources{agent_name}`), read over plain HTTP.
//!
//! Owns the Prometheus text parser ([`parse_prometheus_text`]), the join and its text/JSON
//! rendering; reading is all it does.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use kube::api::{Api, ListParams};
use serde::Serialize;

use super::{CliError, OutputFormat};
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
    /// The hub cluster and the namespace of its Argo CD (where the cluster secrets are).
    #[command(flatten)]
    pub cluster: super::blocklist::ClusterArgs,
    /// The principal's metrics endpoint (plain HTTP), e.g. http://127.0.0.1:8000/metrics: adds
    /// connected, mode, last event and queue depth per agent. Without it those columns show "-".
    #[arg(
        long,
        visible_alias = "metrics-url",
        env = "ARGOCD_AGENTCTL_PRINCIPAL_METRICS",
        value_name = "URL"
    )]
    pub principal_metrics: Option<String>,
    #[command(flatten)]
    pub out: super::OutputArgs,
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

/// One sample of a Prometheus text exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels, unescaped.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, &str)> {
    // `s` starts after '{'; returns the labels and the rest after '}'.
    let mut labels = BTreeMap::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after_key) = rest.split_once('=')?;
        let mut chars = after_key.strip_prefix('"')?.char_indices();
        let mut value = String::new();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                (_, c) => value.push(c),
            }
        };
        labels.insert(key.trim().to_owned(), value);
        rest = &after_key[1 + end + 1..];
    }
}

/// Parses the Prometheus text format: comments and malformed lines are skipped.
pub fn parse_prometheus_text(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let (labels, rest) = match line[name_end..].strip_prefix('{') {
            Some(inner) => match parse_labels(inner) {
                Some(l) => l,
                None => continue,
            },
            None => (BTreeMap::new(), &line[name_end..]),
        };
        let Some(value) = rest.split_whitespace().next() else {
            continue;
        };
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => match v.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    out
}

/// What the principal's metrics say about one agent.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct AgentMetrics {
    /// `argocd_principal_agent_connected` (1/0).
    pub connected: Option<bool>,
    /// Its `agent_mode` label.
    pub mode: Option<String>,
    /// `argocd_principal_agent_last_event_timestamp_seconds`.
    pub last_event: Option<chrono::DateTime<chrono::Utc>>,
    /// `argocd_principal_outbox_resources`.
    pub queue_depth: Option<u64>,
}

/// Per-agent view of the principal's metrics text.
pub fn agent_metrics(text: &str) -> BTreeMap<String, AgentMetrics> {
    let mut out: BTreeMap<String, AgentMetrics> = BTreeMap::new();
    for s in parse_prometheus_text(text) {
        let Some(agent) = s.labels.get("agent_name") else {
            continue;
        };
        match s.name.as_str() {
            "argocd_principal_agent_connected" => {
                let a = out.entry(agent.clone()).or_default();
                // Several series (one per mode) may exist; connected if any says so.
                if s.value > 0.0 || a.connected.is_none() {
                    a.connected = Some(s.value > 0.0);
                    a.mode = s.labels.get("agent_mode").cloned().or(a.mode.take());
                }
            }
            "argocd_principal_agent_last_event_timestamp_seconds" if s.value > 0.0 => {
                let t = chrono::DateTime::from_timestamp_millis((s.value * 1000.0) as i64);
                let a = out.entry(agent.clone()).or_default();
                a.last_event = a.last_event.max(t);
            }
            "argocd_principal_outbox_resources" => {
                let a = out.entry(agent.clone()).or_default();
                *a.queue_depth.get_or_insert(0) += s.value.max(0.0) as u64;
            }
            _ => {}
        }
    }
    out
}

async fn fetch_metrics(url: &str) -> Result<String, CliError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fail =
        |e: &dyn std::fmt::Display| CliError::runtime(format!("--principal-metrics {url}: {e}"));
    let rest = url.strip_prefix("http://").ok_or_else(|| {
        CliError::usage(format!(
            "--principal-metrics {url}: only http:// URLs are supported"
        ))
    })?;
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/metrics".into()));
    let read = async {
        let mut s = tokio::net::TcpStream::connect(host).await?;
        // HTTP/1.0: the body is the rest of the stream, never chunked.
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(buf)
    };
    let buf = tokio::time::timeout(std::time::Duration::from_secs(10), read)
        .await
        .map_err(|_| fail(&"no answer within 10s"))?
        .map_err(|e| fail(&e))?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| fail(&"not an HTTP response"))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(fail(&format!("answered {status:?}")));
    }
    Ok(body.to_owned())
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
        let metrics = agent_metrics(&text);
        // Agents the principal knows but the hub does not list are shown too.
        for name in metrics.keys() {
            agents.entry(name.clone()).or_default();
        }
        for (name, a) in agents.iter_mut() {
            let m = metrics.get(name).cloned().unwrap_or_default();
            a.connected = Some(m.connected.unwrap_or(false));
            a.queue_depth = Some(m.queue_depth.unwrap_or(0));
            a.last_event = m.last_event.map(|t| t.to_rfc3339());
            if a.mode.is_empty() {
                a.mode = m.mode.unwrap_or_default();
            }
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
            let (client, namespace) = args.cluster.client().await?;
            let agents =
                fleet_status(&client, &namespace, args.principal_metrics.as_deref()).await?;
            match args.out.output {
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

    const FIXTURE: &str = r#"# HELP argocd_principal_agent_connected Whether the agent has a live stream.
# TYPE argocd_principal_agent_connected gauge
argocd_principal_agent_connected{agent_name="c1",agent_mode="managed"} 1
argocd_principal_agent_connected{agent_name="c2",agent_mode="autonomous"} 0
argocd_principal_agent_last_event_timestamp_seconds{agent_name="c1"} 1700000000.5
argocd_principal_agent_last_event_timestamp_seconds{agent_name="c2"} 0
argocd_principal_outbox_resources{agent_name="c1"} 3
argocd_principal_outbox_resources_total{agent_name="c1"} 99
argocd_principal_events_total{agent_name="c\"q\\x",direction="out"} 7 1700000000000
up 1
garbage{agent_name="c1" 5
"#;

    #[test]
    fn prometheus_text_is_parsed_with_labels_escapes_and_timestamps() {
        let samples = parse_prometheus_text(FIXTURE);
        assert_eq!(samples.len(), 8, "{samples:?}");
        let esc = samples
            .iter()
            .find(|s| s.name == "argocd_principal_events_total")
            .unwrap();
        assert_eq!(esc.labels["agent_name"], "c\"q\\x");
        assert_eq!(esc.labels["direction"], "out");
        assert_eq!(esc.value, 7.0);
        assert!(samples
            .iter()
            .any(|s| s.name == "up" && s.labels.is_empty()));
    }

    #[test]
    fn per_agent_metrics_give_connection_mode_last_event_and_queue() {
        let m = agent_metrics(FIXTURE);
        let c1 = &m["c1"];
        assert_eq!(c1.connected, Some(true));
        assert_eq!(c1.mode.as_deref(), Some("managed"));
        assert_eq!(
            c1.queue_depth,
            Some(3),
            "the _total series is another metric"
        );
        assert_eq!(
            c1.last_event.unwrap().to_rfc3339(),
            "2023-11-14T22:13:20.500+00:00"
        );
        let c2 = &m["c2"];
        assert_eq!(c2.connected, Some(false));
        assert_eq!(c2.mode.as_deref(), Some("autonomous"));
        assert_eq!(c2.last_event, None, "0 means never");
        assert_eq!(c2.queue_depth, None);
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
