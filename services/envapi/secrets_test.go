package envapi

import (
	"encoding/hex"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
)

// The dev token survives restarts: made once, mode 0600, kept while it is valid, so a
// trainer holding it is not locked out by the next `gauntlet up`.
func TestDevTokensKeepsTheTokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "envapi-token")
	log := slog.New(slog.DiscardHandler)
	_, tok, err := DevTokens(path, log)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("made %v, %v; want mode 0600", fi.Mode(), err)
	}
	tokens, tok2, err := DevTokens(path, log)
	if err != nil || tok2 != tok || tokens.Lookup(tok) == nil || tokens.Lookup(tok).Name != "default" {
		t.Fatalf("second start: token %q (first %q), %v", tok2, tok, err)
	}
	// A token the user wrote is kept too; a file readable by others is made private.
	mine := "my-own-dev-token-of-some-length"
	if err := os.WriteFile(path, []byte(mine+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, got, err := DevTokens(path, log); err != nil || got != mine {
		t.Fatalf("a token the user wrote: %q, %v", got, err)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v after start, want 0600", fi.Mode().Perm())
	}
	// One that cannot be a token is an error naming the file, never replaced in silence.
	for _, bad := range []string{"", "short\n", "two tokens-here-0123456789\n"} {
		if err := os.WriteFile(path, []byte(bad), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, _, err := DevTokens(path, log); err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("token file %q: %v, want an error naming the file", bad, err)
		}
	}
}

// Episode ids say which run of the env API issued them: one it issued before a restart
// is told from one it never issued (a typo, another key, another tenant).
func TestEpisodeIDsKnowTheirRun(t *testing.T) {
	key := filepath.Join(t.TempDir(), "envapi-id-key")
	log := slog.New(slog.DiscardHandler)
	before, err := loadEpisodeIDs(key, log)
	if err != nil {
		t.Fatal(err)
	}
	id := before.issue("api-acme")
	if !strings.HasPrefix(id, "api-acme-") || before.issuedBefore("api-acme", id) {
		t.Fatalf("id %q: issued before this run by its own run?", id)
	}
	after, err := loadEpisodeIDs(key, log)
	if err != nil {
		t.Fatal(err)
	}
	if !after.issuedBefore("api-acme", id) {
		t.Errorf("after a restart, %q is not recognised as issued before it", id)
	}
	if after.issuedBefore("api-other", id) {
		t.Error("another tenant's id is recognised")
	}
	flip := []byte(id)
	flip[len("api-acme-")+10] ^= 1
	for _, never := range []string{string(flip), id[:len(id)-1], "api-acme-0123456789abcdef", "nope", ""} {
		if after.issuedBefore("api-acme", never) {
			t.Errorf("%q, never issued, is recognised", never)
		}
	}
	other, err := loadEpisodeIDs(filepath.Join(t.TempDir(), "k"), log)
	if err != nil {
		t.Fatal(err)
	}
	if other.issuedBefore("api-acme", id) {
		t.Error("an id made with another key is recognised")
	}
	if a, b := after.issue("api-acme"), after.issue("api-acme"); a == b {
		t.Errorf("two ids alike: %s", a)
	}
}

// Episode ids sort in the order they were issued, within one run of the API and across
// a restart (whose clock may have stepped back) and across several servers under one
// key, so the console pages a run's episodes by a range of the episodes table's key.
func TestEpisodeIDsSortInIssueOrder(t *testing.T) {
	key := filepath.Join(t.TempDir(), "envapi-id-key")
	log := slog.New(slog.DiscardHandler)
	first, err := loadEpisodeIDs(key, log)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for range 1000 {
		ids = append(ids, first.issue("api-acme"))
	}
	// A restart, and a second server beside it, both under the same key.
	restarted, err := loadEpisodeIDs(key, log)
	if err != nil {
		t.Fatal(err)
	}
	beside, err := loadEpisodeIDs(key, log)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		g := restarted
		if i%2 == 1 {
			g = beside
		}
		ids = append(ids, g.issue("api-acme"))
	}
	seen := map[string]bool{}
	for i, id := range ids {
		if seen[id] {
			t.Fatalf("id %d, %s, issued twice", i, id)
		}
		seen[id] = true
		if i > 0 && id <= ids[i-1] {
			t.Fatalf("id %d, %s, sorts before id %d, %s, issued before it", i, id, i-1, ids[i-1])
		}
		at, ok := runs.IssuedAt("api-acme", id)
		if !ok || time.Since(time.Unix(0, int64(at))) > time.Minute {
			t.Fatalf("id %s: issued at %d (%v), want about now", id, at, ok)
		}
	}
	if !restarted.issuedBefore("api-acme", ids[0]) || restarted.issuedBefore("api-acme", ids[1000]) {
		t.Error("after the restart, its own id or the old run's is not told apart")
	}
	// The clock steps back: the ids still sort in issue order within the run of the API.
	last := first.issue("api-acme")
	first.now = func() time.Time { return time.Unix(0, 0) }
	if next := first.issue("api-acme"); next <= last {
		t.Errorf("after the clock stepped back, %s sorts before %s", next, last)
	}
	// Ids issued before this form (boot number, random bytes, MAC) still say they were.
	b := append(first.boot[:], 1, 2, 3, 4, 5, 6, 7, 8)
	old := "api-acme-" + hex.EncodeToString(b)
	old += hex.EncodeToString(first.mac([]byte(old)))
	if !restarted.issuedBefore("api-acme", old) || first.issuedBefore("api-acme", old) {
		t.Errorf("an id of the earlier form, %s, is not told apart", old)
	}
}
