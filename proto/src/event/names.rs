//! Kubernetes names carried by events, checked before a receiver uses them: a peer chooses them,
//! and a name such as `app?dryRun=All` or `../secrets` must never reach an apiserver URL.
//!
//! Owns: the DNS-1123 rules (subdomain for object names, label for namespaces) and which parts of
//! an object event carry names (`subject` `<namespace>/<name>`; the payload's `metadata.name` /
//! `metadata.namespace`; the resync keys' `name` / `namespace`; an error report's
//! `resourceName` / `resourceNamespace`). Proxy traffic (`resource`, `redis`, logs, terminal)
//! carries no names the receiver writes with and is not checked here.

use serde_json::Value;

use crate::event::{Event, Target};

/// Whether `s` is a DNS-1123 label (namespaces): 1–63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS-1123 subdomain (object names): at most 253 characters, dot-separated
/// labels.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

fn check(what: &str, value: &str, namespace: bool) -> Result<(), String> {
    let ok = if namespace {
        is_dns1123_label(value)
    } else {
        is_dns1123_subdomain(value)
    };
    if ok {
        return Ok(());
    }
    let shown = crate::peer_input::truncated(value);
    Err(if namespace {
        format!("{what} {shown:?} is not a valid Kubernetes namespace (DNS-1123 label)")
    } else {
        format!("{what} {shown:?} is not a valid Kubernetes object name (DNS-1123 subdomain)")
    })
}

/// Checks `value` at `pointer` in `data`, if it is there and not empty.
fn check_field(data: &Value, pointer: &str, namespace: bool) -> Result<(), String> {
    match data.pointer(pointer) {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(s)) if s.is_empty() => Ok(()),
        Some(Value::String(s)) => check(pointer, s, namespace),
        Some(_) => Err(format!("{pointer} is not a string")),
    }
}

/// Checks every name an object event carries; `Err` says which and why (fit for an error ACK).
pub fn check_event_names(ev: &Event) -> Result<(), String> {
    match ev.target {
        Target::Application
        | Target::AppProject
        | Target::ApplicationSet
        | Target::Repository
        | Target::GpgKey
        | Target::ResourceResync => {}
        _ => return Ok(()),
    }
    if let Some((namespace, name)) = ev.subject_parts() {
        if let Some(ns) = namespace.filter(|ns| !ns.is_empty()) {
            check("subject namespace", ns, true)?;
        }
        if !name.is_empty() {
            check("subject name", name, false)?;
        }
    }
    let Some(data) = ev.data.as_deref() else {
        return Ok(());
    };
    // Payloads that are not JSON objects are refused by the handler that decodes them.
    let Ok(data @ Value::Object(_)) = serde_json::from_slice::<Value>(data) else {
        return Ok(());
    };
    for (pointer, namespace) in [
        ("/metadata/name", false),
        ("/metadata/namespace", true),
        ("/name", false),
        ("/namespace", true),
        ("/resourceName", false),
        ("/resourceNamespace", true),
    ] {
        check_field(&data, pointer, namespace)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventType;
    use serde_json::json;

    fn app_event(obj: Value) -> Event {
        Event::for_object(EventType::SpecUpdate, Target::Application, "agent", &obj).unwrap()
    }

    #[test]
    fn dns_rules() {
        for ok in ["a", "app-1", "a.b.c", &"x".repeat(63)] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "App",
            "name?dryRun=All",
            "../secrets",
            "a/b",
            "-a",
            "a.",
            "a..b",
            "a_b",
            &"x".repeat(64),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
        assert!(is_dns1123_label("argocd"));
        assert!(!is_dns1123_label("a.b"));
    }

    #[test]
    fn a_query_string_in_a_name_is_refused_wherever_it_is() {
        let good = json!({"metadata": {"name": "app", "namespace": "argocd"}});
        assert_eq!(check_event_names(&app_event(good)), Ok(()));
        let bad_name = json!({"metadata": {"name": "app?dryRun=All", "namespace": "argocd"}});
        let err = check_event_names(&app_event(bad_name)).unwrap_err();
        assert!(err.contains("DNS-1123 subdomain"), "{err}");
        let bad_ns = json!({"metadata": {"name": "app", "namespace": "x/../y"}});
        assert!(check_event_names(&app_event(bad_ns)).is_err());
        let resync = Event::new(EventType::RequestUpdate, Target::ResourceResync, "agent")
            .with_json(&json!({"name": "a%2Fb", "kind": "Application"}))
            .unwrap();
        assert!(check_event_names(&resync).is_err());
        let error = Event::new(EventType::Error, Target::Application, "agent")
            .with_json(&json!({"resourceName": "x?y", "message": "m"}))
            .unwrap();
        assert!(check_event_names(&error).is_err());
        let subject = Event::new(EventType::Delete, Target::Application, "agent")
            .with_subject("argocd/app?dryRun=All");
        assert!(check_event_names(&subject).is_err());
    }

    #[test]
    fn proxy_traffic_is_not_checked() {
        let resp = Event::new(EventType::Response, Target::Resource, "agent")
            .with_json(&json!({"metadata": {"name": "Not A Name"}}))
            .unwrap();
        assert_eq!(check_event_names(&resp), Ok(()));
    }
}
