package reward

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/metric/noop"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// startedOn starts the service on b.
func startedOn(ctx context.Context, t *testing.T, b *bus.Bus, cfg Config) *Service {
	t.Helper()
	s := New(cfg, func() *bus.Bus { return b }, noop.NewMeterProvider().Meter("test"), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := s.Starting(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stopping(ctx) })
	return s
}

// Steps scored over NATS, batched by a worker's scorer from many episodes at once, each
// get exactly the score the pure function gives them in process: the service keeps no
// state between steps, and no step gets another's score.
func TestScoresOverNATSAreThePureFunctions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	startedOn(ctx, t, b, Config{Subscribers: 2})
	scorer := play.NewScorer(func() *bus.Bus { return b }, 8, 2, noop.NewMeterProvider().Meter("test"), "test")
	go scorer.Run(ctx)

	const episodes, steps = 16, 12
	var wg sync.WaitGroup
	errs := make(chan error, episodes)
	for e := range episodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reply := make(chan play.ScoreResult, 1)
			for i := range steps {
				st := &gauntletv1.StepTaken{
					EpisodeId: fmt.Sprintf("r1-%07d", e), Step: uint32(i), Env: "shop",
					Signals:  &gauntletv1.Signals{ProgressDelta: float64(e*steps+i) / 1000, InvalidAction: (e+i)%5 == 0, Success: i == steps-1 && e%2 == 0},
					Metering: &gauntletv1.Metering{ToolCalls: uint32(i % 3), Errors: uint32(e % 2), VirtualNs: uint64(e * 1000)},
				}
				got, err := scorer.Score(ctx, st, nil, reply)
				if err != nil {
					errs <- fmt.Errorf("episode %d step %d: %w", e, i, err)
					return
				}
				if want := scoring.Score(scoring.SpecFor("shop"), st); !proto.Equal(got.Full(), want) {
					errs <- fmt.Errorf("episode %d step %d: scored %v over NATS, %v in process", e, i, got, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A request the service cannot decode is answered with an invalid error at once, never
// dropped: the worker ends the episode as an infra error instead of waiting out its
// timeout.
func TestUndecodableRequestIsAnsweredOverNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := bustest.Start(t)
	startedOn(ctx, t, b, Config{})
	msg, err := b.NC.RequestWithContext(ctx, bus.SubjectScore, []byte("\xff\xfe not a score request"))
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	var r gauntletv1.ScoreReply
	if err := proto.Unmarshal(msg.Data, &r); err != nil || r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_INVALID || r.Error == "" || r.Table != nil {
		t.Fatalf("reply %v (%v), want an invalid error and no scores", &r, err)
	}
}

// Stopping drains: a request received before the stop is answered, and none after it.
func TestStoppingAnswersNoMore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := bustest.Start(t)
	s := startedOn(ctx, t, b, Config{Subscribers: 3})
	data, _ := proto.Marshal(&gauntletv1.ScoreRequest{Steps: []*gauntletv1.StepTaken{{EpisodeId: "r1-0000000", Env: "shop"}}})
	if _, err := b.NC.RequestWithContext(ctx, bus.SubjectScore, data); err != nil {
		t.Fatalf("before the stop: %v", err)
	}
	if err := s.Stopping(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := b.NC.Request(bus.SubjectScore, data, 200*time.Millisecond)
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the service still answers 5s after Stopping")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// namedSpec is a stateful spec a run names: shaping, a running z-score and an expression
// over the episode so far, so a step scored without its episode's state would differ; and a
// repeat detector, so a step scored without its action would differ.
const namedSpec = `name: contract
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.9}, weight: 0.5}
  - {name: calls, expr: double(metering.tool_calls), weight: 0.1, normalise: [{zscore: {window: 4}}]}
  - {name: late, expr: "episode.steps > 5u ? -0.5 : 0.0", weight: 1}
  - {name: repeat, detector: {kind: repeat, window: 3, faults: hold}, weight: 0.2}
`

// Episodes of a run that names a spec, scored over NATS in batches mixing episodes and
// the default spec, get step by step what the pure function gives them with their own
// episode's state: the state travels with the steps, the service keeps none. The steps
// carry their actions too, which the repeat detector reads.
func TestNamedSpecsCarryEpisodeState(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	startedOn(ctx, t, b, Config{Subscribers: 2})
	spec, err := scoring.Parse("contract.yaml", []byte(namedSpec))
	if err != nil {
		t.Fatal(err)
	}
	if err := rewardspecs.NewClient(b.JS).Put(ctx, spec); err != nil {
		t.Fatal(err)
	}
	scorer := play.NewScorer(func() *bus.Bus { return b }, 8, 2, noop.NewMeterProvider().Meter("test"), "test")
	go scorer.Run(ctx)

	const episodes, steps = 12, 10
	var wg sync.WaitGroup
	errs := make(chan error, episodes)
	for e := range episodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprintf("r1-%07d", e), Env: "shop"}
			if e%3 != 0 { // every third episode stays on the default spec
				req.RewardSpec = spec.Digest
			}
			named := play.NewEpisodeScoring(req)
			var want gauntletv1.RewardState
			reply := make(chan play.ScoreResult, 1)
			for i := range steps {
				st := &gauntletv1.StepTaken{
					EpisodeId: req.EpisodeId, Step: uint32(i), Env: "shop", Terminated: i == steps-1,
					Signals:  &gauntletv1.Signals{Progress: float64(i*e%7) / 7, ProgressDelta: 0.01 * float64(e)},
					Metering: &gauntletv1.Metering{ToolCalls: uint32((i * e) % 4)},
					// The same call from the third step on: flagged from the fifth.
					Action: &gauntletv1.Action{Tool: "wallet.balance", ArgsJson: fmt.Sprintf(`{"n":%d}`, min(i, 2))},
				}
				got, err := scorer.Score(ctx, st, named, reply)
				if err != nil {
					errs <- fmt.Errorf("episode %d step %d: %w", e, i, err)
					return
				}
				if len(got.Components) > 0 || len(got.Values) == 0 {
					errs <- fmt.Errorf("episode %d step %d: score %v, want the values form", e, i, got)
					return
				}
				got = got.Full()
				expect := scoring.Score(scoring.SpecFor("shop"), st)
				if named != nil {
					expect = scoring.ScoreState(spec, &want, st)
				}
				if !proto.Equal(got, expect) {
					errs <- fmt.Errorf("episode %d step %d: scored %v over NATS, %v in process", e, i, got, expect)
					return
				}
				if flagged := named != nil && got.Components[4].Value == -1; named != nil && flagged != (i >= 4) {
					errs <- fmt.Errorf("episode %d step %d: repeat flagged %v over NATS", e, i, flagged)
					return
				}
			}
			if named != nil {
				if got, err := stateOf(named); err != nil || !proto.Equal(got, &want) {
					errs <- fmt.Errorf("episode %d: state %v (%v), want %v", e, got, err, &want)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// leanSpec reads no action (no repeat detector) and no episode so far: the 8 components
// of pkg/scoring's BenchmarkScoreSpecs.
const leanSpec = `name: lean
version: "1"
components:
  - {name: task, builtin: task, weight: 1}
  - {name: cost, builtin: cost, weight: 0.2}
  - {name: causal, builtin: causal, weight: 0.3, normalise: [{scale: 2}, {clip: [-1, 0]}]}
  - {name: thrift, expr: "signals.budget > 0.0 ? -signals.spend / signals.budget : 0.0", weight: 0.1}
  - {name: careful, expr: "signals.invalid_action || size(signals.violations) > 0 ? -1.0 : 0.0", weight: 0.1}
  - {name: progress, potential: {expr: signals.progress, gamma: 0.99}, weight: 0.5}
`

// Under a spec that reads no action and no fault the worker leaves them out of its
// requests once a reply has said so, and the state it carries holds no episode so far;
// the scores stay exactly those of the pure function, given the steps' full faults. Under
// a spec with a repeat detector every step carries its action, and a step a fault
// answered that fault's kind alone (TestNamedSpecsCarryEpisodeState checks the flags
// they raise).
func TestActionsLeftOutForSpecsThatReadNone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := bustest.Start(t)
	startedOn(ctx, t, b, Config{Subscribers: 2})
	lean, err := scoring.Parse("lean.yaml", []byte(leanSpec))
	if err != nil {
		t.Fatal(err)
	}
	reading, err := scoring.Parse("contract.yaml", []byte(namedSpec))
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range []scoring.Spec{lean, reading} {
		if err := rewardspecs.NewClient(b.JS).Put(ctx, sp); err != nil {
			t.Fatal(err)
		}
	}
	// Every request, as the reward service receives it: a plain subscription sees what
	// the queue group does.
	var mu sync.Mutex
	withAction := map[string]int{} // digest -> steps sent with their action
	withFaults := map[string]int{} // digest -> steps sent with faults
	sent := map[string]int{}
	var fullFaults []string // faults sent with more than their kind
	var episodes []string
	sub, err := b.NC.Subscribe(bus.SubjectScore, func(m *nats.Msg) {
		var req gauntletv1.ScoreRequest
		if err := proto.Unmarshal(m.Data, &req); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for i, st := range req.Steps {
			digest := st.RewardSpec
			if len(req.SpecOf) > 0 && req.SpecOf[i] > 0 {
				digest = req.SpecDigests[req.SpecOf[i]-1]
			}
			sent[digest]++
			if st.Action != nil {
				withAction[digest]++
			}
			if len(st.Faults) > 0 {
				withFaults[digest]++
			}
			for _, f := range st.Faults {
				if f.FaultId != "" || f.Detail != "" || f.Target != "" || len(st.Faults) > 1 {
					fullFaults = append(fullFaults, f.String())
				}
			}
			var state gauntletv1.RewardState
			if err := state.DecodeReusing(req.EncodedStates[i]); err != nil {
				t.Errorf("step %d of %s: %v", st.Step, st.EpisodeId, err)
			}
			if state.GetEpisode() != nil {
				episodes = append(episodes, st.EpisodeId)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.NC.Flush(); err != nil {
		t.Fatal(err)
	}
	scorer := play.NewScorer(func() *bus.Bus { return b }, 8, 2, noop.NewMeterProvider().Meter("test"), "test")
	go scorer.Run(ctx)

	// One episode at a time, so exactly one request goes before the first reply.
	const steps = 20
	for e, sp := range []scoring.Spec{lean, reading, lean} {
		named := play.NewEpisodeScoring(&gauntletv1.EpisodeRequested{EpisodeId: fmt.Sprintf("r1-%07d", e), Env: "shop", RewardSpec: sp.Digest})
		var want gauntletv1.RewardState
		reply := make(chan play.ScoreResult, 1)
		for i := range steps {
			st := &gauntletv1.StepTaken{
				EpisodeId: fmt.Sprintf("r1-%07d", e), Step: uint32(i), Env: "shop", Terminated: i == steps-1,
				Signals: &gauntletv1.Signals{Progress: float64(i%7) / 7, ProgressDelta: 0.01 * float64(i), Spend: float64(i), Budget: 40,
					InvalidAction: i%4 == 0, Violations: make([]*gauntletv1.CausalViolation, i%3/2)},
				Metering: &gauntletv1.Metering{ToolCalls: uint32(i % 4)},
				Action:   &gauntletv1.Action{Tool: "wallet.balance", ArgsJson: `{}`},
			}
			switch i % 5 {
			case 0: // a retry a 503 answered, slowed too
				st.Faults = []*gauntletv1.FaultFired{
					{FaultId: "f1", Kind: "latency", Target: "wallet/wallet.balance", Detail: "latency_ms=12.5"},
					{FaultId: "f2", Kind: "http_error", Target: "wallet/wallet.balance", Detail: "status=503 retry_after_ms=0"},
				}
			case 3: // slowed only: the env answered
				st.Faults = []*gauntletv1.FaultFired{{FaultId: "f1", Kind: "latency", Target: "wallet/wallet.balance", Detail: "latency_ms=80.1"}}
			}
			got, err := scorer.Score(ctx, st, named, reply)
			if err != nil {
				t.Fatalf("episode %d step %d: %v", e, i, err)
			}
			got = got.Full()
			if expect := scoring.ScoreState(sp, &want, st); !proto.Equal(got, expect) {
				t.Fatalf("episode %d step %d: scored %v over NATS, %v in process", e, i, got, expect)
			}
		}
		if got, err := stateOf(named); err != nil || !proto.Equal(got, &want) {
			t.Errorf("episode %d: state %v (%v), want %v", e, got, err, &want)
		}
	}
	// The observer's copies of the requests may trail their replies.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := sent[lean.Digest] + sent[reading.Digest]
		mu.Unlock()
		if n >= 3*steps || time.Now().After(deadline) {
			break
		}
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if sent[lean.Digest] != 2*steps || withAction[lean.Digest] != 1 {
		t.Errorf("lean spec: %d of %d steps sent with their action, want only the first", withAction[lean.Digest], sent[lean.Digest])
	}
	if sent[reading.Digest] != steps || withAction[reading.Digest] != steps {
		t.Errorf("spec with a repeat detector: %d of %d steps sent with their action, want all", withAction[reading.Digest], sent[reading.Digest])
	}
	// Faults: the lean spec's first step only; the reading spec's steps a 503 answered
	// (one in five), each with that fault's kind alone; never a latency.
	if withFaults[lean.Digest] != 1 || withFaults[reading.Digest] != steps/5 {
		t.Errorf("steps sent with faults: lean %d (want 1, the first), repeat detector %d (want %d)", withFaults[lean.Digest], withFaults[reading.Digest], steps/5)
	}
	if len(fullFaults) > 0 {
		t.Errorf("faults sent with more than the kind of the one that answered: %v", fullFaults)
	}
	for _, ep := range episodes {
		if ep != "r1-0000001" {
			t.Errorf("a step of %s carried an episode so far, which its spec does not read", ep)
		}
	}
}

// stateOf decodes the state an episode carries.
func stateOf(named *play.EpisodeScoring) (*gauntletv1.RewardState, error) {
	var st gauntletv1.RewardState
	return &st, st.DecodeReusing(named.State)
}

// A step naming a spec the bucket does not hold is answered with a not-found error,
// naming the digest, so the worker ends the episode as an infra error.
func TestUnknownSpecIsNotFound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b := bustest.Start(t)
	startedOn(ctx, t, b, Config{})
	digest := "sha256:" + strings.Repeat("ab", 32)
	data, _ := proto.Marshal(&gauntletv1.ScoreRequest{Steps: []*gauntletv1.StepTaken{{EpisodeId: "r1-0000000", Env: "shop", RewardSpec: digest}}})
	msg, err := b.NC.RequestWithContext(ctx, bus.SubjectScore, data)
	if err != nil {
		t.Fatal(err)
	}
	var r gauntletv1.ScoreReply
	if err := proto.Unmarshal(msg.Data, &r); err != nil || r.ErrorKind != gauntletv1.ErrorKind_ERROR_KIND_NOT_FOUND || !strings.Contains(r.Error, digest) || r.Table != nil {
		t.Fatalf("reply %v (%v), want a not-found error naming the digest", &r, err)
	}
}
