package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/services/envapi"
	"github.com/gauntlet-rl/gauntlet/services/reward"
	"github.com/gauntlet-rl/gauntlet/services/scheduler"
	"github.com/gauntlet-rl/gauntlet/services/store"
	"github.com/gauntlet-rl/gauntlet/services/worker"
)

// config is everything a serving gauntlet process is configured with. Flags own the
// defaults; a YAML file (--config) may overlay them with the same names ("worker.concurrency:
// 256"); flags given on the command line win over the file.
type config struct {
	DataDir        string
	NATSURL        string
	NATSPort       int
	Replicas       int
	ClickHouse     string
	ClickHousePort int
	Database       string
	HTTPAddr       string
	LogLevel       string
	TraceFile      string
	StopTimeout    time.Duration

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
}

// register declares every serving flag on fs.
func (c *config) register(fs *flag.FlagSet) {
	fs.StringVar(&c.DataDir, "data-dir", envOr("GAUNTLET_DATA", ".gauntlet"), "directory for JetStream, the local ClickHouse and stack.json")
	fs.StringVar(&c.NATSURL, "nats", "", "NATS URL of an existing cluster (empty: run NATS embedded)")
	fs.IntVar(&c.NATSPort, "nats.port", 4222, "port the embedded NATS listens on for clients (-1: in-process only)")
	fs.IntVar(&c.Replicas, "nats.replicas", 1, "replicas of gauntlet's streams and KV buckets (3 on a NATS cluster)")
	fs.StringVar(&c.ClickHouse, "clickhouse", "", "ClickHouse native address host:port (empty: start Debian's clickhouse-server locally)")
	fs.IntVar(&c.ClickHousePort, "clickhouse.port", 19000, "native port of the local ClickHouse (0: any free port)")
	fs.StringVar(&c.Database, "clickhouse.database", "gauntlet", "ClickHouse database")
	fs.StringVar(&c.HTTPAddr, "http", "127.0.0.1:9464", "address of /ready and /metrics (empty: off)")
	fs.StringVar(&c.LogLevel, "log.level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&c.TraceFile, "trace-file", "", "write OpenTelemetry spans as JSON to this file")
	fs.DurationVar(&c.StopTimeout, "stop-timeout", 30*time.Second, "bound on a graceful stop")
	fs.StringVar(&c.Temporal, "temporal", "", "Temporal frontend host:port of an existing server (empty: run the Temporal dev server locally)")
	fs.IntVar(&c.TemporalPort, "temporal.port", 7233, "frontend port of the local Temporal dev server (0: any free port)")
	fs.IntVar(&c.TemporalUIPort, "temporal.ui-port", 8233, "Web UI port of the local Temporal dev server (0: any free port, -1: no UI)")
	fs.StringVar(&c.TemporalNamespace, "temporal.namespace", "default", "Temporal namespace of gauntlet's workflows")

	fs.StringVar(&c.Worker.ID, "worker.id", "", "worker id in events (default: random)")
	fs.IntVar(&c.Worker.Concurrency, "worker.concurrency", 256, "episodes a worker runs at once")
	fs.IntVar(&c.Worker.ScoreBatch, "worker.score-batch", 512, "most steps in one score request")
	fs.IntVar(&c.Worker.ScoreRequests, "worker.score-requests", 2, "most score requests in flight at once (fewer carry more steps each)")
	fs.DurationVar(&c.Worker.AckWait, "worker.ack-wait", 30*time.Second, "lease on an assignment")
	fs.IntVar(&c.Worker.MaxDeliver, "worker.max-deliver", 3, "attempts per episode before it is an infra error")
	fs.IntVar(&c.Worker.SegmentSteps, "worker.segment-steps", 32, "steps of an episode per StepsTaken event")
	fs.StringVar(&c.Worker.Sandbox.Runtime, "sandbox.runtime", "", "sandbox runtime of envs that run commands (codefix): process, containerd, or empty for none")
	fs.StringVar(&c.Worker.Sandbox.Image, "sandbox.image", "", "root filesystem of sandboxes: a containerd image reference; for process empty (the host's, read-only)")
	fs.StringVar(&c.Worker.Sandbox.StateDir, "sandbox.state-dir", "", "state directory of the sandbox runtime (default: <data-dir>/sandbox)")
	fs.StringVar(&c.Worker.Sandbox.Containerd, "sandbox.containerd", "", "socket of a running containerd (scripts/containerd.sh start; default: start a private one)")
	fs.IntVar(&c.Worker.Sandbox.PoolSize, "sandbox.pool-size", 2, "warm sandboxes kept per sandbox template (0: create each on demand)")
	fs.StringVar(&c.Worker.Sandbox.AgentBinary, "sandbox.agent", "", "static in-sandbox agent for containerd sandboxes (default: build it with the Go toolchain)")

	fs.Uint64Var(&c.Scheduler.MaxInFlight, "scheduler.max-in-flight", 20_000, "episodes in flight over all runs")
	fs.Uint64Var(&c.Scheduler.AssignBatch, "scheduler.assign-batch", 512, "most episodes assigned per run per round")
	fs.Uint64Var(&c.Scheduler.EpisodesPerAssignment, "scheduler.episodes-per-assignment", 16, "consecutive episodes per assignment message, leased and acked as one (1: one per message; lower it for long episodes)")
	fs.DurationVar(&c.Scheduler.ProgressEvery, "scheduler.progress-every", 250*time.Millisecond, "how often run progress is published")

	fs.IntVar(&c.Store.BatchRows, "store.batch-rows", 25_000, "most step and episode rows per ClickHouse insert")
	fs.DurationVar(&c.Store.FlushEvery, "store.flush-every", 5*time.Second, "longest wait of an event in a partial batch")
	fs.DurationVar(&c.Store.IdleFlush, "store.idle-flush", 250*time.Millisecond, "write a partial batch once no event arrived for this long (0: never)")
	fs.DurationVar(&c.Store.AckWait, "store.ack-wait", 30*time.Second, "lease on delivered events (renewed while ClickHouse is down)")

	fs.IntVar(&c.Reward.Subscribers, "reward.subscribers", 2, "score handlers per reward instance")

	fs.StringVar(&c.EnvAPI.Addr, "envapi.addr", "127.0.0.1:9470", "address of the env API, gRPC and HTTP/JSON on one port (empty: off)")
	fs.StringVar(&c.EnvAPI.TokensFile, "envapi.tokens", "", "YAML file of tenants and their API tokens (empty: tenant \"default\", token in <data-dir>/envapi-token)")
	fs.IntVar(&c.EnvAPI.MaxEpisodes, "envapi.max-episodes", 1024, "live episodes per tenant unless its entry says otherwise")
	fs.IntVar(&c.EnvAPI.ServerMaxEpisodes, "envapi.server-max-episodes", 16384, "live env API episodes over all tenants")
	fs.DurationVar(&c.EnvAPI.StepTimeout, "envapi.step-timeout", 30*time.Second, "bound on one step (env and reward)")
	fs.DurationVar(&c.EnvAPI.StartTimeout, "envapi.start-timeout", 30*time.Second, "bound on a Reset (fault plan and env start)")
	fs.DurationVar(&c.EnvAPI.EpisodeTimeout, "envapi.episode-timeout", time.Hour, "wall time from Reset after which an episode is truncated (reason timeout)")
	fs.DurationVar(&c.EnvAPI.IdleTimeout, "envapi.idle-timeout", 5*time.Minute, "an episode with no call for this long is reaped (truncated, reason timeout)")
	fs.IntVar(&c.EnvAPI.SegmentSteps, "envapi.segment-steps", 32, "steps of an env API episode per StepsTaken event")
	fs.IntVar(&c.EnvAPI.ScoreBatch, "envapi.score-batch", 512, "most steps in one score request of the env API")

	fs.StringVar(&c.PolicyHTTP.URL, "policy.http.url", "", "OpenAI-compatible API base of the \"http\" policy, e.g. http://127.0.0.1:8000/v1")
	fs.StringVar(&c.PolicyHTTP.Model, "policy.http.model", "", "model name the \"http\" policy sends")
	fs.StringVar(&c.PolicyHTTP.APIKey, "policy.http.api-key", "", "bearer key for the \"http\" policy's endpoint")
	fs.DurationVar(&c.PolicyHTTP.Timeout, "policy.http.timeout", 60*time.Second, "bound on one chat completion of the \"http\" policy (an infra error past it)")
	fs.IntVar(&c.PolicyHTTP.MaxTokens, "policy.http.max-tokens", 0, "max_tokens of each completion (0: the server's default)")
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

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
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
