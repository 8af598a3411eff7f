package faults_test

import (
	"slices"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

const flakyShop = `name: flaky-shop
sla: {latency_ms: {max: 400}}
faults:
  - {id: lat, kind: latency, params: {mean_ms: 120, jitter_ms: 30}}
  - {id: pay-429, kind: http_error, probability: 0.2, match: {services: [payment]}, params: {status: 429, retry_after_ms: 1500}}
  - {id: cut, kind: truncate, probability: 0.1, match: {tools: [catalog.search]}, params: {keep_fraction: 0.25}}
`

func TestCustomProfilePlan(t *testing.T) {
	c, err := faults.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "flaky-shop", SpecYaml: flakyShop}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := c.Plan(5, "flaky-shop", shopServices)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range p.Rules {
		ids = append(ids, r.Id+"@"+r.Target)
	}
	want := []string{"catalog.lat@catalog", "inventory.lat@inventory", "payment.lat@payment", "shipping.lat@shipping",
		"payment.pay-429@payment", "catalog.search.cut@catalog.search"}
	if !slices.Equal(ids, want) {
		t.Fatalf("rules %v, want %v", ids, want)
	}
	if r := p.Rules[4]; r.Probability != 0.2 || r.GetHttpError().Status != 429 || r.GetHttpError().RetryAfterMs != 1500 {
		t.Fatalf("429 rule %v", r)
	}
	// The mix may name it; the choice stays deterministic.
	mix := []*gauntletv1.Share{{Name: "baseline", Weight: 1}, {Name: "flaky-shop", Weight: 3}}
	n := 0
	for seed := uint64(0); seed < 4000; seed++ {
		name, err := faults.ChooseProfile(seed, mix, c.Names()...)
		if err != nil {
			t.Fatal(err)
		}
		if name == "flaky-shop" {
			n++
		}
	}
	within5Sigma(t, "flaky-shop share", n, 4000, 0.75)
	wantErrs(t, faults.ValidateMix(mix), `unknown profile "flaky-shop"`)
}

func TestCustomProfilesRejected(t *testing.T) {
	tests := []struct {
		name string
		cps  []*gauntletv1.CustomProfile
		want string
	}{
		{"name mismatch", []*gauntletv1.CustomProfile{{Name: "other", SpecYaml: flakyShop}}, `custom_profiles[0].name: "other" differs from the spec's name "flaky-shop"`},
		{"duplicate", []*gauntletv1.CustomProfile{{Name: "flaky-shop", SpecYaml: flakyShop}, {Name: "flaky-shop", SpecYaml: flakyShop}}, `custom_profiles[1].name: duplicate profile "flaky-shop"`},
		{"storage fault in sim", []*gauntletv1.CustomProfile{{Name: "d", SpecYaml: "name: d\nfaults:\n  - {id: f, kind: disk_full}\n"}},
			"custom_profiles[0] (d): faults[0].kind: disk_full cannot apply in a sim env"},
		{"host match in sim", []*gauntletv1.CustomProfile{{Name: "h", SpecYaml: "name: h\nfaults:\n  - {id: f, kind: latency, match: {hosts: [a]}}\n"}},
			"custom_profiles[0] (h): faults[0].match: a sim env's calls have no host"},
		{"bad spec", []*gauntletv1.CustomProfile{{Name: "b", SpecYaml: "name: b\nfaults:\n  - {id: f, kind: latency, params: {mean_ms: -1}}\n"}},
			"custom_profiles[0] (b): faults[0].params.mean_ms: -1 is below the minimum 0 ms"},
		{"SLA broken", []*gauntletv1.CustomProfile{{Name: "s", SpecYaml: "name: s\nsla: {latency_ms: {max: 10}}\nfaults:\n  - {id: f, kind: latency, params: {mean_ms: 50}}\n"}},
			"50 ms expected added latency is above the SLA maximum 10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := faults.CompileCustomProfiles(tt.cps)
			wantErrs(t, err, tt.want)
		})
	}
	c, _ := faults.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "x", SpecYaml: "name: x\nfaults:\n  - {id: f, kind: latency, match: {services: [warehouse]}}\n"}})
	_, err := c.Plan(1, "x", shopServices)
	wantErrs(t, err, `unknown service "warehouse" (the env has catalog, inventory`)
}
