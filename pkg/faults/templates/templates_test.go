package templates

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A template in the bucket (put there as the faults service puts it) expands compact
// plans, an unknown id is named in the error, and a bucket entry that is not the
// template its key names is refused. services/faults tests the writing side.
func TestClientReadsTheBucket(t *testing.T) {
	ctx := context.Background()
	b := bustest.Start(t)
	services := []string{"a", "b"}
	custom, tmpl, id := faulttest.SlowTemplate(t, services)
	kv, err := b.JS.KeyValue(ctx, bus.BucketPlanTemplates)
	if err != nil {
		t.Fatal(err)
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(tmpl)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, id, data); err != nil {
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
	worker := NewClient(b.JS)
	got, err := worker.Expand(ctx, ref, services)
	if err != nil {
		t.Fatal(err)
	}
	full.Digest = ref.Digest
	if !proto.Equal(got, full) {
		t.Fatalf("expanded %v, want %v", got, full)
	}

	if _, err := worker.Get(ctx, "0123456789abcdef0123456789abcdef"); err == nil || !strings.Contains(err.Error(), "not in kv bucket gauntlet_plan_templates") {
		t.Fatalf("unknown template: %v", err)
	}
	// Another template's bytes under this id: found, and refused.
	other := proto.Clone(tmpl).(*gauntletv1.FaultPlan)
	other.Rules[0].Probability = 0.5
	data, _ = proto.Marshal(other)
	const forged = "ffffffffffffffffffffffffffffffff"
	if _, err := kv.Put(ctx, forged, data); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(b.JS).Get(ctx, forged); err == nil || !strings.Contains(err.Error(), "content has id") {
		t.Fatalf("forged template: %v", err)
	}
}
