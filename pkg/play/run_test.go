package play_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// played is a whole random-policy episode's recording (seed 7, as session plays it).
func played(t *testing.T) []play.Recorded {
	t.Helper()
	s, out, turn := session(t, "random")
	agent, err := play.Deps{}.NewAgent(s.Env, s.Req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background(), agent, turn); err != nil {
		t.Fatal(err)
	}
	if len(out.steps) < 5 {
		t.Fatalf("the episode took %d steps; the test needs 5", len(out.steps))
	}
	return recording(out.steps)
}

// Replay names the first step whose observation differs, not a later one, and steps
// whose recording has no observation are not compared.
func TestReplayNamesTheFirstDivergentStep(t *testing.T) {
	rec := played(t)
	rec[0].Observation = nil
	rec[2].Observation = []byte(`{"not":"this"}`)
	rec[4].Observation = []byte(`{"nor":"this"}`)
	s, _, _ := session(t, "random")
	if _, diverged, err := s.Replay(context.Background(), rec); err != nil || diverged != 2 {
		t.Errorf("replay with steps 2 and 4 changed: diverged at %d, err %v; want 2", diverged, err)
	}
}

// failingOut is an Output that refuses the step numbered failAt (the stream full, say).
type failingOut struct {
	memOut
	failAt int
}

var errOutput = errors.New("output refused the step")

func (o *failingOut) Step(ctx context.Context, st *gauntletv1.StepTaken) error {
	if int(st.Step) == o.failAt {
		return errOutput
	}
	return o.memOut.Step(ctx, st)
}

// scriptAgent plays the recorded actions, then fails with errPolicy.
type scriptAgent struct {
	acts []env.Action
	seen []uint32
}

var errPolicy = errors.New("the policy has no answer")

func (a *scriptAgent) Act(t env.Turn) (env.Action, error) {
	a.seen = append(a.seen, t.Step)
	if int(t.Step) >= len(a.acts) {
		return env.Action{}, errPolicy
	}
	return a.acts[t.Step], nil
}

func actions(rec []play.Recorded) []env.Action {
	out := make([]env.Action, len(rec))
	for i, r := range rec {
		out[i] = r.Action
	}
	return out
}

// The Output contract seen from Run: every step goes to the output in order, once; the
// output's error stops the episode at that step and is Run's error; nothing of a refused
// step is counted in the episode's end.
func TestRunStopsAtTheOutputsError(t *testing.T) {
	rec := played(t)
	req := &gauntletv1.EpisodeRequested{EpisodeId: "r-0", RunId: "r", Env: "shop", ParamsJson: "{}", Seed: 7, Policy: "random"}
	plan := &gauntletv1.FaultPlan{Profile: "stress", Seed: rng.Derive(7, "faults"), CatalogueVersion: plans.CatalogueVersion, Compact: true}
	out := &failingOut{failAt: 3}
	s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, "w-test", play.LocalScorer{Spec: scoring.SpecFor("shop")}, out)
	defer s.Close()
	ctx := context.Background()
	if _, err := s.Prepare(ctx, play.Deps{}); err != nil {
		t.Fatal(err)
	}
	obs, err := s.Reset(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Run(ctx, &scriptAgent{acts: actions(rec)}, env.Turn{Observation: obs})
	if !errors.Is(err, errOutput) {
		t.Fatalf("Run = %v, want the output's error", err)
	}
	if len(out.steps) != 3 || s.Steps() != 3 || s.Ended.Steps != 3 || s.Done() {
		t.Fatalf("after a refused step 3: output has %d steps, session %d, end %d, done %v; want 3, 3, 3, not done",
			len(out.steps), s.Steps(), s.Ended.Steps, s.Done())
	}
	for i, st := range out.steps {
		if st.Step != uint32(i) {
			t.Fatalf("output step %d is numbered %d", i, st.Step)
		}
	}
}

// A policy that fails ends Run with an error naming the policy and the step, wrapping
// the policy's own; the steps before it are recorded.
func TestRunNamesThePolicysError(t *testing.T) {
	rec := played(t)
	s, out, turn := session(t, "random")
	agent := &scriptAgent{acts: actions(rec[:2])}
	err := s.Run(context.Background(), agent, turn)
	if !errors.Is(err, errPolicy) || !strings.Contains(err.Error(), "policy random at step 2") {
		t.Fatalf("Run = %v, want the policy's error at step 2", err)
	}
	if len(out.steps) != 2 || s.Done() {
		t.Fatalf("%d steps recorded, done %v", len(out.steps), s.Done())
	}
	if got := agent.seen; len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Errorf("the agent saw turns %v, want 0 1 2", got)
	}
}

// A Run whose context has ended takes no step and says the episode was abandoned, so the
// caller leaves it to a retry instead of recording an end.
func TestRunAbandonsWhenItsContextEnds(t *testing.T) {
	s, out, turn := session(t, "random")
	agent, err := play.Deps{}.NewAgent(s.Env, s.Req)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := s.Run(ctx, agent, turn); !errors.Is(err, play.ErrAbandoned) {
		t.Fatalf("Run with an ended context = %v, want ErrAbandoned", err)
	}
	if len(out.steps) != 0 || s.Steps() != 0 {
		t.Errorf("%d steps taken after the context ended", len(out.steps))
	}
}

// failingScorer stands in for a reward service that is down: every score fails.
type failingScorer struct{}

var errScore = errors.New("no reward service")

func (failingScorer) Score(context.Context, *gauntletv1.StepTaken, *play.EpisodeScoring, chan play.ScoreResult) (*gauntletv1.StepScored, error) {
	return nil, errScore
}

// A step that cannot be scored is an infra error: it goes to no output and is not
// counted; once an episode ended, no step is taken.
func TestStepErrors(t *testing.T) {
	ctx := context.Background()
	rec := played(t)
	req := &gauntletv1.EpisodeRequested{EpisodeId: "r-0", RunId: "r", Env: "shop", ParamsJson: "{}", Seed: 7}
	out := &memOut{}
	s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: &gauntletv1.FaultPlan{Profile: "baseline"}}, "w-test", failingScorer{}, out)
	defer s.Close()
	if _, err := s.Prepare(ctx, play.Deps{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Step(ctx, rec[0].Action, nil); !errors.Is(err, errScore) {
		t.Fatalf("unscored step: %v, want the scorer's error", err)
	}
	if len(out.steps) != 0 || s.Steps() != 0 || s.Ended.Steps != 0 {
		t.Fatalf("an unscored step reached the output (%d) or the counts (%d, %d)", len(out.steps), s.Steps(), s.Ended.Steps)
	}

	// An env that would go on stepping after its episode ended (not every env guards
	// itself) is not asked to: the session refuses the step.
	deps := play.Deps{Envs: func(string) (env.Env, error) { return endingEnv{}, nil }}
	eout := &memOut{}
	ended := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: &gauntletv1.EpisodeRequested{EpisodeId: "r-1", Env: "ending-test"}}, "w-test", play.LocalScorer{}, eout)
	defer ended.Close()
	if _, err := ended.Prepare(ctx, deps); err != nil {
		t.Fatal(err)
	}
	if _, err := ended.Reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	add := env.Action{Tool: "counter.add", Args: []byte(`{}`)}
	for range 2 {
		if _, _, err := ended.Step(ctx, add, nil); err != nil {
			t.Fatal(err)
		}
	}
	if !ended.Done() {
		t.Fatal("the episode did not end at its second step")
	}
	if _, _, err := ended.Step(ctx, add, nil); err == nil || len(eout.steps) != 2 || ended.Steps() != 2 {
		t.Fatalf("a step after the end: err %v, %d steps recorded, session at %d; want an error and 2, 2", err, len(eout.steps), ended.Steps())
	}
}

// endingEnv is counterEnv whose episodes terminate at their second step and, unlike the
// real envs, would go on stepping if asked.
type endingEnv struct{ counterEnv }

func (endingEnv) NewEpisode(env.Config) (env.Episode, error) { return &endingEpisode{}, nil }

type endingEpisode struct{ counterEpisode }

func (e *endingEpisode) Step(a env.Action) (env.StepResult, error) {
	res, err := e.counterEpisode.Step(a)
	res.Terminated = e.n >= 2
	return res, err
}

// The Publisher puts an episode on GAUNTLET_EVENTS as segments of at most Max steps: the
// start on the first, the end on the last, every step exactly once and in order; Flush
// publishes what is queued without waiting for a full segment; with Hold the last segment
// is kept in Held instead of published.
func TestPublisherPutsTheEpisodeOnTheStream(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	rec := played(t)

	for _, hold := range []bool{false, true} {
		pub := &play.Publisher{Bus: b, Max: 3, Hold: hold}
		req := &gauntletv1.EpisodeRequested{EpisodeId: "r-0", RunId: "r", Env: "shop", ParamsJson: "{}", Seed: 7, Policy: "random"}
		if hold {
			req = proto.Clone(req).(*gauntletv1.EpisodeRequested)
			req.EpisodeId, req.RunId = "h-0", "h"
		}
		plan := &gauntletv1.FaultPlan{Profile: "stress", Seed: rng.Derive(7, "faults"), CatalogueVersion: plans.CatalogueVersion, Compact: true}
		s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, "w-test", play.LocalScorer{Spec: scoring.SpecFor("shop")}, pub)
		if _, err := s.Prepare(ctx, play.Deps{}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reset(ctx, 1); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Replay(ctx, rec[:1]); err != nil {
			t.Fatal(err)
		}
		if err := s.Flush(); err != nil {
			t.Fatal(err)
		}
		// The flushed step is on the stream before the segment fills.
		waitFor(ctx, t, b, req.RunId, func(segs []*gauntletv1.StepsTaken) bool { return len(segs) == 1 && len(segs[0].Steps) == 1 })
		if _, _, err := s.Replay(ctx, rec[1:]); err != nil {
			t.Fatal(err)
		}
		if err := s.Finish(ctx); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()

		var segs []*gauntletv1.StepsTaken
		if hold {
			if pub.Held == nil || pub.Held.GetSteps().GetEnded() == nil {
				t.Fatalf("hold: Held = %v, want the last segment with the end", pub.Held)
			}
			segs = waitFor(ctx, t, b, req.RunId, func(segs []*gauntletv1.StepsTaken) bool {
				n := 0
				for _, g := range segs {
					n += len(g.Steps)
				}
				return n+len(pub.Held.GetSteps().GetSteps()) == len(rec)
			})
			for _, g := range segs {
				if g.Ended != nil {
					t.Fatal("hold: the end was published")
				}
			}
			segs = append(segs, pub.Held.GetSteps())
		} else {
			segs = waitFor(ctx, t, b, req.RunId, func(segs []*gauntletv1.StepsTaken) bool {
				return len(segs) > 0 && segs[len(segs)-1].Ended != nil
			})
		}
		next := uint32(0)
		for i, g := range segs {
			if len(g.Steps) > 3 {
				t.Errorf("hold %v: segment %d has %d steps, more than Max", hold, i, len(g.Steps))
			}
			if (g.Started != nil) != (i == 0) || (g.Ended != nil) != (i == len(segs)-1) {
				t.Errorf("hold %v: segment %d of %d: started %v, ended %v", hold, i, len(segs), g.Started != nil, g.Ended != nil)
			}
			for _, st := range g.Steps {
				if st.Step != next {
					t.Fatalf("hold %v: step %d where %d was due", hold, st.Step, next)
				}
				next++
			}
		}
		if int(next) != len(rec) || segs[len(segs)-1].Ended.GetSteps() != uint32(len(rec)) {
			t.Errorf("hold %v: %d steps on the stream, end says %d; want %d", hold, next, segs[len(segs)-1].Ended.GetSteps(), len(rec))
		}
	}
}

// waitFor reads the run's segments from GAUNTLET_EVENTS until ok holds for them. A
// publish is acked in milliseconds: 5 s without ok means it never will hold.
func waitFor(ctx context.Context, t *testing.T, b *bus.Bus, runID string, ok func([]*gauntletv1.StepsTaken) bool) []*gauntletv1.StepsTaken {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for {
		segs := segments(ctx, t, b, runID)
		if ok(segs) {
			return segs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s: the stream holds %d segments, not what the test waits for", runID, len(segs))
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// segments reads the run's StepsTaken events on GAUNTLET_EVENTS, in stream order.
func segments(ctx context.Context, t *testing.T, b *bus.Bus, runID string) []*gauntletv1.StepsTaken {
	t.Helper()
	str, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	info, err := str.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var out []*gauntletv1.StepsTaken
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && seq > 0; seq++ {
		m, err := str.GetMsg(ctx, seq)
		if err != nil {
			continue // deleted
		}
		var ev gauntletv1.Event
		if err := proto.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("event %d: %v", seq, err)
		}
		if g := ev.GetSteps(); g != nil && (g.Steps != nil || g.Started != nil || g.Ended != nil) {
			id := ""
			switch {
			case g.Started != nil:
				id = g.Started.GetEpisode().GetRunId()
			case len(g.Steps) > 0:
				id = g.Steps[0].GetRunId()
			case g.Ended != nil:
				id = g.Ended.GetEpisode().GetRunId()
			}
			if id == runID {
				out = append(out, g)
			}
		}
	}
	return out
}

// End's nil error means every event of the episode is in the stream; with no stream to
// take them, End fails (here when its context ends) instead of saying they are there.
func TestPublisherEndFailsWhenTheStreamDoesNotTakeTheEpisode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	rec := played(t)
	if err := b.JS.DeleteStream(ctx, bus.StreamEvents); err != nil {
		t.Fatal(err)
	}
	req := &gauntletv1.EpisodeRequested{EpisodeId: "r-0", RunId: "r", Env: "shop", ParamsJson: "{}", Seed: 7, Policy: "random"}
	plan := &gauntletv1.FaultPlan{Profile: "stress", Seed: rng.Derive(7, "faults"), CatalogueVersion: plans.CatalogueVersion, Compact: true}
	s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, "w-test", play.LocalScorer{Spec: scoring.SpecFor("shop")}, &play.Publisher{Bus: b, Max: 3})
	defer s.Close()
	if _, err := s.Prepare(ctx, play.Deps{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.Replay(ctx, rec); err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, time.Second)
	defer fcancel()
	if err := s.Finish(fctx); err == nil {
		t.Fatal("Finish with no stream to take the episode = nil, want an error")
	}
}
