package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	connectrpc "connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestEnvAPIMCPEpisodes: a trainer drives `env: mcp` episodes through the env API with
// the Go client (gRPC), as it would any env: each Reset starts the notes server in a
// `process` sandbox and its first observation lists the server's own tools (their
// descriptions are the server's); each Step calls them through the stress profile's
// faults; a snapshot after the note is written forks into a fresh server that holds the
// note (the recorded calls replayed into it and checked against the recorded answers);
// and ClickHouse holds every step of every episode exactly once, with the server's
// answers and the faults.
func TestEnvAPIMCPEpisodes(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and a sandbox runtime; run without -short")
	}
	dir, _ := notesEnvDir(t)
	s, cfg := envAPIStackWith(t, func(c *config) {
		c.Sandbox = sandboxConfig(t, runtimes.Process)
		c.MCP = mcpenv.Config{Dir: dir}
	})
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	ctx := t.Context()
	acme := grpcClient(s.app.envapi.Addr(), tokenAcme)

	desc, err := acme.DescribeEnv(ctx, connectrpc.NewRequest(&gauntletv1.DescribeEnvRequest{Env: "notes"}))
	if err != nil {
		t.Fatal(err)
	}
	var tools []string
	for _, tl := range desc.Msg.GetTools() {
		tools = append(tools, tl.GetName())
	}
	if strings.Join(tools, " ") != "notes.put notes.get notes.list notes.delete" {
		t.Fatalf("DescribeEnv(notes) tools %v", tools)
	}

	step := func(id, tool, args string) *gauntletv1.StepResult {
		t.Helper()
		r, err := acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: tool, ArgsJson: args}}))
		if err != nil {
			t.Fatalf("Step %s %s: %v", tool, args, err)
		}
		if r.Msg.GetInfo().GetInfraError() {
			t.Fatalf("Step %s %s: infra error %s", tool, args, r.Msg.GetInfo().GetError())
		}
		return r.Msg
	}
	// until steps tool until the server answers it (an injected error aborts the call
	// without reaching the server), and returns that step.
	faults := 0
	until := func(id, tool, args string) *gauntletv1.StepResult {
		t.Helper()
		for range 15 {
			r := step(id, tool, args)
			faults += len(r.GetInfo().GetFaults())
			if !strings.Contains(r.GetObservationJson(), "injected status") || r.GetTerminated() || r.GetTruncated() {
				return r
			}
		}
		t.Fatalf("%s %s: never answered in 15 tries", tool, args)
		return nil
	}

	var ids []string
	var snapID string
	var snapObs string
	for seed := uint64(1); seed <= 4; seed++ {
		r, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "notes", Seed: seed, Profile: "stress"}))
		if err != nil {
			t.Fatalf("Reset seed %d: %v", seed, err)
		}
		id := r.Msg.GetEpisodeId()
		ids = append(ids, id)
		var first struct {
			Task  string
			Tools []struct{ Name, Description string }
		}
		if err := json.Unmarshal([]byte(r.Msg.GetObservationJson()), &first); err != nil || len(first.Tools) != 4 ||
			first.Tools[0].Description != "Create or replace a note." || !strings.Contains(first.Task, fmt.Sprintf(`"n%d"`, seed)) {
			t.Fatalf("Reset seed %d: first observation %s (%v)", seed, r.Msg.GetObservationJson(), err)
		}
		name := fmt.Sprintf("n%d", seed)
		put := until(id, "notes.put", fmt.Sprintf(`{"name":%q,"text":"remember the milk"}`, name))
		if put.GetTerminated() || put.GetTruncated() {
			t.Fatalf("seed %d: the put ended the episode: %v", seed, put)
		}
		if seed == 1 {
			snap, err := acme.Snapshot(ctx, connectrpc.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: id}))
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			snapID, snapObs = snap.Msg.GetSnapshotId(), put.GetObservationJson()
		}
		get := until(id, "notes.get", fmt.Sprintf(`{"name":%q}`, name))
		if !get.GetTerminated() || !get.GetInfo().GetSignals().GetSuccess() || get.GetInfo().GetMetering().GetRuntime() != runtimes.Process {
			t.Fatalf("seed %d: the read back %s ended %v, success %v, runtime %q", seed, get.GetObservationJson(), get.GetTerminated(),
				get.GetInfo().GetSignals().GetSuccess(), get.GetInfo().GetMetering().GetRuntime())
		}
	}

	// The fork: a fresh server, the recorded calls replayed into it, the note there.
	fork, err := acme.Fork(ctx, connectrpc.NewRequest(&gauntletv1.ForkRequest{SnapshotId: snapID}))
	if err != nil {
		t.Fatalf("Fork: %v", err)
	}
	if fork.Msg.GetObservationJson() != snapObs {
		t.Fatalf("the fork observes %s, the snapshot %s", fork.Msg.GetObservationJson(), snapObs)
	}
	fid := fork.Msg.GetEpisodeId()
	ids = append(ids, fid)
	if get := until(fid, "notes.get", `{"name":"n1"}`); !get.GetInfo().GetSignals().GetSuccess() {
		t.Fatalf("the fork's read back: %s", get.GetObservationJson())
	}
	if faults == 0 {
		t.Fatal("no fault fired on any call: the test proves nothing")
	}

	waitEpisodes(t, conn, cfg.Database, ids)
	list := "'" + strings.Join(ids, "','") + "'"
	_, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT e.episode_id, toString(e.steps), toString(e.success), toString(s.rows), toString(s.distinct), toString(s.answered), toString(s.faulted)
FROM %[1]s.episodes AS e FINAL
ANY LEFT JOIN (SELECT episode_id, count() AS rows, uniqExact(step) AS distinct,
  countIf(runtime = 'process' AND position(state_diff, '"answer":{"result":') > 0) AS answered, countIf(length(fault_ids) > 0) AS faulted
  FROM %[1]s.steps FINAL WHERE episode_id IN (%[2]s) GROUP BY episode_id) AS s USING episode_id
WHERE e.episode_id IN (%[2]s)`, cfg.Database, list))
	if err != nil || len(rows) != len(ids) {
		t.Fatalf("episodes and their steps: %d rows, %v", len(rows), err)
	}
	recordedFaults := 0
	for _, r := range rows {
		var steps, stepRows, distinct, answered, faulted int
		fmt.Sscan(r[1], &steps)
		fmt.Sscan(r[3], &stepRows)
		fmt.Sscan(r[4], &distinct)
		fmt.Sscan(r[5], &answered)
		fmt.Sscan(r[6], &faulted)
		recordedFaults += faulted
		if steps < 2 || stepRows != steps || distinct != steps || r[2] != "1" || answered < 2 {
			t.Errorf("episode %s: recorded steps, success, step rows, distinct steps, answered calls, faulted steps = %v", r[0], r[1:])
		}
	}
	if recordedFaults == 0 {
		t.Error("ClickHouse records no faulted step")
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT parent_episode_id FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, fid)); got != ids[0] {
		t.Errorf("the fork's parent is %q, want %s", got, ids[0])
	}
	t.Logf("%d episodes over the env API (one a fork), %d faults on their calls", len(ids), faults)
}
