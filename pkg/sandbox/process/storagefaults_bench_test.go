//go:build linux

package process_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/plans"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// BenchmarkShellExecStorageLayer: the cost of the storage-fault FUSE layer on
// shell.exec round trips, side by side with the plain workspace: a small command (write
// and read back one file) and a read of 1,000 files of 1 KiB (cat of every file). The
// layer's gate holds a rule that matches none of these paths, so every operation pays the
// FUSE round trip and a decision but no injected fault. Run with:
//
//	go test -run '^$' -bench ShellExecStorageLayer -benchtime 20x ./pkg/sandbox/process/
func BenchmarkShellExecStorageLayer(b *testing.B) {
	rt := benchRuntime(b)
	ctx := context.Background()
	_, rules, err := plans.ParseSpec([]byte("name: elsewhere\nfaults:\n  - {id: full, kind: disk_full, match: {paths: [\"/elsewhere/*\"]}}\n"))
	if err != nil {
		b.Fatal(err)
	}
	data := []byte(strings.Repeat("x", 1023) + "\n")
	var files []sandbox.File
	for i := range 1000 {
		files = append(files, sandbox.File{Path: fmt.Sprintf("d%02d/f%03d", i/50, i), Data: data})
	}
	for _, layer := range []string{"plain", "fuse"} {
		h := must(rt.Create(ctx, sandbox.Spec{Workspace: files}))(b)
		if layer == "fuse" {
			gate := faultfs.NewGate(inject.NewDecider(1, rules), nil, nil)
			if err := rt.AttachStorageFaults(ctx, h.ID, gate); err != nil {
				b.Fatalf("attach (FUSE must mount here): %v", err)
			}
		}
		tb := tools.New(rt, h.ID, tools.Options{})
		for _, c := range []struct{ name, cmd, want string }{
			{"small", "echo x > f && cat f", "x\n"},
			{"read1000", "cat d*/f* | wc -c", "1024000\n"},
		} {
			b.Run(c.name+"/"+layer, func(b *testing.B) {
				var s samples
				for b.Loop() {
					s.time(func() {
						res, err := tb.Exec(ctx, tools.ExecArgs{Command: c.cmd})
						if err != nil || res.Stdout != c.want {
							b.Fatalf("%q: %v %q %q", c.cmd, err, res.Stdout, res.Stderr)
						}
					})
				}
				s.report(b)
			})
		}
	}
}
