package temporallocal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// Bounds of the process lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the frontend to answer.
	DefaultStartTimeout = 60 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 10 * time.Second
	// pollInterval is the pause between readiness probes.
	pollInterval = 25 * time.Millisecond
	// portAttempts is how often Start picks fresh ports when one was taken between
	// picking it and the server binding it.
	portAttempts = 3
)

// Files under Options.Dir.
const (
	dbFile  = "temporal.db"
	pidFile = "temporal.pid"
	logFile = "temporal.log"
)

// Namespace is the namespace the dev server creates and gauntlet uses.
const Namespace = "default"

// ErrNotInstalled is wrapped by Start's error when no temporal binary can be found.
var ErrNotInstalled = errors.New("temporal CLI not found in PATH or $(go env GOPATH)/bin: run scripts/deps.sh")

// fastFlags make the dev server quick enough for episodes: the defaults poll the history
// queues so slowly that activities and timers wait on the polls (docs/benchmarks.md, Costs
// the code cites, Local servers).
var fastFlags = []string{
	"--dynamic-config-value", "history.transferProcessorMaxPollRPS=10000",
	"--dynamic-config-value", "history.timerProcessorMaxPollRPS=10000",
	"--dynamic-config-value", "history.visibilityProcessorMaxPollRPS=10000",
	"--dynamic-config-value", "history.outboundProcessorMaxPollRPS=10000",
	"--dynamic-config-value", "matching.numTaskqueueReadPartitions=1",
	"--dynamic-config-value", "matching.numTaskqueueWritePartitions=1",
	"--sqlite-pragma", "journal_mode=wal",
	"--sqlite-pragma", "synchronous=normal",
}

// Options configures Start.
type Options struct {
	// Dir holds the SQLite database, the log and the pid file. It is created when
	// missing and kept on Stop. Required.
	Dir string
	// Port is the frontend (gRPC) port on 127.0.0.1; 0 picks a free one.
	Port int
	// UIPort is the Web UI port on 127.0.0.1; 0 picks a free one. Ignored when NoUI.
	UIPort int
	// NoUI runs the server headless.
	NoUI bool
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds the wait for the frontend; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// Binary is the temporal executable; empty finds it in PATH, then in
	// $(go env GOPATH)/bin.
	Binary string
	// SearchAttributes are custom search attributes the server registers in its
	// namespace at start, by name, with their types (Keyword, Int, Text, Double, Bool,
	// Datetime, KeywordList): workflows may set only registered ones.
	SearchAttributes map[string]string
}

// Server is a Temporal dev server process owned by this program.
type Server struct {
	dir          string
	bin          string
	port, uiPort int
	httpPort     int
	metricsPort  int
	noUI         bool
	searchAttrs  []string // NAME=TYPE, sorted
	d            *childproc.Daemon
}

// Start starts a Temporal dev server with its database under opts.Dir and returns once
// its frontend answers a health check. A server left running on the same Dir by a
// crashed program is killed first.
func Start(ctx context.Context, opts Options) (*Server, error) {
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start temporal: %w", err)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	bin, err := FindBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("start temporal: %w", err)
	}
	s := &Server{dir: dir, bin: bin, noUI: opts.NoUI}
	for name, typ := range opts.SearchAttributes {
		s.searchAttrs = append(s.searchAttrs, name+"="+typ)
	}
	sort.Strings(s.searchAttrs)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start temporal: %w", err)
	}
	s.d = childproc.NewDaemon(childproc.Recipe{
		Name:         "temporal",
		Command:      s.command,
		LogPath:      filepath.Join(dir, logFile),
		PidFile:      filepath.Join(dir, pidFile),
		Owns:         func(pid int) bool { return childproc.CmdlineContains(pid, filepath.Join(dir, dbFile)) },
		OpenProbe:    s.probe,
		Listens:      func() []int { return []int{s.port} },
		Describe:     func() []any { return []any{"addr", s.Addr(), "ui", s.UIURL()} },
		PollInterval: pollInterval,
		StartTimeout: opts.StartTimeout,
		StopGrace:    stopGrace,
	}, opts.Logger)
	if err := s.d.KillLeftover(); err != nil {
		return nil, fmt.Errorf("start temporal: %w", err)
	}
	pick := func() error {
		ports, err := childproc.FreePorts(opts.Port, opts.UIPort, 0, 0)
		if err != nil {
			return err
		}
		s.port, s.uiPort, s.httpPort, s.metricsPort = ports[0], ports[1], ports[2], ports[3]
		return nil
	}
	taken := func(ee *childproc.ExitError) bool { return strings.Contains(ee.Tail, "address already in use") }
	if err := s.d.StartOnFreePorts(ctx, portAttempts, pick, taken); err != nil {
		return nil, fmt.Errorf("start temporal in %s: %w", dir, err)
	}
	return s, nil
}

// Addr is the frontend's host:port, what SDK clients and `temporal --address` dial.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// UIURL is the Web UI's address, or "" when the server runs headless.
func (s *Server) UIURL() string {
	if s.noUI {
		return ""
	}
	return "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(s.uiPort))
}

// Dir is the absolute directory holding the server's database and log.
func (s *Server) Dir() string { return s.dir }

// Pid is the server's process id, or 0 when it has exited.
func (s *Server) Pid() int { return s.d.Pid() }

// Done is closed when the current server process exits.
func (s *Server) Done() <-chan struct{} { return s.d.Done() }

// Supervise returns a supervisor that, while it runs, restarts the server whenever it
// exits without Stop (a crash, a kill -9) on the same Dir and ports, with backoff b, and
// tells meanwhile that it is down.
func (s *Server) Supervise(b childproc.Backoff) *childproc.Supervisor {
	return childproc.NewSupervisor(s.d, b)
}

// Stop shuts the server down: SIGTERM, then SIGKILL after 10 s or when ctx ends first.
// The database is kept. Stopping a stopped server is a no-op.
func (s *Server) Stop(ctx context.Context) error { return s.d.Stop(ctx) }

// Kill ends the server with SIGKILL, as a crash would, and waits until it is gone.
func (s *Server) Kill() error { return s.d.Kill() }

// Restart stops the server if it runs and starts it again on the same Dir and ports.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.d.Restart(ctx); err != nil {
		return fmt.Errorf("restart temporal in %s: %w", s.dir, err)
	}
	return nil
}

// command runs the dev server on the current ports.
func (s *Server) command() (*exec.Cmd, error) {
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Dir = s.dir
	return cmd, nil
}

// probe opens the readiness probe: the frontend's health check, then the default
// namespace, which is registered just after the frontend starts serving.
func (s *Server) probe() (childproc.Probe, func(), error) {
	c, err := client.NewLazyClient(client.Options{
		HostPort: s.Addr(), Namespace: Namespace, Logger: quietLogger{},
	})
	if err != nil {
		return nil, nil, fmt.Errorf("temporal client for %s: %w", s.Addr(), err)
	}
	probe := func(ctx context.Context) error {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := c.CheckHealth(pctx, &client.CheckHealthRequest{}); err != nil {
			return err
		}
		_, err := c.DescribeTaskQueue(pctx, "gauntlet-readiness", 1)
		return err
	}
	return probe, c.Close, nil
}

// args is the command line of the dev server.
func (s *Server) args() []string {
	a := []string{"server", "start-dev",
		"--ip", "127.0.0.1",
		"--port", strconv.Itoa(s.port),
		"--http-port", strconv.Itoa(s.httpPort),
		"--metrics-port", strconv.Itoa(s.metricsPort),
		"--db-filename", filepath.Join(s.dir, dbFile),
		"--log-level", "warn",
	}
	if s.noUI {
		a = append(a, "--headless")
	} else {
		a = append(a, "--ui-ip", "127.0.0.1", "--ui-port", strconv.Itoa(s.uiPort))
	}
	for _, sa := range s.searchAttrs {
		a = append(a, "--search-attribute", sa)
	}
	return append(a, fastFlags...)
}

// FindBinary returns the temporal executable: explicit, else "temporal" in PATH, else
// $(go env GOPATH)/bin/temporal (where scripts/deps.sh installs it), else $HOME/go/bin.
func FindBinary(explicit string) (string, error) {
	if explicit != "" {
		path, err := exec.LookPath(explicit)
		if err != nil {
			return "", fmt.Errorf("%w (Options.Binary %q: %v)", ErrNotInstalled, explicit, err)
		}
		return path, nil
	}
	if path, err := exec.LookPath("temporal"); err == nil {
		return path, nil
	}
	var dirs []string
	if gp := os.Getenv("GOPATH"); gp != "" {
		for _, d := range filepath.SplitList(gp) {
			dirs = append(dirs, filepath.Join(d, "bin"))
		}
	}
	if gb := os.Getenv("GOBIN"); gb != "" {
		dirs = append(dirs, gb)
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, d := range filepath.SplitList(strings.TrimSpace(string(out))) {
			dirs = append(dirs, filepath.Join(d, "bin"))
		}
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "temporal")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", ErrNotInstalled
}

// quietLogger drops the SDK client's own log lines during readiness probes.
type quietLogger struct{}

func (quietLogger) Debug(string, ...any) {}
func (quietLogger) Info(string, ...any)  {}
func (quietLogger) Warn(string, ...any)  {}
func (quietLogger) Error(string, ...any) {}
