//! Event model tests: round trips for every type and target, decoding of bytes laid out as
//! upstream's Go sdk writes them, error reporting for broken envelopes, ACK semantics, payload
//! JSON names and the resync checksums.

use std::collections::BTreeMap;

use argocd_agent_proto::event::{
    go_json, set_checksum, spec_checksum, Event, EventError, EventType, ExtensionValue,
    ResourceKey, Target,
};
use argocd_agent_proto::payload::*;
use argocd_agent_proto::pb::cloudevents::{cloud_event, CloudEvent, CloudEventAttributeValue};
use chrono::{TimeZone, Utc};
use prost::Message;
use serde_json::json;
use sha2::{Digest, Sha256};

fn hex_decode(s: &str) -> Vec<u8> {
    hex::decode(s).expect("fixture hex")
}

fn wire_round_trip(ev: &Event) -> Event {
    let bytes = ev.to_cloud_event().encode_to_vec();
    let ce = CloudEvent::decode(bytes.as_slice()).expect("prost decode");
    Event::try_from_cloud_event(ce).expect("event decode")
}

fn all_types() -> Vec<EventType> {
    let mut v: Vec<EventType> = EventType::all_named().collect();
    for m in ["GET", "PATCH", "POST", "DELETE", "PUT"] {
        v.push(EventType::HttpMethod(m.into()));
    }
    v.push(EventType::Unknown(
        "io.argoproj.argocd-agent.event.operation-update".into(),
    ));
    v.push(EventType::Unknown("com.example.something".into()));
    v
}

fn all_targets() -> Vec<Target> {
    let mut v: Vec<Target> = Target::all_named().collect();
    v.push(Target::Unknown("somethingElse".into()));
    v.push(Target::Unknown(String::new()));
    v
}

#[test]
fn named_wire_strings() {
    let expect = [
        (EventType::Create, "create"),
        (EventType::Delete, "delete"),
        (EventType::SpecUpdate, "spec-update"),
        (EventType::StatusUpdate, "status-update"),
        (EventType::SetOperation, "set-operation"),
        (EventType::TerminateOperation, "terminate-operation"),
        (EventType::Processed, "processed"),
        (EventType::Response, "response"),
        (EventType::RedisRequest, "redis-request"),
        (EventType::RedisResponse, "redis-response"),
        (
            EventType::RequestSyncedResourceList,
            "request-synced-resource-list",
        ),
        (
            EventType::ResponseSyncedResource,
            "response-synced-resource",
        ),
        (EventType::RequestUpdate, "request-update"),
        (EventType::RequestResourceResync, "request-resource-resync"),
        (
            EventType::ClusterCacheInfoUpdate,
            "cluster-cache-info-update",
        ),
        (EventType::TerminalRequest, "terminal-request"),
        (EventType::Ping, "ping"),
        (EventType::Pong, "pong"),
        (EventType::Error, "error"),
    ];
    assert_eq!(expect.len(), EventType::all_named().count());
    for (t, name) in expect {
        let wire = format!("io.argoproj.argocd-agent.event.{name}");
        assert_eq!(t.to_wire(), wire);
        assert_eq!(EventType::from_wire(&wire), t);
    }
    assert_eq!(
        EventType::from_wire("GET"),
        EventType::HttpMethod("GET".into())
    );
    assert_eq!(EventType::HttpMethod("PATCH".into()).to_wire(), "PATCH");

    let targets = [
        (Target::Application, "application"),
        (Target::AppProject, "appproject"),
        (Target::ApplicationSet, "applicationset"),
        (Target::Repository, "repository"),
        (Target::GpgKey, "gpgkey"),
        (Target::Resource, "resource"),
        (Target::Redis, "redis"),
        (Target::ResourceResync, "resourceResync"),
        (Target::ClusterCacheInfoUpdate, "clusterCacheInfoUpdate"),
        (Target::ContainerLog, "containerlog"),
        (Target::Terminal, "terminal"),
        (Target::Heartbeat, "heartbeat"),
        (Target::EventProcessed, "eventProcessed"),
    ];
    assert_eq!(targets.len(), Target::all_named().count());
    for (t, s) in targets {
        assert_eq!(t.as_str(), s);
        assert_eq!(Target::from_wire(s), t);
    }
}

#[test]
fn round_trip_every_type_and_target() {
    let mut n = 0;
    for t in all_types() {
        for target in all_targets() {
            for with_data in [true, false] {
                if !with_data && t.requires_data() {
                    continue;
                }
                let mut ev = Event::new(t.clone(), target.clone(), "agent://agent-managed")
                    .with_subject("ns/app")
                    .with_principal_uid("principal-1")
                    .with_trace(
                        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                        Some("vendor=x".into()),
                    );
                ev.extensions
                    .insert("custom".into(), ExtensionValue::String("kept".into()));
                ev.extensions
                    .insert("count".into(), ExtensionValue::Integer(7));
                if with_data {
                    ev = ev.with_json(&json!({"k": [1, 2], "s": "<&>"})).unwrap();
                }
                let back = wire_round_trip(&ev);
                assert_eq!(back, ev, "type {t:?} target {target:?} data {with_data}");
                // and through the eventstreamapi wrapper
                let wrapped = ev.to_stream_event().encode_to_vec();
                let w = argocd_agent_proto::pb::eventstreamapi::Event::decode(wrapped.as_slice())
                    .unwrap();
                assert_eq!(Event::try_from_stream_event(w).unwrap(), ev);
                n += 1;
            }
        }
    }
    assert!(n > 300, "{n} combinations");
}

#[test]
fn cloud_event_layout() {
    let ev = Event::new(EventType::SpecUpdate, Target::Application, "")
        .with_ids("app_uid", "app_uid_5")
        .with_subject("argocd/app")
        .with_json(&json!({"a": 1}))
        .unwrap();
    let ce = ev.to_cloud_event();
    assert_eq!(ce.id, "app_uid_5");
    assert_eq!(ce.spec_version, "1.0");
    assert_eq!(ce.r#type, "io.argoproj.argocd-agent.event.spec-update");
    let s = |k: &str| match ce.attributes.get(k).and_then(|v| v.attr.clone()) {
        Some(argocd_agent_proto::pb::cloudevents::cloud_event_attribute_value::Attr::CeString(
            s,
        )) => s,
        other => panic!("{k}: {other:?}"),
    };
    // sdk-go reads dataschema only from ce_uri: a ce_string target is "" on a Go peer.
    assert_eq!(
        ce.attributes.get("dataschema").and_then(|v| v.attr.clone()),
        Some(
            argocd_agent_proto::pb::cloudevents::cloud_event_attribute_value::Attr::CeUri(
                "application".into()
            )
        )
    );
    assert_eq!(s("resourceid"), "app_uid");
    assert_eq!(s("eventid"), "app_uid_5");
    assert_eq!(s("subject"), "argocd/app");
    assert_eq!(s("datacontenttype"), "application/json");
    assert!(s("sentat").ends_with('Z'));
    assert_eq!(
        ce.data,
        Some(cloud_event::Data::BinaryData(br#"{"a":1}"#.to_vec()))
    );
}

/// Bytes as upstream's Go sdk (`format.ToProto`) writes a `status-update` from an agent:
/// fields 2,3,4, `dataschema` as `ce_uri` and the other attributes as `ce_string`, JSON in
/// `binary_data`, empty `id` (the same layout the real sdk-go produces in e2e/tests/wire_go_sdk.rs).
const GO_STATUS_UPDATE: &str = "12156167656e743a2f2f6167656e742d6d616e616765641a03312e30222c696f2e6172676f70726f6a2e6172676f63642d6167656e742e6576656e742e7374617475732d7570646174652a250a0f64617461636f6e74656e747479706512121a106170706c69636174696f6e2f6a736f6e2a1b0a0a64617461736368656d61120d2a0b6170706c69636174696f6e2a410a076576656e74696412361a346775657374626f6f6b5f30623661316332652d316634622d346331652d396435652d3366326131623063396438655f31313332342a3e0a0a7265736f75726365696412301a2e6775657374626f6f6b5f30623661316332652d316634622d346331652d396435652d3366326131623063396438652a290a0673656e746174121f1a1d323032352d30372d30395431363a35343a33312e31323334353637385a2a1d0a077375626a65637412121a106172676f63642f6775657374626f6f6b32c0017b226d65746164617461223a7b226e616d65223a226775657374626f6f6b222c226e616d657370616365223a226172676f6364222c22756964223a2230623661316332652d316634622d346331652d396435652d336632613162306339643865222c227265736f7572636556657273696f6e223a223131333234227d2c2273706563223a7b2270726f6a656374223a2264656661756c74227d2c22737461747573223a7b2273796e63223a7b22737461747573223a2253796e636564227d7d7d";

/// A Go ACK: no source, no datacontenttype, `binary_data` present but empty.
const GO_ACK: &str = "1a03312e302228696f2e6172676f70726f6a2e6172676f63642d6167656e742e6576656e742e70726f6365737365642a1e0a0a64617461736368656d6112102a0e6576656e7450726f6365737365642a410a076576656e74696412361a346775657374626f6f6b5f30623661316332652d316634622d346331652d396435652d3366326131623063396438655f31313332342a3e0a0a7265736f75726365696412301a2e6775657374626f6f6b5f30623661316332652d316634622d346331652d396435652d3366326131623063396438653200";

const UID: &str = "0b6a1c2e-1f4b-4c1e-9d5e-3f2a1b0c9d8e";

#[test]
fn decodes_go_sdk_bytes() {
    let ev = Event::decode(&hex_decode(GO_STATUS_UPDATE)).expect("decode go fixture");
    assert_eq!(ev.event_type, EventType::StatusUpdate);
    assert_eq!(ev.target, Target::Application);
    assert_eq!(ev.source, "agent://agent-managed");
    assert_eq!(ev.subject.as_deref(), Some("argocd/guestbook"));
    assert_eq!(ev.subject_parts(), Some((Some("argocd"), "guestbook")));
    assert_eq!(ev.resource_id, format!("guestbook_{UID}"));
    assert_eq!(ev.event_id, format!("guestbook_{UID}_11324"));
    assert_eq!(
        ev.sent_at,
        Some(
            Utc.with_ymd_and_hms(2025, 7, 9, 16, 54, 31).unwrap()
                + chrono::Duration::nanoseconds(123_456_780)
        )
    );
    assert_eq!(ev.principal_uid, None);
    assert!(ev.extensions.is_empty(), "{:?}", ev.extensions);
    let app: serde_json::Value = ev.data_as().unwrap();
    assert_eq!(app["metadata"]["name"], "guestbook");
    assert_eq!(app["status"]["sync"]["status"], "Synced");

    // Re-encoding keeps every attribute (plus the id we set).
    let ce = ev.to_cloud_event();
    let orig = CloudEvent::decode(hex_decode(GO_STATUS_UPDATE).as_slice()).unwrap();
    assert_eq!(ce.attributes, orig.attributes);
    assert_eq!(ce.data, orig.data);
    assert_eq!(ce.id, ev.event_id);

    let ack = Event::decode(&hex_decode(GO_ACK)).expect("decode go ack");
    assert!(ack.is_ack());
    assert_eq!(ack.target, Target::EventProcessed);
    assert_eq!(ack.data, None);
    assert_eq!(ack.source, "");
    assert_eq!(ack.event_id, ev.event_id);
    assert_eq!(ack.resource_id, ev.resource_id);
    assert_eq!(ack.ack_error(), None);
}

#[test]
fn our_ack_of_go_event_matches_go_ack() {
    let ev = Event::decode(&hex_decode(GO_STATUS_UPDATE)).unwrap();
    let ack = ev.ack();
    assert_eq!(ack.event_type, EventType::Processed);
    assert_eq!(ack.target, Target::EventProcessed);
    assert_eq!(
        (ack.event_id.as_str(), ack.resource_id.as_str()),
        (ev.event_id.as_str(), ev.resource_id.as_str())
    );
    assert_eq!(ack.sent_at, ev.sent_at);
    assert_eq!(ack.data, None);
    let ce = ack.to_cloud_event();
    assert!(ce.data.is_none());
    assert!(!ce.attributes.contains_key("datacontenttype"));
}

#[test]
fn ack_copies_all_extensions() {
    let mut ev = Event::new(EventType::SpecUpdate, Target::AppProject, "")
        .with_principal_uid("p-uid")
        .with_trace("00-aa-bb-01", Some("s=1".into()))
        .with_json(&json!({}))
        .unwrap();
    ev.extensions
        .insert("foo".into(), ExtensionValue::String("bar".into()));
    ev.extensions
        .insert("flag".into(), ExtensionValue::Bool(true));
    let ack = ev.ack();
    assert_eq!(ack.resource_id, ev.resource_id);
    assert_eq!(ack.event_id, ev.event_id);
    assert_eq!(ack.sent_at, ev.sent_at);
    assert_eq!(ack.principal_uid.as_deref(), Some("p-uid"));
    assert_eq!(ack.traceparent.as_deref(), Some("00-aa-bb-01"));
    assert_eq!(ack.tracestate.as_deref(), Some("s=1"));
    assert_eq!(ack.extensions, ev.extensions);
    assert_eq!(ack.data, None);
    assert_eq!(ack.subject, None);
    assert_eq!(wire_round_trip(&ack), ack);

    let nack = ev.ack_with_error("unknown event type com.example");
    assert!(nack.is_ack());
    assert_eq!(nack.ack_error(), Some("unknown event type com.example"));
    let back = wire_round_trip(&nack);
    assert_eq!(back.ack_error(), Some("unknown event type com.example"));
    // An ACK of an ACK-with-error does not inherit the error.
    assert_eq!(back.ack().ack_error(), None);
}

#[test]
fn for_object_ids() {
    let obj = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "guestbook", "namespace": "agent-1", "uid": "u-1", "resourceVersion": "42"},
        "spec": {"project": "default"}
    });
    let ev = Event::for_object(EventType::Create, Target::Application, "", &obj).unwrap();
    assert_eq!(ev.subject.as_deref(), Some("agent-1/guestbook"));
    assert_eq!(ev.resource_id, "guestbook_u-1");
    assert_eq!(ev.event_id, "guestbook_u-1_42");
    assert!(ev.sent_at.is_some());
    assert_eq!(ev.data_as::<serde_json::Value>().unwrap(), obj);

    let err = Event::for_object(
        EventType::Create,
        Target::Application,
        "",
        &json!({"metadata": {}}),
    )
    .unwrap_err();
    assert!(err.to_string().contains("metadata.name"), "{err}");
}

#[test]
fn unknown_type_and_target_decode() {
    let ce = CloudEvent {
        spec_version: "1.0".into(),
        r#type: "io.argoproj.argocd-agent.event.frobnicate".into(),
        attributes: [(
            "dataschema".to_string(),
            CloudEventAttributeValue {
                attr: Some(argocd_agent_proto::pb::cloudevents::cloud_event_attribute_value::Attr::CeString(
                    "widget".into(),
                )),
            },
        )]
        .into_iter()
        .collect(),
        ..Default::default()
    };
    let ev = Event::try_from_cloud_event(ce).unwrap();
    assert_eq!(
        ev.event_type,
        EventType::Unknown("io.argoproj.argocd-agent.event.frobnicate".into())
    );
    assert_eq!(ev.target, Target::Unknown("widget".into()));
    let nack = ev.ack_with_error(format!("unknown event type {}", ev.event_type));
    assert_eq!(
        wire_round_trip(&nack)
            .ack_error()
            .map(|s| s.contains("frobnicate")),
        Some(true)
    );
}

fn base_ce(t: &str) -> CloudEvent {
    CloudEvent {
        spec_version: "1.0".into(),
        r#type: t.into(),
        data: Some(cloud_event::Data::BinaryData(b"{}".to_vec())),
        ..Default::default()
    }
}

#[test]
fn broken_envelopes_give_clear_errors() {
    let err = Event::decode(&[0x0a, 0x05, b'a']).unwrap_err();
    assert!(matches!(err, EventError::Decode(_)));
    assert!(
        err.to_string().contains("malformed protobuf CloudEvent"),
        "{err}"
    );

    let err = Event::decode(&[0xff, 0xff, 0xff]).unwrap_err();
    assert!(matches!(err, EventError::Decode(_)), "{err}");

    let err = Event::try_from_cloud_event(base_ce("")).unwrap_err();
    assert!(matches!(err, EventError::MissingType));
    assert!(err.to_string().contains("type"), "{err}");

    let mut ce = base_ce("io.argoproj.argocd-agent.event.create");
    ce.spec_version = "0.3".into();
    let err = Event::try_from_cloud_event(ce).unwrap_err();
    assert!(err.to_string().contains("\"0.3\""), "{err}");

    let mut ce = base_ce("io.argoproj.argocd-agent.event.spec-update");
    ce.data = None;
    let err = Event::try_from_cloud_event(ce).unwrap_err();
    assert!(matches!(err, EventError::MissingData { .. }));
    assert!(err.to_string().contains("spec-update"), "{err}");

    let mut ce = base_ce("io.argoproj.argocd-agent.event.spec-update");
    ce.data = Some(cloud_event::Data::BinaryData(b"{not json".to_vec()));
    let err = Event::try_from_cloud_event(ce).unwrap_err();
    assert!(matches!(err, EventError::InvalidJson { .. }));
    assert!(err.to_string().contains("not valid JSON"), "{err}");

    let mut ce = base_ce("io.argoproj.argocd-agent.event.create");
    ce.data = Some(cloud_event::Data::ProtoData(prost_types::Any::default()));
    assert!(matches!(
        Event::try_from_cloud_event(ce).unwrap_err(),
        EventError::ProtoData { .. }
    ));

    let mut ce = base_ce("io.argoproj.argocd-agent.event.create");
    ce.attributes.insert(
        "datacontenttype".into(),
        CloudEventAttributeValue {
            attr: Some(
                argocd_agent_proto::pb::cloudevents::cloud_event_attribute_value::Attr::CeString(
                    "application/xml".into(),
                ),
            ),
        },
    );
    let err = Event::try_from_cloud_event(ce).unwrap_err();
    assert!(err.to_string().contains("application/xml"), "{err}");

    let err = Event::try_from_stream_event(Default::default()).unwrap_err();
    assert!(matches!(err, EventError::MissingEnvelope));

    // Payload of the wrong shape: error names the target type.
    let ev = Event::try_from_cloud_event(base_ce("GET")).unwrap();
    let err = ev.data_as::<Vec<u8>>().unwrap_err();
    assert!(err.to_string().contains("Vec<u8>"), "{err}");
}

#[test]
fn text_data_and_lenient_attributes() {
    let mut ce = base_ce("io.argoproj.argocd-agent.event.create");
    ce.data = Some(cloud_event::Data::TextData(r#"{"x":1}"#.into()));
    ce.id = "from-id".into();
    use argocd_agent_proto::pb::cloudevents::cloud_event_attribute_value::Attr;
    ce.attributes.insert(
        "sentat".into(),
        CloudEventAttributeValue {
            attr: Some(Attr::CeTimestamp(prost_types::Timestamp {
                seconds: 1_700_000_000,
                nanos: 5,
            })),
        },
    );
    ce.attributes.insert(
        "dataschema".into(),
        CloudEventAttributeValue {
            attr: Some(Attr::CeUriRef("application".into())),
        },
    );
    ce.attributes.insert(
        "weird".into(),
        CloudEventAttributeValue {
            attr: Some(Attr::CeBytes(vec![1, 2, 3])),
        },
    );
    let ev = Event::try_from_cloud_event(ce).unwrap();
    assert_eq!(ev.data.as_deref(), Some(&br#"{"x":1}"#[..]));
    assert_eq!(
        ev.event_id, "from-id",
        "empty eventid falls back to the CloudEvent id"
    );
    assert_eq!(ev.target, Target::Application);
    assert_eq!(ev.sent_at.unwrap().timestamp_subsec_nanos(), 5);
    assert_eq!(
        ev.extensions.get("weird"),
        Some(&ExtensionValue::Bytes(vec![1, 2, 3]))
    );

    // An unparsable sentat is preserved verbatim.
    let mut ce = base_ce("io.argoproj.argocd-agent.event.create");
    ce.attributes.insert(
        "sentat".into(),
        CloudEventAttributeValue {
            attr: Some(Attr::CeString("yesterday".into())),
        },
    );
    let ev = Event::try_from_cloud_event(ce).unwrap();
    assert_eq!(ev.sent_at, None);
    let ce = ev.to_cloud_event();
    assert_eq!(
        ce.attributes.get("sentat").and_then(|v| v.attr.clone()),
        Some(Attr::CeString("yesterday".into()))
    );
}

#[test]
fn sentat_is_go_rfc3339nano() {
    use argocd_agent_proto::event::format_rfc3339_nano;
    let t = Utc.with_ymd_and_hms(2025, 1, 2, 3, 4, 5).unwrap();
    assert_eq!(format_rfc3339_nano(&t), "2025-01-02T03:04:05Z");
    let t2 = t + chrono::Duration::nanoseconds(120_000_000);
    assert_eq!(format_rfc3339_nano(&t2), "2025-01-02T03:04:05.12Z");
    let t3 = t + chrono::Duration::nanoseconds(1);
    assert_eq!(format_rfc3339_nano(&t3), "2025-01-02T03:04:05.000000001Z");
}

#[test]
fn request_constructors() {
    let req = ResourceRequest {
        uuid: "req-1".into(),
        namespace: "default".into(),
        name: "web".into(),
        method: "GET".into(),
        group: "apps".into(),
        version: "v1".into(),
        resource: "deployments".into(),
        ..Default::default()
    };
    let ev = Event::resource_request("", &req).unwrap();
    assert_eq!(ev.event_type, EventType::HttpMethod("GET".into()));
    assert_eq!(ev.target, Target::Resource);
    assert_eq!(
        (ev.resource_id.as_str(), ev.event_id.as_str()),
        ("req-1", "req-1")
    );
    assert_eq!(
        wire_round_trip(&ev).data_as::<ResourceRequest>().unwrap(),
        req
    );

    let resp = ResourceResponse {
        uuid: "req-1".into(),
        status: 200,
        resource: "{}".into(),
    };
    let ev = Event::resource_response("agent://agent-managed", &resp).unwrap();
    assert_eq!(ev.event_type, EventType::Response);
    assert_eq!(ev.event_id, "req-1");
    assert_ne!(ev.resource_id, "req-1");

    let rr = RedisRequest {
        uuid: "r-1".into(),
        connection_uuid: "c-1".into(),
        body: RedisCommandBody {
            get: Some(RedisCommandBodyGet {
                key: "app|resources-tree|x".into(),
            }),
            ..Default::default()
        },
    };
    let ev = Event::redis_request("", &rr).unwrap();
    assert_eq!(
        (ev.event_type.clone(), ev.target.clone()),
        (EventType::RedisRequest, Target::Redis)
    );
    assert_eq!(ev.event_id, "r-1");
    let resp = RedisResponse {
        uuid: "r-1".into(),
        connection_uuid: "c-1".into(),
        body: Default::default(),
    };
    let ev = Event::redis_response("", &resp).unwrap();
    assert_eq!(ev.event_id, "r-1");

    let ev = Event::request_synced_resource_list("", vec![1, 2, 3]).unwrap();
    assert_eq!(ev.target, Target::ResourceResync);
    assert_eq!(ev.data.as_deref(), Some(&br#"{"checksum":"AQID"}"#[..]));

    let ev = Event::request_resource_resync("").unwrap();
    assert_eq!(ev.event_type, EventType::RequestResourceResync);
    assert_eq!(ev.data.as_deref(), Some(&b"{}"[..]));

    let ev = Event::synced_resource(
        "",
        &SyncedResource {
            name: "a".into(),
            namespace: String::new(),
            uid: "u".into(),
            kind: "Application".into(),
        },
    )
    .unwrap();
    assert_eq!(ev.event_type, EventType::ResponseSyncedResource);
    assert_eq!(
        ev.data.as_deref(),
        Some(&br#"{"name":"a","uid":"u","kind":"Application"}"#[..])
    );

    let ev = Event::request_update(
        "",
        &RequestUpdate {
            name: "a".into(),
            namespace: "ns".into(),
            uid: "u".into(),
            kind: "Application".into(),
            checksum: vec![],
        },
    )
    .unwrap();
    assert_eq!(ev.event_type, EventType::RequestUpdate);

    let ev = Event::cluster_cache_info_update(
        "",
        &ClusterCacheInfo {
            applications_count: 1,
            apis_count: 2,
            resources_count: 3,
        },
    )
    .unwrap();
    assert_eq!(
        ev.data.as_deref(),
        Some(&br#"{"applicationsCount":1,"apisCount":2,"resourcesCount":3}"#[..])
    );

    let log = ContainerLogRequest {
        uuid: "l-1".into(),
        namespace: "ns".into(),
        pod_name: "p".into(),
        ..Default::default()
    };
    let ev = Event::container_log_request("", "GET", &log).unwrap();
    assert_eq!(
        (ev.event_type.clone(), ev.target.clone()),
        (EventType::HttpMethod("GET".into()), Target::ContainerLog)
    );
    assert_eq!(ev.event_id, "l-1");

    let term = ContainerTerminalRequest {
        uuid: "t-1".into(),
        ..Default::default()
    };
    let ev = Event::terminal_request("", &term).unwrap();
    assert_eq!(
        (
            ev.event_type.clone(),
            ev.target.clone(),
            ev.event_id.as_str()
        ),
        (EventType::TerminalRequest, Target::Terminal, "t-1")
    );

    let ev = Event::ping("");
    assert_eq!(
        (ev.event_type.clone(), ev.target.clone(), ev.data.clone()),
        (EventType::Ping, Target::Heartbeat, None)
    );
    assert_eq!(
        wire_round_trip(&Event::pong("")).event_type,
        EventType::Pong
    );

    let ev = Event::error_report(
        "",
        Target::Application,
        &ErrorData {
            resource_name: "app".into(),
            resource_namespace: "ns".into(),
            message: "adoption refused".into(),
        },
    )
    .unwrap();
    assert_eq!(ev.subject.as_deref(), Some("ns/app"));
    assert_eq!(
        ev.data_as::<ErrorData>().unwrap().message,
        "adoption refused"
    );
}

#[test]
fn payload_json_names_match_go_tags() {
    let mut params = BTreeMap::new();
    params.insert("watch".to_string(), "false".to_string());
    let req = ResourceRequest {
        uuid: "u".into(),
        namespace: "ns".into(),
        name: "n".into(),
        subresource: "status".into(),
        method: "PATCH".into(),
        body: b"{}".to_vec(),
        params,
        group: "apps".into(),
        version: "v1".into(),
        resource: "deployments".into(),
    };
    assert_eq!(
        serde_json::to_string(&req).unwrap(),
        r#"{"uuid":"u","namespace":"ns","name":"n","subresource":"status","method":"PATCH","body":"e30=","params":{"watch":"false"},"group":"apps","version":"v1","resource":"deployments"}"#
    );
    // omitempty fields vanish, GVR fields do not
    assert_eq!(
        serde_json::to_string(&ResourceRequest {
            uuid: "u".into(),
            ..Default::default()
        })
        .unwrap(),
        r#"{"uuid":"u","name":"","group":"","version":"","resource":""}"#
    );
    assert_eq!(
        serde_json::to_string(&ResourceResponse {
            uuid: "u".into(),
            status: 404,
            resource: String::new()
        })
        .unwrap(),
        r#"{"uuid":"u","status":404}"#
    );
    let rr = RedisRequest {
        uuid: "u".into(),
        connection_uuid: "c".into(),
        body: RedisCommandBody {
            subscribe: Some(RedisCommandBodySubscribe {
                channel_name: "ch".into(),
            }),
            ping: Some(RedisCommandBodyPing {}),
            ..Default::default()
        },
    };
    assert_eq!(
        serde_json::to_string(&rr).unwrap(),
        r#"{"uuid":"u","connectionUuid":"c","body":{"subscribe":{"channel":"ch"},"ping":{}}}"#
    );
    let resp = RedisResponse {
        uuid: "u".into(),
        connection_uuid: "c".into(),
        body: RedisResponseBody {
            get: Some(RedisResponseBodyGet {
                bytes: b"hi".to_vec(),
                cache_hit: true,
                error: String::new(),
            }),
            subscribe_response: Some(RedisResponseBodySubscribeResponse {
                error: "e".into(),
                ..Default::default()
            }),
            push_from_subscribe: Some(RedisResponseBodyPushFromSubscribe {
                channel_name: "x".into(),
            }),
            pong: Some(RedisResponseBodyPong {}),
        },
    };
    assert_eq!(
        serde_json::to_string(&resp).unwrap(),
        r#"{"uuid":"u","connectionUuid":"c","body":{"get":{"bytes":"aGk=","cacheHit":true,"error":""},"subscribeResponse":{"error":"e"},"pushFromSubscribe":{"channelName":"x"},"pong":{}}}"#
    );
    // Our close-connection extension: a field Go peers ignore, both ways.
    let close = RedisRequest {
        uuid: "u".into(),
        connection_uuid: "c".into(),
        body: RedisCommandBody {
            close_connection: Some(RedisCommandBodyCloseConnection {}),
            ..Default::default()
        },
    };
    assert_eq!(
        serde_json::to_string(&close).unwrap(),
        r#"{"uuid":"u","connectionUuid":"c","body":{"closeConnection":{}}}"#
    );
    let ours = RedisResponseBodySubscribeResponse {
        error: String::new(),
        supports_close_connection: true,
    };
    assert_eq!(
        serde_json::to_string(&ours).unwrap(),
        r#"{"error":"","supportsCloseConnection":true}"#
    );
    let go: RedisResponseBodySubscribeResponse = serde_json::from_str(r#"{"error":""}"#).unwrap();
    assert!(!go.supports_close_connection, "upstream agents never close");
    // Go nil []byte decodes; Go omitted fields default.
    let get: RedisResponseBodyGet =
        serde_json::from_str(r#"{"bytes":null,"cacheHit":false}"#).unwrap();
    assert!(get.bytes.is_empty());
    assert_eq!(
        serde_json::to_string(&RequestUpdate {
            name: "a".into(),
            namespace: "n".into(),
            uid: "u".into(),
            kind: "AppProject".into(),
            checksum: vec![0xff]
        })
        .unwrap(),
        r#"{"name":"a","namespace":"n","uid":"u","kind":"AppProject","checksum":"/w=="}"#
    );
    let log = ContainerLogRequest {
        uuid: "u".into(),
        namespace: "ns".into(),
        pod_name: "p".into(),
        container: "c".into(),
        follow: true,
        tail_lines: Some(10),
        since_seconds: Some(5),
        since_time: "2025-01-01T00:00:00Z".into(),
        timestamps: true,
        previous: true,
        insecure_skip_tls_verify_backend: true,
        limit_bytes: Some(100),
    };
    assert_eq!(
        serde_json::to_string(&log).unwrap(),
        r#"{"uuid":"u","namespace":"ns","podName":"p","container":"c","follow":true,"tailLines":10,"sinceSeconds":5,"sinceTime":"2025-01-01T00:00:00Z","timestamps":true,"previous":true,"insecureSkipTLSVerifyBackend":true,"limitBytes":100}"#
    );
    assert_eq!(
        serde_json::to_string(&ContainerLogRequest {
            uuid: "u".into(),
            namespace: "ns".into(),
            pod_name: "p".into(),
            ..Default::default()
        })
        .unwrap(),
        r#"{"uuid":"u","namespace":"ns","podName":"p"}"#
    );
    let mut p = BTreeMap::new();
    p.insert("follow".to_string(), "TRUE".to_string());
    p.insert("tailLines".to_string(), "x".to_string());
    p.insert("limitBytes".to_string(), "7".to_string());
    let l = ContainerLogRequest::from_params("u", "ns", "p", &p);
    assert!(l.follow);
    assert_eq!((l.tail_lines, l.limit_bytes), (None, Some(7)));
    let term = ContainerTerminalRequest {
        uuid: "u".into(),
        namespace: "ns".into(),
        pod_name: "p".into(),
        container_name: "c".into(),
        command: vec!["sh".into()],
        tty: true,
        stdin: true,
        stdout: true,
        stderr: false,
    };
    assert_eq!(
        serde_json::to_string(&term).unwrap(),
        r#"{"uuid":"u","namespace":"ns","podName":"p","containerName":"c","command":["sh"],"tty":true,"stdin":true,"stdout":true,"stderr":false}"#
    );
    assert_eq!(
        serde_json::to_string(&ErrorData {
            resource_name: "a".into(),
            resource_namespace: "b".into(),
            message: "m".into()
        })
        .unwrap(),
        r#"{"resourceName":"a","resourceNamespace":"b","message":"m"}"#
    );
    assert_eq!(
        serde_json::to_string(&RequestResourceResync {}).unwrap(),
        "{}"
    );
}

fn hexs(b: &[u8]) -> String {
    hex::encode(b)
}

#[test]
fn set_checksum_matches_sha256sum() {
    // printf 'AppProject/default/u2Application/guestbook/u1' | sha256sum
    let keys = [
        ResourceKey::new("Application", "guestbook", "agent-1", "u1"),
        ResourceKey::new("AppProject", "default", "argocd", "u2"),
    ];
    assert_eq!(
        hexs(&set_checksum(&keys)),
        "4b8e70291c9efc01d2f56f1011a063796a3f37c2bd2c7fabdf593e6271fb1c4f"
    );
    // Order and namespace do not matter.
    let other = [
        ResourceKey::new("AppProject", "default", "elsewhere", "u2"),
        ResourceKey::new("Application", "guestbook", "", "u1"),
    ];
    assert_eq!(set_checksum(&keys), set_checksum(&other));
    assert!(set_checksum(&[]).is_empty());
}

#[test]
fn resource_key_from_object_prefers_source_uid() {
    let obj = json!({"kind": "Application", "metadata": {"name": "a", "namespace": "n", "uid": "local",
        "annotations": {"argocd.argoproj.io/source-uid": "source"}}});
    let k = ResourceKey::from_object(&obj, None).unwrap();
    assert_eq!(k, ResourceKey::new("Application", "a", "n", "source"));
    assert_eq!(k.checksum_entry(), "Application/a/source");
    let obj = json!({"metadata": {"name": "a", "uid": "local"}});
    assert_eq!(ResourceKey::from_object(&obj, None), None);
    assert_eq!(
        ResourceKey::from_object(&obj, Some("AppProject"))
            .unwrap()
            .uid,
        "local"
    );
}

#[test]
fn spec_checksum_matches_go_json_sha256() {
    let app = json!({
        "kind": "Application",
        "metadata": {"name": "guestbook"},
        "spec": {
            "syncPolicy": {"automated": {"prune": true}},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
            "source": {"targetRevision": "HEAD", "repoURL": "https://example.com/a&b<>", "path": "guestbook"},
            "project": "default"
        },
        "status": {"ignored": true}
    });
    // printf '{"project":"default","source":{"path":"guestbook","repoURL":"https://example.com/a\u0026b\u003c\u003e","targetRevision":"HEAD"},"syncPolicy":{"automated":{"prune":true}}}' | sha256sum
    assert_eq!(
        hexs(&spec_checksum(&app, None).unwrap()),
        "a081068532016cb76e0922275533d5963ed07a23b9647e3891bc3a30bd98b373"
    );
    // destination does not matter
    let mut other = app.clone();
    other["spec"]["destination"] = json!({"name": "in-cluster"});
    assert_eq!(
        spec_checksum(&app, None).unwrap(),
        spec_checksum(&other, None).unwrap()
    );

    // printf '{"password":"c2VjcmV0","url":"aHR0cHM6Ly9leGFtcGxl"}' | sha256sum
    let secret = json!({"kind": "Secret", "metadata": {"name": "repo"},
        "data": {"url": "aHR0cHM6Ly9leGFtcGxl", "password": "c2VjcmV0"}});
    assert_eq!(
        hexs(&spec_checksum(&secret, None).unwrap()),
        "dd618aea4b856252ad4aa14ea108bac82b226505305558af1e3e9dda3c377eb4"
    );
    // A ConfigMap without data checksums as `{}` (upstream's generateSpecChecksum), under its
    // own kind and under the GPG keys ConfigMap's resync kind: printf '{}' | sha256sum
    let cm = json!({"metadata": {"name": "gpg"}});
    for kind in ["ConfigMap", "GPGKey"] {
        assert_eq!(
            hexs(&spec_checksum(&cm, Some(kind)).unwrap()),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
    // printf '{"pub.asc":"k"}' | sha256sum
    let cm = json!({"metadata": {"name": "gpg"}, "data": {"pub.asc": "k"}});
    assert_eq!(
        spec_checksum(&cm, Some("GPGKey")).unwrap(),
        Sha256::digest(br#"{"pub.asc":"k"}"#).to_vec()
    );
    // printf '{}' | sha256sum
    let empty =
        json!({"kind": "AppProject", "metadata": {"name": "p"}, "spec": {"destination": 1}});
    assert_eq!(
        hexs(&spec_checksum(&empty, None).unwrap()),
        "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
    );
    let err = spec_checksum(
        &json!({"kind": "Application", "metadata": {"name": "x"}}),
        None,
    )
    .unwrap_err();
    assert!(err.to_string().contains("no spec"), "{err}");
}

#[test]
fn go_json_byte_for_byte() {
    let v = json!({
        "z": 1, "a": [true, false, null, -3, 2.5, 1e21, 0.0000001, 12345678901234567890u64],
        "html": "<script>&</script>", "ctl": "\u{1}\u{1f}\n\t", "uni": "é\u{2028}",
        "nested": {"b": {}, "a": []}
    });
    assert_eq!(
        go_json::to_string(&v),
        r#"{"a":[true,false,null,-3,2.5,1e+21,1e-7,12345678901234567890],"ctl":"\u0001\u001f\n\t","html":"\u003cscript\u003e\u0026\u003c/script\u003e","nested":{"a":[],"b":{}},"uni":"é\u2028","z":1}"#
    );
}
