package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	connectrpc "connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// smallEnvAPIStack runs the env API with the faults and reward services only (no worker,
// no ClickHouse): enough for calls whose answer does not depend on the record.
func smallEnvAPIStack(t *testing.T) *testStack {
	t.Helper()
	cfg := testConfig(t)
	tokens := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(tokens, []byte("tenants:\n  - name: acme\n    tokens: ["+tokenAcme+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.EnvAPI.TokensFile = tokens
	return startStack(t, cfg, modEnvAPI, modFaults, modReward)
}

// TestEnvAPIRefusesWhatItWouldMisread sends requests a careless trainer writes: a field
// under a name the API does not know (args for argsJson, a misspelled trainer key, a
// typo in Reset) and trainer data that contradicts itself. Each is a 400 naming the
// field, and the episode is untouched; over gRPC the same trainer data is refused too.
func TestEnvAPIRefusesWhatItWouldMisread(t *testing.T) {
	s := smallEnvAPIStack(t)
	addr := s.app.envapi.Addr()

	code, _, body := jsonCall(t, addr, tokenAcme, "Reset", `{"env":"shop","seed":"5"}`)
	if code != http.StatusOK {
		t.Fatalf("Reset: %d %v", code, body)
	}
	id := body["episodeId"].(string)
	step := func(rest string) string { return fmt.Sprintf(`{"episodeId":%q,%s}`, id, rest) }
	good := `"action":{"tool":"catalog.search","argsJson":"{\"query\":\"mug\"}"}`
	for _, tc := range []struct{ name, method, body, want string }{
		{"args instead of argsJson", "Step", step(`"action":{"tool":"catalog.search","args":{"query":"mug"}}`), `"args"`},
		{"misspelled trainer key", "Step", step(good + `,"trainer":{"completionTokenIds":[1,2],"logProbs":[-0.1,-0.2]}`), `"logProbs"`},
		{"unknown top-level field", "Step", step(good + `,"policyVersion":"v1"`), `"policyVersion"`},
		{"unknown Reset field", "Reset", `{"env":"shop","sead":"3"}`, `"sead"`},
		{"fewer logprobs than completion tokens", "Step", step(good + `,"trainer":{"completionTokenIds":[1,2,3],"logprobs":[-0.1]}`), "trainer.logprobs"},
		{"logprobs without completion tokens", "Step", step(good + `,"trainer":{"logprobs":[-0.1]}`), "trainer.logprobs"},
		{"a logprob that is not a log-probability", "Step", step(good + `,"trainer":{"completionTokenIds":[1,2],"logprobs":[-0.1,0.7]}`), "trainer.logprobs[1]"},
		{"a NaN logprob", "Step", step(good + `,"trainer":{"completionTokenIds":[1],"logprobs":["NaN"]}`), "trainer.logprobs[0]"},
	} {
		code, _, body := jsonCall(t, addr, tokenAcme, tc.method, tc.body)
		if code != http.StatusBadRequest || body["code"] != "invalid_argument" || !strings.Contains(fmt.Sprint(body["message"]), tc.want) {
			t.Errorf("%s: HTTP %d %v, want 400 invalid_argument naming %s", tc.name, code, body, tc.want)
		}
	}
	// Nothing above touched the episode: the next good step is its first, and trainer
	// data that agrees with itself is taken.
	code, _, body = jsonCall(t, addr, tokenAcme, "Step", step(good+`,"trainer":{"promptTokenIds":[9],"completionTokenIds":[1,2],"logprobs":[-0.1,0],"policyVersion":"v1"}`))
	if code != http.StatusOK || body["step"] != nil && body["step"] != float64(0) {
		t.Fatalf("a good step after the refused ones: HTTP %d %v, want step 0", code, body)
	}

	// A batch refuses the bad item and steps the good one.
	code, _, body = jsonCall(t, addr, tokenAcme, "Reset", `{"env":"shop","seed":"6"}`)
	if code != http.StatusOK {
		t.Fatalf("Reset: %d %v", code, body)
	}
	id2 := body["episodeId"].(string)
	code, _, body = jsonCall(t, addr, tokenAcme, "StepBatch", fmt.Sprintf(`{"steps":[
		{"episodeId":%q,%s,"trainer":{"completionTokenIds":[1],"logprobs":[-1,-2]}},
		{"episodeId":%q,%s}]}`, id, good, id2, good))
	if code != http.StatusOK {
		t.Fatalf("StepBatch: %d %v", code, body)
	}
	results, _ := body["results"].([]any)
	if len(results) != 2 {
		t.Fatalf("StepBatch: %d results, want 2: %v", len(results), body)
	}
	for _, r := range results {
		r := r.(map[string]any)
		e, _ := r["error"].(map[string]any)
		switch r["episodeId"] {
		case id:
			if e["code"] != "invalid_argument" || !strings.Contains(fmt.Sprint(e["message"]), "trainer.logprobs") {
				t.Errorf("the bad item: %v, want invalid_argument naming trainer.logprobs", r)
			}
		case id2:
			if e != nil {
				t.Errorf("the good item: %v", r)
			}
		}
	}

	// gRPC carries no unknown JSON, but the same trainer data is refused there too.
	_, err := grpcClient(addr, tokenAcme).Step(context.Background(), connectrpc.NewRequest(&gauntletv1.StepRequest{
		EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: `{"query":"mug"}`},
		Trainer: &gauntletv1.TrainerData{CompletionTokenIds: []uint32{1, 2}, Logprobs: []float32{-0.5}},
	}))
	if connectrpc.CodeOf(err) != connectrpc.CodeInvalidArgument || !strings.Contains(err.Error(), "trainer.logprobs") {
		t.Errorf("gRPC step with 2 tokens and 1 logprob: %v, want invalid_argument naming trainer.logprobs", err)
	}
}

// TestEnvAPIAfterRestart restarts the env API on the same data dir, as `gauntlet up`
// twice does, with no tenants file: the dev token a trainer read before the restart
// still works, and an episode that was live before answers the documented "episode
// over: the server restarted" (failed_precondition with the reason SERVER_RESTARTED),
// not 404, while an id the server never issued stays 404. The Python client raises
// ServerRestartedError for it.
func TestEnvAPIAfterRestart(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	s := startStack(t, cfg, modEnvAPI, modFaults, modReward)
	tokenPath := filepath.Join(cfg.DataDir, "envapi-token")
	raw, err := os.ReadFile(tokenPath)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(raw))
	if fi, err := os.Stat(tokenPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the dev token file: %v, %v; want mode 0600", fi.Mode(), err)
	}
	addr := s.app.envapi.Addr()
	client := grpcClient(addr, token)
	var ids []string
	for seed := range uint64(4) {
		r, err := client.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: seed}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Msg.EpisodeId)
	}
	if _, err := client.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: ids[0], Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: `{"query":"mug"}`}})); err != nil {
		t.Fatal(err)
	}
	if err := s.stop(); err != nil {
		t.Fatal(err)
	}

	s = startStack(t, cfg, modEnvAPI, modFaults, modReward)
	addr = s.app.envapi.Addr()
	if raw2, err := os.ReadFile(tokenPath); err != nil || string(raw2) != string(raw) {
		t.Errorf("the dev token file changed across the restart: %q, then %q (%v)", raw, raw2, err)
	}
	client = grpcClient(addr, token)
	if _, err := client.Capacity(ctx, connectrpc.NewRequest(&gauntletv1.CapacityRequest{})); err != nil {
		t.Fatalf("the token from before the restart: %v", err)
	}
	// Over gRPC: the code, the message and the ErrorInfo detail.
	_, err = client.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: ids[0], Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: "{}"}}))
	if connectrpc.CodeOf(err) != connectrpc.CodeFailedPrecondition || !strings.Contains(err.Error(), "episode over: the server restarted") {
		t.Fatalf("a step of an episode live before the restart: %v, want failed_precondition \"episode over: the server restarted\"", err)
	}
	if reason := restartReason(err); reason != "SERVER_RESTARTED" {
		t.Errorf("the error's ErrorInfo reason = %q, want SERVER_RESTARTED", reason)
	}
	// Over HTTP/JSON: 400 with the detail's debug form, which a JSON client reads.
	code, _, body := jsonCall(t, addr, token, "Step", fmt.Sprintf(`{"episodeId":%q,"action":{"tool":"catalog.search","argsJson":"{}"}}`, ids[1]))
	if code != http.StatusBadRequest || body["code"] != "failed_precondition" || !strings.Contains(fmt.Sprint(body["details"]), "SERVER_RESTARTED") {
		t.Errorf("HTTP/JSON step of an episode live before the restart: %d %v", code, body)
	}
	// Snapshot too; Close, which is idempotent, answers that it had ended.
	if _, err := client.Snapshot(ctx, connectrpc.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: ids[2]})); restartReason(err) != "SERVER_RESTARTED" {
		t.Errorf("Snapshot of an episode live before the restart: %v", err)
	}
	c, err := client.Close(ctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: ids[2]}))
	if err != nil || c.Msg.ClosedNow || c.Msg.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR {
		t.Errorf("Close of an episode live before the restart: %v, %v; want ended by an infra error, not closed now", c, err)
	}
	// The ids the restarted server issues sort after those of the server before it, in
	// issue order, so the console pages the tenant's run by its key across the restart.
	for range 2 {
		r, err := client.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 9}))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Msg.EpisodeId)
	}
	for i, id := range ids {
		if _, ok := runs.IssuedAt("api-default", id); !ok || (i > 0 && id <= ids[i-1]) {
			t.Errorf("episode id %d, %s: in issue order %v, after %s", i, id, ok, ids[max(i-1, 0)])
		}
	}
	// An id never issued is still 404, however like a real one it looks.
	for _, fake := range []string{ids[3][:len(ids[3])-1] + flipHex(ids[3][len(ids[3])-1]), "api-default-0123456789abcdef", "nope"} {
		_, err := client.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: fake, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: "{}"}}))
		if connectrpc.CodeOf(err) != connectrpc.CodeNotFound {
			t.Errorf("a step of %q, never issued: %v, want not_found", fake, err)
		}
	}

	t.Run("python client", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Fatalf("python3 is required for the Python client's tests: %v", err)
		}
		cmd := exec.Command(py, "-m", "unittest", "-v", "tests.restarted")
		cmd.Dir = filepath.Join("..", "..", "clients", "python")
		cmd.Env = append(os.Environ(), "GAUNTLET_URL=http://"+addr, "GAUNTLET_TOKEN="+token, "GAUNTLET_RESTARTED_EPISODE="+ids[3])
		out, err := cmd.CombinedOutput()
		t.Logf("python3 -m unittest tests.restarted:\n%s", out)
		if err != nil {
			t.Fatalf("python client after a restart: %v", err)
		}
	})
}

// restartReason is the reason of err's ErrorInfo detail, if any.
func restartReason(err error) string {
	var ce *connectrpc.Error
	if !errors.As(err, &ce) {
		return ""
	}
	for _, d := range ce.Details() {
		v, derr := d.Value()
		if info, ok := v.(*errdetails.ErrorInfo); derr == nil && ok {
			return info.Reason
		}
	}
	return ""
}

// flipHex changes a hex digit into another.
func flipHex(c byte) string {
	if c == '0' {
		return "1"
	}
	return "0"
}
