//! Redis credentials as Argo CD and upstream argocd-agent give them, shared by the agent (its
//! cluster's Argo CD Redis) and the principal (the hub Redis behind its Redis proxy): a password type
//! that never shows in `Debug`, and the rule turning `--redis-username` / `--redis-password` /
//! `--redis-creds-dir-path` (or upstream's `REDIS_USERNAME` / `REDIS_PASSWORD` /
//! `REDIS_CREDS_DIR_PATH`) into the credentials sent with `AUTH`.

use std::path::PathBuf;

use crate::binary_config::{non_empty, ConfigError, FlagEnv};

/// Upstream's env vars for Redis credentials (Argo CD's and upstream argocd-agent's names), read
/// when neither the flag nor its own env var is given: username, password, creds dir.
pub const UPSTREAM_REDIS_ENV: [&str; 3] =
    ["REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_CREDS_DIR_PATH"];

/// A Redis password: never shown by `Debug`, so a logged config cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisPassword(String);

impl RedisPassword {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Self {
        RedisPassword(password.into())
    }

    /// The password in clear, to send with AUTH.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for RedisPassword {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl std::str::FromStr for RedisPassword {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(RedisPassword(s.to_string()))
    }
}

/// What is sent with `AUTH` on every connection to a Redis (and, on the principal's Redis proxy,
/// what clients must authenticate with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisCredentials {
    /// ACL user; `None` sends `AUTH <password>` (the `default` user, and Redis before 6).
    pub username: Option<String>,
    /// The password.
    pub password: RedisPassword,
}

/// The Redis credentials of the flags, else of upstream's env vars: a creds directory (files
/// `auth` and optional `auth_username`, trimmed, as upstream reads them) or a username and password.
/// A creds directory given together with a username or password flag is refused, as upstream does.
pub fn redis_credentials(
    flags: &FlagEnv,
    username: Option<String>,
    password: Option<RedisPassword>,
    creds_dir: Option<PathBuf>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<RedisCredentials>, ConfigError> {
    let env = |name: &str| env(name).filter(|v| !v.is_empty());
    let username = non_empty(username);
    let password = password.filter(|p| !p.0.is_empty());
    let creds_dir = non_empty(creds_dir);
    if creds_dir.is_some() && (username.is_some() || password.is_some()) {
        let flag = if password.is_some() {
            "redis-password"
        } else {
            "redis-username"
        };
        return Err(flags.conflict(
            "redis-creds-dir-path",
            flag,
            "give the credentials either as files in a directory or as username/password, not both",
        ));
    }
    let explicit = username.is_some() || password.is_some();
    let [user_env, password_env, dir_env] = UPSTREAM_REDIS_ENV;
    let creds_dir = creds_dir.or_else(|| {
        (!explicit)
            .then(|| env(dir_env).map(PathBuf::from))
            .flatten()
    });
    if let Some(dir) = creds_dir {
        const FLAG: &str = "redis-creds-dir-path";
        let read = |file: &str| match std::fs::read_to_string(dir.join(file)) {
            Ok(text) => Ok(Some(text.trim().to_string())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(flags.invalid(
                FLAG,
                format!("cannot read {}: {e}", dir.join(file).display()),
            )),
        };
        let password = read("auth")?.filter(|p| !p.is_empty()).ok_or_else(|| {
            flags.invalid(
                FLAG,
                format!(
                    "{} holds no password in file `auth` (mount the secret `argocd-redis` there, or set REDIS_PASSWORD)",
                    dir.display()
                ),
            )
        })?;
        return Ok(Some(RedisCredentials {
            username: read("auth_username")?.filter(|u| !u.is_empty()),
            password: RedisPassword(password),
        }));
    }
    let username = username.or_else(|| env(user_env));
    let password = password.or_else(|| env(password_env).map(RedisPassword));
    match (username, password) {
        (username, Some(password)) => Ok(Some(RedisCredentials { username, password })),
        (Some(_), None) => Err(flags.invalid(
            "redis-username",
            "is set without a password; set --redis-password (or REDIS_PASSWORD) too",
        )),
        (None, None) => Ok(None),
    }
}
