package childproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
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
	// ProbeEvery is the pause between probes (the Recipe's) of a running server; each
	// probe is bounded by it too. A server can be alive and not answer (stopped by a
	// signal, deadlocked, swapping): exits alone would never tell.
	ProbeEvery time.Duration
	// HungAfter is how long a running server may leave every probe unanswered before it
	// counts as hung: it is then killed, and restarted as after a crash.
	HungAfter time.Duration
}

// DefaultBackoff is what gauntlet's local servers are supervised with: back within a
// second of a crash (ClickHouse and Temporal then take one to three seconds to answer),
// at most one start every 30 s while they cannot start.
// A running server is probed every 5 s and killed (then restarted) when it has not
// answered for 20 s.
var DefaultBackoff = Backoff{
	Initial: 500 * time.Millisecond, Max: 30 * time.Second, Stable: time.Minute,
	ProbeEvery: 5 * time.Second, HungAfter: 20 * time.Second,
}

// Supervisor restarts a Daemon's server each time it exits without being asked to (a
// crash, an OOM kill, a kill -9), with Backoff between attempts, and tells meanwhile that
// the server is down. It also probes the running server: one that stops answering is
// reported at once and, after Backoff.HungAfter, killed and restarted. It never restarts
// a server stopped by Stop, nor once its Run's context has ended, so the stopping of a
// process does not race it.
type Supervisor struct {
	d   *Daemon
	b   Backoff
	log *slog.Logger

	mu       sync.Mutex
	down     error // why the server is not serving; nil while it is
	hung     error // why the running server seems not to answer; nil while it does
	killed   *hungKill
	restarts atomic.Int64
}

// hungKill is a process the Supervisor killed because it did not answer, and why.
type hungKill struct {
	p   *Process
	why error
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
	if b.ProbeEvery <= 0 {
		b.ProbeEvery = DefaultBackoff.ProbeEvery
	}
	if b.HungAfter <= 0 {
		b.HungAfter = DefaultBackoff.HungAfter
	}
	return &Supervisor{d: d, b: b, log: d.log}
}

// Ready is nil while the server runs and answers, else says why not: it exited and is
// being restarted (with the last failure), it was stopped, or it runs but its last
// probes went unanswered.
func (s *Supervisor) Ready() error {
	s.mu.Lock()
	down, hung := s.down, s.hung
	s.mu.Unlock()
	if down != nil {
		return down
	}
	if s.d.Pid() == 0 {
		return fmt.Errorf("%s is not running", s.d.r.Name)
	}
	return hung
}

// Restarts is how many restarts the Supervisor has attempted, failed ones included.
func (s *Supervisor) Restarts() int64 { return s.restarts.Load() }

func (s *Supervisor) setDown(err error) {
	s.mu.Lock()
	s.down = err
	s.mu.Unlock()
}

func (s *Supervisor) setHung(err error) {
	s.mu.Lock()
	s.hung = err
	s.mu.Unlock()
}

// exitReason is why p's exit counts as a crash: the hang it was killed for, if the
// Supervisor killed it, else its exit status.
func (s *Supervisor) exitReason(p *Process) error {
	s.mu.Lock()
	k := s.killed
	s.mu.Unlock()
	if k != nil && k.p == p {
		return k.why
	}
	return fmt.Errorf("%s exited unexpectedly (%v)", s.d.r.Name, p.Err())
}

// watch probes the running server every ProbeEvery until ctx ends. Two probes
// unanswered in a row make Ready say so; HungAfter without an answer gets the process killed, which Run
// then sees as a crash and repairs. A server down or being restarted is not probed
// (Run tells about it).
func (s *Supervisor) watch(ctx context.Context) {
	if s.d.r.OpenProbe == nil {
		return
	}
	name := s.d.r.Name
	t := time.NewTicker(s.b.ProbeEvery)
	defer t.Stop()
	var p *Process      // the process probed
	var since time.Time // when it last answered, or was first probed
	var fails int       // probes unanswered in a row
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := s.d.current()
		s.mu.Lock()
		down := s.down
		s.mu.Unlock()
		if cur == nil || cur.Exited() || down != nil {
			p = nil
			s.setHung(nil)
			continue
		}
		if cur != p {
			p, since, fails = cur, time.Now(), 0
			s.setHung(nil)
		}
		err := s.probe(ctx)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			if s.hungErr() != nil {
				s.log.Info(name+" answers again", "pid", p.Pid())
			}
			since, fails = time.Now(), 0
			s.setHung(nil)
			continue
		}
		fails++
		silent := time.Since(since).Round(time.Millisecond)
		if silent < s.b.HungAfter {
			if fails < 2 {
				continue // one slow answer under load is not yet news
			}
			if s.hungErr() == nil {
				s.log.Warn(name+" does not answer", "pid", p.Pid(), "err", err, "killed_after", s.b.HungAfter)
			}
			s.setHung(fmt.Errorf("%s does not answer (%v) for %v; killed and restarted if it still does not after %v", name, err, silent, s.b.HungAfter))
			continue
		}
		if s.d.stoppedSince(p) {
			continue // its owner stops or restarts it: not ours to kill
		}
		why := fmt.Errorf("%s hung: no answer for %v (%v); killed", name, silent, err)
		s.log.Error(name+" hung; killing it to restart it", "pid", p.Pid(), "silent", silent, "err", err)
		s.mu.Lock()
		s.killed = &hungKill{p: p, why: why}
		s.mu.Unlock()
		s.setHung(why)
		if err := p.Signal(syscall.SIGKILL); err != nil {
			s.log.Warn("kill hung "+name, "pid", p.Pid(), "err", err)
		}
	}
}

func (s *Supervisor) hungErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hung
}

// probe runs the Recipe's probe once, bounded by ProbeEvery.
func (s *Supervisor) probe(ctx context.Context) error {
	probe, release, err := s.d.r.OpenProbe()
	if err != nil {
		return err
	}
	defer release()
	pctx, cancel := context.WithTimeout(ctx, s.b.ProbeEvery)
	defer cancel()
	return probe(pctx)
}

// Run supervises the server, which must have been started, until ctx ends; it returns
// nil then. A restart under way when ctx ends is abandoned (Start kills what it spawned).
func (s *Supervisor) Run(ctx context.Context) error {
	name := s.d.r.Name
	p := s.d.current()
	if p == nil {
		return fmt.Errorf("supervise %s: %w", name, errors.New("never started"))
	}
	var watching sync.WaitGroup
	defer watching.Wait()
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watching.Add(1)
	go func() {
		defer watching.Done()
		s.watch(wctx)
	}()
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
		exit := s.exitReason(p)
		s.log.Error(name+" exited unexpectedly; restarting", "pid", p.Pid(), "status", p.Err(), "why", exit, "in", wait)
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
