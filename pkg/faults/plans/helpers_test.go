package plans_test

import gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"

// Plan rules written by hand, for the validation and reference tests (inject's tests
// have the same helpers for the Injector).

func httpRule(id, target string, p float64, status, retryAfterMs uint32) *gauntletv1.FaultRule {
	return &gauntletv1.FaultRule{Id: id, Target: target, Probability: p, Spec: &gauntletv1.FaultRule_HttpError{
		HttpError: &gauntletv1.HTTPErrorFault{Status: status, RetryAfterMs: retryAfterMs}}}
}

func latencyRule(id, target string, p, meanMs, jitterMs float64) *gauntletv1.FaultRule {
	return &gauntletv1.FaultRule{Id: id, Target: target, Probability: p, Spec: &gauntletv1.FaultRule_Latency{
		Latency: &gauntletv1.LatencyFault{MeanMs: meanMs, JitterMs: jitterMs}}}
}

func truncateRule(id, target string, p, keep float64) *gauntletv1.FaultRule {
	return &gauntletv1.FaultRule{Id: id, Target: target, Probability: p, Spec: &gauntletv1.FaultRule_Truncate{
		Truncate: &gauntletv1.TruncateFault{KeepFraction: keep}}}
}

type call struct{ service, tool string }

// script is a fixed call sequence over shop's services: n calls, cycling services and tools.
func script(n int) []call {
	tools := []string{"get", "list", "update"}
	out := make([]call, n)
	for i := range out {
		s := shopServices[i%len(shopServices)]
		out[i] = call{s, s + "." + tools[(i/len(shopServices))%len(tools)]}
	}
	return out
}
