package taskenv

import "github.com/gauntlet-rl/gauntlet/pkg/env"

// TaskOf is the ID and digest of the task ep plays.
func TaskOf(ep env.Episode) (id, digest string) {
	t := ep.(*episode).task
	return t.ID, t.Digest
}

// WorkDirFor is workDir: the folder an image's WORKDIR makes commands run in, and the
// link it adds to spec.
var WorkDirFor = workDir
