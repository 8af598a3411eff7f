package sandbox

import (
	"context"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
)

// StorageFaulter is the optional ability to apply storage faults to the file
// operations of the commands a sandbox runs, through a filesystem layer between the
// sandbox and its workspace (both runtimes: a FUSE passthrough, package faultfuse).
// Every operation is decided by gate with the same ops and stream keys as the file tools'
// own gate, so a seed gives the same faults to the same operations made either way; the
// gate's onFire receives every fault that fires during a command, from the layer's own
// goroutines, and its wait spends the delays (nil: on the wall clock).
//
// Attaching costs a mount and slows every file operation of later commands, so callers
// attach only when an episode's plan has storage faults. It lasts until Detach or
// Destroy; the host-side paths to the workspace (WorkspaceDir) are never faulted.
type StorageFaulter interface {
	// AttachStorageFaults routes the workspace of sandbox id's later commands through
	// gate, replacing a gate attached before.
	AttachStorageFaults(ctx context.Context, id string, gate *faultfs.Gate) error
	// DetachStorageFaults removes the layer; commands see the workspace directly again.
	// Detaching a sandbox with nothing attached does nothing.
	DetachStorageFaults(ctx context.Context, id string) error
}
