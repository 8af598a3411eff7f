package ctrd

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/netns"
)

var _ sandbox.ServiceListener = (*Runtime)(nil)

// Services (Spec.Services): the task's own network namespace (loopback only) is where the
// host process listens (ListenService setns-es into /proc/<task pid>/ns/net); the
// container gets an /etc/hosts naming the services (bound read-only from the sandbox's
// state directory) and their <NAME>_ADDR / <NAME>_URL variables. Restore restarts the
// task in a new namespace: listeners from before it are dead, listen again.

func (r *Runtime) hostsPath(id string) string { return filepath.Join(r.sandboxDir(id), "hosts") }

// writeHosts writes the hosts file of a sandbox with services.
func (r *Runtime) writeHosts(spec sandbox.Spec) error {
	if len(spec.Services) == 0 {
		return nil
	}
	if err := os.WriteFile(r.hostsPath(spec.ID), []byte(sandbox.HostsFile(spec.Services)), 0o644); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	return nil
}

// serviceMounts is the hosts file's mount (none without services).
func (r *Runtime) serviceMounts(spec sandbox.Spec) []specs.Mount {
	if len(spec.Services) == 0 {
		return nil
	}
	return []specs.Mount{{
		Destination: "/etc/hosts",
		Type:        "bind",
		Source:      r.hostsPath(spec.ID),
		Options:     []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
	}}
}

// ListenService implements sandbox.ServiceListener: a listener on 127.0.0.1:port inside
// the network namespace of the sandbox's task.
func (r *Runtime) ListenService(ctx context.Context, id string, port int) (net.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := r.get("listen", id)
	if err != nil {
		return nil, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone || b.task == nil {
		return nil, fmt.Errorf("listen %s: %w", id, sandbox.ErrNotFound)
	}
	if _, ok := sandbox.ServiceByPort(b.handle.Spec.Services, port); !ok {
		return nil, fmt.Errorf("listen %s: %w: port %d: %w", id, sandbox.ErrInvalid, port, sandbox.ErrNotDeclared)
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", b.task.Pid())
	return netns.Listen(ns, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}
