package faults

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Fault kinds as recorded in FaultFired.kind and in ClickHouse.
const (
	KindHTTPError = "http_error"
	KindLatency   = "latency"
	KindTruncate  = "truncate"
)

// Outcome is what the plan does to one simulated service call. The zero Outcome (with
// Keep 1) leaves the call alone.
type Outcome struct {
	// Status, when non-zero, aborts the call with this HTTP-style status.
	Status     uint32
	RetryAfter time.Duration
	// Latency is added to the call's virtual duration.
	Latency time.Duration
	// Keep is the fraction of the response body delivered (1: all of it).
	Keep float64
	// Fired lists the faults that fired, in evaluation order.
	Fired []*gauntletv1.FaultFired
}

// Truncate applies the outcome's body rewrite to body.
func (o Outcome) Truncate(body []byte) []byte {
	if o.Keep >= 1 || o.Status != 0 {
		return body
	}
	return body[:int(float64(len(body))*o.Keep)]
}

// Injector evaluates a fault plan against the calls of one episode. Each rule keeps its own
// counter of matching calls, and its draw for the n-th call is keyed by (plan seed, rule id,
// n): adding a rule or changing another rule's parameters never shifts a rule's stream.
// An Injector belongs to one episode and is not safe for concurrent use.
type Injector struct {
	plan     *gauntletv1.FaultPlan
	counters []uint64
}

// NewInjector validates plan and returns an injector over it. A nil plan injects nothing.
func NewInjector(plan *gauntletv1.FaultPlan) (*Injector, error) {
	if plan == nil {
		plan = &gauntletv1.FaultPlan{Profile: "none"}
	}
	if err := ValidatePlan(plan); err != nil {
		return nil, err
	}
	return &Injector{plan: plan, counters: make([]uint64, len(plan.Rules))}, nil
}

// Plan returns the plan the injector evaluates.
func (in *Injector) Plan() *gauntletv1.FaultPlan { return in.plan }

// Call evaluates every rule matching (service, tool) for one call made at virtual time now.
// Composition order is fixed: aborts (errors) first, then latency, then body rewrites; the
// first abort that fires wins and later aborts are not drawn for this call.
func (in *Injector) Call(service, tool string, now time.Duration) Outcome {
	out := Outcome{Keep: 1}
	if in == nil {
		return out
	}
	for pass := 0; pass < 3; pass++ {
		for i, r := range in.plan.Rules {
			if passOf(r) != pass || !Matches(r.Target, service, tool) {
				continue
			}
			if pass == 0 && out.Status != 0 {
				continue
			}
			n := in.counters[i]
			in.counters[i]++
			if rng.Float64(in.plan.Seed, r.Id, n) >= r.Probability {
				continue
			}
			f := &gauntletv1.FaultFired{FaultId: r.Id, Target: service + "/" + tool, AtVirtualNs: int64(now)}
			switch s := r.Spec.(type) {
			case *gauntletv1.FaultRule_HttpError:
				out.Status = s.HttpError.Status
				out.RetryAfter = time.Duration(s.HttpError.RetryAfterMs) * time.Millisecond
				f.Kind = KindHTTPError
				f.Detail = fmt.Sprintf("status=%d retry_after_ms=%d", s.HttpError.Status, s.HttpError.RetryAfterMs)
			case *gauntletv1.FaultRule_Latency:
				// A second, independent draw (counter offset by the high bit) shapes the delay.
				g := rng.New(in.plan.Seed, r.Id, n|1<<63)
				ms := math.Max(0, s.Latency.MeanMs+g.NormFloat64()*s.Latency.JitterMs)
				d := time.Duration(ms * float64(time.Millisecond))
				out.Latency += d
				f.Kind = KindLatency
				f.Detail = fmt.Sprintf("latency_ms=%.1f", ms)
			case *gauntletv1.FaultRule_Truncate:
				if out.Status != 0 {
					continue // nothing to truncate: the call was aborted
				}
				out.Keep = math.Min(out.Keep, s.Truncate.KeepFraction)
				f.Kind = KindTruncate
				f.Detail = fmt.Sprintf("keep_fraction=%.2f", s.Truncate.KeepFraction)
			}
			out.Fired = append(out.Fired, f)
		}
	}
	return out
}

// passOf orders composition: 0 aborts, 1 delays, 2 body rewrites.
func passOf(r *gauntletv1.FaultRule) int {
	switch r.Spec.(type) {
	case *gauntletv1.FaultRule_HttpError:
		return 0
	case *gauntletv1.FaultRule_Latency:
		return 1
	default:
		return 2
	}
}

// Matches reports whether a rule target selects a call: "*" selects everything, a service
// name ("payment") every tool of it, a tool name ("payment.pay") that tool alone.
func Matches(target, service, tool string) bool {
	switch {
	case target == "*", target == service, target == tool:
		return true
	case strings.HasSuffix(target, ".*"):
		return strings.TrimSuffix(target, ".*") == service
	}
	return false
}
