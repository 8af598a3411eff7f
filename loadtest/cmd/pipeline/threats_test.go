package main

import (
	"strings"
	"testing"
)

// TestParsePropagation reads the workers' histogram from a /metrics page as the demo
// serves it (OpenTelemetry's Prometheus exporter: labels, other metrics around it),
// summing two series, and takes its quantiles as the upper bounds of their buckets.
func TestParsePropagation(t *testing.T) {
	page := `# HELP gauntlet_worker_threat_propagation_seconds From a threat fingerprint's publication ...
# TYPE gauntlet_worker_threat_propagation_seconds histogram
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",le="0.001"} 10
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",le="0.002"} 90
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",le="0.005"} 98
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",le="+Inf"} 100
gauntlet_worker_threat_propagation_seconds_sum{otel_scope_name="gauntlet/worker"} 0.2
gauntlet_worker_threat_propagation_seconds_count{otel_scope_name="gauntlet/worker"} 100
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",worker="2",le="0.001"} 0
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",worker="2",le="0.002"} 0
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",worker="2",le="0.005"} 0
gauntlet_worker_threat_propagation_seconds_bucket{otel_scope_name="gauntlet/worker",worker="2",le="+Inf"} 0
gauntlet_worker_threat_propagation_seconds_sum{otel_scope_name="gauntlet/worker",worker="2"} 0
gauntlet_worker_threat_propagation_seconds_count{otel_scope_name="gauntlet/worker",worker="2"} 0
gauntlet_envapi_threat_propagation_seconds_count 7
gauntlet_worker_steps_total 12345
`
	h, err := parsePropagation(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	if h.count != 100 || h.sum != 0.2 || len(h.le) != 4 {
		t.Fatalf("histogram %+v; want 100 observations summing to 0.2 s in 4 buckets", h)
	}
	for _, c := range []struct {
		q    float64
		want float64
	}{{0.05, 1}, {0.5, 2}, {0.9, 2}, {0.98, 5}, {0.99, -1}} {
		if got := h.quantileMs(c.q); got != c.want {
			t.Errorf("quantile %v: %v ms, want %v", c.q, got, c.want)
		}
	}
	if got := (histogram{}).quantileMs(0.5); got != 0 {
		t.Errorf("an empty histogram's median: %v, want 0", got)
	}
}

// TestProbeCommandsDiffer: the probe's commands differ by letters, not numbers, which
// Normalise folds, so each makes a fingerprint of its own.
func TestProbeCommandsDiffer(t *testing.T) {
	seen := map[string]bool{}
	for n := range uint64(800) {
		w := word(n)
		if seen[w] || strings.ContainsAny(w, "0123456789") {
			t.Fatalf("word(%d) = %q: repeated or with digits", n, w)
		}
		seen[w] = true
	}
	if word(0) != "a" || word(25) != "z" || word(26) != "aa" {
		t.Errorf("word(0, 25, 26) = %s, %s, %s", word(0), word(25), word(26))
	}
}
