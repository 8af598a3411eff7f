package chtest

import (
	"context"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
)

// Start starts a ClickHouse server in t.TempDir() on free ports and registers its
// cleanup. It calls t.Fatal with the reason when the server cannot start. The server
// logs to t.Log only on warnings, so passing tests stay quiet.
func Start(t testing.TB) *chlocal.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*chlocal.DefaultStartTimeout)
	defer cancel()
	srv, err := chlocal.Start(ctx, chlocal.Options{
		Dir:    t.TempDir(),
		Logger: childproctest.Logger(t),
	})
	if err != nil {
		t.Fatalf("chtest: %v", err)
	}
	// Registered after TempDir's cleanup, so it runs first: the server is gone before
	// its directory is removed. Kill, not Stop: the data is thrown away anyway and a
	// clean shutdown of 18.16 costs seconds per test (docs/benchmarks.md, Costs the code
	// cites, Local servers).
	t.Cleanup(func() {
		if err := srv.Kill(); err != nil {
			t.Errorf("chtest: %v", err)
		}
	})
	return srv
}
