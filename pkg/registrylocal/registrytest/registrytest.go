// Package registrytest starts a private docker-registry for one test through
// [registrylocal], with its storage in the test's temporary directory, and stops it
// when the test ends. A test that cannot start the registry fails with the reason; it
// never skips.
package registrytest

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal"
)

// Start starts a registry on a free loopback port with its storage under t.TempDir
// and registers its stop. It calls t.Fatal with the reason when the registry cannot
// start.
func Start(t testing.TB) *registrylocal.Server {
	t.Helper()
	return start(t, registrylocal.Options{Dir: t.TempDir()})
}

// StartWithAuth is Start for a registry that asks for basic auth and accepts only
// user with password, as a private registry does.
func StartWithAuth(t testing.TB, user, password string) *registrylocal.Server {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	htpasswd := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(htpasswd, []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatalf("registrytest: %v", err)
	}
	return start(t, registrylocal.Options{Dir: t.TempDir(), Htpasswd: htpasswd})
}

func start(t testing.TB, opts registrylocal.Options) *registrylocal.Server {
	t.Helper()
	return childproctest.Start(t, "registrytest", 2*registrylocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*registrylocal.Server, error) {
			opts.Logger = log
			return registrylocal.Start(ctx, opts)
		},
		func(srv *registrylocal.Server) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return srv.Stop(ctx)
		})
}
