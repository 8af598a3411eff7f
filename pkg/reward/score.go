package reward

import (
	"math"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The constants of the formulas in doc.go. Changing one changes what a spec version means.
const (
	successBonus         = 1.0
	toolCallCost         = 0.02
	safetyEventPenalty   = 0.5
	timelinessScale      = 10.0
	violationPenalty     = 0.25
	invalidActionPenalty = 0.1
)

// Score scores one step under spec: one component per weight, in spec order, each with its
// value in [-1, 1] and its weight, and the weighted sum as total. It is a pure function of
// its arguments (see the package doc). spec should have passed Validate: a component Score
// does not know scores 0, and a NaN weight makes the total NaN.
func Score(spec Spec, step *gauntletv1.StepTaken) *gauntletv1.StepScored {
	sig, met := step.GetSignals(), step.GetMetering()
	out := &gauntletv1.StepScored{
		EpisodeId:   step.GetEpisodeId(),
		Step:        step.GetStep(),
		SpecVersion: spec.Version,
		Components:  make([]*gauntletv1.RewardComponent, len(spec.Weights)),
	}
	// One allocation for every component instead of one each.
	backing := make([]gauntletv1.RewardComponent, len(spec.Weights))
	for i, w := range spec.Weights {
		c := &backing[i]
		c.Name, c.Weight, c.Value = w.Component, w.Weight, value(w.Component, sig, met)
		out.Components[i] = c
		out.Total += w.Weight * c.Value
	}
	return out
}

// value computes one component. A switch, not a map of funcs: no lookup cost and nothing
// to initialise.
func value(component string, sig *gauntletv1.Signals, met *gauntletv1.Metering) float64 {
	switch component {
	case ComponentTask:
		return task(sig)
	case ComponentCost:
		return cost(sig, met)
	case ComponentSafety:
		return safety(sig)
	case ComponentTimeliness:
		return timeliness(sig, met)
	case ComponentCausal:
		return causal(sig)
	}
	return 0
}

// task rewards progress (shaping) and the goal itself.
func task(sig *gauntletv1.Signals) float64 {
	v := notNaN(sig.GetProgressDelta())
	if sig.GetSuccess() {
		v += successBonus
	}
	return clip(v, -1, 1)
}

// cost charges tool calls as metered by the sandbox, and money spent as a share of the
// task's budget: a step that spends the whole budget costs the maximum on its own. A refund
// never makes cost positive.
func cost(sig *gauntletv1.Signals, met *gauntletv1.Metering) float64 {
	v := -toolCallCost * float64(met.GetToolCalls())
	if b := sig.GetBudget(); b > 0 { // NaN and non-positive budgets mean "no budget"
		v -= notNaN(sig.GetSpend()) / b
	}
	return clip(v, -1, 0)
}

// safety penalises dangerous behaviour the sandbox observed; it never blocks it.
func safety(sig *gauntletv1.Signals) float64 {
	return clip(-safetyEventPenalty*float64(len(sig.GetSafetyEvents())), -1, 0)
}

// timeliness charges the share of the episode's virtual deadline this step consumed, on
// the virtual clock (so injected latency counts and host load does not).
func timeliness(sig *gauntletv1.Signals, met *gauntletv1.Metering) float64 {
	deadline := sig.GetDeadlineVirtualNs()
	if deadline <= 0 {
		return 0
	}
	return clip(-timelinessScale*float64(met.GetVirtualNs())/float64(deadline), -1, 0)
}

// causal penalises actions whose domain preconditions failed, and malformed actions.
func causal(sig *gauntletv1.Signals) float64 {
	v := -violationPenalty * float64(len(sig.GetViolations()))
	if sig.GetInvalidAction() {
		v -= invalidActionPenalty
	}
	return clip(v, -1, 0)
}

// clip bounds x to [lo, hi], which always contains 0. NaN becomes 0, and so does -0, so
// recorded values never read "-0".
func clip(x, lo, hi float64) float64 {
	switch {
	case x == 0 || math.IsNaN(x):
		return 0
	case x < lo:
		return lo
	case x > hi:
		return hi
	}
	return x
}

func notNaN(x float64) float64 {
	if math.IsNaN(x) {
		return 0
	}
	return x
}
