//! The session tokens the principal hands out (access + refresh JWTs) and the decision, before
//! each connection attempt, whether to reuse, refresh or re-authenticate.
//!
//! The tokens are only read for their `exp` claim (base64url payload, no signature check: the
//! principal verifies them, the agent just wants to know when they run out). Token values never
//! appear in `Debug` output or logs.

use std::fmt;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;

/// How long before expiry a token counts as expired (clock skew, time to open the stream).
pub const EXPIRY_MARGIN_SECS: i64 = 30;

/// The `exp` claim (seconds since the Unix epoch) of a JWT, read without verifying it.
/// `None` if the token is not a JWT or has no numeric `exp`.
pub fn jwt_expiry(token: &str) -> Option<i64> {
    let mut parts = token.split('.');
    let (_header, payload, _signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    // Tolerate padding some encoders add despite the JWT spec.
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let exp = claims.get("exp")?;
    exp.as_i64().or_else(|| exp.as_f64().map(|f| f as i64))
}

/// What to do with the tokens held before opening a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenStep {
    /// The access token is still good: subscribe with it.
    UseAccess,
    /// The access token ran out but the refresh token is good: call RefreshToken.
    Refresh,
    /// Both ran out: call Authenticate.
    Authenticate,
}

/// Access and refresh token of the current session.
#[derive(Clone)]
pub struct SessionTokens {
    access: String,
    refresh: String,
    access_expiry: Option<i64>,
    refresh_expiry: Option<i64>,
}

impl fmt::Debug for SessionTokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionTokens")
            .field("access", &"<redacted>")
            .field("access_expiry", &self.access_expiry)
            .field("refresh", &"<redacted>")
            .field("refresh_expiry", &self.refresh_expiry)
            .finish()
    }
}

impl SessionTokens {
    /// Tokens from an `AuthResponse`.
    pub fn new(access: String, refresh: String) -> Self {
        SessionTokens {
            access_expiry: jwt_expiry(&access),
            refresh_expiry: jwt_expiry(&refresh),
            access,
            refresh,
        }
    }

    /// The access token (sent as `authorization` metadata, raw, without `Bearer `).
    pub fn access(&self) -> &str {
        &self.access
    }

    /// The refresh token.
    pub fn refresh(&self) -> &str {
        &self.refresh
    }

    /// Decides at `now` (Unix seconds) how to get a usable access token. A token without a
    /// readable `exp` counts as valid; the principal refuses it if it is not.
    pub fn next_step(&self, now: i64) -> TokenStep {
        let valid = |exp: Option<i64>| exp.is_none_or(|e| e - EXPIRY_MARGIN_SECS > now);
        if !self.access.is_empty() && valid(self.access_expiry) {
            TokenStep::UseAccess
        } else if !self.refresh.is_empty() && valid(self.refresh_expiry) {
            TokenStep::Refresh
        } else {
            TokenStep::Authenticate
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(claims: &str) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS512","typ":"JWT"}"#);
        let payload = URL_SAFE_NO_PAD.encode(claims.as_bytes());
        format!("{header}.{payload}.c2lnbmF0dXJl")
    }

    #[test]
    fn exp_is_read_from_the_payload_without_verification() {
        assert_eq!(
            jwt_expiry(&jwt(r#"{"sub":"{\"clientID\":\"a\"}","exp":1700000000}"#)),
            Some(1700000000)
        );
        assert_eq!(
            jwt_expiry(&jwt(r#"{"exp":1700000000.5}"#)),
            Some(1700000000)
        );
        assert_eq!(jwt_expiry(&jwt(r#"{"sub":"a"}"#)), None);
        assert_eq!(jwt_expiry("not-a-jwt"), None);
        assert_eq!(jwt_expiry("a.b.c.d"), None);
        assert_eq!(jwt_expiry("a.!!!.c"), None);
    }

    #[test]
    fn reuse_then_refresh_then_authenticate_as_tokens_run_out() {
        let now = 1_000_000;
        let t = SessionTokens::new(
            jwt(&format!(r#"{{"exp":{}}}"#, now + 300)),
            jwt(&format!(r#"{{"exp":{}}}"#, now + 3600)),
        );
        assert_eq!(t.next_step(now), TokenStep::UseAccess);
        assert_eq!(
            t.next_step(now + 280),
            TokenStep::Refresh,
            "within the margin"
        );
        assert_eq!(t.next_step(now + 3590), TokenStep::Authenticate);
        let opaque = SessionTokens::new("opaque".into(), String::new());
        assert_eq!(opaque.next_step(now), TokenStep::UseAccess);
        let empty = SessionTokens::new(String::new(), String::new());
        assert_eq!(empty.next_step(now), TokenStep::Authenticate);
    }

    #[test]
    fn debug_output_never_shows_tokens() {
        let t = SessionTokens::new("secret-access".into(), "secret-refresh".into());
        let s = format!("{t:?}");
        assert!(!s.contains("secret"), "{s}");
    }
}
