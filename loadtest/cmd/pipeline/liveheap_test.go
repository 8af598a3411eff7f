package main

import (
	"strings"
	"testing"
)

func TestParseMemStats(t *testing.T) {
	profile := "heap profile: 1: 2 [3: 4] @ heap/1048576\n1: 2 [3: 4] @ 0x1\n\n# runtime.MemStats\n# Alloc = 123\n# HeapAlloc = 417000000\n# HeapSys = 905969664\n# HeapIdle = 1\n"
	s, err := parseMemStats(strings.NewReader(profile))
	if err != nil || s.HeapAlloc != 417000000 || s.HeapSys != 905969664 {
		t.Fatalf("parseMemStats = %+v, %v", s, err)
	}
	if _, err := parseMemStats(strings.NewReader("# Alloc = 1\n")); err == nil {
		t.Fatal("a profile without HeapAlloc parsed")
	}
}

func TestSumMetric(t *testing.T) {
	metrics := `# HELP gauntlet_worker_episodes_total Episodes finished, by reason.
# TYPE gauntlet_worker_episodes_total counter
gauntlet_worker_episodes_total{otel_scope_name="worker",reason="success"} 1200
gauntlet_worker_episodes_total{otel_scope_name="worker",reason="max_steps"} 34
gauntlet_worker_episodes_total_extra 99
gauntlet_worker_steps_total 5000
`
	n, err := sumMetric(strings.NewReader(metrics), "gauntlet_worker_episodes_total")
	if err != nil || n != 1234 {
		t.Fatalf("sumMetric = %d, %v; want 1234", n, err)
	}
}

func TestLiveHeapSlope(t *testing.T) {
	var samples []heapSample
	for i := range 20 {
		// 100 MB flat plus 2 kB per episode, with a start-up sample far off the line.
		e := uint64(i) * 50_000
		samples = append(samples, heapSample{Episodes: e, HeapAlloc: 100<<20 + 2048*e})
	}
	samples[0].HeapAlloc = 900 << 20 // before 10 %: left out
	slope, n, ok := liveHeapSlope(samples)
	if !ok || n != 18 || slope < 2047.9 || slope > 2048.1 {
		t.Fatalf("slope = %v over %d samples (ok %v), want 2048 over 18", slope, n, ok)
	}
	if _, _, ok := liveHeapSlope(samples[:2]); ok {
		t.Fatal("a slope from two samples")
	}
}
