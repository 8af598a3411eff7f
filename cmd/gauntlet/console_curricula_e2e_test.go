package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	connectrpc "connectrpc.com/connect"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/chromedp/chromedp"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/converter"

	"github.com/gauntlet-rl/gauntlet/pkg/console"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

// consoleCurriculum passes its first stage with the oracle, a fifth of its episodes
// given to an http policy whose endpoint fails every call (model endpoint infra errors,
// which its stage records by kind), then stays in its second (a reward mean no episode
// reaches) under a latency ramp until it is aborted. %s is the endpoint's URL.
const consoleCurriculum = `
name: console-e2e
seed: 5
max_in_flight: 50
stages:
  - name: calm
    env: shop
    policies: oracle=4,http=1
    policy_endpoint: {url: '%s/v1', model: down}
    profiles: baseline=1
    episodes: {min: 20, max: 40}
    batch: 10
    promotion: {metric: success_rate, threshold: 0.8, window: 20}
  - name: weather
    env: shop
    policies: oracle=1
    profiles: stress=1
    episodes: {min: 20, max: 4000}
    batch: 10
    promotion: {metric: reward_mean, threshold: 1000, window: 20}
    drift:
      - {selector: "*.latency.mean_ms", from: 10, to: 500}
`

// TestConsoleCurriculaInABrowser runs the whole stack with the console and the env API,
// starts a curriculum, and in Debian's chromium: the curricula list and the curriculum
// page show what Temporal and SQL say; pressing pause with an env API token really
// pauses the curriculum (Temporal's memo says paused and no episode runs), resume
// resumes it; a run's fault heatmap shows what the SQL of docs/querying.md gives; and
// the replay viewer links an env API fork to its parent and back. No page logs an
// error. Screenshots go to the test's artifact directory.
func TestConsoleCurriculaInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a stack and a browser; -short runs unit tests only")
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): the console's browser tests need Debian's chromium; run scripts/deps.sh", err)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "model endpoint down", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	cfg := testConfig(t)
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cfg.Worker.Concurrency = 32
	cfg.Worker.MaxDeliver = 1 // an infra error is recorded at once, not retried
	tokens := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(tokens, []byte("tenants:\n  - name: acme\n    tokens: ["+tokenAcme+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.EnvAPI.TokensFile = tokens
	s := startStack(t, cfg, modAll)
	if err := writeStack(cfg.DataDir, stack{NATSURL: s.app.natsURL(), ClickHouse: s.app.clickHouseAddr(), Database: cfg.Database, Temporal: s.app.temporalAddr()}); err != nil {
		t.Fatal(err)
	}
	tc := dialTemporal(t, s.app.temporalAddr())
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	db := cfg.Database
	base := "http://" + cfg.HTTPAddr + console.Prefix
	shots := t.ArtifactDir()
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()

	out, err := gauntletCLI(t, "curriculum", "start", "-f", writeFile(t, "console.yaml", fmt.Sprintf(consoleCurriculum, down.URL)), "--id", "curriculum-console-e2e", "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(out)
	memoState := func() string {
		d, err := tc.DescribeWorkflow(ctx, id, "")
		if err != nil {
			t.Fatalf("describe %s: %v", id, err)
		}
		var st string
		if p := d.RawResponse.GetWorkflowExecutionInfo().GetMemo().GetFields()[workflows.MemoState]; p != nil {
			_ = converter.GetDefaultDataConverter().FromPayload(p, &st)
		}
		return st
	}

	b := newBrowser(t, chromium)
	if err := b.do(chromedp.Navigate(base+"#/curricula"), chromedp.WaitVisible(chromedp.CSS(`main h1`))); err != nil {
		t.Fatalf("open the curricula page: %v%s", err, b.state())
	}
	rowSel := fmt.Sprintf(`#curricula tr[data-curriculum=%q]`, id)
	waitText(t, b, rowSel+` td[data-field="state"]`, workflows.StatusRunning, time.Minute)
	waitText(t, b, rowSel+` td[data-field="name"]`, "console-e2e", time.Minute)
	b.screenshot(t, filepath.Join(shots, "curricula.png"))

	// Into its second stage, so the chart has a stage change and a drift.
	waitFor(ctx, t, func() bool { p := curriculumQuery(t, tc, id); return p.Stage == 1 && p.StageEpisodes >= 20 })
	if err := b.do(chromedp.Click(chromedp.CSS(rowSel+` a`)), chromedp.WaitVisible(chromedp.CSS(`#signal-pause`))); err != nil {
		t.Fatalf("open the curriculum page: %v%s", err, b.state())
	}

	// Pause, with the token typed on the page: Temporal's memo says paused, and no
	// episode runs while it is.
	if err := b.do(chromedp.SendKeys(chromedp.CSS(`#token`), tokenAcme)); err != nil {
		t.Fatalf("type the token: %v", err)
	}
	if got, err := b.evalString(`sessionStorage.getItem("gauntlet.envapi-token")`); err != nil || got != tokenAcme {
		t.Fatalf("the page kept token %q (err %v), want what was typed", got, err)
	}
	if err := b.do(chromedp.Click(chromedp.CSS(`#signal-pause`))); err != nil {
		t.Fatalf("press pause: %v", err)
	}
	waitFor(ctx, t, func() bool { return memoState() == workflows.StatusPaused })
	paused := curriculumQuery(t, tc, id)
	if paused.Status != workflows.StatusPaused {
		t.Fatalf("after pause: status %s, want paused", paused.Status)
	}
	time.Sleep(time.Second)
	if again := curriculumQuery(t, tc, id); again.TotalEpisodes != paused.TotalEpisodes {
		t.Fatalf("paused curriculum ran on: %d then %d episodes", paused.TotalEpisodes, again.TotalEpisodes)
	}
	waitText(t, b, `h1 [data-field="state"]`, workflows.StatusPaused, time.Minute)
	if got := text(t, b, `#action-note`); !strings.Contains(got, "pause sent") {
		t.Errorf("after pause the page says %q, want that pause was sent", got)
	}

	// Paused, its numbers stand still: the page shows what SQL gives.
	inCurriculum := fmt.Sprintf(`run_id IN (SELECT run_id FROM %s.runs FINAL WHERE curriculum_id = '%s')`, db, id)
	waitFor(ctx, t, func() bool {
		return queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE %s`, db, inCurriculum)) == strconv.FormatUint(paused.TotalEpisodes, 10)
	})
	episodes := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE %s`, db, inCurriculum))
	success := pct(queryOne(t, conn, fmt.Sprintf(`SELECT avg(success) FROM %s.episodes_scored WHERE %s`, db, inCurriculum)))
	waitText(t, b, `.card [data-field="episodes"]`, episodes, time.Minute)
	if got := text(t, b, `.card [data-field="success_rate"]`); got != success {
		t.Errorf("curriculum page: success rate %q, SQL gives %q", got, success)
	}
	if got := text(t, b, `.card [data-field="stage"]`); got != "1 weather" {
		t.Errorf("curriculum page: stage %q, want \"1 weather\"", got)
	}
	_, batches, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT run_id, count(), avgIf(success, infra_error = 0) FROM %s.episodes FINAL WHERE %s GROUP BY run_id`, db, inCurriculum))
	if err != nil || len(batches) < 4 {
		t.Fatalf("batches by SQL: %v (%d)", err, len(batches))
	}
	for _, row := range batches {
		sel := fmt.Sprintf(`#batches tr[data-run=%q] td[data-field=%%q]`, row[0])
		if got := text(t, b, fmt.Sprintf(sel, "episodes")); got != row[1] {
			t.Errorf("batch %s: %s episodes shown, SQL gives %s", row[0], got, row[1])
		}
		if got := text(t, b, fmt.Sprintf(sel, "success_rate")); got != pct(row[2]) {
			t.Errorf("batch %s: success %s shown, SQL gives %s", row[0], got, pct(row[2]))
		}
	}
	if n, err := b.eval(`document.querySelectorAll("#batches tbody tr").length`); err != nil || strconv.Itoa(n) != strconv.Itoa(len(batches)) {
		t.Errorf("%d batches shown (err %v), SQL gives %d", n, err, len(batches))
	}
	stages := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.curriculum_stages FINAL WHERE curriculum_id = '%s'`, db, id))
	if n, err := b.eval(`document.querySelectorAll("#stages tbody tr").length`); err != nil || strconv.Itoa(n) != stages || stages != "1" {
		t.Errorf("%d closed stages shown (err %v), SQL gives %s, want 1", n, err, stages)
	}
	// The closed stage's infra errors, by kind as curriculum_stages holds them: the
	// table's text, and its stacked bar one part a kind.
	_, byKind, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT toString(stage), toString(infra_errors),
		arrayStringConcat(arrayMap((k, n) -> concat(k, ' ', toString(n)), infra_kinds, infra_counts), ', '), toString(length(infra_kinds))
		FROM %s.curriculum_stages FINAL WHERE curriculum_id = '%s'`, db, id))
	if err != nil || len(byKind) != 1 || byKind[0][1] == "0" || !strings.HasPrefix(byKind[0][2], "model_endpoint ") {
		t.Fatalf("closed stages' infra errors by SQL: %v %q; want stage 0's model endpoint errors", err, byKind)
	}
	for _, row := range byKind {
		sel := fmt.Sprintf(`#stages tr[data-stage=%q] `, row[0])
		if got := text(t, b, sel+`td[data-field="infra_errors"]`); got != row[1] {
			t.Errorf("stage %s: %s infra errors shown, SQL gives %s", row[0], got, row[1])
		}
		if got := text(t, b, sel+`[data-field="infra_by_kind"]`); got != row[2] {
			t.Errorf("stage %s: infra errors by kind %q shown, SQL gives %q", row[0], got, row[2])
		}
		if n, err := b.eval(fmt.Sprintf(`document.querySelectorAll(%q).length`, sel+`.kindbar [data-kind]`)); err != nil || strconv.Itoa(n) != row[3] {
			t.Errorf("stage %s: %d parts in its bar of infra errors by kind (err %v), SQL gives %s kinds", row[0], n, err, row[3])
		}
	}
	// One chart: success rate, stage and the latency drift.
	if n, err := b.eval(`document.querySelectorAll(".chart canvas").length`); err != nil || n != 1 {
		t.Errorf("curriculum page: %d charts (err %v), want 1", n, err)
	}
	if n, err := b.eval(`[...document.querySelectorAll(".chart .u-legend .u-label")].filter(l => l.textContent.startsWith("drift ")).length`); err != nil || n != 1 {
		t.Errorf("curriculum chart: %d drift series (err %v), want 1", n, err)
	}
	b.screenshot(t, filepath.Join(shots, "curriculum-paused.png"))

	// The list shows it paused, with the same numbers.
	if err := b.do(chromedp.Navigate(base + "#/curricula")); err != nil {
		t.Fatal(err)
	}
	waitText(t, b, rowSel+` td[data-field="state"]`, workflows.StatusPaused, time.Minute)
	waitText(t, b, rowSel+` td[data-field="episodes"]`, episodes, time.Minute)
	if got := text(t, b, rowSel+` td[data-field="success_rate"]`); got != success {
		t.Errorf("curricula list: success %q, SQL gives %q", got, success)
	}

	// Resume from the page: Temporal's memo says running and episodes run again.
	if err := b.do(chromedp.Click(chromedp.CSS(rowSel+` a`)), chromedp.WaitVisible(chromedp.CSS(`#signal-resume:not([disabled])`))); err != nil {
		t.Fatalf("back to the curriculum page: %v%s", err, b.state())
	}
	if err := b.do(chromedp.Click(chromedp.CSS(`#signal-resume`))); err != nil {
		t.Fatalf("press resume: %v", err)
	}
	waitFor(ctx, t, func() bool { return memoState() == workflows.StatusRunning })
	waitFor(ctx, t, func() bool { return curriculumQuery(t, tc, id).TotalEpisodes > paused.TotalEpisodes })
	waitText(t, b, `h1 [data-field="state"]`, workflows.StatusRunning, time.Minute)
	b.screenshot(t, filepath.Join(shots, "curriculum-resumed.png"))

	// Without a token nothing is sent; with one, abort ends it as Temporal shows.
	post := func(token string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"api/curricula/"+id+"/signal/abort", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if code := post(""); code != http.StatusUnauthorized {
		t.Errorf("abort without a token: status %d, want 401", code)
	}
	if code := post("not-a-token-0123456789"); code != http.StatusUnauthorized {
		t.Errorf("abort with an unknown token: status %d, want 401", code)
	}
	if st := memoState(); st != workflows.StatusRunning {
		t.Fatalf("after refused aborts the memo says %q, want running", st)
	}
	if code := post(tokenAcme); code != http.StatusOK {
		t.Fatalf("abort with the token: status %d", code)
	}
	if err := tc.GetWorkflow(ctx, id, "").Get(ctx, nil); err == nil {
		t.Fatal("aborted curriculum: closed without an error, want canceled")
	}
	d, err := tc.DescribeWorkflow(ctx, id, "")
	if err != nil {
		t.Fatal(err)
	}
	if st := d.RawResponse.GetWorkflowExecutionInfo().GetStatus(); st != enums.WORKFLOW_EXECUTION_STATUS_CANCELED {
		t.Fatalf("aborted curriculum closed as %v, want canceled", st)
	}
	if err := b.do(chromedp.Navigate(base + "#/curricula")); err != nil {
		t.Fatal(err)
	}
	waitText(t, b, rowSel+` td[data-field="state"]`, workflows.StatusAborted, time.Minute)
	b.screenshot(t, filepath.Join(shots, "curricula-aborted.png"))

	consoleHeatmap(t, ctx, b, conn, db, base, inCurriculum, shots)
	consoleForkLineage(t, ctx, b, conn, db, base, s.app.envapi.Addr(), shots)

	for _, e := range b.errors() {
		t.Errorf("browser: %s", e)
	}
}

// consoleHeatmap opens the fault heatmap of the curriculum's run with the most faults
// and checks each cell against the SQL docs/querying.md prints.
func consoleHeatmap(t *testing.T, ctx context.Context, b *browser, conn driver.Conn, db, base, inCurriculum, shots string) {
	t.Helper()
	run := queryOne(t, conn, fmt.Sprintf(`SELECT run_id FROM %s.faults FINAL WHERE %s GROUP BY run_id ORDER BY count() DESC, run_id LIMIT 1`, db, inCurriculum))
	// Every episode of the run is stored (the curriculum has closed).
	waitFor(ctx, t, func() bool {
		return queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE run_id = '%s'`, db, run)) ==
			queryOne(t, conn, fmt.Sprintf(`SELECT ended FROM %s.runs FINAL WHERE run_id = '%s'`, db, run))
	})
	docs, err := os.ReadFile("../../docs/querying.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- console:fault_heatmap -->\n```sql\n(.*?)\n```").FindSubmatch(docs)
	if m == nil {
		t.Fatal("docs/querying.md shows no <!-- console:fault_heatmap --> query")
	}
	q := strings.NewReplacer("gauntlet.", db+".", "'r…'", "'"+run+"'").Replace(string(m[1]))
	_, cells, err := trajectory.Query(ctx, conn, q)
	if err != nil || len(cells) == 0 {
		t.Fatalf("the documented heatmap query on %s: %v (%d cells)\n%s", run, err, len(cells), q)
	}
	if err := b.do(chromedp.Navigate(base+"#/runs/"+run), chromedp.WaitVisible(chromedp.CSS(`#heatmap-link`)),
		chromedp.Click(chromedp.CSS(`#heatmap-link`)), chromedp.WaitVisible(chromedp.CSS(`#heatmap`))); err != nil {
		t.Fatalf("open the heatmap of %s: %v%s", run, err, b.state())
	}
	for _, c := range cells { // kind, service, episodes, succeeded, success_rate
		sel := fmt.Sprintf(`#heatmap tr[data-kind=%q] td[data-service=%q]`, c[0], c[1])
		if got := text(t, b, sel); got != pct(c[4]) {
			t.Errorf("heatmap %s × %s: %q, SQL gives %s", c[0], c[1], got, pct(c[4]))
		}
		if got, err := b.evalString(fmt.Sprintf(`document.querySelector(%q).dataset.episodes`, sel)); err != nil || got != c[2] {
			t.Errorf("heatmap %s × %s: %q episodes (err %v), SQL gives %s", c[0], c[1], got, err, c[2])
		}
	}
	if n, err := b.eval(`document.querySelectorAll("#heatmap td[data-episodes]").length`); err != nil || n != len(cells) {
		t.Errorf("heatmap: %d cells (err %v), SQL gives %d", n, err, len(cells))
	}
	b.screenshot(t, filepath.Join(shots, "heatmap.png"))
}

// consoleForkLineage forks an env API episode at step 2 and checks that ClickHouse
// records the lineage and the replay viewer links the fork and its parent both ways.
func consoleForkLineage(t *testing.T, ctx context.Context, b *browser, conn driver.Conn, db, base, envAPI, shots string) {
	t.Helper()
	api := grpcClient(envAPI, tokenAcme)
	r, err := api.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 11, Profile: "baseline"}))
	if err != nil {
		t.Fatal(err)
	}
	parent := r.Msg.EpisodeId
	step := func(id, q string) {
		if _, err := api.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: `{"query":"` + q + `"}`}})); err != nil {
			t.Fatal(err)
		}
	}
	step(parent, "a")
	step(parent, "b")
	snap, err := api.Snapshot(ctx, connectrpc.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: parent}))
	if err != nil {
		t.Fatal(err)
	}
	step(parent, "c")
	f, err := api.Fork(ctx, connectrpc.NewRequest(&gauntletv1.ForkRequest{SnapshotId: snap.Msg.SnapshotId}))
	if err != nil {
		t.Fatal(err)
	}
	fork := f.Msg.EpisodeId
	step(fork, "d")
	for _, id := range []string{parent, fork} {
		if _, err := api.Close(ctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id})); err != nil {
			t.Fatal(err)
		}
	}
	waitEpisodes(t, conn, db, []string{parent, fork})
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT concat(parent_episode_id, '@', toString(parent_step)) FROM %s.episodes FINAL WHERE episode_id = '%s'`, db, fork)); got != parent+"@2" {
		t.Errorf("fork %s: ClickHouse records parent %q, want %s@2", fork, got, parent)
	}
	if got := queryOne(t, conn, fmt.Sprintf(`SELECT concat(parent_episode_id, '@', toString(parent_step)) FROM %s.episodes FINAL WHERE episode_id = '%s'`, db, parent)); got != "@0" {
		t.Errorf("parent %s: ClickHouse records parent %q, want none", parent, got)
	}
	if err := b.do(chromedp.Navigate(base+"#/episodes/"+fork), chromedp.WaitVisible(chromedp.CSS(`#parent-link`))); err != nil {
		t.Fatalf("open the fork's replay: %v%s", err, b.state())
	}
	if got := text(t, b, `#parent-link`); got != parent {
		t.Errorf("fork's replay: parent %q, want %s", got, parent)
	}
	if got := text(t, b, `#parent-step`); got != "2" {
		t.Errorf("fork's replay: forked at step %q, want 2", got)
	}
	b.screenshot(t, filepath.Join(shots, "replay-fork.png"))
	if err := b.do(chromedp.Click(chromedp.CSS(`#parent-link`))); err != nil {
		t.Fatal(err)
	}
	waitText(t, b, `.fork-link`, fork+" (step 2)", 30*time.Second)
	waitText(t, b, `#step-index`, "2", 30*time.Second)
	b.screenshot(t, filepath.Join(shots, "replay-parent.png"))
}
