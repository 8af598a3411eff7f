// Package shop is the "shop" env: a simulated e-commerce world on a virtual clock, where an
// agent must buy a number of units of a product matching a description, have it shipped,
// and spend no more than a budget.
//
// The world (catalog, inventory, wallet, task) is built from the episode seed alone. Every
// task is solvable by a careful agent (at least one matching sku has enough stock at a price
// within budget and balance), but naive choices fail: the first search hit is usually out
// of stock, short, or too expensive.
//
// The tools call five simulated services (catalog, inventory, orders, payment, shipping);
// every such call goes through the episode's inject.Injector, which may abort it with an
// HTTP-style status (the call then has no effect and the service stays unavailable for its
// Retry-After), delay it on the virtual clock, or truncate its response (the observation is
// then {"truncated":true,"body":"<partial JSON>"}, and the call's effect, if any, happened).
// The wait tool advances the virtual clock without calling a service.
//
// Causal rules guard the order -> inventory -> payment -> shipping graph: an
// action whose precondition fails does nothing and returns a structured observation
// {"ok":false,"error":...,"rule":...,"reason":...,"suggestion":...}, and the step's Signals
// carry the same CausalViolation. The Rule* constants name the rules.
//
// Observations and diffs are canonical JSON, identical byte for byte for the same seed,
// params, fault plan and actions. Bad agent input is never a Go error: it is an observation
// flagged Signals.invalid_action. Step returns a Go error only when it is called before
// Reset or after the episode ended. The Env value is stateless and safe for concurrent use;
// an Episode, and the Agent returned by Oracle, belong to one goroutine.
package shop
