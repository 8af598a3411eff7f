// Command soak runs gauntlet for hours under the load and the failures it must survive,
// and accounts for every episode it started. It runs `gauntlet up` on a size-capped data
// dir (a loop-mounted ext4 image), drives it as fast as it goes with runs of the built-in
// envs and with trainers over the env API, a share of whose actions are over NATS's
// 8 MiB payload limit, kills gauntlet with SIGKILL (and restarts it on the same data dir)
// and its local ClickHouse (which gauntlet must restart) on their own intervals, samples
// both processes' memory, and at the end checks ClickHouse: every episode once with
// every step, no infra error that was not a real infrastructure failure, memory flat.
// See loadtest/README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	// The built-in runs are validated as the CLI validates them, against the envs.
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

type config struct {
	Gauntlet       string        `json:"gauntlet"`
	Duration       time.Duration `json:"duration_ns"`
	KillGauntlet   time.Duration `json:"kill_gauntlet_ns"`
	KillClickHouse time.Duration `json:"kill_clickhouse_ns"`
	DataSize       int64         `json:"data_size_bytes"`
	DataFS         string        `json:"data_fs"`
	BigShare       float64       `json:"big_share"`
	BigBytes       int           `json:"big_bytes"`
	Trainers       int           `json:"trainers"`
	MaxSteps       uint          `json:"max_steps"`
	Env            string        `json:"env"`
	Policies       string        `json:"policies"`
	Profiles       string        `json:"profiles"`
	RunEpisodes    uint64        `json:"run_episodes"`
	RunsInFlight   int           `json:"runs_in_flight"`
	RSSInterval    time.Duration `json:"rss_interval_ns"`
	FlatTolerance  float64       `json:"flat_tolerance"`
	RSSWarmup      time.Duration `json:"rss_warmup_ns"`
	Drain          time.Duration `json:"drain_ns"`
	UpArgs         string        `json:"up_args"`
	Work           string        `json:"-"`
	Out            string        `json:"-"`
	Keep           bool          `json:"-"`
}

func main() {
	var c config
	fs := flag.NewFlagSet("soak", flag.ExitOnError)
	fs.StringVar(&c.Gauntlet, "gauntlet", "../bin/gauntlet", "the gauntlet binary to soak")
	fs.DurationVar(&c.Duration, "duration", 2*time.Hour, "how long the load runs (the drain and the accounting come after)")
	fs.DurationVar(&c.KillGauntlet, "kill-gauntlet", 20*time.Minute, "kill -9 gauntlet this often, then restart it on the same data dir (0: never)")
	fs.DurationVar(&c.KillClickHouse, "kill-clickhouse", 30*time.Minute, "kill -9 gauntlet's local ClickHouse this often (0: never)")
	fs.Int64Var(&c.DataSize, "data-size", 10<<30, "size of the data dir's filesystem in bytes")
	fs.StringVar(&c.DataFS, "data-fs", "auto", "loop (a loop-mounted ext4 image of -data-size; needs root), dir (a plain directory, uncapped) or auto (loop, else dir)")
	fs.Float64Var(&c.BigShare, "big-share", 0.01, "share of all actions (built-in and env API) that are over -big-bytes; the built-in runs are held back to keep it")
	fs.IntVar(&c.BigBytes, "big-bytes", 8<<20+64<<10, "size of a big action's arguments in bytes (over NATS's 8 MiB payload limit, under the env API's Step cap)")
	fs.IntVar(&c.Trainers, "trainers", 4, "concurrent env API trainers (each plays one episode at a time)")
	fs.UintVar(&c.MaxSteps, "max-steps", 20, "step limit of a trainer's episodes")
	fs.StringVar(&c.Env, "env", "shop", "env of the built-in runs")
	fs.StringVar(&c.Policies, "policies", "random=1,oracle=1", "policies of the built-in runs")
	fs.StringVar(&c.Profiles, "profiles", "baseline=60,stress=25,edge=15", "fault profiles of the built-in runs")
	fs.Uint64Var(&c.RunEpisodes, "run-episodes", 500, "episodes per built-in run")
	fs.IntVar(&c.RunsInFlight, "runs-in-flight", 4, "built-in runs open at once")
	fs.DurationVar(&c.RSSInterval, "rss-interval", 5*time.Second, "how often gauntlet's and ClickHouse's memory is sampled")
	fs.Float64Var(&c.FlatTolerance, "flat-tolerance", 0.10, "memory is flat when the last half's median RSS is at most this much above the first half's")
	fs.DurationVar(&c.RSSWarmup, "rss-warmup", -1, "memory samples before this are not judged, the climb to the working set (negative: a tenth of -duration, at most 5m)")
	fs.DurationVar(&c.Drain, "drain", 10*time.Minute, "after the load, how long to wait for every episode to reach ClickHouse")
	fs.StringVar(&c.UpArgs, "up-args", "", "extra flags for gauntlet up, space-separated")
	fs.StringVar(&c.Work, "work", "", "scratch directory for the data dir and logs (default: a new one under $TMPDIR)")
	fs.StringVar(&c.Out, "out", "", "results JSON (default results/soak-<timestamp>.json; the summary goes next to it as .txt)")
	fs.BoolVar(&c.Keep, "keep", false, "keep the data dir and logs")
	fs.Parse(os.Args[1:])
	if c.RSSWarmup < 0 {
		c.RSSWarmup = min(c.Duration/10, 5*time.Minute)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := soak(ctx, c, log); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

// kill is one kill -9 the harness did and what followed.
type kill struct {
	What  string        `json:"what"` // gauntlet or clickhouse
	At    time.Duration `json:"at_ns"`
	PID   int           `json:"pid"`
	Back  bool          `json:"back"` // restarted and /ready again
	Ready time.Duration `json:"ready_after_ns"`
	Err   string        `json:"err,omitempty"`
}

// results is the soak's JSON report.
type results struct {
	Config        config         `json:"config"`
	Started       time.Time      `json:"started"`
	DataDir       *dataDir       `json:"data_dir"`
	DataUsedPeak  uint64         `json:"data_used_peak_bytes"`
	Load          time.Duration  `json:"load_ns"`
	Drained       time.Duration  `json:"drained_after_ns"`
	Actions       uint64         `json:"actions"`
	ActionsPerSec float64        `json:"actions_per_s"`
	BigShare      float64        `json:"big_share_achieved"`
	Kills         []kill         `json:"kills"`
	UnexpectedEnd []string       `json:"unexpected_exits,omitempty"`
	Accounting    Accounting     `json:"accounting"`
	InfraDetails  []string       `json:"infra_error_details,omitempty"`
	TrainerErrors map[string]int `json:"trainer_call_errors"`
	// TrainerErrorSamples are the first few messages of each kind, with when they came.
	TrainerErrorSamples []string    `json:"trainer_call_error_samples,omitempty"`
	EventsPeak          uint64      `json:"events_stream_peak_bytes"`
	EventsCap           uint64      `json:"events_stream_max_bytes"`
	SubmitErrors        int         `json:"run_submit_errors"`
	Gauntlet            Memory      `json:"gauntlet_memory"`
	ClickHouse          Memory      `json:"clickhouse_memory"`
	GauntletRSS         []rssSample `json:"gauntlet_rss"`
	ClickHouseRSS       []rssSample `json:"clickhouse_rss"`
	Pass                bool        `json:"pass"`
}

func soak(ctx context.Context, c config, log *slog.Logger) error {
	bin, err := filepath.Abs(c.Gauntlet)
	if err != nil {
		return err
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("the gauntlet binary (-gauntlet; make build): %w", err)
	}
	if c.Work == "" {
		if c.Work, err = os.MkdirTemp("", "gauntlet-soak-"); err != nil {
			return err
		}
	}
	if c.Out == "" {
		c.Out = filepath.Join("results", "soak-"+time.Now().UTC().Format("20060102-150405")+".json")
	}
	if err := os.MkdirAll(filepath.Dir(c.Out), 0o755); err != nil {
		return err
	}
	res := &results{Config: c, Started: time.Now().UTC()}
	dd, err := prepareDataDir(ctx, c.Work, c.DataFS, c.DataSize, log)
	if err != nil {
		return err
	}
	res.DataDir = dd
	defer func() {
		if !c.Keep {
			if err := dd.release(); err != nil {
				log.Warn("soak: release data dir", "err", err)
			}
			os.RemoveAll(c.Work)
		}
	}()
	p, err := freePorts()
	if err != nil {
		return err
	}
	st := &stack{bin: bin, dir: dd.Path, ports: p, extra: strings.Fields(c.UpArgs), log: log}
	upLog := filepath.Join(c.Work, "up.log")
	log.Info("soak: starting gauntlet", "data_dir", dd.Path, "kind", dd.Kind, "log", upLog)
	if err := st.start(ctx, upLog); err != nil {
		return err
	}
	defer st.stop(time.Minute)
	ch, err := trajectory.Connect(ctx, fmt.Sprintf("127.0.0.1:%d", p.ClickHouse), "gauntlet")
	if err != nil {
		return err
	}
	defer ch.Close()
	token := func() string {
		b, _ := os.ReadFile(filepath.Join(dd.Path, "envapi-token"))
		return strings.TrimSpace(string(b))
	}
	if token() == "" {
		return errors.New("no env API token in the data dir after gauntlet up")
	}

	var cnt counters
	pace := pacer{share: c.BigShare}
	bi := &builtin{natsURL: fmt.Sprintf("nats://127.0.0.1:%d", p.NATS), ch: ch, env: c.Env, policies: c.Policies,
		profiles: c.Profiles, episodes: c.RunEpisodes, inFlight: c.RunsInFlight, pace: pace, c: &cnt, log: log}
	tr := &trainers{addr: fmt.Sprintf("127.0.0.1:%d", p.EnvAPI), token: token, n: c.Trainers,
		maxSteps: uint32(c.MaxSteps), bigAction: `{"query":"` + strings.Repeat("m", max(c.BigBytes-12, 0)) + `"}`,
		pace: pace, c: &cnt, log: log, hard: ctx}

	start := time.Now()
	load, endLoad := context.WithTimeout(ctx, c.Duration)
	defer endLoad()
	var wg sync.WaitGroup
	wg.Go(func() { bi.loop(load) })
	wg.Go(func() { tr.run(load) })

	// Sampling runs until the accounting is done; kills only during the load.
	ev := &eventsStream{url: fmt.Sprintf("nats://127.0.0.1:%d", p.NATS)}
	var evNow atomic.Uint64 // the events stream's bytes at the last sample
	defer ev.close()
	sampleCtx, endSampling := context.WithCancel(ctx)
	defer endSampling()
	var smu sync.Mutex
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(c.RSSInterval)
		defer tick.Stop()
		for {
			gp := st.pid()
			at := time.Since(start)
			smu.Lock()
			if r := rssOf(gp); r > 0 {
				res.GauntletRSS = append(res.GauntletRSS, rssSample{At: at, RSS: r})
			}
			if r := rssOf(childPID(gp, "clickhouse")); r > 0 {
				res.ClickHouseRSS = append(res.ClickHouseRSS, rssSample{At: at, RSS: r})
			}
			res.DataUsedPeak = max(res.DataUsedPeak, dd.used())
			smu.Unlock()
			if b, limit, ok := ev.size(sampleCtx); ok {
				evNow.Store(b)
				smu.Lock()
				res.EventsPeak, res.EventsCap = max(res.EventsPeak, b), uint64(limit)
				smu.Unlock()
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
		}
	})
	wg.Go(func() {
		next := func(d time.Duration) <-chan time.Time {
			if d <= 0 {
				return nil
			}
			return time.After(d)
		}
		kg, kc := next(c.KillGauntlet), next(c.KillClickHouse)
		check := time.NewTicker(time.Second)
		defer check.Stop()
		for {
			select {
			case <-load.Done():
				return
			case <-check.C:
				if st.pid() == 0 {
					res.UnexpectedEnd = append(res.UnexpectedEnd, fmt.Sprintf("gauntlet exited at %s", time.Since(start).Round(time.Second)))
					log.Error("soak: gauntlet exited by itself; restarting it")
					if err := st.start(ctx, upLog); err != nil {
						log.Error("soak: restart gauntlet", "err", err)
					}
				}
			case <-kg:
				k := kill{What: "gauntlet", At: time.Since(start), PID: st.pid()}
				log.Info("soak: kill -9 gauntlet", "pid", k.PID)
				st.kill()
				t0 := time.Now()
				if err := st.start(ctx, upLog); err != nil {
					k.Err = err.Error()
				} else {
					k.Back, k.Ready = true, time.Since(t0)
				}
				res.Kills = append(res.Kills, k)
				kg = next(c.KillGauntlet)
			case <-kc:
				k := killClickHouse(ctx, st, start)
				log.Info("soak: kill -9 clickhouse", "pid", k.PID, "back", k.Back, "ready_after", k.Ready, "err", k.Err)
				res.Kills = append(res.Kills, k)
				kc = next(c.KillClickHouse)
			}
		}
	})
	progress := time.NewTicker(time.Minute)
	go func() {
		for {
			select {
			case <-load.Done():
				return
			case <-progress.C:
				log.Info("soak: progress", "elapsed", time.Since(start).Round(time.Second), "api_steps", cnt.api.Load(),
					"builtin_steps", cnt.builtin.Load(), "big", cnt.big.Load(), "runs", len(bi.ledger()), "open_runs", bi.openRuns(),
					"data_used_mb", dd.used()>>20, "events_stream_mb", evNow.Load()>>20)
			}
		}
	}()
	wg.Wait()
	progress.Stop()
	res.Load = time.Since(start)
	log.Info("soak: load over; draining", "runs", len(bi.ledger()), "api_episodes", len(tr.ledger()))

	// Drain: wait until the accounting passes or the bound passes, then account once more.
	// An interrupted soak still accounts for what it started, within a bound.
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.Drain+5*time.Minute)
	defer cancel()
	drainStart := time.Now()
	var acc Accounting
	for {
		acc, err = accountNow(actx, ch, bi.ledger(), tr.ledger())
		if err == nil && acc.OK() {
			break
		}
		if time.Since(drainStart) > c.Drain || ctx.Err() != nil {
			break
		}
		sleep(ctx, 10*time.Second)
	}
	if err != nil {
		return fmt.Errorf("account: %w", err)
	}
	res.Drained = time.Since(drainStart)
	res.InfraDetails = infraDetails(actx, ch, bi.ledger())
	endSampling()
	sampler.Wait()

	res.Accounting = acc
	res.Actions = acc.BuiltinSteps + acc.APISteps
	res.ActionsPerSec = float64(res.Actions) / res.Load.Seconds()
	if res.Actions > 0 {
		res.BigShare = float64(acc.BigActions) / float64(res.Actions)
	}
	res.TrainerErrors, res.TrainerErrorSamples = tr.errors()
	res.SubmitErrors = bi.submitErrors
	res.Gauntlet = memoryVerdict(res.GauntletRSS, c.RSSWarmup, c.FlatTolerance)
	res.ClickHouse = memoryVerdict(res.ClickHouseRSS, c.RSSWarmup, c.FlatTolerance)
	res.Pass = acc.OK() && len(res.UnexpectedEnd) == 0 && res.Gauntlet.Flat && res.ClickHouse.Flat && allBack(res.Kills)
	return writeResults(c.Out, res)
}

// killClickHouse kills gauntlet's ClickHouse child and waits for gauntlet to have a new
// one and to be ready again.
func killClickHouse(ctx context.Context, st *stack, start time.Time) kill {
	gp := st.pid()
	k := kill{What: "clickhouse", At: time.Since(start), PID: childPID(gp, "clickhouse")}
	if k.PID == 0 {
		k.Err = "no clickhouse child of gauntlet found"
		return k
	}
	syscall.Kill(k.PID, syscall.SIGKILL)
	t0 := time.Now()
	for time.Since(t0) < 3*time.Minute && ctx.Err() == nil {
		if np := childPID(gp, "clickhouse"); np != 0 && np != k.PID {
			if err := st.waitReady(ctx, 3*time.Minute-time.Since(t0), nil); err != nil {
				k.Err = err.Error()
				return k
			}
			k.Back, k.Ready = true, time.Since(t0)
			return k
		}
		time.Sleep(100 * time.Millisecond)
	}
	k.Err = "gauntlet did not restart clickhouse within 3 minutes"
	return k
}

func allBack(ks []kill) bool {
	for _, k := range ks {
		if !k.Back {
			return false
		}
	}
	return true
}

// accountNow reads what ClickHouse holds of the ledgers and judges it.
func accountNow(ctx context.Context, ch driver.Conn, runs []runLedger, api []apiEpisode) (Accounting, error) {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	recorded := map[string]runRecorded{}
	if len(ids) > 0 {
		rows, err := ch.Query(ctx, `SELECT run_id, uniqExact(episode_id), min(idx), max(idx), sum(steps), countIf(infra_error = 1)
			FROM episodes FINAL WHERE run_id IN (`+inList(ids)+`) GROUP BY run_id`)
		if err != nil {
			return Accounting{}, fmt.Errorf("read episodes: %w", err)
		}
		for rows.Next() {
			var r runRecorded
			if err := rows.Scan(&r.ID, &r.Episodes, &r.MinIdx, &r.MaxIdx, &r.ClaimedSteps, &r.InfraErrors); err != nil {
				rows.Close()
				return Accounting{}, fmt.Errorf("read episodes: %w", err)
			}
			recorded[r.ID] = r
		}
		rows.Close()
		rows, err = ch.Query(ctx, `SELECT run_id, uniqExact(episode_id, step) FROM steps WHERE run_id IN (`+inList(ids)+`) GROUP BY run_id`)
		if err != nil {
			return Accounting{}, fmt.Errorf("read steps: %w", err)
		}
		for rows.Next() {
			var id string
			var n uint64
			if err := rows.Scan(&id, &n); err != nil {
				rows.Close()
				return Accounting{}, fmt.Errorf("read steps: %w", err)
			}
			r := recorded[id]
			r.DistinctSteps = n
			recorded[id] = r
		}
		rows.Close()
	}
	apiRec := map[string]apiRecorded{}
	if len(api) > 0 {
		rows, err := ch.Query(ctx, `SELECT episode_id, count(), max(infra_error) FROM episodes FINAL
			WHERE run_id = 'api-default' AND policy = 'soak' GROUP BY episode_id`)
		if err != nil {
			return Accounting{}, fmt.Errorf("read api episodes: %w", err)
		}
		for rows.Next() {
			var id string
			var n uint64
			var infra uint8
			if err := rows.Scan(&id, &n, &infra); err != nil {
				rows.Close()
				return Accounting{}, fmt.Errorf("read api episodes: %w", err)
			}
			apiRec[id] = apiRecorded{EpisodeRows: n, InfraError: infra == 1}
		}
		rows.Close()
		rows, err = ch.Query(ctx, `SELECT episode_id, uniqExact(step),
			uniqExactIf(step, startsWith(args, '{"gauntlet_truncated":'))
			FROM steps WHERE run_id = 'api-default' AND policy = 'soak' GROUP BY episode_id`)
		if err != nil {
			return Accounting{}, fmt.Errorf("read api steps: %w", err)
		}
		for rows.Next() {
			var id string
			var n, cut uint64
			if err := rows.Scan(&id, &n, &cut); err != nil {
				rows.Close()
				return Accounting{}, fmt.Errorf("read api steps: %w", err)
			}
			r := apiRec[id]
			r.Steps, r.CutArgs = n, cut
			apiRec[id] = r
		}
		rows.Close()
	}
	return account(runs, recorded, api, apiRec), nil
}

// infraDetails lists a few recorded infra errors of the built-in runs with their message.
func infraDetails(ctx context.Context, ch driver.Conn, runs []runLedger) []string {
	ids := make([]string, len(runs))
	for i, r := range runs {
		ids[i] = r.ID
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := ch.Query(ctx, `SELECT episode_id, error FROM episodes FINAL
		WHERE run_id IN (`+inList(ids)+`) AND infra_error = 1 ORDER BY ended_at LIMIT 20`)
	if err != nil {
		return []string{"read infra errors: " + err.Error()}
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, msg string
		if rows.Scan(&id, &msg) == nil {
			out = append(out, id+": "+msg)
		}
	}
	return out
}

func writeResults(path string, res *results) error {
	b, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	txt := strings.TrimSuffix(path, ".json") + ".txt"
	f, err := os.Create(txt)
	if err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	defer f.Close()
	w := io.MultiWriter(f, os.Stdout)
	summary(w, res)
	fmt.Fprintf(os.Stdout, "results: %s, %s\n", path, txt)
	return nil
}

func summary(w io.Writer, r *results) {
	a := r.Accounting
	mb := func(b uint64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "soak of %s: load %s, data dir %s (%s, %.1f GiB, peak used %.0f MiB)\n",
		r.Config.Gauntlet, r.Load.Round(time.Second), r.DataDir.Path, r.DataDir.Kind, float64(r.DataDir.Bytes)/(1<<30), mb(r.DataUsedPeak))
	fmt.Fprintf(w, "events stream %s: peak %.0f MiB of its %.0f MiB cap\n", "GAUNTLET_EVENTS", mb(r.EventsPeak), mb(r.EventsCap))
	fmt.Fprintf(w, "actions: %d (%.0f/s), big (%d bytes): %d, %.2f %% of all (asked %.2f %%)\n",
		r.Actions, r.ActionsPerSec, r.Config.BigBytes, a.BigActions, 100*r.BigShare, 100*r.Config.BigShare)
	fmt.Fprintf(w, "built-in: %d runs, %d of %d episodes recorded, %d steps\n", a.Runs, a.BuiltinRecorded, a.BuiltinEpisodes, a.BuiltinSteps)
	fmt.Fprintf(w, "env API: %d episodes: %d over (%d recorded), %d cut by a kill of gauntlet, %d never closed; %d steps acknowledged; big actions recorded cut with their mark: %d of %d\n",
		a.APIEpisodes, a.APIOver, a.APIOverRecorded, a.APICut, a.APIUnclosed, a.APISteps, a.BigRecordedCut, a.BigActions)
	for _, k := range r.Kills {
		status := fmt.Sprintf("ready again after %s", k.Ready.Round(time.Millisecond))
		if !k.Back {
			status = "NOT BACK: " + k.Err
		}
		fmt.Fprintf(w, "kill -9 %s (pid %d) at %s: %s\n", k.What, k.PID, k.At.Round(time.Second), status)
	}
	for _, u := range r.UnexpectedEnd {
		fmt.Fprintf(w, "UNEXPECTED: %s\n", u)
	}
	fmt.Fprintf(w, "lost episodes %d, lost steps %d, extra steps %d, infra errors %d (false %d); drained after %s\n",
		a.LostEpisodes, a.LostSteps, a.ExtraSteps, a.InfraErrors, a.FalseInfraErrors, r.Drained.Round(time.Second))
	for _, p := range a.Problems {
		fmt.Fprintf(w, "  problem: %s\n", p)
	}
	for _, d := range r.InfraDetails {
		fmt.Fprintf(w, "  infra error: %s\n", d)
	}
	for _, m := range []struct {
		name string
		m    Memory
	}{{"gauntlet", r.Gauntlet}, {"clickhouse", r.ClickHouse}} {
		fmt.Fprintf(w, "memory %s (after %s warm-up): median %.0f MiB first half, %.0f MiB last half (%+.1f %%), peak %.0f MiB, slope %+.1f MiB/h, %d samples: flat=%v\n",
			m.name, r.Config.RSSWarmup, mb(m.m.FirstHalfMedian), mb(m.m.LastHalfMedian), 100*m.m.Growth, mb(m.m.Peak), m.m.SlopeMBPerHour, m.m.Samples, m.m.Flat)
	}
	if len(r.TrainerErrors) > 0 {
		fmt.Fprintf(w, "trainer call errors (expected around kills): %v\n", r.TrainerErrors)
		for _, e := range r.TrainerErrorSamples {
			fmt.Fprintf(w, "  %s\n", e)
		}
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(w, "%s\n", verdict)
}
