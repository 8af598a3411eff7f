package rewardspecs

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
)

const shaped = `name: shaped
version: "2"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.99}, weight: 0.5}
`

// A spec put by one client (the CLI) is read by another (a reward instance), parsed and
// checked against its digest; the built-in spec never touches the bucket; an unknown
// digest is ErrNotFound; a bucket entry that is not the file its key names is refused.
func TestPutThenGetAnywhere(t *testing.T) {
	ctx := context.Background()
	b := bustest.Start(t)
	spec, err := scoring.Parse("shaped.yaml", []byte(shaped))
	if err != nil {
		t.Fatal(err)
	}
	cli := NewClient(b.JS)
	for range 2 { // a second put of the same spec is no error
		if err := cli.Put(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	got, err := NewClient(b.JS).Get(ctx, spec.Digest)
	if err != nil {
		t.Fatal(err)
	}
	if got.Version != "shaped/2" || got.Digest != spec.Digest || !got.Stateful() || got.Source != shaped {
		t.Errorf("got %s %s stateful=%v", got.Version, got.Digest, got.Stateful())
	}

	if err := cli.Put(ctx, scoring.SpecFor("shop")); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketRewardSpecs)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(ctx, Key(scoring.DefaultDigest())); err == nil {
		t.Error("the built-in spec was put in the bucket")
	}
	def, err := NewClient(b.JS).Get(ctx, scoring.DefaultDigest())
	if err != nil || def.Version != scoring.DefaultVersion {
		t.Errorf("built-in spec: %v %v", def.Version, err)
	}

	missing := "sha256:" + strings.Repeat("0", 64)
	if _, err := NewClient(b.JS).Get(ctx, missing); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown digest: %v, want ErrNotFound", err)
	}
	if _, err := kv.Put(ctx, Key(missing), []byte(shaped)); err != nil {
		t.Fatal(err)
	}
	if _, err := NewClient(b.JS).Get(ctx, missing); err == nil || !strings.Contains(err.Error(), "the bucket's file has digest "+spec.Digest) {
		t.Errorf("mislabelled entry: %v", err)
	}
	if err := cli.Put(ctx, scoring.Spec{Version: "go/1"}); err == nil {
		t.Error("put a spec without a file")
	}
}
