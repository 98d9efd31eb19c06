//! Fuzzes what both ends do with every message off the event stream: protobuf decoding of the
//! `eventstreamapi.Event` wrapper and of the bare CloudEvent, conversion to the typed
//! [`Event`], and decoding of its JSON payload as every payload type a receiver asks for.
//! Oracles: nothing panics, and a decoded event survives re-encoding unchanged (the model
//! claims a lossless conversion; the outbox journal and forwarding rely on it).
#![no_main]

use argocd_agent_proto::event::{data_checksum, go_json, spec_checksum, Event, ResourceKey};
use argocd_agent_proto::payload::{
    ClusterCacheInfo, ContainerLogRequest, ContainerTerminalRequest, ErrorData, RedisRequest,
    RedisResponse, RequestSyncedResourceList, RequestUpdate, ResourceRequest, ResourceResponse,
    SyncedResource,
};
use argocd_agent_proto::pb;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if let Ok(wrapper) = pb::eventstreamapi::Event::decode(data) {
        if let Ok(ev) = Event::try_from_stream_event(wrapper) {
            exercise(&ev);
        }
    }
    if let Ok(ev) = Event::decode(data) {
        exercise(&ev);
    }
});

fn exercise(ev: &Event) {
    let again = Event::decode(&ev.encode_to_vec())
        .unwrap_or_else(|e| panic!("a decoded event does not decode after re-encoding: {e}"));
    assert_eq!(&again, ev, "re-encoding changed the event");
    let _ = ev.subject_parts();
    let _ = ev.ack_error();
    let _ = ev.ack();

    if let Ok(obj) = ev.data_as::<Value>() {
        let _ = go_json::to_string(&obj);
        let _ = data_checksum(&obj);
        let _ = spec_checksum(&obj, None);
        let _ = spec_checksum(&obj, Some("Application"));
        let _ = ResourceKey::from_object(&obj, None).map(|k| k.checksum_entry());
    }
    let _ = ev
        .data_as::<ResourceRequest>()
        .map(|r| (r.is_valid(), r.is_list()));
    let _ = ev.data_as::<ResourceResponse>();
    let _ = ev.data_as::<RedisRequest>();
    let _ = ev.data_as::<RedisResponse>();
    let _ = ev.data_as::<RequestSyncedResourceList>();
    let _ = ev
        .data_as::<SyncedResource>()
        .map(|s| ResourceKey::from(&s));
    let _ = ev.data_as::<RequestUpdate>();
    let _ = ev.data_as::<ClusterCacheInfo>();
    let _ = ev.data_as::<ContainerLogRequest>();
    let _ = ev.data_as::<ContainerTerminalRequest>();
    let _ = ev.data_as::<ErrorData>();
}
