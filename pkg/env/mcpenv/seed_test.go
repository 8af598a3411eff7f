package mcpenv_test

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
)

// TestLargeSeedReachesTheVerifier: the pipeline's seeds use all 64 bits; the verifier's
// condition sees the seed the task names.
func TestLargeSeedReachesTheVerifier(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	ep, _ := newEpisode(t, mcpenv.New(notes(t)), env.Config{Seed: 9509953958448690639, Sandboxes: sb})
	mustStep(t, ep, "notes.put", `{"name":"n9509953958448690639","text":"remember the milk"}`)
	if r := mustStep(t, ep, "notes.get", `{"name":"n9509953958448690639"}`); !r.Signals.GetSuccess() {
		t.Fatalf("get: %s, no success", r.Observation)
	}
}

// TestOracleReadsTheEpisodesSeed: the oracle policy builds its agent with a seed of its
// own, not the episode's; the plan's "{seed}" is the episode's, read from the first
// observation, or the oracle would never win in the pipeline.
func TestOracleReadsTheEpisodesSeed(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	e := mcpenv.New(notes(t))
	ep, first := newEpisode(t, e, env.Config{Seed: 9509953958448690639, Sandboxes: sb})
	agent := e.(env.Oracle).Oracle(42)
	turn := env.Turn{Observation: first}
	for i := range 6 {
		a, err := agent.Act(turn)
		if err != nil {
			t.Fatal(err)
		}
		r := mustStep(t, ep, a.Tool, string(a.Args))
		if r.Done() {
			if !r.Signals.GetSuccess() {
				t.Fatalf("ended without success: %s", r.Observation)
			}
			return
		}
		turn = env.Turn{Step: uint32(i + 1), Observation: r.Observation}
	}
	t.Fatal("the oracle did not win in 6 steps")
}
