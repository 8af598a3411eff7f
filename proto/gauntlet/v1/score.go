package gauntletv1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
)

// StepScores returns the score of each of steps, the steps of the ScoreRequest r answers,
// in their order. A reply with a table is read into StepScored messages sharing three
// backing arrays, a fraction of the allocations of one message per score (docs/benchmarks.md,
// Costs the code cites); one without, from an older reward service, gives its scores as
// they are. A reply carrying an error, or not exactly one score per step, is an error
// naming what is wrong.
func (r *ScoreReply) StepScores(steps []*StepTaken) ([]*StepScored, error) {
	t, err := r.checkTable(steps)
	if err != nil {
		return nil, err
	}
	if t == nil {
		return r.Scores, nil
	}
	n := len(t.Values)
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

// LeanStepScores is StepScores giving the scores in the values form: each with its spec's
// version and digest, its values in the spec's order and its total, and no components
// (a step's eight components are 700 bytes of messages; its values 64). The spec's names
// and weights are kept once for the process (by version and digest): Marshal writes
// such a score into its segment's compact form as it does a full one, and
// StepScored.Full gives it back with its components. A spec whose version and digest
// the process knows with other names or weights (specs built in Go, without a digest)
// gives its steps' scores in the full form.
func (r *ScoreReply) LeanStepScores(steps []*StepTaken) ([]*StepScored, error) {
	t, err := r.checkTable(steps)
	if err != nil {
		return nil, err
	}
	if t == nil {
		return r.Scores, nil
	}
	specs := make([]*ScoreSpec, len(t.Specs)) // the process's copy; nil: full form
	for k, sp := range t.Specs {
		specs[k] = internScoreSpec(sp)
	}
	scores := make([]StepScored, len(steps))
	out := make([]*StepScored, len(steps))
	var full []*StepTaken // steps whose spec the process cannot keep
	off := 0
	for i, st := range steps {
		sp := specs[t.Spec[i]]
		m := len(t.Specs[t.Spec[i]].GetNames())
		if sp == nil {
			full = append(full, st)
			off += m
			continue
		}
		sc := &scores[i]
		sc.EpisodeId, sc.Step, sc.Total = st.GetEpisodeId(), st.GetStep(), t.Totals[i]
		sc.SpecVersion, sc.SpecDigest = sp.Version, sp.Digest
		sc.Values = t.Values[off : off+m : off+m]
		off += m
		out[i] = sc
	}
	if full != nil {
		scored, err := r.StepScores(steps)
		if err != nil {
			return nil, err
		}
		for i := range out {
			if out[i] == nil {
				out[i] = scored[i]
			}
		}
	}
	return out, nil
}

// checkTable returns r's table, checked against steps: nil (and no error) for a reply
// without one whose scores fit steps, from an older reward service.
func (r *ScoreReply) checkTable(steps []*StepTaken) (*ScoreTable, error) {
	if r.GetError() != "" {
		return nil, errors.New("reward service: " + r.GetError())
	}
	t := r.GetTable()
	if t == nil {
		if len(r.GetScores()) != len(steps) {
			return nil, fmt.Errorf("reward service returned %d scores for %d steps", len(r.GetScores()), len(steps))
		}
		return nil, nil
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
	return t, nil
}

// scoreSpecs holds the process's copy of every spec LeanStepScores has met, by version
// and digest (a scoreSpecKey): a score in the values form names its spec by them.
// Specs are few (one per spec file a run names, and the built-in one) and never change.
var scoreSpecs sync.Map

type scoreSpecKey struct{ version, digest string }

// internScoreSpec returns the process's copy of sp: the one kept for sp's version and
// digest, stored now (copied: sp may share a reply's memory) if there was none; nil when
// the one kept has other names or weights.
func internScoreSpec(sp *ScoreSpec) *ScoreSpec {
	if v, ok := scoreSpecs.Load(scoreSpecKey{sp.GetVersion(), sp.GetDigest()}); ok {
		if kept := v.(*ScoreSpec); sameNamesAndWeights(kept, sp) {
			return kept
		}
		return nil
	}
	kept := &ScoreSpec{Version: strings.Clone(sp.GetVersion()), Digest: strings.Clone(sp.GetDigest()),
		Names: make([]string, len(sp.GetNames())), Weights: slices.Clone(sp.GetWeights())}
	for j, name := range sp.GetNames() {
		kept.Names[j] = strings.Clone(name)
	}
	v, _ := scoreSpecs.LoadOrStore(scoreSpecKey{kept.Version, kept.Digest}, kept)
	if kept = v.(*ScoreSpec); sameNamesAndWeights(kept, sp) {
		return kept
	}
	return nil
}

// keptScoreSpec returns the spec a score in the values form names, nil if the process
// keeps none by its version and digest.
func keptScoreSpec(sc *StepScored) *ScoreSpec {
	v, ok := scoreSpecs.Load(scoreSpecKey{sc.GetSpecVersion(), sc.GetSpecDigest()})
	if !ok {
		return nil
	}
	return v.(*ScoreSpec)
}

func sameNamesAndWeights(a, b *ScoreSpec) bool {
	return slices.Equal(a.GetNames(), b.GetNames()) && slices.EqualFunc(a.GetWeights(), b.GetWeights(), func(x, y float64) bool {
		return math.Float64bits(x) == math.Float64bits(y)
	})
}

// lean reports whether sc is in the values form (LeanStepScores): values, a spec
// version, no components. A segment's compact form has values but no version.
func (sc *StepScored) lean() bool {
	return len(sc.GetValues()) > 0 && sc.GetSpecVersion() != "" && len(sc.GetComponents()) == 0
}

// Full returns sc in the full form, with its components named and weighted: sc itself
// when it is in that form (or has no score at all), else a copy built from the spec the
// process keeps for its version and digest. A score in the values form whose spec the
// process does not keep (it was not made by LeanStepScores) is returned as it is.
func (sc *StepScored) Full() *StepScored {
	if sc == nil || !sc.lean() {
		return sc
	}
	sp := keptScoreSpec(sc)
	if sp == nil || len(sp.Names) != len(sc.Values) {
		return sc
	}
	out := &StepScored{EpisodeId: sc.EpisodeId, Step: sc.Step, Total: sc.Total, SpecVersion: sc.SpecVersion, SpecDigest: sc.SpecDigest,
		Components: make([]*RewardComponent, len(sc.Values))}
	comps := make([]RewardComponent, len(sc.Values))
	for j, v := range sc.Values {
		comps[j] = RewardComponent{Name: sp.Names[j], Value: v, Weight: sp.Weights[j]}
		out.Components[j] = &comps[j]
	}
	return out
}

// DecodeReusing decodes data, a RewardState in its wire form (ScoreRequest.encoded_states),
// into st, reusing st's slices and messages: a reward service decoding one state per
// step into the same st allocates nothing once st has grown to the spec's size, where
// proto.Unmarshal makes a message and its slices each time. What st held before is
// replaced, not merged. A field RewardState does not have is an error naming it: a state
// written by a newer reward service is refused rather than read in part.
func (st *RewardState) DecodeReusing(data []byte) error {
	ep := st.Episode
	st.Episode, st.Potentials = nil, st.Potentials[:0]
	windows := st.Windows[:cap(st.Windows)]
	nw := 0
	err := ScanFields(data, func(num protowire.Number, typ protowire.Type, v []byte) error {
		switch {
		case num == 1 && typ == protowire.BytesType:
			if ep == nil {
				ep = &EpisodeSoFar{}
			} else {
				ep.Reset()
			}
			if err := ep.UnmarshalVTUnsafe(v); err != nil {
				return fmt.Errorf("episode: %w", err)
			}
			st.Episode = ep
		case num == 2:
			var err error
			if st.Potentials, err = appendDoubles(st.Potentials, typ, v); err != nil {
				return fmt.Errorf("potentials: %w", err)
			}
		case num == 3 && typ == protowire.BytesType:
			if nw == len(windows) {
				windows = append(windows, &ZWindow{})
				windows = windows[:cap(windows)]
			}
			w := windows[nw]
			if w == nil {
				w = &ZWindow{}
				windows[nw] = w
			}
			w.Values = w.Values[:0]
			nw++
			return ScanFields(v, func(num protowire.Number, typ protowire.Type, v []byte) error {
				if num != 1 {
					return fmt.Errorf("windows[%d]: unknown field %d", nw-1, num)
				}
				var err error
				if w.Values, err = appendDoubles(w.Values, typ, v); err != nil {
					return fmt.Errorf("windows[%d].values: %w", nw-1, err)
				}
				return nil
			})
		case num >= 1 && num <= 3:
			return fmt.Errorf("field %d: wire type %d is not the field's", num, typ)
		default:
			return fmt.Errorf("unknown field %d", num)
		}
		return nil
	})
	st.Windows = windows[:nw]
	if err != nil {
		return fmt.Errorf("reward state: %w", err)
	}
	return nil
}

// appendDoubles appends the doubles of a packed repeated double field (v, its bytes) to
// dst. Reward services write states packed, as every proto3 encoder does; an unpacked
// one is refused, not half read.
func appendDoubles(dst []float64, typ protowire.Type, v []byte) ([]float64, error) {
	if typ != protowire.BytesType {
		return dst, fmt.Errorf("wire type %d: only packed doubles are written", typ)
	}
	if len(v)%8 != 0 {
		return dst, fmt.Errorf("%d bytes of packed doubles is not a whole number of them", len(v))
	}
	for ; len(v) > 0; v = v[8:] {
		dst = append(dst, math.Float64frombits(binary.LittleEndian.Uint64(v)))
	}
	return dst, nil
}

// AppendEncoded appends st in its wire form (what DecodeReusing reads) to dst.
func (st *RewardState) AppendEncoded(dst []byte) ([]byte, error) {
	n := st.SizeVT()
	dst = slices.Grow(dst, n)
	if _, err := st.MarshalToSizedBufferVT(dst[len(dst) : len(dst)+n]); err != nil {
		return dst, fmt.Errorf("encode reward state: %w", err)
	}
	return dst[:len(dst)+n], nil
}
