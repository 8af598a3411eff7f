package plans_test

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

const latencyShop = `name: slow-shop
faults:
  - {id: latency, kind: latency, params: {mean_ms: 120, jitter_ms: 30}}
  - {id: pay-429, kind: http_error, probability: 0.2, match: {services: [payment]}, params: {status: 429, retry_after_ms: 1500}}
`

var planDrift = []*gauntletv1.DriftValue{
	{Selector: "*.latency.mean_ms", Value: 333, Source: plans.DriftSourceGlobal},
	{Selector: "payment.latency.jitter_ms", Value: 7, Source: plans.DriftSourceRun},
}

// A compact plan expands to exactly the plan it was made from, built-in or user-defined,
// with and without drift.
func TestCompactPlansExpandToTheWholePlan(t *testing.T) {
	custom, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "slow-shop", SpecYaml: latencyShop}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := custom.Plan(0, "slow-shop", shopServices)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, id, err := plans.NewTemplate(base)
	if err != nil {
		t.Fatal(err)
	}
	before := proto.Clone(tmpl)
	for seed := uint64(1); seed <= 60; seed++ {
		for _, profile := range []string{plans.ProfileBaseline, plans.ProfileStress, plans.ProfileEdge, "slow-shop"} {
			for _, drift := range [][]*gauntletv1.DriftValue{nil, planDrift} {
				var full *gauntletv1.FaultPlan
				var template string
				if profile == "slow-shop" {
					full, err = custom.Plan(seed, profile, shopServices)
					template = id
				} else {
					full, err = plans.Derive(seed, profile, shopServices)
				}
				if err != nil {
					t.Fatal(err)
				}
				if drift != nil {
					if err := plans.ApplyDrift(full, drift); err != nil {
						t.Fatal(err)
					}
				}
				c, err := plans.Compact(full, template)
				if err != nil {
					t.Fatal(err)
				}
				if len(c.Rules) > 0 || c.BoundarySpec != "" || !c.Compact || c.Digest == "" {
					t.Fatalf("compact plan carries rules or lacks its digest: %v", c)
				}
				got, err := plans.Expand(c, shopServices, tmpl)
				if err != nil {
					t.Fatalf("seed %d %s: %v", seed, profile, err)
				}
				want := proto.Clone(full).(*gauntletv1.FaultPlan)
				want.Digest = c.Digest
				if !proto.Equal(got, want) {
					t.Fatalf("seed %d %s drift %v: expanded\n%v\nwant\n%v", seed, profile, drift != nil, got, want)
				}
			}
		}
	}
	if !proto.Equal(tmpl, before) {
		t.Fatal("expanding with drift rewrote the shared template")
	}
}

func TestExpandRefusesWhatItCannotReproduce(t *testing.T) {
	full, err := plans.Derive(7, plans.ProfileEdge, shopServices)
	if err != nil {
		t.Fatal(err)
	}
	c, err := plans.Compact(full, "")
	if err != nil {
		t.Fatal(err)
	}
	mutate := func(f func(p *gauntletv1.FaultPlan)) *gauntletv1.FaultPlan {
		p := proto.Clone(c).(*gauntletv1.FaultPlan)
		f(p)
		return p
	}
	cases := []struct {
		name string
		plan *gauntletv1.FaultPlan
		want string
	}{
		{"another seed", mutate(func(p *gauntletv1.FaultPlan) { p.Seed++ }), "expand plan: digest: re-derived"},
		{"another catalogue", mutate(func(p *gauntletv1.FaultPlan) { p.CatalogueVersion = "0-old" }), `catalogue_version: plan made by catalogue "0-old"`},
		{"custom without template", mutate(func(p *gauntletv1.FaultPlan) { p.Profile = "mine" }), `profile "mine" is not built-in and the plan names no template`},
		{"template missing", mutate(func(p *gauntletv1.FaultPlan) { p.Template = "abc" }), "plan names template abc, none given"},
	}
	for _, tc := range cases {
		if _, err := plans.Expand(tc.plan, shopServices, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := plans.Compact(&gauntletv1.FaultPlan{Profile: "mine"}, ""); err == nil || !strings.Contains(err.Error(), "needs a template") {
		t.Errorf("compacting a user-defined plan without template: %v", err)
	}
}

// Digest covers every field of FaultPlan but the three that describe the reference
// itself; a field added to the message must be added to Digest's view (or here).
func TestDigestCoversEveryField(t *testing.T) {
	var names []string
	fields := (&gauntletv1.FaultPlan{}).ProtoReflect().Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		names = append(names, string(fields.Get(i).Name()))
	}
	want := []string{"profile", "seed", "rules", "catalogue_version", "drift_values", "boundary_spec", "digest", "compact", "template"}
	if !slices.Equal(names, want) {
		t.Fatalf("FaultPlan fields %v; Digest knows %v: update Digest's view", names, want)
	}
	full, err := plans.Derive(3, plans.ProfileStress, shopServices)
	if err != nil {
		t.Fatal(err)
	}
	d0, _ := plans.Digest(full)
	for _, f := range []func(p *gauntletv1.FaultPlan){
		func(p *gauntletv1.FaultPlan) { p.Profile = "x" },
		func(p *gauntletv1.FaultPlan) { p.Seed++ },
		func(p *gauntletv1.FaultPlan) { p.Rules[0].Probability += 0.01 },
		func(p *gauntletv1.FaultPlan) { p.CatalogueVersion += "x" },
		func(p *gauntletv1.FaultPlan) { p.DriftValues = planDrift[:1] },
		func(p *gauntletv1.FaultPlan) { p.BoundarySpec = "x" },
	} {
		p := proto.Clone(full).(*gauntletv1.FaultPlan)
		f(p)
		if d, _ := plans.Digest(p); d == d0 {
			t.Errorf("a changed plan kept digest %s: %v", d, p)
		}
	}
	p := proto.Clone(full).(*gauntletv1.FaultPlan)
	p.Digest, p.Compact, p.Template = "d", true, "t"
	if d, _ := plans.Digest(p); d != d0 {
		t.Error("the reference fields change the digest")
	}
}

// A sandboxed env's built-in plans carry boundary faults in their boundary spec; by
// reference they come back whole.
func TestCompactSandboxPlansExpand(t *testing.T) {
	services := []string{"docs", plans.SandboxService}
	withSpec := 0
	for seed := uint64(1); seed <= 40; seed++ {
		for _, profile := range []string{plans.ProfileBaseline, plans.ProfileStress, plans.ProfileEdge} {
			full, err := plans.Derive(seed, profile, services)
			if err != nil {
				t.Fatal(err)
			}
			if full.BoundarySpec != "" {
				withSpec++
			}
			c, err := plans.Compact(full, "")
			if err != nil {
				t.Fatal(err)
			}
			got, err := plans.Expand(c, services, nil)
			if err != nil {
				t.Fatalf("seed %d %s: %v", seed, profile, err)
			}
			want := proto.Clone(full).(*gauntletv1.FaultPlan)
			want.Digest = c.Digest
			if !proto.Equal(got, want) {
				t.Fatalf("seed %d %s: expanded\n%v\nwant\n%v", seed, profile, got, want)
			}
		}
	}
	if withSpec == 0 {
		t.Fatal("no built-in sandbox plan carried boundary faults; the test needs some")
	}
}

// A plan as the faults service hands it out has no digest: expanding it computes one,
// Seal records it (with the drift values as applied), and the sealed record then checks
// every re-derivation.
func TestSealRecordsTheDigestOfThePlanPlayed(t *testing.T) {
	drift := []*gauntletv1.DriftValue{{Selector: "*.http_429.retry_after_ms", Value: 1234.6, Source: plans.DriftSourceRun}}
	ref := &gauntletv1.FaultPlan{Profile: plans.ProfileBaseline, Seed: 99, CatalogueVersion: plans.CatalogueVersion, Compact: true, DriftValues: drift}
	full, err := plans.Expand(ref, shopServices, nil)
	if err != nil {
		t.Fatal(err)
	}
	if full.Digest == "" {
		t.Fatal("expanded plan has no digest")
	}
	plans.Seal(ref, full)
	if ref.Digest != full.Digest || ref.DriftValues[0].Value != 1235 {
		t.Fatalf("sealed %v", ref)
	}
	again, err := plans.Expand(ref, shopServices, nil)
	if err != nil || !proto.Equal(again, full) {
		t.Fatalf("sealed plan re-derived to %v (%v), want %v", again, err, full)
	}
	ref.Seed++
	if _, err := plans.Expand(ref, shopServices, nil); err == nil || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("a changed sealed plan expanded: %v", err)
	}
}
