package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// consoleOpts is the console run: `gauntlet up` against the harness's ClickHouse, one
// `gauntlet run` through it, and the probe loading the console `up` serves meanwhile.
type consoleOpts struct {
	gauntlet    string
	dataDir     string
	chAddr      string
	database    string
	policy      string
	episodes    uint64
	maxInFlight uint
	every       time.Duration
	upLog       string
	runLog      string
	procs       procSet
	extraArgs   []string // for `gauntlet up` (-demo-args)
}

// consoleResult is what the console run measured: the run's throughput, the machine
// meanwhile, and each console page's latencies.
type consoleResult struct {
	Database   string   `json:"database"`
	UpCommand  []string `json:"up_command"`
	RunCommand []string `json:"run_command"`
	summary
	StepsPerSec float64 `json:"persisted_steps_per_sec"`
	// Window covers the run, from its submission until ClickHouse held every step;
	// ChildCores in it is gauntlet up's and gauntlet run's CPU together.
	Window window      `json:"window"`
	Pages  []pageStats `json:"pages"`
	// Requests are the requests of the pages of several, each on its own.
	Requests []pageStats `json:"requests"`
	// ProbeStartedAt and ProbeEndedAt bound the probe, in UTC: from the run's submission
	// until `gauntlet run` returned (every episode in ClickHouse).
	ProbeStartedAt time.Time `json:"probe_started_at"`
	ProbeEndedAt   time.Time `json:"probe_ended_at"`
	UpLog          string    `json:"up_log"`
	RunLog         string    `json:"run_log"`
}

// errConsolePages fails a console run in which a page answered with an error.
var errConsolePages = errors.New("console pages failed")

// runConsoleProbe starts `gauntlet up`, waits for /ready, then runs `gauntlet run` of
// o.episodes episodes through it while the probe loads the console, and stops up. It
// returns the figures even when it fails (a page that errored fails it, wrapping
// errConsolePages).
func runConsoleProbe(ctx context.Context, o consoleOpts) (consoleResult, error) {
	r := consoleResult{Database: o.database, UpLog: o.upLog, RunLog: o.runLog}
	var addrs [4]string
	for i := range addrs {
		a, err := freeLoopbackAddr()
		if err != nil {
			return r, err
		}
		addrs[i] = a
	}
	httpAddr, natsAddr, envAPIAddr, temporalAddr := addrs[0], addrs[1], addrs[2], addrs[3]
	upArgs := []string{"up", "--data-dir", o.dataDir,
		"--clickhouse", o.chAddr, "--clickhouse.database", o.database,
		"--nats.port", port(natsAddr), "--http", httpAddr, "--envapi.addr", envAPIAddr,
		"--temporal.port", port(temporalAddr), "--temporal.ui-port", "-1",
		"--log.level", "warn"}
	upArgs = append(upArgs, o.extraArgs...)
	r.UpCommand = append([]string{o.gauntlet}, upArgs...)

	upLog, err := os.Create(o.upLog)
	if err != nil {
		return r, fmt.Errorf("console run: up log: %w", err)
	}
	defer upLog.Close()
	fmt.Fprintf(upLog, "$ %q\n", r.UpCommand)
	up := exec.CommandContext(ctx, o.gauntlet, upArgs...)
	up.Stdout, up.Stderr = upLog, upLog
	up.Cancel = func() error { return up.Process.Signal(syscall.SIGTERM) }
	up.WaitDelay = 45 * time.Second
	up.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := up.Start(); err != nil {
		return r, fmt.Errorf("start %s up: %w", o.gauntlet, err)
	}
	var upErr error
	upDone := make(chan struct{})
	go func() { upErr = up.Wait(); close(upDone) }()
	stopUp := func() error {
		_ = up.Process.Signal(syscall.SIGTERM)
		<-upDone
		if upErr != nil && !isSignalExit(upErr) {
			return fmt.Errorf("gauntlet up: %w (output in %s)", upErr, o.upLog)
		}
		return nil
	}
	if err := waitHTTPReady(ctx, httpAddr, 3*time.Minute, upDone); err != nil {
		_ = stopUp()
		return r, fmt.Errorf("gauntlet up: %w (output in %s)", err, o.upLog)
	}

	runArgs := []string{"run", "--data-dir", o.dataDir,
		"--episodes", strconv.FormatUint(o.episodes, 10),
		"--policies", o.policy + "=1",
		"--max-in-flight", strconv.FormatUint(uint64(o.maxInFlight), 10)}
	r.RunCommand = append([]string{o.gauntlet}, runArgs...)
	runLog, err := os.Create(o.runLog)
	if err != nil {
		_ = stopUp()
		return r, fmt.Errorf("console run: run log: %w", err)
	}
	defer runLog.Close()
	fmt.Fprintf(runLog, "$ %q\n", r.RunCommand)
	var stdout bytes.Buffer
	run := exec.CommandContext(ctx, o.gauntlet, runArgs...)
	run.Stdout, run.Stderr = io.MultiWriter(&stdout, runLog), runLog
	run.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}

	upPid := up.Process.Pid
	win := startWindow(o.procs)
	up0 := procTicks(upPid)
	stop := make(chan struct{})
	pagesDone := make(chan struct{})
	p := newProber(httpAddr, o.every)
	r.ProbeStartedAt = time.Now().UTC()
	go func() { r.Pages, r.Requests = p.run(ctx, stop); close(pagesDone) }()
	runErr := run.Run()
	r.ProbeEndedAt = time.Now().UTC()
	close(stop)
	<-pagesDone
	var runCPU time.Duration
	if run.ProcessState != nil {
		runCPU = run.ProcessState.UserTime() + run.ProcessState.SystemTime()
	}
	upCPU := time.Duration(since(procTicks(upPid), up0)) * time.Second / userHZ
	r.Window = win.endWith(upCPU + runCPU)
	stopErr := stopUp()

	if runErr != nil {
		return r, fmt.Errorf("%s run: %w (output in %s)", o.gauntlet, runErr, o.runLog)
	}
	s, err := parseSummary(stdout.Bytes())
	if err != nil {
		return r, fmt.Errorf("%s run: %w (output in %s)", o.gauntlet, err, o.runLog)
	}
	r.summary = s
	r.StepsPerSec = s.PersistedStepsPerSec()
	if stopErr != nil {
		return r, stopErr
	}
	var failed []string
	for _, pg := range r.Pages {
		if pg.Errors > 0 {
			failed = append(failed, fmt.Sprintf("%s: %d of %d (first: %s)", pg.Page, pg.Errors, pg.Count, pg.FirstError))
		}
	}
	if len(failed) > 0 {
		return r, fmt.Errorf("%w: %s", errConsolePages, strings.Join(failed, "; "))
	}
	return r, nil
}

// port returns the port of a host:port address.
func port(addr string) string {
	_, p, _ := strings.Cut(addr, "127.0.0.1:")
	return p
}

// isSignalExit says whether a child's exit error is its death by the SIGTERM we sent.
func isSignalExit(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM
}

// waitHTTPReady polls /ready until it answers 200, the process exits (done) or the bound
// passes.
func waitHTTPReady(ctx context.Context, addr string, bound time.Duration, done <-chan struct{}) error {
	client := &http.Client{Timeout: 5 * time.Second}
	deadline := time.Now().Add(bound)
	last := "no answer"
	for time.Now().Before(deadline) {
		if resp, err := client.Get("http://" + addr + "/ready"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = strings.TrimSpace(string(b))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return errors.New("exited before it was ready")
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("not ready after %s: %s", bound, last)
}
