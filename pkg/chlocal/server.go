package chlocal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// Bounds of the process lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the server to answer.
	DefaultStartTimeout = 60 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	// ClickHouse 18.16 takes about 2 s to shut down cleanly here.
	stopGrace = 15 * time.Second
	// pollInterval is the pause between readiness probes.
	pollInterval = 25 * time.Millisecond
	// portAttempts is how often Start picks fresh ports when a picked port was
	// taken between picking it and the server binding it.
	portAttempts = 3
)

// ErrNotInstalled is wrapped by Start's error when no ClickHouse server binary can
// be found.
var ErrNotInstalled = errors.New("clickhouse-server not found in PATH, /usr/sbin or /usr/bin: run scripts/deps.sh")

// Options configures Start.
type Options struct {
	// Dir holds everything the server writes: config, data, logs, pid file. It is
	// created when missing and kept on Stop, so a later Start on the same Dir finds
	// the same databases. Required.
	Dir string
	// TCPPort is the native-protocol port on 127.0.0.1; 0 picks a free one.
	TCPPort int
	// HTTPPort is the HTTP port on 127.0.0.1; 0 picks a free one.
	HTTPPort int
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds the wait for the server to answer; 0 means
	// DefaultStartTimeout. The context given to Start can shorten it.
	StartTimeout time.Duration
	// Binary is the server executable; empty finds clickhouse-server (or the
	// multi-call clickhouse binary) in PATH, /usr/sbin and /usr/bin.
	Binary string
}

// Server is a ClickHouse server process owned by this program. Its ports and Dir
// stay fixed for its lifetime, across Kill and Restart.
type Server struct {
	dir          string
	bin          []string // executable and leading arguments
	tcpPort      int
	httpPort     int
	log          *slog.Logger
	startTimeout time.Duration

	mu   sync.Mutex
	proc *childproc.Process // the current or last process; nil only during Start
}

// Start starts a ClickHouse server with its state under opts.Dir and returns once it
// answers `SELECT 1` over the native protocol. A server left running on the same Dir
// by an earlier, crashed program is killed first.
//
// Measured on the project's 2-core machine with Debian's ClickHouse 18.16: about
// 0.3 s from Start until it answers (0.25-0.45 s depending on load, BenchmarkStart);
// Stop then takes about 1 s, Kill a few milliseconds.
//
// If the server exits before it is ready, the error includes the tail of its error
// log. If no binary is found, the error wraps ErrNotInstalled.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Dir == "" {
		return nil, errors.New("start clickhouse: Options.Dir is empty")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	bin, err := findBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	s := &Server{
		dir:          dir,
		bin:          bin,
		log:          opts.Logger,
		startTimeout: opts.StartTimeout,
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.startTimeout <= 0 {
		s.startTimeout = DefaultStartTimeout
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	owns := func(pid int) bool { return childproc.CmdlineContains(pid, filepath.Join(dir, configFile)) }
	if err := childproc.KillLeftover(filepath.Join(dir, pidFile), "clickhouse", owns, s.log); err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}

	for attempt := 1; ; attempt++ {
		s.tcpPort, s.httpPort, err = choosePorts(opts.TCPPort, opts.HTTPPort)
		if err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
		if err := writeConfig(dir, s.tcpPort, s.httpPort); err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
		err = s.run(ctx)
		var ee *exitError
		if err == nil || attempt == portAttempts || !errors.As(err, &ee) {
			break
		}
		// Another process may have bound a port we picked before the server did.
		if !(opts.TCPPort == 0 && ee.portInUse(s.tcpPort)) && !(opts.HTTPPort == 0 && ee.portInUse(s.httpPort)) {
			break
		}
		s.log.Warn("clickhouse port taken, picking others", "tcp_port", s.tcpPort, "http_port", s.httpPort)
	}
	if err != nil {
		return nil, fmt.Errorf("start clickhouse in %s: %w", dir, err)
	}
	return s, nil
}

// Addr returns the native-protocol address, "127.0.0.1:port".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.tcpPort))
}

// HTTPAddr returns the HTTP address, "127.0.0.1:port". ClickHouse 18.16 answers
// queries there but clickhouse-go's HTTP inserts fail against it: use Addr.
func (s *Server) HTTPAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.httpPort))
}

// Dir returns the absolute directory holding the server's state.
func (s *Server) Dir() string { return s.dir }

// Pid returns the process id of the current server process, or 0 when it has exited.
func (s *Server) Pid() int {
	p := s.current()
	if p == nil || p.Exited() {
		return 0
	}
	return p.Pid()
}

// Done returns a channel that is closed when the current server process exits. After
// Restart a new channel is returned.
func (s *Server) Done() <-chan struct{} {
	return s.current().Done()
}

// Wait blocks until the current server process exits and returns its exit status
// (nil for a clean exit).
func (s *Server) Wait() error {
	p := s.current()
	<-p.Done()
	return p.Err()
}

// Stop shuts the server down: SIGTERM, then SIGKILL if it has not exited after 15 s
// or when ctx ends first. The data in Dir is kept. Stopping a stopped server is a
// no-op.
func (s *Server) Stop(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(ctx)
}

func (s *Server) stopLocked(ctx context.Context) error {
	p := s.proc
	if p == nil || p.Exited() {
		return nil
	}
	begin := time.Now()
	if err := p.Signal(syscall.SIGCONT); err != nil { // a paused server cannot handle SIGTERM
		return fmt.Errorf("stop clickhouse: %w", err)
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop clickhouse: %w", err)
	}
	grace := time.NewTimer(stopGrace)
	defer grace.Stop()
	select {
	case <-p.Done():
		s.log.Info("clickhouse stopped", "pid", p.Pid(), "took", time.Since(begin))
		return nil
	case <-grace.C:
		s.log.Warn("clickhouse ignored SIGTERM, killing it", "pid", p.Pid(), "grace", stopGrace)
	case <-ctx.Done():
		s.log.Warn("clickhouse stop cancelled, killing it", "pid", p.Pid(), "err", ctx.Err())
	}
	return s.killLocked()
}

// Kill ends the server with SIGKILL, as a crash would, and waits until it is gone.
// The data in Dir is kept (ClickHouse's inserts are atomic per part), so Restart
// brings back every acknowledged insert. Killing a stopped server is a no-op.
func (s *Server) Kill() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.killLocked()
}

func (s *Server) killLocked() error {
	p := s.proc
	if p == nil || p.Exited() {
		return nil
	}
	if err := p.Signal(syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill clickhouse: %w", err)
	}
	<-p.Done()
	return nil
}

// Pause freezes the server with SIGSTOP: its ports stay open but nothing answers, as
// with a hung server or a network partition. Resume undoes it.
func (s *Server) Pause() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.proc.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause clickhouse: %w", err)
	}
	return nil
}

// Resume continues a server frozen by Pause.
func (s *Server) Resume() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.proc.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume clickhouse: %w", err)
	}
	return nil
}

// Restart stops the server if it runs (as Stop does) and starts it again on the same
// Dir and ports, returning once it answers. Use it after Kill or Stop to bring
// ClickHouse back for clients that remember its address.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(ctx); err != nil {
		return fmt.Errorf("restart clickhouse: %w", err)
	}
	if err := s.runLocked(ctx); err != nil {
		return fmt.Errorf("restart clickhouse in %s: %w", s.dir, err)
	}
	return nil
}

func (s *Server) current() *childproc.Process {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc
}

// run starts the binary and waits until the server answers.
func (s *Server) run(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runLocked(ctx)
}

func (s *Server) runLocked(ctx context.Context) error {
	begin := time.Now()
	errLogAt := childproc.FileSize(filepath.Join(s.dir, errorLog))
	stdoutAt := childproc.FileSize(filepath.Join(s.dir, stdoutLog))
	p, err := s.spawn()
	if err != nil {
		return err
	}
	s.proc = p

	ctx, cancel := context.WithTimeout(ctx, s.startTimeout)
	defer cancel()
	var last error
	for {
		if last = ping(ctx, s.Addr()); last == nil {
			s.log.Info("clickhouse ready", "addr", s.Addr(), "pid", p.Pid(), "dir", s.dir, "took", time.Since(begin))
			return nil
		}
		select {
		case <-p.Done():
			return &exitError{
				status: p.Err(),
				tail:   tailOf(filepath.Join(s.dir, errorLog), errLogAt, filepath.Join(s.dir, stdoutLog), stdoutAt),
			}
		case <-ctx.Done():
			_ = s.killLocked()
			return fmt.Errorf("wait for clickhouse on %s: %w (last probe: %v)", s.Addr(), ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

// spawn starts the binary in its own process group, records its pid and reaps it in
// the background.
func (s *Server) spawn() (*childproc.Process, error) {
	args := append(append([]string{}, s.bin[1:]...), "--config-file="+filepath.Join(s.dir, configFile))
	cmd := exec.Command(s.bin[0], args...)
	cmd.Dir = s.dir
	// Newer releases fork a watchdog parent by default; keep one process to signal.
	cmd.Env = append(os.Environ(), "CLICKHOUSE_WATCHDOG_ENABLE=0")
	return childproc.Spawn(cmd, "clickhouse", filepath.Join(s.dir, stdoutLog), filepath.Join(s.dir, pidFile), s.log)
}

// ping reports whether the server answers SELECT 1 over the native protocol.
func ping(ctx context.Context, addr string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:         []string{addr},
		DialTimeout:  time.Second,
		ReadTimeout:  5 * time.Second,
		MaxOpenConns: 1,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	var one uint8
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// findBinary returns the command that runs a ClickHouse server: explicit, then
// clickhouse-server in PATH, /usr/sbin, /usr/bin, then the multi-call clickhouse
// binary with its "server" argument.
func findBinary(explicit string) ([]string, error) {
	if explicit != "" {
		path, err := exec.LookPath(explicit)
		if err != nil {
			return nil, fmt.Errorf("%w (Options.Binary %q: %v)", ErrNotInstalled, explicit, err)
		}
		return []string{path}, nil
	}
	for _, cand := range []struct {
		name string
		args []string
	}{
		{"clickhouse-server", nil},
		{"/usr/sbin/clickhouse-server", nil},
		{"/usr/bin/clickhouse-server", nil},
		{"clickhouse", []string{"server"}},
		{"/usr/bin/clickhouse", []string{"server"}},
	} {
		if path, err := exec.LookPath(cand.name); err == nil {
			return append([]string{path}, cand.args...), nil
		}
	}
	return nil, ErrNotInstalled
}

// choosePorts returns the given ports, replacing zeros with free ports of 127.0.0.1.
// Both listeners are held until both ports are known so they differ.
func choosePorts(tcp, http int) (int, int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	pick := func(p int) (int, error) {
		if p != 0 {
			return p, nil
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("pick a free port: %w", err)
		}
		held = append(held, l)
		return l.Addr().(*net.TCPAddr).Port, nil
	}
	tcp, err := pick(tcp)
	if err != nil {
		return 0, 0, err
	}
	http, err = pick(http)
	if err != nil {
		return 0, 0, err
	}
	return tcp, http, nil
}

// exitError is returned when the server exits before it is ready.
type exitError struct {
	status error
	tail   string
}

func (e *exitError) Error() string {
	if e.tail == "" {
		return fmt.Sprintf("clickhouse exited before it was ready (%v) and logged nothing", e.status)
	}
	return fmt.Sprintf("clickhouse exited before it was ready (%v); end of its log:\n%s", e.status, e.tail)
}

func (e *exitError) Unwrap() error { return e.status }

// portInUse reports whether the server's log says it could not bind port.
func (e *exitError) portInUse(port int) bool {
	return strings.Contains(e.tail, "Address already in use") &&
		strings.Contains(e.tail, "127.0.0.1:"+strconv.Itoa(port))
}

// tailOf returns the last lines written to the error log since offset errAt, or
// those of the stdout log when the server died before its logger was set up.
func tailOf(errPath string, errAt int64, outPath string, outAt int64) string {
	if t := childproc.Tail(errPath, errAt); t != "" {
		return t
	}
	return childproc.Tail(outPath, outAt)
}
