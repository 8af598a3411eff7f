package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// halfFailingModel is a stand-in for an OpenAI-compatible endpoint (outside the product):
// every second call fails with a 503, the others answer with a catalogue search.
type halfFailingModel struct{ calls atomic.Int32 }

func (m *halfFailingModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	if m.calls.Add(1)%2 == 0 {
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"catalog__search","arguments":"{\"query\":\"mug\"}"}}]}}]}`)
}

// TestHTTPPolicyRunAgainstAFlakyEndpoint runs the http policy through the whole stack
// with the endpoint named per run, against an endpoint that fails half its calls: those
// episodes are infra errors of kind model_endpoint that carry no reward, and the run's
// summary and episodes_scored leave them out. A run naming the policy without an endpoint
// is refused before it is submitted, naming the field.
func TestHTTPPolicyRunAgainstAFlakyEndpoint(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse; run without -short")
	}
	model := &halfFailingModel{}
	srv := httptest.NewServer(model)
	defer srv.Close()
	cfg := testConfig(t)
	cfg.Worker.MaxDeliver = 1 // a failed episode is recorded at once, not retried
	cfg.NATSPort = 0          // on TCP, for the CLI
	s := startStack(t, cfg)
	db := cfg.Database
	stack := []string{"--nats", s.app.natsURL(), "--clickhouse", s.app.clickHouseAddr(), "--database", db, "--data-dir", t.TempDir()}

	out, err := runCLI(t, append([]string{"run", "--policies", "http=1", "--episodes", "4"}, stack...)...)
	if err == nil || !strings.Contains(err.Error()+out, "policy_endpoint.url: policy http needs its model endpoint (gauntlet run --policy.http.url URL)") {
		t.Fatalf("a run of the http policy without an endpoint: %v\n%s", err, out)
	}

	const episodes = 20
	out, err = runCLI(t, append([]string{"run", "--policies", "http=1", "--policy.http.url", srv.URL + "/v1", "--policy.http.model", "m",
		"--profiles", "baseline=1", "--episodes", fmt.Sprint(episodes), "--max-steps", "1", "--seed", "3", "--label", t.Name()}, stack...)...)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, out)
	}
	t.Logf("gauntlet run:\n%s", out)
	if n := model.calls.Load(); n != episodes {
		t.Errorf("the endpoint was asked %d times, want %d", n, episodes)
	}
	// The summary's row: policy profile episodes success_rate mean_reward mean_steps faults infra_errors.
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) == 8 && f[0] == "http" {
			row = f
		}
	}
	if row == nil || row[2] != fmt.Sprint(episodes) || row[5] != "1" || row[7] != fmt.Sprint(episodes/2) {
		t.Errorf("summary row %v: want %d episodes, mean_steps 1 (infra errors, with 0 steps, left out), %d infra errors", row, episodes, episodes/2)
	}
	conn := connect(t, s.app.clickHouseAddr(), db)
	run := queryOne(t, conn, fmt.Sprintf(`SELECT run_id FROM %s.episodes_final WHERE policy = 'http' LIMIT 1`, db))
	for _, c := range []struct{ what, query, want string }{
		{"infra errors, model_endpoint ones, with a reward, with the 503",
			fmt.Sprintf(`SELECT concat(toString(countIf(infra_error = 1)), ' ', toString(countIf(infra_kind = 'model_endpoint')), ' ',
				toString(countIf(infra_error = 1 AND total_reward != 0)), ' ', toString(countIf(infra_error = 1 AND position(error, 'endpoint answered 503') > 0)))
				FROM %s.episodes_final WHERE run_id = '%s'`, db, run),
			fmt.Sprintf("%d %d 0 %d", episodes/2, episodes/2, episodes/2)},
		{"episodes_scored: the others, none an infra error",
			fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(sum(infra_error)), ' ', toString(countIf(infra_kind != ''))) FROM %s.episodes_scored WHERE run_id = '%s'`, db, run),
			fmt.Sprintf("%d 0 0", episodes/2)},
	} {
		if got := queryOne(t, conn, c.query); got != c.want {
			t.Errorf("%s: %s, want %s", c.what, got, c.want)
		}
	}
}
