package mcpenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// ToolSubmit is gauntlet's own tool, offered beside the server's when the verifier is a
// command: the agent declares the task done and the command judges.
const ToolSubmit = "submit"

// anyObject is the Spec's schema of a server's tool: the server's own input schema comes
// with its tools/list at each reset (in the first observation) and checks the arguments.
var anyObject = json.RawMessage(`{"type":"object"}`)

var submitSchema = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)

type mcpEnv struct{ d *Decl }

// New returns the env a declaration describes.
func New(d *Decl) env.Env { return &mcpEnv{d: d} }

// Spec lists the declared tools (each with the catch-all schema: the server gives the
// real one at reset), the services they target and the per-episode parameters. Each call
// returns a fresh copy.
func (x *mcpEnv) Spec() env.Spec {
	d := x.d
	var tools []env.Tool
	svcs := []string{d.Service}
	for _, t := range d.Tools {
		svc := t.Service
		if svc == "" {
			svc = d.Service
		}
		if !slices.Contains(svcs, svc) {
			svcs = append(svcs, svc)
		}
		tools = append(tools, env.Tool{Name: t.Name, Service: svc,
			Description: "a tool of the MCP server (its description and input schema come with the first observation)", Schema: slices.Clone(anyObject)})
	}
	if len(d.Verifier.Command) > 0 {
		tools = append(tools, env.Tool{Name: ToolSubmit, Description: "Declare the task done: the episode ends and the verifier judges.", Schema: slices.Clone(submitSchema)})
	}
	slices.Sort(svcs)
	desc := d.Description
	if desc == "" {
		desc = "the MCP server of " + d.file
	}
	return env.Spec{
		Name: d.Name, Description: desc, Tools: tools, Services: svcs, DefaultMaxSteps: d.MaxSteps,
		Params: []env.Param{
			{Name: "max_invalid", Type: "int", Default: fmt.Sprint(d.MaxInvalid), Description: "invalid actions that terminate the episode (1..1000)"},
			{Name: "deadline_ms", Type: "int", Default: fmt.Sprint(d.deadline.Milliseconds()), Description: "virtual milliseconds the episode may take"},
			{Name: "cassette", Type: "object", Description: "replay: the server's recorded answers (Cassette), played back instead of a server"},
		},
	}
}

var _ env.OutsideState = (*mcpEnv)(nil)

// OutsideState implements env.OutsideState: an episode's state is its server's, so a
// fork replays the recorded calls into a fresh server and is refused where that server
// answers otherwise than the recording (docs/mcp.md, Forks).
func (x *mcpEnv) OutsideState() string {
	if x.d.Server.URL != "" {
		return "the MCP server at " + x.d.Server.URL + " (" + x.d.file + ")"
	}
	return "the MCP server of " + x.d.file
}

// SandboxTemplates is a command server's sandbox, for warm pools; a URL server's episodes
// need none.
func (x *mcpEnv) SandboxTemplates() []sandbox.Spec {
	if len(x.d.Server.Command) == 0 {
		return nil
	}
	return []sandbox.Spec{{Template: Template, Labels: map[string]string{"env": x.d.Name}}}
}

// params are an episode's parameters.
type params struct {
	MaxInvalid *int      `json:"max_invalid"`
	DeadlineMs *int64    `json:"deadline_ms"`
	Cassette   *Cassette `json:"cassette"`
}

func parseParams(raw json.RawMessage) (params, error) {
	var p params
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return p, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		return p, fmt.Errorf("params: %w (known: max_invalid, deadline_ms, cassette)", err)
	}
	var errs []error
	if p.MaxInvalid != nil && (*p.MaxInvalid < 1 || *p.MaxInvalid > 1000) {
		errs = append(errs, fmt.Errorf("params.max_invalid: %d is outside 1..1000", *p.MaxInvalid))
	}
	if p.DeadlineMs != nil && (*p.DeadlineMs < 1 || *p.DeadlineMs > 86_400_000) {
		errs = append(errs, fmt.Errorf("params.deadline_ms: %d is outside 1..86400000", *p.DeadlineMs))
	}
	return p, errors.Join(errs...)
}

// NewEpisode checks the parameters; the server is reached at Reset.
func (x *mcpEnv) NewEpisode(cfg env.Config) (env.Episode, error) {
	p, err := parseParams(cfg.Params)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: %w", x.d.Name, err)
	}
	e := &episode{d: x.d, cfg: cfg, maxSteps: cfg.MaxSteps, maxInvalid: x.d.MaxInvalid, deadline: x.d.deadline, cassette: p.Cassette}
	if e.maxSteps == 0 {
		e.maxSteps = x.d.MaxSteps
	}
	if p.MaxInvalid != nil {
		e.maxInvalid = *p.MaxInvalid
	}
	if p.DeadlineMs != nil {
		e.deadline = msDuration(*p.DeadlineMs)
	}
	return e, nil
}

// Config is where a process finds its MCP envs. Every process that plays, schedules or
// checks their episodes needs the same directory.
type Config struct {
	// Dir holds MCP env declarations (*.yaml, *.yml); empty: none.
	Dir string
}

// RegisterFlags declares --env.mcp on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Dir, "env.mcp", "", "directory of MCP env declarations (*.yaml, `env: mcp`: a user's MCP server as an env, docs/mcp.md); every process that runs, schedules or plays their episodes needs it")
}

// Validate loads the directory's declarations and reports every invalid file and every
// name another env already has, without registering anything.
func (c *Config) Validate() error {
	if c.Dir == "" {
		return nil
	}
	ds, err := LoadDir(c.Dir)
	mu.Lock()
	defer mu.Unlock()
	if err := errors.Join(err, taken(ds)); err != nil {
		return fmt.Errorf("env.mcp: %w", err)
	}
	return nil
}

// Register registers the directory's MCP envs, all or none. Registering a declaration
// again (a client command after the stack in one process) is a no-op when its content is
// the same; a changed one is refused.
func (c *Config) Register() error {
	if c.Dir == "" {
		return nil
	}
	ds, err := LoadDir(c.Dir)
	if err != nil {
		return fmt.Errorf("env.mcp: %w", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if err := taken(ds); err != nil {
		return fmt.Errorf("env.mcp: %w", err)
	}
	for _, d := range ds {
		if _, ok := done[d.Name]; !ok {
			env.Register(New(d))
			done[d.Name] = d.digest
		}
	}
	return nil
}

var (
	mu   sync.Mutex
	done = map[string][32]byte{} // env name → declaration digest, registered by Register
)

// taken reports declarations whose name another env has (the same declaration,
// registered before, excepted).
func taken(ds []*Decl) error {
	var errs []error
	for _, d := range ds {
		if dg, ok := done[d.Name]; ok {
			if dg != d.digest {
				errs = append(errs, fmt.Errorf("%s: %w: name: %q was registered from other content", d.file, ErrInvalid, d.Name))
			}
			continue
		}
		if _, err := env.Lookup(d.Name); err == nil {
			errs = append(errs, fmt.Errorf("%s: %w: name: %q is already an env", d.file, ErrInvalid, d.Name))
		}
	}
	return errors.Join(errs...)
}
