package codefix_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestDocsServiceMeetsThePlansFaults: with docs=1 the agent's requests to the docs service
// go through the fault gateway under the episode's plan; what fires is on the step, the
// same seed meets the same faults, and a branch meets what its parent would.
func TestDocsServiceMeetsThePlansFaults(t *testing.T) {
	sb := testSandboxes(t)
	plan := &gauntletv1.FaultPlan{Profile: "custom", Seed: 11, Rules: []*gauntletv1.FaultRule{
		{Id: "docs.http_429", Target: codefix.DocsService, Probability: 0.5,
			Spec: &gauntletv1.FaultRule_HttpError{HttpError: &gauntletv1.HTTPErrorFault{Status: 429, RetryAfterMs: 2000}}},
		{Id: "docs.latency", Target: codefix.DocsService, Probability: 1,
			Spec: &gauntletv1.FaultRule_Latency{Latency: &gauntletv1.LatencyFault{MeanMs: 30, JitterMs: 10}}},
	}}
	episode := func() env.Episode {
		in, err := inject.NewInjector(plan)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := codefix.New().NewEpisode(env.Config{Seed: 4, Params: json.RawMessage(`{"docs":1}`), Sandboxes: sb, Faults: in})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Close(ep) })
		return ep
	}
	// Six reads of the guide; what each met, from the agent's side and as recorded.
	const reads = 6
	trace := func(ep env.Episode) string {
		var b strings.Builder
		for range reads {
			res := step(t, ep, tools.ShellExec, map[string]string{"command": codefix.DocsCommand + ` 2>&1 | head -c 200`})
			var obs struct{ Stdout string }
			_ = json.Unmarshal(res.Observation, &obs)
			seen := "guide"
			if !strings.Contains(obs.Stdout, "codefix guide") {
				seen = strings.TrimSpace(obs.Stdout)
			}
			fmt.Fprintf(&b, "[%s |", seen)
			for _, f := range res.Faults {
				if f.Target == codefix.DocsService {
					fmt.Fprintf(&b, " %s %s", f.FaultId, strings.Fields(f.Detail)[0])
				}
			}
			b.WriteString("]\n")
		}
		return b.String()
	}

	a := episode()
	obs, err := a.Reset()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(obs), `"docs_url":"http://docs:8080"`) {
		t.Fatalf("reset observation does not announce the docs service: %s", obs)
	}
	first := trace(a)
	t.Logf("seed 11:\n%s", first)
	if !strings.Contains(first, "429 Too Many Requests | docs.http_429 status=429") || !strings.Contains(first, "[guide | docs.latency") {
		t.Errorf("want both a 429 and a clean read, each with its recorded faults:\n%s", first)
	}
	for _, line := range strings.Split(strings.TrimSpace(first), "\n") {
		if !strings.Contains(line, "docs.latency latency_ms=") {
			t.Errorf("a read without its recorded latency: %s", line)
		}
		if strings.Contains(line, "429") != strings.Contains(line, "docs.http_429") {
			t.Errorf("what the agent met and what was recorded differ: %s", line)
		}
	}

	// The same seed meets the same faults.
	b := episode()
	if _, err := b.Reset(); err != nil {
		t.Fatal(err)
	}
	if again := trace(b); again != first {
		t.Errorf("same seed, other faults:\n%s\nvs\n%s", first, again)
	}

	// A branch taken after the reads meets what its parent meets next.
	br, err := b.(env.Brancher).Branch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(br) })
	if p, q := trace(b), trace(br); p != q {
		t.Errorf("parent and branch differ:\n%s\nvs\n%s", p, q)
	}

	// The oracle reads the guide first and still fixes the bug.
	oracle, err := policy.Lookup(policy.Oracle)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := oracle.NewAgent(codefix.New(), 4)
	if err != nil {
		t.Fatal(err)
	}
	steps := play(t, episode(), agent)
	if len(steps) != 5 || !steps[len(steps)-1].Signals.GetSuccess() {
		t.Errorf("oracle with the docs service: %d steps (want 5: guide, read, patch, test, submit), success %v",
			len(steps), len(steps) > 0 && steps[len(steps)-1].Signals.GetSuccess())
	}
}

// TestDocsServiceMeetsThePlansDNSFaults: a user-defined profile's DNS fault (in the
// plan's boundary_spec) meets the agent's lookups of "docs" at the sandbox's name
// server: a SERVFAIL half of the time, seen by wget as a bad address and recorded on the
// step; the same seed meets the same faults, the plan's other rules draw as before.
func TestDocsServiceMeetsThePlansDNSFaults(t *testing.T) {
	sb := testSandboxes(t)
	custom, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "flaky-dns", SpecYaml: `name: flaky-dns
faults:
  - {id: dns, kind: dns_servfail, probability: 0.5, match: {services: [docs]}}
  - {id: slow, kind: latency, match: {services: [docs]}, params: {mean_ms: 20, jitter_ms: 0}}
`}})
	if err != nil {
		t.Fatal(err)
	}
	plan, err := custom.Plan(5, "flaky-dns", codefix.New().Spec().Services)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.GetBoundarySpec(), "dns_servfail") {
		t.Fatalf("the DNS fault is not in the plan's boundary_spec: %v", plan)
	}
	trace := func() string {
		in, err := inject.NewInjector(plan)
		if err != nil {
			t.Fatal(err)
		}
		ep, err := codefix.New().NewEpisode(env.Config{Seed: 4, Params: json.RawMessage(`{"docs":1}`), Sandboxes: sb, Faults: in})
		if err != nil {
			t.Fatal(err)
		}
		defer env.Close(ep)
		if _, err := ep.Reset(); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for range 6 {
			res := step(t, ep, tools.ShellExec, map[string]string{"command": codefix.DocsCommand + ` 2>&1 | head -c 200`})
			var obs struct{ Stdout string }
			_ = json.Unmarshal(res.Observation, &obs)
			seen := "guide"
			if !strings.Contains(obs.Stdout, "codefix guide") {
				seen = strings.TrimSpace(obs.Stdout)
			}
			fmt.Fprintf(&b, "[%s |", seen)
			for _, f := range res.Faults {
				if f.Target == codefix.DocsService {
					fmt.Fprintf(&b, " %s %s", f.FaultId, f.Kind)
				}
			}
			b.WriteString("]\n")
		}
		return b.String()
	}
	first := trace()
	t.Logf("seed 5:\n%s", first)
	if !strings.Contains(first, "[wget: bad address 'docs:8080' | dns dns_servfail]") || !strings.Contains(first, "[guide | docs.slow latency]") {
		t.Errorf("want a SERVFAIL (and no request) and a clean read, each with its recorded faults:\n%s", first)
	}
	for _, line := range strings.Split(strings.TrimSpace(first), "\n") {
		if strings.Contains(line, "bad address") != strings.Contains(line, "dns_servfail") {
			t.Errorf("what the agent met and what was recorded differ: %s", line)
		}
	}
	if again := trace(); again != first {
		t.Errorf("same seed, other faults:\n%s\nvs\n%s", first, again)
	}
}
