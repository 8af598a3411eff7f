package shop

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// newEp returns a reset episode and its first observation.
func newEp(t testing.TB, cfg env.Config) (*episode, json.RawMessage) {
	t.Helper()
	ep, err := New().NewEpisode(cfg)
	if err != nil {
		t.Fatalf("NewEpisode: %v", err)
	}
	obs, err := ep.Reset()
	if err != nil {
		t.Fatalf("Reset: %v", err)
	}
	return ep.(*episode), obs
}

func step(t testing.TB, ep env.Episode, tool string, args any) env.StepResult {
	t.Helper()
	var raw json.RawMessage
	switch a := args.(type) {
	case nil:
	case string:
		raw = json.RawMessage(a)
	default:
		b, err := json.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		raw = b
	}
	r, err := ep.Step(env.Action{Tool: tool, Args: raw})
	if err != nil {
		t.Fatalf("Step(%s %s): %v", tool, raw, err)
	}
	if !json.Valid(r.Observation) || !json.Valid(r.Diff) {
		t.Fatalf("Step(%s %s): invalid JSON: obs %s diff %s", tool, raw, r.Observation, r.Diff)
	}
	return r
}

// stressPlan is a hand-built plan harsher than a typical baseline.
func stressPlan(t testing.TB, seed uint64) *inject.Injector {
	return faulttest.Injector(t, rng.Derive(seed, "plan"),
		faulttest.HTTPError("pay-503", "payment", 0.3, 503, 250),
		faulttest.HTTPError("pay-429", "payment.pay", 0.05, 429, 1000),
		faulttest.HTTPError("orders-503", "orders", 0.03, 503, 100),
		faulttest.HTTPError("any-500", "*", 0.02, 500, 0),
		faulttest.Latency("lat", "*", 0.5, 40, 20),
		faulttest.Truncate("cat-trunc", "catalog", 0.1, 0.5),
		faulttest.Truncate("inv-trunc", "inventory", 0.1, 0.3),
		faulttest.Truncate("pay-trunc", "payment.pay", 0.1, 0.2),
	)
}

// result is how one whole episode went.
type result struct {
	steps      int
	last       env.StepResult
	transcript []byte
	faults     int
}

// run plays agent through an episode and records every byte it produced.
func run(t testing.TB, cfg env.Config, agent env.Agent) result {
	t.Helper()
	ep, obs := newEp(t, cfg)
	var res result
	res.transcript = append(res.transcript, obs...)
	opts := proto.MarshalOptions{Deterministic: true}
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: obs})
		if err != nil {
			t.Fatalf("seed %d step %d: Act: %v", cfg.Seed, i, err)
		}
		r, err := ep.Step(a)
		if err != nil {
			t.Fatalf("seed %d step %d: Step: %v", cfg.Seed, i, err)
		}
		res.steps++
		res.faults += len(r.Faults)
		res.last = r
		for _, m := range []proto.Message{r.Signals, r.Metering} {
			b, err := opts.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			res.transcript = append(res.transcript, b...)
		}
		for _, f := range r.Faults {
			b, _ := opts.Marshal(f)
			res.transcript = append(res.transcript, b...)
		}
		res.transcript = append(res.transcript, r.Observation...)
		res.transcript = append(res.transcript, r.Diff...)
		res.transcript = fmt.Appendf(res.transcript, "|%v|%v|%v|%d\n", r.Terminated, r.Truncated, r.Reason, ep.Now())
		obs = r.Observation
		if r.Done() {
			if _, err := ep.Step(a); !errors.Is(err, ErrEpisodeOver) {
				t.Fatalf("seed %d: Step after the end: got %v, want ErrEpisodeOver", cfg.Seed, err)
			}
			return res
		}
	}
}

// chaos is a test agent that mixes sensible and nonsense actions from its own RNG.
type chaos struct {
	seed uint64
	n    uint64
	seen []string
}

func (c *chaos) Act(t env.Turn) (env.Action, error) {
	r := rng.New(c.seed, "chaos", c.n)
	c.n++
	for _, w := range strings.FieldsFunc(string(t.Observation), func(r rune) bool { return r == '"' || r == '\\' }) {
		if strings.HasPrefix(w, "sku-") || strings.HasPrefix(w, "o-") {
			c.seen = append(c.seen, w)
		}
	}
	pick := func() string {
		if len(c.seen) == 0 || r.IntN(5) == 0 {
			return "sku-zz"
		}
		return c.seen[r.IntN(len(c.seen))]
	}
	switch r.IntN(12) {
	case 0:
		return env.Action{Tool: "catalog.search", Args: json.RawMessage(`{"query":"` + []string{"mug", "kitchen", "", "a"}[r.IntN(4)] + `"}`)}, nil
	case 1:
		return env.Action{Tool: "inventory.get", Args: fmt.Appendf(nil, `{"sku":%q}`, pick())}, nil
	case 2:
		return env.Action{Tool: "order.create", Args: fmt.Appendf(nil, `{"sku":%q,"qty":%d}`, pick(), 1+r.IntN(4))}, nil
	case 3:
		return env.Action{Tool: "payment.pay", Args: fmt.Appendf(nil, `{"order_id":"o-%d"}`, 1+r.IntN(3))}, nil
	case 4:
		return env.Action{Tool: "shipping.ship", Args: fmt.Appendf(nil, `{"order_id":"o-%d"}`, 1+r.IntN(3))}, nil
	case 5:
		return env.Action{Tool: "wait", Args: fmt.Appendf(nil, `{"ms":%d}`, 1+r.IntN(3000))}, nil
	case 6:
		return env.Action{Tool: "order.status", Args: json.RawMessage(`{"order_id":"o-1"}`)}, nil
	case 7:
		return env.Action{Tool: "wallet.balance"}, nil
	case 8:
		return env.Action{Tool: "catalog.get", Args: fmt.Appendf(nil, `{"sku":%q}`, pick())}, nil
	case 9:
		return env.Action{Tool: "order.create", Args: json.RawMessage(`{"sku":1,"qty":"2"}`)}, nil
	case 10:
		return env.Action{Tool: "teleport", Args: json.RawMessage(`{}`)}, nil
	}
	return env.Action{Tool: "payment.pay", Args: json.RawMessage(`{"order_id":`)}, nil
}

func TestDeterminism(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		for _, agent := range []string{"oracle", "chaos"} {
			var runs [2]result
			for i := range runs {
				cfg := env.Config{Seed: seed, Params: json.RawMessage(`{"products":30,"max_invalid":20}`), Faults: stressPlan(t, seed)}
				var a env.Agent = New().(env.Oracle).Oracle(seed)
				if agent == "chaos" {
					cfg.MaxSteps, a = 60, &chaos{seed: seed}
				}
				runs[i] = run(t, cfg, a)
			}
			if !bytes.Equal(runs[0].transcript, runs[1].transcript) {
				t.Fatalf("seed %d, %s agent: two runs differ", seed, agent)
			}
		}
	}
}

func TestWorldIsSolvableButNaiveChoicesFail(t *testing.T) {
	firstBad := 0
	const seeds = 2000
	for seed := uint64(0); seed < seeds; seed++ {
		products := 2 + int(seed%60)
		p := params{products: products, qtyMax: 1 + int(seed%5), maxInvalid: 5}
		w := newWorld(seed, p)
		if len(w.products) != products || len(w.bySKU) != products {
			t.Fatalf("seed %d: %d products, %d skus; want %d", seed, len(w.products), len(w.bySKU), products)
		}
		good, first := 0, -1
		for i := range w.products {
			if w.good(i) {
				good++
			}
			if w.matches(i) && first < 0 {
				first = i
			}
		}
		if k := w.task; good != 1 || k.budget > w.balance || k.qty < 1 || k.qty > int64(p.qtyMax) {
			t.Fatalf("seed %d: %d good skus, budget %d, balance %d, qty %d", seed, good, k.budget, w.balance, k.qty)
		}
		if !w.good(first) {
			firstBad++
		}
	}
	if rate := float64(firstBad) / seeds; rate < 0.6 {
		t.Errorf("first search hit is a decoy in %.2f of worlds, want most", rate)
	}
}

func TestOracleSucceedsWithoutFaults(t *testing.T) {
	o := New().(env.Oracle)
	for seed := uint64(0); seed < 1000; seed++ {
		params := json.RawMessage(fmt.Sprintf(`{"products":%d,"qty_max":%d}`, 2+seed%199, 1+seed%7))
		res := run(t, env.Config{Seed: seed, Params: params}, o.Oracle(seed))
		if res.last.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS || !res.last.Signals.Success || res.last.Signals.Progress != 1 {
			t.Fatalf("seed %d params %s: oracle ended %v after %d steps: %s", seed, params, res.last.Reason, res.steps, res.last.Observation)
		}
	}
}

func TestOracleUnderFaults(t *testing.T) {
	o := New().(env.Oracle)
	const seeds = 1000
	ok, fired := 0, 0
	for seed := uint64(0); seed < seeds; seed++ {
		res := run(t, env.Config{Seed: seed, Faults: stressPlan(t, seed)}, o.Oracle(seed))
		fired += res.faults
		if res.last.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			ok++
		} else if res.last.Terminated {
			t.Errorf("seed %d: oracle terminated with %v: %s", seed, res.last.Reason, res.last.Observation)
		}
	}
	rate := float64(ok) / seeds
	t.Logf("oracle success under the stress plan: %.3f, %.1f faults per episode", rate, float64(fired)/seeds)
	if rate < 0.9 {
		t.Errorf("oracle success rate %.3f under faults, want >= 0.9", rate)
	}
	if fired < seeds {
		t.Errorf("only %d faults fired in %d episodes: the plan is not exercised", fired, seeds)
	}
}

// The oracle takes over an episode a random agent began (gauntlet episode fork): told the
// steps played before (env.Follower), it knows the task and the state of its order, and
// goes on to succeed wherever the first steps left success possible.
func TestOracleTakesOverAfterRandomSteps(t *testing.T) {
	o := New().(env.Oracle)
	const seeds = 600
	ok, late := 0, 0
	for seed := uint64(0); seed < seeds; seed++ {
		random, err := policy.Lookup("random")
		if err != nil {
			t.Fatal(err)
		}
		first, err := random.NewAgent(New(), seed)
		if err != nil {
			t.Fatal(err)
		}
		k := uint32(seed % 6)
		res := run(t, env.Config{Seed: seed}, envtest.Takeover(first, o.Oracle(seed), k))
		switch {
		case res.last.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS:
			ok++
		case uint32(res.steps) <= k:
			late++ // the random steps ended it before the oracle took over
		default:
			t.Logf("seed %d, oracle from step %d: ended %v after %d steps: %s", seed, k, res.last.Reason, res.steps, res.last.Observation)
		}
	}
	t.Logf("oracle after random steps: %d of %d succeeded, %d ended before the takeover", ok, seeds, late)
	if ok+late < seeds*98/100 {
		t.Errorf("oracle after random steps: %d of %d succeeded (%d ended before it took over), want at least 98%%", ok, seeds-late, late)
	}
}
