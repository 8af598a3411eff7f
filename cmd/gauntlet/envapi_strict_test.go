package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	connectrpc "connectrpc.com/connect"

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
