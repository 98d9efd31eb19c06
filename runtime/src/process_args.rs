//! Flags every long-running binary takes with the same meaning, declared once.
//!
//! Owns [`ProcessArgs`] (which cluster: `--kubeconfig` / `--kubecontext`; how to log:
//! `--log-level` / `--log-format`; where to export traces: `--otlp-address`),
//! [`RedisCredentialArgs`] (`--redis-username` / `--redis-password` / `--redis-creds-dir-path` for
//! the Argo CD Redis next to the process) and [`TlsPolicyArgs`] (`--tls-min-version` /
//! `--tls-max-version` / `--tls-ciphersuites`, upstream's names), [`OpsAddressArgs`]
//! (`--metrics-address` / `--health-address`, whose defaults each binary gives with
//! [`OpsAddressArgs::defaults`]) and [`GrpcMessageArgs`] (`--grpc-max-message-size`), each with
//! its checks. A binary flattens them into its own flags and mirrors them by its own env vars
//! with [`FlagEnv::mirror_env`] (e.g. `ARGOCD_AGENT_KUBECONFIG`, `ARGOCD_PRINCIPAL_KUBECONFIG`).

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::binary_config::{
    non_empty, ConfigError, FlagEnv, KubeClientConfig, DEFAULT_GRPC_MAX_MESSAGE_SIZE,
};
use crate::redis_credentials::{redis_credentials, RedisCredentials, RedisPassword};
use crate::telemetry::LogFormat;
use crate::tls::{TlsPolicy, TlsVersion};

/// Cluster, logging and trace flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ProcessArgs {
    /// Kubeconfig of the cluster this process works on [default: in-cluster config, then
    /// $KUBECONFIG, then ~/.kube/config].
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// Context to use from the kubeconfig [default: its current context].
    #[arg(long, value_name = "NAME")]
    pub kubecontext: Option<String>,

    /// Log filter: a level (trace, debug, info, warn, error) or per-module directives such as
    /// `argocd_agent_principal=debug,info`.
    #[arg(long, default_value = "info", value_name = "FILTER")]
    pub log_level: String,

    /// Log line format.
    #[arg(long, default_value_t = LogFormat::Text, value_enum, value_name = "FORMAT")]
    pub log_format: LogFormat,

    /// OTLP/gRPC endpoint (HOST:PORT or http://HOST:PORT of a collector) to export traces to; the
    /// trace context crosses between principal and agents in each event's `traceparent`.
    #[arg(long, value_name = "HOST:PORT")]
    pub otlp_address: Option<String>,
}

/// [`ProcessArgs`], checked.
#[derive(Debug, Clone)]
pub struct ProcessSettings {
    /// Which cluster.
    pub kube: KubeClientConfig,
    /// Log filter (checked).
    pub log_level: String,
    /// Log line format.
    pub log_format: LogFormat,
    /// Trace export endpoint, if any.
    pub otlp_address: Option<String>,
}

impl ProcessArgs {
    /// Checks the values: a readable kubeconfig, a log filter the logger understands.
    pub fn check(self, flags: &FlagEnv) -> Result<ProcessSettings, ConfigError> {
        let kube = flags.kube_client(self.kubeconfig, self.kubecontext)?;
        flags.log_level(&self.log_level)?;
        Ok(ProcessSettings {
            kube,
            log_level: self.log_level,
            log_format: self.log_format,
            otlp_address: non_empty(self.otlp_address),
        })
    }
}

/// Credentials of the Argo CD Redis next to this process (Argo CD's secret `argocd-redis`).
#[derive(clap::Args, Debug, Clone)]
pub struct RedisCredentialArgs {
    /// Username for the local Argo CD Redis (Redis 6 ACL user) [fallback env: REDIS_USERNAME].
    #[arg(long, value_name = "NAME")]
    pub redis_username: Option<String>,

    /// Password for the local Argo CD Redis (Argo CD's secret `argocd-redis`, key `auth`); on the
    /// principal, Redis proxy clients must authenticate with it as Redis would. Prefer the env var
    /// or --redis-creds-dir-path to the command line [fallback env: REDIS_PASSWORD].
    #[arg(long, hide_env_values = true, value_name = "PASSWORD")]
    pub redis_password: Option<RedisPassword>,

    /// Directory with the Redis password in file `auth` and optionally the username in
    /// `auth_username` (the mounted `argocd-redis` secret) [fallback env: REDIS_CREDS_DIR_PATH].
    #[arg(long, value_name = "DIR")]
    pub redis_creds_dir_path: Option<PathBuf>,
}

impl RedisCredentialArgs {
    /// The credentials the flags, else upstream's `REDIS_*` env vars (looked up with `env`),
    /// give; `None` for a Redis without a password.
    pub fn resolve(
        &self,
        flags: &FlagEnv,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<RedisCredentials>, ConfigError> {
        redis_credentials(
            flags,
            self.redis_username.clone(),
            self.redis_password.clone(),
            self.redis_creds_dir_path.clone(),
            env,
        )
    }
}

/// The TLS versions and cipher suites of every listener and dial (see [`crate::tls::policy`]).
#[derive(clap::Args, Debug, Clone)]
pub struct TlsPolicyArgs {
    /// Lowest TLS version accepted.
    #[arg(
        long,
        default_value = "tls1.3",
        value_name = "VERSION",
        value_parser = crate::flags::tls_version_parser()
    )]
    pub tls_min_version: TlsVersion,

    /// Highest TLS version accepted.
    #[arg(
        long,
        default_value = "tls1.3",
        value_name = "VERSION",
        value_parser = crate::flags::tls_version_parser()
    )]
    pub tls_max_version: TlsVersion,

    /// Comma-separated cipher suites to offer, by IANA name as Go prints them (e.g.
    /// TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_AES_128_GCM_SHA256); a TLS version none of
    /// them belongs to keeps all of its suites. `list` prints the available suites and exits
    /// [default: all].
    #[arg(long, value_delimiter = ',', value_name = "SUITES")]
    pub tls_ciphersuites: Vec<String>,
}

impl TlsPolicyArgs {
    /// Whether `--tls-ciphersuites list` asks for the available suites instead of a run.
    pub fn wants_suite_list(&self) -> bool {
        self.tls_ciphersuites.len() == 1 && self.tls_ciphersuites[0].trim() == "list"
    }

    /// Prints the available suites, one per line with its TLS version (`--tls-ciphersuites list`).
    pub fn print_suite_list() {
        for (name, version) in crate::tls::policy::available_cipher_suites() {
            println!("{name}\t{version}");
        }
    }

    /// Checks the range and the suites.
    pub fn check(&self, flags: &FlagEnv) -> Result<TlsPolicy, ConfigError> {
        TlsPolicy::new(
            self.tls_min_version,
            self.tls_max_version,
            &self.tls_ciphersuites,
        )
        .map_err(|e| {
            let flag = if self.tls_min_version > self.tls_max_version {
                "tls-max-version"
            } else {
                "tls-ciphersuites"
            };
            flags.invalid(flag, e.to_string())
        })
    }
}

/// Where the ops server serves metrics and health (one server when both are the same address).
#[derive(clap::Args, Debug, Clone)]
pub struct OpsAddressArgs {
    /// Address `/metrics` is served on.
    #[arg(long, value_name = "IP:PORT")]
    pub metrics_address: SocketAddr,

    /// Address `/healthz` and `/readyz` are served on (may equal --metrics-address).
    #[arg(long, value_name = "IP:PORT")]
    pub health_address: SocketAddr,
}

impl OpsAddressArgs {
    /// For `Command::mut_args`: this binary's defaults of `--metrics-address` and
    /// `--health-address` (the binaries serve them on different ports, as upstream's do).
    pub fn defaults(
        metrics: &'static str,
        health: &'static str,
    ) -> impl FnMut(clap::Arg) -> clap::Arg {
        move |arg| {
            let default = match arg.get_id().as_str() {
                "metrics_address" => metrics,
                "health_address" => health,
                _ => return arg,
            };
            arg.required(false).default_value(default)
        }
    }

    /// Checks that metrics and health are served on one address or on two that do not meet
    /// (`remedy` says what to do when they do).
    pub fn check(&self, flags: &FlagEnv, remedy: &str) -> Result<(), ConfigError> {
        if self.metrics_address == self.health_address {
            return Ok(());
        }
        flags.listeners_distinct(
            &[
                ("metrics-address", self.metrics_address),
                ("health-address", self.health_address),
            ],
            remedy,
        )
    }
}

/// The size limit of the gRPC messages a binary sends and receives.
#[derive(clap::Args, Debug, Clone)]
pub struct GrpcMessageArgs {
    /// Largest gRPC message sent or received, in bytes (units such as 16MiB or 200MB accepted).
    #[arg(
        long,
        default_value = DEFAULT_GRPC_MAX_MESSAGE_SIZE,
        value_name = "BYTES",
        value_parser = crate::flags::parse_byte_size
    )]
    pub grpc_max_message_size: usize,
}

impl GrpcMessageArgs {
    /// The limit, checked against what both ends can carry.
    pub fn check(&self, flags: &FlagEnv) -> Result<usize, ConfigError> {
        flags.grpc_max_message_size(self.grpc_max_message_size)
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    const FLAGS: FlagEnv = FlagEnv::new("ARGOCD_TEST_");

    #[derive(Parser, Debug)]
    #[command(mut_args = FLAGS.mirror_env())]
    struct Args {
        #[command(flatten)]
        process: ProcessArgs,
        #[command(flatten)]
        redis: RedisCredentialArgs,
    }

    #[derive(Parser, Debug)]
    #[command(mut_args = FLAGS.mirror_env())]
    #[command(mut_args = OpsAddressArgs::defaults("0.0.0.0:8000", "0.0.0.0:8003"))]
    struct OpsArgs {
        #[command(flatten)]
        ops: OpsAddressArgs,
        #[command(flatten)]
        grpc: GrpcMessageArgs,
    }

    #[test]
    fn ops_addresses_take_the_binarys_defaults_and_may_share_one_address_but_not_a_port() {
        let parsed = OpsArgs::try_parse_from(["test"]).unwrap();
        assert_eq!(parsed.ops.metrics_address, "0.0.0.0:8000".parse().unwrap());
        assert_eq!(parsed.ops.health_address, "0.0.0.0:8003".parse().unwrap());
        assert_eq!(parsed.grpc.check(&FLAGS).unwrap(), 16 << 20);
        assert!(FLAGS
            .flags_without_their_env_var(&OpsArgs::command())
            .is_empty());
        let help = OpsArgs::command().render_long_help().to_string();
        assert!(
            help.contains("ARGOCD_TEST_METRICS_ADDRESS")
                && help.contains("[default: 0.0.0.0:8003]"),
            "{help}"
        );

        let shared = OpsArgs::try_parse_from(["test", "--health-address", "0.0.0.0:8000"]).unwrap();
        assert!(shared.ops.check(&FLAGS, "pick another").is_ok());
        let clash = OpsArgs::try_parse_from([
            "test",
            "--metrics-address",
            "127.0.0.1:9000",
            "--health-address",
            "0.0.0.0:9000",
        ])
        .unwrap();
        let err = clash
            .ops
            .check(&FLAGS, "pick another")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--metrics-address")
                && err.contains("--health-address")
                && err.contains("pick another"),
            "{err}"
        );
        let tiny = OpsArgs::try_parse_from(["test", "--grpc-max-message-size", "1KiB"]).unwrap();
        assert!(tiny.grpc.check(&FLAGS).is_err());
    }

    #[test]
    fn shared_flags_are_mirrored_by_each_binarys_own_env_vars() {
        let cmd = Args::command();
        assert!(FLAGS.flags_without_their_env_var(&cmd).is_empty());
        let kubeconfig = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some("kubeconfig"))
            .unwrap();
        assert_eq!(kubeconfig.get_env().unwrap(), "ARGOCD_TEST_KUBECONFIG");
        let help = Args::command().render_long_help().to_string();
        assert!(help.contains("ARGOCD_TEST_REDIS_PASSWORD"), "{help}");
    }

    #[test]
    fn a_log_filter_the_logger_refuses_names_the_flag_and_env_var() {
        let args = Args::try_parse_from(["x", "--log-level=nonsense=="]).unwrap();
        let err = args.process.check(&FLAGS).unwrap_err().to_string();
        assert!(err.contains("ARGOCD_TEST_LOG_LEVEL"), "{err}");
    }
}
