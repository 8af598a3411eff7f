package plans_test

import (
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

func TestParseSpecValid(t *testing.T) {
	spec, rules, err := plans.ParseSpec([]byte(`
name: flaky-payments
description: payment provider under load
sla:
  latency_ms: {min: 100, max: 500}
  error_rate: {max: 0.3}
faults:
  - id: lat
    kind: latency
    params: {mean_ms: 250, jitter_ms: 40}
  - id: pay-429
    kind: http_error
    probability: 0.05
    match: {services: [payment], paths: ["/v1/*"], methods: [POST]}
    params: {status: 429, retry_after_ms: 2000}
  - id: loss
    kind: packet_loss
    params: {rate: 0.01, burst_len: 4}
  - id: gz
    kind: broken_gzip
    probability: 0.01
  - id: hdr
    kind: header_missing
    params: {header: Retry-After}
  - id: leak
    kind: memory_leak
    params: {mb_per_min: 5, limit_mb: 512}
`))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Name != "flaky-payments" || len(rules) != 6 {
		t.Fatalf("spec %q with %d rules", spec.Name, len(rules))
	}
	if r := rules[1]; r.Probability != 0.05 || r.Num("status") != 429 || r.Num("retry_after_ms") != 2000 {
		t.Fatalf("rule 1 = %+v", r)
	}
	if r := rules[2]; r.Probability != 1 || r.Num("rto_ms") != 200 {
		t.Fatalf("defaults not applied: probability %v rto_ms %v", r.Probability, r.Num("rto_ms"))
	}
	if got := inject.AmbientRules(rules); len(got) != 1 || got[0].ID != "leak" {
		t.Fatalf("ambient rules = %v", got)
	}
}

func TestParseSpecRejectsBadSpecs(t *testing.T) {
	const head = "name: p\nfaults:\n"
	tests := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown fault", head + "  - {id: a, kind: chaos_monkey}\n", []string{`faults[0].kind: unknown fault "chaos_monkey" (known: packet_loss, latency`}},
		{"negative rate", head + "  - {id: a, kind: packet_loss, params: {rate: -0.1}}\n", []string{"faults[0].params.rate: -0.1 is below the minimum 0 probability"}},
		{"rate over 1", head + "  - {id: a, kind: packet_loss, params: {rate: 1.5}}\n", []string{"faults[0].params.rate: 1.5 is above the maximum 1 probability"}},
		{"probability over 1", head + "  - {id: a, kind: disk_full, probability: 2}\n", []string{"faults[0].probability: 2 is above the maximum 1"}},
		{"unknown param", head + "  - {id: a, kind: latency, params: {mean: 3}}\n", []string{`faults[0].params.mean: fault latency has no parameter "mean" (known: mean_ms, jitter_ms, distribution)`}},
		{"param of a kind without params", head + "  - {id: a, kind: disk_full, params: {x: 1}}\n", []string{"faults[0].params.x: fault disk_full takes no parameters"}},
		{"unknown distribution", head + "  - {id: a, kind: latency, params: {distribution: pareto}}\n", []string{"faults[0].params.distribution: pareto is not one of normal, lognormal, uniform"}},
		{"wrong type", head + "  - {id: a, kind: latency, params: {mean_ms: fast}}\n", []string{"faults[0].params.mean_ms: want a number in ms, got fast"}},
		{"required param", head + "  - {id: a, kind: bandwidth}\n", []string{"faults[0].params.bytes_per_sec: required"}},
		{"required text", head + "  - {id: a, kind: header_garbled}\n", []string{"faults[0].params.header: required"}},
		{"status not whole", head + "  - {id: a, kind: http_error, params: {status: 429.5}}\n", []string{"429.5 is not a whole number of status"}},
		{"duplicate id", head + "  - {id: a, kind: disk_full}\n  - {id: a, kind: read_only}\n", []string{`faults[1].id: duplicate id "a" (first at faults[0])`}},
		{"bad id", head + "  - {id: '-x y', kind: disk_full}\n", []string{`faults[0].id: "-x y"`}},
		{"unknown field", head + "  - {id: a, kind: disk_full, probabilty: 0.5}\n", []string{"field probabilty not found"}},
		{"duplicate key", "name: p\nname: q\n", []string{`mapping key "name" already defined`}},
		{"two documents", "name: p\n---\nname: q\n", []string{"more than one YAML document"}},
		{"empty", "", []string{"spec: empty document"}},
		{"built-in name", "name: stress\n", []string{`name: "stress" is a built-in profile`}},
		{"bad glob", head + "  - {id: a, kind: disk_full, match: {paths: [\"[\"]}}\n", []string{`faults[0].match.paths[0]: "[": bad pattern`}},
		{"unknown op", head + "  - {id: a, kind: disk_full, match: {ops: [truncate]}}\n", []string{`faults[0].match.ops[0]: unknown operation "truncate"`}},
		{"impossible burst", head + "  - {id: a, kind: packet_loss, params: {rate: 0.9, burst_len: 2}}\n", []string{"faults[0].params.rate: 0.9 with burst_len 2 is impossible"}},
		{"inconsistent SLA", "name: p\nsla: {latency_ms: {min: 500, max: 100}}\n", []string{"sla.latency_ms: min 500 is above max 100"}},
		{"SLA out of range", "name: p\nsla: {error_rate: {max: 1.2}}\n", []string{"sla.error_rate.max: 1.2 is outside [0, 1]"}},
		{"plan breaks SLA latency", "name: p\nsla: {latency_ms: {max: 100}}\nfaults:\n  - {id: l, kind: latency, params: {mean_ms: 300}}\n",
			[]string{"sla.latency_ms: service *: 300 ms expected added latency is above the SLA maximum 100"}},
		{"plan breaks SLA min", "name: p\nsla: {latency_ms: {min: 100}}\nfaults:\n  - {id: l, kind: latency, probability: 0.1, params: {mean_ms: 300}}\n",
			[]string{"30 ms expected added latency is below the SLA minimum 100"}},
		{"plan breaks SLA errors", "name: p\nsla: {error_rate: {max: 0.1}}\nfaults:\n  - {id: a, kind: http_error, probability: 0.1, match: {services: [pay]}}\n  - {id: b, kind: reset, probability: 0.1}\n",
			[]string{"sla.error_rate: service pay: 0.19 abort probability is above the SLA maximum 0.1"}},
		{"every problem at once", head + "  - {id: a, kind: chaos}\n  - {id: b, kind: latency, probability: -1, params: {mean_ms: -2}}\n",
			[]string{"faults[0].kind", "faults[1].probability", "faults[1].params.mean_ms"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := plans.ParseSpec([]byte(tt.yaml))
			wantErrs(t, err, tt.want...)
		})
	}
	big := "name: p\nfaults:\n" + strings.Repeat("  - {id: a, kind: disk_full}\n", 40000)
	if _, _, err := plans.ParseSpec([]byte(big)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("oversized spec: %v", err)
	}
}
