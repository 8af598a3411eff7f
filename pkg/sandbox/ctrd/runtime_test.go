package ctrd_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

func TestNewRejectsBadOptions(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := ctrd.New(ctx, ctrd.Options{CgroupParent: "relative"})
	if !errors.Is(err, sandbox.ErrInvalid) {
		t.Fatalf("empty options: got %v, want ErrInvalid", err)
	}
	for _, want := range []string{"Options.Address", "Options.StateDir", "Options.CgroupParent"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
	_, err = ctrd.New(ctx, ctrd.Options{Address: filepath.Join(t.TempDir(), "no.sock"), StateDir: t.TempDir(), AgentBinary: agentBinary})
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("no daemon: got %v, want ErrUnavailable", err)
	}
}

// TestStateDirsAreSeparate: two runtimes on one daemon with different state
// directories (two workers) never list or recover each other's sandboxes.
func TestStateDirsAreSeparate(t *testing.T) {
	srv, a := start(t)
	b := open(t, srv, t.TempDir())
	defer b.Close()
	ctx := context.Background()
	h := mustCreate(t, a, sandbox.Spec{})
	hs, err := b.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 0 {
		t.Fatalf("the other runtime lists %v", hs)
	}
	if err := b.Recover(ctx, h); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("the other runtime recovers %s: %v, want ErrNotFound", h.ID, err)
	}
	if _, err := a.Create(ctx, sandbox.Spec{Image: "gauntlet.local/absent:1"}); !errors.Is(err, sandbox.ErrInvalid) || !strings.Contains(err.Error(), "image") {
		t.Fatalf("absent image: got %v, want ErrInvalid naming the image", err)
	}
}
