package main

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/splitlocal"
)

// Bad chaos flags are refused naming the flag; no seed means no chaos, whatever the rest.
func TestChaosFlagsNameTheirError(t *testing.T) {
	for _, tc := range []struct {
		flags chaosFlags
		want  string
	}{
		{chaosFlags{seed: 1, rounds: 0, maxWait: time.Second}, "--chaos.rounds 0"},
		{chaosFlags{seed: 1, rounds: 1, minWait: -time.Second}, "--chaos.min-wait -1s"},
		{chaosFlags{seed: 1, rounds: 1, minWait: 2 * time.Second, maxWait: time.Second}, "--chaos.max-wait 1s"},
	} {
		err := tc.flags.validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error naming %q", tc.flags, err, tc.want)
		}
	}
	if err := (chaosFlags{rounds: -1}).validate(); err != nil {
		t.Errorf("no seed: %v, want no error", err)
	}
}

// split status sums up chaos.jsonl: how many faults, how many did not come back, the last.
func TestChaosSummary(t *testing.T) {
	dir := t.TempDir()
	if got := chaosSummary(dir); got != "" {
		t.Fatalf("no chaos file: %q, want nothing", got)
	}
	at := time.Date(2026, 12, 2, 3, 4, 5, 0, time.UTC)
	var lines []string
	for _, ev := range []splitlocal.ChaosEvent{
		{Fault: splitlocal.Fault{Kind: splitlocal.KillWorker}, Victim: "worker-2", At: at, Recovered: 1500 * time.Millisecond},
		{Fault: splitlocal.Fault{Kind: splitlocal.KillNATSNode}, Victim: "nats-n1", At: at.Add(time.Minute), Err: "not back after 3m0s"},
	} {
		b, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		lines = append(lines, string(b))
	}
	if err := os.WriteFile(chaosLogPath(dir), []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := "chaos: 2 faults, 1 not recovered; last nats nats-n1 at 03:05:05 (not back after 3m0s)"
	if got := chaosSummary(dir); got != want {
		t.Errorf("summary %q, want %q", got, want)
	}
}
