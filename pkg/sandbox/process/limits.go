package process

import (
	"context"
	"fmt"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// UpdateLimits implements sandbox.LimitUpdater: it writes the sandbox's cgroup knobs
// (v2: memory.max, pids.max, cpu.max; v1: memory.limit_in_bytes and
// memory.memsw.limit_in_bytes, pids.max, cpu.cfs_quota_us) while it exists, between or
// during commands: a running command feels the change at once. Zero fields keep their
// current value; OpenFiles and DiskBytes cannot change (they are set when a command or
// the workspace starts). The limits the sandbox was created with (its Spec, which forks
// inherit) stay as they were.
//
// Lowering the memory limit below what the sandbox uses makes the kernel reclaim; on
// cgroup v1 the write fails with EBUSY when it cannot, and the error says so.
func (r *Runtime) UpdateLimits(ctx context.Context, id string, l sandbox.Limits) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("update limits %s: %w", id, err)
	}
	if err := (sandbox.Spec{Limits: l}).Validate(); err != nil {
		return fmt.Errorf("update limits %s: %w", id, err)
	}
	b, err := r.get("update limits", id)
	if err != nil {
		return err
	}
	b.lmu.Lock()
	defer b.lmu.Unlock()
	cur := b.limits
	if cur == (sandbox.Limits{}) {
		cur = b.rec.Handle.Spec.Limits
	}
	if l.OpenFiles != 0 && l.OpenFiles != cur.OpenFiles {
		return fmt.Errorf("update limits %s: %w: limits.open_files cannot change while the sandbox exists", id, sandbox.ErrUnsupported)
	}
	if l.DiskBytes != 0 && l.DiskBytes != cur.DiskBytes {
		return fmt.Errorf("update limits %s: %w: limits.disk_bytes cannot change while the sandbox exists", id, sandbox.ErrUnsupported)
	}
	next := cur
	if l.MemoryBytes != 0 {
		next.MemoryBytes = l.MemoryBytes
	}
	if l.Pids != 0 {
		next.Pids = l.Pids
	}
	if l.CPUMillis != 0 {
		next.CPUMillis = l.CPUMillis
	}
	if err := b.cg.setLimits(next, true); err != nil {
		return fmt.Errorf("update limits %s: cgroup %s: %w", id, b.cg.rel, err)
	}
	b.limits, b.cpuSet = next, true
	return nil
}

// ensureCPU writes the CPU quota in force before the sandbox's first command (create
// leaves it out: see cgroup.setLimits).
func (b *box) ensureCPU() error {
	b.lmu.Lock()
	defer b.lmu.Unlock()
	if b.cpuSet {
		return nil
	}
	l := b.limits
	if l == (sandbox.Limits{}) {
		l = b.rec.Handle.Spec.Limits
	}
	if err := b.cg.setCPU(l.CPUMillis); err != nil {
		return fmt.Errorf("cgroup %s: cpu quota: %w", b.cg.rel, err)
	}
	b.cpuSet = true
	return nil
}

// liveLimits returns the limits in force: those UpdateLimits last wrote, else spec's.
func (b *box) liveLimits(spec sandbox.Limits) sandbox.Limits {
	b.lmu.Lock()
	defer b.lmu.Unlock()
	if b.limits != (sandbox.Limits{}) {
		return b.limits
	}
	return spec
}

// The optional abilities resource faults use.
var (
	_ sandbox.LimitUpdater = (*Runtime)(nil)
	_ sandbox.ClockSkewer  = (*Runtime)(nil)
)
