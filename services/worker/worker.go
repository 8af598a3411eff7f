// Package worker is the sandbox worker: it pulls assigned episodes from the GAUNTLET_CMD
// work queue, runs each one in its sandbox (in-process sim envs, or a real sandbox from the
// runtime of Config.Sandbox for envs such as codefix), asks the reward service
// to score every step, and publishes the episode's events (started, every step, ended) to
// GAUNTLET_EVENTS.
//
// Delivery contract: an assignment is acked only after every event of its episode has been
// acked by the stream. A worker that dies mid-episode leaves the assignment unacked, so
// JetStream redelivers it (to any worker) after AckWait; the episode re-runs from its seed
// and, being deterministic, republishes the same events with the same message ids, which
// the stream and the store de-duplicate. Long episodes heartbeat with InProgress. On stop,
// episodes in flight are abandoned and their assignments nak'ed for immediate redelivery.
//
// Concurrency: Config.Concurrency episode goroutines share one consumer and one scorer;
// each episode's env, agent and injector belong to its goroutine alone.
package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ConsumerName is the durable consumer all workers share.
const ConsumerName = "worker"

// Config configures a worker.
type Config struct {
	// ID names this worker in events (defaults to a random id).
	ID string
	// Concurrency is how many episodes run at once.
	Concurrency int
	// ScoreBatch caps the steps per score request.
	ScoreBatch int
	// AckWait is the lease on an assignment; a worker silent for this long loses it.
	AckWait time.Duration
	// MaxDeliver is how many times an assignment is tried before the episode is recorded
	// as an infra error.
	MaxDeliver int
	// SegmentSteps is how many steps of an episode go in one StepsTaken event; an episode
	// also flushes its pending steps when it ends and when a second has passed.
	SegmentSteps int
	// Sandbox chooses the runtime of envs that need real sandboxes (codefix).
	Sandbox runtimes.Config
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("worker.concurrency: %d must be at least 1", c.Concurrency))
	}
	if c.ScoreBatch < 1 {
		errs = append(errs, fmt.Errorf("worker.score-batch: %d must be at least 1", c.ScoreBatch))
	}
	if c.AckWait < time.Second {
		errs = append(errs, fmt.Errorf("worker.ack-wait: %v must be at least 1s", c.AckWait))
	}
	if c.MaxDeliver < 1 {
		errs = append(errs, fmt.Errorf("worker.max-deliver: %d must be at least 1", c.MaxDeliver))
	}
	if c.SegmentSteps < 1 {
		errs = append(errs, fmt.Errorf("worker.segment-steps: %d must be at least 1", c.SegmentSteps))
	}
	if err := c.Sandbox.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Service is one sandbox worker.
type Service struct {
	cfg    Config
	bus    func() *bus.Bus
	log    *slog.Logger
	tracer trace.Tracer
	scorer *scorer
	cons   jetstream.Consumer
	// sandboxes is nil when no sandbox runtime is configured; runtimes owns it.
	sandboxes env.Sandboxes
	runtimes  *runtimes.Sandboxes

	steps    metric.Int64Counter
	episodes metric.Int64Counter
	fired    metric.Int64Counter
	active   metric.Int64UpDownCounter
}

// New allocates a worker. getBus carries its consumer and event publishes; getRPC its score
// requests, so they never wait behind publishes.
func New(cfg Config, getBus, getRPC func() *bus.Bus, tel *telemetry.Telemetry, log *slog.Logger) *Service {
	if cfg.ID == "" {
		cfg.ID = fmt.Sprintf("w-%08x", rng.Derive(uint64(time.Now().UnixNano()), "worker")>>32)
	}
	m := tel.Meter("gauntlet/worker")
	return &Service{
		cfg: cfg, bus: getBus, log: log.With("worker_id", cfg.ID),
		tracer:   tel.Tracer("gauntlet/worker"),
		scorer:   newScorer(getRPC, cfg.ScoreBatch, 4, m),
		steps:    telemetry.Must(m.Int64Counter("gauntlet_worker_steps_total", metric.WithDescription("Steps run."))),
		episodes: telemetry.Must(m.Int64Counter("gauntlet_worker_episodes_total", metric.WithDescription("Episodes finished, by reason."))),
		fired:    telemetry.Must(m.Int64Counter("gauntlet_worker_faults_fired_total", metric.WithDescription("Faults fired, by kind."))),
		active:   telemetry.Must(m.Int64UpDownCounter("gauntlet_worker_active_episodes", metric.WithDescription("Episodes running now."))),
	}
}

// ID is the worker's id.
func (w *Service) ID() string { return w.cfg.ID }

// Starting opens the sandbox runtime, if one is configured, and creates (or binds to) the
// shared work-queue consumer.
func (w *Service) Starting(ctx context.Context) error {
	if err := w.cfg.Validate(); err != nil {
		return err
	}
	sb, err := runtimes.Open(ctx, w.cfg.Sandbox, w.log.With("sandbox_runtime", w.cfg.Sandbox.Runtime))
	if err != nil {
		return err
	}
	if sb != nil {
		w.sandboxes, w.runtimes = sb, sb
	}
	cons, err := w.bus().JS.CreateOrUpdateConsumer(ctx, bus.StreamCommands, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "episode assignments, shared by every worker",
		FilterSubject: bus.SubjectEpisodePrefix + ">",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       w.cfg.AckWait,
		MaxDeliver:    w.cfg.MaxDeliver,
		MaxAckPending: 100_000,
	})
	if err != nil {
		if sb != nil {
			_ = sb.Close()
		}
		return fmt.Errorf("create consumer %s: %w", ConsumerName, err)
	}
	w.cons = cons
	return nil
}

// Running pulls assignments and runs episodes until ctx ends.
func (w *Service) Running(ctx context.Context) error {
	go w.scorer.run(ctx)
	it, err := w.cons.Messages(jetstream.PullMaxMessages(w.cfg.Concurrency))
	if err != nil {
		return fmt.Errorf("pull from %s: %w", ConsumerName, err)
	}
	go func() { <-ctx.Done(); it.Drain() }()

	work := make(chan jetstream.Msg)
	done := make(chan struct{})
	for i := 0; i < w.cfg.Concurrency; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for msg := range work {
				w.handle(ctx, msg)
			}
		}()
	}
	for {
		msg, err := it.Next()
		if err != nil {
			break // iterator drained after the stop
		}
		if ctx.Err() != nil {
			_ = msg.Nak() // prefetched but not started: give it back now
			continue
		}
		work <- msg
	}
	close(work)
	for i := 0; i < w.cfg.Concurrency; i++ {
		<-done
	}
	return nil
}

// Stopping closes the sandbox runtime, if any: Running returned after its episodes did,
// and they released their sandboxes.
func (w *Service) Stopping(context.Context) error {
	if w.runtimes == nil {
		return nil
	}
	return w.runtimes.Close()
}

// errAbandoned marks an episode given up because the worker is stopping.
var errAbandoned = errors.New("worker stopping")

func (w *Service) handle(ctx context.Context, msg jetstream.Msg) {
	var a gauntletv1.EpisodeAssigned
	if err := proto.Unmarshal(msg.Data(), &a); err != nil || a.Episode == nil {
		w.log.Error("undecodable assignment; terminating it", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return
	}
	attempt := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		attempt = md.NumDelivered
	}
	w.active.Add(ctx, 1)
	defer w.active.Add(ctx, -1)
	err := w.play(ctx, msg, &a, uint32(attempt))
	switch {
	case err == nil:
		_ = msg.Ack()
	case ctx.Err() != nil || errors.Is(err, errAbandoned):
		_ = msg.Nak()
	case attempt < uint64(w.cfg.MaxDeliver):
		w.log.Warn("episode failed; will retry", "episode_id", a.Episode.EpisodeId, "attempt", attempt, "err", err)
		_ = msg.NakWithDelay(time.Duration(attempt) * time.Second)
	default:
		w.log.Error("episode failed on its last attempt; recording an infra error", "episode_id", a.Episode.EpisodeId, "err", err)
		ended := &gauntletv1.EpisodeEnded{
			Episode: a.Episode, Profile: a.Plan.GetProfile(), Plan: a.Plan, WorkerId: w.cfg.ID,
			Truncated: true, Reason: gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR,
			InfraError: true, Error: err.Error(), EndedAtUnixNano: time.Now().UnixNano(),
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if perr := w.bus().PublishEvent(pctx, &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: ended}}); perr != nil {
			_ = msg.Nak()
			return
		}
		w.episodes.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "infra_error")))
		_ = msg.Ack()
	}
}

// play runs one episode to its end and publishes its events. A nil error means every event
// is in the stream. Problems with the request itself (unknown env, bad params) are not
// errors: the episode ends at once with the reason recorded.
func (w *Service) play(ctx context.Context, msg jetstream.Msg, a *gauntletv1.EpisodeAssigned, attempt uint32) error {
	req := a.Episode
	ctx, span := w.tracer.Start(ctx, "episode", trace.WithAttributes(
		attribute.String("episode_id", req.EpisodeId), attribute.String("env", req.Env),
		attribute.String("policy", req.Policy), attribute.String("profile", a.Plan.GetProfile())))
	defer span.End()

	pub := publisher{bus: w.bus(), stall: 10 * time.Second, segment: w.cfg.SegmentSteps}
	startedAt := time.Now()
	ended := &gauntletv1.EpisodeEnded{
		Episode: req, Profile: a.Plan.GetProfile(), Plan: a.Plan, WorkerId: w.cfg.ID,
		StartedAtUnixNano: startedAt.UnixNano(),
	}
	episode, agent, err := w.prepare(a)
	if err != nil {
		ended.Terminated = true
		ended.Reason = gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE
		ended.Error = err.Error()
		return w.finish(ctx, &pub, ended)
	}
	defer func() {
		if err := env.Close(episode); err != nil {
			w.log.Warn("close episode", "episode_id", req.EpisodeId, "err", err)
		}
	}()
	obs, err := episode.Reset()
	if err != nil {
		return fmt.Errorf("reset %s: %w", req.EpisodeId, err)
	}
	// The plan goes with the ended event (and into ClickHouse); started stays small.
	if err := pub.event(&gauntletv1.Event{Body: &gauntletv1.Event_Started{Started: &gauntletv1.EpisodeStarted{
		Episode: req, WorkerId: w.cfg.ID, StartedAtUnixNano: startedAt.UnixNano(),
		ObservationJson: string(obs), Attempt: attempt,
	}}}); err != nil {
		return err
	}

	turn := env.Turn{Observation: obs}
	lastBeat := time.Now()
	reply := make(chan scoreResult, 1) // this episode's score replies, reused every step
	for step := uint32(0); ; step++ {
		if ctx.Err() != nil {
			return errAbandoned
		}
		if time.Since(lastBeat) > w.cfg.AckWait/3 {
			_ = msg.InProgress()
			lastBeat = time.Now()
		}
		act, res, err := env.PlayStep(agent, episode, req, turn)
		if err != nil {
			return err
		}
		st := env.StepEvent(req, a.Plan.GetProfile(), w.cfg.ID, step, act, res, episode.Now())
		score, err := w.scorer.Score(ctx, st, reply)
		if err != nil {
			if ctx.Err() != nil {
				return errAbandoned
			}
			return err
		}
		st.Score = score
		if err := pub.step(st); err != nil {
			return err
		}
		w.steps.Add(ctx, 1)
		for _, f := range res.Faults {
			w.fired.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", f.Kind)))
		}
		ended.Steps = step + 1
		ended.TotalReward += score.GetTotal()
		ended.FaultsFired += uint32(len(res.Faults))
		turn = env.Turn{Step: step + 1, Observation: res.Observation, Reward: score.GetTotal()}
		if res.Done() {
			ended.Terminated, ended.Truncated, ended.Reason = res.Terminated, res.Truncated, res.Reason
			ended.Success = res.Signals.GetSuccess()
			break
		}
	}
	ended.VirtualTimeNs = int64(episode.Now())
	return w.finish(ctx, &pub, ended)
}

// prepare builds the episode and its agent; its errors are the request's fault.
func (w *Service) prepare(a *gauntletv1.EpisodeAssigned) (env.Episode, env.Agent, error) {
	req := a.Episode
	e, err := env.Lookup(req.Env)
	if err != nil {
		return nil, nil, fmt.Errorf("env: %w", err)
	}
	inj, err := faults.NewInjector(a.Plan)
	if err != nil {
		return nil, nil, fmt.Errorf("fault plan: %w", err)
	}
	params := json.RawMessage(req.ParamsJson)
	episode, err := e.NewEpisode(env.Config{Seed: req.Seed, Params: params, MaxSteps: req.MaxSteps, Faults: inj, Sandboxes: w.sandboxes})
	if err != nil {
		return nil, nil, err
	}
	p, err := policy.Lookup(req.Policy)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	agent, err := p.NewAgent(e, rng.Derive(req.Seed, "policy"))
	if err != nil {
		return nil, nil, fmt.Errorf("policy %s: %w", req.Policy, err)
	}
	return episode, agent, nil
}

func (w *Service) finish(ctx context.Context, pub *publisher, ended *gauntletv1.EpisodeEnded) error {
	ended.EndedAtUnixNano = time.Now().UnixNano()
	if err := pub.flush(); err != nil {
		return err
	}
	if err := pub.event(&gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: ended}}); err != nil {
		return err
	}
	if err := pub.wait(ctx); err != nil {
		return err
	}
	w.episodes.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", ended.Reason.Name())))
	return nil
}

// publisher publishes one episode's events asynchronously and waits for all their acks
// at the end, republishing (same message id, so no duplicate) any that failed. Steps are
// grouped into StepsTaken segments of up to segment steps.
type publisher struct {
	bus     *bus.Bus
	stall   time.Duration
	segment int
	pending []jetstream.PubAckFuture

	steps     []*gauntletv1.StepTaken
	lastFlush time.Time
}

// step queues one step, publishing the segment when it is full or has waited a second.
func (p *publisher) step(st *gauntletv1.StepTaken) error {
	if len(p.steps) == 0 && p.lastFlush.IsZero() {
		p.lastFlush = time.Now()
	}
	p.steps = append(p.steps, st)
	if len(p.steps) >= p.segment || time.Since(p.lastFlush) > time.Second {
		return p.flush()
	}
	return nil
}

// flush publishes the queued steps, if any, as one StepsTaken event.
func (p *publisher) flush() error {
	if len(p.steps) == 0 {
		return nil
	}
	ev := &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{Steps: p.steps}}}
	p.steps = nil
	p.lastFlush = time.Now()
	return p.event(ev)
}

func (p *publisher) event(ev *gauntletv1.Event) error {
	f, err := p.bus.PublishEventAsync(ev, p.stall)
	if err != nil {
		return err
	}
	p.pending = append(p.pending, f)
	return nil
}

func (p *publisher) wait(ctx context.Context) error {
	for _, f := range p.pending {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			m := f.Msg()
			var ev gauntletv1.Event
			if uerr := proto.Unmarshal(m.Data, &ev); uerr != nil {
				return fmt.Errorf("republish after %v: %w", err, uerr)
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			perr := p.bus.PublishEvent(rctx, &ev)
			cancel()
			if perr != nil {
				return fmt.Errorf("publish %s: %w (first error: %v)", m.Subject, perr, err)
			}
		case <-ctx.Done():
			return errAbandoned
		}
	}
	p.pending = p.pending[:0]
	return nil
}
