package ctrd_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// TestDensity is the containerd side of the density measurement in docs/benchmarks.md
// (the process runtime's is pkg/sandbox/process's TestDensity, with the same variables):
// GAUNTLET_DENSITY=N sandboxes made one by one, then destroyed, timed per bucket of
// GAUNTLET_DENSITY_STEP; GAUNTLET_DENSITY_LIVE=1 runs a command in each before the
// destroys.
//
//	GAUNTLET_DENSITY=200 nice go test -run TestDensity -v -timeout 1h ./pkg/sandbox/ctrd/
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
	_, rt := start(t)
	sandboxtest.Density(t, rt, sandboxtest.DensityConfig{
		Count: n, Step: step, Live: live,
	})
}
