//go:build linux

package faultfuse_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/faults/faultfs"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/faultfuse"
)

// BenchmarkBeginEnd: what a command pays for the layer before any file operation: the
// shadow bind, the FUSE mount and its server, then the unmounts.
//
//	go test -run '^$' -bench BeginEnd -benchtime 200x ./pkg/sandbox/faultfuse/
func BenchmarkBeginEnd(b *testing.B) {
	dir := b.TempDir()
	ws, mnt, shadow := filepath.Join(dir, "ws"), filepath.Join(dir, "mnt"), filepath.Join(dir, "shadow")
	for _, d := range []string{ws, mnt, shadow} {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	l, err := faultfuse.New(faultfuse.Config{Workspace: ws, Mountpoint: mnt, Shadow: shadow, Gate: faultfs.NewGate(inject.NewDecider(1, nil), nil, nil)})
	if err != nil {
		b.Fatalf("FUSE unavailable here: %v", err)
	}
	defer l.Close()
	for b.Loop() {
		if err := l.Begin(); err != nil {
			b.Fatal(err)
		}
		if err := l.End(); err != nil {
			b.Fatal(err)
		}
	}
}
