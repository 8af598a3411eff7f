package codefix_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
)

// BenchmarkOracleEpisode measures one whole codefix episode played by the oracle (reset
// from a warm pool, read, patch, test run, submit with the verifier in a forked sandbox,
// release), per runtime, side by side.
//
//	go test -run '^$' -bench OracleEpisode -benchtime 20x ./pkg/env/codefix/
func BenchmarkOracleEpisode(b *testing.B) {
	for _, rt := range []string{runtimes.Process, runtimes.Containerd} {
		b.Run(rt, func(b *testing.B) {
			sb := runtimestest.Open(b, rt, 2)
			oracle, err := policy.Lookup(policy.Oracle)
			if err != nil {
				b.Fatal(err)
			}
			e := codefix.New()
			for i := 0; i < b.N; i++ {
				ep, err := e.NewEpisode(env.Config{Seed: uint64(i), Sandboxes: sb})
				if err != nil {
					b.Fatal(err)
				}
				agent, _ := oracle.NewAgent(e, uint64(i))
				obs, err := ep.Reset()
				if err != nil {
					b.Fatal(err)
				}
				turn := env.Turn{Observation: obs}
				for {
					act, err := agent.Act(turn)
					if err != nil {
						b.Fatal(err)
					}
					res, err := ep.Step(act)
					if err != nil {
						b.Fatal(err)
					}
					if res.Done() {
						if !res.Signals.GetSuccess() {
							b.Fatalf("oracle failed: %s", res.Observation)
						}
						break
					}
					turn = env.Turn{Step: turn.Step + 1, Observation: res.Observation}
				}
				if err := env.Close(ep); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
