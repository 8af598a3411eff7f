package plans_test

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

// FuzzParseSpec feeds arbitrary bytes to the spec parser. It must never panic; a spec it
// accepts must compile to rules whose decisions are possible (no negative delay, fractions
// in [0,1], an errno only with a storage abort) for every kind of event.
func FuzzParseSpec(f *testing.F) {
	for _, name := range sampleSpecs(f) {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("name: x\nfaults:\n  - {id: a, kind: latency, params: {mean_ms: 1e308, jitter_ms: 1e308}}\n"))
	f.Add([]byte("name: x\nfaults:\n  - {id: a, kind: packet_loss, probability: .5, params: {rate: 0.5, burst_len: 1}}\n"))
	f.Add([]byte("name: x\nsla: {latency_ms: {min: .nan}}\n"))
	f.Add([]byte("name: &a x\nfaults: *a\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, rules, err := plans.ParseSpec(data)
		if err != nil {
			return
		}
		d := inject.NewDecider(1, rules)
		events := []catalogue.Event{
			{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Host: "h", Path: "/p", Method: "GET"},
			{Layer: catalogue.LayerNetwork, Op: catalogue.OpLookup, Host: "h"},
			{Layer: catalogue.LayerNetwork, Op: catalogue.OpWrite, Host: "h"},
			{Layer: catalogue.LayerStorage, Op: catalogue.OpWrite, Path: "/f"},
			{Layer: catalogue.LayerStorage, Op: catalogue.OpCreate, Path: "/f"},
			{Layer: catalogue.LayerStorage, Op: catalogue.OpLock, Path: "/f"},
		}
		for i := range 20 {
			dec := d.Decide("k", events[i%len(events)])
			if dec.Delay < 0 || dec.Hold < 0 || dec.RTO < 0 || !(dec.Keep >= 0 && dec.Keep <= 1) || !(dec.WriteKeep >= 0 && dec.WriteKeep <= 1) ||
				math.IsNaN(dec.BytesPerSec) || dec.BytesPerSec < 0 {
				t.Fatalf("impossible decision %+v", dec)
			}
			if dec.Errno != 0 && events[i%len(events)].Layer != catalogue.LayerStorage {
				t.Fatalf("errno %v on a %s event", dec.Errno, events[i%len(events)].Layer)
			}
			if dec.Delay > 2*time.Hour*24*365 {
				t.Fatalf("delay %v overflows any sane clock", dec.Delay)
			}
		}
	})
}

// FuzzParseDrift feeds arbitrary text to the drift parser: no panic, and accepted drift
// evaluates to values its parameters accept, which ApplyDrift takes.
func FuzzParseDrift(f *testing.F) {
	for _, s := range []string{
		"*.latency.mean_ms=linear(0:20,999:500)",
		"payment.http_503.probability=step(0:0.01,500:0.2);*.truncate.probability=piecewise@wall(0:0,60:0.3,120:0)",
		"*.http_429.retry_after_ms=linear(0:100, 10:1000)",
		"a.b.c=step()",
		"=(",
		"*.latency.mean_ms=linear(0:1e309,1:2)",
	} {
		f.Add(s)
	}
	now := time.Unix(1_700_000_000, 0)
	f.Fuzz(func(t *testing.T, text string) {
		ds, err := plans.ParseDrift(text, now)
		if err != nil {
			return
		}
		for _, x := range []float64{0, 0.5, 7, 1e9} {
			vals := plans.DriftValues(ds, plans.DriftPosition{Index: uint64(x), At: now.Add(time.Duration(x) * time.Second)}, "run")
			plan, _ := plans.Derive(1, plans.ProfileEdge, []string{"payment", "shipping"})
			if err := plans.ApplyDrift(plan, vals); err != nil {
				t.Fatalf("accepted drift %q evaluates to a rejected value at %v: %v", text, x, err)
			}
			if err := plans.Validate(plan); err != nil {
				t.Fatalf("drift %q made an invalid plan: %v", text, err)
			}
		}
		if again, err := plans.ParseDrift(plans.FormatDrift(ds), now); err != nil || len(again) != len(ds) {
			t.Fatalf("FormatDrift(%q) does not parse back: %v", text, err)
		}
	})
}

// sampleSpecs are the example profiles shipped in testdata/profiles.
func sampleSpecs(tb testing.TB) []string {
	names, err := filepath.Glob(filepath.Join("testdata", "profiles", "*.yaml"))
	if err != nil || len(names) == 0 {
		tb.Fatalf("no sample profiles in testdata/profiles: %v", err)
	}
	return names
}
