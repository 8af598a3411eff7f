package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal/chtest"
	"github.com/gauntlet-rl/gauntlet/pkg/console"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// TestConsoleEnvAPIPagesInABrowser opens, in Debian's chromium, the run page of an env
// API run whose episode ids sort in issue order, and follows its pages by their cursor:
// 450 episodes from a server that restarted halfway (its counter, idx, starting again),
// shown 200 at a time in the order they were issued, then back to the first page.
func TestConsoleEnvAPIPagesInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs ClickHouse and a browser; -short runs unit tests only")
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): the console's browser tests need Debian's chromium; run scripts/deps.sh", err)
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
	const run, n = "api-acme", 450
	t0 := uint64(time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC).UnixNano())
	ids := make([]string, n)
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+db+".episodes (run_id, episode_id, idx, env, seed, policy, requested_at, steps, success, total_reward, reason, version)")
	if err != nil {
		t.Fatal(err)
	}
	for e := range n {
		boot, idx := "a1a1a1a1", uint64(e)
		if e >= n/2 {
			boot, idx = "bbbbbbbb", uint64(e-n/2)
		}
		ids[e] = runs.IssuedIDPrefix(run, t0+uint64(e)*1_000_000) + boot + fmt.Sprintf("%016x", e)
		if err := batch.Append(run, ids[e], idx, "shop", uint64(e), "trainer", time.Unix(0, int64(t0)), uint32(3), uint8(1), 1.0, "success", uint64(1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
	c := console.New(console.Config{ClickHouse: srv.Addr, Database: db}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer c.Close()
	web := httptest.NewServer(c)
	defer web.Close()
	base := web.URL + console.Prefix
	shots := t.ArtifactDir()

	b := newBrowser(t, chromium)
	// page checks that the page shows the episodes from first on, count of them, and
	// whether it links to a next page.
	page := func(first, count int, next bool) {
		t.Helper()
		waitText(t, b, `#episodes tbody tr:first-child td:first-child`, ids[first], time.Minute)
		rows, err := b.eval(`document.querySelectorAll("#episodes tbody tr").length`)
		if err != nil || rows != count {
			t.Fatalf("page from episode %d: %d rows (%v), want %d%s", first, rows, err, count, b.state())
		}
		last, err := b.evalString(`document.querySelector("#episodes tbody tr:last-child").dataset.episode`)
		if err != nil || last != ids[first+count-1] {
			t.Fatalf("page from episode %d ends at %s (%v), want %s", first, last, err, ids[first+count-1])
		}
		hasNext, err := b.eval(`document.querySelectorAll("#episodes-next").length`)
		if err != nil || (hasNext == 1) != next {
			t.Fatalf("page from episode %d: next links %d (%v), want %v", first, hasNext, err, next)
		}
	}
	if err := b.do(chromedp.Navigate(base+"#/runs/"+run), chromedp.WaitVisible(chromedp.CSS(`#episodes`))); err != nil {
		t.Fatalf("open the run page: %v%s", err, b.state())
	}
	page(0, 200, true)
	if h := text(t, b, `main h2:has(+ .stepper)`); !strings.HasPrefix(h, "Episodes in the order they were issued") {
		t.Errorf("heading %q", h)
	}
	b.screenshot(t, filepath.Join(shots, "envapi-episodes-first.png"))
	// A part the page leaves out (no infra errors here) shows nothing, not "null".
	if nulls, err := b.eval(`document.getElementById("main").textContent.split("null").length - 1`); err != nil || nulls != 0 {
		t.Errorf("the run page shows \"null\" %d times (%v)%s", nulls, err, b.state())
	}
	for _, want := range []struct {
		first, count int
		next         bool
	}{{200, 200, true}, {400, 50, false}} {
		if err := b.do(chromedp.Click(chromedp.CSS(`#episodes-next`))); err != nil {
			t.Fatalf("next page: %v%s", err, b.state())
		}
		page(want.first, want.count, want.next)
	}
	b.screenshot(t, filepath.Join(shots, "envapi-episodes-last.png"))
	if err := b.do(chromedp.Click(chromedp.CSS(`#episodes-first`))); err != nil {
		t.Fatalf("first page: %v%s", err, b.state())
	}
	page(0, 200, true)
	if errs := b.errors(); len(errs) > 0 {
		t.Errorf("the browser logged: %q", errs)
	}
}
