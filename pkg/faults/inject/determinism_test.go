package inject_test

import (
	"hash/fnv"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// episodeTrace plans episode i of a 10,000-episode run (profile from the default mix, run
// drift ramping latency and 503s, and a global drift whose value changes at episode 5,000
// as if set mid-run), runs 30 calls through the injector and hashes the plan and every
// fired fault.
func episodeTrace(t *testing.T, runSeed uint64, i uint64, runDrift, before, after []*gauntletv1.Drift) (uint64, *gauntletv1.FaultPlan) {
	seed := runSeed*1_000_003 + i
	profile, err := plans.ChooseProfile(seed, nil)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := plans.Derive(seed, profile, shopServices)
	if err != nil {
		t.Fatal(err)
	}
	global := before
	if i >= 5000 {
		global = after
	}
	pos := plans.DriftPosition{Index: i, At: time.Unix(0, 0)}
	vals := append(plans.DriftValues(global, pos, plans.DriftSourceGlobal), plans.DriftValues(runDrift, pos, plans.DriftSourceRun)...)
	if err := plans.ApplyDrift(plan, vals); err != nil {
		t.Fatal(err)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	h := fnv.New64a()
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(plan)
	h.Write(b)
	for j, c := range script(30) {
		for _, f := range in.Call(c.service, c.tool, time.Duration(j)).Fired {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(f)
			h.Write(b)
		}
	}
	return h.Sum64(), plan
}

// TestSameSeedSameFaultsOver10000Episodes: every episode's plan and fired faults are the
// same on a second pass, also with drift changing parameters mid-run; different run seeds
// give different episodes; and drift never reseeds: a rule it does not touch fires exactly
// as it does without drift.
func TestSameSeedSameFaultsOver10000Episodes(t *testing.T) {
	const n = 10_000
	runDrift := []*gauntletv1.Drift{
		drift("*.latency.mean_ms", linear, 0, 20, n-1, 400),
		drift("*.http_503.probability", piecewise, 0, 0.01, 5000, 0.2, n-1, 0.05),
	}
	before := []*gauntletv1.Drift{drift("*.truncate.probability", step, 0, 0.01)}
	after := []*gauntletv1.Drift{drift("*.truncate.probability", step, 0, 0.3)}
	for _, ds := range [][]*gauntletv1.Drift{runDrift, before, after} {
		if err := plans.ValidateDrift(ds); err != nil {
			t.Fatal(err)
		}
	}
	first := make([]uint64, n)
	distinct := map[uint64]bool{}
	for i := range uint64(n) {
		first[i], _ = episodeTrace(t, 1, i, runDrift, before, after)
		distinct[first[i]] = true
	}
	if len(distinct) != n {
		t.Fatalf("%d distinct episodes of %d", len(distinct), n)
	}
	same := 0
	for i := range uint64(n) {
		h, _ := episodeTrace(t, 1, i, runDrift, before, after)
		if h != first[i] {
			t.Fatalf("episode %d differs on replay", i)
		}
		if h2, _ := episodeTrace(t, 2, i, runDrift, before, after); h2 == h {
			same++
		}
	}
	if same != 0 {
		t.Fatalf("%d episodes identical across run seeds 1 and 2", same)
	}
	// No reseeding: the 429 rules (never drifted) fire identically with and without drift.
	for i := uint64(0); i < n; i += 97 {
		_, drifted := episodeTrace(t, 1, i, runDrift, before, after)
		plain, _ := plans.Derive(1*1_000_003+i, drifted.Profile, shopServices)
		a, _ := inject.NewInjector(drifted)
		b, _ := inject.NewInjector(plain)
		for j, c := range script(60) {
			fa, fb := only429(a.Call(c.service, c.tool, 0).Fired), only429(b.Call(c.service, c.tool, 0).Fired)
			if fa != fb {
				t.Fatalf("episode %d call %d: 429 %q with drift, %q without", i, j, fa, fb)
			}
		}
	}
}

func only429(fired []*gauntletv1.FaultFired) string {
	for _, f := range fired {
		if f.Kind == catalogue.KindHTTPError && len(f.FaultId) > 9 && f.FaultId[len(f.FaultId)-9:] == ".http_429" {
			return f.FaultId
		}
	}
	return ""
}
