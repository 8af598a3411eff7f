package console

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
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
