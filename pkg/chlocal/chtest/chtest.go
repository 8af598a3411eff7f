package chtest

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/zklocal"
	"github.com/gauntlet-rl/gauntlet/pkg/zklocal/zktest"
)

// Start starts a ClickHouse server in t.TempDir() on free ports and registers its
// cleanup. It calls t.Fatal with the reason when the server cannot start. The server
// logs to t.Log only on warnings, so passing tests stay quiet.
func Start(t testing.TB) *chlocal.Server {
	t.Helper()
	dir := t.TempDir()
	// Kill, not Stop: the data is thrown away anyway and a clean shutdown of 18.16 costs
	// seconds per test (docs/benchmarks.md, Costs the code cites, Local servers).
	return childproctest.Start(t, "chtest", 2*chlocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*chlocal.Server, error) {
			return chlocal.Start(ctx, chlocal.Options{Dir: dir, Logger: log})
		},
		(*chlocal.Server).Kill)
}

// StartCluster starts a ZooKeeper and a one-shard ClickHouse cluster of two replicas
// on it (chlocal.StartCluster), all in t.TempDir() on free ports, and registers their
// cleanup. It calls t.Fatal with the reason when any of them cannot start: a machine
// without ZooKeeper fails the test, saying to run scripts/deps.sh.
func StartCluster(t testing.TB) (*zklocal.Server, []*chlocal.Server) {
	t.Helper()
	zk := zktest.Start(t)
	dir := t.TempDir()
	servers := childproctest.Start(t, "chtest cluster", 4*chlocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) ([]*chlocal.Server, error) {
			return chlocal.StartCluster(ctx, chlocal.ClusterOptions{Dir: dir, ZooKeeper: []string{zk.Addr()}, Logger: log})
		},
		func(servers []*chlocal.Server) error {
			var errs []error
			for _, s := range servers {
				errs = append(errs, s.Kill())
			}
			return errors.Join(errs...)
		})
	return zk, servers
}
