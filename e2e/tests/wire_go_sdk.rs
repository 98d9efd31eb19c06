//! Our CloudEvents checked with the library upstream argocd-agent reads and writes them with:
//! cloudevents/sdk-go's protobuf format at the version upstream v0.9.0 pins, driven through
//! `cewire` (e2e/peers/wire, built by `hack/peers.sh wire`). Both directions: events our principal
//! and agent send are decoded by sdk-go exactly as a Go peer sees them (type, source, `dataschema`,
//! subject, extensions, data), and events built the way upstream builds them decode on our side.
//! Upstream's own `internal/event` package cannot be imported from another module (Go's `internal`
//! rule), so the upstream-shaped events are built with sdk-go the way that package builds them.

use std::io::Write;
use std::process::{Command, Stdio};

use argocd_agent_proto::event::{Event, EventType, Target};
use e2e::binaries::Peer;
use serde_json::{json, Value};

fn cewire(arg: &str, stdin: &str) -> anyhow::Result<Vec<Value>> {
    let mut child = Command::new(Peer::Wire.binary("cewire")?)
        .arg(arg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "cewire {arg} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)?
        .lines()
        .map(|l| Ok(serde_json::from_str(l)?))
        .collect()
}

/// What sdk-go decodes from each of `events`, in order.
fn as_go_sees_it(events: &[Event]) -> anyhow::Result<Vec<Value>> {
    let input: String = events
        .iter()
        .map(|e| hex::encode(e.encode_to_vec()) + "\n")
        .collect();
    let seen = cewire("decode", &input)?;
    anyhow::ensure!(seen.len() == events.len(), "cewire answered {seen:?}");
    Ok(seen)
}

#[test]
fn events_we_send_decode_in_go_with_their_target() -> anyhow::Result<()> {
    let app = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "guestbook", "namespace": "agent-a", "uid": "u-1", "resourceVersion": "7"},
        "spec": {"project": "default"},
    });
    let spec = Event::for_object(
        EventType::SpecUpdate,
        Target::Application,
        "principal://hub",
        &app,
    )?
    .with_principal_uid("p-uid");
    let ack = spec.ack().with_source("agent://agent-managed");
    let ping = Event::ping("agent://agent-managed");
    let resync = Event::request_resource_resync("principal://hub")?;
    let seen = as_go_sees_it(&[spec, ack, ping, resync])?;

    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
    for v in &seen {
        assert!(v.get("error").is_none(), "sdk-go refused our event: {v}");
    }
    // Every event's target survives: a Go peer dispatches on it and drops events without one.
    assert_eq!(s(&seen[0], "dataschema"), "application");
    assert_eq!(s(&seen[1], "dataschema"), "eventProcessed");
    assert_eq!(s(&seen[2], "dataschema"), "heartbeat");
    assert_eq!(
        s(&seen[3], "type"),
        "io.argoproj.argocd-agent.event.request-resource-resync"
    );
    assert!(!s(&seen[3], "dataschema").is_empty(), "{}", seen[3]);

    let spec = &seen[0];
    assert_eq!(
        s(spec, "type"),
        "io.argoproj.argocd-agent.event.spec-update"
    );
    assert_eq!(s(spec, "source"), "principal://hub");
    assert_eq!(s(spec, "subject"), "agent-a/guestbook");
    assert_eq!(s(spec, "datacontenttype"), "application/json");
    let ext = &spec["extensions"];
    assert_eq!(ext["resourceid"], "guestbook_u-1");
    assert_eq!(ext["eventid"], "guestbook_u-1_7");
    assert_eq!(ext["principaluid"], "p-uid");
    assert!(
        ext["sentat"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{ext}"
    );
    let data: Value = serde_json::from_str(&s(spec, "data"))?;
    assert_eq!(data["metadata"]["name"], "guestbook");

    // The ACK carries the acknowledged event's ids: upstream matches ACKs by resourceid + eventid.
    assert_eq!(seen[1]["extensions"]["resourceid"], "guestbook_u-1");
    assert_eq!(seen[1]["extensions"]["eventid"], "guestbook_u-1_7");
    assert_eq!(
        s(&seen[1], "type"),
        "io.argoproj.argocd-agent.event.processed"
    );
    Ok(())
}

#[test]
fn events_built_like_upstream_decode_on_our_side() -> anyhow::Result<()> {
    let upstream = cewire("encode", "")?;
    let by_name = |n: &str| -> anyhow::Result<Event> {
        let v = upstream
            .iter()
            .find(|v| v["name"] == n)
            .ok_or_else(|| anyhow::anyhow!("cewire encoded no {n}: {upstream:?}"))?;
        Ok(Event::decode(
            &hex::decode(v["hex"].as_str().unwrap_or_default())?[..],
        )?)
    };

    let status = by_name("status-update")?;
    assert_eq!(status.event_type, EventType::StatusUpdate);
    assert_eq!(status.target, Target::Application);
    assert_eq!(status.source, "agent://agent-managed");
    assert_eq!(status.subject_parts(), Some((Some("argocd"), "guestbook")));
    assert_eq!(status.resource_id, "guestbook_0b6a1c2e");
    assert_eq!(status.event_id, "guestbook_0b6a1c2e_11324");
    assert!(
        status.sent_at.is_some(),
        "sentat read from the sdk's string"
    );
    let app: Value = status.data_as()?;
    assert_eq!(app["status"]["sync"]["status"], "Synced");

    let ack = by_name("ack")?;
    assert!(ack.is_ack(), "{ack:?}");
    assert_eq!(ack.event_id, "guestbook_0b6a1c2e_11324");

    let ping = by_name("heartbeat")?;
    assert_eq!(ping.target, Target::Heartbeat);

    // And what we decoded re-encodes to bytes sdk-go reads back the same.
    let again = as_go_sees_it(&[status])?;
    assert_eq!(again[0]["dataschema"], "application");
    assert_eq!(
        again[0]["extensions"]["eventid"],
        "guestbook_0b6a1c2e_11324"
    );
    Ok(())
}
