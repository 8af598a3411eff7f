package ctrd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal/ctrdtest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

// agentBinary and abuseBinary are built once for the whole test binary.
var agentBinary, abuseBinary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gauntlet-agent")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	agentBinary, err = ctrd.BuildAgent(ctx, dir)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "build agent:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	abuseBinary = filepath.Join(dir, "abuse")
	cmd := exec.Command("go", "build", "-o", abuseBinary, "./testdata/abuse")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build abuse helper: %v: %s\n", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// open starts a runtime over stateDir against srv, failing t when it cannot.
func open(t testing.TB, srv *ctrdlocal.Server, stateDir string) *ctrd.Runtime {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt, err := ctrd.New(ctx, ctrd.Options{Address: srv.Address(), StateDir: stateDir, AgentBinary: agentBinary})
	if err != nil {
		t.Fatalf("open containerd runtime: %v", err)
	}
	return rt
}

// start is a containerd daemon and a runtime over a fresh state directory.
func start(t testing.TB) (*ctrdlocal.Server, *ctrd.Runtime) {
	t.Helper()
	srv := ctrdtest.Start(t)
	rt := open(t, srv, t.TempDir())
	t.Cleanup(func() { _ = rt.Close() })
	return srv, rt
}

func mustCreate(t testing.TB, rt *ctrd.Runtime, spec sandbox.Spec) sandbox.Handle {
	t.Helper()
	h, err := rt.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	t.Cleanup(func() { _ = rt.Destroy(context.Background(), h.ID) })
	return h
}
