package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	connectrpc "connectrpc.com/connect"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1/gauntletv1connect"
)

// Tokens of the env API tests' tenants.
const (
	tokenAcme  = "acme-token-0123456789abcdef"
	tokenOther = "other-token-0123456789abcdef"
	tokenSmall = "small-token-0123456789abcdef"
)

// envAPIStack starts the whole stack with the env API on a free port and three tenants:
// acme (quota 300), other, and small (quota 2).
func envAPIStack(t testing.TB) (*testStack, config) {
	t.Helper()
	return envAPIStackWith(t, nil)
}

// envAPIStackWith is envAPIStack with the configuration adjusted by adjust (if not nil)
// before the stack starts.
func envAPIStackWith(t testing.TB, adjust func(*config)) (*testStack, config) {
	t.Helper()
	cfg := testConfig(t)
	tokens := filepath.Join(t.TempDir(), "tenants.yaml")
	err := os.WriteFile(tokens, []byte(fmt.Sprintf(`tenants:
  - name: acme
    tokens: [%s]
    max_episodes: 300
  - name: other
    tokens: [%s]
  - name: small
    tokens: [%s]
    max_episodes: 2
`, tokenAcme, tokenOther, tokenSmall)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cfg.EnvAPI.TokensFile = tokens
	cfg.EnvAPI.IdleTimeout = time.Minute // TestEnvAPIReapsIdleEpisodes tests the reaper
	// A stand-in for a model server (outside the product) for the "http" policy: it
	// always searches the catalog.
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Tools []struct {
				Function struct{ Name string } `json:"function"`
			} `json:"tools"`
		}
		if r.URL.Path != "/v1/chat/completions" || json.NewDecoder(r.Body).Decode(&req) != nil || len(req.Tools) == 0 {
			http.Error(w, "not a chat completion request", http.StatusBadRequest)
			return
		}
		fmt.Fprint(w, `{"choices":[{"message":{"role":"assistant","tool_calls":[{"id":"c","type":"function","function":{"name":"catalog__search","arguments":"{\"query\":\"mug\"}"}}]}}]}`)
	}))
	t.Cleanup(model.Close)
	cfg.PolicyHTTP.URL = model.URL + "/v1"
	cfg.PolicyHTTP.Timeout = 5 * time.Second
	if adjust != nil {
		adjust(&cfg)
	}
	return startStack(t, cfg, modPipeline, modEnvAPI), cfg
}

// bearer is a client interceptor adding the tenant's token.
type bearer string

func (b bearer) WrapUnary(next connectrpc.UnaryFunc) connectrpc.UnaryFunc {
	return func(ctx context.Context, req connectrpc.AnyRequest) (connectrpc.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connectrpc.StreamingClientFunc) connectrpc.StreamingClientFunc {
	return func(ctx context.Context, spec connectrpc.Spec) connectrpc.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connectrpc.StreamingHandlerFunc) connectrpc.StreamingHandlerFunc {
	return next
}

// grpcClient is a plain gRPC client (HTTP/2 without TLS, gRPC framing).
func grpcClient(addr, token string) gauntletv1connect.EnvServiceClient {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	return gauntletv1connect.NewEnvServiceClient(&http.Client{Transport: tr}, "http://"+addr,
		connectrpc.WithGRPC(), connectrpc.WithInterceptors(bearer(token)))
}

// jsonCall posts a Connect/JSON request and returns the HTTP status, headers and body.
func jsonCall(t *testing.T, addr, token, method, body string) (int, http.Header, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", "http://"+addr+"/gauntlet.v1.EnvService/"+method, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatalf("%s: decode the reply (status %d): %v", method, resp.StatusCode, err)
	}
	return resp.StatusCode, resp.Header, out
}

// waitEpisodes waits until ClickHouse holds the episodes (episodes FINAL) and returns
// their step counts as recorded.
func waitEpisodes(t *testing.T, conn driver.Conn, db string, ids []string) {
	t.Helper()
	list := "'" + strings.Join(ids, "','") + "'"
	deadline := time.Now().Add(time.Minute)
	for {
		got := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.episodes FINAL WHERE episode_id IN (%s)`, db, list))
		if got == fmt.Sprint(len(ids)) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("ClickHouse holds %s of %d episodes after a minute", got, len(ids))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestEnvAPI(t *testing.T) {
	s, cfg := envAPIStack(t)
	addr := s.app.envapi.Addr()
	conn := connect(t, s.app.clickHouseAddr(), cfg.Database)
	ctx := context.Background()
	acme := grpcClient(addr, tokenAcme)

	t.Run("full shop episode over gRPC, recorded with trainer data", func(t *testing.T) {
		envs, err := acme.ListEnvs(ctx, connectrpc.NewRequest(&gauntletv1.ListEnvsRequest{}))
		if err != nil {
			t.Fatalf("ListEnvs: %v", err)
		}
		var names []string
		for _, e := range envs.Msg.Envs {
			names = append(names, e.Name)
		}
		if !slices.Equal(names, env.Names()) {
			t.Fatalf("ListEnvs = %v, want every registered env %v", names, env.Names())
		}
		desc, err := acme.DescribeEnv(ctx, connectrpc.NewRequest(&gauntletv1.DescribeEnvRequest{Env: "shop"}))
		if err != nil {
			t.Fatal(err)
		}
		if len(desc.Msg.Tools) == 0 || !json.Valid([]byte(desc.Msg.Tools[0].SchemaJson)) || len(desc.Msg.RewardComponents) != 5 {
			t.Fatalf("DescribeEnv: %d tools, first schema %q, %d reward components", len(desc.Msg.Tools), desc.Msg.Tools[0].SchemaJson, len(desc.Msg.RewardComponents))
		}
		const seed = 7
		reset, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: seed, Profile: "baseline"}))
		if err != nil {
			t.Fatal(err)
		}
		id := reset.Msg.EpisodeId
		if reset.Msg.Info.RunId != "api-acme" || reset.Msg.Info.Profile != "baseline" || !json.Valid([]byte(reset.Msg.ObservationJson)) {
			t.Fatalf("Reset = %v", reset.Msg)
		}
		// The trainer's policy here is the env's scripted agent, run client side.
		e, _ := env.Lookup("shop")
		agent := e.(env.Oracle).Oracle(seed)
		turn := env.Turn{Observation: json.RawMessage(reset.Msg.ObservationJson)}
		var last *gauntletv1.StepResult
		total := 0.0
		for i := 0; ; i++ {
			act, err := agent.Act(turn)
			if err != nil {
				t.Fatal(err)
			}
			res, err := acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{
				EpisodeId: id, Action: &gauntletv1.Action{Tool: act.Tool, ArgsJson: string(act.Args)},
				Trainer: &gauntletv1.TrainerData{CompletionTokenIds: []uint32{uint32(i), 1}, Logprobs: []float32{-0.5, -0.25}, PolicyVersion: "v1"},
			}))
			if err != nil {
				t.Fatalf("step %d: %v", i, err)
			}
			last = res.Msg
			total += last.Reward
			if last.Step != uint32(i) || len(last.RewardComponents) != 5 || last.Info.GetInfraError() {
				t.Fatalf("step %d: %v", i, last)
			}
			if last.Terminated || last.Truncated {
				break
			}
			turn = env.Turn{Step: uint32(i + 1), Observation: json.RawMessage(last.ObservationJson), Reward: last.Reward}
		}
		if !last.Terminated || last.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS {
			t.Fatalf("the oracle's episode ended %v (terminated %v)", last.Reason, last.Terminated)
		}
		// Explicit reset: a step after the end is refused with the reason.
		_, err = acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: "{}"}}))
		if connectrpc.CodeOf(err) != connectrpc.CodeFailedPrecondition || !strings.Contains(err.Error(), "success") {
			t.Errorf("step after the end: %v, want failed_precondition naming success", err)
		}
		// Close is idempotent.
		for range 2 {
			c, err := acme.Close(ctx, connectrpc.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id}))
			if err != nil || c.Msg.ClosedNow || c.Msg.Steps != last.Step+1 {
				t.Errorf("Close = %v, %v", c, err)
			}
		}
		waitEpisodes(t, conn, cfg.Database, []string{id})
		row := queryOne(t, conn, fmt.Sprintf(`SELECT concat(toString(steps), ' ', reason, ' ', toString(success), ' ', policy, ' ', run_id, ' ', toString(round(total_reward, 6)))
			FROM %s.episodes FINAL WHERE episode_id = '%s'`, cfg.Database, id))
		if want := fmt.Sprintf("%d success 1 trainer api-acme %v", last.Step+1, fmt.Sprint(roundTo(total, 6))); row != want {
			t.Errorf("episode row = %q, want %q", row, want)
		}
		joined := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM (SELECT episode_id, step FROM %[1]s.steps FINAL WHERE episode_id = '%[2]s')
			ANY INNER JOIN (SELECT episode_id, step, policy_version FROM %[1]s.trainer_steps FINAL WHERE episode_id = '%[2]s' AND policy_version = 'v1') USING episode_id, step`, cfg.Database, id))
		if joined != fmt.Sprint(last.Step+1) {
			t.Errorf("steps joined with trainer data = %s, want %d", joined, last.Step+1)
		}
	})

	t.Run("batched stepping over 256 episodes", func(t *testing.T) {
		const n = 256
		ids := make([]string, n)
		for i := range ids {
			r, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: uint64(1000 + i), MaxSteps: 6}))
			if err != nil {
				t.Fatal(err)
			}
			ids[i] = r.Msg.EpisodeId
		}
		batch := func(ids []string, round int) *gauntletv1.StepBatchRequest {
			req := &gauntletv1.StepBatchRequest{}
			for _, id := range ids {
				req.Steps = append(req.Steps, &gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: fmt.Sprintf(`{"query":"item %d"}`, round)}})
			}
			return req
		}
		steps := map[string]int{}
		check := func(r *gauntletv1.StepResult) {
			t.Helper()
			if r.Error != nil || r.Info.GetInfraError() {
				t.Fatalf("batched step of %s: %v", r.EpisodeId, r)
			}
			if int(r.Step) != steps[r.EpisodeId] {
				t.Fatalf("%s: step %d, want %d", r.EpisodeId, r.Step, steps[r.EpisodeId])
			}
			steps[r.EpisodeId]++
		}
		// Round 0: StepBatch returning the first 64; Recv collects the rest.
		b, err := acme.StepBatch(ctx, connectrpc.NewRequest(&gauntletv1.StepBatchRequest{Steps: batch(ids, 0).Steps, MinResults: 64, Queue: "q1"}))
		if err != nil {
			t.Fatal(err)
		}
		got := len(b.Msg.Results)
		if got < 64 {
			t.Fatalf("StepBatch(min 64) returned %d results", got)
		}
		for _, r := range b.Msg.Results {
			check(r)
		}
		// Another queue of the same tenant sees none of them.
		if rv, err := acme.Recv(ctx, connectrpc.NewRequest(&gauntletv1.RecvRequest{MinResults: 1, TimeoutMs: 50, Queue: "q2"})); err != nil || len(rv.Msg.Results) != 0 {
			t.Fatalf("Recv on another queue: %v, %v", rv, err)
		}
		for got < n {
			rv, err := acme.Recv(ctx, connectrpc.NewRequest(&gauntletv1.RecvRequest{MinResults: uint32(n - got), TimeoutMs: 30_000, Queue: "q1"}))
			if err != nil {
				t.Fatal(err)
			}
			if len(rv.Msg.Results) == 0 {
				t.Fatalf("Recv returned nothing with %d results outstanding", n-got)
			}
			for _, r := range rv.Msg.Results {
				check(r)
			}
			got += len(rv.Msg.Results)
		}
		// Round 1: Send, then Recv everything (EnvPool's send/recv).
		if _, err := acme.Send(ctx, connectrpc.NewRequest(batch(ids, 1))); err != nil {
			t.Fatal(err)
		}
		for got = 0; got < n; {
			rv, err := acme.Recv(ctx, connectrpc.NewRequest(&gauntletv1.RecvRequest{MinResults: uint32(n - got), TimeoutMs: 30_000}))
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rv.Msg.Results {
				check(r)
			}
			got += len(rv.Msg.Results)
		}
		// Round 2: the server stream.
		stream, err := acme.StepStream(ctx, connectrpc.NewRequest(batch(ids, 2)))
		if err != nil {
			t.Fatal(err)
		}
		got = 0
		for stream.Receive() {
			check(stream.Msg())
			got++
		}
		if err := stream.Err(); err != nil || got != n {
			t.Fatalf("StepStream: %d results, err %v", got, err)
		}
		// Then the whole batch until every episode is truncated at max_steps.
		for round := 3; ; round++ {
			var live []string
			for _, id := range ids {
				if steps[id] < 6 {
					live = append(live, id)
				}
			}
			if len(live) == 0 {
				break
			}
			b, err := acme.StepBatch(ctx, connectrpc.NewRequest(batch(live, round)))
			if err != nil {
				t.Fatal(err)
			}
			if len(b.Msg.Results) != len(live) {
				t.Fatalf("StepBatch(all) returned %d of %d", len(b.Msg.Results), len(live))
			}
			for _, r := range b.Msg.Results {
				check(r)
				if steps[r.EpisodeId] == 6 && !(r.Truncated && r.Reason == gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS) && !r.Terminated {
					t.Fatalf("%s at max_steps: truncated %v reason %v", r.EpisodeId, r.Truncated, r.Reason)
				}
			}
		}
		waitEpisodes(t, conn, cfg.Database, ids)
		var want uint64
		for _, n := range steps {
			want += uint64(n)
		}
		got2 := queryOne(t, conn, fmt.Sprintf(`SELECT count() FROM %s.steps FINAL WHERE episode_id IN ('%s')`, cfg.Database, strings.Join(ids, "','")))
		if got2 != fmt.Sprint(want) {
			t.Errorf("steps in ClickHouse = %s, want %d", got2, want)
		}
	})

	t.Run("tenancy: 401, 404, 429", func(t *testing.T) {
		for _, tok := range []string{"", "not-a-token-at-all-xxxxxxxx"} {
			code, _, body := jsonCall(t, addr, tok, "ListEnvs", `{}`)
			if code != http.StatusUnauthorized || body["code"] != "unauthenticated" {
				t.Errorf("token %q: HTTP %d %v, want 401 unauthenticated", tok, code, body)
			}
		}
		if _, err := grpcClient(addr, "nope").Capacity(ctx, connectrpc.NewRequest(&gauntletv1.CapacityRequest{})); connectrpc.CodeOf(err) != connectrpc.CodeUnauthenticated {
			t.Errorf("gRPC without a valid token: %v", err)
		}
		code, _, body := jsonCall(t, addr, tokenAcme, "Reset", `{"env":"shop","seed":"3"}`)
		if code != http.StatusOK {
			t.Fatalf("Reset over HTTP/JSON: %d %v", code, body)
		}
		id := body["episodeId"].(string)
		code, _, body = jsonCall(t, addr, tokenOther, "Step", fmt.Sprintf(`{"episodeId":%q,"action":{"tool":"catalog.search","argsJson":"{}"}}`, id))
		if code != http.StatusNotFound || body["code"] != "not_found" {
			t.Errorf("another tenant's episode: HTTP %d %v, want 404", code, body)
		}
		if code, _, _ = jsonCall(t, addr, tokenOther, "Close", fmt.Sprintf(`{"episodeId":%q}`, id)); code != http.StatusNotFound {
			t.Errorf("closing another tenant's episode: HTTP %d, want 404", code)
		}
		for i := range 2 {
			if code, _, body = jsonCall(t, addr, tokenSmall, "Reset", `{"env":"shop"}`); code != http.StatusOK {
				t.Fatalf("small's reset %d: %d %v", i, code, body)
			}
		}
		code, hdr, body := jsonCall(t, addr, tokenSmall, "Reset", `{"env":"shop"}`)
		if code != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || !strings.Contains(fmt.Sprint(body["message"]), "quota") {
			t.Errorf("over quota: HTTP %d, Retry-After %q, %v", code, hdr.Get("Retry-After"), body)
		}
		c, err := grpcClient(addr, tokenSmall).Capacity(ctx, connectrpc.NewRequest(&gauntletv1.CapacityRequest{}))
		if err != nil || c.Msg.Tenant != "small" || c.Msg.ActiveEpisodes != 2 || c.Msg.MaxEpisodes != 2 {
			t.Errorf("Capacity = %v, %v", c, err)
		}
	})

	t.Run("bad input gets clear errors and the episode stays usable", func(t *testing.T) {
		code, _, body := jsonCall(t, addr, tokenAcme, "Reset", `{"env":"shop","seed":"5","profile":"edge"}`)
		if code != http.StatusOK {
			t.Fatalf("Reset: %d %v", code, body)
		}
		id := body["episodeId"].(string)
		for _, tc := range []struct{ name, body, want string }{
			{"malformed JSON", `{"episodeId": "` + id + `", "action": {`, "unmarshal"},
			{"wrong type", `{"episodeId": 12}`, "episodeId"},
			{"no action", fmt.Sprintf(`{"episodeId":%q}`, id), "action: required"},
		} {
			code, _, body := jsonCall(t, addr, tokenAcme, "Step", tc.body)
			if code != http.StatusBadRequest || !strings.Contains(strings.ToLower(fmt.Sprint(body["message"])), strings.ToLower(tc.want)) {
				t.Errorf("%s: HTTP %d %v, want 400 mentioning %q", tc.name, code, body, tc.want)
			}
		}
		for _, tc := range []struct{ name, action string }{
			{"unknown tool", `{"tool":"rm.rf","argsJson":"{}"}`},
			{"args not JSON", `{"tool":"catalog.search","argsJson":"{nope"}`},
		} {
			code, _, body := jsonCall(t, addr, tokenAcme, "Step", fmt.Sprintf(`{"episodeId":%q,"action":%s}`, id, tc.action))
			info, _ := body["info"].(map[string]any)
			sig, _ := info["signals"].(map[string]any)
			if code != http.StatusOK || sig["invalidAction"] != true || body["terminated"] == true {
				t.Errorf("%s: HTTP %d %v, want an invalid-action observation", tc.name, code, body)
			}
		}
		code, _, body = jsonCall(t, addr, tokenAcme, "Step", fmt.Sprintf(`{"episodeId":%q,"action":{"tool":"catalog.search","argsJson":"{\"query\":\"mug\"}"}}`, id))
		if code != http.StatusOK || body["step"] != float64(2) {
			t.Errorf("a good step after bad input: HTTP %d %v, want step 2", code, body)
		}
		if code, _, body = jsonCall(t, addr, tokenAcme, "Reset", `{"env":"nope"}`); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(body["message"]), "env") {
			t.Errorf("unknown env: %d %v", code, body)
		}
		if code, _, body = jsonCall(t, addr, tokenAcme, "Reset", `{"env":"shop","paramsJson":"{\"max_invalid\":-4}"}`); code != http.StatusBadRequest || !strings.Contains(fmt.Sprint(body["message"]), "params_json") {
			t.Errorf("bad params: %d %v", code, body)
		}
		if code, _, body = jsonCall(t, addr, tokenAcme, "Fork", `{"snapshotId":"snap-x"}`); code != http.StatusNotFound {
			t.Errorf("unknown snapshot: %d %v", code, body)
		}
	})

	t.Run("snapshot and fork replay the same trajectory", func(t *testing.T) {
		r, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 11, Profile: "stress"}))
		if err != nil {
			t.Fatal(err)
		}
		step := func(id, q string) *gauntletv1.StepResult {
			res, err := acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: `{"query":"` + q + `"}`}}))
			if err != nil {
				t.Fatal(err)
			}
			return res.Msg
		}
		step(r.Msg.EpisodeId, "a")
		step(r.Msg.EpisodeId, "b")
		snap, err := acme.Snapshot(ctx, connectrpc.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: r.Msg.EpisodeId}))
		if err != nil || snap.Msg.Step != 2 {
			t.Fatalf("Snapshot = %v, %v", snap, err)
		}
		orig := step(r.Msg.EpisodeId, "c")
		fork, err := acme.Fork(ctx, connectrpc.NewRequest(&gauntletv1.ForkRequest{SnapshotId: snap.Msg.SnapshotId}))
		if err != nil {
			t.Fatal(err)
		}
		forked := step(fork.Msg.EpisodeId, "c")
		if forked.Step != 2 || forked.ObservationJson != orig.ObservationJson || forked.Reward != orig.Reward {
			t.Errorf("fork's step 2 = %d %s %v, original %s %v", forked.Step, forked.ObservationJson, forked.Reward, orig.ObservationJson, orig.Reward)
		}
		if _, err := grpcClient(addr, tokenOther).Fork(ctx, connectrpc.NewRequest(&gauntletv1.ForkRequest{SnapshotId: snap.Msg.SnapshotId})); connectrpc.CodeOf(err) != connectrpc.CodeNotFound {
			t.Errorf("another tenant's snapshot: %v", err)
		}
	})

	t.Run("a model endpoint's episode and a trainer's are recorded alike", func(t *testing.T) {
		// A run names its model endpoint (gauntlet run --policy.http.url).
		o := runOpts{env: "shop", params: "{}", policies: "http=1", profiles: "stress=1",
			episodes: 3, seed: 77, maxInFlight: 500, label: t.Name(), endpoint: cfg.PolicyHTTP.URL}
		req, err := o.request()
		if err != nil {
			t.Fatal(err)
		}
		req.MaxSteps = 3
		runToEnd(t, s.app.getBus(), conn, cfg.Database, req)
		_, rows, err := trajectory.Query(ctx, conn, fmt.Sprintf(`SELECT episode_id, toString(seed), profile, toString(steps), reason FROM %s.episodes FINAL WHERE run_id = '%s' ORDER BY episode_id LIMIT 1`, cfg.Database, req.RunId))
		if err != nil || len(rows) != 1 {
			t.Fatalf("the http policy's episodes: %v %v", rows, err)
		}
		workerEp, seed, profile := rows[0][0], rows[0][1], rows[0][2]
		if rows[0][3] != "3" || rows[0][4] != "max_steps" {
			t.Fatalf("http policy episode: %v", rows[0])
		}
		// The same seed, profile and actions through the env API.
		var sd uint64
		fmt.Sscan(seed, &sd)
		r, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", ParamsJson: "{}", Seed: sd, Profile: profile, MaxSteps: 3}))
		if err != nil {
			t.Fatal(err)
		}
		for range 3 {
			if _, err := acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: r.Msg.EpisodeId, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: `{"query":"mug"}`}})); err != nil {
				t.Fatal(err)
			}
		}
		waitEpisodes(t, conn, cfg.Database, []string{r.Msg.EpisodeId})
		cols := "step, tool, args, observation, state_diff, fault_ids, fault_details, virtual_ns, progress, reward, reward_names, reward_values, terminated, truncated, reason"
		traj := func(id string) string {
			return queryOne(t, conn, fmt.Sprintf(`SELECT toString(groupArray(tuple(%s))) FROM (SELECT %s FROM %s.steps FINAL WHERE episode_id = '%s' ORDER BY step)`, cols, cols, cfg.Database, id))
		}
		if a, b := traj(workerEp), traj(r.Msg.EpisodeId); a != b || strings.Count(a, "catalog.search") != 3 {
			t.Errorf("the same episode differs by who chose the actions:\nworker (http policy): %s\nenv API:              %s", a, b)
		}
	})

	t.Run("REINFORCE example improves", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Fatalf("python3 is required for the example: %v", err)
		}
		cmd := exec.Command(py, filepath.Join("..", "..", "examples", "shop_reinforce.py"), "--iterations", "10", "--batch", "16")
		cmd.Env = append(os.Environ(), "GAUNTLET_URL=http://"+addr, "GAUNTLET_TOKEN="+tokenAcme)
		out, err := cmd.CombinedOutput()
		t.Logf("examples/shop_reinforce.py:\n%s", out)
		if err != nil {
			t.Fatal(err)
		}
		var r0, s0, r1, s1 float64
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if _, err := fmt.Sscanf(lines[len(lines)-1], "first iteration: return %f, success %f%%; last: return %f, success %f%%", &r0, &s0, &r1, &s1); err != nil {
			t.Fatalf("read the summary line: %v", err)
		}
		if r1 <= r0 || s1 <= s0 {
			t.Errorf("no improvement: return %v -> %v, success %v%% -> %v%%", r0, r1, s0, s1)
		}
	})

	t.Run("python client", func(t *testing.T) {
		py, err := exec.LookPath("python3")
		if err != nil {
			t.Fatalf("python3 is required for the Python client's tests: %v", err)
		}
		cmd := exec.Command(py, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
		cmd.Dir = filepath.Join("..", "..", "clients", "python")
		cmd.Env = append(os.Environ(), "GAUNTLET_URL=http://"+addr, "GAUNTLET_TOKEN="+tokenAcme, "GAUNTLET_OTHER_TOKEN="+tokenOther)
		out, err := cmd.CombinedOutput()
		t.Logf("python3 -m unittest:\n%s", out)
		if err != nil {
			t.Fatalf("python client tests: %v", err)
		}
	})
}

func roundTo(x float64, places int) float64 {
	p := 1.0
	for range places {
		p *= 10
	}
	v := float64(int64(x*p+0.5*sign(x))) / p
	return v
}

func sign(x float64) float64 {
	if x < 0 {
		return -1
	}
	return 1
}

// gauntletv1connectClientJSON is a Connect client speaking JSON over HTTP/1.1.
func gauntletv1connectClientJSON(addr, token string) gauntletv1connect.EnvServiceClient {
	return gauntletv1connect.NewEnvServiceClient(http.DefaultClient, "http://"+addr,
		connectrpc.WithProtoJSON(), connectrpc.WithInterceptors(bearer(token)))
}

// TestEnvAPIReapsIdleEpisodes leaves an episode idle past the idle timeout: later calls
// are told it was reaped, and its end (truncated, reason timeout) is in the event stream.
func TestEnvAPIReapsIdleEpisodes(t *testing.T) {
	cfg := testConfig(t)
	tokens := filepath.Join(t.TempDir(), "tenants.yaml")
	if err := os.WriteFile(tokens, []byte("tenants:\n  - name: acme\n    tokens: ["+tokenAcme+"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.EnvAPI.TokensFile = tokens
	cfg.EnvAPI.IdleTimeout = 300 * time.Millisecond
	s := startStack(t, cfg, modEnvAPI, modFaults, modReward)
	ctx := context.Background()
	acme := grpcClient(s.app.envapi.Addr(), tokenAcme)
	r, err := acme.Reset(ctx, connectrpc.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 1}))
	if err != nil {
		t.Fatal(err)
	}
	id := r.Msg.EpisodeId
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := acme.Capacity(ctx, connectrpc.NewRequest(&gauntletv1.CapacityRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		if c.Msg.ActiveEpisodes == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the idle episode was not reaped within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = acme.Step(ctx, connectrpc.NewRequest(&gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: "{}"}}))
	if connectrpc.CodeOf(err) != connectrpc.CodeFailedPrecondition || !strings.Contains(err.Error(), "reaped") {
		t.Errorf("step on a reaped episode: %v", err)
	}
	cons, err := s.app.getBus().JS.OrderedConsumer(ctx, bus.StreamEvents, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{bus.SubjectEvent(bus.KindEnded, "api-acme")},
	})
	if err != nil {
		t.Fatal(err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var ev gauntletv1.Event
	if err := proto.Unmarshal(m.Data(), &ev); err != nil {
		t.Fatal(err)
	}
	e := ev.EpisodeEnd()
	if e.GetEpisode().GetEpisodeId() != id || !e.Truncated || e.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT || !strings.Contains(e.Error, "reaped") || e.InfraError {
		t.Errorf("ended event = %v", e)
	}
}
