package threats

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
)

// recordQueue bounds the fingerprints waiting to be published; past it Record drops them
// (counted): a sandbox under a storm of attacks must not slow its steps.
const recordQueue = 256

// Watcher knows the fingerprints of the bucket and publishes new ones. Start it before
// the process plays episodes (it loads every known fingerprint), run it while it does.
type Watcher struct {
	js  jetstream.JetStream
	log *slog.Logger

	set atomic.Pointer[Set] // nil while no fingerprint is known
	// queued are the keys recorded and not yet seen back from the bucket, so that a
	// command repeated before its fingerprint comes back is published once.
	mu     sync.Mutex
	queued map[uint64]bool
	pub    chan *Fingerprint

	kv      jetstream.KeyValue
	watch   jetstream.KeyWatcher
	stop    context.CancelFunc
	learned chan struct{} // closed and replaced on every update, for WaitFor

	propagation metric.Float64Histogram
	dropped     metric.Int64Counter
}

// NewWatcher allocates a watcher of the bucket of js; its metrics are named after prefix
// (e.g. "gauntlet_worker").
func NewWatcher(js jetstream.JetStream, meter metric.Meter, prefix string, log *slog.Logger) *Watcher {
	return &Watcher{
		js: js, log: log, queued: make(map[uint64]bool), pub: make(chan *Fingerprint, recordQueue),
		learned: make(chan struct{}),
		propagation: telemetry.Must(meter.Float64Histogram(prefix+"_threat_propagation_seconds",
			metric.WithDescription("From a threat fingerprint's publication by the process that recorded it to this process knowing it."),
			metric.WithExplicitBucketBoundaries(0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 1))),
		dropped: telemetry.Must(meter.Int64Counter(prefix+"_threat_records_dropped_total",
			metric.WithDescription("Threat fingerprints not published because the queue was full."))),
	}
}

// Start opens the bucket and loads every fingerprint it holds, so that the first episode
// already meets them. ctx bounds the loading; the watch itself lasts until Run's context
// ends (or Stop).
func (w *Watcher) Start(ctx context.Context) error {
	kv, err := w.js.KeyValue(ctx, bus.BucketThreats)
	if err != nil {
		return fmt.Errorf("threat fingerprints: open kv bucket %s: %w", bus.BucketThreats, err)
	}
	wctx, stop := context.WithCancel(context.Background())
	watch, err := kv.WatchAll(wctx)
	if err != nil {
		stop()
		return fmt.Errorf("threat fingerprints: watch %s: %w", bus.BucketThreats, err)
	}
	w.kv, w.watch, w.stop = kv, watch, stop
	initial := map[uint64]*Fingerprint{}
	for {
		select {
		case e, ok := <-watch.Updates():
			if !ok {
				stop()
				return fmt.Errorf("threat fingerprints: watch of %s closed while loading", bus.BucketThreats)
			}
			if e == nil { // every value held when the watch began has come
				w.set.Store(newSet(initial))
				return nil
			}
			if f, k, ok := w.decode(e); ok {
				initial[k] = f
			}
		case <-ctx.Done():
			stop()
			return fmt.Errorf("threat fingerprints: load %s: %w", bus.BucketThreats, ctx.Err())
		}
	}
}

// Run applies the bucket's updates and publishes what Record queued, until ctx ends.
func (w *Watcher) Run(ctx context.Context) {
	defer w.stop()
	go w.publish(ctx)
	for {
		select {
		case e, ok := <-w.watch.Updates():
			if !ok {
				return
			}
			if e != nil {
				w.apply(e)
			}
		case <-ctx.Done():
			return
		}
	}
}

// Stop ends the watch (Run returns); for a watcher started and never run.
func (w *Watcher) Stop() {
	if w.stop != nil {
		w.stop()
	}
}

// Set is the fingerprints known now; nil while there are none. It never changes: a
// later update makes a new one.
func (w *Watcher) Set() *Set { return w.set.Load() }

// Match returns the known fingerprint an action matches, or nil. While no fingerprint is
// known it is an atomic load and a nil test, with no allocation.
func (w *Watcher) Match(tool string, args []byte) *Fingerprint {
	return w.set.Load().Match(tool, args)
}

// Record queues f for publication, unless it is known or queued already. It never
// blocks: when the queue is full f is dropped (counted); the same command recorded again
// later is queued then.
func (w *Watcher) Record(f *Fingerprint) {
	k, err := strconv.ParseUint(f.ID, 16, 64)
	if err != nil || w.set.Load().Has(k) {
		return
	}
	w.mu.Lock()
	if w.queued[k] {
		w.mu.Unlock()
		return
	}
	select {
	case w.pub <- f:
		w.queued[k] = true
	default:
		w.dropped.Add(context.Background(), 1)
	}
	w.mu.Unlock()
}

// WaitFor waits until the fingerprint with the given id is known, or ctx ends; for tests
// and tools that must not race the watch.
func (w *Watcher) WaitFor(ctx context.Context, id string) error {
	k, err := strconv.ParseUint(id, 16, 64)
	if err != nil {
		return fmt.Errorf("wait for fingerprint %q: %w", id, err)
	}
	for {
		w.mu.Lock()
		ch := w.learned
		w.mu.Unlock()
		if w.set.Load().Has(k) {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("wait for fingerprint %s: %w", id, ctx.Err())
		}
	}
}

func (w *Watcher) publish(ctx context.Context) {
	for {
		select {
		case f := <-w.pub:
			f.RecordedAtUnixNano = time.Now().UnixNano()
			data, err := json.Marshal(f)
			if err == nil {
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err = w.kv.Create(pctx, f.ID, data)
				cancel()
			}
			if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				// Not fatal: the next step recording it queues it again.
				w.log.Warn("publish threat fingerprint", "id", f.ID, "err", err)
				w.mu.Lock()
				delete(w.queued, mustKey(f.ID))
				w.mu.Unlock()
				continue
			}
			if err == nil {
				w.log.Info("threat fingerprint published", "id", f.ID, "tool", f.Tool, "command", f.Command, "episode_id", f.Episode, "step", f.Step)
			}
		case <-ctx.Done():
			return
		}
	}
}

// apply folds one update of the bucket into a new set.
func (w *Watcher) apply(e jetstream.KeyValueEntry) {
	k, err := strconv.ParseUint(e.Key(), 16, 64)
	if err != nil {
		w.log.Warn("threat fingerprint with a bad key ignored", "key", e.Key())
		return
	}
	var f *Fingerprint
	if e.Operation() == jetstream.KeyValuePut {
		var ok bool
		if f, _, ok = w.decode(e); !ok {
			return
		}
		if f.RecordedAtUnixNano > 0 {
			w.propagation.Record(context.Background(), time.Since(time.Unix(0, f.RecordedAtUnixNano)).Seconds())
		}
	}
	w.mu.Lock()
	w.set.Store(w.set.Load().with(k, f)) // one writer: this goroutine
	delete(w.queued, k)
	close(w.learned)
	w.learned = make(chan struct{})
	w.mu.Unlock()
}

func (w *Watcher) decode(e jetstream.KeyValueEntry) (*Fingerprint, uint64, bool) {
	k, err := strconv.ParseUint(e.Key(), 16, 64)
	if err != nil || e.Operation() != jetstream.KeyValuePut {
		return nil, 0, false
	}
	var f Fingerprint
	if err := json.Unmarshal(e.Value(), &f); err != nil || f.ID != e.Key() {
		w.log.Warn("threat fingerprint that does not decode ignored", "key", e.Key(), "err", err)
		return nil, 0, false
	}
	return &f, k, true
}

func mustKey(id string) uint64 {
	k, _ := strconv.ParseUint(id, 16, 64)
	return k
}

// List returns every fingerprint the bucket holds, the oldest first: what an operator
// reads to see what players flag, and before Forget.
func List(ctx context.Context, js jetstream.JetStream) ([]*Fingerprint, error) {
	kv, err := js.KeyValue(ctx, bus.BucketThreats)
	if err != nil {
		return nil, fmt.Errorf("threat fingerprints: open kv bucket %s: %w", bus.BucketThreats, err)
	}
	watch, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("threat fingerprints: read %s: %w", bus.BucketThreats, err)
	}
	defer watch.Stop()
	var out []*Fingerprint
	for {
		select {
		case e, ok := <-watch.Updates():
			if !ok {
				return nil, fmt.Errorf("threat fingerprints: watch of %s closed while reading", bus.BucketThreats)
			}
			if e == nil { // every value held when the watch began has come
				slices.SortFunc(out, func(a, b *Fingerprint) int {
					return cmp.Or(cmp.Compare(a.RecordedAtUnixNano, b.RecordedAtUnixNano), cmp.Compare(a.ID, b.ID))
				})
				return out, nil
			}
			var f Fingerprint
			if e.Operation() != jetstream.KeyValuePut || json.Unmarshal(e.Value(), &f) != nil || f.ID != e.Key() {
				continue // what players ignore too (Watcher.decode)
			}
			out = append(out, &f)
		case <-ctx.Done():
			return nil, fmt.Errorf("threat fingerprints: read %s: %w", bus.BucketThreats, ctx.Err())
		}
	}
}

// ErrUnknown is Forget's answer for an id the bucket does not hold.
var ErrUnknown = errors.New("no such threat fingerprint")

// Forget removes a fingerprint from the bucket, with its history: every player stops
// flagging it within milliseconds (a false positive an operator has judged). The same
// attack seen again makes it anew.
func Forget(ctx context.Context, js jetstream.JetStream, id string) error {
	if _, err := strconv.ParseUint(id, 16, 64); err != nil || len(id) != 16 {
		return fmt.Errorf("forget threat fingerprint %q: an id is 16 hex digits", id)
	}
	kv, err := js.KeyValue(ctx, bus.BucketThreats)
	if err != nil {
		return fmt.Errorf("forget threat fingerprint %s: open kv bucket %s: %w", id, bus.BucketThreats, err)
	}
	if _, err := kv.Get(ctx, id); errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("forget threat fingerprint %s: %w", id, ErrUnknown)
	} else if err != nil {
		return fmt.Errorf("forget threat fingerprint %s: %w", id, err)
	}
	if err := kv.Purge(ctx, id); err != nil {
		return fmt.Errorf("forget threat fingerprint %s: %w", id, err)
	}
	return nil
}
