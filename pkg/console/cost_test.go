package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// fillRun inserts a run of n ended episodes as a shop run records them: ids
// "<run>-0000000"…, 7 steps each, and in two of every five episodes three faults (kinds
// http_error, latency, http_error on services api and db). It is made in ClickHouse
// (INSERT … SELECT FROM numbers), so a run of a million costs seconds.
func fillRun(t testing.TB, conn driver.Conn, db, runID string, n int) {
	t.Helper()
	ctx := context.Background()
	id := `concat('` + runID + `', '-', substring(toString(10000000 + e), 2))`
	stmts := []string{
		`INSERT INTO ` + db + `.episodes (run_id, episode_id, idx, env, seed, policy, profile, requested_at, started_at, ended_at,
			steps, success, total_reward, infra_error, infra_kind, faults_fired, reason, version)
		SELECT '` + runID + `', ` + id + `, e, 'shop', e, 'oracle', if(e % 5 < 2, 'stress', 'baseline'),
			toDateTime('2026-12-01 12:00:00'), toDateTime('2026-12-01 12:00:00') + intDiv(e, 1000), toDateTime('2026-12-01 12:00:01') + intDiv(e, 1000),
			7, toUInt8(e % 10 != 3), (e % 13) / 4, toUInt8(e % 1000 = 999), if(e % 1000 = 999, 'sandbox', ''), if(e % 5 < 2, 3, 0), 'success', 1
		FROM (SELECT number AS e FROM system.numbers LIMIT ` + strconv.Itoa(n) + `)`,
		`INSERT INTO ` + db + `.faults (run_id, episode_id, step, seq, requested_at, kind, target, detail, version)
		SELECT '` + runID + `', ` + id + `, toUInt32(f), 0, toDateTime('2026-12-01 12:00:00'), if(f = 1, 'latency', 'http_error'),
			if(f = 2, 'db/query', 'api/search'), '', 1
		FROM (SELECT intDiv(number, 3) AS e, number % 3 AS f FROM system.numbers LIMIT ` + strconv.Itoa(3*n) + `) WHERE e % 5 < 2`,
		`INSERT INTO ` + db + `.steps (run_id, episode_id, step, requested_at, tool, args, observation, state_diff, reward, reward_names, reward_values, reward_spec, version)
		SELECT '` + runID + `', ` + id + `, toUInt32(s), toDateTime('2026-12-01 12:00:00'), 'catalog.search', '{"q":"x"}', '{"ok":true}', '[]',
			0.25, ['task'], [0.25], 'default/1', 1
		FROM (SELECT intDiv(number, 7) AS e, number % 7 AS s FROM system.numbers LIMIT ` + strconv.Itoa(7*n) + `)`,
	}
	for _, s := range stmts {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("fill run %s: %v", runID, err)
		}
	}
}

// plannedRun is Config.Progress for a console whose one scheduled run is runID, of n
// episodes, in flight.
func plannedRun(runID string, n uint64) func(context.Context, string) (*gauntletv1.RunProgress, bool) {
	return func(_ context.Context, id string) (*gauntletv1.RunProgress, bool) {
		if id != runID {
			return nil, false
		}
		return &gauntletv1.RunProgress{RunId: id, Episodes: n, Ended: n}, true
	}
}

// queryCost is what ClickHouse read for the queries of one console request: rows and
// bytes (uncompressed, of the columns read), and the granules (marks) the tables' keys
// selected.
type queryCost struct {
	queries   uint64
	readRows  uint64
	readBytes uint64
	marks     uint64
}

// consoleCost serves path from c with every query logged under one query id, and
// returns the status, the time it took and what ClickHouse read for it (system.query_log).
func consoleCost(t testing.TB, c *Console, conn driver.Conn, path string) (int, time.Duration, queryCost) {
	t.Helper()
	rec, took, qc := serveLogged(t, c, conn, path)
	if rec.Code != http.StatusOK {
		t.Errorf("%s: status %d: %s", path, rec.Code, rec.Body.String())
	}
	return rec.Code, took, qc
}

// serveLogged serves path from c with every query logged under one query id, and
// returns the response, the time it took and what ClickHouse read for it.
//
// A page's queries may run at once, and all carry the request's query id; ClickHouse
// refuses a query whose id is already running ("code: 216"). The page is then asked
// again under a new id: a device of these tests, not something a console user meets.
func serveLogged(t testing.TB, c *Console, conn driver.Conn, path string) (*httptest.ResponseRecorder, time.Duration, queryCost) {
	t.Helper()
	return serveLoggedN(t, c, conn, path, 1)
}

// serveLoggedN is serveLogged for a request that runs at least queries queries: it waits
// for that many to be logged (the log row of a query is written as it finishes, which
// can be after its answer was read).
func serveLoggedN(t testing.TB, c *Console, conn driver.Conn, path string, queries uint64) (*httptest.ResponseRecorder, time.Duration, queryCost) {
	t.Helper()
	var rec *httptest.ResponseRecorder
	var qid string
	var took time.Duration
	for try := 0; ; try++ {
		qid = fmt.Sprintf("console-cost-%d", time.Now().UnixNano())
		ctx := clickhouse.Context(context.Background(), clickhouse.WithQueryID(qid),
			clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
		rec = httptest.NewRecorder()
		start := time.Now()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx))
		took = time.Since(start)
		if try == 10 || rec.Code == http.StatusOK || !strings.Contains(rec.Body.String(), "code: 216") {
			break
		}
	}
	var qc queryCost
	// A query's log row is written as it finishes, which on a loaded machine can be
	// after the answer has been read: flush until it shows, for a while (an answer from
	// the console's memory, which logs none, costs the whole while).
	for range 20 {
		if err := conn.Exec(context.Background(), "SYSTEM FLUSH LOGS"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(context.Background(), `SELECT count(), sum(read_rows), sum(read_bytes),
			sum(ProfileEvents.Values[indexOf(ProfileEvents.Names, 'SelectedMarks')]) FROM system.query_log
			WHERE query_id = ? AND type = 2`, qid).Scan(&qc.queries, &qc.readRows, &qc.readBytes, &qc.marks); err != nil {
			t.Fatal(err)
		}
		if qc.queries >= queries {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return rec, took, qc
}

// serveCounted is serveLogged for a request whose queries run one after another under
// no common query id (a keyed page reads in several, some refused at once, and a query
// id still registered refuses the next one, "code: 216"): the query log is emptied
// first, and every query logged is the request's, this ClickHouse serving the test alone.
func serveCounted(t testing.TB, c *Console, conn driver.Conn, path string) (*httptest.ResponseRecorder, time.Duration, queryCost) {
	t.Helper()
	ctx := context.Background()
	for _, q := range []string{"SYSTEM FLUSH LOGS", "TRUNCATE TABLE IF EXISTS system.query_log"} {
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	rec := httptest.NewRecorder()
	start := time.Now()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(
		clickhouse.Context(ctx, clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))))
	took := time.Since(start)
	var qc queryCost
	if err := conn.Exec(ctx, "SYSTEM FLUSH LOGS"); err != nil {
		t.Fatal(err)
	}
	// Finished (2) or refused (3 before it started, 4 while it ran).
	if err := conn.QueryRow(ctx, `SELECT count(), sum(read_rows) FROM system.query_log WHERE type IN (2, 3, 4)`).Scan(&qc.queries, &qc.readRows); err != nil {
		t.Fatal(err)
	}
	return rec, took, qc
}

// TestConsoleCostOfALargeRun prints, for a run of CONSOLE_COST_EPISODES episodes (skipped
// without it), each console request's time and the rows ClickHouse read for it: the
// figures behind docs/benchmarks.md's console section, measured without the pipeline.
func TestConsoleCostOfALargeRun(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CONSOLE_COST_EPISODES"))
	if n <= 0 {
		t.Skip("set CONSOLE_COST_EPISODES to the run's size")
	}
	srv, conn := migratedClickHouse(t)
	const db = testDB
	start := time.Now()
	fillRun(t, conn, db, "rbig", n)
	fillRun(t, conn, db, "rsmall", 100)
	t.Logf("filled %d episodes in %v", n, time.Since(start))
	// Nothing kept: every request pays for its queries.
	c := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rbig", uint64(n)), CacheFrom: 1 << 62},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	last := (n - 1) / 200 * 200
	paths := []string{
		"/console/api/runs",
		"/console/api/runs/rbig",
		"/console/api/runs/rbig/episodes?offset=0&limit=200",
		fmt.Sprintf("/console/api/runs/rbig/episodes?offset=%d&limit=200", last),
		"/console/api/runs/rbig/faults",
		fmt.Sprintf("/console/api/episodes/rbig-%07d?from=0&limit=100", n-1),
	}
	for round := range 3 {
		for _, p := range paths {
			_, took, qc := consoleCost(t, c, conn, p)
			t.Logf("round %d %-60s %8.1f ms  %2d queries  %10d rows read", round, p, float64(took.Microseconds())/1000, qc.queries, qc.readRows)
		}
	}
}

// TestReadsStayWithinTheRun: the pages of one run read that run's rows by the tables'
// keys. Before, a run's fault table and heatmap filtered the faults, ordered by episode,
// on run_id (every fault of every run: the small run's page read the large run's
// faults), and a page of a planned run's episodes sorted all of them to skip to its
// offset; each read more rows than half the large run.
func TestReadsStayWithinTheRun(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	const n = 100_000
	fillRun(t, conn, db, "rbig", n)
	fillRun(t, conn, db, "rsmall", 100)
	c := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rbig", n)},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	// Half the large run: a read by key costs a few granules (8,192 rows) per part and
	// query, a scan of the large run all of its rows.
	const most = n / 2
	for _, path := range []string{
		"/console/api/runs/rsmall",
		"/console/api/runs/rsmall/faults",
		fmt.Sprintf("/console/api/runs/rbig/episodes?offset=%d&limit=200", n-200),
	} {
		_, took, qc := consoleCost(t, c, conn, path)
		t.Logf("%s: %d queries, %d rows read, %v", path, qc.queries, qc.readRows, took)
		if qc.queries == 0 || qc.readRows > most {
			t.Errorf("%s: %d queries read %d rows; want at most %d", path, qc.queries, qc.readRows, most)
		}
	}
	// The large run's report and heatmap, once folded (the first look reads the run
	// whole), and an episode's replay read a few granules (8,192 rows) by key, not the
	// run: five granules at most. Before, the report read the run's episodes 8 times
	// over (820,000 rows), the heatmap its episodes and faults (320,000), the replay its
	// episodes once, looking for forks (125,440).
	const granules = 5 * 8192
	// Nothing kept: every answer is computed when asked.
	uncached := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rbig", n), CacheFrom: 1 << 62},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer uncached.Close()
	for _, path := range []string{"/console/api/runs/rbig", "/console/api/runs/rbig/faults"} {
		consoleCost(t, uncached, conn, path)
	}
	for _, path := range []string{
		"/console/api/runs/rbig",
		"/console/api/runs/rbig/faults",
		fmt.Sprintf("/console/api/episodes/rbig-%07d?from=0&limit=100", n-1),
	} {
		_, took, qc := consoleCost(t, uncached, conn, path)
		t.Logf("%s: %d queries, %d rows read, %v", path, qc.queries, qc.readRows, took)
		if qc.queries == 0 || qc.readRows > granules {
			t.Errorf("%s: %d queries read %d rows; want at most %d", path, qc.queries, qc.readRows, granules)
		}
	}

	// The planned run's page by index is the page by rank: every episode has ended.
	rd, err := c.reader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{0, 4321, n - 200, n - 50} {
		byRank, err := rd.Episodes(ctx, "rbig", off, 200)
		if err != nil {
			t.Fatal(err)
		}
		byIdx, err := rd.EpisodesFrom(ctx, "rbig", off, 200)
		if err != nil {
			t.Fatal(err)
		}
		if len(byRank) != min(200, n-off) || len(byIdx) != len(byRank) {
			t.Fatalf("offset %d: %d episodes by rank, %d by index", off, len(byRank), len(byIdx))
		}
		for i := range byRank {
			if byRank[i] != byIdx[i] {
				t.Fatalf("offset %d, episode %d: by rank %+v, by index %+v", off, i, byRank[i], byIdx[i])
			}
		}
	}
}

// TestLargeSummaryServedKept: a run of at least CacheFrom episodes is summarised once and
// served from memory, with its age, until RefreshAfter; a smaller one is read for every
// request, so it shows a new episode at once.
func TestLargeSummaryServedKept(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	fillRun(t, conn, db, "rkept", 50)
	fillRun(t, conn, db, "rread", 49)
	c := New(Config{ClickHouse: srv.Addr, Database: db, CacheFrom: 50, RefreshAfter: time.Hour},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	episodes := func(run string) (uint64, string, queryCost) {
		t.Helper()
		rec, _, qc := serveLogged(t, c, conn, "/console/api/runs/"+run)
		if rec.Code != http.StatusOK {
			t.Fatalf("run %s: status %d: %s", run, rec.Code, rec.Body.String())
		}
		var p RunPage
		if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
			t.Fatal(err)
		}
		return p.Run.Episodes, rec.Header().Get("Age"), qc
	}
	for _, run := range []string{"rkept", "rread"} {
		if n, age, qc := episodes(run); age != "" || qc.queries == 0 {
			t.Errorf("run %s, first look: %d episodes, Age %q, %d queries; want it read", run, n, age, qc.queries)
		}
	}
	// One more ended episode in each.
	for _, run := range []string{"rkept", "rread"} {
		if err := conn.Exec(ctx, `INSERT INTO `+db+`.episodes (run_id, episode_id, idx, requested_at, steps, version)
			SELECT '`+run+`', '`+run+`-0000999', 999, toDateTime('2026-12-01 12:00:00'), 1, 1`); err != nil {
			t.Fatal(err)
		}
	}
	if n, age, qc := episodes("rkept"); n != 50 || age == "" || qc.queries != 0 {
		t.Errorf("run rkept, second look: %d episodes, Age %q, %d queries; want the kept 50 with its age, no query", n, age, qc.queries)
	}
	if n, age, qc := episodes("rread"); n != 50 || age != "" || qc.queries == 0 {
		t.Errorf("run rread, second look: %d episodes, Age %q, %d queries; want 50 read now", n, age, qc.queries)
	}
}

// runsProgress is Config.Progress for a console whose scheduled runs are those of
// records: planned episodes, and whether the run is done (every episode ended).
func runsProgress(records map[string]*gauntletv1.RunProgress) func(context.Context, string) (*gauntletv1.RunProgress, bool) {
	return func(_ context.Context, id string) (*gauntletv1.RunProgress, bool) {
		p, ok := records[id]
		return p, ok
	}
}

// TestRunsListReadsLittle: the runs list takes an in-flight large planned run's numbers
// from its fold and a finished run's from the summary it kept, and reads only the other
// runs by key; its numbers equal runSummarySQL's over every run. Before, each look read
// every episode of every run it showed (130,150 rows here).
func TestRunsListReadsLittle(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	const n, done = 100_000, 30_000
	fillRun(t, conn, db, "rbig", n)
	fillRun(t, conn, db, "rdone", done)
	fillRun(t, conn, db, "rsmall", 100) // an env API run: no scheduler record
	fillRun(t, conn, db, "rzz", 50)     // sorts after the others
	records := map[string]*gauntletv1.RunProgress{
		"rbig":  {RunId: "rbig", Episodes: 2 * n, Ended: n},
		"rdone": {RunId: "rdone", Episodes: done, Ended: done, Done: true},
		"rzz":   {RunId: "rzz", Episodes: 50, Ended: 50, Done: true},
	}
	// Nothing kept in the answer cache: every answer is computed when asked.
	c := New(Config{ClickHouse: srv.Addr, Database: db, Progress: runsProgress(records), CacheFrom: 1 << 62},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	rd, err := c.reader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	same := func(stage string) {
		t.Helper()
		var page RunsPage
		getJSON(t, c, "/console/api/runs", &page)
		want, err := rd.Runs(ctx, 100)
		if err != nil {
			t.Fatal(err)
		}
		for i := range want {
			c.addProgress(ctx, &want[i])
			utc(&want[i], nil)
		}
		for i := range page.Runs {
			utc(&page.Runs[i], nil)
		}
		if !reflect.DeepEqual(page.Runs, want) {
			t.Errorf("%s: runs list\n%+v\nSQL\n%+v", stage, page.Runs, want)
		}
	}
	// The first looks find the runs, start folding the large one and keep the finished
	// ones; the fold's first refresh reads its run whole, once.
	for range 2 {
		consoleCost(t, c, conn, "/console/api/runs")
	}
	const granules = 5 * 8192
	_, took, qc := consoleCost(t, c, conn, "/console/api/runs")
	t.Logf("runs list: %d queries, %d rows read, %v", qc.queries, qc.readRows, took)
	if qc.queries == 0 || qc.readRows > granules {
		t.Errorf("runs list: %d queries read %d rows; want at most %d", qc.queries, qc.readRows, granules)
	}
	same("steady")
	// The large run goes on past its watermark, and the small one: both show at once.
	insertEpisodes(t, conn, db, "rbig", n, n+5000, 1, "", "")
	records["rbig"].Ended = n + 5000
	insertEpisodes(t, conn, db, "rsmall", 100, 120, 1, "", "")
	same("later")
}

// TestEnvAPIEpisodePagesByRank: a page of a run the scheduler did not plan (an env API
// run: random ids, indices not dense, so ids do not sort as indices), read by rank over
// two narrow columns and then by key, equals the page of FINAL's rank, while copies of
// some episodes, newer and older, are not merged away.
func TestEnvAPIEpisodePagesByRank(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	n, _ := strconv.Atoi(os.Getenv("CONSOLE_COST_EPISODES"))
	if n <= 0 {
		n = 20_000
	}
	insert := func(from, to int, version uint64, reward string) {
		t.Helper()
		if err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO `+db+`.episodes (run_id, episode_id, idx, env, seed, policy, requested_at, started_at, ended_at,
			steps, success, total_reward, reason, version)
		SELECT 'renv', concat('renv-', lower(hex(MD5(toString(e))))), 3 * e + 1, 'shop', e, 'trainer', toDateTime('2026-12-01 12:00:00'),
			toDateTime('2026-12-01 12:00:00'), toDateTime('2026-12-01 12:00:01') + intDiv(e, 1000), 7, toUInt8(e %% 10 != 3), %s, 'success', %d
		FROM (SELECT number + %d AS e FROM system.numbers LIMIT %d)`, reward, version, from, to-from)); err != nil {
			t.Fatal(err)
		}
	}
	insert(0, n, 2, "(e % 13) / 4")
	insert(n/2, n/2+500, 3, "100")  // newer copies: their reward wins
	insert(n/4, n/4+500, 1, "-100") // older copies: theirs loses
	c := New(Config{ClickHouse: srv.Addr, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	rd, err := c.reader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, off := range []int{0, n / 4, n/2 - 100, n - 200, n - 50, n + 10} {
		// The faster of three tries of each, read one after the other.
		var want, got []EpisodeSummary
		var final, byRank time.Duration
		for try := range 3 {
			start := time.Now()
			if want, err = rd.Episodes(ctx, "renv", off, 200); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); try == 0 || took < final {
				final = took
			}
			start = time.Now()
			if got, err = rd.EpisodesByRank(ctx, "renv", off, 200); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); try == 0 || took < byRank {
				byRank = took
			}
		}
		t.Logf("offset %d: %d episodes; rank with FINAL %v, by rank then key %v", off, len(want), final, byRank)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("offset %d: by rank then key\n%+v\nwith FINAL\n%+v", off, got, want)
		}
	}
	var page EpisodesPage
	getJSON(t, c, fmt.Sprintf("/console/api/runs/renv/episodes?offset=%d&limit=200", n/2-100), &page)
	if len(page.Episodes) != 200 || page.Episodes[100].TotalReward != 100 {
		t.Errorf("page at %d: %d episodes, the 101st's reward %v; want 200, 100 (its newest copy)", n/2-100, len(page.Episodes), page.Episodes[min(100, len(page.Episodes)-1)].TotalReward)
	}
}

// TestEnvAPIEpisodePagesByKey: an env API run whose ids sort in issue order
// (runs.IssuedIDPrefix) is paged by a cursor, each page read by a bounded range of the
// episodes table's key: a few granules, not a row of every episode of the run as by rank.
// Its episodes come from a server that restarted (its counter, idx, starting again at 0)
// and then from two servers at once; the pages hold every episode once, in issue order,
// each its newest version. A run with ids of the earlier, random form is still paged by
// rank.
func TestEnvAPIEpisodePagesByKey(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	n, _ := strconv.Atoi(os.Getenv("CONSOLE_COST_EPISODES"))
	if n <= 0 {
		n = 100_000
	}
	const run = "api-acme"
	// Episode e is issued at t0 + e ms: the first half by boot a1a1a1a1, the second,
	// after the restart, by bbbbbbbb and cccccccc in turn, each counting idx from 0.
	t0 := uint64(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC).UnixNano())
	insert := func(run string, from, to int, version uint64, reward string) {
		t.Helper()
		id := fmt.Sprintf(`concat('%s-v', lower(hex(toUInt64(%d + e * 1000000))),
			if(e < %d, 'a1a1a1a1', if(e %% 2 = 0, 'bbbbbbbb', 'cccccccc')), substring(lower(hex(MD5(toString(e)))), 1, 16))`, run, t0, n/2)
		if err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO `+db+`.episodes (run_id, episode_id, idx, env, seed, policy, requested_at, started_at, ended_at,
			steps, success, total_reward, reason, version)
		SELECT '%s', %s, if(e < %d, e, toUInt64(e - %d)), 'shop', e, 'trainer', toDateTime('2026-12-02 09:00:00'),
			toDateTime('2026-12-02 09:00:00'), toDateTime('2026-12-02 09:00:01') + intDiv(e, 1000), 7, toUInt8(e %% 10 != 3), %s, 'success', %d
		FROM (SELECT number + %d AS e FROM system.numbers LIMIT %d)`, run, id, n/2, n/2, reward, version, from, to-from)); err != nil {
			t.Fatal(err)
		}
	}
	insert(run, 0, n/2, 2, "(e % 13) / 4") // before the restart
	insert(run, n/2, n, 2, "(e % 13) / 4") // after it, from two servers
	insert(run, n/2, n/2+500, 3, "100")    // newer copies: their reward wins
	insert(run, n/4, n/4+500, 1, "-100")   // older copies: theirs loses
	insert("api-acmd", 0, 30_000, 2, "1")  // neighbours in the table's key
	insert("api-acmf", 0, 30_000, 2, "1")
	if err := conn.Exec(ctx, `INSERT INTO `+db+`.episodes (run_id, episode_id, idx, seed, requested_at, version)
		SELECT 'api-old', concat('api-old-', lower(hex(MD5(toString(number))))), number, number, toDateTime('2026-12-01 12:00:00'), 1
		FROM system.numbers LIMIT 30000`); err != nil {
		t.Fatal(err)
	}
	c := New(Config{ClickHouse: srv.Addr, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	rd, err := c.reader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for r, want := range map[string]bool{run: true, "api-acmd": true, "api-old": false, "api-none": true} {
		if keyed, err := rd.Keyed(ctx, r); err != nil || keyed != want {
			t.Errorf("run %s keyed: %v, %v; want %v", r, keyed, err, want)
		}
	}

	// Every page, by the reader: every episode once, in issue order, the newest copy.
	var all []EpisodeSummary
	after := ""
	for pages := 0; ; pages++ {
		if pages > n/200+1 {
			t.Fatalf("%d pages and no end", pages)
		}
		page, err := rd.EpisodesAfter(ctx, run, after, 200)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, page...)
		if len(page) < 200 {
			break
		}
		after = page[len(page)-1].EpisodeID
	}
	if len(all) != n {
		t.Fatalf("%d episodes paged, want %d", len(all), n)
	}
	for e, ep := range all {
		if ep.Seed != uint64(e) {
			t.Fatalf("episode %d of the pages is episode %d (%s)", e, ep.Seed, ep.EpisodeID)
		}
		if at, ok := runs.IssuedAt(run, ep.EpisodeID); !ok || at != t0+uint64(e)*1_000_000 {
			t.Fatalf("episode %s: issued at %d, %v; want %d", ep.EpisodeID, at, ok, t0+uint64(e)*1_000_000)
		}
		wantReward := float64(e%13) / 4
		if e >= n/2 && e < n/2+500 {
			wantReward = 100
		}
		if ep.TotalReward != wantReward {
			t.Fatalf("episode %d: reward %v, want %v (its newest copy)", e, ep.TotalReward, wantReward)
		}
	}

	// What a page costs, by the API, beside the page by rank of the same episodes.
	const granules, firstGranules = 5 * 8192, 8 * 8192
	for _, from := range []int{-1, 0, n / 4, n/2 - 100, n - 200, n - 50} {
		path := fmt.Sprintf("/console/api/runs/%s/episodes?limit=200", run)
		if from >= 0 {
			path += "&after=" + all[from].EpisodeID
		}
		rec, took, qc := serveCounted(t, c, conn, path)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body.String())
		}
		var page EpisodesPage
		if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		want := all[from+1 : min(from+201, n)]
		if !page.Keyed || len(page.Episodes) != len(want) || (len(want) > 0 && page.Episodes[0].EpisodeID != want[0].EpisodeID) {
			t.Fatalf("%s: keyed %v, %d episodes; want %d from %s", path, page.Keyed, len(page.Episodes), len(want), want[0].EpisodeID)
		}
		if wantNext := len(want) == 200; (page.Next != "") != wantNext || (wantNext && page.Next != want[199].EpisodeID) {
			t.Errorf("%s: next %q", path, page.Next)
		}
		most := granules
		if from < 0 {
			// The first page looks for the run's first id from a time before any,
			// reading the granule around each window it finds empty.
			most = firstGranules
		} else {
			// An offset past 0 is read by rank, as before the ids sorted.
			_, rankTook, rankCost := serveLogged(t, c, conn, fmt.Sprintf("/console/api/runs/%s/episodes?limit=200&offset=%d", run, from+1))
			t.Logf("by rank: %d rows read, %v", rankCost.readRows, rankTook)
		}
		t.Logf("after episode %d: %d queries, %d rows read, %v", from, qc.queries, qc.readRows, took)
		if qc.readRows > uint64(most) {
			t.Errorf("%s: %d queries read %d rows; want at most %d", path, qc.queries, qc.readRows, most)
		}
	}

	// The earlier form is paged by rank, and refuses a cursor.
	var page EpisodesPage
	getJSON(t, c, "/console/api/runs/api-old/episodes?offset=100&limit=50", &page)
	if page.Keyed || len(page.Episodes) != 50 || page.Episodes[0].Idx != 100 {
		t.Errorf("api-old: keyed %v, %d episodes", page.Keyed, len(page.Episodes))
	}
	for _, path := range []string{
		"/console/api/runs/api-old/episodes?after=api-old-00",
		"/console/api/runs/" + run + "/episodes?after=api-acme-0123",
		"/console/api/runs/" + run + "/episodes?after=" + all[5].EpisodeID + "&offset=3",
		"/console/api/runs/" + run + "/episodes?after=a%20b",
	} {
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "after") {
			t.Errorf("%s: status %d: %s; want 400 naming after", path, rec.Code, rec.Body.String())
		}
	}
}

// TestReplayReadsTheEpisodesGranules: the replay of the newest ended episode of a run
// being written reads the wide columns of its own steps' granules, not of a granule of
// every part of the steps table, and no granule of another time's partition.
//
// The table is laid out as a run in flight leaves it, merges stopped: 40 parts of the
// steps of episodes in flight (each episode's 7 steps in 7 consecutive parts, a step's
// observation 1 KB), after a merged part of the run's first 50,000 episodes, beside 30
// parts of a run of the day before whose ids sort before the run's. The key (episode_id,
// step) selects a granule of every one of those parts for the newest episode (ClickHouse
// 18.16's index has no upper bound on a part's last granule); before, the replay read
// every column of them (225 MB), and now the partition key leaves out the day before's.
func TestReplayReadsTheEpisodesGranules(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	const run, base, perPart, parts = "rlive", 50_000, 400, 40
	fillRun(t, conn, db, run, base)
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES"); err != nil {
		t.Fatal(err)
	}
	id := `concat(run, '-', substring(toString(10000000 + e), 2))`
	// observation is 1 KB of hex that does not compress, the same for every copy of a step.
	obs := `arrayStringConcat(arrayMap(x -> hex(MD5(concat(run, toString(e * 100 + s * 10 + x)))), range(32)))`
	insertSteps := func(run, day string, k int) {
		t.Helper()
		// Insert k: step k - w of each episode of window w (perPart episodes each), for
		// the 7 windows in flight.
		q := fmt.Sprintf(`INSERT INTO %s.steps (run_id, episode_id, step, requested_at, tool, args, observation, state_diff, reward, reward_names, reward_values, reward_spec, version)
		SELECT run, %s, toUInt32(s), toDateTime('%s'), 'catalog.search', '{"q":"x"}', %s, '[]', 0.25, ['task'], [0.25], 'default/1', 1
		FROM (SELECT '%s' AS run, %d + (%d - intDiv(number, %d)) * %d + number %% %d AS e, intDiv(number, %d) AS s FROM system.numbers LIMIT %d)
		WHERE e >= %d`, db, id, day, obs, run, base, k, perPart, perPart, perPart, perPart, 7*perPart, base)
		if err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("steps of part %d: %v", k, err)
		}
	}
	insertEpisodes := func(run, day string, from, to int) {
		t.Helper()
		if err := conn.Exec(ctx, fmt.Sprintf(`INSERT INTO %s.episodes (run_id, episode_id, idx, env, seed, policy, profile, requested_at, started_at, ended_at, steps, success, total_reward, reason, version)
		SELECT run, %s, e, 'shop', e, 'oracle', 'baseline', toDateTime('%s'), toDateTime('%s'), toDateTime('%s') + 1, 7, 1, 1.75, 'success', 1
		FROM (SELECT '%s' AS run, number + %d AS e FROM system.numbers LIMIT %d)`, db, id, day, day, day, run, from, to-from)); err != nil {
			t.Fatal(err)
		}
	}
	const today, yesterday = "2026-12-01 12:00:00", "2026-11-30 12:00:00"
	for k := range parts {
		insertSteps(run, today, k)
		// The episodes whose last step this part holds end with it.
		if w := k - 6; w >= 0 {
			insertEpisodes(run, today, base+w*perPart, base+(w+1)*perPart)
		}
	}
	// A run of the day before whose ids sort before the run's: the last granule of each
	// of its parts spans the newest episode's place too.
	for k := range 30 {
		insertSteps("rearly", yesterday, k)
	}
	newest := base + (parts-6)*perPart - 1
	c := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun(run, 1_000_000), CacheFrom: 1 << 62},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	for _, e := range []int{newest, base + 10*perPart + 7, base - 1} {
		path := fmt.Sprintf("/console/api/episodes/%s-%07d?from=0&limit=100", run, e)
		// Two queries: the episode, by its whole key (its run is planned), then its steps.
		rec, took, qc := serveLoggedN(t, c, conn, path, 2)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body.String())
		}
		var page EpisodePage
		if err := json.Unmarshal(rec.Body.Bytes(), &page); err != nil {
			t.Fatal(err)
		}
		t.Logf("episode %d: %d queries, %d rows, %d bytes, %d granules read, %v", e, qc.queries, qc.readRows, qc.readBytes, qc.marks, took)
		// The page is the episode's: its 7 steps, each one copy, with its own observation.
		var want []string
		if err := conn.QueryRow(ctx, fmt.Sprintf(`SELECT groupArray(o) FROM (SELECT observation AS o FROM %s.steps FINAL
			WHERE episode_id = '%s-%07d' ORDER BY step)`, db, run, e)).Scan(&want); err != nil {
			t.Fatal(err)
		}
		if page.Episode == nil || page.Episode.Idx != uint64(e) || len(page.Steps) != 7 || len(want) != 7 {
			t.Fatalf("%s: episode %+v, %d steps (%d recorded); want episode %d and its 7 steps", path, page.Episode, len(page.Steps), len(want), e)
		}
		for i, s := range page.Steps {
			if s.Step != uint32(i) || s.Observation != want[i] {
				t.Errorf("%s: step %d is step %d with observation %.20q…; want %.20q…", path, i, s.Step, s.Observation, want[i])
			}
		}
		// The key's and the partition key's columns of every granule the keys select
		// (about 20 bytes a row), and the other columns of the episode's own rows; not a
		// granule's worth of observations from every part (7 parts hold the episode's
		// steps, 1.2 MB of observations each).
		most := 32*qc.readRows + 1<<20
		if qc.readBytes > most {
			t.Errorf("%s: %d queries read %d bytes (%d rows, %d granules); want at most %d", path, qc.queries, qc.readBytes, qc.readRows, qc.marks, most)
		}
		// Granules: at most one of each part of the run in each table (its merged part
		// and the 40 parts written after), none of the day before's.
		if qc.marks > 2*(parts+1) {
			t.Errorf("%s: %d granules selected; want at most %d, none of the parts of the day before", path, qc.marks, 2*(parts+1))
		}
	}
}
