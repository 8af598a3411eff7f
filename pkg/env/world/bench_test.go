package world

import (
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// BenchmarkOracleEpisode runs whole bank oracle episodes without faults (Reset included) and
// reports env steps per second of one goroutine.
func BenchmarkOracleEpisode(b *testing.B) {
	benchEpisodes(b, func(uint64) env.Config { return env.Config{} })
}

// BenchmarkOracleEpisodeFaults is BenchmarkOracleEpisode under the stress fault plan.
func BenchmarkOracleEpisodeFaults(b *testing.B) {
	benchEpisodes(b, func(seed uint64) env.Config { return env.Config{Faults: stressPlan(b, seed)} })
}

func benchEpisodes(b *testing.B, mk func(seed uint64) env.Config) {
	e := bank(b)
	o := e.(env.Oracle)
	steps := 0
	var stepTime time.Duration
	b.ReportAllocs()
	seed := uint64(0)
	for b.Loop() {
		seed++
		cfg := mk(seed)
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

// BenchmarkLoadBank loads the bank's file: what `worlds validate`, a process's start and
// each fuzz input of the loader cost.
func BenchmarkLoadBank(b *testing.B) {
	data, err := builtinFS.ReadFile("builtin/bank.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load("bank.yaml", data); err != nil {
			b.Fatal(err)
		}
	}
}
