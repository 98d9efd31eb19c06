//! Parsing and checking of command-line/env values that both binaries accept.
//!
//! Owns: durations (`30s`, `5m`, `1h`, `0`), byte sizes (`16MiB`), `host:port` addresses
//! ([`HostPort`]), namespace names and allow-list patterns, host names, label selectors, and the
//! "is this file there and readable" check. Each function says what is wrong with a value;
//! [`crate::binary_config`] adds which flag and env var it came from.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use argocd_agent_proto::event::names::{is_dns1123_label, is_dns1123_subdomain};
use clap::builder::{PossibleValuesParser, TypedValueParser};

pub use argocd_agent_proto::mode::AgentMode;

use crate::label_selector::{is_label_name, LabelSelector, SelectorError};
use crate::tls::TlsVersion;

/// What is wrong with one flag value.
#[derive(Debug, thiserror::Error)]
pub enum FlagValueError {
    /// The file cannot be opened for reading.
    #[error("cannot read {}: {source}", path.display())]
    Unreadable {
        /// The path as given.
        path: PathBuf,
        /// The operating system's reason.
        source: std::io::Error,
    },
    /// The path exists but is a directory or other non-regular file.
    #[error("{} is not a regular file", path.display())]
    NotAFile {
        /// The path as given.
        path: PathBuf,
    },
    /// Not an RFC 1123 DNS label.
    #[error(
        "{value:?} is not a valid namespace name: use at most 63 lowercase letters, digits or '-', \
         starting and ending with a letter or digit"
    )]
    NotDnsLabel {
        /// The value as given.
        value: String,
    },
    /// A namespace allow-list entry that is neither a name, a glob nor a `/regex/`.
    #[error("{value:?} is not a namespace pattern: {reason}")]
    BadNamespacePattern {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not `host:port`.
    #[error("{value:?} is not host:port ({reason}); for example argocd-redis:6379 or [::1]:6379")]
    BadHostPort {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not a DNS name or IP address.
    #[error("{value:?} is not a DNS name or IP address")]
    BadHostName {
        /// The value as given.
        value: String,
    },
    /// Not a duration.
    #[error("{value:?} is not a duration ({reason}); use e.g. 30s, 5m, 1h30m, or 0")]
    BadDuration {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not a byte size.
    #[error("{value:?} is not a byte size ({reason}); use e.g. 16777216, 16MiB, 200MB")]
    BadByteSize {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not a Kubernetes label selector.
    #[error("{value:?} is not a label selector ({reason}); use e.g. app=foo,tier!=db")]
    BadLabelSelector {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// Not a `key=value` Kubernetes label.
    #[error("{value:?} is not a label ({reason}); use key=value, e.g. team=edge or example.com/tier=spoke")]
    BadLabel {
        /// The value as given.
        value: String,
        /// What is wrong.
        reason: String,
    },
}

/// Drops the env fallback of every argument of `cmd` whose env var `lookup` finds set but empty,
/// so an empty variable (as Helm templates often render an unset value) means "use the default"
/// rather than "the value is the empty string", as upstream's binaries treat it.
pub fn ignore_empty_env(
    cmd: clap::Command,
    lookup: impl Fn(&std::ffi::OsStr) -> Option<std::ffi::OsString>,
) -> clap::Command {
    let empty: Vec<clap::Id> = cmd
        .get_arguments()
        .filter(|arg| {
            arg.get_env()
                .and_then(&lookup)
                .is_some_and(|value| value.is_empty())
        })
        .map(|arg| arg.get_id().clone())
        .collect();
    empty.into_iter().fold(cmd, |cmd, id| {
        cmd.mut_arg(id, |arg| arg.env(clap::builder::Resettable::Reset))
    })
}

/// Parser of `--tls-min-version` / `--tls-max-version`: upstream's spellings `tls1.3` and
/// `tls1.2`, both listed in `--help` as the possible values.
pub fn tls_version_parser() -> impl TypedValueParser<Value = TlsVersion> {
    PossibleValuesParser::new(["tls1.3", "tls1.2"]).try_map(|v| v.parse::<TlsVersion>())
}

/// Parses a duration such as `30s`, `5m`, `1h30m`, `250ms` or `0`.
pub fn parse_duration(value: &str) -> Result<Duration, FlagValueError> {
    let trimmed = value.trim();
    if trimmed == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(trimmed).map_err(|e| FlagValueError::BadDuration {
        value: value.to_string(),
        reason: e.to_string(),
    })
}

/// Formats a duration the way [`parse_duration`] reads it (for defaults and messages).
pub fn format_duration(duration: Duration) -> String {
    if duration.is_zero() {
        "0".to_string()
    } else {
        humantime::format_duration(duration).to_string()
    }
}

/// Parses a byte size: a plain number of bytes, or a number with a unit
/// (`KiB`/`Ki`, `MiB`/`Mi`, `GiB`/`Gi` are powers of 1024; `KB`/`K`, `MB`/`M`, `GB`/`G` of 1000).
pub fn parse_byte_size(value: &str) -> Result<usize, FlagValueError> {
    let bad = |reason: &str| FlagValueError::BadByteSize {
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = value.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(digits_end);
    if number.is_empty() {
        return Err(bad("it does not start with a number"));
    }
    let number: u64 = number.parse().map_err(|_| bad("the number is too large"))?;
    let multiplier: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "ki" | "kib" => 1 << 10,
        "m" | "mb" => 1_000_000,
        "mi" | "mib" => 1 << 20,
        "g" | "gb" => 1_000_000_000,
        "gi" | "gib" => 1 << 30,
        _ => return Err(bad("unknown unit")),
    };
    number
        .checked_mul(multiplier)
        .and_then(|bytes| usize::try_from(bytes).ok())
        .ok_or_else(|| bad("it is too large"))
}

/// A `host:port` network address whose host may be a DNS name (resolved when dialling).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// DNS name or IP address, without IPv6 brackets.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl FromStr for HostPort {
    type Err = FlagValueError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let bad = |reason: &str| FlagValueError::BadHostPort {
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let (host, port) = if let Some(rest) = value.strip_prefix('[') {
            let (host, rest) = rest
                .split_once(']')
                .ok_or_else(|| bad("missing ']' after the IPv6 address"))?;
            let port = rest
                .strip_prefix(':')
                .ok_or_else(|| bad("missing ':port' after the address"))?;
            if host.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad("the part in brackets is not an IPv6 address"));
            }
            (host, port)
        } else {
            let (host, port) = value
                .rsplit_once(':')
                .ok_or_else(|| bad("the port is missing"))?;
            if host.contains(':') {
                return Err(bad("write IPv6 addresses in brackets"));
            }
            check_host_name(host).map_err(|_| bad("the host is not a DNS name or IP address"))?;
            (host, port)
        };
        let port: u16 = port
            .parse()
            .map_err(|_| bad("the port is not a number from 1 to 65535"))?;
        if port == 0 {
            return Err(bad("the port is not a number from 1 to 65535"));
        }
        Ok(HostPort {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for HostPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Checks that `path` is a regular file this process can open for reading.
pub fn check_readable_file(path: &Path) -> Result<(), FlagValueError> {
    let file = std::fs::File::open(path).map_err(|source| FlagValueError::Unreadable {
        path: path.to_path_buf(),
        source,
    })?;
    let metadata = file
        .metadata()
        .map_err(|source| FlagValueError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
    if !metadata.is_file() {
        return Err(FlagValueError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Checks that `value` is a Kubernetes namespace name (an RFC 1123 DNS label).
pub fn check_namespace_name(value: &str) -> Result<(), FlagValueError> {
    if is_dns1123_label(value) {
        Ok(())
    } else {
        Err(FlagValueError::NotDnsLabel {
            value: value.to_string(),
        })
    }
}

/// Checks a namespace allow-list entry as Argo CD's `MatchStringInList(.., REGEXP)` reads it
/// ([`argocd_agent_proto::glob`]): a `/regex/` that compiles, or a glob that compiles and spells
/// only what a namespace can hold (lowercase letters, digits, '-') besides glob syntax.
pub fn check_namespace_pattern(value: &str) -> Result<(), FlagValueError> {
    let bad = |reason: String| FlagValueError::BadNamespacePattern {
        value: value.to_string(),
        reason,
    };
    let is_regex = value.len() > 1 && value.starts_with('/') && value.ends_with('/');
    if !is_regex
        && !value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-*?[]!{},\\".contains(c))
    {
        return Err(bad(
            "use lowercase letters, digits, '-' and the glob syntax '*', '?', '[abc]', '[a-z]', \
             '[!...]', '{a,b}', or a /regular expression/"
                .into(),
        ));
    }
    // The flag is split at commas, so `{a,b}` arrives as `{a` and `b}`: say so rather than keep
    // two patterns that do not mean what was written.
    let unescaped = |brace| {
        let mut escaped = false;
        value
            .chars()
            .filter(|&c| {
                let hit = !escaped && c == brace;
                escaped = !escaped && c == '\\';
                hit
            })
            .count()
    };
    if !is_regex && unescaped('{') != unescaped('}') {
        return Err(bad(
            "brace alternatives {a,b} cannot be written in this comma-separated flag: give \
             each alternative as its own entry"
                .into(),
        ));
    }
    argocd_agent_proto::glob::validate_list(&[value.to_string()]).map_err(bad)
}

/// Checks that `value` is an IP address or a DNS name (labels of letters, digits and '-').
pub fn check_host_name(value: &str) -> Result<(), FlagValueError> {
    if value.parse::<std::net::IpAddr>().is_ok() {
        return Ok(());
    }
    let name = value.strip_suffix('.').unwrap_or(value);
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|label| is_dns1123_label(&label.to_ascii_lowercase()));
    if ok {
        Ok(())
    } else {
        Err(FlagValueError::BadHostName {
            value: value.to_string(),
        })
    }
}

/// Checks a Kubernetes label selector (see [`LabelSelector`] for the syntax) and returns it
/// parsed; an empty one is refused (a flag left empty means "no selector" before this is called).
pub fn check_label_selector(value: &str) -> Result<LabelSelector, FlagValueError> {
    let bad = |reason: String| FlagValueError::BadLabelSelector {
        value: value.to_string(),
        reason,
    };
    if value.trim().is_empty() {
        return Err(bad("it is empty".to_string()));
    }
    value.parse().map_err(|e: SelectorError| bad(e.to_string()))
}

/// Parses one `key=value` label as upstream's `--namespace-create-labels` does (the value keeps
/// any further '=' and may not be empty), and checks key and value against Kubernetes' rules
/// (key: an optional DNS-subdomain prefix and '/', then a name; value: a name) so a bad label is
/// refused at startup rather than by every create that carries it.
pub fn parse_label(value: &str) -> Result<(String, String), FlagValueError> {
    let bad = |reason: &str| FlagValueError::BadLabel {
        value: value.to_string(),
        reason: reason.to_string(),
    };
    let (key, val) = value.split_once('=').ok_or_else(|| bad("it has no '='"))?;
    if val.is_empty() {
        return Err(bad("it has no value"));
    }
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_dns1123_subdomain(prefix) {
            return Err(bad("the key's prefix is not a DNS subdomain"));
        }
    }
    if !is_label_name(name) {
        return Err(bad(
            "the key's name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        ));
    }
    if !is_label_name(val) {
        return Err(bad(
            "the value must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
        ));
    }
    Ok((key.to_string(), val.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_parse_like_upstream_and_follow_kubernetes_rules() {
        assert_eq!(
            parse_label("team=edge").unwrap(),
            ("team".to_string(), "edge".to_string())
        );
        assert_eq!(
            parse_label("example.com/tier=spoke-1").unwrap(),
            ("example.com/tier".to_string(), "spoke-1".to_string())
        );
        for (bad, why) in [
            ("team", "no '='"),
            ("team=", "no value"),
            ("=edge", "key's name"),
            ("team=a=b", "the value"),
            ("Bad_/x=y", "prefix"),
            ("team=-edge", "the value"),
        ] {
            let err = parse_label(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn empty_env_vars_fall_back_to_defaults() {
        use std::ffi::{OsStr, OsString};
        let cmd = || {
            clap::Command::new("t")
                .arg(
                    clap::Arg::new("addr")
                        .long("addr")
                        .env("T_ADDR")
                        .default_value("0.0.0.0:1"),
                )
                .arg(clap::Arg::new("mode").long("mode").env("T_MODE"))
        };
        let lookup = |name: &OsStr| -> Option<OsString> {
            match name.to_str() {
                Some("T_ADDR") => Some(OsString::new()),
                Some("T_MODE") => Some(OsString::from("managed")),
                _ => None,
            }
        };
        let cmd = ignore_empty_env(cmd(), lookup);
        let env_of = |id: &str| {
            cmd.get_arguments()
                .find(|arg| arg.get_id() == id)
                .and_then(|arg| arg.get_env().map(OsStr::to_os_string))
        };
        assert_eq!(env_of("addr"), None, "empty var no longer consulted");
        assert_eq!(env_of("mode"), Some(OsString::from("T_MODE")));
        let matches = cmd.get_matches_from(["t"]);
        assert_eq!(matches.get_one::<String>("addr").unwrap(), "0.0.0.0:1");
    }

    #[test]
    fn durations_parse_units_and_zero() {
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(parse_duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("0").unwrap(), Duration::ZERO);
        assert_eq!(parse_duration("0s").unwrap(), Duration::ZERO);
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("10").is_err(), "a unit is required");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
        assert_eq!(format_duration(Duration::ZERO), "0");
    }

    #[test]
    fn byte_sizes_parse_binary_and_decimal_units() {
        assert_eq!(parse_byte_size("1024").unwrap(), 1024);
        assert_eq!(parse_byte_size("16MiB").unwrap(), 16 << 20);
        assert_eq!(parse_byte_size("16Mi").unwrap(), 16 << 20);
        assert_eq!(parse_byte_size("200MB").unwrap(), 200_000_000);
        assert!(parse_byte_size("MiB").is_err());
        assert!(parse_byte_size("12 parsecs").is_err());
    }

    #[test]
    fn host_port_accepts_names_ipv4_and_bracketed_ipv6() {
        let hp: HostPort = "argocd-redis:6379".parse().unwrap();
        assert_eq!((hp.host.as_str(), hp.port), ("argocd-redis", 6379));
        assert_eq!(hp.to_string(), "argocd-redis:6379");
        let hp: HostPort = "[::1]:8443".parse().unwrap();
        assert_eq!(hp.host, "::1");
        assert_eq!(hp.to_string(), "[::1]:8443");
        assert!("10.0.0.1:443".parse::<HostPort>().is_ok());
        for bad in [
            "argocd-redis",
            "::1:80",
            "host:0",
            "host:http",
            ":80",
            "bad_host:80",
        ] {
            assert!(bad.parse::<HostPort>().is_err(), "{bad}");
        }
    }

    #[test]
    fn namespace_names_and_patterns() {
        assert!(check_namespace_name("argocd").is_ok());
        assert!(check_namespace_name("agent-1").is_ok());
        for bad in ["", "Argocd", "-a", "a-", "a_b", &"a".repeat(64)] {
            assert!(check_namespace_name(bad).is_err(), "{bad}");
        }
        assert!(check_namespace_pattern("team-*").is_ok());
        assert!(check_namespace_pattern("app-?").is_ok());
        assert!(check_namespace_pattern("Team/*").is_err());
        for ok in ["team-[ab]", "{dev,prod}-*", "[!x]-ns", "/^fleet-[0-9]+$/"] {
            check_namespace_pattern(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for (bad, why) in [
            ("team-[a-z0-9]", "expected close range character"),
            ("team-[", "unexpected end of input"),
            ("/(/", "regular expression"),
            ("{dev", "brace alternatives"),
            ("prod}-*", "brace alternatives"),
        ] {
            let err = check_namespace_pattern(bad).unwrap_err().to_string();
            assert!(err.contains(why) && err.contains(bad), "{bad}: {err}");
        }
    }

    #[test]
    fn label_selectors() {
        for ok in ["app=foo", "app=foo,tier!=db", "!legacy", "env in (a,b),x"] {
            check_label_selector(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in ["", "app=foo,", "env in (a,b", "=x"] {
            assert!(check_label_selector(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn readable_file_check_names_the_path() {
        let dir = std::env::temp_dir();
        let err = check_readable_file(&dir.join("surely-missing-file.pem")).unwrap_err();
        assert!(err.to_string().contains("surely-missing-file.pem"), "{err}");
        let err = check_readable_file(&dir).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }
}
