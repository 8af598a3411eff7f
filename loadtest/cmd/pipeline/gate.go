package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// baseline is what a regression gate compares a run with: gauntlet's CPU per persisted
// step (the demo process: scheduler, workers, reward, faults, NATS, store) over the CPU
// per step row of the ClickHouse ceiling measured in the same round, the median over the
// rounds of an earlier run of the same size on a machine of the same kind.
//
// CPU per step is the figure to judge by: wall-clock rates move with whatever else a
// 2-core VM is doing, CPU time per unit of work much less. Less, not nothing: on one VM
// in one day gauntlet's CPU per step read 52 to 79 µs with the code unchanged, and the
// ceiling's CPU per row, measured seconds apart, moved with it. Their quotient is what
// the gate compares (docs/benchmarks.md); the absolute figures are kept for the reader.
type baseline struct {
	MeasuredAt time.Time `json:"measured_at"`
	Command    []string  `json:"command"`
	Machine    machine   `json:"machine"`
	Episodes   uint64    `json:"episodes"`
	Rounds     int       `json:"rounds"`
	Policy     string    `json:"policy"`
	// GauntletUsPerStep is the median over the rounds (µs of CPU per persisted step).
	GauntletUsPerStep float64 `json:"median_gauntlet_us_per_step"`
	// ClickHouseUsPerStep is recorded for the reader; the gate does not judge ClickHouse.
	ClickHouseUsPerStep float64 `json:"median_clickhouse_us_per_step"`
	// CeilingUsPerRow is the ceiling's median CPU per step row (ClickHouse and the
	// harness's writer), for the reader.
	CeilingUsPerRow float64 `json:"median_ceiling_us_per_row"`
	// GauntletPerCeilingRow is the gate's figure (summaryResult.MedianGauntletPerCeilingRow).
	GauntletPerCeilingRow float64 `json:"median_gauntlet_per_ceiling_row"`
}

// writeBaseline records res's summary as a baseline at path.
func writeBaseline(path string, res *results) error {
	if res.Summary == nil {
		return errors.New("-write-baseline: no rounds were measured")
	}
	// The harness runs from a temporary build under `go run`: name it by its package.
	cmd := append([]string{"loadtest/cmd/pipeline"}, res.Command[min(1, len(res.Command)):]...)
	b := baseline{
		MeasuredAt: res.StartedAt, Command: cmd, Machine: res.Machine,
		Episodes: res.Options.Episodes, Rounds: len(res.Rounds), Policy: res.Options.Policy,
		GauntletUsPerStep: res.Summary.MedianGauntletUsPerStep, ClickHouseUsPerStep: res.Summary.MedianClickHouseUsPerStep,
		CeilingUsPerRow: res.Summary.MedianCeilingUsPerRow, GauntletPerCeilingRow: res.Summary.MedianGauntletPerCeilingRow,
	}
	if b.GauntletPerCeilingRow <= 0 {
		return errors.New("-write-baseline: no round measured both the pipeline's and the ceiling's CPU")
	}
	data, err := json.MarshalIndent(b, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("-write-baseline: %w", err)
	}
	return nil
}

// readBaseline reads a baseline, refusing unknown fields and one of another shape of run.
func readBaseline(path string, o options) (baseline, error) {
	var b baseline
	f, err := os.Open(path)
	if err != nil {
		return b, fmt.Errorf("-baseline: %w", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return b, fmt.Errorf("-baseline %s: %w", path, err)
	}
	switch {
	case b.GauntletUsPerStep <= 0:
		return b, fmt.Errorf("-baseline %s: median_gauntlet_us_per_step must be positive", path)
	case b.GauntletPerCeilingRow <= 0:
		return b, fmt.Errorf("-baseline %s: median_gauntlet_per_ceiling_row must be positive (a baseline from before the gate compared it: re-measure with make bench-baseline)", path)
	case b.Episodes != o.Episodes || b.Policy != o.Policy:
		return b, fmt.Errorf("-baseline %s was measured with -episodes %d -policy %s; this run has -episodes %d -policy %s: CPU per step is compared only between runs of one size",
			path, b.Episodes, b.Policy, o.Episodes, o.Policy)
	}
	return b, nil
}

// gate judges a run's summary against the baseline: an error when gauntlet's CPU per step
// over the ceiling's CPU per row (medians over the rounds) is more than maxSlowdown times
// the baseline's.
func gate(w io.Writer, s *summaryResult, b baseline, maxSlowdown float64) error {
	if s == nil || s.MedianGauntletPerCeilingRow <= 0 {
		return errors.New("regression gate: no round measured both the pipeline's and the ceiling's CPU")
	}
	ratio := s.MedianGauntletPerCeilingRow / b.GauntletPerCeilingRow
	fmt.Fprintf(w, "\nregression gate: gauntlet CPU per step over the ceiling's per row %.2f (%.1f µs over %.1f µs), baseline %.2f (%.1f over %.1f µs, measured %s on %d × %s): ×%.2f, limit ×%.2f\n",
		s.MedianGauntletPerCeilingRow, s.MedianGauntletUsPerStep, s.MedianCeilingUsPerRow,
		b.GauntletPerCeilingRow, b.GauntletUsPerStep, b.CeilingUsPerRow, b.MeasuredAt.Format("2006-01-02"), b.Machine.CPUs, b.Machine.CPUModel, ratio, maxSlowdown)
	if ratio > maxSlowdown {
		return fmt.Errorf("regression gate: gauntlet's CPU per persisted step is %.2f times the ceiling's per row (%.1f µs) against the baseline's %.2f (×%.2f, over the limit ×%.2f)",
			s.MedianGauntletPerCeilingRow, s.MedianGauntletUsPerStep, b.GauntletPerCeilingRow, ratio, maxSlowdown)
	}
	return nil
}
