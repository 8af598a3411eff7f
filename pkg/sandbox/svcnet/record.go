package svcnet

import (
	"cmp"
	"container/heap"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Recorder collects the faults a gateway fires as step events (StepTaken.faults, the
// faults table), for an env to take at the end of each step. Its OnFire method is an
// Options.OnFire. Safe for concurrent use.
type Recorder struct {
	// Now gives the event's time on the episode's clock (nil: zero).
	Now func() time.Duration

	mu       sync.Mutex
	events   []*gauntletv1.FaultFired
	requests []entry    // the allowed requests since the last TakeRequests
	denied   deniedHeap // the denied ones kept since then: the first MaxDenied in order
	dropped  int64      // denied requests dropped since then, past MaxDenied
	seq      uint64     // requests received so far (entry.seq)
}

// entry is a request a Recorder holds, numbered in the order it got them (seq), which
// orders those that began together, and the runtime's attempts in the order tried.
type entry struct {
	Request
	seq uint64
}

// MaxDenied is how many denied requests (refused hosts, lookups, addresses) a Recorder
// keeps between two TakeRequests: a sandbox that floods the gateway with attempts (a
// scan of an address range) costs a count past it, not memory.
const MaxDenied = 256

// MethodDropped is Request.Method of the entry that counts the denied requests a
// Recorder dropped (Request.Dropped), past MaxDenied.
const MethodDropped = "DROPPED"

// OnRequest records a request through the egress gateway (an Options.OnRequest). Of the
// denied ones since the last TakeRequests, the first MaxDenied in TakeRequests' order
// are kept, whatever order they came in (the gateway's goroutines may record a later
// one first): the others are only counted.
func (r *Recorder) OnRequest(req Request) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	e := entry{req, r.seq}
	if !req.Denied {
		r.requests = append(r.requests, e)
		return
	}
	if len(r.denied) < MaxDenied {
		heap.Push(&r.denied, e)
		return
	}
	r.dropped++
	if inOrder(e, r.denied[0]) < 0 {
		r.denied[0] = e // the latest kept is dropped instead
		heap.Fix(&r.denied, 0)
	}
}

// inOrder orders a step's requests: by when they began, the runtime's attempts (which
// have no begin time) after the gateway's, and those that began together in the order
// the Recorder got them.
func inOrder(a, b entry) int {
	switch {
	case a.at == b.at:
		return cmp.Compare(a.seq, b.seq)
	case a.at == 0: // reported by the runtime: after the gateway's
		return 1
	case b.at == 0:
		return -1
	}
	return cmp.Compare(a.at, b.at)
}

// deniedHeap is a max-heap of denied requests in inOrder's order: the latest kept on
// top, the one a Recorder drops when an earlier one comes past the cap.
type deniedHeap []entry

func (h deniedHeap) Len() int           { return len(h) }
func (h deniedHeap) Less(i, j int) bool { return inOrder(h[i], h[j]) > 0 }
func (h deniedHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *deniedHeap) Push(x any)        { *h = append(*h, x.(entry)) }
func (h *deniedHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// OnEgress records a command's refused attempts at addresses outside the sandbox
// (sandbox.ExecResult.Egress, in the order tried) as denied requests: the address as
// the host, its port, the protocol as the method ("TCP", "UDP", "ICMP") and the reason;
// dropped, the attempts the runtime only counted, are counted here too. It is a
// tools.Options.OnEgress. They share OnRequest's cap: past MaxDenied denied ones since
// the last TakeRequests, the latest in TakeRequests' order are only counted.
func (r *Recorder) OnEgress(attempts []sandbox.EgressAttempt, dropped int64) {
	for _, a := range attempts {
		r.OnRequest(Request{Host: a.Addr, Port: a.Port, Method: a.Protocol, Denied: true, Error: errBareAddress})
	}
	if dropped > 0 {
		r.mu.Lock()
		r.dropped += dropped
		r.mu.Unlock()
	}
}

// errBareAddress is the Request.Error of an attempt to reach an address outside the
// sandbox, which has no route out: only an allowed host's name reaches anything.
const errBareAddress = "no route out of the sandbox: a bare address, not an allowed host's name"

// TakeRequests returns the requests recorded since the last TakeRequests and forgets
// them. They are in the order they began: a request's arrival at the gateway, a
// connection's accept, a refusal's sending by the sandbox's kernel (so a sandbox that
// makes them one after another finds them in that order, however late each was
// recorded); concurrent ones in the order the gateway saw them begin. The attempts a
// runtime reported (OnEgress) follow, in the order tried. When denied requests were
// dropped, a last entry of method MethodDropped, denied, says how many: the denied
// ones kept are the first MaxDenied in this order (the cap is applied as if after the
// sort).
func (r *Recorder) TakeRequests() []Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := append(r.requests, r.denied...)
	slices.SortFunc(all, inOrder)
	out := make([]Request, len(all), len(all)+1)
	for i, e := range all {
		out[i] = e.Request
	}
	if r.dropped > 0 {
		out = append(out, Request{Method: MethodDropped, Denied: true, Dropped: r.dropped})
	}
	r.requests, r.denied, r.dropped = nil, nil, 0
	return out
}

// OnFire records fired faults; the target is the service (for a name lookup, the name
// looked up when it is no service's), the detail says what fired and on what (the
// request's method and path, the connection's stream, or the lookup's "dns/<name>").
func (r *Recorder) OnFire(key string, ev catalogue.Event, fired []catalogue.Fired) {
	var at time.Duration
	if r.Now != nil {
		at = r.Now()
	}
	on := key
	target := ev.Service
	if target == "" {
		target = ev.Host
	}
	if ev.Method != "" {
		on = ev.Method + " " + ev.Path
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, f := range fired {
		detail := strings.TrimSpace(f.Detail + " on " + on)
		r.events = append(r.events, &gauntletv1.FaultFired{FaultId: f.RuleID, Kind: f.Kind, Target: target, Detail: detail, AtVirtualNs: int64(at)})
	}
}

// Take returns the faults recorded since the last Take and forgets them.
func (r *Recorder) Take() []*gauntletv1.FaultFired {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}
