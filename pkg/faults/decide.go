package faults

import (
	"math"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Operations an Event can name (Match.Ops).
const (
	OpOpen    = "open"
	OpCreate  = "create"
	OpRead    = "read"
	OpWrite   = "write"
	OpLock    = "lock"
	OpMkdir   = "mkdir"
	OpRemove  = "remove"
	OpRename  = "rename"
	OpStat    = "stat"
	OpLookup  = "lookup"
	OpConnect = "connect"
	OpRequest = "request"
)

// Rule is one compiled fault: a kind with checked parameters, a probability and a match.
// Rules come from a Spec (ParseSpec, Spec.Compile) or from a sim plan (RulesFromPlan).
type Rule struct {
	ID          string
	Kind        KindInfo
	Probability float64
	Match       Match
	// target is a sim plan rule's target ("payment", "payment.pay", "*"), matched by
	// Matches against the event's service and tool; empty for spec rules.
	target string
	nums   map[string]float64
	texts  map[string]string
}

// Num returns a numeric parameter (its default when the rule did not set it).
func (r Rule) Num(name string) float64 { return r.nums[name] }

// Text returns a text parameter.
func (r Rule) Text(name string) string { return r.texts[name] }

// RulesFromPlan compiles a sim plan's rules (http_error, latency, truncate) so a Decider
// can evaluate them at a real boundary. The plan must be valid.
func RulesFromPlan(plan *gauntletv1.FaultPlan) []Rule {
	out := make([]Rule, 0, len(plan.GetRules()))
	for _, pr := range plan.GetRules() {
		kind := kindOf(pr)
		k, _ := LookupKind(kind)
		r := Rule{ID: pr.Id, Kind: k, Probability: pr.Probability, target: pr.Target, nums: map[string]float64{}}
		for _, p := range kindParams[kind][1:] {
			r.nums[p.Name] = p.get(pr)
		}
		out = append(out, r)
	}
	return out
}

// Event is one thing a boundary is about to do: an HTTP request through the proxy, a write
// on a connection, a name lookup, a file operation. Fields that do not apply stay empty.
type Event struct {
	Layer   Layer
	Op      string
	Service string
	Tool    string
	Host    string
	Path    string
	Method  string
}

// opSet is a set of Event operations, one bit each, so a rule's kind tells whether it
// acts on an event by one mask test instead of comparing names.
type opSet uint16

const (
	opOpen opSet = 1 << iota
	opCreate
	opRead
	opWrite
	opLock
	opMkdir
	opRemove
	opRename
	opStat
	opLookup
	opConnect
	opRequest
	// opOther is every operation not named above (and none).
	opOther

	allOps    = opOther<<1 - 1
	notLookup = allOps &^ opLookup
	// atOpen is for network kinds that act once, when a connection opens.
	atOpen = notLookup &^ opWrite
)

// opBit returns the bit of an Event's operation.
func opBit(op string) opSet {
	switch op {
	case OpOpen:
		return opOpen
	case OpCreate:
		return opCreate
	case OpRead:
		return opRead
	case OpWrite:
		return opWrite
	case OpLock:
		return opLock
	case OpMkdir:
		return opMkdir
	case OpRemove:
		return opRemove
	case OpRename:
		return opRename
	case OpStat:
		return opStat
	case OpLookup:
		return opLookup
	case OpConnect:
		return opConnect
	case OpRequest:
		return opRequest
	}
	return opOther
}

// meets reports whether a kind of layer l acts on events of layer ev: storage kinds on
// file operations, service kinds on service calls, network kinds on both connections and
// service calls, resource kinds on none.
func (l Layer) meets(ev Layer) bool {
	switch l {
	case LayerStorage, LayerService:
		return ev == l
	case LayerNetwork:
		return ev == LayerNetwork || ev == LayerService
	}
	return false
}

// applies reports whether the rule's kind acts on this kind of event (op is opBit(ev.Op)).
func (r *Rule) applies(ev *Event, op opSet) bool {
	return r.Kind.ops&op != 0 && r.Kind.Layer.meets(ev.Layer)
}

// matches reports whether the rule selects the event.
func (r *Rule) matches(ev *Event) bool {
	if r.target != "" && !Matches(r.target, ev.Service, ev.Tool) {
		return false
	}
	m := &r.Match
	return anyEqual(m.Services, ev.Service) && anyEqual(m.Tools, ev.Tool) && anyGlob(m.Hosts, ev.Host) &&
		anyGlob(m.Paths, ev.Path) && anyFold(m.Methods, ev.Method) && anyEqual(m.Ops, ev.Op)
}

func anyEqual(list []string, s string) bool { return len(list) == 0 || containsString(list, s) }

func anyFold(list []string, s string) bool {
	if len(list) == 0 {
		return true
	}
	for _, x := range list {
		if strings.EqualFold(x, s) {
			return true
		}
	}
	return false
}

func anyGlob(list []string, s string) bool {
	if len(list) == 0 {
		return true
	}
	for _, p := range list {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

// Fired is one fault that fired on an event.
type Fired struct {
	RuleID string
	Kind   string
	Detail string
}

// Decision is what the rules do to one event, after composition: the first abort that
// fires wins, every delay that fires adds up, rewrites apply only to events not aborted.
type Decision struct {
	// Fired lists the faults that fired, in composition order.
	Fired []Fired

	// Abort is the kind of the abort that fired ("" when none); the fields after it say
	// what the abort does.
	Abort      string
	Status     int           // http_error
	RetryAfter time.Duration // http_error
	// ResetAfterBytes and ResetAfter: reset the connection once either is reached (a
	// zero ResetAfter means bytes only).
	ResetAfterBytes int64
	ResetAfter      time.Duration
	// Hold: timeout and dns_timeout hold the event this long, then fail it.
	Hold time.Duration
	// RTO: a lost packet costs a stream connection this long.
	RTO time.Duration
	// Errno: a storage abort's error (ENOSPC, EMFILE, EROFS, EWOULDBLOCK).
	Errno syscall.Errno

	// Delay is the latency added (latency, io_latency), in total.
	Delay time.Duration
	// BytesPerSec caps throughput (bandwidth); 0: no cap.
	BytesPerSec float64
	// IOPS caps file operations per second (iops_cap); 0: no cap.
	IOPS float64

	// Keep is the fraction of a response body delivered (truncate; 1: all).
	Keep float64
	// WriteKeep is the fraction of a write stored (short_write; 1: all).
	WriteKeep float64
	// RemoveHeaders and GarbleHeaders name response headers to drop or garble.
	RemoveHeaders []string
	GarbleHeaders []string
	// BrokenGzip sends the body as a gzip stream that breaks part-way.
	BrokenGzip bool
	// SlowBodyBytesPerSec sends the body at this rate (0: full speed).
	SlowBodyBytesPerSec float64
}

// Events converts the fired faults to step events, with target and virtual time.
func (d Decision) Events(target string, at time.Duration) []*gauntletv1.FaultFired {
	out := make([]*gauntletv1.FaultFired, len(d.Fired))
	for i, f := range d.Fired {
		out[i] = &gauntletv1.FaultFired{FaultId: f.RuleID, Kind: f.Kind, Target: target, Detail: f.Detail, AtVirtualNs: int64(at)}
	}
	return out
}

// Decider evaluates rules at a real boundary (B2, B4): the HTTP proxy and connection
// wrappers of pkg/faults/faultnet, the file layer of pkg/faults/faultfs, or a runtime's
// own hooks. Each rule's draw for an event is keyed by (seed, rule id, key, n), n counting
// the events of that key the rule matched: give each independent stream of events its own
// key (a connection, a host, a file) and the faults it meets do not depend on how the
// streams interleave. A Decider is safe for concurrent use.
type Decider struct {
	seed  uint64
	rules []Rule // composition order
	mu    sync.Mutex
	state map[string]*keyState
}

type keyState struct {
	counters []uint64
	bad      []bool // packet_loss: in a loss burst
}

// NewDecider returns a decider over rules with seed, ordering them abort, delay, rewrite
// (each group in the given order).
func NewDecider(seed uint64, rules []Rule) *Decider {
	d := &Decider{seed: seed, state: map[string]*keyState{}}
	for _, pass := range []Pass{PassAbort, PassDelay, PassRewrite} {
		for _, r := range rules {
			if r.Kind.Pass == pass {
				d.rules = append(d.rules, r)
			}
		}
	}
	return d
}

// Rules returns the decider's rules in composition order (resource faults, which act on
// the sandbox as a whole, are left out: see AmbientRules).
func (d *Decider) Rules() []Rule { return d.rules }

// AmbientRules returns the resource faults among rules (memory_leak, cpu_throttle,
// clock_skew), which a runtime applies to the whole sandbox through cgroup knobs and its
// clock rather than per event.
func AmbientRules(rules []Rule) []Rule {
	var out []Rule
	for _, r := range rules {
		if r.Kind.Pass == PassAmbient {
			out = append(out, r)
		}
	}
	return out
}

// Clone returns an independent decider in the same state: from now on both make the
// same decisions for the same events (a branched episode continues as its parent would).
func (d *Decider) Clone() *Decider {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c := &Decider{seed: d.seed, rules: d.rules, state: make(map[string]*keyState, len(d.state))}
	for k, st := range d.state {
		c.state[k] = &keyState{counters: slices.Clone(st.counters), bad: slices.Clone(st.bad)}
	}
	return c
}

// Forget drops the state of stream key (its counters and loss bursts), for a stream that
// has ended, such as a closed connection, so a long-lived boundary does not accumulate
// state. A key must not be reused after Forget: its draws would start over.
func (d *Decider) Forget(key string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	delete(d.state, key)
	d.mu.Unlock()
}

// Decide evaluates every rule matching ev as the next event of stream key. The rules'
// kinds say what firing does (KindInfo.decide); Decide composes them: the first abort
// that fires wins, delays add up, rewrites apply only to events not aborted.
func (d *Decider) Decide(key string, ev Event) Decision {
	out := Decision{Keep: 1, WriteKeep: 1}
	if d == nil {
		return out
	}
	op := opBit(ev.Op)
	d.mu.Lock()
	st := d.state[key]
	if st == nil {
		st = &keyState{counters: make([]uint64, len(d.rules)), bad: make([]bool, len(d.rules))}
		d.state[key] = st
	}
	// Draw under the lock (cheap hashes) so counters and burst states stay consistent.
	type hit struct {
		i int
		n uint64
	}
	hits := make([]hit, 0, 4)
	var lossFired []bool
	for i := range d.rules {
		r := &d.rules[i]
		if !r.applies(&ev, op) || !r.matches(&ev) {
			continue
		}
		n := st.counters[i]
		st.counters[i]++
		if r.Kind.lossChain {
			lossFired = append(lossFired, d.lossStep(st, i, key, n))
		}
		hits = append(hits, hit{i, n})
	}
	d.mu.Unlock()

	li := 0
	for _, h := range hits {
		r := &d.rules[h.i]
		id := r.ID + "\x00" + key
		var fires bool
		if r.Kind.lossChain {
			fires = lossFired[li]
			li++
		} else {
			fires = fireDraw(d.seed, id, h.n, r.Probability)
		}
		if !fires {
			continue
		}
		if r.Kind.Pass == PassAbort && out.Abort != "" {
			continue // the first abort wins
		}
		if r.Kind.Pass == PassRewrite && out.Abort != "" {
			continue // nothing to rewrite on an aborted event
		}
		var at draw
		if r.Kind.drawsLatency {
			at.latencyMs = latencyDraw(r, d.seed, id, h.n)
		}
		var detail string
		out, detail = r.Kind.decide(out, r, ev, at)
		if r.Kind.Pass == PassAbort {
			out.Abort = r.Kind.Name
		}
		out.Fired = append(out.Fired, Fired{r.ID, r.Kind.Name, detail})
	}
	return out
}

// draw is what Decide drew for a fired rule beyond its firing, for kinds whose effect is
// a random number: the latency of a kind with drawsLatency. Decide draws it, not the
// kind, so the rule's stream id, built on Decide's stack, never leaves it.
type draw struct {
	latencyMs float64
}

// addLatency is latency's and io_latency's decision: a delay drawn per event.
func addLatency(out Decision, _ *Rule, _ Event, at draw) (Decision, string) {
	out.Delay += ms(at.latencyMs)
	return out, "latency_ms=" + strconv.FormatFloat(at.latencyMs, 'f', 1, 64)
}

// hostDetail is the decision of a DNS abort that only needs naming: the host looked up.
func hostDetail(out Decision, _ *Rule, ev Event, _ draw) (Decision, string) { return out, ev.Host }

// failWith returns the decision of a storage abort that fails the operation with errno.
func failWith(errno syscall.Errno, prefix string) func(Decision, *Rule, Event, draw) (Decision, string) {
	return func(out Decision, _ *Rule, ev Event, _ draw) (Decision, string) {
		out.Errno = errno
		return out, prefix + ev.Path
	}
}

// lossStep advances rule i's Gilbert loss chain for stream key and reports whether event
// n is lost. The chain is Good -> Bad with probability a and Bad -> Good with 1/burst_len;
// a = rate/(burst_len(1-rate)) makes the long-run loss rate exactly rate (Spec.Compile
// refuses a rate for which a would exceed 1). With burst_len 1 the losses are independent
// draws of probability rate.
func (d *Decider) lossStep(st *keyState, i int, key string, n uint64) bool {
	r := &d.rules[i]
	rate, l := r.Num("rate")*r.Probability, math.Max(1, r.Num("burst_len"))
	u := rng.Float64(d.seed, r.ID+"\x00"+key, n)
	if l <= 1 || rate >= 1 {
		return u < rate // independent losses
	}
	if st.bad[i] {
		st.bad[i] = u >= 1/l // stay in the burst
	} else {
		st.bad[i] = u < rate/(l*(1-rate))
	}
	return st.bad[i]
}

// fireDraw is fires for a rule id and counter.
func fireDraw(seed uint64, id string, n uint64, p float64) bool {
	switch {
	case p >= 1:
		return true
	case p <= 0:
		return false
	}
	return rng.Float64(seed, id, n) < p
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func fmtNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func minPositive(cur, v float64) float64 {
	if cur == 0 || v < cur {
		return v
	}
	return cur
}

// latencyDraw draws a latency rule's delay in ms for its n-th event: mean mean_ms and
// standard deviation jitter_ms, shaped by the distribution parameter.
func latencyDraw(r *Rule, seed uint64, id string, n uint64) float64 {
	m, sd := r.Num("mean_ms"), r.Num("jitter_ms")
	switch r.Text("distribution") {
	case DistLognormal:
		if m <= 0 {
			return 0
		}
		s2 := math.Log1p(sd * sd / (m * m))
		return math.Exp(math.Log(m) - s2/2 + math.Sqrt(s2)*normal(seed, id, n))
	case DistUniform:
		// Uniform on mean ± sd·√3 has standard deviation sd.
		return math.Max(0, m+(2*rng.Float64(seed, id, n|1<<61)-1)*sd*math.Sqrt(3))
	}
	return math.Max(0, m+normal(seed, id, n)*sd)
}
