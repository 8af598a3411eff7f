package scheduler

import (
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// endedSet records which episode indices of a run have ended, in memory that stays small
// however large the run: every index below Low has ended, and the few above it that ended
// out of order are kept individually. Since the scheduler admits at most MaxInFlight
// episodes past the oldest unfinished one, Above never holds more than that.
type endedSet struct {
	Low   uint64
	above map[uint64]struct{}
}

// Add records index i and reports whether it was new.
func (s *endedSet) Add(i uint64) bool {
	if s.Has(i) {
		return false
	}
	if s.above == nil {
		s.above = map[uint64]struct{}{}
	}
	s.above[i] = struct{}{}
	for {
		if _, ok := s.above[s.Low]; !ok {
			break
		}
		delete(s.above, s.Low)
		s.Low++
	}
	return true
}

// Has reports whether index i ended.
func (s *endedSet) Has(i uint64) bool {
	if i < s.Low {
		return true
	}
	_, ok := s.above[i]
	return ok
}

// Count is how many distinct indices ended.
func (s *endedSet) Count() uint64 { return s.Low + uint64(len(s.above)) }

// sortedAbove returns the stragglers in order, as RunState.ended_above holds them.
func (s *endedSet) sortedAbove() []uint64 {
	if len(s.above) == 0 {
		return nil
	}
	above := make([]uint64, 0, len(s.above))
	for i := range s.above {
		above = append(above, i)
	}
	slices.Sort(above)
	return above
}

// run is the scheduler's state of one run, persisted in the gauntlet_runs bucket as a
// gauntletv1.RunState (encode). The ended set is a map here, for the per-end lookup, and
// sorted only when written.
type run struct {
	Spec     []byte // the encoded RunRequested, written into every RunState as it is
	Assigned uint64
	Ended    endedSet

	Succeeded   uint64
	Steps       uint64
	Faults      uint64
	InfraErrors uint64
	// InfraByKind counts InfraErrors by gauntletv1.InfraKind (index), trailing zeros
	// left out.
	InfraByKind []uint64
	RewardSum   float64
	StartedAt   int64
	UpdatedAt   int64
	Error       string

	spec  *gauntletv1.RunRequested
	dirty bool
	// rev is the run's revision in KV as this instance last read or wrote it (0: never
	// written); persist writes only over it.
	rev uint64

	// planBackoff is the pause before the next plan request after the faults service was
	// unavailable (0: none pending); planRetryAt is when that pause ends. Not persisted:
	// a restarted scheduler asks again at once.
	planBackoff time.Duration
	planRetryAt time.Time
}

// decodeRun reads a run's state from KV: a RunState, or the JSON of older schedulers
// (legacy reports which, so Starting can rewrite it).
func decodeRun(b []byte) (r *run, legacy bool, err error) {
	st, err := gauntletv1.DecodeRunState(b)
	if err != nil {
		return nil, false, err
	}
	r = &run{
		spec: st.GetSpec(), Assigned: st.GetAssigned(), Ended: endedSet{Low: st.GetEndedLow()},
		Succeeded: st.GetSucceeded(), Steps: st.GetSteps(), Faults: st.GetFaultsFired(),
		InfraErrors: st.GetInfraErrors(), InfraByKind: st.GetInfraByKind(), RewardSum: st.GetRewardSum(),
		StartedAt: st.GetStartedAtUnixNano(), UpdatedAt: st.GetUpdatedAtUnixNano(), Error: st.GetError(),
	}
	if r.spec == nil {
		r.spec = &gauntletv1.RunRequested{}
	}
	for _, i := range st.GetEndedAbove() {
		r.Ended.Add(i)
	}
	if r.Spec, err = gauntletv1.Marshal(r.spec); err != nil {
		return nil, false, fmt.Errorf("encode run spec: %w", err)
	}
	return r, len(b) > 0 && b[0] == '{', nil
}

// encode writes the run as a RunState. The spec, encoded once when the run was accepted,
// is copied in as field 1 rather than encoded again on every write (a message's encoding
// may list its fields in any order).
func (r *run) encode() ([]byte, error) {
	st := gauntletv1.RunState{
		Assigned: r.Assigned, EndedLow: r.Ended.Low, EndedAbove: r.Ended.sortedAbove(),
		Succeeded: r.Succeeded, Steps: r.Steps, FaultsFired: r.Faults, InfraErrors: r.InfraErrors,
		RewardSum: r.RewardSum, StartedAtUnixNano: r.StartedAt, UpdatedAtUnixNano: r.UpdatedAt,
		Error: r.Error, InfraByKind: r.InfraByKind,
	}
	n := st.SizeVT()
	b := make([]byte, 0, protowire.SizeTag(1)+protowire.SizeBytes(len(r.Spec))+n)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendBytes(b, r.Spec)
	off := len(b)
	b = b[:off+n]
	if _, err := st.MarshalToSizedBufferVT(b[off:]); err != nil {
		return nil, fmt.Errorf("encode run state: %w", err)
	}
	return b, nil
}

func (r *run) done() bool { return r.Error != "" || r.Ended.Count() >= r.spec.GetEpisodes() }

// record folds one ended episode into the run; duplicates (a re-run after a crash) are
// ignored.
func (r *run) record(e *gauntletv1.EndedSummary) {
	if !r.Ended.Add(e.GetEpisode().GetIndex()) {
		return
	}
	// The run's state says when it last changed, in KV too: a batch's heartbeat reads it
	// there to tell a stalled run from a moving one (workflows.BatchWaiting).
	r.UpdatedAt = time.Now().UnixNano()
	r.Steps += uint64(e.GetSteps())
	r.Faults += uint64(e.GetFaultsFired())
	r.RewardSum += e.GetTotalReward()
	if e.GetSuccess() {
		r.Succeeded++
	}
	if e.GetInfraError() {
		r.InfraErrors++
		k := int(e.GetInfraKind())
		if k >= len(r.InfraByKind) {
			r.InfraByKind = append(r.InfraByKind, make([]uint64, k+1-len(r.InfraByKind))...)
		}
		r.InfraByKind[k]++
	}
	r.dirty = true
}

func (r *run) progress() *gauntletv1.RunProgress {
	return &gauntletv1.RunProgress{
		RunId: r.spec.GetRunId(), Env: r.spec.GetEnv(), Label: r.spec.GetLabel(),
		Episodes: r.spec.GetEpisodes(), Assigned: r.Assigned, Ended: r.Ended.Count(),
		Succeeded: r.Succeeded, Steps: r.Steps, FaultsFired: r.Faults, InfraErrors: r.InfraErrors,
		RewardSum: r.RewardSum, Done: r.done(), StartedAtUnixNano: r.StartedAt,
		UpdatedAtUnixNano: r.UpdatedAt, Error: r.Error,
		// A copy: the message may be encoded after the next end updates the counts.
		InfraByKind: slices.Clone(r.InfraByKind),
	}
}
