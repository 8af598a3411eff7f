package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// pipelineOpts is one run of `gauntlet demo` against the harness's ClickHouse.
type pipelineOpts struct {
	gauntlet    string
	dataDir     string
	chAddr      string
	database    string
	policy      string
	episodes    uint64
	maxInFlight uint
	rssInterval time.Duration
	// maxRSSKB stops the child (SIGTERM) when its RSS passes it: a run whose memory grows
	// with its size must not take the shared machine down with it. 0: no limit.
	maxRSSKB int64
	logPath  string
	procs    procSet
	// profileSeconds > 0 takes a CPU profile of the child for that long, starting
	// profileDelay after it is ready, into profilePath.
	profileSeconds int
	profileDelay   time.Duration
	profilePath    string
	// extraArgs are appended to the demo's command line.
	extraArgs []string
	// liveHeapEvery > 0 samples the child's live heap (after a forced GC) that often.
	liveHeapEvery time.Duration
	// threatEvery > 0 has the demo's NATS listen on a loopback port and this process
	// publish a threat fingerprint into it that often while it runs (threats.go).
	threatEvery time.Duration
}

// pipelineResult is what one run of the demo showed.
type pipelineResult struct {
	Database string   `json:"database"`
	Command  []string `json:"command"`
	summary
	// StepsPerSec is the headline: steps in ClickHouse per second of the run (S / Y of
	// the demo's summary line).
	StepsPerSec float64 `json:"persisted_steps_per_sec"`
	// RunStepsPerSec is steps per second until the scheduler saw the last episode end.
	RunStepsPerSec float64 `json:"run_steps_per_sec"`
	// WallSeconds is the child's whole life: stack start, the run, the summary, stop.
	WallSeconds float64     `json:"wall_seconds"`
	PeakRSSKB   int64       `json:"peak_rss_kb"`
	PeakCHRSSKB int64       `json:"peak_clickhouse_rss_kb"`
	RSSAt       []rssSample `json:"rss_at_25_50_75_100_pct"`
	RSS         []rssSample `json:"rss"`
	Window      window      `json:"window"`
	Log         string      `json:"log"`
	// StoppedAtRSSKB is set when the child was stopped for passing -max-rss-mb.
	StoppedAtRSSKB int64  `json:"stopped_at_rss_kb,omitempty"`
	Profile        string `json:"cpu_profile,omitempty"`
	// LiveHeap is the child's heap after a forced collection, over the run (with
	// -live-heap-every): what it still references, as opposed to RSS, which also holds
	// the garbage GOGC lets pile up between collections.
	LiveHeap []heapSample `json:"live_heap,omitempty"`
	// Threats is the fingerprint probe's measure of propagation from this process to
	// the demo's workers (with -threat-episodes).
	Threats *threatResult `json:"threats,omitempty"`
}

// rssFractions are the points of a run whose RSS the tables show.
var rssFractions = []float64{0.25, 0.5, 0.75, 1}

// runPipeline runs the demo as a child process, samples its memory until it exits and
// reads its summary line.
func runPipeline(ctx context.Context, o pipelineOpts) (pipelineResult, error) {
	r := pipelineResult{Database: o.database}
	httpAddr, err := freeLoopbackAddr()
	if err != nil {
		return r, err
	}
	natsPort, natsURL := "-1", ""
	if o.threatEvery > 0 {
		addr, err := freeLoopbackAddr()
		if err != nil {
			return r, err
		}
		natsPort, natsURL = port(addr), "nats://"+addr
	}
	args := []string{"demo",
		"--episodes", strconv.FormatUint(o.episodes, 10),
		"--policies", o.policy + "=1",
		"--max-in-flight", strconv.FormatUint(uint64(o.maxInFlight), 10),
		"--data-dir", o.dataDir,
		"--clickhouse", o.chAddr,
		"--clickhouse.database", o.database,
		// In-process NATS only (on a loopback port of our choosing for the fingerprint
		// probe) and our own http port: nothing collides with a gauntlet someone else
		// runs on this machine, and no traffic leaves the machine.
		"--nats.port", natsPort,
		"--http", httpAddr,
	}
	args = append(args, o.extraArgs...)
	r.Command = append([]string{o.gauntlet}, args...)

	logf, err := os.Create(o.logPath)
	if err != nil {
		return r, fmt.Errorf("pipeline log: %w", err)
	}
	defer logf.Close()
	r.Log = o.logPath
	fmt.Fprintf(logf, "$ %q\n", r.Command)

	var stdout bytes.Buffer
	cmd := exec.CommandContext(ctx, o.gauntlet, args...)
	cmd.Stdout = io.MultiWriter(&stdout, logf)
	cmd.Stderr = logf
	cmd.Env = os.Environ()
	// Stopped by the harness's timeout or Ctrl-C: SIGTERM lets the demo stop its stack;
	// after WaitDelay it is killed. If the harness dies, the kernel kills the child.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 45 * time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	win := startWindow(o.procs)
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return r, fmt.Errorf("start %s: %w", o.gauntlet, err)
	}
	pid := cmd.Process.Pid

	stop := make(chan struct{})
	var wg sync.WaitGroup
	var series []rssSample
	var stoppedAt int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(o.rssInterval)
		defer tick.Stop()
		for {
			if kb, err := procRSSKB(pid); err == nil {
				s := rssSample{Seconds: time.Since(t0).Seconds(), RSSKB: kb}
				s.CHRSSKB, _ = procRSSKB(o.procs.ClickHouse())
				series = append(series, s)
				if o.maxRSSKB > 0 && kb > o.maxRSSKB && stoppedAt == 0 {
					stoppedAt = kb
					fmt.Fprintf(logf, "loadtest: RSS %d kB passed -max-rss-mb; sending SIGTERM\n", kb)
					_ = cmd.Process.Signal(syscall.SIGTERM)
				}
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	var live []heapSample
	if o.liveHeapEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			live = sampleLiveHeap(ctx, stop, httpAddr, t0, o.liveHeapEvery)
		}()
	}
	var threatRes threatResult
	if o.threatEvery > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			threatRes = probeThreats(ctx, stop, natsURL, httpAddr, o.threatEvery)
		}()
	}
	var profErr error
	if o.profileSeconds > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			profErr = takeProfile(ctx, stop, httpAddr, o.profileDelay, o.profileSeconds, o.profilePath)
		}()
	}

	waitErr := cmd.Wait()
	close(stop)
	wg.Wait()
	var childCPU time.Duration
	if cmd.ProcessState != nil {
		childCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	r.Window = win.endWith(childCPU)
	r.WallSeconds = time.Since(t0).Seconds()
	r.RSS = series
	r.LiveHeap = live
	if o.threatEvery > 0 {
		r.Threats = &threatRes
	}
	r.PeakRSSKB = peakRSS(series)
	for _, s := range series {
		r.PeakCHRSSKB = max(r.PeakCHRSSKB, s.CHRSSKB)
	}
	r.RSSAt = rssAt(series, rssFractions)
	r.StoppedAtRSSKB = stoppedAt
	if stoppedAt > 0 {
		return r, fmt.Errorf("stopped the demo: its RSS reached %.0f MB, past -max-rss-mb %.0f (output in %s)", mb(stoppedAt), mb(o.maxRSSKB), o.logPath)
	}
	if o.profileSeconds > 0 {
		if profErr != nil {
			fmt.Fprintf(os.Stderr, "loadtest: cpu profile: %v\n", profErr)
		} else {
			r.Profile = o.profilePath
		}
	}

	if waitErr != nil {
		return r, fmt.Errorf("%s demo: %w (output in %s)", o.gauntlet, waitErr, o.logPath)
	}
	s, err := parseSummary(stdout.Bytes())
	if err != nil {
		return r, fmt.Errorf("%s demo: %w (output in %s)", o.gauntlet, err, o.logPath)
	}
	r.summary = s
	r.StepsPerSec = s.PersistedStepsPerSec()
	if s.RunSeconds > 0 {
		r.RunStepsPerSec = float64(s.Steps) / s.RunSeconds
	}
	return r, nil
}

// takeProfile waits until the child's /ready answers, then delay, then saves a CPU
// profile of seconds seconds.
func takeProfile(ctx context.Context, stop <-chan struct{}, addr string, delay time.Duration, seconds int, path string) error {
	client := &http.Client{Timeout: time.Duration(seconds)*time.Second + 30*time.Second}
	for {
		resp, err := client.Get("http://" + addr + "/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-stop:
			return errors.New("the run ended before the stack was ready")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	select {
	case <-stop:
		return errors.New("the run ended before the profile started")
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(delay):
	}
	resp, err := client.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, seconds))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/profile: %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// freeLoopbackAddr returns a 127.0.0.1 address whose port was free a moment ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("pick a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
