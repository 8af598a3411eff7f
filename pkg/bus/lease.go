package bus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LeaseTTL is how long a leader lease lasts unless renewed: the bucket's TTL. A holder
// renews it every LeaseTTL/3 and stops acting once LeaseTTL/2 has passed without a
// renewal, so it has stepped down before the entry expires and a standby can take it. A
// killed leader is replaced within about LeaseTTL.
const LeaseTTL = 6 * time.Second

// ErrLeaseLost is Hold's error when the lease was taken over or could not be renewed in
// time: the holder must stop acting at once.
var ErrLeaseLost = errors.New("leader lease lost")

// errWrongLastSequence is JetStream's refusal of a revision-checked KV write whose
// revision is not the key's latest (JSStreamWrongLastSequenceErrF).
const errWrongLastSequence jetstream.ErrorCode = 10071

// Lease is a leader lease: one key of BucketLeases, created by the instance that becomes
// the leader and renewed by revision-checked updates, so exactly one instance holds it
// at a time. It is not safe for concurrent use except Held.
type Lease struct {
	bucket *Bucket
	key    string
	holder string
	log    *slog.Logger

	mu      sync.Mutex
	rev     uint64
	renewed time.Time // last successful write; zero while not held
}

// NewLease returns the lease named key for holder (an id unique to this instance).
func (b *Bus) NewLease(key, holder string, log *slog.Logger) *Lease {
	return &Lease{bucket: NewBucket(b.JS, BucketLeases), key: key, holder: holder, log: log}
}

// Held tells whether the lease is held and was renewed within LeaseTTL/2: whether the
// holder may still act.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.renewed.IsZero() && time.Since(l.renewed) < LeaseTTL/2
}

// Acquire waits until the lease is free and takes it, polling every LeaseTTL/12; it
// returns ctx's error if ctx ends first.
func (l *Lease) Acquire(ctx context.Context) error {
	logged := false
	for {
		kv, err := l.bucket.KV(ctx)
		var rev uint64
		if err == nil {
			begin := time.Now()
			rev, err = kv.Create(ctx, l.key, []byte(l.holder))
			if err == nil {
				l.mu.Lock()
				l.rev, l.renewed = rev, begin
				l.mu.Unlock()
				return nil
			}
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			l.log.Warn("acquire leader lease", "key", l.key, "err", err)
		} else if !logged {
			logged = true
			if e, gerr := kv.Get(ctx, l.key); gerr == nil {
				l.log.Info("standing by: another instance holds the leader lease", "key", l.key, "leader", string(e.Value()))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("acquire leader lease %s: %w", l.key, ctx.Err())
		case <-time.After(LeaseTTL / 12):
		}
	}
}

// Hold renews the lease every LeaseTTL/3 until ctx ends (then it returns nil, still
// holding it: Release gives it up) or the lease is lost: taken by another instance, or
// not renewed for LeaseTTL/2. lost is called at once when it is, before Hold returns
// ErrLeaseLost.
func (l *Lease) Hold(ctx context.Context, lost func()) error {
	tick := time.NewTicker(LeaseTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		err := l.renew(ctx)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		var apiErr *jetstream.APIError
		takenOver := errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyExists) ||
			errors.As(err, &apiErr) && apiErr.ErrorCode == errWrongLastSequence
		if takenOver || !l.Held() {
			l.mu.Lock()
			l.renewed = time.Time{}
			l.mu.Unlock()
			lost()
			return fmt.Errorf("%w: %s: %v", ErrLeaseLost, l.key, err)
		}
		l.log.Warn("renew leader lease; retrying", "key", l.key, "err", err)
	}
}

// renew writes the lease again if it is still at the revision last written.
func (l *Lease) renew(ctx context.Context) error {
	kv, err := l.bucket.KV(ctx)
	if err != nil {
		return err
	}
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	rctx, cancel := context.WithTimeout(ctx, LeaseTTL/6)
	defer cancel()
	begin := time.Now()
	next, err := kv.Update(rctx, l.key, []byte(l.holder), rev)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.rev, l.renewed = next, begin
	l.mu.Unlock()
	return nil
}

// Release gives the lease up, if still held, so a standby takes over at once rather than
// after LeaseTTL.
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	rev, held := l.rev, !l.renewed.IsZero()
	l.renewed = time.Time{}
	l.mu.Unlock()
	if !held {
		return nil
	}
	kv, err := l.bucket.KV(ctx)
	if err != nil {
		return err
	}
	if err := kv.Delete(ctx, l.key, jetstream.LastRevision(rev)); err != nil {
		return fmt.Errorf("release leader lease %s: %w", l.key, err)
	}
	return nil
}
