package faults

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
)

// A template the service puts expands plans in another process (a worker's Client), and
// putting it again, from this process or a fresh one, is harmless.
func TestTemplatesCrossProcesses(t *testing.T) {
	ctx := context.Background()
	b := bustest.Start(t)
	services := []string{"a", "b"}
	custom, tmpl, id := faulttest.SlowTemplate(t, services)
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
