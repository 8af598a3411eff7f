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
// host process listens (ListenService setns-es into /proc/<task pid>/ns/net), and where
// the host answers the sandbox's name server at 127.0.0.53:53 (ListenResolver). The
// container gets an /etc/hosts (localhost, sandbox), an /etc/nsswitch.conf (hosts: files
// dns) and an /etc/resolv.conf naming that server, bound read-only from the sandbox's
// state directory, so the service names resolve through DNS, where DNS faults apply;
// and the services' <NAME>_ADDR / <NAME>_URL variables. Restore restarts the
// task in a new namespace: listeners from before it are dead, listen again.

// serviceEtc are the /etc files of a sandbox with services, by name.
func serviceEtc() map[string]string {
	return map[string]string{"hosts": sandbox.HostsFile(), "nsswitch.conf": sandbox.NsswitchConf(), "resolv.conf": sandbox.ResolvConf()}
}

// writeHosts writes the /etc files of a sandbox with services into its state directory.
func (r *Runtime) writeHosts(spec sandbox.Spec) error {
	if len(spec.Services) == 0 {
		return nil
	}
	for name, body := range serviceEtc() {
		if err := os.WriteFile(filepath.Join(r.sandboxDir(spec.ID), name), []byte(body), 0o644); err != nil {
			return fmt.Errorf("services: %w", err)
		}
	}
	return nil
}

// serviceMounts are the mounts of those files (none without services).
func (r *Runtime) serviceMounts(spec sandbox.Spec) []specs.Mount {
	if len(spec.Services) == 0 {
		return nil
	}
	var out []specs.Mount
	for _, name := range []string{"hosts", "nsswitch.conf", "resolv.conf"} {
		out = append(out, specs.Mount{
			Destination: "/etc/" + name,
			Type:        "bind",
			Source:      filepath.Join(r.sandboxDir(spec.ID), name),
			Options:     []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
		})
	}
	return out
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

var _ sandbox.ResolverListener = (*Runtime)(nil)

// ListenResolver implements sandbox.ResolverListener: the name server's UDP and TCP
// sockets at 127.0.0.53:53 inside the network namespace of the sandbox's task.
func (r *Runtime) ListenResolver(ctx context.Context, id string) (net.PacketConn, net.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	b, err := r.get("listen resolver", id)
	if err != nil {
		return nil, nil, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone || b.task == nil {
		return nil, nil, fmt.Errorf("listen resolver %s: %w", id, sandbox.ErrNotFound)
	}
	if len(b.handle.Spec.Services) == 0 {
		return nil, nil, fmt.Errorf("listen resolver %s: %w: the sandbox declares no services", id, sandbox.ErrInvalid)
	}
	ns := fmt.Sprintf("/proc/%d/ns/net", b.task.Pid())
	addr := net.JoinHostPort(sandbox.ResolverIP, strconv.Itoa(sandbox.ResolverPort))
	pc, err := netns.ListenPacket(ns, "udp", addr)
	if err != nil {
		return nil, nil, err
	}
	l, err := netns.Listen(ns, "tcp", addr)
	if err != nil {
		_ = pc.Close()
		return nil, nil, err
	}
	return pc, l, nil
}

var _ sandbox.RefusalWatcher = (*Runtime)(nil)

// WatchRefusals implements sandbox.RefusalWatcher in the network namespace of the sandbox's
// task. Restore restarts the task in a new namespace: watch again after it.
func (r *Runtime) WatchRefusals(ctx context.Context, id string) (*os.File, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := r.get("watch refusals", id)
	if err != nil {
		return nil, err
	}
	b.op.Lock()
	defer b.op.Unlock()
	if b.gone || b.task == nil {
		return nil, fmt.Errorf("watch refusals %s: %w", id, sandbox.ErrNotFound)
	}
	if len(b.handle.Spec.Services) == 0 {
		return nil, fmt.Errorf("watch refusals %s: %w: the sandbox declares no services", id, sandbox.ErrInvalid)
	}
	return netns.WatchRefusals(fmt.Sprintf("/proc/%d/ns/net", b.task.Pid()))
}

var _ sandbox.HostMapper = (*Runtime)(nil)

// HostUpstream implements sandbox.HostMapper with Options.Hosts.
func (r *Runtime) HostUpstream(name string, port int) (string, bool) {
	return r.opts.Hosts.HostUpstream(name, port)
}

// HostPorts implements sandbox.HostMapper with Options.Hosts.
func (r *Runtime) HostPorts(name string) []int { return r.opts.Hosts.HostPorts(name) }

// HostTCPPorts implements sandbox.HostMapper with Options.Hosts.
func (r *Runtime) HostTCPPorts(name string) []int { return r.opts.Hosts.HostTCPPorts(name) }

var _ sandbox.Dialer = (*Runtime)(nil)

// DialSandbox implements sandbox.Dialer: a connection to 127.0.0.1:port in the network
// namespace of the sandbox's task, which every command of the sandbox shares (loopback
// only, whether or not the sandbox declares services). A server started with ExecStream
// is reached this way while it runs: the dial does not wait for the sandbox's op lock,
// which the streaming command holds.
func (r *Runtime) DialSandbox(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial %s: %w: port %d must be 1-65535", id, sandbox.ErrInvalid, port)
	}
	b, err := r.get("dial", id)
	if err != nil {
		return nil, err
	}
	pid := b.pid.Load()
	if pid == 0 {
		return nil, fmt.Errorf("dial %s: %w: the sandbox has no running task", id, sandbox.ErrNotFound)
	}
	return netns.Dial(ctx, "/proc/"+strconv.FormatInt(pid, 10)+"/ns/net", "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}
