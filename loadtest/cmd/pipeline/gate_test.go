package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGateJudgesCPUPerStep(t *testing.T) {
	b := baseline{GauntletUsPerStep: 40}
	for _, tc := range []struct {
		us   float64
		fail bool
	}{{40, false}, {59.9, false}, {60, false}, {60.1, true}, {200, true}, {10, false}} {
		err := gate(io.Discard, &summaryResult{MedianGauntletUsPerStep: tc.us}, b, 1.5)
		if (err != nil) != tc.fail {
			t.Errorf("%.1f µs against 40 µs, limit ×1.5: err %v, want failure %v", tc.us, err, tc.fail)
		}
	}
	if err := gate(io.Discard, nil, b, 1.5); err == nil {
		t.Error("a run without rounds passed the gate")
	}
}

func TestBaselineRoundTripsAndRefusesOtherRuns(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "b.json")
	o := options{Episodes: 20_000, Policy: "oracle"}
	res := &results{Options: o, Rounds: make([]round, 3), Summary: &summaryResult{MedianGauntletUsPerStep: 33.5, MedianClickHouseUsPerStep: 20}}
	if err := writeBaseline(path, res); err != nil {
		t.Fatal(err)
	}
	b, err := readBaseline(path, o)
	if err != nil || b.GauntletUsPerStep != 33.5 || b.Rounds != 3 {
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
}
