package world

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

var shopPortOnce sync.Once

// shopPort loads examples/worlds/shop.yaml, the shop re-expressed as a world file, and
// registers it (the conformance suite looks an env up by its name).
func shopPort(t testing.TB) env.Env {
	t.Helper()
	data, err := os.ReadFile("../../../examples/worlds/shop.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := Load("shop.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	shopPortOnce.Do(func() { env.Register(w.Env()) })
	e, err := env.Lookup(w.Name())
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestShopPortConformance: the shop as a world file passes the suite every env passes,
// its oracle under a stress plan of the shop's services.
func TestShopPortConformance(t *testing.T) {
	envtest.Run(t, envtest.Subject{
		Env: shopPort(t),
		Config: func(t testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Faults: injector(t, seed,
				httpErr("pay-503", "payment", 0.3, 503, 250), latency("lat", "*", 0.5, 40, 20),
				truncate("cat-trunc", "catalog", 0.1, 0.5), truncate("pay-trunc", "payment.pay", 0.1, 0.2))}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: "wait", Args: json.RawMessage(`{"ms":100}`)},
		ErrNotReset: ErrNotReset,
	})
}

// episodeOf plays an env's oracle through one episode without faults.
func episodeOf(t *testing.T, e env.Env, seed uint64) (tools []string, obs [][]byte, last env.StepResult) {
	t.Helper()
	ep, err := e.NewEpisode(env.Config{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	o, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	agent := e.(env.Oracle).Oracle(seed)
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: o})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		r, err := ep.Step(a)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		tools, obs, o = append(tools, a.Tool), append(obs, r.Observation), r.Observation
		if r.Done() {
			return tools, obs, r
		}
	}
}

// TestShopPortAgainstTheGoShop measures how close the port's oracle episodes are to the
// Go shop's for the same seeds: how often each oracle wins, how often the two play the
// same tools in the same order, and how often an observation is the same bytes. The
// worlds themselves differ (the port draws its catalog its own way, docs/worlds.md), so
// tool sequences differ wherever the catalogs make the oracles check a different number
// of candidates, and observations match only where they carry no drawn value.
func TestShopPortAgainstTheGoShop(t *testing.T) {
	port, goShop := shopPort(t), shop.New()
	const seeds = 300
	var portWins, goWins, sameTools, sameObs, steps int
	for seed := uint64(1); seed <= seeds; seed++ {
		pt, po, pl := episodeOf(t, port, seed)
		gt, gob, gl := episodeOf(t, goShop, seed)
		if pl.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			portWins++
		} else {
			t.Errorf("seed %d: the port's oracle ended %s after %s", seed, pl.Reason, strings.Join(pt, ", "))
		}
		if gl.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			goWins++
		}
		if strings.Join(pt, ",") == strings.Join(gt, ",") {
			sameTools++
		}
		for i := range min(len(po), len(gob)) {
			steps++
			if string(po[i]) == string(gob[i]) {
				sameObs++
			}
		}
	}
	t.Logf("over %d seeds without faults: the port's oracle won %d, the Go shop's %d; same tool sequence %d; identical observations %d of %d compared steps",
		seeds, portWins, goWins, sameTools, sameObs, steps)
	if goWins != seeds {
		t.Errorf("the Go shop's oracle won %d of %d: the comparison's baseline moved", goWins, seeds)
	}
}
