//! The `authapi.Authentication` and `versionapi.Version` services, and the check every stream
//! passes: the caller's client certificate (or, behind a service mesh, the mesh's identity header)
//! names an agent, and the access token was issued to that same agent; an agent's mode is the one pinned for it ([`crate::mode_pin`]).

use std::sync::Arc;

use argocd_agent_proto::identity::AgentName;
use argocd_agent_proto::mode::AgentMode;
use argocd_agent_proto::pb::authapi::authentication_server::Authentication;
use argocd_agent_proto::pb::authapi::{AuthRequest, AuthResponse, RefreshTokenRequest};
use argocd_agent_proto::pb::versionapi::version_server::Version;
use argocd_agent_proto::pb::versionapi::{VersionRequest, VersionResponse};
use argocd_agent_proto::version::{check_compatible, version_string};
use tonic::{Request, Response, Status};

use crate::listener::{PeerCredential, PeerIdentity};
use crate::metrics::PrincipalMetrics;
use crate::mode_pin::ModePins;
use crate::tokens::{Subject, TokenIssuer, AUDIENCE_ACCESS, AUDIENCE_REFRESH};

/// Largest Authenticate/RefreshToken/Version request accepted (their bodies are a few hundred
/// bytes): these calls come before a token is checked, so they get a limit of their own instead
/// of the event stream's `--grpc-max-message-size`, and a client cannot make the principal buffer
/// megabytes per call.
pub const AUTH_MAX_MESSAGE_SIZE: usize = 64 * 1024;

/// HTTP/2 streams one gRPC connection may have open at once (an agent uses one Subscribe plus the
/// odd Authenticate, RefreshToken or Ping), so one connection cannot hold hundreds of calls'
/// buffers before any of them is authorised.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 16;

/// Settings of the authentication service.
pub struct AuthPolicy {
    /// The principal's namespace (never a valid agent name).
    pub principal_namespace: String,
    /// Modes agents may use.
    pub allowed_modes: Vec<AgentMode>,
    /// Modes this build implements.
    pub implemented_modes: Vec<AgentMode>,
}

/// Implements `authapi.Authentication`.
pub struct AuthService {
    /// Token issuer shared with the stream check.
    pub issuer: Arc<TokenIssuer>,
    /// Policy.
    pub policy: AuthPolicy,
    /// Metrics.
    pub metrics: Arc<PrincipalMetrics>,
    /// Each agent's pinned mode.
    pub pins: Arc<ModePins>,
}

/// The agent that sent `req`: the one the verified client certificate of its connection names,
/// or, on the `--insecure-plaintext` listener behind a service mesh, the one the mesh's identity
/// header names ([`PeerCredential`]; the listener decides which, never the request).
pub fn caller_agent<T>(req: &Request<T>) -> Result<AgentName, Status> {
    let peer = req
        .extensions()
        .get::<PeerIdentity>()
        .ok_or_else(|| Status::unauthenticated("no client certificate: connect with mutual TLS"))?;
    match &peer.credential {
        PeerCredential::Certificate(Ok(id)) => Ok(id.name.clone()),
        PeerCredential::Certificate(Err(reason)) => Err(Status::unauthenticated(format!(
            "client certificate refused: {reason}"
        ))),
        PeerCredential::MeshHeader(rule) => {
            let value = req
                .metadata()
                .get(rule.header.as_str())
                .and_then(|v| v.to_str().ok());
            rule.agent_of(value)
                .map_err(|e| Status::unauthenticated(e.to_string()))
        }
    }
}

/// The auth method name an agent must send in `AuthRequest.method` on `req`'s connection.
fn expected_method<T>(req: &Request<T>) -> &'static str {
    match req
        .extensions()
        .get::<PeerIdentity>()
        .map(|p| &p.credential)
    {
        Some(PeerCredential::MeshHeader(_)) => "header",
        _ => "mtls",
    }
}

/// Checks the `authorization` metadata of a stream request against the connection's certificate;
/// returns the agent and its mode.
pub fn authorize_stream<T>(
    req: &Request<T>,
    issuer: &TokenIssuer,
    metrics: &PrincipalMetrics,
) -> Result<(AgentName, AgentMode), Status> {
    let cert_agent = caller_agent(req).inspect_err(|_| metrics.auth_failure("certificate"))?;
    let token = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            metrics.auth_failure("missing_token");
            Status::unauthenticated("missing authorization metadata: call Authenticate first")
        })?;
    let subject = issuer
        .validate(token.trim_start_matches("Bearer "), AUDIENCE_ACCESS)
        .map_err(|e| {
            metrics.auth_failure("invalid_token");
            Status::unauthenticated(format!("{e}: authenticate again"))
        })?;
    if subject.client_id != cert_agent.as_str() {
        metrics.auth_failure("token_certificate_mismatch");
        return Err(Status::permission_denied(format!(
            "token was issued to agent {:?} but the client certificate names {:?}",
            subject.client_id,
            cert_agent.as_str()
        )));
    }
    let mode = parse_mode(&subject.mode)?;
    Ok((cert_agent, mode))
}

fn parse_mode(mode: &str) -> Result<AgentMode, Status> {
    mode.parse().map_err(Status::invalid_argument)
}

impl AuthService {
    fn check_mode(&self, mode: AgentMode) -> Result<(), Status> {
        if !self.policy.allowed_modes.contains(&mode) {
            return Err(Status::permission_denied(format!(
                "agent mode {} is not allowed by this principal (--allowed-agent-modes)",
                mode.as_str()
            )));
        }
        if !self.policy.implemented_modes.contains(&mode) {
            return Err(Status::failed_precondition(format!(
                "agent mode {} is not implemented by this principal build; run the agent in managed mode",
                mode.as_str()
            )));
        }
        Ok(())
    }

    fn subject_for(&self, agent: &AgentName, mode: AgentMode) -> Subject {
        Subject {
            client_id: agent.as_str().to_string(),
            mode: mode.as_str().to_string(),
        }
    }
}

#[tonic::async_trait]
impl Authentication for AuthService {
    async fn authenticate(
        &self,
        req: Request<AuthRequest>,
    ) -> Result<Response<AuthResponse>, Status> {
        let agent = caller_agent(&req).inspect_err(|_| self.metrics.auth_failure("certificate"))?;
        let body = req.get_ref();
        let expected = expected_method(&req);
        if body.method != expected {
            self.metrics.auth_failure("method");
            return Err(Status::unauthenticated(format!(
                "auth method {:?} is not supported: this principal accepts {expected:?}",
                body.method
            )));
        }
        if let Err(e) = check_compatible(&body.version) {
            self.metrics.auth_failure("version");
            return Err(Status::failed_precondition(e.to_string()));
        }
        if agent.as_str() == self.policy.principal_namespace {
            self.metrics.auth_failure("reserved_name");
            return Err(Status::permission_denied(
                "an agent may not be named like the principal's namespace",
            ));
        }
        let mode = parse_mode(&body.mode).inspect_err(|_| self.metrics.auth_failure("mode"))?;
        self.check_mode(mode)
            .inspect_err(|_| self.metrics.auth_failure("mode"))?;
        self.pins
            .admit(&agent, mode)
            .await
            .inspect_err(|_| self.metrics.auth_failure("mode_pinned"))?;
        let (access, refresh) = self
            .issuer
            .issue_pair(&self.subject_for(&agent, mode))
            .map_err(|e| Status::internal(e.to_string()))?;
        tracing::info!(agent = agent.as_str(), mode = mode.as_str(), peer_version = %body.version, "agent authenticated");
        Ok(Response::new(AuthResponse {
            access_token: access,
            refresh_token: refresh,
            version: version_string(),
            principal_namespace: self.policy.principal_namespace.clone(),
        }))
    }

    async fn refresh_token(
        &self,
        req: Request<RefreshTokenRequest>,
    ) -> Result<Response<AuthResponse>, Status> {
        let agent = caller_agent(&req).inspect_err(|_| self.metrics.auth_failure("certificate"))?;
        let subject = self
            .issuer
            .validate(&req.get_ref().refresh_token, AUDIENCE_REFRESH)
            .map_err(|e| {
                self.metrics.auth_failure("invalid_refresh_token");
                Status::unauthenticated(format!("{e}: authenticate again"))
            })?;
        if subject.client_id != agent.as_str() {
            self.metrics.auth_failure("token_certificate_mismatch");
            return Err(Status::permission_denied(
                "refresh token was issued to another agent",
            ));
        }
        let mode = parse_mode(&subject.mode)?;
        self.check_mode(mode)?;
        self.pins
            .verify(&agent, mode)
            .await
            .inspect_err(|_| self.metrics.auth_failure("mode_pinned"))?;
        let access = self
            .issuer
            .issue_access(&subject)
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(AuthResponse {
            access_token: access,
            refresh_token: req.into_inner().refresh_token,
            version: version_string(),
            principal_namespace: self.policy.principal_namespace.clone(),
        }))
    }
}

/// Implements `versionapi.Version`.
pub struct VersionService;

#[tonic::async_trait]
impl Version for VersionService {
    async fn version(
        &self,
        _req: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse {
            version: version_string(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_proto::identity::{AgentIdentity, HeaderIdentity};

    fn request(credential: PeerCredential, header: Option<&str>) -> Request<()> {
        let mut req = Request::new(());
        if let Some(value) = header {
            req.metadata_mut()
                .insert("x-agent-id", value.parse().unwrap());
        }
        req.extensions_mut().insert(PeerIdentity {
            credential,
            remote: None,
        });
        req
    }

    #[test]
    fn the_header_names_the_agent_only_on_the_mesh_listener() {
        let rule = Arc::new(HeaderIdentity::parse("x-agent-id:^(.+)$").unwrap());
        let mesh = request(PeerCredential::MeshHeader(rule.clone()), Some("agent-b"));
        assert_eq!(caller_agent(&mesh).unwrap().as_str(), "agent-b");
        assert_eq!(expected_method(&mesh), "header");
        let missing = request(PeerCredential::MeshHeader(rule), None);
        assert_eq!(
            caller_agent(&missing).unwrap_err().code(),
            tonic::Code::Unauthenticated
        );
        // On a TLS connection the certificate decides, whatever header the client sends.
        let cert = AgentIdentity {
            name: AgentName::new("agent-a").unwrap(),
            fingerprint: "AA".into(),
            not_after: chrono::Utc::now(),
        };
        let tls = request(PeerCredential::Certificate(Ok(cert)), Some("agent-b"));
        assert_eq!(caller_agent(&tls).unwrap().as_str(), "agent-a");
        assert_eq!(expected_method(&tls), "mtls");
        let refused = request(
            PeerCredential::Certificate(Err("no client certificate presented".into())),
            Some("agent-b"),
        );
        assert!(caller_agent(&refused).is_err());
    }
}
