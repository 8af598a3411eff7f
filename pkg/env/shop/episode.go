package shop

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Progress milestones; Signals.progress is the highest level reached divided by
// progressShipped (0.2, 0.4, ... 1.0, exact in float64 and never decreasing).
const (
	progressFound   = 1 + iota // a matching product was seen in the catalog
	progressStocked            // the stock of a good sku was read
	progressOrdered            // an order for qty units of a good sku exists
	progressPaid               // such an order is paid
	progressShipped            // such an order is shipped
)

// ErrEpisodeOver is returned by Step after the episode terminated or was truncated.
var ErrEpisodeOver = errors.New("shop: episode is over")

// ErrNotReset is returned by Step before the first Reset.
var ErrNotReset = errors.New("shop: Step before Reset")

// order is one order of the episode; its id is "o-<index+1>".
type order struct {
	product int
	qty     int64
	amount  int64
	status  string // "created", "paid", "shipped"
}

const (
	statusCreated = "created"
	statusPaid    = "paid"
	statusShipped = "shipped"
)

type episode struct {
	cfg      env.Config
	p        params
	maxSteps uint32

	ready bool
	w     world
	// orders, spent: the agent's purchases so far.
	orders []order
	spent  int64

	clock    time.Duration
	step     uint32
	invalid  int
	progress int
	done     bool
	reason   gauntletv1.TerminationReason

	// Service health: an abort with Retry-After makes a service answer with the same status
	// until its time has passed.
	downUntil  [len(serviceNames)]time.Duration
	downStatus [len(serviceNames)]uint32
	baseMs     [len(serviceNames)]int64
	lat        *rand.Rand
}

// serviceNames are the simulated services behind the tools, in Spec order; an array, so
// per-service state can live in arrays.
var serviceNames = [...]string{"catalog", "inventory", "orders", "payment", "shipping"}

func (e *episode) Now() time.Duration { return e.clock }

// Reset rebuilds the world from the seed and returns the task. The fault injector is the
// caller's and is not rewound.
func (e *episode) Reset() (json.RawMessage, error) {
	*e = episode{cfg: e.cfg, p: e.p, maxSteps: e.maxSteps, ready: true}
	e.w = newWorld(e.cfg.Seed, e.p)
	e.lat = rng.New(e.cfg.Seed, "shop/latency", 0)
	for i := range e.baseMs {
		e.baseMs[i] = 5 + e.lat.Int64N(36)
	}
	t := e.w.task
	return marshal(resetObs{
		Task:       t.String(),
		Item:       t.noun,
		Category:   t.category,
		Qty:        t.qty,
		Budget:     t.budget,
		Balance:    e.w.balance,
		DeadlineMs: e.p.deadline.Milliseconds(),
		MaxSteps:   e.maxSteps,
		Tools:      toolNames,
	}), nil
}

// stepState collects what one step did besides its observation.
// stepAlloc is one step's state and the signals and metering the step reports,
// allocated together: the state escapes (the tools get a pointer to it) and the other
// two are returned, and three allocations per step were a visible share of a worker's
// objects (see docs/benchmarks.md, Costs the code cites, Shop env).
type stepAlloc struct {
	s   stepState
	sig gauntletv1.Signals
	met gauntletv1.Metering
}

type stepState struct {
	diff       diff
	violations []*gauntletv1.CausalViolation
	errors     uint32
	spend      int64
	// milestone is the progress the step reached; a read's milestone counts only when its
	// response was delivered whole.
	milestone int
	read      bool
	success   bool
	failure   bool
}

// fail records a failed call; with a rule it is a causal violation.
func (s *stepState) fail(rule, msg, reason, suggestion string) errObs {
	s.errors++
	if rule != "" {
		s.violations = append(s.violations, &gauntletv1.CausalViolation{Rule: rule, Reason: reason, Suggestion: suggestion})
	}
	return errObs{Error: msg, Rule: rule, Reason: reason, Suggestion: suggestion}
}

func (s *stepState) reach(p int, read bool) {
	if p > s.milestone {
		s.milestone, s.read = p, read
	}
}

// Step applies one action. Bad actions are observations; the only errors are stepping
// before Reset or after the end.
func (e *episode) Step(act env.Action) (env.StepResult, error) {
	switch {
	case !e.ready:
		return env.StepResult{}, ErrNotReset
	case e.done:
		return env.StepResult{}, fmt.Errorf("%w (%s)", ErrEpisodeOver, e.reason)
	}
	a := new(stepAlloc)
	s := &a.s
	var faults []*gauntletv1.FaultFired
	var obs []byte
	start := e.clock
	calls := uint32(1)
	t := lookupTool(act.Tool)
	in, bad := parseArgsFor(t, act)
	if bad != nil {
		calls = 0
		e.invalid++
		s.errors++
		obs = marshal(bad)
	} else {
		obs, faults = e.call(t, &in, s)
	}

	progress := max(e.progress, s.milestone)
	sig := &a.sig
	sig.Progress = float64(progress) / progressShipped
	sig.ProgressDelta = float64(progress-e.progress) / progressShipped
	sig.InvalidAction = calls == 0
	sig.Violations = s.violations
	sig.Success = s.success
	sig.Spend = float64(s.spend)
	sig.Budget = float64(e.w.task.budget)
	sig.DeadlineVirtualNs = int64(e.p.deadline)
	e.progress = progress
	e.step++

	met := &a.met
	met.ToolCalls = calls
	met.Errors = s.errors
	met.VirtualNs = uint64(e.clock - start)
	met.BytesIn = uint32(len(act.Args))
	met.BytesOut = uint32(len(obs))
	res := env.StepResult{
		Observation: obs,
		Diff:        s.diff.bytes(),
		Signals:     sig,
		Faults:      faults,
		Metering:    met,
	}
	env.End{
		Success: s.success, Failure: s.failure,
		Invalid: e.invalid, MaxInvalid: e.p.maxInvalid,
		Clock: e.clock, Deadline: e.p.deadline,
		Step: e.step, MaxSteps: e.maxSteps,
	}.Apply(&res)
	e.done, e.reason = res.Done(), res.Reason
	return res, nil
}

// parseArgsFor validates an action against the tool it names (nil: unknown tool) and
// returns its args, or the observation explaining why the action is invalid.
func parseArgsFor(t *toolDef, a env.Action) (args, *errObs) {
	if t == nil {
		return args{}, &errObs{
			Error:      fmt.Sprintf("unknown tool %q", clip(a.Tool)),
			Suggestion: "use one of: " + strings.Join(toolNames, ", "),
		}
	}
	v, err := parseArgs(t, a.Args)
	if err != nil {
		return args{}, &errObs{Error: err.Error(), Suggestion: "call it as " + t.usage}
	}
	return v, nil
}

// call runs a valid action: through the fault injector for service tools, then the tool.
func (e *episode) call(t *toolDef, a *args, s *stepState) ([]byte, []*gauntletv1.FaultFired) {
	if t.svc < 0 {
		return marshal(t.run(e, a, s)), nil
	}
	svc := t.svc
	now := e.clock
	base := time.Duration(e.baseMs[svc]+e.lat.Int64N(e.baseMs[svc]/4+1)) * time.Millisecond
	if now < e.downUntil[svc] {
		e.clock += base
		wait := ceilMs(e.downUntil[svc] - now)
		name := serviceNames[svc]
		o := s.fail(RuleRespectRetryAfter, statusText(e.downStatus[svc]),
			fmt.Sprintf("%s is unavailable for another %d ms", name, wait),
			fmt.Sprintf("wait retry_after_ms (the wait tool) before calling %s again", name))
		o.Status, o.RetryAfterMs = e.downStatus[svc], wait
		return marshal(o), nil
	}
	out := e.cfg.Faults.Call(serviceNames[svc], t.name, now)
	e.clock += base + out.Latency
	if out.Status != 0 {
		s.errors++
		o := errObs{Status: out.Status, Error: statusText(out.Status), RetryAfterMs: ceilMs(out.RetryAfter)}
		if out.RetryAfter > 0 {
			until := e.clock + out.RetryAfter
			s.diff.setInt("services/"+serviceNames[svc]+"/unavailable_until_ns", int64(e.downUntil[svc]), int64(until))
			e.downUntil[svc], e.downStatus[svc] = until, out.Status
		}
		return marshal(o), out.Fired
	}
	body := marshal(t.run(e, a, s))
	if out.Keep < 1 {
		body = marshal(truncObs{Truncated: true, Body: string(out.Truncate(body))})
		if s.read {
			s.milestone = 0
		}
	}
	return body, out.Fired
}

func ceilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// statusText is the error text of an injected HTTP status.
func statusText(status uint32) string {
	switch status {
	case 400:
		return "bad request"
	case 401:
		return "unauthorized"
	case 403:
		return "forbidden"
	case 404:
		return "not found"
	case 408:
		return "request timeout"
	case 429:
		return "rate limited"
	case 500:
		return "internal server error"
	case 502:
		return "bad gateway"
	case 503:
		return "service unavailable"
	case 504:
		return "gateway timeout"
	}
	return fmt.Sprintf("http error %d", status)
}

// checkFeasible ends the episode as a failure when, after a payment, the task can no
// longer be completed: the budget is overspent, or no paid order fulfils the task and no
// matching sku with enough stock fits what is left of both budget and balance.
func (e *episode) checkFeasible(s *stepState) {
	t := e.w.task
	if e.spent > t.budget {
		s.failure = true
		return
	}
	for _, o := range e.orders {
		if o.status == statusPaid && e.fulfils(o) {
			return
		}
	}
	left := min(e.w.balance, t.budget-e.spent)
	for i := range e.w.products {
		if e.w.matches(i) && e.w.stock[i] >= t.qty && e.w.products[i].price*t.qty <= left {
			return
		}
	}
	s.failure = true
}

// fulfils reports whether an order is what the task asks for.
func (e *episode) fulfils(o order) bool {
	return e.w.matches(o.product) && o.qty == e.w.task.qty
}
