package natslocal

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
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
)

// ModulePath is the Go module of the NATS server gauntlet embeds and this package runs.
const ModulePath = "github.com/nats-io/nats-server/v2"

// Bounds of a node's lifecycle.
const (
	// DefaultStartTimeout bounds how long Start waits for the cluster to serve JetStream.
	DefaultStartTimeout = 60 * time.Second
	// stopGrace is how long a stop waits after SIGTERM (a node shuts down in well under a
	// second; lame-duck mode is not used) before it sends SIGKILL.
	stopGrace    = 10 * time.Second
	pollInterval = 50 * time.Millisecond
	// portAttempts is how often Start picks fresh ports when one was taken between
	// picking it and a node binding it.
	portAttempts = 3
	// maxPayload matches the embedded server's (bus.MaxPayload): score requests batch
	// many steps.
	maxPayload = "8MB"
)

var (
	// ErrNotInstalled is wrapped by Start's error when no nats-server binary of the
	// embedded version is found.
	ErrNotInstalled = errors.New("nats-server of the embedded version not found: run scripts/nats-server.sh")
	// ErrWrongVersion is wrapped by Start's error when the binary reports another version
	// than the one gauntlet embeds.
	ErrWrongVersion = errors.New("nats-server is not of the version gauntlet embeds")
)

// Version is the version of the NATS server gauntlet embeds ("v2.15.3"): the server
// package's own constant, so test binaries, which carry no module information, agree with
// gauntlet's.
func Version() string { return "v" + server.VERSION }

// BinaryName is the file name scripts/nats-server.sh gives the server of version v.
func BinaryName(v string) string { return "nats-server-" + v }

// Options configures Start.
type Options struct {
	// Dir holds one folder per node (n1, n2, ...): config, JetStream store, log, pid file.
	// Created when missing and kept on Stop. Required.
	Dir string
	// Nodes is the cluster's size; 0 means 3. One node runs without cluster routes.
	Nodes int
	// Binary is the nats-server executable; empty finds BinaryName(Version()) in PATH,
	// then in $(go env GOPATH)/bin, where scripts/nats-server.sh builds it.
	Binary string
	// MaxFileStore caps each node's JetStream file store (bytes); 0 means 40 GiB, above
	// the 32 GiB gauntlet's events stream reserves and below what a server would take of
	// a big disk. JetStream reserves a stream's max_bytes on every node holding a replica.
	MaxFileStore int64
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
	// StartTimeout bounds the wait for the cluster; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
}

// Cluster is a running set of nats-server processes, routed to each other as one
// JetStream cluster. Its nodes' ports stay fixed for its lifetime.
type Cluster struct {
	dir   string
	bin   string
	log   *slog.Logger
	nodes []*node
}

type node struct {
	name                    string
	dir                     string
	port, clusterPort, http int
	d                       *childproc.Daemon
}

// Files under a node's folder.
const (
	configFile = "nats.conf"
	logFile    = "nats.log"
	pidFile    = "nats.pid"
	storeDir   = "js"
)

// Start starts the cluster and returns once every node serves JetStream and the cluster
// has a meta leader. Nodes left running on the same Dir by a crashed program are killed
// first.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start nats cluster: %w", err)
	}
	if opts.Nodes <= 0 {
		opts.Nodes = 3
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.MaxFileStore <= 0 {
		opts.MaxFileStore = 40 << 30
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	bin, err := FindBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("start nats cluster: %w", err)
	}
	if err := CheckVersion(bin); err != nil {
		return nil, fmt.Errorf("start nats cluster: %w", err)
	}
	c := &Cluster{dir: dir, bin: bin, log: opts.Logger}
	for i := range opts.Nodes {
		n := &node{name: "n" + strconv.Itoa(i+1)}
		n.dir = filepath.Join(dir, n.name)
		if err := os.MkdirAll(filepath.Join(n.dir, storeDir), 0o755); err != nil {
			return nil, fmt.Errorf("start nats cluster: %w", err)
		}
		n.d = childproc.NewDaemon(c.recipe(n, opts.StartTimeout), opts.Logger.With("node", n.name))
		if err := n.d.KillLeftover(); err != nil {
			return nil, fmt.Errorf("start nats node %s: %w", n.name, err)
		}
		c.nodes = append(c.nodes, n)
	}
	for attempt := 1; ; attempt++ {
		err := c.startAll(ctx, opts.MaxFileStore)
		var ee *childproc.ExitError
		if err == nil {
			break
		}
		if attempt >= portAttempts || !errors.As(err, &ee) || !strings.Contains(ee.Tail, "address already in use") {
			_ = c.Stop(context.WithoutCancel(ctx))
			return nil, err
		}
		_ = c.Stop(context.WithoutCancel(ctx))
		opts.Logger.Warn("nats port taken, picking others", "attempt", attempt)
	}
	wctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		_ = c.Stop(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("start nats cluster in %s: %w", dir, err)
	}
	return c, nil
}

// startAll picks every node's ports, writes the configs and starts the nodes together: a
// clustered node serves JetStream only once it has peers, so none waits for another.
func (c *Cluster) startAll(ctx context.Context, maxStore int64) error {
	ports, err := childproc.FreePorts(make([]int, 3*len(c.nodes))...)
	if err != nil {
		return fmt.Errorf("start nats cluster: %w", err)
	}
	for i, n := range c.nodes {
		n.port, n.clusterPort, n.http = ports[3*i], ports[3*i+1], ports[3*i+2]
	}
	for _, n := range c.nodes {
		if err := c.writeConfig(n, maxStore); err != nil {
			return err
		}
	}
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.d.Start(ctx); err != nil {
				errs[i] = fmt.Errorf("start nats node %s: %w", n.name, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// writeConfig writes n's config file: its ports, its store, and routes to every node.
func (c *Cluster) writeConfig(n *node, maxStore int64) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by gauntlet's pkg/natslocal on every start: edits are overwritten.\n")
	fmt.Fprintf(&b, "server_name: %s\nhost: 127.0.0.1\nport: %d\nhttp: \"127.0.0.1:%d\"\n", n.name, n.port, n.http)
	fmt.Fprintf(&b, "max_payload: %s\n", maxPayload)
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  max_file_store: %d\n  max_memory_store: %d\n}\n",
		filepath.Join(n.dir, storeDir), maxStore, 256<<20)
	if len(c.nodes) > 1 {
		fmt.Fprintf(&b, "cluster {\n  name: gauntlet\n  host: 127.0.0.1\n  port: %d\n  routes: [\n", n.clusterPort)
		for _, o := range c.nodes {
			if o != n {
				fmt.Fprintf(&b, "    \"nats-route://127.0.0.1:%d\"\n", o.clusterPort)
			}
		}
		b.WriteString("  ]\n}\n")
	}
	if err := os.WriteFile(filepath.Join(n.dir, configFile), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("write nats config of %s: %w", n.name, err)
	}
	return nil
}

// recipe is how the Daemon runs n: the binary on its config file, ready once JetStream
// is enabled on it (the cluster's health is WaitHealthy's).
func (c *Cluster) recipe(n *node, timeout time.Duration) childproc.Recipe {
	conf := filepath.Join(n.dir, configFile)
	return childproc.Recipe{
		Name: "nats " + n.name,
		Command: func() (*exec.Cmd, error) {
			cmd := exec.Command(c.bin, "--config", conf)
			cmd.Dir = n.dir
			return cmd, nil
		},
		LogPath: filepath.Join(n.dir, logFile),
		PidFile: filepath.Join(n.dir, pidFile),
		Owns:    func(pid int) bool { return childproc.CmdlineContains(pid, conf) },
		OpenProbe: func() (childproc.Probe, func(), error) {
			return func(ctx context.Context) error { return healthz(ctx, n.http, true) }, func() {}, nil
		},
		Listens:      func() []int { return []int{n.port, n.http} },
		Describe:     func() []any { return []any{"url", n.url()} },
		PollInterval: pollInterval,
		StartTimeout: timeout,
		StopGrace:    stopGrace,
	}
}

func (n *node) url() string { return "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// healthz asks a node's monitoring endpoint whether it is healthy: with jsEnabledOnly,
// only whether JetStream runs on it; else also whether it is current with the cluster's
// meta leader and its streams.
func healthz(ctx context.Context, port int, jsEnabledOnly bool) error {
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/healthz"
	if jsEnabledOnly {
		url += "?js-enabled-only=true"
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var buf [512]byte
		k, _ := resp.Body.Read(buf[:])
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(buf[:k])))
	}
	return nil
}

// WaitHealthy waits until every running node reports itself healthy: JetStream enabled,
// a meta leader known, its stream replicas current.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for {
		var last error
		for _, n := range c.nodes {
			if err := healthz(ctx, n.http, false); err != nil {
				last = fmt.Errorf("node %s: %w", n.name, err)
				break
			}
		}
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for a healthy nats cluster: %w (last: %v)", ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

// URL is the client URL naming every node, comma-separated, as gauntlet's --nats takes it:
// a client fails over to another node when its own dies.
func (c *Cluster) URL() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.url()
	}
	return strings.Join(urls, ",")
}

// NodeURL is node i's client URL (i from 0).
func (c *Cluster) NodeURL(i int) string { return c.nodes[i].url() }

// Nodes is the cluster's size.
func (c *Cluster) Nodes() int { return len(c.nodes) }

// Dir is the absolute directory holding the nodes' state.
func (c *Cluster) Dir() string { return c.dir }

// Pid is node i's process id, 0 when it does not run.
func (c *Cluster) Pid(i int) int { return c.nodes[i].d.Pid() }

// Kill ends node i with SIGKILL, as a crash would, and waits until it is reaped. Its
// store is kept; Restart brings it back.
func (c *Cluster) Kill(i int) error {
	if err := c.nodes[i].d.Kill(); err != nil {
		return fmt.Errorf("kill nats node %s: %w", c.nodes[i].name, err)
	}
	return nil
}

// Restart stops node i if it runs and starts it again on the same ports and store,
// returning once JetStream runs on it (WaitHealthy waits for it to catch up).
func (c *Cluster) Restart(ctx context.Context, i int) error {
	if err := c.nodes[i].d.Restart(ctx); err != nil {
		return fmt.Errorf("restart nats node %s: %w", c.nodes[i].name, err)
	}
	return nil
}

// Supervise returns a supervisor of node i that restarts it whenever it exits without
// Stop, with backoff b.
func (c *Cluster) Supervise(i int, b childproc.Backoff) *childproc.Supervisor {
	return childproc.NewSupervisor(c.nodes[i].d, b)
}

// Stop stops every node (SIGTERM, then SIGKILL after 10 s or when ctx ends). The stores
// are kept. Stopping a stopped cluster is a no-op.
func (c *Cluster) Stop(ctx context.Context) error {
	errs := make([]error, len(c.nodes))
	var wg sync.WaitGroup
	for i, n := range c.nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := n.d.Stop(ctx); err != nil {
				errs[i] = fmt.Errorf("stop nats node %s: %w", n.name, err)
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// FindBinary returns the nats-server executable: explicit, else BinaryName(Version()) in
// PATH, else in $(go env GOPATH)/bin (where scripts/nats-server.sh builds it).
func FindBinary(explicit string) (string, error) {
	if explicit != "" {
		path, err := exec.LookPath(explicit)
		if err != nil {
			return "", fmt.Errorf("%w (Options.Binary %q: %v)", ErrNotInstalled, explicit, err)
		}
		return path, nil
	}
	name := BinaryName(Version())
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	var dirs []string
	if gp := os.Getenv("GOPATH"); gp != "" {
		dirs = append(dirs, filepath.SplitList(gp)...)
	}
	if out, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		dirs = append(dirs, filepath.SplitList(strings.TrimSpace(string(out)))...)
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "bin", name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w (looked for %s)", ErrNotInstalled, name)
}

// CheckVersion fails, wrapping ErrWrongVersion, unless bin reports the version this
// program embeds.
func CheckVersion(bin string) error {
	want := Version()
	out, err := exec.Command(bin, "--version").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s --version: %w: %s", bin, err, out)
	}
	got := strings.TrimSpace(string(out))
	if !strings.HasSuffix(got, " "+want) {
		return fmt.Errorf("%w: %s reports %q, gauntlet embeds %s %s", ErrWrongVersion, bin, got, ModulePath, want)
	}
	return nil
}
