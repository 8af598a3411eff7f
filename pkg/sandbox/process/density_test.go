//go:build linux

package process_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// TestDensity is the density measurement of docs/benchmarks.md: GAUNTLET_DENSITY=N
// sandboxes made one by one, then destroyed, with create and destroy timed per bucket
// of GAUNTLET_DENSITY_STEP; GAUNTLET_DENSITY_LIVE=1 starts a command in each before
// the destroys. It is a big load (N mounts of each kind, N cgroups): run it alone.
//
//	GAUNTLET_DENSITY=10000 nice go test -run TestDensity -v -timeout 2h ./pkg/sandbox/process/
func TestDensity(t *testing.T) {
	// Without the variables, a small count with a live command in each, so that the
	// harness runs in every test run and cannot rot.
	n, step, live := 24, 8, true
	if v := os.Getenv("GAUNTLET_DENSITY"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("GAUNTLET_DENSITY=%q: want a positive count", v)
		}
		step, _ = strconv.Atoi(os.Getenv("GAUNTLET_DENSITY_STEP"))
		live = os.Getenv("GAUNTLET_DENSITY_LIVE") == "1"
	}
	rt := open(t, t.TempDir())
	sandboxtest.Density(t, rt, sandboxtest.DensityConfig{
		Count: n, Step: step, Live: live,
	})
}
