package envapi

import (
	"encoding/json"
	"errors"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

func TestMCPReset(t *testing.T) {
	q, _ := url.ParseQuery(`seed=42&profile=stress&params={"qty":2}&max_steps=9&policy=claude`)
	r, err := mcpReset("shop", q)
	if err != nil {
		t.Fatal(err)
	}
	if r.Env != "shop" || r.Seed != 42 || r.Profile != "stress" || r.ParamsJson != `{"qty":2}` || r.MaxSteps != 9 || r.Policy != "claude" {
		t.Errorf("mcpReset = %v", r)
	}
	if r, err := mcpReset("shop", nil); err != nil || r.Policy != "mcp" || r.Seed != 0 {
		t.Errorf("no query: %v, %v; want policy mcp, seed 0", r, err)
	}
	// Every problem at once, each naming its parameter.
	q, _ = url.ParseQuery(`seed=x&seed=2&max_steps=-1&sead=3`)
	_, err = mcpReset("shop", q)
	for _, want := range []string{"query seed: given 2 times", "query max_steps:", "query sead: unknown parameter"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad query: %v, want it to say %q", err, want)
		}
	}
}

// TestMCPRefusesWorldsOfSeveralAgents: an MCP session is one agent, so a world with
// roles is refused when the session opens, naming its roles, not served with tool names
// MCP does not allow.
func TestMCPRefusesWorldsOfSeveralAgents(t *testing.T) {
	e, err := env.Lookup("dispatch")
	if err != nil {
		t.Fatal(err)
	}
	_, err = (&Service{}).newMCPServer(nil, &gauntletv1.ResetRequest{Env: "dispatch"}, e)
	if connect.CodeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), "roles dispatcher, driver") {
		t.Errorf("an MCP session of dispatch: %v, want invalid_argument naming the roles", err)
	}
}

func TestMCPErrorCodes(t *testing.T) {
	over := overQuota("tenant acme already has 2 live episodes")
	for _, tc := range []struct {
		err   error
		code  int64
		name  string
		retry int
	}{
		{connect.NewError(connect.CodeInvalidArgument, errors.New("x")), -32602, "invalid_argument", 0},
		{connect.NewError(connect.CodeFailedPrecondition, errors.New("x")), -32109, "failed_precondition", 0},
		{connect.NewError(connect.CodeAborted, errors.New("x")), -32110, "aborted", 0},
		{connect.NewError(connect.CodeUnavailable, errors.New("x")), -32114, "unavailable", 0},
		{connect.NewError(connect.CodeNotFound, errors.New("x")), -32105, "not_found", 0},
		{over, -32108, "resource_exhausted", 1},
		{errors.New("plain"), -32603, "internal", 0},
	} {
		je := mcpError(tc.err)
		var data mcpErrorData
		if err := json.Unmarshal(je.Data, &data); err != nil || je.Code != tc.code || data.Code != tc.name || data.RetryAfterSeconds != tc.retry {
			t.Errorf("%v: code %d data %s, want %d %s retry %d", tc.err, je.Code, je.Data, tc.code, tc.name, tc.retry)
		}
	}
	w := httptest.NewRecorder()
	mcpRefuse(w, over)
	if w.Code != 429 || w.Header().Get("Retry-After") != "1" {
		t.Errorf("refusing over quota: HTTP %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	w = httptest.NewRecorder()
	mcpRefuse(w, tooLarge(1<<30, mcpBodyMax))
	if w.Code != 413 {
		t.Errorf("refusing a large body: HTTP %d, want 413", w.Code)
	}
}

// TestMCPToolResult: the observation is the content (text and structured), the rest of
// the StepResult is _meta, and an invalid action or a step that did not play is isError.
func TestMCPToolResult(t *testing.T) {
	res, err := toolResult(&gauntletv1.StepResult{EpisodeId: "e", Step: 3, ObservationJson: `{"ok":true}`, Reward: 0.5, Terminated: true,
		Reason: gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS, Info: &gauntletv1.StepInfo{}})
	if err != nil {
		t.Fatal(err)
	}
	meta, _ := json.Marshal(res.Meta[MetaStep])
	if res.IsError || res.Content[0].(*mcp.TextContent).Text != `{"ok":true}` || string(res.StructuredContent.(json.RawMessage)) != `{"ok":true}` ||
		!strings.Contains(string(meta), `"reward":0.5`) || !strings.Contains(string(meta), `"terminated":true`) ||
		strings.Contains(string(meta), `"truncated"`) || strings.Contains(string(meta), "observation") {
		t.Errorf("a successful step: isError %v, content %v, meta %s", res.IsError, res.Content, meta)
	}
	res, _ = toolResult(&gauntletv1.StepResult{ObservationJson: `{"error":"unknown tool"}`, Info: &gauntletv1.StepInfo{Signals: &gauntletv1.Signals{InvalidAction: true}}})
	if !res.IsError {
		t.Error("an invalid action is not isError")
	}
	res, _ = toolResult(&gauntletv1.StepResult{ObservationJson: `{}`, Truncated: true, Info: &gauntletv1.StepInfo{InfraError: true, Error: "infra error: step timeout"}})
	if !res.IsError || len(res.Content) != 2 || res.Content[1].(*mcp.TextContent).Text != "infra error: step timeout" {
		t.Errorf("an infra error: isError %v, content %v", res.IsError, res.Content)
	}
}
