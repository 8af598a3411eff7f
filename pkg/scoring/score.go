package scoring

import (
	"fmt"
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
	tb := newTableBuilder(specFor, len(steps))
	if states != nil {
		tb.t.States = states
	}
	for i, st := range steps {
		var rs *gauntletv1.RewardState
		if states != nil {
			if states[i] == nil {
				states[i] = &gauntletv1.RewardState{}
			}
			rs = states[i]
		}
		tb.score(i, st, rs)
	}
	return tb.t
}

// TableEncodedStates is TableStates with the states in their wire form
// (ScoreRequest.encoded_states, one per step; empty for a first step), as a worker sends
// them without reading them: each is decoded into one reused RewardState, advanced, and
// encoded into the table's encoded_states, all of them in one buffer. A stateless spec's
// step gets its state back as it came. A state that cannot be decoded is an error naming
// its step.
func TableEncodedStates(specFor func(env, digest string) Spec, steps []*gauntletv1.StepTaken, states [][]byte) (*gauntletv1.ScoreTable, error) {
	if len(states) != len(steps) {
		return nil, fmt.Errorf("%d encoded states for %d steps", len(states), len(steps))
	}
	tb := newTableBuilder(specFor, len(steps))
	var (
		scratch gauntletv1.RewardState
		buf     []byte
		err     error
	)
	ends := make([]int, len(steps)) // ends[i]: where step i's state ends in buf (-1: its own)
	for i, st := range steps {
		sp := tb.spec(st)
		if !sp.Stateful() {
			tb.score(i, st, nil)
			ends[i] = -1
			continue
		}
		if err := scratch.DecodeReusing(states[i]); err != nil {
			return nil, fmt.Errorf("step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err)
		}
		tb.score(i, st, &scratch)
		if buf == nil { // room for the rest, if their states are this one's size
			buf = make([]byte, 0, (len(steps)-i)*(scratch.SizeVT()+8))
		}
		if buf, err = scratch.AppendEncoded(buf); err != nil {
			return nil, fmt.Errorf("step %d of %s: %w", st.GetStep(), st.GetEpisodeId(), err)
		}
		ends[i] = len(buf)
	}
	tb.t.EncodedStates = make([][]byte, len(steps))
	start := 0
	for i, end := range ends {
		if end < 0 {
			tb.t.EncodedStates[i] = states[i]
			continue
		}
		tb.t.EncodedStates[i] = buf[start:end:end]
		start = end
	}
	return tb.t, nil
}

// tableBuilder fills a ScoreTable step by step, each spec in it once.
type tableBuilder struct {
	t       *gauntletv1.ScoreTable
	specFor func(env, digest string) Spec
	keys    []tableKey // keys[k] is the env and digest of t.Specs[k]
	specs   []Spec
	last    int // index in keys of the last step's spec
}

type tableKey struct{ env, digest string }

func newTableBuilder(specFor func(env, digest string) Spec, steps int) *tableBuilder {
	return &tableBuilder{
		t:       &gauntletv1.ScoreTable{Spec: make([]uint32, steps), Totals: make([]float64, steps)},
		specFor: specFor,
		last:    -1,
	}
}

// index returns the index in the table's specs of st's spec, adding it on first sight.
func (tb *tableBuilder) index(st *gauntletv1.StepTaken) int {
	kk := tableKey{st.GetEnv(), st.GetRewardSpec()}
	if tb.last >= 0 && tb.keys[tb.last] == kk { // a request's steps mostly share one
		return tb.last
	}
	k := slices.Index(tb.keys, kk) // a request's steps are of a handful of envs
	if k < 0 {
		sp := tb.specFor(kk.env, kk.digest)
		k = len(tb.specs)
		tb.keys, tb.specs = append(tb.keys, kk), append(tb.specs, sp)
		ts := &gauntletv1.ScoreSpec{Version: sp.Version, Digest: sp.Digest, Names: make([]string, len(sp.Weights)), Weights: make([]float64, len(sp.Weights)),
			ActionsUnread: !sp.ReadsActions(), FaultsUnread: !sp.ReadsFaults()}
		for j, w := range sp.Weights {
			ts.Names[j], ts.Weights[j] = w.Component, w.Weight
		}
		tb.t.Specs = append(tb.t.Specs, ts)
		if tb.t.Values == nil {
			tb.t.Values = make([]float64, 0, len(tb.t.Spec)*len(sp.Weights))
		}
	}
	tb.last = k
	return k
}

// spec returns st's spec.
func (tb *tableBuilder) spec(st *gauntletv1.StepTaken) Spec { return tb.specs[tb.index(st)] }

// score scores step i, st, from rs (nil for none), advancing rs.
func (tb *tableBuilder) score(i int, st *gauntletv1.StepTaken, rs *gauntletv1.RewardState) {
	k := tb.index(st)
	tb.t.Spec[i] = uint32(k)
	tb.t.Values, tb.t.Totals[i] = AppendValuesState(tb.t.Values, tb.specs[k], rs, st)
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
