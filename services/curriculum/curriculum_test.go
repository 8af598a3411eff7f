package curriculum

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal/temporaltest"
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

func TestWorkerRunsAndStops(t *testing.T) {
	srv := temporaltest.Start(t)
	s := New(Config{Address: srv.Addr, Namespace: "default", StopTimeout: time.Second}, func() *bus.Bus { return nil }, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Running(rctx) }()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Stopping(ctx); err != nil {
		t.Fatal(err)
	}
}
