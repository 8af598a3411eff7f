package inject

import (
	"math"
	"slices"
	"sync"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// Decider evaluates rules at a real boundary: the HTTP proxy and connection
// wrappers of pkg/faults/faultnet, the file layer of pkg/faults/faultfs, or a runtime's
// own hooks. Each rule's draw for an event is keyed by (seed, rule id, key, n), n counting
// the events of that key the rule matched: give each independent stream of events its own
// key (a connection, a host, a file) and the faults it meets do not depend on how the
// streams interleave. A Decider is safe for concurrent use.
type Decider struct {
	seed  uint64
	rules []catalogue.Rule // composition order
	mu    sync.Mutex
	state map[string]*keyState
}

type keyState struct {
	counters []uint64
	bad      []bool // packet_loss: in a loss burst
}

// NewDecider returns a decider over rules with seed, ordering them abort, delay, rewrite
// (each group in the given order).
func NewDecider(seed uint64, rules []catalogue.Rule) *Decider {
	d := &Decider{seed: seed, state: map[string]*keyState{}}
	for _, pass := range []catalogue.Pass{catalogue.PassAbort, catalogue.PassDelay, catalogue.PassRewrite} {
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
func (d *Decider) Rules() []catalogue.Rule { return d.rules }

// AmbientRules returns the resource faults among rules (memory_leak, cpu_throttle,
// clock_skew), which a runtime applies to the whole sandbox through cgroup knobs and its
// clock rather than per event.
func AmbientRules(rules []catalogue.Rule) []catalogue.Rule {
	var out []catalogue.Rule
	for _, r := range rules {
		if r.Kind.Pass == catalogue.PassAmbient {
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
// kinds say what firing does (KindInfo.Apply); Decide composes them: the first abort
// that fires wins, delays add up, rewrites apply only to events not aborted.
func (d *Decider) Decide(key string, ev catalogue.Event) catalogue.Decision {
	return d.decide(key, ev, "")
}

// DecideKind is Decide over the rules of one kind alone: the other rules neither fire
// nor count the event, so a stream of events only that kind meets (a relayed stream's
// segments, which only packet_loss draws on) leaves their draws as they were.
func (d *Decider) DecideKind(key string, ev catalogue.Event, kind string) catalogue.Decision {
	return d.decide(key, ev, kind)
}

// Meets reports whether a rule of kind acts on ev and selects it.
func (d *Decider) Meets(ev catalogue.Event, kind string) bool {
	if d == nil {
		return false
	}
	op := catalogue.OpBit(ev.Op)
	for i := range d.rules {
		r := &d.rules[i]
		if r.Kind.Name == kind && r.Acts(&ev, op) && r.Selects(&ev) {
			return true
		}
	}
	return false
}

// decide is Decide over the rules of kind only ("" for all).
func (d *Decider) decide(key string, ev catalogue.Event, kind string) catalogue.Decision {
	out := catalogue.Decision{Keep: 1, WriteKeep: 1}
	if d == nil {
		return out
	}
	op := catalogue.OpBit(ev.Op)
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
	// Room on the stack for the rules of a realistic spec; more spill to the heap.
	var hitBuf [8]hit
	var lossBuf [4]bool
	hits, lossFired := hitBuf[:0], lossBuf[:0]
	for i := range d.rules {
		r := &d.rules[i]
		if kind != "" && r.Kind.Name != kind || !r.Acts(&ev, op) || !r.Selects(&ev) {
			continue
		}
		n := st.counters[i]
		st.counters[i]++
		if r.Kind.LossChain {
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
		if r.Kind.LossChain {
			fires = lossFired[li]
			li++
		} else {
			fires = fireDraw(d.seed, id, h.n, r.Probability)
		}
		if !fires {
			continue
		}
		if r.Kind.Pass == catalogue.PassAbort && out.Abort != "" {
			continue // the first abort wins
		}
		if r.Kind.Pass == catalogue.PassRewrite && out.Abort != "" {
			continue // nothing to rewrite on an aborted event
		}
		var latencyMs float64
		if r.Kind.DrawsLatency {
			latencyMs = catalogue.LatencyDraw(r, d.seed, id, h.n)
		}
		var detail string
		out, detail = r.Kind.Apply(out, r, ev, latencyMs)
		if r.Kind.Pass == catalogue.PassAbort {
			out.Abort = r.Kind.Name
		}
		out.Fired = append(out.Fired, catalogue.Fired{RuleID: r.ID, Kind: r.Kind.Name, Detail: detail})
	}
	return out
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
