//! The one rule for what a failed Kubernetes request means for the change that caused it.
//!
//! Owns [`handle_error`]: a request the apiserver refused as malformed or invalid (400, 405, 406,
//! 413, 415, 422) can never succeed as sent, so the event is rejected (ACKed with the error, which
//! the peer logs); everything else — transport failures, timeouts, 401/403 (credentials or RBAC an
//! admin can fix), 404 (the object or its namespace may appear: every retry re-reads the state),
//! 409 conflicts, 429 throttling and 5xx — is retried, because dropping the event would lose the
//! change. Handlers that treat a particular status as success (a delete of what is already gone, a
//! create of what already exists) match it themselves before falling back to this rule.

use argocd_agent_proto::sync::HandleError;

/// Status codes whose request can never succeed as sent.
const NEVER_SUCCEEDS: &[u16] = &[400, 405, 406, 413, 415, 422];

/// Whether `e` is the apiserver refusing the request itself (see the module doc).
pub fn is_refusal(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if NEVER_SUCCEEDS.contains(&s.code))
}

/// Whether `e` says the object (or its namespace) does not exist.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether `e` is a conflict: a stale resourceVersion, or a create of an existing name.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// `e`, met while doing `what`, as the result of handling an event.
pub fn handle_error(what: impl std::fmt::Display, e: kube::Error) -> HandleError {
    match &e {
        kube::Error::Api(s) if is_refusal(&e) => {
            HandleError::Rejected(format!("{what}: apiserver refused: {}", s.message))
        }
        _ => HandleError::Retryable(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(&format!("status {code}"), "Reason")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn only_requests_that_can_never_succeed_are_rejected() {
        for code in [400, 405, 406, 413, 415, 422] {
            assert!(
                matches!(handle_error("x", api(code)), HandleError::Rejected(m) if m.contains(&format!("status {code}"))),
                "{code}"
            );
        }
        for code in [401, 403, 404, 409, 410, 429, 500, 503] {
            assert!(
                matches!(handle_error("x", api(code)), HandleError::Retryable(_)),
                "{code}"
            );
        }
        let transport = kube::Error::Service("connection refused".into());
        assert!(matches!(
            handle_error("x", transport),
            HandleError::Retryable(_)
        ));
    }
}
