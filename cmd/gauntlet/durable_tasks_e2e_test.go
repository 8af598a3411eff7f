package main

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// A task episode runs as a DurableEpisode workflow too: the curriculum worker's
// activities read the dataset from --tasks.datasets and get their sandboxes from
// --sandbox.runtime, the oracle's solution passes the task's verifier, and the episode's
// steps and verdict are in ClickHouse with the task it played.
func TestTaskDurableEpisode(t *testing.T) {
	dataset, err := filepath.Abs("../../datasets/gauntlet")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Sandbox = sandboxConfig(t, runtimes.Process)
	if err := cfg.Tasks.Datasets.Set("gauntlet=" + dataset); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, cfg, modStore, modFaults, modReward, modTemporal, modCurriculum)
	tc := dialTemporal(t, s.app.temporalAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const task = "shell/count-errors"
	spec := workflows.EpisodeSpec{Env: "tasks", Params: map[string]any{"dataset": "gauntlet", "task": task},
		Policy: "oracle", Profile: "baseline", Seed: 5}
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-task", TaskQueue: workflows.TaskQueue}, workflows.WorkflowEpisode, spec)
	if err != nil {
		t.Fatal(err)
	}
	var res workflows.EpisodeResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatalf("durable task episode: %v", err)
	}
	if !res.Success || res.Steps == 0 {
		t.Fatalf("durable task episode: %+v; want the oracle's success", res)
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	waitEpisodes(t, conn, cfg.Database, []string{res.EpisodeID})
	q := fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(countIf(runtime = '%s') > 0)) FROM %s.steps FINAL WHERE episode_id = '%s'`, runtimes.Process, cfg.Database, res.EpisodeID)
	if got, want := queryOne(t, conn, q), fmt.Sprintf("%d 1", res.Steps); got != want {
		t.Errorf("steps in ClickHouse (count, any run in a process sandbox) = %s; want %s", got, want)
	}
	q = fmt.Sprintf(`SELECT concat(toString(success), ' ', toString(infra_error)) FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, res.EpisodeID)
	if got := queryOne(t, conn, q); got != "1 0" {
		t.Errorf("episode (success, infra error) = %s; want 1 0", got)
	}
}
