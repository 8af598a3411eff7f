package taskenv

import (
	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// TaskOf is the ID and digest of the task ep plays.
func TaskOf(ep env.Episode) (id, digest string) {
	t := ep.(*episode).task
	return t.ID, t.Digest
}

// WorkDirFor is workDir: the folder an image's WORKDIR makes commands run in, and the
// link it adds to spec.
var WorkDirFor = workDir

// VerifierFor is verifierFor: whether the verifier's fork runs as another user than the
// agent's, and as whom.
func VerifierFor(rt sandbox.Runtime, t *tasks.Task) (set bool, user string, err error) {
	v, err := verifierFor(rt, t)
	return v.set, v.user, err
}
