// Package faulttest builds fault rules and injectors written by hand, for tests: one
// rule of each kind the simulated services meet (an HTTP error, latency, a truncated
// answer), an Injector over a plan of such rules, and a plan template. Everything here
// returns new values; safe for concurrent use.
package faulttest

import (
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// HTTPError is a rule that fails a call to target with status (and Retry-After, when
// retryAfterMs is not 0) with probability p.
func HTTPError(id, target string, p float64, status, retryAfterMs uint32) *gauntletv1.FaultRule {
	return &gauntletv1.FaultRule{Id: id, Target: target, Probability: p, Spec: &gauntletv1.FaultRule_HttpError{
		HttpError: &gauntletv1.HTTPErrorFault{Status: status, RetryAfterMs: retryAfterMs}}}
}

// Latency is a rule that delays a call to target by about meanMs, with jitterMs of
// jitter, with probability p.
func Latency(id, target string, p, meanMs, jitterMs float64) *gauntletv1.FaultRule {
	return &gauntletv1.FaultRule{Id: id, Target: target, Probability: p, Spec: &gauntletv1.FaultRule_Latency{
		Latency: &gauntletv1.LatencyFault{MeanMs: meanMs, JitterMs: jitterMs}}}
}

// Truncate is a rule that cuts an answer of target to the fraction keep of its bytes
// with probability p.
func Truncate(id, target string, p, keep float64) *gauntletv1.FaultRule {
	return &gauntletv1.FaultRule{Id: id, Target: target, Probability: p, Spec: &gauntletv1.FaultRule_Truncate{
		Truncate: &gauntletv1.TruncateFault{KeepFraction: keep}}}
}

// Injector is the injector of a plan (profile "test") of rules, drawing from seed; a
// plan it refuses fails the test.
func Injector(t testing.TB, seed uint64, rules ...*gauntletv1.FaultRule) *inject.Injector {
	t.Helper()
	in, err := inject.NewInjector(&gauntletv1.FaultPlan{Profile: "test", Seed: seed, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// SlowTemplate compiles a custom profile "slow" (one latency fault of 90 ms, 5 ms of
// jitter) and makes the template of its plan over services (plans.NewTemplate): the
// profiles, the template and its id.
func SlowTemplate(t testing.TB, services []string) (plans.CustomProfiles, *gauntletv1.FaultPlan, string) {
	t.Helper()
	custom, err := plans.CompileCustomProfiles([]*gauntletv1.CustomProfile{{Name: "slow", SpecYaml: "name: slow\nfaults:\n  - {id: latency, kind: latency, params: {mean_ms: 90, jitter_ms: 5}}\n"}})
	if err != nil {
		t.Fatal(err)
	}
	base, err := custom.Plan(0, "slow", services)
	if err != nil {
		t.Fatal(err)
	}
	tmpl, id, err := plans.NewTemplate(base)
	if err != nil {
		t.Fatal(err)
	}
	return custom, tmpl, id
}
