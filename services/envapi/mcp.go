package envapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// MCPPath is where the env API serves MCP (streamable HTTP): one MCP session at
// MCPPath+"<env>" plays one episode of that env (docs/mcp.md).
const MCPPath = "/mcp/"

// Keys of gauntlet's _meta entries: MetaEpisode on the initialize result (the episode
// id, its first observation and the ResetInfo), MetaStep on every tools/call result (the
// StepResult, reward and end included, without the observation, which is the content).
const (
	MetaEpisode = "gauntlet/episode"
	MetaStep    = "gauntlet/step"
)

// mcpBodyMax caps an MCP request body: a tools/call whose arguments are at the envs'
// env.MaxArgsBytes, each byte up to six times that once JSON escapes it, plus 64 KiB
// for the rest. (An MCP step carries no trainer data, so it is far below stepBodyMax.)
const mcpBodyMax = 6*env.MaxArgsBytes + 64<<10

// mcpQueryKeys are the query parameters that choose an MCP session's episode.
var mcpQueryKeys = []string{"max_steps", "params", "policy", "profile", "seed"}

// mcpSession is one MCP session and the episode it plays. The episode is reset when
// the client initializes the session and closed when the session ends.
type mcpSession struct {
	s      *Service
	tenant *Tenant
	reset  *gauntletv1.ResetRequest
	desc   string // the env's description, for the instructions
	tools  map[string]bool

	mu      sync.Mutex
	episode string // set by initialize
	ss      *mcp.ServerSession
}

func (m *mcpSession) episodeID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.episode
}

// mcpServerKey carries the MCP server a new session's request prepared (getServer).
type mcpServerKey struct{}

// mcpFront is the MCP endpoint's front door: it admits requests through the API's
// guard (tokens, back-off, size), keeps a session to its tenant, and for a request
// that opens a session reads the episode's choice from the URL and prepares the
// session's server before the SDK's handler runs.
type mcpFront struct {
	s    *Service
	g    *guard
	sdk  *mcp.StreamableHTTPHandler
	base *mcp.Server
}

// mcpHandler builds the MCP endpoint on the guard g of the connect API.
func (s *Service) mcpHandler(g *guard) http.Handler {
	f := &mcpFront{s: s, g: g}
	// base serves what the SDK asks of a server outside any session (its protocol
	// versions); it never opens one: every session gets its own, with its episode.
	f.base = mcp.NewServer(&mcp.Implementation{Name: "gauntlet"}, &mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{}})
	f.base.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "initialize" {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "open a session at " + MCPPath + "<env>"}
			}
			return next(ctx, method, req)
		}
	})
	f.sdk = mcp.NewStreamableHTTPHandler(f.server, &mcp.StreamableHTTPOptions{
		Logger: s.log,
		// An idle session outlives its episode's idle timeout, so the reaper ends the
		// episode first, as a timeout, as it would over the other calls.
		SessionTimeout:      2 * s.cfg.IdleTimeout,
		MaxRequestBodyBytes: mcpBodyMax,
	})
	return f
}

func (f *mcpFront) server(r *http.Request) *mcp.Server {
	if srv, ok := r.Context().Value(mcpServerKey{}).(*mcp.Server); ok {
		return srv
	}
	return f.base
}

func (f *mcpFront) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t, err := f.g.admit(r)
	if err != nil {
		mcpRefuse(w, err)
		return
	}
	if r.ContentLength > mcpBodyMax {
		mcpRefuse(w, tooLarge(r.ContentLength, mcpBodyMax))
		return
	}
	envName := strings.TrimPrefix(r.URL.Path, MCPPath)
	if envName == "" || strings.Contains(envName, "/") {
		mcpRefuse(w, connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s: MCP sessions are served at %s<env>", r.URL.Path, MCPPath)))
		return
	}
	if sid := r.Header.Get("Mcp-Session-Id"); sid != "" {
		f.s.mu.Lock()
		m := f.s.mcpSessions[sid]
		f.s.mu.Unlock()
		// Another tenant's session is unknown, exactly like a wrong id.
		if m != nil && m.tenant.Name != t.Name {
			mcpRefuse(w, connect.NewError(connect.CodeNotFound, errors.New("session not found")))
			return
		}
		if m != nil && m.reset.Env != envName {
			mcpRefuse(w, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("path %s: session %s plays env %q", r.URL.Path, sid, m.reset.Env)))
			return
		}
		f.sdk.ServeHTTP(w, r)
		return
	}
	if r.Method == http.MethodPost {
		// A request without a session opens one: its episode is chosen here, and
		// refused here when the choice is wrong, before the SDK reads the body.
		reset, err := mcpReset(envName, r.URL.Query())
		if err != nil {
			mcpRefuseCall(w, r, connect.NewError(connect.CodeInvalidArgument, err))
			return
		}
		e, err := f.s.validateReset(reset)
		if err != nil {
			mcpRefuseCall(w, r, err)
			return
		}
		srv, err := f.s.newMCPServer(t, reset, e)
		if err != nil {
			mcpRefuseCall(w, r, err)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), mcpServerKey{}, srv))
	}
	f.sdk.ServeHTTP(w, r)
}

// mcpReset reads an episode's choice from the query of the session's URL: seed,
// profile, params (a JSON object), max_steps and policy (default "mcp"), each at most
// once; other keys are refused, naming them.
func mcpReset(envName string, q map[string][]string) (*gauntletv1.ResetRequest, error) {
	r := &gauntletv1.ResetRequest{Env: envName, Policy: "mcp"}
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var errs []error
	for _, k := range keys {
		vs := q[k]
		if len(vs) != 1 {
			errs = append(errs, fmt.Errorf("query %s: given %d times; give it once", k, len(vs)))
			continue
		}
		v := vs[0]
		switch k {
		case "seed":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				errs = append(errs, fmt.Errorf("query seed: %q is not an unsigned 64-bit integer", v))
			}
			r.Seed = n
		case "max_steps":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				errs = append(errs, fmt.Errorf("query max_steps: %q is not an unsigned 32-bit integer", v))
			}
			r.MaxSteps = uint32(n)
		case "profile":
			r.Profile = v
		case "params":
			r.ParamsJson = v
		case "policy":
			r.Policy = v
		default:
			errs = append(errs, fmt.Errorf("query %s: unknown parameter; known: %s", k, strings.Join(mcpQueryKeys, ", ")))
		}
	}
	return r, errors.Join(errs...)
}

// newMCPServer is the MCP server of one session: the env's tools, in its order, with
// their descriptions and JSON Schemas as they are; each call a step of the session's
// episode.
func (s *Service) newMCPServer(t *Tenant, reset *gauntletv1.ResetRequest, e env.Env) (*mcp.Server, error) {
	sp := e.Spec()
	if w, ok := world.Of(e); ok && len(w.Roles()) > 0 {
		// An MCP client is one agent, and role-named tools are no MCP tool names.
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("env %s is a world of several agents (roles %s): an MCP session is one agent's; play it over the env API (docs/worlds.md, Several agents)",
			sp.Name, strings.Join(w.Roles(), ", ")))
	}
	m := &mcpSession{s: s, tenant: t, reset: reset, desc: sp.Description, tools: make(map[string]bool, len(sp.Tools))}
	srv := mcp.NewServer(&mcp.Implementation{Name: "gauntlet", Title: "gauntlet env " + sp.Name},
		&mcp.ServerOptions{Logger: s.log, Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}}})
	for _, tool := range sp.Tools {
		// The SDK insists on object schemas (and panics on others); every env's are
		// (envtest), so one that is not is a bug of the env, answered as such.
		var top struct {
			Type string `json:"type"`
		}
		if err := json.Unmarshal(tool.Schema, &top); err != nil || top.Type != "object" {
			return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("env %s: tool %s: its schema is not a JSON Schema of type object", sp.Name, tool.Name))
		}
		m.tools[tool.Name] = true
		name := tool.Name
		srv.AddTool(&mcp.Tool{Name: name, Description: tool.Description, InputSchema: json.RawMessage(tool.Schema)},
			func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
				return m.step(ctx, name, req.Params.Arguments)
			})
	}
	srv.AddReceivingMiddleware(m.middleware)
	return srv, nil
}

// middleware resets the episode at initialize, and steps calls of tools the env does
// not have (the SDK would refuse them as a protocol error) so that, as over the other
// calls, they are the policy's moves: invalid actions the env answers and counts.
func (m *mcpSession) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize":
			return m.initialize(ctx, method, req, next)
		case "tools/call":
			if p, ok := req.GetParams().(*mcp.CallToolParamsRaw); ok && !m.tools[p.Name] {
				return m.step(ctx, p.Name, p.Arguments)
			}
		}
		return next(ctx, method, req)
	}
}

// initialize resets the session's episode and answers the first observation in the
// result's instructions and _meta; the episode is closed when the session ends.
func (m *mcpSession) initialize(ctx context.Context, method string, req mcp.Request, next mcp.MethodHandler) (mcp.Result, error) {
	s := m.s
	ss, ok := req.GetSession().(*mcp.ServerSession)
	if !ok || ss.ID() == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "an MCP episode needs a session"}
	}
	if s.stopping.Load() {
		return nil, mcpError(connect.NewError(connect.CodeUnavailable, errors.New("the env API is stopping")))
	}
	if m.episodeID() != "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "the session is initialized already"}
	}
	out, err := s.start(ctx, m.tenant, m.reset, nil)
	if err != nil {
		return nil, mcpError(err) // the SDK drops a session whose initialize failed
	}
	res, err := next(ctx, method, req)
	if err != nil {
		cctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		_, _ = s.close(cctx, m.tenant, out.EpisodeId, "MCP initialize failed")
		cancel()
		return nil, err
	}
	m.mu.Lock()
	m.episode, m.ss = out.EpisodeId, ss
	m.mu.Unlock()
	s.mu.Lock()
	s.mcpSessions[ss.ID()] = m
	s.mu.Unlock()
	go m.closeAtEnd(ss, out.EpisodeId)

	ir, ok := res.(*mcp.InitializeResult)
	if !ok {
		return res, nil
	}
	info, err := protojson.Marshal(out.Info)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "encode the reset's info: " + err.Error()}
	}
	meta := struct {
		EpisodeID   string          `json:"episodeId"`
		Observation json.RawMessage `json:"observation"`
		Info        json.RawMessage `json:"info"`
	}{out.EpisodeId, json.RawMessage(out.ObservationJson), info}
	ir.Meta = mcp.Meta{MetaEpisode: meta}
	ir.Instructions = fmt.Sprintf("gauntlet env %s: %s\n\nThis session is one episode (%s: seed %d, fault profile %s, at most %d steps). "+
		"Each tool call is one step; the episode ends on success, failure or its step limit. Its first observation:\n%s",
		m.reset.Env, m.desc, out.EpisodeId, out.Info.GetSeed(), out.Info.GetProfile(), out.Info.GetMaxSteps(), out.ObservationJson)
	return ir, nil
}

// closeAtEnd closes the episode when its session ends (the client's DELETE, the
// session's idle timeout, a lost connection), so every episode is recorded to its
// end; one already over stays as it ended. When the API stops, Stopping ends the
// episodes instead, as the server's doing.
func (m *mcpSession) closeAtEnd(ss *mcp.ServerSession, id string) {
	_ = ss.Wait()
	s := m.s
	s.mu.Lock()
	delete(s.mcpSessions, ss.ID())
	s.mu.Unlock()
	if s.stopping.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	if _, err := s.close(ctx, m.tenant, id, "MCP session closed"); err != nil && connect.CodeOf(err) != connect.CodeNotFound {
		s.log.Warn("envapi: close the episode of an ended MCP session", "episode_id", id, "err", err)
	}
}

// step plays one tools/call as a step of the session's episode through the API's own
// step path, and answers it as an MCP tool result.
func (m *mcpSession) step(ctx context.Context, tool string, args json.RawMessage) (*mcp.CallToolResult, error) {
	id := m.episodeID()
	if id == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidRequest, Message: "the session is not initialized"}
	}
	// MCP lets a client leave out the arguments of a call that has none.
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	res, err := m.s.step(ctx, m.tenant, &gauntletv1.StepRequest{EpisodeId: id, Action: &gauntletv1.Action{Tool: tool, ArgsJson: string(args)}})
	if err != nil {
		return nil, mcpError(err)
	}
	return toolResult(res)
}

// toolResult is a step as an MCP tool result: the observation as text content and, as
// every observation is a JSON object, as structured content; isError when the env
// answered an invalid action or a violated precondition, or the step did not play (an
// infra error, the episode timeout: the error follows as a second text); the rest of
// the StepResult (reward, reward vector, terminated, truncated, reason, info) in
// _meta[MetaStep], as the env API's HTTP/JSON writes it (fields at their zero value,
// such as terminated false, left out).
func toolResult(res *gauntletv1.StepResult) (*mcp.CallToolResult, error) {
	rest := proto.CloneOf(res)
	rest.ObservationJson = ""
	meta, err := protojson.Marshal(rest)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "encode the step's result: " + err.Error()}
	}
	out := &mcp.CallToolResult{
		Meta:    mcp.Meta{MetaStep: json.RawMessage(meta)},
		Content: []mcp.Content{&mcp.TextContent{Text: res.ObservationJson}},
	}
	if obs := strings.TrimSpace(res.ObservationJson); strings.HasPrefix(obs, "{") && json.Valid([]byte(obs)) {
		out.StructuredContent = json.RawMessage(obs)
	}
	sig := res.GetInfo().GetSignals()
	out.IsError = sig.GetInvalidAction() || len(sig.GetViolations()) > 0 || res.GetInfo().GetError() != ""
	if msg := res.GetInfo().GetError(); msg != "" {
		out.Content = append(out.Content, &mcp.TextContent{Text: msg})
	}
	return out, nil
}

// mcpErrorBase is where gauntlet's JSON-RPC error codes start: an env API error of
// gRPC code c is -32100-c (resource_exhausted -32108, failed_precondition -32109,
// aborted -32110, unavailable -32114, unauthenticated -32116; not found -32105), but
// invalid_argument is JSON-RPC's own invalid params (-32602) and internal its internal
// error (-32603). The codes below -32099 are outside JSON-RPC's and MCP's reserved range.
const mcpErrorBase = -32100

// mcpErrorData is the data of gauntlet's JSON-RPC errors: the env API's code by name,
// and when to retry a refusal for load.
type mcpErrorData struct {
	Code              string `json:"code"`
	RetryAfterSeconds int    `json:"retryAfterSeconds,omitempty"`
}

// mcpError is an env API call error as a JSON-RPC error.
func mcpError(err error) *jsonrpc.Error {
	code, data := mcpCode(err)
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	if code == mcpErrorBase-int64(connect.CodeFailedPrecondition) {
		msg += " (over MCP, a new session plays a new episode)"
	}
	return &jsonrpc.Error{Code: code, Message: msg, Data: mustJSON(data)}
}

func mcpCode(err error) (int64, mcpErrorData) {
	c := connect.CodeOf(err)
	if c == connect.CodeUnknown {
		c = connect.CodeInternal
	}
	data := mcpErrorData{Code: c.String()}
	var ce *connect.Error
	if errors.As(err, &ce) {
		data.RetryAfterSeconds, _ = strconv.Atoi(ce.Meta().Get("Retry-After"))
	}
	switch c {
	case connect.CodeInvalidArgument:
		return jsonrpc.CodeInvalidParams, data
	case connect.CodeInternal:
		return jsonrpc.CodeInternalError, data
	}
	return mcpErrorBase - int64(c), data
}

// mcpRefuse answers a request refused before MCP reads it: the HTTP status of the env
// API's code (401, 404, 400, 413, 429 with Retry-After, ...) with a JSON-RPC error as
// its body. Its id is null: the body of a request refused by the guard is never read.
func mcpRefuse(w http.ResponseWriter, err error) { mcpRefuseID(w, nil, err) }

// mcpRefuseCall refuses an authenticated request whose episode cannot be opened (a bad
// query, an unknown env): it reads the body for the request's id, so that the JSON-RPC
// error answers that request and an MCP client surfaces its message to its caller.
func mcpRefuseCall(w http.ResponseWriter, r *http.Request, err error) {
	var id any
	if body, rerr := io.ReadAll(io.LimitReader(r.Body, mcpBodyMax)); rerr == nil {
		if msg, derr := jsonrpc.DecodeMessage(body); derr == nil {
			if req, ok := msg.(*jsonrpc.Request); ok && req.ID.IsValid() {
				id = req.ID.Raw()
			}
		}
	}
	mcpRefuseID(w, id, err)
}

func mcpRefuseID(w http.ResponseWriter, id any, err error) {
	code, data := mcpCode(err)
	status := http.StatusInternalServerError
	switch connect.CodeOf(err) {
	case connect.CodeUnauthenticated:
		status = http.StatusUnauthorized
		w.Header().Set("WWW-Authenticate", "Bearer")
	case connect.CodeNotFound:
		status = http.StatusNotFound
	case connect.CodeInvalidArgument, connect.CodeFailedPrecondition:
		status = http.StatusBadRequest
	case connect.CodeResourceExhausted:
		status = http.StatusRequestEntityTooLarge
		if data.RetryAfterSeconds > 0 {
			status = http.StatusTooManyRequests
			w.Header().Set("Retry-After", strconv.Itoa(data.RetryAfterSeconds))
		}
	case connect.CodeUnavailable:
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) {
		msg = ce.Message()
	}
	body, _ := json.Marshal(struct {
		JSONRPC string         `json:"jsonrpc"`
		ID      any            `json:"id"`
		Error   *jsonrpc.Error `json:"error"`
	}{"2.0", id, &jsonrpc.Error{Code: code, Message: msg, Data: mustJSON(data)}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// stopMCP closes every MCP session before the server shuts down, so their open
// streams do not hold the shutdown; their episodes are then ended by Stopping.
func (s *Service) stopMCP() {
	s.stopping.Store(true)
	s.mu.Lock()
	sessions := make([]*mcp.ServerSession, 0, len(s.mcpSessions))
	for _, m := range s.mcpSessions {
		m.mu.Lock()
		if m.ss != nil {
			sessions = append(sessions, m.ss)
		}
		m.mu.Unlock()
	}
	s.mu.Unlock()
	for _, ss := range sessions {
		_ = ss.Close()
	}
}
