package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/splitlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/zklocal"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// splitState is what `gauntlet split up` tells `split down` and `split status` about the
// stack it runs, in <data-dir>/split.json. Client commands find the stack through the
// stack.json written next to it, as for `gauntlet up`.
type splitState struct {
	PID        int    `json:"pid"`
	Dir        string `json:"dir"`
	NATSURL    string `json:"nats_url"`
	ClickHouse string `json:"clickhouse"` // every replica, comma-separated, as --clickhouse takes them
	// ClickHouseReplicas are the replicas' addresses one by one; ZooKeeper is their
	// coordinator, empty when ClickHouse is a single server.
	ClickHouseReplicas []string    `json:"clickhouse_replicas"`
	ZooKeeper          string      `json:"zookeeper,omitempty"`
	Temporal           string      `json:"temporal"`
	EnvAPI             string      `json:"envapi,omitempty"`
	Procs              []splitProc `json:"procs"`
}

type splitProc struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	HTTP   string `json:"http"`
	Dir    string `json:"dir"`
}

func splitStatePath(dataDir string) string { return filepath.Join(dataDir, "split.json") }

// splitUsage is `gauntlet split -h`.
const splitUsage = `Usage:
  gauntlet split up [--data-dir DIR] [--nats-server BIN] [--clickhouse.replicas N]
                    [--chaos.seed N [--chaos.rounds R] [--chaos.min-wait D] [--chaos.max-wait D]]
                    [-- SERVE FLAGS...]
  gauntlet split down [--data-dir DIR]
  gauntlet split status [--data-dir DIR]

up runs gauntlet in split mode on this machine, in the foreground until SIGTERM: a 3-node
NATS JetStream cluster (streams and KV buckets at 3 replicas), ClickHouse as two replicas
on a ZooKeeper (every process given both addresses), the Temporal dev server, and each service as its own 'gauntlet serve --target=...' process, restarted when
it dies. scripts/split.sh runs it in the background. Flags after -- go to every serve.

With --chaos.seed, up also kills parts of the stack with SIGKILL at seeded random times,
one at a time, each after a wait drawn from [min-wait, max-wait] once the previous one is
back: every round kills one NATS node, one worker, one store, the scheduler leader and one
ClickHouse replica, in an order drawn from the seed. Each kill is a line of
<data dir>/chaos.jsonl; status counts them.
`

// cmdSplit is `gauntlet split up|down|status`.
func cmdSplit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "up" && args[0] != "down" && args[0] != "status") {
		fmt.Fprint(stderr, splitUsage)
		return errUsage
	}
	sub := args[0]
	fs := newFlagSet("split "+sub, stderr)
	var dataDir string
	registerDataDir(fs, &dataDir, "directory of the split stack's state, split.json and stack.json")
	natsServer := fs.String("nats-server", "", "nats-server binary of the version gauntlet embeds (empty: as scripts/nats-server.sh builds it)")
	logLevel := fs.String("log.level", "info", "log level of the stack's own lifecycle messages")
	chReplicas := fs.Int("clickhouse.replicas", splitlocal.ClickHouseReplicas, "ClickHouse replicas of the one shard (1: a single server and no ZooKeeper)")
	var chaos chaosFlags
	fs.Uint64Var(&chaos.seed, "chaos.seed", 0, "kill parts of the stack at times drawn from this seed (0: no chaos)")
	fs.IntVar(&chaos.rounds, "chaos.rounds", 1, "chaos rounds; each kills every kind of part once")
	fs.DurationVar(&chaos.minWait, "chaos.min-wait", 20*time.Second, "shortest wait before a kill, counted from the previous part's recovery")
	fs.DurationVar(&chaos.maxWait, "chaos.max-wait", time.Minute, "longest wait before a kill")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	extra := fs.Args()
	if sub != "up" && len(extra) > 0 {
		fmt.Fprintf(stderr, "gauntlet split %s: unexpected argument %q\n", sub, extra[0])
		return errUsage
	}
	switch sub {
	case "down":
		return splitDown(ctx, dataDir, stdout)
	case "status":
		return splitStatus(ctx, dataDir, stdout)
	}
	log, err := newLogger(*logLevel, stderr)
	if err != nil {
		return err
	}
	if err := chaos.validate(); err != nil {
		fmt.Fprintf(stderr, "gauntlet split %s: %v\n", sub, err)
		return errUsage
	}
	return splitUp(ctx, dataDir, *natsServer, *chReplicas, chaos, extra, stdout, log)
}

// readSplitState reads split.json; ok is false when no split stack of a live process
// is recorded there.
func readSplitState(dataDir string) (st splitState, ok bool, err error) {
	b, err := os.ReadFile(splitStatePath(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return st, false, nil
	}
	if err != nil {
		return st, false, fmt.Errorf("read split state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, false, fmt.Errorf("read %s: %w", splitStatePath(dataDir), err)
	}
	return st, st.PID > 0 && childproc.CmdlineContains(st.PID, "split"), nil
}

// splitUp runs the split stack in the foreground until ctx ends.
func splitUp(ctx context.Context, dataDir, natsServer string, chReplicas int, chaos chaosFlags, extra []string, stdout io.Writer, log *slog.Logger) error {
	if st, ok, err := readSplitState(dataDir); err != nil {
		return err
	} else if ok {
		return fmt.Errorf("split up: a split stack already runs in %s (pid %d): gauntlet split down first", dataDir, st.PID)
	}
	if st, err := readStack(dataDir); err == nil && st.PID > 0 && syscall.Kill(st.PID, 0) == nil {
		return fmt.Errorf("split up: a gauntlet stack already runs in %s (pid %d, stack.json)", dataDir, st.PID)
	}
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("split up: %w", err)
	}
	dir, err := filepath.Abs(filepath.Join(dataDir, "split"))
	if err != nil {
		return fmt.Errorf("split up: %w", err)
	}
	begin := time.Now()
	if chReplicas < 1 {
		return fmt.Errorf("split up: --clickhouse.replicas %d: want 1 or more", chReplicas)
	}
	s, err := splitlocal.Start(ctx, splitlocal.Options{Dir: dir, Gauntlet: bin, NATSServer: natsServer, Args: extra,
		ClickHouseReplicas: chReplicas, TemporalSearchAttributes: workflows.SearchAttributes, Logger: log})
	if err != nil {
		return err
	}
	st := splitState{PID: os.Getpid(), Dir: dir, NATSURL: s.NATS.URL(), ClickHouse: s.CHAddr(),
		ClickHouseReplicas: chlocal.Addrs(s.CH), Temporal: s.Temporal.Addr(), EnvAPI: s.EnvAPI}
	if s.ZK != nil {
		st.ZooKeeper = s.ZK.Addr()
	}
	for _, p := range s.Procs {
		st.Procs = append(st.Procs, splitProc{Name: p.Name, Target: p.Target, HTTP: p.HTTP, Dir: p.Dir})
	}
	werr := writeJSONFile(splitStatePath(dataDir), st)
	if werr == nil {
		werr = writeStack(dataDir, stack{NATSURL: st.NATSURL, ClickHouse: st.ClickHouse, Database: "gauntlet",
			Temporal: st.Temporal, EnvAPI: st.EnvAPI, PID: st.PID})
	}
	chKind := "one server"
	if n := len(st.ClickHouseReplicas); n > 1 {
		chKind = fmt.Sprintf("%d replicas", n)
	}
	if werr == nil {
		fmt.Fprintf(stdout, "gauntlet split stack is up in %v: nats %s (3 nodes, 3 replicas), clickhouse %s (%s), temporal %s, env api %s, %d gauntlet processes\n",
			time.Since(begin).Round(time.Millisecond), st.NATSURL, st.ClickHouse, chKind, st.Temporal, st.EnvAPI, len(st.Procs))
		var chaosDone <-chan struct{}
		_ = os.Remove(chaosLogPath(dataDir)) // an earlier up's faults are not this one's
		if chaos.seed != 0 {
			chaosDone = startChaos(ctx, s, chaos, chaosLogPath(dataDir), log)
		}
		werr = s.Run(ctx)
		if chaosDone != nil {
			<-chaosDone
		}
	}
	_ = os.Remove(stackPath(dataDir))
	_ = os.Remove(splitStatePath(dataDir))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Minute)
	defer cancel()
	return errors.Join(werr, s.Stop(sctx))
}

// writeJSONFile writes v to path aside and renames it over, so a reader never sees half.
func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// splitDown stops the split stack recorded in dataDir: SIGTERM to `split up`, which stops
// every process, then SIGKILL after 3 minutes (its children die with it). Nothing
// recorded: nothing to do.
func splitDown(ctx context.Context, dataDir string, stdout io.Writer) error {
	st, ok, err := readSplitState(dataDir)
	if err != nil {
		return err
	}
	if !ok {
		_ = os.Remove(splitStatePath(dataDir))
		fmt.Fprintln(stdout, "no split stack runs in", dataDir)
		return nil
	}
	if err := syscall.Kill(st.PID, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("split down: signal pid %d: %w", st.PID, err)
	}
	deadline := time.Now().Add(3 * time.Minute)
	for syscall.Kill(st.PID, 0) == nil {
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = syscall.Kill(st.PID, syscall.SIGKILL)
			if err := childproc.WaitGone(st.PID, 10*time.Second); err != nil {
				return fmt.Errorf("split down: %w", err)
			}
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	fmt.Fprintln(stdout, "split stack stopped:", dataDir)
	return nil
}

// serverState asks a server of the stack whether it serves ("ready" or "down"), within 2 s.
func serverState(ctx context.Context, addr string, ping func(context.Context, string) error) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if ping(ctx, addr) != nil {
		return "down"
	}
	return "ready"
}

// splitStatus prints every part of the split stack and whether it is ready; an error when
// no stack runs or a part is not ready.
func splitStatus(ctx context.Context, dataDir string, stdout io.Writer) error {
	st, ok, err := readSplitState(dataDir)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("split status: no split stack runs in %s", dataDir)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "split stack\tpid %d\t%s\n", st.PID, st.Dir)
	fmt.Fprintf(tw, "nats\t\t%s\n", st.NATSURL)
	var notReady []string
	if st.ZooKeeper != "" {
		state := serverState(ctx, st.ZooKeeper, zklocal.Ping)
		if state != "ready" {
			notReady = append(notReady, "zookeeper")
		}
		fmt.Fprintf(tw, "zookeeper\t%s\t%s\n", state, st.ZooKeeper)
	}
	replicas := st.ClickHouseReplicas
	if len(replicas) == 0 { // a split.json written before the replicas were listed
		replicas = strings.Split(st.ClickHouse, ",")
	}
	for i, addr := range replicas {
		name := fmt.Sprintf("clickhouse-%d", i+1)
		state := serverState(ctx, addr, chlocal.Ping)
		if state != "ready" {
			notReady = append(notReady, name)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", name, state, addr)
	}
	fmt.Fprintf(tw, "temporal\t\t%s\n", st.Temporal)
	client := http.Client{Timeout: 2 * time.Second}
	for _, p := range st.Procs {
		state := "ready"
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.HTTP+"/ready", nil)
		var resp *http.Response
		if err == nil {
			resp, err = client.Do(req)
		}
		switch {
		case err != nil:
			state = "down"
		case resp.StatusCode != http.StatusOK:
			state = "not ready"
		}
		if resp != nil {
			resp.Body.Close()
		}
		if state != "ready" {
			notReady = append(notReady, p.Name)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Name, state, p.HTTP)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if c := chaosSummary(dataDir); c != "" {
		fmt.Fprintln(stdout, c)
	}
	if len(notReady) > 0 {
		return fmt.Errorf("split status: not ready: %s", strings.Join(notReady, ", "))
	}
	return nil
}
