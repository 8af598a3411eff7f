package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gauntlet-rl/gauntlet/pkg/temporallocal"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// These tests run curricula on the real stack: the Temporal dev server started by the
// same code `gauntlet up` uses, embedded NATS, every service, and a real ClickHouse.

// testCurriculum is three small stages on shop: the oracle passes each, random passes
// none (its success rate on shop is near zero).
func testCurriculum(policy string) string {
	return strings.ReplaceAll(`
name: e2e-POLICY
seed: 11
max_in_flight: 200
stages:
  - name: calm
    env: shop
    policies: POLICY=1
    profiles: baseline=1
    episodes: {min: 40, max: 80}
    batch: 20
    promotion: {metric: success_rate, threshold: 0.8, window: 40}
  - name: weather
    env: shop
    policies: POLICY=1
    profiles: baseline=1,stress=1
    episodes: {min: 40, max: 80}
    batch: 20
    promotion: {metric: success_rate, threshold: 0.6, window: 40}
    drift:
      - {selector: "*.latency.mean_ms", from: 10, to: 500}
  - name: storm
    env: shop
    policies: POLICY=1
    profiles: stress=1,edge=1
    episodes: {min: 20, max: 60}
    promotion: {metric: reward_mean, threshold: 0.0, window: 20}
`, "POLICY", policy)
}

func writeFile(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func dialTemporal(t testing.TB, addr string) client.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.DialContext(ctx, client.Options{HostPort: addr, Logger: sdkLogger{discardLogger()}})
	if err != nil {
		t.Fatalf("dial temporal %s: %v", addr, err)
	}
	t.Cleanup(c.Close)
	return c
}

func discardLogger() interface{ Error(string, ...any) } {
	l, _ := newLogger("error", ioDiscard{})
	return l
}

type ioDiscard struct{}

func (ioDiscard) Write(p []byte) (int, error) { return len(p), nil }

// gauntletCLI runs a client command in this process against the stack in dataDir.
func gauntletCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	err := runMain(context.Background(), args, &out, &errb)
	if err != nil {
		return out.String(), fmt.Errorf("%w (stderr: %s)", err, errb.String())
	}
	return out.String(), nil
}

// stageCounts returns the episodes ClickHouse holds per stage of a curriculum, waiting
// until they stop changing and match want (or a deadline passes).
func stageCounts(t *testing.T, conn driver.Conn, db string, p workflows.Progress) []string {
	t.Helper()
	var got []string
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got = got[:0]
		ok := true
		for _, r := range p.Reports {
			n := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE startsWith(run_id, '%s')`, db, r.RunPrefix))
			got = append(got, n)
			ok = ok && n == fmt.Sprint(r.Episodes)
		}
		if ok || time.Now().After(deadline) {
			return got
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestCurriculumOnRealStack(t *testing.T) {
	cfg := testConfig(t)
	cfg.Worker.Concurrency = 64
	s := startStack(t, cfg, modAll)
	if err := writeStack(cfg.DataDir, stack{NATSURL: s.app.natsURL(), ClickHouse: s.app.clickHouseAddr(), Database: cfg.Database, Temporal: s.app.temporalAddr()}); err != nil {
		t.Fatal(err)
	}
	tc := dialTemporal(t, s.app.temporalAddr())
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)

	// A bad spec is refused before anything starts, naming the field.
	bad := writeFile(t, "bad.yaml", strings.Replace(testCurriculum("oracle"), "window: 40}", "window: 0}", 1))
	out, err := gauntletCLI(t, "curriculum", "start", "-f", bad, "--data-dir", cfg.DataDir)
	if err == nil || !strings.Contains(err.Error(), "stages[0].promotion.window: must be > 0") {
		t.Fatalf("bad spec: err %v, output %q; want an error naming stages[0].promotion.window", err, out)
	}

	// The oracle through gauntlet's CLI; random through the real temporal CLI with the
	// spec as JSON, as a user without gauntlet would.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	out, err = gauntletCLI(t, "curriculum", "start", "-f", writeFile(t, "oracle.yaml", testCurriculum("oracle")), "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	oracleID := strings.TrimSpace(out)

	spec, err := workflows.LoadSpec(strings.NewReader(testCurriculum("random")))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(spec)
	tbin, err := temporallocal.FindBinary("")
	if err != nil {
		t.Fatal(err)
	}
	randomID := "curriculum-random-e2e"
	cmd := exec.CommandContext(ctx, tbin, "workflow", "start", "--address", s.app.temporalAddr(),
		"--task-queue", workflows.TaskQueue, "--type", workflows.WorkflowCurriculum,
		"--workflow-id", randomID, "--input-file", writeFile(t, "random.json", string(raw)))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("temporal workflow start: %v\n%s", err, b)
	}

	// A third curriculum is steered by signals: paused, then its first stage skipped,
	// then aborted in its second.
	sigSpec := strings.ReplaceAll(testCurriculum("random"), "max: 80}", "max: 2000}")
	out, err = gauntletCLI(t, "curriculum", "start", "-f", writeFile(t, "signals.yaml", sigSpec), "--id", "curriculum-signals-e2e", "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	sigID := strings.TrimSpace(out)
	if _, err := gauntletCLI(t, "curriculum", "pause", sigID, "--data-dir", cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, func() bool {
		out, err := gauntletCLI(t, "curriculum", "status", sigID, "--data-dir", cfg.DataDir)
		return err == nil && strings.Contains(out, "): paused")
	})
	// Temporal's own UI and CLI show it paused (its execution status stays Running).
	waitFor(ctx, t, func() bool {
		return strings.Contains(temporalList(ctx, t, tbin, s.app.temporalAddr(), "GauntletCurriculumState = 'paused'"), sigID)
	})
	paused := curriculumQuery(t, tc, sigID)
	time.Sleep(500 * time.Millisecond)
	if again := curriculumQuery(t, tc, sigID); again.TotalEpisodes != paused.TotalEpisodes {
		t.Errorf("paused curriculum ran on: %d then %d episodes", paused.TotalEpisodes, again.TotalEpisodes)
	}
	for _, sig := range []string{"skip", "resume"} {
		if _, err := gauntletCLI(t, "curriculum", sig, sigID, "--data-dir", cfg.DataDir); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, func() bool { p := curriculumQuery(t, tc, sigID); return p.Stage == 1 && p.StageEpisodes >= 20 })
	if _, err := gauntletCLI(t, "curriculum", "abort", sigID, "--data-dir", cfg.DataDir); err != nil {
		t.Fatal(err)
	}

	// A batch on its own.
	out, err = gauntletCLI(t, "batch", "start", "--id", "batch-e2e", "--episodes", "30", "--policies", "oracle=1", "--profiles", "baseline=1", "--seed", "4", "--data-dir", cfg.DataDir)
	if err != nil || !strings.Contains(out, ": 30 episodes, success rate 1.000") {
		t.Fatalf("batch start: %v\n%s", err, out)
	}

	// Progress is queryable while it runs.
	waitFor(ctx, t, func() bool {
		out, err := gauntletCLI(t, "curriculum", "status", oracleID, "--data-dir", cfg.DataDir)
		return err == nil && strings.Contains(out, "episodes in all")
	})

	results := map[string]workflows.Progress{}
	for _, id := range []string{oracleID, randomID, sigID} {
		var p workflows.Progress
		if err := tc.GetWorkflow(ctx, id, "").Get(ctx, &p); err != nil {
			// The aborted one closes as canceled, its progress the details.
			aborted, ok := workflows.ProgressOf(err)
			if id != sigID || !ok {
				t.Fatalf("curriculum %s: %v", id, err)
			}
			p = aborted
		}
		results[id] = p
	}
	// Temporal tells the truth: the aborted curriculum closed as canceled, not completed;
	// each one's memo holds its state and stage, and the temporal CLI finds curricula by
	// state (those started by gauntlet, which registers the search attributes).
	for _, c := range []struct {
		id, state string
		status    enums.WorkflowExecutionStatus
	}{
		{oracleID, workflows.StatusCompleted, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED},
		{randomID, workflows.StatusStopped, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED},
		{sigID, workflows.StatusAborted, enums.WORKFLOW_EXECUTION_STATUS_CANCELED},
	} {
		d, err := tc.DescribeWorkflow(ctx, c.id, "")
		if err != nil {
			t.Fatal(err)
		}
		info := d.RawResponse.GetWorkflowExecutionInfo()
		var state string
		if p := info.GetMemo().GetFields()[workflows.MemoState]; p == nil || converter.GetDefaultDataConverter().FromPayload(p, &state) != nil || state != c.state {
			t.Errorf("curriculum %s: memo state %q; want %q", c.id, state, c.state)
		}
		if info.GetStatus() != c.status {
			t.Errorf("curriculum %s closed as %v; want %v", c.id, info.GetStatus(), c.status)
		}
	}
	waitFor(ctx, t, func() bool {
		return strings.Contains(temporalList(ctx, t, tbin, s.app.temporalAddr(), "GauntletCurriculumState = 'aborted' AND GauntletStage = 1"), sigID) &&
			strings.Contains(temporalList(ctx, t, tbin, s.app.temporalAddr(), "GauntletCurriculumState = 'completed'"), oracleID)
	})
	o, r, sg := results[oracleID], results[randomID], results[sigID]
	if sg.Status != workflows.StatusAborted || len(sg.Reports) != 2 || sg.Reports[0].Outcome != workflows.OutcomeSkipped || sg.Reports[1].Outcome != workflows.OutcomeAborted {
		t.Errorf("signalled curriculum: %+v; want stage 1 skipped, stage 2 aborted", sg)
	}
	if o.Status != workflows.StatusCompleted || len(o.Reports) != 3 {
		t.Errorf("oracle: %+v; want completed through 3 stages", o)
	}
	for _, rep := range o.Reports {
		if rep.Outcome != workflows.OutcomePromoted {
			t.Errorf("oracle stage %d: %+v; want promoted", rep.Index, rep)
		}
	}
	if r.Status != workflows.StatusStopped || len(r.Reports) != 1 || r.Reports[0].Outcome != workflows.OutcomeNotPromoted || r.Reports[0].Episodes != 80 {
		t.Errorf("random: %+v; want stopped at stage 1 after its 80-episode budget", r)
	}
	// ClickHouse holds exactly the episodes each stage reported.
	for _, p := range []workflows.Progress{o, r, sg} {
		got := stageCounts(t, conn, cfg.Database, p)
		for i, rep := range p.Reports {
			if got[i] != fmt.Sprint(rep.Episodes) {
				t.Errorf("%s stage %d: ClickHouse holds %s episodes, the workflow reported %d", p.Name, i, got[i], rep.Episodes)
			}
		}
	}
	// Stage 2's latency ramp: every episode recorded the stage's value at its position,
	// 10 ms at the stage's first episode to 500 ms at its 80th.
	_, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT run_id, idx, drift_values[indexOf(drift_selectors, '*.latency.mean_ms')], drift_sources[1]
		FROM %s.episodes FINAL WHERE startsWith(run_id, '%s') ORDER BY run_id, idx`, cfg.Database, o.Reports[1].RunPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != int(o.Reports[1].Episodes) {
		t.Fatalf("%d stage-2 episodes with drift, want %d", len(rows), o.Reports[1].Episodes)
	}
	for _, row := range rows {
		batch, _ := strconv.Atoi(strings.TrimPrefix(row[0], o.Reports[1].RunPrefix))
		idx, _ := strconv.Atoi(row[1])
		got, _ := strconv.ParseFloat(row[2], 64)
		want := 10 + 490*float64(batch*20+idx)/79
		if math.Abs(got-want) > 1e-6 || row[3] != "run" {
			t.Errorf("%s episode %s: latency drift %s (%s), want %v (run)", row[0], row[1], row[2], row[3], want)
		}
	}
	out, err = gauntletCLI(t, "curriculum", "status", oracleID, "--data-dir", cfg.DataDir)
	if err != nil || !strings.Contains(out, "completed") || !strings.Contains(out, "weather") {
		t.Errorf("status of a finished curriculum: %v\n%s", err, out)
	}
	t.Logf("oracle: %d episodes; random: %d episodes\n%s", o.TotalEpisodes, r.TotalEpisodes, out)
	if *updateHistories {
		for name, id := range map[string]string{"curriculum-oracle": oracleID, "curriculum-random": randomID, "curriculum-signals": sigID, "batch": "batch-e2e"} {
			saveHistory(t, tc, id, name)
		}
	}
}

// temporalList runs `temporal workflow list --query` against the test's server, as a
// person would, and returns its output.
func temporalList(ctx context.Context, t *testing.T, tbin, addr, query string) string {
	t.Helper()
	out, err := exec.CommandContext(ctx, tbin, "workflow", "list", "--address", addr, "--query", query).CombinedOutput()
	if err != nil {
		t.Fatalf("temporal workflow list --query %q: %v\n%s", query, err, out)
	}
	return string(out)
}

var updateHistories = flag.Bool("update-histories", false, "record the e2e workflows' histories into workflows/testdata for the replay tests")

// saveHistory writes a workflow's history as JSON where the replay test reads it.
func saveHistory(t *testing.T, c client.Client, id, name string) {
	t.Helper()
	ctx := context.Background()
	it := c.GetWorkflowHistory(ctx, id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	h := &historypb.History{}
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		h.Events = append(h.Events, e)
	}
	b, err := protojson.MarshalOptions{Indent: "  "}.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "workflows", "testdata", name+".json")
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("recorded %d events of %s in %s", len(h.Events), id, path)
}

func curriculumQuery(t *testing.T, c client.Client, id string) workflows.Progress {
	t.Helper()
	v, err := c.QueryWorkflow(context.Background(), id, "", workflows.QueryProgress)
	if err != nil {
		t.Fatalf("query %s: %v", id, err)
	}
	var p workflows.Progress
	if err := v.Get(&p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCurriculumSurvivesKill kills -9 the whole gauntlet process (Temporal dev server,
// NATS, ClickHouse and the worker with it) after the first stage, starts it again on the
// same data directory, and checks that the curriculum goes on from where it was: no stage
// re-run, exact episode counts.
func TestCurriculumSurvivesKill(t *testing.T) {
	bin := buildBinary(t)
	dir := t.TempDir()
	natsPort, chPort, tPort := freePort(t), freePort(t), freePort(t)
	args := []string{"up", "--data-dir", dir, "--nats.port", fmt.Sprint(natsPort), "--clickhouse.port", fmt.Sprint(chPort),
		"--temporal.port", fmt.Sprint(tPort), "--temporal.ui-port", "-1",
		"--http", "", "--envapi.addr", "127.0.0.1:0", "--log.level", "warn", "--worker.concurrency", "64", "--store.batch-rows", "5000", "--store.flush-every", "200ms"}
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
	// Batches of 10, and a second stage of at least 200 episodes (20 batches): a window of
	// seconds in which to kill it running, where the whole curriculum of the other tests
	// can end between two progress queries on a quiet machine.
	text := strings.ReplaceAll(testCurriculum("oracle"), "batch: 20", "batch: 10")
	text = strings.Replace(text, "episodes: {min: 40, max: 80}\n    batch: 10\n    promotion: {metric: success_rate, threshold: 0.6",
		"episodes: {min: 200, max: 240}\n    batch: 10\n    promotion: {metric: success_rate, threshold: 0.6", 1)
	if !strings.Contains(text, "min: 200") {
		t.Fatal("the test's curriculum no longer has the second stage this test lengthens")
	}
	spec := writeFile(t, "c.yaml", text)
	out, err := gauntletCLI(t, "curriculum", "start", "-f", spec, "--data-dir", dir)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	tc := dialTemporal(t, fmt.Sprintf("127.0.0.1:%d", tPort))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	progress := func() workflows.Progress {
		v, err := tc.QueryWorkflow(ctx, id, "", workflows.QueryProgress)
		if err != nil {
			return workflows.Progress{}
		}
		var p workflows.Progress
		_ = v.Get(&p)
		return p
	}
	// Kill after stage 1 is done, in stage 2 (or later, if the query missed stage 2).
	var before workflows.Progress
	waitFor(ctx, t, func() bool {
		before = progress()
		return before.Stage > 1 || (before.Stage == 1 && before.StageEpisodes >= 10)
	})
	if before.Status != workflows.StatusRunning {
		t.Fatalf("curriculum %s before the kill; the test needs it running", before.Status)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	_ = os.Remove(stackPath(dir))
	restarted := time.Now()
	cmd = start()

	// Recovery is never silent: while the curriculum makes no progress after the restart,
	// `curriculum status` says what it waits for (the batch in flight and why it stalls).
	type seen struct {
		at      time.Duration
		out     string
		pending string // Temporal's pending activities and workflow task, to tell why
	}
	var statuses []seen
	for time.Since(restarted) < 3*time.Minute {
		out, err := gauntletCLI(t, "curriculum", "status", id, "--data-dir", dir)
		if err == nil {
			if p := progress(); p.TotalEpisodes > before.TotalEpisodes || p.Status != workflows.StatusRunning {
				break
			}
			pending := ""
			if desc, err := tc.DescribeWorkflow(ctx, id, ""); err == nil {
				d := desc.RawResponse
				for _, pa := range d.GetPendingActivities() {
					pending += fmt.Sprintf("activity %s: state %s, attempt %d, scheduled %v, started %v, heartbeat %v\n", pa.GetActivityType().GetName(), pa.GetState(),
						pa.GetAttempt(), pa.GetScheduledTime().AsTime().Format(time.StampMilli), pa.GetLastStartedTime().AsTime().Format(time.StampMilli), pa.GetLastHeartbeatTime().AsTime().Format(time.StampMilli))
				}
				if wt := d.GetPendingWorkflowTask(); wt != nil {
					pending += fmt.Sprintf("workflow task: state %s, attempt %d, scheduled %v, started %v\n", wt.GetState(), wt.GetAttempt(),
						wt.GetScheduledTime().AsTime().Format(time.StampMilli), wt.GetStartedTime().AsTime().Format(time.StampMilli))
				}
			}
			statuses = append(statuses, seen{time.Since(restarted), out, pending})
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, s := range statuses {
		t.Logf("status %.1fs after the restart (now %s):\n%s%s", s.at.Seconds(), restarted.Add(s.at).Format(time.StampMilli), s.out, s.pending)
		if s.at > 5*time.Second && !strings.Contains(s.out, "waiting") {
			t.Errorf("status %.1fs after the restart, before any progress, does not say what it waits for:\n%s%s", s.at.Seconds(), s.out, s.pending)
		}
	}

	tc2 := dialTemporal(t, fmt.Sprintf("127.0.0.1:%d", tPort))
	var p workflows.Progress
	if err := tc2.GetWorkflow(ctx, id, "").Get(ctx, &p); err != nil {
		t.Fatalf("curriculum after restart: %v", err)
	}
	if p.Status != workflows.StatusCompleted || len(p.Reports) != 3 {
		t.Fatalf("after restart: %+v; want completed", p)
	}
	if !reflect.DeepEqual(p.Reports[0], before.Reports[0]) {
		t.Errorf("stage 1 report changed across the kill: %+v, then %+v", before.Reports[0], p.Reports[0])
	}
	conn := connect(t, fmt.Sprintf("127.0.0.1:%d", chPort), "gauntlet")
	got := stageCounts(t, conn, "gauntlet", p)
	var total uint64
	for i, rep := range p.Reports {
		total += rep.Episodes
		if got[i] != fmt.Sprint(rep.Episodes) {
			t.Errorf("stage %d: ClickHouse holds %s episodes, the workflow reported %d", i, got[i], rep.Episodes)
		}
		runs := queryOne(t, conn, fmt.Sprintf(`SELECT uniqExact(run_id) FROM gauntlet.episodes FINAL WHERE startsWith(run_id, '%s')`, rep.RunPrefix))
		if runs != fmt.Sprint(rep.Batches) {
			t.Errorf("stage %d: %s runs in ClickHouse, %d batches reported", i, runs, rep.Batches)
		}
	}
	if all := queryOne(t, conn, `SELECT count() FROM gauntlet.episodes FINAL`); all != fmt.Sprint(total) {
		t.Errorf("ClickHouse holds %s episodes, the workflow reported %d in all", all, total)
	}
}

// TestCurriculumDriftContinuesAndLastSkipOnRealStack runs, on the real stack, a
// curriculum whose second stage continues the first stage's latency ramp and is then
// skipped: ClickHouse shows the ramp going on from where the first stage was promoted,
// and the curriculum ends as skipped, not completed.
func TestCurriculumDriftContinuesAndLastSkipOnRealStack(t *testing.T) {
	cfg := testConfig(t)
	cfg.Worker.Concurrency = 64
	s := startStack(t, cfg, modAll)
	if err := writeStack(cfg.DataDir, stack{NATSURL: s.app.natsURL(), ClickHouse: s.app.clickHouseAddr(), Database: cfg.Database, Temporal: s.app.temporalAddr()}); err != nil {
		t.Fatal(err)
	}
	tc := dialTemporal(t, s.app.temporalAddr())
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	// Stage ramp: 1 ms more per episode over 100 episodes, promoted after 20 by the
	// oracle. Stage climb goes on from there to 500 over its 2000 episodes, with random,
	// which never passes: it is skipped.
	spec := writeFile(t, "continue.yaml", `
name: continue
seed: 5
max_in_flight: 200
stages:
  - name: ramp
    env: shop
    policies: oracle=1
    episodes: {min: 20, max: 100}
    batch: 10
    promotion: {metric: success_rate, threshold: 0.8, window: 10}
    drift: [{selector: "*.latency.mean_ms", from: 10, to: 109}]
  - name: climb
    env: shop
    policies: random=1
    episodes: {min: 20, max: 2000}
    batch: 10
    promotion: {metric: success_rate, threshold: 1, window: 20}
    drift: [{selector: "*.latency.mean_ms", continue: true, to: 500}]
`)
	out, err := gauntletCLI(t, "curriculum", "start", "-f", spec, "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	waitFor(context.Background(), t, func() bool { p := curriculumQuery(t, tc, id); return p.Stage == 1 && p.StageEpisodes >= 30 })
	if _, err := gauntletCLI(t, "curriculum", "skip", id, "--data-dir", cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var p workflows.Progress
	if err := tc.GetWorkflow(ctx, id, "").Get(ctx, &p); err != nil {
		t.Fatalf("curriculum %s: %v", id, err)
	}
	if len(p.Reports) != 2 || p.Reports[0].Outcome != workflows.OutcomePromoted || p.Reports[1].Outcome != workflows.OutcomeSkipped {
		t.Fatalf("reports %+v; want ramp promoted, climb skipped", p.Reports)
	}
	if p.Status != workflows.StatusSkipped {
		t.Errorf("status %q after the last stage was skipped; want %q", p.Status, workflows.StatusSkipped)
	}
	out, err = gauntletCLI(t, "curriculum", "status", id, "--data-dir", cfg.DataDir)
	if err != nil || !strings.Contains(out, "): skipped") {
		t.Errorf("status: %v\n%s", err, out)
	}
	// The climb starts where the ramp was when promoted: 10 + its episodes, then 1/1999
	// of the way to 500 per episode.
	reached := 10 + float64(p.Reports[0].Episodes)
	if got := stageCounts(t, conn, cfg.Database, p); got[1] != fmt.Sprint(p.Reports[1].Episodes) {
		t.Fatalf("ClickHouse holds %v episodes per stage; the workflow reported %+v", got, p.Reports)
	}
	_, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT run_id, idx, drift_values[indexOf(drift_selectors, '*.latency.mean_ms')]
		FROM %s.episodes FINAL WHERE startsWith(run_id, '%s') ORDER BY run_id, idx`, cfg.Database, p.Reports[1].RunPrefix))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != int(p.Reports[1].Episodes) || len(rows) < 30 {
		t.Fatalf("%d climb episodes in ClickHouse, the workflow reported %d", len(rows), p.Reports[1].Episodes)
	}
	for _, row := range rows {
		batch, _ := strconv.Atoi(strings.TrimPrefix(row[0], p.Reports[1].RunPrefix))
		idx, _ := strconv.Atoi(row[1])
		got, _ := strconv.ParseFloat(row[2], 64)
		want := reached + (500-reached)*float64(batch*10+idx)/1999
		if math.Abs(got-want) > 1e-6 {
			t.Errorf("%s episode %s: latency drift %s, want %v (continuing from %v)", row[0], row[1], row[2], want, reached)
		}
	}
}
