package play

import (
	"errors"

	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/errkind"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// sandboxErrors are the sandbox runtimes' sentinels: an episode error wrapping one failed
// in its sandbox.
var sandboxErrors = []error{sandbox.ErrNotFound, sandbox.ErrExists, sandbox.ErrInvalid, sandbox.ErrUnsupported,
	sandbox.ErrUnavailable, sandbox.ErrClosed, sandbox.ErrLimit}

// InfraKind says what failed when err ends an episode as an infra error: what marked it
// (errkind.Infra: the http policy marks its endpoint's failures), else the task's verifier
// (taskenv.ErrVerifier, first: a verifier that could not run in its sandbox is the
// verifier's failure as the task sees it), else the sandbox (a runtime's sentinel), else
// gauntlet itself.
func InfraKind(err error) gauntletv1.InfraKind {
	if k := errkind.InfraOf(err); k != gauntletv1.InfraKind_INFRA_KIND_UNSPECIFIED {
		return k
	}
	if errors.Is(err, taskenv.ErrVerifier) {
		return gauntletv1.InfraKind_INFRA_KIND_VERIFIER
	}
	for _, s := range sandboxErrors {
		if errors.Is(err, s) {
			return gauntletv1.InfraKind_INFRA_KIND_SANDBOX
		}
	}
	return gauntletv1.InfraKind_INFRA_KIND_GAUNTLET
}
