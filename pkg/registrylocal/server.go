package registrylocal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// Bounds of the registry's lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the registry to answer.
	DefaultStartTimeout = 30 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
	stopGrace = 10 * time.Second
	// pollInterval is the pause between readiness probes.
	pollInterval = 10 * time.Millisecond
	// portAttempts is how often Start picks a fresh port when the one it picked was
	// taken before the registry bound it.
	portAttempts = 3
)

// ErrNotInstalled is wrapped by Start's error when docker-registry is missing.
var ErrNotInstalled = errors.New("docker-registry not found in PATH or /usr/bin: run scripts/deps.sh")

// Options configures Start.
type Options struct {
	// Dir holds everything the registry writes: config.yml, data/ (its storage),
	// registry.log and the pid file. It is created when missing. Required.
	Dir string
	// Port is the loopback port to listen on; 0 picks a free one.
	Port int
	// Htpasswd, when set, is an htpasswd file (bcrypt entries, as `htpasswd -B` writes)
	// and the registry asks every client for basic auth against it: the shape of a
	// private registry, for tests of credentials. Empty serves everyone.
	Htpasswd string
	// Binary is the docker-registry executable; empty finds it in PATH and /usr/bin.
	Binary string
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds the wait for the registry to answer; 0 means
	// DefaultStartTimeout. The context given to Start can shorten it.
	StartTimeout time.Duration
}

// Server is a docker-registry process owned by this program.
type Server struct {
	dir      string
	bin      string
	port     int
	htpasswd string

	d *childproc.Daemon
}

// Start starts the registry with its storage under opts.Dir and returns once it
// answers. A registry left running on the same Dir by an earlier, crashed program is
// killed first.
func Start(ctx context.Context, opts Options) (*Server, error) {
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	if opts.Port < 0 || opts.Port > 65535 {
		return nil, fmt.Errorf("start registry: Options.Port is %d: must be 0 (pick one) or a port number", opts.Port)
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	bin, err := findBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	s := &Server{dir: dir, bin: bin}
	if opts.Htpasswd != "" {
		if s.htpasswd, err = filepath.Abs(opts.Htpasswd); err != nil {
			return nil, fmt.Errorf("start registry: Options.Htpasswd: %w", err)
		}
		if _, err := os.Stat(s.htpasswd); err != nil {
			return nil, fmt.Errorf("start registry: Options.Htpasswd: %w", err)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	s.d = childproc.NewDaemon(childproc.Recipe{
		Name:    "docker-registry",
		Command: s.command,
		LogPath: filepath.Join(dir, "registry.log"),
		PidFile: filepath.Join(dir, "registry.pid"),
		Owns: func(pid int) bool {
			return childproc.CmdlineContains(pid, filepath.Join(dir, "config.yml"))
		},
		OpenProbe:    s.probe,
		Listens:      func() []int { return []int{s.port} },
		Describe:     func() []any { return []any{"addr", s.Addr()} },
		PollInterval: pollInterval,
		StartTimeout: opts.StartTimeout,
		StopGrace:    stopGrace,
	}, opts.Logger)
	if err := s.d.KillLeftover(); err != nil {
		return nil, fmt.Errorf("start registry: %w", err)
	}
	pick := func() error {
		ports, err := childproc.FreePorts(opts.Port)
		if err != nil {
			return err
		}
		s.port = ports[0]
		if err := os.WriteFile(s.configPath(), []byte(s.config()), 0o644); err != nil {
			return fmt.Errorf("write config: %w", err)
		}
		return nil
	}
	taken := func(ee *childproc.ExitError) bool { return strings.Contains(ee.Tail, "address already in use") }
	if err := s.d.StartOnFreePorts(ctx, portAttempts, pick, taken); err != nil {
		return nil, fmt.Errorf("start registry in %s: %w", dir, err)
	}
	return s, nil
}

// Addr is the registry's host:port on the loopback interface, the first component of
// the references of the images it holds ("127.0.0.1:41234/debian:bookworm").
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Dir is the directory that holds the registry's config, storage and log.
func (s *Server) Dir() string { return s.dir }

// Pid is the registry's process id, or 0 when it is not running.
func (s *Server) Pid() int { return s.d.Pid() }

// Supervise returns a supervisor that, while it runs, restarts the registry whenever
// it exits without Stop (a crash, a kill -9) on the same storage and port, with
// backoff b, and tells meanwhile that it is down.
func (s *Server) Supervise(b childproc.Backoff) *childproc.Supervisor {
	return childproc.NewSupervisor(s.d, b)
}

// Stop sends SIGTERM and waits for the registry to exit (SIGKILL after a grace period
// or when ctx ends). The storage stays.
func (s *Server) Stop(ctx context.Context) error {
	if err := s.d.Stop(ctx); err != nil {
		return fmt.Errorf("stop registry: %w", err)
	}
	return nil
}

// Kill ends the registry with SIGKILL, as a crash would, and waits until it is gone.
func (s *Server) Kill() error { return s.d.Kill() }

func (s *Server) configPath() string { return filepath.Join(s.dir, "config.yml") }

// config is the registry's configuration (distribution's configuration.md): storage on
// the filesystem under Dir/data, deletes allowed so tests and operators can remove
// images, no auth unless Htpasswd is set, plain HTTP on loopback, the access log off (one
// line per request would drown the log that errors are quoted from).
func (s *Server) config() string {
	auth := ""
	if s.htpasswd != "" {
		auth = fmt.Sprintf("auth:\n  htpasswd:\n    realm: gauntlet\n    path: %s\n", strconv.Quote(s.htpasswd))
	}
	return auth + fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s
  delete:
    enabled: true
http:
  addr: %s
`, strconv.Quote(filepath.Join(s.dir, "data")), s.Addr())
}

func (s *Server) command() (*exec.Cmd, error) {
	cmd := exec.Command(s.bin, "serve", s.configPath())
	cmd.Dir = s.dir
	return cmd, nil
}

// probe answers nil once GET /v2/ (the registry API's version check) returns 200 (401
// when the registry asks for auth).
func (s *Server) probe() (childproc.Probe, func(), error) {
	c := &http.Client{Timeout: time.Second}
	probe := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr()+"/v2/", nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		// With auth, an anonymous GET is refused with 401: the registry answers.
		if resp.StatusCode != http.StatusOK && (s.htpasswd == "" || resp.StatusCode != http.StatusUnauthorized) {
			return fmt.Errorf("GET /v2/: %s", resp.Status)
		}
		return nil
	}
	return probe, c.CloseIdleConnections, nil
}

func findBinary(bin string) (string, error) {
	if bin != "" {
		if _, err := os.Stat(bin); err != nil {
			return "", fmt.Errorf("%w: %v", ErrNotInstalled, err)
		}
		return bin, nil
	}
	if p, err := exec.LookPath("docker-registry"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/bin/docker-registry"); err == nil {
		return "/usr/bin/docker-registry", nil
	}
	return "", ErrNotInstalled
}
