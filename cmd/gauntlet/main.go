// Command gauntlet is the single binary of the gauntlet platform: every service as a
// module (`up`, `serve`), the trainer-facing `run` and `demo`, and the analyst's `sql` and
// `episode show`. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"syscall"

	"github.com/gauntlet-rl/gauntlet/pkg/console"

	// Envs and policies register themselves.
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/world"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `gauntlet: RL training episodes in hostile sandboxes, recorded for SQL and replay.

Usage:
  gauntlet up [flags]                  run every service (embedded NATS, local ClickHouse)
  gauntlet serve --target=a,b [flags]  run some modules (against --nats / --clickhouse)
  gauntlet split up|down|status        split mode on this machine: a 3-node NATS cluster, one process per service
  gauntlet run [flags]                 submit a run of episodes and follow it
  gauntlet demo [flags]                start the stack, run a campaign, print results, stop
  gauntlet curriculum start -f FILE    start a curriculum workflow (prints its id)
  gauntlet curriculum status|pause|resume|skip|abort ID
  gauntlet batch start [flags]         run N episodes of one spec as a Temporal workflow
  gauntlet sql "SELECT ..."            query the trajectories (aligned table)
  gauntlet report RUN_ID...|--curriculum ID   the compatibility report (table, json, html)
  gauntlet episode show ID             every step of one episode
  gauntlet episode snapshot ID --step N   rebuild an episode's workspace at a step
  gauntlet episode fork ID --step N   branch an episode at a step and go on with a policy
  gauntlet episode export ID --format atif|jsonl [-o FILE]   an episode as ATIF or JSONL
  gauntlet reward explain ID [--step N]   each step's reward, component by component (docs/rewards.md)
  gauntlet reward rescore --run R --spec F   a run's recorded steps scored under another spec (docs/rewards.md)
  gauntlet reward fingerprints [--forget ID]   the threat fingerprints players flag (docs/rewards.md)
  gauntlet faults ls|plan|validate|from-log|drift   the fault spectrum (docs/faults.md)
  gauntlet tasks validate|ls|describe   Harbor-format task folders and datasets (docs/tasks.md)
  gauntlet worlds validate|describe|graph FILE   tool worlds written as YAML (docs/worlds.md)
  gauntlet version

Run 'gauntlet <command> -h' for a command's flags. GAUNTLET_DATA, when set, is the
default of --data-dir (else .gauntlet), where 'gauntlet up' keeps its data and stack.json
and where the client commands look for it.
`

// errUsage marks an error already explained to the user with the command's usage.
var errUsage = errors.New("usage")

func main() {
	// Memory is plentiful next to CPU on our machines, and the hot path allocates
	// (protobuf, JSON): collect less often. GOGC in the environment still wins.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := runMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, errUsage) {
			fmt.Fprintln(os.Stderr, "gauntlet:", err)
		}
		os.Exit(2)
	}
}

func runMain(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "up":
		return cmdServe(ctx, "up", rest, stdout, stderr)
	case "serve":
		return cmdServe(ctx, "serve", rest, stdout, stderr)
	case "split":
		return cmdSplit(ctx, rest, stdout, stderr)
	case "run":
		return cmdRun(ctx, rest, stdout, stderr)
	case "demo":
		return cmdDemo(ctx, rest, stdout, stderr)
	case "sql":
		return cmdSQL(ctx, rest, stdout, stderr)
	case "report":
		return cmdReport(ctx, rest, stdout, stderr)
	case "curriculum":
		return cmdCurriculum(ctx, rest, stdout, stderr)
	case "batch":
		return cmdBatch(ctx, rest, stdout, stderr)
	case "episode":
		return cmdEpisode(ctx, rest, stdout, stderr)
	case "reward":
		return cmdReward(ctx, rest, stdout, stderr)
	case "tasks":
		return cmdTasks(ctx, args[1:], stdout, stderr)
	case "faults":
		return cmdFaults(ctx, rest, stdout, stderr)
	case "worlds":
		return cmdWorlds(ctx, rest, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "gauntlet", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "gauntlet: unknown command %q\n\n%s", cmd, usage)
	return errUsage
}

// newFlagSet returns a flag set whose errors name the bad flag and return errUsage.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("gauntlet "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return errUsage
		}
		return errUsage // the flag package already printed the bad flag and the usage
	}
	return nil
}

// newAppLogging builds the app with a logger at cfg's level writing to w.
func newAppLogging(cfg config, w io.Writer) (*app, error) {
	log, err := newLogger(cfg.LogLevel, w)
	if err != nil {
		return nil, err
	}
	return newApp(cfg, log)
}

func newLogger(level string, w io.Writer) (*slog.Logger, error) {
	l, err := parseLevel(level)
	if err != nil {
		return nil, err
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})), nil
}

func parseLevel(level string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return l, fmt.Errorf("--log.level: %q is not one of debug, info, warn, error", level)
	}
	return l, nil
}

// cmdServe runs modules until SIGINT/SIGTERM.
func cmdServe(ctx context.Context, name string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stderr)
	var cfg config
	cfg.register(fs)
	cfgFile := fs.String("config", "", "YAML file overlaying the flags (keys are flag names)")
	target := "all"
	if name == "serve" {
		fs.StringVar(&target, "target", "all", "comma-separated modules to run: all, pipeline (all but Temporal), scheduler, worker, faults, reward, store, curriculum (Temporal worker), temporal (dev server), console (the web console at /console/ on --http)")
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "gauntlet %s: unexpected argument %q\n", name, fs.Arg(0))
		return errUsage
	}
	if err := overlay(fs, *cfgFile); err != nil {
		return err
	}
	// The whole config is checked before anything starts: a bad flag of any module is
	// reported, with every other, before NATS, ClickHouse or Temporal run.
	if err := cfg.validate(); err != nil {
		return err
	}
	a, err := newAppLogging(cfg, stderr)
	if err != nil {
		return err
	}
	log := a.log
	targets := splitTargets(target)
	order, err := a.mgr.Order(targets)
	if err != nil {
		return fmt.Errorf("--target: %w", err)
	}
	go func() {
		// Tell client commands where the stack is once it runs.
		if !waitReady(ctx, a) {
			return
		}
		st := stack{NATSURL: a.natsURL(), ClickHouse: a.clickHouseAddr(), Database: cfg.Database, HTTP: cfg.HTTPAddr, PID: os.Getpid(), Datasets: cfg.Tasks.Datasets}
		if slices.Contains(order, modTemporal) {
			st.Temporal, st.TemporalUI = a.temporalAddr(), a.temporalUI()
		}
		if a.envapi != nil {
			st.EnvAPI = a.envapi.Addr()
		}
		if cfg.HTTPAddr != "" && slices.Contains(order, modConsole) {
			st.Console = "http://" + cfg.HTTPAddr + console.Prefix
		}
		if err := writeStack(cfg.DataDir, st); err != nil {
			log.Warn("write stack.json", "err", err)
		}
		printBanner(stdout, st, cfg.EnvAPI.TokensFile == "", cfg.EnvAPI.DevTokenPath)
	}()
	err = a.run(ctx, targets)
	_ = os.Remove(stackPath(cfg.DataDir))
	return err
}

// printBanner tells whoever ran `gauntlet up` where each part of the stack st listens: a
// trainer needs the env API's address, and its token's file when gauntlet made the token
// (devToken: no --envapi.tokens).
func printBanner(w io.Writer, st stack, devToken bool, devTokenPath string) {
	fmt.Fprintf(w, "gauntlet is up: nats %s, clickhouse %s (database %s), http %s\n", st.NATSURL, st.ClickHouse, st.Database, st.HTTP)
	if st.EnvAPI != "" {
		token := ""
		if devToken {
			token = ", token in " + devTokenPath
		}
		fmt.Fprintf(w, "env api http://%s (gRPC and HTTP/JSON, MCP at /mcp/<env>%s)\n", st.EnvAPI, token)
	}
	if st.Console != "" {
		fmt.Fprintf(w, "console %s\n", st.Console)
	}
	if st.Temporal != "" {
		fmt.Fprintf(w, "temporal %s (task queue gauntlet)%s\n", st.Temporal, uiHint(st.TemporalUI))
	}
}
