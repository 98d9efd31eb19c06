#!/usr/bin/env python3
"""Writes the seed corpora under principal/fuzz/corpus/<target>/ (small files, committed).

The inputs are the real ones, byte for byte: CloudEvents laid out exactly as our
`Event::into_cloud_event` (and upstream's Go sdk) put them on the wire, bare and inside the
`eventstreamapi.Event` wrapper; an outbox journal in the layout `proto/src/sync/journal.rs`
writes (intact, cut short by a crash, with a flipped byte); the RESP commands Argo CD's server
sends its Redis; the API paths Argo CD's controller and server request from a cluster.
Plain Python (no build): `python3 principal/fuzz/seed_corpus.py`.
"""
import hashlib
import json
import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
PREFIX = "io.argoproj.argocd-agent.event."


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


# --- protobuf wire encoding (only what a CloudEvent needs) ---
def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, payload):  # length-delimited field
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def cloud_event(type_, target, data=None, source="", subject=None, ids=("", ""), extra=()):
    resource_id, event_id = ids
    attrs = [("dataschema", target)] if target else []
    if subject is not None:
        attrs.append(("subject", subject))
    if resource_id:
        attrs.append(("resourceid", resource_id))
    if event_id:
        attrs.append(("eventid", event_id))
    attrs.append(("sentat", "2025-05-01T10:00:00.123456789Z"))
    attrs.extend(extra)
    if data is not None:
        attrs.append(("datacontenttype", "application/json"))
    out = field(1, event_id) + (field(2, source) if source else b"") + field(3, "1.0") + field(4, type_)
    for k, v in attrs:
        out += field(5, field(1, k) + field(2, field(3, v)))  # map entry: key, ce_string value
    if data is not None:
        out += field(6, json.dumps(data, separators=(",", ":")).encode())
    return out


APP = {
    "apiVersion": "argoproj.io/v1alpha1",
    "kind": "Application",
    "metadata": {
        "name": "guestbook",
        "namespace": "agent-a",
        "uid": "5b2c1e0e-4a7e-4d7a-9b1f-3f1c2d9e8a01",
        "resourceVersion": "4711",
        "labels": {"app.kubernetes.io/part-of": "demo"},
        "finalizers": ["resources-finalizer.argocd.argoproj.io"],
    },
    "spec": {
        "project": "default",
        "source": {
            "repoURL": "https://github.com/argoproj/argocd-example-apps",
            "path": "guestbook",
            "targetRevision": "HEAD",
        },
        "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
        "syncPolicy": {"automated": {"prune": True, "selfHeal": True}},
    },
    "status": {
        "sync": {"status": "Synced", "revision": "53e28ff20cc530b9ada2173fbbd64d48338583ba"},
        "health": {"status": "Healthy"},
    },
}
APP_IDS = ("guestbook_5b2c1e0e-4a7e-4d7a-9b1f-3f1c2d9e8a01",
           "guestbook_5b2c1e0e-4a7e-4d7a-9b1f-3f1c2d9e8a01_4711")
REQ = "7d0c3d8e-0b6a-4f1e-9c55-0d7a1b2c3d4e"
CONN = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
EVENTS = {
    "app-create": cloud_event(PREFIX + "create", "application", APP, subject="agent-a/guestbook", ids=APP_IDS),
    "app-status-update": cloud_event(
        PREFIX + "status-update", "application", APP, source="agent://agent-managed",
        subject="agent-a/guestbook", ids=APP_IDS,
        extra=[("principaluid", "0c6f3f5e-1d2c-4b3a-8f9e-7d6c5b4a3f2e"),
               ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")]),
    "app-ack-error": cloud_event(PREFIX + "processed", "eventProcessed", ids=APP_IDS,
                                 extra=[("error", "namespace agent-a is not managed")]),
    "resource-get": cloud_event("GET", "resource", {
        "uuid": REQ, "name": "guestbook-ui", "namespace": "guestbook", "method": "GET",
        "group": "apps", "version": "v1", "resource": "deployments"}, ids=(REQ, REQ)),
    "resource-response": cloud_event(PREFIX + "response", "resource", {
        "uuid": REQ, "status": 200, "resource": json.dumps(APP)}, source="agent://agent-managed",
        ids=("1c2d3e4f-aaaa-4bbb-8ccc-dddddddddddd", REQ)),
    "redis-get": cloud_event(PREFIX + "redis-request", "redis", {
        "uuid": REQ, "connection_uuid": CONN,
        "body": {"get": {"key": "app|managed-resources|agent-a_guestbook"}}}, ids=(REQ, REQ)),
    "redis-response": cloud_event(PREFIX + "redis-response", "redis", {
        "uuid": REQ, "connection_uuid": CONN,
        "body": {"get": {"bytes": "H4sIAAAAAAAA/w==", "cache_hit": True, "error": ""}}}, ids=(REQ, REQ)),
    "resync-update": cloud_event(PREFIX + "request-update", "resourceResync", {
        "name": "guestbook", "namespace": "agent-a", "uid": "5b2c1e0e", "kind": "Application",
        "checksum": "3q2+7w=="}, ids=(REQ, REQ)),
    "log-request": cloud_event("GET", "containerlog", {
        "uuid": REQ, "namespace": "guestbook", "podName": "guestbook-ui-85985d774c-2lx7m",
        "container": "guestbook-ui", "follow": True, "tailLines": 1000}, ids=(REQ, REQ)),
    "ping": cloud_event(PREFIX + "ping", "heartbeat", ids=(REQ, REQ)),
    "error-report": cloud_event(PREFIX + "error", "application", {
        "resourceName": "guestbook", "resourceNamespace": "agent-a", "message": "adoption refused"},
        source="agent://agent-managed", subject="agent-a/guestbook", ids=(REQ, REQ)),
}


def cloudevent_seeds():
    for name, ce in EVENTS.items():
        write("cloudevent_decode", name + ".ce", ce)
        write("cloudevent_decode", name + ".stream", field(1, ce))


def record(kind, payload):
    return bytes([kind]) + struct.pack("<I", len(payload)) + hashlib.sha256(payload).digest()[:8] + payload


def journal_seeds():
    delivery = "3c1d2e3f-4a5b-4c6d-8e7f-8091a2b3c4d5"
    queued = [cloud_event(PREFIX + "spec-update", "application", APP, subject="agent-a/guestbook",
                          ids=APP_IDS, extra=[("deliveryid", delivery)]),
              cloud_event(PREFIX + "status-update", "application", APP, subject="agent-a/guestbook",
                          ids=APP_IDS, extra=[("deliveryid", "5e6f7a8b-0000-4111-8222-333344445555")])]
    confirmed = (APP_IDS[0] + "\n" + delivery).encode()
    journal = b"ARGOQ1\n" + b"".join(record(1, q) for q in queued) + record(2, confirmed)
    write("journal_reader", "intact", journal)
    write("journal_reader", "cut-mid-record", journal[:-9])
    flipped = bytearray(journal)
    flipped[40] ^= 0x20
    write("journal_reader", "flipped-byte", bytes(flipped))
    # The target's framed mode: b"F", then [kind][u16 LE length][payload] per record.
    framed = b"F" + b"".join(bytes([k]) + struct.pack("<H", len(p)) + p
                             for k, p in [(1, queued[0]), (1, queued[1]), (2, confirmed)])
    write("journal_reader", "framed", framed)


def resp(*args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode() if isinstance(a, str) else a
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    return out


def resp_seeds():
    sessions = {
        "ping": resp("PING"),
        "get-live-view": resp("GET", "app|managed-resources|agent-a_guestbook"),
        "subscribe": resp("SUBSCRIBE", "app|resources-tree|agent-a_guestbook|1.8.3",
                          "app|managed-resources|agent-a_guestbook"),
        "pipeline": resp("HELLO", "2") + resp("SET", "mfst|guestbook|53e28ff2", b"\x1f\x8bdata", "EX", "86400")
        + resp("MGET", "app|resources-tree|guestbook|1.8.3", "app|managed-resources|guestbook")
        + resp("UNSUBSCRIBE") + resp("QUIT"),
        "simple-string-args": b"*2\r\n+GET\r\n$36\r\napp|resources-tree|agent-b_web|1.8.3\r\n",
    }
    # First byte: the chunk size the target feeds the codec (whole frames, then byte by byte).
    for name, wire in sessions.items():
        write("resp_parser", name + "-whole", b"\xff" + wire)
        write("resp_parser", name + "-bytewise", b"\x01" + wire)


def path_seeds():
    for name, path in {
        "discovery": "/apis/apps/v1",
        "version": "/version",
        "get-object": "/apis/apps/v1/namespaces/guestbook/deployments/guestbook-ui",
        "list-selector": "/api/v1/namespaces/guestbook/pods?labelSelector=app%3Dguestbook-ui%2Ctier+in+%28web%29&limit=500",
        "patch-apply": "/apis/apps/v1/namespaces/guestbook/deployments/guestbook-ui?fieldManager=argocd-controller&force=true",
        "status": "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/guestbook/status",
        "cluster-scoped": "/api/v1/nodes/kind-control-plane/status",
        "logs": "/api/v1/namespaces/guestbook/pods/guestbook-ui-85985d774c-2lx7m/log?container=guestbook-ui&follow=true&tailLines=1000&sinceSeconds=3600&timestamps=true",
        "namespace-finalize": "/api/v1/namespaces/guestbook/finalize",
        "dot-segment": "/api/v1/namespaces/../secrets",
    }.items():
        write("proxy_path", name, path.encode())


if __name__ == "__main__":
    cloudevent_seeds()
    journal_seeds()
    resp_seeds()
    path_seeds()
    print("seed corpora written under", ROOT)
