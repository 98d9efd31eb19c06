//! A refresh requested on a hub Application (`argocd app get --refresh`: argocd-server writes the
//! annotation `argocd.argoproj.io/refresh: normal|hard`, and `argocd.argoproj.io/hydrate` with
//! it), from the request to its delivery to the spoke's Argo CD and its removal from the hub.
//!
//! The hub's application controller skips a pulled Application, so nobody there removes the
//! request: the pull model carries it to the spoke in the payload and removes it from the hub once
//! the spoke's Argo CD has consumed it, which is also what argocd-server waits for before
//! `argocd app get --refresh` returns. A later request is then a change again and is delivered
//! again. Upstream (multicloud-integrations) removes it from the hub as soon as the ManifestWork is
//! written; the next work then lacks it, and the work agent's server-side apply withdraws it from
//! the spoke if Argo CD has not consumed it yet (or never saw it, when the agent read only the
//! later work).
//!
//! The signal for "consumed" is the spoke's own state, read by the work agent in one snapshot of
//! the spoke Application (its status feedback, [`super::manifestwork::application_feedback_rules`]):
//! the payload that carries the request also carries a delivery token ([`DELIVERY_ANNOTATION`]),
//! and the request has been consumed once a snapshot shows this token (so it was taken after the
//! apply that put the request there) and no longer the request annotation (Argo CD's controller
//! removes both request annotations in the write that records its refresh, `status.reconciledAt`
//! included). Weaker signals fail: the work applied at the generation carrying the request says
//! nothing of Argo CD having read it, so clearing then would let the next apply withdraw it; a
//! `reconciledAt` newer than before the delivery may come from a periodic refresh that ran before
//! the apply, and the feedback may be older than the `Applied` condition. The token is new for
//! each request (the hub Application's `resourceVersion` when the request is first carried, kept
//! while the work carries the same request), so a spoke that consumed one request is never taken
//! for having consumed the next, identical one; it lives in the payload only (Argo CD's
//! ApplicationSet controller removes the annotations it does not preserve from the Applications it
//! generates). Before clearing, the work is read again from the API server: the cached one may
//! predate the work written right after the previous request was cleared, and would show that
//! request consumed while the hub already asks for the next. Should that write fail, a request
//! asked again before it is retried is taken for the one cleared.
//!
//! Between the spoke consuming a request and the hub clearing it (one feedback period), a hub
//! change that rewrites the payload carries the request once more, and the spoke refreshes once
//! more: leaving it out would withdraw it from a spoke that has not consumed it. A request made on
//! the hub while an identical one is still there is no change (argocd-server's patch writes
//! nothing) and is answered with it, as Argo CD answers it.
//!
//! Owns the delivery token and the pure decisions [`requested`], [`carried`], [`token_for`] and
//! [`delivered`]; the ManifestWork keeps `ignoreFields` on spoke change for the request
//! annotations ([`super::manifestwork`]), so re-applying the same work never puts back a request
//! the spoke consumed.

use std::collections::BTreeMap;

use argocd_agent_kube::argocd::Application;
use argocd_agent_proto::event::{HYDRATE_ANNOTATION, REFRESH_ANNOTATION};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::manifestwork::ManifestWork;
use super::status::{read_feedback, SpokeStatus};

/// Payload annotation: the token of the refresh request the payload carries.
pub const DELIVERY_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/refresh-delivery";

/// Argo CD's request annotations, in the order the one deciding consumption is chosen: the
/// refresh (argocd-server waits for its removal) if requested, else the hydration.
pub const REQUEST_ANNOTATIONS: [&str; 2] = [REFRESH_ANNOTATION, HYDRATE_ANNOTATION];

/// The request annotations present, by key.
pub type Request = BTreeMap<String, String>;

/// A request as the payload carries it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carried {
    /// The request annotations in the payload.
    pub request: Request,
    /// Its delivery token.
    pub token: String,
}

fn request_of(meta: &ObjectMeta) -> Option<Request> {
    let annotations = meta.annotations.as_ref()?;
    let request: Request = REQUEST_ANNOTATIONS
        .iter()
        .filter_map(|k| annotations.get(*k).map(|v| (k.to_string(), v.clone())))
        .collect();
    (!request.is_empty()).then_some(request)
}

/// The refresh (and hydration) the hub Application requests.
pub fn requested(app: &Application) -> Option<Request> {
    request_of(&app.metadata)
}

/// The request and token the work's payload carries.
pub fn carried(work: &ManifestWork) -> Option<Carried> {
    let metadata = work.spec.workload.manifests.first()?.get("metadata")?;
    let meta = ObjectMeta::deserialize(metadata).ok()?;
    let token = meta.annotations.as_ref()?.get(DELIVERY_ANNOTATION)?.clone();
    Some(Carried {
        request: request_of(&meta)?,
        token,
    })
}

/// The token for delivering `request` of `app`: kept while `existing` carries the same request,
/// else the Application's current `resourceVersion` (the hub writes it anew for every request,
/// and for every clearing).
pub fn token_for(app: &Application, request: &Request, existing: Option<&ManifestWork>) -> String {
    existing
        .and_then(carried)
        .filter(|c| &c.request == request)
        .map(|c| c.token)
        .unwrap_or_else(|| app.metadata.resource_version.clone().unwrap_or_default())
}

/// `meta` with the delivery `token` of its request, as the payload carries it.
pub fn stamp(meta: &mut ObjectMeta, token: String) {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(DELIVERY_ANNOTATION.to_string(), token);
}

/// The spoke's value of request annotation `key`, as the feedback reports it.
fn on_spoke(spoke: &SpokeStatus, key: &str) -> Option<String> {
    if key == REFRESH_ANNOTATION {
        spoke.refresh_requested.clone()
    } else {
        spoke.hydrate_requested.clone()
    }
}

/// True when the spoke's Argo CD has consumed the request `app` makes: `work` carries this request
/// with its token, and one snapshot of the spoke Application (the feedback) shows the token and
/// not the deciding request annotation.
pub fn delivered(app: &Application, work: Option<&ManifestWork>) -> bool {
    let Some(work) = work else {
        return false;
    };
    let (Some(request), Some(carried)) = (requested(app), carried(work)) else {
        return false;
    };
    if carried.request != request {
        return false;
    }
    let spoke = read_feedback(work).0;
    let deciding = REQUEST_ANNOTATIONS
        .iter()
        .find(|k| request.contains_key(**k))
        .expect("a request has an annotation");
    spoke.refresh_delivery.as_deref() == Some(carried.token.as_str())
        && on_spoke(&spoke, deciding).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pull::manifestwork::{
        FEEDBACK_HYDRATE_REQUESTED, FEEDBACK_REFRESH_DELIVERY, FEEDBACK_REFRESH_REQUESTED,
    };
    use serde_json::{json, Value};

    fn app(annotations: Value, resource_version: &str) -> Application {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "apps",
                         "resourceVersion": resource_version, "annotations": annotations},
            "spec": {}
        }))
        .unwrap()
    }

    /// A work whose payload has `annotations` and whose feedback shows `feedback` (name, value).
    fn work(annotations: Value, feedback: &[(&str, &str)]) -> ManifestWork {
        let values: Vec<Value> = feedback
            .iter()
            .map(|(n, v)| json!({"name": n, "fieldValue": {"type": "String", "string": v}}))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "work.open-cluster-management.io/v1", "kind": "ManifestWork",
            "metadata": {"name": "guestbook-3f2a9", "namespace": "cluster1", "generation": 2},
            "spec": {"workload": {"manifests": [
                {"kind": "Application", "metadata": {"name": "guestbook", "annotations": annotations}}
            ]}},
            "status": {"resourceStatus": {"manifests": [{
                "resourceMeta": {"group": "argoproj.io", "kind": "Application", "resource": "applications"},
                "statusFeedback": {"values": values}
            }]}}
        }))
        .unwrap()
    }

    fn request(pairs: &[(&str, &str)]) -> Request {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const TOKEN: &str = "DELIVERY";

    #[test]
    fn a_request_is_argocd_servers_refresh_and_hydrate_annotations() {
        let hub = app(
            json!({REFRESH_ANNOTATION: "hard", HYDRATE_ANNOTATION: "normal", "notes": "x"}),
            "7",
        );
        assert_eq!(
            requested(&hub),
            Some(request(&[
                (REFRESH_ANNOTATION, "hard"),
                (HYDRATE_ANNOTATION, "normal")
            ]))
        );
        assert_eq!(requested(&app(json!({"notes": "x"}), "7")), None);
        let payload = work(
            json!({REFRESH_ANNOTATION: "hard", DELIVERY_ANNOTATION: TOKEN}),
            &[],
        );
        assert_eq!(
            carried(&payload),
            Some(Carried {
                request: request(&[(REFRESH_ANNOTATION, "hard")]),
                token: TOKEN.into()
            })
        );
        assert_eq!(
            carried(&work(json!({REFRESH_ANNOTATION: "hard"}), &[])),
            None,
            "not carried for delivery without a token"
        );
    }

    #[test]
    fn a_token_is_new_for_each_request_and_kept_while_the_work_carries_it() {
        let normal = request(&[(REFRESH_ANNOTATION, "normal")]);
        let hub = app(json!({REFRESH_ANNOTATION: "normal"}), "42");
        assert_eq!(token_for(&hub, &normal, None), "42");
        let carrying = work(
            json!({REFRESH_ANNOTATION: "normal", DELIVERY_ANNOTATION: "17"}),
            &[],
        );
        assert_eq!(token_for(&hub, &normal, Some(&carrying)), "17");
        let hard = request(&[(REFRESH_ANNOTATION, "hard")]);
        assert_eq!(
            token_for(&hub, &hard, Some(&carrying)),
            "42",
            "another request"
        );
        assert_eq!(
            token_for(&hub, &normal, Some(&work(json!({}), &[]))),
            "42",
            "the work carries none"
        );
        let mut meta = ObjectMeta::default();
        stamp(&mut meta, "42".into());
        assert_eq!(meta.annotations.unwrap()[DELIVERY_ANNOTATION], "42");
    }

    #[test]
    fn a_request_is_delivered_once_a_snapshot_shows_its_token_and_not_the_request() {
        let hub = app(
            json!({REFRESH_ANNOTATION: "normal", HYDRATE_ANNOTATION: "normal"}),
            "42",
        );
        let payload = json!({REFRESH_ANNOTATION: "normal", HYDRATE_ANNOTATION: "normal",
                             DELIVERY_ANNOTATION: TOKEN});
        let with = |feedback: &[(&str, &str)]| work(payload.clone(), feedback);
        let token = (FEEDBACK_REFRESH_DELIVERY, TOKEN);
        assert!(delivered(&hub, Some(&with(&[token]))));
        assert!(
            delivered(
                &hub,
                Some(&with(&[token, (FEEDBACK_HYDRATE_REQUESTED, "normal")]))
            ),
            "the refresh decides (a spoke that does not know hydration keeps that)"
        );
        for (why, feedback) in [
            ("not applied yet (or not read since)", vec![]),
            (
                "not consumed yet",
                vec![token, (FEEDBACK_REFRESH_REQUESTED, "normal")],
            ),
            (
                "an earlier request's token",
                vec![(FEEDBACK_REFRESH_DELIVERY, "OLDER")],
            ),
        ] {
            assert!(!delivered(&hub, Some(&with(&feedback))), "{why}");
        }
        assert!(!delivered(&hub, None), "no work");
        let other = app(json!({REFRESH_ANNOTATION: "hard"}), "43");
        assert!(
            !delivered(&other, Some(&with(&[token]))),
            "the work carries another request"
        );
        assert!(
            !delivered(&app(json!({}), "44"), Some(&with(&[token]))),
            "nothing requested"
        );
        let untokened = work(json!({REFRESH_ANNOTATION: "normal"}), &[token]);
        assert!(!delivered(
            &app(json!({REFRESH_ANNOTATION: "normal"}), "42"),
            Some(&untokened)
        ));
    }

    #[test]
    fn a_hydration_alone_is_decided_by_the_hydrate_annotation() {
        let hub = app(json!({HYDRATE_ANNOTATION: "normal"}), "42");
        let payload = json!({HYDRATE_ANNOTATION: "normal", DELIVERY_ANNOTATION: TOKEN});
        let token = (FEEDBACK_REFRESH_DELIVERY, TOKEN);
        assert!(!delivered(
            &hub,
            Some(&work(
                payload.clone(),
                &[token, (FEEDBACK_HYDRATE_REQUESTED, "normal")]
            ))
        ));
        assert!(delivered(&hub, Some(&work(payload, &[token]))));
    }
}
