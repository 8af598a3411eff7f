package childproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Backoff spaces a Supervisor's restarts: a server that keeps crashing (a full disk, a
// broken config) is retried ever less often instead of in a tight loop, and one that
// crashed once after a long life comes back quickly.
type Backoff struct {
	// Initial is the wait before the first restart after a crash.
	Initial time.Duration
	// Max caps the wait, which doubles after every restart that failed or did not last.
	Max time.Duration
	// Stable is how long a server must have run for its next crash to start over from
	// Initial.
	Stable time.Duration
}

// DefaultBackoff is what gauntlet's local servers are supervised with: back within a
// second of a crash (ClickHouse and Temporal then take one to three seconds to answer),
// at most one start every 30 s while they cannot start.
var DefaultBackoff = Backoff{Initial: 500 * time.Millisecond, Max: 30 * time.Second, Stable: time.Minute}

// Supervisor restarts a Daemon's server each time it exits without being asked to (a
// crash, an OOM kill, a kill -9), with Backoff between attempts, and tells meanwhile that
// the server is down. It never restarts a server stopped by Stop, nor once its Run's
// context has ended, so the stopping of a process does not race it.
type Supervisor struct {
	d   *Daemon
	b   Backoff
	log *slog.Logger

	mu       sync.Mutex
	down     error // why the server is not serving; nil while it is
	restarts atomic.Int64
}

// NewSupervisor returns a Supervisor of d, not running; it logs to d's logger. A zero
// field of b takes DefaultBackoff's.
func NewSupervisor(d *Daemon, b Backoff) *Supervisor {
	if b.Initial <= 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max <= 0 {
		b.Max = DefaultBackoff.Max
	}
	if b.Max < b.Initial {
		b.Max = b.Initial
	}
	if b.Stable <= 0 {
		b.Stable = DefaultBackoff.Stable
	}
	return &Supervisor{d: d, b: b, log: d.log}
}

// Ready is nil while the server runs, else says why not: it exited and is being
// restarted (with the last failure), or it was stopped.
func (s *Supervisor) Ready() error {
	s.mu.Lock()
	down := s.down
	s.mu.Unlock()
	if down != nil {
		return down
	}
	if s.d.Pid() == 0 {
		return fmt.Errorf("%s is not running", s.d.r.Name)
	}
	return nil
}

// Restarts is how many restarts the Supervisor has attempted, failed ones included.
func (s *Supervisor) Restarts() int64 { return s.restarts.Load() }

func (s *Supervisor) setDown(err error) {
	s.mu.Lock()
	s.down = err
	s.mu.Unlock()
}

// Run supervises the server, which must have been started, until ctx ends; it returns
// nil then. A restart under way when ctx ends is abandoned (Start kills what it spawned).
func (s *Supervisor) Run(ctx context.Context) error {
	name := s.d.r.Name
	p := s.d.current()
	if p == nil {
		return fmt.Errorf("supervise %s: %w", name, errors.New("never started"))
	}
	wait := s.b.Initial
	for {
		up := time.Now()
		select {
		case <-ctx.Done():
			return nil
		case <-p.Done():
		}
		if ctx.Err() != nil {
			return nil
		}
		if s.d.stoppedSince(p) {
			// Stopped or restarted by its owner: follow whatever runs next.
			if p = s.awaitStart(ctx, p); p == nil {
				return nil
			}
			continue
		}
		if time.Since(up) >= s.b.Stable {
			wait = s.b.Initial
		}
		exit := fmt.Errorf("%s exited unexpectedly (%v)", name, p.Err())
		s.log.Error(name+" exited unexpectedly; restarting", "pid", p.Pid(), "status", p.Err(), "in", wait)
		last := exit
		for attempt := 1; ; attempt++ {
			s.setDown(fmt.Errorf("%w; restart %d in %v", last, attempt, wait))
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			s.setDown(fmt.Errorf("%w; restart %d under way", last, attempt))
			wait = min(2*wait, s.b.Max)
			started, err := s.d.startIfDown(ctx)
			if started {
				s.restarts.Add(1)
			}
			if ctx.Err() != nil {
				return nil
			}
			if err == nil {
				break
			}
			last = fmt.Errorf("%w; restart %d failed: %w", exit, attempt, err)
			s.log.Warn(name+" restart failed", "attempt", attempt, "err", err, "next_in", wait)
		}
		p = s.d.current()
		if p.Exited() || s.d.stoppedSince(p) {
			// Stopped on purpose while we waited, or already gone again.
			continue
		}
		s.setDown(nil)
		s.log.Info(name+" restarted", "pid", p.Pid(), "restarts", s.restarts.Load())
	}
}

// awaitStart waits, while the server is stopped on purpose, for a process newer than p
// to run; nil when ctx ends first.
func (s *Supervisor) awaitStart(ctx context.Context, p *Process) *Process {
	tick := time.NewTicker(s.d.r.PollInterval + 10*time.Millisecond)
	defer tick.Stop()
	for {
		if q := s.d.current(); q != p && !q.Exited() {
			s.setDown(nil)
			return q
		}
		s.setDown(fmt.Errorf("%s is stopped", s.d.r.Name))
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
