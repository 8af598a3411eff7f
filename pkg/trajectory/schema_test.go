package trajectory

import (
	goflag "flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
)

var update = goflag.Bool("update", false, "rewrite testdata/migration_statements.txt from the migrations")

// TestMigrationStatementsAsApplied: what Migrate runs for each migration (its own
// statements, then the views it re-creates) is what it ran when the migration was
// applied, statement for statement and in order, so that a database migrated now ends
// as one migrated before. A migration added later appends to the file (-update); no
// earlier line may change.
func TestMigrationStatementsAsApplied(t *testing.T) {
	var b strings.Builder
	for _, m := range migrations {
		fmt.Fprintf(&b, "-- %d %s\n", m.version, m.name)
		for _, s := range slices.Concat(m.stmts, rebuildViews(m)) {
			fmt.Fprintf(&b, "%s;\n", s)
		}
	}
	const golden = "testdata/migration_statements.txt"
	if *update {
		if err := os.WriteFile(golden, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got := b.String(); got != string(want) {
		gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
		for i := range max(len(gl), len(wl)) {
			if i >= len(gl) || i >= len(wl) || gl[i] != wl[i] {
				t.Fatalf("migration statements differ from %s at line %d:\n got %q\nwant %q", golden, i+1, at(gl, i), at(wl, i))
			}
		}
	}
}

func at(lines []string, i int) string {
	if i < len(lines) {
		return lines[i]
	}
	return "(end)"
}
