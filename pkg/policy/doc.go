// Package policy holds gauntlet's built-in policies, the ones that choose actions without
// a trainer or a model endpoint: "random" (a uniformly random tool with arguments drawn
// from its JSON Schema, a baseline any learner must beat) and "oracle" (the env's own
// scripted good agent, an upper reference and a smoke test of the env).
//
// A Policy is stateless and safe for concurrent use; NewAgent makes an env.Agent for one
// episode, which belongs to one goroutine. Agents are deterministic: the same env, seed and
// observations give the same actions, since every draw comes from pkg/rng keyed by the
// seed. The registry (Register, Lookup, Names) is safe for concurrent use. A policy that
// needs configuration (the "http" policy's endpoint) registers an unconfigured row for its
// name; the process makes a configured one and hands it, in a Set, to whoever builds
// agents. NewAgent fails with a Go error when the policy cannot play the env (ErrNoOracle,
// an unreadable tool schema); an agent's own Act errors are infra errors of the episode.
package policy
