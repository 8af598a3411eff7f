package chtest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
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
