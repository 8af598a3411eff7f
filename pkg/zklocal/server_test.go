package zklocal_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/zklocal"
)

// TestStartKillRestart starts a server, kills it as a crash would and brings it back on
// the same port: what chlocal's replicated mode does to its coordinator in tests.
func TestStartKillRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ZooKeeper; -short runs unit tests only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	began := time.Now()
	srv, err := zklocal.Start(ctx, zklocal.Options{Dir: t.TempDir(), Logger: childproctest.Logger(t)})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	defer srv.Kill()
	t.Logf("ready after %v, rss %d KiB", time.Since(began), rssKiB(srv.Pid()))
	if err := zklocal.Ping(ctx, srv.Addr()); err != nil {
		t.Fatalf("ping: %v", err)
	}
	addr := srv.Addr()
	if err := srv.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := zklocal.Ping(ctx, addr); err == nil {
		t.Fatal("a killed server still answers")
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	if srv.Addr() != addr {
		t.Fatalf("restart moved the server from %s to %s", addr, srv.Addr())
	}
	if err := zklocal.Ping(ctx, addr); err != nil {
		t.Fatalf("ping after restart: %v", err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatalf("stop: %v", err)
	}
}

// rssKiB reads the VmRSS line of /proc/pid/status, -1 when it cannot.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}
