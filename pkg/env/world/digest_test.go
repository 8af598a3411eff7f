package world

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
)

// trajectoryDigests are the SHA-256 of 300 seeded episodes of each world, oracle and
// random policy, under a stress plan and with more steps than the worlds' max_steps
// (observations, diffs, signals, faults, metering, ends). They pin what a world does for
// a seed: a change that makes evaluation faster must leave every one of them unchanged.
// Recorded with CEL's interpreter evaluating every expression (the files as of 5ee739d;
// the shop file's since it gives the Go shop's trajectories, TestShopPortAgainstTheGoShop).
var trajectoryDigests = map[string]string{
	"bank/oracle":       "8d17a64605d5e1ae377de6df052127877f3786b68592b18c4da6511fbb35e5e6",
	"bank/random":       "7eb415c28d1a24e62cf5af4f8eae72613d085b69d82da34b3999a4433b50c62c",
	"airline/oracle":    "bb63de9ac9d0e74896b83948cef609dc711476abd9174386fc7f976ebbaeb73b",
	"airline/random":    "74dae6ae770c3aa918f1280e7439ef162f6e64dd2d21c83b9a9ade5a308d9907",
	"shop_world/oracle": "188cdd8d56feec08168aff629e8a961fa56c542706d556c2507acb860afb4711",
	"shop_world/random": "f003bf798997cfe0ae00dfbcd65a1c44a415012ad8ea1563955e64730966ee4c",
	"dispatch/oracle":   "24e36b5da2147a2712c3f73ab660fd34073e3f75832571d25f78f4b82fbf2e26",
	"dispatch/random":   "7ffce479164ecb3dc3726dd38064b063fead77c16ac44db636b7002c484513cb",
}

// TestTrajectoryDigests plays 300 seeds of each built-in world (dispatch's two roles
// played by one agent) and the shop's port, oracle and random, and compares the digests
// of their trajectories with the recorded ones.
func TestTrajectoryDigests(t *testing.T) {
	worlds := []struct {
		e      env.Env
		config func(seed uint64) env.Config
	}{
		{bank(t), func(seed uint64) env.Config { return env.Config{Seed: seed, Faults: stressPlan(t, seed)} }},
		{airline(t), func(seed uint64) env.Config { return airlineStress(t, seed) }},
		{shopPort(t), func(seed uint64) env.Config { return shopStress(t, seed) }},
		{dispatch(t), func(seed uint64) env.Config { return dispatchStress(t, seed) }},
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
	agent := policyAgent(t, e, pol, cfg.Seed)
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
