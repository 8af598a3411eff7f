package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory/export"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestBadExportCommandLines(t *testing.T) {
	for _, args := range [][]string{
		{"episode", "export"},
		{"episode", "export", "a", "b"},
		{"episode", "export", "--format", "csv", "ep"},
		{"episode", "export", "bad id!"},
	} {
		var out, errOut bytes.Buffer
		if err := runMain(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%q: accepted", args)
		}
	}
}

// TestExportRoundTripsRecordedSteps: an episode recorded in ClickHouse, exported as ATIF
// and as JSONL by the CLI, reads back into exactly the rows ClickHouse holds.
func TestExportRoundTripsRecordedSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	cfg := testConfig(t)
	s := startStack(t, cfg)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	req := newRun(t, 4, "random=1", 5)
	req.Profiles = []*gauntletv1.Share{{Name: "stress", Weight: 1}}
	runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
	id := queryOne(t, conn, fmt.Sprintf(`SELECT min(episode_id) FROM %s.episodes FINAL WHERE run_id = '%s' AND steps >= 3`, cfg.Database, req.RunId))

	ctx := context.Background()
	wantEp, err := trajectory.Episode(ctx, conn, cfg.Database, id)
	if err != nil {
		t.Fatal(err)
	}
	wantSteps, err := trajectory.EpisodeSteps(ctx, conn, cfg.Database, id)
	if err != nil {
		t.Fatal(err)
	}
	if len(wantSteps) < 3 {
		t.Fatalf("episode %s has %d steps", id, len(wantSteps))
	}
	wantEp, wantSteps = utcRows(wantEp, wantSteps)

	dir := t.TempDir()
	cli := []string{"--clickhouse", s.app.clickHouseAddr(), "--database", cfg.Database, "--data-dir", t.TempDir()}
	for _, format := range []string{"atif", "jsonl"} {
		file := filepath.Join(dir, "export."+format)
		var stdout, stderr bytes.Buffer
		args := append([]string{"episode", "export", id, "--format", format, "-o", file}, cli...)
		if err := runMain(ctx, args, &stdout, &stderr); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stderr.String())
		}
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		var gotEp trajectory.EpisodeRow
		var gotSteps []trajectory.StepRow
		if format == "atif" {
			tr, err := export.ReadATIF(f)
			if err != nil {
				t.Fatal(err)
			}
			if tr.SessionID != id || len(tr.Steps) != len(wantSteps) || tr.Steps[0].ToolCalls[0].FunctionName != wantSteps[0].Tool {
				t.Errorf("ATIF trajectory: session %s, %d steps", tr.SessionID, len(tr.Steps))
			}
			gotEp, gotSteps, err = export.FromATIF(tr)
			if err != nil {
				t.Fatal(err)
			}
		} else {
			gotEp, gotSteps, err = export.ReadJSONL(f)
			if err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		gotEp, gotSteps = utcRows(gotEp, gotSteps)
		if !reflect.DeepEqual(gotEp, wantEp) {
			t.Errorf("%s: episode row\n got %+v\nwant %+v", format, gotEp, wantEp)
		}
		if !reflect.DeepEqual(gotSteps, wantSteps) {
			for i := range min(len(gotSteps), len(wantSteps)) {
				if !reflect.DeepEqual(gotSteps[i], wantSteps[i]) {
					t.Errorf("%s: step %d\n got %+v\nwant %+v", format, i, gotSteps[i], wantSteps[i])
					break
				}
			}
			t.Errorf("%s: %d steps read back, %d recorded", format, len(gotSteps), len(wantSteps))
		}
	}

	var stdout, stderr bytes.Buffer
	if err := runMain(ctx, append([]string{"episode", "export", "no-such-episode"}, cli...), &stdout, &stderr); err == nil ||
		!strings.Contains(err.Error(), "no-such-episode") {
		t.Errorf("export of an unknown episode: %v", err)
	}
}

// utcRows drops the time zones ClickHouse attaches, which JSON does not carry: the
// instants are compared.
func utcRows(ep trajectory.EpisodeRow, steps []trajectory.StepRow) (trajectory.EpisodeRow, []trajectory.StepRow) {
	ep.RequestedAt, ep.StartedAt, ep.EndedAt = ep.RequestedAt.UTC(), ep.StartedAt.UTC(), ep.EndedAt.UTC()
	out := make([]trajectory.StepRow, len(steps))
	for i, s := range steps {
		s.RequestedAt = s.RequestedAt.UTC()
		out[i] = s
	}
	return ep, out
}
