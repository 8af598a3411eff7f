package splitlocal

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// A chaos plan is a function of its seed: the same seed repeats a failed run's faults in
// the same order with the same waits; each round kills every kind once; waits stay in
// their bounds; another seed gives another plan.
func TestPlanChaosIsSeeded(t *testing.T) {
	const rounds = 20
	minWait, maxWait := 5*time.Second, 9*time.Second
	a := PlanChaos(42, rounds, minWait, maxWait)
	if b := PlanChaos(42, rounds, minWait, maxWait); !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed gave two plans")
	}
	if len(a) != rounds*len(ChaosKinds) {
		t.Fatalf("%d faults, want %d", len(a), rounds*len(ChaosKinds))
	}
	orders := map[string]bool{}
	for r := range rounds {
		round := a[r*len(ChaosKinds) : (r+1)*len(ChaosKinds)]
		var kinds []string
		for _, f := range round {
			kinds = append(kinds, f.Kind)
			if f.Wait < minWait || f.Wait > maxWait {
				t.Errorf("round %d: %s waits %v, outside [%v, %v]", r, f.Kind, f.Wait, minWait, maxWait)
			}
		}
		orders[kinds[0]] = true
		sorted := slices.Sorted(slices.Values(kinds))
		if want := slices.Sorted(slices.Values(ChaosKinds)); !slices.Equal(sorted, want) {
			t.Errorf("round %d kills %v, want each of %v once", r, kinds, want)
		}
	}
	if len(orders) < 2 {
		t.Errorf("every one of %d rounds starts with the same kind: the order is not drawn", rounds)
	}
	if reflect.DeepEqual(a, PlanChaos(43, rounds, minWait, maxWait)) {
		t.Error("seeds 42 and 43 gave the same plan")
	}
	if p := PlanChaos(1, 1, time.Second, time.Second); p[0].Wait != time.Second {
		t.Errorf("min-wait = max-wait: waits %v, want exactly 1s", p[0].Wait)
	}
}
