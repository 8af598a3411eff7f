package splitlocal

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

	"golang.org/x/sync/errgroup"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/natslocal"
	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
	"github.com/gauntlet-rl/gauntlet/pkg/zklocal"
)

// Bounds of the gauntlet processes' lifecycle.
const (
	// procStartTimeout bounds a gauntlet process's wait for /ready: it connects, creates
	// the streams at 3 replicas, and the store migrates ClickHouse.
	procStartTimeout = 2 * time.Minute
	// procStopGrace is above the store's --stop-timeout (75 s in deploy/): a stop is
	// graceful, not a SIGKILL.
	procStopGrace = 90 * time.Second
)

// Options configures Start.
type Options struct {
	// Dir holds everything: nats/, zookeeper/, clickhouse/ (replica-1/, replica-2/ when
	// replicated), temporal/, and procs/<name>-<i>/ for each
	// gauntlet process (its --data-dir and gauntlet.log). Required.
	Dir string
	// Gauntlet is the gauntlet binary the processes run. Required.
	Gauntlet string
	// NATSServer is the nats-server binary; empty finds it as natslocal does.
	NATSServer string
	// ClickHouseReplicas is how many replicas of the one shard ClickHouse runs; 0 means
	// ClickHouseReplicas (the package's constant). At 2 or more, a ZooKeeper runs too
	// and every gauntlet process is given every replica's address (--clickhouse a,b: the
	// store migrates each and fails over between them); 1 runs a single server without
	// ZooKeeper, as `gauntlet up` does.
	ClickHouseReplicas int
	// Layout is what runs; nil means the package's Layout.
	Layout []Target
	// Args are added to every gauntlet process's command line (flags such as
	// --worker.concurrency=64; a later flag wins).
	Args []string
	// TemporalSearchAttributes are registered by the Temporal dev server at start (the
	// curriculum worker's workflows set them).
	TemporalSearchAttributes map[string]string
	// Logger receives lifecycle messages; nil discards them.
	Logger *slog.Logger
}

// Proc is one gauntlet process of the stack.
type Proc struct {
	// Name is its target and ordinal: "worker-2".
	Name string
	// Target is its --target.
	Target string
	// HTTP is its /ready, /metrics and /modules address.
	HTTP string
	// Dir is its --data-dir; its log is gauntlet.log there.
	Dir string

	d   *childproc.Daemon
	sup *childproc.Supervisor
}

// Pid is the process's id, 0 when it does not run.
func (p *Proc) Pid() int { return p.d.Pid() }

// Ready is nil while the process runs and its supervisor has nothing to report.
func (p *Proc) Ready() error {
	if p.sup != nil {
		return p.sup.Ready()
	}
	if p.d.Pid() == 0 {
		return fmt.Errorf("%s is not running", p.Name)
	}
	return nil
}

// Stack is a running split stack.
type Stack struct {
	opts Options
	log  *slog.Logger
	NATS *natslocal.Cluster
	// ZK is the replicas' coordinator; nil when ClickHouse is a single server.
	ZK *zklocal.Server
	// CH are the ClickHouse replicas in the order of CHAddr's list (one when single).
	CH       []*chlocal.Server
	Temporal *temporallocal.Server
	// Procs are the gauntlet processes, in start order.
	Procs []*Proc
	// EnvAPI is the env API's address (gRPC and HTTP/JSON).
	EnvAPI string

	mu      sync.Mutex
	running bool
}

// Start brings the whole stack up and returns once every process is ready. Nothing is
// supervised until Run. On failure everything started is stopped.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if opts.Dir == "" || opts.Gauntlet == "" {
		return nil, errors.New("start split stack: Options.Dir and Options.Gauntlet are required")
	}
	dir, err := childproc.StateDir(opts.Dir)
	if err != nil {
		return nil, fmt.Errorf("start split stack: %w", err)
	}
	opts.Dir = dir
	if opts.Layout == nil {
		opts.Layout = Layout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ClickHouseReplicas == 0 {
		opts.ClickHouseReplicas = ClickHouseReplicas
	}
	if opts.ClickHouseReplicas < 1 {
		return nil, fmt.Errorf("start split stack: %d clickhouse replicas", opts.ClickHouseReplicas)
	}
	s := &Stack{opts: opts, log: opts.Logger}
	ok := false
	defer func() {
		if !ok {
			_ = s.Stop(context.WithoutCancel(ctx))
		}
	}()
	// The servers are independent of each other: started together.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		c, err := natslocal.Start(gctx, natslocal.Options{Dir: filepath.Join(dir, "nats"), Nodes: NATSNodes,
			Binary: opts.NATSServer, Logger: opts.Logger})
		s.NATS = c
		return err
	})
	g.Go(func() error { return s.startClickHouse(gctx) })
	g.Go(func() error {
		t, err := temporallocal.Start(gctx, temporallocal.Options{Dir: filepath.Join(dir, "temporal"), NoUI: true,
			SearchAttributes: opts.TemporalSearchAttributes, Logger: opts.Logger})
		s.Temporal = t
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("start split stack: %w", err)
	}
	for _, t := range opts.Layout {
		if t.Count < 1 {
			continue
		}
		procs := make([]*Proc, t.Count)
		for i := range procs {
			p, err := s.newProc(t.Name, i+1)
			if err != nil {
				return nil, fmt.Errorf("start split stack: %w", err)
			}
			procs[i] = p
			s.Procs = append(s.Procs, p)
		}
		// A kind's processes start together (the stores migrate ClickHouse at once, as
		// a deployment's do); kinds in Layout's order.
		g, gctx := errgroup.WithContext(ctx)
		for _, p := range procs {
			g.Go(func() error {
				if err := p.d.Start(gctx); err != nil {
					return fmt.Errorf("start %s: %w", p.Name, err)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return nil, fmt.Errorf("start split stack: %w", err)
		}
	}
	ok = true
	return s, nil
}

// startClickHouse starts ClickHouse: one server, or ZooKeeper and then the replicas
// (which need ZooKeeper to start).
func (s *Stack) startClickHouse(ctx context.Context) error {
	dir := filepath.Join(s.opts.Dir, "clickhouse")
	if s.opts.ClickHouseReplicas == 1 {
		ch, err := chlocal.Start(ctx, chlocal.Options{Dir: dir, Logger: s.log})
		if ch != nil {
			s.CH = []*chlocal.Server{ch}
		}
		return err
	}
	zk, err := zklocal.Start(ctx, zklocal.Options{Dir: filepath.Join(s.opts.Dir, "zookeeper"), Logger: s.log})
	if err != nil {
		return err
	}
	s.ZK = zk
	s.CH, err = chlocal.StartCluster(ctx, chlocal.ClusterOptions{Dir: dir, ZooKeeper: []string{zk.Addr()},
		Replicas: s.opts.ClickHouseReplicas, Logger: s.log})
	return err
}

// CHAddr is what every gauntlet process of the stack is given as --clickhouse: the
// replicas' native addresses, comma-separated (one address when single).
func (s *Stack) CHAddr() string { return strings.Join(chlocal.Addrs(s.CH), ",") }

// newProc prepares gauntlet process name-i: its folder, its ports, its command.
func (s *Stack) newProc(target string, i int) (*Proc, error) {
	name := target + "-" + strconv.Itoa(i)
	dir := filepath.Join(s.opts.Dir, "procs", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := childproc.FreePorts(0, 0)
	if err != nil {
		return nil, err
	}
	p := &Proc{Name: name, Target: target, Dir: dir, HTTP: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))}
	args := []string{"serve", "--target=" + target,
		"--data-dir", dir,
		"--nats", s.NATS.URL(), "--nats.replicas", strconv.Itoa(min(StreamReplicas, s.NATS.Nodes())),
		"--clickhouse", s.CHAddr(),
		"--temporal", s.Temporal.Addr(),
		"--http", p.HTTP,
		"--stop-timeout", "75s",
	}
	if target == "envapi" {
		s.EnvAPI = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
		args = append(args, "--envapi.addr", s.EnvAPI)
	}
	args = append(args, s.opts.Args...)
	logPath := filepath.Join(dir, "gauntlet.log")
	p.d = childproc.NewDaemon(childproc.Recipe{
		Name: name,
		Command: func() (*exec.Cmd, error) {
			cmd := exec.Command(s.opts.Gauntlet, args...)
			cmd.Dir = dir
			return cmd, nil
		},
		LogPath: logPath,
		PidFile: filepath.Join(dir, "gauntlet.pid"),
		Owns:    func(pid int) bool { return childproc.CmdlineContains(pid, dir) },
		OpenProbe: func() (childproc.Probe, func(), error) {
			return func(ctx context.Context) error { return ready(ctx, p.HTTP) }, func() {}, nil
		},
		Listens:      func() []int { return []int{ports[0]} },
		Describe:     func() []any { return []any{"http", p.HTTP} },
		PollInterval: 100 * time.Millisecond,
		StartTimeout: procStartTimeout,
		StopGrace:    procStopGrace,
	}, s.log.With("proc", name))
	if err := p.d.KillLeftover(); err != nil {
		return nil, err
	}
	return p, nil
}

// ready asks a gauntlet process's /ready.
func ready(ctx context.Context, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/ready", nil)
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
		n, _ := resp.Body.Read(buf[:])
		return fmt.Errorf("/ready: %s: %s", resp.Status, buf[:n])
	}
	return nil
}

// Backoff is how the stack's processes are restarted: back within half a second, as a
// Kubernetes Deployment brings a pod back; probed every 2 s so a kill shows quickly.
var Backoff = childproc.Backoff{
	Initial: 500 * time.Millisecond, Max: 10 * time.Second, Stable: time.Minute,
	ProbeEvery: 2 * time.Second, HungAfter: 30 * time.Second,
}

// Run supervises every process and server until ctx ends: one that exits without being
// stopped is started again on the same ports and data. Then it returns nil; Stop stops.
func (s *Stack) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("split stack: Run called twice")
	}
	s.running = true
	sups := []*childproc.Supervisor{s.Temporal.Supervise(Backoff)}
	if s.ZK != nil {
		sups = append(sups, s.ZK.Supervise(Backoff))
	}
	for _, ch := range s.CH {
		sups = append(sups, ch.Supervise(Backoff))
	}
	for i := range s.NATS.Nodes() {
		sups = append(sups, s.NATS.Supervise(i, Backoff))
	}
	for _, p := range s.Procs {
		p.sup = childproc.NewSupervisor(p.d, Backoff)
		sups = append(sups, p.sup)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, sup := range sups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = sup.Run(ctx)
		}()
	}
	wg.Wait()
	return nil
}

// Proc returns the process named name ("worker-2"), nil when there is none.
func (s *Stack) Proc(name string) *Proc {
	for _, p := range s.Procs {
		if p.Name == name {
			return p
		}
	}
	return nil
}

// Kill ends a gauntlet process with SIGKILL, as a crash would; while Run runs, its
// supervisor starts it again.
func (s *Stack) Kill(name string) error {
	p := s.Proc(name)
	if p == nil {
		return fmt.Errorf("kill %s: no such process in the split stack", name)
	}
	return p.d.Kill()
}

// Signal sends sig to a gauntlet process (SIGTERM: a graceful stop, which the supervisor
// counts as an exit to repair, as Kubernetes does).
func (s *Stack) Signal(name string, sig os.Signal) error {
	p := s.Proc(name)
	if p == nil {
		return fmt.Errorf("signal %s: no such process in the split stack", name)
	}
	pid := p.Pid()
	if pid == 0 {
		return fmt.Errorf("signal %s: not running", name)
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return proc.Signal(sig)
}

// Stop stops the gauntlet processes (in reverse start order, each kind's together), then
// the servers. Data is kept. Stopping twice is a no-op.
func (s *Stack) Stop(ctx context.Context) error {
	var errs []error
	for i := len(s.Procs) - 1; i >= 0; {
		j := i
		for j > 0 && s.Procs[j-1].Target == s.Procs[i].Target {
			j--
		}
		var wg sync.WaitGroup
		errc := make(chan error, i-j+1)
		for _, p := range s.Procs[j : i+1] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := p.d.Stop(ctx); err != nil {
					errc <- fmt.Errorf("stop %s: %w", p.Name, err)
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			errs = append(errs, err)
		}
		i = j - 1
	}
	if s.Temporal != nil {
		errs = append(errs, s.Temporal.Stop(ctx))
	}
	for _, ch := range s.CH {
		errs = append(errs, ch.Stop(ctx))
	}
	if s.ZK != nil {
		errs = append(errs, s.ZK.Stop(ctx))
	}
	if s.NATS != nil {
		errs = append(errs, s.NATS.Stop(ctx))
	}
	return errors.Join(errs...)
}
