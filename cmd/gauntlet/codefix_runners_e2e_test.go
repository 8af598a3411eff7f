package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	connectrpc "connectrpc.com/connect"
	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// TestCodefixOverEnvAPI plays a codefix episode over the env API, its actions chosen by
// the oracle on the trainer's side: the env API's sandboxes come from the runtime named by
// --sandbox.runtime, as the worker's do. A snapshot mid-episode forks into a new episode
// whose replay runs in a sandbox of its own; both reach ClickHouse.
func TestCodefixOverEnvAPI(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	cfg := testConfig(t)
	cfg.Sandbox = sandboxConfig(t, runtimes.Process)
	const token = "codefix-token-0123456789abcdef"
	cfg.EnvAPI.TokensFile = filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(cfg.EnvAPI.TokensFile, []byte("tenants:\n  - name: acme\n    tokens: ["+token+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startStack(t, cfg, modPipeline, modEnvAPI)
	ctx := context.Background()
	api := grpcClient(s.app.envapi.Addr(), token)

	r, err := api.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "codefix", Seed: 4, Profile: "baseline", Policy: "oracle"}))
	if err != nil {
		t.Fatalf("Reset codefix: %v", err)
	}
	id := r.Msg.EpisodeId
	e, err := env.Lookup("codefix")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Lookup(policy.Oracle)
	if err != nil {
		t.Fatal(err)
	}
	agent, err := p.NewAgent(e, 1)
	if err != nil {
		t.Fatal(err)
	}
	turn := env.Turn{Observation: json.RawMessage(r.Msg.ObservationJson)}
	var last *gauntletv1.StepResult
	var fork string
	for !last.GetTerminated() && !last.GetTruncated() {
		if turn.Step == 2 {
			snap, err := api.Snapshot(ctx, connectrpc.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: id}))
			if err != nil {
				t.Fatalf("Snapshot at step 2: %v", err)
			}
			f, err := api.Fork(ctx, connectrpc.NewRequest(&gauntletv1.ForkRequest{SnapshotId: snap.Msg.SnapshotId}))
			if err != nil {
				t.Fatalf("Fork: %v", err)
			}
			if f.Msg.ObservationJson != string(turn.Observation) {
				t.Errorf("the fork at step 2 observes %.200s; the episode observed %.200s", f.Msg.ObservationJson, turn.Observation)
			}
			fork = f.Msg.EpisodeId
			if _, err := api.Close(ctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: fork})); err != nil {
				t.Fatalf("Close the fork: %v", err)
			}
		}
		act, err := agent.Act(turn)
		if err != nil {
			t.Fatal(err)
		}
		sr, err := api.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id,
			Action: &gauntletv1.Action{Tool: act.Tool, ArgsJson: string(act.Args)}}))
		if err != nil {
			t.Fatalf("Step %d: %v", turn.Step, err)
		}
		last = sr.Msg
		if last.GetInfo().GetInfraError() {
			t.Fatalf("step %d: infra error: %s", turn.Step, last.GetInfo().GetError())
		}
		turn = env.Turn{Step: last.Step + 1, Observation: json.RawMessage(last.ObservationJson), Reward: last.Reward}
	}
	if !last.GetInfo().GetSignals().GetSuccess() {
		t.Errorf("the oracle's codefix episode ended at step %d without success: %v", last.Step, last.Reason)
	}
	if fork == "" {
		t.Fatal("the episode ended before step 2: nothing forked")
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	waitEpisodes(t, conn, cfg.Database, []string{id, fork})
	for _, c := range []struct {
		id   string
		want string
	}{{id, fmt.Sprintf("%d 1 0", last.Step+1)}, {fork, "2 0 0"}} {
		got := queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(steps), ' ', toString(success), ' ', toString(infra_error)) FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, c.id))
		if got != c.want {
			t.Errorf("episode %s (steps, success, infra error) = %s; want %s", c.id, got, c.want)
		}
	}
}

// TestCodefixDurableEpisode runs a codefix episode as a DurableEpisode workflow: the
// curriculum worker's activities get their sandboxes from --sandbox.runtime, as the
// worker's episodes do.
func TestCodefixDurableEpisode(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse, Temporal and a sandbox runtime; run without -short")
	}
	cfg := testConfig(t)
	cfg.Sandbox = sandboxConfig(t, runtimes.Process)
	s := startStack(t, cfg, modStore, modFaults, modReward, modTemporal, modCurriculum)
	tc := dialTemporal(t, s.app.temporalAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	spec := workflows.EpisodeSpec{Env: "codefix", Policy: "oracle", Profile: "baseline", Seed: 4}
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-codefix", TaskQueue: workflows.TaskQueue}, workflows.WorkflowEpisode, spec)
	if err != nil {
		t.Fatal(err)
	}
	var res workflows.EpisodeResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatalf("durable codefix episode: %v", err)
	}
	if !res.Success || res.Steps == 0 {
		t.Fatalf("durable codefix episode: %+v; want the oracle's success", res)
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	waitEpisodes(t, conn, cfg.Database, []string{res.EpisodeID})
	q := fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(countIf(runtime = '%s') > 0)) FROM %s.steps FINAL WHERE episode_id = '%s'`, runtimes.Process, cfg.Database, res.EpisodeID)
	if got, want := queryOne(t, conn, q), fmt.Sprintf("%d 1", res.Steps); got != want {
		t.Errorf("steps in ClickHouse (count, any run in a process sandbox) = %s; want %s", got, want)
	}
}
