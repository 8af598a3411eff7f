// Package plans owns an episode's fault plan: the built-in profiles that mix the catalogue's
// faults (baseline, stress, edge) and user-defined ones in strict YAML (ParseSpec), the
// derivation of a plan from (seed, profile, services), compact plans and their expansion,
// validation, and drift of fault parameters over episodes or wall time.
//
// # Plans
//
// Derive turns (seed, profile, services) into a FaultPlan of atomic FaultRules. Rule ids
// are "<service>.<fault>", e.g. "payment.http_503" or "inventory.latency". A stress plan is
// its seed's baseline plan with one fault family amplified on one or two services (same
// ids, bigger numbers); an edge plan is the baseline plan plus three or more rare faults
// (new ids). Profiles lists the built-in profiles; DefaultMix is the default share of each
// (baseline 60, stress 25, edge 15); ChooseProfile draws one for an episode from a mix. A
// plan records CatalogueVersion, the version of the ranges its numbers were drawn from.
//
// # Determinism
//
// Every number comes from pkg/rng, never from a global source or the host clock: a plan's
// numbers are keyed by (seed, "plan", layer, rule id), its choices (which family, which
// services) by (seed, "plan", layer, "choice"). So a plan depends on the set of services,
// not their order; one service's rules do not depend on which other services exist; and
// adding a rule never shifts another rule's numbers. Changing a range or a rule id changes
// plans: bump CatalogueVersion when you do.
//
// # Errors
//
// Derive, ChooseProfile, ValidateMix, Validate, ValidateDrift, ParseDrift, ParseSpec and
// CheckCustomProfiles report bad input as errors that name the offending field
// ("profiles[1].name: ...", "rules[3].probability: ..."), every problem at once where
// several can occur. Unknown profile names wrap ErrUnknownProfile. Nothing in the package panics on any input.
//
// # Concurrency
//
// The package's functions are pure and safe for concurrent use.
package plans
