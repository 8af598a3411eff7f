// Command pipeline measures gauntlet end to end on this machine: how many steps per second
// the whole stack (scheduler, workers, reward, faults, NATS JetStream, store) gets into
// ClickHouse, next to how many rows of the same kind ClickHouse takes from the store's
// writer alone, measured in the same run against the same server. The ratio of the two
// is the pipeline's share of its store's ceiling.
//
// Each round does both, in alternating order (ceiling first in odd rounds, pipeline first
// in even ones, so a machine getting busier or quieter over time does not favour either):
//
//   - ceiling: episodes are run in this process beforehand (shop, the chosen policy, the
//     fault plans services/faults would give, every step scored by pkg/scoring) and built
//     into the events services/worker publishes; the timed part is only
//     trajectory.Writer.Write of those events, in batches of the store's size, into a
//     fresh database.
//   - pipeline: `gauntlet demo` as a child process against the same ClickHouse; its
//     summary line gives persisted steps/s, /proc/<pid>/status its memory over time.
//
// -memory-episodes runs one more, long demo to show whether memory grows with the run.
// -console-episodes runs one more through `gauntlet up` and `gauntlet run` while a probe
// loads every page of the web console up serves, and reports each page's latency.
// -threat-episodes runs one more demo while this process publishes threat fingerprints
// into its NATS, and reports how long its workers took to know them (p50, p99).
// See loadtest/README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop" // registers the shop env
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// options are the harness's flags.
type options struct {
	Gauntlet       string        `json:"gauntlet"`
	Episodes       uint64        `json:"episodes"`
	Rounds         int           `json:"rounds"`
	Policy         string        `json:"policy"`
	Out            string        `json:"out"`
	RSSInterval    time.Duration `json:"rss_interval_ns"`
	MemoryEpisodes uint64        `json:"memory_episodes"`
	Timeout        time.Duration `json:"timeout_ns"`
	MaxInFlight    uint          `json:"max_in_flight"`
	CeilingSteps   int           `json:"ceiling_steps"`
	BatchRows      int           `json:"batch_rows"`
	PprofSeconds   int           `json:"pprof_seconds"`
	KeepData       bool          `json:"keep_data"`
	MaxRSSMB       int64         `json:"max_rss_mb"`
	// DemoArgs are extra flags for every `gauntlet demo` the harness runs (white-space
	// separated), e.g. "--store.flush-every 3s" or "--profiles edge=1".
	DemoArgs string `json:"demo_args,omitempty"`
	// LiveHeapEvery samples the memory run's live heap (after a forced GC) that often.
	LiveHeapEvery time.Duration `json:"live_heap_every_ns,omitempty"`
	// ConsoleEpisodes > 0 runs the console probe (consolerun.go) over a run of that many
	// episodes; ConsoleEvery is how often it loads each page.
	ConsoleEpisodes uint64        `json:"console_episodes,omitempty"`
	ConsoleEvery    time.Duration `json:"console_every_ns,omitempty"`
	// ThreatEpisodes > 0 runs one more demo of that many episodes with the fingerprint
	// probe (threats.go) publishing every ThreatEvery.
	ThreatEpisodes uint64        `json:"threat_episodes,omitempty"`
	ThreatEvery    time.Duration `json:"threat_every_ns,omitempty"`
	// Baseline, when set, makes the run a regression gate (gate.go); WriteBaseline
	// records the run as one.
	Baseline      string  `json:"baseline,omitempty"`
	MaxSlowdown   float64 `json:"max_slowdown,omitempty"`
	WriteBaseline string  `json:"write_baseline,omitempty"`
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.Gauntlet, "gauntlet", "../bin/gauntlet", "the gauntlet binary (`make build` makes bin/gauntlet)")
	fs.Uint64Var(&o.Episodes, "episodes", 200_000, "episodes of each round's pipeline run")
	fs.IntVar(&o.Rounds, "rounds", 3, "rounds of ceiling + pipeline (0: none)")
	fs.StringVar(&o.Policy, "policy", policy.Oracle, "policy of every episode")
	fs.StringVar(&o.Out, "out", "", "JSON results (default results/pipeline-<timestamp>.json)")
	fs.DurationVar(&o.RSSInterval, "rss-interval", time.Second, "how often the child's RSS is sampled")
	fs.Uint64Var(&o.MemoryEpisodes, "memory-episodes", 0, "after the rounds, one pipeline run of this many episodes to watch memory (0: skip)")
	fs.DurationVar(&o.Timeout, "timeout", 60*time.Minute, "bound on the whole harness; it stops itself (and its children) then")
	fs.UintVar(&o.MaxInFlight, "max-in-flight", 10_000, "the demo's --max-in-flight")
	fs.IntVar(&o.CeilingSteps, "ceiling-steps", 500_000, "step rows generated for (and written by) each ceiling measurement")
	fs.IntVar(&o.BatchRows, "batch-rows", 25_000, "step and episode rows per Write in the ceiling (the store's --store.batch-rows)")
	fs.IntVar(&o.PprofSeconds, "pprof-seconds", 0, "after the rounds, one extra untimed pipeline run profiled for this many seconds (0: skip)")
	fs.BoolVar(&o.KeepData, "keep-data", false, "keep the ClickHouse databases and the temp dir")
	fs.DurationVar(&o.LiveHeapEvery, "live-heap-every", 30*time.Second, "in the memory run, sample the live heap (a forced GC, then /debug/pprof/heap) this often (0: never)")
	fs.Uint64Var(&o.ConsoleEpisodes, "console-episodes", 0, "last, one run of this many episodes through `gauntlet up` and `gauntlet run` while a probe loads every console page; fails if a page errors (0: skip)")
	fs.DurationVar(&o.ConsoleEvery, "console-every", time.Second, "in the console run, how often the probe loads each page (one page after another, like one reader)")
	fs.Uint64Var(&o.ThreatEpisodes, "threat-episodes", 0, "after the memory run, one pipeline run of this many episodes while this process publishes threat fingerprints into the demo's NATS; reports their propagation to the demo's workers, p50 and p99 (0: skip)")
	fs.DurationVar(&o.ThreatEvery, "threat-every", 50*time.Millisecond, "in the threat run, how often a new fingerprint is published")
	fs.StringVar(&o.DemoArgs, "demo-args", "", "extra flags for every `gauntlet demo`, white-space separated (e.g. \"--profiles edge=1\")")
	fs.Int64Var(&o.MaxRSSMB, "max-rss-mb", defaultMaxRSSMB(), "stop a demo whose RSS passes this (default: half the machine's RAM; 0: no limit)")
	fs.StringVar(&o.Baseline, "baseline", "", "a baseline JSON (from -write-baseline) to judge this run's CPU per step against; the run fails beyond -max-slowdown")
	fs.Float64Var(&o.MaxSlowdown, "max-slowdown", 1.5, "with -baseline: the most gauntlet's median CPU per step may be, as a multiple of the baseline's")
	fs.StringVar(&o.WriteBaseline, "write-baseline", "", "write this run's medians as a baseline JSON to this path")
}

func (o *options) validate() error {
	var errs []error
	if o.Rounds < 0 {
		errs = append(errs, fmt.Errorf("-rounds: %d is negative", o.Rounds))
	}
	if o.Episodes == 0 && (o.Rounds > 0 || o.PprofSeconds > 0) {
		errs = append(errs, errors.New("-episodes: must be at least 1"))
	}
	if o.Rounds == 0 && o.MemoryEpisodes == 0 && o.PprofSeconds == 0 && o.ConsoleEpisodes == 0 && o.ThreatEpisodes == 0 {
		errs = append(errs, errors.New("nothing to do: -rounds, -memory-episodes, -pprof-seconds, -threat-episodes and -console-episodes are all 0"))
	}
	if o.ThreatEvery < time.Millisecond {
		errs = append(errs, fmt.Errorf("-threat-every: %v is shorter than 1ms", o.ThreatEvery))
	}
	if o.ConsoleEvery < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("-console-every: %v is shorter than 10ms", o.ConsoleEvery))
	}
	if _, err := policy.Lookup(o.Policy); err != nil {
		errs = append(errs, fmt.Errorf("-policy: %w", err))
	}
	if o.RSSInterval < 10*time.Millisecond {
		errs = append(errs, fmt.Errorf("-rss-interval: %v is shorter than 10ms", o.RSSInterval))
	}
	if o.Timeout <= 0 {
		errs = append(errs, fmt.Errorf("-timeout: %v must be positive", o.Timeout))
	}
	if o.MaxInFlight == 0 {
		errs = append(errs, errors.New("-max-in-flight: must be at least 1"))
	}
	if o.CeilingSteps < 1 || o.BatchRows < 1 {
		errs = append(errs, errors.New("-ceiling-steps and -batch-rows must be at least 1"))
	}
	if o.PprofSeconds < 0 {
		errs = append(errs, fmt.Errorf("-pprof-seconds: %d is negative", o.PprofSeconds))
	}
	if (o.Baseline != "" || o.WriteBaseline != "") && o.Rounds == 0 {
		errs = append(errs, errors.New("-baseline and -write-baseline need rounds (-rounds at least 1)"))
	}
	if o.MaxSlowdown < 1 {
		errs = append(errs, fmt.Errorf("-max-slowdown: %v must be at least 1", o.MaxSlowdown))
	}
	return errors.Join(errs...)
}

// results is the JSON the harness writes (after every round, so a stopped run keeps what
// it measured).
type results struct {
	Command        []string        `json:"command"`
	StartedAt      time.Time       `json:"started_at"`
	FinishedAt     time.Time       `json:"finished_at,omitzero"`
	Options        options         `json:"options"`
	Machine        machine         `json:"machine"`
	LoadStart      loadAvg         `json:"load_start"`
	LoadEnd        loadAvg         `json:"load_end"`
	ClickHouseAddr string          `json:"clickhouse_addr"`
	Corpus         *corpusInfo     `json:"ceiling_corpus,omitempty"`
	Rounds         []round         `json:"rounds"`
	Summary        *summaryResult  `json:"summary,omitempty"`
	Memory         *pipelineResult `json:"memory_run,omitempty"`
	Profile        *pipelineResult `json:"profile_run,omitempty"`
	Threats        *pipelineResult `json:"threat_run,omitempty"`
	Console        *consoleResult  `json:"console_run,omitempty"`
	Error          string          `json:"error,omitempty"`
}

// corpusInfo describes the ceiling's pre-generated events.
type corpusInfo struct {
	Episodes    int     `json:"episodes"`
	Events      int     `json:"events"`
	Steps       int     `json:"steps"`
	Faults      int     `json:"faults"`
	StepsPerEp  float64 `json:"steps_per_episode"`
	GenSeconds  float64 `json:"generate_seconds"`
	GenStepsSec float64 `json:"generate_steps_per_sec"`
	// WarmupSeconds is the untimed first pass over every batch, WarmupStepRowsPerSec its
	// rate (for comparison with the rounds': how much a cold process loses).
	WarmupSeconds        float64 `json:"warmup_write_seconds"`
	WarmupStepRowsPerSec float64 `json:"warmup_step_rows_per_sec"`
}

type round struct {
	N        int            `json:"round"`
	Order    string         `json:"order"` // "ceiling,pipeline" or "pipeline,ceiling"
	Ceiling  ceilingResult  `json:"ceiling"`
	Pipeline pipelineResult `json:"pipeline"`
	// Ratio is pipeline persisted steps/s over ceiling step rows/s.
	Ratio float64 `json:"ratio"`
}

type summaryResult struct {
	MedianCeilingStepRowsPerSec  float64 `json:"median_ceiling_step_rows_per_sec"`
	MedianCeilingTotalRowsPerSec float64 `json:"median_ceiling_total_rows_per_sec"`
	MedianPipelineStepsPerSec    float64 `json:"median_pipeline_persisted_steps_per_sec"`
	RatioOfMedians               float64 `json:"ratio_of_medians"`
	MedianRatio                  float64 `json:"median_ratio"`
	Target                       float64 `json:"target_ratio"`
	TargetMet                    bool    `json:"target_met"`
	MedianPeakRSSKB              float64 `json:"median_peak_rss_kb"`
	// CPU per step or row (µs), medians over the rounds: what a faster or slower machine
	// moves least, where the rates and the ratio move with it (docs/benchmarks.md).
	MedianGauntletUsPerStep   float64 `json:"median_gauntlet_us_per_step"`
	MedianClickHouseUsPerStep float64 `json:"median_clickhouse_us_per_step"`
	MedianCeilingUsPerRow     float64 `json:"median_ceiling_us_per_row"` // ClickHouse and the harness's writer
	// MedianGauntletPerCeilingRow is, per round, gauntlet's CPU per step over the ceiling's
	// CPU per step row measured next to it, the median over the rounds: the gate's figure.
	// A slower or busier machine slows both halves of a round alike, so it moves less
	// than gauntlet's CPU per step alone (docs/benchmarks.md).
	MedianGauntletPerCeilingRow float64 `json:"median_gauntlet_per_ceiling_row"`
}

// cpuUs is the CPU each of n units took, in µs, from a window's cores over its seconds.
func cpuUs(cores, seconds float64, n int) float64 {
	if n <= 0 {
		return 0
	}
	return cores * seconds / float64(n) * 1e6
}

// cpuPerStep is the pipeline's CPU per persisted step: gauntlet's, ClickHouse's (µs).
func (p pipelineResult) cpuPerStep() (gauntlet, clickhouse float64) {
	return cpuUs(p.Window.ChildCores, p.Window.Seconds, int(p.Steps)), cpuUs(p.Window.CHCores, p.Window.Seconds, int(p.Steps))
}

// cpuPerRow is the ceiling's CPU per step row: ClickHouse's and the harness's (µs).
func (c ceilingResult) cpuPerRow() (clickhouse, harness float64) {
	return cpuUs(c.Window.CHCores, c.Window.Seconds, c.StepRows), cpuUs(c.Window.HarnessCores, c.Window.Seconds, c.StepRows)
}

// targetRatio is the goal: the pipeline reaches half of its store's ceiling.
const targetRatio = 0.5

func main() {
	// The same collector setting as cmd/gauntlet, whose store the ceiling stands in
	// for; GOGC in the environment still wins. It had drifted to 400: on these VMs a page
	// touched for the first time (or again after the runtime returned it) is costly, and
	// with a heap allowed to grow 5× between collections the ceiling's Writes spent most
	// of their time in page faults: 26-28k step rows/s at 400 against 62k at 200 for the
	// same batches (docs/benchmarks.md).
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadtest:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) (err error) {
	fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
	var o options
	o.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := o.validate(); err != nil {
		return err
	}
	bin, err := filepath.Abs(o.Gauntlet)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() {
		return fmt.Errorf("gauntlet binary %s not found: run `make build` in the repository root first (or pass -gauntlet PATH)", bin)
	}
	o.Gauntlet = bin
	started := time.Now()
	if o.Out == "" {
		o.Out = filepath.Join("results", "pipeline-"+started.Format("20060102-150405")+".json")
	}
	if err := os.MkdirAll(filepath.Dir(o.Out), 0o755); err != nil {
		return err
	}
	stem := strings.TrimSuffix(o.Out, ".json")
	var base baseline
	if o.Baseline != "" {
		// Read first: a gate whose baseline is unusable fails before minutes of rounds.
		if base, err = readBaseline(o.Baseline, o); err != nil {
			return err
		}
	}

	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()

	res := &results{Command: os.Args, StartedAt: started, Options: o, LoadStart: readLoadAvg()}
	save := func() {
		b, _ := json.MarshalIndent(res, "", "  ")
		if werr := os.WriteFile(o.Out, append(b, '\n'), 0o644); werr != nil {
			fmt.Fprintln(os.Stderr, "loadtest: write results:", werr)
		}
	}
	defer func() {
		res.FinishedAt = time.Now()
		res.LoadEnd = readLoadAvg()
		if err != nil {
			res.Error = err.Error()
			if ctx.Err() == context.DeadlineExceeded {
				err = fmt.Errorf("stopped after -timeout %v: %w", o.Timeout, err)
				res.Error = err.Error()
			}
		}
		save()
		fmt.Fprintf(stdout, "\nresults: %s\n", o.Out)
	}()

	tmp, err := os.MkdirTemp("", "gauntlet-loadtest-")
	if err != nil {
		return err
	}
	if !o.KeepData {
		defer os.RemoveAll(tmp)
	}

	fmt.Fprintf(stdout, "starting ClickHouse in %s …\n", tmp)
	ch, err := chlocal.Start(ctx, chlocal.Options{Dir: filepath.Join(tmp, "clickhouse")})
	if errors.Is(err, chlocal.ErrNotInstalled) {
		return errors.New("ClickHouse is not installed: run `scripts/deps.sh` as root (or `make deps`) in the repository root")
	}
	if err != nil {
		return err
	}
	defer func() {
		sctx, scancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer scancel()
		_ = ch.Stop(sctx)
	}()
	res.ClickHouseAddr = ch.Addr()
	procs := procSet{ClickHouse: ch.Pid}
	admin, err := trajectory.Connect(ctx, ch.Addr(), "default")
	if err != nil {
		return err
	}
	defer admin.Close()
	res.Machine = describeMachine(ctx, bin, admin)
	m := res.Machine
	fmt.Fprintf(stdout, "machine: %d × %s, %d MB RAM, kernel %s; gauntlet built with %s; ClickHouse %s at %s\n",
		m.CPUs, m.CPUModel, m.MemTotalMB, m.Kernel, m.GauntletGo, m.ClickHouse, ch.Addr())
	fmt.Fprintf(stdout, "load average at start: %s\n", res.LoadStart)
	save()

	drop := func(db string) {
		if o.KeepData {
			return
		}
		if err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+db); err != nil {
			fmt.Fprintf(os.Stderr, "loadtest: drop database %s: %v\n", db, err)
		}
	}
	pipeline := func(label, db string, episodes uint64, profileSeconds int) (pipelineResult, error) {
		dataDir := filepath.Join(tmp, "data-"+label)
		defer func() {
			if !o.KeepData {
				_ = os.RemoveAll(dataDir)
			}
		}()
		po := pipelineOpts{
			gauntlet: bin, dataDir: dataDir, chAddr: ch.Addr(), database: db, policy: o.Policy,
			episodes: episodes, maxInFlight: o.MaxInFlight, rssInterval: o.RSSInterval,
			logPath: stem + "-" + label + ".log", procs: procs, maxRSSKB: o.MaxRSSMB * 1024,
			extraArgs: strings.Fields(o.DemoArgs),
		}
		switch label {
		case "memory":
			po.liveHeapEvery = o.LiveHeapEvery
		case "threats":
			po.threatEvery = o.ThreatEvery
		}
		if profileSeconds > 0 {
			po.profileSeconds, po.profileDelay, po.profilePath = profileSeconds, 5*time.Second, stem+"-"+label+".pprof"
		}
		fmt.Fprintf(stdout, "  pipeline: %s demo --episodes %d … (log %s)\n", filepath.Base(bin), episodes, po.logPath)
		r, err := runPipeline(ctx, po)
		drop(db)
		return r, err
	}

	if o.Rounds > 0 {
		fmt.Fprintf(stdout, "generating the ceiling's events (≥ %d steps of shop/%s, in process) …\n", o.CeilingSteps, o.Policy)
		c, err := generate(ctx, o.Policy, o.CeilingSteps)
		if err != nil {
			return fmt.Errorf("generate ceiling events: %w", err)
		}
		res.Corpus = &corpusInfo{
			Episodes: c.episodes, Events: len(c.events), Steps: c.steps, Faults: c.faults,
			StepsPerEp: float64(c.steps) / float64(c.episodes), GenSeconds: c.GenSeconds,
			GenStepsSec: float64(c.steps) / c.GenSeconds,
		}
		fmt.Fprintf(stdout, "  %d episodes, %d events, %d steps (%.1f per episode), %d faults in %.1fs (%.0f steps/s on one goroutine)\n",
			c.episodes, len(c.events), c.steps, res.Corpus.StepsPerEp, c.faults, c.GenSeconds, res.Corpus.GenStepsSec)
		batches, err := c.encode(o.BatchRows)
		if err != nil {
			return err
		}
		// The first Writes of a fresh process are slower: its heap is faulted in page by
		// page (~10 µs a page on these VMs) and the writer's buffers grow. The store of a
		// running pipeline is long past that, so one whole untimed pass warms up first.
		// One batch was not enough: in a first round the first half of the batches still
		// took 2-3 times as long as the rest, and that round's ceiling came out at 44k
		// step rows/s against 50-72k in the next four (docs/benchmarks.md).
		wu, err := measureCeiling(ctx, ch.Addr(), "lt_warmup", batches, 0, procs)
		drop("lt_warmup")
		if err != nil {
			return fmt.Errorf("warm-up pass: %w", err)
		}
		res.Corpus.WarmupSeconds = wu.Seconds
		res.Corpus.WarmupStepRowsPerSec = wu.StepRowsPerSec
		fmt.Fprintf(stdout, "  warm-up pass (not counted): %d step rows in %.2fs (%.0f step rows/s)\n", wu.StepRows, wu.Seconds, wu.StepRowsPerSec)

		for n := 1; n <= o.Rounds; n++ {
			rd := round{N: n, Order: "ceiling,pipeline"}
			if n%2 == 0 {
				rd.Order = "pipeline,ceiling"
			}
			fmt.Fprintf(stdout, "\nround %d/%d (%s)\n", n, o.Rounds, rd.Order)
			ceiling := func() error {
				db := fmt.Sprintf("lt_ceiling_%d", n)
				fmt.Fprintf(stdout, "  ceiling: %d events in %d writes into %s …\n", countEvents(batches), len(batches), db)
				r, err := measureCeiling(ctx, ch.Addr(), db, batches, c.episodes, procs)
				drop(db)
				rd.Ceiling = r
				return err
			}
			pipe := func() error {
				r, err := pipeline(fmt.Sprintf("round%d", n), fmt.Sprintf("lt_%d", n), o.Episodes, 0)
				rd.Pipeline = r
				return err
			}
			steps := []func() error{ceiling, pipe}
			if n%2 == 0 {
				steps = []func() error{pipe, ceiling}
			}
			for _, step := range steps {
				if err := step(); err != nil {
					res.Rounds = append(res.Rounds, rd)
					return fmt.Errorf("round %d: %w", n, err)
				}
			}
			rd.Ratio = rd.Pipeline.StepsPerSec / rd.Ceiling.StepRowsPerSec
			res.Rounds = append(res.Rounds, rd)
			printRound(stdout, rd)
			save()
		}
		res.Summary = summarize(res.Rounds)
		printSummary(stdout, res.Rounds, res.Summary)
		save()
		if o.WriteBaseline != "" {
			if err := writeBaseline(o.WriteBaseline, res); err != nil {
				return err
			}
			fmt.Fprintf(stdout, "baseline written to %s\n", o.WriteBaseline)
		}
		if o.Baseline != "" {
			if err := gate(stdout, res.Summary, base, o.MaxSlowdown); err != nil {
				return err
			}
		}
	}

	if o.PprofSeconds > 0 {
		fmt.Fprintf(stdout, "\nprofile run: %d episodes, CPU profile of %ds (not counted in the medians)\n", o.Episodes, o.PprofSeconds)
		r, err := pipeline("profile", "lt_profile", o.Episodes, o.PprofSeconds)
		res.Profile = &r
		save()
		if err != nil {
			return fmt.Errorf("profile run: %w", err)
		}
		fmt.Fprintf(stdout, "  profile: %s (go tool pprof -top %s %s)\n", r.Profile, bin, r.Profile)
	}

	if o.MemoryEpisodes > 0 {
		fmt.Fprintf(stdout, "\nmemory run: %d episodes\n", o.MemoryEpisodes)
		r, err := pipeline("memory", "lt_memory", o.MemoryEpisodes, 0)
		res.Memory = &r
		save()
		if err != nil {
			return fmt.Errorf("memory run: %w", err)
		}
		printMemory(stdout, r)
	}

	if o.ThreatEpisodes > 0 {
		fmt.Fprintf(stdout, "\nthreat run: %d episodes, a threat fingerprint published into the demo's NATS every %v\n", o.ThreatEpisodes, o.ThreatEvery)
		r, err := pipeline("threats", "lt_threats", o.ThreatEpisodes, 0)
		res.Threats = &r
		save()
		if err != nil {
			return fmt.Errorf("threat run: %w", err)
		}
		printThreats(stdout, r)
		if r.Threats.Error != "" {
			return fmt.Errorf("threat run: %s", r.Threats.Error)
		}
	}

	if o.ConsoleEpisodes > 0 {
		fmt.Fprintf(stdout, "\nconsole run: %d episodes through gauntlet up, each console page loaded every %v\n", o.ConsoleEpisodes, o.ConsoleEvery)
		dataDir := filepath.Join(tmp, "data-console")
		co := consoleOpts{
			gauntlet: bin, dataDir: dataDir, chAddr: ch.Addr(), database: "lt_console", policy: o.Policy,
			episodes: o.ConsoleEpisodes, maxInFlight: o.MaxInFlight, every: o.ConsoleEvery,
			upLog: stem + "-console-up.log", runLog: stem + "-console-run.log", procs: procs,
			extraArgs: strings.Fields(o.DemoArgs),
		}
		fmt.Fprintf(stdout, "  %s up … ; %s run --episodes %d … (logs %s, %s)\n", filepath.Base(bin), filepath.Base(bin), o.ConsoleEpisodes, co.upLog, co.runLog)
		r, err := runConsoleProbe(ctx, co)
		res.Console = &r
		save()
		if !o.KeepData {
			_ = os.RemoveAll(dataDir)
		}
		drop("lt_console")
		printConsole(stdout, r)
		if err != nil {
			return fmt.Errorf("console run: %w", err)
		}
	}
	fmt.Fprintf(stdout, "\nload average at end: %s\n", readLoadAvg())
	return nil
}

func countEvents(batches []encodedBatch) int {
	n := 0
	for _, b := range batches {
		n += len(b)
	}
	return n
}

func summarize(rounds []round) *summaryResult {
	var ceil, total, pipe, ratio, peak, gus, chus, ceilus, norm []float64
	for _, r := range rounds {
		ceil = append(ceil, r.Ceiling.StepRowsPerSec)
		total = append(total, r.Ceiling.TotalRowsPerSec)
		pipe = append(pipe, r.Pipeline.StepsPerSec)
		ratio = append(ratio, r.Ratio)
		peak = append(peak, float64(r.Pipeline.PeakRSSKB))
		g, ch := r.Pipeline.cpuPerStep()
		gus, chus = append(gus, g), append(chus, ch)
		cch, charness := r.Ceiling.cpuPerRow()
		ceilus = append(ceilus, cch+charness)
		if cch+charness > 0 {
			norm = append(norm, g/(cch+charness))
		}
	}
	s := &summaryResult{
		MedianCeilingStepRowsPerSec:  median(ceil),
		MedianCeilingTotalRowsPerSec: median(total),
		MedianPipelineStepsPerSec:    median(pipe),
		MedianRatio:                  median(ratio),
		Target:                       targetRatio,
		MedianPeakRSSKB:              median(peak),
		MedianGauntletUsPerStep:      median(gus),
		MedianClickHouseUsPerStep:    median(chus),
		MedianCeilingUsPerRow:        median(ceilus),
		MedianGauntletPerCeilingRow:  median(norm),
	}
	s.RatioOfMedians = s.MedianPipelineStepsPerSec / s.MedianCeilingStepRowsPerSec
	s.TargetMet = s.MedianRatio >= targetRatio
	return s
}

// defaultMaxRSSMB is half of MemTotal, or 8 GiB if /proc/meminfo cannot be read.
func defaultMaxRSSMB() int64 {
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		if kb, err := parseStatusKB(b, "MemTotal"); err == nil {
			return kb / 1024 / 2
		}
	}
	return 8 << 10
}

func mb(kb int64) float64 { return float64(kb) / 1024 }

func printRound(w io.Writer, r round) {
	c, p := r.Ceiling, r.Pipeline
	fmt.Fprintf(w, "  ceiling   %d step rows (+%d fault, %d episode rows) in %.2fs over %d writes: %.0f step rows/s, %.0f rows/s in all\n",
		c.StepRows, c.FaultRows, c.EpisodeRows, c.Seconds, c.Writes, c.StepRowsPerSec, c.TotalRowsPerSec)
	fmt.Fprintf(w, "            %s\n", c.Window)
	cch, charness := c.cpuPerRow()
	fmt.Fprintf(w, "            CPU per step row: ClickHouse %.1f + harness %.1f µs\n", cch, charness)
	fmt.Fprintf(w, "  pipeline  %d episodes, %d steps, all in ClickHouse after %.1fs: %.0f steps/s (run done after %.1fs: %.0f steps/s)\n",
		p.Episodes, p.Steps, p.PersistedSeconds, p.StepsPerSec, p.RunSeconds, p.RunStepsPerSec)
	fmt.Fprintf(w, "            RSS peak %.0f MB; at 25/50/75/100%%: %s; ClickHouse peak %.0f MB\n",
		mb(p.PeakRSSKB), rssList(p.RSSAt), mb(p.PeakCHRSSKB))
	fmt.Fprintf(w, "            %s\n", p.Window)
	g, ch := p.cpuPerStep()
	fmt.Fprintf(w, "            CPU per step: gauntlet %.1f + ClickHouse %.1f µs\n", g, ch)
	fmt.Fprintf(w, "  ratio     %.3f (pipeline / ceiling)\n", r.Ratio)
}

func rssList(s []rssSample) string {
	parts := make([]string, len(s))
	for i, x := range s {
		parts[i] = fmt.Sprintf("%.0f", mb(x.RSSKB))
	}
	return strings.Join(parts, "/") + " MB"
}

func printSummary(w io.Writer, rounds []round, s *summaryResult) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\torder\tceiling step rows/s\tceiling rows/s\tpipeline steps/s\tratio\tpeak RSS MB\tload start→end\tothers' cores\t")
	for _, r := range rounds {
		others := max(r.Ceiling.Window.OtherCores, r.Pipeline.Window.OtherCores)
		first, last := r.Ceiling.Window, r.Pipeline.Window
		if r.Order != "ceiling,pipeline" {
			first, last = last, first
		}
		fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%.0f\t%.3f\t%.0f\t%.2f→%.2f\t≤%.2f\t\n", r.N, r.Order,
			r.Ceiling.StepRowsPerSec, r.Ceiling.TotalRowsPerSec, r.Pipeline.StepsPerSec, r.Ratio,
			mb(r.Pipeline.PeakRSSKB), first.LoadStart.One, last.LoadEnd.One, others)
	}
	fmt.Fprintf(tw, "median\t\t%.0f\t%.0f\t%.0f\t%.3f\t%.0f\t\t\t\n", s.MedianCeilingStepRowsPerSec,
		s.MedianCeilingTotalRowsPerSec, s.MedianPipelineStepsPerSec, s.MedianRatio, s.MedianPeakRSSKB/1024)
	tw.Flush()
	verdict := "NOT met"
	if s.TargetMet {
		verdict = "met"
	}
	fmt.Fprintf(w, "\npipeline / ceiling: median of ratios %.3f, ratio of medians %.3f; target %.2f: %s\n",
		s.MedianRatio, s.RatioOfMedians, s.Target, verdict)
	fmt.Fprintf(w, "CPU, medians: pipeline gauntlet %.1f + ClickHouse %.1f µs per step; ceiling %.1f µs per step row; gauntlet per step over ceiling per row %.2f\n",
		s.MedianGauntletUsPerStep, s.MedianClickHouseUsPerStep, s.MedianCeilingUsPerRow, s.MedianGauntletPerCeilingRow)
}

func printMemory(w io.Writer, r pipelineResult) {
	fmt.Fprintf(w, "  %d episodes, %d steps, all in ClickHouse after %.1fs: %.0f steps/s\n",
		r.Episodes, r.Steps, r.PersistedSeconds, r.StepsPerSec)
	fmt.Fprintf(w, "  %s\n", r.Window)
	fracs := []float64{0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "% of run\tt (s)\tgauntlet RSS MB\tClickHouse RSS MB\t")
	for i, s := range rssAt(r.RSS, fracs) {
		fmt.Fprintf(tw, "%.0f\t%.0f\t%.0f\t%.0f\t\n", fracs[i]*100, s.Seconds, mb(s.RSSKB), mb(s.CHRSSKB))
	}
	tw.Flush()
	fmt.Fprintf(w, "  peak %.0f MB\n", mb(r.PeakRSSKB))
	printLiveHeap(w, r.LiveHeap)
}

// printLiveHeap shows about ten of the live-heap samples and the least-squares slope of
// the live heap over episodes done, leaving out the first 10 % of the run (start-up).
func printLiveHeap(w io.Writer, samples []heapSample) {
	if len(samples) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t (s)	episodes	live heap MB	heap held MB\t")
	step := max(1, len(samples)/10)
	for i, s := range samples {
		if i%step == 0 || i == len(samples)-1 {
			fmt.Fprintf(tw, "%.0f\t%d\t%.0f\t%.0f\t\n", s.Seconds, s.Episodes, float64(s.HeapAlloc)/(1<<20), float64(s.HeapSys)/(1<<20))
		}
	}
	tw.Flush()
	if slope, n, ok := liveHeapSlope(samples); ok {
		fmt.Fprintf(w, "  live heap slope over %d samples past 10%% of the episodes: %+.1f MB per 100,000 episodes\n", n, slope*100_000/(1<<20))
	}
}

// printThreats shows the threat run's throughput and the fingerprints' propagation from
// this process to the demo's workers.
func printThreats(w io.Writer, r pipelineResult) {
	fmt.Fprintf(w, "  %d episodes, %d steps, all in ClickHouse after %.1fs: %.0f steps/s\n",
		r.Episodes, r.Steps, r.PersistedSeconds, r.StepsPerSec)
	fmt.Fprintf(w, "  %s\n", r.Window)
	t := r.Threats
	bound := func(ms float64) string {
		if ms < 0 {
			return "+Inf"
		}
		return strconv.FormatFloat(ms, 'g', -1, 64) + " ms"
	}
	fmt.Fprintf(w, "  threat fingerprints: %d published from this process, %d learned by the demo's workers; propagation p50 <= %s, p99 <= %s, mean %.2f ms\n",
		t.Published, t.Learned, bound(t.P50Ms), bound(t.P99Ms), t.MeanMs)
}

// printConsole shows the console run's throughput and each page's latencies.
func printConsole(w io.Writer, r consoleResult) {
	if r.Steps > 0 {
		fmt.Fprintf(w, "  %d episodes, %d steps, all in ClickHouse after %.1fs: %.0f steps/s\n",
			r.Episodes, r.Steps, r.PersistedSeconds, r.StepsPerSec)
	}
	fmt.Fprintf(w, "  %s\n", r.Window)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "page\tloads\terrors\tp50 ms\tp99 ms\tmax ms\t")
	for _, p := range r.Pages {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t\n", p.Page, p.Count, p.Errors, p.P50Ms, p.P99Ms, p.MaxMs)
	}
	fmt.Fprintln(tw, "\t\t\t\t\t\t")
	for _, p := range r.Requests {
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%.1f\t%.1f\t%.1f\t\n", p.Page, p.Count, p.Errors, p.P50Ms, p.P99Ms, p.MaxMs)
	}
	tw.Flush()
	for _, p := range r.Pages {
		if p.FirstError != "" {
			fmt.Fprintf(w, "  %s: first error: %s\n", p.Page, p.FirstError)
		}
	}
}
