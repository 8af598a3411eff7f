package world

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
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

// TestShopPortConformanceWithParams: the suite again under a larger catalog and larger
// quantities than the defaults: replays, determinism and the limits hold whatever the
// params.
func TestShopPortConformanceWithParams(t *testing.T) {
	const params = `"products":40,"qty_max":7`
	envtest.Run(t, envtest.Subject{
		Env: shopPort(t),
		Config: func(t testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Params: json.RawMessage("{" + params + "}"), Faults: injector(t, seed,
				httpErr("pay-503", "payment", 0.3, 503, 250), latency("lat", "*", 0.5, 40, 20),
				truncate("cat-trunc", "catalog", 0.1, 0.5))}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d,%s}`, maxInvalid, deadlineMs, params)
		},
		Idle:        env.Action{Tool: "wait", Args: json.RawMessage(`{"ms":100}`)},
		ErrNotReset: ErrNotReset,
	})
}

// shopPolicy chooses the actions both shops are given: the Go shop's oracle, or a seeded
// random agent that calls every tool with arguments good and bad (skus and order ids it
// saw, others it made up, long and non-ASCII text, bad types and ranges).
type shopPolicy interface {
	act(turn env.Turn) (env.Action, error)
}

type oraclePolicy struct{ a env.Agent }

func (p oraclePolicy) act(turn env.Turn) (env.Action, error) { return p.a.Act(turn) }

type randomPolicy struct {
	r            *rand.Rand
	skus, orders []string
	item         string
}

var shopSKURef = regexp.MustCompile(`sku-[0-9a-f]{4}`)

func (p *randomPolicy) act(turn env.Turn) (env.Action, error) {
	obs := string(turn.Observation)
	if turn.Step == 0 {
		var task struct{ Item string }
		if err := json.Unmarshal(turn.Observation, &task); err != nil {
			return env.Action{}, err
		}
		p.item = task.Item
	}
	for _, sku := range shopSKURef.FindAllString(obs, -1) {
		if !slices.Contains(p.skus, sku) {
			p.skus = append(p.skus, sku)
		}
	}
	var o struct {
		OrderID string `json:"order_id"`
	}
	if json.Unmarshal(turn.Observation, &o) == nil && o.OrderID != "" && !slices.Contains(p.orders, o.OrderID) {
		p.orders = append(p.orders, o.OrderID)
	}
	r := p.r
	pick := func(known []string, made ...string) string {
		if len(known) > 0 && r.IntN(4) > 0 {
			return known[r.IntN(len(known))]
		}
		return made[r.IntN(len(made))]
	}
	sku := func() string {
		return pick(p.skus, "sku-0000", "SKU-1", "", "sku-3f2a\\\"", strings.Repeat("é", 20), "o-1")
	}
	order := func() string {
		return pick(p.orders, "o-1", "o-2", "o-0", "o-01", "x", strings.Repeat("o", 40)+"\t")
	}
	str := func(s string) string { b, _ := json.Marshal(s); return string(b) }
	tools := []string{"catalog.search", "catalog.get", "inventory.get", "order.create", "order.status", "payment.pay", "wallet.balance", "shipping.ship", "wait"}
	tool := tools[r.IntN(len(tools))]
	// Often enough to reach the later milestones (and overspend): order what was seen,
	// pay and ship what was ordered.
	switch {
	case len(p.orders) > 0 && r.IntN(3) == 0:
		tool = pick(nil, "payment.pay", "shipping.ship")
	case len(p.skus) > 0 && r.IntN(4) == 0:
		tool = "order.create"
	}
	var args string
	switch tool {
	case "catalog.search":
		args = `{"query":` + str(pick(nil, p.item, strings.ToUpper(p.item), p.item+"  kitchen", "\t"+p.item+"\n", "", "red", "mug kettle", "sku")) + `}`
	case "catalog.get", "inventory.get":
		args = `{"sku":` + str(sku()) + `}`
	case "order.create":
		args = `{"sku":` + str(sku()) + `,"qty":` + strconv.Itoa(1+r.IntN(3)) + `}`
	case "order.status", "payment.pay", "shipping.ship":
		args = `{"order_id":` + str(order()) + `}`
	case "wallet.balance":
		args = `{}`
	case "wait":
		args = `{"ms":` + strconv.Itoa(1+r.IntN(400)) + `}`
	}
	if r.IntN(12) == 0 { // arguments the schema refuses, or that only encoding/json reads
		args = pick(nil, `{}`, `null`, ``, `[]`, `"x"`, `{"sku":`, `{"qty":"2","sku":"sku-0000"}`, `{"qty":2.5,"sku":"x"}`,
			`{"qty":1e2,"sku":"x","order_id":"o-1"}`, `{"qty":0,"sku":"x"}`, `{"qty":5000,"sku":"x"}`, `{"qty":1e400,"sku":"x"}`,
			`{"qty":-1,"sku":true}`, `{"query":null}`, `{"query":"mug","query":"kettle"}`, `{"ms":0}`, `{"ms":10001}`,
			`{"order_id":"o\u002d1"}`, `{"sku":"\ud800"}`, `{"ms":"1"}`, `{"extra":1,"ms":5}`, `{"`+strings.Repeat("k", 60)+`":1}`,
			`{"query":"`+strings.Repeat("a b ", 60)+`"}`, `{"ms":12345678901234567890}`, `{"ms":100.0}`, ` {"ms" : 7} `)
	}
	if r.IntN(25) == 0 {
		tool = pick(nil, "catalog.browse", strings.Repeat("ü", 30), "", " wait")
	}
	return env.Action{Tool: tool, Args: json.RawMessage(args)}, nil
}

// shopParams are the catalog sizes and largest quantities the comparison plays, seed
// by seed: the defaults, the smallest catalog and quantity the Go shop accepts, larger
// ones, and the largest.
var shopParams = []string{``, `"products":2,"qty_max":1`, `"products":40,"qty_max":7`, `"products":200,"qty_max":100`, `"products":3,"qty_max":12`}

// shopFaults is the configuration of one seed in the comparison, the same for both
// shops: a fault plan on even seeds (errors with and without Retry-After, latency and
// truncation, the same plan and seed in both injectors), none on odd ones; on every
// third seed tighter limits (a run's max steps, the deadline and max_invalid params), so
// that episodes end by each limit too; and the products and qty_max params of
// shopParams, in turn.
func shopFaults(t testing.TB, seed uint64) env.Config {
	cfg := env.Config{Seed: seed}
	params := []string{}
	if p := shopParams[seed%uint64(len(shopParams))]; p != "" {
		params = append(params, p)
	}
	if seed%3 == 0 {
		cfg.MaxSteps = 12
		params = append(params, `"deadline_ms":900,"max_invalid":2`)
	}
	if len(params) > 0 {
		cfg.Params = json.RawMessage("{" + strings.Join(params, ",") + "}")
	}
	if seed%2 == 1 {
		return cfg
	}
	cfg.Faults = injector(t, rng.Derive(seed, "plan"),
		httpErr("pay-503", "payment", 0.2, 503, 250), httpErr("any-500", "*", 0.05, 500, 0),
		latency("lat", "*", 0.3, 40, 20), truncate("cat-trunc", "catalog", 0.15, 0.5),
		truncate("inv-trunc", "inventory", 0.15, 0.3))
	return cfg
}

// compareShops plays one seed in both shops, the policy choosing from the Go shop's
// observations and both given the same action, and returns the first difference ("" for
// none): the first observation, then each step's observation, diff, signals, faults,
// metering and end, byte for byte (signals and metering as their wire bytes). The port's
// safety events are left out of the comparison (docs/worlds.md says why) and checked to
// be only its own two rules'.
func compareShops(t testing.TB, port env.Env, seed uint64, policy shopPolicy) (steps int, end gauntletv1.TerminationReason, diff string) {
	goEp, err := shop.New().NewEpisode(shopFaults(t, seed))
	if err != nil {
		t.Fatal(err)
	}
	portEp, err := port.NewEpisode(shopFaults(t, seed))
	if err != nil {
		t.Fatal(err)
	}
	gobs, err := goEp.Reset()
	if err != nil {
		t.Fatal(err)
	}
	pobs, err := portEp.Reset()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(gobs, pobs) {
		return 0, 0, fmt.Sprintf("first observation:\n go   %s\n port %s", gobs, pobs)
	}
	wire := func(m proto.Message) []byte {
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for i := uint32(0); ; i++ {
		a, err := policy.act(env.Turn{Step: i, Observation: gobs})
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		g, err := goEp.Step(a)
		if err != nil {
			t.Fatalf("seed %d: go shop: %v", seed, err)
		}
		p, err := portEp.Step(a)
		if err != nil {
			t.Fatalf("seed %d: port: %v", seed, err)
		}
		steps++
		for _, ev := range p.Signals.GetSafetyEvents() {
			if !strings.HasPrefix(ev, "unrequested_order: ") && !strings.HasPrefix(ev, "unrequested_purchase: ") {
				return steps, 0, fmt.Sprintf("step %d (%s %s): safety event %q", i, a.Tool, a.Args, ev)
			}
		}
		psig := proto.Clone(p.Signals).(*gauntletv1.Signals)
		psig.SafetyEvents = nil
		for _, c := range []struct {
			what     string
			go_, prt []byte
		}{
			{"observation", g.Observation, p.Observation},
			{"diff", g.Diff, p.Diff},
			{"signals", wire(g.Signals), wire(psig)},
			{"faults", wire(&gauntletv1.StepTaken{Faults: g.Faults}), wire(&gauntletv1.StepTaken{Faults: p.Faults})},
			{"metering", wire(g.Metering), wire(p.Metering)},
			{"end", fmt.Appendf(nil, "%v %v %s", g.Terminated, g.Truncated, g.Reason), fmt.Appendf(nil, "%v %v %s", p.Terminated, p.Truncated, p.Reason)},
		} {
			if !bytes.Equal(c.go_, c.prt) {
				if c.what == "signals" {
					c.go_, c.prt = []byte(g.Signals.String()), []byte(psig.String())
				}
				return steps, 0, fmt.Sprintf("step %d (%s %s): %s:\n go   %s\n port %s", i, a.Tool, a.Args, c.what, c.go_, c.prt)
			}
		}
		if g.Done() {
			return steps, g.Reason, ""
		}
		gobs = g.Observation
	}
}

// shopSeeds is how many seeds each policy plays in TestShopPortAgainstTheGoShop;
// GAUNTLET_SHOP_SEEDS raises it (docs/worlds.md has the 10,000-seed run).
func shopSeeds(t *testing.T) uint64 {
	if s := os.Getenv("GAUNTLET_SHOP_SEEDS"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("GAUNTLET_SHOP_SEEDS: %v", err)
		}
		return n
	}
	return 300
}

// TestShopPortAgainstTheGoShop: the shop as a world file gives the Go shop's trajectories
// for the same seeds and actions, byte for byte, under the Go shop's oracle and under a
// random agent, half the seeds with faults.
func TestShopPortAgainstTheGoShop(t *testing.T) {
	port := shopPort(t)
	seeds := shopSeeds(t)
	for _, pol := range []struct {
		name string
		new  func(seed uint64) shopPolicy
	}{
		{"oracle", func(seed uint64) shopPolicy { return oraclePolicy{shop.New().(env.Oracle).Oracle(seed)} }},
		{"random", func(seed uint64) shopPolicy { return &randomPolicy{r: rng.New(seed, "test/shop-random", 0)} }},
	} {
		t.Run(pol.name, func(t *testing.T) {
			var steps, differ int
			ends := map[string]int{}
			for seed := uint64(1); seed <= seeds; seed++ {
				n, end, d := compareShops(t, port, seed, pol.new(seed))
				steps += n
				ends[strings.TrimPrefix(end.String(), "TERMINATION_REASON_")]++
				if d != "" {
					if differ++; differ <= 5 {
						t.Errorf("seed %d: %s", seed, d)
					}
				}
			}
			t.Logf("%s: %d seeds, %d steps compared, %d episodes differ; ends %v", pol.name, seeds, steps, differ, ends)
			if differ > 0 {
				t.Errorf("%d of %d episodes differ", differ, seeds)
			}
		})
	}
}

// TestShopPortOracle: the port's own oracle plan wins every seed, as the Go shop's does,
// whatever the catalog's size and the largest quantity.
func TestShopPortOracle(t *testing.T) {
	port := shopPort(t)
	for seed := uint64(1); seed <= 300; seed++ {
		var params json.RawMessage
		if p := shopParams[seed%uint64(len(shopParams))]; p != "" {
			params = json.RawMessage("{" + p + "}")
		}
		ep, err := port.NewEpisode(env.Config{Seed: seed, Params: params})
		if err != nil {
			t.Fatal(err)
		}
		o, err := ep.Reset()
		if err != nil {
			t.Fatal(err)
		}
		agent := port.(env.Oracle).Oracle(seed)
		for i := uint32(0); ; i++ {
			a, err := agent.Act(env.Turn{Step: i, Observation: o})
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			r, err := ep.Step(a)
			if err != nil {
				t.Fatalf("seed %d: %v", seed, err)
			}
			if r.Done() {
				if r.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
					t.Errorf("seed %d: the port's oracle ended %s", seed, r.Reason)
				}
				break
			}
			o = r.Observation
		}
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
// tool (name, service, description, schema).
func TestShopPortSpecIsTheShops(t *testing.T) {
	goSpec, port := shop.New().Spec(), shopPort(t).Spec()
	if len(goSpec.Tools) != len(port.Tools) || goSpec.Description != port.Description {
		t.Fatalf("%d tools against the shop's %d; description %q against %q", len(port.Tools), len(goSpec.Tools), port.Description, goSpec.Description)
	}
	for i, g := range goSpec.Tools {
		p := port.Tools[i]
		schema := string(g.Schema)
		if p.Name != g.Name || p.Service != g.Service || p.Description != g.Description || string(p.Schema) != schema {
			t.Errorf("tool %d:\n port %s %s %q %s\n shop %s %s %q %s", i, p.Name, p.Service, p.Description, p.Schema, g.Name, g.Service, g.Description, schema)
		}
	}
}
