// Command cewire encodes and decodes argocd-agent CloudEvents with cloudevents/sdk-go's protobuf
// format, the library upstream argocd-agent uses on the wire.
//
//	cewire encode   prints one JSON line per upstream-shaped event: {"name": ..., "hex": ...}
//	cewire decode   reads hex-encoded protobuf CloudEvents, one per line, and prints per line what
//	                sdk-go decodes: {"type", "source", "dataschema", "subject", "datacontenttype",
//	                "extensions", "data"} or {"error": ...}
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	format "github.com/cloudevents/sdk-go/binding/format/protobuf/v2"
	"github.com/cloudevents/sdk-go/binding/format/protobuf/v2/pb"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"google.golang.org/protobuf/proto"
)

const typePrefix = "io.argoproj.argocd-agent.event."

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: cewire encode|decode")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "encode":
		encode()
	case "decode":
		decode()
	default:
		fmt.Fprintln(os.Stderr, "usage: cewire encode|decode")
		os.Exit(2)
	}
}

// newEvent builds an event as upstream's internal/event package does: spec 1.0, source, type,
// dataschema = target, the resourceid/eventid/sentat extensions.
func newEvent(source, typ, target, resourceID, eventID string) cloudevents.Event {
	ev := cloudevents.NewEvent()
	ev.SetSpecVersion("1.0")
	ev.SetSource(source)
	ev.SetType(typePrefix + typ)
	ev.SetDataSchema(target)
	ev.SetExtension("resourceid", resourceID)
	ev.SetExtension("eventid", eventID)
	ev.SetExtension("sentat", time.Date(2026, 11, 24, 7, 0, 0, 123456789, time.UTC).Format(time.RFC3339Nano))
	return ev
}

func emit(name string, ev cloudevents.Event) {
	p, err := format.ToProto(&ev)
	must(err)
	b, err := proto.Marshal(p)
	must(err)
	line, _ := json.Marshal(map[string]string{"name": name, "hex": hex.EncodeToString(b)})
	fmt.Println(string(line))
}

func encode() {
	app := map[string]any{
		"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
		"metadata": map[string]any{"name": "guestbook", "namespace": "argocd", "uid": "0b6a1c2e-1f4b-4c1e-9d5e-3f2a1b0c9d8e", "resourceVersion": "11324"},
		"spec":     map[string]any{"project": "default"},
		"status":   map[string]any{"sync": map[string]any{"status": "Synced"}},
	}
	status := newEvent("agent://agent-managed", "status-update", "application", "guestbook_0b6a1c2e", "guestbook_0b6a1c2e_11324")
	status.SetSubject("argocd/guestbook")
	must(status.SetData(cloudevents.ApplicationJSON, app))
	emit("status-update", status)

	ack := newEvent("agent://agent-managed", "processed", "eventProcessed", "guestbook_0b6a1c2e", "guestbook_0b6a1c2e_11324")
	emit("ack", ack)

	ping := newEvent("agent://agent-managed", "ping", "heartbeat", "", "")
	emit("heartbeat", ping)
}

func decode() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		out := map[string]any{}
		if err := decodeOne(line, out); err != nil {
			out = map[string]any{"error": err.Error()}
		}
		b, _ := json.Marshal(out)
		fmt.Println(string(b))
	}
	must(in.Err())
}

func decodeOne(line string, out map[string]any) error {
	raw, err := hex.DecodeString(line)
	if err != nil {
		return err
	}
	var p pb.CloudEvent
	if err := proto.Unmarshal(raw, &p); err != nil {
		return err
	}
	ev, err := format.FromProto(&p)
	if err != nil {
		return err
	}
	out["type"] = ev.Type()
	out["source"] = ev.Source()
	out["dataschema"] = ev.DataSchema()
	out["subject"] = ev.Subject()
	out["datacontenttype"] = ev.DataContentType()
	ext := map[string]string{}
	for k, v := range ev.Extensions() {
		ext[k] = fmt.Sprint(v)
	}
	out["extensions"] = ext
	out["data"] = string(ev.Data())
	return nil
}

func must(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
