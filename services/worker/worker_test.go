package worker

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/reward"
)

// brokenEnv is an env whose episodes cannot start (Reset fails: an infra error, as a
// sandbox that cannot be created would be). resets counts the attempts.
type brokenEnv struct{ resets *atomic.Int32 }

func (e brokenEnv) Spec() env.Spec {
	return env.Spec{Name: "broken-test", Services: []string{"svc"}, DefaultMaxSteps: 5,
		Tools: []env.Tool{{Name: "svc.noop", Service: "svc", Schema: json.RawMessage(`{}`)}}}
}

func (e brokenEnv) NewEpisode(env.Config) (env.Episode, error) { return brokenEpisode(e), nil }

type brokenEpisode struct{ resets *atomic.Int32 }

func (b brokenEpisode) Reset() (json.RawMessage, error) {
	b.resets.Add(1)
	return nil, errors.New("sandbox unavailable")
}
func (brokenEpisode) Step(env.Action) (env.StepResult, error) { return env.StepResult{}, nil }
func (brokenEpisode) Now() time.Duration                      { return 0 }

var brokenResets atomic.Int32

func init() { env.Register(brokenEnv{&brokenResets}) }

// startWorker runs a reward service and a worker over a fresh bus until the test ends; the
// worker's metrics are on tel.
func startWorker(t *testing.T, maxDeliver int) (b *bus.Bus, tel *telemetry.Telemetry) {
	t.Helper()
	return startWorkerWith(t, func(c *Config) { c.MaxDeliver = maxDeliver })
}

// startWorkerWith is startWorker with the worker's config changed by set.
func startWorkerWith(t *testing.T, set func(*Config)) (b *bus.Bus, tel *telemetry.Telemetry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b = bustest.Start(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tel, err := telemetry.New("worker-test", "")
	if err != nil {
		t.Fatal(err)
	}
	get := func() *bus.Bus { return b }
	rw := reward.New(reward.Config{Subscribers: 1}, get, tel.Meter("reward"), log)
	if err := rw.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Concurrency: 3, ScoreBatch: 64, ScoreRequests: 2, AckWait: 2 * time.Second, MaxDeliver: 3, SegmentSteps: 32}
	set(&cfg)
	w := New(cfg, get, get, tel, log)
	if err := w.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Running(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		_ = rw.Stopping(context.Background())
	})
	return b, tel
}

// metricValue returns the value of one series on tel's /metrics, e.g.
// `gauntlet_worker_episodes_total{reason="success"}`, or -1 when it is absent.
func metricValue(t *testing.T, tel *telemetry.Telemetry, series string) float64 {
	t.Helper()
	rec := httptest.NewRecorder()
	tel.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// assign publishes one assignment of the given run's episodes (plans left out: no faults).
func assign(t *testing.T, b *bus.Bus, run *gauntletv1.RunRequested, envs ...string) {
	t.Helper()
	a := &gauntletv1.Assignment{}
	for i, e := range envs {
		ep := runs.Episode(run, uint64(i))
		if e != "shop" {
			ep.Env, ep.Policy = e, "random" // only shop has an oracle
		}
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: ep})
	}
	if err := b.PublishCommand(context.Background(), bus.SubjectEpisode(run.RunId), run.RunId+"/assigned", a); err != nil {
		t.Fatal(err)
	}
}

// endedMessages waits until the worker has settled the assignment (nothing pending or
// unacked on its consumer), then returns every message on the run's ended subject.
func endedMessages(t *testing.T, b *bus.Bus, runID string) []*gauntletv1.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		info, err := b.JS.Consumer(ctx, bus.StreamCommands, ConsumerName)
		if err != nil {
			t.Fatal(err)
		}
		ci, err := info.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Delivered.Consumer > 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("assignment not settled: %d pending, %d unacked", ci.NumPending, ci.NumAckPending)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Read as many messages as the stream holds on the subject, not "until a pause":
	// on a loaded machine a pause between two 8 MB messages is no end.
	subj := bus.SubjectEvent(bus.KindEnded, runID)
	stream, err := b.JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		t.Fatal(err)
	}
	si, err := stream.Info(ctx, jetstream.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	want := int(si.State.Subjects[subj])
	cons, err := b.JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{subj}})
	if err != nil {
		t.Fatal(err)
	}
	var out []*gauntletv1.Event
	for len(out) < want {
		m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		if err != nil {
			t.Fatalf("read message %d of %d on %s: %v", len(out)+1, want, subj, err)
		}
		var ev gauntletv1.Event
		if err := gauntletv1.Unmarshal(m.Data(), &ev); err != nil {
			t.Fatal(err)
		}
		out = append(out, &ev)
	}
	return out
}

func run(id string) *gauntletv1.RunRequested {
	return &gauntletv1.RunRequested{RunId: id, Env: "shop", Seed: 11, Episodes: 3,
		Policies: []*gauntletv1.Share{{Name: "oracle", Weight: 1}}}
}

// An assignment of several episodes ends as one message: the batch of their last
// segments, each episode's steps and end in it, and the assignment is acked.
func TestAssignmentEndsAsOneBatch(t *testing.T) {
	b, tel := startWorker(t, 3)
	r := run("rbatch")
	assign(t, b, r, "shop", "shop", "shop")
	msgs := endedMessages(t, b, r.RunId)
	if len(msgs) != 1 || msgs[0].GetBatch() == nil {
		t.Fatalf("%d messages on the ended subject (first %v), want one batch", len(msgs), msgs)
	}
	evs := msgs[0].Events()
	if len(evs) != 3 {
		t.Fatalf("the batch carries %d events, want 3", len(evs))
	}
	steps := 0
	for i, ev := range evs {
		end := ev.EpisodeEnd()
		if end.GetEpisode().GetIndex() != uint64(i) || end.GetInfraError() || len(ev.GetSteps().GetSteps()) != int(end.GetSteps()) || end.GetSteps() == 0 {
			t.Errorf("event %d: end %v with %d steps", i, end, len(ev.GetSteps().GetSteps()))
		}
		steps += int(end.GetSteps())
	}
	// The step counter is added to once per episode, when it ends.
	if got := metricValue(t, tel, "gauntlet_worker_steps_total"); got != float64(steps) {
		t.Errorf("gauntlet_worker_steps_total = %v, want the episodes' %d steps", got, steps)
	}
	if got := metricValue(t, tel, `gauntlet_worker_episodes_total{reason="success"}`); got != 3 {
		t.Errorf("successful episodes counted %v, want 3", got)
	}
}

// An episode that fails has its whole assignment retried; on the last delivery it is
// recorded as an infra error, in the same batch as the others' events, and nothing of
// the failed attempts reached the stream.
func TestFailedEpisodeRetriesItsAssignmentThenIsAnInfraError(t *testing.T) {
	brokenResets.Store(0)
	b, _ := startWorker(t, 2)
	r := run("rfail")
	assign(t, b, r, "shop", "broken-test", "shop")
	msgs := endedMessages(t, b, r.RunId)
	if n := brokenResets.Load(); n != 2 {
		t.Errorf("the broken episode was tried %d times, want 2 (max-deliver)", n)
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages on the ended subject, want one batch from the last delivery", len(msgs))
	}
	evs := msgs[0].Events()
	if len(evs) != 3 {
		t.Fatalf("the batch carries %d events, want 3", len(evs))
	}
	for i, ev := range evs {
		end := ev.EpisodeEnd()
		if end.GetEpisode().GetIndex() != uint64(i) {
			t.Errorf("event %d is the end of episode %d", i, end.GetEpisode().GetIndex())
		}
		if infra := i == 1; end.GetInfraError() != infra {
			t.Errorf("event %d: infra_error %v, want %v (%s)", i, end.GetInfraError(), infra, end.GetError())
		}
	}
	if end := evs[1].EpisodeEnd(); end.GetReason() != gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR || !strings.Contains(end.GetError(), "sandbox unavailable") {
		t.Errorf("infra error end: reason %v, error %q", end.GetReason(), end.GetError())
	}
}

// A request the worker cannot play (here: the oracle policy on an env without an oracle)
// is not retried: it ends at once, terminated with reason failure and the error, in the
// assignment's batch beside the other episodes.
func TestRequestErrorEndsAtOnce(t *testing.T) {
	brokenResets.Store(0)
	b, _ := startWorker(t, 3)
	r := run("rreq")
	a := &gauntletv1.Assignment{}
	for i, e := range []string{"shop", "broken-test"} {
		ep := runs.Episode(r, uint64(i))
		ep.Env = e // both with the oracle policy
		a.Episodes = append(a.Episodes, &gauntletv1.EpisodeAssigned{Episode: ep})
	}
	if err := b.PublishCommand(context.Background(), bus.SubjectEpisode(r.RunId), r.RunId+"/assigned", a); err != nil {
		t.Fatal(err)
	}
	msgs := endedMessages(t, b, r.RunId)
	if len(msgs) != 1 || len(msgs[0].Events()) != 2 {
		t.Fatalf("%d messages on the ended subject, want one batch of 2", len(msgs))
	}
	end := msgs[0].Events()[1].EpisodeEnd()
	if end.GetInfraError() || !end.GetTerminated() || end.GetReason() != gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE ||
		!strings.Contains(end.GetError(), "oracle") {
		t.Errorf("end of the unplayable episode: %v", end)
	}
	if n := brokenResets.Load(); n != 0 {
		t.Errorf("the unplayable episode was reset %d times, want 0", n)
	}
}

// A worker's configuration is checked whole: every bad field is named, each with why.
func TestConfigNamesEveryBadField(t *testing.T) {
	err := Config{}.Validate()
	if err == nil {
		t.Fatal("the zero Config passed validation")
	}
	for _, field := range []string{"worker.concurrency", "worker.score-batch", "worker.score-requests", "worker.ack-wait", "worker.max-deliver", "worker.segment-steps"} {
		if !strings.Contains(err.Error(), field+":") {
			t.Errorf("error %q does not name %s", err, field)
		}
	}
	ok := Config{Concurrency: 1, ScoreBatch: 1, ScoreRequests: 1, AckWait: time.Second, MaxDeliver: 1, SegmentSteps: 1}
	if err := ok.Validate(); err != nil {
		t.Errorf("a valid Config: %v", err)
	}
}

// slowModel is a stand-in for an OpenAI-compatible endpoint (outside the product) that
// takes delay to answer each request, always with a catalogue search, and counts the
// requests: one per step played.
type slowModel struct {
	delay time.Duration
	calls atomic.Int32
}

func (m *slowModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	m.calls.Add(1)
	select {
	case <-time.After(m.delay):
	case <-r.Context().Done():
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"catalog__search","arguments":"{\"query\":\"mug\"}"}}]}}]}`)
}

// A step that takes longer than the assignment's lease (a slow model call, a long
// command) keeps the lease: the assignment is not redelivered meanwhile, so each step is
// played exactly once and the episode is recorded once.
func TestStepLongerThanTheLeaseRunsOnce(t *testing.T) {
	model := &slowModel{delay: 2500 * time.Millisecond}
	srv := httptest.NewServer(model)
	defer srv.Close()
	p, err := httppolicy.New(httppolicy.Config{URL: srv.URL + "/v1", Model: "m", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := startWorkerWith(t, func(c *Config) {
		c.AckWait, c.MaxDeliver, c.Policies = time.Second, 5, policy.NewSet(p)
	})
	r := &gauntletv1.RunRequested{RunId: "rslow", Env: "shop", Seed: 5, Episodes: 1, MaxSteps: 3,
		Policies: []*gauntletv1.Share{{Name: httppolicy.Name, Weight: 1}}}
	a := &gauntletv1.Assignment{Episodes: []*gauntletv1.EpisodeAssigned{{Episode: runs.Episode(r, 0)}}}
	if err := b.PublishCommand(context.Background(), bus.SubjectEpisode(r.RunId), r.RunId+"/assigned", a); err != nil {
		t.Fatal(err)
	}
	msgs := endedMessages(t, b, r.RunId)
	if n := model.calls.Load(); n != 3 {
		t.Errorf("the model was asked %d times for a 3-step episode, want 3 (one per step)", n)
	}
	if len(msgs) != 1 {
		t.Fatalf("%d messages on the ended subject, want the episode recorded once", len(msgs))
	}
	if end := msgs[0].EpisodeEnd(); end.GetInfraError() || end.GetSteps() != 3 {
		t.Errorf("end: %v, want 3 steps and no infra error", end)
	}
	ci, err := b.JS.Consumer(context.Background(), bus.StreamCommands, ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := ci.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.NumRedelivered != 0 || info.Delivered.Consumer != 1 {
		t.Errorf("the assignment was delivered %d times (%d redelivered), want once", info.Delivered.Consumer, info.NumRedelivered)
	}
}
