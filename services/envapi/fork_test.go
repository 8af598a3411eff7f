package envapi_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// partyEnv is an env whose state stands for a party outside gauntlet (env.OutsideState),
// as an MCP server is: each step's diff records the party's answer. A steady party
// answers with the episode's own count; a wobbly one adds a count of every answer it
// ever gave, as a server that keeps state across sessions would.
type partyEnv struct {
	name   string
	wobbly bool
}

var answers atomic.Int64

func (p partyEnv) Spec() env.Spec {
	return env.Spec{Name: p.name, Services: []string{"party"}, DefaultMaxSteps: 10,
		Tools: []env.Tool{{Name: "party.ask", Service: "party", Schema: []byte(`{"type":"object"}`)}}}
}

func (p partyEnv) OutsideState() string { return "the test's " + p.name }

func (p partyEnv) NewEpisode(env.Config) (env.Episode, error) {
	return &partyEpisode{wobbly: p.wobbly}, nil
}

type partyEpisode struct {
	n      int
	wobbly bool
}

func (e *partyEpisode) Reset() (json.RawMessage, error) {
	e.n = 0
	return json.RawMessage(`{"n":0}`), nil
}
func (e *partyEpisode) Now() time.Duration { return time.Duration(e.n) }
func (e *partyEpisode) Step(env.Action) (env.StepResult, error) {
	e.n++
	answer := strconv.Itoa(e.n)
	if e.wobbly {
		answer += "/" + strconv.FormatInt(answers.Add(1), 10)
	}
	obs := json.RawMessage(`{"n":` + strconv.Itoa(e.n) + `}`)
	return env.StepResult{Observation: obs, Diff: json.RawMessage(`{"answer":"` + answer + `"}`),
		Metering: &gauntletv1.Metering{ToolCalls: 1}, Signals: &gauntletv1.Signals{}}, nil
}

func init() {
	env.Register(partyEnv{name: "steady-party-test"})
	env.Register(partyEnv{name: "wobbly-party-test", wobbly: true})
}

// A fork of an env with outside state replays the snapshot's steps and checks them
// against the diffs the snapshot kept: a party that answers as it did forks (twice over:
// a fork's snapshot carries the replayed diffs), one that answers otherwise is refused
// with FAILED_PRECONDITION naming the step and the party, and holds no slot afterwards.
func TestForkOfOutsideStateChecksTheDiffs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startAPI(t, nil)
	acme := a.client(tokenAcme)
	played := func(name string) string {
		t.Helper()
		res, err := acme.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: name, Seed: 1, Profile: "baseline"}))
		if err != nil {
			t.Fatalf("reset %s: %v", name, err)
		}
		for range 2 {
			if _, err := acme.Step(ctx, connect.NewRequest(&gauntletv1.StepRequest{EpisodeId: res.Msg.EpisodeId, Action: &gauntletv1.Action{Tool: "party.ask", ArgsJson: "{}"}})); err != nil {
				t.Fatalf("step %s: %v", name, err)
			}
		}
		snap, err := acme.Snapshot(ctx, connect.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: res.Msg.EpisodeId}))
		if err != nil {
			t.Fatal(err)
		}
		return snap.Msg.SnapshotId
	}
	fork, err := acme.Fork(ctx, connect.NewRequest(&gauntletv1.ForkRequest{SnapshotId: played("steady-party-test")}))
	if err != nil || fork.Msg.ObservationJson != `{"n":2}` {
		t.Fatalf("fork of a steady party: %v, %v", fork, err)
	}
	again, err := acme.Snapshot(ctx, connect.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: fork.Msg.EpisodeId}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Fork(ctx, connect.NewRequest(&gauntletv1.ForkRequest{SnapshotId: again.Msg.SnapshotId})); err != nil {
		t.Fatalf("fork of the fork: %v", err)
	}

	before := capacity(ctx, t, acme).ActiveEpisodes
	_, err = acme.Fork(ctx, connect.NewRequest(&gauntletv1.ForkRequest{SnapshotId: played("wobbly-party-test")}))
	if codeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), "at step 0 (party.ask): the test's wobbly-party-test answered otherwise") {
		t.Fatalf("fork of a wobbly party: %v, want failed_precondition naming step 0", err)
	}
	if after := capacity(ctx, t, acme).ActiveEpisodes; after != before+1 { // the wobbly episode itself
		t.Errorf("active episodes %d after the refused fork, want %d", after, before+1)
	}
}
