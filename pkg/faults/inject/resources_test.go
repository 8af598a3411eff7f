package inject_test

import (
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

func TestResourcesFor(t *testing.T) {
	_, rules, err := plans.ParseSpec([]byte(`name: box
faults:
  - {id: cpu, kind: cpu_throttle, params: {cpu_fraction: 0.5}}
  - {id: cpu2, kind: cpu_throttle, params: {cpu_fraction: 0.25}}
  - {id: leak, kind: memory_leak, params: {mb_per_min: 10, limit_mb: 512}}
  - {id: skew, kind: clock_skew, params: {offset_ms: -90000, drift_ppm: 1000}}
  - {id: never, kind: clock_skew, probability: 0, params: {offset_ms: 5}}
  - {id: lat, kind: latency, params: {mean_ms: 5}}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := inject.ResourcesFor(1, rules)
	if got := r.CPUMax(); got != "25000 100000" {
		t.Errorf("cpu.max = %q, want the stricter throttle 25000 100000", got)
	}
	if got := r.MemoryMaxAt(6 * time.Minute); got != 452<<20 {
		t.Errorf("memory.max after 6 min = %d, want 452 MiB", got)
	}
	if got := r.MemoryMaxAt(10 * time.Hour); got != 16<<20 {
		t.Errorf("memory.max after 10 h = %d, want the 16 MiB floor", got)
	}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := r.Clock(start, start.Add(1000*time.Second)); !got.Equal(start.Add(1000*time.Second - 90*time.Second + time.Second)) {
		t.Errorf("clock = %v: want -90 s offset and +1 s drift after 1000 s", got)
	}
	if len(r.Fired) != 4 {
		t.Errorf("fired %v, want the 4 resource faults with probability 1", r.Fired)
	}
	if none := inject.ResourcesFor(1, nil); none.CPUMax() != "max 100000" || none.MemoryMaxAt(time.Hour) != -1 {
		t.Errorf("no faults: %q %d", none.CPUMax(), none.MemoryMaxAt(time.Hour))
	}
	// Half-probability faults are in force in about half the episodes, reproducibly.
	_, half, _ := plans.ParseSpec([]byte("name: h\nfaults:\n  - {id: cpu, kind: cpu_throttle, probability: 0.5, params: {cpu_fraction: 0.5}}\n"))
	on := 0
	for seed := uint64(0); seed < 10000; seed++ {
		if inject.ResourcesFor(seed, half).CPUFraction > 0 {
			on++
		}
		if inject.ResourcesFor(seed, half).CPUFraction != inject.ResourcesFor(seed, half).CPUFraction {
			t.Fatal("not reproducible")
		}
	}
	within5Sigma(t, "episodes throttled", on, 10000, 0.5)
}
