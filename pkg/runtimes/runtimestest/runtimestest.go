// Package runtimestest gives tests a real sandbox runtime by name: a state directory in
// t.TempDir(), and for containerd a private daemon (package ctrdtest, the launcher
// scripts/containerd.sh uses) and the in-sandbox agent built once per test binary. When
// the runtime cannot run on this machine the test fails saying why; it never skips.
package runtimestest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/images/imagestest"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
)

var agent struct {
	once sync.Once
	path string
	err  error
}

// AgentBinary builds the containerd agent once per test binary, for tests that open a
// containerd runtime themselves. It outlives single tests, so it lives at one path
// shared by every test binary, $TMPDIR/gauntlet-test-agent/gauntlet-agent, each build
// renamed over the last (atomically: a sandbox starting meanwhile gets one whole
// binary or the other, built from the same source). A directory per test binary was
// never removed and left 5 MB behind for each one.
func AgentBinary(t testing.TB) string {
	t.Helper()
	agent.once.Do(func() {
		shared := filepath.Join(os.TempDir(), "gauntlet-test-agent")
		if agent.err = os.MkdirAll(shared, 0o755); agent.err != nil {
			return
		}
		build, err := os.MkdirTemp(shared, "build")
		if err != nil {
			agent.err = err
			return
		}
		defer os.RemoveAll(build)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		built, err := ctrd.BuildAgent(ctx, build)
		if err != nil {
			agent.err = err
			return
		}
		agent.path = filepath.Join(shared, "gauntlet-agent")
		if err := os.Rename(built, agent.path); err != nil {
			agent.err = fmt.Errorf("install the test agent: %w", err)
		}
	})
	if agent.err != nil {
		t.Fatalf("runtimestest: %v", agent.err)
	}
	return agent.path
}

// Config returns a runtimes.Config for the named runtime ("process", "containerd") whose
// state lives in t.TempDir(); for containerd it starts the daemon for the test. The
// in-repo dataset's allowed host (taskstest.ReleasesHost) is served on the loopback for
// the test, over HTTP and HTTPS (port 443), and mapped in Hosts, so any episode drawn from
// the dataset can be played.
func Config(t testing.TB, name string) runtimes.Config {
	t.Helper()
	dir := t.TempDir()
	// The process runtime's sandbox user (not root) must reach its workspace below the
	// state directory; t.TempDir makes the directory and its parent 0700.
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatalf("runtimestest: %v", err)
		}
	}
	remote := httptest.NewServer(taskstest.ReleasesHandler())
	t.Cleanup(remote.Close)
	secure := httptest.NewTLSServer(taskstest.ReleasesHandler()) // its certificate names example.com
	t.Cleanup(secure.Close)
	c := runtimes.Config{Runtime: name, StateDir: dir, Hosts: runtimes.HostsFlag{
		taskstest.ReleasesHost:          remote.Listener.Addr().String(),
		taskstest.ReleasesHost + ":443": secure.Listener.Addr().String(),
	}}
	if name == runtimes.Containerd {
		c.Containerd = ctrdtest.Start(t).Address()
		c.AgentBinary = AgentBinary(t)
	}
	return c
}

// Open opens the named runtime for the test (with a warm pool of poolSize sandboxes per
// template) and closes it at the end. Every sandbox the test leaves behind is destroyed
// first.
func Open(t testing.TB, name string, poolSize int) env.Sandboxes {
	t.Helper()
	c := Config(t, name)
	c.PoolSize = poolSize
	return OpenConfig(t, c)
}

// OpenConfig opens the runtime c configures (from Config, changed by the test) and
// closes it at the end, as Open does.
func OpenConfig(t testing.TB, c runtimes.Config) env.Sandboxes {
	t.Helper()
	name := c.Runtime
	sb, err := runtimes.Open(context.Background(), c, nil)
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

// Images starts a local registry serving gauntlet's Debian base image (package
// imagestest) for the test and returns the image configuration under which a runtime
// builds task images through it, their FROM debian:... lines included (the registry is
// the Docker Hub mirror). The builder's storage is the test's.
func Images(t testing.TB) runtimes.ImagesConfig {
	t.Helper()
	reg := imagestest.Registry(t)
	return runtimes.ImagesConfig{Registry: reg.Addr(), DockerHubMirror: reg.Addr(), CacheDir: t.TempDir()}
}
