// Package store is the trajectory store: it projects every event of
// GAUNTLET_EVENTS into ClickHouse, in large batches, and acknowledges events only after
// ClickHouse has them. Acknowledged events then leave the stream (bus.TrimEvents keeps a
// sized recent history), so ClickHouse is where trajectories stay; deleting the store's
// consumer re-projects only what that history still holds.
//
// Exactness: inserts are idempotent (ReplacingMergeTree keyed by episode and step, see
// pkg/trajectory), so a crash between insert and ack, or a re-run episode, duplicates
// nothing that FINAL or the *_final views show. While ClickHouse is unreachable the store
// keeps its batch, retries with backoff and holds its lease on the events (InProgress), so
// nothing is lost and nothing piles up in memory beyond one batch in flight and one filling.
//
// After each batch the store publishes what it has written, as a fact others wait on: a
// StoreProgress in the gauntlet_store KV bucket whose written_seq is the consumer's ack
// floor, the GAUNTLET_EVENTS sequence up to which every event is in ClickHouse (or was
// undecodable and terminated). A run's waiter (`gauntlet run`, demo, tests, the loadtest
// harness) compares it with the stream's last sequence once the run is done, instead of
// reading the store's consumer itself.
//
// Run and curriculum metadata (the runs and curriculum_stages tables) come from KV
// buckets instead of the stream: the scheduler's run state (gauntlet_runs, with the run's
// spec and origin) and the stages curricula close (gauntlet_curricula). The store watches
// both and writes their rows about once a second (a running run's at most every ten
// seconds); a restarted store rewrites every row from the buckets' current values (meta.go).
//
// One reader goroutine fills batches, one writer goroutine inserts them; several store
// instances may share the consumer (each then publishes the shared ack floor).
package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/templates"
	"github.com/gauntlet-rl/gauntlet/pkg/rewardspecs"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ConsumerName is the durable consumer of the store; GAUNTLET_EVENTS keeps what it has
// not acknowledged (bus.TrimEvents).
const ConsumerName = bus.ConsumerStore

// Config configures the store.
type Config struct {
	// Addr returns ClickHouse's native address (host:port) once known; for a replicated
	// ClickHouse, the replicas' addresses, comma-separated: the store writes to the first
	// that answers and fails over to the next (docs/architecture.md, Replicated
	// ClickHouse).
	Addr     func() string
	Database string
	// BatchRows is the most step and episode rows (trajectory.RowsOf) inserted at once; a
	// batch closes at the first event that reaches it.
	BatchRows int
	// FlushEvery bounds how long an event waits in a partial batch. Large batches are
	// cheap for ClickHouse: every insert makes a part per table, and the server merges
	// small parts again and again in the background (docs/benchmarks.md, Costs the code
	// cites, Trajectory store: long store batches).
	FlushEvery time.Duration
	// IdleFlush writes a partial batch as soon as no event has arrived for this long, so
	// the tail of a run (or a trickle) does not wait FlushEvery. 0 disables it.
	IdleFlush time.Duration
	// AckWait is the lease on delivered events; it is renewed while ClickHouse is down.
	AckWait time.Duration
}

// Validate reports every problem at once.
func (c Config) Validate() error {
	var errs []error
	if c.Database == "" {
		errs = append(errs, errors.New("store.database: must not be empty"))
	}
	if c.BatchRows < 1 {
		errs = append(errs, fmt.Errorf("store.batch-rows: %d must be at least 1", c.BatchRows))
	}
	if c.FlushEvery <= 0 {
		errs = append(errs, errors.New("store.flush-every: must be positive"))
	}
	if c.IdleFlush < 0 {
		errs = append(errs, fmt.Errorf("store.idle-flush: %v must not be negative", c.IdleFlush))
	}
	if c.AckWait < 10*time.Second {
		errs = append(errs, fmt.Errorf("store.ack-wait: %v must be at least 10s", c.AckWait))
	}
	return errors.Join(errs...)
}

// Service is the trajectory store.
type Service struct {
	cfg    Config
	bus    func() *bus.Bus
	log    *slog.Logger
	conn   driver.Conn
	writer *trajectory.Writer
	cons   jetstream.Consumer
	// progress is the gauntlet_store bucket (nil on a stack without it).
	progress jetstream.KeyValue

	events   metric.Int64Counter
	batches  metric.Int64Counter
	failures metric.Int64Counter
	latency  metric.Float64Histogram
	lag      metric.Float64Histogram

	// crashAt, set only by tests, is called at the write path's two crash points
	// (beforeInsert, beforeAck) with the batch's size; when it returns true the store
	// behaves as a process killed there: the batch is neither written further nor acked.
	crashAt func(p crashPoint, events int) bool
}

// crashPoint names a place in the write path where a crash must lose nothing.
type crashPoint int

const (
	beforeInsert crashPoint = iota // a batch is read, nothing of it is in ClickHouse
	beforeAck                      // the batch is in ClickHouse, none of it acknowledged
)

// New allocates the store.
func New(cfg Config, getBus func() *bus.Bus, meter metric.Meter, log *slog.Logger) *Service {
	return &Service{
		cfg: cfg, bus: getBus, log: log,
		events:   telemetry.Must(meter.Int64Counter("gauntlet_store_events_written_total", metric.WithDescription("Events projected into ClickHouse."))),
		batches:  telemetry.Must(meter.Int64Counter("gauntlet_store_batches_total", metric.WithDescription("Batches inserted."))),
		failures: telemetry.Must(meter.Int64Counter("gauntlet_store_insert_failures_total", metric.WithDescription("Failed insert attempts (retried)."))),
		latency: telemetry.Must(meter.Float64Histogram("gauntlet_store_insert_seconds", metric.WithDescription("Insert time per batch."),
			metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10))),
		lag: telemetry.Must(meter.Float64Histogram("gauntlet_store_lag_seconds",
			metric.WithDescription("Per batch, from its oldest event entering the events stream to the batch being in ClickHouse."),
			metric.WithExplicitBucketBoundaries(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300))),
	}
}

// Starting connects to ClickHouse, migrates the schema and binds the consumer.
func (s *Service) Starting(ctx context.Context) error {
	if err := s.cfg.Validate(); err != nil {
		return err
	}
	addr := s.cfg.Addr()
	conn, err := trajectory.Connect(ctx, addr, s.cfg.Database)
	if err != nil {
		return fmt.Errorf("connect to clickhouse %s: %w", addr, err)
	}
	s.conn = conn
	if err := s.migrate(ctx, addr); err != nil {
		return fmt.Errorf("migrate clickhouse schema: %w", err)
	}
	// Compact plans of user-defined profiles name templates, recorded once each.
	s.writer = trajectory.NewWriter(conn, s.cfg.Database).WithTemplates(templates.NewClient(s.bus().JS)).
		WithRewardSpecs(rewardspecs.NewClient(s.bus().JS))
	s.cons, err = s.bus().JS.CreateOrUpdateConsumer(ctx, bus.StreamEvents, jetstream.ConsumerConfig{
		Durable:       ConsumerName,
		Description:   "the ClickHouse projection",
		FilterSubject: bus.SubjectEventsAll,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       s.cfg.AckWait,
		// Every event carries at least one row, so the batch filling, the one queued and
		// the one being written always fit.
		MaxAckPending: 3 * s.cfg.BatchRows,
	})
	if err != nil {
		return fmt.Errorf("create consumer %s: %w", ConsumerName, err)
	}
	if s.progress, err = s.bus().StoreBucket(ctx); err != nil {
		return err
	}
	// What an earlier run of the store wrote is already a fact: a waiter need not wait
	// for the first batch to learn it.
	s.publishWritten(ctx, s.cons.CachedInfo())
	return nil
}

// migrate brings the schema up to date: on the server, or on every replica when addr
// lists several (tables and views are each replica's own, so every replica is
// migrated, not only the one written to).
func (s *Service) migrate(ctx context.Context, addr string) error {
	if addrs := trajectory.SplitAddrs(addr); len(addrs) > 1 {
		return trajectory.MigrateReplicas(ctx, addrs, s.cfg.Database, s.log)
	}
	return trajectory.Migrate(ctx, s.conn, s.cfg.Database)
}

// schemaMissing reports whether err is a server's refusal for want of a table, a column
// or the database: a replica that was down while the store migrated the others.
func schemaMissing(err error) bool {
	var ex *clickhouse.Exception
	return errors.As(err, &ex) && (ex.Code == codeNoSuchColumn || ex.Code == codeUnknownTable || ex.Code == codeUnknownDatabase)
}

// ClickHouse's error codes for what schemaMissing looks for.
const (
	codeNoSuchColumn    = 16
	codeUnknownTable    = 60
	codeUnknownDatabase = 81
)

// publishWritten publishes the consumer's ack floor as the store's StoreProgress (ci: the
// consumer's info, read again when nil). A failure is logged: the next batch publishes
// again, and waiters count in ClickHouse now and then whatever the fact says.
func (s *Service) publishWritten(ctx context.Context, ci *jetstream.ConsumerInfo) {
	if s.progress == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if ci == nil {
		var err error
		if ci, err = s.cons.Info(ctx); err != nil {
			s.log.Warn("read the store's consumer to publish what is written", "err", err)
			return
		}
	}
	if err := bus.PutStoreProgress(ctx, s.progress, ci.AckFloor.Stream); err != nil {
		s.log.Warn("publish what the store has written", "err", err)
	}
}

// batch is a set of delivered events inserted and acknowledged together. Its events stay
// encoded (in msgs) until the writer takes the batch: decoded, a batch of whole episodes
// takes about three times the memory, and only the batch being written needs that.
type batch struct {
	msgs []jetstream.Msg
	rows int
}

// Running pipelines reading and writing until ctx ends, then writes what it holds.
func (s *Service) Running(ctx context.Context) error {
	// The client buffers up to this many delivered messages ahead of the reader; an event
	// may carry a whole episode, so a few thousand are seconds of traffic.
	msgs := make(chan jetstream.Msg, 1024)
	go func() {
		defer close(msgs)
		bus.Pull(ctx, s.cons, s.log, func(m jetstream.Msg) { msgs <- m },
			jetstream.PullMaxMessages(min(s.cfg.BatchRows, 4_000)))
	}()

	metaDone := make(chan struct{})
	go func() {
		defer close(metaDone)
		s.projectMeta(ctx)
	}()
	defer func() { <-metaDone }()

	full := make(chan *batch, 1)
	writeDone := make(chan struct{})
	go func() {
		defer close(writeDone)
		for b := range full {
			s.write(ctx, b)
		}
	}()

	cur := &batch{}
	timer := time.NewTimer(s.cfg.FlushEvery)
	defer timer.Stop()
	flush := func() {
		if len(cur.msgs) > 0 {
			full <- cur
			cur = &batch{}
		}
		timer.Reset(s.cfg.FlushEvery)
	}
	// The idle check runs on a ticker rather than a timer reset per event: at tens of
	// thousands of events a second, one check every half idle period is cheaper.
	var idle <-chan time.Time
	if s.cfg.IdleFlush > 0 {
		tick := time.NewTicker(max(s.cfg.IdleFlush/2, time.Millisecond))
		defer tick.Stop()
		idle = tick.C
	}
	var last time.Time // when the last event arrived
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				flush()
				close(full)
				<-writeDone
				return nil
			}
			rows, err := trajectory.EncodedRows(m.Data())
			if err != nil {
				s.log.Error("undecodable event; terminating it", "subject", m.Subject(), "err", err)
				_ = m.Term()
				continue
			}
			last = time.Now()
			cur.msgs = append(cur.msgs, m)
			cur.rows += rows
			if cur.rows >= s.cfg.BatchRows {
				flush()
			}
		case <-timer.C:
			flush()
		case <-idle:
			if len(cur.msgs) > 0 && time.Since(last) >= s.cfg.IdleFlush {
				flush()
			}
		}
	}
}

// decode decodes a batch's events, terminating (and dropping from the batch) any that
// passed the reader's wire check but do not decode.
func (s *Service) decode(b *batch) []*gauntletv1.Event {
	events := make([]*gauntletv1.Event, 0, len(b.msgs))
	kept := b.msgs[:0]
	for _, m := range b.msgs {
		ev := &gauntletv1.Event{}
		// The event's strings share the message's memory: the batch holds its messages
		// until their rows are written and acknowledged. Its steps come in blocks, a
		// handful of allocations per event instead of five per step.
		if err := gauntletv1.UnmarshalStepsInBlocks(m.Data(), ev); err != nil {
			s.log.Error("undecodable event; terminating it", "subject", m.Subject(), "err", err)
			_ = m.Term()
			continue
		}
		kept = append(kept, m)
		events = append(events, ev)
	}
	b.msgs = kept
	return events
}

// write decodes and inserts a batch, retrying until it succeeds or the store stops, then
// acks it.
func (s *Service) write(ctx context.Context, b *batch) {
	events := s.decode(b)
	if s.crashAt != nil && s.crashAt(beforeInsert, len(b.msgs)) {
		return
	}
	backoff := 250 * time.Millisecond
	lastBeat := time.Now()
	for attempt := 1; ; attempt++ {
		// A stopping store still gets a bounded chance to write what it holds.
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		t0 := time.Now()
		c, err := s.writer.Write(wctx, events)
		cancel()
		if err == nil {
			s.latency.Record(ctx, time.Since(t0).Seconds())
			// The batch's first event is its oldest: the consumer delivers in order.
			if len(b.msgs) > 0 {
				if md, err := b.msgs[0].Metadata(); err == nil {
					s.lag.Record(ctx, time.Since(md.Timestamp).Seconds())
				}
			}
			if c.Invalid > 0 || c.Unscored > 0 {
				s.log.Warn("batch written with events it could not project whole", "events", len(b.msgs),
					"skipped_invalid", c.Invalid, "steps_without_reward_vector", c.Unscored, "first_reward_error", c.UnscoredErr)
			}
			break
		}
		s.failures.Add(ctx, 1)
		if ctx.Err() != nil {
			s.log.Warn("store stopping with an unwritten batch; its events will be redelivered", "events", len(b.msgs), "err", err)
			return
		}
		s.log.Warn("insert failed; retrying", "attempt", attempt, "events", len(b.msgs), "backoff", backoff, "err", err)
		if len(trajectory.SplitAddrs(s.cfg.Addr())) > 1 && schemaMissing(err) {
			// The replica written to missed a migration while it was down.
			mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			if err := s.migrate(mctx, s.cfg.Addr()); err != nil {
				s.log.Warn("migrate the replicas again", "err", err)
			}
			mcancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
		if time.Since(lastBeat) > s.cfg.AckWait/3 {
			for _, m := range b.msgs {
				_ = m.InProgress()
			}
			lastBeat = time.Now()
		}
	}
	if s.crashAt != nil && s.crashAt(beforeAck, len(b.msgs)) {
		return
	}
	if last := len(b.msgs) - 1; last >= 0 {
		for _, m := range b.msgs[:last] {
			_ = m.Ack()
		}
		// The server confirms the last ack after processing it, and it processes one
		// connection's acks in order: once confirmed, the consumer's ack floor includes
		// the whole batch, and is what the store has written.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		if err := b.msgs[last].DoubleAck(actx); err != nil {
			s.log.Warn("confirm the ack of a written batch", "err", err)
		}
		cancel()
	}
	s.publishWritten(ctx, nil)
	s.events.Add(ctx, int64(len(b.msgs)))
	s.batches.Add(ctx, 1)
}

// Stopping closes the ClickHouse connection.
func (s *Service) Stopping(context.Context) error {
	if s.conn == nil {
		return nil
	}
	return s.conn.Close()
}
