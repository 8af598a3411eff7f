package mcpenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ErrNotReset is returned by Step before the first Reset.
var ErrNotReset = errors.New("mcp: Step before Reset")

// ErrEpisodeOver is returned by Step after the episode ended.
var ErrEpisodeOver = errors.New("mcp: episode is over")

func msDuration(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

// toolInfo is one offered tool as the server listed it.
type toolInfo struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`

	service string
	schema  *jsonschema.Resolved
}

type episode struct {
	d          *Decl
	cfg        env.Config
	maxSteps   uint32
	maxInvalid int
	deadline   time.Duration
	cassette   *Cassette

	srv     *server
	tools   []*toolInfo
	calls   []any // what the verifier sees, one map per call
	answers int   // cassette answers played
	listed  bool  // the tools' listing is in a diff already
	ready   bool
	done    bool
	reason  gauntletv1.TerminationReason
	step    uint32
	clock   time.Duration
	invalid int
}

func (e *episode) Now() time.Duration { return e.clock }

// resetObs is the first observation.
type resetObs struct {
	Task       string      `json:"task"`
	Seed       uint64      `json:"seed"`
	Tools      []*toolInfo `json:"tools"`
	MaxSteps   uint32      `json:"max_steps"`
	DeadlineMs int64       `json:"deadline_ms"`
}

// Reset connects to the server (a fresh sandbox and process for a command, a new session
// for a URL; nothing for a cassette), lists its tools and returns the task.
func (e *episode) Reset() (json.RawMessage, error) {
	if err := e.Close(); err != nil {
		return nil, err
	}
	*e = episode{d: e.d, cfg: e.cfg, maxSteps: e.maxSteps, maxInvalid: e.maxInvalid, deadline: e.deadline, cassette: e.cassette}
	var listed []*mcp.Tool
	switch {
	case e.cassette != nil:
		for _, t := range e.cassette.Tools {
			listed = append(listed, &mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema})
		}
	case len(e.d.Server.Command) > 0:
		if e.cfg.Sandboxes == nil {
			return nil, fmt.Errorf("mcp %s: %w", e.d.Name, env.ErrNoSandbox)
		}
		srv, err := startCommand(e.d, e.cfg.Sandboxes, e.cfg.Seed)
		if err != nil {
			return nil, err
		}
		e.srv = srv
	default:
		srv, err := dialURL(e.d, e.cfg.Seed)
		if err != nil {
			return nil, err
		}
		e.srv = srv
	}
	if e.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), msDuration(e.d.Server.TimeoutMs))
		defer cancel()
		for t, err := range e.srv.sess.Tools(ctx, nil) {
			if err != nil {
				return nil, errors.Join(fmt.Errorf("mcp %s: %w: tools/list: %w", e.d.Name, ErrServer, err), e.Close())
			}
			listed = append(listed, t)
		}
	}
	tools, err := e.offer(listed)
	if err != nil {
		return nil, errors.Join(err, e.Close())
	}
	e.tools, e.ready = tools, true
	obs, err := json.Marshal(resetObs{Task: strings.ReplaceAll(e.d.Task, "{seed}", strconv.FormatUint(e.cfg.Seed, 10)),
		Seed: e.cfg.Seed, Tools: tools, MaxSteps: e.maxSteps, DeadlineMs: e.deadline.Milliseconds()})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("mcp %s: first observation: %w", e.d.Name, err), e.Close())
	}
	return obs, nil
}

// offer picks the declared tools out of the server's listing, in the declaration's
// order, with their schemas resolved; a declared tool the server does not list is an
// infra error naming it (the env's action space is frozen by its declaration).
func (e *episode) offer(listed []*mcp.Tool) ([]*toolInfo, error) {
	byName := make(map[string]*mcp.Tool, len(listed))
	for _, t := range listed {
		byName[t.Name] = t
	}
	var (
		out     []*toolInfo
		missing []string
	)
	for _, dt := range e.d.Tools {
		t, ok := byName[dt.Name]
		if !ok {
			missing = append(missing, dt.Name)
			continue
		}
		raw, err := json.Marshal(t.InputSchema)
		if err != nil || t.InputSchema == nil {
			raw = anyObject
		}
		var s jsonschema.Schema
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, fmt.Errorf("mcp %s: %w: tool %s: input schema: %w", e.d.Name, ErrServer, dt.Name, err)
		}
		rs, err := s.Resolve(nil)
		if err != nil {
			return nil, fmt.Errorf("mcp %s: %w: tool %s: input schema: %w", e.d.Name, ErrServer, dt.Name, err)
		}
		svc := dt.Service
		if svc == "" {
			svc = e.d.Service
		}
		out = append(out, &toolInfo{Name: t.Name, Description: t.Description, InputSchema: raw, service: svc, schema: rs})
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("mcp %s: %w: tools/list lacks declared tools %s", e.d.Name, ErrServer, strings.Join(missing, ", "))
	}
	if len(e.d.Verifier.Command) > 0 {
		out = append(out, &toolInfo{Name: ToolSubmit, Description: "Declare the task done: the episode ends and the verifier judges.", InputSchema: submitSchema})
	}
	return out, nil
}

// errObs is the observation of an action refused or a call aborted.
type errObs struct {
	OK           bool   `json:"ok"`
	Error        string `json:"error"`
	Status       uint32 `json:"status,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	Suggestion   string `json:"suggestion,omitempty"`
}

// answer is the server's answer to one call as recorded in the step's diff (and played
// back from a cassette): its CallToolResult, or the JSON-RPC error it answered with.
type answer struct {
	Result json.RawMessage `json:"result,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// callObs is the observation of a call the server answered.
type callObs struct {
	IsError    bool            `json:"is_error"`
	Content    json.RawMessage `json:"content,omitempty"`
	Structured json.RawMessage `json:"structured,omitempty"`
	Error      string          `json:"error,omitempty"`
}

// diffEntry is one entry of a step's diff: the tools the server listed (in the first
// step that is not an invalid action), a call's answer, or the command verifier's verdict.
type diffEntry struct {
	Tools   []*toolInfo `json:"tools,omitempty"`
	Tool    string      `json:"tool,omitempty"`
	Answer  *answer     `json:"answer,omitempty"`
	Verdict *verdict    `json:"verdict,omitempty"`
}

// Step applies one action. Invalid actions and the server's tool errors are observations;
// a Go error is an infra error (the server broke its connection or did not answer in
// time, the sandbox failed, a cassette ran out) and the episode is dead.
func (e *episode) Step(a env.Action) (env.StepResult, error) {
	switch {
	case !e.ready:
		return env.StepResult{}, ErrNotReset
	case e.done:
		return env.StepResult{}, fmt.Errorf("%w (%s)", ErrEpisodeOver, e.reason)
	}
	start := e.clock
	var (
		obs     []byte
		diff    = []byte("[]")
		fired   []*gauntletv1.FaultFired
		errs    uint32
		calls   = uint32(1)
		v       *verdict
		success bool
		failure bool
	)
	t, args, bad := e.parseAction(a)
	switch {
	case bad != nil:
		calls = 0
		e.invalid++
		errs++
		obs = marshal(bad)
	case t.Name == ToolSubmit:
		var err error
		if v, err = e.verify(); err != nil {
			return env.StepResult{}, err
		}
		obs, diff = marshal(struct {
			Verdict *verdict `json:"verdict"`
		}{v}), marshal([]diffEntry{{Verdict: v}})
	default:
		out := e.cfg.Faults.Call(t.service, t.Name, e.clock)
		e.clock += e.d.callCost + out.Latency
		fired = out.Fired
		rec := map[string]any{"tool": t.Name, "args": decodeAny(args), "answered": false, "ok": false, "is_error": false,
			"status": int64(out.Status), "truncated": false, "text": "", "structured": nil}
		if out.Status != 0 {
			errs++
			obs = marshal(errObs{Error: fmt.Sprintf("%s failed: injected status %d", t.Name, out.Status),
				Status: out.Status, RetryAfterMs: out.RetryAfter.Milliseconds(), Suggestion: "the call had no effect; try it again"})
		} else {
			ans, err := e.call(t.Name, args)
			if err != nil {
				return env.StepResult{}, err
			}
			o := observe(ans, rec)
			if o.IsError {
				errs++
			}
			obs = marshal(o)
			diff = marshal([]diffEntry{{Tool: t.Name, Answer: ans}})
			if out.Keep < 1 {
				rec["truncated"] = true
				obs = marshal(struct {
					Truncated bool   `json:"truncated"`
					Body      string `json:"body"`
				}{true, strings.ToValidUTF8(string(out.Truncate(obs)), "")})
			}
		}
		e.calls = append(e.calls, rec)
	}
	if calls > 0 && !e.listed {
		// The listing rides with the first valid step, so the steps' diffs alone hold
		// everything a replay needs of the server (Cassette).
		e.listed = true
		var es []diffEntry
		_ = json.Unmarshal(diff, &es) // the package's own encoding
		diff = marshal(append([]diffEntry{{Tools: e.tools}}, es...))
	}
	e.step++
	if calls > 0 && v == nil {
		if e.d.success != nil {
			var err error
			if success, err = eval(e.d.success, e.calls, e.cfg.Seed, int(e.step)); err != nil {
				return env.StepResult{}, fmt.Errorf("mcp %s: %s: verifier.success: %w", e.d.Name, e.d.file, err)
			}
			if !success && e.d.failure != nil {
				if failure, err = eval(e.d.failure, e.calls, e.cfg.Seed, int(e.step)); err != nil {
					return env.StepResult{}, fmt.Errorf("mcp %s: %s: verifier.failure: %w", e.d.Name, e.d.file, err)
				}
			}
		} else if e.step >= e.maxSteps || e.clock > e.deadline {
			// Out of steps or time: the command judges what the agent left, as after a submit.
			var err error
			if v, err = e.verify(); err != nil {
				return env.StepResult{}, err
			}
			obs = marshal(struct {
				Last    json.RawMessage `json:"last"`
				Verdict *verdict        `json:"verdict"`
			}{obs, v})
			var prev []diffEntry
			_ = json.Unmarshal(diff, &prev)
			diff = marshal(append(prev, diffEntry{Verdict: v}))
		}
	}
	if v != nil {
		success, failure = v.Pass, t != nil && t.Name == ToolSubmit && !v.Pass
	}
	progress := 0.0
	if success {
		progress = 1
	}
	res := env.StepResult{
		Observation: obs, Diff: diff, Faults: fired,
		Metering: &gauntletv1.Metering{ToolCalls: calls, Errors: errs, VirtualNs: uint64(e.clock - start),
			BytesIn: uint32(len(a.Args)), BytesOut: uint32(len(obs)), Runtime: e.runtime()},
		Signals: &gauntletv1.Signals{Progress: progress, ProgressDelta: progress, InvalidAction: calls == 0, Success: success,
			DeadlineVirtualNs: int64(e.deadline)},
	}
	env.End{Success: success, Failure: failure, Invalid: e.invalid, MaxInvalid: e.maxInvalid,
		Clock: e.clock, Deadline: e.deadline, Step: e.step, MaxSteps: e.maxSteps}.Apply(&res)
	e.done, e.reason = res.Done(), res.Reason
	if e.done && e.srv != nil {
		// The server's work is over: stop it now, and meter what its process used.
		if r := e.srv.stop(); r.err == nil {
			m := res.Metering
			m.CpuNs, m.PeakMemoryBytes = uint64(r.res.Metering.CPUTime), uint64(max(r.res.Metering.PeakMemoryBytes, 0))
			m.Processes, m.ReadBytes, m.WrittenBytes = uint32(max(r.res.Metering.Processes, 0)), uint64(max(r.res.Metering.BytesRead, 0)), uint64(max(r.res.Metering.BytesWritten, 0))
		}
	}
	return res, nil
}

// runtime names where the server ran, for the step's metering.
func (e *episode) runtime() string {
	switch {
	case e.cassette != nil:
		return "cassette"
	case len(e.d.Server.Command) > 0 && e.cfg.Sandboxes != nil:
		return e.cfg.Sandboxes.Runtime().Name()
	default:
		return "url"
	}
}

// call makes one tools/call, or plays the cassette's next answer.
func (e *episode) call(name string, args json.RawMessage) (*answer, error) {
	if e.cassette != nil {
		if e.answers >= len(e.cassette.Answers) {
			return nil, fmt.Errorf("mcp %s: %w: the cassette holds %d answers, and call %d asks for one more", e.d.Name, ErrCassette, len(e.cassette.Answers), e.answers+1)
		}
		a := e.cassette.Answers[e.answers]
		e.answers++
		return &a, nil
	}
	if e.srv == nil || e.srv.sess == nil {
		return nil, fmt.Errorf("mcp %s: %w: the session is closed", e.d.Name, ErrServer)
	}
	ctx, cancel := context.WithTimeout(context.Background(), msDuration(e.d.Server.TimeoutMs))
	defer cancel()
	r, err := e.srv.sess.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	var werr *jsonrpc.Error
	switch {
	case errors.As(err, &werr):
		// The server refused the call (arguments it rejects, say): its answer, an
		// observation like a tool error.
		return &answer{Error: werr.Message}, nil
	case err != nil:
		return nil, fmt.Errorf("mcp %s: %w: tools/call %s: %w", e.d.Name, ErrServer, name, err)
	}
	raw, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: tools/call %s: encode result: %w", e.d.Name, name, err)
	}
	return &answer{Result: raw}, nil
}

// observe turns an answer into the agent's observation and fills the call's record.
func observe(a *answer, rec map[string]any) callObs {
	rec["answered"] = true
	if a.Result == nil {
		rec["is_error"], rec["text"] = true, a.Error
		return callObs{IsError: true, Error: a.Error}
	}
	var r struct {
		Content    []json.RawMessage `json:"content"`
		Structured json.RawMessage   `json:"structuredContent"`
		IsError    bool              `json:"isError"`
	}
	_ = json.Unmarshal(a.Result, &r) // our own encoding of the SDK's result, or a cassette's copy of it
	var text strings.Builder
	for _, c := range r.Content {
		var tc struct {
			Type, Text string
		}
		if json.Unmarshal(c, &tc) == nil && tc.Type == "text" {
			text.WriteString(tc.Text)
		}
	}
	rec["is_error"], rec["ok"], rec["text"] = r.IsError, !r.IsError, text.String()
	if len(r.Structured) > 0 {
		rec["structured"] = decodeAny(r.Structured)
	}
	o := callObs{IsError: r.IsError, Structured: r.Structured}
	if len(r.Content) > 0 {
		o.Content = marshal(r.Content)
	}
	return o
}

// parseAction checks an action against the offered tools and the tool's input schema.
func (e *episode) parseAction(a env.Action) (*toolInfo, json.RawMessage, *errObs) {
	var t *toolInfo
	for _, x := range e.tools {
		if x.Name == a.Tool {
			t = x
			break
		}
	}
	if t == nil {
		names := make([]string, len(e.tools))
		for i, x := range e.tools {
			names[i] = x.Name
		}
		return nil, nil, &errObs{Error: fmt.Sprintf("unknown tool %.60q", a.Tool), Suggestion: "use one of: " + strings.Join(names, ", ")}
	}
	raw := bytes.TrimSpace(a.Args)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil || v == nil {
		return nil, nil, &errObs{Error: t.Name + ": arguments must be a JSON object", Suggestion: "input schema: " + string(t.InputSchema)}
	}
	if t.Name == ToolSubmit {
		if len(v) > 0 {
			return nil, nil, &errObs{Error: "submit takes no arguments", Suggestion: "call submit with {}"}
		}
		return t, raw, nil
	}
	if err := t.schema.Validate(v); err != nil {
		return nil, nil, &errObs{Error: fmt.Sprintf("%s: %.300s", t.Name, err), Suggestion: "input schema: " + string(t.InputSchema)}
	}
	return t, raw, nil
}

// Close stops the server and releases the sandbox. It is safe to call more than once.
func (e *episode) Close() error {
	if e.srv == nil {
		return nil
	}
	srv := e.srv
	e.srv = nil
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := srv.release(ctx); err != nil {
		return fmt.Errorf("mcp %s: %w", e.d.Name, err)
	}
	return nil
}

// decodeAny decodes JSON for the verifier (nil when it does not decode).
func decodeAny(b []byte) any {
	var v any
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	return v
}

// marshal encodes an observation or diff of the package's own types, which always encode.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"ok":false,"error":"internal: observation did not encode"}`)
	}
	return b
}
