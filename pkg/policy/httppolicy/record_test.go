package httppolicy

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// A run names the credential, never the key: the worker reads the key from its
// credentials directory and sends it. A credential the worker does not hold is an infra
// error of kind model endpoint, naming the credential.
func TestRunsNameTheirCredential(t *testing.T) {
	f := &fakeEndpoint{reply: func(int) (int, string) { return 200, toolReply("catalog__search", `{"query":"mug"}`) }}
	srv := httptest.NewServer(f) // answers only "Bearer k"
	defer srv.Close()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "lab-vllm"), []byte("k\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := New(Config{APIKey: "the process's own", CredentialsDir: dir, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ep := p.(policy.Endpointed)
	e, _ := env.Lookup("shop")
	withKey, err := ep.WithEndpoint(policy.Endpoint{URL: srv.URL + "/v1", Model: "m", Credential: "lab-vllm"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := withKey.NewAgent(e, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Act(env.Turn{Observation: json.RawMessage(`{}`)}); err != nil {
		t.Fatalf("with the credential's key: %v", err)
	}
	// Without a credential, the process's key: the endpoint refuses it.
	own, err := ep.WithEndpoint(policy.Endpoint{URL: srv.URL + "/v1"})
	if err != nil {
		t.Fatal(err)
	}
	if a, err = own.NewAgent(e, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Act(env.Turn{Observation: json.RawMessage(`{}`)}); err == nil || !strings.Contains(err.Error(), "answered 404") {
		t.Errorf("with the process's key: %v, want the endpoint's refusal", err)
	}
	for _, c := range []struct{ cred, want string }{
		{"missing", "credential missing"},
		{"empty", "is empty"},
		{"../lab-vllm", "not a credential name"},
	} {
		_, err := ep.WithEndpoint(policy.Endpoint{URL: srv.URL + "/v1", Credential: c.cred})
		if !errors.Is(err, ErrCredential) || !strings.Contains(err.Error(), c.want) ||
			errkind.InfraOf(err) != gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT {
			t.Errorf("credential %q: %v (kind %v), want a model endpoint infra error saying %q", c.cred, err, errkind.InfraOf(err), c.want)
		}
	}
	noDir, _ := New(Config{Timeout: time.Second})
	if _, err := noDir.(policy.Endpointed).WithEndpoint(policy.Endpoint{URL: srv.URL + "/v1", Credential: "lab-vllm"}); err == nil ||
		!strings.Contains(err.Error(), "--policy.http.credentials-dir") {
		t.Errorf("a credential on a process without credentials: %v", err)
	}
}

// logprobReply is a tool call with vLLM's token ids (return_token_ids) and OpenAI's
// logprobs; tokens as "token_id:N" when asIDs (vLLM's --return-tokens-as-token-ids),
// without the token_ids fields.
func logprobReply(prompt, completion []uint32, logprobs []float64, asIDs bool) string {
	var content []string
	for i, lp := range logprobs {
		tok := fmt.Sprintf("tok%d", i)
		if asIDs {
			tok = fmt.Sprintf("token_id:%d", completion[i])
		}
		content = append(content, fmt.Sprintf(`{"token":%q,"logprob":%v,"bytes":null,"top_logprobs":[]}`, tok, lp))
	}
	ids := func(name string, v []uint32) string {
		if asIDs {
			return ""
		}
		b, _ := json.Marshal(v)
		return fmt.Sprintf(`%q:%s,`, name, b)
	}
	return `{"model":"qwen3-8b",` + ids("prompt_token_ids", prompt) + `"choices":[{"index":0,` + ids("token_ids", completion) +
		`"logprobs":{"content":[` + strings.Join(content, ",") + `]},` +
		`"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"catalog__search","arguments":"{}"}}]}}]}`
}

// With --policy.http.logprobs the agent asks for logprobs and token ids and says, for
// each action, what the endpoint returned: token ids from vLLM's fields or its
// token_id:N tokens, the logprobs, the answering model; none when the endpoint returned
// none; the prompt's ids left out past MaxRecordedTokens.
func TestAgentRecordsTokenIDsAndLogprobs(t *testing.T) {
	big := make([]uint32, MaxRecordedTokens)
	replies := []string{
		logprobReply([]uint32{1, 2, 3}, []uint32{7, 8}, []float64{-0.25, -1.5}, false),
		logprobReply(nil, []uint32{9, 10, 11}, []float64{-0.5, -0.125, -2}, true),
		toolReply("catalog__search", `{}`),
		logprobReply(big, []uint32{12}, []float64{-1}, false),
	}
	f := &fakeEndpoint{reply: func(n int) (int, string) { return 200, replies[n-1] }}
	srv := httptest.NewServer(f)
	defer srv.Close()
	a, err := NewAgent(Config{URL: srv.URL + "/v1", Model: "m", APIKey: "k", Timeout: 5 * time.Second, Logprobs: true}, shopSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	src := a.(interface {
		LastTrainerData() *gauntletv1.TrainerData
	})
	want := []*gauntletv1.TrainerData{
		{PromptTokenIds: []uint32{1, 2, 3}, CompletionTokenIds: []uint32{7, 8}, Logprobs: []float32{-0.25, -1.5}, PolicyVersion: "qwen3-8b"},
		{CompletionTokenIds: []uint32{9, 10, 11}, Logprobs: []float32{-0.5, -0.125, -2}, PolicyVersion: "qwen3-8b"},
		nil,
		{CompletionTokenIds: []uint32{12}, Logprobs: []float32{-1}, PolicyVersion: "qwen3-8b"},
	}
	for i, w := range want {
		if _, err := a.Act(env.Turn{Step: uint32(i), Observation: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		got := src.LastTrainerData()
		if (got == nil) != (w == nil) || (w != nil && (!slices.Equal(got.PromptTokenIds, w.PromptTokenIds) ||
			!slices.Equal(got.CompletionTokenIds, w.CompletionTokenIds) || !slices.Equal(got.Logprobs, w.Logprobs) || got.PolicyVersion != w.PolicyVersion)) {
			t.Errorf("step %d: trainer data %v, want %v", i, got, w)
		}
	}
	if r := f.reqs[0]; !r.Logprobs || !r.ReturnTokenIDs {
		t.Errorf("request asked logprobs %v, token ids %v; want both", r.Logprobs, r.ReturnTokenIDs)
	}
	// Without the flag the request asks for neither (an endpoint may refuse the fields).
	plain, _ := NewAgent(Config{URL: srv.URL + "/v1", APIKey: "k", Timeout: 5 * time.Second}, shopSpec(t))
	replies = append(replies, toolReply("catalog__search", `{}`))
	if _, err := plain.Act(env.Turn{Observation: json.RawMessage(`{}`)}); err != nil {
		t.Fatal(err)
	}
	if r := f.reqs[4]; r.Logprobs || r.ReturnTokenIDs {
		t.Errorf("a request without --policy.http.logprobs asked logprobs %v, token ids %v", r.Logprobs, r.ReturnTokenIDs)
	}
}

// A run names whether it wants token ids and logprobs with its endpoint: on where the
// worker's flag is off, off where it is on (an endpoint that refuses the fields); a run
// that names neither gets the worker's flag.
func TestRunsNameLogprobs(t *testing.T) {
	f := &fakeEndpoint{reply: func(int) (int, string) {
		return 200, logprobReply([]uint32{1}, []uint32{7}, []float64{-0.5}, false)
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	e, _ := env.Lookup("shop")
	on, off := true, false
	for i, c := range []struct {
		process bool
		run     *bool
		want    bool
	}{{false, &on, true}, {true, &off, false}, {true, nil, true}, {false, nil, false}} {
		p, err := New(Config{APIKey: "k", Timeout: 5 * time.Second, Logprobs: c.process})
		if err != nil {
			t.Fatal(err)
		}
		withEp, err := p.(policy.Endpointed).WithEndpoint(policy.Endpoint{URL: srv.URL + "/v1", Model: "m", Logprobs: c.run})
		if err != nil {
			t.Fatal(err)
		}
		a, err := withEp.NewAgent(e, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Act(env.Turn{Observation: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		r := f.reqs[i]
		td := a.(interface {
			LastTrainerData() *gauntletv1.TrainerData
		}).LastTrainerData()
		run := "unnamed"
		if c.run != nil {
			run = fmt.Sprint(*c.run)
		}
		if r.Logprobs != c.want || r.ReturnTokenIDs != c.want || (c.want && td == nil) {
			t.Errorf("case %d, worker flag %v, run %s: asked logprobs %v, token ids %v, recorded %v; want asked %v", i, c.process, run, r.Logprobs, r.ReturnTokenIDs, td, c.want)
		}
	}
}
