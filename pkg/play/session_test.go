package play_test

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// memOut keeps an episode's events in memory.
type memOut struct {
	started *gauntletv1.EpisodeStarted
	steps   []*gauntletv1.StepTaken
	ended   *gauntletv1.EpisodeEnded
}

func (o *memOut) Start(_ context.Context, st *gauntletv1.EpisodeStarted) error {
	o.started = st
	return nil
}

func (o *memOut) Step(_ context.Context, st *gauntletv1.StepTaken) error {
	o.steps = append(o.steps, st)
	return nil
}

func (o *memOut) Flush() error { return nil }

func (o *memOut) End(_ context.Context, e *gauntletv1.EpisodeEnded) error {
	o.ended = e
	return nil
}

// session prepares and resets a stress-profile shop episode of policy, seed 7.
func session(t *testing.T, policy string) (*play.Session, *memOut, env.Turn) {
	t.Helper()
	req := &gauntletv1.EpisodeRequested{EpisodeId: "r-0", RunId: "r", Env: "shop", ParamsJson: "{}", Seed: 7, Policy: policy}
	plan := &gauntletv1.FaultPlan{Profile: "stress", Seed: rng.Derive(7, "faults"), CatalogueVersion: plans.CatalogueVersion, Compact: true}
	out := &memOut{}
	s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: plan}, "w-test", play.LocalScorer{Spec: scoring.SpecFor("shop")}, out)
	t.Cleanup(func() { _ = s.Close() })
	ctx := context.Background()
	if _, err := s.Prepare(ctx, play.Deps{}); err != nil {
		t.Fatal(err)
	}
	obs, err := s.Reset(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	return s, out, env.Turn{Observation: obs}
}

// recording is the actions and observations of played steps.
func recording(steps []*gauntletv1.StepTaken) []play.Recorded {
	rec := make([]play.Recorded, len(steps))
	for i, st := range steps {
		rec[i] = play.Recorded{Action: env.Action{Tool: st.Action.Tool, Args: []byte(st.Action.ArgsJson)}, Observation: []byte(st.ObservationJson)}
	}
	return rec
}

// sameStep reports whether two recorded steps are the same but for their host times (the
// env's, the policy's, the scoring's).
func sameStep(a, b *gauntletv1.StepTaken) bool {
	a, b = proto.Clone(a).(*gauntletv1.StepTaken), proto.Clone(b).(*gauntletv1.StepTaken)
	a.Metering.WallNs, b.Metering.WallNs = 0, 0
	a.Metering.PolicyNs, b.Metering.PolicyNs = 0, 0
	a.Metering.RewardNs, b.Metering.RewardNs = 0, 0
	return proto.Equal(a, b)
}

// An episode played by a policy and the same episode replayed from its recording record
// the same steps and the same end; a replay that meets another observation says where.
func TestReplayRebuildsTheEpisode(t *testing.T) {
	ctx := context.Background()
	played, out, turn := session(t, "random")
	agent, err := play.Deps{}.NewAgent(played.Env, played.Req)
	if err != nil {
		t.Fatal(err)
	}
	if err := played.Run(ctx, agent, turn); err != nil {
		t.Fatal(err)
	}
	if err := played.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if len(out.steps) < 3 || out.ended.Steps != uint32(len(out.steps)) || out.started == nil {
		t.Fatalf("played %d steps, end %v", len(out.steps), out.ended)
	}
	rec := recording(out.steps)

	replayed, rout, _ := session(t, "random")
	turn, diverged, err := replayed.Replay(ctx, rec)
	if err != nil || diverged != -1 || !replayed.Done() {
		t.Fatalf("replay: diverged at %d, done %v, err %v", diverged, replayed.Done(), err)
	}
	for i := range out.steps {
		if !sameStep(out.steps[i], rout.steps[i]) {
			t.Fatalf("step %d replayed as %v, played as %v", i, rout.steps[i], out.steps[i])
		}
	}
	if turn.Step != uint32(len(rec)) || string(turn.Observation) != out.steps[len(rec)-1].ObservationJson {
		t.Errorf("turn after the replay = step %d %s", turn.Step, turn.Observation)
	}
	if err := replayed.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	a, b := proto.Clone(out.ended).(*gauntletv1.EpisodeEnded), proto.Clone(rout.ended).(*gauntletv1.EpisodeEnded)
	a.StartedAtUnixNano, a.EndedAtUnixNano, b.StartedAtUnixNano, b.EndedAtUnixNano = 0, 0, 0, 0
	if !proto.Equal(a, b) {
		t.Errorf("replayed end %v, played end %v", b, a)
	}

	t.Run("another observation", func(t *testing.T) {
		bad := append([]play.Recorded(nil), rec...)
		bad[1].Observation = []byte(`{"not":"this"}`)
		s, _, _ := session(t, "random")
		if _, diverged, err := s.Replay(ctx, bad); err != nil || diverged != 1 {
			t.Errorf("replay of a recording changed at step 1: diverged at %d, err %v", diverged, err)
		}
	})
	t.Run("longer than the episode", func(t *testing.T) {
		s, _, _ := session(t, "random")
		if _, _, err := s.Replay(ctx, append(rec, rec[0])); !errors.Is(err, play.ErrReplayEnded) {
			t.Errorf("replay past the end: %v, want ErrReplayEnded", err)
		}
	})
}

// counterEnv is a test env whose episodes can branch: its state is a counter that each
// "add" step increments, observed after every step. Sessions find it through Deps.Envs.
type counterEnv struct{}

func (counterEnv) Spec() env.Spec {
	return env.Spec{Name: "counter-test", Services: []string{"counter"}, DefaultMaxSteps: 10,
		Tools: []env.Tool{{Name: "counter.add", Service: "counter", Schema: []byte(`{}`)}}}
}

func (counterEnv) NewEpisode(env.Config) (env.Episode, error) { return &counterEpisode{}, nil }

type counterEpisode struct{ n int }

func (c *counterEpisode) Reset() (json.RawMessage, error) { c.n = 0; return c.obs(), nil }
func (c *counterEpisode) Step(env.Action) (env.StepResult, error) {
	c.n++
	return env.StepResult{Observation: c.obs()}, nil
}
func (c *counterEpisode) Now() time.Duration { return time.Duration(c.n) }
func (c *counterEpisode) obs() json.RawMessage {
	return json.RawMessage(`{"n":` + strconv.Itoa(c.n) + `}`)
}
func (c *counterEpisode) Branch(context.Context) (env.Episode, error) {
	b := *c
	return &b, nil
}

// A branch goes on from its session's state on its own copy of the episode: its next step
// observes what the original's next step observes, and the original is untouched by it.
func TestBranchGoesOnFromTheSameState(t *testing.T) {
	ctx := context.Background()
	deps := play.Deps{Envs: func(string) (env.Env, error) { return counterEnv{}, nil }}
	req := &gauntletv1.EpisodeRequested{EpisodeId: "r-0", Env: "counter-test", Seed: 1}
	out := &memOut{}
	s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req}, "w-test", play.LocalScorer{}, out)
	defer s.Close()
	if _, err := s.Prepare(ctx, deps); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reset(ctx, 1); err != nil {
		t.Fatal(err)
	}
	add := env.Action{Tool: "counter.add", Args: []byte(`{}`)}
	if _, _, err := s.Step(ctx, add, nil); err != nil {
		t.Fatal(err)
	}
	bout := &memOut{}
	b, err := s.Branch(ctx, bout)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for range 2 {
		if _, _, err := b.Step(ctx, add, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := s.Step(ctx, add, nil); err != nil {
		t.Fatal(err)
	}
	if len(bout.steps) != 2 || bout.steps[0].Step != 1 || bout.steps[1].ObservationJson != `{"n":3}` || b.Steps() != 3 {
		t.Errorf("branch steps %v", bout.steps)
	}
	if len(out.steps) != 2 || out.steps[1].ObservationJson != `{"n":2}` || s.Steps() != 2 || s.Ended.Steps != 2 {
		t.Errorf("original steps %v, end %v", out.steps, s.Ended)
	}
}

// Each step records where its time went: the policy's turn (from the reset or the last
// step's end to the action), and the scoring.
func TestStepRecordsPolicyAndRewardTime(t *testing.T) {
	s, out, _ := session(t, "oracle")
	ctx := context.Background()
	const think = 20 * time.Millisecond
	for i := 0; i < 2; i++ {
		time.Sleep(think) // the agent thinks
		act := env.Action{Tool: "inventory.get", Args: json.RawMessage(`{"sku":"a"}`)}
		if _, _, err := s.Step(ctx, act, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(out.steps) != 2 {
		t.Fatalf("%d steps recorded; want 2", len(out.steps))
	}
	for i, st := range out.steps {
		m := st.GetMetering()
		if m.GetPolicyNs() < uint64(think) {
			t.Errorf("step %d: policy time %v; the agent took at least %v", i, time.Duration(m.GetPolicyNs()), think)
		}
		if m.GetRewardNs() == 0 {
			t.Errorf("step %d: no scoring time recorded", i)
		}
	}
}

// outsideEnv is counterEnv whose state stands for a party outside gauntlet
// (env.OutsideState): each step's diff records what the party answered.
type outsideEnv struct{ counterEnv }

func (outsideEnv) OutsideState() string { return "the test's counter" }

func (outsideEnv) NewEpisode(env.Config) (env.Episode, error) { return &outsideEpisode{}, nil }

type outsideEpisode struct{ counterEpisode }

func (c *outsideEpisode) Step(a env.Action) (env.StepResult, error) {
	r, err := c.counterEpisode.Step(a)
	r.Diff = r.Observation
	return r, err
}

// A replay of an env with outside state is refused at the first step whose diff is not
// the recorded one (the party answered otherwise), and goes no further; without the
// recorded diffs, or for an env whose state is gauntlet's own, a differing diff changes
// nothing.
func TestReplayOfOutsideStateRefusesAnotherDiff(t *testing.T) {
	ctx := context.Background()
	start := func(e env.Env) (*play.Session, *memOut) {
		t.Helper()
		deps := play.Deps{Envs: func(string) (env.Env, error) { return e, nil }}
		out := &memOut{}
		s := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: &gauntletv1.EpisodeRequested{EpisodeId: "r-0", Env: "counter-test", Seed: 1}},
			"w-test", play.LocalScorer{}, out)
		t.Cleanup(func() { _ = s.Close() })
		if _, err := s.Prepare(ctx, deps); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Reset(ctx, 1); err != nil {
			t.Fatal(err)
		}
		return s, out
	}
	add := env.Action{Tool: "counter.add", Args: []byte(`{}`)}
	rec := []play.Recorded{{Action: add, Diff: []byte(`{"n":1}`)}, {Action: add, Diff: []byte(`{"n":2}`)}, {Action: add, Diff: []byte(`{"n":3}`)}}
	s, _ := start(outsideEnv{})
	if _, diverged, err := s.Replay(ctx, rec); err != nil || diverged != -1 {
		t.Fatalf("replay of the recorded diffs: diverged at %d, %v", diverged, err)
	}

	bad := append([]play.Recorded(nil), rec...)
	bad[1].Diff = []byte(`{"n":20}`)
	s, out := start(outsideEnv{})
	_, diverged, err := s.Replay(ctx, bad)
	if !errors.Is(err, play.ErrDiverged) || diverged != 1 || len(out.steps) != 2 {
		t.Fatalf("replay of a recording the party no longer answers: diverged at %d after %d steps, %v; want ErrDiverged at 1", diverged, len(out.steps), err)
	}
	for _, want := range []string{"at step 1 (counter.add)", "the test's counter answered otherwise", `recorded {"n":20}; now {"n":2}`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}

	noDiffs := append([]play.Recorded(nil), bad...)
	for i := range noDiffs {
		noDiffs[i].Diff = nil
	}
	s, _ = start(outsideEnv{})
	if _, _, err := s.Replay(ctx, noDiffs); err != nil {
		t.Fatalf("replay without recorded diffs: %v", err)
	}
	s, _ = start(counterEnv{})
	if _, _, err := s.Replay(ctx, bad); err != nil {
		t.Fatalf("replay of an env without outside state: %v", err)
	}
}
