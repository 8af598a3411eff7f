// Package faults owns gauntlet's fault spectrum (B1-B6): the catalogue of faults, the
// profiles that mix them (baseline, stress, edge and user-defined YAML profiles), the
// derivation of an episode's fault plan, drift of fault parameters over episodes or time,
// the Injector that evaluates a plan against the episode's simulated service calls, and the
// Decider that evaluates rules at real boundaries (subpackages faultnet and faultfs apply
// it to connections, HTTP and files; fromlog derives profiles from logs).
//
// # What it owns
//
//   - The catalogue: every fault kind a plan can contain and the ranges its numbers are
//     drawn from, versioned by CatalogueVersion. A plan records the version that made it.
//   - Profiles: Profiles lists them; DefaultMix is the default share of each (baseline 60,
//     stress 25, edge 15); ChooseProfile draws one for an episode from a mix.
//   - Plans: Plan turns (seed, profile, services) into a FaultPlan of atomic FaultRules.
//     Rule ids are "<service>.<fault>", e.g. "payment.http_503" or "inventory.latency".
//     A stress plan is its seed's baseline plan with one fault family amplified on one or
//     two services (same ids, bigger numbers); an edge plan is the baseline plan plus three
//     or more rare faults (new ids).
//   - The Injector: which rules fire on a call and what that does to it (Outcome).
//   - Kinds: the full catalogue of fault kinds (network, storage, service, resource), each
//     with typed parameters (Param: unit, range, default) and a composition pass.
//   - Specs: user-defined profiles in strict YAML (ParseSpec), compiled to Rules with
//     targets by service, tool, host, path, method and operation, checked against an SLA.
//   - The Decider: the typed decision API for real boundaries; Decide(key, event) returns
//     what the faults do to one event (Decision), composed abort > delay > rewrite.
//   - Drift: selectors "<service|*>.<fault>.<param>", schedules (step, linear, piecewise)
//     over the episode index or wall time, ApplyDrift recording the values on the plan.
//
// # Determinism
//
// Every number comes from pkg/rng, never from a global source or the host clock: a plan's
// numbers are keyed by (seed, "plan", layer, rule id), its choices (which family, which
// services) by (seed, "plan", layer, "choice"), and the Injector's draw for the n-th call
// matching a rule by (plan seed, rule id, n). So a plan depends on the set of services, not
// their order; one service's rules do not depend on which other services exist; and adding
// a rule to a plan never shifts another rule's firing sequence. Changing a range or a rule
// id in the catalogue changes plans: bump CatalogueVersion when you do.
//
// # Errors
//
// Plan, ChooseProfile, ValidateMix, ValidatePlan, ValidateDrift, ParseDrift and ParseSpec
// report bad input as errors that name the offending field ("profiles[1].name: ...", "rules[3].probability: ..."), every problem at
// once where several can occur. Unknown profile names wrap ErrUnknownProfile. Nothing in the
// package panics on any input.
//
// # Concurrency
//
// The package-level functions are pure and safe for concurrent use. An Injector belongs to
// one episode and is not safe for concurrent use; the plan it evaluates must not be modified
// while it is in use. A Decider is safe for concurrent use; its draws are keyed per stream,
// so concurrent streams do not perturb each other.
package faults
