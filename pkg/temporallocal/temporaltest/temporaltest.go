package temporaltest

import (
	"context"
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*temporallocal.DefaultStartTimeout)
	defer cancel()
	srv, err := temporallocal.Start(ctx, temporallocal.Options{
		Dir:    dir,
		NoUI:   true,
		Logger: childproctest.Logger(t),
	})
	if err != nil {
		t.Fatalf("temporaltest: %v", err)
	}
	// Registered after TempDir's cleanup, so it runs first. Kill: the data is thrown
	// away anyway.
	t.Cleanup(func() {
		if err := srv.Kill(); err != nil {
			t.Errorf("temporaltest: %v", err)
		}
	})
	return srv
}
