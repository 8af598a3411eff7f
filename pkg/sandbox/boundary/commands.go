package boundary

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// Storage faults for the agent's commands: when the plan has storage faults and the
// runtime is a sandbox.StorageFaulter (process, containerd), the layer attaches a second
// gate, which the runtime's filesystem layer (package faultfuse) passes every file
// operation of a shell.exec command through. Its Decider is the file tools' one as it
// was when the episode began (same seed, rules, ops and stream keys), counting on its
// own: the n-th operation of the agent's commands on a file meets what the n-th
// file-tool operation on that file meets, and neither shifts the other's draws, so the
// file tools meet the same faults on a runtime with the layer as on one without. The
// faults that fire during a command become FaultFired events of the step that ran it
// (target "<target>/shell.exec", detail "<op> <path>: <what>", at the virtual time the
// command ran), like the file tools'. The layer spends delays on the wall clock while the
// command runs: they lengthen the command (it may time out) but, like the command's own
// run time, not its virtual cost, so the virtual clock stays the same on any machine.

// cmdFaults collects what the runtime's gate fires during one command. The runtime
// calls it from its own goroutines.
type cmdFaults struct {
	d     *inject.Decider
	mu    sync.Mutex
	fired []firedOp
}

type firedOp struct {
	op, path string
	f        catalogue.Fired
}

func (c *cmdFaults) onFire(_ string, ev catalogue.Event, fired []catalogue.Fired) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range fired {
		c.fired = append(c.fired, firedOp{ev.Op, ev.Path, f})
	}
}

// take returns and forgets what fired since the last take.
func (c *cmdFaults) take() []firedOp {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.fired
	c.fired = nil
	return f
}

// attachCommands attaches the runtime's storage-fault layer, deciding with d, to the
// sandbox when the plan has storage faults (d not nil) and the runtime can apply them to
// commands; otherwise commands meet no storage fault and nothing is mounted (it costs
// every file operation).
func (l *Layer) attachCommands(ctx context.Context, d *inject.Decider) error {
	l.cmd = nil
	if d == nil {
		return nil
	}
	sf, ok := l.rt.(sandbox.StorageFaulter)
	if !ok {
		return nil
	}
	c := &cmdFaults{d: d}
	if err := sf.AttachStorageFaults(ctx, l.sb, faultfs.NewGate(d, c.onFire, nil)); err != nil {
		return fmt.Errorf("%s: storage faults for commands: %w", l.env, err)
	}
	l.cmd = c
	return nil
}

// detachCommands removes the runtime's storage-fault layer.
func (l *Layer) detachCommands(ctx context.Context) error {
	if l.cmd == nil {
		return nil
	}
	l.cmd = nil
	if err := l.rt.(sandbox.StorageFaulter).DetachStorageFaults(ctx, l.sb); err != nil {
		return fmt.Errorf("%s: detach storage faults of %s: %w", l.env, l.sb, err)
	}
	return nil
}

// CommandDone moves what fired during the command that just ran, at virtual time at,
// into the call's faults (Fired).
func (l *Layer) CommandDone(at time.Duration) {
	if l.cmd == nil {
		return
	}
	for _, f := range l.cmd.take() {
		l.fired = append(l.fired, &gauntletv1.FaultFired{
			FaultId: f.f.RuleID, Kind: f.f.Kind, Target: l.target + "/" + tools.ShellExec,
			Detail: f.op + " " + f.path + ": " + f.f.Detail, AtVirtualNs: int64(at),
		})
	}
}
