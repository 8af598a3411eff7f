package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The gate judges gauntlet's CPU per step over the ceiling's per row, not the absolute
// figure: a machine that got slower for both passes, one where gauntlet alone did fails.
func TestGateJudgesCPUPerStepOverTheCeilings(t *testing.T) {
	b := baseline{GauntletUsPerStep: 40, CeilingUsPerRow: 20, GauntletPerCeilingRow: 2}
	for _, tc := range []struct {
		us, ceiling float64
		fail        bool
	}{
		{40, 20, false}, {59.9, 20, false}, {60, 20, false}, {60.1, 20, true}, {200, 20, true}, {10, 20, false},
		{80, 40, false},   // the machine at half speed: both halves of the round slowed
		{80, 20, true},    // gauntlet alone slowed
		{40, 10, true},    // the ceiling got faster, gauntlet did not
		{90, 30.1, false}, // ×1.495: just inside
	} {
		s := &summaryResult{MedianGauntletUsPerStep: tc.us, MedianCeilingUsPerRow: tc.ceiling, MedianGauntletPerCeilingRow: tc.us / tc.ceiling}
		err := gate(io.Discard, s, b, 1.5)
		if (err != nil) != tc.fail {
			t.Errorf("%.1f µs a step over a ceiling of %.1f µs a row against 40 over 20, limit ×1.5: err %v, want failure %v", tc.us, tc.ceiling, err, tc.fail)
		}
	}
	if err := gate(io.Discard, nil, b, 1.5); err == nil {
		t.Error("a run without rounds passed the gate")
	}
	if err := gate(io.Discard, &summaryResult{MedianGauntletUsPerStep: 40}, b, 1.5); err == nil {
		t.Error("a run without a ceiling measurement passed the gate")
	}
}

func TestBaselineRoundTripsAndRefusesOtherRuns(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "b.json")
	o := options{Episodes: 20_000, Policy: "oracle"}
	res := &results{Options: o, Rounds: make([]round, 3), Summary: &summaryResult{MedianGauntletUsPerStep: 33.5, MedianClickHouseUsPerStep: 20, MedianCeilingUsPerRow: 20, MedianGauntletPerCeilingRow: 1.675}}
	if err := writeBaseline(path, res); err != nil {
		t.Fatal(err)
	}
	b, err := readBaseline(path, o)
	if err != nil || b.GauntletUsPerStep != 33.5 || b.GauntletPerCeilingRow != 1.675 || b.Rounds != 3 {
		t.Fatalf("read back %+v, %v", b, err)
	}
	if _, err := readBaseline(path, options{Episodes: 100_000, Policy: "oracle"}); err == nil || !strings.Contains(err.Error(), "-episodes 20000") {
		t.Errorf("a baseline of another size was accepted: %v", err)
	}
	data, _ := os.ReadFile(path)
	odd := strings.Replace(string(data), `"rounds"`, `"round_count": 1, "rounds"`, 1)
	if err := os.WriteFile(path, []byte(odd), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readBaseline(path, o); err == nil || !strings.Contains(err.Error(), "round_count") {
		t.Errorf("a baseline with an unknown field was accepted: %v", err)
	}
	if err := writeBaseline(path, &results{}); err == nil {
		t.Error("a run without rounds was written as a baseline")
	}
	// A baseline from before the gate compared against the ceiling is refused, saying how
	// to make a new one.
	old := strings.Replace(string(data), `"median_gauntlet_per_ceiling_row": 1.675`, `"median_gauntlet_per_ceiling_row": 0`, 1)
	if old == string(data) {
		t.Fatalf("the baseline file does not hold the ceiling figure:\n%s", data)
	}
	if err := os.WriteFile(path, []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readBaseline(path, o); err == nil || !strings.Contains(err.Error(), "median_gauntlet_per_ceiling_row") || !strings.Contains(err.Error(), "bench-baseline") {
		t.Errorf("a baseline without the ceiling figure: %v", err)
	}
}
