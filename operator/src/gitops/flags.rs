//! The operator's settings as `argocd-principal` flags (flattened into its command line, each
//! mirrored by an `ARGOCD_PRINCIPAL_OPERATOR_*` env var): certificate lifetimes and renewal, the
//! principal/resource-proxy addresses agents and Argo CD are given (overriding server discovery),
//! the principal Service server discovery reads, the default agent image, the hub Argo CD namespace (and the further namespaces GitOpsClusters
//! may register clusters in), the agents' namespace on the spokes and the cluster-wide grants
//! their ManifestWorks carry (the agent chart's `liveView.enabled`, `liveView.write`,
//! `terminal.enabled`), and what the OCM pull model asks the work agents to report.
//!
//! Owns [`OperatorFlags`], their validation into [`OperatorSettings`], and how the settings fill
//! [`OperatorOptions`]. A GitOpsCluster's own spec fields still win over these defaults.

use std::time::Duration;

use argocd_agent_runtime::binary_config::{ConfigError, FlagEnv};
use argocd_agent_runtime::flags::{self, HostPort};
use clap::builder::BoolishValueParser;
use clap::{ArgAction, Args};

use argocd_agent_proto::event::names::is_dns1123_label;

use super::agent_work::AgentGrants;
use super::certs::{CertPolicy, PRINCIPAL_SERVICE};
use super::OperatorOptions;
use crate::pull::manifestwork::Feedback;

/// `--operator-*` flags of `argocd-principal`.
#[derive(Debug, Clone, Args, PartialEq, Eq)]
pub struct OperatorFlags {
    /// Validity of the fleet CA the operator creates (upstream: 1 year).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_CA_LIFETIME",
        default_value = "365d",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub operator_ca_lifetime: Duration,

    /// Validity of the certificates the operator issues: principal, resource proxy, agent client
    /// certificates and signed add-on CSRs (upstream: 30 days; never beyond the CA's end).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_CERT_LIFETIME",
        default_value = "30d",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub operator_cert_lifetime: Duration,

    /// Reissue an operator-issued certificate when less than this is left of its validity.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_RENEW_BEFORE",
        default_value = "10d",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub operator_renew_before: Duration,

    /// Host or IP agents dial to reach this principal (also put into its certificate); overrides
    /// discovery from the principal Service's LoadBalancer ingress. A GitOpsCluster's
    /// spec.argoCDAgentAddon.principalServerAddress wins over it.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_PRINCIPAL_ADDRESS",
        value_name = "HOST"
    )]
    pub operator_principal_address: Option<String>,

    /// Port agents dial (default 443, the principal Service's port). A GitOpsCluster's
    /// spec.argoCDAgentAddon.principalServerPort wins over it.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_PRINCIPAL_PORT",
        value_name = "PORT",
        value_parser = clap::value_parser!(u16).range(1..)
    )]
    pub operator_principal_port: Option<u16>,

    /// Service (in the principal's --namespace) whose LoadBalancer ingress or node port is the
    /// address agents dial, when neither --operator-principal-address nor the GitOpsCluster names
    /// one; its in-cluster DNS names also go into the principal's certificate. The chart sets it
    /// to its own Service (named after the Helm release) and grants `get` on that name only.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_PRINCIPAL_SERVICE",
        default_value = PRINCIPAL_SERVICE,
        value_name = "NAME"
    )]
    pub operator_principal_service: String,

    /// HOST:PORT the hub Argo CD reaches the resource proxy at: written into every cluster
    /// secret's server URL and the resource proxy's certificate [default:
    /// argocd-agent-resource-proxy:9090].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_RESOURCE_PROXY_ADDRESS",
        value_name = "HOST:PORT"
    )]
    pub operator_resource_proxy_address: Option<HostPort>,

    /// Agent container image for GitOpsClusters that name none [default: argocd-agent of this
    /// principal's version].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_AGENT_IMAGE",
        value_name = "IMAGE"
    )]
    pub operator_agent_image: Option<String>,

    /// Namespace of the hub Argo CD, where cluster secrets are written [default: the principal's
    /// --namespace]. This principal serves the GitOpsClusters naming it (or one of the others
    /// it serves) in spec.argoServer.argoNamespace, or, naming none, living in it (upstream's
    /// default: the GitOpsCluster's own namespace).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_ARGOCD_NAMESPACE",
        value_name = "NS"
    )]
    pub operator_argocd_namespace: Option<String>,

    /// Further hub namespaces a GitOpsCluster may name in spec.argoServer.argoNamespace, besides
    /// --operator-argocd-namespace and the principal's --namespace (comma-separated). The
    /// operator reads and writes cluster Secrets only in these namespaces, so it needs no
    /// cluster-wide Secret grant (the chart's operator.extraArgocdNamespaces grants a Role in
    /// each); a GitOpsCluster naming another namespace is refused in its status.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_EXTRA_ARGOCD_NAMESPACES",
        value_name = "NS,...",
        value_delimiter = ','
    )]
    pub operator_extra_argocd_namespaces: Vec<String>,

    /// Namespace of the agent on the managed clusters [default: argocd]. A GitOpsCluster's
    /// spec.argoCDAgentAddon.agentNamespace wins over it.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_OPERATOR_AGENT_NAMESPACE",
        value_name = "NS"
    )]
    pub operator_agent_namespace: Option<String>,

    /// Grant the agents cluster-wide `get` on every kind and `list` on events (agent/rbac.yaml
    /// `liveView`), so the hub's Argo CD shows their clusters' live state: the agent chart's
    /// liveView.enabled. The agent serves only objects Argo CD tracks.
    #[arg(long, env = "ARGOCD_PRINCIPAL_OPERATOR_AGENT_LIVE_VIEW", default_value_t = true,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub operator_agent_live_view: bool,

    /// Also grant the agents cluster-wide create, update, patch and delete on every kind
    /// (agent/rbac.yaml `liveViewWrite`): resource actions and deleting one resource from the hub,
    /// on tracked objects only. The agent chart's liveView.write; needs
    /// --operator-agent-live-view.
    #[arg(long, env = "ARGOCD_PRINCIPAL_OPERATOR_AGENT_LIVE_VIEW_WRITE", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub operator_agent_live_view_write: bool,

    /// Grant the agents `get` on pods and `get`, `create` on pods/exec cluster-wide
    /// (agent/rbac.yaml `terminal`), so the hub's web terminal execs into pods of Argo CD
    /// applications: the agent chart's terminal.enabled.
    #[arg(long, env = "ARGOCD_PRINCIPAL_OPERATOR_AGENT_TERMINAL", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub operator_agent_terminal: bool,

    /// Ask the OCM work agents for each pulled Application's status.resources too, so the hub
    /// Application and its ApplicationSet's MulticlusterApplicationSetReport list what it
    /// deployed (upstream's report takes them from ACM's search add-on). Needs the work agents'
    /// RawFeedbackJsonString feature gate (the Klusterlet's spec.workConfiguration.featureGates);
    /// they return at most their --max-json-raw-length (1 KiB by default: about eight
    /// resources), and say so on the hub Application when an Application has more.
    #[arg(long, env = "ARGOCD_PRINCIPAL_OPERATOR_PULL_RESOURCE_FEEDBACK", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub operator_pull_resource_feedback: bool,
}

/// Validated operator settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorSettings {
    /// Lifetimes and renewal.
    pub certs: CertPolicy,
    /// Advertised principal host.
    pub principal_address: Option<String>,
    /// Advertised principal port.
    pub principal_port: Option<u16>,
    /// Service server discovery reads (default [`PRINCIPAL_SERVICE`]).
    pub principal_service: String,
    /// Resource proxy `host:port` for the hub Argo CD.
    pub resource_proxy_address: Option<String>,
    /// Default agent image.
    pub agent_image: Option<String>,
    /// Hub Argo CD namespace.
    pub argocd_namespace: Option<String>,
    /// Further namespaces GitOpsClusters may register clusters in.
    pub extra_argocd_namespaces: Vec<String>,
    /// Agent namespace on the spokes.
    pub agent_namespace: Option<String>,
    /// The agents' cluster-wide grants.
    pub agent_grants: AgentGrants,
    /// What the pull model asks the work agents to bring back.
    pub pull_feedback: Feedback,
}

fn non_blank(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

impl OperatorFlags {
    /// Checks the values; an error names the flag and the env var of `env` (the principal's)
    /// that mirrors it, and says what is wrong.
    pub fn validate(self, env: &FlagEnv) -> Result<OperatorSettings, ConfigError> {
        let fmt = flags::format_duration;
        env.min_duration(
            "operator-renew-before",
            self.operator_renew_before,
            Duration::ZERO,
            "certificates would only be renewed once expired",
        )?;
        if self.operator_cert_lifetime <= self.operator_renew_before {
            return Err(env.conflict(
                "operator-cert-lifetime",
                "operator-renew-before",
                format!(
                    "a certificate lifetime of {} is not longer than the renewal margin of {}: \
                     every certificate would be reissued on every reconciliation",
                    fmt(self.operator_cert_lifetime),
                    fmt(self.operator_renew_before)
                ),
            ));
        }
        if self.operator_ca_lifetime < self.operator_cert_lifetime {
            return Err(env.conflict(
                "operator-ca-lifetime",
                "operator-cert-lifetime",
                format!(
                    "a CA lifetime of {} is shorter than the certificate lifetime of {}: issued \
                     certificates cannot outlive their CA",
                    fmt(self.operator_ca_lifetime),
                    fmt(self.operator_cert_lifetime)
                ),
            ));
        }
        let principal_address = non_blank(self.operator_principal_address);
        if let Some(a) = &principal_address {
            flags::check_host_name(a).map_err(|e| {
                env.invalid(
                    "operator-principal-address",
                    format!("{e} (give the port with --operator-principal-port)"),
                )
            })?;
        }
        if self.operator_agent_live_view_write && !self.operator_agent_live_view {
            return Err(env.conflict(
                "operator-agent-live-view-write",
                "operator-agent-live-view",
                "the live view's writes are granted with its reads: enable both, or neither",
            ));
        }
        let principal_service = self.operator_principal_service.trim().to_owned();
        // A Service name is a DNS-1035 label: a DNS-1123 label starting with a letter.
        if !is_dns1123_label(&principal_service)
            || !principal_service.starts_with(|c: char| c.is_ascii_lowercase())
        {
            return Err(env.invalid(
                "operator-principal-service",
                format!(
                    "{principal_service:?} is not a Service name (lower-case letters, digits and \
                     '-', starting with a letter, at most 63 characters)"
                ),
            ));
        }
        Ok(OperatorSettings {
            certs: CertPolicy {
                ca_validity: self.operator_ca_lifetime,
                cert_validity: self.operator_cert_lifetime,
                renew_before: self.operator_renew_before,
            },
            principal_address,
            principal_port: self.operator_principal_port,
            principal_service,
            resource_proxy_address: self.operator_resource_proxy_address.map(|h| h.to_string()),
            agent_image: non_blank(self.operator_agent_image),
            argocd_namespace: env
                .optional_namespace("operator-argocd-namespace", self.operator_argocd_namespace)?,
            agent_namespace: env
                .optional_namespace("operator-agent-namespace", self.operator_agent_namespace)?,
            agent_grants: AgentGrants {
                live_view: self.operator_agent_live_view,
                live_view_write: self.operator_agent_live_view_write,
                terminal: self.operator_agent_terminal,
            },
            pull_feedback: if self.operator_pull_resource_feedback {
                Feedback::StatusAndResources
            } else {
                Feedback::Status
            },
            extra_argocd_namespaces: self
                .operator_extra_argocd_namespaces
                .into_iter()
                .filter_map(|n| {
                    env.optional_namespace("operator-extra-argocd-namespaces", Some(n))
                        .transpose()
                })
                .collect::<Result<_, _>>()?,
        })
    }
}

impl OperatorOptions {
    /// Options for a principal in `namespace` with the flags' settings.
    pub fn with_settings(namespace: &str, s: &OperatorSettings) -> Self {
        let mut o = OperatorOptions::new(namespace);
        o.certs = s.certs;
        o.principal_address = s.principal_address.clone();
        o.principal_port = s.principal_port;
        o.principal_service = s.principal_service.clone();
        if let Some(a) = &s.resource_proxy_address {
            o.resource_proxy_address = a.clone();
        }
        if let Some(i) = &s.agent_image {
            o.agent_image = i.clone();
        }
        o.argocd_namespace = s.argocd_namespace.clone();
        o.extra_argocd_namespaces = s.extra_argocd_namespaces.clone();
        o.agent_namespace = s.agent_namespace.clone();
        o.agent_grants = s.agent_grants;
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        op: OperatorFlags,
    }

    const FLAGS: FlagEnv = FlagEnv::new("ARGOCD_PRINCIPAL_");

    fn parse(args: &[&str]) -> Result<OperatorSettings, ConfigError> {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .expect("clap accepts")
            .op
            .validate(&FLAGS)
    }

    #[test]
    fn defaults_are_upstreams_lifetimes_and_no_overrides() {
        let s = parse(&[]).unwrap();
        assert_eq!(s.certs, CertPolicy::default());
        assert_eq!(s.principal_address, None);
        let o = OperatorOptions::with_settings("argocd", &s);
        assert_eq!(o.resource_proxy_address, "argocd-agent-resource-proxy:9090");
        assert_eq!(
            o.principal_service, "argocd-agent-principal",
            "upstream's name"
        );
        assert_eq!(o.argocd_namespace(), "argocd");
        assert_eq!(
            o.agent_grants,
            AgentGrants {
                live_view: true,
                live_view_write: false,
                terminal: false
            },
            "the agent chart's defaults"
        );
        assert_eq!(s.pull_feedback, Feedback::Status, "upstream's feedback");
        assert_eq!(
            parse(&["--operator-pull-resource-feedback"])
                .unwrap()
                .pull_feedback,
            Feedback::StatusAndResources
        );
    }

    #[test]
    fn agent_grants_follow_their_flags() {
        for (args, grants) in [
            (
                &[
                    "--operator-agent-live-view-write",
                    "--operator-agent-terminal",
                ][..],
                (true, true, true),
            ),
            (
                &[
                    "--operator-agent-live-view=false",
                    "--operator-agent-terminal=true",
                ][..],
                (false, false, true),
            ),
            (
                &["--operator-agent-live-view=false"][..],
                (false, false, false),
            ),
        ] {
            let (live_view, live_view_write, terminal) = grants;
            assert_eq!(
                parse(args).unwrap().agent_grants,
                AgentGrants {
                    live_view,
                    live_view_write,
                    terminal
                },
                "{args:?}"
            );
        }
    }

    #[test]
    fn every_setting_reaches_the_options() {
        let s = parse(&[
            "--operator-ca-lifetime=730d",
            "--operator-cert-lifetime=7d",
            "--operator-renew-before=2d",
            "--operator-principal-address=principal.example.com",
            "--operator-principal-port=8443",
            "--operator-principal-service=hub-argocd-agent-principal",
            "--operator-resource-proxy-address=rp.example.com:9443",
            "--operator-agent-image=registry/agent:1",
            "--operator-argocd-namespace=gitops",
            "--operator-agent-namespace=agents",
        ])
        .unwrap();
        let o = OperatorOptions::with_settings("hub", &s);
        assert_eq!(o.certs.cert_validity, Duration::from_secs(7 * 86400));
        assert_eq!(o.certs.renew_before, Duration::from_secs(2 * 86400));
        assert_eq!(o.certs.ca_validity, Duration::from_secs(730 * 86400));
        assert_eq!(
            o.principal_address.as_deref(),
            Some("principal.example.com")
        );
        assert_eq!(o.principal_port, Some(8443));
        assert_eq!(o.principal_service, "hub-argocd-agent-principal");
        assert_eq!(o.resource_proxy_address, "rp.example.com:9443");
        assert_eq!(o.agent_image, "registry/agent:1");
        assert_eq!(o.argocd_namespace(), "gitops");
        assert_eq!(o.agent_namespace.as_deref(), Some("agents"));
    }

    #[test]
    fn bad_values_name_their_flag() {
        for (args, flag) in [
            (
                &["--operator-cert-lifetime=5d", "--operator-renew-before=5d"][..],
                "operator-cert-lifetime",
            ),
            (
                &["--operator-ca-lifetime=10d", "--operator-cert-lifetime=30d"][..],
                "operator-ca-lifetime",
            ),
            (&["--operator-renew-before=0s"][..], "operator-renew-before"),
            (
                &["--operator-principal-address=https://x"][..],
                "operator-principal-address",
            ),
            (
                &["--operator-agent-namespace=Not_A_Namespace"][..],
                "operator-agent-namespace",
            ),
            (
                &["--operator-argocd-namespace=-bad"][..],
                "operator-argocd-namespace",
            ),
            (
                &["--operator-principal-service=Principal"][..],
                "operator-principal-service",
            ),
            (
                &["--operator-principal-service=1-principal"][..],
                "operator-principal-service",
            ),
            (
                &["--operator-principal-service="][..],
                "operator-principal-service",
            ),
            (
                &[
                    "--operator-agent-live-view=false",
                    "--operator-agent-live-view-write",
                ][..],
                "operator-agent-live-view-write",
            ),
        ] {
            let err = parse(args).unwrap_err();
            assert_eq!(err.flag(), flag, "{args:?}: {err:?}");
            assert!(
                err.to_string().contains(&FLAGS.env_var_for(flag)),
                "{args:?}: {err}"
            );
        }
        let mut argv = vec!["x", "--operator-principal-port=0"];
        assert!(
            Cli::try_parse_from(argv.drain(..)).is_err(),
            "port 0 refused"
        );
    }
}
