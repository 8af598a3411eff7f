package policy_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// play runs one episode of e with the named policy and returns the last step and the
// actions taken.
func play(t *testing.T, e env.Env, name string, seed uint64) (env.StepResult, []env.Action) {
	t.Helper()
	p, err := policy.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := p.NewAgent(e, seed)
	if err != nil {
		t.Fatal(err)
	}
	ep, err := e.NewEpisode(env.Config{Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	obs, err := ep.Reset()
	if err != nil {
		t.Fatal(err)
	}
	var actions []env.Action
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: obs})
		if err != nil {
			t.Fatalf("seed %d step %d: Act: %v", seed, i, err)
		}
		actions = append(actions, a)
		r, err := ep.Step(a)
		if err != nil {
			t.Fatalf("seed %d step %d: Step: %v", seed, i, err)
		}
		if r.Done() {
			return r, actions
		}
		obs = r.Observation
	}
}

// TestShopSuccessRates is behavioural: the oracle mostly succeeds on shop, random rarely.
func TestShopSuccessRates(t *testing.T) {
	const seeds = 500
	for _, tt := range []struct {
		policy  string
		atLeast float64
		below   float64
	}{
		{policy.Oracle, 0.95, 1.01},
		{policy.Random, 0, 0.2},
	} {
		ok, invalid := 0, 0
		for seed := uint64(0); seed < seeds; seed++ {
			r, _ := play(t, shop.New(), tt.policy, seed)
			if r.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
				ok++
			}
			if r.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_INVALID_ACTION_LIMIT {
				invalid++
			}
		}
		rate := float64(ok) / seeds
		t.Logf("%s: success %.3f, invalid-limit endings %d of %d", tt.policy, rate, invalid, seeds)
		if rate < tt.atLeast || rate >= tt.below {
			t.Errorf("%s: success rate %.3f, want in [%.2f, %.2f)", tt.policy, rate, tt.atLeast, tt.below)
		}
	}
}

func TestRandomIsDeterministicAndSchemaValid(t *testing.T) {
	tools := map[string]bool{}
	for seed := uint64(0); seed < 50; seed++ {
		r1, a1 := play(t, shop.New(), policy.Random, seed)
		r2, a2 := play(t, shop.New(), policy.Random, seed)
		if !reflect.DeepEqual(a1, a2) || r1.Reason != r2.Reason {
			t.Fatalf("seed %d: two random runs differ", seed)
		}
		for _, a := range a1 {
			tools[a.Tool] = true
		}
		if r1.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_INVALID_ACTION_LIMIT {
			t.Errorf("seed %d: random hit the invalid-action limit: its args should follow the schemas", seed)
		}
	}
	if len(tools) != len(shop.New().Spec().Tools) {
		t.Errorf("random used %d of %d tools", len(tools), len(shop.New().Spec().Tools))
	}
}

// fakeEnv has tools of every schema shape and no oracle.
type fakeEnv struct{ schema string }

func (f fakeEnv) Spec() env.Spec {
	return env.Spec{Name: "fake", Tools: []env.Tool{{Name: "t", Schema: json.RawMessage(f.schema)}}}
}

func (fakeEnv) NewEpisode(env.Config) (env.Episode, error) { return nil, errors.New("not here") }

func TestRandomFollowsSchemas(t *testing.T) {
	schema := `{"type":"object","required":["i","s","n","b","e"],"properties":{
		"i":{"type":"integer","minimum":5,"maximum":7},
		"s":{"type":"string","maxLength":2},
		"n":{"type":"number","minimum":-1,"maximum":1},
		"b":{"type":"boolean"},
		"e":{"enum":["a","b"]},
		"opt":{"type":"integer"}}}`
	agent, err := mustLookup(t, policy.Random).NewAgent(fakeEnv{schema}, 1)
	if err != nil {
		t.Fatal(err)
	}
	obs := json.RawMessage(`{"id":"abc-123","note":"hello world"}`)
	for range 200 {
		a, err := agent.Act(env.Turn{Observation: obs})
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			I   *int64   `json:"i"`
			S   *string  `json:"s"`
			N   *float64 `json:"n"`
			B   *bool    `json:"b"`
			E   *string  `json:"e"`
			Opt *int64   `json:"opt"`
		}
		if err := json.Unmarshal(a.Args, &v); err != nil || v.I == nil || v.S == nil || v.N == nil || v.B == nil || v.E == nil {
			t.Fatalf("args %s: %v", a.Args, err)
		}
		if *v.I < 5 || *v.I > 7 || len(*v.S) > 2 || *v.N < -1 || *v.N > 1 || (*v.E != "a" && *v.E != "b") || (v.Opt != nil && (*v.Opt < 0 || *v.Opt > 9)) {
			t.Fatalf("args %s break the schema", a.Args)
		}
	}
	if _, err := mustLookup(t, policy.Random).NewAgent(fakeEnv{`{"properties":[`}, 1); err == nil || !strings.Contains(err.Error(), `tool "t"`) {
		t.Errorf("bad schema: %v", err)
	}
}

func TestOracleNeedsAnOracle(t *testing.T) {
	_, err := mustLookup(t, policy.Oracle).NewAgent(fakeEnv{`{}`}, 1)
	if !errors.Is(err, policy.ErrNoOracle) || !strings.Contains(err.Error(), `"fake"`) {
		t.Errorf("oracle on an env without one: %v", err)
	}
}

func TestRegistry(t *testing.T) {
	if got, want := policy.Names(), []string{"oracle", "random"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	_, err := policy.Lookup("genius")
	if !errors.Is(err, policy.ErrUnknownPolicy) || !strings.Contains(err.Error(), "oracle random") {
		t.Errorf("Lookup(genius): %v", err)
	}
}

func mustLookup(t *testing.T, name string) policy.Policy {
	t.Helper()
	p, err := policy.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
