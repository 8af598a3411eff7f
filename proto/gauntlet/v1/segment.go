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
	if sc.lean() { // a worker's own step, not yet encoded
		sp := keptScoreSpec(sc)
		if sp == nil || len(sp.Names) != len(sc.Values) {
			return Score{Total: sc.GetTotal()}, fmt.Errorf("step %d: score: values of spec %s (%s), which this process does not keep", st.GetStep(), sc.GetSpecVersion(), sc.GetSpecDigest())
		}
		return Score{Version: sp.Version, Digest: sp.Digest, Names: sp.Names, Values: sc.Values, Total: sc.Total}, nil
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
// spec once in score_specs, per step its index, its values and its total. A score is in
// the full form (components) or the values form (StepScored.lean, whose spec the
// process keeps). It returns the function that puts the steps' own scores back, or nil
// when there was nothing to do: no step has a score, a score is in neither form (a
// values-form score whose spec the process does not keep is sent as it is, with no names
// for a reader to find), or seg is compact already (a decoded segment published again).
// seg's steps must not be read by another goroutine meanwhile.
//
// On the wire a step's score shrinks from about 170 bytes (five named components with
// their weights, the episode id and the spec version again) to about 50, and the store
// decodes it into two allocations instead of six.
func (seg *StepsTaken) compactScores() (restore func()) {
	if seg == nil || len(seg.ScoreSpecs) > 0 {
		return nil
	}
	n := 0
	var kept []*ScoreSpec // kept[i]: the spec of step i's score in the values form
	for i, st := range seg.Steps {
		sc := st.GetScore()
		switch {
		case sc == nil:
		case sc.lean():
			if kept == nil {
				kept = make([]*ScoreSpec, len(seg.Steps))
			}
			if i > 0 && kept[i-1] != nil && kept[i-1].Version == sc.SpecVersion && kept[i-1].Digest == sc.SpecDigest {
				kept[i] = kept[i-1] // a segment's steps share one spec
			} else {
				kept[i] = keptScoreSpec(sc)
			}
			if kept[i] == nil || len(kept[i].Names) != len(sc.Values) {
				return nil // not made by LeanStepScores: sent as it is
			}
		case len(sc.Components) == 0 || len(sc.Values) > 0:
			return nil
		default:
			n += len(sc.Components)
		}
	}
	if n == 0 && kept == nil {
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
		var v []float64
		if kept != nil && kept[i] != nil {
			if k < 0 || specs[k] != kept[i] {
				if k = slices.Index(specs, kept[i]); k < 0 {
					k, specs = len(specs), append(specs, kept[i])
				}
			}
			v = sc.Values
		} else {
			if k < 0 || !specOf(specs[k], sc) { // a segment's steps share one spec
				k = slices.IndexFunc(specs, func(sp *ScoreSpec) bool { return specOf(sp, sc) })
				if k < 0 {
					k, specs = len(specs), append(specs, newScoreSpec(sc))
				}
			}
			m := len(sc.Components)
			v = values[off : off+m : off+m]
			for j, c := range sc.Components {
				v[j] = c.GetValue()
			}
			off += m
		}
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
