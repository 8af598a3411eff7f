// Package scheduler is gauntlet's admission and placement service. It takes run
// requests from the GAUNTLET_CMD work queue, asks the faults service for the plans of the
// next episodes, and assigns them to the shared worker queue while each run stays under
// its in-flight cap and the scheduler under its global cap. It follows every run's ended
// events to know what finished, publishes progress for CLIs, and keeps each run's state in
// the gauntlet_runs KV bucket so a restarted scheduler continues where it stopped.
//
// Decisions (Admit) are pure functions of a Snapshot; this file is the plumbing. Leases and
// retries are JetStream's: a worker holds an assignment until it acks (heartbeating with
// InProgress), and an unacked assignment is redelivered after AckWait up to MaxDeliver
// times; one that runs out of deliveries has its unfinished episodes recorded as infra
// errors here (stalledLoop). Assignment is idempotent: an episode's id, seed and message
// id derive from (run, index), so re-assigning after a crash duplicates nothing downstream.
//
// Several instances may run: one leads (it holds a leader lease in KV) and the others
// stand by, taking over within seconds when the leader dies. The leader's run table is
// guarded by one mutex.
package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// LeaseKey is the scheduler's leader lease in bus.BucketLeases.
const LeaseKey = "scheduler"

// instanceID names this scheduler in its lease: host, pid and a random part, so a log
// line tells which process leads.
func instanceID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s/%d/%x", host, os.Getpid(), b)
}

// Consumer names.
const (
	ConsumerRuns    = "scheduler"
	ConsumerEnded   = bus.ConsumerEnded // GAUNTLET_EVENTS keeps what it has not folded in
	ConsumerStalled = "scheduler-stalled"
)

// Config configures the scheduler.
type Config struct {
	// MaxInFlight caps episodes in flight over all runs.
	MaxInFlight uint64
	// AssignBatch caps the episodes assigned in one round for one run.
	AssignBatch uint64
	// EpisodesPerAssignment is how many consecutive episodes of a run go in one
	// assignment message, leased and acked as one (1: one message per episode).
	EpisodesPerAssignment uint64
	// ProgressEvery is how often progress is published.
	ProgressEvery time.Duration
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.MaxInFlight < 1 {
		errs = append(errs, errors.New("scheduler.max-in-flight: must be at least 1"))
	}
	if c.AssignBatch < 1 {
		errs = append(errs, errors.New("scheduler.assign-batch: must be at least 1"))
	}
	if c.EpisodesPerAssignment < 1 {
		errs = append(errs, errors.New("scheduler.episodes-per-assignment: must be at least 1"))
	}
	if c.ProgressEvery <= 0 {
		errs = append(errs, errors.New("scheduler.progress-every: must be positive"))
	}
	return errors.Join(errs...)
}

// Service is the scheduler.
type Service struct {
	cfg Config
	bus func() *bus.Bus
	log *slog.Logger

	kv          jetstream.KeyValue
	runsCons    jetstream.Consumer
	endedCons   jetstream.Consumer
	stalledCons jetstream.Consumer
	wake        chan struct{}

	// instance names this process in the lease; lease is held while it leads, and
	// stopHolding stops its renewal (set when it leads).
	instance    string
	lease       *bus.Lease
	stopHolding func()
	// lost is set from the moment the lease is lost until it is taken again: nothing
	// is persisted meanwhile.
	lost atomic.Bool
	// superseded, set while leading, stops the leader when a run's state in KV turns
	// out to have been written by another instance (persist): see errSuperseded.
	superseded func(error)

	mu        sync.Mutex
	runs      map[string]*run // runs not yet done (the leader's; empty on a standby)
	persistMu sync.Mutex      // serialises writes of run state to KV

	assigned metric.Int64Counter
}

// New allocates the scheduler.
func New(cfg Config, getBus func() *bus.Bus, meter metric.Meter, log *slog.Logger) *Service {
	return &Service{
		cfg: cfg, bus: getBus, log: log,
		instance: instanceID(),
		wake:     make(chan struct{}, 1),
		runs:     map[string]*run{},
		assigned: telemetry.Must(meter.Int64Counter("gauntlet_scheduler_episodes_assigned_total",
			metric.WithDescription("Episodes assigned to workers."))),
	}
}

// Starting binds the KV bucket and consumers and reloads unfinished runs.
func (s *Service) Starting(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	js := s.bus().JS
	kv, err := js.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		return fmt.Errorf("open kv %s: %w", bus.BucketRuns, err)
	}
	s.kv = kv
	s.lease = s.bus().NewLease(LeaseKey, s.instance, s.log)
	if s.runsCons, err = js.CreateOrUpdateConsumer(ctx, bus.StreamCommands, jetstream.ConsumerConfig{
		// A short lease: accepting a run takes a KV read and write, and a request held by
		// a scheduler that was killed waits out the whole lease before another takes it
		// (a curriculum's next batch stood still 30 s after a kill -9). Accepting twice
		// is harmless: the second finds the run in KV and only acknowledges.
		Durable: ConsumerRuns, FilterSubject: bus.SubjectRun,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second,
	}); err != nil {
		return fmt.Errorf("create consumer %s: %w", ConsumerRuns, err)
	}
	// Headers only: an end travels with the episode's last steps, and the scheduler needs
	// only the summary in its header (bus.HeaderEnded), not the steps.
	//
	// The lease on a fetched end is no longer than the leader's: ends a killed leader had
	// fetched but not acknowledged are due again by the time its successor takes over.
	// With 30 s, a new leader saw its runs' in-flight slots full of episodes that had
	// ended and assigned nothing for 30 s. An end delivered twice (a slow persist that
	// outlived the lease) is folded in once: run.record ignores indices it has.
	if s.endedCons, err = js.CreateOrUpdateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{
		Durable: ConsumerEnded, FilterSubject: bus.SubjectEndedAll, HeadersOnly: true,
		AckPolicy: jetstream.AckExplicitPolicy, AckWait: endedAckWait, MaxAckPending: 50_000,
	}); err != nil {
		return fmt.Errorf("create consumer %s: %w", ConsumerEnded, err)
	}
	if s.stalledCons, err = js.CreateOrUpdateConsumer(ctx, bus.StreamStalled, jetstream.ConsumerConfig{
		Durable: ConsumerStalled, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 30 * time.Second,
	}); err != nil {
		return fmt.Errorf("create consumer %s: %w", ConsumerStalled, err)
	}
	return nil
}

// loadRuns reads every unfinished run from KV into a fresh run table: what the leader
// continues from.
func (s *Service) loadRuns(ctx context.Context) error {
	kv := s.kv
	loaded := map[string]*run{}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("list runs: %w", err)
	}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			return fmt.Errorf("load run %s: %w", k, err)
		}
		r, legacy, err := decodeRun(e.Value())
		if err != nil {
			s.log.Error("skipping unreadable run state", "run_id", k, "err", err)
			continue
		}
		if legacy {
			// Written as JSON by an older scheduler: rewritten as a RunState once, only
			// if nobody changed it meanwhile (readers take either form, so a failed
			// rewrite costs nothing but the next attempt).
			r.rev = e.Revision()
			b, err := r.encode()
			var rev uint64
			if err == nil {
				rev, err = kv.Update(ctx, k, b, e.Revision())
			}
			if err != nil {
				s.log.Warn("rewrite a JSON run state as a RunState", "run_id", k, "err", err)
			} else {
				r.rev = rev
			}
		} else {
			r.rev = e.Revision()
		}
		if !r.done() {
			loaded[k] = r
			s.log.Info("resuming run", "run_id", k, "assigned", r.Assigned, "ended", r.Ended.Count())
		}
	}
	s.mu.Lock()
	s.runs = loaded
	s.mu.Unlock()
	return nil
}

// Running leads or stands by until the stop. An instance acts only while it holds the
// scheduler's leader lease (bus.Lease, key LeaseKey): it then loads the unfinished runs
// from KV and runs the five loops (run intake, dispatch, ended tracking, stalled
// assignments and progress). Another instance stands by, trying to take the lease, and
// takes over within about bus.LeaseTTL of the leader's death, from the state the leader
// persisted (ends are acknowledged only once persisted, so none is lost). A leader that
// loses the lease stops its loops at once, drops its run table and stands by again.
func (s *Service) Running(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := s.lease.Acquire(ctx); err != nil {
			return nil // only ctx ends Acquire
		}
		s.lost.Store(false)
		s.log.Info("leading: took the scheduler's leader lease", "instance", s.instance)
		err := s.lead(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if !errors.Is(err, bus.ErrLeaseLost) {
			return err
		}
		s.log.Warn("lost the scheduler's leader lease; standing by", "err", err)
		s.mu.Lock()
		s.runs = map[string]*run{}
		s.mu.Unlock()
	}
	return nil
}

// lead runs the loops while the lease is held. It returns nil at the stop (still holding
// the lease: Stopping persists, then releases it), ErrLeaseLost when the lease is lost,
// or a loop's failure.
func (s *Service) lead(ctx context.Context) error {
	hctx, stopHolding := context.WithCancel(context.WithoutCancel(ctx))
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var holdErr error
	holding := make(chan struct{})
	go func() {
		defer close(holding)
		holdErr = s.lease.Hold(hctx, func() { s.lost.Store(true); cancel(bus.ErrLeaseLost) })
	}()
	s.stopHolding = func() { stopHolding(); <-holding }
	s.mu.Lock()
	s.superseded = func(err error) { s.lost.Store(true); cancel(err) }
	s.mu.Unlock()
	stepDown := func(err error) error {
		cause := context.Cause(lctx)
		if !errors.Is(cause, bus.ErrLeaseLost) {
			return err
		}
		s.stopHolding()
		if holdErr != nil {
			return holdErr
		}
		// Superseded while the lease looked held: give it up, so whoever leads next
		// (this instance again, perhaps) starts from what KV holds now.
		if rerr := s.lease.Release(context.WithoutCancel(ctx)); rerr != nil {
			s.log.Warn("give up the leader lease after being superseded", "err", rerr)
		}
		return cause
	}
	if err := s.loadRuns(lctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return stepDown(err)
	}
	g, gctx := errgroup.WithContext(lctx)
	g.Go(func() error { return s.intakeLoop(gctx) })
	g.Go(func() error { return s.dispatchLoop(gctx) })
	g.Go(func() error { return s.endedLoop(gctx) })
	g.Go(func() error { return s.stalledLoop(gctx) })
	g.Go(func() error { return s.progressLoop(gctx) })
	err := g.Wait()
	// The group's context is cancelled once Wait returns, so the stop is read from ctx:
	// a loop that failed while the scheduler was meant to run is the scheduler's failure.
	if ctx.Err() != nil {
		return nil
	}
	return stepDown(err)
}

// Stopping persists every run's latest state and gives the leader lease up, so a standby
// takes over at once.
func (s *Service) Stopping(ctx context.Context) error {
	if s.kv == nil || !s.lease.Held() {
		if s.stopHolding != nil {
			s.stopHolding()
		}
		return nil
	}
	err := s.persist(ctx, s.activeIDs()...)
	s.stopHolding()
	return errors.Join(err, s.lease.Release(ctx))
}

func (s *Service) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// intakeLoop accepts run requests. A run already known (a redelivered request) is
// acknowledged and otherwise ignored; an invalid run is recorded with its error, so the
// submitter learns why nothing runs.
func (s *Service) intakeLoop(ctx context.Context) error {
	for ctx.Err() == nil {
		// One at a time: a Fetch returns only when it has all n messages or its wait is
		// over, so asking for 16 held a lone run request up to 500 ms (a curriculum's
		// every batch paid it).
		batch, ok := s.fetch(ctx, s.runsCons, 1, 500*time.Millisecond, "run requests")
		if !ok {
			continue
		}
		for m := range batch.Messages() {
			s.accept(ctx, m)
		}
	}
	return nil
}

func (s *Service) accept(ctx context.Context, m jetstream.Msg) {
	spec := &gauntletv1.RunRequested{}
	if err := proto.Unmarshal(m.Data(), spec); err != nil {
		s.log.Error("undecodable run request; dropping it", "err", err)
		_ = m.Term()
		return
	}
	if err := bus.ValidToken("run_id", spec.RunId); err != nil {
		s.log.Error("run request without a usable id; dropping it", "err", err)
		_ = m.Term()
		return
	}
	if _, err := s.kv.Get(ctx, spec.RunId); err == nil {
		_ = m.Ack() // already accepted once
		return
	} else if !errors.Is(err, jetstream.ErrKeyNotFound) {
		_ = m.NakWithDelay(time.Second)
		return
	}
	now := time.Now().UnixNano()
	r := &run{spec: spec, StartedAt: now, UpdatedAt: now, dirty: true}
	r.Spec, _ = proto.Marshal(spec)
	if err := runs.Validate(spec); err != nil {
		r.Error = err.Error()
		s.log.Warn("refused run", "run_id", spec.RunId, "err", err)
	} else {
		s.log.Info("accepted run", "run_id", spec.RunId, "env", spec.Env, "episodes", spec.Episodes,
			"policies", runs.FormatShares(spec.Policies), "max_in_flight", spec.MaxInFlight)
	}
	b, err := r.encode()
	if err == nil {
		r.rev, err = s.kv.Create(ctx, spec.RunId, b)
	}
	if errors.Is(err, jetstream.ErrKeyExists) {
		_ = m.Ack() // accepted by an earlier delivery whose ack was lost
		return
	}
	if err != nil {
		s.log.Warn("persist new run", "run_id", spec.RunId, "err", err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	s.mu.Lock()
	s.runs[spec.RunId] = r
	p := r.progress()
	s.mu.Unlock()
	s.publishProgress(p)
	_ = m.Ack()
	s.poke()
}

// dispatchLoop assigns episodes whenever there is room, checking every 50 ms and whenever
// episodes end.
func (s *Service) dispatchLoop(ctx context.Context) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-s.wake:
		}
		for _, id := range s.activeIDs() {
			if err := s.dispatch(ctx, id); err != nil && ctx.Err() == nil {
				s.log.Warn("dispatch", "run_id", id, "err", err)
			}
		}
	}
}

func (s *Service) activeIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.runs))
	for id := range s.runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

// dispatch assigns the next admissible batch of one run.
func (s *Service) dispatch(ctx context.Context, id string) error {
	s.mu.Lock()
	r, ok := s.runs[id]
	if !ok || r.Error != "" || r.planBackoff > 0 && time.Now().Before(r.planRetryAt) {
		s.mu.Unlock()
		return nil
	}
	var global uint64
	for _, o := range s.runs {
		global += o.Assigned - min(o.Ended.Count(), o.Assigned)
	}
	n := Admit(Snapshot{
		Episodes: r.spec.Episodes, Assigned: r.Assigned, Ended: r.Ended.Count(),
		MaxInFlight: uint64(r.spec.MaxInFlight), GlobalInFlight: global, GlobalMax: s.cfg.MaxInFlight,
		Batch: s.cfg.AssignBatch,
	})
	first, spec := r.Assigned, r.spec
	s.mu.Unlock()
	if n == 0 {
		return nil
	}

	eps := make([]*gauntletv1.EpisodeRequested, n)
	for i := range eps {
		eps[i] = runs.Episode(spec, first+uint64(i))
	}
	// The plans stay encoded: the scheduler only forwards them (PlanReplyPassThrough).
	var plans gauntletv1.PlanReplyPassThrough
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := s.bus().Request(pctx, bus.SubjectPlan, &gauntletv1.PlanRequest{Episodes: eps, Profiles: spec.Profiles, Drift: spec.Drift, CustomProfiles: spec.CustomProfiles}, &plans)
	if err == nil {
		err = errkind.FromReply(plans.Error, plans.ErrorKind)
	}
	if err == nil && len(plans.Plans) != len(eps) {
		err = errkind.E(errkind.Internal, fmt.Errorf("faults service returned %d plans for %d episodes", len(plans.Plans), len(eps)))
	}
	if err != nil {
		return s.planFailed(r, first, n, err)
	}
	s.mu.Lock()
	r.planBackoff = 0
	s.mu.Unlock()
	js := s.bus().JS
	var futures []jetstream.PubAckFuture
	for _, lot := range lots(first, n, s.cfg.EpisodesPerAssignment) {
		a := &gauntletv1.AssignmentPassThrough{Episodes: make([]*gauntletv1.EpisodeAssignedPassThrough, lot.n)}
		for i := range a.Episodes {
			k := lot.first - first + uint64(i)
			a.Episodes[i] = &gauntletv1.EpisodeAssignedPassThrough{Episode: eps[k], Plan: plans.Plans[k]}
		}
		data, err := gauntletv1.Marshal(a)
		if err != nil {
			return fmt.Errorf("marshal assignment of episodes %d..%d: %w", lot.first, lot.first+lot.n-1, err)
		}
		id := assignmentID(a)
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: bus.SubjectEpisode(spec.RunId), Data: data},
			jetstream.WithMsgID(id), jetstream.WithStallWait(10*time.Second))
		if err != nil {
			return fmt.Errorf("assign %s: %w", id, err)
		}
		futures = append(futures, f)
	}
	for _, f := range futures {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			// Nothing is recorded as assigned; the next round re-publishes the batch and
			// the stream drops the ids it already holds.
			return fmt.Errorf("assign: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.assigned.Add(ctx, int64(n))
	s.mu.Lock()
	r.Assigned = first + n
	r.UpdatedAt = time.Now().UnixNano()
	r.dirty = true
	s.mu.Unlock()
	return s.persist(ctx, id)
}

// Backoff of plan requests after the faults service could not plan for now.
const (
	planBackoffFirst = 250 * time.Millisecond
	planBackoffMax   = 10 * time.Second
)

// planFailed handles a failed plan request for episodes [first, first+n) of r. Only an
// invalid run (the faults service cannot plan it as it is) is refused, for good; any
// other failure (the faults service or a bucket it reads unavailable, a broken reply) is
// retried with backoff, so a moment's KV timeout does not end a run.
func (s *Service) planFailed(r *run, first, n uint64, err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if errkind.Is(errkind.Invalid, err) {
		r.Error = "faults service cannot plan this run: " + err.Error()
		r.dirty = true
		return errors.New(r.Error)
	}
	r.planBackoff = min(max(2*r.planBackoff, planBackoffFirst), planBackoffMax)
	r.planRetryAt = time.Now().Add(r.planBackoff)
	return fmt.Errorf("plan episodes %d..%d (%s; again in %v): %w", first, first+n-1, errkind.Of(err), r.planBackoff, err)
}

// lot is a run of consecutive episode indices assigned in one message.
type lot struct{ first, n uint64 }

// lots cuts the indices [first, first+n) into assignments of up to size episodes, cut at
// multiples of size, so a round re-published after a failure (same first, perhaps another
// n) makes the same messages, with the same ids, for the stream to drop; only its last
// lot may differ.
func lots(first, n, size uint64) []lot {
	var out []lot
	for end := first + n; first < end; {
		next := min((first/size+1)*size, end)
		out = append(out, lot{first, next - first})
		first = next
	}
	return out
}

// assignmentID is an assignment's de-duplication id: "<episode_id>/assigned" for one
// episode, "<first_episode_id>..<last_episode_id>/assigned" for a lot.
func assignmentID(a *gauntletv1.AssignmentPassThrough) string {
	eps := a.GetEpisodes()
	id := eps[0].GetEpisode().GetEpisodeId()
	if len(eps) > 1 {
		id += ".." + eps[len(eps)-1].GetEpisode().GetEpisodeId()
	}
	return id + "/assigned"
}

// endsOf reads the ends an event of the headers-only ended consumer carries: from its
// HeaderEnded values (one per end; a batch carries several), or, for an event published
// without them (by an older version), from the stream's copy of the whole message.
func (s *Service) endsOf(ctx context.Context, m jetstream.Msg) ([]*gauntletv1.EndedSummary, error) {
	if hs := m.Headers().Values(bus.HeaderEnded); len(hs) > 0 {
		ends := make([]*gauntletv1.EndedSummary, len(hs))
		for i, h := range hs {
			e, err := bus.DecodeEndedHeader(h)
			if err != nil {
				return nil, err
			}
			ends[i] = e
		}
		return ends, nil
	}
	data := m.Data()
	if len(data) == 0 {
		md, err := m.Metadata()
		if err != nil {
			return nil, fmt.Errorf("no %s header, and no metadata to fetch the event by: %w", bus.HeaderEnded, err)
		}
		stream, err := s.bus().JS.Stream(ctx, bus.StreamEvents)
		if err != nil {
			return nil, fmt.Errorf("no %s header; fetch the event: %w", bus.HeaderEnded, err)
		}
		raw, err := stream.GetMsg(ctx, md.Sequence.Stream)
		if err != nil {
			return nil, fmt.Errorf("no %s header; fetch event %d: %w", bus.HeaderEnded, md.Sequence.Stream, err)
		}
		data = raw.Data
	}
	e, err := decodeEnded(data)
	if err != nil {
		return nil, err
	}
	return []*gauntletv1.EndedSummary{e}, nil
}

// endedView decodes only what counting an episode needs: the steps and the fault plan of
// an ended event (a lone EpisodeEnded or a segment ending an episode) are skipped unread.
var endedView = proto.UnmarshalOptions{DiscardUnknown: true}

// decodeEnded reads the end of an episode from an event on an ended subject.
func decodeEnded(data []byte) (*gauntletv1.EndedSummary, error) {
	var v gauntletv1.EndedView
	if err := endedView.Unmarshal(data, &v); err != nil {
		return nil, err
	}
	e := v.GetEnded()
	if e == nil {
		e = v.GetSteps().GetEnded()
	}
	if e == nil {
		return nil, errors.New("no episode end in the event")
	}
	return e, nil
}

// endedAckWait is how long a fetched end stays with the scheduler that fetched it before
// it is delivered again: the leader lease's TTL (see Starting).
const endedAckWait = bus.LeaseTTL

// endedLoop follows ended events, folds them into their runs, and acknowledges them only
// after the runs' new state is persisted.
func (s *Service) endedLoop(ctx context.Context) error {
	for ctx.Err() == nil {
		batch, ok := s.fetch(ctx, s.endedCons, 2000, 200*time.Millisecond, "ended events")
		if !ok {
			continue
		}
		// Collect first: the batch fills over up to FetchMaxWait, and the run table must
		// not be locked meanwhile.
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		ends := make([]*gauntletv1.EndedSummary, 0, len(msgs))
		for _, m := range msgs {
			es, err := s.endsOf(ctx, m)
			if err != nil {
				s.log.Error("undecodable ended event; skipping it", "subject", m.Subject(), "err", err)
				continue
			}
			ends = append(ends, es...)
		}
		touched := map[string]bool{}
		s.mu.Lock()
		for _, e := range ends {
			if r, ok := s.runs[e.GetEpisode().GetRunId()]; ok {
				r.record(e)
				touched[e.GetEpisode().GetRunId()] = true
			}
		}
		s.mu.Unlock()
		ids := make([]string, 0, len(touched))
		for id := range touched {
			ids = append(ids, id)
		}
		if perr := s.persist(ctx, ids...); perr != nil {
			// Handed back rather than left to their lease, so this leader's next fetch, or
			// a successor's, folds them in within a second; the stop cancels persist
			// too, so a leader stepping down hands back its last batch here.
			if ctx.Err() == nil {
				s.log.Warn("persist runs; ended events handed back", "err", perr)
			}
			for _, m := range msgs {
				_ = m.NakWithDelay(time.Second)
			}
			continue
		}
		for _, m := range msgs {
			_ = m.Ack()
		}
		if len(msgs) > 0 {
			s.poke()
		}
	}
	return nil
}

// stalledLoop records the episodes of assignments that ran out of deliveries. JetStream
// gives up on an assignment after --worker.max-deliver deliveries without an ack; a
// worker that fails an episode records it as an infra error itself on the last one, but
// a worker that dies or hangs on it every time records nothing, and the run would wait
// for those episodes forever. The advisory JetStream publishes then (kept in
// GAUNTLET_STALLED) names the assignment; once the ended events already in the stream are
// folded in (endsCaughtUp), the scheduler publishes an infra-error end for each of its
// episodes not ended yet and deletes the assignment from the work queue.
func (s *Service) stalledLoop(ctx context.Context) error {
	for ctx.Err() == nil {
		batch, ok := s.fetch(ctx, s.stalledCons, 16, time.Second, "stalled assignments")
		if !ok {
			continue
		}
		for m := range batch.Messages() {
			if err := s.stalled(ctx, m.Data()); err != nil {
				if ctx.Err() == nil {
					s.log.Warn("record a stalled assignment; will retry", "err", err)
				}
				_ = m.NakWithDelay(5 * time.Second)
				continue
			}
			_ = m.Ack()
		}
	}
	return nil
}

// maxDeliveriesAdvisory is the part of JetStream's max-deliveries advisory the scheduler
// reads.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// stalled handles one max-deliveries advisory. A nil error means nothing is left to do
// for it (including an advisory that is not readable, or names an assignment already gone).
func (s *Service) stalled(ctx context.Context, advisory []byte) error {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(advisory, &adv); err != nil || adv.Stream != bus.StreamCommands || adv.StreamSeq == 0 {
		s.log.Error("unreadable max-deliveries advisory; dropping it", "advisory", string(advisory), "err", err)
		return nil
	}
	stream, err := s.bus().JS.Stream(ctx, bus.StreamCommands)
	if err != nil {
		return err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil // acked after all, or already handled
	}
	if err != nil {
		return fmt.Errorf("fetch assignment %d: %w", adv.StreamSeq, err)
	}
	var a gauntletv1.Assignment
	if err := gauntletv1.Unmarshal(raw.Data, &a); err != nil {
		s.log.Error("stalled assignment does not decode; deleting it", "seq", adv.StreamSeq, "err", err)
		return s.deleteAssignment(ctx, stream, adv.StreamSeq)
	}
	// A worker may have published the lot's ends and died before its ack: the ends are
	// in the stream, the assignment still runs out of deliveries. Read them first, or
	// their episodes would end twice.
	if err := s.endsCaughtUp(ctx, 10*time.Second); err != nil {
		return err
	}
	why := fmt.Sprintf("assignment delivered %d times without an ack (--worker.max-deliver): its workers stopped or hung on it", adv.Deliveries)
	for _, ep := range a.GetEpisodes() {
		req := ep.GetEpisode()
		ended, known, err := s.hasEnded(ctx, req.GetRunId(), req.GetIndex())
		if err != nil {
			return err
		}
		if ended || !known {
			continue
		}
		s.log.Error("episode stalled on every delivery; recording an infra error", "episode_id", req.GetEpisodeId(), "deliveries", adv.Deliveries)
		end := &gauntletv1.Event{Body: &gauntletv1.Event_Ended{Ended: ep.InfraErrorEnd("scheduler", gauntletv1.InfraKind_INFRA_KIND_GAUNTLET, why, time.Now().UnixNano())}}
		if err := s.bus().PublishEvent(ctx, end); err != nil {
			return err
		}
	}
	return s.deleteAssignment(ctx, stream, adv.StreamSeq)
}

// endsCaughtUp waits, at most wait, until the scheduler has folded in every ended event
// that GAUNTLET_EVENTS held when it was called: its ended consumer has nothing left to
// deliver or acknowledge, or its acknowledgements (sent once a batch's runs are persisted)
// have passed that point of the stream.
func (s *Service) endsCaughtUp(ctx context.Context, wait time.Duration) error {
	events, err := s.bus().JS.Stream(ctx, bus.StreamEvents)
	if err != nil {
		return err
	}
	si, err := events.Info(ctx)
	if err != nil {
		return fmt.Errorf("read %s: %w", bus.StreamEvents, err)
	}
	last := si.State.LastSeq
	deadline := time.Now().Add(wait)
	for {
		ci, err := s.endedCons.Info(ctx)
		if err != nil {
			return fmt.Errorf("read consumer %s: %w", ConsumerEnded, err)
		}
		if ci.NumPending == 0 && ci.NumAckPending == 0 || ci.AckFloor.Stream >= last {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ended events up to %s sequence %d not folded in yet (acknowledged up to %d, %d not delivered)", bus.StreamEvents, last, ci.AckFloor.Stream, ci.NumPending)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *Service) deleteAssignment(ctx context.Context, stream jetstream.Stream, seq uint64) error {
	if err := stream.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete stalled assignment %d: %w", seq, err)
	}
	return nil
}

// hasEnded reports whether episode index of a run has ended, from the run table or, for
// a run no longer in it, from its state in KV; known is false for a run the scheduler
// has no record of (its episodes are then left alone).
func (s *Service) hasEnded(ctx context.Context, runID string, index uint64) (ended, known bool, err error) {
	s.mu.Lock()
	r, ok := s.runs[runID]
	if ok {
		ended = r.Ended.Has(index)
	}
	s.mu.Unlock()
	if ok {
		return ended, true, nil
	}
	e, err := s.kv.Get(ctx, runID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, false, nil
	}
	if err != nil {
		return false, false, fmt.Errorf("load run %s: %w", runID, err)
	}
	r, _, err = decodeRun(e.Value())
	if err != nil {
		return false, false, nil
	}
	return r.Ended.Has(index), true, nil
}

// progressLoop publishes the progress of changed runs and retires finished ones.
func (s *Service) progressLoop(ctx context.Context) error {
	tick := time.NewTicker(s.cfg.ProgressEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		s.mu.Lock()
		var changed []*gauntletv1.RunProgress
		var finished []string
		for id, r := range s.runs {
			if !r.dirty {
				continue
			}
			r.dirty = false
			r.UpdatedAt = time.Now().UnixNano()
			changed = append(changed, r.progress())
			if r.done() {
				finished = append(finished, id)
			}
		}
		s.mu.Unlock()
		if len(finished) > 0 && s.persist(ctx, finished...) == nil {
			s.mu.Lock()
			for _, id := range finished {
				r := s.runs[id]
				delete(s.runs, id)
				s.log.Info("run done", "run_id", id, "ended", r.Ended.Count(), "succeeded", r.Succeeded, "error", r.Error)
			}
			s.mu.Unlock()
		}
		for _, p := range changed {
			s.publishProgress(p)
		}
	}
}

func (s *Service) publishProgress(p *gauntletv1.RunProgress) {
	data, err := proto.Marshal(p)
	if err != nil {
		return
	}
	_ = s.bus().NC.Publish(bus.SubjectProgress(p.RunId), data)
}

// persist writes the current state of the given runs to KV. Writers take persistMu for
// the whole encode-and-put, so a later state is never overwritten by an earlier one, and
// s.mu only for the encoding, so no loop waits on KV while holding the run table.
func (s *Service) persist(ctx context.Context, ids ...string) error {
	s.persistMu.Lock()
	defer s.persistMu.Unlock()
	states := make([][]byte, len(ids))
	runs := make([]*run, len(ids))
	revs := make([]uint64, len(ids))
	s.mu.Lock()
	for i, id := range ids {
		r, ok := s.runs[id]
		if !ok {
			continue
		}
		b, err := r.encode()
		if err != nil {
			s.mu.Unlock()
			return fmt.Errorf("encode run %s: %w", id, err)
		}
		states[i], runs[i], revs[i] = b, r, r.rev
	}
	s.mu.Unlock()
	for i, id := range ids {
		if states[i] == nil {
			continue
		}
		// A leader that lost its lease must not overwrite what the new one wrote.
		if s.lost.Load() {
			return fmt.Errorf("persist run %s: %w", id, bus.ErrLeaseLost)
		}
		// Revision-checked: the lease fences by time, and a leader paused past it
		// (a stopped process, a long GC) may write once more before it learns it lost
		// the lease. Whichever of the two writes second finds the revision moved and
		// steps down, so neither overwrites ends the other had folded in and acked.
		rev, err := s.kv.Update(ctx, id, states[i], revs[i])
		if isWrongRevision(err) {
			err = fmt.Errorf("%w: run %s", errSuperseded, id)
			s.mu.Lock()
			stop := s.superseded
			s.mu.Unlock()
			if stop != nil {
				stop(err)
			}
			s.lost.Store(true)
		}
		if err != nil {
			return fmt.Errorf("persist run %s: %w", id, err)
		}
		s.mu.Lock()
		runs[i].rev = rev
		s.mu.Unlock()
	}
	return nil
}

// errSuperseded is persist's error when a run's state in KV is not the revision this
// instance last read or wrote: another instance led meanwhile. It wraps ErrLeaseLost, so
// the leader steps down as on a lost lease.
var errSuperseded = fmt.Errorf("%w: another scheduler wrote a run's state", bus.ErrLeaseLost)

// isWrongRevision tells whether a revision-checked KV write was refused because the key
// is at another revision.
func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// fetch pulls up to n messages, waiting at most wait; on a failure it logs, pauses a
// second and reports false, so the caller's loop tries again (or ends with ctx).
func (s *Service) fetch(ctx context.Context, cons jetstream.Consumer, n int, wait time.Duration, what string) (jetstream.MessageBatch, bool) {
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(wait))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("fetch "+what, "err", err)
			sleep(ctx, time.Second)
		}
		return nil, false
	}
	return batch, true
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
