package chlocal_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
)

func connect(t testing.TB, addr string) driver.Conn {
	t.Helper()
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{addr},
		DialTimeout: time.Second,
		ReadTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func countRows(ctx context.Context, conn driver.Conn) (uint64, error) {
	var n uint64
	err := conn.QueryRow(ctx, "SELECT count() FROM default.t").Scan(&n)
	return n, err
}

func start(t *testing.T, opts chlocal.Options) *chlocal.Server {
	t.Helper()
	srv, err := chlocal.Start(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Kill() })
	return srv
}

func TestStartAnswersAndStops(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	dir := t.TempDir()
	begin := time.Now()
	srv := start(t, chlocal.Options{Dir: dir})
	t.Logf("clickhouse ready in %v at %s", time.Since(begin), srv.Addr())

	var version string
	if err := connect(t, srv.Addr()).QueryRow(context.Background(), "SELECT version()").Scan(&version); err != nil {
		t.Fatalf("query version: %v", err)
	}
	t.Logf("clickhouse version %s", version)
	if srv.Pid() == 0 {
		t.Error("Pid() = 0 for a running server")
	}
	if _, err := os.Stat(filepath.Join(dir, "clickhouse.pid")); err != nil {
		t.Errorf("pid file: %v", err)
	}
	for _, f := range []string{"config.xml", "users.xml", "data"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("%s not under Dir: %v", f, err)
		}
	}

	begin = time.Now()
	if err := srv.Stop(context.Background()); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("clickhouse stopped in %v", time.Since(begin))
	select {
	case <-srv.Done():
	default:
		t.Fatal("Done not closed after Stop")
	}
	if err := srv.Wait(); err != nil {
		t.Errorf("exit status after Stop: %v", err)
	}
	if srv.Pid() != 0 {
		t.Error("Pid() != 0 after Stop")
	}
	if _, err := os.Stat(filepath.Join(dir, "clickhouse.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pid file after Stop: %v", err)
	}
	if err := srv.Stop(context.Background()); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestKillRestartKeepsDataAndPort is the outage a store test needs: ClickHouse dies
// like a crash, clients fail, and it comes back at the same address with its data.
func TestKillRestartKeepsDataAndPort(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	ctx := context.Background()
	srv := chtest.Start(t)
	addr := srv.Addr()
	conn := connect(t, addr)
	if err := conn.Exec(ctx, "CREATE TABLE default.t (x UInt64) ENGINE = MergeTree() ORDER BY x"); err != nil {
		t.Fatal(err)
	}
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO default.t (x)")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if err := batch.Append(uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}

	if err := srv.Kill(); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if _, err := countRows(ctx, connect(t, addr)); err == nil {
		t.Fatal("query succeeded against a killed server")
	}

	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart: %v", err)
	}
	if srv.Addr() != addr {
		t.Fatalf("Addr after Restart = %s, want %s", srv.Addr(), addr)
	}
	n, err := countRows(ctx, connect(t, addr))
	if err != nil {
		t.Fatalf("count after Restart: %v", err)
	}
	if n != 1000 {
		t.Fatalf("rows after Restart = %d, want 1000", n)
	}
	// Restart of a running server is a stop and a start.
	if err := srv.Restart(ctx); err != nil {
		t.Fatalf("Restart of a running server: %v", err)
	}
	if n, err := countRows(ctx, connect(t, addr)); err != nil || n != 1000 {
		t.Fatalf("count after second Restart = %d, %v", n, err)
	}
}

func TestPauseResume(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	ctx := context.Background()
	srv := chtest.Start(t)
	if err := srv.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := connect(t, srv.Addr()).Ping(short); err == nil {
		t.Fatal("ping answered by a paused server")
	}
	if err := srv.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := connect(t, srv.Addr()).Ping(ctx); err != nil {
		t.Fatalf("ping after Resume: %v", err)
	}
	// A paused server still stops.
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Stop(ctx); err != nil {
		t.Fatalf("Stop of a paused server: %v", err)
	}
}

// TestStartKillsLeftover covers a crashed run: its server still runs on the Dir, and
// the next Start on that Dir must replace it rather than fail on ClickHouse's lock.
func TestStartKillsLeftover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	dir := t.TempDir()
	old := start(t, chlocal.Options{Dir: dir})
	oldPid := old.Pid()

	srv := start(t, chlocal.Options{Dir: dir})
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("leftover pid %d still running after a new Start on its Dir", oldPid)
	}
	if err := connect(t, srv.Addr()).Ping(context.Background()); err != nil {
		t.Fatalf("ping new server: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "clickhouse.pid"))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(srv.Pid()) {
		t.Fatalf("pid file = %q, %v; want %d", b, err, srv.Pid())
	}
}

func TestStartErrors(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a local server; -short runs unit tests only")
	}
	t.Run("missing binary", func(t *testing.T) {
		_, err := chlocal.Start(context.Background(), chlocal.Options{Dir: t.TempDir(), Binary: "/nonexistent/clickhouse-server"})
		if !errors.Is(err, chlocal.ErrNotInstalled) {
			t.Fatalf("err = %v, want ErrNotInstalled", err)
		}
		if !strings.Contains(err.Error(), "scripts/deps.sh") {
			t.Errorf("error does not say how to install: %v", err)
		}
	})
	t.Run("no dir", func(t *testing.T) {
		if _, err := chlocal.Start(context.Background(), chlocal.Options{}); err == nil {
			t.Fatal("Start without Dir succeeded")
		}
	})
	t.Run("port answered by another clickhouse", func(t *testing.T) {
		// Tests of several packages start servers at once; a port picked free can be
		// taken by another package's server before ours binds it. Ours then exits, and
		// its readiness probe must not take the other server's answer for its own.
		other := start(t, chlocal.Options{Dir: t.TempDir()})
		port, err := strconv.Atoi(other.Addr()[strings.LastIndex(other.Addr(), ":")+1:])
		if err != nil {
			t.Fatal(err)
		}
		srv, err := chlocal.Start(context.Background(), chlocal.Options{Dir: t.TempDir(), TCPPort: port})
		if err == nil {
			srv.Kill()
			t.Fatalf("Start on the port of another running server (%s) reported ready", other.Addr())
		}
		t.Logf("error as users see it:\n%v", err)
	})
	t.Run("port taken", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		port := l.Addr().(*net.TCPAddr).Port
		_, err = chlocal.Start(context.Background(), chlocal.Options{Dir: t.TempDir(), TCPPort: port})
		if err == nil {
			t.Fatal("Start on a taken port succeeded")
		}
		if !strings.Contains(err.Error(), "Address already in use") {
			t.Fatalf("error lacks the server's log tail: %v", err)
		}
		t.Logf("error as users see it:\n%v", err)
	})
}

// BenchmarkStart measures Start until ready plus Kill, on a fresh Dir each time.
func BenchmarkStart(b *testing.B) {
	for b.Loop() {
		srv, err := chlocal.Start(context.Background(), chlocal.Options{Dir: b.TempDir()})
		if err != nil {
			b.Fatal(err)
		}
		if err := srv.Kill(); err != nil {
			b.Fatal(err)
		}
	}
}
