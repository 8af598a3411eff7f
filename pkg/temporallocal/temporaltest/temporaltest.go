package temporaltest

import (
	"context"
	"log/slog"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
)

// Start starts a headless Temporal dev server with its database in t.TempDir() on free
// ports and kills it when the test ends. It calls t.Fatal with the reason when the server
// cannot start.
func Start(t testing.TB) *temporallocal.Server {
	t.Helper()
	return StartIn(t, t.TempDir())
}

// StartIn is Start with the database under dir, so a test can restart a server on the
// same data.
func StartIn(t testing.TB, dir string) *temporallocal.Server {
	t.Helper()
	// Kill: the data is thrown away anyway.
	return childproctest.Start(t, "temporaltest", 2*temporallocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*temporallocal.Server, error) {
			return temporallocal.Start(ctx, temporallocal.Options{Dir: dir, NoUI: true, Logger: log})
		},
		(*temporallocal.Server).Kill)
}
