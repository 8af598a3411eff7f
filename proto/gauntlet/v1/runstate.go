package gauntletv1

import (
	"encoding/json"
	"fmt"
)

// DecodeRunState reads a run's state as the scheduler keeps it in the gauntlet_runs KV
// bucket: a RunState, or the JSON the scheduler wrote before RunState existed (a value
// starting with '{', which no RunState encoding does: it would be field 15 as a group).
func DecodeRunState(b []byte) (*RunState, error) {
	if len(b) > 0 && b[0] == '{' {
		return decodeLegacyRunState(b)
	}
	var s RunState
	if err := Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("decode run state: %w", err)
	}
	return &s, nil
}

// legacyRunState is the JSON form of a run's state written by schedulers before RunState.
type legacyRunState struct {
	Spec     []byte `json:"spec"` // protobuf RunRequested
	Assigned uint64 `json:"assigned"`
	Ended    struct {
		Low   uint64   `json:"low"`
		Above []uint64 `json:"above"`
	} `json:"ended"`
	Succeeded   uint64  `json:"succeeded"`
	Steps       uint64  `json:"steps"`
	Faults      uint64  `json:"faults"`
	InfraErrors uint64  `json:"infra_errors"`
	RewardSum   float64 `json:"reward_sum"`
	StartedAt   int64   `json:"started_at"`
	UpdatedAt   int64   `json:"updated_at"`
	Error       string  `json:"error"`
}

func decodeLegacyRunState(b []byte) (*RunState, error) {
	var v legacyRunState
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("decode run state (JSON): %w", err)
	}
	spec := &RunRequested{}
	if err := Unmarshal(v.Spec, spec); err != nil {
		return nil, fmt.Errorf("decode run spec: %w", err)
	}
	return &RunState{
		Spec: spec, Assigned: v.Assigned, EndedLow: v.Ended.Low, EndedAbove: v.Ended.Above,
		Succeeded: v.Succeeded, Steps: v.Steps, FaultsFired: v.Faults, InfraErrors: v.InfraErrors,
		RewardSum: v.RewardSum, StartedAtUnixNano: v.StartedAt, UpdatedAtUnixNano: v.UpdatedAt,
		Error: v.Error,
	}, nil
}

// EndedCount is how many distinct episodes of the run ended.
func (s *RunState) EndedCount() uint64 {
	n := s.GetEndedLow()
	for _, i := range s.GetEndedAbove() {
		if i >= s.GetEndedLow() {
			n++
		}
	}
	return n
}

// Done reports whether the run is over: refused, or every episode ended.
func (s *RunState) Done() bool {
	return s.GetError() != "" || s.EndedCount() >= s.GetSpec().GetEpisodes()
}

// Progress is the run's progress as the scheduler publishes it.
func (s *RunState) Progress() *RunProgress {
	spec := s.GetSpec()
	return &RunProgress{
		RunId: spec.GetRunId(), Env: spec.GetEnv(), Label: spec.GetLabel(),
		Episodes: spec.GetEpisodes(), Assigned: s.GetAssigned(), Ended: s.EndedCount(),
		Succeeded: s.GetSucceeded(), Steps: s.GetSteps(), FaultsFired: s.GetFaultsFired(),
		InfraErrors: s.GetInfraErrors(), RewardSum: s.GetRewardSum(), Done: s.Done(),
		StartedAtUnixNano: s.GetStartedAtUnixNano(), UpdatedAtUnixNano: s.GetUpdatedAtUnixNano(),
		Error: s.GetError(), InfraByKind: s.GetInfraByKind(),
	}
}

// DecodeRunProgress reads a run's progress from its state in the gauntlet_runs bucket, for
// clients that missed the progress messages.
func DecodeRunProgress(state []byte) (*RunProgress, error) {
	s, err := DecodeRunState(state)
	if err != nil {
		return nil, err
	}
	return s.Progress(), nil
}
