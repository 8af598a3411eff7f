// Package zktest starts a throwaway local ZooKeeper for tests of other packages.
//
// Tests that need ZooKeeper (a replicated ClickHouse, pkg/chlocal/chtest.StartReplicated)
// call [Start] and get a running server with its data in the test's temporary
// directory; cleanup kills it when the test ends. A machine without ZooKeeper fails the
// test with the reason (run scripts/deps.sh), never skips it.
package zktest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/zklocal"
)

// Start starts a ZooKeeper server in t.TempDir() on a free port and registers its
// cleanup. It calls t.Fatal with the reason when the server cannot start.
func Start(t testing.TB) *zklocal.Server {
	t.Helper()
	dir := t.TempDir()
	return childproctest.Start(t, "zktest", 2*zklocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*zklocal.Server, error) {
			return zklocal.Start(ctx, zklocal.Options{Dir: dir, Logger: log})
		},
		(*zklocal.Server).Kill)
}
