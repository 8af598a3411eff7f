package world

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func bank(t testing.TB) env.Env {
	t.Helper()
	e, err := env.Lookup("bank")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The fault rules and injectors of these tests.
var (
	injector = faulttest.Injector
	httpErr  = faulttest.HTTPError
	truncate = faulttest.Truncate
	latency  = faulttest.Latency
)

// stressPlan hits every service of the bank with errors, Retry-After, latency and
// truncated answers, writes included.
func stressPlan(t testing.TB, seed uint64) *inject.Injector {
	return injector(t, rng.Derive(seed, "plan"),
		httpErr("pay-503", "payments", 0.2, 503, 250),
		httpErr("fraud-429", "fraud", 0.1, 429, 1000),
		httpErr("any-500", "*", 0.03, 500, 0),
		latency("lat", "*", 0.5, 40, 20),
		truncate("acct-trunc", "accounts", 0.1, 0.5),
		truncate("create-trunc", "transfer.create", 0.15, 0.2),
		truncate("fraud-trunc", "fraud", 0.15, 0.3),
	)
}

// TestConformance runs the suite every env passes, with the oracle under the stress
// plan's faults.
func TestConformance(t *testing.T) {
	envtest.Run(t, envtest.Subject{
		Env: bank(t),
		Config: func(t testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Faults: stressPlan(t, seed)}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: "wait", Args: json.RawMessage(`{"ms":100}`)},
		ErrNotReset: ErrNotReset,
	})
}

// play runs the oracle through one episode and returns the last step and the steps.
func play(t testing.TB, e env.Env, cfg env.Config) (env.StepResult, int, []string) {
	t.Helper()
	r, n, log, err := playE(e, cfg)
	if err != nil {
		t.Fatalf("%v\n%s", err, strings.Join(log, "\n"))
	}
	return r, n, log
}

// playE is play for goroutines other than the test's: it returns its error.
func playE(e env.Env, cfg env.Config) (env.StepResult, int, []string, error) {
	ep, err := e.NewEpisode(cfg)
	if err != nil {
		return env.StepResult{}, 0, nil, err
	}
	obs, err := ep.Reset()
	if err != nil {
		return env.StepResult{}, 0, nil, err
	}
	agent := e.(env.Oracle).Oracle(cfg.Seed)
	var log []string
	for i := uint32(0); ; i++ {
		a, err := agent.Act(env.Turn{Step: i, Observation: obs})
		if err != nil {
			return env.StepResult{}, 0, log, fmt.Errorf("seed %d step %d: %w", cfg.Seed, i, err)
		}
		r, err := ep.Step(a)
		if err != nil {
			return env.StepResult{}, 0, log, fmt.Errorf("seed %d step %d: %w", cfg.Seed, i, err)
		}
		log = append(log, fmt.Sprintf("%s %s -> %s %s", a.Tool, a.Args, r.Observation, r.Diff))
		obs = r.Observation
		if r.Done() {
			return r, int(i) + 1, log, nil
		}
	}
}

// TestOracleSucceeds: the plan solves every world, without faults and under the stress
// plan (where the step limit may cut a few short).
func TestOracleSucceeds(t *testing.T) {
	e := bank(t)
	held := 0
	for seed := uint64(1); seed <= 200; seed++ {
		r, _, log := play(t, e, env.Config{Seed: seed})
		if r.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			t.Fatalf("seed %d: ended %s\n%s", seed, r.Reason, strings.Join(log, "\n"))
		}
		if strings.Contains(strings.Join(log, "\n"), "fraud.verify") {
			held++
		}
	}
	if held < 20 || held > 180 {
		t.Errorf("%d of 200 worlds needed verification; the holds should be common but not universal", held)
	}
	ok := 0
	for seed := uint64(1); seed <= 200; seed++ {
		r, _, log := play(t, e, env.Config{Seed: seed, Faults: stressPlan(t, seed), MaxSteps: 60})
		switch r.Reason {
		case gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS:
			ok++
		case gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE:
			t.Fatalf("seed %d: the oracle failed the task under faults\n%s", seed, strings.Join(log, "\n"))
		}
	}
	if ok < 190 {
		t.Errorf("oracle succeeded in %d of 200 stressed episodes, want at least 190", ok)
	}
}

// TestConcurrentEpisodes: one World serves many episodes at once (workers run hundreds);
// under -race this checks that nothing of the loaded world is written while they play
// but the answers' size hints, which are atomic and change no byte. The bank and the
// shop file, each with its oracle plan.
func TestConcurrentEpisodes(t *testing.T) {
	for _, c := range []struct {
		e      env.Env
		faults func(seed uint64) env.Config
	}{
		{bank(t), func(seed uint64) env.Config { return env.Config{Seed: seed, Faults: stressPlan(t, seed)} }},
		{shopPort(t), func(seed uint64) env.Config { return shopStress(t, seed) }},
	} {
		var wg sync.WaitGroup
		results := make([]string, 8)
		errs := make([]error, 8)
		for g := range 8 {
			cfg := c.faults(uint64(g%4) + 1)
			wg.Go(func() {
				r, n, _, err := playE(c.e, cfg)
				results[g], errs[g] = fmt.Sprintf("%s/%d/%s", r.Reason, n, r.Observation), err
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		for g := 4; g < 8; g++ {
			if results[g] != results[g-4] {
				t.Fatalf("seed %d played twice at once ended differently:\n%s\n%s", g%4+1, results[g], results[g-4])
			}
		}
	}
}

// TestOracleTakesOver: the oracle takes over an episode another agent began (gauntlet
// episode fork): its own, at any step, and a random agent's, succeeding wherever the
// first steps left success possible.
func TestOracleTakesOver(t *testing.T) {
	e := bank(t)
	o := e.(env.Oracle)
	random, err := policy.Lookup("random")
	if err != nil {
		t.Fatal(err)
	}
	const seeds = 300
	ok, over := 0, 0
	for seed := uint64(1); seed <= seeds; seed++ {
		k := uint32(seed % 6)
		first := o.Oracle(seed)
		if seed%2 == 0 {
			if first, err = random.NewAgent(e, seed); err != nil {
				t.Fatal(err)
			}
		}
		ep, err := e.NewEpisode(env.Config{Seed: seed, Faults: stressPlan(t, seed), MaxSteps: 40})
		if err != nil {
			t.Fatal(err)
		}
		obs, err := ep.Reset()
		if err != nil {
			t.Fatal(err)
		}
		agent := envtest.Takeover(first, o.Oracle(seed), k)
		for i := uint32(0); ; i++ {
			a, err := agent.Act(env.Turn{Step: i, Observation: obs})
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
			r, err := ep.Step(a)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, i, err)
			}
			obs = r.Observation
			if r.Done() {
				switch {
				case r.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS:
					ok++
				case i < k:
					over++ // ended before the takeover
				case seed%2 == 1:
					t.Errorf("seed %d: the oracle took over its own episode at step %d and ended %s", seed, k, r.Reason)
				}
				break
			}
		}
	}
	t.Logf("oracle takeovers: %d of %d succeeded, %d ended before the takeover", ok, seeds, over)
	if ok+over < seeds*9/10 {
		t.Errorf("%d of %d takeovers succeeded (%d ended before), want at least 90%%", ok, seeds-over, over)
	}
}
