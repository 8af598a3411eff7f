package natstest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc/childproctest"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal"
)

// Start starts a cluster of n nodes in t.TempDir() on free ports and registers its
// cleanup.
func Start(t testing.TB, n int) *natslocal.Cluster {
	t.Helper()
	bin := Binary(t)
	dir := t.TempDir()
	return childproctest.Start(t, "natstest", 2*natslocal.DefaultStartTimeout,
		func(ctx context.Context, log *slog.Logger) (*natslocal.Cluster, error) {
			return natslocal.Start(ctx, natslocal.Options{Dir: dir, Nodes: n, Binary: bin, MaxFileStore: 1 << 30, Logger: log})
		},
		func(c *natslocal.Cluster) error {
			for i := range c.Nodes() {
				if err := c.Kill(i); err != nil {
					return err
				}
			}
			return nil
		})
}

// Binary returns the path of the server binary of the embedded version, building it with
// scripts/nats-server.sh on the first call of the test binary.
func Binary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a local NATS cluster; -short runs unit tests only")
	}
	binOnce.Do(func() { binPath, binErr = build() })
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

var (
	binOnce sync.Once
	binPath string
	binErr  error
)

// build runs scripts/nats-server.sh of the repository holding the working directory.
func build() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		script := filepath.Join(dir, "scripts", "nats-server.sh")
		if _, err := os.Stat(script); err == nil {
			out, err := exec.Command(script).Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				return "", fmt.Errorf("%s: %w: %s", script, err, stderr)
			}
			return strings.TrimSpace(string(out)), nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("build nats-server: no scripts/nats-server.sh above the working directory: %w", natslocal.ErrNotInstalled)
		}
		dir = parent
	}
}
