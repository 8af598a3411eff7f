package curriculum

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal/temporaltest"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

func TestStartingNamesAnUnreachableServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	s := New(Config{Address: func() string { return addr }, Namespace: "default"}, func() *bus.Bus { return nil }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = s.Starting(ctx)
	if err == nil || !strings.Contains(err.Error(), "dial temporal at "+addr) {
		t.Fatalf("error %v; want one naming %s", err, addr)
	}
}

// The service's worker serves gauntlet's task queue while it runs: a curriculum started
// there is executed by it (here one with a spec the workflow refuses, so it ends at once
// with the spec's error, which only the workflow's own code produces). Cancelling Running
// stops the worker within its stop timeout.
func TestWorkerRunsAndStops(t *testing.T) {
	srv := temporaltest.Start(t)
	s := New(Config{Address: srv.Addr, Namespace: "default", StopTimeout: time.Second}, func() *bus.Bus { return nil }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Running(rctx) }()

	c, err := client.DialContext(ctx, client.Options{HostPort: srv.Addr(), Namespace: "default"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "refused-spec", TaskQueue: workflows.TaskQueue},
		workflows.WorkflowCurriculum, json.RawMessage(`{"stages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	err = run.Get(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "stages") {
		t.Fatalf("curriculum with no stages ended with %v; want the workflow's refusal naming stages", err)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Running did not return 10 s after its context was cancelled (stop timeout 1 s)")
	}
	if err := s.Stopping(ctx); err != nil {
		t.Fatal(err)
	}
}
