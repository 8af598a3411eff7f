package zklocal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// Bounds of the process lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the server to answer. A JVM
	// start takes about 1.3 s on an idle 2-core machine (docs/benchmarks.md, Costs the
	// code cites, Local servers); a loaded one takes several times that.
	DefaultStartTimeout = 60 * time.Second
	// DefaultHeap is the JVM's -Xmx: a development ZooKeeper holding the state of a
	// few dozen replicated tables needs a few megabytes of it.
	DefaultHeap = "256m"
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 10 * time.Second
	// pollInterval is the pause between readiness probes.
	pollInterval = 50 * time.Millisecond
	// portAttempts is how often Start picks a fresh port when the picked one was
	// taken between picking it and the server binding it.
	portAttempts = 3
)

// Files and folders under Options.Dir.
const (
	configFile = "zoo.cfg"
	pidFile    = "zookeeper.pid"
	logFile    = "zookeeper.log"
	dataDir    = "data"
)

// Where Debian's zookeeper package puts the server: the jar names its dependencies in
// its manifest's Class-Path.
const (
	debianJar = "/usr/share/java/zookeeper.jar"
	mainClass = "org.apache.zookeeper.server.ZooKeeperServerMain"
)

// ErrNotInstalled is wrapped by Start's error when Java or the ZooKeeper jar is missing.
var ErrNotInstalled = errors.New("zookeeper not installed (java in PATH and " + debianJar + "): run scripts/deps.sh")

// Options configures Start.
type Options struct {
	// Dir holds everything the server writes: config, data, log, pid file. It is
	// created when missing and kept on Stop. Required.
	Dir string
	// Port is the client port on 127.0.0.1; 0 picks a free one.
	Port int
	// Heap is the JVM's maximum heap (-Xmx), as Java spells it; empty means DefaultHeap.
	Heap string
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds the wait for the server to answer; 0 means
	// DefaultStartTimeout. The context given to Start can shorten it.
	StartTimeout time.Duration
}

// Server is a ZooKeeper server process owned by this program. Its port and Dir stay
// fixed for its lifetime, across Kill and Restart.
type Server struct {
	dir  string
	java string
	heap string
	port int
	d    *childproc.Daemon
}

// Start starts a standalone ZooKeeper with its state under opts.Dir and returns once it
// serves clients (Ping). A server left running on the same Dir by an earlier, crashed program is
// killed first.
func Start(ctx context.Context, opts Options) (*Server, error) {
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start zookeeper: %w", err)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.Heap == "" {
		opts.Heap = DefaultHeap
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return nil, fmt.Errorf("start zookeeper: %w (java: %v)", ErrNotInstalled, err)
	}
	if _, err := os.Stat(debianJar); err != nil {
		return nil, fmt.Errorf("start zookeeper: %w (%v)", ErrNotInstalled, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, dataDir), 0o755); err != nil {
		return nil, fmt.Errorf("start zookeeper: %w", err)
	}
	s := &Server{dir: dir, java: java, heap: opts.Heap}
	s.d = childproc.NewDaemon(childproc.Recipe{
		Name:         "zookeeper",
		Command:      s.command,
		LogPath:      filepath.Join(dir, logFile),
		PidFile:      filepath.Join(dir, pidFile),
		Owns:         func(pid int) bool { return childproc.CmdlineContains(pid, filepath.Join(dir, configFile)) },
		OpenProbe:    s.probe,
		Listens:      func() []int { return []int{s.port} },
		Describe:     func() []any { return []any{"addr", s.Addr(), "dir", dir} },
		PollInterval: pollInterval,
		StartTimeout: opts.StartTimeout,
		StopGrace:    stopGrace,
	}, opts.Logger)
	if err := s.d.KillLeftover(); err != nil {
		return nil, fmt.Errorf("start zookeeper: %w", err)
	}
	pick := func() error {
		ports, err := childproc.FreePorts(opts.Port)
		if err != nil {
			return err
		}
		s.port = ports[0]
		return s.writeConfig()
	}
	taken := func(ee *childproc.ExitError) bool {
		return opts.Port == 0 && strings.Contains(ee.Tail, "Address already in use")
	}
	if err := s.d.StartOnFreePorts(ctx, portAttempts, pick, taken); err != nil {
		return nil, fmt.Errorf("start zookeeper in %s: %w", dir, err)
	}
	return s, nil
}

// writeConfig writes zoo.cfg for the current port. The admin web server (port 8080 by
// default) is off: two of them on one machine collide, and nothing here uses it.
func (s *Server) writeConfig() error {
	cfg := fmt.Sprintf(`# Written by gauntlet's pkg/zklocal on every start: edits are overwritten.
tickTime=2000
dataDir=%s
clientPort=%d
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
maxClientCnxns=0
autopurge.snapRetainCount=3
autopurge.purgeInterval=1
`, filepath.Join(s.dir, dataDir), s.port)
	if err := os.WriteFile(filepath.Join(s.dir, configFile), []byte(cfg), 0o644); err != nil {
		return fmt.Errorf("write zookeeper config: %w", err)
	}
	return nil
}

// command is the JVM's command line. A serial collector and the client compiler keep
// a server that idles most of the time small and quick to start.
func (s *Server) command() (*exec.Cmd, error) {
	cmd := exec.Command(s.java,
		"-Xmx"+s.heap, "-Xss512k", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dzookeeper.admin.enableServer=false",
		"-cp", debianJar, mainClass, filepath.Join(s.dir, configFile))
	cmd.Dir = s.dir
	return cmd, nil
}

// probe opens the readiness probe: Ping.
func (s *Server) probe() (childproc.Probe, func(), error) {
	addr := s.Addr()
	return func(ctx context.Context) error { return Ping(ctx, addr) }, func() {}, nil
}

// Addr returns the client address, "127.0.0.1:port".
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the client port.
func (s *Server) Port() int { return s.port }

// Dir returns the absolute directory holding the server's state.
func (s *Server) Dir() string { return s.dir }

// Pid returns the process id of the current server process, or 0 when it has exited.
func (s *Server) Pid() int { return s.d.Pid() }

// Supervise returns a supervisor that, while it runs, restarts the server whenever it
// exits without Stop (a crash, a kill -9) on the same Dir and port, with backoff b, and
// tells meanwhile that it is down.
func (s *Server) Supervise(b childproc.Backoff) *childproc.Supervisor {
	return childproc.NewSupervisor(s.d, b)
}

// Stop shuts the server down: SIGTERM, then SIGKILL if it has not exited after 10 s or
// when ctx ends first. The data in Dir is kept. Stopping a stopped server is a no-op.
func (s *Server) Stop(ctx context.Context) error { return s.d.Stop(ctx) }

// Kill ends the server with SIGKILL, as a crash would, and waits until it is gone.
// ZooKeeper syncs its transaction log before it answers, so Restart brings back every
// acknowledged write. Killing a stopped server is a no-op.
func (s *Server) Kill() error { return s.d.Kill() }

// Restart stops the server if it runs and starts it again on the same Dir and port,
// returning once it answers.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.d.Restart(ctx); err != nil {
		return fmt.Errorf("restart zookeeper in %s: %w", s.dir, err)
	}
	return nil
}

// Ping reports whether the ZooKeeper server at addr (host:port) serves clients: nil when
// it answers the srvr four-letter word with its version, else what the attempt met.
// ruok is not enough: it answers imok as soon as the port is open, while sessions are
// still refused (a client then fails its handshake). ctx bounds it.
func Ping(ctx context.Context, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	deadline := time.Now().Add(2 * time.Second)
	if dl, ok := ctx.Deadline(); ok && dl.Before(deadline) {
		deadline = dl
	}
	if err := conn.SetDeadline(deadline); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(conn, 4096))
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(b), "Zookeeper version:") {
		return fmt.Errorf("zookeeper at %s is not serving: %q", addr, strings.TrimSpace(string(b)))
	}
	return nil
}
