package gauntletv1

import (
	"errors"
	"fmt"
)

// StepScores returns the score of each of steps, the steps of the ScoreRequest r answers,
// in their order. A reply with a table is read into StepScored messages sharing three
// backing arrays, a fraction of the allocations of one message per score (docs/benchmarks.md,
// Costs the code cites); one without, from an older reward service, gives its scores as
// they are. A reply carrying an error, or not exactly one score per step, is an error
// naming what is wrong.
func (r *ScoreReply) StepScores(steps []*StepTaken) ([]*StepScored, error) {
	if r.GetError() != "" {
		return nil, errors.New("reward service: " + r.GetError())
	}
	t := r.GetTable()
	if t == nil {
		if len(r.GetScores()) != len(steps) {
			return nil, fmt.Errorf("reward service returned %d scores for %d steps", len(r.GetScores()), len(steps))
		}
		return r.Scores, nil
	}
	if len(t.Spec) != len(steps) || len(t.Totals) != len(steps) {
		return nil, fmt.Errorf("score table: %d spec indexes and %d totals for %d steps", len(t.Spec), len(t.Totals), len(steps))
	}
	for k, sp := range t.Specs {
		if len(sp.GetWeights()) != len(sp.GetNames()) {
			return nil, fmt.Errorf("score table: specs[%d] has %d names but %d weights", k, len(sp.GetNames()), len(sp.GetWeights()))
		}
	}
	n := 0
	for i, k := range t.Spec {
		if int(k) >= len(t.Specs) {
			return nil, fmt.Errorf("score table: spec[%d] is %d, past the %d specs", i, k, len(t.Specs))
		}
		n += len(t.Specs[k].GetNames())
	}
	if len(t.Values) != n {
		return nil, fmt.Errorf("score table: %d values where its steps' specs have %d components", len(t.Values), n)
	}
	scores := make([]StepScored, len(steps))
	comps := make([]RewardComponent, n)
	ptrs := make([]*RewardComponent, n)
	out := make([]*StepScored, len(steps))
	off := 0
	for i, st := range steps {
		sp := t.Specs[t.Spec[i]]
		names, weights := sp.GetNames(), sp.GetWeights()
		m := len(names)
		sc := &scores[i]
		sc.EpisodeId, sc.Step, sc.SpecVersion, sc.Total = st.GetEpisodeId(), st.GetStep(), sp.GetVersion(), t.Totals[i]
		sc.SpecDigest = sp.GetDigest()
		sc.Components = ptrs[off : off+m : off+m]
		for j := range m {
			c := &comps[off+j]
			c.Name, c.Value, c.Weight = names[j], t.Values[off+j], weights[j]
			ptrs[off+j] = c
		}
		off += m
		out[i] = sc
	}
	return out, nil
}
