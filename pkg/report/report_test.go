package report

import (
	"context"
	"log/slog"
	"math"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// TestQueriesRunOnTheSchema runs every query of the report on the migrated schema of a
// real ClickHouse (Debian's 18.16 here): a column, a function or a join the server does
// not know fails here, not in front of a user.
func TestQueriesRunOnTheSchema(t *testing.T) {
	ctx := context.Background()
	ch := chtest.Start(t)
	conn, err := trajectory.Connect(ctx, ch.Addr(), "rep")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := trajectory.Migrate(ctx, conn, "rep"); err != nil {
		t.Fatal(err)
	}
	runQueries(ctx, t, conn)
}

// TestQueriesRunOnTheReplicatedSchema runs the same queries, unchanged, on a replica of
// a two-replica cluster, where the tables they name are Distributed tables over
// replicated ones (pkg/trajectory, Migrate): analysts change nothing.
func TestQueriesRunOnTheReplicatedSchema(t *testing.T) {
	ctx := context.Background()
	_, replicas := chtest.StartCluster(t)
	if err := trajectory.MigrateReplicas(ctx, chlocal.Addrs(replicas), "rep", slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	conn, err := trajectory.Connect(ctx, replicas[1].Addr(), "rep")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	runQueries(ctx, t, conn)
}

// runQueries runs the report's queries and every query docs/querying.md shows.
func runQueries(ctx context.Context, t *testing.T, conn driver.Conn) {
	t.Helper()
	for _, q := range Queries {
		if _, err := Run(ctx, conn, q.SQL, Scope{Database: "rep", Runs: []string{"r1", "it's"}, First: 1764547200, Last: 1764633600}); err != nil {
			t.Errorf("query %s: %v", q.Name, err)
		}
	}
	if _, err := Build(ctx, conn, Options{Database: "rep", RunIDs: []string{"r1"}}); err == nil {
		t.Error("a report of a run with no episodes: no error")
	}

	// Every query docs/querying.md shows runs too, its placeholders filled in.
	blocks := sqlBlocks(t)
	if len(blocks) < len(Queries) {
		t.Fatalf("%d SQL blocks in docs/querying.md; want at least the report's %d", len(blocks), len(Queries))
	}
	fill := strings.NewReplacer("gauntlet.", "rep.", "{runs}", "'r1'", "{first}", "1764547200", "{last}", "1764633600", "…", "x")
	for _, b := range blocks {
		for _, stmt := range regexp.MustCompile(`\n\s*\n`).Split(strings.TrimSpace(b.sql), -1) {
			if _, err := Run(ctx, conn, fill.Replace(stmt), Scope{Database: "rep"}); err != nil {
				t.Errorf("docs/querying.md line %d: %v\n%s", b.line, err, stmt)
			}
		}
	}
}

// TestDocsShowTheReportsQueries: docs/querying.md shows each query of the report, under
// its marker, exactly as the report runs it.
func TestDocsShowTheReportsQueries(t *testing.T) {
	blocks := sqlBlocks(t)
	byName := map[string]string{}
	for _, b := range blocks {
		if b.marker != "" {
			byName[b.marker] = b.sql
		}
	}
	for _, q := range Queries {
		doc, ok := byName[q.Name]
		if !ok {
			t.Errorf("docs/querying.md has no <!-- report:%s --> block", q.Name)
			continue
		}
		if want := strings.ReplaceAll(q.SQL, "{db}", "gauntlet"); strings.TrimSpace(doc) != want {
			t.Errorf("docs/querying.md, report:%s:\n%s\nthe report runs:\n%s", q.Name, doc, want)
		}
		delete(byName, q.Name)
	}
	for name := range byName {
		t.Errorf("docs/querying.md has a block report:%s the report does not run", name)
	}
}

// sqlBlock is one fenced sql block of docs/querying.md, with the report marker just
// before it, if any.
type sqlBlock struct {
	line   int
	marker string
	sql    string
}

func sqlBlocks(t testing.TB) []sqlBlock {
	t.Helper()
	data, err := os.ReadFile("../../docs/querying.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []sqlBlock
	lines := strings.Split(string(data), "\n")
	marker := regexp.MustCompile(`^<!-- report:(\w+) -->$`)
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```sql" {
			continue
		}
		b := sqlBlock{line: i + 1}
		if i > 0 {
			if m := marker.FindStringSubmatch(lines[i-1]); m != nil {
				b.marker = m[1]
			}
		}
		var body []string
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			body = append(body, lines[i])
		}
		b.sql = strings.Join(body, "\n")
		out = append(out, b)
	}
	return out
}

func TestWilson(t *testing.T) {
	for _, c := range []struct {
		k, n      uint64
		low, high float64
	}{
		// Values from the closed form, checked against published tables (e.g. 0 of 10:
		// [0, 0.2775]; 5 of 10: [0.2366, 0.7634]; 10 of 10: [0.7225, 1]).
		{0, 10, 0, 0.2775},
		{5, 10, 0.2366, 0.7634},
		{10, 10, 0.7225, 1},
		{81, 263, 0.2553, 0.3662},
	} {
		r := Wilson(c.k, c.n)
		if math.Abs(r.Low-c.low) > 5e-5 || math.Abs(r.High-c.high) > 5e-5 {
			t.Errorf("Wilson(%d, %d) = [%.4f, %.4f], want [%.4f, %.4f]", c.k, c.n, r.Low, r.High, c.low, c.high)
		}
	}
	if r := Wilson(0, 0); r.Rate != 0 || r.Low != 0 || r.High != 1 {
		t.Errorf("Wilson(0, 0) = %+v, want rate 0 in [0, 1]", r)
	}
}
