package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// readyStatus is GET /ready's status code and body.
func readyStatus(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/ready")
	if err != nil {
		t.Fatalf("GET /ready: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// moduleStates is GET /modules.
func moduleStates(t *testing.T, addr string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/modules")
	if err != nil {
		t.Fatalf("GET /modules: %v", err)
	}
	defer resp.Body.Close()
	var st map[string]string
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("GET /modules: %v", err)
	}
	return st
}

// childRestarts is gauntlet_child_restarts_total{child} as GET /metrics reports it, -1
// when absent.
func childRestarts(t *testing.T, addr, child string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "gauntlet_child_restarts_total{") && strings.Contains(line, `child="`+child+`"`) {
			n, err := strconv.Atoi(line[strings.LastIndexByte(line, ' ')+1:])
			if err != nil {
				t.Fatalf("/metrics line %q: %v", line, err)
			}
			return n
		}
	}
	return -1
}

// awaitReady polls GET /ready until its status is code, for at most bound, and returns
// the body.
func awaitReady(t *testing.T, addr string, code int, bound time.Duration, what string) string {
	t.Helper()
	return awaitReadySaying(t, addr, code, "", bound, what)
}

// awaitReadySaying is awaitReady for an answer whose body also contains want. Between a
// child's death and its supervisor noticing it (milliseconds), /ready is already red but
// says only that the child is not running; the reason follows.
func awaitReadySaying(t *testing.T, addr string, code int, want string, bound time.Duration, what string) string {
	t.Helper()
	deadline := time.Now().Add(bound)
	for {
		got, body := readyStatus(t, addr)
		if got == code && strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("/ready still %d %q %v after %s", got, body, bound, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// The local ClickHouse of a running stack killed with SIGKILL, as the OOM killer would:
// /ready turns red naming it, the stack brings it back by itself, /ready turns green
// again, and the run in flight completes with every episode in ClickHouse.
func TestKilledClickHouseIsRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := startStack(t, cfg)
	if code, body := readyStatus(t, cfg.HTTPAddr); code != http.StatusOK {
		t.Fatalf("/ready of a fresh stack: %d %s", code, body)
	}
	ch := s.app.ch
	conn := connect(t, ch.Addr(), cfg.Database)
	req := newRun(t, 1500, "oracle=1", 13)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ctx, unguard := guardStall(ctx, t, s.app.getBus(), req.RunId)
	defer unguard()
	done := make(chan *gauntletv1.RunProgress, 1)
	go func() {
		p, err := follow(ctx, s.app.getBus(), req, io.Discard)
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	waitFor(ctx, t, func() bool {
		eps, _, _ := trajectory.RunCounts(ctx, conn, cfg.Database, req.RunId)
		return eps > 100
	})
	pid := ch.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}

	// Red within seconds, naming ClickHouse, on /ready and /modules alike.
	awaitReadySaying(t, cfg.HTTPAddr, http.StatusServiceUnavailable,
		"clickhouse is not ready: clickhouse exited unexpectedly", 30*time.Second, "ClickHouse was killed")
	// The restart takes more than the backoff's first 500 ms: still down.
	if st := moduleStates(t, cfg.HTTPAddr); st["clickhouse"] != "unready" {
		t.Errorf("/modules with ClickHouse down: %v", st)
	}
	// Green again without any manual step, on a new ClickHouse process.
	awaitReady(t, cfg.HTTPAddr, http.StatusOK, 2*time.Minute, "ClickHouse was killed")
	if p := ch.Pid(); p == 0 || p == pid {
		t.Fatalf("ClickHouse pid after the restart is %d (killed: %d)", p, pid)
	}
	if n := childRestarts(t, cfg.HTTPAddr, "clickhouse"); n != 1 {
		t.Errorf("gauntlet_child_restarts_total{child=\"clickhouse\"} = %d, want 1", n)
	}

	final := <-done
	if final == nil {
		t.FailNow()
	}
	conn2 := connect(t, ch.Addr(), cfg.Database)
	if err := waitPersisted(ctx, s.app.getBus(), conn2, cfg.Database, req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		failStalled(t, ctx, err, missingEpisodes(conn2, cfg.Database, req.RunId, req.Episodes))
	}
	assertExact(t, s.app.getBus(), conn2, cfg.Database, req, final)
}

// The local Temporal dev server killed with SIGKILL: the stack no longer stops over it
// but restarts it, /ready red naming temporal meanwhile, green once it answers again.
func TestKilledTemporalIsRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Temporal CLI; run without -short")
	}
	cfg := testConfig(t)
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := startStack(t, cfg, modHTTP, modTemporal)
	awaitReady(t, cfg.HTTPAddr, http.StatusOK, 0, "the start")
	pid := s.app.temporal.Pid()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	awaitReadySaying(t, cfg.HTTPAddr, http.StatusServiceUnavailable,
		"temporal is not ready: temporal exited unexpectedly", 30*time.Second, "Temporal was killed")
	awaitReady(t, cfg.HTTPAddr, http.StatusOK, 2*time.Minute, "Temporal was killed")
	if p := s.app.temporal.Pid(); p == 0 || p == pid {
		t.Fatalf("Temporal pid after the restart is %d (killed: %d)", p, pid)
	}
	if n := childRestarts(t, cfg.HTTPAddr, "temporal"); n != 1 {
		t.Errorf("gauntlet_child_restarts_total{child=\"temporal\"} = %d, want 1", n)
	}
	if st := moduleStates(t, cfg.HTTPAddr); st["temporal"] != "running" {
		t.Errorf("/modules once Temporal is back: %v", st)
	}
}

// An external ClickHouse (--clickhouse) that stops answering: /ready turns red naming it
// and its address, as for the local one, and green again once it answers.
func TestUnreachableExternalClickHouseIsNotReady(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	ext := chtest.Start(t)
	cfg := testConfig(t)
	cfg.ClickHouse = ext.Addr()
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startStack(t, cfg)
	if code, body := readyStatus(t, cfg.HTTPAddr); code != http.StatusOK {
		t.Fatalf("/ready with the external ClickHouse up: %d %s", code, body)
	}
	if err := ext.Kill(); err != nil {
		t.Fatal(err)
	}
	awaitReadySaying(t, cfg.HTTPAddr, http.StatusServiceUnavailable,
		"clickhouse is not ready: clickhouse at "+ext.Addr()+" does not answer", 30*time.Second, "the external ClickHouse was killed")
	if st := moduleStates(t, cfg.HTTPAddr); st["clickhouse"] != "unready" {
		t.Errorf("/modules with the external ClickHouse down: %v", st)
	}
	if err := ext.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	awaitReady(t, cfg.HTTPAddr, http.StatusOK, time.Minute, "the external ClickHouse came back")
}

// The local ClickHouse frozen with SIGSTOP, as a hung server: alive, its port open, but
// nothing answers. /ready turns red naming it, and the stack kills and restarts it by
// itself within the supervisor's bound.
func TestHungClickHouseIsRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := startStack(t, cfg)
	ch := s.app.ch
	pid := ch.Pid()
	if err := ch.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // if it is still there
	bound := childproc.DefaultBackoff.HungAfter + 3*childproc.DefaultBackoff.ProbeEvery
	awaitReadySaying(t, cfg.HTTPAddr, http.StatusServiceUnavailable,
		"clickhouse is not ready: clickhouse does not answer", bound, "ClickHouse was frozen")
	awaitReady(t, cfg.HTTPAddr, http.StatusOK, bound+2*time.Minute, "ClickHouse was frozen")
	if p := ch.Pid(); p == 0 || p == pid {
		t.Fatalf("ClickHouse pid after the restart is %d (frozen: %d)", p, pid)
	}
	if n := childRestarts(t, cfg.HTTPAddr, "clickhouse"); n != 1 {
		t.Errorf("gauntlet_child_restarts_total{child=\"clickhouse\"} = %d, want 1", n)
	}
}
