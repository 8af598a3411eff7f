package gauntletv1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"google.golang.org/protobuf/encoding/protowire"
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
