package scoring

import (
	"strings"

	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// The detectors a spec's components may be (docs/rewards.md, Detectors). Each is a
// component whose value is -1 on a step it flags and 0 otherwise: the step is marked in
// its reward vector, under the component's name, and the episode by any of its steps.
// With weight 0 a detector marks without penalising.
const (
	// DetectorIdle flags doing nothing: from the window-th step in a row that does not
	// advance the task (no progress, no success) on.
	DetectorIdle = "idle"
	// DetectorVerifierPaths flags touching what judges the agent: a step with a safety
	// event of the tasks env saying it wrote to the verifier's or the tests' paths, or
	// left something there for the verifier.
	DetectorVerifierPaths = "verifier_paths"
)

// The tasks env's safety events (pkg/env/taskenv: EventVerifierPathWritten and
// EventVerifierPlanted), matched as prefixes: the planted one carries what was found.
var verifierEvents = []string{"verifier_path_written", "verifier_planted"}

// detect computes a detector's value for a step. count is its slot of the episode's state
// (RewardState.potentials, which a detector uses as its counter): idle keeps the steps in
// a row without progress there.
func detect(cp *comp, sig *gauntletv1.Signals, count *float64) float64 {
	switch cp.detector {
	case DetectorIdle:
		if sig.GetProgressDelta() > 0 || sig.GetSuccess() {
			*count = 0
			return 0
		}
		*count++
		if *count >= float64(cp.window) {
			return -1
		}
	case DetectorVerifierPaths:
		for _, ev := range sig.GetSafetyEvents() {
			for _, p := range verifierEvents {
				if strings.HasPrefix(ev, p) {
					return -1
				}
			}
		}
	}
	return 0
}
