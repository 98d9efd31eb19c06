//! The configuration machinery `argocd-principal` and `argocd-agent` share.
//!
//! Owns: [`ConfigError`], whose messages name the flag and the env var mirroring it; [`FlagEnv`],
//! one binary's env-var prefix together with the checks that turn a parsed flag value into a
//! validated one (readable files, namespaces, intervals, minimum durations, the gRPC message size
//! range, listeners not sharing a port, kubeconfig, log filter, label selector);
//! [`KubeClientConfig`]; and [`parse_env_and_args`]. Each binary's own flags, defaults and rules
//! stay in its `config` module.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::flags::{
    check_label_selector, check_namespace_name, check_namespace_pattern, check_readable_file,
    format_duration, ignore_empty_env, FlagValueError,
};
use crate::label_selector::LabelSelector;
use crate::telemetry::parse_log_filter;

/// Default `--grpc-max-message-size` of both binaries: 16 MiB (upstream: 200 MB). Both sides use
/// the same value so neither sends a message the other refuses; on the principal it bounds the
/// memory one misbehaving agent can make it allocate per message while leaving ample room for
/// large Applications. Raise it on both if "message too large" appears.
pub const DEFAULT_GRPC_MAX_MESSAGE_SIZE: &str = "16MiB";

/// Smallest accepted `--grpc-max-message-size`, in bytes.
pub const MIN_GRPC_MAX_MESSAGE_SIZE: usize = 4 << 10;

/// Largest accepted `--grpc-max-message-size`, in bytes.
pub const MAX_GRPC_MAX_MESSAGE_SIZE: usize = 2 << 30;

/// Why a binary's configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag's value is malformed or points at an unusable file.
    #[error("--{flag} (env {env}): {source}")]
    InvalidValue {
        /// Flag name without dashes.
        flag: &'static str,
        /// The mirroring env var.
        env: String,
        /// What is wrong.
        #[source]
        source: FlagValueError,
    },
    /// A flag's value is out of range or otherwise unusable.
    #[error("--{flag} (env {env}): {problem}")]
    Invalid {
        /// Flag name without dashes.
        flag: &'static str,
        /// The mirroring env var.
        env: String,
        /// What is wrong and what to do.
        problem: String,
    },
    /// Two flags' values cannot be used together.
    #[error("--{flag} (env {env}) conflicts with --{other} (env {other_env}): {problem}")]
    Conflict {
        /// First flag.
        flag: &'static str,
        /// Its env var.
        env: String,
        /// Second flag.
        other: &'static str,
        /// Its env var.
        other_env: String,
        /// What is wrong and what to do.
        problem: String,
    },
}

impl ConfigError {
    /// The flag (without dashes) the error is about.
    pub fn flag(&self) -> &'static str {
        match self {
            ConfigError::InvalidValue { flag, .. }
            | ConfigError::Invalid { flag, .. }
            | ConfigError::Conflict { flag, .. } => flag,
        }
    }
}

/// How to reach a cluster's Kubernetes API (the hub's for the principal, the workload cluster's
/// for the agent).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KubeClientConfig {
    /// Explicit kubeconfig file, if any.
    pub kubeconfig: Option<PathBuf>,
    /// Explicit kubeconfig context, if any.
    pub context: Option<String>,
}

/// Empty strings (as Helm charts often render unset values) mean "not set".
pub fn non_empty<T: AsRef<OsStr>>(value: Option<T>) -> Option<T> {
    value.filter(|v| !v.as_ref().is_empty())
}

/// Parses the process's arguments and the env vars mirroring them into `A` (an empty env var
/// counts as unset); on a usage error prints clap's message and exits 2.
pub fn parse_env_and_args<A: clap::Parser>() -> A {
    let cmd = ignore_empty_env(A::command(), |name| std::env::var_os(name));
    A::from_arg_matches(&cmd.get_matches()).unwrap_or_else(|e| e.exit())
}

/// One binary's flags as seen from the environment: every `--some-flag` is mirrored by
/// `<prefix>SOME_FLAG`, and every [`ConfigError`] built here names both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlagEnv {
    prefix: &'static str,
}

impl FlagEnv {
    /// The flags of a binary whose env vars start with `prefix` (such as `ARGOCD_AGENT_`).
    pub const fn new(prefix: &'static str) -> Self {
        FlagEnv { prefix }
    }

    /// The env var that mirrors `--<flag>`.
    pub fn env_var_for(&self, flag: &str) -> String {
        format!(
            "{}{}",
            self.prefix,
            flag.to_ascii_uppercase().replace('-', "_")
        )
    }

    /// For `Command::mut_args`: gives every long flag without an env var the one
    /// [`FlagEnv::env_var_for`] names, so flags declared once for several binaries
    /// ([`crate::process_args`]) are mirrored by each binary's own env vars.
    pub fn mirror_env(self) -> impl FnMut(clap::Arg) -> clap::Arg {
        move |arg| match arg.get_long() {
            Some(long) if arg.get_env().is_none() && !matches!(long, "help" | "version") => {
                let env = self.env_var_for(long);
                arg.env(env)
            }
            _ => arg,
        }
    }

    /// The long flags of `cmd` (but `--help` and `--version`) not mirrored by the env var
    /// [`FlagEnv::env_var_for`] names, each saying what it has instead; empty when all are.
    pub fn flags_without_their_env_var(&self, cmd: &clap::Command) -> Vec<String> {
        cmd.get_arguments()
            .filter_map(|arg| {
                let long = arg.get_long()?;
                if matches!(long, "help" | "version") {
                    return None;
                }
                let expected = self.env_var_for(long);
                match arg.get_env() {
                    Some(env) if env == expected.as_str() => None,
                    Some(env) => Some(format!(
                        "--{long} has env var {} instead of {expected}",
                        env.to_string_lossy()
                    )),
                    None => Some(format!("--{long} has no env var")),
                }
            })
            .collect()
    }

    /// `--<flag>`'s value is malformed: `source` says how.
    pub fn invalid_value(&self, flag: &'static str, source: FlagValueError) -> ConfigError {
        ConfigError::InvalidValue {
            flag,
            env: self.env_var_for(flag),
            source,
        }
    }

    /// `--<flag>`'s value is unusable: `problem` says why and what to do.
    pub fn invalid(&self, flag: &'static str, problem: impl Into<String>) -> ConfigError {
        ConfigError::Invalid {
            flag,
            env: self.env_var_for(flag),
            problem: problem.into(),
        }
    }

    /// `--<flag>` and `--<other>` cannot be used together: `problem` says why and what to do.
    pub fn conflict(
        &self,
        flag: &'static str,
        other: &'static str,
        problem: impl Into<String>,
    ) -> ConfigError {
        ConfigError::Conflict {
            flag,
            env: self.env_var_for(flag),
            other,
            other_env: self.env_var_for(other),
            problem: problem.into(),
        }
    }

    /// `--<flag>` names a regular file this process can read.
    pub fn readable_file(&self, flag: &'static str, path: &Path) -> Result<PathBuf, ConfigError> {
        if path.as_os_str().is_empty() {
            return Err(self.invalid(flag, "is empty; point it at a readable PEM file"));
        }
        check_readable_file(path).map_err(|e| self.invalid_value(flag, e))?;
        Ok(path.to_path_buf())
    }

    /// Like [`FlagEnv::readable_file`] for an optional flag; unset or empty gives `None`.
    pub fn optional_readable_file(
        &self,
        flag: &'static str,
        path: Option<PathBuf>,
    ) -> Result<Option<PathBuf>, ConfigError> {
        non_empty(path)
            .map(|path| self.readable_file(flag, &path))
            .transpose()
    }

    /// `--namespace` is a Kubernetes namespace name.
    pub fn namespace(&self, namespace: &str) -> Result<(), ConfigError> {
        self.namespace_of_flag("namespace", namespace)
    }

    /// `--<flag>` is a Kubernetes namespace name.
    pub fn namespace_of_flag(
        &self,
        flag: &'static str,
        namespace: &str,
    ) -> Result<(), ConfigError> {
        check_namespace_name(namespace).map_err(|e| self.invalid_value(flag, e))
    }

    /// An optional namespace flag: unset or blank gives `None`, anything else is trimmed and must
    /// be a namespace name.
    pub fn optional_namespace(
        &self,
        flag: &'static str,
        namespace: Option<String>,
    ) -> Result<Option<String>, ConfigError> {
        let namespace = namespace
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty());
        if let Some(n) = &namespace {
            self.namespace_of_flag(flag, n)?;
        }
        Ok(namespace)
    }

    /// `--allowed-namespaces`: the non-blank entries, trimmed, each a name or a glob over one.
    pub fn allowed_namespaces(&self, patterns: Vec<String>) -> Result<Vec<String>, ConfigError> {
        let mut allowed = Vec::new();
        for pattern in patterns {
            let pattern = pattern.trim();
            if pattern.is_empty() {
                continue;
            }
            check_namespace_pattern(pattern)
                .map_err(|e| self.invalid_value("allowed-namespaces", e))?;
            allowed.push(pattern.to_string());
        }
        Ok(allowed)
    }

    /// An interval where 0 switches the feature off (`None`) and anything else is at least 1s.
    /// `zero_hint` completes "use 0 …" in the error, e.g. "for no heartbeats".
    pub fn optional_interval(
        &self,
        flag: &'static str,
        value: Duration,
        zero_hint: &str,
    ) -> Result<Option<Duration>, ConfigError> {
        if value.is_zero() {
            Ok(None)
        } else if value < Duration::from_secs(1) {
            Err(self.invalid(
                flag,
                format!("is shorter than 1s; use 0 {zero_hint}, or at least 1s"),
            ))
        } else {
            Ok(Some(value))
        }
    }

    /// `--<flag>` is a duration of at least `min` (more than 0 when `min` is 0); `note` ends the
    /// error in brackets, e.g. "default 10s".
    pub fn min_duration(
        &self,
        flag: &'static str,
        value: Duration,
        min: Duration,
        note: &str,
    ) -> Result<Duration, ConfigError> {
        if min.is_zero() && value.is_zero() {
            Err(self.invalid(flag, format!("must be more than 0 ({note})")))
        } else if value < min {
            Err(self.invalid(
                flag,
                format!("must be at least {} ({note})", format_duration(min)),
            ))
        } else {
            Ok(value)
        }
    }

    /// `--grpc-max-message-size` lies in
    /// [`MIN_GRPC_MAX_MESSAGE_SIZE`]`..=`[`MAX_GRPC_MAX_MESSAGE_SIZE`].
    pub fn grpc_max_message_size(&self, bytes: usize) -> Result<usize, ConfigError> {
        if (MIN_GRPC_MAX_MESSAGE_SIZE..=MAX_GRPC_MAX_MESSAGE_SIZE).contains(&bytes) {
            Ok(bytes)
        } else {
            Err(self.invalid(
                "grpc-max-message-size",
                format!("{bytes} bytes is outside the usable range 4KiB..=2GiB"),
            ))
        }
    }

    /// No two of `listeners` (flag, address) would fight over one port; `remedy` ends the error.
    /// Port 0 (any free port) never collides.
    pub fn listeners_distinct(
        &self,
        listeners: &[(&'static str, SocketAddr)],
        remedy: &str,
    ) -> Result<(), ConfigError> {
        for (i, (flag, addr)) in listeners.iter().enumerate() {
            for (other, other_addr) in &listeners[i + 1..] {
                let overlapping_ips = addr.ip() == other_addr.ip()
                    || addr.ip().is_unspecified()
                    || other_addr.ip().is_unspecified();
                if addr.port() != 0 && addr.port() == other_addr.port() && overlapping_ips {
                    return Err(self.conflict(
                        flag,
                        other,
                        format!(
                            "{addr} and {other_addr} would both listen on port {}; {remedy}",
                            addr.port()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// `--kubeconfig` (readable if set) and `--kubecontext`; empty values mean unset.
    pub fn kube_client(
        &self,
        kubeconfig: Option<PathBuf>,
        context: Option<String>,
    ) -> Result<KubeClientConfig, ConfigError> {
        Ok(KubeClientConfig {
            kubeconfig: self.optional_readable_file("kubeconfig", kubeconfig)?,
            context: non_empty(context),
        })
    }

    /// `--log-level` is a filter [`parse_log_filter`] accepts.
    pub fn log_level(&self, filter: &str) -> Result<(), ConfigError> {
        parse_log_filter(filter)
            .map(drop)
            .map_err(|e| self.invalid("log-level", e.to_string()))
    }

    /// `--label-selector`, if set and not empty, parsed as a Kubernetes label selector.
    pub fn label_selector(
        &self,
        selector: Option<String>,
    ) -> Result<Option<LabelSelector>, ConfigError> {
        non_empty(selector)
            .map(|s| check_label_selector(&s).map_err(|e| self.invalid_value("label-selector", e)))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLAGS: FlagEnv = FlagEnv::new("ARGOCD_TEST_");

    #[test]
    fn errors_name_the_flag_and_its_env_var() {
        assert_eq!(FLAGS.env_var_for("tls-ca"), "ARGOCD_TEST_TLS_CA");
        let err = FLAGS.invalid("queue-dir", "is empty");
        assert_eq!(err.flag(), "queue-dir");
        assert_eq!(
            err.to_string(),
            "--queue-dir (env ARGOCD_TEST_QUEUE_DIR): is empty"
        );
        let err = FLAGS.conflict("jwt-key", "insecure-jwt-generate", "not both");
        assert_eq!(err.flag(), "jwt-key");
        assert_eq!(
            err.to_string(),
            "--jwt-key (env ARGOCD_TEST_JWT_KEY) conflicts with --insecure-jwt-generate \
             (env ARGOCD_TEST_INSECURE_JWT_GENERATE): not both"
        );
    }

    #[test]
    fn flags_must_be_mirrored_by_their_env_var() {
        let cmd = clap::Command::new("t")
            .arg(clap::Arg::new("a").long("tls-ca").env("ARGOCD_TEST_TLS_CA"))
            .arg(clap::Arg::new("b").long("queue-dir").env("OTHER_QUEUE_DIR"))
            .arg(clap::Arg::new("c").long("mode"));
        assert_eq!(
            FLAGS.flags_without_their_env_var(&cmd),
            vec![
                "--queue-dir has env var OTHER_QUEUE_DIR instead of ARGOCD_TEST_QUEUE_DIR",
                "--mode has no env var",
            ]
        );
    }

    #[test]
    fn readable_files_must_exist_and_not_be_empty_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("ca.crt");
        std::fs::write(&file, "pem\n").unwrap();
        assert_eq!(FLAGS.readable_file("tls-ca", &file).unwrap(), file);
        let err = FLAGS.readable_file("tls-ca", Path::new("")).unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
        let err = FLAGS
            .readable_file("tls-ca", &dir.path().join("missing.crt"))
            .unwrap_err();
        assert!(err.to_string().contains("missing.crt"), "{err}");
        assert_eq!(
            FLAGS
                .optional_readable_file("kubeconfig", Some(PathBuf::new()))
                .unwrap(),
            None
        );
    }

    #[test]
    fn optional_intervals_are_off_at_zero_and_at_least_one_second() {
        assert_eq!(
            FLAGS
                .optional_interval(
                    "resync-interval",
                    Duration::ZERO,
                    "to resync only on connect"
                )
                .unwrap(),
            None
        );
        let err = FLAGS
            .optional_interval(
                "resync-interval",
                Duration::from_millis(10),
                "to resync only on connect",
            )
            .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("is shorter than 1s; use 0 to resync only on connect, or at least 1s"),
            "{err}"
        );
    }

    #[test]
    fn minimum_durations_name_the_bound_and_the_note() {
        let second = Duration::from_secs(1);
        assert_eq!(
            FLAGS
                .min_duration("ttl", second, second, "default 5m")
                .unwrap(),
            second
        );
        let err = FLAGS
            .min_duration("ttl", Duration::from_millis(999), second, "default 5m")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "--ttl (env ARGOCD_TEST_TTL): must be at least 1s (default 5m)"
        );
        let err = FLAGS
            .min_duration("renew", Duration::ZERO, Duration::ZERO, "default 2s")
            .unwrap_err();
        assert!(
            err.to_string()
                .ends_with("must be more than 0 (default 2s)"),
            "{err}"
        );
        assert!(FLAGS
            .min_duration("renew", Duration::from_nanos(1), Duration::ZERO, "")
            .is_ok());
    }

    #[test]
    fn optional_namespaces_are_trimmed_blank_is_unset_and_errors_name_the_flag() {
        assert_eq!(
            FLAGS
                .optional_namespace("lease-namespace", Some(" argocd ".into()))
                .unwrap(),
            Some("argocd".to_string())
        );
        assert_eq!(
            FLAGS
                .optional_namespace("lease-namespace", Some("  ".into()))
                .unwrap(),
            None
        );
        assert_eq!(
            FLAGS.optional_namespace("lease-namespace", None).unwrap(),
            None
        );
        let err = FLAGS
            .optional_namespace("lease-namespace", Some("Not_A_Namespace".into()))
            .unwrap_err();
        assert_eq!(err.flag(), "lease-namespace");
        assert!(
            err.to_string().contains("ARGOCD_TEST_LEASE_NAMESPACE"),
            "{err}"
        );
        assert_eq!(FLAGS.namespace("-bad").unwrap_err().flag(), "namespace");
    }

    #[test]
    fn grpc_message_size_range() {
        assert!(FLAGS.grpc_max_message_size(16 << 20).is_ok());
        assert!(FLAGS
            .grpc_max_message_size(MIN_GRPC_MAX_MESSAGE_SIZE - 1)
            .is_err());
        assert!(FLAGS
            .grpc_max_message_size(MAX_GRPC_MAX_MESSAGE_SIZE + 1)
            .is_err());
    }

    #[test]
    fn listeners_collide_on_one_port_unless_it_is_zero() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        let err = FLAGS
            .listeners_distinct(
                &[
                    ("metrics-address", addr("0.0.0.0:9000")),
                    ("health-address", addr("127.0.0.1:9000")),
                ],
                "use two ports",
            )
            .unwrap_err();
        assert_eq!(err.flag(), "metrics-address");
        assert!(
            err.to_string().ends_with("on port 9000; use two ports"),
            "{err}"
        );
        for (a, b) in [
            ("127.0.0.1:0", "127.0.0.1:0"),
            ("127.0.0.1:9000", "127.0.0.2:9000"),
            ("0.0.0.0:9000", "0.0.0.0:9001"),
        ] {
            assert!(FLAGS
                .listeners_distinct(&[("a", addr(a)), ("b", addr(b))], "")
                .is_ok());
        }
    }

    #[test]
    fn empty_values_mean_unset() {
        assert_eq!(non_empty(Some("")), None);
        assert_eq!(non_empty(Some("x")), Some("x"));
        assert_eq!(FLAGS.label_selector(Some(String::new())).unwrap(), None);
        assert_eq!(
            FLAGS
                .label_selector(Some(",".to_string()))
                .unwrap_err()
                .flag(),
            "label-selector"
        );
        assert_eq!(
            FLAGS.kube_client(None, Some(String::new())).unwrap(),
            KubeClientConfig::default()
        );
        assert_eq!(
            FLAGS
                .allowed_namespaces(vec![" team-* ".into(), "".into()])
                .unwrap(),
            vec!["team-*"]
        );
        assert_eq!(FLAGS.log_level("loud").unwrap_err().flag(), "log-level");
    }
}
