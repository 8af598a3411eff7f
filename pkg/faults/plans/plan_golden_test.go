package plans_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
)

// planDigest hashes the deterministic encoding of the plans of seeds 0..499 of every
// built-in profile for services; with rulesOnly, of their rules alone (boundary_spec
// left out).
func planDigest(t *testing.T, services []string, rulesOnly bool) string {
	t.Helper()
	h := sha256.New()
	for _, profile := range plans.Profiles() {
		for seed := uint64(0); seed < 500; seed++ {
			p := mustPlan(t, seed, profile, services)
			if rulesOnly {
				p.BoundarySpec = ""
			}
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestBuiltinPlansGolden pins the built-in plans: a shop env's plans are
// byte-identical to those before sandboxed envs got boundary faults, and a sandboxed
// env's (codefix: docs, sandbox) rules too, only its boundary_spec being new. A change
// here changes every recorded episode's replay: update the digests only on purpose.
// (The encoding is protobuf-go's deterministic one, stable within its pinned version.)
func TestBuiltinPlansGolden(t *testing.T) {
	for _, tc := range []struct {
		services  []string
		rulesOnly bool
		want      string
	}{
		{shopServices, false, "3eb537ec023d84b2288a000508f8597d6e926f2cdab5c4f5512946e7ee1f13d4"},
		{[]string{"docs", "sandbox"}, true, "7227297a016b215f77ba02e86d5c6732608136922448b3fc3241be272fe015a9"},
	} {
		if got := planDigest(t, tc.services, tc.rulesOnly); got != tc.want {
			t.Errorf("plans of %v changed: digest %s, want %s", tc.services, got, tc.want)
		}
	}
}

// TestSandboxedPlansCarryBoundaryFaults: the built-in plans of a sandboxed env carry
// storage and resource faults proportionate to the profile: baseline rare mild
// IO latency only; stress one boundary family amplified, every family over the seeds;
// edge one to three rare severe faults, every one over the seeds. Plans are valid,
// deterministic and independent of the services' order; an env without a sandbox gets
// none.
func TestSandboxedPlansCarryBoundaryFaults(t *testing.T) {
	codefix := []string{"docs", "sandbox"}
	family := map[string]string{
		"io_latency": "slow", "iops_cap": "slow",
		"disk_full": "failing", "too_many_open_files": "failing", "short_write": "failing",
		"cpu_throttle": "starved", "memory_leak": "starved",
	}
	families := map[string]int{}
	severe := map[string]int{}
	for seed := uint64(0); seed < 300; seed++ {
		if p := mustPlan(t, seed, plans.ProfileEdge, shopServices); p.BoundarySpec != "" {
			t.Fatalf("seed %d: shop plan with boundary faults: %s", seed, p.BoundarySpec)
		}
		for _, profile := range plans.Profiles() {
			p := mustPlan(t, seed, profile, codefix)
			if err := plans.Validate(p); err != nil {
				t.Fatalf("seed %d %s: %v", seed, profile, err)
			}
			if q := mustPlan(t, seed, profile, []string{"sandbox", "docs"}); !proto.Equal(p, q) {
				t.Fatalf("seed %d %s: plan depends on the order of services", seed, profile)
			}
			if _, err := inject.NewInjector(p); err != nil {
				t.Fatalf("seed %d %s: injector: %v", seed, profile, err)
			}
			rules, err := plans.BoundaryRules(p)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]catalogue.Rule{}
			for _, r := range rules {
				got[r.Kind.Name] = r
			}
			lat, ok := got[catalogue.KindIOLatency]
			if !ok {
				t.Fatalf("seed %d %s: no io_latency: %s", seed, profile, p.BoundarySpec)
			}
			switch profile {
			case plans.ProfileBaseline:
				if len(rules) != 1 || lat.Probability < 0.02 || lat.Probability > 0.05 || lat.Num("mean_ms") > 10 {
					t.Fatalf("seed %d baseline: want rare mild io_latency only: %s", seed, p.BoundarySpec)
				}
			case plans.ProfileStress:
				amplified := map[string]bool{}
				for k, r := range got {
					if k != catalogue.KindIOLatency || r.Probability >= 0.3 {
						amplified[family[k]] = true
					}
				}
				if len(amplified) != 1 {
					t.Fatalf("seed %d stress: %d families amplified: %s", seed, len(amplified), p.BoundarySpec)
				}
				for f := range amplified {
					families[f]++
				}
			case plans.ProfileEdge:
				n := 0
				for k, r := range got {
					if k == catalogue.KindIOLatency {
						continue
					}
					n++
					severe[k]++
					if r.Kind.Layer == catalogue.LayerStorage && r.Probability > 0.05 {
						t.Fatalf("seed %d edge: %s is not rare: %s", seed, k, p.BoundarySpec)
					}
				}
				if n < 1 || n > 3 || lat.Probability > 0.05 {
					t.Fatalf("seed %d edge: %d severe faults: %s", seed, n, p.BoundarySpec)
				}
			}
		}
	}
	if len(families) != 3 {
		t.Errorf("stress amplified only %v over 300 seeds", families)
	}
	for _, k := range []string{catalogue.KindDiskFull, catalogue.KindReadOnly, catalogue.KindInodes, catalogue.KindMemoryLeak} {
		if severe[k] == 0 {
			t.Errorf("edge never picked %s over 300 seeds (%v)", k, severe)
		}
	}
	t.Logf("stress families %v, edge faults %v", families, severe)
}

// BenchmarkPlanSandboxed: deriving an edge plan of a sandboxed env (codefix's services),
// boundary_spec included (its YAML encoding and check); compare BenchmarkPlan (shop).
func BenchmarkPlanSandboxed(b *testing.B) {
	b.ReportAllocs()
	var seed uint64
	for b.Loop() {
		seed++
		if _, err := plans.Derive(seed, plans.ProfileEdge, []string{"docs", "sandbox"}); err != nil {
			b.Fatal(err)
		}
	}
}
