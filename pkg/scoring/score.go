package scoring

import (
	"math"
	"slices"

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
// does not know scores 0, and a NaN weight makes the total NaN. A stateful spec scores the
// step as an episode's first; ScoreState scores it after the episode's earlier steps.
func Score(spec Spec, step *gauntletv1.StepTaken) *gauntletv1.StepScored {
	return ScoreState(spec, nil, step)
}

// ScoreState is Score with the state of the step's episode before it (nil or empty for a
// first step), which it advances to the state after it. Stateless specs leave st as it is.
func ScoreState(spec Spec, st *gauntletv1.RewardState, step *gauntletv1.StepTaken) *gauntletv1.StepScored {
	out := &gauntletv1.StepScored{
		EpisodeId:   step.GetEpisodeId(),
		Step:        step.GetStep(),
		SpecVersion: spec.Version,
		SpecDigest:  spec.Digest,
		Components:  make([]*gauntletv1.RewardComponent, len(spec.Weights)),
	}
	// One allocation for every component instead of one each.
	backing := make([]gauntletv1.RewardComponent, len(spec.Weights))
	var values [8]float64
	vals, total := AppendValuesState(values[:0], spec, st, step)
	for i, w := range spec.Weights {
		c := &backing[i]
		c.Name, c.Weight, c.Value = w.Component, w.Weight, vals[i]
		out.Components[i] = c
	}
	out.Total = total
	return out
}

// AppendValues appends the value of each of spec's components for step, in spec order, to
// dst, and returns it with their weighted sum: Score's numbers without its message, summed
// in the same order, so the total is the same to the bit.
func AppendValues(dst []float64, spec Spec, step *gauntletv1.StepTaken) ([]float64, float64) {
	return AppendValuesState(dst, spec, nil, step)
}

// AppendValuesState is AppendValues with the episode's state, as ScoreState.
func AppendValuesState(dst []float64, spec Spec, st *gauntletv1.RewardState, step *gauntletv1.StepTaken) ([]float64, float64) {
	sig, met := step.GetSignals(), step.GetMetering()
	total := 0.0
	c := spec.c
	if c == nil || c.plain || len(c.comps) != len(spec.Weights) {
		// Built-ins only: no state, no expressions, exactly the formulas of the doc.
		for _, w := range spec.Weights {
			v := value(w.Component, sig, met)
			dst = append(dst, v)
			total += w.Weight * v
		}
		return dst, total
	}
	if st == nil {
		st = &gauntletv1.RewardState{}
	}
	c.prepare(st)
	act := activation{sig: sig, met: met, ep: st.Episode}
	if act.sig == nil {
		act.sig = noSignals
	}
	if act.met == nil {
		act.met = noMetering
	}
	if act.ep == nil {
		act.ep = noEpisode
	}
	for i, w := range spec.Weights {
		v := c.componentValue(i, sig, met, step, &act, st, nil)
		dst = append(dst, v)
		total += w.Weight * v
	}
	advance(st.Episode, sig, met, total)
	return dst, total
}

// Table scores steps, each under the spec specFor gives its env, into a ScoreTable: the
// reward service's reply, read back by ScoreReply.StepScores into exactly what Score
// gives each step. specFor is called once per distinct env of steps.
func Table(specFor func(env string) Spec, steps []*gauntletv1.StepTaken) *gauntletv1.ScoreTable {
	return TableStates(func(env, _ string) Spec { return specFor(env) }, steps, nil)
}

// TableStates is Table for steps that name their spec by digest (StepTaken.reward_spec),
// with their episodes' states: specFor is called once per distinct (env, digest) of steps,
// and states, when not nil, has one per step, each advanced as ScoreState does and
// returned in the table. A request's steps of one episode are in step order, each with the
// state the previous one left (the worker sends an episode's next step only once the last
// is scored).
func TableStates(specFor func(env, digest string) Spec, steps []*gauntletv1.StepTaken, states []*gauntletv1.RewardState) *gauntletv1.ScoreTable {
	t := &gauntletv1.ScoreTable{
		Spec:   make([]uint32, len(steps)),
		Totals: make([]float64, len(steps)),
	}
	type key struct{ env, digest string }
	var (
		keys  []key // keys[k] is the env and digest of t.Specs[k]
		specs []Spec
	)
	if states != nil {
		t.States = states
	}
	for i, st := range steps {
		kk := key{st.GetEnv(), st.GetRewardSpec()}
		k := slices.Index(keys, kk) // a request's steps are of a handful of envs
		if k < 0 {
			sp := specFor(kk.env, kk.digest)
			k = len(specs)
			keys, specs = append(keys, kk), append(specs, sp)
			ts := &gauntletv1.ScoreSpec{Version: sp.Version, Digest: sp.Digest, Names: make([]string, len(sp.Weights)), Weights: make([]float64, len(sp.Weights)),
				ActionsUnread: !sp.ReadsActions(), FaultsUnread: !sp.ReadsFaults()}
			for j, w := range sp.Weights {
				ts.Names[j], ts.Weights[j] = w.Component, w.Weight
			}
			t.Specs = append(t.Specs, ts)
			if t.Values == nil {
				t.Values = make([]float64, 0, len(steps)*len(sp.Weights))
			}
		}
		t.Spec[i] = uint32(k)
		var rs *gauntletv1.RewardState
		if states != nil {
			if states[i] == nil {
				states[i] = &gauntletv1.RewardState{}
			}
			rs = states[i]
		}
		t.Values, t.Totals[i] = AppendValuesState(t.Values, specs[k], rs, st)
	}
	return t
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

// safety penalises dangerous behaviour the sandbox observed; it never blocks it. A threat
// fingerprint's match is not an observation (observed): the fingerprint detector of a
// spec penalises it.
func safety(sig *gauntletv1.Signals) float64 {
	return clip(-safetyEventPenalty*float64(observed(sig)), -1, 0)
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
