package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/services/envapi"
	"github.com/gauntlet-rl/gauntlet/services/reward"
	"github.com/gauntlet-rl/gauntlet/services/scheduler"
	"github.com/gauntlet-rl/gauntlet/services/store"
	"github.com/gauntlet-rl/gauntlet/services/worker"
)

// config is everything a serving gauntlet process is configured with. The process owns
// the flags of what it runs itself (data dir, NATS, ClickHouse, Temporal, http, logs,
// traces, stop timeout); each component's config declares its own (RegisterFlags, as in
// Loki and dskit). Flags own the defaults; a YAML file (--config) may overlay them with
// the same names ("worker.concurrency: 256"); flags given on the command line win over
// the file.
type config struct {
	DataDir  string
	NATSURL  string
	NATSPort int
	NATSTCP  bool
	Replicas int
	// EventsMaxBytes and EventsHistoryBytes size GAUNTLET_EVENTS (bus.StreamConfig).
	EventsMaxBytes     int64
	EventsHistoryBytes int64
	ClickHouse         string
	ClickHousePort     int
	Database           string
	HTTPAddr           string
	LogLevel           string
	TraceFile          string
	StopTimeout        time.Duration

	Temporal          string
	TemporalPort      int
	TemporalUIPort    int
	TemporalNamespace string

	Worker    worker.Config
	Scheduler scheduler.Config
	Store     store.Config
	Reward    reward.Config
	EnvAPI    envapi.Config

	PolicyHTTP httppolicy.Config
	// Sandbox is the process's sandbox runtime, opened once by the sandbox module and
	// shared by every module that plays episodes (worker, env API, durable episodes).
	Sandbox runtimes.Config
	// Tasks names the task datasets the process's episodes may play (--tasks.datasets).
	Tasks taskenv.Config
	// Worlds are the user worlds this process registers as envs, next to the built-in
	// ones, before any module starts.
	Worlds world.Config
	// MCP are the user MCP envs (`env: mcp` declarations) this process registers, as
	// Worlds.
	MCP mcpenv.Config
}

// register declares every serving flag on fs: the process's own here, the components'
// through their RegisterFlags.
func (c *config) register(fs *flag.FlagSet) {
	registerDataDir(fs, &c.DataDir, "directory for JetStream, the local ClickHouse and stack.json")
	fs.StringVar(&c.NATSURL, "nats", "", "NATS URL of an existing cluster (empty: run NATS embedded)")
	fs.IntVar(&c.NATSPort, "nats.port", 4222, "port the embedded NATS listens on for clients (-1: in-process only)")
	fs.BoolVar(&c.NATSTCP, "nats.tcp", false, "connect this process's modules to the embedded NATS over TCP instead of in-process (to measure the network path)")
	fs.IntVar(&c.Replicas, "nats.replicas", 1, "replicas of gauntlet's streams and KV buckets (3 on a NATS cluster)")
	def := bus.DefaultStreamConfig()
	fs.Int64Var(&c.EventsMaxBytes, "nats.events-max-bytes", def.EventsMaxBytes, "cap of the events stream in bytes (halved until it fits when the disk has less room); only events the store has not written yet can fill it, and producers then wait")
	fs.Int64Var(&c.EventsHistoryBytes, "nats.events-history-bytes", def.EventsHistoryBytes, "events already written to ClickHouse kept replayable in the events stream while it holds less than this many bytes (at most half its cap; 0: none kept)")
	fs.StringVar(&c.ClickHouse, "clickhouse", "", "ClickHouse native address host:port (empty: start Debian's clickhouse-server locally)")
	fs.IntVar(&c.ClickHousePort, "clickhouse.port", 19000, "native port of the local ClickHouse (0: any free port)")
	fs.StringVar(&c.Database, "clickhouse.database", "gauntlet", "ClickHouse database")
	fs.StringVar(&c.HTTPAddr, "http", "127.0.0.1:9464", "address of /ready, /metrics and the web console at /console/ (empty: off)")
	fs.StringVar(&c.LogLevel, "log.level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.TraceFile, "trace-file", "", "write OpenTelemetry spans as JSON to this file")
	fs.DurationVar(&c.StopTimeout, "stop-timeout", 30*time.Second, "bound on a graceful stop")
	fs.StringVar(&c.Temporal, "temporal", "", "Temporal frontend host:port of an existing server (empty: run the Temporal dev server locally)")
	fs.IntVar(&c.TemporalPort, "temporal.port", 7233, "frontend port of the local Temporal dev server (0: any free port)")
	fs.IntVar(&c.TemporalUIPort, "temporal.ui-port", 8233, "Web UI port of the local Temporal dev server (0: any free port, -1: no UI)")
	fs.StringVar(&c.TemporalNamespace, "temporal.namespace", "default", "Temporal namespace of gauntlet's workflows")

	c.Worker.RegisterFlags(fs)
	c.Scheduler.RegisterFlags(fs)
	c.Store.RegisterFlags(fs)
	c.Reward.RegisterFlags(fs)
	c.EnvAPI.RegisterFlags(fs)
	c.PolicyHTTP.RegisterFlags(fs)
	c.Sandbox.RegisterFlags(fs)
	c.Tasks.RegisterFlags(fs)
	c.Worlds.RegisterFlags(fs)
	c.MCP.RegisterFlags(fs)
}

// resolve fills in what components take from the process: defaults under the data dir
// and the ClickHouse database.
func (c *config) resolve() {
	if c.Sandbox.StateDir == "" {
		c.Sandbox.StateDir = filepath.Join(c.DataDir, "sandbox")
	}
	c.Store.Database = c.Database
	c.EnvAPI.DevTokenPath = filepath.Join(c.DataDir, "envapi-token")
	c.EnvAPI.IDKeyPath = filepath.Join(c.DataDir, "envapi-id-key")
}

// validate resolves c and reports every problem of the whole config at once, so a bad
// flag is refused before NATS, ClickHouse or Temporal start.
func (c *config) validate() error {
	c.resolve()
	var errs []error
	if _, err := parseLevel(c.LogLevel); err != nil {
		errs = append(errs, err)
	}
	if c.EventsMaxBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("nats.events-max-bytes: %d is under 1 MiB", c.EventsMaxBytes))
	}
	if c.EventsHistoryBytes < 0 {
		errs = append(errs, fmt.Errorf("nats.events-history-bytes: %d must not be negative", c.EventsHistoryBytes))
	}
	errs = append(errs, c.Worker.Validate(), c.Sandbox.Validate(), c.Scheduler.Validate(), c.Store.Validate(), c.PolicyHTTP.Validate(), c.Worlds.Validate(), c.MCP.Validate(), c.Tasks.Validate())
	if c.EnvAPI.Addr != "" { // empty: the env API is off
		errs = append(errs, c.EnvAPI.Validate())
	}
	return errors.Join(errs...)
}

// overlay applies a YAML file's keys to fs, skipping flags set on the command line. Unknown
// keys are errors naming the key.
func overlay(fs *flag.FlagSet, path string) error {
	if path == "" {
		return nil
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	flat := map[string]string{}
	flatten("", doc, flat)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var errs []error
	for _, k := range keys {
		if fs.Lookup(k) == nil {
			errs = append(errs, fmt.Errorf("--config %s: unknown key %q", path, k))
			continue
		}
		if set[k] {
			continue
		}
		if err := fs.Set(k, flat[k]); err != nil {
			errs = append(errs, fmt.Errorf("--config %s: %s: %w", path, k, err))
		}
	}
	return errors.Join(errs...)
}

func flatten(prefix string, v any, out map[string]string) {
	if m, ok := v.(map[string]any); ok {
		for k, sub := range m {
			key := k
			if prefix != "" {
				key = prefix + "." + k
			}
			flatten(key, sub, out)
		}
		return
	}
	out[prefix] = fmt.Sprint(v)
}

// splitTargets parses --target=worker,reward.
func splitTargets(s string) []string {
	var out []string
	for _, t := range strings.Split(s, ",") {
		if t = strings.TrimSpace(t); t != "" {
			out = append(out, t)
		}
	}
	return out
}
