package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"

	"github.com/gauntlet-rl/gauntlet/pkg/console"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
)

// TestConsoleInABrowser runs the stack with the console, opens the runs page in
// Debian's chromium (headless, driven by chromedp) before a small real run, and checks
// that the page follows the run as it goes; then that each page shows what SQL gives
// for the same run, that the replay viewer steps through an episode, and that no page
// logs a console error or an exception. Screenshots of each page are written to the
// test's artifact directory (go test -artifacts keeps them).
func TestConsoleInABrowser(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a stack and a browser; -short runs unit tests only")
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium not found (%v): the console's browser tests need Debian's chromium; run scripts/deps.sh", err)
	}
	cfg := testConfig(t)
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := startStack(t, cfg, modPipeline, modConsole)
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	base := "http://" + cfg.HTTPAddr + console.Prefix
	shots := t.ArtifactDir()

	b := newBrowser(t, chromium)
	if err := b.do(chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS(`main h1`))); err != nil {
		t.Fatalf("open the runs page: %v%s", err, b.state())
	}

	// The run starts with the page open: the page finds it and follows it to its end
	// by itself.
	const episodes = 40
	req := newRun(t, episodes, "random=1,oracle=1", 5)
	runToEnd(t, s.app.bus, conn, cfg.Database, req)
	run := req.RunId
	rowSel := fmt.Sprintf(`#runs tr[data-run=%q]`, run)
	waitText(t, b, rowSel+` td[data-field="episodes"]`, strconv.Itoa(episodes), time.Minute)
	// The scheduler's record says the run is done and how many episodes it planned.
	waitText(t, b, rowSel+` td[data-field="state"]`, "done", time.Minute)
	if got := text(t, b, rowSel+` td[data-field="planned"]`); got != fmt.Sprintf("of %d", episodes) {
		t.Errorf("runs page, planned episodes of %s: %q, want \"of %d\"", run, got, episodes)
	}

	// The runs list shows what SQL gives for the run.
	q := func(expr string) string {
		return queryOne(t, conn, fmt.Sprintf(`SELECT %s FROM %s.episodes FINAL WHERE run_id = '%s'`, expr, cfg.Database, run))
	}
	want := map[string]string{
		"env":      q("any(env)"),
		"episodes": q("count()"),
		// Over the scored episodes, as episodes_scored counts them.
		"success_rate": pct(q("avgIf(success, infra_error = 0)")),
		"mean_reward":  fixed3(q("avgIf(total_reward, infra_error = 0)")),
		"infra_errors": q("sum(infra_error)"),
	}
	for field, w := range want {
		if got := text(t, b, rowSel+fmt.Sprintf(` td[data-field=%q]`, field)); got != w {
			t.Errorf("runs page, %s of %s: %q, SQL gives %q", field, run, got, w)
		}
	}
	b.screenshot(t, filepath.Join(shots, "runs.png"))

	// The run page: the same numbers, and per fault kind the episodes that met it.
	if err := b.do(chromedp.Click(chromedp.CSS(rowSel+` a`)), chromedp.WaitVisible(chromedp.CSS(`#fault-kinds`))); err != nil {
		t.Fatalf("open the run page: %v%s", err, b.state())
	}
	for field, w := range want {
		if got := text(t, b, fmt.Sprintf(`.card [data-field=%q]`, field)); got != w {
			t.Errorf("run page, %s: %q, SQL gives %q", field, got, w)
		}
	}
	_, kinds, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT kind, uniqExact(episode_id) FROM %s.faults FINAL WHERE run_id = '%s' GROUP BY kind`, cfg.Database, run))
	if err != nil {
		t.Fatal(err)
	}
	if len(kinds) == 0 {
		t.Fatal("no fault fired in the run: the per fault kind table would show nothing")
	}
	for _, k := range kinds {
		if got := text(t, b, fmt.Sprintf(`#fault-kinds tr[data-kind=%q] td:nth-child(2)`, k[0])); got != k[1] {
			t.Errorf("run page, episodes that met %s: %q, SQL gives %s", k[0], got, k[1])
		}
	}
	if charts, err := b.eval(`document.querySelectorAll(".chart canvas").length`); err != nil || charts != 2 {
		t.Errorf("run page: %d charts drawn (err %v), want 2", charts, err)
	}
	b.screenshot(t, filepath.Join(shots, "run.png"))

	// The replay viewer steps through an episode, showing each step as SQL has it.
	_, eps, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT episode_id FROM %s.episodes FINAL WHERE run_id = '%s' AND steps >= 3 ORDER BY idx LIMIT 1`, cfg.Database, run))
	if err != nil || len(eps) == 0 {
		t.Fatalf("an episode of 3 steps or more: %v (%d found)", err, len(eps))
	}
	ep := eps[0][0]
	seed := queryOne(t, conn, fmt.Sprintf(`SELECT seed FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, ep))
	_, steps, err := trajectory.Query(context.Background(), conn, fmt.Sprintf(`SELECT step, tool, reward, length(fault_kinds) FROM %s.steps FINAL WHERE episode_id = '%s' ORDER BY step LIMIT 3`, cfg.Database, ep))
	if err != nil || len(steps) != 3 {
		t.Fatalf("steps of %s: %v (%d found)", ep, err, len(steps))
	}
	if err := b.do(chromedp.Click(chromedp.CSS(fmt.Sprintf(`#episodes tr[data-episode=%q] a`, ep)))); err != nil {
		t.Fatalf("open the replay of %s: %v", ep, err)
	}
	for i, st := range steps {
		if i == 1 {
			if err := b.do(chromedp.Click(chromedp.CSS(`#next`))); err != nil {
				t.Fatalf("click next: %v", err)
			}
		} else if i == 2 { // the keyboard steps too
			if err := b.do(chromedp.KeyEvent(kb.ArrowRight)); err != nil {
				t.Fatalf("press the right arrow: %v", err)
			}
		}
		waitText(t, b, `#step-index`, st[0], 30*time.Second)
		if i == 0 { // a uint64 as a JavaScript number would lose digits
			if got := text(t, b, `.card [data-field="seed"]`); got != seed {
				t.Errorf("replay of %s: seed %s, SQL gives %s", ep, got, seed)
			}
		}
		if got := text(t, b, `#step-action`); !strings.HasPrefix(got, st[1]+" ") {
			t.Errorf("replay of %s, step %s: action %q, SQL gives tool %s", ep, st[0], got, st[1])
		}
		if got := text(t, b, `#step-reward [data-field="reward"]`); got != fixed3(st[2]) {
			t.Errorf("replay of %s, step %s: reward %q, SQL gives %s", ep, st[0], got, fixed3(st[2]))
		}
		if st[3] != "0" {
			if rows, err := b.eval(`document.querySelectorAll("#step-faults tr").length`); err != nil || strconv.Itoa(rows) != st[3] {
				t.Errorf("replay of %s, step %s: %d faults shown (err %v), SQL gives %s", ep, st[0], rows, err, st[3])
			}
		}
		b.screenshot(t, filepath.Join(shots, fmt.Sprintf("replay-step%s.png", st[0])))
	}

	// The API answers with the numbers SQL gives, exactly.
	var page console.RunPage
	getJSON(t, base+"api/runs/"+run, &page)
	if got := strconv.FormatUint(page.Run.Episodes, 10); got != want["episodes"] {
		t.Errorf("api: %s episodes, SQL gives %s", got, want["episodes"])
	}
	var binned uint64
	for _, bin := range page.Histogram {
		binned += bin.Count
	}
	if binned != page.Run.Episodes {
		t.Errorf("api: the reward histogram holds %d episodes of %d", binned, page.Run.Episodes)
	}

	for _, e := range b.errors() {
		t.Errorf("browser: %s", e)
	}
}

// browser is a headless chromium tab that records console errors, warnings and
// exceptions.
type browser struct {
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

func newBrowser(t *testing.T, chromium string) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &browser{ctx: ctx}
	// The first call starts the browser, so it runs without a timeout (one would stop
	// the browser when it ends).
	err := chromedp.Listen(ctx, func(ev any) {
		b.mu.Lock()
		defer b.mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeWarning {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				b.errs = append(b.errs, fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
			}
		case *runtime.EventExceptionThrown:
			d := ev.ExceptionDetails
			msg := d.Text
			if d.Exception != nil {
				msg += " " + d.Exception.Description
			}
			b.errs = append(b.errs, fmt.Sprintf("exception at %s:%d: %s", d.URL, d.LineNumber+1, msg))
		case *cdplog.EventEntryAdded:
			if ev.Entry.Level == cdplog.EntryLevelError || ev.Entry.Level == cdplog.EntryLevelWarning {
				b.errs = append(b.errs, fmt.Sprintf("log %s: %s %s", ev.Entry.Level, ev.Entry.Text, ev.Entry.URL))
			}
		}
	})
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, runtime.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enable the runtime domain: %v", err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("enable the log domain: %v", err)
	}
	return b
}

// do runs actions with a bound, so a page that never shows what a test waits for
// fails the test instead of hanging it.
func (b *browser) do(actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

func (b *browser) eval(expr string) (int, error) {
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[int](expr))
}

func (b *browser) evalString(expr string) (string, error) {
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[string](expr))
}

// state is what the page shows and what the browser logged, for a failure's message.
func (b *browser) state() string {
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	main, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("main").textContent`))
	if err != nil {
		main = "(" + err.Error() + ")"
	}
	return fmt.Sprintf("\npage: %.2000s\nbrowser log: %q", main, b.errors())
}

func (b *browser) errors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.errs...)
}

func (b *browser) screenshot(t *testing.T, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", path, err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s", path)
}

// text is the visible text of the element sel, waiting up to a minute for it.
func text(t *testing.T, b *browser, sel string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		t.Fatalf("text of %s: %v%s", sel, err, b.state())
	}
	return strings.TrimSpace(s)
}

// waitText waits until the element sel shows want (the page refreshes by itself).
func waitText(t *testing.T, b *browser, sel, want string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var got string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		nodes, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSSAll(sel), chromedp.AtLeast(0)))
		if err == nil && len(nodes) > 0 {
			if s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel))); err == nil {
				got = strings.TrimSpace(s)
			}
		}
		cancel()
		if got == want {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("%s shows %q after %s, want %q%s", sel, got, within, want, b.state())
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, res.Status)
	}
	if err := json.NewDecoder(res.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

// pct and fixed3 format a number SQL printed as the console does (fmt.pct, fmt.reward).
func pct(s string) string {
	f, _ := strconv.ParseFloat(s, 64)
	return strconv.FormatFloat(100*f, 'f', 1, 64) + "%"
}

func fixed3(s string) string {
	f, _ := strconv.ParseFloat(s, 64)
	return strconv.FormatFloat(f, 'f', 3, 64)
}
