package safety

import (
	"fmt"
	"sync"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// maxDistinct bounds the distinct observations of one kind a Recorder keeps between drains;
// a command that tries thousands of destinations yields maxDistinct events and a count of
// the rest, and cannot crowd out another kind.
const maxDistinct = 16

// Recorder folds observations into a bounded, ordered list of events. Safe for concurrent
// use.
type Recorder struct {
	mu      sync.Mutex
	order   []key
	seen    map[key]*entry
	kept    map[sandbox.EventKind]int
	dropped map[sandbox.EventKind]int
	// egress are the refused attempts at addresses one by one (DrainEgress), unfolded;
	// egressDropped counts those past sandbox.MaxEgress.
	egress        []sandbox.EgressAttempt
	egressDropped int64
}

type key struct {
	kind sandbox.EventKind
	what string
}

type entry struct {
	n     int
	first string
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	r := &Recorder{}
	r.reset()
	return r
}

func (r *Recorder) reset() {
	r.order, r.seen = nil, map[key]*entry{}
	r.kept, r.dropped = map[sandbox.EventKind]int{}, map[sandbox.EventKind]int{}
}

// Add records one observation of kind: what happened ("ptrace refused with EPERM") and by
// whom ("pid 12 (perl)"); repeats of the same what are counted.
func (r *Recorder) Add(kind sandbox.EventKind, what, by string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := key{kind, what}
	if e, ok := r.seen[k]; ok {
		e.n++
		return
	}
	if r.kept[kind] >= maxDistinct {
		r.dropped[kind]++
		return
	}
	r.kept[kind]++
	r.seen[k] = &entry{n: 1, first: by}
	r.order = append(r.order, k)
}

// AddEgress records one refused attempt at an address outside the sandbox, as
// ExecResult.Egress lists them: past sandbox.MaxEgress since the last DrainEgress it is
// only counted.
func (r *Recorder) AddEgress(a sandbox.EgressAttempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.egress) >= sandbox.MaxEgress {
		r.egressDropped++
		return
	}
	r.egress = append(r.egress, a)
}

// DrainEgress returns the attempts AddEgress recorded since the last DrainEgress, in
// order, and how many it only counted, and forgets them. It is apart from Drain: each
// forgets only its own.
func (r *Recorder) DrainEgress() ([]sandbox.EgressAttempt, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out, dropped := r.egress, r.egressDropped
	r.egress, r.egressDropped = nil, 0
	return out, dropped
}

// Drain returns the events recorded since the last Drain and forgets them.
func (r *Recorder) Drain() []sandbox.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []sandbox.Event
	for _, k := range r.order {
		e := r.seen[k]
		d := fmt.Sprintf("%s: %s", k.what, e.first)
		if e.n > 1 {
			d += fmt.Sprintf(", %d times", e.n)
		}
		out = append(out, sandbox.Event{Kind: k.kind, Detail: d})
	}
	for _, kind := range []sandbox.EventKind{sandbox.EventSyscallDenied, sandbox.EventEgress, sandbox.EventDeviceAccess} {
		if n := r.dropped[kind]; n > 0 {
			out = append(out, sandbox.Event{Kind: kind, Detail: fmt.Sprintf("%d more not itemised", n)})
		}
	}
	r.reset()
	return out
}
