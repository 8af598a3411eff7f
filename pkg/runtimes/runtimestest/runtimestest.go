// Package runtimestest gives tests a real sandbox runtime by name: a state directory in
// t.TempDir(), and for containerd a daemon and base image started by the project's own
// code. When the runtime cannot run on this machine the test fails saying why; it never
// skips.
package runtimestest

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
)

// Config returns a runtimes.Config for the named runtime ("process", "containerd") whose
// state lives in t.TempDir().
func Config(t testing.TB, name string) runtimes.Config {
	t.Helper()
	dir := t.TempDir()
	// The sandbox user (not root) must reach its workspace below the state directory;
	// t.TempDir makes the directory and its parent 0700.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatalf("runtimestest: %v", err)
		}
	}
	return runtimes.Config{Runtime: name, StateDir: dir}
}

// Open opens the named runtime for the test and closes it at the end. Every sandbox the
// test leaves behind is destroyed first.
func Open(t testing.TB, name string) env.Sandboxes {
	t.Helper()
	sb, err := runtimes.Open(context.Background(), Config(t, name), nil)
	if err != nil {
		t.Fatalf("runtimestest: open %s runtime: %v", name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		rt := sb.Runtime()
		if hs, err := rt.List(ctx); err == nil {
			for _, h := range hs {
				_ = rt.Destroy(ctx, h.ID)
			}
		}
		if err := sb.Close(); err != nil {
			t.Errorf("runtimestest: close %s runtime: %v", name, err)
		}
	})
	return sb
}
