package workflows

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric/noop"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/activity"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal/temporaltest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/faults"
	"github.com/gauntlet-rl/gauntlet/services/reward"
)

// statefulSpec keeps every kind of per-episode state: a running z-score (over the
// policy's think time, which differs from one execution of a step to the next), a
// potential, an expression over the episode so far, and two detectors.
const statefulSpec = `name: durable-stateful
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - name: pace
    expr: double(metering.policy_ns)
    weight: 0.3
    normalise:
      - zscore: {window: 4}
      - clip: [-2, 2]
      - scale: 0.5
  - name: progress
    potential: {expr: signals.progress, gamma: 0.9}
    weight: 1
  - name: so_far
    expr: 'episode.steps > 3u ? -0.1 * double(episode.errors) : 0.0'
    weight: 0.2
  - {name: idle, detector: {kind: idle, window: 3}, weight: 0.1}
  - {name: repeat, detector: {kind: repeat, window: 2}, weight: 0.1}
`

// durableStack is what a durable episode needs, for real: a Temporal dev server, an
// embedded NATS with gauntlet's streams, the faults and reward services.
type durableStack struct {
	tc  client.Client
	bus *bus.Bus
}

func startDurableStack(t *testing.T) *durableStack {
	t.Helper()
	ctx := context.Background()
	srv := temporaltest.Start(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	tc, err := client.DialContext(ctx, client.Options{HostPort: srv.Addr(), Namespace: temporallocal.Namespace, Logger: tlog.NewStructuredLogger(quiet)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(tc.Close)
	b := bustest.Start(t)
	getBus := func() *bus.Bus { return b }
	meter := noop.NewMeterProvider().Meter("test")
	rw := reward.New(reward.Config{Subscribers: 1}, getBus, meter, quiet)
	if err := rw.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rw.Stopping(ctx) })
	fs := faults.New(getBus, meter, quiet)
	if err := fs.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Stopping(ctx) })
	return &durableStack{tc: tc, bus: b}
}

// worker starts a worker of the gauntlet task queue named id; afterStep, when set, is
// its activities' AfterStep.
func (s *durableStack) worker(t *testing.T, id string, afterStep func(ctx context.Context, episodeID string, step uint32)) worker.Worker {
	t.Helper()
	w := worker.New(s.tc, TaskQueue, worker.Options{Identity: id})
	Register(w, &Activities{Bus: func() *bus.Bus { return s.bus }, WorkerID: id, AfterStep: afterStep})
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	return w
}

// recordedEpisode is an episode's events as the stream holds them, in step order.
type recordedEpisode struct {
	started *gauntletv1.EpisodeStarted
	steps   []*gauntletv1.StepTaken
	scores  []gauntletv1.Score
	ended   *gauntletv1.EpisodeEnded
}

// streamEvents reads GAUNTLET_EVENTS (the subjects given, or all) from its start until
// half a second passes without a message.
func streamEvents(t *testing.T, b *bus.Bus, subjects ...string) []*gauntletv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := b.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{FilterSubjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	var out []*gauntletv1.Event
	for {
		m, err := cons.Next(jetstream.FetchMaxWait(500 * time.Millisecond))
		if errors.Is(err, nats.ErrTimeout) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		ev := &gauntletv1.Event{}
		if err := gauntletv1.Unmarshal(m.Data(), ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

// episodeEvents reads episodeID's events from GAUNTLET_EVENTS, one of each step (the
// stream de-duplicates a step published twice).
func episodeEvents(t *testing.T, b *bus.Bus, episodeID string) recordedEpisode {
	t.Helper()
	var out recordedEpisode
	for _, ev := range streamEvents(t, b) {
		switch body := ev.Body.(type) {
		case *gauntletv1.Event_Started:
			if body.Started.GetEpisode().GetEpisodeId() == episodeID {
				out.started = body.Started
			}
		case *gauntletv1.Event_Steps:
			for _, st := range body.Steps.GetSteps() {
				if st.GetEpisodeId() != episodeID {
					continue
				}
				if int(st.Step) != len(out.steps) {
					t.Fatalf("step %d of %s in the stream after %d steps", st.Step, episodeID, len(out.steps))
				}
				sc, err := body.Steps.ScoreOf(st)
				if err != nil {
					t.Fatal(err)
				}
				out.steps, out.scores = append(out.steps, st), append(out.scores, sc)
			}
		case *gauntletv1.Event_Ended:
			if body.Ended.GetEpisode().GetEpisodeId() == episodeID {
				out.ended = body.Ended
			}
		}
	}
	return out
}

// checkScoredAsThePureFunction scores the recorded steps again, in order with the state
// carried, by scoring's pure function (what a worker's reward service and `reward
// rescore` compute), and wants every step's recorded score, the episode's end and the
// workflow's result to be those, bit for bit.
func checkScoredAsThePureFunction(t *testing.T, spec scoring.Spec, rec recordedEpisode, res EpisodeResult) {
	t.Helper()
	if rec.started == nil || rec.ended == nil || len(rec.steps) == 0 || len(rec.steps) != int(res.Steps) {
		t.Fatalf("stream holds start %v, %d steps, end %v; result %+v", rec.started != nil, len(rec.steps), rec.ended != nil, res)
	}
	if got := rec.started.GetEpisode().GetRewardSpec(); got != spec.Digest {
		t.Errorf("the episode names spec %q; want %s", got, spec.Digest)
	}
	state := &gauntletv1.RewardState{}
	var total float64
	for i, st := range rec.steps {
		in := &gauntletv1.StepTaken{
			EpisodeId: st.EpisodeId, Step: st.Step, Env: st.Env, Terminated: st.Terminated,
			Signals: st.Signals, Metering: st.Metering, Action: st.Action,
		}
		want := scoring.ScoreState(spec, state, in)
		got := rec.scores[i]
		if got.Digest != spec.Digest || got.Version != spec.Version {
			t.Fatalf("step %d scored under %s (%s); want %s (%s)", i, got.Version, got.Digest, spec.Version, spec.Digest)
		}
		if math.Float64bits(got.Total) != math.Float64bits(want.GetTotal()) {
			t.Fatalf("step %d: recorded total %v, the pure function gives %v (components %v, want %v)", i, got.Total, want.GetTotal(), got.Values, want.GetComponents())
		}
		for j, c := range want.GetComponents() {
			if math.Float64bits(got.Values[j]) != math.Float64bits(c.GetValue()) {
				t.Fatalf("step %d: component %s recorded %v, the pure function gives %v", i, c.GetName(), got.Values[j], c.GetValue())
			}
		}
		total += want.GetTotal()
	}
	if math.Float64bits(rec.ended.GetTotalReward()) != math.Float64bits(total) || math.Float64bits(res.TotalReward) != math.Float64bits(total) {
		t.Errorf("episode total: ended event %v, workflow result %v; the pure function's steps sum to %v", rec.ended.GetTotalReward(), res.TotalReward, total)
	}
}

// A durable episode naming a stateful spec is scored as a worker's episode is: its
// recorded steps, scored again by scoring's pure function with the state carried from
// step to step, give its recorded scores and totals bit for bit; the episode and its
// steps name the spec by digest; and the spec's file is in the bucket for the store.
func TestDurableEpisodeScoredUnderItsSpec(t *testing.T) {
	s := startDurableStack(t)
	w := s.worker(t, "worker-a", nil)
	defer w.Stop()
	spec, err := scoring.Parse("stateful.yaml", []byte(statefulSpec))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	in := EpisodeSpec{Env: "shop", Policy: "random", Profile: "stress", Seed: 11, MaxSteps: 40, RewardSpec: statefulSpec}
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-spec", TaskQueue: TaskQueue}, WorkflowEpisode, in)
	if err != nil {
		t.Fatal(err)
	}
	var res EpisodeResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	rec := episodeEvents(t, s.bus, res.EpisodeID)
	checkScoredAsThePureFunction(t, spec, rec, res)
	if _, err := rewardspecs.NewClient(s.bus.JS).Get(ctx, spec.Digest); err != nil {
		t.Errorf("the spec's file is not in the bucket: %v", err)
	}
	flagged := 0
	for _, sc := range rec.scores {
		for j, name := range sc.Names {
			if (name == "idle" || name == "repeat") && sc.Values[j] < 0 {
				flagged++
			}
		}
	}
	t.Logf("%d steps, total %v, %d detector flags", res.Steps, res.TotalReward, flagged)
}

// The spec's state is kept with the episode: a worker stopped mid-episode leaves its
// checkpoint (the heartbeat, with the state after its last recorded step), and the
// worker that resumes it scores the steps after from that state. Re-scoring the steps it
// re-executes would not do: the spec's z-score reads the policy's think time, which is
// not what it was when the steps were recorded. Worker A publishes nothing after the
// checkpoint the server holds (it waits in AfterStep until stopped), so every recorded
// step is one the checkpoint covers or one worker B scored.
func TestDurableEpisodeKeepsItsScoringStateAcrossWorkers(t *testing.T) {
	s := startDurableStack(t)
	spec, err := scoring.Parse("stateful.yaml", []byte(statefulSpec))
	if err != nil {
		t.Fatal(err)
	}
	// Named by digest: the file is put in the bucket by whoever starts the episode.
	if err := rewardspecs.NewClient(s.bus.JS).Put(context.Background(), spec); err != nil {
		t.Fatal(err)
	}
	const stopAt = 12
	held := make(chan struct{})
	a := s.worker(t, "worker-a", func(ctx context.Context, _ string, step uint32) {
		if step == stopAt {
			close(held)
			<-ctx.Done() // worker A plays no further
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	in := EpisodeSpec{Env: "shop", Policy: "random", Profile: "stress", Seed: 23, MaxSteps: 60,
		Params: map[string]any{"max_invalid": 1000, "deadline_ms": 86_400_000},
		// Long enough that a loaded machine's slow step is not taken for a dead worker:
		// the test stops worker A itself, once its checkpoint reached the server.
		HeartbeatTimeout: 5 * time.Second, RewardSpecDigest: spec.Digest}
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-spec-resume", TaskQueue: TaskQueue}, WorkflowEpisode, in)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("worker A never reached step ", stopAt)
	}
	// Stop worker A once its checkpoint after step stopAt reached the server.
	var at EpisodeCheckpoint
	for at.NextStep != stopAt+1 {
		if ctx.Err() != nil {
			t.Fatalf("no checkpoint after step %d reached the server; last %+v", stopAt, at)
		}
		d, err := s.tc.DescribeWorkflow(ctx, run.GetID(), "")
		if err != nil {
			t.Fatal(err)
		}
		desc := d.RawResponse
		if st := desc.GetWorkflowExecutionInfo().GetStatus(); st != enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
			t.Fatalf("episode %v before worker A stopped", st)
		}
		if p := desc.GetPendingActivities(); len(p) == 1 && len(p[0].GetHeartbeatDetails().GetPayloads()) == 1 {
			if err := json.Unmarshal(p[0].GetHeartbeatDetails().GetPayloads()[0].GetData(), &at); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(at.RewardState) == 0 {
		t.Fatalf("checkpoint %+v holds no reward state", at)
	}
	a.Stop()
	b := s.worker(t, "worker-b", nil)
	defer b.Stop()
	var res EpisodeResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	if res.Attempt < 2 || res.ResumedAt != stopAt+1 || res.Steps <= res.ResumedAt {
		t.Fatalf("result %+v; want a later attempt that resumed at step %d and played on", res, stopAt+1)
	}
	rec := episodeEvents(t, s.bus, res.EpisodeID)
	for _, st := range rec.steps {
		if want := map[bool]string{true: "worker-a", false: "worker-b"}[st.Step <= stopAt]; st.WorkerId != want {
			t.Fatalf("step %d played by %s; want %s", st.Step, st.WorkerId, want)
		}
	}
	checkScoredAsThePureFunction(t, spec, rec, res)
}

// A durable episode naming a spec the bucket does not hold ends as an infra error saying
// so, as a worker's episode does, and its workflow fails at once with the reason; no
// step is scored under another spec.
func TestDurableEpisodeWithAnUnknownSpecIsAnInfraError(t *testing.T) {
	s := startDurableStack(t)
	w := s.worker(t, "worker-a", nil)
	defer w.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	missing := "sha256:" + strings.Repeat("ab", 32)
	in := EpisodeSpec{Env: "shop", Policy: "oracle", Seed: 3, RewardSpecDigest: missing}
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-spec-missing", TaskQueue: TaskQueue}, WorkflowEpisode, in)
	if err != nil {
		t.Fatal(err)
	}
	err = run.Get(ctx, nil)
	var ae *temporal.ApplicationError
	if !errors.As(err, &ae) || ae.Type() != ErrTypeNotFound || !strings.Contains(err.Error(), missing) || !strings.Contains(err.Error(), "not found") {
		t.Fatalf("workflow ended with %v; want a NotFound failure naming %s", err, missing)
	}
	desc, err := s.tc.DescribeWorkflow(ctx, run.GetID(), "")
	if err != nil {
		t.Fatal(err)
	}
	if n := desc.RawResponse.GetPendingActivities(); len(n) != 0 {
		t.Errorf("pending activities %v after the failure", n)
	}
	// The only episode in the stream is this one.
	ends := allEnded(t, s.bus)
	if len(ends) != 1 {
		t.Fatalf("%d episode ends in the stream; want 1", len(ends))
	}
	e := ends[0]
	episodeID := e.GetEpisode().GetEpisodeId()
	if !e.InfraError || e.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR || e.TotalReward != 0 || e.Steps != 0 ||
		!strings.Contains(e.Error, missing) || !strings.Contains(e.Error, "not found") {
		t.Errorf("episode %s ended %+v; want an infra error naming the missing spec, no step", episodeID, e)
	}
	if got := episodeEvents(t, s.bus, episodeID); len(got.steps) != 0 {
		t.Errorf("%d steps recorded; want none", len(got.steps))
	}
}

// allEnded is every episode end in GAUNTLET_EVENTS.
func allEnded(t *testing.T, b *bus.Bus) []*gauntletv1.EpisodeEnded {
	t.Helper()
	var out []*gauntletv1.EpisodeEnded
	for _, ev := range streamEvents(t, b, bus.SubjectEndedAll) {
		if e := ev.GetEnded(); e != nil {
			out = append(out, e)
		}
	}
	return out
}

// A durable episode's input is read strictly: a misspelt key, a spec file that does not
// parse, a digest of the wrong form or one that is not the file's fail the workflow at
// once, naming the key, before any episode is played.
func TestDurableEpisodeRefusesABadSpec(t *testing.T) {
	spec, err := scoring.Parse("stateful.yaml", []byte(statefulSpec))
	if err != nil {
		t.Fatal(err)
	}
	text, _ := json.Marshal(statefulSpec)
	for _, c := range []struct{ name, input, want string }{
		{"misspelt key", `{"env":"shop","policy":"oracle","reward_spec_digset":"` + spec.Digest + `"}`, `unknown field "reward_spec_digset"`},
		{"bad file", `{"env":"shop","policy":"oracle","reward_spec":"name: x\nversion: \"1\"\ncomponents:\n  - {name: t, builtin: charm, weight: 1}\n"}`, `reward_spec:4: components[0].builtin: unknown component "charm"`},
		{"bad digest", `{"env":"shop","policy":"oracle","reward_spec_digest":"sha1:abc"}`, `reward_spec_digest: "sha1:abc" is not a spec digest`},
		{"digest of another file", `{"env":"shop","policy":"oracle","reward_spec":` + string(text) + `,"reward_spec_digest":"sha256:` + strings.Repeat("0", 64) + `"}`,
			"reward_spec_digest: sha256:" + strings.Repeat("0", 64) + " is not the digest of reward_spec (" + spec.Digest + ")"},
	} {
		t.Run(c.name, func(t *testing.T) {
			played := 0
			env := newSuite(t).NewTestWorkflowEnvironment()
			env.RegisterWorkflowWithOptions(DurableEpisode, workflow.RegisterOptions{Name: WorkflowEpisode})
			env.RegisterActivityWithOptions(func(context.Context, PlayInput) (EpisodeResult, error) {
				played++
				return EpisodeResult{}, nil
			}, activity.RegisterOptions{Name: ActivityPlayEpisode})
			env.ExecuteWorkflow(WorkflowEpisode, json.RawMessage(c.input))
			err := env.GetWorkflowError()
			if !IsInvalidSpec(err) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v; want InvalidSpec saying %q", err, c.want)
			}
			if played != 0 {
				t.Errorf("the episode was played %d times", played)
			}
		})
	}
	// Both, and they agree: the episode names the file's digest, and the activity gets
	// the file to put in the bucket.
	env := newSuite(t).NewTestWorkflowEnvironment()
	env.RegisterWorkflowWithOptions(DurableEpisode, workflow.RegisterOptions{Name: WorkflowEpisode})
	var got PlayInput
	env.RegisterActivityWithOptions(func(_ context.Context, in PlayInput) (EpisodeResult, error) {
		got = in
		return EpisodeResult{}, nil
	}, activity.RegisterOptions{Name: ActivityPlayEpisode})
	env.ExecuteWorkflow(WorkflowEpisode, EpisodeSpec{Env: "shop", Policy: "oracle", RewardSpec: statefulSpec, RewardSpecDigest: spec.Digest})
	if err := env.GetWorkflowError(); err != nil {
		t.Fatal(err)
	}
	if got.Run == nil || got.Run.RewardSpec != spec.Digest || got.Run.RewardSpecText != statefulSpec {
		t.Errorf("activity input %+v; want the spec's digest and file", got.Run)
	}
}

// A worker that dies may have published steps after the last checkpoint Temporal holds
// (heartbeats are throttled). The worker that resumes plays those steps again and the
// stream keeps the first copy of each (same message id); the spec's state then follows
// the copies kept, not the steps played again, so the scores after them are still the
// pure function's over the recorded steps.
func TestDurableEpisodeFollowsTheStepsTheStreamKept(t *testing.T) {
	s := startDurableStack(t)
	spec, err := scoring.Parse("stateful.yaml", []byte(statefulSpec))
	if err != nil {
		t.Fatal(err)
	}
	const stopAt = 12
	held := make(chan struct{})
	a := s.worker(t, "worker-a", func(ctx context.Context, _ string, step uint32) {
		if step == stopAt {
			close(held)
			<-ctx.Done()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	in := EpisodeSpec{Env: "shop", Policy: "random", Profile: "stress", Seed: 23, MaxSteps: 60,
		Params:           map[string]any{"max_invalid": 1000, "deadline_ms": 86_400_000},
		HeartbeatTimeout: 5 * time.Second, RewardSpec: statefulSpec}
	run, err := s.tc.ExecuteWorkflow(ctx, client.StartWorkflowOptions{ID: "durable-spec-dups", TaskQueue: TaskQueue}, WorkflowEpisode, in)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("worker A never reached step ", stopAt)
	}
	a.Stop()
	b := s.worker(t, "worker-b", nil)
	defer b.Stop()
	var res EpisodeResult
	if err := run.Get(ctx, &res); err != nil {
		t.Fatal(err)
	}
	t.Logf("result %+v", res)
	rec := episodeEvents(t, s.bus, res.EpisodeID)
	checkScoredAsThePureFunction(t, spec, rec, res)
}
