//go:build linux

package process_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// TestDensity is the density measurement of docs/benchmarks.md: GAUNTLET_DENSITY=N
// sandboxes made one by one, then destroyed, with create and destroy timed per bucket
// of GAUNTLET_DENSITY_STEP; GAUNTLET_DENSITY_LIVE=1 starts a command in each before
// the destroys; GAUNTLET_DENSITY_CHURN=K destroys and creates one sandbox K times at the
// peak before the destroys. It is a big load (N mounts of each kind, N cgroups): run it alone.
//
//	GAUNTLET_DENSITY=10000 nice go test -run TestDensity -v -timeout 2h ./pkg/sandbox/process/
func TestDensity(t *testing.T) {
	// Without the variables, a small count with a live command in each, so that the
	// harness runs in every test run and cannot rot.
	n, step, live, churn := 24, 8, true, 4
	if v := os.Getenv("GAUNTLET_DENSITY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("GAUNTLET_DENSITY=%q: want a positive count", v)
		}
		step, _ = strconv.Atoi(os.Getenv("GAUNTLET_DENSITY_STEP"))
		live = os.Getenv("GAUNTLET_DENSITY_LIVE") == "1"
		churn, _ = strconv.Atoi(os.Getenv("GAUNTLET_DENSITY_CHURN"))
	}
	dir := t.TempDir()
	rt := open(t, dir)
	// The run directory is where the workspaces are mounted: the parent of one.
	probe, err := rt.Create(context.Background(), sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	ws, err := rt.WorkspaceDir(context.Background(), probe.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(context.Background(), probe.ID); err != nil {
		t.Fatal(err)
	}
	sandboxtest.Density(t, rt, sandboxtest.DensityConfig{
		Count: n, Step: step, Live: live, Churn: churn,
	})
	// Every sandbox destroyed, Close leaves no mount, cgroup or run directory behind.
	// It removes the cgroups the runtime kept, so its cost belongs to the drain's.
	var closeErr error
	c := sandboxtest.Measure(func() { closeErr = rt.Close() })
	if closeErr != nil {
		t.Fatal(closeErr)
	}
	t.Logf("density: close after the drain: %v", c)
	run := filepath.Dir(ws)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (under(f[4], dir) || under(f[4], run)) {
			left++
		}
	}
	if left > 0 {
		t.Errorf("%d mounts left under %s and %s", left, dir, run)
	}
	if _, err := os.Lstat(run); !os.IsNotExist(err) {
		t.Errorf("run directory %s left: %v", run, err)
	}
	// The cgroups live under <hierarchy>/gauntlet/<the run directory's name>.
	cgs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", "gauntlet", filepath.Base(run)))
	cg2, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "gauntlet", filepath.Base(run)))
	if left := append(cgs, cg2...); len(left) > 0 {
		t.Errorf("cgroups left: %v", left)
	}
}

// under says p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
