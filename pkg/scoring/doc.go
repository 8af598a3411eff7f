// Package scoring is gauntlet's reward engine: it turns one step, as the worker recorded it,
// into a reward vector.
//
// # Contract
//
// Score is a pure function of a Spec and a StepTaken (its Signals and Metering): no clock,
// no randomness, no state carried between steps. The same spec and step give the same score
// bit for bit, so any recorded episode can be re-scored later under the same or a new spec.
// Scoring runs in the reward service, outside the sandbox, where the agent cannot reach it;
// the env only reports raw signals (progress, violations, spend, safety events) and the
// sandbox its own metering.
//
// # The vector
//
// Each component is normalised into [-1, 1] and reported with its weight, in spec order, so
// a step's reward can be taken apart when debugging; the total is the weighted sum.
//
//	task        progress_delta, +1 on success (shaping plus the goal)
//	cost        -0.02 per tool call - spend/budget (when a budget is set); never positive
//	safety      -0.5 per safety event (penalised, never blocked; a threat fingerprint's match, a flag, is not counted)
//	timeliness  -10 * virtual_ns / deadline_virtual_ns, on the episode's virtual clock;
//	            0 without a deadline. With weight 0.1, an episode that uses its whole
//	            deadline loses about 1 in total (exactly 1 unless one step takes over 10 %)
//	causal      -0.25 per causal violation, -0.1 for an invalid action
//
// A NaN input (a NaN progress_delta, say) counts as 0 and an infinite one saturates its
// component, so that one bad signal never turns a trainer's return into NaN. These formulas are part of what a spec version means:
// changing one requires a new version string, or re-scoring would silently disagree with
// the recorded scores.
//
// # Spec files
//
// A spec is a YAML file (Parse, LoadFile; docs/rewards.md): a name and version, and
// components, each with a weight and one source: a built-in above, a CEL expression over
// signals, metering and episode (the step's gauntlet.v1.Signals and Metering, and
// EpisodeSoFar: what came before in the episode), type-checked when the file is parsed,
// or potential-based shaping (gamma*phi(after) - phi(before), phi a CEL expression, 0
// before the first step and after a terminating one, so the shaping of an episode
// telescopes to a constant). Each component may have normalisation stages, applied in
// order (clip, scale, a running z-score over a declared window of the episode's steps),
// and its value is then bounded to [-1, 1]. The built-in spec, DefaultVersion, is such a
// file (default.yaml) embedded in the binary; specs whose components are all built-ins
// without stages are scored by the built-in formulas alone, exactly as before spec files.
//
// A component may also read one of the named numbers a task's verifier wrote
// (verifier: NAME; Signals.verifier_names and verifier_values, set on the verdict step
// only): that number there, 0 on every other step. Expressions see the same numbers as the
// map verifier (verifier.tests). The built-in spec reads neither, so it scores a task
// episode's steps as it did before they carried them.
//
// A component may also be a detector (detect.go: idle, repeat, verifier_paths, canary,
// fingerprint), an anti-hacking check that is -1 on a step it flags and 0 otherwise, so
// the step is marked in its vector under the component's name; weight 0 marks without
// penalising. The two that count steps in a row, idle and repeat, hold their count on a
// step whose call an injected fault answered (faults: hold; FaultAnswers says which
// kinds answer), so an honest retry through faults is neither counted nor flagged;
// faults: count, the default, counts it (a file without the key keeps the meaning it
// had before the option). Such a spec reads the step's faults
// (Spec.ReadsFaults), as a repeat detector reads its action (Spec.ReadsActions).
//
// A spec with expressions, shaping, z-scores or detectors is stateful: its steps are scored in order,
// each with the RewardState the previous one left (ScoreState, TableStates), which the
// worker carries between an episode's score requests. The state keeps the episode so far
// only for a spec whose expressions read episode; otherwise it is the potentials, the
// detectors' counters and the z-score windows alone, and the requests carrying it are the
// smaller. Scoring remains a pure function of the spec, the state and the step;
// expressions are compiled once per spec, those of the common shapes into Go closures that
// give CEL's value without CEL (native.go).
//
// # Errors and concurrency
//
// Parse and Spec.Validate report every problem at once, naming the field (and Parse the
// file and line). Score never fails and never panics: a nil step scores 0 on every
// component, a component it does not know (which Validate rejects) scores 0, and so does
// an expression whose evaluation fails (Explain says why). Validate specs when they are loaded, not per step. Everything here is safe for concurrent use.
package scoring
