package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A fork's new steps are matched against the stack's threat fingerprints, as a worker's
// steps are: once a fingerprint of the action the oracle takes first after the fork is
// known, forking again flags that step (and prints the flag); the replayed steps are not.
func TestForkStepsMatchThreatFingerprints(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	cfg.NATSPort = freePort(t) // the fork connects from outside
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	req := newRun(t, 8, "random=1", 5)
	req.Profiles = []*gauntletv1.Share{{Name: "baseline", Weight: 1}}
	runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	ep := queryOne(t, conn, fmt.Sprintf(`SELECT min(episode_id) FROM %s.episodes FINAL WHERE run_id = '%s' AND steps >= 3`, cfg.Database, req.RunId))
	fork := func() string {
		t.Helper()
		var stdout, stderr bytes.Buffer
		args := []string{"episode", "fork", ep, "--step", "2", "--policy", "oracle",
			"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--nats", s.app.natsURL(), "--data-dir", t.TempDir()}
		if err := runMain(context.Background(), args, &stdout, &stderr); err != nil {
			t.Fatalf("%v: %v\n%s%s", args, err, stdout.String(), stderr.String())
		}
		if strings.Contains(stderr.String(), "not matched against threat fingerprints") {
			t.Fatalf("the fork did not watch the stack's fingerprints: %s", stderr.String())
		}
		return stdout.String()
	}
	before := fork()
	if strings.Contains(before, "flagged:") {
		t.Fatalf("a fork flagged with no fingerprint known:\n%s", before)
	}
	// The first forked step's action, as the fork printed it.
	m := regexp.MustCompile(`(?m)^  step 2  (\S+) (\{.*\})$`).FindStringSubmatch(before)
	if m == nil {
		t.Fatalf("no step 2 in the fork's output:\n%s", before)
	}
	f, ok := threats.Make(m[1], []byte(m[2]), []string{"syscall_denied: ptrace refused with EPERM"})
	if !ok {
		t.Fatalf("no fingerprint of %s %s", m[1], m[2])
	}
	w := threats.NewWatcher(s.app.getBus().JS, noop.NewMeterProvider().Meter("test"), "test", slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	go w.Run(ctx)
	w.Record(f)
	if err := w.WaitFor(ctx, f.ID); err != nil {
		t.Fatal(err)
	}
	after := fork()
	if n := strings.Count(after, "flagged: threat_fingerprint: "+f.ID); n < 1 {
		t.Errorf("the fork's step 2 was not flagged by fingerprint %s:\n%s", f.ID, after)
	}
}
