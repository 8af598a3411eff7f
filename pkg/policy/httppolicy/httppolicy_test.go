package httppolicy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
)

// fakeEndpoint is a stand-in for an OpenAI-compatible server (outside the product): it
// records each request and answers with reply(n) for the n-th one.
type fakeEndpoint struct {
	mu    sync.Mutex
	reqs  []request
	reply func(n int) (int, string)
}

func (f *fakeEndpoint) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/chat/completions" || r.Header.Get("Authorization") != "Bearer k" {
		http.Error(w, "bad path or key", http.StatusNotFound)
		return
	}
	var req request
	body, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	n := len(f.reqs)
	f.mu.Unlock()
	code, out := f.reply(n)
	w.WriteHeader(code)
	fmt.Fprint(w, out)
}

func toolReply(fn, args string) string {
	b, _ := json.Marshal(args)
	return `{"choices":[{"message":{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"` + fn + `","arguments":` + string(b) + `}}]}}]}`
}

func shopSpec(t *testing.T) env.Spec {
	e, err := env.Lookup("shop")
	if err != nil {
		t.Fatal(err)
	}
	return e.Spec()
}

func TestAgentPlaysToolCallsWithToolSchemas(t *testing.T) {
	f := &fakeEndpoint{reply: func(n int) (int, string) {
		if n == 1 {
			return 200, toolReply("catalog__search", `{"query":"mug"}`)
		}
		return 200, toolReply("made_up_tool", `{not json`)
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	spec := shopSpec(t)
	a, err := NewAgent(Config{URL: srv.URL + "/v1", Model: "m", APIKey: "k", Timeout: 5 * time.Second}, spec)
	if err != nil {
		t.Fatal(err)
	}
	act, err := a.Act(env.Turn{Observation: json.RawMessage(`{"task":"buy"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if act.Tool != "catalog.search" || string(act.Args) != `{"query":"mug"}` {
		t.Errorf("first action = %s %s", act.Tool, act.Args)
	}
	// The model's odd choices are its actions, for the env to judge.
	act, err = a.Act(env.Turn{Step: 1, Observation: json.RawMessage(`{"ok":true}`)})
	if err != nil {
		t.Fatal(err)
	}
	if act.Tool != "made_up_tool" || string(act.Args) != `{not json` {
		t.Errorf("second action = %s %s", act.Tool, act.Args)
	}
	first := f.reqs[0]
	if len(first.Tools) != len(spec.Tools) || first.ToolChoice != "required" || first.Model != "m" {
		t.Fatalf("request: %d tools (want %d), tool_choice %q, model %q", len(first.Tools), len(spec.Tools), first.ToolChoice, first.Model)
	}
	for i, td := range first.Tools {
		if td.Function.Name != functionName(spec.Tools[i].Name) || string(td.Function.Parameters) != string(spec.Tools[i].Schema) {
			t.Errorf("tool %d = %s %s, want %s's schema", i, td.Function.Name, td.Function.Parameters, spec.Tools[i].Name)
		}
	}
	// The second request carries the conversation: system, user, assistant call, tool result.
	second := f.reqs[1].Messages
	roles := []string{}
	for _, m := range second {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "system,user,assistant,tool" || second[3].ToolCallID != "c1" || second[3].Content != `{"ok":true}` {
		t.Errorf("second request messages = %+v", second)
	}
}

func TestEndpointFailuresAreInfraErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  int
		body  string
		sleep time.Duration
		want  string
	}{
		{"timeout", 200, toolReply("catalog__search", "{}"), 3 * time.Second, "did not answer within"},
		{"server error", 503, `overloaded`, 0, "answered 503"},
		{"not JSON", 200, `<html>`, 0, "malformed reply"},
		{"no choices", 200, `{"choices":[]}`, 0, "no choices"},
		{"no tool call", 200, `{"choices":[{"message":{"role":"assistant","content":"I think..."}}]}`, 0, "no tool call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(&fakeEndpoint{reply: func(int) (int, string) {
				time.Sleep(tc.sleep)
				return tc.code, tc.body
			}})
			defer srv.Close()
			// Timeout well below the slow reply and well above a busy machine's latency.
			a, err := NewAgent(Config{URL: srv.URL + "/v1", APIKey: "k", Timeout: time.Second}, shopSpec(t))
			if err != nil {
				t.Fatal(err)
			}
			_, err = a.Act(env.Turn{Observation: json.RawMessage(`{}`)})
			if err == nil || !strings.Contains(err.Error(), "infra error") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Act error = %v, want an infra error mentioning %q", err, tc.want)
			}
		})
	}
}

func TestRegisteredAndConfigured(t *testing.T) {
	p, err := policy.Lookup(Name)
	if err != nil {
		t.Fatal(err)
	}
	e, _ := env.Lookup("shop")
	if _, err := p.NewAgent(e, 1); err == nil || !strings.Contains(err.Error(), "policy.http.url") {
		t.Errorf("NewAgent of the registered policy: %v", err)
	}
	unset, err := New(Config{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unset.NewAgent(e, 1); err == nil || !strings.Contains(err.Error(), "policy.http.url") {
		t.Errorf("NewAgent without a URL: %v", err)
	}
	if _, err := New(Config{URL: "ftp://x", Timeout: 0}); err == nil || !strings.Contains(err.Error(), "policy.http.url") || !strings.Contains(err.Error(), "policy.http.timeout") {
		t.Errorf("New(bad) = %v", err)
	}
}

// Two configurations in one process each reach their own endpoint: nothing is global.
func TestSetsDoNotClash(t *testing.T) {
	e, _ := env.Lookup("shop")
	var sets []*policy.Set
	var ends []*fakeEndpoint
	for range 2 {
		f := &fakeEndpoint{reply: func(int) (int, string) { return 200, toolReply("catalog__search", `{"query":"mug"}`) }}
		srv := httptest.NewServer(f)
		t.Cleanup(srv.Close)
		p, err := New(Config{URL: srv.URL + "/v1", APIKey: "k", Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		sets, ends = append(sets, policy.NewSet(p)), append(ends, f)
	}
	for i, s := range sets {
		p, err := s.Lookup(Name)
		if err != nil {
			t.Fatal(err)
		}
		a, err := p.NewAgent(e, 1)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Act(env.Turn{Observation: json.RawMessage(`{}`)}); err != nil {
			t.Fatal(err)
		}
		for j, f := range ends {
			f.mu.Lock()
			n := len(f.reqs)
			f.mu.Unlock()
			if want := b2i(j <= i); n != want {
				t.Errorf("after set %d's agent acted, endpoint %d has %d requests, want %d", i, j, n, want)
			}
		}
	}
	// Names the set does not configure are the registered policies.
	if p, err := sets[0].Lookup(policy.Oracle); err != nil || p.Name() != policy.Oracle {
		t.Errorf("Lookup(oracle) = %v, %v", p, err)
	}
	var none *policy.Set
	if _, err := none.Lookup("genius"); !errors.Is(err, policy.ErrUnknownPolicy) {
		t.Errorf("nil set Lookup(genius) = %v", err)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
