package inject_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// BenchmarkSimEdgeCost runs whole oracle episodes of the shop env (the sim pipeline's
// env stage) three ways, side by side, and reports env steps per second and ns per env
// step:
//
//   - none: no fault plan;
//   - edge-inert: the seed's edge plan with every probability set to 0 and latencies to
//     0, so every rule is matched and evaluated on every call but nothing fires: the pure
//     cost of fault evaluation, on the same episodes as none;
//   - edge: the edge plan as drawn, whose faults change the episodes (errors, retries).
//
// docs/benchmarks.md compares none with edge-inert (cost) and with edge (effect).
func BenchmarkSimEdgeCost(b *testing.B) {
	e, err := env.Lookup("shop")
	if err != nil {
		b.Fatal(err)
	}
	services := e.Spec().Services
	mk := map[string]func(seed uint64) *inject.Injector{
		"none": func(uint64) *inject.Injector { return nil },
		"edge-inert": func(seed uint64) *inject.Injector {
			p, err := plans.Derive(seed, plans.ProfileEdge, services)
			if err != nil {
				b.Fatal(err)
			}
			for _, r := range p.Rules {
				r.Probability = 0
				if l, ok := r.Spec.(*gauntletv1.FaultRule_Latency); ok {
					l.Latency.MeanMs, l.Latency.JitterMs = 0, 0
				}
			}
			in, _ := inject.NewInjector(p)
			return in
		},
		"edge": func(seed uint64) *inject.Injector {
			p, err := plans.Derive(seed, plans.ProfileEdge, services)
			if err != nil {
				b.Fatal(err)
			}
			in, _ := inject.NewInjector(p)
			return in
		},
	}
	for _, name := range []string{"none", "edge-inert", "edge"} {
		b.Run(name, func(b *testing.B) {
			envtest.BenchOracle(b, e, func(seed uint64) env.Config { return env.Config{Faults: mk[name](seed)} })
		})
	}
}

// BenchmarkSimEdgeOverhead interleaves the three variants of BenchmarkSimEdgeCost episode
// by episode (same seed for each, variant order rotating), so that load from other
// processes hits all three alike. Each episode's clock covers what a worker does: the
// injector (plan validation included), Reset and every step. Plan derivation, which the
// faults service does before assignment, is timed apart (plan-ns per episode). It reports
// each variant's steps per second and the ratios edge-inert/none (the cost of evaluating
// faults) and edge/none (their effect on the episodes).
func BenchmarkSimEdgeOverhead(b *testing.B) {
	e, err := env.Lookup("shop")
	if err != nil {
		b.Fatal(err)
	}
	services := e.Spec().Services
	o := e.(env.Oracle)
	plan := func(seed uint64, inert bool) *gauntletv1.FaultPlan {
		p, err := plans.Derive(seed, plans.ProfileEdge, services)
		if err != nil {
			b.Fatal(err)
		}
		if inert {
			for _, r := range p.Rules {
				r.Probability = 0
				if l, ok := r.Spec.(*gauntletv1.FaultRule_Latency); ok {
					l.Latency.MeanMs, l.Latency.JitterMs = 0, 0
				}
			}
		}
		return p
	}
	// The faults service derives plans before the worker sees an episode: derive them up
	// front (timing the derivation apart), so neither their time nor their garbage lands
	// on the worker's clock. The injector (plan validation included) is on it.
	const distinct = 2048
	var plans [3][distinct + 1]*gauntletv1.FaultPlan
	t := time.Now()
	for s := uint64(1); s <= distinct; s++ {
		plans[2][s] = plan(s, false)
	}
	planNs := float64(time.Since(t).Nanoseconds()) / distinct
	for s := uint64(1); s <= distinct; s++ {
		plans[1][s] = plan(s, true)
	}
	runtime.GC()
	episode := func(seed uint64, variant int) (int, time.Duration) {
		p := plans[variant][(seed-1)%distinct+1]
		t0 := time.Now()
		var in *inject.Injector
		if p != nil {
			in, _ = inject.NewInjector(p)
		}
		ep, err := e.NewEpisode(env.Config{Seed: seed, Faults: in})
		if err != nil {
			b.Fatal(err)
		}
		obs, err := ep.Reset()
		if err != nil {
			b.Fatal(err)
		}
		agent := o.Oracle(seed)
		steps := 0
		for i := uint32(0); ; i++ {
			a, err := agent.Act(env.Turn{Step: i, Observation: obs})
			if err != nil {
				b.Fatal(err)
			}
			r, err := ep.Step(a)
			if err != nil {
				b.Fatal(err)
			}
			steps++
			obs = r.Observation
			if r.Done() {
				break
			}
		}
		return steps, time.Since(t0)
	}
	var steps [3]int
	var took [3]time.Duration
	seed := uint64(0)
	b.ResetTimer()
	for b.Loop() {
		seed++
		for k := range 3 {
			v := (int(seed) + k) % 3
			n, d := episode(seed, v)
			steps[v] += n
			took[v] += d
		}
	}
	rate := func(v int) float64 { return float64(steps[v]) / took[v].Seconds() }
	b.ReportMetric(rate(0), "none-steps/s")
	b.ReportMetric(rate(1), "inert-steps/s")
	b.ReportMetric(rate(2), "edge-steps/s")
	b.ReportMetric(rate(1)/rate(0), "inert/none")
	b.ReportMetric(rate(2)/rate(0), "edge/none")
	b.ReportMetric(planNs, "plan-ns")
	b.ReportMetric(float64(took[0].Nanoseconds())/float64(max(1, steps[0])), "none-ns/step")
}

// BenchmarkInjectorCallEdge is the cost of evaluating one call against an edge plan.
func BenchmarkInjectorCallEdge(b *testing.B) {
	p, err := plans.Derive(1, plans.ProfileEdge, shopServices)
	if err != nil {
		b.Fatal(err)
	}
	in, _ := inject.NewInjector(p)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		s := shopServices[i%len(shopServices)]
		in.Call(s, s+".get", 0)
		i++
	}
}

// BenchmarkDeciderEdge is the cost of one boundary decision against a realistic spec.
func BenchmarkDeciderEdge(b *testing.B) {
	_, rules, err := plans.ParseSpec([]byte(`name: bench
faults:
  - {id: lat, kind: latency, params: {mean_ms: 50, jitter_ms: 10}}
  - {id: e429, kind: http_error, probability: 0.02, params: {status: 429, retry_after_ms: 1000}}
  - {id: e503, kind: http_error, probability: 0.01, params: {status: 503}}
  - {id: cut, kind: truncate, probability: 0.01, params: {keep_fraction: 0.5}}
  - {id: loss, kind: packet_loss, params: {rate: 0.01, burst_len: 3}}
`))
	if err != nil {
		b.Fatal(err)
	}
	d := inject.NewDecider(1, rules)
	ev := catalogue.Event{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Host: "api", Path: "/v1/x", Method: "GET"}
	b.ReportAllocs()
	for b.Loop() {
		d.Decide("http/api", ev)
	}
}

// BenchmarkDeciderQuiet is one boundary decision where the rules match but rarely fire
// (no latency on every event): the common case of a file or connection boundary.
func BenchmarkDeciderQuiet(b *testing.B) {
	_, rules, err := plans.ParseSpec([]byte(`name: bench
faults:
  - {id: e429, kind: http_error, probability: 0.02, params: {status: 429, retry_after_ms: 1000}}
  - {id: e503, kind: http_error, probability: 0.01, params: {status: 503}}
  - {id: cut, kind: truncate, probability: 0.01, params: {keep_fraction: 0.5}}
  - {id: slow, kind: latency, probability: 0.01, params: {mean_ms: 50, jitter_ms: 10}}
  - {id: full, kind: disk_full, probability: 0.5}
`))
	if err != nil {
		b.Fatal(err)
	}
	d := inject.NewDecider(1, rules)
	ev := catalogue.Event{Layer: catalogue.LayerService, Op: catalogue.OpRequest, Host: "api", Path: "/v1/x", Method: "GET"}
	b.ReportAllocs()
	for b.Loop() {
		d.Decide("http/api", ev)
	}
}
