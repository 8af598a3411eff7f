package taskenv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// Name is the name the env registers under.
const Name = "tasks"

// DefaultMaxSteps truncates a task episode when its Config does not set MaxSteps.
const DefaultMaxSteps = 50

// Template is the sandbox template task episodes ask for.
const Template = "task"

// ToolSubmit ends the episode and asks the verifier for the verdict.
const ToolSubmit = "submit"

// defaultMaxInvalid is how many invalid actions end an episode when params do not say.
const defaultMaxInvalid = 5

func init() { env.Register(New()) }

// New returns the tasks env. Datasets it reads are kept (by absolute path) for the
// process's life; the task an episode plays is read again, with its digest, every time.
func New() env.Env { return &taskEnv{} }

type taskEnv struct {
	mu       sync.Mutex
	datasets map[string]*tasks.Dataset
}

type toolDef struct {
	name, service, desc string
	schema              json.RawMessage
}

var toolDefs = func() []toolDef {
	var out []toolDef
	for _, t := range tools.Specs() {
		out = append(out, toolDef{t.Name, tools.Service, t.Description, t.Schema})
	}
	return append(out, toolDef{ToolSubmit, "", "Declare the task done: the episode ends and the task's verifier judges the final state.",
		json.RawMessage(`{"type":"object","properties":{},"additionalProperties":false}`)})
}()

var toolNames = func() []string {
	out := make([]string, len(toolDefs))
	for i, t := range toolDefs {
		out[i] = t.name
	}
	return out
}()

// Spec describes the env's tools and params. Each call returns a fresh copy.
func (*taskEnv) Spec() env.Spec {
	ts := make([]env.Tool, len(toolDefs))
	for i, t := range toolDefs {
		ts[i] = env.Tool{Name: t.name, Service: t.service, Description: t.desc, Schema: slices.Clone(t.schema)}
	}
	return env.Spec{
		Name: Name,
		Description: "A task of a Harbor-format dataset (task folders: instruction.md, task.toml, environment/, " +
			"tests/test.sh, solution/solve.sh) in a real sandbox: the agent works in /app with the workspace " +
			"tools and submits; the task's tests/test.sh judges a fork of the final state.",
		Tools: ts,
		Params: []env.Param{
			{Name: "dataset", Type: "string", Description: "the dataset's name, one of the process's --tasks.datasets (required)"},
			{Name: "task", Type: "string", Description: "the task's ID in the dataset; empty: picked by the seed (seed modulo their count) among the pinned tasks, else among those the filters select, else among all the dataset's tasks, in ID order"},
			{Name: "digest", Type: "string", Description: "when set, the task's content digest must be this one (a recorded episode's task, unchanged)"},
			{Name: "tags", Type: "array", Description: "only tasks with every one of these tags ([metadata].tags or [task].keywords)"},
			{Name: "difficulty", Type: "array", Description: "only tasks of one of these difficulties (easy, medium, hard)"},
			{Name: "glob", Type: "array", Description: "only tasks whose ID matches one of these patterns (path.Match, e.g. \"codefix/*\")"},
			{Name: "tasks", Type: "array", Description: "the selection pinned: [{\"id\", \"digest\"}], as `gauntlet run --tasks` records it; a task whose content changed since is refused"},
			{Name: "canary_rate", Type: "float", Default: "0", Description: "with a draw (no task named): the share of episodes (0..1) that play one of the dataset's canaries instead, chosen by the episode's seed"},
			{Name: "max_invalid", Type: "int", Default: "5", Description: "invalid actions that terminate the episode (1..1000)"},
			{Name: "deadline_ms", Type: "int", Description: "virtual milliseconds the episode may take (default: the task's [agent] timeout; each command's wall time stays bounded by that timeout)"},
		},
		// The egress service is the gateway to an allowlist task's hosts: the plan's
		// rules for it are what the agent's requests meet there.
		Services:        []string{tools.Service, EgressService},
		DefaultMaxSteps: DefaultMaxSteps,
	}
}

// params are an episode's validated parameters.
type params struct {
	Dataset    string   `json:"dataset"`
	Task       string   `json:"task"`
	Digest     string   `json:"digest"`
	Tags       []string `json:"tags"`
	Difficulty []string `json:"difficulty"`
	Glob       []string `json:"glob"`
	Tasks      []Pinned `json:"tasks"`
	// CanaryRate is the share of a draw's episodes that play one of the dataset's
	// canaries instead (0: none), each chosen from the episode's seed.
	CanaryRate float64 `json:"canary_rate"`
	MaxInvalid *int    `json:"max_invalid"`
	DeadlineMs *int64  `json:"deadline_ms"`
}

func parseParams(raw json.RawMessage) (params, error) {
	var p params
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(&p); err != nil {
		return p, fmt.Errorf("params: %w (known: dataset, task, digest, tags, difficulty, glob, tasks, canary_rate, max_invalid, deadline_ms)", err)
	}
	var errs []error
	if p.Dataset == "" {
		errs = append(errs, errors.New("params.dataset: required: the name of the dataset the task comes from (one of the process's --tasks.datasets)"))
	}
	errs = append(errs, p.checkSelection()...)
	if p.MaxInvalid != nil && (*p.MaxInvalid < 1 || *p.MaxInvalid > 1000) {
		errs = append(errs, fmt.Errorf("params.max_invalid: %d is outside 1..1000", *p.MaxInvalid))
	}
	if p.DeadlineMs != nil && (*p.DeadlineMs < 1000 || *p.DeadlineMs > tasks.MaxTimeout.Milliseconds()) {
		errs = append(errs, fmt.Errorf("params.deadline_ms: %d is outside 1000..%d", *p.DeadlineMs, tasks.MaxTimeout.Milliseconds()))
	}
	return p, errors.Join(errs...)
}

// dataset returns the dataset the process names name, read once per process. A dataset
// with invalid tasks is refused whole, naming every problem: training on part of a dataset
// by accident is worse than not starting.
func (e *taskEnv) dataset(name string, datasets map[string]string) (*tasks.Dataset, error) {
	p, ok := datasets[name]
	if !ok {
		names := slices.Sorted(maps.Keys(datasets))
		if len(names) == 0 {
			return nil, fmt.Errorf("params.dataset: %q: %w", name, ErrNoDatasets)
		}
		return nil, fmt.Errorf("params.dataset: %q is not a dataset of this process (known: %s)", name, strings.Join(names, ", "))
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return nil, fmt.Errorf("params.dataset: %w", err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if ds, ok := e.datasets[abs]; ok {
		return ds, nil
	}
	ds, err := tasks.LoadDataset(abs)
	if err != nil {
		return nil, fmt.Errorf("params.dataset: %w", err)
	}
	if len(ds.Tasks) == 0 {
		return nil, fmt.Errorf("params.dataset: %s holds no task folder", abs)
	}
	if e.datasets == nil {
		e.datasets = map[string]*tasks.Dataset{}
	}
	e.datasets[abs] = ds
	return ds, nil
}

// ErrNoDatasets is returned by Reset of an episode made where no dataset is configured
// (env.Config.Datasets nil): the process playing it was started without --tasks.datasets.
var ErrNoDatasets = errors.New("tasks: this process plays no dataset (start it with --tasks.datasets NAME=DIR)")

// NewEpisode picks the episode's task and reads it afresh (its digest is the content's
// now). Where no dataset is configured (cfg.Datasets nil: a client or the scheduler
// checking a run) it checks the params alone, and Reset fails with ErrNoDatasets, as
// codefix checks its params where no sandbox runtime runs. Reset needs cfg.Sandboxes.
func (e *taskEnv) NewEpisode(cfg env.Config) (env.Episode, error) {
	p, err := parseParams(cfg.Params)
	if err != nil {
		return nil, fmt.Errorf("tasks: %w", err)
	}
	if cfg.Datasets == nil {
		return &episode{cfg: cfg}, nil
	}
	ds, err := e.dataset(p.Dataset, cfg.Datasets)
	if err != nil {
		return nil, fmt.Errorf("tasks: %w", err)
	}
	pick, digest, err := p.pick(p.Dataset, ds, cfg.Seed)
	if err != nil {
		return nil, fmt.Errorf("tasks: %w", err)
	}
	t, err := tasks.Load(pick.Dir, pick.ID)
	if err != nil {
		return nil, fmt.Errorf("tasks: task %s changed since the dataset was read: %w", pick.ID, err)
	}
	if digest != "" && digest != t.Digest {
		field := "params.digest"
		if len(p.Tasks) > 0 {
			field = "params.tasks"
		}
		return nil, fmt.Errorf("tasks: %s: task %s has digest %s now, not %s: its content changed", field, t.ID, t.Digest, digest)
	}
	remember(t)
	maxSteps := cfg.MaxSteps
	if maxSteps == 0 {
		maxSteps = DefaultMaxSteps
	}
	maxInvalid := defaultMaxInvalid
	if p.MaxInvalid != nil {
		maxInvalid = *p.MaxInvalid
	}
	deadline := t.Config.Agent.Timeout
	if p.DeadlineMs != nil {
		deadline = time.Duration(*p.DeadlineMs) * time.Millisecond
	}
	return &episode{cfg: cfg, task: t, maxSteps: maxSteps, maxInvalid: maxInvalid, deadline: deadline}, nil
}

// SandboxTemplates is the sandbox of a task that leaves [environment]'s resources at
// Harbor's defaults, for warm pools; tasks with other limits get sandboxes made on demand.
// (Being a SandboxTemplater also tells tools such as `episode snapshot` that the env's
// episodes need a sandbox runtime to be rebuilt.)
func (*taskEnv) SandboxTemplates() []sandbox.Spec {
	return []sandbox.Spec{{
		Template: Template,
		Limits:   limits(tasks.DefaultCPUs, tasks.DefaultMemoryMB, tasks.DefaultStorageMB),
		Links:    links,
		Labels:   map[string]string{"env": Name},
	}}
}

// Oracle returns the agent that runs the task's solution/solve.sh, as Harbor's oracle
// agent does.
func (*taskEnv) Oracle(uint64) env.Agent { return &oracle{} }

// known holds the tasks episodes of this process played, by digest, for the oracle: it
// learns its task's digest from the reset observation, never a host path.
var known sync.Map // digest → *tasks.Task

func remember(t *tasks.Task) { known.Store(t.Digest, t) }

func lookup(digest string) (*tasks.Task, bool) {
	v, ok := known.Load(digest)
	if !ok {
		return nil, false
	}
	return v.(*tasks.Task), true
}

// Virtual cost of each kind of call: the episode's clock is the env's, never the host's,
// so the same actions take the same virtual time on any machine.
const (
	costShell = 500 * time.Millisecond
	costFS    = 20 * time.Millisecond
)
