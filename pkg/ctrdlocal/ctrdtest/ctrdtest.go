// Package ctrdtest starts a private containerd daemon for one test through
// [ctrdlocal], the same launcher scripts/containerd.sh uses, and tears it down when
// the test ends. A test that cannot start containerd fails with the reason; it never
// skips.
package ctrdtest

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
)

// RootTmpfsBytes is the size of the tmpfs that holds the test daemon's images and
// snapshots, so nothing a test container writes reaches the host's disk.
const RootTmpfsBytes = 1 << 30

// Start starts containerd under a fresh short temporary directory (unix socket
// paths are limited to 107 bytes, too short for t.TempDir under long test names)
// and registers its cleanup: every task and container is purged, the daemon stopped
// and the directory removed. It calls t.Fatal with the reason when the daemon cannot
// start.
func Start(t testing.TB) *ctrdlocal.Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "gctrd")
	if err != nil {
		t.Fatalf("ctrdtest: %v", err)
	}
	return childproctest.Start(t, "ctrdtest", 2*ctrdlocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*ctrdlocal.Server, error) {
			srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: dir, RootTmpfsBytes: RootTmpfsBytes, Logger: log})
			if err != nil {
				_ = os.RemoveAll(dir)
			}
			return srv, err
		},
		func(srv *ctrdlocal.Server) error {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			return errors.Join(srv.Purge(ctx), srv.Stop(ctx), os.RemoveAll(dir))
		})
}
