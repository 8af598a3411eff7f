package console

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// insertEpisodes inserts episodes from to to-1 of runID as fillRun does (with their
// faults, without steps), with version; infra is the SQL of which are infra errors
// ("": fillRun's, one in a thousand), skip of which to leave out ("": none).
func insertEpisodes(t *testing.T, conn driver.Conn, db, runID string, from, to int, version uint64, infra, skip string) {
	t.Helper()
	ctx := context.Background()
	id := `concat('` + runID + `', '-', substring(toString(10000000 + e), 2))`
	numbers := fmt.Sprintf(`(SELECT number + %d AS e FROM system.numbers LIMIT %d)`, from, to-from)
	where := "1"
	if skip != "" {
		where = "NOT (" + skip + ")"
	}
	inf := "toUInt8(e % 1000 = 999)"
	if infra != "" {
		inf = "toUInt8(" + infra + ")"
	}
	stmts := []string{
		`INSERT INTO ` + db + `.faults (run_id, episode_id, step, seq, requested_at, kind, target, detail, version)
		SELECT '` + runID + `', ` + id + `, toUInt32(f), 0, toDateTime('2026-12-01 12:00:00'), if(f = 1, 'latency', 'http_error'),
			if(f = 2, 'db/query', 'api/search'), '', 1
		FROM (SELECT e, f FROM ` + numbers + ` ARRAY JOIN [0, 1, 2] AS f) WHERE e % 5 < 2 AND ` + where,
		fmt.Sprintf(`INSERT INTO `+db+`.episodes (run_id, episode_id, idx, env, seed, policy, profile, requested_at, started_at, ended_at,
			steps, success, total_reward, infra_error, infra_kind, faults_fired, reason, version)
		SELECT '`+runID+`', `+id+`, e, 'shop', e, 'oracle', if(e %% 5 < 2, 'stress', 'baseline'),
			toDateTime('2026-12-01 12:00:00'), toDateTime('2026-12-01 12:00:00') + intDiv(e, 1000), toDateTime('2026-12-01 12:00:01') + intDiv(e, 1000) + %d,
			7, toUInt8(e %% 10 != 3 AND NOT %s), if(%s, 0, (e %% 13) / 4), %s, if(%s, 'sandbox', ''), if(e %% 5 < 2, 3, 0), 'success', %d
		FROM `+numbers+` WHERE `+where, version, inf, inf, inf, inf, version),
	}
	for _, s := range stmts {
		if err := conn.Exec(ctx, s); err != nil {
			t.Fatalf("insert episodes %d-%d of %s: %v", from, to, runID, err)
		}
	}
}

// getJSON serves path from c and decodes its answer into v.
func getJSON(t *testing.T, c *Console, path string, v any) {
	t.Helper()
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("%s: status %d: %s", path, rec.Code, rec.Body.String())
	}
	if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// utc puts a page's times in UTC, so pages read and folded compare equal.
func utc(s *RunSummary, points []Point) {
	s.First, s.Last = s.First.UTC(), s.Last.UTC()
	for i := range points {
		points[i].LastEnded = points[i].LastEnded.UTC()
	}
}

// TestFoldedReportEqualsTheReads: a large planned run's report and fault heatmap, folded
// (fold.go), equal the same pages read whole (reader.go), field by field, while the run
// goes on: episodes ending past the watermark, stragglers below it, an infra error below
// it retried and ending scored, a stale infra-error end arriving after a scored end, and
// redelivered copies.
func TestFoldedReportEqualsTheReads(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	ctx := context.Background()
	const db = testDB
	const planned = 5 * foldChunk
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// Nothing kept: every answer is computed when asked.
	folded := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rf", planned), CacheFrom: 1 << 62, FoldFrom: 1}, quiet)
	defer folded.Close()
	folded.folds.recheck = 0 // every answer reads the pending infra errors
	read := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rf", planned), CacheFrom: 1 << 62, FoldFrom: 1 << 62}, quiet)
	defer read.Close()
	// A fold reading one chunk past its watermark at a time.
	windowed := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rf", planned), CacheFrom: 1 << 62, FoldFrom: 1}, quiet)
	defer windowed.Close()
	windowed.folds.recheck, windowed.folds.window = 0, foldChunk
	same := func(stage string) {
		t.Helper()
		for _, fc := range []*Console{folded, windowed} {
			var fr, rr RunPage
			getJSON(t, fc, "/console/api/runs/rf", &fr)
			getJSON(t, read, "/console/api/runs/rf", &rr)
			utc(&fr.Run, fr.Series)
			utc(&rr.Run, rr.Series)
			if !reflect.DeepEqual(fr, rr) {
				t.Errorf("%s: run page folded (window %d)\n%+v\nread\n%+v", stage, fc.folds.window, fr, rr)
			}
			var fh, rh HeatmapPage
			getJSON(t, fc, "/console/api/runs/rf/faults", &fh)
			getJSON(t, read, "/console/api/runs/rf/faults", &rh)
			utc(&fh.Run, nil)
			utc(&rh.Run, nil)
			if !reflect.DeepEqual(fh, rh) || len(fh.Cells) == 0 {
				t.Errorf("%s: heatmap folded (window %d)\n%+v\nread\n%+v", stage, fc.folds.window, fh, rh)
			}
		}
		// The pages of episodes by index (newest version of each, without FINAL) and an
		// episode alone equal the same episodes read with FINAL, over the retried, stale
		// and redelivered episodes.
		rd, err := read.reader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, off := range []int{0, foldChunk} {
			final, err := rd.episodesWhere(ctx, "rf", `FINAL WHERE run_id = ? AND idx >= ? AND idx < ? ORDER BY idx, episode_id`, "rf", off, off+MaxEpisodes)
			if err != nil {
				t.Fatal(err)
			}
			byIdx, err := rd.EpisodesFrom(ctx, "rf", off, MaxEpisodes)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(final, byIdx) {
				t.Errorf("%s: episodes from %d by index differ from those read with FINAL", stage, off)
			}
		}
		for _, idx := range []uint64{10, 550, 999, foldChunk + 1} {
			id := fmt.Sprintf("rf-%07d", idx)
			final, err := rd.episodesWhere(ctx, "rf", `FINAL WHERE run_id = ? AND episode_id = ?`, "rf", id)
			if err != nil {
				t.Fatal(err)
			}
			for _, run := range []string{"", "rf"} { // its run looked for, or known
				one, err := rd.Episode(ctx, id, run)
				if err != nil {
					t.Fatal(err)
				}
				if (one == nil) != (len(final) == 0) || one != nil && *one != final[0] {
					t.Errorf("%s: episode %s alone (run %q): %+v; read with FINAL %+v", stage, id, run, one, final)
				}
			}
		}
	}
	// Two chunks ended, but for 100 stragglers; the run has moved past the third.
	insertEpisodes(t, conn, db, "rf", 0, 2*foldChunk, 1, "", "e >= 500 AND e < 600")
	insertEpisodes(t, conn, db, "rf", 2*foldChunk, 3*foldChunk+200, 1, "", "")
	same("first look")
	f := folded.folds.get("rf", planned)
	if f.next == 0 || len(f.pending) < 100 {
		t.Fatalf("the fold's watermark is at %d with %d pending; want chunks folded and the stragglers pending", f.next, len(f.pending))
	}
	// Past the watermark, and a chunk more.
	insertEpisodes(t, conn, db, "rf", 3*foldChunk+200, 4*foldChunk+300, 1, "", "")
	same("more episodes")
	// Copies stay apart, as in a table being written: FINAL and the newest version must
	// choose among them.
	if err := conn.Exec(ctx, "SYSTEM STOP MERGES"); err != nil {
		t.Fatal(err)
	}
	// The stragglers end; infra error 999 is retried and ends scored, later (a higher
	// version); a stale infra-error end of a folded, scored episode arrives after it;
	// a chunk is redelivered.
	insertEpisodes(t, conn, db, "rf", 500, 600, 1, "", "")
	insertEpisodes(t, conn, db, "rf", 999, 1000, 5, "0", "")
	insertEpisodes(t, conn, db, "rf", 10, 11, 0, "1", "")
	insertEpisodes(t, conn, db, "rf", foldChunk, 2*foldChunk, 1, "", "")
	same("stragglers, a retry, a stale end, redeliveries")
	if _, ok := f.pending["rf-0000999"]; ok {
		t.Error("episode 999 ended scored but is still pending")
	}
	// The rest of the run.
	insertEpisodes(t, conn, db, "rf", 4*foldChunk+300, planned, 1, "", "")
	same("every episode ended")
	if f.next != planned {
		t.Errorf("the watermark is at %d of %d; want the whole run folded", f.next, planned)
	}
	if w := windowed.folds.get("rf", planned); w.next != planned {
		t.Errorf("the windowed fold's watermark is at %d of %d; want the whole run folded", w.next, planned)
	}
}

// TestFoldServesConcurrentReaders: the run page and the heatmap of one folded run, asked
// for at once by several readers while the run goes on, share its fold: a refresh must
// not change what another answer is being computed from (go test -race).
func TestFoldServesConcurrentReaders(t *testing.T) {
	srv, conn := migratedClickHouse(t)
	const db = testDB
	const planned = 6 * foldChunk
	c := New(Config{ClickHouse: srv.Addr, Database: db, Progress: plannedRun("rc", planned), CacheFrom: 1 << 62, FoldFrom: 1},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	insertEpisodes(t, conn, db, "rc", 0, foldChunk, 1, "", "")
	done, stop := make(chan error), make(chan struct{})
	const readers = 4
	for r := range readers {
		go func() {
			var err error
			for i := 0; ; i++ {
				select {
				case <-stop:
					done <- err
					return
				default:
				}
				path := "/console/api/runs/rc"
				if (r+i)%2 == 1 {
					path += "/faults"
				}
				rec := httptest.NewRecorder()
				c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != http.StatusOK && err == nil {
					err = fmt.Errorf("%s: status %d: %s", path, rec.Code, rec.Body.String())
				}
			}
		}()
	}
	for k := 1; k < 6; k++ {
		for part := range 4 { // in quarters: each look finds something new
			from := k*foldChunk + part*foldChunk/4
			insertEpisodes(t, conn, db, "rc", from, from+foldChunk/4, 1, "", "")
		}
	}
	close(stop)
	for range readers {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}
