//! Protocol and build version, and the rule deciding which peers we talk to.
//!
//! Our version string is `argocd-agent-rs/<crate version> protocol/<N>` (see [`version_string`]).
//! Unlike upstream (exact string equality), peers are accepted when they speak the same
//! protocol major: ours with `protocol/1`, and every upstream Go build, whose version strings
//! look like `v0.5.0`, `0.9.0`, `99.9.9-unreleased` or `argocd-agent-0.0.1-alpha`, all of which
//! speak protocol 1. Empty or unparsable strings and other protocol majors are refused with a
//! message that says which side to upgrade.

use std::fmt;

/// Wire protocol major spoken by this build.
pub const PROTOCOL_VERSION: u32 = 1;
/// Version of this build (the crate version).
pub const BUILD_VERSION: &str = env!("CARGO_PKG_VERSION");
/// Product name in our version string.
pub const PRODUCT: &str = "argocd-agent-rs";

/// The version string we send (`AuthRequest.version`, `VersionResponse.version`).
pub fn version_string() -> String {
    format!("{PRODUCT}/{BUILD_VERSION} protocol/{PROTOCOL_VERSION}")
}

/// Who is on the other side.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerKind {
    /// argocd-agent-rs.
    Rust,
    /// Upstream Go argocd-agent.
    Go,
}

/// A parsed peer version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerVersion {
    pub kind: PeerKind,
    /// The release version (without a leading `v`), e.g. `0.5.0`.
    pub release: String,
    /// Protocol major the peer speaks.
    pub protocol: u32,
}

impl fmt::Display for PeerVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            PeerKind::Rust => write!(f, "{PRODUCT} {} (protocol {})", self.release, self.protocol),
            PeerKind::Go => write!(
                f,
                "argocd-agent {} (protocol {})",
                self.release, self.protocol
            ),
        }
    }
}

/// Why a peer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("peer sent no version string; it is too old or not an argocd-agent")]
    Empty,
    #[error(
        "peer version {0:?} is not understood (expected \"{PRODUCT}/X.Y.Z protocol/N\" or an argocd-agent release like \"v0.5.0\")"
    )]
    Unparsable(String),
    #[error(
        "peer {peer:?} speaks protocol {theirs}, this build ({PRODUCT} {BUILD_VERSION}) speaks protocol {ours}: upgrade this side to a release that speaks protocol {theirs}"
    )]
    PeerNewer {
        peer: String,
        theirs: u32,
        ours: u32,
    },
    #[error(
        "peer {peer:?} speaks protocol {theirs}, this build ({PRODUCT} {BUILD_VERSION}) speaks protocol {ours}: upgrade the peer to a release that speaks protocol {ours}"
    )]
    PeerOlder {
        peer: String,
        theirs: u32,
        ours: u32,
    },
}

/// `MAJOR.MINOR[.PATCH][-pre][+build]`, each numeric part all digits.
fn is_semver_like(s: &str) -> bool {
    let core = s.split(['-', '+']).next().unwrap_or_default();
    let parts: Vec<&str> = core.split('.').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && s.bytes().all(|b| b.is_ascii_graphic())
}

/// Parse a peer's version string.
pub fn parse_peer_version(peer: &str) -> Result<PeerVersion, VersionError> {
    let peer = peer.trim();
    if peer.is_empty() {
        return Err(VersionError::Empty);
    }
    let unparsable = || VersionError::Unparsable(peer.to_string());

    if let Some(rest) = peer.strip_prefix(PRODUCT).and_then(|r| r.strip_prefix('/')) {
        let mut words = rest.split_whitespace();
        let release = words.next().ok_or_else(unparsable)?;
        if !is_semver_like(release) {
            return Err(unparsable());
        }
        let protocol = words
            .find_map(|w| w.strip_prefix("protocol/"))
            .ok_or_else(unparsable)?
            .parse::<u32>()
            .map_err(|_| unparsable())?;
        return Ok(PeerVersion {
            kind: PeerKind::Rust,
            release: release.to_string(),
            protocol,
        });
    }

    // Upstream Go: optional product prefix, optional `v`, semver; anything after a space
    // (e.g. a git revision) is ignored.
    let first = peer.split_whitespace().next().unwrap_or_default();
    let bare = first
        .strip_prefix("argocd-agent-")
        .or_else(|| first.strip_prefix("argocd-agent/"))
        .unwrap_or(first);
    let bare = if bare == "argocd-agent" {
        peer.split_whitespace().nth(1).unwrap_or_default()
    } else {
        bare
    };
    let release = bare.strip_prefix('v').unwrap_or(bare);
    if is_semver_like(release) {
        return Ok(PeerVersion {
            kind: PeerKind::Go,
            release: release.to_string(),
            protocol: 1,
        });
    }
    Err(unparsable())
}

/// The `AuthRequest.version` to send to a principal whose `Version` RPC answered `principal`.
///
/// Upstream principals (v0.8 on) refuse any version that is not byte-equal to their own release
/// (`FailedPrecondition "version mismatch"`), and their `Version` RPC answers that release behind an
/// `argocd-agent-` prefix. So a Go principal is answered with its own release string, verbatim;
/// ours (and anything unparsable, or no answer) get our own version string.
pub fn auth_version_for(principal: Option<&str>) -> String {
    match principal.map(|p| (p, parse_peer_version(p))) {
        Some((p, Ok(v))) if v.kind == PeerKind::Go => {
            let first = p.split_whitespace().next().unwrap_or_default();
            first
                .strip_prefix("argocd-agent-")
                .unwrap_or(first)
                .to_string()
        }
        _ => version_string(),
    }
}

/// Decide whether we talk to a peer announcing `peer`. Same protocol major: yes.
pub fn check_compatible(peer: &str) -> Result<(), VersionError> {
    let v = parse_peer_version(peer)?;
    match v.protocol.cmp(&PROTOCOL_VERSION) {
        std::cmp::Ordering::Equal => Ok(()),
        std::cmp::Ordering::Greater => Err(VersionError::PeerNewer {
            peer: peer.to_string(),
            theirs: v.protocol,
            ours: PROTOCOL_VERSION,
        }),
        std::cmp::Ordering::Less => Err(VersionError::PeerOlder {
            peer: peer.to_string(),
            theirs: v.protocol,
            ours: PROTOCOL_VERSION,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_version_is_compatible() {
        assert_eq!(
            version_string(),
            format!("argocd-agent-rs/{} protocol/1", env!("CARGO_PKG_VERSION"))
        );
        check_compatible(&version_string()).expect("own version");
        check_compatible("argocd-agent-rs/9.3.1 protocol/1")
            .expect("other rs release, same protocol");
    }

    #[test]
    fn a_go_principal_is_sent_its_own_release_verbatim() {
        assert_eq!(auth_version_for(Some("argocd-agent-0.9.0")), "0.9.0");
        assert_eq!(
            auth_version_for(Some("argocd-agent-99.9.9-unreleased")),
            "99.9.9-unreleased"
        );
        assert_eq!(auth_version_for(Some("v0.7.2")), "v0.7.2");
        assert_eq!(auth_version_for(Some(&version_string())), version_string());
        assert_eq!(auth_version_for(None), version_string());
        assert_eq!(auth_version_for(Some("garbage!")), version_string());
    }

    #[test]
    fn upstream_versions_are_protocol_1() {
        for v in [
            "v0.5.0",
            "0.9.0",
            "99.9.9-unreleased",
            "argocd-agent-0.0.1-alpha",
            "v0.6.1+abc123",
            "argocd-agent v0.3.2",
            "0.4",
        ] {
            let p = parse_peer_version(v).unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(p.kind, PeerKind::Go, "{v}");
            assert_eq!(p.protocol, 1, "{v}");
            check_compatible(v).unwrap_or_else(|e| panic!("{v}: {e}"));
        }
    }

    #[test]
    fn refuses_garbage_and_newer_major() {
        assert_eq!(check_compatible(""), Err(VersionError::Empty));
        for g in [
            "hello",
            "v",
            "1",
            "1.x.3",
            "argocd-agent-rs/0.1.0",
            "argocd-agent-rs/abc protocol/1",
        ] {
            assert!(
                matches!(check_compatible(g), Err(VersionError::Unparsable(_))),
                "{g} must be refused"
            );
        }
        let err = check_compatible("argocd-agent-rs/2.0.0 protocol/2").unwrap_err();
        assert!(matches!(err, VersionError::PeerNewer { theirs: 2, .. }));
        assert!(err.to_string().contains("upgrade this side"), "{err}");
        let err = check_compatible("argocd-agent-rs/0.0.1 protocol/0").unwrap_err();
        assert!(err.to_string().contains("upgrade the peer"), "{err}");
    }
}
