package catalogue

import (
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"
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

// Match selects the events a fault applies to. Every non-empty list must match (a list
// matches when any entry does); empty lists match everything. Hosts and paths are glob
// patterns (path.Match: "*.internal", "/v1/*"); methods compare case-insensitively; ops
// name file or network operations (open, create, read, write, lock, mkdir, remove,
// rename, stat, lookup, connect, request).
type Match struct {
	Services []string `yaml:"services,omitempty"`
	Tools    []string `yaml:"tools,omitempty"`
	Hosts    []string `yaml:"hosts,omitempty"`
	Paths    []string `yaml:"paths,omitempty"`
	Methods  []string `yaml:"methods,omitempty"`
	Ops      []string `yaml:"ops,omitempty"`
}

// knownOps are the operation names Match.Ops accepts.
var knownOps = []string{OpOpen, OpCreate, OpRead, OpWrite, OpLock, OpMkdir, OpRemove, OpRename, OpStat, OpLookup, OpConnect, OpRequest}

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

// HasParam reports whether the rule sets parameter name (a number or a text).
func (r Rule) HasParam(name string) bool {
	_, num := r.nums[name]
	_, txt := r.texts[name]
	return num || txt
}

// WithParams returns r with these parameter values, which a compiler (a spec's) has
// checked against r's kind. The maps are kept, not copied.
func (r Rule) WithParams(nums map[string]float64, texts map[string]string) Rule {
	r.nums, r.texts = nums, texts
	return r
}

// RulesFromPlan compiles a sim plan's rules (http_error, latency, truncate) so a Decider
// can evaluate them at a real boundary. The plan must be valid.
func RulesFromPlan(plan *gauntletv1.FaultPlan) []Rule {
	out := make([]Rule, 0, len(plan.GetRules()))
	for _, pr := range plan.GetRules() {
		kind := KindOf(pr)
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

// OpSet is a set of Event operations, one bit each, so a rule's kind tells whether it
// acts on an event by one mask test instead of comparing names (OpBit).
type OpSet uint16

const (
	opOpen OpSet = 1 << iota
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

// OpBit returns the bit of an Event's operation: a boundary's decider computes it once
// per event and hands it to every rule's Selects.
func OpBit(op string) OpSet {
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

// Acts reports whether the rule's kind acts on this kind of event (op is OpBit(ev.Op)).
// It is cheap and inlined; ask Selects only of the rules that act.
func (r *Rule) Acts(ev *Event, op OpSet) bool {
	return r.Kind.ops&op != 0 && r.Kind.Layer.meets(ev.Layer)
}

// Selects reports whether the rule's target and match select the event.
func (r *Rule) Selects(ev *Event) bool {
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

// Apply returns out with rule r, of kind k, fired on ev: the kind's decision. latencyMs
// is the delay the caller drew for a kind with DrawsLatency (LatencyDraw), and 0 for any
// other; the caller draws it, not the kind, so the rule's stream id the caller built
// never escapes through the call. It also returns the detail the firing records.
func (k *KindInfo) Apply(out Decision, r *Rule, ev Event, latencyMs float64) (Decision, string) {
	return k.decide(out, r, ev, latencyMs)
}

// addLatency is latency's and io_latency's decision: a delay drawn per event.
func addLatency(out Decision, _ *Rule, _ Event, latencyMs float64) (Decision, string) {
	out.Delay += ms(latencyMs)
	return out, "latency_ms=" + strconv.FormatFloat(latencyMs, 'f', 1, 64)
}

// hostDetail is the decision of a DNS abort that only needs naming: the host looked up.
func hostDetail(out Decision, _ *Rule, ev Event, _ float64) (Decision, string) { return out, ev.Host }

// failWith returns the decision of a storage abort that fails the operation with errno.
func failWith(errno syscall.Errno, prefix string) func(Decision, *Rule, Event, float64) (Decision, string) {
	return func(out Decision, _ *Rule, ev Event, _ float64) (Decision, string) {
		out.Errno = errno
		return out, prefix + ev.Path
	}
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

func fmtNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func minPositive(cur, v float64) float64 {
	if cur == 0 || v < cur {
		return v
	}
	return cur
}

// LatencyDraw draws a latency rule's delay in ms for its n-th event: mean mean_ms and
// standard deviation jitter_ms, shaped by the distribution parameter.
func LatencyDraw(r *Rule, seed uint64, id string, n uint64) float64 {
	m, sd := r.Num("mean_ms"), r.Num("jitter_ms")
	switch r.Text("distribution") {
	case DistLognormal:
		if m <= 0 {
			return 0
		}
		s2 := math.Log1p(sd * sd / (m * m))
		return math.Exp(math.Log(m) - s2/2 + math.Sqrt(s2)*Normal(seed, id, n))
	case DistUniform:
		// Uniform on mean ± sd·√3 has standard deviation sd.
		return math.Max(0, m+(2*rng.Float64(seed, id, n|1<<61)-1)*sd*math.Sqrt(3))
	}
	return math.Max(0, m+Normal(seed, id, n)*sd)
}

// Validate reports every problem of the match at once, each naming its field under
// where ("faults[2].match").
func (m Match) Validate(where string) []error {
	var errs []error
	for _, l := range []struct {
		name string
		list []string
		glob bool
	}{{"services", m.Services, false}, {"tools", m.Tools, false}, {"hosts", m.Hosts, true}, {"paths", m.Paths, true}, {"methods", m.Methods, false}, {"ops", m.Ops, false}} {
		for i, v := range l.list {
			if v == "" {
				errs = append(errs, fmt.Errorf("%s.%s[%d]: must not be empty", where, l.name, i))
			} else if l.glob {
				if _, err := path.Match(v, ""); err != nil {
					errs = append(errs, fmt.Errorf("%s.%s[%d]: %q: bad pattern", where, l.name, i, v))
				}
			}
			if l.name == "ops" && v != "" && !containsString(knownOps, v) {
				errs = append(errs, fmt.Errorf("%s.ops[%d]: unknown operation %q (known: %s)", where, i, v, strings.Join(knownOps, ", ")))
			}
		}
	}
	return errs
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Normal is a standard normal draw for the n-th call of rule id, by Box-Muller over two
// uniform draws on counters that the firing draw never uses (n stays far below 2^62). It
// allocates nothing, unlike a rand.Rand per call.
func Normal(seed uint64, id string, n uint64) float64 {
	u1 := 1 - rng.Float64(seed, id, n|1<<63) // in (0,1]: log is finite
	u2 := rng.Float64(seed, id, n|1<<62)
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*u2)
}

// Matches reports whether a rule target selects a call: "*" selects everything, a service
// name ("payment") or "payment.*" every tool of it, a tool name ("payment.pay") that tool
// alone.
func Matches(target, service, tool string) bool {
	switch {
	case target == "*", target == service, target == tool:
		return true
	case strings.HasSuffix(target, ".*"):
		return strings.TrimSuffix(target, ".*") == service
	}
	return false
}
