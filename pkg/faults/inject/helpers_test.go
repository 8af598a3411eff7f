package inject_test

import (
	"math"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Plans and drift for the injection tests (plans' tests have the same helpers).

var shopServices = []string{"catalog", "inventory", "payment", "shipping"}

func mustPlan(t testing.TB, seed uint64, profile string, services []string) *gauntletv1.FaultPlan {
	t.Helper()
	p, err := plans.Derive(seed, profile, services)
	if err != nil {
		t.Fatalf("Plan(%d, %q, %v): %v", seed, profile, services, err)
	}
	return p
}

func drift(sel string, shape gauntletv1.DriftShape, xy ...float64) *gauntletv1.Drift {
	points := make([]*gauntletv1.DriftPoint, 0, len(xy)/2)
	for i := 0; i+1 < len(xy); i += 2 {
		points = append(points, &gauntletv1.DriftPoint{At: xy[i], Value: xy[i+1]})
	}
	return &gauntletv1.Drift{Selector: sel, Schedule: &gauntletv1.DriftSchedule{Shape: shape, Points: points}}
}

const (
	step      = gauntletv1.DriftShape_DRIFT_SHAPE_STEP
	linear    = gauntletv1.DriftShape_DRIFT_SHAPE_LINEAR
	piecewise = gauntletv1.DriftShape_DRIFT_SHAPE_PIECEWISE
)

func within5Sigma(t *testing.T, what string, hits, n int, p float64) {
	t.Helper()
	mean, sd := float64(n)*p, math.Sqrt(float64(n)*p*(1-p))
	if d := math.Abs(float64(hits) - mean); d > 5*sd {
		t.Errorf("%s: %d of %d, want %.0f ± %.0f (5 sigma)", what, hits, n, mean, 5*sd)
	}
}
