package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// TestDurableEpisodeResumesOnAnotherWorker runs a long episode as a DurableEpisode
// workflow on a worker process (`gauntlet serve --target=curriculum`), kills that process
// with SIGKILL mid-episode, and lets a second worker take over: the episode resumes from
// the last step its heartbeat recorded and ClickHouse ends up with every step exactly once.
// The episode names a stateful reward spec (its file in the workflow's input): every step
// is recorded under its digest, the file is in reward_specs, and re-scoring the recorded
// rows (`reward rescore`) gives every recorded score to the bit, across the kill.
func TestDurableEpisodeResumesOnAnotherWorker(t *testing.T) {
	bin := buildBinary(t)
	cfg := testConfig(t)
	cfg.NATSPort = freePort(t)
	s := startStack(t, cfg, modStore, modFaults, modReward, modTemporal)
	tc := dialTemporal(t, s.app.temporalAddr())

	// Worker A: a separate process, the only worker at first.
	a := startProc(t, bin, "serve", "--target", modCurriculum, "--nats", s.app.natsURL(), "--temporal", s.app.temporalAddr(),
		"--http", "", "--log.level", "warn", "--data-dir", t.TempDir(), "--worker.id", "worker-a")
	t.Cleanup(func() { _ = a.Process.Kill(); _ = a.Wait() })

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	spec := workflows.EpisodeSpec{
		Env: "shop", Policy: "random", Profile: "stress", Seed: 21, MaxSteps: 3000,
		Params:           map[string]any{"max_invalid": 1000, "deadline_ms": 86_400_000},
		HeartbeatTimeout: time.Second, RewardSpec: durableRewardSpec,
	}
	rspec, err := scoring.Parse("durable.yaml", []byte(durableRewardSpec))
	if err != nil {
		t.Fatal(err)
	}
	run, err := tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-e2e", TaskQueue: workflows.TaskQueue}, workflows.WorkflowEpisode, spec)
	if err != nil {
		t.Fatal(err)
	}
	// Kill worker A once a heartbeat from mid-episode has reached the server. The first
	// heartbeat (step 1) goes out at once, later ones every 0.8 s (the SDK throttles them
	// to 80 % of the timeout); if no later one comes within 3 s of the first, kill anyway
	// rather than risk the episode finishing first.
	var at workflows.EpisodeCheckpoint
	var first time.Time
	waitFor(ctx, t, func() bool {
		desc, err := tc.DescribeWorkflow(ctx, run.GetID(), "")
		if err != nil {
			return false
		}
		d := desc.RawResponse
		if d.GetWorkflowExecutionInfo().GetStatus() != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
			t.Fatalf("the episode finished before worker A could be killed: %v", d.GetWorkflowExecutionInfo().GetStatus())
		}
		if len(d.PendingActivities) == 0 || d.PendingActivities[0].HeartbeatDetails == nil {
			return false
		}
		p := d.PendingActivities[0].HeartbeatDetails.Payloads
		if len(p) != 1 || json.Unmarshal(p[0].Data, &at) != nil || at.NextStep < 1 {
			return false
		}
		if first.IsZero() {
			first = time.Now()
		}
		return at.NextStep >= 2 || time.Since(first) > 3*time.Second
	})
	if err := a.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = a.Wait()

	// Worker B, in this process.
	w := worker.New(tc, workflows.TaskQueue, worker.Options{Identity: "worker-b"})
	workflows.Register(w, &workflows.Activities{Bus: func() *bus.Bus { return s.app.getBus() }, WorkerID: "worker-b"})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var res workflows.EpisodeResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatalf("durable episode: %v", err)
	}
	t.Logf("killed worker A at heartbeat step %d; result %+v", at.NextStep, res)
	if res.Attempt < 2 || res.ResumedAt < at.NextStep || res.ResumedAt >= res.Steps {
		t.Errorf("result %+v; want a later attempt resumed at or after step %d", res, at.NextStep)
	}
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	q := fmt.Sprintf(`SELECT count(), uniqExact(step), max(step), uniqExact(worker_id) FROM %s.steps FINAL WHERE episode_id = '%s'`, cfg.Database, res.EpisodeID)
	want := fmt.Sprintf("%d %d %d 2", res.Steps, res.Steps, res.Steps-1)
	var got string
	deadline := time.Now().Add(time.Minute)
	for {
		_, rows, err := trajectory.Query(ctx, conn, q)
		if err == nil && len(rows) == 1 {
			got = fmt.Sprintf("%s %s %s %s", rows[0][0], rows[0][1], rows[0][2], rows[0][3])
		}
		if got == want || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got != want {
		t.Fatalf("steps in ClickHouse (count, distinct, max, workers) = %s; want %s", got, want)
	}
	// The ended event is projected in its own batch: it may land after the steps.
	episodeQ := fmt.Sprintf(`SELECT count(), groupArray(steps) FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, res.EpisodeID)
	wantEpisode := fmt.Sprintf("1 [%d]", res.Steps)
	for {
		_, rows, err := trajectory.Query(ctx, conn, episodeQ)
		if err == nil && len(rows) == 1 {
			got = rows[0][0] + " " + rows[0][1]
		}
		if got == wantEpisode || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if got != wantEpisode {
		t.Errorf("episode rows (count, steps) = %s; want %s", got, wantEpisode)
	}
	// Under the spec, by digest, every step; re-scored from the rows, to the bit.
	specQ := fmt.Sprintf(`SELECT groupUniqArray(s.reward_spec_digest), (SELECT count() FROM %s.reward_specs FINAL WHERE digest = '%s'),
		(SELECT any(reward_spec_digest) FROM %s.episodes FINAL WHERE episode_id = '%s') FROM %s.steps AS s FINAL WHERE s.episode_id = '%s'`,
		cfg.Database, rspec.Digest, cfg.Database, res.EpisodeID, cfg.Database, res.EpisodeID)
	_, rows, err := trajectory.Query(ctx, conn, specQ)
	if err != nil {
		t.Fatal(err)
	}
	if wantSpec := fmt.Sprintf("['%s'] 1 %s", rspec.Digest, rspec.Digest); len(rows) != 1 || strings.Join(rows[0], " ") != wantSpec {
		t.Errorf("steps' digests, reward_specs rows, episode's digest = %v; want %s", rows, wantSpec)
	}
	runID := strings.TrimSuffix(res.EpisodeID, "-0000000")
	rs, err := trajectory.Rescore(ctx, conn, cfg.Database, runID, rspec, trajectory.RescoreOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("re-scored from its rows under %s: %+v", rspec.Version, rs)
	if rs.Steps != int(res.Steps) || rs.Compared != rs.Steps || rs.Differ != 0 {
		t.Errorf("re-scored from its rows: %+v; want all %d steps compared, none differing", rs, res.Steps)
	}
	if *updateHistories {
		saveHistory(t, tc, run.GetID(), "durable-episode")
	}
	_ = os.Remove(stackPath(cfg.DataDir))
}

// durableRewardSpec keeps state of every kind: a z-score, a potential, an expression
// over the episode so far, and a detector. The z-score reads the policy's think time,
// which a step played again does not repeat: the steps the killed worker published
// after its last checkpoint reached Temporal are played again by the other, which must
// follow the copies the stream kept (docs/rewards.md).
const durableRewardSpec = `name: durable-e2e
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - name: pace
    expr: double(metering.policy_ns)
    weight: 0.3
    normalise:
      - zscore: {window: 4}
      - clip: [-2, 2]
  - name: progress
    potential: {expr: signals.progress, gamma: 0.9}
    weight: 1
  - name: so_far
    expr: 'episode.steps > 3u ? -0.1 * double(episode.errors) : 0.0'
    weight: 0.2
  - {name: repeat, detector: {kind: repeat, window: 2}, weight: 0.1}
`
