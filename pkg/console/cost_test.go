package console

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
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

// queryCost is what ClickHouse read for the queries of one console request.
type queryCost struct {
	queries  uint64
	readRows uint64
}

// consoleCost serves path from c with every query logged under one query id, and
// returns the status, the time it took and what ClickHouse read for it (system.query_log).
func consoleCost(t testing.TB, c *Console, conn driver.Conn, path string) (int, time.Duration, queryCost) {
	t.Helper()
	qid := fmt.Sprintf("console-cost-%d", time.Now().UnixNano())
	ctx := clickhouse.Context(context.Background(), clickhouse.WithQueryID(qid),
		clickhouse.WithSettings(clickhouse.Settings{"log_queries": 1}))
	rec := httptest.NewRecorder()
	start := time.Now()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx))
	took := time.Since(start)
	if err := conn.Exec(context.Background(), "SYSTEM FLUSH LOGS"); err != nil {
		t.Fatal(err)
	}
	var qc queryCost
	if err := conn.QueryRow(context.Background(), `SELECT count(), sum(read_rows) FROM system.query_log
		WHERE query_id = ? AND type = 2`, qid).Scan(&qc.queries, &qc.readRows); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusOK {
		t.Errorf("%s: status %d: %s", path, rec.Code, rec.Body.String())
	}
	return rec.Code, took, qc
}

// TestConsoleCostOfALargeRun prints, for a run of CONSOLE_COST_EPISODES episodes (skipped
// without it), each console request's time and the rows ClickHouse read for it: the
// figures behind docs/benchmarks.md's console section, measured without the pipeline.
func TestConsoleCostOfALargeRun(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CONSOLE_COST_EPISODES"))
	if n <= 0 {
		t.Skip("set CONSOLE_COST_EPISODES to the run's size")
	}
	srv := chtest.Start(t)
	ctx := context.Background()
	const db = "gauntlet"
	conn, err := trajectory.Connect(ctx, srv.Addr(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := trajectory.Migrate(ctx, conn, db); err != nil {
		t.Fatal(err)
	}
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
