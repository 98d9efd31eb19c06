//! Command-line and environment configuration of `argocd-agent`.
//!
//! Owns: [`AgentArgs`] (every flag, each mirrored by an `ARGOCD_AGENT_<FLAG>` env var), its
//! validation into [`AgentConfig`] (files readable, names well-formed, mode-dependent options
//! consistent, durations sane). The checks both binaries share, and [`ConfigError`] whose messages
//! name the flag and env var and say what to do, live in [`binary_config`]. Syntax errors (an
//! unknown mode, a malformed address) are clap's and exit 2 too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_kube::secret_files::{self, SecretContent, SecretFile};
use argocd_agent_runtime::binary_config::{self, non_empty, FlagEnv};
use argocd_agent_runtime::flags::{self, check_host_name, AgentMode, HostPort};
use argocd_agent_runtime::process_args::{
    GrpcMessageArgs, OpsAddressArgs, ProcessArgs, RedisCredentialArgs, TlsPolicyArgs,
};
use argocd_agent_runtime::telemetry::LogFormat;
use argocd_agent_runtime::tls::TlsPolicy;
use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser, ValueEnum};

pub use argocd_agent_runtime::binary_config::{ConfigError, KubeClientConfig};
pub use argocd_agent_runtime::redis_client::RedisTls;
use argocd_agent_runtime::redis_client::{
    redis_tls_choice, RedisTlsChoice, RedisTlsFlags, REDIS_CA_SECRET_FIELD,
};
pub use argocd_agent_runtime::redis_credentials::{
    redis_credentials, RedisCredentials, RedisPassword, UPSTREAM_REDIS_ENV,
};

/// Prefix of every env var mirroring an agent flag.
pub const ENV_PREFIX: &str = "ARGOCD_AGENT_";

/// The agent's flags and the env vars mirroring them.
const FLAGS: FlagEnv = FlagEnv::new(ENV_PREFIX);

/// The agent's Redis TLS flags (upstream's names).
const REDIS_TLS_FLAGS: RedisTlsFlags = RedisTlsFlags {
    enabled: "redis-tls-enabled",
    ca_path: "redis-tls-ca-path",
    ca_secret: "redis-tls-ca-secret-name",
    insecure: "redis-tls-insecure",
};

/// Upstream's env var for `--root-ca-secret-name`, read when ours is not set.
pub const UPSTREAM_ROOT_CA_SECRET_ENV: &str = "ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME";

/// Default `--root-ca-secret-name` (upstream's).
pub const DEFAULT_CA_SECRET_NAME: &str = "argocd-agent-ca";

/// The env var that mirrors `--<flag>`.
pub fn env_var_for(flag: &str) -> String {
    FLAGS.env_var_for(flag)
}

/// What a managed agent does when a local object's source UID differs from the hub's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum SourceUidMismatchPolicy {
    /// Delete the local object and create it again from the hub's copy.
    #[default]
    Recreate,
    /// Update the local object in place and take over the hub's identity.
    Upsert,
}

/// What a managed agent does after recreating an Application that was deleted on the spoke
/// without the hub asking (upstream's `--on-application-recreate`). The recreated Application
/// keeps the status it had, as upstream's does, so Argo CD's automated sync does not run again
/// for a revision it already synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum RecreateAction {
    /// Nothing more: the Application may stay OutOfSync until someone syncs it (investigate why
    /// it was deleted).
    #[default]
    Ignore,
    /// Clear `status.operationState`, so Argo CD's automated sync (if the Application has one)
    /// runs again.
    ClearStatus,
    /// Request a sync operation, whatever the Application's sync policy.
    Resync,
}

/// Whether a managed agent takes over a same-named local Application that no hub object created.
/// Upstream's agent never does (the hub's Application gets an error); `always` is ours, opt-in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum AdoptionPolicy {
    /// Adopt it: the hub's copy wins from then on.
    Always,
    /// Leave it alone and report an error to the hub (upstream's behaviour).
    #[default]
    Never,
}

/// `argocd-agent`: the workload-cluster side of argocd-agent.
///
/// Every flag can also be set through the environment variable shown next to it; a flag given
/// twice takes its last value.
#[derive(Debug, Clone, Parser)]
#[command(name = "argocd-agent", version, about, long_about = None, args_override_self = true)]
#[command(mut_args = FLAGS.mirror_env())]
#[command(mut_args = OpsAddressArgs::defaults("0.0.0.0:8181", "0.0.0.0:8001"))]
pub struct AgentArgs {
    /// The principal's gRPC endpoint.
    #[arg(long, env = "ARGOCD_AGENT_SERVER_ADDRESS", value_name = "HOST:PORT")]
    pub server_address: HostPort,

    /// Name to send as SNI and to verify the principal's certificate against [default: the host of --server-address].
    #[arg(long, env = "ARGOCD_AGENT_TLS_SERVER_NAME", value_name = "NAME")]
    pub tls_server_name: Option<String>,

    /// How this agent operates.
    #[arg(
        long,
        env = "ARGOCD_AGENT_MODE",
        value_enum,
        default_value_t = AgentMode::Managed,
        value_name = "MODE"
    )]
    pub mode: AgentMode,

    /// Client certificate (PEM) presented to the principal; its subject/SAN names this agent
    /// [default: tls.crt of --tls-secret-name].
    #[arg(long, env = "ARGOCD_AGENT_TLS_CLIENT_CERT", value_name = "PATH")]
    pub tls_client_cert: Option<PathBuf>,

    /// Private key (PEM) of the client certificate [default: tls.key of --tls-secret-name].
    #[arg(long, env = "ARGOCD_AGENT_TLS_CLIENT_KEY", value_name = "PATH")]
    pub tls_client_key: Option<PathBuf>,

    /// CA bundle (PEM) the principal's server certificate must chain to [default: the
    /// certificates in --root-ca-secret-name].
    #[arg(long, env = "ARGOCD_AGENT_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,

    /// kubernetes.io/tls Secret in --namespace holding this agent's client certificate (tls.crt,
    /// tls.key), read when --tls-client-cert and --tls-client-key are not given; re-read every few
    /// seconds, so a rotated certificate is used for the next connection.
    #[arg(
        long,
        env = "ARGOCD_AGENT_TLS_SECRET_NAME",
        default_value = "argocd-agent-client-tls",
        value_name = "NAME"
    )]
    pub tls_secret_name: String,

    /// Secret in --namespace holding the CA the principal's certificate must chain to (every field
    /// holding certificates), read when --tls-ca is not given; re-read every few seconds.
    /// Upstream's env var ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME is read too [default:
    /// argocd-agent-ca].
    #[arg(long, env = "ARGOCD_AGENT_ROOT_CA_SECRET_NAME", value_name = "NAME")]
    pub root_ca_secret_name: Option<String>,

    /// INSECURE: Connect to the principal without TLS, for a service mesh (e.g. Istio) whose
    /// sidecar provides mTLS and tells the principal who this agent is (the principal runs with
    /// --insecure-plaintext and --auth=header:...); the agent logs in with auth method "header".
    /// Refused together with the --tls-client-cert/--tls-client-key/--tls-ca files.
    #[arg(long, env = "ARGOCD_AGENT_INSECURE_PLAINTEXT", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub insecure_plaintext: bool,

    #[command(flatten)]
    pub tls_policy: TlsPolicyArgs,

    /// Namespace of Argo CD on this cluster.
    #[arg(
        long,
        short = 'n',
        env = "ARGOCD_AGENT_NAMESPACE",
        default_value = "argocd",
        value_name = "NAMESPACE"
    )]
    pub namespace: String,

    /// Further local namespaces Applications may live in, comma-separated; upstream's patterns
    /// allowed (globs '*', '?', '[abc]', '[a-z]', '[!...]', or a /regular expression/). As upstream, only used with --destination-based-mapping (an Application whose hub
    /// namespace is neither --namespace nor matched here is refused and reported to the hub).
    #[arg(
        long,
        env = "ARGOCD_AGENT_ALLOWED_NAMESPACES",
        value_delimiter = ',',
        value_name = "PATTERNS"
    )]
    pub allowed_namespaces: Vec<String>,

    /// This cluster's Argo CD Redis (answers the principal's Redis proxy requests).
    #[arg(
        long,
        env = "ARGOCD_AGENT_REDIS_ADDRESS",
        default_value = "argocd-redis:6379",
        value_name = "HOST:PORT"
    )]
    pub redis_address: HostPort,

    /// Credentials of the local Argo CD Redis.
    #[command(flatten)]
    pub redis: RedisCredentialArgs,

    /// Connect to this cluster's Argo CD Redis with TLS.
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_ENABLED", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub redis_tls_enabled: bool,

    /// CA bundle (PEM) the Redis server certificate must chain to (with --redis-tls-enabled; one of
    /// this, --redis-tls-ca-secret-name and --redis-tls-insecure at most).
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_CA_PATH", value_name = "PATH")]
    pub redis_tls_ca_path: Option<PathBuf>,

    /// Secret in --namespace whose field `ca.crt` is the CA bundle the Redis server certificate
    /// must chain to; with --redis-tls-enabled and neither --redis-tls-ca-path nor
    /// --redis-tls-insecure, `argocd-redis-tls` (as upstream). Read at start.
    #[arg(
        long,
        env = "ARGOCD_AGENT_REDIS_TLS_CA_SECRET_NAME",
        value_name = "NAME"
    )]
    pub redis_tls_ca_secret_name: Option<String>,

    /// INSECURE: accept any Redis server certificate (TLS without verification).
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_INSECURE", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub redis_tls_insecure: bool,

    /// Directory holding the outbound event queue, so changes made while offline survive a restart.
    #[arg(
        long,
        env = "ARGOCD_AGENT_QUEUE_DIR",
        default_value = "/var/lib/argocd-agent/queue",
        value_name = "DIR"
    )]
    pub queue_dir: PathBuf,

    /// Where metrics and health are served.
    #[command(flatten)]
    pub ops: OpsAddressArgs,

    /// Interval of HTTP/2 keepalive pings to the principal (0 = off).
    #[arg(
        long,
        env = "ARGOCD_AGENT_KEEPALIVE_INTERVAL",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub keepalive_interval: Duration,

    /// How long to wait for a keepalive ping's answer before dropping the connection.
    #[arg(
        long,
        env = "ARGOCD_AGENT_KEEPALIVE_TIMEOUT",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub keepalive_timeout: Duration,

    /// Interval of application-level heartbeat events, for meshes that cut idle streams (0 = off).
    #[arg(
        long,
        env = "ARGOCD_AGENT_HEARTBEAT_INTERVAL",
        default_value = "0",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub heartbeat_interval: Duration,

    /// Longest wait between reconnection attempts (backoff grows up to this).
    #[arg(
        long,
        env = "ARGOCD_AGENT_RECONNECT_BACKOFF_MAX",
        default_value = "60s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub reconnect_backoff_max: Duration,

    /// The gRPC message size limit.
    #[command(flatten)]
    pub grpc: GrpcMessageArgs,

    /// Answer the principal's resource proxy requests (live resources for the hub's Argo CD UI).
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_RESOURCE_PROXY", default_value_t = true,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_resource_proxy: bool,

    /// Compress what is sent to the principal with gzip (upstream's `--enable-compression`; every
    /// principal, ours and upstream's, accepts it). Answers are accepted gzip-compressed either way.
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_COMPRESSION", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_compression: bool,

    /// Carry every call to the principal (authentication, the event stream, logs, terminals)
    /// as gRPC over WebSocket on HTTP/1.1, one connection per call, for proxies or load
    /// balancers between the two that do not pass HTTP/2; the principal needs
    /// --enable-websocket too (upstream's flag and wire, golang.stackrox.io/grpc-http1). With
    /// --keepalive-interval and --keepalive-timeout each call's WebSocket is pinged.
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_WEBSOCKET", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_websocket: bool,

    /// Where container logs are read from: a Kubernetes-shaped HTTP(S) endpoint serving
    /// `GET /api/v1/namespaces/{ns}/pods/{pod}/log` [default: this cluster's apiserver].
    #[arg(long, env = "ARGOCD_AGENT_LOG_ENDPOINT", value_name = "URL")]
    pub log_endpoint: Option<String>,

    /// Keep each Application's hub namespace locally (the principal maps by destination; managed
    /// only): it must be --namespace or match --allowed-namespaces; an Application of the
    /// principal's own namespace is kept in --namespace, as upstream.
    #[arg(long, env = "ARGOCD_AGENT_DESTINATION_BASED_MAPPING", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub destination_based_mapping: bool,

    /// Create an Application's namespace locally when it is missing (managed only; requires
    /// --destination-based-mapping, as upstream).
    #[arg(long, env = "ARGOCD_AGENT_CREATE_NAMESPACE", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub create_namespace: bool,

    /// What to do when a local object's source UID (annotation `argocd.argoproj.io/source-uid`)
    /// differs from the hub object's: recreate (delete and create) or upsert (update in place);
    /// a hub object's annotation `argocd.argoproj.io/source-uid-mismatch-policy` overrides it for
    /// that object (managed only).
    #[arg(
        long,
        env = "ARGOCD_AGENT_SOURCE_UID_MISMATCH_POLICY",
        value_enum,
        default_value_t = SourceUidMismatchPolicy::Recreate,
        value_name = "POLICY"
    )]
    pub source_uid_mismatch_policy: SourceUidMismatchPolicy,

    /// Whether to adopt a pre-existing local Application of a hub Application's name that the hub
    /// did not create (managed only): `never` (upstream's behaviour) leaves it alone and reports an
    /// error to the hub; `always` makes it the hub's copy. AppProjects and repository Secrets are
    /// always taken over, as upstream does.
    #[arg(
        long,
        env = "ARGOCD_AGENT_ADOPTION_POLICY",
        value_enum,
        default_value_t = AdoptionPolicy::Never,
        value_name = "POLICY"
    )]
    pub adoption_policy: AdoptionPolicy,

    /// Leave local Applications without the source-uid annotation (not created from the hub)
    /// alone: never adopted, whatever --adoption-policy says, and a hub Application of the same
    /// name is refused and reported to the hub (managed only).
    #[arg(long, env = "ARGOCD_AGENT_IGNORE_UNMANAGED_APPS", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub ignore_unmanaged_apps: bool,

    /// What to do after recreating an Application deleted locally without the hub asking
    /// (managed only): ignore, clear-status (clear the stale operationState so automated sync
    /// runs again) or resync (request a sync).
    #[arg(
        long,
        env = "ARGOCD_AGENT_ON_APPLICATION_RECREATE",
        value_enum,
        default_value_t = RecreateAction::Ignore,
        value_name = "ACTION"
    )]
    pub on_application_recreate: RecreateAction,

    /// How often to compare local and hub state for missed changes (0 = only on (re)connect).
    #[arg(
        long,
        env = "ARGOCD_AGENT_RESYNC_INTERVAL",
        default_value = "5m",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub resync_interval: Duration,

    /// How often a managed agent sends its Argo CD's cluster cache counts (applications, APIs,
    /// resources) to the principal, for the hub's cluster list (0 = never).
    #[arg(
        long,
        env = "ARGOCD_AGENT_CACHE_REFRESH_INTERVAL",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub cache_refresh_interval: Duration,

    /// Only watch local objects matching this Kubernetes label selector.
    #[arg(long, env = "ARGOCD_AGENT_LABEL_SELECTOR", value_name = "SELECTOR")]
    pub label_selector: Option<String>,

    /// Cluster, logging and trace flags shared with the other binaries.
    #[command(flatten)]
    pub process: ProcessArgs,
}

impl AgentArgs {
    /// Parses the process's arguments and `ARGOCD_AGENT_*` env vars (an empty env var counts as
    /// unset); on a usage error prints clap's message and exits 2.
    pub fn from_env_and_args() -> Self {
        binary_config::parse_env_and_args()
    }
}

/// Client certificate, key and server CA files for the connection to the principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// Client certificate chain (PEM).
    pub cert: PathBuf,
    /// Client private key (PEM).
    pub key: PathBuf,
    /// CA bundle the principal's certificate must chain to (PEM).
    pub ca: PathBuf,
}

/// HTTP/2 keepalive towards the principal.
pub type KeepaliveConfig = argocd_agent_runtime::dial::Http2Keepalive;

/// Validated configuration of the agent.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The principal's endpoint.
    pub server_address: HostPort,
    /// SNI / certificate verification name (the override, or the server address's host).
    pub tls_server_name: String,
    /// Operating mode.
    pub mode: AgentMode,
    /// TLS files (`None` = `--insecure-plaintext`, behind a service mesh).
    pub tls: Option<ClientTlsFiles>,
    /// Those of the TLS files that are kept from Secrets (`--tls-secret-name`,
    /// `--root-ca-secret-name`), written under [`Self::tls_secret_dir`] before they are loaded.
    pub tls_secrets: Vec<SecretFile>,
    /// The private directory the Secret-backed files live in.
    pub tls_secret_dir: PathBuf,
    /// TLS versions and cipher suites.
    pub tls_policy: TlsPolicy,
    /// Local Argo CD namespace.
    pub namespace: String,
    /// Extra local Application namespace patterns (always empty until destination-based
    /// mapping is implemented).
    pub allowed_namespaces: Vec<String>,
    /// Local Argo CD Redis.
    pub redis_address: HostPort,
    /// AUTH credentials for the local Redis; `None` = it has no password.
    pub redis_credentials: Option<RedisCredentials>,
    /// TLS to the local Redis; `None` = plaintext.
    pub redis_tls: Option<RedisTls>,
    /// Outbound queue directory (may not exist yet; its nearest existing ancestor is a directory).
    pub queue_dir: PathBuf,
    /// Where `/metrics` is served.
    pub metrics_address: SocketAddr,
    /// Where `/healthz` and `/readyz` are served.
    pub health_address: SocketAddr,
    /// HTTP/2 keepalive; `None` = off.
    pub keepalive: Option<KeepaliveConfig>,
    /// Heartbeat event interval; `None` = off.
    pub heartbeat_interval: Option<Duration>,
    /// Cap of the reconnection backoff.
    pub reconnect_backoff_max: Duration,
    /// gRPC message size limit in bytes.
    pub grpc_max_message_size: usize,
    /// Serve resource proxy requests.
    pub enable_resource_proxy: bool,
    /// Send gzip-compressed gRPC messages.
    pub enable_compression: bool,
    /// Carry every call as gRPC over WebSocket on HTTP/1.1.
    pub enable_websocket: bool,
    /// Container log source; `None` = the spoke apiserver's `pods/log`.
    pub log_endpoint: Option<http::Uri>,
    /// Destination-based mapping (managed only; always false: refused until implemented).
    pub destination_based_mapping: bool,
    /// Create missing Application namespaces (managed only; always false, as above).
    pub create_namespace: bool,
    /// Source UID mismatch handling.
    pub source_uid_mismatch_policy: SourceUidMismatchPolicy,
    /// Adoption of pre-existing Applications.
    pub adoption_policy: AdoptionPolicy,
    /// Leave local Applications the hub did not create alone.
    pub ignore_unmanaged_apps: bool,
    /// What follows the recreation of an Application deleted locally.
    pub on_application_recreate: RecreateAction,
    /// Periodic resync; `None` = only on (re)connect.
    pub resync_interval: Option<Duration>,
    /// Period of the cluster cache counts sent to the principal; `None` = never.
    pub cache_refresh_interval: Option<Duration>,
    /// Kubernetes client settings.
    pub kube: KubeClientConfig,
    /// Log filter (already checked by `parse_log_filter`).
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// Label selector for watched local objects.
    pub label_selector: Option<String>,
    /// OTLP trace export endpoint.
    pub otlp_address: Option<String>,
}

/// The queue directory may be created at start-up, but only inside an existing directory.
fn check_queue_dir(path: &Path) -> Result<(), ConfigError> {
    const FLAG: &str = "queue-dir";
    if path.as_os_str().is_empty() {
        return Err(FLAGS.invalid(FLAG, "is empty; give a directory path"));
    }
    let mut candidate = Some(path);
    while let Some(dir) = candidate {
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(_) => {
                return Err(FLAGS.invalid(
                    FLAG,
                    format!(
                        "{} exists and is not a directory; point it at a directory",
                        dir.display()
                    ),
                ))
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
                ) =>
            {
                candidate = dir.parent().filter(|p| !p.as_os_str().is_empty());
            }
            Err(e) => {
                return Err(FLAGS.invalid(FLAG, format!("cannot inspect {}: {e}", dir.display())))
            }
        }
    }
    // A relative path whose every component is missing lives in the working directory.
    Ok(())
}

/// `--log-endpoint`: an absolute `http://` or `https://` URL without query or fragment.
fn parse_log_endpoint(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{url:?} must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    if uri.query().is_some() {
        return Err(format!(
            "{url:?} must not carry a query; the agent adds the log options"
        ));
    }
    Ok(uri)
}

impl AgentArgs {
    /// Checks everything clap cannot (files, names, ranges, combinations) and builds the config;
    /// Redis credentials missing from the flags are looked up in upstream's env vars
    /// ([`UPSTREAM_REDIS_ENV`]).
    pub fn validate(self) -> Result<AgentConfig, ConfigError> {
        self.validate_with_env(|name| std::env::var(name).ok())
    }

    /// [`Self::validate`] with `env` standing in for the process environment (for tests).
    pub fn validate_with_env(
        self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<AgentConfig, ConfigError> {
        let redis_credentials = self.redis.resolve(&FLAGS, &env)?;
        let redis_tls_choice = redis_tls_choice(
            &FLAGS,
            &REDIS_TLS_FLAGS,
            self.redis_tls_enabled,
            self.redis_tls_ca_path.clone(),
            self.redis_tls_ca_secret_name.clone(),
            self.redis_tls_insecure,
        )?;
        let tls_files = [
            ("tls-client-cert", non_empty(self.tls_client_cert)),
            ("tls-client-key", non_empty(self.tls_client_key)),
            ("tls-ca", non_empty(self.tls_ca)),
        ];
        let root_ca_secret_name = non_empty(self.root_ca_secret_name)
            .or_else(|| non_empty(env(UPSTREAM_ROOT_CA_SECRET_ENV)))
            .unwrap_or_else(|| DEFAULT_CA_SECRET_NAME.to_string());
        let tls_secret_dir = secret_files::private_dir_for("argocd-agent");
        let mut tls_secrets = Vec::new();
        let tls = if self.insecure_plaintext {
            if let Some((flag, _)) = tls_files.iter().find(|(_, path)| path.is_some()) {
                return Err(FLAGS.conflict(
                    flag,
                    "insecure-plaintext",
                    "--insecure-plaintext connects without TLS, so no certificate would be used: \
                     drop --tls-client-cert/--tls-client-key/--tls-ca behind a service mesh, or \
                     drop --insecure-plaintext to connect with mutual TLS",
                ));
            }
            None
        } else {
            let [(_, cert), (_, key), (_, ca)] = tls_files;
            let mut from_secret = |flag: &'static str, name: &str, content: SecretContent| {
                if name.trim().is_empty() {
                    return Err(FLAGS.invalid(
                        flag,
                        "is empty: name the Secret holding the TLS material, or give the PEM files",
                    ));
                }
                let file = SecretFile::new(&tls_secret_dir, flag, name, content);
                let path = file.path.clone();
                tls_secrets.push(file);
                Ok(path)
            };
            let (cert, key) =
                match (cert, key) {
                    (Some(cert), Some(key)) => (
                        FLAGS.readable_file("tls-client-cert", &cert)?,
                        FLAGS.readable_file("tls-client-key", &key)?,
                    ),
                    (None, None) => (
                        from_secret(
                            "tls-secret-name",
                            &self.tls_secret_name,
                            SecretContent::TlsCert,
                        )?,
                        from_secret(
                            "tls-secret-name",
                            &self.tls_secret_name,
                            SecretContent::TlsKey,
                        )?,
                    ),
                    _ => return Err(FLAGS.conflict(
                        "tls-client-cert",
                        "tls-client-key",
                        "both --tls-client-cert and --tls-client-key have to be given, or neither \
                         to read them from the Secret --tls-secret-name",
                    )),
                };
            let ca = match ca {
                Some(ca) => FLAGS.readable_file("tls-ca", &ca)?,
                None => from_secret(
                    "root-ca-secret-name",
                    &root_ca_secret_name,
                    SecretContent::CaBundle(vec![]),
                )?,
            };
            Some(ClientTlsFiles { cert, key, ca })
        };
        let redis_tls = match redis_tls_choice {
            RedisTlsChoice::Off => None,
            RedisTlsChoice::Insecure => Some(RedisTls::Insecure),
            RedisTlsChoice::CaFile(path) => Some(RedisTls::Ca(path)),
            RedisTlsChoice::CaSecret(name) => {
                let file = SecretFile::new(
                    &tls_secret_dir,
                    "redis-tls-ca-secret-name",
                    &name,
                    SecretContent::CaBundle(vec![REDIS_CA_SECRET_FIELD.into()]),
                );
                let path = file.path.clone();
                tls_secrets.push(file);
                Some(RedisTls::Ca(path))
            }
        };
        let tls_server_name = match non_empty(self.tls_server_name) {
            Some(name) => {
                check_host_name(&name).map_err(|e| FLAGS.invalid_value("tls-server-name", e))?;
                name
            }
            None => self.server_address.host.clone(),
        };

        if self.mode == AgentMode::Autonomous {
            if self.destination_based_mapping {
                return Err(FLAGS.conflict(
                    "destination-based-mapping",
                    "mode",
                    "destination-based mapping is for managed agents only; drop it or use --mode=managed",
                ));
            }
            if self.create_namespace {
                return Err(FLAGS.conflict(
                    "create-namespace",
                    "mode",
                    "creating Application namespaces is for managed agents only; drop it or use --mode=managed",
                ));
            }
            // Upstream accepts both and then filters every local Application out (none has a
            // source uid in autonomous mode) or does nothing: refused instead.
            if self.ignore_unmanaged_apps {
                return Err(FLAGS.conflict(
                    "ignore-unmanaged-apps",
                    "mode",
                    "an autonomous agent owns its local Applications, none of which the hub created; \
                     ignoring them would sync nothing. Drop it or use --mode=managed",
                ));
            }
            if self.on_application_recreate != RecreateAction::Ignore {
                return Err(FLAGS.conflict(
                    "on-application-recreate",
                    "mode",
                    "an autonomous agent never recreates Applications; drop it or use --mode=managed",
                ));
            }
        }

        // Upstream refuses --create-namespace without destination-based mapping (in namespace
        // mapping every Application lives in --namespace), and --allowed-namespaces only admits
        // Applications outside --namespace under destination-based mapping.
        if self.create_namespace && !self.destination_based_mapping {
            return Err(FLAGS.conflict(
                "create-namespace",
                "destination-based-mapping",
                "namespaces are only created for Applications that keep their hub namespace \
                 (destination-based mapping); without it every Application lives in --namespace",
            ));
        }
        FLAGS.namespace(&self.namespace)?;
        let allowed_namespaces = FLAGS.allowed_namespaces(self.allowed_namespaces)?;
        if !allowed_namespaces.is_empty() && !self.destination_based_mapping {
            return Err(FLAGS.conflict(
                "allowed-namespaces",
                "destination-based-mapping",
                "further namespaces only hold Applications that keep their hub namespace \
                 (destination-based mapping); without it every Application lives in --namespace",
            ));
        }

        check_queue_dir(&self.queue_dir)?;

        // Metrics and health may share one address (one server then serves both).
        self.ops
            .check(&FLAGS, "use one address for both or two ports")?;

        let keepalive = match FLAGS.optional_interval(
            "keepalive-interval",
            self.keepalive_interval,
            "for no keepalive pings",
        )? {
            None => None,
            Some(interval) => {
                if self.keepalive_timeout.is_zero() {
                    return Err(FLAGS.invalid(
                        "keepalive-timeout",
                        "is 0; give the principal time to answer a ping (default 10s)",
                    ));
                }
                Some(KeepaliveConfig {
                    interval,
                    timeout: self.keepalive_timeout,
                })
            }
        };
        let heartbeat_interval = FLAGS.optional_interval(
            "heartbeat-interval",
            self.heartbeat_interval,
            "for no heartbeats",
        )?;
        if self.reconnect_backoff_max < Duration::from_secs(1) {
            return Err(FLAGS.invalid(
                "reconnect-backoff-max",
                "must be at least 1s so a down principal is not hammered (default 60s)",
            ));
        }
        let grpc_max_message_size = self.grpc.check(&FLAGS)?;
        let resync_interval = FLAGS.optional_interval(
            "resync-interval",
            self.resync_interval,
            "for resyncing only on (re)connect",
        )?;
        let cache_refresh_interval = FLAGS.optional_interval(
            "cache-refresh-interval",
            self.cache_refresh_interval,
            "for never sending cluster cache counts",
        )?;

        let log_endpoint = non_empty(self.log_endpoint)
            .map(|url| parse_log_endpoint(&url).map_err(|e| FLAGS.invalid("log-endpoint", e)))
            .transpose()?;

        let process = self.process.check(&FLAGS)?;
        let label_selector = FLAGS
            .label_selector(self.label_selector)?
            .map(|s| s.to_string());

        Ok(AgentConfig {
            server_address: self.server_address,
            tls_server_name,
            mode: self.mode,
            tls,
            tls_secrets,
            tls_secret_dir,
            tls_policy: self.tls_policy.check(&FLAGS)?,
            namespace: self.namespace,
            allowed_namespaces,
            redis_address: self.redis_address,
            redis_credentials,
            redis_tls,
            queue_dir: self.queue_dir,
            metrics_address: self.ops.metrics_address,
            health_address: self.ops.health_address,
            keepalive,
            heartbeat_interval,
            reconnect_backoff_max: self.reconnect_backoff_max,
            grpc_max_message_size,
            enable_resource_proxy: self.enable_resource_proxy,
            enable_compression: self.enable_compression,
            enable_websocket: self.enable_websocket,
            log_endpoint,
            destination_based_mapping: self.destination_based_mapping,
            create_namespace: self.create_namespace,
            source_uid_mismatch_policy: self.source_uid_mismatch_policy,
            adoption_policy: self.adoption_policy,
            ignore_unmanaged_apps: self.ignore_unmanaged_apps,
            on_application_recreate: self.on_application_recreate,
            resync_interval,
            cache_refresh_interval,
            kube: process.kube,
            log_level: process.log_level,
            log_format: process.log_format,
            label_selector,
            otlp_address: process.otlp_address,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    struct Files {
        dir: tempfile::TempDir,
    }

    impl Files {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            for name in ["client.crt", "client.key", "ca.crt"] {
                std::fs::write(dir.path().join(name), "not checked here\n").unwrap();
            }
            Files { dir }
        }

        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }

        fn args(&self, extra: &[&str]) -> Result<AgentArgs, clap::Error> {
            let mut argv = vec![
                "argocd-agent".to_string(),
                "--server-address=principal.example.com:8443".to_string(),
                format!("--tls-client-cert={}", self.path("client.crt")),
                format!("--tls-client-key={}", self.path("client.key")),
                format!("--tls-ca={}", self.path("ca.crt")),
                format!("--queue-dir={}", self.path("queue")),
            ];
            argv.extend(extra.iter().map(|s| s.to_string()));
            AgentArgs::try_parse_from(argv)
        }

        fn validate(&self, extra: &[&str]) -> Result<AgentConfig, ConfigError> {
            self.args(extra).expect("clap accepts").validate()
        }
    }

    #[test]
    fn tls_from_upstreams_secrets_unless_files_and_none_in_plaintext() {
        let files = Files::new();
        let bare = |extra: &[&str], env: &[(&str, &str)]| {
            let mut argv = vec![
                "argocd-agent".to_string(),
                "--server-address=principal.example.com:8443".to_string(),
                format!("--queue-dir={}", files.path("queue")),
            ];
            argv.extend(extra.iter().map(|s| s.to_string()));
            AgentArgs::try_parse_from(argv)
                .unwrap()
                .validate_with_env(env_of(env))
        };
        let config = bare(&[], &[]).unwrap();
        let secrets: Vec<(&str, &str)> = config
            .tls_secrets
            .iter()
            .map(|f| (f.flag, f.secret.as_str()))
            .collect();
        assert_eq!(
            secrets,
            [
                ("tls-secret-name", "argocd-agent-client-tls"),
                ("tls-secret-name", "argocd-agent-client-tls"),
                ("root-ca-secret-name", "argocd-agent-ca"),
            ]
        );
        let upstream = [(UPSTREAM_ROOT_CA_SECRET_ENV, "upstream-ca")];
        assert_eq!(
            bare(&[], &upstream).unwrap().tls_secrets[2].secret,
            "upstream-ca"
        );
        assert!(files.validate(&[]).unwrap().tls_secrets.is_empty());
        // Plaintext behind a mesh: no TLS at all, and never by default.
        assert!(config.tls.is_some());
        let plaintext = bare(&["--insecure-plaintext"], &[]).unwrap();
        assert!(plaintext.tls.is_none() && plaintext.tls_secrets.is_empty());
        // HTTP/2 unless asked; the WebSocket transport goes with either.
        assert!(!config.enable_websocket);
        assert!(
            bare(&["--enable-websocket", "--insecure-plaintext"], &[])
                .unwrap()
                .enable_websocket
        );
        let err = files
            .validate(&["--insecure-plaintext"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("drop --tls-client-cert"), "{err}");
    }

    #[test]
    fn every_flag_has_its_env_var() {
        assert_eq!(
            FLAGS.flags_without_their_env_var(&AgentArgs::command()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn defaults_match_the_documented_contract() {
        let files = Files::new();
        let config = files.validate(&[]).unwrap();
        assert_eq!(
            config.server_address.to_string(),
            "principal.example.com:8443"
        );
        assert_eq!(config.tls_server_name, "principal.example.com");
        assert_eq!(config.mode, AgentMode::Managed);
        assert_eq!(config.namespace, "argocd");
        assert_eq!(config.redis_address.to_string(), "argocd-redis:6379");
        assert_eq!(config.metrics_address, "0.0.0.0:8181".parse().unwrap());
        assert_eq!(config.health_address, "0.0.0.0:8001".parse().unwrap());
        assert_eq!(
            config.keepalive,
            Some(KeepaliveConfig {
                interval: Duration::from_secs(30),
                timeout: Duration::from_secs(10)
            })
        );
        assert_eq!(config.heartbeat_interval, None);
        assert_eq!(config.reconnect_backoff_max, Duration::from_secs(60));
        assert_eq!(config.grpc_max_message_size, 16 << 20);
        assert!(config.enable_resource_proxy);
        assert_eq!(
            config.source_uid_mismatch_policy,
            SourceUidMismatchPolicy::Recreate
        );
        assert_eq!(
            config.adoption_policy,
            AdoptionPolicy::Never,
            "upstream's agent never adopts an unmanaged Application"
        );
        assert_eq!(config.resync_interval, Some(Duration::from_secs(300)));
        assert_eq!(config.cache_refresh_interval, Some(Duration::from_secs(10)));
        assert_eq!(config.tls_policy, TlsPolicy::default());
    }

    #[test]
    fn default_queue_dir_is_documented() {
        let args = AgentArgs::try_parse_from([
            "argocd-agent",
            "--server-address=p:1",
            "--tls-client-cert=a",
            "--tls-client-key=b",
            "--tls-ca=c",
        ])
        .unwrap();
        assert_eq!(args.queue_dir, PathBuf::from("/var/lib/argocd-agent/queue"));
    }

    #[test]
    fn server_address_needs_a_port() {
        let files = Files::new();
        let err = files.args(&["--server-address=principal"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
    }

    #[test]
    fn tls_server_name_overrides_the_host() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--server-address=10.0.0.5:443",
                "--tls-server-name=principal.hub",
            ])
            .unwrap();
        assert_eq!(config.tls_server_name, "principal.hub");
        let err = files
            .validate(&["--tls-server-name=not a name"])
            .unwrap_err();
        assert_eq!(err.flag(), "tls-server-name");
    }

    #[test]
    fn missing_client_key_names_flag_and_env() {
        let files = Files::new();
        let err = files
            .validate(&["--tls-client-key=/nonexistent/client.key"])
            .unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("--tls-client-key (env ARGOCD_AGENT_TLS_CLIENT_KEY)"),
            "{message}"
        );
        assert!(message.contains("/nonexistent/client.key"), "{message}");
    }

    #[test]
    fn autonomous_mode_rejects_managed_only_mapping_options() {
        let files = Files::new();
        let err = files
            .validate(&["--mode=autonomous", "--destination-based-mapping"])
            .unwrap_err();
        assert_eq!(err.flag(), "destination-based-mapping");
        assert!(err.to_string().contains("ARGOCD_AGENT_MODE"), "{err}");
        let err = files
            .validate(&["--mode=autonomous", "--create-namespace=true"])
            .unwrap_err();
        assert_eq!(err.flag(), "create-namespace");
    }

    #[test]
    fn destination_mapping_flags_take_effect_together_and_are_refused_alone() {
        let files = Files::new();
        for alone in [
            &["--create-namespace"][..],
            &["--allowed-namespaces=team-*"][..],
        ] {
            let err = files.validate(alone).unwrap_err();
            assert!(
                err.to_string()
                    .contains("ARGOCD_AGENT_DESTINATION_BASED_MAPPING"),
                "{alone:?}: {err}"
            );
        }
        let config = files
            .validate(&[
                "--destination-based-mapping",
                "--create-namespace",
                "--allowed-namespaces=team-*,apps",
            ])
            .unwrap();
        assert!(config.destination_based_mapping && config.create_namespace);
        assert_eq!(config.allowed_namespaces, vec!["team-*", "apps"]);
        let err = files
            .validate(&["--mode=autonomous", "--destination-based-mapping"])
            .unwrap_err();
        assert_eq!(err.flag(), "destination-based-mapping");
        assert!(err.to_string().contains("managed agents only"), "{err}");
        let config = files
            .validate(&[
                "--destination-based-mapping=false",
                "--create-namespace=false",
                "--allowed-namespaces=",
            ])
            .unwrap();
        assert!(!config.destination_based_mapping && !config.create_namespace);
        assert!(config.allowed_namespaces.is_empty());
    }

    #[test]
    fn queue_dir_must_be_a_directory_or_creatable() {
        let files = Files::new();
        assert!(files
            .validate(&[&format!("--queue-dir={}", files.path("a/b/c"))])
            .is_ok());
        let err = files
            .validate(&[&format!("--queue-dir={}", files.path("ca.crt"))])
            .unwrap_err();
        assert_eq!(err.flag(), "queue-dir");
        let err = files
            .validate(&[&format!("--queue-dir={}", files.path("ca.crt/sub"))])
            .unwrap_err();
        assert!(err.to_string().contains("not a directory"), "{err}");
    }

    #[test]
    fn intervals_are_checked() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--keepalive-interval=0",
                "--heartbeat-interval=30s",
                "--resync-interval=0",
            ])
            .unwrap();
        assert_eq!(config.keepalive, None);
        assert_eq!(config.heartbeat_interval, Some(Duration::from_secs(30)));
        assert_eq!(config.resync_interval, None);
        assert_eq!(
            files
                .validate(&["--keepalive-timeout=0"])
                .unwrap_err()
                .flag(),
            "keepalive-timeout"
        );
        assert_eq!(
            files
                .validate(&["--reconnect-backoff-max=10ms"])
                .unwrap_err()
                .flag(),
            "reconnect-backoff-max"
        );
        assert_eq!(
            files
                .validate(&["--heartbeat-interval=100ms"])
                .unwrap_err()
                .flag(),
            "heartbeat-interval"
        );
    }

    #[test]
    fn metrics_and_health_may_share_an_address_but_not_a_port() {
        let files = Files::new();
        assert!(files
            .validate(&[
                "--metrics-address=127.0.0.1:9000",
                "--health-address=127.0.0.1:9000"
            ])
            .is_ok());
        let err = files
            .validate(&[
                "--metrics-address=0.0.0.0:9000",
                "--health-address=127.0.0.1:9000",
            ])
            .unwrap_err();
        assert_eq!(err.flag(), "metrics-address");
    }

    #[test]
    fn log_endpoint_is_an_http_url() {
        let files = Files::new();
        assert_eq!(files.validate(&[]).unwrap().log_endpoint, None);
        let config = files
            .validate(&["--log-endpoint=http://127.0.0.1:8080"])
            .unwrap();
        assert_eq!(
            config.log_endpoint.unwrap().to_string(),
            "http://127.0.0.1:8080/"
        );
        for bad in ["ftp://logs", "logs:8080", "http://logs?x=1", "not a url"] {
            let err = files
                .validate(&[&format!("--log-endpoint={bad}")])
                .unwrap_err();
            assert_eq!(err.flag(), "log-endpoint", "{bad}");
            assert!(
                err.to_string().contains("ARGOCD_AGENT_LOG_ENDPOINT"),
                "{err}"
            );
        }
    }

    #[test]
    fn policies_parse() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--source-uid-mismatch-policy=upsert",
                "--adoption-policy=always",
            ])
            .unwrap();
        assert_eq!(
            config.source_uid_mismatch_policy,
            SourceUidMismatchPolicy::Upsert
        );
        assert_eq!(config.adoption_policy, AdoptionPolicy::Always);
        assert!(files.args(&["--adoption-policy=sometimes"]).is_err());
    }

    #[test]
    fn upstreams_application_flags_default_as_upstream_and_refuse_unknown_values() {
        let files = Files::new();
        let config = files.validate(&[]).unwrap();
        assert_eq!(
            config.source_uid_mismatch_policy,
            SourceUidMismatchPolicy::Recreate
        );
        assert_eq!(config.on_application_recreate, RecreateAction::Ignore);
        assert!(!config.ignore_unmanaged_apps);
        let config = files
            .validate(&[
                "--on-application-recreate=clear-status",
                "--ignore-unmanaged-apps",
            ])
            .unwrap();
        assert_eq!(config.on_application_recreate, RecreateAction::ClearStatus);
        assert!(config.ignore_unmanaged_apps);
        // Unknown values are refused with the valid ones named.
        for (flag, valid) in [
            (
                "--on-application-recreate=restart",
                "ignore, clear-status, resync",
            ),
            ("--source-uid-mismatch-policy=merge", "recreate, upsert"),
        ] {
            let err = files.args(&[flag]).unwrap_err().to_string();
            assert!(err.contains(valid), "{flag}: {err}");
        }
        // Managed only: refused for autonomous agents, not silently without effect.
        for flag in [
            "--ignore-unmanaged-apps",
            "--on-application-recreate=resync",
        ] {
            let err = files.validate(&["--mode=autonomous", flag]).unwrap_err();
            assert!(flag.contains(err.flag()), "{flag}: {err}");
            assert!(err.to_string().contains("--mode=managed"), "{err}");
        }
        assert!(files
            .validate(&["--mode=autonomous", "--on-application-recreate=ignore"])
            .is_ok());
    }

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: std::collections::HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn creds(user: Option<&str>, password: &str) -> Option<RedisCredentials> {
        Some(RedisCredentials {
            username: user.map(str::to_string),
            password: RedisPassword::new(password),
        })
    }

    #[test]
    fn redis_credentials_come_from_flags_then_upstream_env_vars() {
        let files = Files::new();
        let no_env = env_of(&[]);
        let v = |extra: &[&str], env: &dyn Fn(&str) -> Option<String>| {
            files
                .args(extra)
                .expect("clap accepts")
                .validate_with_env(env)
        };
        assert_eq!(v(&[], &no_env).unwrap().redis_credentials, None);
        assert_eq!(
            v(&["--redis-password=s3cret"], &no_env)
                .unwrap()
                .redis_credentials,
            creds(None, "s3cret")
        );
        assert_eq!(
            v(&["--redis-username=argo", "--redis-password=pw"], &no_env)
                .unwrap()
                .redis_credentials,
            creds(Some("argo"), "pw")
        );
        // Argo CD's and upstream argocd-agent's names, as the argocd-redis secret is usually mounted.
        let upstream = env_of(&[("REDIS_PASSWORD", "from-env"), ("REDIS_USERNAME", "u")]);
        assert_eq!(
            v(&[], &upstream).unwrap().redis_credentials,
            creds(Some("u"), "from-env")
        );
        // Our flag wins over upstream's env var; an empty env var counts as unset.
        assert_eq!(
            v(&["--redis-password=flag"], &upstream)
                .unwrap()
                .redis_credentials,
            creds(Some("u"), "flag")
        );
        assert_eq!(
            v(&[], &env_of(&[("REDIS_PASSWORD", "")]))
                .unwrap()
                .redis_credentials,
            None
        );
        let err = v(&["--redis-username=argo"], &no_env).unwrap_err();
        assert_eq!(err.flag(), "redis-username");
    }

    #[test]
    fn redis_creds_dir_holds_auth_and_optional_username_and_excludes_the_password_flags() {
        let files = Files::new();
        let dir = files.dir.path().join("redis-creds");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("auth"), "from-file\n").unwrap();
        let flag = format!("--redis-creds-dir-path={}", dir.display());
        let no_env = env_of(&[]);
        let v = |extra: &[&str], env: &dyn Fn(&str) -> Option<String>| {
            files
                .args(extra)
                .expect("clap accepts")
                .validate_with_env(env)
        };
        assert_eq!(
            v(&[&flag], &no_env).unwrap().redis_credentials,
            creds(None, "from-file")
        );
        std::fs::write(dir.join("auth_username"), " argo \n").unwrap();
        assert_eq!(
            v(&[&flag], &no_env).unwrap().redis_credentials,
            creds(Some("argo"), "from-file")
        );
        // Upstream's REDIS_CREDS_DIR_PATH, and it wins over REDIS_PASSWORD as in Argo CD.
        let env = env_of(&[
            ("REDIS_CREDS_DIR_PATH", dir.to_str().unwrap()),
            ("REDIS_PASSWORD", "ignored"),
        ]);
        assert_eq!(
            v(&[], &env).unwrap().redis_credentials,
            creds(Some("argo"), "from-file")
        );
        let err = v(&[&flag, "--redis-password=x"], &no_env).unwrap_err();
        assert_eq!(err.flag(), "redis-creds-dir-path");
        assert!(
            err.to_string().contains("ARGOCD_AGENT_REDIS_PASSWORD"),
            "{err}"
        );
        std::fs::remove_file(dir.join("auth")).unwrap();
        let err = v(&[&flag], &no_env).unwrap_err();
        assert_eq!(err.flag(), "redis-creds-dir-path");
        assert!(err.to_string().contains("`auth`"), "{err}");
    }

    #[test]
    fn redis_password_is_never_shown() {
        let files = Files::new();
        let config = files
            .args(&["--redis-password=hunter2"])
            .unwrap()
            .validate_with_env(env_of(&[]))
            .unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
        assert!(
            !format!("{:?}", files.args(&["--redis-password=hunter2"]).unwrap())
                .contains("hunter2")
        );
        let help = AgentArgs::command().render_long_help().to_string();
        assert!(help.contains("ARGOCD_AGENT_REDIS_PASSWORD"), "{help}");
    }

    #[test]
    fn redis_tls_takes_one_verification_mode() {
        let files = Files::new();
        assert_eq!(files.validate(&[]).unwrap().redis_tls, None);
        assert_eq!(
            files
                .validate(&["--redis-tls-enabled", "--redis-tls-insecure"])
                .unwrap()
                .redis_tls,
            Some(RedisTls::Insecure)
        );
        let ca = files.path("ca.crt");
        assert_eq!(
            files
                .validate(&["--redis-tls-enabled", &format!("--redis-tls-ca-path={ca}")])
                .unwrap()
                .redis_tls,
            Some(RedisTls::Ca(PathBuf::from(&ca)))
        );
        // TLS with no mode named: the CA in upstream's Secret, read at start.
        let config = files.validate(&["--redis-tls-enabled"]).unwrap();
        let Some(RedisTls::Ca(path)) = config.redis_tls else {
            panic!("{:?}", config.redis_tls)
        };
        let secret = config.tls_secrets.iter().find(|f| f.path == path).unwrap();
        assert_eq!(secret.secret, "argocd-redis-tls");
        for (bad, flag) in [
            (vec!["--redis-tls-insecure"], "redis-tls-insecure"),
            (
                vec!["--redis-tls-ca-secret-name=mine"],
                "redis-tls-ca-secret-name",
            ),
            (
                vec![
                    "--redis-tls-enabled",
                    "--redis-tls-insecure",
                    "--redis-tls-ca-path=/x",
                ],
                "redis-tls-insecure",
            ),
            (
                vec![
                    "--redis-tls-enabled",
                    "--redis-tls-ca-path=/nonexistent/ca.crt",
                ],
                "redis-tls-ca-path",
            ),
        ] {
            assert_eq!(files.validate(&bad).unwrap_err().flag(), flag, "{bad:?}");
        }
    }
}
