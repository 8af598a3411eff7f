package codefix

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// Name is the name the codefix env registers under.
const Name = "codefix"

// DefaultMaxSteps truncates a codefix episode when its Config does not set MaxSteps.
const DefaultMaxSteps = 20

// Template is the sandbox template codefix episodes ask for (pools group by it).
const Template = "codefix-sh"

// ToolSubmit ends the episode and asks for the verdict. The other tools are the shared
// workspace tools of package tools (tools.ShellExec, tools.FSRead, ...).
const ToolSubmit = "submit"

// Service is the fault target of every workspace tool call (package tools' service name).
const Service = tools.Service

func init() { env.Register(New()) }

// New returns the codefix env. The value is stateless; it is the env the package
// registers under Name.
func New() env.Env { return codefixEnv{} }

type codefixEnv struct{}

type toolDef struct {
	name, service, desc string
	schema              json.RawMessage
}

var toolDefs = func() []toolDef {
	var out []toolDef
	for _, t := range tools.Specs() {
		out = append(out, toolDef{t.Name, tools.Service, t.Description, t.Schema})
	}
	return append(out, toolDef{ToolSubmit, "", "Declare the fix done: the episode ends and a verifier judges the workspace.",
		json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)})
}()

var toolNames = func() []string {
	out := make([]string, len(toolDefs))
	for i, t := range toolDefs {
		out[i] = t.name
	}
	return out
}()

// Spec describes codefix's tools, params and services. Each call returns a fresh copy.
func (codefixEnv) Spec() env.Spec {
	ts := make([]env.Tool, len(toolDefs))
	for i, t := range toolDefs {
		ts[i] = env.Tool{Name: t.name, Service: t.service, Description: t.desc, Schema: slices.Clone(t.schema)}
	}
	return env.Spec{
		Name: Name,
		Description: "Fix a bug in a small shell project inside a real sandbox: the tests in " + TestPath +
			" fail; make them pass without changing them, then submit. A verifier in a fresh sandbox " +
			"restored from the final workspace runs the tests and hidden cases.",
		Tools:           ts,
		Params:          paramDefs.Spec(),
		Services:        []string{DocsService, Service},
		DefaultMaxSteps: DefaultMaxSteps,
	}
}

// NewEpisode validates cfg and returns an episode ready for Reset. Reset needs
// cfg.Sandboxes; without it Reset fails with env.ErrNoSandbox (NewEpisode does not, so
// params can be validated where no runtime runs).
func (codefixEnv) NewEpisode(cfg env.Config) (env.Episode, error) {
	p, err := parseParams(cfg.Params)
	if err != nil {
		return nil, fmt.Errorf("codefix: %w", err)
	}
	maxSteps := cfg.MaxSteps
	if maxSteps == 0 {
		maxSteps = DefaultMaxSteps
	}
	return &episode{cfg: cfg, p: p, maxSteps: maxSteps, task: newTask(cfg.Seed, p.variant, p.cases)}, nil
}

// Oracle returns the scripted good agent: it knows the task of the seed.
func (codefixEnv) Oracle(seed uint64) env.Agent { return &oracle{} }

// SandboxTemplates is the sandbox codefix episodes run in with default params, for warm
// pools; episodes with other limits (memory_mb) get sandboxes made on demand.
func (codefixEnv) SandboxTemplates() []sandbox.Spec {
	p, _ := parseParams(nil)          // the defaults always parse
	spec, _ := sandboxSpec(task{}, p) // without the docs service it cannot fail
	spec.Labels = map[string]string{"env": Name}
	return []sandbox.Spec{spec}
}

// params are codefix's validated parameters.
type params struct {
	variant     int
	cases       int
	execTimeout time.Duration
	deadline    time.Duration
	maxInvalid  int
	memoryBytes int64
	docs        bool
}

// paramDefs are the params a request may set.
var paramDefs = env.IntParams[params]{
	{Name: "variant", Default: -1, Min: -1, Max: int64(len(variants) - 1), Description: "bug variant (-1: chosen by the seed)",
		Set: func(p *params, v int64) { p.variant = int(v) }},
	{Name: "cases", Default: 4, Min: 2, Max: 5, Description: "visible test cases in " + TestPath,
		Set: func(p *params, v int64) { p.cases = int(v) }},
	{Name: "exec_timeout_ms", Default: 10_000, Min: 100, Max: 60_000, Description: "longest shell.exec the agent may ask for, in milliseconds",
		Set: func(p *params, v int64) { p.execTimeout = time.Duration(v) * time.Millisecond }},
	{Name: "deadline_ms", Default: 600_000, Min: 1000, Max: 86_400_000, Description: "virtual milliseconds the episode may take",
		Set: func(p *params, v int64) { p.deadline = time.Duration(v) * time.Millisecond }},
	{Name: "max_invalid", Default: 5, Min: 1, Max: 1000, Description: "invalid actions that terminate the episode",
		Set: func(p *params, v int64) { p.maxInvalid = int(v) }},
	{Name: "memory_mb", Default: 128, Min: 16, Max: 4096, Description: "memory limit of the sandbox, in MiB",
		Set: func(p *params, v int64) { p.memoryBytes = v << 20 }},
	{Name: "docs", Default: 0, Min: 0, Max: 1, Description: "1: the sandbox may reach the docs HTTP service at $DOCS_URL, through the fault gateway",
		Set: func(p *params, v int64) { p.docs = v == 1 }},
}

// parseParams decodes the params object strictly (env.IntParams.Decode) and reports every
// problem at once, each naming its field.
func parseParams(raw json.RawMessage) (params, error) {
	return paramDefs.Decode(raw, intValue)
}

// intValue reads a param's value, an integer within min..max.
func intValue(v json.RawMessage, min, max int64) (int64, error) {
	var n int64
	if err := json.Unmarshal(v, &n); err != nil {
		return 0, fmt.Errorf("want an integer, got %.40s", v)
	}
	if n < min || n > max {
		return 0, fmt.Errorf("%d is outside %d..%d", n, min, max)
	}
	return n, nil
}

// sandboxSpec is the sandbox an episode of task t runs in: the project seeded into the
// workspace, small limits, and the docs service when asked for.
func sandboxSpec(t task, p params) (sandbox.Spec, error) {
	files := make([]sandbox.File, 0, len(t.files))
	for _, path := range t.paths() {
		files = append(files, sandbox.File{Path: path, Data: []byte(t.files[path])})
	}
	svcs, err := docsServices(p)
	if err != nil {
		return sandbox.Spec{}, err
	}
	tpl := Template
	if p.docs {
		tpl = DocsTemplate
	}
	return sandbox.Spec{
		Template:  tpl,
		Limits:    sandbox.Limits{MemoryBytes: p.memoryBytes, Pids: 64, CPUMillis: 1000, DiskBytes: 64 << 20},
		Workspace: files,
		Labels:    map[string]string{"env": Name, "variant": t.v.name},
		Services:  svcs,
	}, nil
}
