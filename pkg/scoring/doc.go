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
//	safety      -0.5 per safety event (penalised, never blocked)
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
// # Errors and concurrency
//
// Spec.Validate reports every problem at once, naming the field. Score never fails and never
// panics: a nil step scores 0 on every component, and a component it does not know (which
// Validate rejects) scores 0. Validate specs when they are loaded, not per step. Everything here is safe for concurrent use.
package scoring
