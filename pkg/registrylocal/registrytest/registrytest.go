// Package registrytest starts a private docker-registry for one test through
// [registrylocal], with its storage in the test's temporary directory, and stops it
// when the test ends. A test that cannot start the registry fails with the reason; it
// never skips.
package registrytest

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal"
)

// Start starts a registry on a free loopback port with its storage under t.TempDir
// and registers its stop. It calls t.Fatal with the reason when the registry cannot
// start.
func Start(t testing.TB) *registrylocal.Server {
	t.Helper()
	dir := t.TempDir()
	return childproctest.Start(t, "registrytest", 2*registrylocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*registrylocal.Server, error) {
			return registrylocal.Start(ctx, registrylocal.Options{Dir: dir, Logger: log})
		},
		func(srv *registrylocal.Server) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return srv.Stop(ctx)
		})
}
