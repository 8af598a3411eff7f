package plans

import (
	"math"
	"math/rand/v2"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// CatalogueVersion identifies the catalogue below; every plan records it. Bump it whenever a
// fault, a range or a rule id changes, because the same seed then yields a different plan.
const CatalogueVersion = "2026.11.1"

// family groups the faults that a stress plan amplifies together.
type family int

const (
	familyErrors family = iota
	familyLatency
	familyTruncation
	numFamilies
)

// fault is one entry of the catalogue, instantiated per service as rule "<service>.<name>".
// A baseline fault is in every plan; a stress plan may swap its numbers for the amplified
// ones. An edge fault appears only in the edge plans that pick it. Exactly one of baseline
// and edge is set.
type fault struct {
	name     string
	family   family
	baseline ruleFunc
	stress   ruleFunc // nil: never amplified
	edge     ruleFunc
}

// simFaults lists every fault in the order its rules appear for a service. The injector
// tries aborts in plan order and the first that fires wins, so the rare, specific errors
// come before the common transient ones. Growing the spectrum (network, storage, ...) means
// adding entries here and, for a new kind of effect, a field to FaultRule's spec.
var simFaults = []fault{
	// Rare auth and server failures: edge only.
	{name: "http_401", family: familyErrors, edge: httpError(401, span{0.005, 0.02, pct001}, noRetry)},
	{name: "http_403", family: familyErrors, edge: httpError(403, span{0.005, 0.02, pct001}, noRetry)},
	{name: "http_500", family: familyErrors, edge: httpError(500, span{0.01, 0.05, pct001}, noRetry)},
	// Transient errors of a busy service: together 0.5-3 % at baseline, 20-40 % under stress.
	{
		name: "http_429", family: familyErrors,
		baseline: httpError(429, span{0.002, 0.01, pct001}, retryAfterMs),
		stress:   httpError(429, span{0.10, 0.20, pct001}, retryAfterMs),
	},
	{
		name: "http_503", family: familyErrors,
		baseline: httpError(503, span{0.003, 0.02, pct001}, retryAfterMs),
		stress:   httpError(503, span{0.10, 0.20, pct001}, retryAfterMs),
	},
	// Latency on every call: tens of milliseconds, hundreds under stress, seconds at the edge.
	{
		name: "latency", family: familyLatency,
		baseline: latency(always, span{20, 60, 1}, span{10, 30, 1}),
		stress:   latency(always, span{200, 500, 1}, span{50, 150, 1}),
	},
	{name: "latency_spike", family: familyLatency, edge: latency(span{0.02, 0.08, pct001}, span{1000, 4000, 1}, span{200, 800, 1})},
	// Truncated bodies: rare at baseline, common under stress, nearly empty at the edge.
	{
		name: "truncate", family: familyTruncation,
		baseline: truncate(span{0.001, 0.005, pct001}, span{0.2, 0.9, 0.05}),
		stress:   truncate(span{0.20, 0.40, pct001}, span{0.1, 0.6, 0.05}),
	},
	{name: "truncate_severe", family: familyTruncation, edge: truncate(span{0.02, 0.08, pct001}, span{0, 0.3, 0.05})},
}

// Ranges shared by several faults.
var (
	always       = span{1, 1, 1}
	noRetry      = span{}
	retryAfterMs = span{100, 1000, 50}
)

// pct001 rounds probabilities to 0.01 %.
const pct001 = 0.0001

// span is the closed range [lo, hi] a plan draws a number from, uniformly, rounded to a
// multiple of step so that plans read as round numbers (0.0123, 350 ms). lo and hi are
// multiples of step, so rounding never leaves the range.
type span struct{ lo, hi, step float64 }

func (s span) draw(g *rand.Rand) float64 {
	x := s.lo + g.Float64()*(s.hi-s.lo)
	switch {
	case s.step >= 1:
		return math.Round(x/s.step) * s.step
	case s.step > 0:
		// Divide by an integer rather than multiply by an inexact fraction, so 123 steps
		// of 0.0001 is exactly the float64 nearest 0.0123.
		per := math.Round(1 / s.step)
		return math.Round(x*per) / per
	}
	return x
}

// ruleFunc draws a rule's probability and spec from the rule's own generator; Plan sets
// its id and target.
type ruleFunc func(g *rand.Rand) *gauntletv1.FaultRule

func httpError(status uint32, prob, retryAfter span) ruleFunc {
	return func(g *rand.Rand) *gauntletv1.FaultRule {
		f := &gauntletv1.HTTPErrorFault{Status: status}
		p := prob.draw(g)
		if retryAfter.hi > 0 {
			f.RetryAfterMs = uint32(retryAfter.draw(g))
		}
		return &gauntletv1.FaultRule{Probability: p, Spec: &gauntletv1.FaultRule_HttpError{HttpError: f}}
	}
}

func latency(prob, meanMs, jitterMs span) ruleFunc {
	return func(g *rand.Rand) *gauntletv1.FaultRule {
		p := prob.draw(g)
		f := &gauntletv1.LatencyFault{MeanMs: meanMs.draw(g), JitterMs: jitterMs.draw(g)}
		return &gauntletv1.FaultRule{Probability: p, Spec: &gauntletv1.FaultRule_Latency{Latency: f}}
	}
}

func truncate(prob, keep span) ruleFunc {
	return func(g *rand.Rand) *gauntletv1.FaultRule {
		p := prob.draw(g)
		f := &gauntletv1.TruncateFault{KeepFraction: keep.draw(g)}
		return &gauntletv1.FaultRule{Probability: p, Spec: &gauntletv1.FaultRule_Truncate{Truncate: f}}
	}
}
