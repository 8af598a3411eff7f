package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"
	"time"

	connectrpc "connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/services/envapi"
)

// bearerTransport adds a tenant's token to every request of an MCP client.
type bearerTransport string

func (b bearerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect opens an MCP session, with the Go SDK's own client, at the env API's MCP
// endpoint for env with the query (seed, profile, ...).
func mcpConnect(ctx context.Context, addr, token, envName string, query url.Values) (*mcp.ClientSession, error) {
	tr := &mcp.StreamableClientTransport{
		Endpoint:   "http://" + addr + envapi.MCPPath + envName + "?" + query.Encode(),
		HTTPClient: &http.Client{Transport: bearerTransport(token)},
		MaxRetries: -1,
	}
	return mcp.NewClient(&mcp.Implementation{Name: "gauntlet-conformance", Version: "1"}, nil).Connect(ctx, tr, nil)
}

// stepMeta decodes a tool result's _meta step: the env API's StepResult in its JSON.
func stepMeta(t *testing.T, res *mcp.CallToolResult) *gauntletv1.StepResult {
	t.Helper()
	raw, err := json.Marshal(res.Meta[envapi.MetaStep])
	if err != nil {
		t.Fatal(err)
	}
	var st gauntletv1.StepResult
	if err := protojson.Unmarshal(raw, &st); err != nil {
		t.Fatalf("_meta[%s] = %s is not a StepResult: %v", envapi.MetaStep, raw, err)
	}
	return &st
}

func resultText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// TestMCPServer holds gauntlet's MCP endpoint to the protocol with the Go SDK's own
// client on a live stack: initialize opens an episode, tools/list is the env's action
// space, tools/call steps it exactly as the env API's Step does (same observations,
// rewards and ends for the same seed, profile and actions), invalid arguments and
// unknown tools come back as isError with the env's feedback, a whole shop episode lands
// in ClickHouse with every step once, the session's end closes its episode, and bad
// tokens, other tenants' sessions, bad queries and quotas are refused.
func TestMCPServer(t *testing.T) {
	s, cfg := envAPIStack(t)
	addr := s.app.envapi.Addr()
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	ctx := context.Background()
	e, err := env.Lookup("shop")
	if err != nil {
		t.Fatal(err)
	}
	spec := e.Spec()

	t.Run("initialize and tools/list", func(t *testing.T) {
		cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", url.Values{"seed": {"3"}})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		init := cs.InitializeResult()
		if init.ServerInfo == nil || init.ServerInfo.Name != "gauntlet" || init.Capabilities.Tools == nil {
			t.Errorf("initialize: server %+v, capabilities %+v", init.ServerInfo, init.Capabilities)
		}
		raw, _ := json.Marshal(init.Meta[envapi.MetaEpisode])
		var ep struct {
			EpisodeID   string          `json:"episodeId"`
			Observation json.RawMessage `json:"observation"`
			Info        struct {
				RunID string `json:"runId"`
				Seed  string `json:"seed"`
			} `json:"info"`
		}
		if err := json.Unmarshal(raw, &ep); err != nil || ep.EpisodeID == "" || ep.Info.RunID != "api-acme" || ep.Info.Seed != "3" ||
			!strings.HasPrefix(string(ep.Observation), "{") {
			t.Errorf("initialize _meta[%s] = %s (%v)", envapi.MetaEpisode, raw, err)
		}
		if _, first, ok := strings.Cut(init.Instructions, "Its first observation:\n"); !ok || !jsonEqual(t, []byte(first), ep.Observation) {
			t.Errorf("the instructions do not end with the first observation: %q", init.Instructions)
		}
		tools, err := cs.ListTools(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The SDK lists tools by name; each is the env's, as DescribeEnv gives it.
		if len(tools.Tools) != len(spec.Tools) {
			t.Fatalf("tools/list: %d tools, the env has %d", len(tools.Tools), len(spec.Tools))
		}
		listed := map[string]*mcp.Tool{}
		for _, tool := range tools.Tools {
			listed[tool.Name] = tool
		}
		for _, want := range spec.Tools {
			got := listed[want.Name]
			if got == nil {
				t.Errorf("tools/list lacks %s", want.Name)
				continue
			}
			schema, _ := json.Marshal(got.InputSchema)
			if got.Description != want.Description || !jsonEqual(t, schema, want.Schema) {
				t.Errorf("tools/list %s: %q %s, want %q %s", want.Name, got.Description, schema, want.Description, want.Schema)
			}
		}
	})

	t.Run("a whole shop episode, stepped as the env API steps it and recorded once", func(t *testing.T) {
		const seed = 7
		cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", url.Values{"seed": {fmt.Sprint(seed)}, "profile": {"baseline"}})
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(cs.InitializeResult().Meta[envapi.MetaEpisode])
		var ep struct {
			EpisodeID   string          `json:"episodeId"`
			Observation json.RawMessage `json:"observation"`
		}
		if err := json.Unmarshal(raw, &ep); err != nil {
			t.Fatal(err)
		}
		agent := e.(env.Oracle).Oracle(seed)
		turn := env.Turn{Observation: ep.Observation}
		var actions []env.Action
		var results []*gauntletv1.StepResult
		total := 0.0
		for {
			act, err := agent.Act(turn)
			if err != nil {
				t.Fatal(err)
			}
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: act.Tool, Arguments: act.Args})
			if err != nil {
				t.Fatalf("step %d: %v", len(results), err)
			}
			st := stepMeta(t, res)
			obs, _ := json.Marshal(res.StructuredContent)
			if len(res.Content) == 0 || !jsonEqual(t, obs, []byte(res.Content[0].(*mcp.TextContent).Text)) {
				t.Fatalf("step %d: structured content %s is not the text observation", len(results), obs)
			}
			st.ObservationJson = res.Content[0].(*mcp.TextContent).Text
			actions, results = append(actions, act), append(results, st)
			total += st.Reward
			if st.Terminated || st.Truncated {
				break
			}
			turn = env.Turn{Step: uint32(len(results)), Observation: json.RawMessage(st.ObservationJson), Reward: st.Reward}
		}
		last := results[len(results)-1]
		if !last.Terminated || last.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			t.Fatalf("the oracle's episode ended %v after %d steps", last.Reason, len(results))
		}
		// The episode is over: a further call is the env API's failed_precondition.
		_, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "catalog.search", Arguments: map[string]any{"query": "mug"}})
		if code := rpcCode(err); code != -32109 || !strings.Contains(err.Error(), "is over") {
			t.Errorf("a call after the end: %v (code %d), want JSON-RPC error -32109 saying the episode is over", err, code)
		}
		if err := cs.Close(); err != nil {
			t.Errorf("close the session: %v", err)
		}

		// The same seed, profile and actions through the env API's Step give the same
		// observations, rewards and ends.
		acme := grpcClient(addr, tokenAcme)
		reset, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: seed, Profile: "baseline"}))
		if err != nil {
			t.Fatal(err)
		}
		if !jsonEqual(t, []byte(reset.Msg.ObservationJson), ep.Observation) {
			t.Errorf("first observation over MCP %s, over the API %s", ep.Observation, reset.Msg.ObservationJson)
		}
		for i, act := range actions {
			got, err := acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: reset.Msg.EpisodeId,
				Action: &gauntletv1.Action{Tool: act.Tool, ArgsJson: string(act.Args)}}))
			if err != nil {
				t.Fatal(err)
			}
			want := results[i]
			if got.Msg.ObservationJson != want.ObservationJson || got.Msg.Reward != want.Reward ||
				got.Msg.Terminated != want.Terminated || got.Msg.Truncated != want.Truncated || got.Msg.Reason != want.Reason ||
				len(got.Msg.Info.GetFaults()) != len(want.Info.GetFaults()) {
				t.Fatalf("step %d over the API differs from MCP:\n api %v\n mcp %v", i, got.Msg, want)
			}
		}

		waitEpisodes(t, conn, cfg.Database, []string{ep.EpisodeID})
		q := fmt.Sprintf(`SELECT concat(toString(count()), ' ', toString(uniqExact(step)), ' ', toString(max(step)), ' ', toString(round(sum(reward), 6)))
			FROM %s.steps FINAL WHERE episode_id = '%s'`, cfg.Database, ep.EpisodeID)
		want := fmt.Sprintf("%d %d %d %v", len(results), len(results), len(results)-1, math.Round(total*1e6)/1e6)
		if got := queryOne(t, conn, q); got != want {
			t.Errorf("steps in ClickHouse (count, distinct steps, last step, reward): %s, want %s", got, want)
		}
		row := queryOne(t, conn, fmt.Sprintf(`SELECT concat(run_id, ' ', policy, ' ', toString(steps), ' ', reason)
			FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, ep.EpisodeID))
		if want := fmt.Sprintf("api-acme mcp %d success", len(results)); row != want {
			t.Errorf("the episode in ClickHouse: %q, want %q", row, want)
		}
	})

	t.Run("invalid actions are the env's answers, with isError", func(t *testing.T) {
		cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", url.Values{"seed": {"4"}, "policy": {"mcp-conformance"}})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		for i, call := range []*mcp.CallToolParams{
			{Name: "catalog.search", Arguments: map[string]any{"qurey": "mug"}}, // breaks the schema
			{Name: "no.such.tool", Arguments: map[string]any{}},                 // not in the action space
		} {
			res, err := cs.CallTool(ctx, call)
			if err != nil {
				t.Fatalf("%s: %v, want a tool result", call.Name, err)
			}
			st := stepMeta(t, res)
			if !res.IsError || !st.GetInfo().GetSignals().GetInvalidAction() || st.Step != uint32(i) || st.Terminated || st.Truncated {
				t.Errorf("%s: isError %v, step %+v; want isError, invalid_action, step %d, episode going on", call.Name, res.IsError, st, i)
			}
			if txt := resultText(res); !strings.Contains(txt, "invalid") && !strings.Contains(txt, call.Name) {
				t.Errorf("%s: the env's feedback %q names neither the tool nor the problem", call.Name, txt)
			}
		}
		// A valid call goes on from there.
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "catalog.search", Arguments: map[string]any{"query": "mug"}})
		if err != nil || res.IsError || stepMeta(t, res).Step != 2 {
			t.Errorf("a valid call after two invalid ones: %v, %v", res, err)
		}
	})

	t.Run("the URL's query chooses params and the step limit", func(t *testing.T) {
		cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", url.Values{"seed": {"6"}, "max_steps": {"4"},
			"params": {`{"deadline_ms":12345,"max_invalid":2}`}})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		raw, _ := json.Marshal(cs.InitializeResult().Meta[envapi.MetaEpisode])
		var ep struct {
			Observation struct {
				DeadlineMs int `json:"deadline_ms"`
				MaxSteps   int `json:"max_steps"`
			} `json:"observation"`
		}
		if err := json.Unmarshal(raw, &ep); err != nil || ep.Observation.DeadlineMs != 12345 || ep.Observation.MaxSteps != 4 {
			t.Fatalf("first observation %s (%v), want deadline_ms 12345 and max_steps 4", raw, err)
		}
		// max_invalid 2: the second invalid action ends the episode by the env's rule.
		var st *gauntletv1.StepResult
		for range 2 {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no.such.tool"})
			if err != nil {
				t.Fatal(err)
			}
			st = stepMeta(t, res)
		}
		if !st.Terminated || st.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_INVALID_ACTION_LIMIT {
			t.Errorf("after two invalid actions with max_invalid 2: %v", st)
		}
	})

	t.Run("the session's end closes its episode, recorded", func(t *testing.T) {
		cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", url.Values{"seed": {"5"}})
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := json.Marshal(cs.InitializeResult().Meta[envapi.MetaEpisode])
		var ep struct {
			EpisodeID string `json:"episodeId"`
		}
		_ = json.Unmarshal(raw, &ep)
		if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "catalog.search", Arguments: map[string]any{"query": "mug"}}); err != nil {
			t.Fatal(err)
		}
		if err := cs.Close(); err != nil {
			t.Fatal(err)
		}
		waitEpisodes(t, conn, cfg.Database, []string{ep.EpisodeID})
		row := queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(steps), ' ', toString(truncated), ' ', error)
			FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, ep.EpisodeID))
		if row != "1 1 MCP session closed after 1 steps" {
			t.Errorf("the closed session's episode: %q", row)
		}
		steps := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.steps FINAL WHERE episode_id = '%s'`, cfg.Database, ep.EpisodeID))
		if steps != "1" {
			t.Errorf("%s steps recorded, want 1", steps)
		}
	})

	t.Run("refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name, token, env string
			query            url.Values
			want             []string
		}{
			{"unknown token", "not-a-token-0123456789", "shop", nil, []string{"Unauthorized"}},
			{"no token", "", "shop", nil, []string{"Unauthorized"}},
			{"unknown env", tokenAcme, "nosuchenv", nil, []string{"nosuchenv"}},
			{"unknown query parameter", tokenAcme, "shop", url.Values{"sead": {"1"}}, []string{"query sead: unknown parameter"}},
			{"bad seed", tokenAcme, "shop", url.Values{"seed": {"-1"}}, []string{"query seed"}},
			{"unknown profile", tokenAcme, "shop", url.Values{"profile": {"nope"}}, []string{"profile"}},
			{"params the env refuses", tokenAcme, "shop", url.Values{"params": {`{"products":1}`}}, []string{"products"}},
			{"params that are not JSON", tokenAcme, "shop", url.Values{"params": {`{products`}}, []string{"params"}},
		} {
			cs, err := mcpConnect(ctx, addr, tc.token, tc.env, tc.query)
			if err == nil {
				cs.Close()
				t.Errorf("%s: connected, want a refusal", tc.name)
				continue
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s: %v, want it to say %q", tc.name, err, w)
				}
			}
		}

		// A bad token is refused before the body is read: 401, the reason in a JSON-RPC error.
		req, _ := http.NewRequest("POST", "http://"+addr+envapi.MCPPath+"shop", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer not-a-token-0123456789")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var refusal struct {
			Error struct {
				Code    int64
				Message string
				Data    struct{ Code string }
			}
		}
		err = json.NewDecoder(resp.Body).Decode(&refusal)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || err != nil || refusal.Error.Code != -32116 ||
			refusal.Error.Message != "unknown API token" || refusal.Error.Data.Code != "unauthenticated" {
			t.Errorf("a bad token: HTTP %d %+v (%v), want 401 with error -32116 unknown API token", resp.StatusCode, refusal, err)
		}

		// Another tenant's session is unknown, exactly like a wrong id.
		cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		for _, tc := range []struct{ token, sid string }{{tokenOther, cs.ID()}, {tokenAcme, "no-such-session"}} {
			body := `{"jsonrpc":"2.0","id":9,"method":"tools/list","params":{}}`
			req, _ := http.NewRequest("POST", "http://"+addr+envapi.MCPPath+"shop", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Mcp-Session-Id", tc.sid)
			req.Header.Set("Mcp-Protocol-Version", cs.InitializeResult().ProtocolVersion)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				t.Errorf("session %s with token %s…: HTTP %d, want 404", tc.sid, tc.token[:5], resp.StatusCode)
			}
		}
		if _, err := cs.ListTools(ctx, nil); err != nil {
			t.Errorf("the session after another tenant knocked: %v", err)
		}

		// A tenant over its quota is refused at initialize with resource_exhausted.
		var open []*mcp.ClientSession
		defer func() {
			for _, cs := range open {
				cs.Close()
			}
		}()
		for i := 0; i < 2; i++ {
			cs, err := mcpConnect(ctx, addr, tokenSmall, "shop", nil)
			if err != nil {
				t.Fatal(err)
			}
			open = append(open, cs)
		}
		if cs, err := mcpConnect(ctx, addr, tokenSmall, "shop", nil); err == nil {
			cs.Close()
			t.Error("a third session of a tenant whose quota is 2 was opened")
		} else if code := rpcCode(err); code != -32108 || !strings.Contains(err.Error(), "quota") {
			t.Errorf("over quota: %v (code %d), want JSON-RPC error -32108 naming the quota", err, code)
		}
	})

	t.Run("the example plays an episode", func(t *testing.T) {
		// examples/mcp-shop, run as a user runs it, against this stack.
		cmd := exec.Command("go", "run", "../../examples/mcp-shop", "--url", "http://"+addr, "--token", tokenOther, "--seed", "11")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "episode over after") || !strings.Contains(string(out), "TERMINATION_REASON_SUCCESS") {
			t.Fatalf("go run ./examples/mcp-shop: %v\n%s", err, out)
		}
		t.Logf("examples/mcp-shop:\n%s", out)
	})

	// A live session, its client's stream open, does not hold the API's stop.
	cs, err := mcpConnect(ctx, addr, tokenAcme, "shop", url.Values{"seed": {"8"}})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "catalog.search", Arguments: map[string]any{"query": "mug"}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.stop(); err != nil {
		t.Errorf("stop with a live MCP session: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("stop with a live MCP session took %v", d)
	}
}

// rpcCode is the JSON-RPC error code err carries, or 0.
func rpcCode(err error) int64 {
	var je *jsonrpc.Error
	if errors.As(err, &je) {
		return je.Code
	}
	return 0
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return string(ja) == string(jb)
}
