package childproc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os/exec"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Probe tells whether a started server answers: nil means ready, an error says what the
// last attempt met (it is quoted when the wait times out).
type Probe func(ctx context.Context) error

// Recipe is what differs between gauntlet's local servers: how to run one, where its
// output goes and how to tell it is ready. Everything else (spawning it so that it dies
// with this program, waiting for readiness within a bound, quoting its log when it dies
// early, stopping it gracefully then killing it) is the Daemon's.
type Recipe struct {
	// Name says what the server is ("clickhouse"), in logs and errors.
	Name string
	// Command builds the command of one start. It is called on every Start, so
	// arguments may follow state the launcher changes between starts (fresh ports).
	// Its SysProcAttr may carry flags of its own (a new mount namespace, say); the
	// Daemon adds a process group of the server's own and death with this program.
	Command func() (*exec.Cmd, error)
	// LogPath receives the server's stdout and stderr, appended.
	LogPath string
	// PidFile records the running server's pid, for KillLeftover after a crash.
	PidFile string
	// Owns tells whether a process found through PidFile is this recipe's server (pids
	// are reused): its command line or name, say.
	Owns func(pid int) bool
	// TailLogs are the logs quoted, first non-empty first, when the server exits
	// before it is ready: what each gained during that start. Empty means LogPath.
	TailLogs []string
	// OpenProbe opens what probing one start needs (a client, say) and returns the probe
	// and a function releasing it, called once the wait is over.
	OpenProbe func() (Probe, func(), error)
	// Listens, when set, returns the TCP ports the server itself listens on once ready.
	// The probe's answer then counts only while a process of the server's process group
	// holds a listening socket on each: a port picked free can be bound by another
	// program's server before this one binds it, and that server would answer the probe
	// while this one fails to bind and exits.
	Listens func() []int
	// Describe, when set, adds attributes (an address, say) to the "ready" log line.
	Describe func() []any
	// PollInterval is the pause between probes.
	PollInterval time.Duration
	// StartTimeout bounds the wait for readiness of one start; the context given to
	// Start can shorten it.
	StartTimeout time.Duration
	// StopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	StopGrace time.Duration
	// SignalLeaderOnly sends signals to the server's own pid rather than to its process
	// group: containerd's shims must outlive a restart of the daemon.
	SignalLeaderOnly bool
}

// Daemon is one supervised local server: at most one process of its Recipe runs at a
// time. Its methods are safe for concurrent use; Start, Stop, Kill and Restart are
// serialized. It restarts nothing by itself: a [Supervisor] brings a crashed server back.
type Daemon struct {
	r   Recipe
	log *slog.Logger

	mu sync.Mutex // serializes Start, Stop, Kill and Restart
	// proc is the current or last process, nil before the first Start; written under
	// mu, read without it, so readiness checks never wait for a start or a stop.
	proc atomic.Pointer[Process]
	// stopped is set by Stop (and Restart) until the next start: the exit it causes is
	// asked for, not a crash a Supervisor should repair.
	stopped bool
}

// NewDaemon returns a Daemon of r, not started. log receives lifecycle messages; nil
// discards them.
func NewDaemon(r Recipe, log *slog.Logger) *Daemon {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if len(r.TailLogs) == 0 {
		r.TailLogs = []string{r.LogPath}
	}
	return &Daemon{r: r, log: log}
}

// ExitError is Start's error when the server exits before it is ready.
type ExitError struct {
	// Name is the Recipe's.
	Name string
	// Status is the process's exit status.
	Status error
	// Tail is the end of what the server logged during that start, "" when nothing.
	Tail string
}

func (e *ExitError) Error() string {
	if e.Tail == "" {
		return fmt.Sprintf("%s exited before it was ready (%v) and logged nothing", e.Name, e.Status)
	}
	return fmt.Sprintf("%s exited before it was ready (%v); end of its log:\n%s", e.Name, e.Status, e.Tail)
}

func (e *ExitError) Unwrap() error { return e.Status }

// KillLeftover kills a server of this recipe left running by an earlier, crashed program
// (see the package function KillLeftover).
func (d *Daemon) KillLeftover() error {
	return KillLeftover(d.r.PidFile, d.r.Name, d.r.Owns, d.log)
}

// StartOnFreePorts is Start for a server whose ports this program picks: pick chooses
// ports (and writes whatever config names them) before each attempt, and when the server
// exits before it is ready because taken says a picked port was bound by another process
// in between, it picks again, at most attempts times in all.
func (d *Daemon) StartOnFreePorts(ctx context.Context, attempts int, pick func() error, taken func(*ExitError) bool) error {
	for attempt := 1; ; attempt++ {
		if err := pick(); err != nil {
			return err
		}
		err := d.Start(ctx)
		var ee *ExitError
		if err == nil || attempt >= attempts || !errors.As(err, &ee) || !taken(ee) {
			return err
		}
		d.log.Warn(d.r.Name+" port taken, picking others", "attempt", attempt)
	}
}

// FreePorts returns ports with each zero replaced by a distinct free port of 127.0.0.1.
// The listeners are held until every port is known, so the picks differ; another process
// may still bind one before the server does (StartOnFreePorts retries then).
func FreePorts(ports ...int) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	out := make([]int, len(ports))
	for i, p := range ports {
		if p != 0 {
			out[i] = p
			continue
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		held = append(held, l)
		out[i] = l.Addr().(*net.TCPAddr).Port
	}
	return out, nil
}

// Start spawns the server and returns once its probe succeeds. When it exits first the
// error is an *ExitError; when the wait outlasts StartTimeout or ctx the server is
// killed and the error quotes the end of its log. Starting a running daemon is an error.
func (d *Daemon) Start(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.startLocked(ctx)
}

func (d *Daemon) startLocked(ctx context.Context) error {
	if cur := d.proc.Load(); cur != nil && !cur.Exited() {
		return fmt.Errorf("start %s: already running as pid %d", d.r.Name, cur.Pid())
	}
	probe, release, err := d.r.OpenProbe()
	if err != nil {
		return fmt.Errorf("%s readiness probe: %w", d.r.Name, err)
	}
	defer release()
	begin := time.Now()
	logAt := make([]int64, len(d.r.TailLogs))
	for i, path := range d.r.TailLogs {
		logAt[i] = FileSize(path)
	}
	cmd, err := d.r.Command()
	if err != nil {
		return fmt.Errorf("%s command: %w", d.r.Name, err)
	}
	p, err := Spawn(cmd, d.r.Name, d.r.LogPath, d.r.PidFile, d.log)
	if err != nil {
		return err
	}
	p.leaderOnly = d.r.SignalLeaderOnly
	d.proc.Store(p)
	d.stopped = false

	ctx, cancel := context.WithTimeout(ctx, d.r.StartTimeout)
	defer cancel()
	var last error
	for {
		if last = probe(ctx); last == nil && d.r.Listens != nil {
			last = d.holdsPorts(p)
		}
		if last == nil {
			attrs := []any{"pid", p.Pid(), "took", time.Since(begin).Round(time.Millisecond)}
			if d.r.Describe != nil {
				attrs = append(d.r.Describe(), attrs...)
			}
			d.log.Info(d.r.Name+" ready", attrs...)
			return nil
		}
		select {
		case <-p.Done():
			return &ExitError{Name: d.r.Name, Status: p.Err(), Tail: d.tail(logAt)}
		case <-ctx.Done():
			_ = d.killLocked()
			if tail := d.tail(logAt); tail != "" {
				return fmt.Errorf("wait for %s: %w (last probe: %v); end of its log:\n%s", d.r.Name, ctx.Err(), last, tail)
			}
			return fmt.Errorf("wait for %s: %w (last probe: %v)", d.r.Name, ctx.Err(), last)
		case <-time.After(d.r.PollInterval):
		}
	}
}

// holdsPorts is nil when process p's group listens on every port of Recipe.Listens.
func (d *Daemon) holdsPorts(p *Process) error {
	want := d.r.Listens()
	missing, err := unheldPorts(p.Pid(), want)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return fmt.Errorf("127.0.0.1 port %v answers, but %s (pid %d) does not listen on it: another program holds it", missing, d.r.Name, p.Pid())
	}
	return nil
}

// tail is the end of the first of TailLogs that gained lines since offsets at.
func (d *Daemon) tail(at []int64) string {
	for i, path := range d.r.TailLogs {
		if t := Tail(path, at[i]); t != "" {
			return t
		}
	}
	return ""
}

// Stop shuts the server down: SIGCONT (a paused server cannot handle SIGTERM), SIGTERM,
// then SIGKILL after StopGrace or when ctx ends first. Stopping a stopped daemon is a
// no-op.
func (d *Daemon) Stop(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopLocked(ctx)
}

func (d *Daemon) stopLocked(ctx context.Context) error {
	p := d.proc.Load()
	if p == nil || p.Exited() {
		return nil
	}
	d.stopped = true
	begin := time.Now()
	if err := p.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("stop %s: %w", d.r.Name, err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop %s: %w", d.r.Name, err)
	}
	grace := time.NewTimer(d.r.StopGrace)
	defer grace.Stop()
	select {
	case <-p.Done():
		d.log.Info(d.r.Name+" stopped", "pid", p.Pid(), "took", time.Since(begin))
		return nil
	case <-grace.C:
		d.log.Warn(d.r.Name+" ignored SIGTERM, killing it", "pid", p.Pid(), "grace", d.r.StopGrace)
	case <-ctx.Done():
		d.log.Warn(d.r.Name+" stop cancelled, killing it", "pid", p.Pid(), "err", ctx.Err())
	}
	return d.killLocked()
}

// Kill ends the server with SIGKILL, as a crash would, and waits until it is reaped; a
// Supervisor treats it as a crash. Killing a stopped daemon is a no-op.
func (d *Daemon) Kill() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.killLocked()
}

func (d *Daemon) killLocked() error {
	p := d.proc.Load()
	if p == nil || p.Exited() {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill %s: %w", d.r.Name, err)
	}
	<-p.Done()
	return nil
}

// Restart stops the server if it runs (as Stop does) and starts it again.
func (d *Daemon) Restart(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.stopLocked(ctx); err != nil {
		return err
	}
	return d.startLocked(ctx)
}

// Signal sends sig to the running server; an error when it does not run.
func (d *Daemon) Signal(sig syscall.Signal) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc.Load().Signal(sig)
}

// Pid is the running server's process id, 0 when it does not run.
func (d *Daemon) Pid() int {
	p := d.current()
	if p == nil || p.Exited() {
		return 0
	}
	return p.Pid()
}

// Done is closed when the current (or last) server process exits; after a new Start
// it is a new channel. Before the first Start it is nil.
func (d *Daemon) Done() <-chan struct{} {
	p := d.current()
	if p == nil {
		return nil
	}
	return p.Done()
}

// Wait blocks until the current server process exits and returns its exit status (nil
// for a clean exit). Before the first Start it returns at once with an error.
func (d *Daemon) Wait() error {
	p := d.current()
	if p == nil {
		return errors.New(d.r.Name + " was never started")
	}
	<-p.Done()
	return p.Err()
}

// Name is the Recipe's.
func (d *Daemon) Name() string { return d.r.Name }

// startIfDown starts the server unless it runs already (someone else restarted it) or
// was stopped on purpose; started tells whether it tried.
func (d *Daemon) startIfDown(ctx context.Context) (started bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.proc.Load(); d.stopped || (cur != nil && !cur.Exited()) {
		return false, nil
	}
	return true, d.startLocked(ctx)
}

// stoppedSince reports whether p, an exited process, left because Stop asked it to, or
// has been replaced by a newer start.
func (d *Daemon) stoppedSince(p *Process) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.proc.Load() != p || d.stopped
}

func (d *Daemon) current() *Process { return d.proc.Load() }
