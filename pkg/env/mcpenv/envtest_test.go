package mcpenv_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/envtest"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faulttest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// faulty is a plan that fires on the notes server's calls: errors with Retry-After on
// writes, latency everywhere, truncated reads.
func faulty(t testing.TB, seed uint64) *inject.Injector {
	t.Helper()
	in, err := inject.NewInjector(faultyPlan(seed))
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// faultyPlan is faulty's plan.
func faultyPlan(seed uint64) *gauntletv1.FaultPlan {
	return &gauntletv1.FaultPlan{Profile: "test", Seed: seed, Rules: []*gauntletv1.FaultRule{
		{Id: "write-503", Target: "notes-write", Probability: 0.3,
			Spec: &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{Status: 503, RetryAfterMs: 200}}},
		{Id: "lat", Target: "*", Probability: 0.5, Spec: &gauntletv1.FaultRule_Latency{Latency: &gauntletv1.LatencyFault{MeanMs: 40, JitterMs: 20}}},
		{Id: "cut", Target: "notes.get", Probability: 0.3, Spec: &gauntletv1.FaultRule_Truncate{Truncate: &gauntletv1.TruncateFault{KeepFraction: 0.5}}},
	}}
}

var registered = map[string]env.Env{}

// notesEnv is the notes env, registered once (the suite looks it up by name).
func notesEnv(t testing.TB) env.Env {
	t.Helper()
	if e, ok := registered["notes"]; ok {
		return e
	}
	e := mcpenv.New(notes(t))
	env.Register(e)
	registered["notes"] = e
	return e
}

// TestConformance runs the suite every env passes over the notes server in sandboxes of
// the process runtime, its calls meeting faults.
func TestConformance(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	envtest.Run(t, envtest.Subject{
		Env: notesEnv(t),
		Config: func(_ testing.TB, seed uint64) env.Config {
			return env.Config{Seed: seed, Sandboxes: sb, Faults: faulty(t, seed)}
		},
		Limits: func(maxInvalid int, deadlineMs int64) json.RawMessage {
			return fmt.Appendf(nil, `{"max_invalid":%d,"deadline_ms":%d}`, maxInvalid, deadlineMs)
		},
		Idle:        env.Action{Tool: "notes.list", Args: json.RawMessage(`{}`)},
		ErrNotReset: mcpenv.ErrNotReset,
		Seeds:       []uint64{1, 2},
	})
}

func injectorOf(t testing.TB, rules ...*gauntletv1.FaultRule) *inject.Injector {
	t.Helper()
	return faulttest.Injector(t, 1, rules...)
}

var httpErr = faulttest.HTTPError

// latency always delays a call to target by ms.
func latency(id, target string, ms float64) *gauntletv1.FaultRule {
	return faulttest.Latency(id, target, 1, ms, 0)
}

// cut always truncates an answer of target to keep of its bytes.
func cut(id, target string, keep float64) *gauntletv1.FaultRule {
	return faulttest.Truncate(id, target, 1, keep)
}
