package policy

import (
	"errors"
	"fmt"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/registry"
)

// Names of the built-in policies.
const (
	// Random names the policy that calls uniformly random tools with schema-shaped args.
	Random = "random"
	// Oracle names the policy that delegates to the env's scripted agent (env.Oracle).
	Oracle = "oracle"
)

// Policy makes agents: whoever chooses the actions of an episode.
type Policy interface {
	// Name is the name the policy registers under.
	Name() string
	// NewAgent returns an agent for one episode of e, deterministic from seed.
	NewAgent(e env.Env, seed uint64) (env.Agent, error)
}

// Endpointed is a policy that asks a model endpoint, which each run names
// (RunRequested.policy_endpoint; runs.Validate refuses a run naming such a policy without
// one). WithEndpoint returns the policy asking url for model (empty: its own), keeping the
// rest of its configuration (a key, a timeout), which is the process's.
type Endpointed interface {
	Policy
	WithEndpoint(url, model string) (Policy, error)
}

// ErrUnknownPolicy is returned by Lookup for a name nobody registered.
var ErrUnknownPolicy = errors.New("unknown policy")

// ErrNoOracle is returned by the oracle policy for an env that ships no scripted agent.
var ErrNoOracle = errors.New("env has no oracle")

var registered = registry.New[Policy]("policy", ErrUnknownPolicy)

func init() {
	Register(randomPolicy{})
	Register(oraclePolicy{})
}

// Register makes a policy available by name. It panics on a duplicate name: that is a
// programming error caught at init time, never at run time.
func Register(p Policy) { registered.Register(p.Name(), p) }

// Lookup returns the named policy; its error lists the known names.
func Lookup(name string) (Policy, error) { return registered.Lookup(name) }

// Names lists the registered policies, sorted.
func Names() []string { return registered.Names() }

// oraclePolicy delegates to the env's scripted agent.
type oraclePolicy struct{}

func (oraclePolicy) Name() string { return Oracle }

func (oraclePolicy) NewAgent(e env.Env, seed uint64) (env.Agent, error) {
	o, ok := e.(env.Oracle)
	if !ok {
		return nil, fmt.Errorf("policy %s: %w: env %q", Oracle, ErrNoOracle, e.Spec().Name)
	}
	return o.Oracle(seed), nil
}
