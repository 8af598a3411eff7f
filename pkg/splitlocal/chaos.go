package splitlocal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/chlocal"
)

// The kinds of part a chaos plan kills. Each kill is a SIGKILL, as a crash or an
// out-of-memory kill would be, and the stack's supervision (Run) brings the part back on
// the same ports and data, as a Kubernetes controller would.
const (
	// KillNATSNode kills one node of the 3-node JetStream cluster.
	KillNATSNode = "nats"
	// KillWorker kills one worker process.
	KillWorker = "worker"
	// KillStore kills one store process.
	KillStore = "store"
	// KillSchedulerLeader kills the scheduler holding the leader lease (the standby takes
	// over once the lease expires).
	KillSchedulerLeader = "scheduler-leader"
	// KillClickHouse kills one ClickHouse replica.
	KillClickHouse = "clickhouse"
)

// ChaosKinds lists every kind a chaos round kills once.
var ChaosKinds = []string{KillNATSNode, KillWorker, KillStore, KillSchedulerLeader, KillClickHouse}

// Fault is one planned kill.
type Fault struct {
	// Wait is how long after the previous fault's recovery (or the chaos's start) this
	// one strikes.
	Wait time.Duration `json:"wait"`
	// Kind is one of ChaosKinds.
	Kind string `json:"kind"`
	// Instance picks which of the kind's parts dies, modulo their count; the scheduler
	// leader is whichever holds the lease then.
	Instance int `json:"instance"`
}

// PlanChaos draws rounds rounds of faults from seed: each round kills every kind of
// ChaosKinds once, in an order shuffled by the seed, each after a wait drawn uniformly
// from [minWait, maxWait]. The same arguments give the same plan, so a failed chaos run is
// repeated exactly (the times are measured from each recovery, which the machine decides).
func PlanChaos(seed uint64, rounds int, minWait, maxWait time.Duration) []Fault {
	r := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	span := max(maxWait-minWait, 0)
	var plan []Fault
	for range rounds {
		kinds := append([]string(nil), ChaosKinds...)
		r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
		for _, k := range kinds {
			wait := minWait
			if span > 0 {
				wait += time.Duration(r.Int64N(int64(span) + 1))
			}
			plan = append(plan, Fault{Wait: wait, Kind: k, Instance: r.IntN(1 << 16)})
		}
	}
	return plan
}

// ChaosEvent is what one fault did.
type ChaosEvent struct {
	Fault
	// Victim names the part killed: "worker-2", "nats-n1", "clickhouse-replica1".
	Victim string `json:"victim"`
	// Pid is the victim's process id when it was killed.
	Pid int `json:"pid"`
	// At is when it was killed.
	At time.Time `json:"at"`
	// Recovered is how long the part took to run again (and, for a NATS node, the
	// cluster to be healthy again); 0 when it did not.
	Recovered time.Duration `json:"recovered_ns"`
	// Err says why the fault could not be done or the part did not come back.
	Err string `json:"error,omitempty"`
}

// Recovery bounds how long Chaos waits for a killed part to come back before it reports
// the fault as not recovered and stops.
var Recovery = 3 * time.Minute

// ErrNotRecovered is returned by Chaos when a killed part did not come back in Recovery.
var ErrNotRecovered = errors.New("killed part did not come back")

// Chaos carries out plan against the stack, which Run must be supervising: one fault at
// a time, each after its Wait, then waiting until the victim runs again (a new process,
// ready; for a NATS node, the whole cluster healthy) before the next Wait begins, so
// that no two kills overlap and quorum is never lost on purpose. leader names the
// scheduler process holding the lease. record is called with every fault done. Chaos
// returns nil at the plan's end, ctx's error when it ends first, and ErrNotRecovered
// (wrapped, naming the victim) when a part stays down.
func (s *Stack) Chaos(ctx context.Context, plan []Fault, leader func(context.Context) (string, error), record func(ChaosEvent)) error {
	for !s.supervised() { // a part killed before Run supervises it would stay down
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	for _, f := range plan {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(f.Wait):
		}
		ev := s.inflict(ctx, f, leader)
		if record != nil {
			record(ev)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ev.Err != "" {
			return fmt.Errorf("chaos: %s %s: %s: %w", f.Kind, ev.Victim, ev.Err, ErrNotRecovered)
		}
	}
	return nil
}

// inflict kills f's victim and waits for it to come back.
func (s *Stack) inflict(ctx context.Context, f Fault, leader func(context.Context) (string, error)) ChaosEvent {
	ev := ChaosEvent{Fault: f}
	var (
		pid     func() int
		kill    func() error
		healthy func(context.Context) error
	)
	switch f.Kind {
	case KillNATSNode:
		i := f.Instance % s.NATS.Nodes()
		ev.Victim = fmt.Sprintf("nats-n%d", i+1)
		pid = func() int { return s.NATS.Pid(i) }
		kill = func() error { return s.NATS.Kill(i) }
		healthy = s.NATS.WaitHealthy
	case KillClickHouse:
		ch := s.CH[f.Instance%len(s.CH)]
		ev.Victim = "clickhouse-" + ch.Replica()
		pid, kill = ch.Pid, ch.Kill
		healthy = func(ctx context.Context) error { return chlocal.Ping(ctx, ch.Addr()) }
	case KillWorker, KillStore:
		var procs []*Proc
		for _, p := range s.Procs {
			if p.Target == f.Kind {
				procs = append(procs, p)
			}
		}
		if len(procs) == 0 {
			ev.Err = "the stack runs no " + f.Kind
			return ev
		}
		p := procs[f.Instance%len(procs)]
		ev.Victim = p.Name
		pid, kill = p.Pid, p.d.Kill
		healthy = func(ctx context.Context) error { return ready(ctx, p.HTTP) }
	case KillSchedulerLeader:
		name, err := leader(ctx)
		if err == nil && s.Proc(name) == nil {
			err = fmt.Errorf("lease holder %q is none of the stack's processes", name)
		}
		if err != nil {
			ev.Err = "find the scheduler leader: " + err.Error()
			return ev
		}
		p := s.Proc(name)
		ev.Victim = p.Name
		pid, kill = p.Pid, p.d.Kill
		healthy = func(ctx context.Context) error { return ready(ctx, p.HTTP) }
	default:
		ev.Err = fmt.Sprintf("unknown kind %q", f.Kind)
		return ev
	}
	ev.Pid = pid()
	ev.At = time.Now()
	if err := kill(); err != nil {
		ev.Err = "kill: " + err.Error()
		return ev
	}
	rctx, cancel := context.WithTimeout(ctx, Recovery)
	defer cancel()
	for {
		if p := pid(); p != 0 && p != ev.Pid && healthy(rctx) == nil {
			ev.Recovered = time.Since(ev.At)
			return ev
		}
		select {
		case <-rctx.Done():
			ev.Err = fmt.Sprintf("not back after %v", Recovery)
			if ctx.Err() != nil {
				ev.Err = ctx.Err().Error()
			}
			return ev
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// supervised tells whether Run supervises the stack.
func (s *Stack) supervised() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}
