package main

import (
	"errors"
	"math"
	"testing"
)

func TestParseSummary(t *testing.T) {
	for _, tc := range []struct {
		name    string
		out     string
		want    summary
		wantErr error
	}{
		{
			name: "demo output",
			out: "starting gauntlet (embedded NATS, local ClickHouse, all services)…\n" +
				"up: nats nats://127.0.0.1:4222, clickhouse 127.0.0.1:19000, metrics http://127.0.0.1:9464/metrics\n\n" +
				"run r0123456789ab: 100000 episodes of shop, policies oracle=1, profiles baseline=60,stress=25,edge=15\n" +
				"\n100000 episodes, 1012345 steps in 61.2s (1634 episodes/s, 16541 steps/s); all in ClickHouse after 62.0s\n\n" +
				"policy  profile  episodes\n",
			want: summary{Episodes: 100000, Steps: 1012345, RunSeconds: 61.2, PersistedSeconds: 62},
		},
		{
			name: "last line wins",
			out: "1 episodes, 2 steps in 1.0s (1 episodes/s, 2 steps/s); all in ClickHouse after 2.0s\n" +
				"3 episodes, 40 steps in 3.5s (1 episodes/s, 11 steps/s); all in ClickHouse after 4.0s\n",
			want: summary{Episodes: 3, Steps: 40, RunSeconds: 3.5, PersistedSeconds: 4},
		},
		{
			name:    "run stopped before the summary",
			out:     "run r1: 5 episodes of shop\ngauntlet: stopped following run r1\n",
			wantErr: errNoSummary,
		},
		{
			name: "zero persist time",
			out:  "3 episodes, 40 steps in 0.0s (0 episodes/s, 0 steps/s); all in ClickHouse after 0.0s\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSummary([]byte(tc.out))
			if tc.wantErr != nil || tc.want == (summary{}) {
				if err == nil {
					t.Fatalf("parseSummary = %+v, want an error", got)
				}
				if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
					t.Fatalf("error %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("parseSummary = %+v, want %+v", got, tc.want)
			}
		})
	}
	s := summary{Steps: 1000, PersistedSeconds: 4}
	if got := s.PersistedStepsPerSec(); got != 250 {
		t.Fatalf("PersistedStepsPerSec = %v, want 250", got)
	}
}

func TestParseStatusKB(t *testing.T) {
	status := []byte("Name:\tgauntlet\nUmask:\t0022\nState:\tS (sleeping)\nVmPeak:\t 2349288 kB\nVmRSS:\t  812344 kB\nRssAnon:\t  790000 kB\nThreads:\t14\n")
	for _, tc := range []struct {
		key     string
		want    int64
		wantErr bool
	}{
		{key: "VmRSS", want: 812344},
		{key: "VmPeak", want: 2349288},
		{key: "Threads", wantErr: true}, // no unit
		{key: "VmSwap", wantErr: true},  // absent (as in a zombie's status)
	} {
		t.Run(tc.key, func(t *testing.T) {
			got, err := parseStatusKB(status, tc.key)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("parseStatusKB(%s) = %d, want an error", tc.key, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseStatusKB(%s) = %d, %v; want %d", tc.key, got, err, tc.want)
			}
		})
	}
}

func TestParseProcFiles(t *testing.T) {
	l, err := parseLoadAvg([]byte("1.77 2.62 3.01 2/311 17834\n"))
	if err != nil || l != (loadAvg{1.77, 2.62, 3.01}) {
		t.Fatalf("parseLoadAvg = %+v, %v", l, err)
	}
	if _, err := parseLoadAvg([]byte("1.0")); err == nil {
		t.Fatal("parseLoadAvg of a short line: want an error")
	}
	// A command name with spaces and a parenthesis must not shift the fields.
	stat := []byte("4242 (gauntlet (x) y) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 230 0 0 20 0 14 0 5000 2000000 3000 18446744073709551615")
	ticks, err := parseProcStatTicks(stat)
	if err != nil || ticks != 1730 {
		t.Fatalf("parseProcStatTicks = %d, %v; want 1730", ticks, err)
	}
	cpu, err := parseCPUTicks([]byte("cpu  100 5 50 1000 20 3 2 1 0 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n"))
	if err != nil || cpu != (cpuTicks{Busy: 161, Idle: 1020}) {
		t.Fatalf("parseCPUTicks = %+v, %v", cpu, err)
	}
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(tc.in); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestRSSAt(t *testing.T) {
	series := []rssSample{{0, 100, 0}, {1, 200, 0}, {2, 300, 0}, {3, 250, 0}, {4, 260, 0}}
	got := rssAt(series, []float64{0.25, 0.5, 0.75, 1})
	want := []int64{200, 300, 250, 260}
	for i := range want {
		if got[i].RSSKB != want[i] {
			t.Fatalf("rssAt = %+v, want RSS %v", got, want)
		}
	}
	if p := peakRSS(series); p != 300 {
		t.Fatalf("peakRSS = %d, want 300", p)
	}
	if got := rssAt(nil, []float64{0.5}); got[0] != (rssSample{}) {
		t.Fatalf("rssAt(nil) = %+v", got)
	}
}

// The summary's CPU per step is each round's cores × seconds over its steps (or step
// rows), medians over the rounds.
func TestSummarizeCPUPerStep(t *testing.T) {
	mk := func(childCores, chCores float64, steps uint64, ceilCH, ceilHarness float64) round {
		r := round{Ratio: 0.5}
		r.Pipeline.Steps = steps
		r.Pipeline.Window = window{Seconds: 20, ChildCores: childCores, CHCores: chCores}
		r.Ceiling.StepRows = 500_000
		r.Ceiling.Window = window{Seconds: 8, CHCores: ceilCH, HarnessCores: ceilHarness}
		return r
	}
	s := summarize([]round{
		mk(1.2, 0.6, 600_000, 0.9, 0.5), // 40 + 20 µs; 14.4 + 8 µs
		mk(1.3, 0.5, 650_000, 1.0, 0.4), // 40 + 15.4; 16 + 6.4
		mk(1.5, 0.5, 600_000, 0.8, 0.5), // 50 + 16.7; 12.8 + 8
	})
	for _, c := range []struct {
		name      string
		got, want float64
	}{
		{"gauntlet µs per step", s.MedianGauntletUsPerStep, 40},
		{"ClickHouse µs per step", s.MedianClickHouseUsPerStep, 0.5 * 20 / 600_000 * 1e6},
		{"ceiling µs per row", s.MedianCeilingUsPerRow, 22.4},
		// 40/22.4, 40/22.4 (= 40 / (16 + 6.4)), 50/20.8: per round, then the median.
		{"gauntlet per ceiling row", s.MedianGauntletPerCeilingRow, 40 / 22.4},
	} {
		if math.Abs(c.got-c.want) > 1e-9 {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if g, ch := (pipelineResult{}).cpuPerStep(); g != 0 || ch != 0 {
		t.Errorf("a run of no steps: %v and %v µs per step, want 0", g, ch)
	}
}
