package envtest

import "github.com/gauntlet-rl/gauntlet/pkg/env"

// Takeover is an agent that plays first's actions for the first k steps, telling next of
// each when next is an env.Follower, then lets next play: an episode forked at step k
// (gauntlet episode fork), for tests of an oracle taking over.
func Takeover(first, next env.Agent, k uint32) env.Agent {
	return takeover{first: first, next: next, k: k}
}

type takeover struct {
	first, next env.Agent
	k           uint32
}

func (a takeover) Act(t env.Turn) (env.Action, error) {
	if t.Step >= a.k {
		return a.next.Act(t)
	}
	act, err := a.first.Act(t)
	if f, ok := a.next.(env.Follower); ok && err == nil {
		f.Follow(t, act)
	}
	return act, err
}
