package scheduler

import (
	"encoding/json"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

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

// MarshalJSON writes Low and the sorted stragglers.
func (s endedSet) MarshalJSON() ([]byte, error) {
	above := make([]uint64, 0, len(s.above))
	for i := range s.above {
		above = append(above, i)
	}
	sort.Slice(above, func(a, b int) bool { return above[a] < above[b] })
	return json.Marshal(struct {
		Low   uint64   `json:"low"`
		Above []uint64 `json:"above,omitempty"`
	}{s.Low, above})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *endedSet) UnmarshalJSON(b []byte) error {
	var v struct {
		Low   uint64   `json:"low"`
		Above []uint64 `json:"above"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	s.Low, s.above = v.Low, nil
	for _, i := range v.Above {
		s.Add(i)
	}
	return nil
}

// run is the scheduler's state of one run, persisted as JSON in the gauntlet_runs bucket.
type run struct {
	Spec     []byte   `json:"spec"` // protobuf RunRequested
	Assigned uint64   `json:"assigned"`
	Ended    endedSet `json:"ended"`

	Succeeded   uint64  `json:"succeeded"`
	Steps       uint64  `json:"steps"`
	Faults      uint64  `json:"faults"`
	InfraErrors uint64  `json:"infra_errors"`
	RewardSum   float64 `json:"reward_sum"`
	StartedAt   int64   `json:"started_at"`
	UpdatedAt   int64   `json:"updated_at"`
	Error       string  `json:"error,omitempty"`

	spec  *gauntletv1.RunRequested
	dirty bool
}

func decodeRun(b []byte) (*run, error) {
	var r run
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decode run state: %w", err)
	}
	r.spec = &gauntletv1.RunRequested{}
	if err := proto.Unmarshal(r.Spec, r.spec); err != nil {
		return nil, fmt.Errorf("decode run spec: %w", err)
	}
	return &r, nil
}

func (r *run) encode() ([]byte, error) { return json.Marshal(r) }

func (r *run) done() bool { return r.Error != "" || r.Ended.Count() >= r.spec.GetEpisodes() }

// record folds one ended episode into the run; duplicates (a re-run after a crash) are
// ignored.
func (r *run) record(e *gauntletv1.EndedSummary) {
	if !r.Ended.Add(e.GetEpisode().GetIndex()) {
		return
	}
	r.Steps += uint64(e.GetSteps())
	r.Faults += uint64(e.GetFaultsFired())
	r.RewardSum += e.GetTotalReward()
	if e.GetSuccess() {
		r.Succeeded++
	}
	if e.GetInfraError() {
		r.InfraErrors++
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
	}
}

// DecodeProgress reads a run's progress from its state in the gauntlet_runs bucket, for
// clients that missed the progress messages.
func DecodeProgress(state []byte) (*gauntletv1.RunProgress, error) {
	r, err := decodeRun(state)
	if err != nil {
		return nil, err
	}
	return r.progress(), nil
}
