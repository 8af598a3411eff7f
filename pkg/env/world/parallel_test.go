package world

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// TestEpisodesInParallel: episodes of one world played at once (sharing its compiled
// programs and whatever the world keeps across episodes) give the trajectories they give
// alone. Run under -race too.
func TestEpisodesInParallel(t *testing.T) {
	e := shopPort(t)
	play := func(seed uint64) string {
		ep, err := e.NewEpisode(env.Config{Seed: seed})
		if err != nil {
			t.Error(err)
			return ""
		}
		obs, err := ep.Reset()
		if err != nil {
			t.Error(err)
			return ""
		}
		out := string(obs)
		agent := e.(env.Oracle).Oracle(seed)
		for turn := uint32(0); ; turn++ {
			a, err := agent.Act(env.Turn{Step: turn, Observation: obs})
			if err != nil {
				t.Error(err)
				return out
			}
			r, err := ep.Step(a)
			if err != nil {
				t.Error(err)
				return out
			}
			obs, out = r.Observation, out+string(r.Observation)+string(r.Diff)
			if r.Done() {
				return out
			}
		}
	}
	const seeds = 40
	alone := make([]string, seeds)
	for i := range alone {
		alone[i] = play(uint64(i + 1))
	}
	got := make([]string, seeds)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := g; i < seeds; i += 4 {
				got[i] = play(uint64(i + 1))
			}
		}()
	}
	for range 4 {
		<-done
	}
	for i := range alone {
		if got[i] != alone[i] {
			t.Errorf("seed %d: played beside others, the trajectory differs from the one played alone", i+1)
		}
	}
}
