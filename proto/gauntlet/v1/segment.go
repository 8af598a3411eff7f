package gauntletv1

import (
	"fmt"
	"slices"
)

// Score is one step's score as a reader needs it, whichever form it was recorded in: the
// version of the spec it was scored under and its digest (empty for scores recorded before
// specs had one), the spec's component names and the step's values in the spec's order,
// and the weighted total.
type Score struct {
	Version string
	Digest  string
	Names   []string
	Values  []float64
	Total   float64
}

// ScoreOf returns the score of st, a step of seg, or of a lone step when seg is nil. A
// compact score (StepScored.spec and values, as Marshal writes a segment's) is read
// against seg's score_specs without copying: Names and Values share the segment's
// memory. A score in the full form (components), as older workers wrote it and as lone
// steps carry it, is copied out. A step without a score has the zero Score. A compact
// score that does not fit seg's specs is an error naming the field; the Score then
// still has the total.
func (seg *StepsTaken) ScoreOf(st *StepTaken) (Score, error) {
	sc := st.GetScore()
	if sc == nil {
		return Score{}, nil
	}
	if len(sc.GetValues()) == 0 || len(sc.GetComponents()) > 0 {
		comps := sc.GetComponents()
		out := Score{Version: sc.GetSpecVersion(), Digest: sc.GetSpecDigest(), Total: sc.GetTotal(),
			Names: make([]string, len(comps)), Values: make([]float64, len(comps))}
		for i, c := range comps {
			out.Names[i], out.Values[i] = c.GetName(), c.GetValue()
		}
		return out, nil
	}
	specs := seg.GetScoreSpecs()
	k := sc.GetSpec()
	if int(k) >= len(specs) {
		return Score{Total: sc.GetTotal()}, fmt.Errorf("step %d: score.spec: %d, past the segment's %d score_specs", st.GetStep(), k, len(specs))
	}
	sp := specs[k]
	if len(sc.GetValues()) != len(sp.GetNames()) {
		return Score{Total: sc.GetTotal()}, fmt.Errorf("step %d: score.values: %d values for the %d components of score_specs[%d]", st.GetStep(), len(sc.GetValues()), len(sp.GetNames()), k)
	}
	return Score{Version: sp.GetVersion(), Digest: sp.GetDigest(), Names: sp.GetNames(), Values: sc.GetValues(), Total: sc.GetTotal()}, nil
}

// compactScores puts the scores of seg's steps into the compact form for encoding: each
// spec once in score_specs, per step its index, its values and its total. It returns the
// function that puts the steps' own scores back, or nil when there was nothing to do: no
// step has a score, a score is not in the full form, or seg is compact already (a decoded
// segment published again). seg's steps must not be read by another goroutine meanwhile.
//
// On the wire a step's score shrinks from about 170 bytes (five named components with
// their weights, the episode id and the spec version again) to about 50, and the store
// decodes it into two allocations instead of six.
func (seg *StepsTaken) compactScores() (restore func()) {
	if seg == nil || len(seg.ScoreSpecs) > 0 {
		return nil
	}
	n := 0
	for _, st := range seg.Steps {
		sc := st.GetScore()
		if sc == nil {
			continue
		}
		if len(sc.Components) == 0 || len(sc.Values) > 0 {
			return nil
		}
		n += len(sc.Components)
	}
	if n == 0 {
		return nil
	}
	own := make([]*StepScored, len(seg.Steps))
	compact := make([]StepScored, len(seg.Steps))
	values := make([]float64, n)
	var specs []*ScoreSpec
	k, off := -1, 0
	for i, st := range seg.Steps {
		sc := st.GetScore()
		if sc == nil {
			continue
		}
		if k < 0 || !specOf(specs[k], sc) { // a segment's steps share one spec
			k = slices.IndexFunc(specs, func(sp *ScoreSpec) bool { return specOf(sp, sc) })
			if k < 0 {
				k, specs = len(specs), append(specs, newScoreSpec(sc))
			}
		}
		m := len(sc.Components)
		v := values[off : off+m : off+m]
		for j, c := range sc.Components {
			v[j] = c.GetValue()
		}
		off += m
		c := &compact[i]
		c.Spec, c.Values, c.Total = uint32(k), v, sc.Total
		own[i], st.Score = sc, c
	}
	seg.ScoreSpecs = specs
	return func() {
		for i, st := range seg.Steps {
			if own[i] != nil {
				st.Score = own[i]
			}
		}
		seg.ScoreSpecs = nil
	}
}

// specOf reports whether sc was scored under sp: the same version, digest, component
// names and weights.
func specOf(sp *ScoreSpec, sc *StepScored) bool {
	if sp.Version != sc.SpecVersion || sp.Digest != sc.SpecDigest || len(sp.Names) != len(sc.Components) {
		return false
	}
	for j, c := range sc.Components {
		if sp.Names[j] != c.GetName() || sp.Weights[j] != c.GetWeight() {
			return false
		}
	}
	return true
}

// newScoreSpec returns the spec sc names: its version, components' names and weights.
func newScoreSpec(sc *StepScored) *ScoreSpec {
	sp := &ScoreSpec{Version: sc.SpecVersion, Digest: sc.SpecDigest, Names: make([]string, len(sc.Components)), Weights: make([]float64, len(sc.Components))}
	for j, c := range sc.Components {
		sp.Names[j], sp.Weights[j] = c.GetName(), c.GetWeight()
	}
	return sp
}

// compactEvent puts the scores of ev's segment, or of the segments of ev's batch, into
// the compact form (compactScores) and returns the function that undoes it, or nil.
func compactEvent(ev *Event) (restore func()) {
	var undo []func()
	switch b := ev.GetBody().(type) {
	case *Event_Steps:
		return b.Steps.compactScores()
	case *Event_Batch:
		for _, e := range b.Batch.GetEvents() {
			if r := e.GetSteps().compactScores(); r != nil {
				undo = append(undo, r)
			}
		}
	}
	if len(undo) == 0 {
		return nil
	}
	return func() {
		for _, r := range undo {
			r()
		}
	}
}
