package chlocal

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// Bounds of the process lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the server to answer.
	DefaultStartTimeout = 60 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL: well
	// above what a clean shutdown of ClickHouse 18.16 takes (docs/benchmarks.md, Costs
	// the code cites, Local servers).
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
	// Replication, when set, starts the server as one replica of a one-shard
	// replicated cluster; nil (the default) starts a single server, as always.
	// StartCluster fills it for every replica of a local cluster.
	Replication *Replication
}

// DefaultCluster is the cluster's name in remote_servers and in the {cluster} macro.
const DefaultCluster = "gauntlet"

// DefaultSessionTimeout is the replicas' ZooKeeper session timeout. A replica killed
// and restarted within it waits for its old session to expire before it is active
// again, so it is shorter than ClickHouse's 30 s; ZooKeeper's tickTime of 2 s allows
// 4 to 40 s.
const DefaultSessionTimeout = 10 * time.Second

// Replication makes a server one replica of a one-shard replicated cluster: it gets
// ZooKeeper, the {cluster}, {shard} and {replica} macros that pkg/trajectory's
// migrations put into the paths of Replicated* tables, a remote_servers entry
// naming every replica (internal_replication on, for Distributed tables and the
// cluster() function), an interserver port the other replicas fetch parts from, and
// distributed DDL (ON CLUSTER).
type Replication struct {
	// ZooKeeper are the coordinator's client addresses (host:port). Required.
	ZooKeeper []string
	// Cluster names the cluster; empty means DefaultCluster. Letters, digits and
	// underscores only: it is an XML element's name.
	Cluster string
	// Shard is the {shard} macro; empty means "01".
	Shard string
	// Replica is the {replica} macro, distinct per server. Required.
	Replica string
	// Replicas are the native addresses (host:port) of every replica of the shard,
	// this server's Options.TCPPort on 127.0.0.1 included. Required.
	Replicas []string
	// InterserverPort is the HTTP port on 127.0.0.1 the other replicas fetch parts
	// from; 0 picks a free one.
	InterserverPort int
	// SessionTimeout is the ZooKeeper session timeout; 0 means DefaultSessionTimeout.
	SessionTimeout time.Duration
}

// values checks r and returns it as config values, for a server on tcpPort.
func (r *Replication) values(tcpPort int) (*replicationValues, error) {
	v := &replicationValues{
		InterserverPort:  r.InterserverPort,
		SessionTimeoutMs: r.SessionTimeout.Milliseconds(),
		Cluster:          r.Cluster,
		Shard:            r.Shard,
		Replica:          r.Replica,
	}
	if v.Cluster == "" {
		v.Cluster = DefaultCluster
	}
	if v.Shard == "" {
		v.Shard = "01"
	}
	if v.SessionTimeoutMs <= 0 {
		v.SessionTimeoutMs = DefaultSessionTimeout.Milliseconds()
	}
	var errs []error
	if !identRE.MatchString(v.Cluster) {
		errs = append(errs, fmt.Errorf("cluster %q: want letters, digits and underscores", v.Cluster))
	}
	if r.Replica == "" {
		errs = append(errs, errors.New("replica: must not be empty"))
	}
	var err error
	if v.ZooKeeper, err = splitHostPorts(r.ZooKeeper); err != nil || len(v.ZooKeeper) == 0 {
		errs = append(errs, fmt.Errorf("zookeeper %q: want host:port addresses: %v", r.ZooKeeper, err))
	}
	if v.Replicas, err = splitHostPorts(r.Replicas); err != nil {
		errs = append(errs, fmt.Errorf("replicas %q: want host:port addresses: %w", r.Replicas, err))
	}
	listed := false
	for _, hp := range v.Replicas {
		listed = listed || (hp.Port == tcpPort && tcpPort != 0)
	}
	if !listed {
		errs = append(errs, fmt.Errorf("replicas %q: must list this server's TCPPort %d (a fixed port)", r.Replicas, tcpPort))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	return v, nil
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Server is a ClickHouse server process owned by this program. Its ports and Dir
// stay fixed for its lifetime, across Kill and Restart.
type Server struct {
	dir      string
	bin      []string // executable and leading arguments
	tcpPort  int
	httpPort int
	repl     *replicationValues // nil for a single server
	instance string             // this start's value of the instanceMacro macro
	d        *childproc.Daemon
}

// instanceMacro is the macro in every config.xml that names the server started from
// it: a random value written at each start. Tests of several packages start servers
// at once, and a port picked free may be bound by another package's server before
// this one binds it; this one then exits, and a probe satisfied by any answer at its
// port would have taken the other server's for its own.
const instanceMacro = "gauntlet_instance"

// Start starts a ClickHouse server with its state under opts.Dir and returns once it
// answers `SELECT 1` over the native protocol. A server left running on the same Dir
// by an earlier, crashed program is killed first.
//
// Its start and stop times are in docs/benchmarks.md, Costs the code cites, Local
// servers.
//
// If the server exits before it is ready, the error includes the tail of its error
// log. If no binary is found, the error wraps ErrNotInstalled.
func Start(ctx context.Context, opts Options) (*Server, error) {
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	bin, err := findBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	s := &Server{dir: dir, bin: bin}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	s.d = childproc.NewDaemon(childproc.Recipe{
		Name:         "clickhouse",
		Command:      s.command,
		LogPath:      filepath.Join(dir, stdoutLog),
		PidFile:      filepath.Join(dir, pidFile),
		Owns:         func(pid int) bool { return childproc.CmdlineContains(pid, filepath.Join(dir, configFile)) },
		TailLogs:     []string{filepath.Join(dir, errorLog), filepath.Join(dir, stdoutLog)},
		OpenProbe:    s.probe,
		Describe:     func() []any { return []any{"addr", s.Addr(), "dir", dir} },
		PollInterval: pollInterval,
		StartTimeout: opts.StartTimeout,
		StopGrace:    stopGrace,
	}, opts.Logger)
	if err := s.d.KillLeftover(); err != nil {
		return nil, fmt.Errorf("start clickhouse: %w", err)
	}
	if r := opts.Replication; r != nil {
		if s.repl, err = r.values(opts.TCPPort); err != nil {
			return nil, fmt.Errorf("start clickhouse: %w", err)
		}
	}
	pick := func() error {
		ports, err := childproc.FreePorts(opts.TCPPort, opts.HTTPPort)
		if err != nil {
			return err
		}
		s.tcpPort, s.httpPort = ports[0], ports[1]
		if s.repl != nil {
			if ports, err = childproc.FreePorts(opts.Replication.InterserverPort); err != nil {
				return err
			}
			s.repl.InterserverPort = ports[0]
		}
		var b [8]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		s.instance = hex.EncodeToString(b[:])
		return writeConfig(dir, s.instance, s.tcpPort, s.httpPort, s.repl)
	}
	// Only a port we picked can have been taken in between; a given one stays an error.
	taken := func(ee *childproc.ExitError) bool {
		return (opts.TCPPort == 0 && portInUse(ee, s.tcpPort)) || (opts.HTTPPort == 0 && portInUse(ee, s.httpPort)) ||
			(s.repl != nil && opts.Replication.InterserverPort == 0 && portInUse(ee, s.repl.InterserverPort))
	}
	if err := s.d.StartOnFreePorts(ctx, portAttempts, pick, taken); err != nil {
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

// Replica returns the server's {replica} macro, "" for a single server.
func (s *Server) Replica() string {
	if s.repl == nil {
		return ""
	}
	return s.repl.Replica
}

// Dir returns the absolute directory holding the server's state.
func (s *Server) Dir() string { return s.dir }

// Pid returns the process id of the current server process, or 0 when it has exited.
func (s *Server) Pid() int { return s.d.Pid() }

// Done returns a channel that is closed when the current server process exits. After
// Restart a new channel is returned.
func (s *Server) Done() <-chan struct{} { return s.d.Done() }

// Wait blocks until the current server process exits and returns its exit status
// (nil for a clean exit).
func (s *Server) Wait() error { return s.d.Wait() }

// Supervise returns a supervisor that, while it runs, restarts the server whenever it
// exits without Stop (a crash, a kill -9) on the same Dir and ports, with backoff b, and
// tells meanwhile that it is down.
func (s *Server) Supervise(b childproc.Backoff) *childproc.Supervisor {
	return childproc.NewSupervisor(s.d, b)
}

// Stop shuts the server down: SIGTERM, then SIGKILL if it has not exited after 15 s
// or when ctx ends first. The data in Dir is kept. Stopping a stopped server is a
// no-op.
func (s *Server) Stop(ctx context.Context) error { return s.d.Stop(ctx) }

// Kill ends the server with SIGKILL, as a crash would, and waits until it is gone.
// The data in Dir is kept (ClickHouse's inserts are atomic per part), so Restart
// brings back every acknowledged insert. Killing a stopped server is a no-op.
func (s *Server) Kill() error { return s.d.Kill() }

// Pause freezes the server with SIGSTOP: its ports stay open but nothing answers, as
// with a hung server or a network partition. Resume undoes it.
func (s *Server) Pause() error {
	if err := s.d.Signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pause clickhouse: %w", err)
	}
	return nil
}

// Resume continues a server frozen by Pause.
func (s *Server) Resume() error {
	if err := s.d.Signal(syscall.SIGCONT); err != nil {
		return fmt.Errorf("resume clickhouse: %w", err)
	}
	return nil
}

// Restart stops the server if it runs (as Stop does) and starts it again on the same
// Dir and ports, returning once it answers. Use it after Kill or Stop to bring
// ClickHouse back for clients that remember its address.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.d.Restart(ctx); err != nil {
		return fmt.Errorf("restart clickhouse in %s: %w", s.dir, err)
	}
	return nil
}

// command is the server's command line: the config file written for the current ports.
func (s *Server) command() (*exec.Cmd, error) {
	args := append(append([]string{}, s.bin[1:]...), "--config-file="+filepath.Join(s.dir, configFile))
	cmd := exec.Command(s.bin[0], args...)
	cmd.Dir = s.dir
	// Newer releases fork a watchdog parent by default; keep one process to signal.
	cmd.Env = append(os.Environ(), "CLICKHOUSE_WATCHDOG_ENABLE=0")
	return cmd, nil
}

// probe opens the readiness probe: the server at this server's address answers with
// this start's instance macro, so an answer from another server on the same port is
// not readiness.
func (s *Server) probe() (childproc.Probe, func(), error) {
	addr, want := s.Addr(), s.instance
	return func(ctx context.Context) error {
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
		var got string
		q := "SELECT substitution FROM system.macros WHERE macro = '" + instanceMacro + "'"
		if err := conn.QueryRow(ctx, q).Scan(&got); err != nil {
			return err
		}
		if got != want {
			return fmt.Errorf("%s is answered by another clickhouse server (%s %q, this one's %q)", addr, instanceMacro, got, want)
		}
		return nil
	}, func() {}, nil
}

// Ping reports whether the ClickHouse server at addr (host:port, native protocol) answers
// SELECT 1: nil when it does, else what the attempt met. addr may list the replicas of a
// replicated cluster, comma-separated: nil then when one of them answers, as a client
// failing over from one to the next is served. It opens and closes a connection of its
// own; ctx bounds it.
func Ping(ctx context.Context, addr string) error {
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:         strings.Split(addr, ","),
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

// portInUse reports whether the server's log says it could not bind port.
func portInUse(e *childproc.ExitError, port int) bool {
	return strings.Contains(e.Tail, "Address already in use") &&
		strings.Contains(e.Tail, "127.0.0.1:"+strconv.Itoa(port))
}
