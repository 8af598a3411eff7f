// Package worker is the sandbox worker: it pulls assignments (lots of consecutive
// episodes of a run) from the GAUNTLET_CMD work queue, runs each episode in its sandbox
// (in-process sim envs, or a real sandbox from Config.Sandboxes for envs such
// as codefix), asks the reward service to score every step, and publishes the episodes'
// events (started, every step, ended) to GAUNTLET_EVENTS.
//
// Delivery contract: an assignment is acked only after every event of its episodes has
// been acked by the stream. The last segment of each episode (its end, and for a short
// episode all of it) is held until the assignment's last episode ends, and the lot's last
// segments go out as one EventBatch: one stream message, one store delivery and one
// scheduler delivery per assignment rather than per episode. A worker that dies
// mid-assignment leaves it unacked, so JetStream redelivers it (to any worker) after
// AckWait; its episodes re-run from their seeds and, being deterministic, republish the
// same events, which the stream and the store de-duplicate. While any episode of an
// assignment is waiting, running (in the middle of a step too: a slow model call, a long
// command) or being settled, a timer renews its lease with InProgress every third of
// AckWait, so an episode runs at most once at a time however long its steps take; a step
// is bounded by its own limits (the policy's timeout, the sandbox's command timeout), and
// a worker process that dies stops renewing. An episode that fails has its whole assignment
// retried (the others re-run harmlessly) until the last delivery, when the failed
// episodes are recorded as infra errors beside the others' events. On stop, episodes in
// flight are abandoned and their assignments nak'ed for immediate redelivery.
//
// Each step takes the shared step path of pkg/play, the same as a trainer's step over the
// env API, so a trajectory looks the same whoever chose its actions.
//
// Concurrency: Config.Concurrency episode goroutines share one consumer and one scorer;
// each episode's env, agent and injector belong to its goroutine alone; an assignment's
// bookkeeping (lot) is shared by its episodes under its mutex.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
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
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
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
	// ScoreRequests caps the score requests in flight at once. Fewer requests carry more
	// steps each: with 256 episodes running, 2 rather than 4 cut the CPU of the score round
	// trips (scorer, NATS and reward service) by about a tenth (docs/benchmarks.md).
	ScoreRequests int
	// AckWait is the lease on an assignment; a worker silent for this long loses it.
	AckWait time.Duration
	// MaxDeliver is how many times an assignment is tried before the episode is recorded
	// as an infra error.
	MaxDeliver int
	// SegmentSteps is how many steps of an episode go in one StepsTaken event; an episode
	// also flushes its pending steps when it ends and when a second has passed.
	SegmentSteps int
	// Sandboxes lends real sandboxes to envs that need them (codefix): the process's
	// sandbox runtime, opened once for every module that plays episodes. Nil, or a nil
	// result, means this process runs none; such envs' episodes then fail with
	// env.ErrNoSandbox.
	Sandboxes func() env.Sandboxes
	// Policies are the policies the worker plays with their configuration (the "http"
	// policy's endpoint); nil is the registered policies alone.
	Policies *policy.Set
	// Datasets are the task datasets episodes may play, by name (--tasks.datasets, set by
	// the process); nil: none.
	Datasets map[string]string
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
	if c.ScoreRequests < 1 {
		errs = append(errs, fmt.Errorf("worker.score-requests: %d must be at least 1", c.ScoreRequests))
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
	// sandboxes is nil when no sandbox runtime is configured.
	sandboxes env.Sandboxes
	// templates finds the templates of user-defined profiles' compact plans.
	templates *templates.Client
	// threats are the threat fingerprints, watched while the worker runs.
	threats *threats.Watcher
	meter   metric.Meter

	steps    metric.Int64Counter
	episodes metric.Int64Counter
	fired    metric.Int64Counter
	cut      metric.Int64Counter
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
		cfg: cfg, bus: getBus, log: log.With("worker_id", cfg.ID), meter: m,
		tracer:   tel.Tracer("gauntlet/worker"),
		scorer:   play.NewScorer(getRPC, cfg.ScoreBatch, max(cfg.ScoreRequests, 1), m, "gauntlet_worker"),
		steps:    telemetry.Must(m.Int64Counter("gauntlet_worker_steps_total", metric.WithDescription("Steps run."))),
		episodes: telemetry.Must(m.Int64Counter("gauntlet_worker_episodes_total", metric.WithDescription("Episodes finished, by reason."))),
		fired:    telemetry.Must(m.Int64Counter("gauntlet_worker_faults_fired_total", metric.WithDescription("Faults fired, by kind."))),
		cut:      telemetry.Must(m.Int64Counter("gauntlet_worker_recorded_bytes_cut_total", metric.WithDescription("Bytes of actions, observations and diffs left out of the recording, each value being held to play.MaxFieldBytes."))),
		active:   telemetry.Must(m.Int64UpDownCounter("gauntlet_worker_active_episodes", metric.WithDescription("Episodes running now."))),
		byKind:   telemetry.NewLabel("kind"),
		byReason: telemetry.NewLabel("reason"),
	}
}

// ID is the worker's id.
func (w *Service) ID() string { return w.cfg.ID }

// Starting takes the sandboxes of the process's runtime, if any, and creates (or binds to) the
// shared work-queue consumer.
func (w *Service) Starting(ctx context.Context) error {
	if err := w.cfg.Validate(); err != nil {
		return err
	}
	if w.cfg.Sandboxes != nil {
		w.sandboxes = w.cfg.Sandboxes()
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
		return fmt.Errorf("create consumer %s: %w", ConsumerName, err)
	}
	w.cons = cons
	w.templates = templates.NewClient(w.bus().JS)
	w.threats = threats.NewWatcher(w.bus().JS, w.meter, "gauntlet_worker", w.log)
	return w.threats.Start(ctx)
}

// Running pulls assignments and runs their episodes until ctx ends.
func (w *Service) Running(ctx context.Context) error {
	go w.scorer.Run(ctx)
	go w.threats.Run(ctx)
	work := make(chan job)
	done := make(chan struct{})
	for i := 0; i < w.cfg.Concurrency; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for j := range work {
				w.run(ctx, j)
			}
		}()
	}
	w.pull(ctx, work)
	close(work)
	for i := 0; i < w.cfg.Concurrency; i++ {
		<-done
	}
	return nil
}

// pull fetches assignments, up to a handful at a time, and leases each the moment it
// arrives (receive); a second goroutine hands the leased lots' episodes to the episode
// goroutines, in order, and the next fetch waits until it has taken what the last one
// brought. So no assignment waits in the client unleased while every episode goroutine
// is busy: with the pull iterator's prefetch, assignments buffered behind episodes that
// wait for room in the events stream (back-pressure lasts as long as ClickHouse is down)
// ran out their lease, then their deliveries, and became false infra errors. At most two
// fetches' worth of lots are leased and not yet started.
func (w *Service) pull(ctx context.Context, work chan<- job) {
	const maxPause = 5 * time.Second
	prefetch := max(2, w.cfg.Concurrency/8)
	lots := make(chan []*lot)
	started := make(chan struct{})
	go func() {
		defer close(started)
		for ls := range lots {
			for _, l := range ls {
				w.start(ctx, l, work)
			}
		}
	}()
	var pending []*lot
	pause := 100 * time.Millisecond
	failing := false
	for ctx.Err() == nil {
		batch, err := w.cons.Fetch(prefetch, jetstream.FetchMaxWait(time.Second))
		if err == nil {
			for msg := range batch.Messages() {
				l := w.receive(msg)
				if l == nil {
					continue
				}
				pending = append(pending, l)
				select { // started at once when the starter is free
				case lots <- pending:
					pending = nil
				default:
				}
			}
			err = batch.Error()
		}
		if len(pending) > 0 {
			select {
			case lots <- pending:
				pending = nil
			case <-ctx.Done():
			}
		}
		if err == nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrNoMessages) || ctx.Err() != nil {
			pause, failing = 100*time.Millisecond, false
			continue
		}
		if !failing {
			failing = true
			w.log.Error("fetch assignments failed; retrying", "consumer", ConsumerName, "err", err, "pause", pause)
		}
		select {
		case <-ctx.Done():
		case <-time.After(pause):
		}
		pause = min(2*pause, maxPause)
	}
	close(lots)
	<-started
	for _, l := range pending { // leased as the worker stopped: given back
		w.start(ctx, l, work)
	}
}

// Stopping has nothing to release: Running returned after its episodes did, and they
// gave their sandboxes back to the runtime, which its opener closes.
func (w *Service) Stopping(context.Context) error { return nil }

// job is one episode of an assignment, for an episode goroutine to run.
type job struct {
	lot *lot
	i   int
}

// lot is an assignment being run: its episodes' outcomes, filled in as they end.
type lot struct {
	msg     jetstream.Msg
	a       *gauntletv1.Assignment
	attempt uint32

	mu      sync.Mutex
	left    int
	held    []*gauntletv1.Event // each episode's last segment, held for the batch
	encoded [][]byte            // and its encoding
	errs    []error
	// lease renews the assignment every renewEvery until released; released says the
	// lot is being acked or given back, so the lease is no longer renewed.
	lease      *time.Timer
	renewEvery time.Duration
	released   bool
}

// holdLease renews the assignment's lease every every, from a timer rather than from the
// steps: a step may outlast the lease, and a timer per lot costs nothing per step.
func (l *lot) holdLease(every time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewEvery = every
	l.lease = time.AfterFunc(every, l.renew)
}

// renew renews the lease once and sets the timer for the next renewal.
func (l *lot) renew() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return
	}
	_ = l.msg.InProgress()
	l.lease.Reset(l.renewEvery)
}

// release stops renewing the lease, before the assignment is acked or given back: a
// renewal after a nak would hold back its redelivery.
func (l *lot) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = true
	l.lease.Stop()
}

// end records episode i's outcome and reports whether it was the lot's last.
func (l *lot) end(i int, held *gauntletv1.Event, encoded []byte, err error) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held[i], l.encoded[i], l.errs[i] = held, encoded, err
	l.left--
	return l.left == 0
}

// receive decodes an assignment and starts holding its lease (until it is settled); nil
// for an undecodable one, terminated.
func (w *Service) receive(msg jetstream.Msg) *lot {
	var a gauntletv1.Assignment
	err := gauntletv1.Unmarshal(msg.Data(), &a)
	if err == nil && len(a.Episodes) == 0 {
		err = errors.New("no episodes")
	}
	for i, e := range a.Episodes {
		if err == nil && e.GetEpisode() == nil {
			err = fmt.Errorf("episodes[%d]: no episode", i)
		}
	}
	if err != nil {
		w.log.Error("undecodable assignment; terminating it", "subject", msg.Subject(), "err", err)
		_ = msg.Term()
		return nil
	}
	attempt := uint64(1)
	if md, err := msg.Metadata(); err == nil {
		attempt = md.NumDelivered
	}
	l := &lot{msg: msg, a: &a, attempt: uint32(attempt), left: len(a.Episodes),
		held: make([]*gauntletv1.Event, len(a.Episodes)), encoded: make([][]byte, len(a.Episodes)),
		errs: make([]error, len(a.Episodes))}
	l.holdLease(w.cfg.AckWait / 3)
	return l
}

// start hands a leased lot's episodes to the episode goroutines, waiting for free ones.
// Once ctx has ended, the episodes not started are abandoned, so the assignment goes
// back (nak) once its started episodes have stopped.
func (w *Service) start(ctx context.Context, l *lot, work chan<- job) {
	for i := range l.a.Episodes {
		if ctx.Err() == nil {
			select {
			case work <- job{l, i}:
				continue
			case <-ctx.Done():
			}
		}
		for ; i < len(l.a.Episodes); i++ {
			if l.end(i, nil, nil, play.ErrAbandoned) {
				w.settle(ctx, l)
			}
		}
		return
	}
}

// run plays one episode of a lot and encodes its last segment while the episode's
// messages are still in the cache (walking them again when the lot settles, cold, cost as
// much as encoding them); the lot's last episode settles it.
func (w *Service) run(ctx context.Context, j job) {
	w.active.Add(ctx, 1)
	held, err := w.play(ctx, j.lot, j.lot.a.Episodes[j.i])
	w.active.Add(ctx, -1)
	var encoded []byte
	switch {
	case err != nil:
	case held == nil:
		err = errors.New("episode ended without its last segment") // never expected
	default:
		if encoded, err = gauntletv1.Marshal(held); err != nil {
			err = fmt.Errorf("encode the last segment: %w", err)
		}
	}
	if j.lot.end(j.i, held, encoded, err) {
		w.settle(ctx, j.lot)
	}
}

// settle acks, retries or finishes an assignment whose episodes have all ended: every
// episode played, their held segments are published as one batch and the assignment is
// acked; an episode failed, the assignment is retried, or on its last delivery the
// failures are recorded as infra errors with the others' events.
func (w *Service) settle(ctx context.Context, l *lot) {
	var (
		events  []*gauntletv1.Event
		encoded [][]byte
		size    int
	)
	failed := 0
	for i, err := range l.errs {
		ep := l.a.Episodes[i]
		switch {
		case err == nil:
			events, encoded = append(events, l.held[i]), append(encoded, l.encoded[i])
			size += len(l.encoded[i])
			continue
		case ctx.Err() != nil || errors.Is(err, play.ErrAbandoned):
			l.release()
			_ = l.msg.Nak()
			return
		}
		failed++
		if l.attempt < uint32(w.cfg.MaxDeliver) {
			w.log.Warn("episode failed; will retry its assignment", "episode_id", ep.Episode.EpisodeId, "attempt", l.attempt, "err", err)
			continue
		}
		w.log.Error("episode failed on its last attempt; recording an infra error", "episode_id", ep.Episode.EpisodeId, "err", err)
		infra := &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: ep.InfraErrorEnd(w.cfg.ID, play.InfraKind(err), err.Error(), time.Now().UnixNano())}}
		data, merr := gauntletv1.Marshal(infra)
		if merr != nil {
			w.log.Error("encode an infra error end; the assignment will be retried", "episode_id", ep.Episode.EpisodeId, "err", merr)
			l.release()
			_ = l.msg.Nak()
			return
		}
		events, encoded = append(events, infra), append(encoded, data)
		size += len(data)
	}
	if failed > 0 && l.attempt < uint32(w.cfg.MaxDeliver) {
		l.release()
		_ = l.msg.NakWithDelay(time.Duration(l.attempt) * time.Second)
		return
	}
	err := w.publishBatches(ctx, events, encoded, size)
	l.release() // held while publishing: back-pressure may make that slow
	if err != nil {
		w.log.Warn("publish an assignment's events; it will be retried", "err", err)
		_ = l.msg.Nak()
		return
	}
	for _, ev := range events {
		w.episodes.Add(ctx, 1, w.byReason.Option(ev.EpisodeEnd().GetReason().Name()))
	}
	_ = l.msg.Ack()
}

// publishPatience is how a worker publishes an assignment's batch: failures are given
// up on after 30 s (the assignment is then given back and retried), but a stream without
// room is waited out for as long as it lasts, the lease renewed meanwhile, so
// back-pressure slows the worker instead of turning its episodes into infra errors.
var publishPatience = bus.Patience{Other: 30 * time.Second}

// publishBatches publishes an assignment's last segments (encoded, size bytes in all) as
// one batch, or, when that would be over the stream's payload limit, as consecutive
// batches under it; a segment that fits only alone goes alone. The cut depends only on
// the segments, so a retried assignment publishes the same messages (the same ids,
// which the stream deduplicates).
func (w *Service) publishBatches(ctx context.Context, events []*gauntletv1.Event, encoded [][]byte, size int) error {
	b := w.bus()
	// Room for the batch's envelope (a few bytes an event) and the message's headers.
	room := int(b.NC.MaxPayload()) - 64<<10
	if size+16+6*len(encoded) <= room { // the usual case: the whole assignment at once
		room = size + 16 + 6*len(encoded)
	}
	for first := 0; first < len(events); {
		last, n := first+1, len(encoded[first])+6
		for last < len(events) && n+len(encoded[last])+6 <= room-16 {
			n += len(encoded[last]) + 6
			last++
		}
		ev, data := events[first], encoded[first]
		if last-first > 1 {
			ev = &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{Events: events[first:last]}}}
			data = gauntletv1.AppendBatch(make([]byte, 0, n+16), encoded[first:last])
		}
		if err := b.PublishEncodedEventWith(ctx, ev, data, publishPatience); err != nil {
			return err
		}
		first = last
	}
	return nil
}

// play runs one episode to its end through the shared step path (pkg/play), publishing
// its events but the last segment, which it returns for the assignment's batch. A nil
// error means every other event is in the stream. Problems with the request itself
// (unknown env, bad params, a policy that cannot play the env) are not errors: the episode
// ends at once with the reason recorded.
func (w *Service) play(ctx context.Context, l *lot, a *gauntletv1.EpisodeAssigned) (*gauntletv1.Event, error) {
	req := a.Episode
	ctx, span := w.tracer.Start(ctx, "episode", trace.WithAttributes(
		attribute.String("episode_id", req.EpisodeId), attribute.String("env", req.Env),
		attribute.String("policy", req.Policy), attribute.String("profile", a.Plan.GetProfile())))
	defer span.End()

	out := &episodeOut{Publisher: play.Publisher{Bus: w.bus(), Max: w.cfg.SegmentSteps, Hold: true}}
	sess := play.NewSession(a, w.cfg.ID, w.scorer, out)
	defer func() {
		if err := sess.Close(); err != nil {
			w.log.Warn("close episode", "episode_id", req.EpisodeId, "err", err)
		}
	}()
	agent, err := w.prepare(ctx, sess)
	if err != nil {
		ferr := sess.Fail(ctx, err) // before reading Held, which Fail sets
		return out.Held, ferr
	}
	obs, err := sess.Reset(ctx, l.attempt)
	if err != nil {
		return nil, err
	}
	// Counted by out and added once at the end: a counter add per step and per fault cost a
	// worker CPU (docs/benchmarks.md, Costs the code cites, Telemetry and the worker), and
	// /metrics is read every few seconds at most.
	defer func() {
		w.steps.Add(ctx, out.steps)
		if cut := sess.CutBytes(); cut > 0 {
			w.cut.Add(ctx, int64(cut))
		}
		for _, f := range out.fired {
			w.fired.Add(ctx, f.n, w.byKind.Option(f.kind))
		}
	}()
	if err := sess.Run(ctx, agent, env.Turn{Observation: obs}); err != nil {
		return nil, err
	}
	if err := sess.Finish(ctx); err != nil {
		return nil, err
	}
	return out.Held, nil
}

// episodeOut is the output of a worker's episode: its segments are published (the last
// held for the assignment's batch), and steps and faults are counted for the metrics.
// The lot's lease is renewed by its own timer, not here.
type episodeOut struct {
	play.Publisher
	steps int64
	fired []kindCount
}

// Step publishes one step (play.Output).
func (o *episodeOut) Step(ctx context.Context, st *gauntletv1.StepTaken) error {
	if err := o.Publisher.Step(ctx, st); err != nil {
		return err
	}
	o.steps++
	for _, f := range st.Faults {
		o.fired = countKind(o.fired, f.Kind)
	}
	return nil
}

// kindCount is how many faults of one kind an episode met.
type kindCount struct {
	kind string
	n    int64
}

// countKind counts one more fault of kind in counts (a handful of kinds: a slice, no map).
func countKind(counts []kindCount, kind string) []kindCount {
	for i := range counts {
		if counts[i].kind == kind {
			counts[i].n++
			return counts
		}
	}
	return append(counts, kindCount{kind, 1})
}

// prepare builds the episode and its agent; its errors are the request's fault.
func (w *Service) prepare(ctx context.Context, sess *play.Session) (env.Agent, error) {
	deps := play.Deps{Sandboxes: w.sandboxes, Templates: w.templates, Policies: w.cfg.Policies, Datasets: w.cfg.Datasets, Threats: w.threats}
	e, err := sess.Prepare(ctx, deps)
	if err != nil {
		return nil, err
	}
	return deps.NewAgent(e, sess.Req)
}
