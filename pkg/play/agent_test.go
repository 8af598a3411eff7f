package play_test

import (
	"errors"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// configuredOracle stands in for a policy the process configured (as the "http" policy
// with its endpoint): it refuses with its own error, so the test sees which one was asked.
type configuredOracle struct{}

var errConfigured = errors.New("the configured oracle")

func (configuredOracle) Name() string { return policy.Oracle }

func (configuredOracle) NewAgent(env.Env, uint64) (env.Agent, error) { return nil, errConfigured }

// Agents come from the policies the runner was given, not from a process-wide setting:
// the same request gets the registered policy from one Deps and the configured one from
// another.
func TestNewAgentUsesTheGivenPolicies(t *testing.T) {
	e, err := env.Lookup("shop")
	if err != nil {
		t.Fatal(err)
	}
	req := &gauntletv1.EpisodeRequested{Env: "shop", Policy: policy.Oracle, Seed: 3}
	if _, err := (play.Deps{}).NewAgent(e, req); err != nil {
		t.Fatalf("registered oracle: %v", err)
	}
	configured := play.Deps{Policies: policy.NewSet(configuredOracle{})}
	if _, err := configured.NewAgent(e, req); !errors.Is(err, errConfigured) {
		t.Fatalf("configured oracle: %v, want the configured policy's error", err)
	}
	if _, err := (play.Deps{}).NewAgent(e, req); err != nil {
		t.Fatalf("registered oracle after a configured one: %v", err)
	}
}
