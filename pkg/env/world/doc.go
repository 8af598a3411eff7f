// Package world runs tool worlds written as data: a YAML file declares a world's services
// (the fault targets), its state (variables and entities, drawn from the episode's seed),
// its tools (arguments as JSON Schema, preconditions that form the causal graph, effects,
// observations), its success, failure and progress conditions, its limits, its params
// (values the episode's request sets, checked against their declared bounds; params.go)
// and, optionally, an oracle plan. Expressions are CEL (cel.dev/cel-go), type-checked when the world loads
// and compiled to Go closures that leave to CEL's interpreter whatever they cannot decide
// (compiled.go; bools, ints and strings unboxed, compiledtyped.go), so that every result
// is the interpreter's. The end conditions' exists and all over the state keep their
// value until a step writes what they read (endparts.go).
//
// A loaded World is an env.Env like the Go envs (and an env.Oracle when the file declares a
// plan): deterministic from the seed, on the episode's virtual clock, every service call
// through the episode's fault injector, answering invalid actions and violated
// preconditions as observations with Signals, and reporting state changes as the same
// diff arrays package shop writes. The reset observation names the world and the digest
// of its file, so a recorded episode says which version of the world it played.
//
// Worlds reach the processes that play episodes two ways: the built-in worlds (the
// builtin directory) are embedded in the binary and registered at init; a directory of
// user worlds is registered by RegisterDir, which the processes call at start with their
// --env.worlds flag (see Config), refusing the start when a world is invalid or its name
// is taken. The file format is documented in docs/worlds.md.
package world
