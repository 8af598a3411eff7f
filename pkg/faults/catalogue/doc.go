// Package catalogue owns what a fault is: every fault kind gauntlet can inject, as one
// row (KindInfo) that says where the kind acts (Layer), when it composes (Pass), its typed
// parameters (Param: unit, range, default), the events it acts on, what firing does to an
// event (KindInfo.Apply, into a Decision) or, for a resource kind, to the whole sandbox
// (KindInfo.ApplyAmbient, into Resources), and how logs show it (LogPattern). A Rule is one
// compiled fault: a kind with checked parameters, a probability and a Match.
//
// # Contract
//
// Adding a fault kind is adding a row to the table in kinds.go (and, for a new kind of
// effect, a field to Decision); nothing else in gauntlet switches on kind names to decide
// what a fault does. Plan rules (the sim kinds http_error, latency and truncate) record
// their parameters in FaultRule's spec oneof, read and written through Param.Get and
// Param.Set.
//
// Every number a kind draws comes from pkg/rng keyed by the caller's (seed, stream id,
// counter): the catalogue holds no state and no randomness of its own. Everything here is
// safe for concurrent use; the tables must not be modified.
package catalogue
