package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/childproc"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// These tests drive the real pipeline: embedded NATS JetStream, every service, and a real
// ClickHouse started by the same code `gauntlet up` uses.

// testConfig is the flag defaults with test-friendly overrides.
func testConfig(t testing.TB) config {
	t.Helper()
	var cfg config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	cfg.register(fs)
	if err := fs.Parse(nil); err != nil {
		t.Fatal(err)
	}
	cfg.DataDir = t.TempDir()
	cfg.NATSPort = -1
	cfg.ClickHousePort = 0
	cfg.TemporalPort = 0
	cfg.TemporalUIPort = -1
	cfg.HTTPAddr = ""
	cfg.EnvAPI.Addr = "127.0.0.1:0"
	cfg.LogLevel = "warn"
	cfg.Worker.Concurrency = 128
	cfg.Store.BatchRows = 5000
	cfg.Store.FlushEvery = 200 * time.Millisecond
	return cfg
}

type testStack struct {
	app  *app
	stop func() error
}

// startStack runs the given modules in this process until the test ends.
func startStack(t testing.TB, cfg config, targets ...string) *testStack {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a stack with its local ClickHouse and Temporal; -short runs unit tests only")
	}
	if len(targets) == 0 {
		targets = []string{modPipeline}
	}
	log := slog.New(slog.NewTextHandler(testLogWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	a, err := newApp(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- a.run(ctx, targets) }()
	rctx, rcancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer rcancel()
	if !waitReady(rctx, a) {
		cancel()
		t.Fatalf("stack did not start: %v", <-errc)
	}
	var stopped bool
	var stopErr error
	s := &testStack{app: a, stop: func() error {
		if !stopped {
			stopped = true
			cancel()
			stopErr = <-errc
		}
		return stopErr
	}}
	t.Cleanup(func() {
		if err := s.stop(); err != nil {
			t.Errorf("stack stop: %v", err)
		}
	})
	return s
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func newRun(t *testing.T, episodes uint64, policies string, seed uint64) *gauntletv1.RunRequested {
	t.Helper()
	o := runOpts{env: "shop", params: "{}", policies: policies, profiles: "baseline=60,stress=25,edge=15",
		episodes: episodes, seed: seed, maxInFlight: 500, label: t.Name()}
	req, err := o.request()
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// runToEnd submits a run and waits until the scheduler reports it done and ClickHouse
// holds all of it.
func runToEnd(t *testing.T, b *bus.Bus, conn driver.Conn, db string, req *gauntletv1.RunRequested) *gauntletv1.RunProgress {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ctx, unguard := guardStall(ctx, t, b, req.RunId)
	defer unguard()
	final, err := follow(ctx, b, req, io.Discard)
	if err != nil {
		failStalled(t, ctx, err)
	}
	if final.Error != "" {
		t.Fatalf("run refused: %s", final.Error)
	}
	if err := waitPersisted(ctx, b, conn, db, req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		failStalled(t, ctx, err, missingEpisodes(conn, db, req.RunId, req.Episodes))
	}
	return final
}

func connect(t *testing.T, addr, db string) driver.Conn {
	t.Helper()
	conn, err := trajectory.Connect(context.Background(), addr, db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func queryOne(t *testing.T, conn driver.Conn, q string) string {
	t.Helper()
	_, rows, err := trajectory.Query(context.Background(), conn, q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	if len(rows) != 1 || len(rows[0]) != 1 {
		t.Fatalf("%s: want one value, got %v", q, rows)
	}
	return rows[0][0]
}

// assertExact checks that ClickHouse holds exactly the run's steps: as many as the workers
// reported, numbered 0..n-1 per episode with no gap and no duplicate, and exactly the
// steps in the event stream.
func assertExact(t *testing.T, b *bus.Bus, conn driver.Conn, db string, req *gauntletv1.RunRequested, final *gauntletv1.RunProgress) {
	t.Helper()
	run := req.RunId
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s'`, db, run)); got != fmt.Sprint(req.Episodes) {
		t.Errorf("episodes in ClickHouse = %s, want %d", got, req.Episodes)
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.steps FINAL WHERE run_id = '%s'`, db, run)); got != fmt.Sprint(final.Steps) {
		t.Errorf("steps in ClickHouse = %s, workers reported %d", got, final.Steps)
	}
	// Per episode: steps 0..n-1, n matching the episode row.
	bad := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM (
		SELECT episode_id, count() AS n, uniqExact(step) AS u, min(step) AS lo, max(step) AS hi
		FROM %[1]s.steps FINAL WHERE run_id = '%[2]s' GROUP BY episode_id
	) ANY INNER JOIN (
		SELECT episode_id, steps FROM %[1]s.episodes FINAL WHERE run_id = '%[2]s'
	) USING episode_id
	WHERE n != u OR lo != 0 OR hi + 1 != n OR n != steps`, db, run))
	if bad != "0" {
		t.Errorf("%s episodes have gaps, duplicates or a step count unlike their episode row", bad)
	}
	// The stream is the source of truth: count its distinct step events of the run.
	inStream := streamSteps(t, b, run)
	if uint64(inStream) != final.Steps {
		t.Errorf("step events in the stream = %d, workers reported %d", inStream, final.Steps)
	}
}

// streamSteps counts the distinct (episode, step) steps of a run in GAUNTLET_EVENTS
// (countStreamSteps), failing t if it cannot within 5 minutes.
func streamSteps(t *testing.T, b *bus.Bus, runID string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n, err := countStreamSteps(ctx, b.JS, runID)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// countStreamSteps counts the distinct (episode, step) steps of a run in GAUNTLET_EVENTS
// with an ephemeral consumer, counting again from the start while a clustered JetStream
// answers that it cannot serve the stream for now: after a node's loss, until the stream
// and its consumers have leaders again, the cluster answers an API request with "no
// responders" (or not at all), as every gauntlet service it serves already expects.
func countStreamSteps(ctx context.Context, js jetstream.JetStream, runID string) (int, error) {
	backoff := 100 * time.Millisecond
	for {
		n, err := countStreamStepsOnce(ctx, js, runID)
		if err == nil || !jetStreamBusy(err) || ctx.Err() != nil {
			return n, err
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// jetStreamBusy reports whether err is JetStream saying it cannot answer yet (a stream
// or consumer without a leader, a request unanswered), not that the request is wrong.
func jetStreamBusy(err error) bool {
	var api *jetstream.APIError
	if errors.As(err, &api) && api.Code == 503 {
		return true
	}
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled)
}

// countStreamStepsOnce is one try of countStreamSteps. Making the consumer is bounded to
// 5 s, as it hangs while the stream has no leader; each fetch waits 2 s at most.
func countStreamStepsOnce(ctx context.Context, js jetstream.JetStream, runID string) (int, error) {
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(mctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		// Steps ride on steps subjects and, in an episode's last segment, on its ended one.
		FilterSubjects: []string{bus.SubjectEvent(bus.KindSteps, runID), bus.SubjectEvent(bus.KindEnded, runID)},
		// A fetch that must make the consumer again (its stream lost its leader) tries a
		// few times and fails instead of retrying without end, whatever ctx says:
		// countStreamSteps then counts again from the start.
		MaxResetAttempts: 3,
	})
	if err != nil {
		return 0, fmt.Errorf("ordered consumer on %s: %w", bus.StreamEvents, err)
	}
	info, err := cons.Info(mctx)
	if err != nil {
		return 0, fmt.Errorf("ordered consumer's info: %w", err)
	}
	pending := info.NumPending
	seen := map[string]bool{}
	for n := uint64(0); n < pending; {
		batch, err := cons.Fetch(5000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return 0, fmt.Errorf("fetch after %d of %d messages: %w", n, pending, err)
		}
		for m := range batch.Messages() {
			n++
			var ev gauntletv1.Event
			if err := proto.Unmarshal(m.Data(), &ev); err != nil {
				continue // junk some tests publish on purpose
			}
			for _, ev := range ev.Events() {
				for _, s := range ev.GetSteps().GetSteps() {
					if s.GetRunId() == runID {
						seen[s.EpisodeId+"/"+strconv.Itoa(int(s.Step))] = true
					}
				}
			}
		}
		if err := batch.Error(); err != nil {
			return 0, fmt.Errorf("fetch after %d of %d messages: %w", n, pending, err)
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	return len(seen), nil
}

func TestPipelineRecordsEveryStepExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	req := newRun(t, 2000, "random=1,oracle=1", 7)
	final := runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	if final.Ended != 2000 || final.InfraErrors != 0 {
		t.Fatalf("ended %d, infra errors %d", final.Ended, final.InfraErrors)
	}
	assertExact(t, s.app.getBus(), conn, cfg.Database, req, final)

	// The two policies must differ measurably: the oracle succeeds, random mostly not.
	_, rows, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(
		`SELECT policy, avg(success) FROM %s.episodes FINAL WHERE run_id = '%s' GROUP BY policy ORDER BY policy`, cfg.Database, req.RunId))
	if err != nil {
		t.Fatal(err)
	}
	rate := map[string]float64{}
	for _, r := range rows {
		rate[r[0]], _ = strconv.ParseFloat(r[1], 64)
	}
	if rate["oracle"] < 0.8 || rate["random"] > 0.2 {
		t.Errorf("success rates %v: want oracle >= 0.8 and random <= 0.2", rate)
	}
	// Every fired fault is recorded, in the faults table too.
	if got, want := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.faults FINAL WHERE run_id = '%s'`, cfg.Database, req.RunId)), fmt.Sprint(final.FaultsFired); got != want {
		t.Errorf("faults rows = %s, fired = %s", got, want)
	}
}

func TestSameSeedSameSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	a := newRun(t, 300, "random=1,oracle=1", 42)
	b := newRun(t, 300, "random=1,oracle=1", 42)
	runToEnd(t, s.app.getBus(), conn, cfg.Database, a)
	runToEnd(t, s.app.getBus(), conn, cfg.Database, b)
	// Same seed: every step row matches on everything but ids and wall time.
	cols := `policy, profile, tool, args, observation, state_diff, fault_ids, fault_details, reward, r_task, r_cost, r_safety, r_timeliness, r_causal, virtual_time_ns, reason`
	hashA := queryOne(t, conn, runHash(cfg.Database, a.RunId, cols))
	hashB := queryOne(t, conn, runHash(cfg.Database, b.RunId, cols))
	if hashA != hashB {
		t.Fatalf("same seed, different trajectories: %s vs %s", hashA, hashB)
	}
	c := newRun(t, 300, "random=1,oracle=1", 43)
	runToEnd(t, s.app.getBus(), conn, cfg.Database, c)
	if queryOne(t, conn, runHash(cfg.Database, c.RunId, cols)) == hashA {
		t.Fatal("different seeds gave identical trajectories")
	}
}

// runHash is an order-independent fingerprint of a run's steps keyed by episode index.
func runHash(db, runID, cols string) string {
	return fmt.Sprintf(`SELECT sum(cityHash64(toUInt64(substring(episode_id, 15)), step, %s)) FROM %s.steps FINAL WHERE run_id = '%s'`, cols, db, runID)
}

func TestClickHouseOutageLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	ch := chtest.Start(t)
	cfg := testConfig(t)
	cfg.ClickHouse = ch.Addr()
	s := startStack(t, cfg)
	conn := connect(t, ch.Addr(), cfg.Database)
	req := newRun(t, 1500, "oracle=1", 11)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ctx, unguard := guardStall(ctx, t, s.app.getBus(), req.RunId)
	defer unguard()
	done := make(chan *gauntletv1.RunProgress, 1)
	go func() {
		p, err := follow(ctx, s.app.getBus(), req, io.Discard)
		if err != nil {
			t.Error(err)
		}
		done <- p
	}()
	// Stop ClickHouse once some episodes are stored, keep it down for a while, bring it back.
	waitFor(ctx, t, func() bool {
		eps, _, _ := trajectory.RunCounts(ctx, conn, cfg.Database, req.RunId)
		return eps > 100
	})
	if err := ch.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	// The outage must matter: while ClickHouse is down the run goes on and its events
	// pile up unwritten, the store's inserts failing, rather than the run having been
	// written whole before the stop.
	b := s.app.getBus()
	storeKV, err := b.StoreBucket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	outage := time.Now()
	var written, last uint64
	for {
		p, err := bus.GetStoreProgress(ctx, storeKV)
		if err != nil {
			t.Fatal(err)
		}
		written = p.GetWrittenSeq()
		if last, err = b.EventsLastSeq(ctx); err != nil {
			t.Fatal(err)
		}
		if last > written || time.Since(outage) > 4*time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if last <= written {
		t.Fatalf("during the outage the stream grew to event %d and the store had written up to %d: the outage did not hold back the store's inserts", last, written)
	}
	time.Sleep(4*time.Second - time.Since(outage))
	if p, err := bus.GetStoreProgress(ctx, storeKV); err != nil || p.GetWrittenSeq() >= last {
		t.Fatalf("with ClickHouse down the store said it had written up to event %d of %d (err %v)", p.GetWrittenSeq(), last, err)
	}
	if err := ch.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	final := <-done
	if final == nil {
		t.FailNow()
	}
	conn2 := connect(t, ch.Addr(), cfg.Database)
	if err := waitPersisted(ctx, s.app.getBus(), conn2, cfg.Database, req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		failStalled(t, ctx, err, missingEpisodes(conn2, cfg.Database, req.RunId, req.Episodes))
	}
	assertExact(t, s.app.getBus(), conn2, cfg.Database, req, final)
}

func TestKilledProcessResumesExactly(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	natsPort, chPort := freePort(t), freePort(t)
	args := []string{"up", "--data-dir", dir, "--nats.port", fmt.Sprint(natsPort), "--clickhouse.port", fmt.Sprint(chPort),
		"--http", "", "--envapi.addr", "127.0.0.1:0", "--log.level", "warn", "--worker.concurrency", "128", "--store.batch-rows", "5000", "--store.flush-every", "200ms",
		"--temporal.port", fmt.Sprint(freePort(t)), "--temporal.ui-port", "-1"}
	start := func() *testProc {
		cmd := startProc(t, bin, args...)
		cmd.waitStack(t, dir)
		return cmd
	}
	cmd := start()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b, err := bus.Connect(fmt.Sprintf("nats://127.0.0.1:%d", natsPort), "test", log)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	conn := connect(t, fmt.Sprintf("127.0.0.1:%d", chPort), "gauntlet")

	req := newRun(t, 3000, "random=1,oracle=1", 5)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := b.PublishCommand(ctx, bus.SubjectRun, req.RunId+"/run", req); err != nil {
		t.Fatal(err)
	}
	kv, err := b.JS.KeyValue(ctx, bus.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, unguard := guardStall(ctx, t, b, req.RunId)
	defer unguard()
	// Kill -9 the whole process a third of the way through.
	waitFor(ctx, t, func() bool {
		p := progressFromKV(ctx, kv, req.RunId)
		return p != nil && p.Ended > 1000
	})
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	_ = os.Remove(stackPath(dir))
	cmd = start()

	var final *gauntletv1.RunProgress
	waitFor(ctx, t, func() bool {
		final = progressFromKV(ctx, kv, req.RunId)
		return final != nil && final.Done
	})
	if err := waitPersisted(ctx, nil, conn, "gauntlet", req.RunId, req.Episodes, final.Steps, io.Discard); err != nil {
		failStalled(t, ctx, err, missingEpisodes(conn, "gauntlet", req.RunId, req.Episodes))
	}
	assertExact(t, b, conn, "gauntlet", req, final)
}

// buildBinary builds cmd/gauntlet once per test binary (the kill tests share it; a build
// costs tens of seconds on a busy machine). TestMain removes it.
func buildBinary(t testing.TB) string {
	t.Helper()
	if testing.Short() {
		t.Skip("runs gauntlet as a process, with its local servers; -short runs unit tests only")
	}
	binOnce.Do(func() {
		dir, err := os.MkdirTemp("", "gauntlet-bin-")
		if err != nil {
			binErr = err
			return
		}
		binDir = dir
		bin := filepath.Join(dir, "gauntlet")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		binPath = bin
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

var (
	binOnce         sync.Once
	binDir, binPath string
	binErr          error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	if notesRoot != "" {
		os.RemoveAll(notesRoot)
	}
	os.Exit(code)
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond until it holds. It fails when ctx ends, with the cause guardStall
// gave it (a run that stopped progressing, and what it is missing) when there is one,
// and after 5 minutes in any case.
func waitFor(ctx context.Context, t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for !cond() {
		if ctx.Err() != nil {
			failStalled(t, ctx, fmt.Errorf("condition not met: %w", ctx.Err()))
		}
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5 minutes")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testProc is a gauntlet process a test started. It dies with the test binary, even one
// that go test's timeout ends without running any cleanup: it is started with a parent-
// death signal from a locked thread (childproc.StartLocked), so no orphaned stack, with
// its ClickHouse and Temporal, outlives a hung test.
type testProc struct {
	Process *os.Process
	waited  <-chan error
	err     error
	exited  bool
}

// startProc starts bin with args, its stderr in the test's log.
func startProc(t testing.TB, bin string, args ...string) *testProc {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Stderr = testLogWriter{t}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	waited, err := childproc.StartLocked(cmd)
	if err != nil {
		t.Fatal(err)
	}
	return &testProc{Process: cmd.Process, waited: waited}
}

// waitStack waits for the process to write its stack.json into dir, and fails at once,
// with its exit status, when it exits first.
func (p *testProc) waitStack(t *testing.T, dir string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for {
		if _, err := os.Stat(stackPath(dir)); err == nil {
			return
		}
		select {
		case err := <-p.waited:
			p.err, p.exited = err, true
			t.Fatalf("gauntlet exited before it was up: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gauntlet wrote no %s within 5 minutes", stackPath(dir))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Wait waits for the process to exit; it may be called more than once.
func (p *testProc) Wait() error {
	if !p.exited {
		p.err, p.exited = <-p.waited, true
	}
	return p.err
}
