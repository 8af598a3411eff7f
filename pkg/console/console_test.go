package console

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
)

func newTestConsole(addr string) *Console {
	return New(Config{ClickHouse: func() string { return addr }, Database: "gauntlet"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
}

// TestRequestsCheckedBeforeReading sends malformed requests to a console whose
// ClickHouse does not exist: each is refused as the client's mistake (400) naming what
// is wrong, before any connection is tried (which would answer 503).
func TestRequestsCheckedBeforeReading(t *testing.T) {
	c := newTestConsole("127.0.0.1:1")
	for _, tc := range []struct{ path, want string }{
		{"/console/api/runs?limit=501", "limit"},
		{"/console/api/runs?limit=-1", "limit"},
		{"/console/api/runs?limit=x", "limit"},
		{"/console/api/runs?sort=env", `unknown query parameter "sort"`},
		{"/console/api/runs/r1'%20OR%201=1", "run id"},
		{"/console/api/runs/r1/episodes?limit=1001", "limit"},
		{"/console/api/runs/r1/episodes?offset=-5", "offset"},
		{"/console/api/episodes/e;DROP", "episode id"},
		{"/console/api/episodes/e1?limit=201", "limit"},
		{"/console/api/episodes/e1?from=x", "from"},
	} {
		t.Run(tc.path, func(t *testing.T) {
			rec := httptest.NewRecorder()
			c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("status %d, want 400: %s", rec.Code, rec.Body)
			}
			var body struct{ Error string }
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body, err)
			}
			if !strings.Contains(body.Error, tc.want) {
				t.Errorf("error %q does not name %q", body.Error, tc.want)
			}
		})
	}
}

// TestUnreachableClickHouseIs503 checks that a console whose ClickHouse does not answer
// says so (503, naming the server) instead of failing the page with a 500.
func TestUnreachableClickHouseIs503(t *testing.T) {
	c := newTestConsole("127.0.0.1:1")
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console/api/runs", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "127.0.0.1:1") {
		t.Fatalf("status %d body %s, want 503 naming the address", rec.Code, rec.Body)
	}
}

// TestPagesServedFromTheBinary checks that the page and every file it loads are served
// from the embedded files, with types a browser accepts for modules and styles.
func TestPagesServedFromTheBinary(t *testing.T) {
	c := newTestConsole("")
	for _, tc := range []struct{ path, ctype, contains string }{
		{"/console/", "text/html", `src="static/app.js"`},
		{"/console/static/app.js", "text/javascript", `from "./vendor/uPlot.esm.js"`},
		{"/console/static/style.css", "text/css", "body"},
		{"/console/static/vendor/uPlot.esm.js", "text/javascript", "export"},
		{"/console/static/vendor/uPlot.min.css", "text/css", ".uplot"},
	} {
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
		if rec.Code != http.StatusOK {
			t.Errorf("%s: status %d", tc.path, rec.Code)
			continue
		}
		if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, tc.ctype) {
			t.Errorf("%s: Content-Type %q, want %s", tc.path, ct, tc.ctype)
		}
		if !strings.Contains(rec.Body.String(), tc.contains) {
			t.Errorf("%s: body lacks %q", tc.path, tc.contains)
		}
	}
	rec := httptest.NewRecorder()
	c.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console/nothing-here", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("/console/nothing-here: status %d, want 404", rec.Code)
	}
}

// TestActionsNeedAToken sends curriculum signals to consoles without Temporal: a bad
// signal is the client's mistake (400), a console without tokens refuses every action
// (403), and one with tokens refuses a missing or unknown token (401) before it asks
// Temporal anything (which, absent here, would answer 503).
func TestActionsNeedAToken(t *testing.T) {
	readOnly := newTestConsole("127.0.0.1:1")
	guarded := New(Config{
		ClickHouse: func() string { return "127.0.0.1:1" }, Database: "gauntlet",
		Authorize: func(tok string) bool { return tok == "good-token-0123456789" },
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, tc := range []struct {
		name   string
		c      *Console
		path   string
		auth   string
		status int
		want   string
	}{
		{"unknown signal", guarded, "/console/api/curricula/c1/signal/explode", "Bearer good-token-0123456789", http.StatusBadRequest, "want one of pause, resume, skip, abort"},
		{"bad id", guarded, "/console/api/curricula/c1;x/signal/pause", "Bearer good-token-0123456789", http.StatusBadRequest, "curriculum id"},
		{"read-only console", readOnly, "/console/api/curricula/c1/signal/pause", "Bearer good-token-0123456789", http.StatusForbidden, "takes no actions"},
		{"no token", guarded, "/console/api/curricula/c1/signal/pause", "", http.StatusUnauthorized, "need an env API token"},
		{"not a bearer", guarded, "/console/api/curricula/c1/signal/pause", "Basic Zm9vOmJhcg==", http.StatusUnauthorized, "need an env API token"},
		{"unknown token", guarded, "/console/api/curricula/c1/signal/abort", "Bearer bad-token-0123456789", http.StatusUnauthorized, "unknown API token"},
		{"good token, no Temporal", guarded, "/console/api/curricula/c1/signal/resume", "Bearer good-token-0123456789", http.StatusServiceUnavailable, "no Temporal server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			rec := httptest.NewRecorder()
			tc.c.ServeHTTP(rec, req)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.want) {
				t.Fatalf("status %d body %s, want %d naming %q", rec.Code, rec.Body, tc.status, tc.want)
			}
			if tc.status == http.StatusUnauthorized && rec.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
		})
	}
	// Reading needs no token; without Temporal the curricula pages say what is missing.
	rec := httptest.NewRecorder()
	guarded.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console/api/curricula", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "Temporal") {
		t.Errorf("curricula without Temporal: status %d body %s, want 503 naming Temporal", rec.Code, rec.Body)
	}
	// GET on an action's path is not an action.
	rec = httptest.NewRecorder()
	guarded.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/console/api/curricula/c1/signal/pause", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET of a signal: status %d, want 405", rec.Code)
	}
}

// TestDocsShowTheHeatmapQuery: docs/querying.md prints the fault heatmap's query as the
// console runs it (less the console's LIMIT), so an analyst's numbers are the page's.
func TestDocsShowTheHeatmapQuery(t *testing.T) {
	data, err := os.ReadFile("../../docs/querying.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)<!-- console:fault_heatmap -->\n```sql\n(.*?)\n```").FindSubmatch(data)
	if m == nil {
		t.Fatal("docs/querying.md has no <!-- console:fault_heatmap --> block")
	}
	want := strings.ReplaceAll(strings.ReplaceAll(faultHeatmapSQL, "{db}", "gauntlet"), "?", "'r…'")
	if string(m[1]) != want {
		t.Errorf("docs/querying.md, console:fault_heatmap:\n%s\nthe console runs:\n%s", m[1], want)
	}
}
