package plans_test

import (
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

var shopServices = []string{"catalog", "inventory", "payment", "shipping"}

func mustPlan(t testing.TB, seed uint64, profile string, services []string) *gauntletv1.FaultPlan {
	t.Helper()
	p, err := plans.Derive(seed, profile, services)
	if err != nil {
		t.Fatalf("Plan(%d, %q, %v): %v", seed, profile, services, err)
	}
	return p
}

// byID indexes a plan's rules by id.
func byID(p *gauntletv1.FaultPlan) map[string]*gauntletv1.FaultRule {
	m := make(map[string]*gauntletv1.FaultRule, len(p.Rules))
	for _, r := range p.Rules {
		m[r.Id] = r
	}
	return m
}

func TestPlanIsDeterministic(t *testing.T) {
	for _, profile := range plans.Profiles() {
		t.Run(profile, func(t *testing.T) {
			for seed := uint64(0); seed < 100; seed++ {
				a := mustPlan(t, seed, profile, shopServices)
				if b := mustPlan(t, seed, profile, shopServices); !proto.Equal(a, b) {
					t.Fatalf("seed %d: two plans differ:\n%v\n%v", seed, a, b)
				}
				reversed := []string{"shipping", "payment", "inventory", "catalog"}
				if b := mustPlan(t, seed, profile, reversed); !proto.Equal(a, b) {
					t.Fatalf("seed %d: plan depends on the order of services", seed)
				}
				if b := mustPlan(t, seed+1, profile, shopServices); proto.Equal(a, b) {
					t.Fatalf("seeds %d and %d gave the same plan", seed, seed+1)
				}
			}
		})
	}
}

// A service's rules must not depend on which other services the env has.
func TestPlanServiceRulesAreIndependent(t *testing.T) {
	for seed := uint64(0); seed < 100; seed++ {
		all := byID(mustPlan(t, seed, plans.ProfileBaseline, shopServices))
		for _, r := range mustPlan(t, seed, plans.ProfileBaseline, []string{"payment"}).Rules {
			if !proto.Equal(r, all[r.Id]) {
				t.Fatalf("seed %d: %s alone is %v, beside other services %v", seed, r.Id, r, all[r.Id])
			}
		}
	}
}

func TestPlanShape(t *testing.T) {
	const seeds = 1000
	for _, services := range [][]string{shopServices, {"only"}} {
		for _, profile := range plans.Profiles() {
			t.Run(profile+"/"+strings.Join(services, ","), func(t *testing.T) {
				for seed := uint64(0); seed < seeds; seed++ {
					p := mustPlan(t, seed, profile, services)
					if err := plans.Validate(p); err != nil {
						t.Fatalf("seed %d: plan does not validate: %v\n%v", seed, err, p)
					}
					if p.Profile != profile || p.Seed != seed || p.CatalogueVersion != plans.CatalogueVersion {
						t.Fatalf("seed %d: header = (%q, %d, %q)", seed, p.Profile, p.Seed, p.CatalogueVersion)
					}
					for _, r := range p.Rules {
						if !strings.HasPrefix(r.Id, r.Target+".") {
							t.Fatalf("seed %d: rule id %q does not start with its target %q", seed, r.Id, r.Target)
						}
					}
					checkProfile(t, seed, p, mustPlan(t, seed, plans.ProfileBaseline, services), len(services))
				}
			})
		}
	}
}

// checkProfile checks what distinguishes each profile, comparing p with the baseline plan of
// the same seed.
func checkProfile(t *testing.T, seed uint64, p, base *gauntletv1.FaultPlan, services int) {
	t.Helper()
	rules, baseRules := byID(p), byID(base)
	switch p.Profile {
	case plans.ProfileBaseline:
		if len(p.Rules) != 4*services {
			t.Fatalf("seed %d: %d baseline rules, want 4 per service", seed, len(p.Rules))
		}
		for _, r := range p.Rules {
			switch {
			case r.GetLatency() != nil:
				l := r.GetLatency()
				if r.Probability != 1 || l.MeanMs < 20 || l.MeanMs > 60 || l.JitterMs < 10 || l.JitterMs > 30 {
					t.Fatalf("seed %d: baseline latency %v", seed, r)
				}
			case r.GetHttpError() != nil:
				if r.Probability < 0.002 || r.Probability > 0.02 {
					t.Fatalf("seed %d: baseline error %v", seed, r)
				}
			case r.GetTruncate() != nil:
				if r.Probability > 0.005 {
					t.Fatalf("seed %d: baseline truncation not rare: %v", seed, r)
				}
			}
		}
	case plans.ProfileStress:
		// Same ids as the baseline; the rules that differ are one family on one or two
		// services, and amplified.
		if len(rules) != len(baseRules) {
			t.Fatalf("seed %d: stress has %d rules, baseline %d", seed, len(rules), len(baseRules))
		}
		services, families := map[string]bool{}, map[string]bool{}
		for id, r := range rules {
			b := baseRules[id]
			if b == nil {
				t.Fatalf("seed %d: stress rule %q not in the baseline", seed, id)
			}
			if proto.Equal(r, b) {
				continue
			}
			services[r.Target] = true
			families[familyOf(r)] = true
			if r.Probability < 0.1 && r.GetLatency().GetMeanMs() < 200 {
				t.Fatalf("seed %d: stress changed %s without amplifying it: %v -> %v", seed, id, b, r)
			}
		}
		if n := len(services); n < 1 || n > 2 || len(families) != 1 {
			t.Fatalf("seed %d: stress amplified %v on services %v, want one family on 1-2 services", seed, families, services)
		}
	case plans.ProfileEdge:
		// The baseline plus three to five rare faults.
		for id, b := range baseRules {
			if !proto.Equal(rules[id], b) {
				t.Fatalf("seed %d: edge changed baseline rule %s", seed, id)
			}
		}
		extra := len(rules) - len(baseRules)
		if extra < 3 || extra > 5 {
			t.Fatalf("seed %d: edge added %d rules, want 3-5", seed, extra)
		}
		for id, r := range rules {
			if baseRules[id] == nil && r.Probability > 0.08 {
				t.Fatalf("seed %d: edge fault %v is not rare", seed, r)
			}
		}
	}
}

// familyOf names the fault family a stress plan amplifies together.
func familyOf(r *gauntletv1.FaultRule) string {
	switch {
	case r.GetHttpError() != nil:
		return "errors"
	case r.GetLatency() != nil:
		return "latency"
	}
	return "truncation"
}

// Over many seeds, stress plans amplify every family, on one service and on two.
func TestStressCoversEveryFamily(t *testing.T) {
	families := map[string]int{}
	serviceCounts := map[int]int{}
	for seed := uint64(0); seed < 300; seed++ {
		base := byID(mustPlan(t, seed, plans.ProfileBaseline, shopServices))
		services := map[string]bool{}
		for _, r := range mustPlan(t, seed, plans.ProfileStress, shopServices).Rules {
			if !proto.Equal(r, base[r.Id]) {
				families[familyOf(r)]++
				services[r.Target] = true
			}
		}
		serviceCounts[len(services)]++
	}
	for _, f := range []string{"errors", "latency", "truncation"} {
		if families[f] == 0 {
			t.Errorf("no stress plan in 300 seeds amplified %s (saw %v)", f, families)
		}
	}
	if serviceCounts[1] == 0 || serviceCounts[2] == 0 {
		t.Errorf("stress plans amplified on %v services, want both 1 and 2", serviceCounts)
	}
}

func TestPlanErrors(t *testing.T) {
	tests := []struct {
		name     string
		profile  string
		services []string
		want     []string
	}{
		{name: "unknown profile", profile: "chaos", services: shopServices, want: []string{`profile: unknown profile "chaos" (known: baseline, edge, stress)`}},
		{name: "no services", profile: "baseline", services: nil, want: []string{"services: must name at least one service"}},
		{name: "empty service", profile: "edge", services: []string{"a", ""}, want: []string{"services[1]: must not be empty"}},
		{name: "duplicate service", profile: "stress", services: []string{"a", "b", "a"}, want: []string{`services[2]: duplicate service "a" (first at services[0])`}},
		{name: "wildcard service", profile: "stress", services: []string{"*"}, want: []string{`services[0]: "*" must not contain`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := plans.Derive(1, tt.profile, tt.services)
			if p != nil {
				t.Errorf("got a plan with the error: %v", p)
			}
			wantErrs(t, err, tt.want...)
		})
	}
	if _, err := plans.Derive(1, "chaos", shopServices); !errors.Is(err, plans.ErrUnknownProfile) {
		t.Errorf("errors.Is(%v, ErrUnknownProfile) = false", err)
	}
}

func BenchmarkPlan(b *testing.B) {
	b.ReportAllocs()
	var seed uint64
	for b.Loop() {
		seed++
		if _, err := plans.Derive(seed, plans.ProfileEdge, shopServices); err != nil {
			b.Fatal(err)
		}
	}
}
