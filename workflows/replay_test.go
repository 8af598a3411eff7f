package workflows

import (
	"log/slog"
	"path/filepath"
	"testing"

	"go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
)

// TestReplayRecordedHistories replays histories recorded against the real Temporal dev
// server (cmd/gauntlet: go test -run 'TestCurriculumOnRealStack|TestDurableEpisode'
// -update-histories). A change to workflow code that would make running workflows
// non-deterministic (other commands, other order) fails here.
func TestReplayRecordedHistories(t *testing.T) {
	want := []string{"curriculum-oracle", "curriculum-random", "curriculum-signals", "batch", "durable-episode"}
	for _, name := range want {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join("testdata", name+".json")
			r := worker.NewWorkflowReplayer()
			r.RegisterWorkflowWithOptions(Curriculum, workflow.RegisterOptions{Name: WorkflowCurriculum})
			r.RegisterWorkflowWithOptions(Batch, workflow.RegisterOptions{Name: WorkflowBatch})
			r.RegisterWorkflowWithOptions(DurableEpisode, workflow.RegisterOptions{Name: WorkflowEpisode})
			logger := log.NewStructuredLogger(slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})))
			if err := r.ReplayWorkflowHistoryFromJSONFile(logger, path); err != nil {
				t.Fatalf("replay %s: %v", path, err)
			}
		})
	}
}
