//! Command-line and environment configuration of `argocd-principal`.
//!
//! Owns: [`PrincipalArgs`] (every flag, each mirrored by an `ARGOCD_PRINCIPAL_<FLAG>` env var),
//! its validation into [`PrincipalConfig`] (files readable, names well-formed, listeners not
//! colliding, durations sane). The checks both binaries share, and [`ConfigError`] whose messages
//! name the flag and env var and say what to do, live in [`binary_config`]. Syntax errors (an
//! unknown mode, a malformed address) are clap's and exit 2 too.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_kube::secret_files::{self, SecretContent, SecretFile};
use argocd_agent_proto::identity::{HeaderIdentity, IdentityPattern, IdentitySource};
use argocd_agent_runtime::binary_config::{self, non_empty, FlagEnv};
use argocd_agent_runtime::flags::{self, AgentMode, HostPort};
use argocd_agent_runtime::label_selector::LabelSelector;
use argocd_agent_runtime::process_args::{
    GrpcMessageArgs, OpsAddressArgs, ProcessArgs, RedisCredentialArgs, TlsPolicyArgs,
};
use argocd_agent_runtime::telemetry::LogFormat;
use argocd_agent_runtime::tls::TlsPolicy;
use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser};

pub use argocd_agent_runtime::binary_config::{ConfigError, KubeClientConfig};
pub use argocd_agent_runtime::redis_client::RedisTls;
use argocd_agent_runtime::redis_client::{
    redis_tls_choice, RedisTlsChoice, RedisTlsFlags, REDIS_CA_SECRET_FIELD,
};
pub use argocd_agent_runtime::redis_credentials::{
    redis_credentials, RedisCredentials, RedisPassword, UPSTREAM_REDIS_ENV,
};

/// Prefix of every env var mirroring a principal flag.
pub const ENV_PREFIX: &str = "ARGOCD_PRINCIPAL_";

/// The principal's flags and the env vars mirroring them.
const FLAGS: FlagEnv = FlagEnv::new(ENV_PREFIX);

/// Upstream's env var for `--tls-ca-secret-name`, read when ours is not set.
pub const UPSTREAM_TLS_CA_SECRET_ENV: &str = "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME";

/// Upstream's env vars for `--redis-proxy-server-tls-cert` / `-key`, read when ours are not set.
pub const UPSTREAM_REDIS_PROXY_CERT_ENV: &str = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT_PATH";
/// See [`UPSTREAM_REDIS_PROXY_CERT_ENV`].
pub const UPSTREAM_REDIS_PROXY_KEY_ENV: &str = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY_PATH";

/// The principal's Redis TLS flags (upstream's names).
const REDIS_TLS_FLAGS: RedisTlsFlags = RedisTlsFlags {
    enabled: "redis-tls-enabled",
    ca_path: "redis-ca-path",
    ca_secret: "redis-ca-secret-name",
    insecure: "redis-tls-insecure",
};

/// Default `--tls-ca-secret-name` (upstream's).
pub const DEFAULT_CA_SECRET_NAME: &str = "argocd-agent-ca";

/// Default `--redis-proxy-server-tls-secret-name` (upstream's).
pub const DEFAULT_REDIS_PROXY_TLS_SECRET_NAME: &str = "argocd-redis-proxy-tls";

/// Default `--jwt-secret-name` (upstream's).
pub const DEFAULT_JWT_SECRET_NAME: &str = "argocd-agent-jwt";

/// The field of the `--jwt-secret-name` Secret holding the key (upstream's).
pub const JWT_SECRET_FIELD: &str = "jwt.key";

/// The env var that mirrors `--<flag>`.
pub fn env_var_for(flag: &str) -> String {
    FLAGS.env_var_for(flag)
}

/// `argocd-principal`: the hub side of argocd-agent.
///
/// Every flag can also be set through the environment variable shown next to it; a flag given
/// twice takes its last value.
#[derive(Debug, Clone, Parser)]
#[command(name = "argocd-principal", version, about, long_about = None, args_override_self = true)]
#[command(mut_args = FLAGS.mirror_env())]
#[command(mut_args = OpsAddressArgs::defaults("0.0.0.0:8000", "0.0.0.0:8003"))]
pub struct PrincipalArgs {
    /// Address the agent-facing gRPC (mTLS) server listens on.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_LISTEN_ADDRESS",
        default_value = "0.0.0.0:8443",
        value_name = "IP:PORT"
    )]
    pub listen_address: SocketAddr,

    /// Server certificate (PEM) of the gRPC listener [default: tls.crt of --tls-secret-name].
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of the gRPC listener's certificate [default: tls.key of
    /// --tls-secret-name].
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,

    /// CA bundle (PEM) that agents' client certificates must chain to [default: tls.crt and
    /// ca.crt of --tls-ca-secret-name].
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,

    /// kubernetes.io/tls Secret in --namespace holding the gRPC listener's certificate (tls.crt,
    /// tls.key), read when --tls-cert and --tls-key are not given; re-read every few seconds, so a
    /// rotated certificate serves new connections.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_TLS_SECRET_NAME",
        default_value = "argocd-agent-principal-tls",
        value_name = "NAME"
    )]
    pub tls_secret_name: String,

    /// Secret in --namespace holding the CA agents' certificates must chain to (fields tls.crt
    /// and/or ca.crt), read when --tls-ca is not given; re-read every few seconds. Upstream's env
    /// var ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME is read too [default: argocd-agent-ca].
    #[arg(long, env = "ARGOCD_PRINCIPAL_TLS_CA_SECRET_NAME", value_name = "NAME")]
    pub tls_ca_secret_name: Option<String>,

    #[command(flatten)]
    pub tls_policy: TlsPolicyArgs,

    /// Longest TLS handshake on the gRPC and resource proxy listeners; slower clients are dropped.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_TLS_HANDSHAKE_TIMEOUT",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub tls_handshake_timeout: Duration,

    /// Longest silence after a handshake before the first request on the gRPC and resource proxy
    /// listeners (and the longest a Redis proxy command may take to arrive); then the connection closes.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REQUEST_HEADER_TIMEOUT",
        default_value = "10s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub request_header_timeout: Duration,

    /// Longest a resource proxy request body may take to arrive in full; a stalled one is answered
    /// 408 and its connection closed.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REQUEST_BODY_TIMEOUT",
        default_value = "30s",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub request_body_timeout: Duration,

    /// Resource proxy request bodies being received at once, read or waiting for their turn, from
    /// all clients; one more is answered 429 (Retry-After: 1) naming this flag and its HTTP/1.1
    /// connection closed. Bounds the memory of stalled bodies (each holds its connection's TLS and
    /// HTTP buffers, up to ~100 KiB) [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_MAX_REQUEST_BODIES_IN_FLIGHT",
        default_value_t = crate::resource_proxy::DEFAULT_MAX_BODIES_IN_FLIGHT,
        value_name = "N"
    )]
    pub max_request_bodies_in_flight: usize,

    /// Resource proxy request bodies of one agent (the agent a request is for: its bearer token's
    /// or client certificate's) being received at once; one more is answered 429 naming this flag,
    /// so an agent stalling bodies leaves room for the others' writes [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_MAX_REQUEST_BODIES_IN_FLIGHT_PER_AGENT",
        default_value_t = crate::resource_proxy::DEFAULT_MAX_BODIES_IN_FLIGHT_PER_AGENT,
        value_name = "N"
    )]
    pub max_request_bodies_in_flight_per_agent: usize,

    /// A web terminal (pods/exec through the resource proxy) with no data in either direction
    /// this long is ended, and with it the exec on the spoke.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_TERMINAL_IDLE_TIMEOUT",
        default_value = "15m",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub terminal_idle_timeout: Duration,

    /// Web terminal sessions (pods/exec through the resource proxy) open at once in all; one more
    /// is refused with a message naming this flag, before its agent is asked to open it [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_TERMINAL_MAX_SESSIONS",
        default_value_t = crate::terminal::DEFAULT_MAX_SESSIONS,
        value_name = "N"
    )]
    pub terminal_max_sessions: usize,

    /// Web terminal sessions open at once per agent; one more is refused with a message naming
    /// this flag, before the agent is asked to open it [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_TERMINAL_MAX_SESSIONS_PER_AGENT",
        default_value_t = crate::terminal::DEFAULT_MAX_SESSIONS_PER_AGENT,
        value_name = "N"
    )]
    pub terminal_max_sessions_per_agent: usize,

    /// Private key (PEM, RSA or EC) that signs agents' session tokens (JWT); re-read every few
    /// seconds, so a rotated key signs new tokens [default: jwt.key of --jwt-secret-name].
    #[arg(long, env = "ARGOCD_PRINCIPAL_JWT_KEY", value_name = "PATH")]
    pub jwt_key: Option<PathBuf>,

    /// Secret in --namespace whose field `jwt.key` is the JWT signing key (upstream's), read when
    /// neither --jwt-key nor --insecure-jwt-generate is given; re-read every few seconds, so a
    /// rotated key signs new tokens [default: argocd-agent-jwt].
    #[arg(long, env = "ARGOCD_PRINCIPAL_JWT_SECRET_NAME", value_name = "NAME")]
    pub jwt_secret_name: Option<String>,

    /// Generate a throwaway JWT signing key at start-up (tokens do not survive a restart; dev only).
    #[arg(long, env = "ARGOCD_PRINCIPAL_INSECURE_JWT_GENERATE", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub insecure_jwt_generate: bool,

    /// How agents are identified: `mtls` or `mtls:subject:CN` (client certificate subject common
    /// name), `mtls:subject:<regex>` / `mtls:uri:<regex>` (first capture group), `mtls:uri:<prefix>`
    /// (URI SAN starting with prefix, SPIFFE style), or `header:<header-name>:<regex>` (first
    /// capture group of a request header a service mesh sets; requires --insecure-plaintext).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_AUTH",
        default_value = "mtls:subject:CN",
        value_name = "METHOD",
        value_parser = parse_auth
    )]
    pub auth: AuthMethod,

    /// INSECURE: Run the gRPC server without TLS, for a service mesh (e.g. Istio) whose sidecar
    /// terminates the agents' mTLS and sets the identity header of --auth=header:...; only that
    /// sidecar may be able to reach --listen-address. The resource proxy keeps its TLS.
    #[arg(long, env = "ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub insecure_plaintext: bool,

    /// Also serve gRPC over WebSocket on HTTP/1.1 on --listen-address, for agents behind
    /// proxies or load balancers that do not pass HTTP/2 (agents need --enable-websocket too):
    /// upstream's flag, wire-compatible with its golang.stackrox.io/grpc-http1 transport. Native
    /// gRPC keeps being served on the same port.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_websocket: bool,

    /// Namespace of Argo CD on the hub.
    #[arg(
        long,
        short = 'n',
        env = "ARGOCD_PRINCIPAL_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub namespace: String,

    /// Hub namespaces whose Applications are synced, comma-separated; upstream's patterns allowed
    /// (globs '*', '?', '[abc]', '[a-z]', '[!...]', or a /regular expression/). An Application in any other namespace is not sent to (or kept on) its agent, nor is the
    /// status of one accepted from it [default: every namespace].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES",
        value_delimiter = ',',
        value_name = "PATTERNS"
    )]
    pub allowed_namespaces: Vec<String>,

    /// Create the hub namespace of an autonomous agent when it first connects.
    #[arg(long, env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub namespace_create_enable: bool,

    /// Only create hub namespaces whose name this regular expression matches (anywhere in the
    /// name, as upstream: anchor it with ^...$ for a whole-name match); other autonomous agents
    /// without a hub namespace are refused with that reason [default: any name].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN",
        value_name = "REGEX"
    )]
    pub namespace_create_pattern: Option<String>,

    /// Labels put on the hub namespaces the principal creates, comma-separated key=value pairs.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS",
        value_delimiter = ',',
        value_name = "KEY=VALUE"
    )]
    pub namespace_create_labels: Vec<String>,

    /// Route Applications to agents by `spec.destination.name` instead of by namespace: a hub
    /// Application in any namespace --allowed-namespaces admits goes to the agent its destination
    /// names (agents run with --destination-based-mapping too, and keep its namespace). Autonomous
    /// agents still map by namespace.
    #[arg(long, env = "ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub destination_based_mapping: bool,

    /// Agent modes allowed to connect, comma-separated [default: managed,autonomous].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_ALLOWED_AGENT_MODES",
        value_delimiter = ',',
        default_value = "managed,autonomous",
        hide_default_value = true,
        value_name = "MODES"
    )]
    pub allowed_agent_modes: Vec<AgentMode>,

    /// Serve the resource proxy (Argo CD's hub-side view of agents' live resources).
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY", default_value_t = true,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_resource_proxy: bool,

    /// Address the resource proxy listens on.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS",
        default_value = "0.0.0.0:9090",
        value_name = "IP:PORT"
    )]
    pub resource_proxy_address: SocketAddr,

    /// Server certificate (PEM) of the resource proxy [default: the --tls-cert file].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT",
        value_name = "PATH"
    )]
    pub resource_proxy_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of the resource proxy certificate [default: the --tls-key file].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_KEY",
        value_name = "PATH"
    )]
    pub resource_proxy_tls_key: Option<PathBuf>,

    /// kubernetes.io/tls Secret in --namespace holding the resource proxy's certificate (tls.crt,
    /// tls.key), read when --resource-proxy-tls-cert/-key are not given; re-read every few
    /// seconds [default: the gRPC listener's certificate].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME",
        value_name = "NAME"
    )]
    pub resource_proxy_secret_name: Option<String>,

    /// CA bundle (PEM) for the resource proxy's clients (Argo CD) [default: the --tls-ca file].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CA",
        value_name = "PATH"
    )]
    pub resource_proxy_tls_ca: Option<PathBuf>,

    /// Create the Argo CD cluster secret `cluster-<agent>` of a connecting agent that has none,
    /// with a bearer token naming the agent and the shared client certificate of
    /// --self-registration-client-cert-secret; the cluster URL is the resource proxy's address
    /// (`argocd-agent-resource-proxy:<port>` when it listens on all interfaces).
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_self_cluster_registration: bool,

    /// Secret in --namespace holding the resource-proxy client certificate shared by
    /// self-registered clusters (`tls.crt`, `tls.key`, optional `ca.crt` [default: the resource
    /// proxy's client CA]).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_SELF_REGISTRATION_CLIENT_CERT_SECRET",
        value_name = "NAME"
    )]
    pub self_registration_client_cert_secret: Option<String>,

    /// Serve the Redis proxy that routes Argo CD's cache reads to agents.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_REDIS_PROXY", default_value_t = true,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_redis_proxy: bool,

    /// Address the Redis proxy listens on.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_ADDRESS",
        default_value = "0.0.0.0:6379",
        value_name = "IP:PORT"
    )]
    pub redis_proxy_address: SocketAddr,

    /// The hub's Argo CD Redis (upstream of the proxy, and where connection state is written).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS",
        default_value = "argocd-redis:6379",
        value_name = "HOST:PORT"
    )]
    pub redis_server_address: HostPort,

    /// Credentials of the local Argo CD Redis.
    #[command(flatten)]
    pub redis: RedisCredentialArgs,

    /// Talk TLS to the hub Redis (verified as --redis-ca-path, --redis-ca-secret-name or
    /// --redis-tls-insecure say) and serve TLS on the Redis proxy (certificate from
    /// --redis-proxy-server-tls-cert/-key or the Secret --redis-proxy-server-tls-secret-name), as
    /// upstream: for an Argo CD whose Redis runs with TLS (argocd-server `--redis-use-tls`).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub redis_tls_enabled: bool,

    /// CA bundle (PEM) the hub Redis certificate must chain to (with --redis-tls-enabled; one of
    /// this, --redis-ca-secret-name and --redis-tls-insecure at most).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_CA_PATH", value_name = "PATH")]
    pub redis_ca_path: Option<PathBuf>,

    /// Secret in --namespace whose field `ca.crt` is the CA bundle the hub Redis certificate must
    /// chain to; with --redis-tls-enabled and neither --redis-ca-path nor --redis-tls-insecure,
    /// `argocd-redis-tls` (as upstream). Read at start.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_CA_SECRET_NAME",
        value_name = "NAME"
    )]
    pub redis_ca_secret_name: Option<String>,

    /// INSECURE: accept any hub Redis certificate (TLS without verification).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_TLS_INSECURE", default_value_t = false,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub redis_tls_insecure: bool,

    /// Certificate (PEM) the Redis proxy serves with --redis-tls-enabled (with
    /// --redis-proxy-server-tls-key; else the Secret --redis-proxy-server-tls-secret-name) [fallback
    /// env: ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT_PATH].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT",
        value_name = "PATH"
    )]
    pub redis_proxy_server_tls_cert: Option<PathBuf>,

    /// Private key (PEM) of --redis-proxy-server-tls-cert [fallback env:
    /// ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY_PATH].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY",
        value_name = "PATH"
    )]
    pub redis_proxy_server_tls_key: Option<PathBuf>,

    /// `kubernetes.io/tls` Secret in --namespace with the Redis proxy's certificate, used with
    /// --redis-tls-enabled when no certificate files are given; re-read at the TLS reload pace
    /// [default: argocd-redis-proxy-tls].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_SECRET_NAME",
        value_name = "NAME"
    )]
    pub redis_proxy_server_tls_secret_name: Option<String>,

    /// Compression of the hub Argo CD's Redis cache, as its `--redis-compress` (gzip or none):
    /// how agents' cluster connection state and cache counts are written there.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE",
        default_value = "gzip",
        value_name = "gzip|none"
    )]
    pub redis_compression_type: argocd_agent_kube::argocd_cache::RedisCompression,

    /// Largest request a Redis proxy client may send, in bytes (units such as 16MiB accepted): a
    /// command declaring more gets an error and its connection is closed, before the bytes are
    /// read [range 1KiB..=512MiB].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_REQUEST_SIZE",
        default_value = "16MiB",
        value_name = "BYTES",
        value_parser = flags::parse_byte_size
    )]
    pub redis_proxy_max_request_size: usize,

    /// Connections one client IP may hold open to the Redis proxy; the next one is answered
    /// `-ERR max number of clients reached` and closed [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_CONNECTIONS_PER_IP",
        default_value_t = crate::redis_proxy::DEFAULT_MAX_CONNECTIONS_PER_IP,
        value_name = "N"
    )]
    pub redis_proxy_max_connections_per_ip: usize,

    /// Channels one Redis proxy connection may hold subscribed on agents; a SUBSCRIBE past it
    /// gets an error per channel over. Agents keep a channel until the connection ends, so
    /// UNSUBSCRIBE frees no slot [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_SUBSCRIPTIONS_PER_CONNECTION",
        default_value_t = crate::redis_proxy::DEFAULT_MAX_SUBSCRIPTIONS_PER_CONNECTION,
        value_name = "N"
    )]
    pub redis_proxy_max_subscriptions_per_connection: usize,

    /// Where metrics and health are served.
    #[command(flatten)]
    pub ops: OpsAddressArgs,

    /// Run the embedded GitOpsCluster operator.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_OPERATOR", default_value_t = true,
        action = ArgAction::Set, num_args = 0..=1, require_equals = true,
        default_missing_value = "true", value_parser = BoolishValueParser::new(), value_name = "BOOL")]
    pub enable_operator: bool,

    /// Settings of the embedded GitOpsCluster operator (`--operator-*`).
    #[command(flatten)]
    pub operator: argocd_agent_operator::gitops::OperatorFlags,

    /// The gRPC message size limit.
    #[command(flatten)]
    pub grpc: GrpcMessageArgs,

    /// gRPC connections one agent (one client certificate identity) may hold open at once; the
    /// next one gets HTTP/2 GOAWAY `ENHANCE_YOUR_CALM` naming this flag and is closed [at least 1].
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_MAX_CONNECTIONS_PER_AGENT",
        default_value_t = crate::listener::DEFAULT_MAX_CONNECTIONS_PER_AGENT,
        value_name = "N"
    )]
    pub max_connections_per_agent: usize,

    /// Shortest interval between HTTP/2 PINGs an agent may send: an agent that pings sooner three
    /// times running gets GOAWAY `too_many_pings` and is disconnected, like grpc-go's keepalive
    /// enforcement policy; pings after the principal sent it data do not count (0 = not enforced).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_KEEPALIVE_MIN_INTERVAL",
        default_value = "0",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub keepalive_min_interval: Duration,

    /// How often the principal re-checks agents' objects for missed changes (0 = only on connect).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESYNC_INTERVAL",
        default_value = "5m",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub resync_interval: Duration,

    /// Lifetime of the access tokens issued to agents.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_ACCESS_TOKEN_LIFETIME",
        default_value = "5m",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub access_token_lifetime: Duration,

    /// Lifetime of the refresh tokens issued to agents.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REFRESH_TOKEN_LIFETIME",
        default_value = "24h",
        value_name = "DURATION",
        value_parser = flags::parse_duration
    )]
    pub refresh_token_lifetime: Duration,

    /// Only hub Applications, AppProjects and repository Secrets matching this Kubernetes label
    /// selector are watched and synced to agents; one that stops matching is deleted from them.
    #[arg(long, env = "ARGOCD_PRINCIPAL_LABEL_SELECTOR", value_name = "SELECTOR")]
    pub label_selector: Option<String>,

    /// Cluster, logging and trace flags shared with the other binaries.
    #[command(flatten)]
    pub process: ProcessArgs,

    /// High availability (`--ha-*`): see [`crate::leadership`].
    #[command(flatten)]
    pub ha: crate::leadership::HaArgs,
}

impl PrincipalArgs {
    /// Parses the process's arguments and `ARGOCD_PRINCIPAL_*` env vars (an empty env var counts
    /// as unset); on a usage error prints clap's message and exits 2.
    pub fn from_env_and_args() -> Self {
        binary_config::parse_env_and_args()
    }
}

/// Parses `--auth` as upstream does: `mtls:subject:<regex>` / `mtls:uri:<regex>` (the agent name
/// is the regex's first capture group; upstream's default `CN=([^,]+)` and plain `mtls` read the
/// common name), the deprecated `mtls:<regex>` (subject), and our `mtls:uri:<prefix>` (a prefix
/// without a capture group: the name is the URI's last path segment).
fn parse_auth(value: &str) -> Result<AuthMethod, String> {
    if let Some(config) = value.strip_prefix("header:") {
        return HeaderIdentity::parse(config).map(AuthMethod::Header);
    }
    parse_mtls_auth(value).map(AuthMethod::Mtls)
}

/// How the principal identifies agents (`--auth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMethod {
    /// From the verified client certificate of a mutual-TLS connection.
    Mtls(IdentitySource),
    /// From a request header a service mesh sets (plaintext listener only).
    Header(HeaderIdentity),
}

impl AuthMethod {
    /// The method name agents send in `AuthRequest.method` (upstream's names).
    pub fn name(&self) -> &'static str {
        match self {
            AuthMethod::Mtls(_) => "mtls",
            AuthMethod::Header(_) => "header",
        }
    }
}

/// Upstream's `validateAuthTLSPairing`, with its messages: header auth only behind a plaintext
/// listener (the mesh sidecar terminates mTLS), mtls auth only with TLS.
fn check_auth_transport(auth: &AuthMethod, insecure_plaintext: bool) -> Result<(), ConfigError> {
    match (auth, insecure_plaintext) {
        (AuthMethod::Header(_), false) => Err(FLAGS.conflict(
            "auth",
            "insecure-plaintext",
            "invalid configuration: header-based authentication requires --insecure-plaintext=true. \
             Header authentication is designed for service mesh environments (e.g., Istio) where \
             the sidecar terminates mTLS and injects identity headers. Either add \
             --insecure-plaintext when using header auth behind a service mesh, or use \
             --auth=mtls:<regex> for direct TLS connections without a service mesh",
        )),
        (AuthMethod::Mtls(_), true) => Err(FLAGS.conflict(
            "auth",
            "insecure-plaintext",
            "invalid configuration: mtls authentication cannot be used with --insecure-plaintext. \
             mTLS authentication requires TLS to be enabled to receive client certificates. \
             Either remove --insecure-plaintext to enable TLS for mTLS authentication, or use \
             --auth=header:<header>:<regex> for service mesh environments with plaintext mode",
        )),
        _ => Ok(()),
    }
}

/// The `mtls:` forms of `--auth`.
fn parse_mtls_auth(value: &str) -> Result<IdentitySource, String> {
    let pattern = |re: &str| IdentityPattern::new(re).map_err(|e| format!("{value}: {e}"));
    match value {
        "mtls"
        | "mtls:subject"
        | "mtls:subject:CN"
        | "mtls:CN=([^,]+)"
        | "mtls:subject:CN=([^,]+)" => Ok(IdentitySource::CommonName),
        _ => {
            if let Some(uri) = value.strip_prefix("mtls:uri:") {
                if uri.is_empty() {
                    return Err(
                        "the URI pattern is empty; use e.g. mtls:uri:spiffe://example.org/agents/(.+)"
                            .to_string(),
                    );
                }
                return match regex::Regex::new(uri) {
                    Ok(re) if re.captures_len() > 1 => Ok(IdentitySource::UriRegex(pattern(uri)?)),
                    _ => Ok(IdentitySource::UriSan {
                        prefix: uri.to_string(),
                    }),
                };
            }
            if let Some(subject) = value.strip_prefix("mtls:subject:") {
                return Ok(IdentitySource::SubjectRegex(pattern(subject)?));
            }
            if let Some(re) = value.strip_prefix("mtls:") {
                if !re.is_empty() {
                    return Ok(IdentitySource::SubjectRegex(pattern(re)?));
                }
            }
            Err(
                "use mtls (agent name = subject CN), mtls:subject:<regex> or mtls:uri:<regex> \
                 (agent name = the regex's first capture group, as upstream), or \
                 mtls:uri:<prefix> (agent name = last path segment of a URI SAN starting with \
                 <prefix>), or header:<header-name>:<regex> behind a service mesh \
                 (with --insecure-plaintext); userpass auth is not supported"
                    .to_string(),
            )
        }
    }
}

/// What the principal's message about a missing Secret named by `--<flag>` tells the user to do:
/// the `argocd-agentctl` command that creates it (upstream's names), another Secret, or files.
/// `None` for Secrets argocd-agentctl does not create (the Redis ones).
fn missing_secret_remedy(flag: &str, namespace: &str, service: &str) -> Option<String> {
    let (create, files) = match flag {
        "tls-ca-secret-name" => (
            format!("create the CA with `argocd-agentctl pki init -n {namespace}`"),
            "--tls-ca",
        ),
        "tls-secret-name" => (
            format!(
                "issue the principal's certificate with `argocd-agentctl pki issue principal -n \
                 {namespace} --dns {service},{service}.{namespace}.svc` (after `pki init`), adding \
                 the names and addresses agents dial"
            ),
            "--tls-cert and --tls-key",
        ),
        "resource-proxy-secret-name" => (
            format!(
                "issue its certificate with `argocd-agentctl pki issue resource-proxy -n \
                 {namespace} --dns <the resource proxy Service's names>` (after `pki init`)"
            ),
            "--resource-proxy-tls-cert and --resource-proxy-tls-key",
        ),
        "jwt-secret-name" => (
            format!("create the key with `argocd-agentctl jwt create-key -n {namespace}`"),
            "--jwt-key",
        ),
        _ => return None,
    };
    Some(format!(
        "{create}, name another Secret with --{flag}, or give {files}; the principal waits for \
         it (not ready meanwhile) and starts by itself once it exists"
    ))
}

/// Server certificate, key and client CA files of one TLS listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerTlsFiles {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA bundle client certificates must chain to (PEM).
    pub client_ca: PathBuf,
}

/// Where the JWT signing key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JwtKeySource {
    /// A PEM private key file (`--jwt-key`).
    File(PathBuf),
    /// Field `jwt.key` of a Secret (`--jwt-secret-name`), kept in this file of
    /// [`PrincipalConfig::secret_dir`].
    Secret {
        /// The Secret's name.
        name: String,
        /// Where its key is kept.
        path: PathBuf,
    },
    /// A key generated at start-up (`--insecure-jwt-generate`).
    GenerateInsecure,
}

impl JwtKeySource {
    /// The file the key is read (and re-read) from; `None` for a generated key.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            JwtKeySource::File(path) | JwtKeySource::Secret { path, .. } => Some(path),
            JwtKeySource::GenerateInsecure => None,
        }
    }

    /// The flag naming where the key comes from, for messages.
    pub fn flag(&self) -> &'static str {
        match self {
            JwtKeySource::File(_) => "--jwt-key",
            JwtKeySource::Secret { .. } => "--jwt-secret-name",
            JwtKeySource::GenerateInsecure => "--insecure-jwt-generate",
        }
    }
}

/// The resource proxy listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceProxyConfig {
    /// Listen address.
    pub address: SocketAddr,
    /// TLS files (falling back to the gRPC listener's).
    pub tls: ServerTlsFiles,
}

/// Validated configuration of the principal.
#[derive(Debug, Clone, PartialEq)]
pub struct PrincipalConfig {
    /// gRPC listen address.
    pub listen_address: SocketAddr,
    /// gRPC listener TLS files.
    pub tls: ServerTlsFiles,
    /// The files kept from Secrets (`--tls-secret-name`, `--tls-ca-secret-name`,
    /// `--jwt-secret-name`, the Redis ones), written under [`Self::secret_dir`] before anything
    /// loads them.
    pub secret_files: Vec<SecretFile>,
    /// The private directory the Secret-backed files live in.
    pub secret_dir: PathBuf,
    /// TLS versions and cipher suites of every listener.
    pub tls_policy: TlsPolicy,
    /// Longest TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Longest wait for a connection's first request (Redis proxy: for a command to complete).
    pub request_header_timeout: Duration,
    /// Longest a resource proxy request body may take to arrive.
    pub request_body_timeout: Duration,
    /// Resource proxy request bodies received at once in all, and per agent.
    pub max_request_bodies_in_flight: (usize, usize),
    /// A web terminal idle this long is ended.
    pub terminal_idle_timeout: Duration,
    /// Web terminal sessions open at once in all.
    pub terminal_max_sessions: usize,
    /// Web terminal sessions open at once per agent.
    pub terminal_max_sessions_per_agent: usize,
    /// JWT signing key.
    pub jwt_key: JwtKeySource,
    /// How agents are identified.
    pub auth: AuthMethod,
    /// The gRPC listener serves without TLS (`--insecure-plaintext`, behind a service mesh).
    pub insecure_plaintext: bool,
    /// The gRPC listener also serves gRPC over WebSocket on HTTP/1.1 (`--enable-websocket`).
    pub enable_websocket: bool,
    /// Argo CD namespace on the hub.
    pub namespace: String,
    /// Hub namespaces whose Applications are synced (globs); empty = every namespace.
    pub allowed_namespaces: Vec<String>,
    /// Whether, which and how autonomous agents' hub namespaces are created.
    pub namespace_create: crate::hub::NamespaceCreation,
    /// Route managed agents' Applications by `spec.destination.name` instead of by namespace.
    pub destination_based_mapping: bool,
    /// Modes agents may connect with (no duplicates, never empty).
    pub allowed_agent_modes: Vec<AgentMode>,
    /// Resource proxy, if enabled.
    pub resource_proxy: Option<ResourceProxyConfig>,
    /// Self-registration of agent clusters, if enabled.
    pub self_registration: Option<crate::self_registration::SelfRegistrationConfig>,
    /// Redis proxy listen address, if enabled.
    pub redis_proxy_address: Option<SocketAddr>,
    /// The hub's Argo CD Redis.
    pub redis_server_address: HostPort,
    /// AUTH credentials of the hub's Redis; `None` = it has no password.
    pub redis_credentials: Option<RedisCredentials>,
    /// How the hub Redis certificate is verified; `None`: plaintext.
    pub redis_tls: Option<RedisTls>,
    /// The Redis proxy's certificate and key files with --redis-tls-enabled (no client
    /// certificates: Redis clients authenticate with AUTH); `None`: plaintext.
    pub redis_proxy_tls: Option<(PathBuf, PathBuf)>,
    /// Compression of the hub Argo CD's Redis cache (`--redis-compression-type`).
    pub redis_compression: argocd_agent_kube::argocd_cache::RedisCompression,
    /// Largest Redis proxy client request in bytes.
    pub redis_proxy_max_request_size: usize,
    /// Redis proxy connections one client IP may hold.
    pub redis_proxy_max_connections_per_ip: usize,
    /// Channels one Redis proxy connection may hold subscribed on agents.
    pub redis_proxy_max_subscriptions_per_connection: usize,
    /// gRPC connections one agent identity may hold.
    pub max_connections_per_agent: usize,
    /// Where `/metrics` is served.
    pub metrics_address: SocketAddr,
    /// Where `/healthz` and `/readyz` are served.
    pub health_address: SocketAddr,
    /// Kubernetes client settings.
    pub kube: KubeClientConfig,
    /// Run the embedded operator.
    pub enable_operator: bool,
    /// The embedded operator's settings.
    pub operator: argocd_agent_operator::gitops::OperatorSettings,
    /// gRPC message size limit in bytes.
    pub grpc_max_message_size: usize,
    /// Keepalive enforcement; `None` = not enforced.
    pub keepalive_min_interval: Option<Duration>,
    /// Periodic resync; `None` = only on connect.
    pub resync_interval: Option<Duration>,
    /// Access token lifetime.
    pub access_token_lifetime: Duration,
    /// Refresh token lifetime (longer than the access token's).
    pub refresh_token_lifetime: Duration,
    /// Log filter (already checked by `parse_log_filter`).
    pub log_level: String,
    /// Log format.
    pub log_format: LogFormat,
    /// Label selector for watched hub objects.
    pub label_selector: Option<LabelSelector>,
    /// OTLP endpoint (accepted, not yet used).
    pub otlp_address: Option<String>,
    /// HA settings; `None` = a single replica.
    pub ha: Option<crate::leadership::HaConfig>,
}

/// How a listener collision error tells the user to resolve it.
const LISTENER_REMEDY: &str = "give one of them another port";

impl PrincipalArgs {
    /// Checks everything clap cannot (files, names, ranges, combinations) and builds the config.
    pub fn validate(self) -> Result<PrincipalConfig, ConfigError> {
        self.validate_with_env(|name| std::env::var(name).ok())
    }

    /// [`Self::validate`] with `env` standing in for the process environment (for tests); Redis
    /// credentials missing from the flags are looked up in upstream's env vars
    /// ([`UPSTREAM_REDIS_ENV`]).
    pub fn validate_with_env(
        self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<PrincipalConfig, ConfigError> {
        let redis_credentials = self.redis.resolve(&FLAGS, &env)?;
        let tls_ca_secret_name = non_empty(self.tls_ca_secret_name)
            .or_else(|| non_empty(env(UPSTREAM_TLS_CA_SECRET_ENV)))
            .unwrap_or_else(|| DEFAULT_CA_SECRET_NAME.to_string());
        let secret_dir = secret_files::private_dir_for("argocd-principal");
        let mut secret_files = Vec::new();
        let mut from_secret = |flag: &'static str, name: &str, content: SecretContent| {
            if name.trim().is_empty() {
                return Err(FLAGS.invalid(
                    flag,
                    "is empty: name the Secret holding the material, or give the PEM files",
                ));
            }
            let file = SecretFile::new(&secret_dir, flag, name, content);
            let path = file.path.clone();
            secret_files.push(file);
            Ok::<_, ConfigError>(path)
        };
        let (cert, key) =
            match (non_empty(self.tls_cert), non_empty(self.tls_key)) {
                (Some(cert), Some(key)) => (
                    FLAGS.readable_file("tls-cert", &cert)?,
                    FLAGS.readable_file("tls-key", &key)?,
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
                    "tls-cert",
                    "tls-key",
                    "both --tls-cert and --tls-key have to be given, or neither to read them from \
                     the Secret --tls-secret-name",
                )),
            };
        let client_ca = match non_empty(self.tls_ca) {
            Some(ca) => FLAGS.readable_file("tls-ca", &ca)?,
            None => from_secret(
                "tls-ca-secret-name",
                &tls_ca_secret_name,
                SecretContent::CaBundle(vec!["tls.crt".into(), "ca.crt".into()]),
            )?,
        };
        let tls = ServerTlsFiles {
            cert,
            key,
            client_ca,
        };

        let jwt_key = match (
            non_empty(self.jwt_key),
            non_empty(self.jwt_secret_name),
            self.insecure_jwt_generate,
        ) {
            (Some(_), _, true) => {
                return Err(FLAGS.conflict(
                    "jwt-key",
                    "insecure-jwt-generate",
                    "give a key file or ask for a generated key, not both",
                ))
            }
            (Some(_), Some(_), false) => {
                return Err(FLAGS.conflict(
                    "jwt-key",
                    "jwt-secret-name",
                    "the JWT signing key comes from a file or from a Secret, not both: drop one",
                ))
            }
            (None, Some(_), true) => {
                return Err(FLAGS.conflict(
                    "jwt-secret-name",
                    "insecure-jwt-generate",
                    "a generated key is not read from a Secret: drop one",
                ))
            }
            (Some(path), None, false) => JwtKeySource::File(FLAGS.readable_file("jwt-key", &path)?),
            (None, None, true) => JwtKeySource::GenerateInsecure,
            (None, name, false) => {
                let name = name.unwrap_or_else(|| DEFAULT_JWT_SECRET_NAME.to_string());
                let path = from_secret(
                    "jwt-secret-name",
                    &name,
                    SecretContent::Field(JWT_SECRET_FIELD.into()),
                )?;
                JwtKeySource::Secret { name, path }
            }
        };

        FLAGS.namespace(&self.namespace)?;
        let allowed_namespaces = FLAGS.allowed_namespaces(self.allowed_namespaces)?;
        let namespace_create = crate::hub::NamespaceCreation {
            enabled: self.namespace_create_enable,
            pattern: match non_empty(self.namespace_create_pattern) {
                Some(p) => Some(regex::Regex::new(&p).map_err(|e| {
                    FLAGS.invalid(
                        "namespace-create-pattern",
                        format!("is not a regular expression: {e}"),
                    )
                })?),
                None => None,
            },
            labels: self
                .namespace_create_labels
                .iter()
                .filter(|l| !l.is_empty())
                .map(|l| flags::parse_label(l))
                .collect::<Result<_, _>>()
                .map_err(|e| FLAGS.invalid_value("namespace-create-labels", e))?,
        };

        let mut allowed_agent_modes = Vec::new();
        for mode in self.allowed_agent_modes {
            if !allowed_agent_modes.contains(&mode) {
                allowed_agent_modes.push(mode);
            }
        }
        if allowed_agent_modes.is_empty() {
            return Err(FLAGS.invalid(
                "allowed-agent-modes",
                "is empty; allow managed, autonomous, or both",
            ));
        }

        let proxy_secret = non_empty(self.resource_proxy_secret_name);
        if !self.enable_resource_proxy && proxy_secret.is_some() {
            return Err(FLAGS.conflict(
                "resource-proxy-secret-name",
                "enable-resource-proxy",
                "the resource proxy is disabled, so its certificate would never be served: drop \
                 --resource-proxy-secret-name, or enable the proxy",
            ));
        }
        let resource_proxy = if self.enable_resource_proxy {
            let cert = non_empty(self.resource_proxy_tls_cert);
            let key = non_empty(self.resource_proxy_tls_key);
            let (cert, key) = match (cert, key) {
                (Some(_), _) | (_, Some(_)) if proxy_secret.is_some() => {
                    return Err(FLAGS.conflict(
                        "resource-proxy-tls-cert",
                        "resource-proxy-secret-name",
                        "the resource proxy's certificate comes from files or from a Secret, not \
                         both: drop one",
                    ))
                }
                (Some(cert), Some(key)) => (
                    FLAGS.readable_file("resource-proxy-tls-cert", &cert)?,
                    FLAGS.readable_file("resource-proxy-tls-key", &key)?,
                ),
                (None, None) => match &proxy_secret {
                    Some(secret) => (
                        from_secret("resource-proxy-secret-name", secret, SecretContent::TlsCert)?,
                        from_secret("resource-proxy-secret-name", secret, SecretContent::TlsKey)?,
                    ),
                    None => (tls.cert.clone(), tls.key.clone()),
                },
                (Some(_), None) | (None, Some(_)) => {
                    return Err(FLAGS.conflict(
                        "resource-proxy-tls-cert",
                        "resource-proxy-tls-key",
                        "set both or neither (neither reuses --tls-cert and --tls-key)",
                    ))
                }
            };
            let client_ca = FLAGS
                .optional_readable_file("resource-proxy-tls-ca", self.resource_proxy_tls_ca)?
                .unwrap_or_else(|| tls.client_ca.clone());
            Some(ResourceProxyConfig {
                address: self.resource_proxy_address,
                tls: ServerTlsFiles {
                    cert,
                    key,
                    client_ca,
                },
            })
        } else {
            None
        };
        let self_registration = match (
            self.enable_self_cluster_registration,
            non_empty(self.self_registration_client_cert_secret),
            &resource_proxy,
        ) {
            (false, _, _) => None,
            (true, _, None) => {
                return Err(FLAGS.conflict(
                    "enable-self-cluster-registration",
                    "enable-resource-proxy",
                    "self-registered clusters reach their agent through the resource proxy; enable it",
                ))
            }
            (true, None, Some(_)) => {
                return Err(FLAGS.invalid(
                    "self-registration-client-cert-secret",
                    "is required with --enable-self-cluster-registration: name the Secret holding the shared client certificate (tls.crt, tls.key)",
                ))
            }
            (true, Some(secret), Some(proxy)) => {
                let valid = !secret.is_empty()
                    && secret.len() <= 253
                    && secret.split('.').all(|label| {
                        !label.is_empty()
                            && !label.starts_with('-')
                            && !label.ends_with('-')
                            && label
                                .bytes()
                                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    });
                if !valid {
                    return Err(FLAGS.invalid(
                        "self-registration-client-cert-secret",
                        format!("{secret:?} is not a Secret name (lowercase letters, digits, '-' and '.')"),
                    ));
                }
                Some(crate::self_registration::SelfRegistrationConfig {
                    client_cert_secret: secret,
                    fallback_ca: proxy.tls.client_ca.clone(),
                    proxy_listen_address: proxy.address,
                })
            }
        };
        let redis_proxy_address = self.enable_redis_proxy.then_some(self.redis_proxy_address);
        let redis_tls = match redis_tls_choice(
            &FLAGS,
            &REDIS_TLS_FLAGS,
            self.redis_tls_enabled,
            self.redis_ca_path,
            self.redis_ca_secret_name,
            self.redis_tls_insecure,
        )? {
            RedisTlsChoice::Off => None,
            RedisTlsChoice::Insecure => Some(RedisTls::Insecure),
            RedisTlsChoice::CaFile(path) => Some(RedisTls::Ca(path)),
            RedisTlsChoice::CaSecret(name) => Some(RedisTls::Ca(from_secret(
                "redis-ca-secret-name",
                &name,
                SecretContent::CaBundle(vec![REDIS_CA_SECRET_FIELD.into()]),
            )?)),
        };
        let proxy_cert = non_empty(self.redis_proxy_server_tls_cert)
            .or_else(|| non_empty(env(UPSTREAM_REDIS_PROXY_CERT_ENV)).map(PathBuf::from));
        let proxy_key = non_empty(self.redis_proxy_server_tls_key)
            .or_else(|| non_empty(env(UPSTREAM_REDIS_PROXY_KEY_ENV)).map(PathBuf::from));
        let proxy_secret = non_empty(self.redis_proxy_server_tls_secret_name);
        // The first Redis proxy certificate flag given, for messages.
        let proxy_tls_flag = [
            (proxy_cert.is_some(), "redis-proxy-server-tls-cert"),
            (proxy_key.is_some(), "redis-proxy-server-tls-key"),
            (proxy_secret.is_some(), "redis-proxy-server-tls-secret-name"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag));
        let redis_proxy_tls =
            match (
                self.redis_tls_enabled,
                redis_proxy_address.is_some(),
                proxy_tls_flag,
            ) {
                (false, _, None) | (true, false, None) => None,
                (false, _, Some(flag)) => {
                    return Err(FLAGS.conflict(
                        flag,
                        "redis-tls-enabled",
                        "the Redis proxy serves TLS only with --redis-tls-enabled; add it",
                    ))
                }
                // No proxy listener: a certificate given would never be served.
                (true, false, Some(flag)) => return Err(FLAGS.conflict(
                    flag,
                    "enable-redis-proxy",
                    "the Redis proxy is disabled (--enable-redis-proxy=false), so its certificate \
                     would never be served: drop the --redis-proxy-server-tls-* flags, or \
                     enable the proxy",
                )),
                (true, true, _) => match (proxy_cert, proxy_key, proxy_secret) {
                    (Some(cert), Some(key), None) => Some((
                        FLAGS.readable_file("redis-proxy-server-tls-cert", &cert)?,
                        FLAGS.readable_file("redis-proxy-server-tls-key", &key)?,
                    )),
                    (None, None, secret) => {
                        let secret = secret
                            .unwrap_or_else(|| DEFAULT_REDIS_PROXY_TLS_SECRET_NAME.to_string());
                        Some((
                            from_secret(
                                "redis-proxy-server-tls-secret-name",
                                &secret,
                                SecretContent::TlsCert,
                            )?,
                            from_secret(
                                "redis-proxy-server-tls-secret-name",
                                &secret,
                                SecretContent::TlsKey,
                            )?,
                        ))
                    }
                    (Some(_), Some(_), Some(_)) => {
                        return Err(FLAGS.conflict(
                            "redis-proxy-server-tls-cert",
                            "redis-proxy-server-tls-secret-name",
                            "the Redis proxy's certificate comes from files or from a Secret, not \
                         both: drop one",
                        ))
                    }
                    _ => return Err(FLAGS.conflict(
                        "redis-proxy-server-tls-cert",
                        "redis-proxy-server-tls-key",
                        "both --redis-proxy-server-tls-cert and --redis-proxy-server-tls-key have \
                         to be given, or neither to read them from the Secret \
                         --redis-proxy-server-tls-secret-name",
                    )),
                },
            };
        if !(1 << 10..=512 << 20).contains(&self.redis_proxy_max_request_size) {
            return Err(FLAGS.invalid(
                "redis-proxy-max-request-size",
                format!(
                    "{} bytes is outside the usable range 1KiB..=512MiB (default 16MiB)",
                    self.redis_proxy_max_request_size
                ),
            ));
        }
        for (flag, value) in [
            (
                "redis-proxy-max-connections-per-ip",
                self.redis_proxy_max_connections_per_ip,
            ),
            (
                "redis-proxy-max-subscriptions-per-connection",
                self.redis_proxy_max_subscriptions_per_connection,
            ),
            ("max-connections-per-agent", self.max_connections_per_agent),
            (
                "max-request-bodies-in-flight",
                self.max_request_bodies_in_flight,
            ),
            (
                "max-request-bodies-in-flight-per-agent",
                self.max_request_bodies_in_flight_per_agent,
            ),
            ("terminal-max-sessions", self.terminal_max_sessions),
            (
                "terminal-max-sessions-per-agent",
                self.terminal_max_sessions_per_agent,
            ),
        ] {
            if value == 0 {
                return Err(FLAGS.invalid(flag, "must be at least 1 (0 would refuse every client)"));
            }
        }

        let mut listeners = vec![("listen-address", self.listen_address)];
        if let Some(proxy) = &resource_proxy {
            listeners.push(("resource-proxy-address", proxy.address));
        }
        if let Some(addr) = redis_proxy_address {
            listeners.push(("redis-proxy-address", addr));
        }
        listeners.push(("metrics-address", self.ops.metrics_address));
        FLAGS.listeners_distinct(&listeners, LISTENER_REMEDY)?;
        // Metrics and health may share one address (one server then serves both).
        if self.ops.health_address != self.ops.metrics_address {
            listeners.pop();
            listeners.push(("health-address", self.ops.health_address));
            FLAGS.listeners_distinct(&listeners, LISTENER_REMEDY)?;
        }
        self.ops.check(&FLAGS, LISTENER_REMEDY)?;

        let process = self.process.check(&FLAGS)?;
        let grpc_max_message_size = self.grpc.check(&FLAGS)?;

        let keepalive_min_interval =
            (!self.keepalive_min_interval.is_zero()).then_some(self.keepalive_min_interval);
        let resync_interval = FLAGS.optional_interval(
            "resync-interval",
            self.resync_interval,
            "to resync only on connect",
        )?;
        if self.access_token_lifetime < Duration::from_secs(1) {
            return Err(FLAGS.invalid("access-token-lifetime", "must be at least 1s (default 5m)"));
        }
        if self.refresh_token_lifetime <= self.access_token_lifetime {
            return Err(FLAGS.conflict(
                "refresh-token-lifetime",
                "access-token-lifetime",
                format!(
                    "the refresh token ({}) must outlive the access token ({})",
                    flags::format_duration(self.refresh_token_lifetime),
                    flags::format_duration(self.access_token_lifetime)
                ),
            ));
        }

        for (flag, value) in [
            ("tls-handshake-timeout", self.tls_handshake_timeout),
            ("request-header-timeout", self.request_header_timeout),
            ("request-body-timeout", self.request_body_timeout),
            ("terminal-idle-timeout", self.terminal_idle_timeout),
        ] {
            if value < Duration::from_millis(100) {
                return Err(FLAGS.invalid(flag, "must be at least 100ms"));
            }
        }

        let label_selector = FLAGS.label_selector(self.label_selector)?;

        check_auth_transport(&self.auth, self.insecure_plaintext)?;

        let ha = self.ha.validate(&self.namespace)?;
        let operator = self.operator.validate(&FLAGS)?;
        let secret_files = secret_files
            .into_iter()
            .map(|f| {
                match missing_secret_remedy(f.flag, &self.namespace, &operator.principal_service) {
                    Some(remedy) => f.with_remedy(remedy),
                    None => f,
                }
            })
            .collect();
        Ok(PrincipalConfig {
            listen_address: self.listen_address,
            tls,
            secret_files,
            secret_dir,
            tls_policy: self.tls_policy.check(&FLAGS)?,
            tls_handshake_timeout: self.tls_handshake_timeout,
            request_header_timeout: self.request_header_timeout,
            request_body_timeout: self.request_body_timeout,
            max_request_bodies_in_flight: (
                self.max_request_bodies_in_flight,
                self.max_request_bodies_in_flight_per_agent,
            ),
            terminal_idle_timeout: self.terminal_idle_timeout,
            terminal_max_sessions: self.terminal_max_sessions,
            terminal_max_sessions_per_agent: self.terminal_max_sessions_per_agent,
            jwt_key,
            auth: self.auth,
            insecure_plaintext: self.insecure_plaintext,
            enable_websocket: self.enable_websocket,
            namespace: self.namespace,
            allowed_namespaces,
            namespace_create,
            destination_based_mapping: self.destination_based_mapping,
            allowed_agent_modes,
            resource_proxy,
            self_registration,
            redis_proxy_address,
            redis_server_address: self.redis_server_address,
            redis_credentials,
            redis_tls,
            redis_proxy_tls,
            redis_compression: self.redis_compression_type,
            redis_proxy_max_request_size: self.redis_proxy_max_request_size,
            redis_proxy_max_connections_per_ip: self.redis_proxy_max_connections_per_ip,
            redis_proxy_max_subscriptions_per_connection: self
                .redis_proxy_max_subscriptions_per_connection,
            max_connections_per_agent: self.max_connections_per_agent,
            metrics_address: self.ops.metrics_address,
            health_address: self.ops.health_address,
            kube: process.kube,
            enable_operator: self.enable_operator,
            operator,
            grpc_max_message_size,
            keepalive_min_interval,
            resync_interval,
            access_token_lifetime: self.access_token_lifetime,
            refresh_token_lifetime: self.refresh_token_lifetime,
            log_level: process.log_level,
            log_format: process.log_format,
            label_selector,
            otlp_address: process.otlp_address,
            ha,
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
            for name in [
                "tls.crt", "tls.key", "ca.crt", "jwt.key", "rp.crt", "rp.key",
            ] {
                std::fs::write(dir.path().join(name), "not checked here\n").unwrap();
            }
            Files { dir }
        }

        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }

        fn args(&self, extra: &[&str]) -> Result<PrincipalArgs, clap::Error> {
            let mut argv = vec![
                "argocd-principal".to_string(),
                format!("--tls-cert={}", self.path("tls.crt")),
                format!("--tls-key={}", self.path("tls.key")),
                format!("--tls-ca={}", self.path("ca.crt")),
                format!("--jwt-key={}", self.path("jwt.key")),
                "--namespace=argocd".to_string(),
            ];
            argv.extend(extra.iter().map(|s| s.to_string()));
            PrincipalArgs::try_parse_from(argv)
        }

        fn validate(&self, extra: &[&str]) -> Result<PrincipalConfig, ConfigError> {
            self.args(extra).expect("clap accepts").validate()
        }
    }

    #[test]
    fn operator_flags_reach_the_config_and_bad_ones_name_flag_and_env() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--operator-cert-lifetime=12d",
                "--operator-principal-port=8443",
            ])
            .unwrap();
        assert_eq!(config.operator.principal_port, Some(8443));
        assert_eq!(
            config.operator.certs.cert_validity,
            Duration::from_secs(12 * 86400)
        );
        let err = files
            .validate(&["--operator-renew-before=40d"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ARGOCD_PRINCIPAL_OPERATOR_CERT_LIFETIME"),
            "{err}"
        );
    }

    #[test]
    fn namespace_create_flags_reach_the_config_and_bad_ones_are_refused() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--namespace-create-enable",
                "--namespace-create-pattern=^edge-",
                "--namespace-create-labels=team=edge,example.com/tier=spoke",
            ])
            .unwrap();
        let create = config.namespace_create;
        assert!(create.enabled);
        assert_eq!(create.pattern.unwrap().as_str(), "^edge-");
        assert_eq!(
            create.labels.into_iter().collect::<Vec<_>>(),
            vec![
                ("example.com/tier".to_string(), "spoke".to_string()),
                ("team".to_string(), "edge".to_string())
            ]
        );
        let defaults = files.validate(&[]).unwrap().namespace_create;
        assert!(!defaults.enabled && defaults.pattern.is_none() && defaults.labels.is_empty());
        let err = files
            .validate(&["--namespace-create-pattern=(unclosed"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN")
                && err.contains("not a regular expression"),
            "{err}"
        );
        let err = files
            .validate(&["--namespace-create-labels=team="])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS") && err.contains("no value"),
            "{err}"
        );
    }

    #[test]
    fn every_flag_has_its_env_var() {
        assert_eq!(
            FLAGS.flags_without_their_env_var(&PrincipalArgs::command()),
            Vec::<String>::new()
        );
    }

    #[test]
    fn defaults_match_the_documented_contract() {
        let files = Files::new();
        let config = files.validate(&[]).unwrap();
        assert_eq!(config.listen_address, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(config.tls_policy, TlsPolicy::default());
        assert_eq!(config.auth, AuthMethod::Mtls(IdentitySource::CommonName));
        assert!(!config.insecure_plaintext, "plaintext is never the default");
        assert!(
            !config.enable_websocket,
            "HTTP/1.1 is served only on request"
        );
        assert!(
            files
                .validate(&["--enable-websocket"])
                .unwrap()
                .enable_websocket
        );
        assert_eq!(
            config.allowed_agent_modes,
            vec![AgentMode::Managed, AgentMode::Autonomous]
        );
        let proxy = config.resource_proxy.unwrap();
        assert_eq!(proxy.address, "0.0.0.0:9090".parse().unwrap());
        assert_eq!(
            proxy.tls, config.tls,
            "resource proxy reuses the gRPC TLS files"
        );
        assert_eq!(
            config.redis_proxy_address,
            Some("0.0.0.0:6379".parse().unwrap())
        );
        assert_eq!(config.redis_server_address.to_string(), "argocd-redis:6379");
        assert_eq!(
            config.redis_compression,
            argocd_agent_kube::argocd_cache::RedisCompression::Gzip
        );
        assert_eq!(config.metrics_address, "0.0.0.0:8000".parse().unwrap());
        assert_eq!(config.health_address, "0.0.0.0:8003".parse().unwrap());
        assert!(config.enable_operator);
        assert_eq!(config.grpc_max_message_size, 16 << 20);
        assert_eq!(config.redis_proxy_max_request_size, 16 << 20);
        assert_eq!(config.redis_proxy_max_connections_per_ip, 512);
        assert_eq!(config.redis_proxy_max_subscriptions_per_connection, 64);
        assert_eq!(config.max_connections_per_agent, 16);
        assert_eq!(config.max_request_bodies_in_flight, (64, 8));
        assert_eq!(
            (
                config.terminal_max_sessions,
                config.terminal_max_sessions_per_agent
            ),
            (100, 10)
        );
        assert_eq!(config.keepalive_min_interval, None);
        assert_eq!(config.resync_interval, Some(Duration::from_secs(300)));
        assert_eq!(config.access_token_lifetime, Duration::from_secs(300));
        assert_eq!(config.refresh_token_lifetime, Duration::from_secs(86400));
        assert_eq!(config.log_format, LogFormat::Text);
        assert_eq!(
            config.jwt_key,
            JwtKeySource::File(files.path("jwt.key").into())
        );
    }

    #[test]
    fn redis_proxy_max_request_size_takes_units_and_refuses_unusable_sizes() {
        let files = Files::new();
        let config = files
            .validate(&["--redis-proxy-max-request-size=1MiB"])
            .unwrap();
        assert_eq!(config.redis_proxy_max_request_size, 1 << 20);
        for bad in [
            "--redis-proxy-max-request-size=100",
            "--redis-proxy-max-request-size=1GiB",
        ] {
            let err = files.validate(&[bad]).unwrap_err().to_string();
            assert!(
                err.contains("ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_REQUEST_SIZE")
                    && err.contains("1KiB"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn connection_and_subscription_caps_are_at_least_one() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--redis-proxy-max-connections-per-ip=3",
                "--redis-proxy-max-subscriptions-per-connection=2",
                "--max-connections-per-agent=1",
                "--terminal-max-sessions=5",
                "--terminal-max-sessions-per-agent=2",
                "--max-request-bodies-in-flight=7",
                "--max-request-bodies-in-flight-per-agent=3",
            ])
            .unwrap();
        assert_eq!(config.max_request_bodies_in_flight, (7, 3));
        assert_eq!(
            (
                config.terminal_max_sessions,
                config.terminal_max_sessions_per_agent
            ),
            (5, 2)
        );
        assert_eq!(
            (
                config.redis_proxy_max_connections_per_ip,
                config.redis_proxy_max_subscriptions_per_connection,
                config.max_connections_per_agent
            ),
            (3, 2, 1)
        );
        for (flag, env) in [
            (
                "--redis-proxy-max-connections-per-ip=0",
                "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_CONNECTIONS_PER_IP",
            ),
            (
                "--redis-proxy-max-subscriptions-per-connection=0",
                "ARGOCD_PRINCIPAL_REDIS_PROXY_MAX_SUBSCRIPTIONS_PER_CONNECTION",
            ),
            (
                "--max-connections-per-agent=0",
                "ARGOCD_PRINCIPAL_MAX_CONNECTIONS_PER_AGENT",
            ),
            (
                "--terminal-max-sessions=0",
                "ARGOCD_PRINCIPAL_TERMINAL_MAX_SESSIONS",
            ),
            (
                "--terminal-max-sessions-per-agent=0",
                "ARGOCD_PRINCIPAL_TERMINAL_MAX_SESSIONS_PER_AGENT",
            ),
            (
                "--max-request-bodies-in-flight=0",
                "ARGOCD_PRINCIPAL_MAX_REQUEST_BODIES_IN_FLIGHT",
            ),
            (
                "--max-request-bodies-in-flight-per-agent=0",
                "ARGOCD_PRINCIPAL_MAX_REQUEST_BODIES_IN_FLIGHT_PER_AGENT",
            ),
        ] {
            let err = files.validate(&[flag]).unwrap_err().to_string();
            assert!(
                err.contains(env) && err.contains("at least 1"),
                "{flag}: {err}"
            );
        }
    }

    #[test]
    fn bool_flags_accept_bare_and_explicit_values() {
        let files = Files::new();
        let config = files
            .validate(&[
                "--enable-operator=false",
                "--enable-resource-proxy=false",
                "--enable-redis-proxy=no",
                "--destination-based-mapping=false",
            ])
            .unwrap();
        assert!(!config.enable_operator);
        assert!(config.resource_proxy.is_none());
        assert!(config.redis_proxy_address.is_none());
        assert!(!config.destination_based_mapping);
    }

    #[test]
    fn destination_based_mapping_is_taken_from_the_flag_and_its_env_var() {
        let files = Files::new();
        for flag in [
            "--destination-based-mapping",
            "--destination-based-mapping=true",
        ] {
            let config = files.validate(&[flag]).unwrap();
            assert!(config.destination_based_mapping, "{flag}");
        }
        let config = files
            .validate(&["--destination-based-mapping=false"])
            .unwrap();
        assert!(!config.destination_based_mapping);
    }

    #[test]
    fn auth_methods() {
        assert_eq!(parse_mtls_auth("mtls").unwrap(), IdentitySource::CommonName);
        assert_eq!(
            parse_mtls_auth("mtls:CN=([^,]+)").unwrap(),
            IdentitySource::CommonName
        );
        assert_eq!(
            parse_mtls_auth("mtls:uri:spiffe://example.org/agents/").unwrap(),
            IdentitySource::UriSan {
                prefix: "spiffe://example.org/agents/".to_string()
            }
        );
        assert!(parse_mtls_auth("mtls:uri:").is_err());
        assert!(parse_mtls_auth("userpass:/etc/users").is_err());
        // Upstream's regex forms: the first capture group names the agent.
        assert_eq!(
            parse_mtls_auth("mtls:uri:spiffe://example\\.org/sa/(.+)").unwrap(),
            IdentitySource::UriRegex(
                IdentityPattern::new("spiffe://example\\.org/sa/(.+)").unwrap()
            )
        );
        assert_eq!(
            parse_mtls_auth("mtls:subject:O=([^,]+)").unwrap(),
            IdentitySource::SubjectRegex(IdentityPattern::new("O=([^,]+)").unwrap())
        );
        assert_eq!(
            parse_mtls_auth("mtls:OU=([^,]+)").unwrap(),
            IdentitySource::SubjectRegex(IdentityPattern::new("OU=([^,]+)").unwrap())
        );
        let err = parse_mtls_auth("mtls:subject:CN=.+").unwrap_err();
        assert!(err.contains("no capture group"), "{err}");
    }

    #[test]
    fn tls_comes_from_upstreams_secrets_unless_files_are_given() {
        let files = Files::new();
        let from_secrets = |extra: &[&str], env: &[(&str, &str)]| {
            let mut argv = vec![
                "argocd-principal".to_string(),
                format!("--jwt-key={}", files.path("jwt.key")),
                "--namespace=argocd".to_string(),
            ];
            argv.extend(extra.iter().map(|s| s.to_string()));
            PrincipalArgs::try_parse_from(argv)
                .unwrap()
                .validate_with_env(env_of(env))
        };
        let config = from_secrets(&[], &[]).unwrap();
        let secrets: Vec<(&str, &str)> = config
            .secret_files
            .iter()
            .map(|f| (f.flag, f.secret.as_str()))
            .collect();
        assert_eq!(
            secrets,
            [
                ("tls-secret-name", "argocd-agent-principal-tls"),
                ("tls-secret-name", "argocd-agent-principal-tls"),
                ("tls-ca-secret-name", "argocd-agent-ca"),
            ]
        );
        assert!(config.tls.cert.starts_with(&config.secret_dir));
        assert_eq!(
            config.resource_proxy.unwrap().tls,
            config.tls,
            "the resource proxy falls back to the same material"
        );
        // Upstream's env var for the CA Secret is honoured; ours wins over it.
        let upstream = [(UPSTREAM_TLS_CA_SECRET_ENV, "upstream-ca")];
        let config = from_secrets(&[], &upstream).unwrap();
        assert_eq!(config.secret_files[2].secret, "upstream-ca");
        let config = from_secrets(&["--tls-ca-secret-name=ours-ca"], &upstream).unwrap();
        assert_eq!(config.secret_files[2].secret, "ours-ca");
        // Files given: no Secret for them.
        let config = from_secrets(&[&format!("--tls-ca={}", files.path("ca.crt"))], &[]).unwrap();
        assert_eq!(config.secret_files.len(), 2);
        assert!(files.validate(&[]).unwrap().secret_files.is_empty());
        // Half a key pair is refused as upstream does.
        let err = from_secrets(&[&format!("--tls-cert={}", files.path("tls.crt"))], &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("both --tls-cert and --tls-key have to be given"),
            "{err}"
        );
    }

    /// Validates the TLS files of `files`, --namespace=argocd and `extra` (no JWT flag unless in
    /// `extra`).
    fn without_jwt_flags(files: &Files, extra: &[&str]) -> Result<PrincipalConfig, ConfigError> {
        let mut argv = vec![
            "argocd-principal".to_string(),
            format!("--tls-cert={}", files.path("tls.crt")),
            format!("--tls-key={}", files.path("tls.key")),
            format!("--tls-ca={}", files.path("ca.crt")),
            "--namespace=argocd".to_string(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        PrincipalArgs::try_parse_from(argv)
            .expect("clap accepts")
            .validate()
    }

    #[test]
    fn the_jwt_key_comes_from_upstreams_secret_unless_a_file_is_given_never_both() {
        let files = Files::new();
        let config = without_jwt_flags(&files, &[]).unwrap();
        let JwtKeySource::Secret { name, path } = &config.jwt_key else {
            panic!("{:?}", config.jwt_key)
        };
        assert_eq!(name, "argocd-agent-jwt");
        assert!(path.starts_with(&config.secret_dir) && path.ends_with("argocd-agent-jwt/jwt.key"));
        assert_eq!(config.jwt_key.path(), Some(path.as_path()));
        let [kept] = &config.secret_files[..] else {
            panic!("{:?}", config.secret_files)
        };
        assert_eq!(
            (kept.flag, kept.secret.as_str(), &kept.content),
            (
                "jwt-secret-name",
                "argocd-agent-jwt",
                &SecretContent::Field("jwt.key".into())
            )
        );
        let remedy = kept.remedy.as_deref().unwrap();
        assert!(
            remedy.contains("`argocd-agentctl jwt create-key -n argocd`")
                && remedy.contains("--jwt-key"),
            "{remedy}"
        );

        let config = without_jwt_flags(&files, &["--jwt-secret-name=mine"]).unwrap();
        assert!(matches!(&config.jwt_key, JwtKeySource::Secret { name, .. } if name == "mine"));

        let key_file = format!("--jwt-key={}", files.path("jwt.key"));
        let config = without_jwt_flags(&files, &[&key_file]).unwrap();
        assert_eq!(
            config.jwt_key,
            JwtKeySource::File(files.path("jwt.key").into())
        );
        assert!(config.secret_files.is_empty(), "a key file reads no Secret");

        let err = without_jwt_flags(&files, &[&key_file, "--jwt-secret-name=mine"]).unwrap_err();
        assert_eq!(err.flag(), "jwt-key");
        assert!(
            err.to_string().contains("ARGOCD_PRINCIPAL_JWT_SECRET_NAME")
                && err.to_string().contains("not both"),
            "{err}"
        );
        let err = without_jwt_flags(
            &files,
            &["--insecure-jwt-generate", "--jwt-secret-name=mine"],
        )
        .unwrap_err();
        assert_eq!(err.flag(), "jwt-secret-name");
        let config = without_jwt_flags(&files, &["--insecure-jwt-generate"]).unwrap();
        assert_eq!(config.jwt_key, JwtKeySource::GenerateInsecure);
    }

    #[test]
    fn a_missing_secrets_message_names_the_argocd_agentctl_command_creating_it() {
        let argv = [
            "argocd-principal",
            "--namespace=hub",
            "--operator-principal-service=gitops-principal",
            "--resource-proxy-secret-name=rp-tls",
        ];
        let config = PrincipalArgs::try_parse_from(argv)
            .unwrap()
            .validate()
            .unwrap();
        let remedy = |flag: &str| {
            config
                .secret_files
                .iter()
                .find(|f| f.flag == flag)
                .and_then(|f| f.remedy.clone())
                .unwrap_or_default()
        };
        assert!(remedy("tls-ca-secret-name").contains("`argocd-agentctl pki init -n hub`"));
        assert!(remedy("tls-secret-name").contains(
            "`argocd-agentctl pki issue principal -n hub --dns gitops-principal,gitops-principal.hub.svc`"
        ));
        assert!(remedy("resource-proxy-secret-name")
            .contains("`argocd-agentctl pki issue resource-proxy -n hub"));
        assert!(remedy("jwt-secret-name").contains("`argocd-agentctl jwt create-key -n hub`"));
        for flag in ["tls-ca-secret-name", "tls-secret-name", "jwt-secret-name"] {
            assert!(
                remedy(flag).contains(&format!("another Secret with --{flag}")),
                "{flag}: {}",
                remedy(flag)
            );
        }
    }

    #[test]
    fn the_resource_proxy_certificate_comes_from_files_or_a_secret_and_only_when_served() {
        let files = Files::new();
        let config = files
            .validate(&["--resource-proxy-secret-name=rp-tls"])
            .unwrap();
        let proxy = config.resource_proxy.unwrap();
        assert!(proxy.tls.cert.starts_with(&config.secret_dir));
        assert_eq!(
            config
                .secret_files
                .iter()
                .map(|f| (f.flag, f.secret.as_str()))
                .collect::<Vec<_>>(),
            [
                ("resource-proxy-secret-name", "rp-tls"),
                ("resource-proxy-secret-name", "rp-tls")
            ]
        );
        let rp_cert = format!("--resource-proxy-tls-cert={}", files.path("rp.crt"));
        let rp_key = format!("--resource-proxy-tls-key={}", files.path("rp.key"));
        let err = files
            .validate(&[&rp_cert, &rp_key, "--resource-proxy-secret-name=rp-tls"])
            .unwrap_err();
        assert_eq!(err.flag(), "resource-proxy-tls-cert");
        let err = files
            .validate(&[
                "--enable-resource-proxy=false",
                "--resource-proxy-secret-name=rp-tls",
            ])
            .unwrap_err();
        assert_eq!(err.flag(), "resource-proxy-secret-name");
    }

    #[test]
    fn redis_proxy_certificate_flags_that_would_do_nothing_are_refused() {
        let files = Files::new();
        let cert = format!("--redis-proxy-server-tls-cert={}", files.path("rp.crt"));
        let key = format!("--redis-proxy-server-tls-key={}", files.path("rp.key"));
        let tls = ["--redis-tls-enabled", "--redis-tls-insecure"];
        let with = |extra: &[&str]| {
            let mut args = tls.to_vec();
            args.extend_from_slice(extra);
            files.validate(&args)
        };
        // The proxy is off: no certificate of it may be given.
        for given in [
            vec![cert.as_str(), key.as_str()],
            vec![cert.as_str()],
            vec!["--redis-proxy-server-tls-secret-name=proxy-tls"],
        ] {
            let mut args = vec!["--enable-redis-proxy=false"];
            args.extend(given.iter().copied());
            let err = with(&args).unwrap_err().to_string();
            assert!(
                err.contains("ARGOCD_PRINCIPAL_ENABLE_REDIS_PROXY")
                    && err.contains("--enable-redis-proxy=false"),
                "{given:?}: {err}"
            );
        }
        let config = with(&["--enable-redis-proxy=false"]).unwrap();
        assert_eq!(config.redis_proxy_tls, None);
        assert!(config.secret_files.is_empty());
        // No TLS: the same.
        let err = files
            .validate(&["--redis-proxy-server-tls-secret-name=proxy-tls"])
            .unwrap_err();
        assert_eq!(err.flag(), "redis-proxy-server-tls-secret-name");
        assert!(err.to_string().contains("--redis-tls-enabled"), "{err}");
        // Served: from files, or from a Secret (upstream's default name), not both.
        let config = with(&[&cert, &key]).unwrap();
        assert_eq!(
            config.redis_proxy_tls,
            Some((files.path("rp.crt").into(), files.path("rp.key").into()))
        );
        let config = with(&[]).unwrap();
        assert!(config
            .secret_files
            .iter()
            .all(|f| f.secret == "argocd-redis-proxy-tls"));
        assert_eq!(config.secret_files.len(), 2);
        let err = with(&[
            &cert,
            &key,
            "--redis-proxy-server-tls-secret-name=proxy-tls",
        ])
        .unwrap_err();
        assert_eq!(err.flag(), "redis-proxy-server-tls-cert");
        assert_eq!(
            with(&[&cert]).unwrap_err().flag(),
            "redis-proxy-server-tls-cert"
        );
    }

    #[test]
    fn header_auth_needs_plaintext_and_mtls_refuses_it_as_upstream() {
        let files = Files::new();
        let config = files
            .validate(&["--auth=header:x-agent-id:^(.+)$", "--insecure-plaintext"])
            .unwrap();
        assert!(config.insecure_plaintext);
        assert_eq!(config.auth.name(), "header");
        let err = files
            .validate(&["--auth=header:x-agent-id:^(.+)$"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("header-based authentication requires --insecure-plaintext=true"),
            "{err}"
        );
        let err = files
            .validate(&["--insecure-plaintext=true"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mtls authentication cannot be used with --insecure-plaintext"),
            "{err}"
        );
    }

    #[test]
    fn missing_cert_file_names_flag_and_env() {
        let files = Files::new();
        let err = files
            .validate(&["--tls-cert=/nonexistent/tls.crt"])
            .unwrap_err();
        let message = err.to_string();
        assert_eq!(err.flag(), "tls-cert");
        assert!(
            message.contains("--tls-cert (env ARGOCD_PRINCIPAL_TLS_CERT)"),
            "{message}"
        );
        assert!(message.contains("/nonexistent/tls.crt"), "{message}");
    }

    #[test]
    fn jwt_key_or_generation_but_not_both() {
        let files = Files::new();
        let err = files.validate(&["--insecure-jwt-generate"]).unwrap_err();
        assert_eq!(err.flag(), "jwt-key");
        let generated = PrincipalArgs::try_parse_from([
            "argocd-principal",
            "--tls-cert",
            &files.path("tls.crt"),
            "--tls-key",
            &files.path("tls.key"),
            "--tls-ca",
            &files.path("ca.crt"),
            "--namespace",
            "argocd",
            "--insecure-jwt-generate",
        ])
        .unwrap()
        .validate()
        .unwrap();
        assert_eq!(generated.jwt_key, JwtKeySource::GenerateInsecure);
    }

    #[test]
    fn namespace_must_be_a_dns_label() {
        let files = Files::new();
        let err = files.validate(&["--namespace=Argo_CD"]).unwrap_err();
        assert_eq!(err.flag(), "namespace");
        let err = files
            .validate(&["--allowed-namespaces=team-*,Bad/ns"])
            .unwrap_err();
        assert_eq!(err.flag(), "allowed-namespaces");
        let config = files
            .validate(&["--allowed-namespaces=team-*,apps"])
            .unwrap();
        assert_eq!(config.allowed_namespaces, vec!["team-*", "apps"]);
    }

    #[test]
    fn unknown_agent_mode_is_a_usage_error() {
        let files = Files::new();
        let err = files
            .args(&["--allowed-agent-modes=managed,bogus"])
            .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let config = files
            .validate(&["--allowed-agent-modes=managed,managed"])
            .unwrap();
        assert_eq!(config.allowed_agent_modes, vec![AgentMode::Managed]);
    }

    #[test]
    fn colliding_listeners_are_rejected_but_metrics_and_health_may_share() {
        let files = Files::new();
        let err = files
            .validate(&["--metrics-address=127.0.0.1:8443"])
            .unwrap_err();
        assert!(err.to_string().contains("port 8443"), "{err}");
        let config = files
            .validate(&[
                "--metrics-address=127.0.0.1:8000",
                "--health-address=127.0.0.1:8000",
            ])
            .unwrap();
        assert_eq!(config.metrics_address, config.health_address);
        assert!(files
            .validate(&[
                "--enable-redis-proxy=false",
                "--metrics-address=0.0.0.0:6379"
            ])
            .is_ok());
    }

    #[test]
    fn durations_are_checked() {
        let files = Files::new();
        let config = files
            .validate(&["--resync-interval=0", "--keepalive-min-interval=10s"])
            .unwrap();
        assert_eq!(config.resync_interval, None);
        assert_eq!(config.keepalive_min_interval, Some(Duration::from_secs(10)));
        let err = files
            .validate(&["--access-token-lifetime=1h", "--refresh-token-lifetime=30m"])
            .unwrap_err();
        assert_eq!(err.flag(), "refresh-token-lifetime");
        assert!(files.args(&["--resync-interval=soon"]).is_err());
    }

    #[test]
    fn resource_proxy_tls_needs_cert_and_key_together() {
        let files = Files::new();
        let rp_cert = format!("--resource-proxy-tls-cert={}", files.path("rp.crt"));
        let rp_key = format!("--resource-proxy-tls-key={}", files.path("rp.key"));
        let err = files.validate(&[&rp_cert]).unwrap_err();
        assert_eq!(err.flag(), "resource-proxy-tls-cert");
        let config = files.validate(&[&rp_cert, &rp_key]).unwrap();
        let tls = config.resource_proxy.unwrap().tls;
        assert_eq!(tls.cert, PathBuf::from(files.path("rp.crt")));
        assert_eq!(tls.client_ca, PathBuf::from(files.path("ca.crt")));
    }

    #[test]
    fn self_registration_needs_the_proxy_and_a_client_cert_secret() {
        let files = Files::new();
        assert_eq!(files.validate(&[]).unwrap().self_registration, None);
        let err = files
            .validate(&["--enable-self-cluster-registration"])
            .unwrap_err();
        assert_eq!(err.flag(), "self-registration-client-cert-secret");
        let err = files
            .validate(&[
                "--enable-self-cluster-registration",
                "--self-registration-client-cert-secret=rp-client",
                "--enable-resource-proxy=false",
            ])
            .unwrap_err();
        assert_eq!(err.flag(), "enable-self-cluster-registration");
        let err = files
            .validate(&[
                "--enable-self-cluster-registration",
                "--self-registration-client-cert-secret=Not_A_Name",
            ])
            .unwrap_err();
        assert_eq!(err.flag(), "self-registration-client-cert-secret");
        let config = files
            .validate(&[
                "--enable-self-cluster-registration=true",
                "--self-registration-client-cert-secret=rp-client",
            ])
            .unwrap();
        let reg = config.self_registration.unwrap();
        assert_eq!(reg.client_cert_secret, "rp-client");
        assert_eq!(reg.fallback_ca, PathBuf::from(files.path("ca.crt")));
        assert_eq!(reg.proxy_listen_address, "0.0.0.0:9090".parse().unwrap());
    }

    #[test]
    fn log_level_and_label_selector_are_checked() {
        let files = Files::new();
        assert_eq!(
            files.validate(&["--log-level=loud"]).unwrap_err().flag(),
            "log-level"
        );
        assert!(files
            .validate(&["--log-level=argocd_agent_principal=debug,info"])
            .is_ok());
        assert_eq!(
            files
                .validate(&["--label-selector=a=b,"])
                .unwrap_err()
                .flag(),
            "label-selector"
        );
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
            password: password.parse().unwrap(),
        })
    }

    #[test]
    fn hub_redis_credentials_come_from_flags_then_upstream_env_vars_then_a_creds_dir() {
        let files = Files::new();
        let v = |extra: &[&str], env: &[(&str, &str)]| {
            files
                .args(extra)
                .expect("clap accepts")
                .validate_with_env(env_of(env))
        };
        assert_eq!(v(&[], &[]).unwrap().redis_credentials, None);
        assert_eq!(
            v(&["--redis-password=pw"], &[]).unwrap().redis_credentials,
            creds(None, "pw")
        );
        assert_eq!(
            v(&[], &[("REDIS_PASSWORD", "env"), ("REDIS_USERNAME", "u")])
                .unwrap()
                .redis_credentials,
            creds(Some("u"), "env")
        );
        assert_eq!(
            v(&["--redis-password=flag"], &[("REDIS_PASSWORD", "env")])
                .unwrap()
                .redis_credentials,
            creds(None, "flag")
        );
        let dir = files.dir.path().join("creds");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("auth"), "file-pw\n").unwrap();
        let dir_flag = format!("--redis-creds-dir-path={}", dir.display());
        assert_eq!(
            v(&[&dir_flag], &[]).unwrap().redis_credentials,
            creds(None, "file-pw")
        );
        assert_eq!(
            v(&[], &[("REDIS_CREDS_DIR_PATH", dir.to_str().unwrap())])
                .unwrap()
                .redis_credentials,
            creds(None, "file-pw")
        );
        let err = v(&[&dir_flag, "--redis-password=x"], &[]).unwrap_err();
        assert_eq!(err.flag(), "redis-creds-dir-path");
        assert!(
            err.to_string().contains("ARGOCD_PRINCIPAL_REDIS_PASSWORD"),
            "{err}"
        );
        assert_eq!(
            v(&["--redis-username=u"], &[]).unwrap_err().flag(),
            "redis-username"
        );
        let config = v(&["--redis-password=hunter2"], &[]).unwrap();
        assert!(!format!("{config:?}").contains("hunter2"));
    }
}
