package plans_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
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
	c, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "flaky-shop", SpecYaml: flakyShop}})
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
		name, err := plans.ChooseProfile(seed, mix, c.Names()...)
		if err != nil {
			t.Fatal(err)
		}
		if name == "flaky-shop" {
			n++
		}
	}
	within5Sigma(t, "flaky-shop share", n, 4000, 0.75)
	wantErrs(t, plans.ValidateMix(mix), `unknown profile "flaky-shop"`)
}

func TestCustomProfilesRejected(t *testing.T) {
	tests := []struct {
		name string
		cps  []*gauntletv1.CustomProfile
		want string
	}{
		{"name mismatch", []*gauntletv1.CustomProfile{{Name: "other", SpecYaml: flakyShop}}, `custom_profiles[0].name: "other" differs from the spec's name "flaky-shop"`},
		{"duplicate", []*gauntletv1.CustomProfile{{Name: "flaky-shop", SpecYaml: flakyShop}, {Name: "flaky-shop", SpecYaml: flakyShop}}, `custom_profiles[1].name: duplicate profile "flaky-shop"`},
		{"service fault in sim", []*gauntletv1.CustomProfile{{Name: "d", SpecYaml: "name: d\nfaults:\n  - {id: f, kind: broken_gzip}\n"}},
			"custom_profiles[0] (d): faults[0].kind: broken_gzip cannot apply in a sim env"},
		{"host match in sim", []*gauntletv1.CustomProfile{{Name: "h", SpecYaml: "name: h\nfaults:\n  - {id: f, kind: latency, match: {hosts: [a]}}\n"}},
			"custom_profiles[0] (h): faults[0].match: a sim env's calls have no host"},
		{"bad spec", []*gauntletv1.CustomProfile{{Name: "b", SpecYaml: "name: b\nfaults:\n  - {id: f, kind: latency, params: {mean_ms: -1}}\n"}},
			"custom_profiles[0] (b): faults[0].params.mean_ms: -1 is below the minimum 0 ms"},
		{"SLA broken", []*gauntletv1.CustomProfile{{Name: "s", SpecYaml: "name: s\nsla: {latency_ms: {max: 10}}\nfaults:\n  - {id: f, kind: latency, params: {mean_ms: 50}}\n"}},
			"50 ms expected added latency is above the SLA maximum 10"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := plans.CompileCustomProfiles(tt.cps)
			wantErrs(t, err, tt.want)
		})
	}
	c, _ := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "x", SpecYaml: "name: x\nfaults:\n  - {id: f, kind: latency, match: {services: [warehouse]}}\n"}})
	_, err := c.Plan(1, "x", shopServices)
	wantErrs(t, err, `unknown service "warehouse" (the env has catalog, inventory`)
	// Storage faults compile, but only an env with a sandbox can apply them.
	c, err = plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "d", SpecYaml: "name: d\nfaults:\n  - {id: f, kind: disk_full}\n"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Plan(1, "d", shopServices)
	wantErrs(t, err, `fault f: disk_full applies only in envs whose agents act in a real sandbox (service "sandbox")`)
	// So do DNS faults: the sim makes no lookups, a sandbox's name server does.
	c, err = plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "n", SpecYaml: "name: n\nfaults:\n  - {id: f, kind: dns_nxdomain, match: {hosts: [docs]}}\n"}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Plan(1, "n", shopServices)
	wantErrs(t, err, `fault f: dns_nxdomain applies only in envs whose agents act in a real sandbox (service "sandbox")`)
	plan, err := c.Plan(1, "n", []string{"sandbox"})
	if err != nil {
		t.Fatal(err)
	}
	if rules, err := plans.BoundaryRules(plan); err != nil || len(rules) != 1 || rules[0].Kind.Name != catalogue.KindDNSNXDomain {
		t.Fatalf("dns fault in boundary_spec: %v %v", rules, err)
	}
}

// A sandboxed env's plan carries a profile's storage and resource faults in boundary_spec;
// the injector gives them back, and a Decider over them fires exactly what a Decider over
// the profile's own rules fires.
func TestBoundaryFaultsTravelInThePlan(t *testing.T) {
	const spec = `name: disk-trouble
faults:
  - id: slow
    kind: io_latency
    probability: 0.5
    match: {paths: ["/src/*"]}
    params: {mean_ms: 30, jitter_ms: 5, distribution: lognormal}
  - id: full
    kind: disk_full
    probability: 0.3
    match: {ops: [write]}
  - id: short
    kind: short_write
    params: {keep_fraction: 0.25}
  - id: cpu
    kind: cpu_throttle
    params: {cpu_fraction: 0.2}
  - id: five-xx
    kind: http_error
    probability: 0.1
    params: {status: 503}
`
	_, want, err := plans.ParseSpec([]byte(spec))
	if err != nil {
		t.Fatal(err)
	}
	c, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "disk-trouble", SpecYaml: spec}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := c.Plan(7, "disk-trouble", []string{plans.SandboxService})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Rules) != 1 || plan.Rules[0].Id != "sandbox.five-xx" {
		t.Fatalf("sim rules = %v, want only sandbox.five-xx", plan.Rules)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	got := in.BoundaryRules()
	if len(got) != 4 {
		t.Fatalf("boundary rules = %d, want 4 (io_latency, disk_full, short_write, cpu_throttle):\n%s", len(got), plan.BoundarySpec)
	}
	var boundary []catalogue.Rule
	for _, r := range want {
		if r.Kind.Name != "http_error" {
			boundary = append(boundary, r)
		}
	}
	a, b := inject.NewDecider(plan.Seed, boundary), inject.NewDecider(plan.Seed, got)
	fired := 0
	for i := 0; i < 2000; i++ {
		op := []string{catalogue.OpOpen, catalogue.OpWrite, catalogue.OpRead, catalogue.OpCreate}[i%4]
		key := fmt.Sprintf("fs/src/f%d", i%7)
		ev := catalogue.Event{Layer: catalogue.LayerStorage, Op: op, Path: key[2:]}
		da, db := a.Decide(key, ev), b.Decide(key, ev)
		if !reflect.DeepEqual(da, db) {
			t.Fatalf("event %d: %+v != %+v", i, da, db)
		}
		fired += len(da.Fired)
	}
	if fired == 0 {
		t.Fatal("no fault fired in 2000 events")
	}
	if r1, r2 := inject.ResourcesFor(plan.Seed, boundary), inject.ResourcesFor(plan.Seed, got); r1.CPUMax() != "20000 100000" || r2.CPUMax() != r1.CPUMax() {
		t.Fatalf("cpu.max %q and %q, want 20000 100000", r1.CPUMax(), r2.CPUMax())
	}
	// A plan whose boundary spec is broken is refused, naming the field.
	plan.BoundarySpec = "name: x\nfaults:\n  - {id: f, kind: latency}\n"
	wantErrs(t, plans.Validate(plan), "boundary_spec: faults[0].kind: latency is not a storage, resource or DNS fault")
}

// learnedShopProblems are the five reasons shop cannot run learned-shop.yaml.
var learnedShopProblems = []string{
	"faults[0].kind: timeout cannot apply in a sim env",
	"faults[1].kind: reset cannot apply in a sim env",
	`fault disk-full: disk_full applies only in envs whose agents act in a real sandbox (service "sandbox")`,
	`fault http-429: unknown service "psp" (the env has catalog, inventory`,
	"faults[4].match: a sim env's calls have no host, path, method or op",
}

// TestCustomProfileFitsEnvAllAtOnce: the check a run, `faults validate --env` and `faults
// plan --env` share reports every reason a profile cannot run in an env at once, the
// env's own (no sandbox, unknown services) with the rest.
func TestCustomProfileFitsEnvAllAtOnce(t *testing.T) {
	spec, err := os.ReadFile(filepath.Join("testdata", "profiles", "learned-shop.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := plans.ParseSpec(spec); err != nil {
		t.Fatalf("the learned profile is a valid spec: %v", err)
	}
	cps := []*gauntletv1.CustomProfile{{Name: "learned-shop", SpecYaml: string(spec)}}
	_, err = plans.CheckCustomProfiles(cps, shopServices)
	wantErrs(t, err, learnedShopProblems...)
	// Each problem once.
	for _, p := range learnedShopProblems {
		if n := strings.Count(fmt.Sprint(err), p); n != 1 {
			t.Errorf("%q reported %d times:\n%v", p, n, err)
		}
	}
	// A sandboxed env with those services would take the storage fault, and the
	// connection faults, which its gateway applies.
	_, err = plans.CheckCustomProfiles(cps, append(slices.Clone(shopServices), "psp", plans.SandboxService))
	wantErrs(t, err, learnedShopProblems[4])
	if strings.Contains(fmt.Sprint(err), "disk-full") || strings.Contains(fmt.Sprint(err), "psp") || strings.Contains(fmt.Sprint(err), "timeout") || strings.Contains(fmt.Sprint(err), "reset") {
		t.Errorf("problems an env with a sandbox and psp does not have:\n%v", err)
	}
	// What fits compiles, and plans like CompileCustomProfiles' result.
	c, err := plans.CheckCustomProfiles([]*gauntletv1.CustomProfile{{Name: "flaky-shop", SpecYaml: flakyShop}}, shopServices)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Plan(5, "flaky-shop", shopServices); err != nil {
		t.Fatal(err)
	}
}

// egressTrouble is the profile the docs show: reset 5% of egress connections, cut a
// tenth after 4 KiB, cap the bandwidth at 64 KiB/s, black-hole 1% for 2 s.
const egressTrouble = `name: egress-trouble
faults:
  - {id: rst, kind: reset, probability: 0.05, match: {services: [egress]}, params: {after_bytes: 0}}
  - {id: cut, kind: reset, probability: 0.1, match: {services: [egress]}, params: {after_bytes: 4096}}
  - {id: thin, kind: bandwidth, match: {services: [egress]}, params: {bytes_per_sec: 65536}}
  - {id: hole, kind: timeout, probability: 0.01, match: {hosts: ["*.example.test"]}, params: {hold_ms: 2000}}
  - {id: slow, kind: latency, match: {services: [egress]}, params: {mean_ms: 50, jitter_ms: 0}}
  - {id: loss, kind: packet_loss, match: {services: [egress]}, params: {rate: 0.02, rto_ms: 200}}
`

// TestConnectionFaultsInPlans: a profile may name the connection faults a sandbox's
// gateway applies (reset, a cut after N bytes, bandwidth, timeout); for an env with a
// sandbox they travel in the plan's boundary_spec, drawn under the plan's seed as the
// profile says, and come back from it as written; an env without a sandbox refuses them
// as before; bad values and unknown keys are refused, naming the field.
func TestConnectionFaultsInPlans(t *testing.T) {
	_, want, err := plans.ParseSpec([]byte(egressTrouble))
	if err != nil {
		t.Fatal(err)
	}
	c, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "egress-trouble", SpecYaml: egressTrouble}})
	if err != nil {
		t.Fatalf("compile: %v", err)
	}
	plan, err := c.Plan(11, "egress-trouble", []string{plans.SandboxService, "egress"})
	if err != nil {
		t.Fatalf("plan: %v", err)
	}
	if len(plan.Rules) != 1 || plan.Rules[0].Id != "egress.slow" {
		t.Fatalf("rules = %v, want only egress.slow", plan.Rules)
	}
	if err := plans.Validate(plan); err != nil {
		t.Fatalf("validate: %v", err)
	}
	in, err := inject.NewInjector(plan)
	if err != nil {
		t.Fatal(err)
	}
	got := in.BoundaryRules()
	var ids []string
	for _, r := range got {
		ids = append(ids, r.ID+":"+r.Kind.Name)
	}
	if !slices.Equal(ids, []string{"rst:reset", "cut:reset", "thin:bandwidth", "hole:timeout", "loss:packet_loss"}) {
		t.Fatalf("boundary rules = %v, want the five connection faults:\n%s", ids, plan.BoundarySpec)
	}
	// The same decisions as the profile's own rules, connection after connection.
	a, b := inject.NewDecider(plan.Seed, append(want[:4:4], want[5])), inject.NewDecider(plan.Seed, got)
	kinds := map[string]int{}
	for i := range 2000 {
		key := fmt.Sprintf("tls/a.example.test:443/%d", i)
		ev := catalogue.Event{Layer: catalogue.LayerNetwork, Op: catalogue.OpConnect, Service: "egress", Host: "a.example.test"}
		da, db := a.Decide(key, ev), b.Decide(key, ev)
		if !reflect.DeepEqual(da, db) {
			t.Fatalf("connection %d: %+v != %+v", i, da, db)
		}
		for _, f := range da.Fired {
			kinds[f.RuleID]++
		}
	}
	if kinds["thin"] != 2000 || kinds["rst"] < 60 || kinds["rst"] > 150 || kinds["hole"] == 0 || kinds["cut"] == 0 || kinds["loss"] == 0 {
		t.Errorf("fired %v in 2000 connections, want thin on each, rst on about 5%%, some cut, hole and loss", kinds)
	}

	// A sim env has no connection to meet them: refused as before.
	_, err = c.Plan(11, "egress-trouble", shopServices)
	wantErrs(t, err, "faults[0].kind: reset cannot apply in a sim env", "faults[2].kind: bandwidth cannot apply in a sim env", "faults[3].kind: timeout cannot apply in a sim env", "faults[5].kind: packet_loss cannot apply in a sim env")

	// Strict: bad values and unknown keys are refused, naming the field.
	for _, tc := range []struct{ fault, want string }{
		{`{id: a, kind: reset, params: {after_bytes: -1}}`, "faults[0].params.after_bytes"},
		{`{id: a, kind: reset, params: {after_byte: 10}}`, "faults[0].params.after_byte"},
		{`{id: a, kind: bandwidth, params: {bytes_per_sec: 0}}`, "faults[0].params.bytes_per_sec"},
		{`{id: a, kind: timeout, params: {hold_ms: 1e12}}`, "faults[0].params.hold_ms"},
		{`{id: a, kind: reset, probability: 1.5}`, "faults[0].probability"},
		{`{id: a, kind: reset, odds: 0.5}`, "odds"},
	} {
		_, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "x", SpecYaml: "name: x\nfaults:\n  - " + tc.fault + "\n"}})
		wantErrs(t, err, tc.want)
	}
	// A boundary_spec holding a kind it cannot carry is refused.
	plan.BoundarySpec = "name: x\nfaults:\n  - {id: f, kind: truncate}\n"
	wantErrs(t, plans.Validate(plan), "boundary_spec: faults[0].kind: truncate is not a storage, resource or DNS fault, nor a connection fault")
}
