package envtest

import (
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// BenchOracle plays whole episodes of e's oracle, seeds 1, 2, ..., one per iteration
// (Reset included), each with config(seed) (its Seed set), and reports env steps per
// second of one goroutine (steps/s) and the time of Step alone (ns/env-step). e must be
// an env.Oracle.
func BenchOracle(b *testing.B, e env.Env, config func(seed uint64) env.Config) {
	o := e.(env.Oracle)
	steps := 0
	var stepTime time.Duration
	seed := uint64(0)
	for b.Loop() {
		seed++
		cfg := config(seed)
		cfg.Seed = seed
		ep, err := e.NewEpisode(cfg)
		if err != nil {
			b.Fatal(err)
		}
		obs, err := ep.Reset()
		if err != nil {
			b.Fatal(err)
		}
		agent := o.Oracle(seed)
		for i := uint32(0); ; i++ {
			a, err := agent.Act(env.Turn{Step: i, Observation: obs})
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			r, err := ep.Step(a)
			stepTime += time.Since(t0)
			if err != nil {
				b.Fatal(err)
			}
			steps++
			obs = r.Observation
			if r.Done() {
				break
			}
		}
	}
	b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(float64(stepTime.Nanoseconds())/float64(steps), "ns/env-step")
}
