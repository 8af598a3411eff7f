package bus

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// StreamConfig sizes the streams.
type StreamConfig struct {
	// EventsMaxAge is how long events stay replayable from the stream (ClickHouse keeps
	// them longer).
	EventsMaxAge time.Duration
	// EventsMaxBytes caps the events stream; when full, publishes fail (back-pressure)
	// rather than old, maybe unprojected events being dropped.
	EventsMaxBytes int64
	// EventsHistoryBytes is how much of what every required consumer has processed
	// may stay in the events stream as replayable history.
	EventsHistoryBytes int64
	// DuplicateWindow is how long message ids are remembered. The server keeps every id of
	// the window in memory, so at 100k events/s a long window costs gigabytes.
	DuplicateWindow time.Duration
	// Replicas for clustered NATS (1 for the embedded server).
	Replicas int
}

// DefaultStreamConfig suits one machine.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{
		EventsMaxAge:       24 * time.Hour,
		EventsMaxBytes:     32 << 30,
		EventsHistoryBytes: 1 << 30,
		DuplicateWindow:    30 * time.Second,
		Replicas:           1,
	}
}

// Bus is a NATS connection with JetStream.
type Bus struct {
	NC  *nats.Conn
	JS  jetstream.JetStream
	log *slog.Logger

	// full is set while publishes wait for room, so a wait is logged once (and at most
	// once a minute, fullWarned being when, in Unix nanoseconds).
	full       atomic.Bool
	fullWarned atomic.Int64
	// refusedFull counts tries refused for lack of room; waiting, publishes waiting now.
	refusedFull, waiting atomic.Int64
}

// Connect opens a connection. url may be empty when opts include an in-process option.
func Connect(url, name string, log *slog.Logger, opts ...nats.Option) (*Bus, error) {
	all := append([]nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(64 << 20),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("nats reconnected", "url", c.ConnectedUrl()) }),
		nats.ErrorHandler(func(_ *nats.Conn, s *nats.Subscription, err error) {
			subj := ""
			if s != nil {
				subj = s.Subject
			}
			log.Error("nats async error", "subject", subj, "err", err)
		}),
	}, opts...)
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, all...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", url, err)
	}
	js, err := jetstream.New(nc,
		jetstream.WithPublishAsyncMaxPending(8192),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
	)
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream context: %w", err)
	}
	if mp := nc.MaxPayload(); mp < MaxPayload {
		log.Warn("the nats server's max_payload is under what gauntlet's events need: a step with large values (each recorded up to 1 MiB) may not be recordable; set max_payload to 8MB",
			"max_payload", mp, "want", MaxPayload)
	}
	return &Bus{NC: nc, JS: js, log: log}, nil
}

// MaxPayload is the payload limit of the embedded server, and the least a server given
// with --nats should have: a step of values at their recorded limit (1 MiB each, three of
// them) with trainer data, its episode's start and end, fits one message under it.
const MaxPayload = 8 << 20

// Close drains the connection: subscriptions finish what they hold, pending publishes are
// flushed, then the connection closes.
func (b *Bus) Close() error {
	if b == nil || b.NC == nil {
		return nil
	}
	if err := b.NC.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		b.NC.Close()
		return fmt.Errorf("drain nats connection: %w", err)
	}
	for i := 0; i < 200 && !b.NC.IsClosed(); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	b.NC.Close()
	return nil
}

// EnsureStreams creates or updates gauntlet's streams and KV buckets; safe to call from
// every process at start.
func (b *Bus) EnsureStreams(ctx context.Context, cfg StreamConfig) error {
	if cfg.Replicas < 1 {
		cfg.Replicas = 1
	}
	streams := []jetstream.StreamConfig{{
		Name:        StreamCommands,
		Description: "gauntlet commands: runs for the scheduler, episodes for workers",
		Subjects:    []string{"gauntlet.cmd.>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  2 * time.Minute,
		Discard:     jetstream.DiscardNew,
	}, {
		Name:        StreamEvents,
		Description: "gauntlet events: the source of truth ClickHouse projects",
		Subjects:    []string{"gauntlet.ev.>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      cfg.EventsMaxAge,
		MaxBytes:    cfg.EventsMaxBytes,
		Duplicates:  cfg.DuplicateWindow,
		Discard:     jetstream.DiscardNew,
	}, {
		Name:        StreamStalled,
		Description: "assignments that ran out of deliveries (JetStream advisories), for the scheduler",
		Subjects:    []string{SubjectAssignmentsStalled},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      7 * 24 * time.Hour,
	}}
	for _, sc := range streams {
		if err := b.createStream(ctx, sc); err != nil {
			return err
		}
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketRuns,
			Description: "scheduler run state",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketRuns, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketDrift,
			Description: "global fault drift; every revision kept as the change record",
			History:     64, // JetStream's maximum
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketDrift, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketPlanTemplates,
			Description: "templates of user-defined profiles' fault plans, by id (pkg/faults/templates)",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketPlanTemplates, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketRewardSpecs,
			Description: "reward spec files runs name, by digest (pkg/rewardspecs)",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketRewardSpecs, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketStore,
			Description: "what the store has written to ClickHouse (StoreProgress)",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketStore, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketCurricula,
			Description: "closed curriculum stages (StageTransition), projected by the store",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketCurricula, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketLeases,
			Description: "leader leases of singleton roles (the scheduler), expiring unless renewed",
			History:     1,
			TTL:         LeaseTTL,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketLeases, err)
	}
	if err := b.apiRetry(ctx, func(ctx context.Context) error {
		_, err := b.JS.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      BucketThreats,
			Description: "threat fingerprints of dangerous behaviour sandboxes recorded, by id (pkg/threats)",
			History:     1,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
		})
		return err
	}); err != nil {
		return fmt.Errorf("create kv bucket %s: %w", BucketThreats, err)
	}
	return nil
}

// errStorageResourcesExceeded is the JetStream API error of a stream whose MaxBytes the
// server cannot reserve (nats-server's JSStorageResourcesExceededErr).
const errStorageResourcesExceeded jetstream.ErrorCode = 10047

// errClusterNoPeers is a clustered JetStream's refusal to place a stream
// (JSClusterNoPeersErrF); with "insufficient storage" in its description, no node can
// reserve the stream's MaxBytes, as 10047 says of a single server.
const errClusterNoPeers jetstream.ErrorCode = 10005

// storageRefused tells whether err refuses a stream's MaxBytes for lack of room, on a
// single server or on every peer of a cluster.
func storageRefused(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == errStorageResourcesExceeded ||
		apiErr.ErrorCode == errClusterNoPeers && strings.Contains(apiErr.Description, "insufficient storage")
}

// minStreamBytes is the smallest MaxBytes createStream halves a stream down to.
const minStreamBytes = 16 << 20

// createStream creates or updates sc. A stream's MaxBytes is reserved out of JetStream's
// storage, and an embedded server may store 75 % of the disk's free space at its start:
// with less than about 46 GB free, the events stream's default 32 GiB cannot be reserved
// and the stream would not be created at all. So a MaxBytes the server refuses is halved
// until it fits (down to minStreamBytes), then halved once more, so the capped stream
// leaves half of what was free to the other streams and buckets; a warning names both
// sizes.
func (b *Bus) createStream(ctx context.Context, sc jetstream.StreamConfig) error {
	want := sc.MaxBytes
	for {
		err := b.apiRetry(ctx, func(ctx context.Context) error {
			_, err := b.JS.CreateOrUpdateStream(ctx, sc)
			return err
		})
		refused := storageRefused(err)
		switch {
		case refused && sc.MaxBytes/2 >= minStreamBytes:
			sc.MaxBytes /= 2
			continue
		case err != nil:
			return fmt.Errorf("create stream %s (max_bytes %d): %w", sc.Name, sc.MaxBytes, err)
		case sc.MaxBytes == want:
			return nil
		}
		sc.MaxBytes = max(sc.MaxBytes/2, minStreamBytes)
		if err := b.apiRetry(ctx, func(ctx context.Context) error {
			_, err := b.JS.UpdateStream(ctx, sc)
			return err
		}); err != nil {
			return fmt.Errorf("cap stream %s at max_bytes %d: %w", sc.Name, sc.MaxBytes, err)
		}
		b.log.Warn("stream capped below its configured size: JetStream cannot reserve more on this disk",
			"stream", sc.Name, "max_bytes", sc.MaxBytes, "configured_max_bytes", want)
		return nil
	}
}

// apiAttemptTimeout bounds one JetStream API request of EnsureStreams. A clustered
// JetStream leaves unanswered all but one of several requests creating the same stream
// at once (every process of a split deployment creates the streams at its start, and pods
// start together), so a request is asked again rather than waited for: the stream then
// exists and the retry answers at once.
const apiAttemptTimeout = 3 * time.Second

// errStreamNameInUse is the refusal to create a stream another process has just created
// (JSStreamNameExistErr): asked again, create-or-update finds it and updates it.
const errStreamNameInUse jetstream.ErrorCode = 10058

// placementWait bounds how long a clustered JetStream's "peer offline" refusal to place a
// stream is asked again. A server counts a peer only once it has had the peer's first
// statistics message (sent 250 ms after the peer starts, then at growing intervals), so a
// cluster that has just started, or a new meta leader, refuses placements on peers it has
// not heard from yet for a second or two. A peer that is really down stays refused, and
// the error is returned once this runs out.
const placementWait = 30 * time.Second

// peerNotHeardFrom tells whether err is a clustered JetStream's refusal to place a stream
// because a peer it needs counts as offline.
func peerNotHeardFrom(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == errClusterNoPeers &&
		strings.Contains(apiErr.Description, "peer offline")
}

// apiRetry calls req with a context bounded by apiAttemptTimeout until it answers (with
// success or an API error) or ctx ends; an attempt that timed out, or lost a race to
// create the same stream, is retried, and so, for up to placementWait, is a placement
// refused for a peer the cluster has not heard from yet.
func (b *Bus) apiRetry(ctx context.Context, req func(ctx context.Context) error) error {
	backoff := 50 * time.Millisecond
	var offlineSince time.Time
	for {
		actx, cancel := context.WithTimeout(ctx, apiAttemptTimeout)
		err := req(actx)
		cancel()
		var apiErr *jetstream.APIError
		again := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
			errors.As(err, &apiErr) && apiErr.ErrorCode == errStreamNameInUse
		if peerNotHeardFrom(err) {
			if offlineSince.IsZero() {
				offlineSince = time.Now()
			}
			again = time.Since(offlineSince) < placementWait
		}
		if err == nil || !again || ctx.Err() != nil {
			return err
		}
		b.log.Debug("jetstream api request unanswered; asking again", "err", err)
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// EventSubject returns where an event goes (its kind and run) and its de-duplication id
// (its episode, step and kind).
func EventSubject(ev *gauntletv1.Event) (subject, msgID string, err error) {
	switch b := ev.Body.(type) {
	case *gauntletv1.Event_Started:
		e := b.Started.GetEpisode()
		return SubjectEvent(KindStarted, e.GetRunId()), e.GetEpisodeId() + "/started", nil
	case *gauntletv1.Event_Step:
		s := b.Step
		return SubjectEvent(KindStep, s.GetRunId()), s.GetEpisodeId() + "/" + strconv.FormatUint(uint64(s.GetStep()), 10) + "/step", nil
	case *gauntletv1.Event_Steps:
		return segmentSubject(b.Steps)
	case *gauntletv1.Event_Ended:
		e := b.Ended.GetEpisode()
		return SubjectEvent(KindEnded, e.GetRunId()), e.GetEpisodeId() + "/ended", nil
	case *gauntletv1.Event_Batch:
		return batchSubject(b.Batch)
	}
	return "", "", fmt.Errorf("event has no body")
}

// batchSubject places a batch of one run's events: on the ended subject when any of them
// carries an episode's end, on the steps subject otherwise. Its id joins the first and
// last events' ids, so a re-published batch is a duplicate and a batch with other
// contents is not.
func batchSubject(b *gauntletv1.EventBatch) (subject, msgID string, err error) {
	evs := b.GetEvents()
	if len(evs) == 0 {
		return "", "", errors.New("event batch: no events")
	}
	var run, first, last string
	ended := false
	for i, ev := range evs {
		if _, nested := ev.GetBody().(*gauntletv1.Event_Batch); nested {
			return "", "", fmt.Errorf("event batch: event %d is itself a batch", i)
		}
		subj, id, err := EventSubject(ev)
		if err != nil {
			return "", "", fmt.Errorf("event batch: event %d: %w", i, err)
		}
		r := subj[strings.LastIndexByte(subj, '.')+1:]
		if i == 0 {
			run, first = r, id
		} else if r != run {
			return "", "", fmt.Errorf("event batch: event %d is of run %q, the batch's first of %q", i, r, run)
		}
		last = id
		ended = ended || ev.EpisodeEnd() != nil
	}
	kind := KindSteps
	if ended {
		kind = KindEnded
	}
	return SubjectEvent(kind, run), first + ".." + last, nil
}

// segmentSubject places an episode segment: on the ended subject when it carries the
// episode's end (the scheduler follows only those), on the steps subject otherwise.
func segmentSubject(seg *gauntletv1.StepsTaken) (subject, msgID string, err error) {
	steps, ended := seg.GetSteps(), seg.GetEnded()
	if len(steps) == 0 {
		if ended == nil {
			return "", "", errors.New("steps event without steps or an end")
		}
		e := ended.GetEpisode()
		return SubjectEvent(KindEnded, e.GetRunId()), e.GetEpisodeId() + "/ended", nil
	}
	first, last := steps[0], steps[len(steps)-1]
	id := first.GetEpisodeId() + "/steps/" + strconv.FormatUint(uint64(first.GetStep()), 10) + "-" + strconv.FormatUint(uint64(last.GetStep()), 10)
	if ended != nil {
		return SubjectEvent(KindEnded, first.GetRunId()), id + "/ended", nil
	}
	return SubjectEvent(KindSteps, first.GetRunId()), id, nil
}

// HeaderEnded is the header of an event that carries an episode's end: the end's
// EndedSummary, protobuf in unpadded base64; a batch has one value per end it carries, in
// order. The scheduler's consumer of ended events is headers-only, so it counts ends
// without receiving the steps the message carries.
const HeaderEnded = "Gauntlet-Ended"

// eventMsg encodes an event as the message that publishes it, with its de-duplication id.
func eventMsg(ev *gauntletv1.Event) (*nats.Msg, string, error) { return encodedEventMsg(ev, nil) }

// encodedEventMsg is eventMsg for an event already encoded as data (nil: encode it here).
func encodedEventMsg(ev *gauntletv1.Event, data []byte) (*nats.Msg, string, error) {
	subj, id, err := EventSubject(ev)
	if err != nil {
		return nil, "", err
	}
	if data == nil {
		if data, err = gauntletv1.Marshal(ev); err != nil {
			return nil, "", fmt.Errorf("marshal event %s: %w", id, err)
		}
	}
	m := &nats.Msg{Subject: subj, Data: data}
	for _, ev := range ev.Events() {
		e := ev.EpisodeEnd()
		if e == nil {
			continue
		}
		sum, err := EndedHeader(e)
		if err != nil {
			return nil, "", fmt.Errorf("event %s: %w", id, err)
		}
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		m.Header[HeaderEnded] = append(m.Header[HeaderEnded], sum)
	}
	return m, id, nil
}

// EndedHeader is the HeaderEnded value for an episode's end.
func EndedHeader(e *gauntletv1.EpisodeEnded) (string, error) {
	req := e.GetEpisode()
	b, err := gauntletv1.Marshal(&gauntletv1.EndedSummary{
		Episode: &gauntletv1.EpisodeRef{EpisodeId: req.GetEpisodeId(), RunId: req.GetRunId(), Index: req.GetIndex()},
		Steps:   e.GetSteps(), InfraError: e.GetInfraError(), Success: e.GetSuccess(),
		TotalReward: e.GetTotalReward(), FaultsFired: e.GetFaultsFired(), InfraKind: e.GetInfraKind(),
	})
	if err != nil {
		return "", fmt.Errorf("encode ended summary: %w", err)
	}
	return base64.RawStdEncoding.EncodeToString(b), nil
}

// DecodeEndedHeader reads a HeaderEnded value back.
func DecodeEndedHeader(v string) (*gauntletv1.EndedSummary, error) {
	b, err := base64.RawStdEncoding.DecodeString(v)
	if err != nil {
		return nil, fmt.Errorf("header %s: %w", HeaderEnded, err)
	}
	var sum gauntletv1.EndedSummary
	if err := gauntletv1.Unmarshal(b, &sum); err != nil {
		return nil, fmt.Errorf("header %s: %w", HeaderEnded, err)
	}
	return &sum, nil
}

// PublishEventAsync publishes an event to GAUNTLET_EVENTS without waiting for the ack. It
// waits (up to stall) when too many publishes are pending rather than failing at once.
func (b *Bus) PublishEventAsync(ev *gauntletv1.Event, stall time.Duration) (jetstream.PubAckFuture, error) {
	m, id, err := eventMsg(ev)
	if err != nil {
		return nil, err
	}
	f, err := b.JS.PublishMsgAsync(m, jetstream.WithMsgID(id), jetstream.WithStallWait(stall))
	if err != nil {
		return nil, fmt.Errorf("publish %s: %w", id, err)
	}
	return f, nil
}

// Patience says how a publish waits out failures. Whatever it says, a publish refused
// for lack of room (IsFull) is retried until ctx ends, however long that is: that is
// back-pressure, which slows the producer, not a failure to report.
type Patience struct {
	// Other bounds how long other failures (NATS unreachable, a timed-out ack) are
	// retried; 0 retries them until ctx ends.
	Other time.Duration
	// Waiting, if set, is called before each wait for room: a caller whose lease is not
	// renewed by a timer of its own (a durable episode's activity heartbeat) renews it
	// here.
	Waiting func()
	// Duplicate, if set, is called when the stream acknowledges the message as one it
	// holds already (the same message id, within its de-duplication window), with the
	// sequence of the copy it keeps: a caller that published the message before, from
	// another execution, may read that copy back.
	Duplicate func(seq uint64)
}

// PublishEvent publishes an event and waits for the stream's ack, retrying transient
// failures until ctx ends. The message id makes retries safe.
func (b *Bus) PublishEvent(ctx context.Context, ev *gauntletv1.Event) error {
	return b.PublishEventWith(ctx, ev, Patience{})
}

// PublishEventWith is PublishEvent retrying as p says.
func (b *Bus) PublishEventWith(ctx context.Context, ev *gauntletv1.Event, p Patience) error {
	m, id, err := eventMsg(ev)
	if err != nil {
		return err
	}
	return b.publishRetry(ctx, m, id, p)
}

// PublishEncodedEvent is PublishEvent for an event already encoded: data must be the
// encoding of ev (gauntletv1.Marshal, or gauntletv1.AppendBatch of its events' encodings),
// which gives the subject, id and headers. A worker encodes each episode's last segment
// when the episode ends, while its messages are fresh in the cache, and publishes its
// assignment's batch without walking them again.
func (b *Bus) PublishEncodedEvent(ctx context.Context, ev *gauntletv1.Event, data []byte) error {
	return b.PublishEncodedEventWith(ctx, ev, data, Patience{})
}

// PublishEncodedEventWith is PublishEncodedEvent retrying as p says.
func (b *Bus) PublishEncodedEventWith(ctx context.Context, ev *gauntletv1.Event, data []byte, p Patience) error {
	if data == nil {
		return errors.New("publish encoded event: no data")
	}
	m, id, err := encodedEventMsg(ev, data)
	if err != nil {
		return err
	}
	return b.publishRetry(ctx, m, id, p)
}

// PublishCommand publishes a command message (run or episode assignment) and waits for
// its ack, retrying until ctx ends.
func (b *Bus) PublishCommand(ctx context.Context, subject, msgID string, m proto.Message) error {
	data, err := gauntletv1.Marshal(m)
	if err != nil {
		return fmt.Errorf("marshal command %s: %w", msgID, err)
	}
	return b.publishRetry(ctx, &nats.Msg{Subject: subject, Data: data}, msgID, Patience{})
}

// fullBackoffMax bounds the wait between two tries of a publish refused for lack of room:
// room usually returns within a trim (a second) once the store has caught up.
const fullBackoffMax = time.Second

// publishRetry publishes m and waits for its ack, retrying as p says. Waits for room are
// logged once per connection until a publish succeeds again (at most once a minute: a
// stream kept near full by a slow store fills again every trim), and counted (Stalls).
func (b *Bus) publishRetry(ctx context.Context, m *nats.Msg, id string, p Patience) error {
	backoff := 50 * time.Millisecond
	var failingSince time.Time // of failures other than a full stream
	waited := false
	for {
		ack, err := b.JS.PublishMsg(ctx, m, jetstream.WithMsgID(id))
		if err == nil {
			if waited {
				b.waiting.Add(-1)
				if b.full.CompareAndSwap(true, false) {
					b.log.Debug("a stream has room again; publishes resumed")
				}
			}
			if ack != nil && ack.Duplicate && p.Duplicate != nil {
				p.Duplicate(ack.Sequence)
			}
			return nil
		}
		full := IsFull(err)
		if ctx.Err() != nil {
			if waited {
				b.waiting.Add(-1)
			}
			return fmt.Errorf("publish %s: %w (last error: %v)", id, ctx.Err(), err)
		}
		switch {
		case full:
			failingSince = time.Time{}
			b.refusedFull.Add(1)
			if !waited {
				waited = true
				b.waiting.Add(1)
			}
			if now := time.Now().UnixNano(); b.full.CompareAndSwap(false, true) && now-b.fullWarned.Load() >= int64(time.Minute) {
				b.fullWarned.Store(now)
				b.log.Warn("a stream is full: publishes wait (back-pressure) until the store catches up or disk space returns; logged at most once a minute",
					"subject", m.Subject, "err", err, "refused_so_far", b.refusedFull.Load())
			}
			if p.Waiting != nil {
				p.Waiting()
			}
			backoff = min(backoff, fullBackoffMax)
		default:
			now := time.Now()
			if failingSince.IsZero() {
				failingSince = now
			}
			if p.Other > 0 && now.Sub(failingSince) >= p.Other {
				if waited {
					b.waiting.Add(-1)
				}
				return fmt.Errorf("publish %s: failing for %v: %w", id, p.Other, err)
			}
			b.log.Warn("publish failed; retrying", "msg_id", id, "err", err, "backoff", backoff)
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if full {
			backoff = min(2*backoff, fullBackoffMax)
		} else {
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// Stalls reports the publishes of this connection refused for lack of room (each try
// counts) and how many publishes are waiting for room now.
func (b *Bus) Stalls() (refused, waiting int64) {
	return b.refusedFull.Load(), b.waiting.Load()
}

// requestAttemptTimeout bounds one try of a core request; a service that takes longer is
// considered lost and the request is sent again.
const requestAttemptTimeout = 10 * time.Second

// Request sends a protobuf request over core NATS and decodes the reply into out,
// retrying while no responder is there yet (a service still starting) until ctx ends.
// out's strings and bytes share the reply's memory (the client gives every message its
// own buffer, so nothing overwrites it): a worker scores every step this way, and
// copying the names of each step's reward components was a measurable share of it.
// A request that got no reply (ctx ended first, or NATS failed) is errkind.Unavailable;
// a reply that does not decode is errkind.Internal.
func (b *Bus) Request(ctx context.Context, subject string, in, out proto.Message) error {
	data, err := gauntletv1.Marshal(in)
	if err != nil {
		return fmt.Errorf("marshal request to %s: %w", subject, err)
	}
	backoff := 20 * time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, requestAttemptTimeout)
		msg, err := b.NC.RequestWithContext(attempt, subject, data)
		cancel()
		if err == nil {
			if err := gauntletv1.UnmarshalAliasing(msg.Data, out); err != nil {
				return errkind.E(errkind.Internal, fmt.Errorf("decode reply from %s: %w", subject, err))
			}
			return nil
		}
		if ctx.Err() != nil {
			return errkind.E(errkind.Unavailable, fmt.Errorf("request %s: %w (last error: %v)", subject, ctx.Err(), err))
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return errkind.E(errkind.Unavailable, fmt.Errorf("request %s: %w", subject, err))
		}
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}
