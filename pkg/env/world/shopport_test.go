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

var (
	shopPortOnce sync.Once
	shopPortEnv  env.Env
	shopPortErr  error
)

// shopPort loads examples/worlds/shop.yaml, the shop re-expressed as a world file, once,
// and registers it (the conformance suite looks an env up by its name).
func shopPort(t testing.TB) env.Env {
	t.Helper()
	shopPortOnce.Do(func() {
		data, err := os.ReadFile("../../../examples/worlds/shop.yaml")
		if err != nil {
			shopPortErr = err
			return
		}
		w, err := Load("shop.yaml", data)
		if err != nil {
			shopPortErr = err
			return
		}
		env.Register(w.Env())
		shopPortEnv, shopPortErr = env.Lookup(w.Name())
	})
	if shopPortErr != nil {
		t.Fatal(shopPortErr)
	}
	return shopPortEnv
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

// TestRetryAfterSuggestionIsTheShops: calling a service before its Retry-After passed is
// refused with the Go shop's own suggestion, naming the world's wait tool.
func TestRetryAfterSuggestionIsTheShops(t *testing.T) {
	suggestion := func(e env.Env) string {
		t.Helper()
		ep, err := e.NewEpisode(env.Config{Seed: 3, Faults: injector(t, 3, httpErr("pay-503", "payment", 1, 503, 250))})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var r env.StepResult
		for range 2 {
			if r, err = ep.Step(env.Action{Tool: "wallet.balance", Args: json.RawMessage(`{}`)}); err != nil {
				t.Fatal(err)
			}
		}
		v := r.Signals.GetViolations()
		if len(v) != 1 || v[0].GetRule() != RuleRespectRetryAfter {
			t.Fatalf("%s: the second call in the Retry-After window: %s %v", e.Spec().Name, r.Observation, v)
		}
		return v[0].GetSuggestion()
	}
	if got, want := suggestion(shopPort(t)), suggestion(shop.New()); got != want {
		t.Fatalf("the port suggests %q, the Go shop %q", got, want)
	}
}

// TestShopPortSpecIsTheShops: the port publishes the Go shop's action space, tool for
// tool (name, service, description, schema), but for the example id in the sku's
// description: the port's skus are sku-1..sku-12, the shop's hex.
func TestShopPortSpecIsTheShops(t *testing.T) {
	goSpec, port := shop.New().Spec(), shopPort(t).Spec()
	if len(goSpec.Tools) != len(port.Tools) || goSpec.Description != port.Description {
		t.Fatalf("%d tools against the shop's %d; description %q against %q", len(port.Tools), len(goSpec.Tools), port.Description, goSpec.Description)
	}
	for i, g := range goSpec.Tools {
		p := port.Tools[i]
		schema := strings.ReplaceAll(string(g.Schema), `e.g. \"sku-3f2a\"`, `e.g. \"sku-3\"`)
		if p.Name != g.Name || p.Service != g.Service || p.Description != g.Description || string(p.Schema) != schema {
			t.Errorf("tool %d:\n port %s %s %q %s\n shop %s %s %q %s", i, p.Name, p.Service, p.Description, p.Schema, g.Name, g.Service, g.Description, schema)
		}
	}
}
