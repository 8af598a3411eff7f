package faults

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A template the service puts expands plans in another process (a worker's Client), and
// putting it again, from this process or a fresh one, is harmless.
func TestTemplatesCrossProcesses(t *testing.T) {
	ctx := context.Background()
	b := bustest.Start(t)
	custom, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "slow", SpecYaml: "name: slow\nfaults:\n  - {id: latency, kind: latency, params: {mean_ms: 90, jitter_ms: 5}}\n"}})
	if err != nil {
		t.Fatal(err)
	}
	services := []string{"a", "b"}
	base, err := custom.Plan(0, "slow", services)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, id, err := plans.NewTemplate(base)
	if err != nil {
		t.Fatal(err)
	}
	w := newTemplateWriter(b.JS)
	for i := 0; i < 2; i++ {
		if err := w.Put(ctx, id, tmpl); err != nil {
			t.Fatal(err)
		}
	}
	if err := newTemplateWriter(b.JS).Put(ctx, id, tmpl); err != nil {
		t.Fatal(err)
	}

	full, err := custom.Plan(42, "slow", services)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := plans.Compact(full, id)
	if err != nil {
		t.Fatal(err)
	}
	got, err := templates.NewClient(b.JS).Expand(ctx, ref, services)
	if err != nil {
		t.Fatal(err)
	}
	full.Digest = ref.Digest
	if !proto.Equal(got, full) {
		t.Fatalf("expanded %v, want %v", got, full)
	}
}
