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
// renews it every LeaseTTL/3 from its own goroutine (Hold), each try with its own
// deadline. A renewal that fails or goes unanswered is tried again until the lease's own
// expiry, LeaseTTL after the last successful renewal was sent (the earliest the entry can
// expire, so the earliest a standby can take it): a busy server or a starved process costs
// the holder nothing as long as one renewal lands within the TTL. A killed leader is
// replaced within about LeaseTTL.
const LeaseTTL = 6 * time.Second

const (
	// renewEvery is how often a holder renews its lease.
	renewEvery = LeaseTTL / 3
	// renewRetry is how soon a renewal that failed is tried again.
	renewRetry = LeaseTTL / 24
	// renewTimeout bounds one renewal's wait for its answer: a request lost on the way
	// is sent again instead of waited for until the expiry.
	renewTimeout = LeaseTTL / 3
	// renewLastChance is the deadline of a renewal tried when the expiry has already
	// passed (the holder's process got no CPU for a while): the entry may still be there
	// at the holder's revision, and if it is, no one else held the lease meanwhile.
	renewLastChance = LeaseTTL / 12
)

// ErrLeaseLost is Hold's error when the lease was taken over or could not be renewed
// within its TTL: the holder must stop acting at once.
var ErrLeaseLost = errors.New("leader lease lost")

// errLeaseTaken and errLeaseExpired are a renewal's errors when the key no longer holds
// the holder's revision nor a later write of its own: another instance holds it, or its
// entry expired in KV (or was deleted) and may be anyone's next.
var (
	errLeaseTaken   = errors.New("another instance holds the lease")
	errLeaseExpired = errors.New("the lease's entry is gone from KV")
)

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

// Held tells whether the lease is held and its TTL has not run out since its last
// successful renewal: whether the holder may still act.
func (l *Lease) Held() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.renewed.IsZero() && time.Since(l.renewed) < LeaseTTL
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
// holding it: Release gives it up) or the lease is lost. A renewal that fails is tried
// again every LeaseTTL/24 until the lease's expiry; the lease is lost only when its key
// moved to another revision (another instance took it, or the entry expired in KV) or the
// expiry passed with no renewal landing. lost is called at once when it is, before Hold
// returns ErrLeaseLost; the loss is logged at WARN with its reason and how late the
// renewal was.
func (l *Lease) Hold(ctx context.Context, lost func()) error {
	timer := time.NewTimer(renewEvery)
	defer timer.Stop()
	tries := 0 // failed renewals since the last one that landed
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		l.mu.Lock()
		last := l.renewed
		l.mu.Unlock()
		err := l.renew(ctx, last)
		since := time.Since(last)
		if err == nil {
			// Half the TTL gone (a renewal a second late or more) is worth a word: what a
			// lease lost under load would have shown first.
			if tries > 0 || since > LeaseTTL/2 {
				l.log.Warn("renewed the leader lease late", "key", l.key, "failed_tries", tries,
					"since_last_renewal", since.Round(time.Millisecond), "late", (since - renewEvery).Round(time.Millisecond))
			}
			tries = 0
			timer.Reset(renewEvery)
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		tries++
		reason := ""
		switch {
		case errors.Is(err, errLeaseTaken):
			reason = "taken over"
		case errors.Is(err, errLeaseExpired):
			reason = "expired in KV"
		case since >= LeaseTTL:
			reason = "not renewed within its TTL"
		}
		if reason == "" {
			if tries == 1 {
				l.log.Warn("renew leader lease; retrying until it expires", "key", l.key, "err", err,
					"since_last_renewal", since.Round(time.Millisecond), "expires_in", (LeaseTTL - since).Round(time.Millisecond))
			} else {
				l.log.Debug("renew leader lease; retrying", "key", l.key, "err", err, "tries", tries)
			}
			timer.Reset(renewRetry)
			continue
		}
		l.mu.Lock()
		l.renewed = time.Time{}
		l.mu.Unlock()
		l.log.Warn("leader lease lost", "key", l.key, "reason", reason, "err", err, "failed_tries", tries,
			"since_last_renewal", since.Round(time.Millisecond), "late", (since - renewEvery).Round(time.Millisecond), "ttl", LeaseTTL)
		lost()
		return fmt.Errorf("%w: %s %s (last renewed %v ago): %v", ErrLeaseLost, l.key, reason, since.Round(time.Millisecond), err)
	}
}

// renew writes the lease again if it is still at the revision last written, waiting for
// the answer until the lease's expiry (last, the last renewal, plus LeaseTTL) at most. A
// renewal whose answer came too late may still have landed: a key found at a later
// revision naming this holder is its own write (holders are unique, and only Hold writes
// while it runs), renewed again over that revision.
func (l *Lease) renew(ctx context.Context, last time.Time) error {
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	wait := min(renewTimeout, time.Until(last.Add(LeaseTTL)))
	if wait < renewLastChance {
		wait = renewLastChance
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	kv, err := l.bucket.KV(rctx)
	if err != nil {
		return err
	}
	begin := time.Now()
	next, err := kv.Update(rctx, l.key, []byte(l.holder), rev)
	if isWrongRevision(err) || errors.Is(err, jetstream.ErrKeyNotFound) {
		e, gerr := kv.Get(rctx, l.key)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
			return fmt.Errorf("renew leader lease %s: %w (%v)", l.key, errLeaseExpired, err)
		case gerr != nil:
			return fmt.Errorf("renew leader lease %s: %w (then read it: %v)", l.key, err, gerr)
		case string(e.Value()) != l.holder || e.Revision() < rev:
			return fmt.Errorf("renew leader lease %s: %w: %q, at revision %d", l.key, errLeaseTaken, e.Value(), e.Revision())
		}
		l.log.Debug("a renewal answered too late had landed", "key", l.key, "revision", e.Revision())
		rev = e.Revision()
		next, err = kv.Update(rctx, l.key, []byte(l.holder), rev)
		if isWrongRevision(err) {
			return fmt.Errorf("renew leader lease %s: %w: moved past revision %d", l.key, errLeaseTaken, rev)
		}
	}
	if err != nil {
		return fmt.Errorf("renew leader lease %s: %w", l.key, err)
	}
	l.mu.Lock()
	l.rev, l.renewed = next, begin
	l.mu.Unlock()
	return nil
}

// isWrongRevision tells a revision-checked write refused because the key is at another
// revision.
func isWrongRevision(err error) bool {
	var apiErr *jetstream.APIError
	return errors.Is(err, jetstream.ErrKeyExists) || errors.As(err, &apiErr) && apiErr.ErrorCode == errWrongLastSequence
}

// Release gives the lease up, if still held, so a standby takes over at once rather than
// after LeaseTTL. A lease another instance took meanwhile, or whose entry expired, is left
// as it is: there is nothing of this holder's to give up.
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
	err = kv.Delete(ctx, l.key, jetstream.LastRevision(rev))
	if isWrongRevision(err) {
		// A renewal cut short when Hold stopped may have landed unanswered: a later
		// revision naming this holder is its own (as in renew), deleted at that revision.
		// Another holder's entry, or none, is left alone.
		e, gerr := kv.Get(ctx, l.key)
		switch {
		case errors.Is(gerr, jetstream.ErrKeyNotFound) || errors.Is(gerr, jetstream.ErrKeyDeleted):
			return nil
		case gerr != nil:
			return fmt.Errorf("release leader lease %s: %w (then read it: %v)", l.key, err, gerr)
		case string(e.Value()) != l.holder || e.Revision() < rev:
			return nil
		}
		err = kv.Delete(ctx, l.key, jetstream.LastRevision(e.Revision()))
	}
	if err != nil {
		return fmt.Errorf("release leader lease %s: %w", l.key, err)
	}
	return nil
}
