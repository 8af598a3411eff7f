package trajectory

import (
	"context"
	"reflect"
	"testing"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestTrainerDataJoinsSteps writes two steps, one with trainer data, twice (a redelivery),
// and reads the trainer row back joined to its step.
func TestTrainerDataJoinsSteps(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	with := stepEvent("run-t", 0, 0)
	with.GetStep().Trainer = &gauntletv1.TrainerData{
		PromptTokenIds: []uint32{1, 2, 3}, CompletionTokenIds: []uint32{7, 8},
		Logprobs: []float32{-0.5, -1.25}, PolicyVersion: "ckpt-42",
	}
	without := stepEvent("run-t", 0, 1)
	w := NewWriter(conn, testDB)
	for range 2 {
		counts, err := w.Write(ctx, []*gauntletv1.Event{with, without})
		if err != nil {
			t.Fatal(err)
		}
		if counts.Steps != 2 || counts.Trainer != 1 {
			t.Errorf("Counts = %+v, want 2 steps and 1 trainer row", counts)
		}
	}
	_, rows, err := Query(ctx, conn, `SELECT s.step, s.tool, policy_version, prompt_token_ids, completion_token_ids, logprobs
		FROM (SELECT episode_id, step, tool FROM steps FINAL WHERE run_id = 'run-t') AS s
		ANY INNER JOIN (SELECT episode_id, step, policy_version, prompt_token_ids, completion_token_ids, logprobs
			FROM trainer_steps FINAL WHERE run_id = 'run-t') USING episode_id, step`)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"0", with.GetStep().Action.Tool, "ckpt-42", "[1,2,3]", "[7,8]", "[-0.5,-1.25]"}}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("joined rows = %v, want %v", rows, want)
	}
}
