package console

import (
	"context"
	"sync"
	"time"
)

// The answers that summarise a whole run (the runs list, a run's report, its fault
// heatmap) read every episode and every fault of the runs they show: a run of a million
// episodes costs ClickHouse seconds per answer, and the pages of a run in flight ask for
// them every 2 seconds. Such an answer is kept and served from memory while a fresh one
// is computed in the background, so a page waits on ClickHouse only for the first look
// at a large run (docs/console.md, "Cost on a large run"). Answers about fewer episodes
// than Config.CacheFrom are cheap and not kept: small runs (and every test of the pages'
// numbers) see what ClickHouse holds when they ask.
const (
	// DefaultCacheFrom is the size, in episodes, from which a summary is kept.
	DefaultCacheFrom = 20_000
	// DefaultRefreshAfter is the least age at which a kept answer is recomputed in the
	// background when it is served. An answer that took T to compute is recomputed no
	// sooner than 2T after that computation started, so a reader of a large run costs
	// ClickHouse at most a third of its time on that answer.
	DefaultRefreshAfter = time.Second
	// DefaultMaxAge is the age past which a kept answer is not served: a page asked for
	// after that long waits for a fresh one.
	DefaultMaxAge = 2 * time.Minute
	// computeTimeout bounds one computation of an answer. It outlives the request that
	// started it (which gives up at its own timeout, 504), so the slow first answer for a
	// large run is still kept for the next request.
	computeTimeout = time.Minute
	// maxCached bounds the answers kept; the least recently served go first.
	maxCached = 256
)

// cached is an answer served from the cache, and how old it is (the Age header).
type cached struct {
	v   any
	age time.Duration
}

// sized computes an answer and says how many episodes it summarises.
type sized func(ctx context.Context) (v any, episodes uint64, err error)

// answerCache keeps the large summaries. Safe for concurrent use.
type answerCache struct {
	from                 uint64
	refreshAfter, maxAge time.Duration
	onError              func(key string, err error)

	// base ends every computation when the cache is closed.
	base   context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	entries map[string]*cacheEntry
	// flights are the computations under way, one per answer: a request that finds
	// none kept waits for the one under way rather than starting another.
	flights map[string]*flight
}

type cacheEntry struct {
	v        any
	episodes uint64
	at       time.Time     // when the computation of v started: v is at least this fresh
	took     time.Duration // how long it took
	used     time.Time
}

// flight is one computation of an answer; done is closed once v and err are set.
type flight struct {
	done chan struct{}
	v    any
	err  error
}

func newAnswerCache(from uint64, refreshAfter, maxAge time.Duration, onError func(string, error)) *answerCache {
	ctx, cancel := context.WithCancel(context.Background())
	return &answerCache{from: from, refreshAfter: refreshAfter, maxAge: maxAge, onError: onError,
		base: ctx, cancel: cancel, entries: map[string]*cacheEntry{}, flights: map[string]*flight{}}
}

// get returns the answer for key: a kept one younger than maxAge (starting its
// recomputation once it is old enough), else the one being computed, waited for until
// ctx ends. The computation runs under computeTimeout, not ctx's deadline, with ctx's
// values (a request's query settings); it is kept if it summarises CacheFrom episodes or
// more.
func (c *answerCache) get(ctx context.Context, key string, compute sized) (any, error) {
	now := time.Now()
	c.mu.Lock()
	if e := c.entries[key]; e != nil && now.Sub(e.at) < c.maxAge {
		e.used = now
		age := now.Sub(e.at)
		if age >= max(c.refreshAfter, 2*e.took) {
			c.startLocked(c.base, key, compute)
		}
		v := e.v
		c.mu.Unlock()
		return cached{v: v, age: age}, nil
	}
	f := c.startLocked(ctx, key, compute)
	c.mu.Unlock()
	select {
	case <-f.done:
		return f.v, f.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// startLocked returns the computation of key under way, starting one (with ctx's
// values) if there is none. c.mu is held.
func (c *answerCache) startLocked(ctx context.Context, key string, compute sized) *flight {
	if f := c.flights[key]; f != nil {
		return f
	}
	f := &flight{done: make(chan struct{})}
	c.flights[key] = f
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), computeTimeout)
		defer cancel()
		stop := context.AfterFunc(c.base, cancel)
		defer stop()
		at := time.Now()
		v, n, err := compute(cctx)
		took := time.Since(at)
		c.mu.Lock()
		delete(c.flights, key)
		switch {
		case err != nil:
			// A kept answer stays until it is too old.
		case n >= c.from:
			c.keepLocked(key, &cacheEntry{v: v, episodes: n, at: at, took: took, used: at})
		default:
			delete(c.entries, key)
		}
		c.mu.Unlock()
		if err != nil && c.base.Err() == nil {
			c.onError(key, err)
		}
		f.v, f.err = v, err
		close(f.done)
	}()
	return f
}

// keepLocked keeps e under key, dropping the least recently served answer when full.
// c.mu is held.
func (c *answerCache) keepLocked(key string, e *cacheEntry) {
	if old := c.entries[key]; old != nil {
		e.used = old.used
	} else if len(c.entries) >= maxCached {
		var oldest string
		var t time.Time
		for k, x := range c.entries {
			if oldest == "" || x.used.Before(t) {
				oldest, t = k, x.used
			}
		}
		delete(c.entries, oldest)
	}
	c.entries[key] = e
}

// close stops the computations under way and waits for them.
func (c *answerCache) close() {
	c.cancel()
	c.wg.Wait()
}
