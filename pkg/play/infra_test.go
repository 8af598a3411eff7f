package play

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// An infra error says what failed: what marked it, the verifier before the sandbox it ran
// in, a sandbox runtime's sentinel, and gauntlet for anything else.
func TestInfraKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want gauntletv1.InfraKind
	}{
		{fmt.Errorf("policy http at step 2: %w", errkind.Infra(gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT, errors.New("503"))), gauntletv1.InfraKind_INFRA_KIND_MODEL_ENDPOINT},
		{fmt.Errorf("step 4: %w: task t: %w (test.sh exited 1)", taskenv.ErrVerifier, sandbox.ErrClosed), gauntletv1.InfraKind_INFRA_KIND_VERIFIER},
		{fmt.Errorf("prepare: exec sb-1: %w", sandbox.ErrUnavailable), gauntletv1.InfraKind_INFRA_KIND_SANDBOX},
		{fmt.Errorf("step 3: %w", sandbox.ErrLimit), gauntletv1.InfraKind_INFRA_KIND_SANDBOX},
		{errors.New("score step 2: reward service: nats: timeout"), gauntletv1.InfraKind_INFRA_KIND_GAUNTLET},
	} {
		if got := InfraKind(c.err); got != c.want {
			t.Errorf("InfraKind(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
