package trajectory

import (
	"time"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TrainerRow is one row of the trainer_steps table: what a trainer attached to one step
// over the env API (token ids, logprobs, policy version). It lives apart from steps
// because it is large and most queries never need it; join on (episode_id, step).
type TrainerRow struct {
	RunID              string
	EpisodeID          string
	Step               uint32
	RequestedAt        time.Time
	PolicyVersion      string
	PromptTokenIDs     []uint32
	CompletionTokenIDs []uint32
	Logprobs           []float32
	Version            uint64
}

// trainerColumns is the trainer_steps table, in the order of migration 2.
var trainerColumns = []column[TrainerRow]{
	col("run_id", func(r *TrainerRow) *string { return &r.RunID }),
	col("episode_id", func(r *TrainerRow) *string { return &r.EpisodeID }),
	col("step", func(r *TrainerRow) *uint32 { return &r.Step }),
	col("requested_at", func(r *TrainerRow) *time.Time { return &r.RequestedAt }),
	col("policy_version", func(r *TrainerRow) *string { return &r.PolicyVersion }),
	col("prompt_token_ids", func(r *TrainerRow) *[]uint32 { return &r.PromptTokenIDs }),
	col("completion_token_ids", func(r *TrainerRow) *[]uint32 { return &r.CompletionTokenIDs }),
	col("logprobs", func(r *TrainerRow) *[]float32 { return &r.Logprobs }),
	col("version", func(r *TrainerRow) *uint64 { return &r.Version }),
}

// appendTrainerRow adds the trainer row of s, if the step carries trainer data.
func appendTrainerRow(rows []TrainerRow, s *gauntletv1.StepTaken) []TrainerRow {
	td := s.GetTrainer()
	if td == nil {
		return rows
	}
	return append(rows, TrainerRow{
		RunID: s.GetRunId(), EpisodeID: s.GetEpisodeId(), Step: s.GetStep(),
		RequestedAt: dateTime(s.GetRequestedAtUnixNano()), PolicyVersion: td.GetPolicyVersion(),
		PromptTokenIDs:     nonNil(td.GetPromptTokenIds()),
		CompletionTokenIDs: nonNil(td.GetCompletionTokenIds()),
		Logprobs:           nonNil(td.GetLogprobs()),
		Version:            stepVersion,
	})
}
