package world

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
)

// trajectoryDigests are the SHA-256 of 300 seeded episodes of each world, oracle and
// random policy, under a stress plan and with more steps than the worlds' max_steps
// (observations, diffs, signals, faults, metering, ends). They pin what a world does for
// a seed: a change that makes evaluation faster must leave every one of them unchanged.
// Recorded with CEL's interpreter evaluating every expression.
var trajectoryDigests = map[string]string{
	"bank/oracle":       "410f1e384b8cdb72e3b501a4a21b51b3025d39cfd361dc5f4a587557ae06dfee",
	"bank/random":       "72c08e83c56ba4851637f79d69b63db5d3a601f9f27cc9d8036ca701b4fbf2d8",
	"airline/oracle":    "11863be0e2f0f7463b60c448ac4ea56890a98b56993b71cecea9683aa15cdd3b",
	"airline/random":    "e32622e51098e412d5d8594834f14226090910a576c49163ccb331e2bf681439",
	"shop_world/oracle": "530db49296d925210139b8fdd49d40c54df9613c539502320195c968621492b2",
	"shop_world/random": "c4ee7cdc4851dc94773eb1bdcee4552d7f31b85cd943859c18c9e0eefedf1c61",
}

// TestTrajectoryDigests plays 300 seeds of each built-in world and the shop's port,
// oracle and random, and compares the digests of their trajectories with the recorded
// ones.
func TestTrajectoryDigests(t *testing.T) {
	worlds := []struct {
		e      env.Env
		config func(seed uint64) env.Config
	}{
		{bank(t), func(seed uint64) env.Config { return env.Config{Seed: seed, Faults: stressPlan(t, seed)} }},
		{airline(t), func(seed uint64) env.Config { return airlineStress(t, seed) }},
		{shopPort(t), func(seed uint64) env.Config { return shopStress(t, seed) }},
	}
	const seeds = 300
	for _, w := range worlds {
		for _, pol := range []string{"oracle", "random"} {
			name := w.e.Spec().Name + "/" + pol
			h := sha256.New()
			for seed := uint64(1); seed <= seeds; seed++ {
				cfg := w.config(seed)
				if seed%3 == 0 {
					cfg.MaxSteps = 60 // beyond every world's own max_steps: costs tracked
				}
				playDigest(t, h, w.e, pol, cfg)
			}
			got := hex.EncodeToString(h.Sum(nil))
			if want := trajectoryDigests[name]; got != want {
				t.Errorf("%s: trajectories of %d seeds hash to %s, want %s", name, seeds, got, want)
			}
		}
	}
}

// playDigest plays one episode and writes everything it recorded into h.
func playDigest(t *testing.T, h hash.Hash, e env.Env, pol string, cfg env.Config) {
	t.Helper()
	var agent env.Agent
	if pol == "oracle" {
		agent = e.(env.Oracle).Oracle(cfg.Seed)
	} else {
		p, err := policy.Lookup(pol)
		if err != nil {
			t.Fatal(err)
		}
		if agent, err = p.NewAgent(e, cfg.Seed); err != nil {
			t.Fatal(err)
		}
	}
	ep, err := e.NewEpisode(cfg)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	h.Write(obs)
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: obs})
		if err != nil {
			t.Fatalf("seed %d step %d: %v", cfg.Seed, i, err)
		}
		r, err := ep.Step(a)
		if err != nil {
			t.Fatalf("seed %d step %d: %v", cfg.Seed, i, err)
		}
		h.Write([]byte(a.Tool))
		h.Write(a.Args)
		h.Write(r.Observation)
		h.Write(r.Diff)
		for _, m := range []proto.Message{r.Signals, r.Metering} {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
		for _, f := range r.Faults {
			b, err := proto.MarshalOptions{Deterministic: true}.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			h.Write(b)
		}
		var end [8]byte
		binary.LittleEndian.PutUint32(end[:], uint32(r.Reason))
		binary.LittleEndian.PutUint32(end[4:], uint32(ep.Now().Milliseconds()))
		h.Write(end[:])
		obs = r.Observation
		if r.Done() {
			return
		}
	}
}
