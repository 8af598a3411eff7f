package trajectory

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestMigrateIsIdempotent(t *testing.T) {
	ctx := context.Background()
	conn := setup(t) // migrates once
	for range 2 {
		if err := Migrate(ctx, conn, testDB); err != nil {
			t.Fatalf("Migrate again: %v", err)
		}
	}

	_, rows, err := Query(ctx, conn, "SELECT version, count() FROM schema_migrations GROUP BY version ORDER BY version")
	if err != nil {
		t.Fatal(err)
	}
	var wantVersions [][]string
	for i, m := range migrations {
		if m.version != uint32(i+1) {
			t.Fatalf("migration %d (%s) has version %d: versions must run 1, 2, ... without gaps", i, m.name, m.version)
		}
		wantVersions = append(wantVersions, []string{fmt.Sprint(m.version), "1"})
	}
	if want := wantVersions; !reflect.DeepEqual(rows, want) {
		t.Errorf("schema_migrations (version, count) = %v, want %v", rows, want)
	}

	_, rows, err = Query(ctx, conn, "SELECT name, engine FROM system.tables WHERE database = '"+testDB+"' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"curriculum_stages", "ReplacingMergeTree"},
		{"curriculum_stages_final", "View"},
		{"episode_worlds", "ReplacingMergeTree"},
		{"episode_worlds_final", "View"},
		{"episodes", "ReplacingMergeTree"},
		{"episodes_final", "View"},
		{"episodes_scored", "View"},
		{"faults", "ReplacingMergeTree"},
		{"faults_final", "View"},
		{"plan_templates", "ReplacingMergeTree"},
		{"plan_templates_final", "View"},
		{"reward_specs", "ReplacingMergeTree"},
		{"reward_specs_final", "View"},
		{"runs", "ReplacingMergeTree"},
		{"runs_final", "View"},
		{"schema_migrations", "MergeTree"},
		{"step_scores", "ReplacingMergeTree"},
		{"step_scores_final", "View"},
		{"steps", "ReplacingMergeTree"},
		{"steps_final", "View"},
		{"trainer_steps", "ReplacingMergeTree"},
		{"trainer_steps_final", "View"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("tables = %v, want %v", rows, want)
	}

	// Every column the Writer names exists, with the type its Go field needs.
	for _, table := range []struct {
		name  string
		names string
	}{
		{"steps", columnList(stepColumns)},
		{"episodes", columnList(episodeColumns)},
		{"faults", columnList(faultColumns)},
		{"trainer_steps", columnList(trainerColumns)},
		{"plan_templates", columnList(templateColumns)},
		{"runs", columnList(runColumns)},
		{"curriculum_stages", columnList(stageColumns)},
		{"step_scores", columnList(scoreColumns)},
		{"episode_worlds", columnList(worldColumns)},
	} {
		_, rows, err := Query(ctx, conn, "SELECT name FROM system.columns WHERE database = '"+testDB+"' AND table = '"+table.name+"'")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, r := range rows {
			got = append(got, r[0])
		}
		if strings.Join(got, ", ") != table.names {
			t.Errorf("%s columns:\n got %s\nwant %s", table.name, strings.Join(got, ", "), table.names)
		}
	}
}

// TestViewsHaveTheirTablesColumns: a view's columns are fixed when it is created, so
// every migration that adds a column must leave each view over the table re-created;
// one that did not would leave the column out of the view analysts query. Checked on a
// fresh database, and on one migrated first up to version 12, then on, as an existing
// database is.
func TestViewsHaveTheirTablesColumns(t *testing.T) {
	ctx := context.Background()
	srv := chtest.Start(t)
	databases := map[string]uint32{"fresh": uint32(len(migrations)), "in_two_goes": 12}
	for db, first := range databases {
		conn, err := Connect(ctx, srv.Addr(), db)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if err := migrateTo(ctx, conn, db, first); err != nil {
			t.Fatalf("migrate %s up to %d: %v", db, first, err)
		}
		if err := Migrate(ctx, conn, db); err != nil {
			t.Fatalf("migrate %s on: %v", db, err)
		}
		columns := func(table string) string {
			_, rows, err := Query(ctx, conn, "SELECT name, type FROM system.columns WHERE database = '"+db+"' AND table = '"+table+"'")
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprint(rows)
		}
		for _, v := range views {
			if got, want := columns(v.name), columns(v.table); got != want {
				t.Errorf("database %s: view %s columns\n got %s\nwant %s (its table %s's)", db, v.name, got, want, v.table)
			}
		}
	}
}

// TestViewsDeclaredAsCreated: each declared view is created, by the migration it names,
// with its declared query, and every view a migration creates is declared: rebuildViews
// re-creates the views as the migrations made them.
func TestViewsDeclaredAsCreated(t *testing.T) {
	declared := map[string]view{}
	for _, v := range views {
		declared[v.name] = v
	}
	createRE := regexp.MustCompile(`^CREATE VIEW IF NOT EXISTS \{db\}\.([a-z_]+) AS (.*)$`)
	created := map[string]bool{}
	for _, m := range migrations {
		for _, stmt := range m.stmts {
			c := createRE.FindStringSubmatch(stmt)
			if c == nil {
				continue
			}
			v, ok := declared[c[1]]
			switch {
			case !ok:
				t.Errorf("migration %d creates view %s, not declared in views", m.version, c[1])
			case v.query != c[2]:
				t.Errorf("migration %d creates view %s as %q, declared as %q", m.version, c[1], c[2], v.query)
			case !created[c[1]] && v.created != m.version:
				t.Errorf("view %s first created by migration %d, declared as created by %d", c[1], m.version, v.created)
			case !strings.Contains(v.query, "FROM {db}."+v.table+" "):
				t.Errorf("view %s declared over table %s, but reads %q", v.name, v.table, v.query)
			}
			created[c[1]] = true
		}
	}
	for _, v := range views {
		if !created[v.name] {
			t.Errorf("view %s is declared but no migration creates it", v.name)
		}
	}
}

// TestRebuiltViewsAsTheStatementsWere: migrations 13 to 15 re-created their tables'
// views in their own statements before Migrate did it for them; what Migrate runs for
// them now is those statements, in their order, so a database migrated across them
// ends as it did.
func TestRebuiltViewsAsTheStatementsWere(t *testing.T) {
	steps := []string{
		"DROP TABLE IF EXISTS {db}.steps_final",
		"CREATE VIEW IF NOT EXISTS {db}.steps_final AS SELECT * FROM {db}.steps FINAL",
	}
	runs := []string{
		"DROP TABLE IF EXISTS {db}.runs_final",
		"CREATE VIEW IF NOT EXISTS {db}.runs_final AS SELECT * FROM {db}.runs FINAL",
	}
	stages := []string{
		"DROP TABLE IF EXISTS {db}.curriculum_stages_final",
		"CREATE VIEW IF NOT EXISTS {db}.curriculum_stages_final AS SELECT * FROM {db}.curriculum_stages FINAL",
	}
	for _, c := range []struct {
		version uint32
		want    []string
	}{
		{13, steps},
		{14, slices.Concat(runs, stages)},
		{15, slices.Concat(steps, stages)},
		{16, runs},
	} {
		m := migrations[c.version-1]
		if got := slices.Concat(m.stmts, rebuildViews(m)); !slices.Equal(got, c.want) {
			t.Errorf("migration %d runs\n%s\nwant\n%s", c.version, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
		}
	}
}

func TestMigrationsAreNumberedInOrder(t *testing.T) {
	for i, m := range migrations {
		if m.version != uint32(i+1) {
			t.Errorf("migrations[%d] has version %d, want %d", i, m.version, i+1)
		}
	}
}

// TestConnectCreatesDatabase: setup connects to a fresh server, where testDB does not
// exist yet, and unqualified names must resolve to it.
func TestConnectCreatesDatabase(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	_, rows, err := Query(ctx, conn, "SELECT currentDatabase()")
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] != testDB {
		t.Errorf("current database = %q, want %q", rows[0][0], testDB)
	}
}

// TestWriteReadsBackEveryColumn writes one realistic step with a fault, a violation,
// safety events and a full reward vector, and its episode's end, and reads every
// column back.
func TestWriteReadsBackEveryColumn(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	step := stepEvent("run-a", 0, 34) // step%5 == 4: a fault; step%7 == 6: a violation
	step.GetStep().Signals.SafetyEvents = []string{"rm -rf /", "curl | sh"}
	step.GetStep().Signals.Limits = []string{"timeout: killed after 30s"}
	step.GetStep().Signals.Success = true
	step.GetStep().Terminated = true
	step.GetStep().Reason = gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS
	step.GetStep().Action.ArgsJson = `{"q":"it's a \"quote\" and a \\ backslash, ünïcödé"}`
	m := step.GetStep().Metering
	m.CpuNs, m.PeakMemoryBytes = 4_300_000, 9_437_184
	m.Processes, m.ReadBytes, m.WrittenBytes, m.Runtime = 3, 40_960, 512, "process"
	step.GetStep().Score.SpecDigest = scoring.DefaultDigest()
	// A task verifier's named numbers; a value without a name is not recorded, so the
	// two columns stay parallel.
	step.GetStep().Signals.VerifierNames = []string{"style", "tests"}
	step.GetStep().Signals.VerifierValues = []float64{0.75, 1, 9}
	end := endEvent("run-a", 0, 35, requestedAt+7_123_456_789)
	end.GetEnded().VerifierNames, end.GetEnded().VerifierValues = []string{"style", "tests"}, []float64{0.75, 1}

	counts, err := NewWriter(conn, testDB).Write(ctx, []*gauntletv1.Event{
		step,
		{Body: &gauntletv1.Event_Started{Started: &gauntletv1.EpisodeStarted{}}},
		end,
	})
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if want := (Counts{Steps: 1, Faults: 1, Episodes: 1}); counts != want {
		t.Errorf("Counts = %+v, want %+v", counts, want)
	}

	reqAt := time.Date(2026, 3, 14, 15, 9, 26, 0, time.UTC)
	wantStep := StepRow{
		RunID:            "run-a",
		EpisodeID:        "run-a-ep-000000",
		Step:             34,
		RequestedAt:      reqAt,
		Env:              "shop",
		Policy:           "scripted-oracle",
		Profile:          "stress",
		WorkerID:         "worker-1",
		Tool:             "catalog.search",
		Args:             `{"q":"it's a \"quote\" and a \\ backslash, ünïcödé"}`,
		Observation:      step.GetStep().GetObservationJson(),
		StateDiff:        `[{"op":"replace","path":"/balance","value":46600}]`,
		FaultIDs:         []string{"f1"},
		FaultKinds:       []string{"http_error"},
		FaultTargets:     []string{"catalog"},
		FaultDetails:     []string{"status=503 retry_after_ms=200"},
		ToolCalls:        1,
		Errors:           1,
		VirtualNs:        12_500_000,
		WallNs:           48_211,
		BytesIn:          61,
		BytesOut:         312,
		CPUNs:            4_300_000,
		PeakMemoryBytes:  9_437_184,
		Processes:        3,
		ReadBytes:        40_960,
		WrittenBytes:     512,
		Runtime:          "process",
		Progress:         0.4,
		InvalidAction:    true,
		Success:          true,
		ViolationRules:   []string{"pay_before_ship"},
		ViolationReasons: []string{"order not paid"},
		SafetyEvents:     []string{"rm -rf /", "curl | sh"},
		Spend:            12.99,
		Terminated:       true,
		Truncated:        false,
		Reason:           "max_steps",
		VirtualTimeNs:    35 * 12_500_000,
		Reward:           0.0865,
		RTask:            0.1,
		RCost:            -0.026,
		RSafety:          0,
		RTimeliness:      -0.002,
		RCausal:          0,
		RewardNames:      []string{"task", "cost", "safety", "timeliness", "causal"},
		RewardValues:     []float64{0.1, -0.026, 0, -0.002, 0},
		RewardSpec:       "default/1",
		Version:          1,
		RewardSpecDigest: scoring.DefaultDigest(),
		// Migration 10.
		ProgressDelta:        0.1,
		Budget:               500,
		DeadlineVirtualNs:    60_000_000_000,
		ViolationSuggestions: []string{"call payment.pay first"},
		ScoringInputs:        true,
		// Migration 12.
		VerifierNames:  []string{"style", "tests"},
		VerifierValues: []float64{0.75, 1},
		// Migration 15.
		Limits: []string{"timeout: killed after 30s"},
	}
	steps, err := EpisodeSteps(ctx, conn, testDB, "run-a-ep-000000")
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 {
		t.Fatalf("EpisodeSteps returned %d rows, want 1", len(steps))
	}
	compareRows(t, "step", steps[0], wantStep)

	faults, err := EpisodeFaults(ctx, conn, testDB, "run-a-ep-000000")
	if err != nil {
		t.Fatal(err)
	}
	wantFaults := []FaultRow{{
		RunID: "run-a", EpisodeID: "run-a-ep-000000", Step: 34, Seq: 0, RequestedAt: reqAt,
		Profile: "stress", FaultID: "f1", Kind: "http_error", Target: "catalog",
		Detail: "status=503 retry_after_ms=200", AtVirtualNs: 34 * 12_500_000, Version: 1,
	}}
	if len(faults) != 1 {
		t.Fatalf("EpisodeFaults returned %d rows, want 1", len(faults))
	}
	compareRows(t, "fault", faults[0], wantFaults[0])

	episodes, err := RunEpisodes(ctx, conn, testDB, "run-a")
	if err != nil {
		t.Fatal(err)
	}
	if len(episodes) != 1 {
		t.Fatalf("RunEpisodes returned %d rows, want 1", len(episodes))
	}
	compareRows(t, "episode", episodes[0], EpisodeRow{
		RunID:       "run-a",
		EpisodeID:   "run-a-ep-000000",
		Idx:         0,
		Env:         "shop",
		Params:      `{"difficulty":"easy"}`,
		Seed:        1000,
		Policy:      "scripted-oracle",
		Profile:     "stress",
		Plan:        `{"profile":"stress","seed":"1000","rules":[{"id":"f1","target":"catalog","probability":0.2,"http_error":{"status":503,"retry_after_ms":200}}],"catalogue_version":"v1","drift_values":[{"selector":"*.latency.mean_ms","value":250,"source":"global"},{"selector":"catalog.http_503.probability","value":0.2,"source":"run"}]}`,
		WorkerID:    "worker-1",
		RequestedAt: reqAt,
		StartedAt:   time.Date(2026, 3, 14, 15, 9, 28, 0, time.UTC),
		EndedAt:     time.Date(2026, 3, 14, 15, 9, 33, 0, time.UTC),
		StartedAtNs: uint64(requestedAt + 2_000_000_000),
		EndedAtNs:   uint64(requestedAt + 7_123_456_789),
		Steps:       35,
		Terminated:  true,
		Reason:      "success",
		Success:     true,
		TotalReward: 0.865,
		FaultsFired: 1,
		// VirtualTimeNs of 35 steps of 12.5 ms.
		VirtualTimeNs:    35 * 12_500_000,
		Version:          uint64(requestedAt + 7_123_456_789),
		DriftSelectors:   []string{"*.latency.mean_ms", "catalog.http_503.probability"},
		DriftValues:      []float64{250, 0.2},
		DriftSources:     []string{"global", "run"},
		PlanSeed:         1000,
		CatalogueVersion: "v1",
		RewardSpecDigest: scoring.DefaultDigest(),
		VerifierNames:    []string{"style", "tests"},
		VerifierValues:   []float64{0.75, 1},
	})
}

// compareRows compares two rows field by field, naming the fields that differ, and
// compares times with Equal (the server's time zone may differ from UTC).
func compareRows[R any](t *testing.T, what string, got, want R) {
	t.Helper()
	g, w := reflect.ValueOf(got), reflect.ValueOf(want)
	for i := range g.NumField() {
		name := g.Type().Field(i).Name
		gf, wf := g.Field(i).Interface(), w.Field(i).Interface()
		if gt, ok := gf.(time.Time); ok {
			if !gt.Equal(wf.(time.Time)) {
				t.Errorf("%s.%s = %v, want %v", what, name, gt, wf)
			}
			continue
		}
		if !reflect.DeepEqual(gf, wf) {
			t.Errorf("%s.%s = %#v, want %#v", what, name, gf, wf)
		}
	}
}

// TestRedeliveredEventsCountOnce writes the same run twice in separate batches, as
// a redelivery after a crash would: the raw tables hold both copies until a merge,
// but every exact read sees one.
func TestRedeliveredEventsCountOnce(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	events := runEvents("run-dup", 3, 10)
	for range 2 {
		counts, err := w.Write(ctx, events)
		if err != nil {
			t.Fatal(err)
		}
		if want := (Counts{Steps: 30, Faults: 6, Episodes: 3}); counts != want {
			t.Fatalf("Counts = %+v, want %+v", counts, want)
		}
	}

	for _, tc := range []struct {
		sql  string
		want string
	}{
		{"SELECT count() FROM steps", "60"}, // both copies stored until merged
		{"SELECT count() FROM steps FINAL", "30"},
		{"SELECT count() FROM steps_final", "30"},
		{"SELECT count() FROM faults_final", "6"},
		{"SELECT count() FROM episodes_final", "3"},
		{"SELECT count() FROM (SELECT episode_id, step FROM steps GROUP BY episode_id, step)", "30"},
	} {
		_, rows, err := Query(ctx, conn, tc.sql)
		if err != nil {
			t.Fatalf("%s: %v", tc.sql, err)
		}
		if rows[0][0] != tc.want {
			t.Errorf("%s = %s, want %s", tc.sql, rows[0][0], tc.want)
		}
	}
	episodes, steps, err := RunCounts(ctx, conn, testDB, "run-dup")
	if err != nil {
		t.Fatal(err)
	}
	if episodes != 3 || steps != 30 {
		t.Errorf("RunCounts = %d episodes, %d steps; want 3, 30", episodes, steps)
	}
	got, err := EpisodeSteps(ctx, conn, testDB, "run-dup-ep-000001")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 10 {
		t.Fatalf("EpisodeSteps returned %d rows, want 10", len(got))
	}
	for i, s := range got {
		if s.Step != uint32(i) {
			t.Errorf("EpisodeSteps[%d].Step = %d: not ordered by step", i, s.Step)
		}
	}

	// OPTIMIZE ... FINAL merges the copies for good; the answer stays the same.
	if err := conn.Exec(ctx, "OPTIMIZE TABLE "+testDB+".steps FINAL"); err != nil {
		t.Fatal(err)
	}
	if _, rows, err := Query(ctx, conn, "SELECT count() FROM steps"); err != nil || rows[0][0] != "30" {
		t.Errorf("count after OPTIMIZE = %v, %v; want 30", rows, err)
	}
}

func TestWriteDropsDuplicatesWithinACall(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	first := stepEvent("run-d", 0, 4)
	again := stepEvent("run-d", 0, 4)
	again.GetStep().WorkerId = "worker-2" // a re-run on another worker
	retried := endEvent("run-d", 0, 6, requestedAt+9)
	stale := endEvent("run-d", 0, 2, requestedAt+1) // an earlier attempt's end, delivered late
	counts, err := NewWriter(conn, testDB).Write(ctx, []*gauntletv1.Event{
		first, stepEvent("run-d", 0, 5), again, retried, retried, stale,
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := (Counts{Steps: 2, Faults: 1, Episodes: 1, Duplicates: 3}); counts != want {
		t.Errorf("Counts = %+v, want %+v", counts, want)
	}
	if _, rows, err := Query(ctx, conn, "SELECT steps FROM episodes"); err != nil || len(rows) != 1 || rows[0][0] != "6" {
		t.Errorf("raw episodes = %v, %v; want the retried end alone (6 steps)", rows, err)
	}
	_, rows, err := Query(ctx, conn, "SELECT step, worker_id FROM steps ORDER BY step")
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"4", "worker-2"}, {"5", "worker-1"}}; !reflect.DeepEqual(rows, want) {
		t.Errorf("raw steps = %v, want %v (one row per key, the last copy)", rows, want)
	}
}

// TestLaterEpisodeEndWins: a retried episode ends twice; the later end must be the
// row that remains, whatever order the two events arrive in.
func TestLaterEpisodeEndWins(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	retried := endEvent("run-r", 0, 12, requestedAt+9_000_000_000)
	stale := endEvent("run-r", 0, 3, requestedAt+4_000_000_000)
	stale.GetEnded().InfraError = true
	stale.GetEnded().Reason = gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR
	for _, ev := range []*gauntletv1.Event{retried, stale} { // the stale one arrives last
		if _, err := w.Write(ctx, []*gauntletv1.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	episodes, err := RunEpisodes(ctx, conn, testDB, "run-r")
	if err != nil {
		t.Fatal(err)
	}
	if len(episodes) != 1 || episodes[0].Steps != 12 || episodes[0].InfraError {
		t.Fatalf("RunEpisodes = %+v, want the retried end (12 steps, no infra error)", episodes)
	}
}

func TestWriteNothing(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	for _, tc := range []struct {
		name   string
		events []*gauntletv1.Event
		want   Counts
	}{
		{"nil", nil, Counts{}},
		{"started only", []*gauntletv1.Event{{Body: &gauntletv1.Event_Started{Started: &gauntletv1.EpisodeStarted{}}}}, Counts{}},
		{"invalid", []*gauntletv1.Event{
			nil,
			{},
			{Body: &gauntletv1.Event_Step{}},
			{Body: &gauntletv1.Event_Step{Step: &gauntletv1.StepTaken{Step: 3}}},
			{Body: &gauntletv1.Event_Ended{Ended: &gauntletv1.EpisodeEnded{}}},
		}, Counts{Invalid: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := w.Write(ctx, tc.events)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Counts = %+v, want %+v", got, tc.want)
			}
		})
	}
	_, rows, err := Query(ctx, conn, "SELECT (SELECT count() FROM steps) + (SELECT count() FROM episodes) + (SELECT count() FROM faults)")
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] != "0" {
		t.Errorf("rows written = %s, want 0", rows[0][0])
	}
}

func TestWriteErrorsNameTheTable(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	// A database without the tables: the insert fails on the server.
	_, err := NewWriter(conn, "default").Write(ctx, []*gauntletv1.Event{stepEvent("run-e", 0, 0)})
	if err == nil {
		t.Fatal("Write into a database without tables succeeded")
	}
	if !strings.Contains(err.Error(), "insert into default.steps") {
		t.Errorf("error does not name the table and operation: %v", err)
	}
	var ex *clickhouse.Exception
	if !errors.As(err, &ex) {
		t.Errorf("error does not wrap the server's exception: %v", err)
	}

	if _, err := NewWriter(conn, "bad name; DROP").Write(ctx, []*gauntletv1.Event{stepEvent("run-e", 0, 0)}); err == nil {
		t.Error("Write accepted a database name that needs quoting")
	}
}

// TestWrite100kSteps writes one batch of 100,000 realistic steps (2,000 episodes of
// 50 steps) and counts them back exactly.
func TestWrite100kSteps(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 100k rows; run without -short")
	}
	ctx := context.Background()
	conn := setup(t)
	events := runEvents("run-big", 2000, 50)
	counts, err := NewWriter(conn, testDB).Write(ctx, events)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Counts{Steps: 100_000, Faults: 20_000, Episodes: 2000}); counts != want {
		t.Errorf("Counts = %+v, want %+v", counts, want)
	}
	episodes, steps, err := RunCounts(ctx, conn, testDB, "run-big")
	if err != nil {
		t.Fatal(err)
	}
	if episodes != 2000 || steps != 100_000 {
		t.Errorf("RunCounts = %d, %d; want 2000, 100000", episodes, steps)
	}
	_, rows, err := Query(ctx, conn, "SELECT sum(errors), round(sum(reward), 4) FROM steps_final WHERE run_id = 'run-big'")
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]string{{"20000", "8650"}}; !reflect.DeepEqual(rows, want) {
		t.Errorf("sums = %v, want %v", rows, want)
	}
	// The batch went out in blocks of blockRows; the server must have squashed them
	// into one part (inactive parts count too: they linger for minutes after a merge).
	_, rows, err = Query(ctx, conn, "SELECT count() FROM system.parts WHERE database = '"+testDB+"' AND table = 'steps'")
	if err != nil {
		t.Fatal(err)
	}
	if rows[0][0] != "1" {
		t.Errorf("one Write of 100k steps made %s parts, want 1", rows[0][0])
	}
}

func TestReadsOfUnknownIDsAreEmpty(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	steps, err := EpisodeSteps(ctx, conn, testDB, "no-such-episode")
	if err != nil || len(steps) != 0 {
		t.Errorf("EpisodeSteps = %v, %v; want none", steps, err)
	}
	episodes, nsteps, err := RunCounts(ctx, conn, testDB, "no-such-run")
	if err != nil || episodes != 0 || nsteps != 0 {
		t.Errorf("RunCounts = %d, %d, %v; want 0, 0", episodes, nsteps, err)
	}
	if _, err := EpisodeSteps(ctx, conn, "no_such_db", "x"); err == nil {
		t.Error("EpisodeSteps from a missing database succeeded")
	}
}

func TestQueryFormatsText(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	columns, rows, err := Query(ctx, conn, `SELECT
		'it''s' AS s,
		toUInt8(1) AS u8,
		toInt64(-5) AS i64,
		0.1 + 0.2 AS f64,
		toFloat32(1.5) AS f32,
		1e300 AS big,
		1 / 0 AS inf,
		0 / 0 AS nan,
		toDateTime('2026-03-14 15:09:26', 'UTC') AS dt,
		toDate('2026-03-14') AS d,
		['a', 'b''c'] AS strs,
		[1.5, 2] AS floats,
		[[1], [2, 3]] AS nested,
		[toDateTime('2026-03-14 15:09:26', 'UTC')] AS times,
		CAST(NULL AS Nullable(String)) AS null_s,
		toNullable('x') AS some_s,
		toDecimal32(1.25, 2) AS dec,
		toUUID('61f0c404-5cb3-11e7-907b-a6006ad3dba0') AS id`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"s":      "it's",
		"u8":     "1",
		"i64":    "-5",
		"f64":    "0.30000000000000004",
		"f32":    "1.5",
		"big":    "1e300",
		"inf":    "inf",
		"nan":    "nan",
		"dt":     "2026-03-14 15:09:26",
		"d":      "2026-03-14",
		"strs":   `['a','b\'c']`,
		"floats": "[1.5,2]",
		"nested": "[[1],[2,3]]",
		"times":  "['2026-03-14 15:09:26']",
		"null_s": "NULL",
		"some_s": "x",
		"dec":    "1.25",
		"id":     "61f0c404-5cb3-11e7-907b-a6006ad3dba0",
	}
	if len(rows) != 1 || len(rows[0]) != len(columns) {
		t.Fatalf("Query returned %d rows of %v for columns %v", len(rows), rows, columns)
	}
	for i, c := range columns {
		if rows[0][i] != want[c] {
			t.Errorf("%s = %q, want %q", c, rows[0][i], want[c])
		}
	}
	if len(columns) != len(want) {
		t.Errorf("columns = %v, want %d", columns, len(want))
	}

	if _, _, err := Query(ctx, conn, "SELECT nonsense FROM nowhere"); err == nil {
		t.Error("Query of a bad statement succeeded")
	}
}

// The hand-written plan encoder must agree with protojson on every plan the faults
// package makes, and stay valid JSON on any string.
func TestCanonicalJSONMatchesProtojson(t *testing.T) {
	for _, profile := range plans.Profiles() {
		for seed := uint64(0); seed < 300; seed++ {
			plan, err := plans.Derive(seed, profile, []string{"catalog", "inventory", "orders", "payment", "shipping"})
			if err != nil {
				t.Fatal(err)
			}
			got, err := canonicalJSON(plan)
			if err != nil {
				t.Fatal(err)
			}
			pj, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(plan)
			if err != nil {
				t.Fatal(err)
			}
			var want bytes.Buffer
			if err := json.Compact(&want, pj); err != nil {
				t.Fatal(err)
			}
			if got != want.String() {
				t.Fatalf("%s/%d:\n got %s\nwant %s", profile, seed, got, want.String())
			}
		}
	}
	// Drifted plans record their values too.
	drifted, err := plans.Derive(5, plans.ProfileEdge, []string{"payment", "shipping"})
	if err != nil {
		t.Fatal(err)
	}
	if err := plans.ApplyDrift(drifted, []*gauntletv1.DriftValue{
		{Selector: "*.latency.mean_ms", Value: 123.25, Source: "global"},
		{Selector: "payment.http_503.probability", Value: 0, Source: "run"},
	}); err != nil {
		t.Fatal(err)
	}
	// and so do the storage and resource faults of a sandboxed env's plan.
	// (one line here: canonjson escapes control characters its own way, checked below).
	drifted.BoundarySpec = `{name: bad-disk, faults: [{id: full, kind: disk_full, match: {paths: ["/notes.txt"]}}]}`
	got, err := canonicalJSON(drifted)
	if err != nil {
		t.Fatal(err)
	}
	pj, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(drifted)
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := json.Compact(&want, pj); err != nil {
		t.Fatal(err)
	}
	if got != want.String() {
		t.Fatalf("drifted:\n got %s\nwant %s", got, want.String())
	}
	odd := &gauntletv1.FaultPlan{Profile: "a\"b\\c\n\x01<&>é\xff", Rules: []*gauntletv1.FaultRule{
		{Id: "x", Target: "*", Probability: 1e-9, Spec: &gauntletv1.FaultRule_Latency{Latency: &gauntletv1.LatencyFault{}}},
		{Id: "y", Target: "t", Probability: 0.5, Spec: &gauntletv1.FaultRule_Truncate{Truncate: &gauntletv1.TruncateFault{KeepFraction: 0.25}}},
	}}
	got, err = canonicalJSON(odd)
	if err != nil || !json.Valid([]byte(got)) {
		t.Fatalf("canonicalJSON(odd) = %s, %v: not valid JSON", got, err)
	}
	// A multi-line boundary spec reads back exactly.
	drifted.BoundarySpec = "name: bad-disk\nfaults:\n  - {id: full, kind: disk_full}\n"
	got, err = canonicalJSON(drifted)
	if err != nil {
		t.Fatal(err)
	}
	var back gauntletv1.FaultPlan
	if err := protojson.Unmarshal([]byte(got), &back); err != nil || back.BoundarySpec != drifted.BoundarySpec {
		t.Fatalf("boundary_spec read back as %q (%v), want %q", back.BoundarySpec, err, drifted.BoundarySpec)
	}
	if s, _ := canonicalJSON(nil); s != "{}" {
		t.Fatalf("nil plan = %s", s)
	}
}

// TestSegmentsProjectLikeLoneEvents writes the same episodes once as lone events and once
// as the segments workers publish (start, steps and end in one StepsTaken): the rows are
// the same, so the second write only adds copies that FINAL collapses.
func TestSegmentsProjectLikeLoneEvents(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	lone := runEvents("run-seg", 3, 10)
	segs := map[string]*gauntletv1.StepsTaken{}
	var order []string
	segOf := func(id string) *gauntletv1.StepsTaken {
		if segs[id] == nil {
			segs[id] = &gauntletv1.StepsTaken{}
			order = append(order, id)
		}
		return segs[id]
	}
	for _, ev := range lone {
		switch b := ev.GetBody().(type) {
		case *gauntletv1.Event_Step:
			s := segOf(b.Step.GetEpisodeId())
			s.Steps = append(s.Steps, b.Step)
		case *gauntletv1.Event_Ended:
			s := segOf(b.Ended.GetEpisode().GetEpisodeId())
			s.Ended = b.Ended
			s.Started = &gauntletv1.EpisodeStarted{Episode: b.Ended.GetEpisode()}
		}
	}
	var segmented []*gauntletv1.Event
	rows := 0
	for _, id := range order {
		ev := &gauntletv1.Event{Body: &gauntletv1.Event_Steps{Steps: segs[id]}}
		segmented = append(segmented, ev)
		rows += RowsOf(ev)
	}
	if len(segmented) != 3 || rows != 33 {
		t.Fatalf("%d segments of %d rows, want 3 of 33 (10 steps and an end each)", len(segmented), rows)
	}
	// And once as the batch a worker publishes for an assignment's episodes.
	batched := []*gauntletv1.Event{{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{Events: segmented}}}}
	if r := RowsOf(batched[0]); r != rows {
		t.Fatalf("the batch projects to %d rows, its segments to %d", r, rows)
	}
	// And as the store reads that batch off the stream: Marshal writes the segments'
	// scores in the compact form, which must project to the same rows.
	data, err := gauntletv1.Marshal(batched[0])
	if err != nil {
		t.Fatal(err)
	}
	var decoded gauntletv1.Event
	if err := gauntletv1.UnmarshalAliasing(data, &decoded); err != nil {
		t.Fatal(err)
	}
	if specs := decoded.GetBatch().GetEvents()[0].GetSteps().GetScoreSpecs(); len(specs) != 1 {
		t.Fatalf("the encoded segment has %d score specs, want 1 (compact scores)", len(specs))
	}
	want := Counts{Steps: 30, Faults: 6, Episodes: 3}
	for name, events := range map[string][]*gauntletv1.Event{"lone": lone, "segments": segmented, "batch": batched, "encoded": {&decoded}} {
		got, err := w.Write(ctx, events)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != want {
			t.Errorf("%s: Counts = %+v, want %+v", name, got, want)
		}
	}
	for sql, want := range map[string]string{
		"SELECT count() FROM steps":          "120",
		"SELECT count() FROM steps_final":    "30",
		"SELECT count() FROM faults_final":   "6",
		"SELECT count() FROM episodes_final": "3",
		// Identical copies: one distinct row per step once every column is compared.
		"SELECT count() FROM (SELECT DISTINCT * FROM steps)": "30",
	} {
		_, got, err := Query(ctx, conn, sql)
		if err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		if got[0][0] != want {
			t.Errorf("%s = %s, want %s", sql, got[0][0], want)
		}
	}
	// An empty segment projects nothing and is counted invalid.
	got, err := w.Write(ctx, []*gauntletv1.Event{{Body: &gauntletv1.Event_Steps{Steps: &gauntletv1.StepsTaken{}}}})
	if err != nil || got != (Counts{Invalid: 1}) {
		t.Errorf("empty segment: Counts = %+v, %v; want 1 invalid", got, err)
	}
	// So does a batch nested in a batch, which no publisher makes.
	nested := &gauntletv1.Event{Body: &gauntletv1.Event_Batch{Batch: &gauntletv1.EventBatch{Events: batched}}}
	got, err = w.Write(ctx, []*gauntletv1.Event{nested})
	if err != nil || got != (Counts{Invalid: 1}) {
		t.Errorf("nested batch: Counts = %+v, %v; want 1 invalid", got, err)
	}
}

// A Writer keeps its row and column buffers from one Write to the next (scratch). Writes of
// different sizes and contents through one Writer must still each read back as they were:
// nothing of a larger, earlier batch may leak into a smaller, later one (flags set before
// and clear now, arrays longer before, more rows before).
func TestConsecutiveWritesKeepTheirOwnValues(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	// Big, then small with every flag and array flipped, then in between.
	batches := []struct {
		run             string
		episodes, steps int
		flip            bool
	}{{"run-big", 30, 40, false}, {"run-small", 1, 3, true}, {"run-mid", 4, 25, false}}
	for _, b := range batches {
		events := runEvents(b.run, b.episodes, b.steps)
		for _, ev := range events {
			st := ev.GetStep()
			if st == nil {
				continue
			}
			if b.flip {
				st.Signals.Success, st.Signals.InvalidAction, st.Terminated = false, false, false
				st.Faults, st.Signals.Violations, st.Score.Components = nil, nil, st.Score.Components[:1]
				st.ObservationJson = `{"ok":false}`
			} else {
				st.Signals.Success, st.Terminated = true, true
			}
		}
		if _, err := w.Write(ctx, events); err != nil {
			t.Fatalf("write %s: %v", b.run, err)
		}
		// What each step must read back as, from events that were never written.
		want := map[string]StepRow{}
		for _, ev := range events {
			if st := ev.GetStep(); st != nil {
				want[fmt.Sprintf("%s/%d", st.EpisodeId, st.Step)] = newStepRow(st, mustScore(t, nil, st))
			}
		}
		defer func() {
			got := 0
			for e := range b.episodes {
				id := fmt.Sprintf("%s-ep-%06d", b.run, e)
				steps, err := EpisodeSteps(ctx, conn, testDB, id)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range steps {
					compareRows(t, b.run+" step", s, want[fmt.Sprintf("%s/%d", id, s.Step)])
					got++
				}
			}
			if got != len(want) {
				t.Errorf("%s: read back %d steps, want %d", b.run, got, len(want))
			}
		}()
	}
}

// A scratch released after a Write keeps no string of the batch anywhere in its
// buffers, including past the length of a batch's last, shorter block.
func TestScratchReleaseKeepsNothing(t *testing.T) {
	sc := &scratch{}
	rows := make([]StepRow, blockRows+3)
	for i := range rows {
		rows[i].Observation = "obs"
	}
	bufs := sc.buffers("steps", len(stepColumns))
	for start := 0; start < len(rows); start += blockRows {
		block := rows[start:min(start+blockRows, len(rows))]
		for i, c := range stepColumns {
			bufs[i] = c.values(block, bufs[i])
		}
	}
	sc.release()
	for i, c := range stepColumns {
		if c.name != "observation" {
			continue
		}
		obs := bufs[i].([]string)
		for j, s := range obs[:cap(obs)] {
			if s != "" {
				t.Fatalf("observation buffer keeps %q at %d of %d after release", s, j, cap(obs))
			}
		}
		return
	}
	t.Fatal("no observation column")
}

// A lot re-run by another worker after the stream's duplicate window (its first worker
// died mid-lot past the lease) arrives as a second copy of every step, fault and end,
// in separate writes, with another worker id. ClickHouse's keys make the copies one: read
// with FINAL, the episode has each step once and one end, the re-run's. The keys are what
// makes this true, so they are pinned here: a column added to a sorting key (the worker
// id, say) would keep both copies.
func TestRerunOnAnotherWorkerIsOneEpisode(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	attempt := func(worker string, endedAt int64) []*gauntletv1.Event {
		var evs []*gauntletv1.Event
		for step := range 3 {
			ev := stepEvent("run-rerun", 0, step)
			ev.GetStep().WorkerId = worker
			evs = append(evs, ev)
		}
		return append(evs, endEvent("run-rerun", 0, 3, endedAt))
	}
	first, err := w.Write(ctx, attempt("worker-1", requestedAt+1_000_000_000))
	if err != nil {
		t.Fatal(err)
	}
	// The re-run's segments come one write at a time, as separate store batches.
	for _, ev := range attempt("worker-2", requestedAt+9_000_000_000) {
		if _, err := w.Write(ctx, []*gauntletv1.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		table string
		want  int
	}{{"steps", first.Steps}, {"faults", first.Faults}, {"episodes", 1}} {
		_, rows, err := Query(ctx, conn, "SELECT count() FROM "+c.table+" FINAL")
		if err != nil {
			t.Fatal(err)
		}
		if rows[0][0] != fmt.Sprint(c.want) {
			t.Errorf("%s FINAL has %s rows after a re-run on another worker, want %d", c.table, rows[0][0], c.want)
		}
	}
	_, rows, err := Query(ctx, conn, "SELECT DISTINCT worker_id FROM steps FINAL")
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 1 {
		t.Errorf("steps FINAL keeps rows of workers %v; want one copy of each step", rows)
	}

	_, rows, err = Query(ctx, conn, "SELECT name, sorting_key FROM system.tables WHERE database = '"+testDB+"' AND engine = 'ReplacingMergeTree' ORDER BY name")
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"curriculum_stages", "curriculum_prefix, stage"},
		{"episode_worlds", "run_id, episode_id"},
		{"episodes", "run_id, episode_id"},
		{"faults", "episode_id, step, seq"},
		{"plan_templates", "template"},
		{"reward_specs", "digest"},
		{"runs", "run_id"},
		{"step_scores", "run_id, spec_digest, episode_id, step"},
		{"steps", "episode_id, step"},
		{"trainer_steps", "episode_id, step"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("sorting keys = %v, want %v: they are the de-duplication keys of re-run episodes (docs/architecture.md)", rows, want)
	}
}

// An episode of a world begins with the world's name and digest; the start of each such
// episode (alone or opening a segment) is a row of episode_worlds, joined to episodes on
// run_id and episode_id, the later start of a retried episode winning. Other envs' starts
// make no row.
func TestWorldStartsRecordTheirDigest(t *testing.T) {
	ctx := context.Background()
	conn := setup(t)
	w := NewWriter(conn, testDB)
	const d1, d2 = "sha256:1111111111111111111111111111111111111111111111111111111111111111", "sha256:2222222222222222222222222222222222222222222222222222222222222222"
	start := func(episode int, obs string, at int64) *gauntletv1.EpisodeStarted {
		end := endEvent("run-w", episode, 1, requestedAt+5_000_000_000).GetEnded()
		return &gauntletv1.EpisodeStarted{Episode: end.GetEpisode(), ObservationJson: obs, StartedAtUnixNano: at}
	}
	worldObs := func(digest string) string {
		return `{"world":"bank","digest":"` + digest + `","task":"pay the landlord bill","tools":["wait"]}`
	}
	seg := &gauntletv1.StepsTaken{Started: start(0, worldObs(d1), requestedAt+1), Ended: endEvent("run-w", 0, 0, requestedAt+5_000_000_000).GetEnded()}
	events := []*gauntletv1.Event{
		{Body: &gauntletv1.Event_Steps{Steps: seg}},
		{Body: &gauntletv1.Event_Started{Started: start(1, worldObs(d1), requestedAt+1)}},
		{Body: &gauntletv1.Event_Started{Started: start(2, `{"task":"buy a mug","tools":["wait"]}`, requestedAt+1)}},
		{Body: &gauntletv1.Event_Started{Started: start(3, `{"world":"bank","digest":"not a digest"}`, requestedAt+1)}},
		endEvent("run-w", 1, 0, requestedAt+5_000_000_000),
		endEvent("run-w", 2, 0, requestedAt+5_000_000_000),
	}
	if _, err := w.Write(ctx, events); err != nil {
		t.Fatal(err)
	}
	// Episode 1 retried on another worker that loaded another version of the file: the
	// later start wins, whichever arrives last.
	for _, at := range []int64{requestedAt + 9, requestedAt + 2} {
		digest := d2
		if at == requestedAt+2 {
			digest = d1
		}
		ev := &gauntletv1.Event{Body: &gauntletv1.Event_Started{Started: start(1, worldObs(digest), at)}}
		if _, err := w.Write(ctx, []*gauntletv1.Event{ev}); err != nil {
			t.Fatal(err)
		}
	}
	// The query docs/querying.md gives.
	_, rows, err := Query(ctx, conn, `SELECT episode_id, world, digest
FROM `+testDB+`.episodes FINAL
ANY LEFT JOIN (SELECT run_id, episode_id, world, digest FROM `+testDB+`.episode_worlds FINAL) USING (run_id, episode_id)
WHERE run_id = 'run-w' ORDER BY episode_id`)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"run-w-ep-000000", "bank", d1},
		{"run-w-ep-000001", "bank", d2},
		{"run-w-ep-000002", "", ""},
	}
	if fmt.Sprint(rows) != fmt.Sprint(want) {
		t.Fatalf("episodes with their worlds:\n%v\nwant\n%v", rows, want)
	}
	_, rows, err = Query(ctx, conn, `SELECT world, digest, count() AS episodes, min(requested_at) AS first_played,
       round(avg(success), 3) AS success_rate
FROM `+testDB+`.episodes FINAL
ANY INNER JOIN (SELECT run_id, episode_id, world, digest FROM `+testDB+`.episode_worlds FINAL)
USING (run_id, episode_id)
WHERE infra_error = 0
GROUP BY world, digest ORDER BY world, digest`)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 2 || rows[0][1] != d1 || rows[0][2] != "1" || rows[1][1] != d2 || rows[1][2] != "1" {
		t.Fatalf("success by world version: %v", rows)
	}
}

func TestWorldOf(t *testing.T) {
	for obs, want := range map[string]string{
		`{"world":"bank","digest":"sha256:ab","task":"x"}`:  "bank sha256:ab",
		`{"world":"bank","digest":"sha256:ab"}`:             "bank sha256:ab",
		`{"world":"bank"}`:                                  "",
		`{"world":"","digest":"sha256:ab"}`:                 "",
		`{"world":"b\"x","digest":"sha256:ab"}`:             "",
		`{"world":"bank","digest":"md5:ab"}`:                "",
		`{"world":"bank","digest":"sha256:ab`:               "",
		`{"task":"buy","world":"bank","digest":"sha256:a"}`: "",
		``: "",
	} {
		w, d, ok := worldOf(obs)
		got := ""
		if ok {
			got = w + " " + d
		}
		if got != want {
			t.Errorf("worldOf(%s) = %q, want %q", obs, got, want)
		}
	}
}
