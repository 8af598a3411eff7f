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
// Each step takes the shared step path of pkg/play, the same as a trainer's step over the
// env API, so a trajectory looks the same whoever chose its actions.
//
// Concurrency: Config.Concurrency episode goroutines share one consumer and one scorer;
// each episode's env, agent and injector belong to its goroutine alone.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
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
	scorer *play.Scorer
	cons   jetstream.Consumer
	// sandboxes is nil when no sandbox runtime is configured; runtimes owns it.
	sandboxes env.Sandboxes
	runtimes  *runtimes.Sandboxes
	// templates finds the templates of user-defined profiles' compact plans.
	templates *templates.Store

	steps    metric.Int64Counter
	episodes metric.Int64Counter
	fired    metric.Int64Counter
	active   metric.Int64UpDownCounter
	// byKind and byReason label fired and episodes, built once per value.
	byKind, byReason *telemetry.Label
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
		scorer:   play.NewScorer(getRPC, cfg.ScoreBatch, 4, m, "gauntlet_worker"),
		steps:    telemetry.Must(m.Int64Counter("gauntlet_worker_steps_total", metric.WithDescription("Steps run."))),
		episodes: telemetry.Must(m.Int64Counter("gauntlet_worker_episodes_total", metric.WithDescription("Episodes finished, by reason."))),
		fired:    telemetry.Must(m.Int64Counter("gauntlet_worker_faults_fired_total", metric.WithDescription("Faults fired, by kind."))),
		active:   telemetry.Must(m.Int64UpDownCounter("gauntlet_worker_active_episodes", metric.WithDescription("Episodes running now."))),
		byKind:   telemetry.NewLabel("kind"),
		byReason: telemetry.NewLabel("reason"),
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
	w.templates = templates.New(w.bus().JS)
	return nil
}

// Running pulls assignments and runs episodes until ctx ends.
func (w *Service) Running(ctx context.Context) error {
	go w.scorer.Run(ctx)
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
	bus.Pull(ctx, w.cons, w.log, func(msg jetstream.Msg) {
		if ctx.Err() != nil {
			_ = msg.Nak() // prefetched but not started: give it back now
			return
		}
		work <- msg
	}, jetstream.PullMaxMessages(w.cfg.Concurrency))
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

func (w *Service) handle(ctx context.Context, msg jetstream.Msg) {
	var a gauntletv1.EpisodeAssigned
	if err := gauntletv1.Unmarshal(msg.Data(), &a); err != nil || a.Episode == nil {
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
	case ctx.Err() != nil || errors.Is(err, play.ErrAbandoned):
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
		w.episodes.Add(ctx, 1, w.byReason.Option("infra_error"))
		_ = msg.Ack()
	}
}

// play runs one episode to its end through the shared step path (pkg/play) and publishes
// its events. A nil error means every event is in the stream. Problems with the request
// itself (unknown env, bad params, a policy that cannot play the env) are not errors: the
// episode ends at once with the reason recorded.
func (w *Service) play(ctx context.Context, msg jetstream.Msg, a *gauntletv1.EpisodeAssigned, attempt uint32) error {
	req := a.Episode
	ctx, span := w.tracer.Start(ctx, "episode", trace.WithAttributes(
		attribute.String("episode_id", req.EpisodeId), attribute.String("env", req.Env),
		attribute.String("policy", req.Policy), attribute.String("profile", a.Plan.GetProfile())))
	defer span.End()

	sess := play.NewSession(w.bus(), w.cfg.SegmentSteps, a, w.cfg.ID)
	sess.Sandboxes = w.sandboxes
	sess.Templates = w.templates
	defer func() {
		if err := sess.Close(); err != nil {
			w.log.Warn("close episode", "episode_id", req.EpisodeId, "err", err)
		}
	}()
	agent, err := w.prepare(ctx, sess)
	if err != nil {
		return w.finish(ctx, sess, sess.Fail(ctx, err))
	}
	obs, err := sess.Reset(attempt)
	if err != nil {
		return err
	}
	turn := env.Turn{Observation: obs}
	lastBeat := time.Now()
	for !sess.Done() {
		if ctx.Err() != nil {
			return play.ErrAbandoned
		}
		if time.Since(lastBeat) > w.cfg.AckWait/3 {
			_ = msg.InProgress()
			lastBeat = time.Now()
		}
		act, err := agent.Act(turn)
		if err != nil {
			return fmt.Errorf("policy %s at step %d: %w", req.GetPolicy(), turn.Step, err)
		}
		st, res, err := sess.Step(ctx, w.scorer, act, nil)
		if err != nil {
			return err
		}
		w.steps.Add(ctx, 1)
		for _, f := range res.Faults {
			w.fired.Add(ctx, 1, w.byKind.Option(f.Kind))
		}
		turn = env.Turn{Step: sess.Steps(), Observation: res.Observation, Reward: st.Score.GetTotal()}
	}
	return w.finish(ctx, sess, sess.Finish(ctx))
}

// prepare builds the episode and its agent; its errors are the request's fault.
func (w *Service) prepare(ctx context.Context, sess *play.Session) (env.Agent, error) {
	e, err := sess.Prepare(ctx)
	if err != nil {
		return nil, err
	}
	p, err := policy.Lookup(sess.Req.Policy)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	agent, err := p.NewAgent(e, rng.Derive(sess.Req.Seed, "policy"))
	if err != nil {
		return nil, fmt.Errorf("policy %s: %w", sess.Req.Policy, err)
	}
	return agent, nil
}

// finish counts the ended episode once its events are all in the stream.
func (w *Service) finish(ctx context.Context, sess *play.Session, err error) error {
	if err != nil {
		return err
	}
	w.episodes.Add(ctx, 1, w.byReason.Option(sess.Ended.Reason.Name()))
	return nil
}
