package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/workflows"
)

// tokenModel is a stand-in for a vLLM server (outside the product): it answers only the
// bearer key it was given, with a catalogue search and, as vLLM does with logprobs and
// return_token_ids asked, the prompt's and the completion's token ids and the logprobs;
// under /down/ it fails every call.
type tokenModel struct {
	key   string
	calls atomic.Int32
}

func (m *tokenModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Logprobs       bool `json:"logprobs"`
		ReturnTokenIDs bool `json:"return_token_ids"`
	}
	body, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(body, &req)
	m.calls.Add(1)
	switch {
	case r.Header.Get("Authorization") != "Bearer "+m.key:
		http.Error(w, `{"error":"bad key"}`, http.StatusUnauthorized)
		return
	case strings.HasPrefix(r.URL.Path, "/down/"):
		http.Error(w, `{"error":"overloaded"}`, http.StatusServiceUnavailable)
		return
	case !req.Logprobs || !req.ReturnTokenIDs:
		http.Error(w, `{"error":"logprobs and return_token_ids not asked"}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"model":"stand-in-8b","prompt_token_ids":[1,2,3,4],"choices":[{"index":0,"token_ids":[501,502,503],`+
		`"logprobs":{"content":[{"token":"a","logprob":-0.5},{"token":"b","logprob":-0.25},{"token":"c","logprob":-0.125}]},`+
		`"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"catalog__search","arguments":"{\"query\":\"mug\"}"}}]}}]}`)
}

// TestHTTPPolicyCurriculum runs a curriculum of the http policy on the whole stack
// against a stand-in endpoint. Its first stage names the endpoint, its model and the
// name of the credential whose key the worker reads from its credentials directory; its
// episodes play, their steps carry the token ids and logprobs the endpoint returned
// (trainer_steps), and the stage promotes. Its second stage's endpoint fails every call:
// its batch is all infra errors, so the curriculum takes no decision on it and pauses,
// saying why. The key is nowhere in ClickHouse or in Temporal's history.
func TestHTTPPolicyCurriculum(t *testing.T) {
	if testing.Short() {
		t.Skip("needs ClickHouse and Temporal; run without -short")
	}
	const key = "sk-stand-in-9f3a7c"
	model := &tokenModel{key: key}
	srv := httptest.NewServer(model)
	defer srv.Close()
	creds := t.TempDir()
	if err := os.WriteFile(filepath.Join(creds, "lab-vllm"), []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.Worker.MaxDeliver = 1 // an infra error is recorded at once, not retried
	cfg.PolicyHTTP.CredentialsDir, cfg.PolicyHTTP.Logprobs = creds, true
	s := startStack(t, cfg, modAll)
	if err := writeStack(cfg.DataDir, stack{NATSURL: s.app.natsURL(), ClickHouse: s.app.clickHouseAddr(), Database: cfg.Database, Temporal: s.app.temporalAddr()}); err != nil {
		t.Fatal(err)
	}
	tc := dialTemporal(t, s.app.temporalAddr())
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	db := cfg.Database

	spec := fmt.Sprintf(`
name: http-e2e
seed: 5
stages:
  - name: served
    env: shop
    policies: http=1
    profiles: baseline=1
    max_steps: 2
    episodes: {max: 10}
    promotion: {metric: success_rate, threshold: 0, window: 10}
    policy_endpoint: {url: '%[1]s/v1', model: stand-in-8b, credential: lab-vllm}
  - name: down
    env: shop
    policies: http=1
    profiles: baseline=1
    max_steps: 2
    episodes: {max: 10}
    promotion: {metric: success_rate, threshold: 0, window: 10}
    policy_endpoint: {url: '%[1]s/down/v1', credential: lab-vllm}
`, srv.URL)
	// A key where the credential's name belongs is refused before anything starts.
	bad := strings.Replace(spec, "credential: lab-vllm}", "credential: "+key+"}", 1)
	if out, err := gauntletCLI(t, "curriculum", "start", "-f", writeFile(t, "bad.yaml", bad), "--data-dir", cfg.DataDir); err == nil ||
		!strings.Contains(err.Error(), "stages[0].policy_endpoint.credential: looks like a key") {
		t.Fatalf("a key in the spec: %v\n%s", err, out)
	}
	out, err := gauntletCLI(t, "curriculum", "start", "-f", writeFile(t, "http.yaml", spec), "--id", "curriculum-http-e2e", "--data-dir", cfg.DataDir)
	if err != nil {
		t.Fatalf("curriculum start: %v\n%s", err, out)
	}
	id := strings.TrimSpace(out)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var p workflows.Progress
	waitFor(ctx, t, func() bool { p = curriculumQuery(t, tc, id); return p.Status == workflows.StatusPaused })
	if len(p.Reports) != 1 || p.Reports[0].Outcome != workflows.OutcomePromoted || p.Reports[0].Episodes != 10 || p.Reports[0].InfraErrors != 0 {
		t.Errorf("stage served: %+v; want promoted after 10 episodes, no infra error", p.Reports)
	}
	if p.Stage != 1 || p.StageEpisodes != 10 || p.StageInfraErrors != 10 || p.WindowEpisodes != 0 ||
		p.StageInfraByKind["model_endpoint"] != 10 || !strings.Contains(p.PauseReason, "10 of 10 episodes ended as infra errors (model_endpoint 10)") {
		t.Errorf("stage down: %+v; want paused on its batch of 10 infra errors, no decision taken", p)
	}
	out, err = gauntletCLI(t, "curriculum", "status", id, "--data-dir", cfg.DataDir)
	if err != nil || !strings.Contains(out, "paused by itself: stage 1 (down)") {
		t.Errorf("curriculum status: %v\n%s", err, out)
	}

	// The served stage's steps carry what the endpoint returned, with each step.
	served := workflows.StageRunPrefix(p.RunPrefix, 0)
	waitFor(ctx, t, func() bool {
		return queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.trainer_steps FINAL WHERE startsWith(run_id, '%s')`, db, served)) ==
			queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.steps FINAL WHERE startsWith(run_id, '%s')`, db, served))
	})
	for _, c := range []struct{ what, query, want string }{
		{"steps of the served stage, each with token ids and logprobs",
			fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(countIf(completion_token_ids = [501, 502, 503] AND prompt_token_ids = [1, 2, 3, 4]
				AND logprobs = [-0.5, -0.25, -0.125] AND policy_version = 'stand-in-8b'))) FROM %s.trainer_steps FINAL WHERE startsWith(run_id, '%s')`, db, served),
			"20 20"},
		{"episodes of the down stage: model endpoint infra errors",
			fmt.Sprintf(`SELECT toString(countIf(infra_kind = 'model_endpoint')) FROM %s.episodes FINAL WHERE startsWith(run_id, '%s')`, db, workflows.StageRunPrefix(p.RunPrefix, 1)),
			"10"},
		{"runs recording the endpoint and the credential's name",
			fmt.Sprintf(`SELECT concat(toString(countIf(policy_credential = 'lab-vllm')), ' ', toString(countIf(policy_model = 'stand-in-8b')), ' ',
				toString(countIf(position(policy_url, '%s') = 1))) FROM %s.runs FINAL WHERE curriculum_id = '%s'`, srv.URL, db, id),
			"2 1 2"},
		{"the key in the runs table", fmt.Sprintf(`SELECT count() FROM %s.runs FINAL WHERE position(concat(policy_url, policy_model, policy_credential, params, label), '%s') > 0`, db, key), "0"},
	} {
		waitFor(ctx, t, func() bool { return queryOne(t, conn, c.query) == c.want })
	}

	if _, err := gauntletCLI(t, "curriculum", "abort", id, "--data-dir", cfg.DataDir); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, func() bool {
		d, err := tc.DescribeWorkflow(ctx, id, "")
		return err == nil && d.RawResponse.GetWorkflowExecutionInfo().GetStatus() == enums.WORKFLOW_EXECUTION_STATUS_CANCELED
	})
	// Temporal's history holds the endpoint and the credential's name, never the key.
	iter := tc.GetWorkflowHistory(ctx, id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var events, named int
	for iter.HasNext() {
		ev, err := iter.Next()
		if err != nil {
			t.Fatal(err)
		}
		events++
		// The wire form holds each payload's bytes (JSON) as they are.
		raw, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte(key)) {
			t.Errorf("history event %d (%v) holds the key", ev.GetEventId(), ev.GetEventType())
		}
		if bytes.Contains(raw, []byte(`"credential":"lab-vllm"`)) {
			named++
		}
	}
	if events == 0 || named == 0 {
		t.Errorf("%d history events, %d naming the credential; want some of each", events, named)
	}
}
