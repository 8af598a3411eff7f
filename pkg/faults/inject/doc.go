// Package inject evaluates faults: the Injector decides what a plan does to an episode's
// simulated service calls (Outcome), the Decider what compiled rules do to events at real
// boundaries (a catalogue.Decision, composed abort > delay > rewrite), and ResourcesFor
// which ambient faults (memory, CPU, clock) a sandbox carries.
//
// # Determinism
//
// The Injector's draw for the n-th call matching a rule is keyed by (plan seed, rule id,
// n); the Decider's for the n-th event of a stream matching a rule by (seed, rule id,
// stream key, n). So adding a rule never shifts another rule's firing sequence, and the
// faults a stream meets do not depend on how streams interleave.
//
// # Concurrency
//
// An Injector belongs to one episode and is not safe for concurrent use; the plan it
// evaluates must not be modified while it is in use. A Decider is safe for concurrent use;
// its draws are keyed per stream, so concurrent streams do not perturb each other.
package inject
