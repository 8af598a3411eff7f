package scoring

import (
	"slices"
	"strconv"
	"strings"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// StageValue is a component's value after one normalisation stage, and the stage.
type StageValue struct {
	Rule  string
	Value float64
}

// Explained is how one component of a step's vector came about: the rule that produced its
// raw value ("builtin task", "expr ...", "potential ..."), a built-in's inputs from the
// step ("progress_delta 0.25, success true"), the raw value (and the error that made an
// expression score 0), each normalisation stage in order, whether the final bound to
// [-1, 1] changed it, and its value, weight and contribution to the total.
type Explained struct {
	Name         string
	Rule         string
	Inputs       string
	Raw          float64
	Err          error
	Stages       []StageValue
	Bounded      bool
	Value        float64
	Weight       float64
	Contribution float64
}

// Explain scores step under spec as ScoreState does, advancing st the same way, and says
// for each component how its value came about. Its values and total are ScoreState's, bit
// for bit: both run the same code.
func Explain(spec Spec, st *gauntletv1.RewardState, step *gauntletv1.StepTaken) ([]Explained, float64) {
	c := spec.c
	if c == nil || len(c.comps) != len(spec.Weights) {
		c = builtins(spec)
	}
	if st == nil {
		st = &gauntletv1.RewardState{}
	}
	sig, met := step.GetSignals(), step.GetMetering()
	if c.stateful {
		c.prepare(st)
	} else {
		// Stateless specs leave st alone; give their (built-in) components a scratch one.
		scratch := &gauntletv1.RewardState{}
		c.prepare(scratch)
		st = scratch
	}
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
	out := make([]Explained, len(spec.Weights))
	total := 0.0
	for i, w := range spec.Weights {
		var tr trace
		v := c.componentValue(i, sig, met, step, &act, st, &tr)
		total += w.Weight * v
		var inputs string
		switch c.comps[i].kind {
		case kindBuiltin:
			inputs = builtinInputs(c.comps[i].builtin, sig, met)
		case kindVerifier:
			inputs = verifierInputs(c.comps[i].verifier, sig)
		}
		out[i] = Explained{
			Name: w.Component, Rule: c.comps[i].rule, Inputs: inputs, Raw: tr.raw, Err: tr.err, Stages: tr.stages, Bounded: tr.bound,
			Value: v, Weight: w.Weight, Contribution: w.Weight * v,
		}
	}
	if c.stateful {
		advance(st.Episode, sig, met, total)
	}
	return out, total
}

// Rules returns, per component in order, what produces its raw value: "builtin task",
// "expr <CEL>", "potential ...", followed by its normalisation stages (" | scale 0.5").
func (s Spec) Rules() []string {
	c := s.c
	if c == nil || len(c.comps) != len(s.Weights) {
		c = builtins(s)
	}
	out := make([]string, len(c.comps))
	for i, cp := range c.comps {
		r := cp.rule
		for _, st := range cp.stages {
			r += " | " + st.String()
		}
		out[i] = r
	}
	return out
}

// builtins compiles a spec built in Go: each component the built-in of its name.
func builtins(spec Spec) *compiled {
	c := &compiled{plain: true, comps: make([]comp, len(spec.Weights))}
	for i, w := range spec.Weights {
		c.comps[i] = comp{kind: kindBuiltin, builtin: w.Component, rule: "builtin " + w.Component}
	}
	return c
}

// verifierInputs says what a verifier component read: the name's value, or that the step
// carries no such name (a step before the verdict, or a verifier that did not write it).
func verifierInputs(name string, sig *gauntletv1.Signals) string {
	if !slices.Contains(sig.GetVerifierNames(), name) {
		return strconv.Quote(name) + " not written"
	}
	return strconv.Quote(name) + " " + strconv.FormatFloat(verifierValue(sig, name), 'g', -1, 64)
}

// builtinInputs names what a built-in formula read from the step, with the values.
func builtinInputs(name string, sig *gauntletv1.Signals, met *gauntletv1.Metering) string {
	g := func(x float64) string { return strconv.FormatFloat(x, 'g', -1, 64) }
	switch name {
	case ComponentTask:
		return "progress_delta " + g(sig.GetProgressDelta()) + ", success " + strconv.FormatBool(sig.GetSuccess())
	case ComponentCost:
		return "tool_calls " + strconv.FormatUint(uint64(met.GetToolCalls()), 10) + ", spend " + g(sig.GetSpend()) + ", budget " + g(sig.GetBudget())
	case ComponentSafety:
		// The events' names (what precedes their ": reason"), so a penalty says what
		// the sandbox or the world's safety rule saw; a threat fingerprint's match is
		// not counted (observed), so it is not named either.
		s := "safety_events " + strconv.Itoa(observed(sig))
		n := 0
		for _, ev := range sig.GetSafetyEvents() {
			if strings.HasPrefix(ev, matchEvent) {
				continue
			}
			name, _, _ := strings.Cut(ev, ":")
			if n == 0 {
				s += " ("
			} else {
				s += ", "
			}
			s += name
			n++
		}
		if n > 0 {
			s += ")"
		}
		return s
	case ComponentTimeliness:
		return "virtual_ns " + strconv.FormatUint(met.GetVirtualNs(), 10) + ", deadline_virtual_ns " + strconv.FormatInt(sig.GetDeadlineVirtualNs(), 10)
	case ComponentCausal:
		return "violations " + strconv.Itoa(len(sig.GetViolations())) + ", invalid_action " + strconv.FormatBool(sig.GetInvalidAction())
	}
	return ""
}
