//! Session tokens: the JWTs the principal issues after an agent authenticated with its certificate,
//! and their validation on every stream.
//!
//! Wire-compatible with upstream: `sub` is the JSON string `{"clientID":"<agent>","mode":"<mode>"}`,
//! `iss` is `argocd-agent-server`, `aud` is `argocd-agent-server-access` or `-refresh`. Keys are
//! asymmetric (ECDSA P-256 → ES256, RSA → RS512 as upstream), read from a PEM file (kept from a
//! Secret or given as one) and re-read when it changes ([`TokenIssuer::spawn_key_reload`]: new
//! tokens are signed, and only tokens signed, with the new key), or generated for development.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// JWT issuer name.
pub const ISSUER: &str = "argocd-agent-server";
/// Audience of access tokens.
pub const AUDIENCE_ACCESS: &str = "argocd-agent-server-access";
/// Audience of refresh tokens.
pub const AUDIENCE_REFRESH: &str = "argocd-agent-server-refresh";

/// Audience of the bearer tokens in self-registered cluster secrets (the resource proxy's
/// callers); their `sub` is the plain agent name, as upstream.
pub const AUDIENCE_RESOURCE_PROXY: &str = "argocd-agent-server-resource-proxy";

/// Seconds a token is accepted past its `exp` (and before its `nbf`). Zero: the principal both
/// issues and validates its tokens, on one clock, so there is no skew to absorb (jsonwebtoken's
/// default would accept a token up to 60 s after it expired).
pub const CLOCK_SKEW_LEEWAY_SECS: u64 = 0;

/// Errors of key loading and token checks; messages are safe to log (no token material).
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The key file cannot be read or parsed.
    #[error("JWT signing key: {0}")]
    Key(String),
    /// The token failed validation.
    #[error("invalid token: {0}")]
    Invalid(String),
}

/// Who a token was issued to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subject {
    /// The agent name.
    #[serde(rename = "clientID")]
    pub client_id: String,
    /// `managed` or `autonomous`.
    pub mode: String,
}

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    iss: String,
    aud: String,
    exp: i64,
    iat: i64,
    nbf: i64,
    jti: String,
}

/// Issues and validates tokens with one key pair at a time.
pub struct TokenIssuer {
    keys: RwLock<Arc<SigningKeys>>,
    access_lifetime: Duration,
    refresh_lifetime: Duration,
}

/// One key pair, as jsonwebtoken uses it.
struct SigningKeys {
    algorithm: Algorithm,
    encoding: EncodingKey,
    decoding: DecodingKey,
}

impl SigningKeys {
    /// The key pair of a PKCS#8 PEM private key (ECDSA P-256 or RSA).
    fn from_pem(pem: &str) -> Result<Self, TokenError> {
        let pair = rcgen::KeyPair::from_pem(pem)
            .map_err(|e| TokenError::Key(format!("not a usable PKCS#8 private key: {e}")))?;
        let public = pair.public_key_pem();
        let (algorithm, encoding, decoding) = if pair.is_compatible(&rcgen::PKCS_ECDSA_P256_SHA256)
        {
            (
                Algorithm::ES256,
                EncodingKey::from_ec_pem(pem.as_bytes())
                    .map_err(|e| TokenError::Key(e.to_string()))?,
                DecodingKey::from_ec_pem(public.as_bytes())
                    .map_err(|e| TokenError::Key(e.to_string()))?,
            )
        } else if pair.is_compatible(&rcgen::PKCS_RSA_SHA256) {
            (
                Algorithm::RS512,
                EncodingKey::from_rsa_pem(pem.as_bytes())
                    .map_err(|e| TokenError::Key(e.to_string()))?,
                DecodingKey::from_rsa_pem(public.as_bytes())
                    .map_err(|e| TokenError::Key(e.to_string()))?,
            )
        } else {
            return Err(TokenError::Key(
                "unsupported key type: use ECDSA P-256 or RSA".into(),
            ));
        };
        Ok(Self {
            algorithm,
            encoding,
            decoding,
        })
    }
}

impl TokenIssuer {
    /// Builds an issuer from a PKCS#8 PEM private key (ECDSA P-256 or RSA).
    pub fn from_pem(
        pem: &str,
        access_lifetime: Duration,
        refresh_lifetime: Duration,
    ) -> Result<Self, TokenError> {
        Ok(Self {
            keys: RwLock::new(Arc::new(SigningKeys::from_pem(pem)?)),
            access_lifetime,
            refresh_lifetime,
        })
    }

    /// Signs (and validates) with the key `pem` from now on; the current key stays when `pem`
    /// is not a usable key.
    pub fn replace_key(&self, pem: &str) -> Result<(), TokenError> {
        let keys = Arc::new(SigningKeys::from_pem(pem)?);
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys;
        Ok(())
    }

    fn keys(&self) -> Arc<SigningKeys> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Re-reads the key file `path` (named by `flag`) every `interval` until the task is
    /// aborted, and signs with the key it holds once it changes; a file that cannot be read or
    /// holds no usable key is reported once and the current key kept.
    pub fn spawn_key_reload(
        self: Arc<Self>,
        path: PathBuf,
        flag: &'static str,
        interval: Duration,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut current = std::fs::read(&path).ok();
            let mut last_failure: Option<String> = None;
            loop {
                tokio::time::sleep(interval).await;
                let read = std::fs::read(&path);
                if read.as_ref().ok() == current.as_ref() {
                    continue;
                }
                let outcome = read.map_err(|e| e.to_string()).and_then(|bytes| {
                    let pem = String::from_utf8_lossy(&bytes).into_owned();
                    self.replace_key(&pem).map_err(|e| e.to_string())?;
                    current = Some(bytes);
                    Ok(())
                });
                match outcome {
                    Ok(()) => {
                        last_failure = None;
                        tracing::info!(path = %path.display(), flag, "JWT signing key rotated: \
                            new tokens are signed with it; agents holding tokens of the previous \
                            key authenticate again");
                    }
                    Err(e) if last_failure.as_ref() != Some(&e) => {
                        tracing::warn!(path = %path.display(), flag, error = %e,
                            "cannot reload the JWT signing key; keeping the current one");
                        last_failure = Some(e);
                    }
                    Err(_) => {}
                }
            }
        })
    }

    /// An issuer with a freshly generated ECDSA key (development only: tokens die with the process).
    pub fn generate(
        access_lifetime: Duration,
        refresh_lifetime: Duration,
    ) -> Result<Self, TokenError> {
        let pair = rcgen::KeyPair::generate().map_err(|e| TokenError::Key(e.to_string()))?;
        Self::from_pem(&pair.serialize_pem(), access_lifetime, refresh_lifetime)
    }

    /// Issues an access and a refresh token for `subject`.
    pub fn issue_pair(&self, subject: &Subject) -> Result<(String, String), TokenError> {
        Ok((
            self.issue(subject, AUDIENCE_ACCESS, self.access_lifetime)?,
            self.issue(subject, AUDIENCE_REFRESH, self.refresh_lifetime)?,
        ))
    }

    /// Issues an access token only.
    pub fn issue_access(&self, subject: &Subject) -> Result<String, TokenError> {
        self.issue(subject, AUDIENCE_ACCESS, self.access_lifetime)
    }

    fn issue(
        &self,
        subject: &Subject,
        audience: &str,
        lifetime: Duration,
    ) -> Result<String, TokenError> {
        let sub = serde_json::to_string(subject).map_err(|e| TokenError::Invalid(e.to_string()))?;
        self.issue_with_sub(sub, audience, lifetime)
    }

    /// Issues a resource-proxy bearer token for `agent` (`sub` = the agent name).
    pub fn issue_resource_proxy(
        &self,
        agent: &str,
        lifetime: Duration,
    ) -> Result<String, TokenError> {
        self.issue_with_sub(agent.to_string(), AUDIENCE_RESOURCE_PROXY, lifetime)
    }

    /// Validates a resource-proxy bearer token (signature, issuer, audience, expiry) and
    /// returns the agent it names.
    pub fn validate_resource_proxy(&self, token: &str) -> Result<String, TokenError> {
        Ok(self.decode(token, AUDIENCE_RESOURCE_PROXY)?.sub)
    }

    fn issue_with_sub(
        &self,
        sub: String,
        audience: &str,
        lifetime: Duration,
    ) -> Result<String, TokenError> {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub,
            iss: ISSUER.into(),
            aud: audience.into(),
            exp: now + lifetime.as_secs() as i64,
            iat: now,
            nbf: now,
            jti: uuid::Uuid::new_v4().to_string(),
        };
        let keys = self.keys();
        jsonwebtoken::encode(&Header::new(keys.algorithm), &claims, &keys.encoding)
            .map_err(|e| TokenError::Invalid(e.to_string()))
    }

    /// Validates a token for `audience` (signature, issuer, audience, expiry) and returns its subject.
    pub fn validate(&self, token: &str, audience: &str) -> Result<Subject, TokenError> {
        let claims = self.decode(token, audience)?;
        serde_json::from_str(&claims.sub)
            .map_err(|e| TokenError::Invalid(format!("subject is not {{clientID, mode}}: {e}")))
    }

    fn decode(&self, token: &str, audience: &str) -> Result<Claims, TokenError> {
        let keys = self.keys();
        let mut v = Validation::new(keys.algorithm);
        v.set_issuer(&[ISSUER]);
        v.set_audience(&[audience]);
        v.leeway = CLOCK_SKEW_LEEWAY_SECS;
        v.validate_exp = true;
        v.validate_nbf = true;
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        jsonwebtoken::decode::<Claims>(token, &keys.decoding, &v)
            .map(|data| data.claims)
            .map_err(|e| TokenError::Invalid(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn issuer() -> TokenIssuer {
        TokenIssuer::generate(Duration::from_secs(300), Duration::from_secs(3600)).unwrap()
    }

    fn subject() -> Subject {
        Subject {
            client_id: "agent-a".into(),
            mode: "managed".into(),
        }
    }

    #[test]
    fn access_token_round_trips_and_is_not_a_refresh_token() {
        let i = issuer();
        let (access, refresh) = i.issue_pair(&subject()).unwrap();
        assert_eq!(i.validate(&access, AUDIENCE_ACCESS).unwrap(), subject());
        assert!(
            i.validate(&refresh, AUDIENCE_ACCESS).is_err(),
            "refresh token used as access token"
        );
        assert_eq!(i.validate(&refresh, AUDIENCE_REFRESH).unwrap(), subject());
    }

    #[test]
    fn token_from_another_key_is_refused() {
        let (access, _) = issuer().issue_pair(&subject()).unwrap();
        assert!(issuer().validate(&access, AUDIENCE_ACCESS).is_err());
    }

    /// A token signed by `i` whose `exp` is `exp_offset` seconds from now.
    fn token_expiring_in(i: &TokenIssuer, exp_offset: i64) -> String {
        let now = chrono::Utc::now().timestamp();
        let claims = Claims {
            sub: serde_json::to_string(&subject()).unwrap(),
            iss: ISSUER.into(),
            aud: AUDIENCE_ACCESS.into(),
            exp: now + exp_offset,
            iat: now - 600,
            nbf: now - 600,
            jti: "x".into(),
        };
        let keys = i.keys();
        jsonwebtoken::encode(&Header::new(keys.algorithm), &claims, &keys.encoding).unwrap()
    }

    #[test]
    fn expired_token_is_refused_without_leeway() {
        let i = issuer();
        assert!(i
            .validate(&token_expiring_in(&i, 60), AUDIENCE_ACCESS)
            .is_ok());
        // jsonwebtoken's default 60 s leeway would accept both of these.
        for expired_ago in [2, 30, 59, 3600] {
            let err = i
                .validate(&token_expiring_in(&i, -expired_ago), AUDIENCE_ACCESS)
                .unwrap_err();
            assert!(err.to_string().contains("Expired"), "{err}");
        }
    }

    #[test]
    fn a_token_without_expiry_is_refused() {
        let i = issuer();
        let claims = serde_json::json!({
            "sub": serde_json::to_string(&subject()).unwrap(),
            "iss": ISSUER, "aud": AUDIENCE_ACCESS,
        });
        let keys = i.keys();
        let t =
            jsonwebtoken::encode(&Header::new(keys.algorithm), &claims, &keys.encoding).unwrap();
        assert!(i.validate(&t, AUDIENCE_ACCESS).is_err());
    }

    #[test]
    fn resource_proxy_tokens_name_the_agent_and_are_not_access_tokens() {
        let i = issuer();
        let t = i
            .issue_resource_proxy("agent-a", Duration::from_secs(60))
            .unwrap();
        assert_eq!(i.validate_resource_proxy(&t).unwrap(), "agent-a");
        assert!(i.validate(&t, AUDIENCE_ACCESS).is_err());
        let access = i.issue_access(&subject()).unwrap();
        assert!(i.validate_resource_proxy(&access).is_err());
        assert!(issuer().validate_resource_proxy(&t).is_err(), "another key");
    }

    #[tokio::test(start_paused = true)]
    async fn a_rotated_key_file_signs_new_tokens_and_a_broken_one_keeps_the_current_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwt.key");
        let first = rcgen::KeyPair::generate().unwrap().serialize_pem();
        std::fs::write(&path, &first).unwrap();
        let i = Arc::new(
            TokenIssuer::from_pem(&first, Duration::from_secs(60), Duration::from_secs(120))
                .unwrap(),
        );
        let before = i.issue_access(&subject()).unwrap();
        let reload = i
            .clone()
            .spawn_key_reload(path.clone(), "--jwt-key", Duration::from_secs(5));
        let tick = || tokio::time::sleep(Duration::from_secs(6));

        std::fs::write(&path, "not a key").unwrap();
        tick().await;
        assert!(
            i.validate(&before, AUDIENCE_ACCESS).is_ok(),
            "a broken file keeps the current key"
        );

        let second = rcgen::KeyPair::generate().unwrap().serialize_pem();
        std::fs::write(&path, &second).unwrap();
        tick().await;
        assert!(
            i.validate(&before, AUDIENCE_ACCESS).is_err(),
            "the previous key's tokens are refused after the rotation"
        );
        let after = i.issue_access(&subject()).unwrap();
        let by_second =
            TokenIssuer::from_pem(&second, Duration::from_secs(60), Duration::from_secs(120))
                .unwrap();
        assert!(
            by_second.validate(&after, AUDIENCE_ACCESS).is_ok(),
            "new tokens are signed with the rotated key"
        );
        reload.abort();
    }

    #[test]
    fn subject_json_matches_upstream() {
        assert_eq!(
            serde_json::to_string(&subject()).unwrap(),
            r#"{"clientID":"agent-a","mode":"managed"}"#
        );
    }
}
