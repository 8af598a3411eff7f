package policy

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/registry"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
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
// one). WithEndpoint returns the policy asking ep, keeping the rest of its configuration
// (a timeout, where credentials are read), which is the process's.
type Endpointed interface {
	Policy
	WithEndpoint(ep Endpoint) (Policy, error)
}

// Endpoint is the model endpoint a run names: an OpenAI-compatible API base, the model
// (empty: the process's) and the name of the credential to send (empty: the process's
// key). The name, never the secret, travels with the run: each process reads the secret
// from its own credentials.
type Endpoint struct {
	URL, Model, Credential string
	// Logprobs says whether the run wants the completions' token ids and logprobs
	// recorded; nil: the process's configuration (--policy.http.logprobs).
	Logprobs *bool
}

// credentialName is what a credential's name may be: a file name, with no path in it.
var credentialName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// secretPrefixes start the keys of well-known model APIs: a credential "name" starting
// with one is most likely the secret itself, which must not travel with a run.
var secretPrefixes = []string{"sk-", "sk_", "hf_", "gsk_", "xai-", "AIza", "Bearer "}

// CheckCredentialName reports why name cannot name a credential: it must be a plain file
// name (letters, digits, '.', '_', '-'; at most 128 bytes, no path) and must not look like
// a key, which belongs in the credentials directory, not in the run.
func CheckCredentialName(name string) error {
	for _, p := range secretPrefixes {
		if strings.HasPrefix(name, p) {
			return fmt.Errorf("looks like a key (it starts with %q): put the key in a file of the workers' --policy.http.credentials-dir and name that file", p)
		}
	}
	if !credentialName.MatchString(name) {
		return fmt.Errorf("%q is not a credential name: letters, digits, '.', '_' and '-', at most 128, starting with a letter or digit", name)
	}
	return nil
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

// LogprobsOf is a run's choice of token ids and logprobs as Endpoint.Logprobs: nil when
// it made none (the process's configuration applies).
func LogprobsOf(l gauntletv1.Logprobs) *bool {
	switch l {
	case gauntletv1.Logprobs_LOGPROBS_ON:
		on := true
		return &on
	case gauntletv1.Logprobs_LOGPROBS_OFF:
		off := false
		return &off
	}
	return nil
}

// LogprobsProto is Endpoint.Logprobs as a run carries it.
func LogprobsProto(b *bool) gauntletv1.Logprobs {
	switch {
	case b == nil:
		return gauntletv1.Logprobs_LOGPROBS_UNSPECIFIED
	case *b:
		return gauntletv1.Logprobs_LOGPROBS_ON
	}
	return gauntletv1.Logprobs_LOGPROBS_OFF
}
