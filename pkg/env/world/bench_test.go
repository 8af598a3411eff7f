package world

import (
	"syscall"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// BenchmarkOracleEpisode runs whole bank oracle episodes without faults (Reset included) and
// reports env steps per second of one goroutine.
func BenchmarkOracleEpisode(b *testing.B) {
	benchEpisodes(b, bank(b), func(uint64) env.Config { return env.Config{} })
}

// BenchmarkOracleEpisodeFaults is BenchmarkOracleEpisode under the stress fault plan.
func BenchmarkOracleEpisodeFaults(b *testing.B) {
	benchEpisodes(b, bank(b), func(seed uint64) env.Config { return env.Config{Faults: stressPlan(b, seed)} })
}

// BenchmarkShopStep and BenchmarkShopWorldStep run the same oracle episodes of the same
// world side by side: the Go shop, and the shop as a world file (examples/worlds/shop.yaml).
// ns/env-step is what one Step costs; ns/op a whole episode with its Reset and the
// oracle's choices.
func BenchmarkShopStep(b *testing.B) {
	benchEpisodes(b, shop.New(), func(uint64) env.Config { return env.Config{} })
}

// BenchmarkShopWorldStep is BenchmarkShopStep for the shop as a world file.
func BenchmarkShopWorldStep(b *testing.B) {
	benchEpisodes(b, shopPort(b), func(uint64) env.Config { return env.Config{} })
}

// BenchmarkShopReplay and BenchmarkShopWorldReplay replay the recorded oracle
// episodes of 200 seeds (their actions chosen before the timer): the env's own work as
// the pipeline has it, a Reset and the steps, with the garbage collection that work
// causes and no other. cpu-ns/env-step is the CPU of the steps; in BenchmarkShopStep
// it also carries the collection of the oracle's garbage (its plan's CEL, the
// observations it decodes), which is not the env's.
func BenchmarkShopReplay(b *testing.B) { benchReplay(b, shop.New(), "oracle") }

// BenchmarkShopWorldReplay is BenchmarkShopReplay for the shop as a world file.
func BenchmarkShopWorldReplay(b *testing.B) { benchReplay(b, shopPort(b), "oracle") }

// BenchmarkShopRandomReplay and BenchmarkShopWorldRandomReplay replay the random
// policy's episodes: in the pipeline's runs of half oracle, half random episodes, four
// steps in five are the random policy's (its episodes run to max_steps, its arguments
// good and bad).
func BenchmarkShopRandomReplay(b *testing.B) { benchReplay(b, shop.New(), "random") }

// BenchmarkShopWorldRandomReplay is BenchmarkShopRandomReplay for the world file.
func BenchmarkShopWorldRandomReplay(b *testing.B) { benchReplay(b, shopPort(b), "random") }

// BenchmarkShopRandomReplayBaseline and BenchmarkShopWorldRandomReplayBaseline replay
// them under the pipeline's "baseline" fault profile (each seed's plan, a fresh
// injector per episode, as the worker makes one).
func BenchmarkShopRandomReplayBaseline(b *testing.B) {
	benchReplayFaults(b, shop.New(), "random", plans.ProfileBaseline)
}

// BenchmarkShopWorldRandomReplayBaseline is BenchmarkShopRandomReplayBaseline for the
// world file.
func BenchmarkShopWorldRandomReplayBaseline(b *testing.B) {
	benchReplayFaults(b, shopPort(b), "random", plans.ProfileBaseline)
}

// benchReplay plays the episodes of 200 seeds with policy pol, then replays their
// actions on new episodes.
func benchReplay(b *testing.B, e env.Env, pol string) { benchReplayFaults(b, e, pol, "") }

// benchReplayFaults is benchReplay with each episode under profile's fault plan for its
// seed ("": none).
func benchReplayFaults(b *testing.B, e env.Env, pol, profile string) {
	const seeds = 200
	plays, config := recordPlays(b, e, pol, profile, seeds)
	b.ReportAllocs()
	steps := 0
	var stepCPU time.Duration
	cpu0 := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		ep, err := e.NewEpisode(config(uint64(i%seeds + 1)))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			b.Fatal(err)
		}
		c0 := cpuTime(b)
		for _, a := range plays[i%seeds] {
			if _, err := ep.Step(a); err != nil {
				b.Fatal(err)
			}
		}
		stepCPU += cpuTime(b) - c0
		steps += len(plays[i%seeds])
	}
	b.ReportMetric(float64(stepCPU.Nanoseconds())/float64(steps), "cpu-ns/env-step")
	b.ReportMetric(float64((cpuTime(b)-cpu0-stepCPU).Nanoseconds())/float64(b.N), "cpu-ns/reset")
}

func benchEpisodes(b *testing.B, e env.Env, mk func(seed uint64) env.Config) {
	o := e.(env.Oracle)
	steps := 0
	var stepTime, stepCPU time.Duration
	b.ReportAllocs()
	seed := uint64(0)
	cpu0 := cpuTime(b)
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
		var acts []env.Action
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
			acts = append(acts, a)
			if r.Done() {
				break
			}
		}
		// The same episode again, its actions replayed, to read the CPU its steps alone
		// take: a shared machine stretches wall time, not CPU time.
		ep, err = e.NewEpisode(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			b.Fatal(err)
		}
		c0 := cpuTime(b)
		for _, a := range acts {
			if _, err := ep.Step(a); err != nil {
				b.Fatal(err)
			}
		}
		stepCPU += cpuTime(b) - c0
	}
	b.ReportMetric(float64(2*steps)/b.Elapsed().Seconds(), "steps/s") // each episode is played twice
	b.ReportMetric(float64(stepTime.Nanoseconds())/float64(steps), "ns/env-step")
	b.ReportMetric(float64(stepCPU.Nanoseconds())/float64(steps), "cpu-ns/env-step")
	b.ReportMetric(float64((cpuTime(b)-cpu0-stepCPU).Nanoseconds())/float64(b.N), "cpu-ns/episode")
}

// cpuTime is the CPU time the process has used, every thread (the garbage collector's
// too).
// recordPlays plays seeds 1 to n with policy pol, each under profile's fault plan for its
// seed ("": none), and returns each seed's actions and the config that replays them (a
// fresh injector each call, as the worker makes one per episode).
func recordPlays(b *testing.B, e env.Env, pol, profile string, n int) ([][]env.Action, func(seed uint64) env.Config) {
	plays := make([][]env.Action, n)
	var faultPlans []*gauntletv1.FaultPlan
	config := func(seed uint64) env.Config {
		cfg := env.Config{Seed: seed}
		if profile != "" {
			in, err := inject.NewInjector(faultPlans[seed-1])
			if err != nil {
				b.Fatal(err)
			}
			cfg.Faults = in
		}
		return cfg
	}
	if profile != "" {
		for i := range n {
			p, err := plans.Derive(uint64(i+1), profile, e.Spec().Services)
			if err != nil {
				b.Fatal(err)
			}
			faultPlans = append(faultPlans, p)
		}
	}
	for i := range plays {
		seed := uint64(i + 1)
		ep, err := e.NewEpisode(config(seed))
		if err != nil {
			b.Fatal(err)
		}
		obs, err := ep.Reset()
		if err != nil {
			b.Fatal(err)
		}
		agent := policyAgent(b, e, pol, seed)
		for turn := uint32(0); ; turn++ {
			a, err := agent.Act(env.Turn{Step: turn, Observation: obs})
			if err != nil {
				b.Fatal(err)
			}
			r, err := ep.Step(a)
			if err != nil {
				b.Fatal(err)
			}
			plays[i], obs = append(plays[i], a), r.Observation
			if r.Done() {
				break
			}
		}
	}
	return plays, config
}

// BenchmarkShopInterleaved and BenchmarkShopWorldInterleaved replay 400 episodes of
// the pipeline's kind (half oracle, half random, under the baseline profile) a step of
// each at a time, as a worker with that many in flight does: each episode's state is
// cold when its turn comes again. cpu-ns/env-step is the CPU of the steps, cpu-ns/reset
// that of the resets (all made first).
func BenchmarkShopInterleaved(b *testing.B) { benchInterleaved(b, shop.New()) }

// BenchmarkShopWorldInterleaved is BenchmarkShopInterleaved for the world file.
func BenchmarkShopWorldInterleaved(b *testing.B) { benchInterleaved(b, shopPort(b)) }

func benchInterleaved(b *testing.B, e env.Env) {
	const seeds = 200
	var plays [][]env.Action
	var configs []func(uint64) env.Config
	for _, pol := range []string{"oracle", "random"} {
		p, config := recordPlays(b, e, pol, plans.ProfileBaseline, seeds)
		for range p {
			configs = append(configs, config)
		}
		plays = append(plays, p...)
	}
	b.ReportAllocs()
	eps := make([]env.Episode, len(plays))
	steps := 0
	var stepCPU, resetCPU time.Duration
	for b.Loop() {
		c0 := cpuTime(b)
		longest := 0
		for i := range eps {
			ep, err := e.NewEpisode(configs[i](uint64(i%seeds + 1)))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := ep.Reset(); err != nil {
				b.Fatal(err)
			}
			eps[i], longest = ep, max(longest, len(plays[i]))
		}
		c1 := cpuTime(b)
		for k := range longest {
			for i, ep := range eps {
				if k < len(plays[i]) {
					if _, err := ep.Step(plays[i][k]); err != nil {
						b.Fatal(err)
					}
					steps++
				}
			}
		}
		resetCPU += c1 - c0
		stepCPU += cpuTime(b) - c1
	}
	b.ReportMetric(float64(stepCPU.Nanoseconds())/float64(steps), "cpu-ns/env-step")
	b.ReportMetric(float64(resetCPU.Nanoseconds())/float64(b.N*len(eps)), "cpu-ns/reset")
	b.ReportMetric(float64((stepCPU+resetCPU).Nanoseconds())/float64(steps), "cpu-ns/step-all")
}

// policyAgent is policy pol's agent for one episode of e: the env's oracle, or a
// policy of pkg/policy.
func policyAgent(t testing.TB, e env.Env, pol string, seed uint64) env.Agent {
	t.Helper()
	if pol == "oracle" {
		return e.(env.Oracle).Oracle(seed)
	}
	p, err := policy.Lookup(pol)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := p.NewAgent(e, seed)
	if err != nil {
		t.Fatal(err)
	}
	return agent
}

func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// BenchmarkShopReset and BenchmarkShopWorldReset build one episode's world and its first
// observation (NewEpisode and Reset), side by side: what every episode pays before its
// first step, the catalog's generation mostly.
func BenchmarkShopReset(b *testing.B) { benchReset(b, shop.New()) }

// BenchmarkShopWorldReset is BenchmarkShopReset for the shop as a world file.
func BenchmarkShopWorldReset(b *testing.B) { benchReset(b, shopPort(b)) }

func benchReset(b *testing.B, e env.Env) {
	b.ReportAllocs()
	cpu0 := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		ep, err := e.NewEpisode(env.Config{Seed: uint64(i%1000 + 1)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			b.Fatal(err)
		}
	}
	// CPU time, the collector's included: a shared machine stretches wall time.
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/reset")
}

// BenchmarkShopOracle and BenchmarkShopWorldOracle give each env's oracle the recorded
// observations of its own episodes (200 seeds, recorded before the timer): the policy's
// work alone, Act by Act, with no env stepping between. cpu-ns/act is the process's CPU
// per Act, the collection of the oracle's garbage included.
func BenchmarkShopOracle(b *testing.B) { benchOracle(b, shop.New()) }

// BenchmarkShopWorldOracle is BenchmarkShopOracle for the shop as a world file.
func BenchmarkShopWorldOracle(b *testing.B) { benchOracle(b, shopPort(b)) }

func benchOracle(b *testing.B, e env.Env) {
	const seeds = 200
	turns := make([][]env.Turn, seeds)
	for i := range turns {
		seed := uint64(i + 1)
		ep, err := e.NewEpisode(env.Config{Seed: seed})
		if err != nil {
			b.Fatal(err)
		}
		obs, err := ep.Reset()
		if err != nil {
			b.Fatal(err)
		}
		agent := e.(env.Oracle).Oracle(seed)
		for turn := uint32(0); ; turn++ {
			t := env.Turn{Step: turn, Observation: obs}
			a, err := agent.Act(t)
			if err != nil {
				b.Fatal(err)
			}
			turns[i] = append(turns[i], t)
			r, err := ep.Step(a)
			if err != nil {
				b.Fatal(err)
			}
			if obs = r.Observation; r.Done() {
				break
			}
		}
	}
	b.ReportAllocs()
	acts := 0
	cpu0 := cpuTime(b)
	for i := 0; b.Loop(); i++ {
		agent := e.(env.Oracle).Oracle(uint64(i%seeds + 1))
		for _, t := range turns[i%seeds] {
			if _, err := agent.Act(t); err != nil {
				b.Fatal(err)
			}
		}
		acts += len(turns[i%seeds])
	}
	b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/float64(acts), "cpu-ns/act")
}
