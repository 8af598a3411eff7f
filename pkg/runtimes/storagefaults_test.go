package runtimes_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/catalogue"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

const commandStorageSpec = `name: bad-disk
faults:
  - {id: full, kind: disk_full, match: {paths: ["/full/*"]}}
  - {id: ro, kind: read_only, match: {paths: ["/ro/*"]}}
  - {id: slow, kind: io_latency, match: {paths: ["/slow/*"], ops: [read]}, params: {mean_ms: 150, jitter_ms: 0}}
  - {id: coin, kind: disk_full, probability: 0.5, match: {paths: ["/coin/*"], ops: [create]}}
`

// TestCommandStorageFaults (B1, B2, B4): on both real runtimes (sandbox.StorageFaulter),
// shell.exec commands meet the storage faults through the FUSE layer: ENOSPC on
// `echo x > f`, EROFS on `touch`, io_latency on `cat`; ordinary commands work; after
// detaching no fault and no FUSE mount is left; and the same commands on the same seed
// fire the same faults on both runtimes.
func TestCommandStorageFaults(t *testing.T) {
	_, rules, err := plans.ParseSpec([]byte(commandStorageSpec))
	if err != nil {
		t.Fatal(err)
	}
	var traces [][]string
	for _, name := range []string{runtimes.Process, runtimes.Containerd} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			rt := runtimestest.Open(t, name, 0).Runtime()
			h, err := rt.Create(ctx, sandbox.Spec{Workspace: []sandbox.File{
				{Path: "full/.keep"}, {Path: "ro/keep.txt", Data: []byte("keep\n")},
				{Path: "slow/a.txt", Data: []byte("slow\n")}, {Path: "coin/.keep"},
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Destroy(ctx, h.ID)
			var mu sync.Mutex
			var fired []string
			gate := faultfs.NewGate(inject.NewDecider(7, rules), func(_ string, ev catalogue.Event, fs []catalogue.Fired) {
				mu.Lock()
				defer mu.Unlock()
				for _, f := range fs {
					fired = append(fired, f.RuleID+" "+ev.Op+" "+ev.Path)
				}
			}, nil)
			take := func() []string {
				mu.Lock()
				defer mu.Unlock()
				out := fired
				fired = nil
				return out
			}
			sf, ok := rt.(sandbox.StorageFaulter)
			if !ok {
				t.Fatalf("runtime %s cannot apply storage faults to commands", name)
			}
			if err := sf.AttachStorageFaults(ctx, h.ID, gate); err != nil {
				t.Fatalf("attach (FUSE must mount here): %v", err)
			}
			tb := tools.New(rt, h.ID, tools.Options{})
			run := func(cmd string) tools.ExecResult {
				t.Helper()
				res, err := tb.Exec(ctx, tools.ExecArgs{Command: cmd})
				if err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
				return res
			}
			var trace []string
			if res := run("echo x > full/f"); res.ExitCode == 0 || !strings.Contains(strings.ToLower(res.Stderr), "no space left on device") {
				t.Errorf("echo x > full/f: exit %d %q, want ENOSPC", res.ExitCode, res.Stderr)
			}
			trace = append(trace, take()...)
			if res := run("touch ro/new"); res.ExitCode == 0 || !strings.Contains(strings.ToLower(res.Stderr), "read-only file system") {
				t.Errorf("touch ro/new: exit %d %q, want EROFS", res.ExitCode, res.Stderr)
			}
			trace = append(trace, take()...)
			start := time.Now()
			if res := run("cat slow/a.txt"); res.Stdout != "slow\n" {
				t.Errorf("cat slow/a.txt: %q %q", res.Stdout, res.Stderr)
			}
			if d := time.Since(start); d < 150*time.Millisecond { // at least one read of 150 ms (busybox's cat makes one, coreutils' two); a lower bound only
				t.Errorf("cat under io_latency took %v", d)
			}
			take() // how many reads cat makes is the cat's (coreutils or busybox)
			if res := run("for i in 1 2 3 4 5 6 7 8 9 10 11 12; do echo $i > coin/f$i || true; done 2>/dev/null; mkdir -p d && echo ok > d/ok && mv d/ok d/ok2 && cat d/ok2"); res.Stdout != "ok\n" {
				t.Errorf("ordinary commands: %q %q", res.Stdout, res.Stderr)
			}
			trace = append(trace, take()...)
			if err := sf.DetachStorageFaults(ctx, h.ID); err != nil {
				t.Fatal(err)
			}
			if res := run("echo y > full/g && cat full/g && grep -c ' fuse' /proc/self/mountinfo || true"); res.Stdout != "y\n0\n" {
				t.Errorf("after detach: %q %q", res.Stdout, res.Stderr)
			}
			if got := take(); len(got) != 0 {
				t.Errorf("fired %q after detach", got)
			}
			t.Logf("%s fired %q", name, trace)
			traces = append(traces, trace)
		})
	}
	if len(traces) == 2 && !slices.Equal(traces[0], traces[1]) {
		t.Errorf("the runtimes fired different faults for the same commands:\n%q\n%q", traces[0], traces[1])
	}
}
