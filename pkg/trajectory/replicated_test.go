package trajectory

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// TestReplicateCoversEveryTable: every CREATE TABLE of the migrations has a replicated
// twin and a Distributed table; a statement the rewrite does not understand is an
// error, never a table left unreplicated.
func TestReplicateCoversEveryTable(t *testing.T) {
	tables := 0
	for _, m := range migrations {
		for _, stmt := range m.stmts {
			out, err := replicate(stmt, "g", "c", laterColumns(m.version))
			if err != nil {
				t.Fatalf("migration %d: %v", m.version, err)
			}
			if !strings.Contains(stmt, "CREATE TABLE") {
				if len(out) != 1 || out[0] != stmt {
					t.Errorf("migration %d: %q changed to %q", m.version, stmt, out)
				}
				continue
			}
			tables++
			if len(out) != 2 || !strings.Contains(out[0], "ENGINE = ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/g/") ||
				!strings.Contains(out[0], "_local (") || !strings.Contains(out[1], "ENGINE = Distributed(c, g, ") {
				t.Errorf("migration %d: %q became %q", m.version, stmt, out)
			}
		}
	}
	if tables != 8 {
		t.Errorf("%d tables replicated, want the schema's 8", tables)
	}
	if _, err := replicate("CREATE TABLE {db}.x (a UInt8) ENGINE = Memory", "g", "c", nil); err == nil {
		t.Error("a CREATE TABLE without IF NOT EXISTS passed unreplicated")
	}
	if _, err := replicate("CREATE TABLE IF NOT EXISTS {db}.x (a UInt8) ENGINE = Memory", "g", "c", nil); err == nil {
		t.Error("a table without a MergeTree engine passed unreplicated")
	}
}

// TestMigrateReplicasConcurrently starts two stores' migrations at once against a
// two-replica cluster, in opposite orders, and checks they leave one schema: on both
// replicas the same tables, each the single server's table under its name (now
// Distributed, same columns in the same order) with its Replicated* twin behind it,
// and every migration recorded.
func TestMigrateReplicasConcurrently(t *testing.T) {
	ctx := context.Background()
	single := setup(t)
	_, servers := chtest.StartCluster(t)
	addrs := chlocal.Addrs(servers)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, order := range [][]string{addrs, {addrs[1], addrs[0]}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = MigrateReplicas(ctx, order, testDB, log)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	// And again, as every later start of a store does: nothing to do.
	if err := MigrateReplicas(ctx, addrs, testDB, log); err != nil {
		t.Fatalf("migrate again: %v", err)
	}

	want := schemaOf(ctx, t, single, testDB)
	var got []map[string]tableSchema
	for _, addr := range addrs {
		conn, err := Connect(ctx, addr, testDB)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		s := schemaOf(ctx, t, conn, testDB)
		got = append(got, s)
		applied, err := appliedVersions(ctx, conn, testDB)
		if err != nil || len(applied) != len(migrations) {
			t.Errorf("replica %s: applied %v (%v), want every one of %d migrations", addr, applied, err, len(migrations))
		}
		for name, w := range want {
			g := s[name]
			switch w.engine {
			case "View", "MergeTree": // views and schema_migrations are each server's own
				if g.engine != w.engine || !reflect.DeepEqual(g.columns, w.columns) {
					t.Errorf("replica %s: %s is %v, the single server's %v", addr, name, g, w)
				}
				continue
			}
			local := s[name+localSuffix]
			if g.engine != "Distributed" || local.engine != "Replicated"+w.engine {
				t.Errorf("replica %s: %s is %s over %s, want Distributed over Replicated%s", addr, name, g.engine, local.engine, w.engine)
			}
			if !reflect.DeepEqual(g.columns, w.columns) || !reflect.DeepEqual(local.columns, w.columns) {
				t.Errorf("replica %s: columns of %s differ from the single server's:\n%v\n%v\nwant %v", addr, name, g.columns, local.columns, w.columns)
			}
		}
		if len(s) != len(want)+len(want)-countEngines(want, "View", "MergeTree") {
			t.Errorf("replica %s has tables %v", addr, slices.Sorted(maps.Keys(s)))
		}
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Errorf("the replicas' schemas differ:\n%v\n%v", got[0], got[1])
	}

	// Refused before any table is created: a database a single server created, found on a replica;
	// and a single server among the replicas.
	a, err := Connect(ctx, addrs[0], "mixed")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, stmt := range []string{
		"CREATE TABLE mixed.schema_migrations (version UInt32, applied_at DateTime) ENGINE = MergeTree() ORDER BY version",
		"CREATE TABLE mixed.steps (episode_id String) ENGINE = ReplacingMergeTree() ORDER BY episode_id",
	} {
		if err := a.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	if err := recordVersion(ctx, a, "mixed", 1); err != nil {
		t.Fatal(err)
	}
	if err := Migrate(ctx, a, "mixed"); !errors.Is(err, ErrMixedSchema) {
		t.Errorf("migrating a single server's database on a replica: %v, want ErrMixedSchema", err)
	}
	lone := chtest.Start(t)
	if err := MigrateReplicas(ctx, []string{addrs[0], lone.Addr()}, testDB, log); !errors.Is(err, ErrMixedSchema) {
		t.Errorf("migrating a single server as a replica: %v, want ErrMixedSchema", err)
	}

	// One replica migrated only after the other was (it was down, say): it joins with
	// the columns the other's ALTERs put into ZooKeeper. Creating it with the first
	// migration's columns failed: "Table structure in ZooKeeper is too different".
	const late = "gauntlet_late"
	for _, addr := range addrs {
		if err := MigrateReplicas(ctx, []string{addr}, late, log); err != nil {
			t.Fatalf("migrate %s alone: %v", addr, err)
		}
	}
	for _, addr := range addrs {
		conn, err := Connect(ctx, addr, late)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		s := schemaOf(ctx, t, conn, late)
		for _, table := range []string{"steps", "episodes"} {
			if !reflect.DeepEqual(s[table].columns, want[table].columns) || !reflect.DeepEqual(s[table+localSuffix].columns, want[table].columns) {
				t.Errorf("replica %s migrated alone: %s has %v, want %v", addr, table, s[table], want[table])
			}
		}
	}
}

type tableSchema struct {
	engine  string
	columns []string // "name type", in order
}

func (s tableSchema) String() string { return fmt.Sprintf("%s%v", s.engine, s.columns) }

// schemaOf reads db's tables and their columns.
func schemaOf(ctx context.Context, t *testing.T, conn driver.Conn, db string) map[string]tableSchema {
	t.Helper()
	out := map[string]tableSchema{}
	rows, err := conn.Query(ctx, "SELECT name, engine FROM system.tables WHERE database = ?", db)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var name, engine string
		if err := rows.Scan(&name, &engine); err != nil {
			t.Fatal(err)
		}
		out[name] = tableSchema{engine: engine}
	}
	rows.Close()
	rows, err = conn.Query(ctx, "SELECT table, name, type FROM system.columns WHERE database = ?", db)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var table, name, typ string
		if err := rows.Scan(&table, &name, &typ); err != nil {
			t.Fatal(err)
		}
		s := out[table]
		s.columns = append(s.columns, name+" "+typ)
		out[table] = s
	}
	return out
}

func countEngines(s map[string]tableSchema, engines ...string) int {
	n := 0
	for _, t := range s {
		if slices.Contains(engines, t.engine) {
			n++
		}
	}
	return n
}

// TestFinalThroughDistributed checks FINAL on ClickHouse 18.16's Distributed tables of
// a one-shard, two-replica cluster: rows written twice into one replica (in different
// blocks, so insert deduplication keeps both copies) show twice in the Distributed
// table read on the other replica, and once with FINAL, in the *_final views, and in
// the trajectory readers, which read with FINAL: FINAL is applied on the one replica
// the shard is read from, which holds every row, so it collapses exactly as on a
// single server.
func TestFinalThroughDistributed(t *testing.T) {
	ctx := context.Background()
	_, servers := chtest.StartCluster(t)
	addrs := chlocal.Addrs(servers)
	if err := MigrateReplicas(ctx, addrs, testDB, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	a, err := Connect(ctx, addrs[0], testDB)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const episodes, steps = 6, 5
	events := runEvents("fin", episodes, steps)
	w := NewWriter(a, testDB)
	for _, batch := range [][]*gauntletv1.Event{events, events[:len(events)/2]} {
		if _, err := w.Write(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	b, err := Connect(ctx, addrs[1], testDB)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	count := func(from string) uint64 { return countIn(ctx, t, b, from) }
	// Both writes replicated: the other replica holds every copy the first one does.
	written := countIn(ctx, t, a, "steps_local")
	deadline := time.Now().Add(time.Minute)
	for count("steps_local") < written {
		if time.Now().After(deadline) {
			t.Fatalf("the other replica holds %d of %d steps after a minute", count("steps_local"), written)
		}
		time.Sleep(100 * time.Millisecond)
	}
	raw, final, view := count("steps"), count("steps FINAL"), count("steps_final")
	if raw != written || raw <= episodes*steps || final != episodes*steps || view != episodes*steps {
		t.Errorf("steps read through Distributed on the other replica: %d raw, %d FINAL, %d in steps_final; want %d raw (more than %d) and %d with FINAL",
			raw, final, view, written, episodes*steps, episodes*steps)
	}
	got, err := EpisodeSteps(ctx, b, testDB, fmt.Sprintf("fin-ep-%06d", 0))
	if err != nil || len(got) != steps {
		t.Errorf("EpisodeSteps on the other replica: %d steps (%v), want %d", len(got), err, steps)
	}
}

// countIn counts the run fin's rows of testDB.from on conn.
func countIn(ctx context.Context, t *testing.T, conn driver.Conn, from string) uint64 {
	t.Helper()
	var n uint64
	if err := conn.QueryRow(ctx, "SELECT count() FROM "+testDB+"."+from+" WHERE run_id = 'fin'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
