package runtimes_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/sandboxtest"
)

// TestStorageFaults runs the storage-fault suite (package sandboxtest) on both real
// runtimes: the file tools, through both of their backends, and the commands, through
// the runtime's FUSE layer (sandbox.StorageFaulter), meet each storage fault; and the same
// seed and the same calls fire exactly the same faults on both runtimes.
func TestStorageFaults(t *testing.T) {
	var traces []sandboxtest.StorageTrace
	names := []string{runtimes.Process, runtimes.Containerd}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			rt := runtimestest.Open(t, name, 0).Runtime()
			tr := sandboxtest.StorageFaults(t, rt)
			if tr.Commands == nil {
				t.Errorf("runtime %s cannot apply storage faults to commands", name)
			}
			t.Logf("%s fired %d faults in the tools, %q in the commands", name, len(tr.Tools), tr.Commands)
			traces = append(traces, tr)
		})
	}
	if len(traces) != len(names) {
		if testing.Short() {
			t.Skip("compares both runtimes; -short does not start containerd")
		}
		t.Fatalf("%d of %d runtimes finished", len(traces), len(names))
	}
	if !slices.Equal(traces[0].Tools, traces[1].Tools) {
		t.Errorf("the tools fired different faults on %s and %s:\n%s\n---\n%s", names[0], names[1],
			strings.Join(traces[0].Tools, "\n"), strings.Join(traces[1].Tools, "\n"))
	}
	if !slices.Equal(traces[0].Commands, traces[1].Commands) {
		t.Errorf("the runtimes fired different faults for the same commands:\n%q\n%q", traces[0].Commands, traces[1].Commands)
	}
}
