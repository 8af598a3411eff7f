package envapi_test

import (
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/bus"
	"github.com/gauntlet-rl/gauntlet/pkg/bus/bustest"
	_ "github.com/gauntlet-rl/gauntlet/pkg/env/shop"
	"github.com/gauntlet-rl/gauntlet/pkg/telemetry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
	"github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1/gauntletv1connect"
	"github.com/gauntlet-rl/gauntlet/services/envapi"
	"github.com/gauntlet-rl/gauntlet/services/faults"
	"github.com/gauntlet-rl/gauntlet/services/reward"
)

// Tokens of the tenants these tests run as: acme (the server's default quota), other,
// and small (quota 2).
const (
	tokenAcme  = "acme-token-0123456789abcdef"
	tokenOther = "other-token-0123456789abcdef"
	tokenSmall = "small-token-0123456789abcdef"
)

// apiStack is the env API with its real neighbours in process: an embedded NATS with
// gauntlet's streams, the faults service (plans) and the reward service (scores).
type apiStack struct {
	bus    *bus.Bus
	addr   string
	faults *faults.Service
	reward *reward.Service
}

// startAPI starts the stack; adjust (if not nil) changes the env API's configuration
// before it starts.
func startAPI(t *testing.T, adjust func(*envapi.Config)) *apiStack {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	b := bustest.Start(t)
	getBus := func() *bus.Bus { return b }
	meter := noop.NewMeterProvider().Meter("test")

	fs := faults.New(getBus, meter, log)
	if err := fs.Starting(ctx); err != nil {
		t.Fatalf("start the faults service: %v", err)
	}
	t.Cleanup(func() { _ = fs.Stopping(ctx) })
	rs := reward.New(reward.Config{}, getBus, meter, log)
	if err := rs.Starting(ctx); err != nil {
		t.Fatalf("start the reward service: %v", err)
	}
	t.Cleanup(func() { _ = rs.Stopping(ctx) })

	var cfg envapi.Config
	cfg.RegisterFlags(flag.NewFlagSet("test", flag.ContinueOnError))
	cfg.Addr = "127.0.0.1:0"
	cfg.TokensFile = filepath.Join(t.TempDir(), "tenants.yaml")
	tenants := "tenants:\n  - name: acme\n    tokens: [" + tokenAcme + "]\n  - name: other\n    tokens: [" + tokenOther +
		"]\n  - name: small\n    tokens: [" + tokenSmall + "]\n    max_episodes: 2\n"
	if err := os.WriteFile(cfg.TokensFile, []byte(tenants), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg.StepTimeout, cfg.StartTimeout = 5*time.Second, 5*time.Second
	if adjust != nil {
		adjust(&cfg)
	}
	tel, err := telemetry.New("envapi-test", "")
	if err != nil {
		t.Fatal(err)
	}
	s := envapi.New(cfg, getBus, tel, log)
	if err := s.Starting(ctx); err != nil {
		t.Fatalf("start the env API: %v", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.Running(rctx) }()
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		defer scancel()
		_ = s.Stopping(sctx)
		cancel()
		<-done
	})
	return &apiStack{bus: b, addr: s.Addr(), faults: fs, reward: rs}
}

// bearer adds a tenant's token to every call.
type bearer string

func (b bearer) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		req.Header().Set("Authorization", "Bearer "+string(b))
		return next(ctx, req)
	}
}

func (b bearer) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		conn.RequestHeader().Set("Authorization", "Bearer "+string(b))
		return conn
	}
}

func (b bearer) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// client is a Connect client of the API calling as the tenant of token.
func (a *apiStack) client(token string) gauntletv1connect.EnvServiceClient {
	return gauntletv1connect.NewEnvServiceClient(http.DefaultClient, "http://"+a.addr, connect.WithInterceptors(bearer(token)))
}

// codeOf is err's connect code, or 0 (no error) for nil.
func codeOf(err error) connect.Code {
	if err == nil {
		return 0
	}
	return connect.CodeOf(err)
}

func reset(ctx context.Context, t *testing.T, c gauntletv1connect.EnvServiceClient, seed uint64) string {
	t.Helper()
	res, err := c.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: seed, Profile: "baseline"}))
	if err != nil {
		t.Fatalf("reset: %v", err)
	}
	return res.Msg.EpisodeId
}

func search(id string) *gauntletv1.StepRequest {
	return &gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: "catalog.search", ArgsJson: `{"query":"mug"}`}}
}

func capacity(ctx context.Context, t *testing.T, c gauntletv1connect.EnvServiceClient) *gauntletv1.CapacityResponse {
	t.Helper()
	res, err := c.Capacity(ctx, connect.NewRequest(&gauntletv1.CapacityRequest{}))
	if err != nil {
		t.Fatalf("capacity: %v", err)
	}
	return res.Msg
}

// One tenant cannot see, step, snapshot, close or fork another's episodes: each call
// answers NOT_FOUND, exactly as for an id that never existed, and leaves the episode as
// it was for its owner. Results queued by one tenant are not another's to receive, even
// under the same queue name.
func TestTenantCannotReachAnothersEpisodes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startAPI(t, nil)
	acme, other := a.client(tokenAcme), a.client(tokenOther)
	id := reset(ctx, t, acme, 1)
	snap, err := acme.Snapshot(ctx, connect.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: id}))
	if err != nil {
		t.Fatal(err)
	}

	_, err = other.Step(ctx, connect.NewRequest(search(id)))
	if codeOf(err) != connect.CodeNotFound {
		t.Errorf("another tenant's Step: %v, want not_found", err)
	}
	_, err = other.Snapshot(ctx, connect.NewRequest(&gauntletv1.SnapshotRequest{EpisodeId: id}))
	if codeOf(err) != connect.CodeNotFound {
		t.Errorf("another tenant's Snapshot: %v, want not_found", err)
	}
	_, err = other.Close(ctx, connect.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id}))
	if codeOf(err) != connect.CodeNotFound {
		t.Errorf("another tenant's Close: %v, want not_found", err)
	}
	_, err = other.Fork(ctx, connect.NewRequest(&gauntletv1.ForkRequest{SnapshotId: snap.Msg.SnapshotId}))
	if codeOf(err) != connect.CodeNotFound {
		t.Errorf("another tenant's Fork: %v, want not_found", err)
	}
	if c := capacity(ctx, t, other); c.ActiveEpisodes != 0 {
		t.Errorf("other's capacity after the refused fork: %d active, want 0", c.ActiveEpisodes)
	}
	batch, err := other.StepBatch(ctx, connect.NewRequest(&gauntletv1.StepBatchRequest{Steps: []*gauntletv1.StepRequest{search(id)}}))
	if err != nil {
		t.Fatal(err)
	}
	if r := batch.Msg.Results; len(r) != 1 || r[0].GetError().GetCode() != connect.CodeNotFound.String() {
		t.Errorf("another tenant's StepBatch: %v, want one not_found result", r)
	}

	// The owner's episode went untouched: its first step is step 0, and it is live.
	res, err := acme.Step(ctx, connect.NewRequest(search(id)))
	if err != nil || res.Msg.Step != 0 || res.Msg.Truncated || res.Msg.Terminated {
		t.Fatalf("owner's step after the others' calls: %v %v", res, err)
	}

	// Queued results belong to the tenant that sent the steps.
	if _, err := acme.Send(ctx, connect.NewRequest(&gauntletv1.StepBatchRequest{Queue: "q", Steps: []*gauntletv1.StepRequest{search(id)}})); err != nil {
		t.Fatal(err)
	}
	got, err := other.Recv(ctx, connect.NewRequest(&gauntletv1.RecvRequest{Queue: "q", TimeoutMs: 300}))
	if err != nil || len(got.Msg.Results) != 0 {
		t.Errorf("other's Recv on acme's queue name: %v %v, want nothing", got, err)
	}
	mine, err := acme.Recv(ctx, connect.NewRequest(&gauntletv1.RecvRequest{Queue: "q", TimeoutMs: 5000}))
	if err != nil || len(mine.Msg.Results) != 1 || mine.Msg.Results[0].Step != 1 {
		t.Errorf("acme's Recv: %v %v, want its step 1", mine, err)
	}

	// Once ended, the episode is still only its owner's to ask about.
	if _, err := acme.Close(ctx, connect.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = other.Close(ctx, connect.NewRequest(&gauntletv1.CloseRequest{EpisodeId: id}))
	if codeOf(err) != connect.CodeNotFound {
		t.Errorf("another tenant's Close of an ended episode: %v, want not_found", err)
	}
	_, err = other.Step(ctx, connect.NewRequest(search(id)))
	if codeOf(err) != connect.CodeNotFound {
		t.Errorf("another tenant's Step of an ended episode: %v, want not_found", err)
	}
	_, err = acme.Step(ctx, connect.NewRequest(search(id)))
	if codeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("owner's Step of its ended episode: %v, want failed_precondition", err)
	}
}

// A call without a known token is refused before it reaches an episode.
func TestUnknownTokenIsUnauthenticated(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := startAPI(t, nil)
	for _, tok := range []string{"", "nobody-token-0123456789abcdef"} {
		_, err := a.client(tok).Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 1}))
		if codeOf(err) != connect.CodeUnauthenticated {
			t.Errorf("Reset with token %q: %v, want unauthenticated", tok, err)
		}
	}
}

// A tenant's live episodes are capped by its quota and all tenants' by the server's cap:
// past either, Reset is RESOURCE_EXHAUSTED with a Retry-After, and an episode that ends,
// or a Reset that fails, gives its slot back.
func TestAdmissionCaps(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startAPI(t, func(c *envapi.Config) { c.ServerMaxEpisodes = 3 })
	small, acme, other := a.client(tokenSmall), a.client(tokenAcme), a.client(tokenOther)

	first := reset(ctx, t, small, 1)
	reset(ctx, t, small, 2)
	_, err := small.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 3}))
	var ce *connect.Error
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || ce.Meta().Get("Retry-After") == "" {
		t.Fatalf("small's third Reset: %v, want resource_exhausted with Retry-After", err)
	}
	if !strings.Contains(err.Error(), "quota") {
		t.Errorf("small's third Reset names no quota: %v", err)
	}
	if c := capacity(ctx, t, small); c.ActiveEpisodes != 2 || c.MaxEpisodes != 2 || c.ServerActiveEpisodes != 2 || c.ServerMaxEpisodes != 3 {
		t.Errorf("small's capacity: %v", c)
	}

	// The server's cap counts every tenant.
	reset(ctx, t, acme, 4)
	_, err = other.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 5}))
	if !errors.As(err, &ce) || ce.Code() != connect.CodeResourceExhausted || !strings.Contains(err.Error(), "cap") {
		t.Fatalf("other's Reset on a full server: %v, want resource_exhausted naming the cap", err)
	}

	// Closing gives the slot back.
	if _, err := small.Close(ctx, connect.NewRequest(&gauntletv1.CloseRequest{EpisodeId: first})); err != nil {
		t.Fatal(err)
	}
	reset(ctx, t, small, 6)

}

// A Reset whose fault plan cannot be had says why in the code a trainer acts on: a
// profile nobody knows is INVALID_ARGUMENT (do not retry), a faults service that cannot
// plan now is UNAVAILABLE (retry); neither keeps the slot it took.
func TestResetPlanErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startAPI(t, func(c *envapi.Config) { c.StartTimeout = time.Second })
	small := a.client(tokenSmall)

	_, err := small.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 1, Profile: "chaos"}))
	if codeOf(err) != connect.CodeInvalidArgument || !strings.Contains(err.Error(), `unknown profile "chaos"`) {
		t.Errorf("Reset with an unknown profile: %v, want invalid_argument naming it", err)
	}
	_, err = small.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "nope", Seed: 1}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Reset of an unknown env: %v, want invalid_argument", err)
	}

	// The faults service cannot read the global drift: it cannot plan now.
	if err := a.bus.JS.DeleteKeyValue(ctx, bus.BucketDrift); err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // more than the quota: a failed Reset must not keep its slot
		_, err = small.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: uint64(i)}))
		if codeOf(err) != connect.CodeUnavailable {
			t.Fatalf("Reset %d while the faults service cannot plan: %v, want unavailable", i, err)
		}
	}
	if c := capacity(ctx, t, small); c.ActiveEpisodes != 0 || c.ServerActiveEpisodes != 0 {
		t.Errorf("capacity after failed Resets: %v, want no episode live", c)
	}

	// No faults service at all is unavailable too, not the trainer's mistake.
	if err := a.faults.Stopping(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = small.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 9}))
	if codeOf(err) != connect.CodeUnavailable {
		t.Errorf("Reset with no faults service: %v, want unavailable", err)
	}
	// A trainer's own mistake stays INVALID_ARGUMENT when no faults service is there to
	// say so: retrying would never help.
	_, err = small.Reset(ctx, connect.NewRequest(&gauntletv1.ResetRequest{Env: "shop", Seed: 9, Profile: "chaos"}))
	if codeOf(err) != connect.CodeInvalidArgument {
		t.Errorf("Reset with an unknown profile and no faults service: %v, want invalid_argument", err)
	}
}

// A step the reward service does not score in time is gauntlet's failure, not the
// policy's: the result is flagged infra_error and truncated with that reason, the episode
// is over (a later step is FAILED_PRECONDITION) and its slot is free again.
func TestUnscoredStepIsAnInfraError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startAPI(t, func(c *envapi.Config) { c.StepTimeout = 500 * time.Millisecond })
	small := a.client(tokenSmall)
	id := reset(ctx, t, small, 1)
	if _, err := small.Step(ctx, connect.NewRequest(search(id))); err != nil {
		t.Fatalf("step with the reward service up: %v", err)
	}
	if err := a.reward.Stopping(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := small.Step(ctx, connect.NewRequest(search(id)))
	if err != nil {
		t.Fatalf("unscored step: %v, want a result flagged infra_error", err)
	}
	if r := res.Msg; !r.GetInfo().GetInfraError() || !r.Truncated || r.Terminated ||
		r.Reason != gauntletv1.TerminationReason_TERMINATION_REASON_INFRA_ERROR || r.Step != 1 {
		t.Errorf("unscored step: %v, want step 1 truncated as an infra error", r)
	}
	if _, err := small.Step(ctx, connect.NewRequest(search(id))); codeOf(err) != connect.CodeFailedPrecondition {
		t.Errorf("step after the infra error: %v, want failed_precondition", err)
	}
	if c := capacity(ctx, t, small); c.ActiveEpisodes != 0 {
		t.Errorf("%d episodes live after the infra error, want 0", c.ActiveEpisodes)
	}
}

// TestMCPSharesTheAPIsGuard: the MCP endpoint admits requests through the API's own
// guard, so bad tokens sent to it count toward the address's back-off, and the back-off
// then refuses that address everywhere, a good token and the connect API included.
func TestMCPSharesTheAPIsGuard(t *testing.T) {
	a := startAPI(t, func(c *envapi.Config) { c.AuthFailures, c.AuthBackoff = 3, time.Minute })
	initialize := func(token string) *http.Response {
		t.Helper()
		req, err := http.NewRequest("POST", "http://"+a.addr+envapi.MCPPath+"shop",
			strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := initialize(tokenAcme); resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
		t.Fatalf("initialize with a good token: HTTP %d, session %q", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
	}
	for i := range 3 {
		if resp := initialize("bad-token-0123456789abcdef"); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("bad token %d: HTTP %d, want 401", i, resp.StatusCode)
		}
	}
	resp := initialize(tokenAcme)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a good token from a backed-off address: HTTP %d, Retry-After %q; want 429 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if _, err := a.client(tokenAcme).Capacity(context.Background(), connect.NewRequest(&gauntletv1.CapacityRequest{})); codeOf(err) != connect.CodeResourceExhausted {
		t.Errorf("the connect API from the backed-off address: %v, want resource_exhausted", err)
	}
}
