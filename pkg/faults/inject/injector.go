package inject

import (
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Outcome is what the plan does to one simulated service call. Call returns Keep 1 when no
// truncation fired; an Outcome built by hand must set Keep too, since the zero Outcome's
// Keep of 0 means "deliver nothing".
type Outcome struct {
	// Status, when non-zero, aborts the call with this HTTP-style status.
	Status     uint32
	RetryAfter time.Duration
	// Latency is added to the call's virtual duration, aborted or not.
	Latency time.Duration
	// Keep is the fraction of the response body delivered (1: all of it).
	Keep float64
	// Fired lists the faults that fired, in evaluation order.
	Fired []*gauntletv1.FaultFired
}

// Truncate applies the outcome's body rewrite to body. An aborted call has no body to
// rewrite, so it is returned unchanged. A Keep of 1 or more (or NaN) keeps everything and
// one of 0 or less keeps nothing.
func (o Outcome) Truncate(body []byte) []byte {
	if o.Status != 0 || !(o.Keep < 1) {
		return body
	}
	if o.Keep <= 0 {
		return body[:0]
	}
	return body[:int(float64(len(body))*o.Keep)]
}

// Injector evaluates a fault plan against the calls of one episode. Each rule keeps its own
// counter of matching calls, and its draw for the n-th call is keyed by (plan seed, rule id,
// n): adding a rule or changing another rule's parameters never shifts a rule's stream.
// An Injector belongs to one episode and is not safe for concurrent use.
type Injector struct {
	plan *gauntletv1.FaultPlan
	// targets[k] is the target of the k-th rule in composition order (aborts, then
	// delays, then body rewrites, each group in plan order) and rules[k] what Call needs
	// of it. A call scans this one array of targets to find its rules instead of every
	// rule of the plan (40 of them in a stress plan, each its own allocation), mostly
	// cache misses; and reads a matching rule's parameters from one entry of rules, not
	// from the three or four allocations of its message (what each cost is in
	// docs/benchmarks.md, Costs the code cites, Faults).
	targets []string
	rules   []callRule
	// boundary are the plan's storage, resource and DNS faults (boundary_spec).
	boundary []catalogue.Rule
}

// callRule is one service rule of a plan as Call evaluates it: its id and parameters,
// copied out of its FaultRule, and its counter of matching calls.
type callRule struct {
	id   string
	kind string // KindHTTPError, KindLatency, KindTruncate, or "" for a spec Call ignores
	prob float64
	// http_error
	status       uint32
	retryAfterMs uint32
	// latency
	meanMs, jitterMs float64
	// truncate
	keep float64
	n    uint64 // matching calls so far
}

// newCallRule copies what Call needs of r.
func newCallRule(r *gauntletv1.FaultRule) callRule {
	c := callRule{id: r.GetId(), prob: r.GetProbability()}
	switch s := r.Spec.(type) {
	case *gauntletv1.FaultRule_HttpError:
		c.kind, c.status, c.retryAfterMs = catalogue.KindHTTPError, s.HttpError.GetStatus(), s.HttpError.GetRetryAfterMs()
	case *gauntletv1.FaultRule_Latency:
		c.kind, c.meanMs, c.jitterMs = catalogue.KindLatency, s.Latency.GetMeanMs(), s.Latency.GetJitterMs()
	case *gauntletv1.FaultRule_Truncate:
		c.kind, c.keep = catalogue.KindTruncate, s.Truncate.GetKeepFraction()
	}
	return c
}

// NewInjector validates plan and returns an injector over it. A nil plan injects nothing.
// The injector keeps plan: do not modify it afterwards.
func NewInjector(plan *gauntletv1.FaultPlan) (*Injector, error) {
	if plan == nil {
		plan = &gauntletv1.FaultPlan{Profile: "none"}
	}
	if err := plans.Validate(plan); err != nil {
		return nil, err
	}
	boundary, err := plans.BoundaryRules(plan)
	if err != nil {
		return nil, err
	}
	in := &Injector{
		boundary: boundary,
		plan:     plan,
		targets:  make([]string, 0, len(plan.Rules)),
		rules:    make([]callRule, 0, len(plan.Rules)),
	}
	for pass := range numPasses {
		for _, r := range plan.Rules {
			if passOf(r) == pass {
				in.targets = append(in.targets, r.GetTarget())
				in.rules = append(in.rules, newCallRule(r))
			}
		}
	}
	return in, nil
}

// Plan returns the plan the injector evaluates.
func (in *Injector) Plan() *gauntletv1.FaultPlan { return in.plan }

// Call evaluates every rule matching (service, tool) for one call made at virtual time now.
// Composition order is fixed: aborts (errors) first, then latency, then body rewrites. The
// first abort that fires wins; truncation never applies to an aborted call. Every matching
// rule advances its counter on every matching call, fired or shadowed, so one rule's
// sequence never depends on another's.
func (in *Injector) Call(service, tool string, now time.Duration) Outcome {
	out := Outcome{Keep: 1}
	if in == nil {
		return out
	}
	seed := in.plan.Seed
	for k, target := range in.targets {
		if !catalogue.Matches(target, service, tool) {
			continue
		}
		r := &in.rules[k]
		n := r.n
		r.n++
		switch r.kind {
		case catalogue.KindHTTPError:
			if out.Status != 0 || !r.fires(seed, n) {
				continue
			}
			out.Status = r.status
			out.RetryAfter = time.Duration(r.retryAfterMs) * time.Millisecond
			out.Fired = append(out.Fired, fired(r.id, catalogue.KindHTTPError, service, tool, now,
				"status="+strconv.FormatUint(uint64(r.status), 10)+
					" retry_after_ms="+strconv.FormatUint(uint64(r.retryAfterMs), 10)))
		case catalogue.KindLatency:
			if !r.fires(seed, n) {
				continue
			}
			ms := math.Max(0, r.meanMs+catalogue.Normal(seed, r.id, n)*r.jitterMs)
			out.Latency += time.Duration(ms * float64(time.Millisecond))
			out.Fired = append(out.Fired, fired(r.id, catalogue.KindLatency, service, tool, now,
				"latency_ms="+strconv.FormatFloat(ms, 'f', 1, 64)))
		case catalogue.KindTruncate:
			if out.Status != 0 || !r.fires(seed, n) {
				continue // an aborted call has no body to truncate
			}
			out.Keep = math.Min(out.Keep, r.keep)
			out.Fired = append(out.Fired, fired(r.id, catalogue.KindTruncate, service, tool, now,
				"keep_fraction="+strconv.FormatFloat(r.keep, 'f', 2, 64)))
		}
	}
	return out
}

// fires draws whether the rule fires on its n-th matching call. Draws lie in [0,1), so
// probabilities 0 and 1 decide without drawing (a draw is a hash of the rule id).
func (r *callRule) fires(seed uint64, n uint64) bool {
	switch {
	case r.prob >= 1:
		return true
	case r.prob <= 0:
		return false
	}
	return rng.Float64(seed, r.id, n) < r.prob
}

func fired(id, kind, service, tool string, now time.Duration, detail string) *gauntletv1.FaultFired {
	return &gauntletv1.FaultFired{
		FaultId:     id,
		Kind:        kind,
		Target:      service + "/" + tool,
		Detail:      detail,
		AtVirtualNs: int64(now),
	}
}

// Composition passes: aborts, delays, body rewrites.
const (
	passAbort = iota
	passDelay
	passRewrite
	numPasses
)

func passOf(r *gauntletv1.FaultRule) int {
	switch r.Spec.(type) {
	case *gauntletv1.FaultRule_HttpError:
		return passAbort
	case *gauntletv1.FaultRule_Latency:
		return passDelay
	default:
		return passRewrite
	}
}

// BoundaryRules returns the storage, resource and DNS faults of the injector's plan (its
// boundary_spec, checked by NewInjector).
func (in *Injector) BoundaryRules() []catalogue.Rule {
	if in == nil {
		return nil
	}
	return slices.Clone(in.boundary)
}
