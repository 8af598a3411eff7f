// Package faults is the root of gauntlet's fault wing; it holds no code. Each job is a
// package of its own, so an importer names what it uses:
//
//   - catalogue: the fault kinds (network, storage, service, resource), their typed
//     parameters and units, what each does to an event when it fires and how logs show
//     it. Adding a fault kind is adding one row there.
//   - plans: the built-in profiles and user-defined specs, an episode's fault plan
//     derived from (seed, profile, services), compact plans and their expansion,
//     validation, and drift of parameters over episodes or time.
//   - inject: evaluation. The Injector decides what a plan does to simulated service
//     calls, the Decider what rules do to events at real boundaries, ResourcesFor which
//     ambient faults a sandbox carries.
//   - faultnet and faultfs: the real boundaries (connections, DNS, an HTTP proxy; file
//     operations) that apply a Decider's decisions.
//   - fromlog: fault profiles derived from real error logs, by the catalogue's patterns.
//   - templates: the reading side of the faults service's plan templates.
//
// The dependencies run one way: catalogue ← plans ← inject ← the boundaries.
package faults
