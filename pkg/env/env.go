// Package env defines what an environment (a task family) is to gauntlet: its spec (tools,
// parameters, limits), how an episode of it is created from a seed, and how one step runs.
//
// Envs are pure and deterministic: an Episode's results depend only on its Config and the
// actions it receives. Time inside an episode is the episode's virtual clock; faults come
// from the inject.Injector in the Config. An Episode is used by one goroutine at a time;
// Env values and the registry are safe for concurrent use.
//
// Bad agent input (unknown tool, malformed args, violated preconditions) is not a Go error:
// it is an observation the agent can learn from, flagged in the step's Signals. A Go error
// from Step means gauntlet itself failed (an infra error).
package env

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/registry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// MaxArgsBytes bounds the size of one action's arguments; larger actions are refused as
// invalid before they reach the env.
const MaxArgsBytes = 64 << 10

// Tool is one entry of an env's action space.
type Tool struct {
	// Name is what an action names, e.g. "inventory.get".
	Name string `json:"name"`
	// Service is the simulated service behind the tool; faults target services and tools.
	Service     string `json:"service"`
	Description string `json:"description"`
	// Schema is the JSON Schema of the tool's arguments.
	Schema json.RawMessage `json:"schema"`
}

// Param describes one env parameter.
type Param struct {
	Name        string `json:"name"`
	Type        string `json:"type"` // "int", "float", "string", "array" (of strings or objects, as its description says)
	Default     string `json:"default"`
	Description string `json:"description"`
}

// Spec is what an env declares about itself.
type Spec struct {
	Name        string  `json:"name"`
	Description string  `json:"description"`
	Tools       []Tool  `json:"tools"`
	Params      []Param `json:"params"`
	// Services lists the simulated services, the targets fault plans draw from.
	Services []string `json:"services"`
	// DefaultMaxSteps truncates an episode when the request does not say.
	DefaultMaxSteps uint32 `json:"default_max_steps"`
}

// Tool returns the named tool and whether it exists.
func (s Spec) Tool(name string) (Tool, bool) {
	for _, t := range s.Tools {
		if t.Name == name {
			return t, true
		}
	}
	return Tool{}, false
}

// Action is one tool call chosen by a policy.
type Action struct {
	Tool string          `json:"tool"`
	Args json.RawMessage `json:"args,omitempty"`
}

// Config is everything an episode is made from.
type Config struct {
	Seed uint64
	// Params is the env's parameters as JSON ("{}" or empty for defaults).
	Params json.RawMessage
	// MaxSteps truncates the episode; 0 means the env's default.
	MaxSteps uint32
	// Faults decides which faults fire on each simulated service call; nil injects none.
	Faults *inject.Injector
	// Sandboxes lends real sandboxes to envs that need them (codefix); nil when the worker
	// runs none. Such envs' NewEpisode then fails with ErrNoSandbox.
	Sandboxes Sandboxes
	// Datasets are the task datasets the process may play, by name (a folder, task folder
	// or manifest each): envs that play task folders (tasks) find the dataset an episode
	// names here, so a request can never point the process at a path of its choosing.
	// Nil when the process was started without any.
	Datasets map[string]string
}

// StepResult is what one step produced.
type StepResult struct {
	// Observation is canonical JSON, one object: what the agent sees.
	Observation json.RawMessage
	// Diff is canonical JSON: the world-state changes the step caused (a JSON array).
	Diff     json.RawMessage
	Signals  *gauntletv1.Signals
	Faults   []*gauntletv1.FaultFired
	Metering *gauntletv1.Metering
	// Terminated ends the episode by the task's rules; Truncated ends it from outside
	// (step limit, deadline). Reason says which rule.
	Terminated bool
	Truncated  bool
	Reason     gauntletv1.TerminationReason
}

// Done reports whether the episode is over.
func (r StepResult) Done() bool { return r.Terminated || r.Truncated }

// Episode is one running instance of an env.
type Episode interface {
	// Reset builds the world from the Config's seed and returns the first observation.
	Reset() (json.RawMessage, error)
	// Step applies one action. A non-nil error is an infra error; the episode is then dead.
	Step(a Action) (StepResult, error)
	// Now is the episode's virtual clock, since Reset.
	Now() time.Duration
}

// Env is a task family.
type Env interface {
	Spec() Spec
	// NewEpisode validates cfg (parameters name the bad field) and returns an episode
	// ready for Reset.
	NewEpisode(cfg Config) (Episode, error)
}

// Oracle is implemented by envs that ship a scripted good agent, used by the built-in
// "oracle" policy. The returned Agent belongs to one episode.
type Oracle interface {
	Oracle(seed uint64) Agent
}

// Turn is what an agent sees before choosing its next action.
type Turn struct {
	Step        uint32
	Observation json.RawMessage
	// Reward is the scalar reward of the previous step (0 before the first).
	Reward float64
}

// Agent chooses actions for one episode.
type Agent interface {
	Act(t Turn) (Action, error)
}

// Follower is implemented by agents that can take over an episode someone else began
// (`gauntlet episode fork` hands a recorded episode to a policy at a step). Follow tells
// the agent one step played before it took over, in order from the first: what it would
// have seen (t, the reset's observation for the first) and the action played, which
// becomes its own last action; its next Act goes on from there. An agent that reads the
// episode's start (the shop oracle reads its task from the first observation) needs it;
// one that is not a Follower starts from the turn it is handed.
type Follower interface {
	Follow(t Turn, played Action)
}

// OutsideState is implemented by envs whose episodes keep their state in a party outside
// gauntlet that a replay reaches again (an MCP server). Such an episode is forked by
// replaying its recorded steps into a fresh party (play.Session.Replay), which is a fork
// of the recording only if the party answers every replayed call as it did: only a party
// whose answers depend on its calls and seed alone can be forked. These envs record what
// the party answered in each step's diff, and a replay given the recorded diffs refuses
// the fork at the first step whose diff differs (play.ErrDiverged), where other envs'
// replays only report a differing observation.
type OutsideState interface {
	// OutsideState names the party, for that refusal ("the MCP server of notes.yaml").
	OutsideState() string
}

// ErrUnknownEnv is returned by Lookup for a name nobody registered.
var ErrUnknownEnv = errors.New("unknown env")

var registered = registry.New[Env]("env", ErrUnknownEnv)

// Register makes an env available by name. It panics on a duplicate name: that is a
// programming error caught at init time, never at run time.
func Register(e Env) { registered.Register(e.Spec().Name, e) }

// Lookup returns the named env; its error lists the known names.
func Lookup(name string) (Env, error) { return registered.Lookup(name) }

// Names lists the registered envs, sorted.
func Names() []string { return registered.Names() }

// End is what decides whether a step ends its episode, by the rules every env applies in
// the same order: the task's verdict (success, then failure), then the invalid-action
// limit, then the episode's deadline on its virtual clock, then the step limit.
type End struct {
	Success, Failure    bool
	Invalid, MaxInvalid int
	Clock, Deadline     time.Duration
	Step, MaxSteps      uint32
}

// Apply sets res's Terminated, Truncated and Reason from the first rule that holds; none
// holding leaves the episode running.
func (x End) Apply(res *StepResult) {
	switch {
	case x.Success:
		res.Terminated, res.Reason = true, gauntletv1.TerminationReason_TERMINATION_REASON_SUCCESS
	case x.Failure:
		res.Terminated, res.Reason = true, gauntletv1.TerminationReason_TERMINATION_REASON_FAILURE
	case x.Invalid >= x.MaxInvalid:
		res.Terminated, res.Reason = true, gauntletv1.TerminationReason_TERMINATION_REASON_INVALID_ACTION_LIMIT
	case x.Clock > x.Deadline:
		res.Truncated, res.Reason = true, gauntletv1.TerminationReason_TERMINATION_REASON_TIMEOUT
	case x.Step >= x.MaxSteps:
		res.Truncated, res.Reason = true, gauntletv1.TerminationReason_TERMINATION_REASON_MAX_STEPS
	}
}
