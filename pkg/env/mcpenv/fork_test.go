package mcpenv_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// stepsOut keeps an episode's steps.
type stepsOut struct{ steps []*gauntletv1.StepTaken }

func (o *stepsOut) Start(context.Context, *gauntletv1.EpisodeStarted) error { return nil }
func (o *stepsOut) Flush() error                                            { return nil }
func (o *stepsOut) End(context.Context, *gauntletv1.EpisodeEnded) error     { return nil }
func (o *stepsOut) Step(_ context.Context, st *gauntletv1.StepTaken) error {
	o.steps = append(o.steps, st)
	return nil
}

// TestForkReplaysIntoAFreshServer: a fork of an MCP episode replays the recorded calls
// into a fresh server in a fresh sandbox (play.Session.Replay given the recorded diffs,
// as `episode fork` and the env API's Fork do), the faults firing as they did, and goes
// on live from there: the note written before the fork point is on the new server. A
// recording whose answer the fresh server does not give (what a server whose answers are
// not a function of its calls would do) is refused at that step with play.ErrDiverged,
// naming the step and the server, and the replay goes no further.
func TestForkReplaysIntoAFreshServer(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	e := mcpenv.New(notes(t))
	ctx := context.Background()
	deps := play.Deps{Sandboxes: sb, Envs: func(string) (env.Env, error) { return e, nil }}
	const seed = 2
	start := func() (*play.Session, *stepsOut, json.RawMessage) {
		t.Helper()
		out := &stepsOut{}
		req := &gauntletv1.EpisodeRequested{EpisodeId: "fork-test", Env: "notes", ParamsJson: "{}", Seed: seed, MaxSteps: 20}
		s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: faultyPlan(seed)}, "test", play.LocalScorer{}, out)
		t.Cleanup(func() { _ = s.Close() })
		if _, err := s.Prepare(ctx, deps); err != nil {
			t.Fatal(err)
		}
		obs, err := s.Reset(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return s, out, obs
	}
	// The recording: puts until one is answered (writes meet injected errors), then lists.
	s, out, _ := start()
	var rec []play.Recorded
	step := func(s *play.Session, tool, args string) *gauntletv1.StepTaken {
		t.Helper()
		st, _, err := s.Step(ctx, env.Action{Tool: tool, Args: json.RawMessage(args)}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	fired := 0
	for i := 0; i < 10; i++ {
		st := step(s, "notes.put", `{"name":"kept","text":"before the fork"}`)
		if strings.Contains(st.StateDiffJson, `"answer"`) {
			break
		}
	}
	step(s, "notes.list", `{}`)
	for _, st := range out.steps {
		fired += len(st.Faults)
		rec = append(rec, play.Recorded{Action: env.Action{Tool: st.Action.Tool, Args: json.RawMessage(st.Action.ArgsJson)},
			Observation: []byte(st.ObservationJson), Diff: []byte(st.StateDiffJson)})
	}
	if fired == 0 {
		t.Fatal("no fault fired on the recorded calls: the fork's faults prove nothing")
	}
	if !strings.Contains(string(rec[len(rec)-1].Diff), "kept") {
		t.Fatalf("the recorded list: %s", rec[len(rec)-1].Diff)
	}

	fork, fout, _ := start()
	turn, diverged, err := fork.Replay(ctx, rec)
	if err != nil || diverged != -1 || !bytes.Equal(turn.Observation, rec[len(rec)-1].Observation) {
		t.Fatalf("fork of %d recorded steps (%d faults): diverged at %d, %v", len(rec), fired, diverged, err)
	}
	st := step(fork, "notes.get", `{"name":"kept"}`)
	if !strings.Contains(st.StateDiffJson, `before the fork`) || len(fout.steps) != len(rec)+1 {
		t.Fatalf("the fork's first live step: %s", st.StateDiffJson)
	}

	// The recorded list answered another note: the fresh server does not.
	bad := append([]play.Recorded(nil), rec...)
	last := len(bad) - 1
	bad[last].Diff = bytes.Replace(bad[last].Diff, []byte("kept"), []byte("lost"), -1)
	refused, rout, _ := start()
	_, diverged, err = refused.Replay(ctx, bad)
	if !errors.Is(err, play.ErrDiverged) || diverged != last || len(rout.steps) != last+1 ||
		!strings.Contains(err.Error(), "(notes.list): the MCP server of ") || !strings.Contains(err.Error(), "notes.yaml answered otherwise") {
		t.Fatalf("fork of a recording the server no longer answers: diverged at %d after %d steps, %v; want ErrDiverged at %d", diverged, len(rout.steps), err, last)
	}
}
