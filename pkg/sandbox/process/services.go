//go:build linux

package process

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/netns"
)

var _ sandbox.ServiceListener = (*Runtime)(nil)

// A sandbox that declares services (Spec.Services) gets a network namespace of its own,
// pinned under <StateDir>/netns/<id> for the sandbox's life, instead of bwrap's fresh one
// per exec: the host process listens inside it (ListenService) and every exec joins it
// (nsenter, as root, before dropping privileges). It holds lo alone, like bwrap's; it is
// owned by the host's user namespace, so the sandbox (in a user namespace of its own,
// without capabilities) can use it but not reconfigure it, nor bind the name server's
// port. Its /etc/nsswitch.conf (<StateDir>/netns/<id>.nsswitch) sends host lookups to
// /etc/hosts and then DNS, and /etc/resolv.conf (every process sandbox's) names the
// name server at 127.0.0.53, which the host answers (ListenResolver): the service names
// resolve there, where DNS faults apply.

func (r *Runtime) netnsPath(id string) string    { return r.path("netns", id) }
func (r *Runtime) nsswitchPath(id string) string { return r.path("netns", id+".nsswitch") }

// setupServices creates the network namespace and nsswitch.conf of a sandbox with services;
// it does nothing for one without.
func (r *Runtime) setupServices(spec sandbox.Spec) error {
	if len(spec.Services) == 0 {
		return nil
	}
	if r.nsenter == "" {
		return fmt.Errorf("%w: services: nsenter (util-linux) not found in PATH", sandbox.ErrUnavailable)
	}
	if err := os.MkdirAll(r.path("netns"), 0o711); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if err := os.WriteFile(r.nsswitchPath(spec.ID), []byte(sandbox.NsswitchConf()), 0o644); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	if netns.Pinned(r.netnsPath(spec.ID)) {
		return nil // recovered: still there
	}
	_ = os.Remove(r.netnsPath(spec.ID))
	if err := netns.Create(r.netnsPath(spec.ID)); err != nil {
		return fmt.Errorf("services: %w", err)
	}
	return nil
}

// teardownServices unpins the sandbox's network namespace, if it has one.
func (r *Runtime) teardownServices(id string) error {
	err := netns.Remove(r.netnsPath(id))
	if rerr := os.Remove(r.nsswitchPath(id)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
		err = errors.Join(err, rerr)
	}
	return err
}

// etcFile is the host file shown at /etc/<name> in the sandbox.
func (r *Runtime) etcFile(spec sandbox.Spec, name string) string {
	if name == "nsswitch.conf" && len(spec.Services) > 0 {
		return r.nsswitchPath(spec.ID)
	}
	return r.path("etc", name)
}

// netArgs are the launcher's network arguments: join the sandbox's pinned namespace
// (services) or let bwrap make a fresh loopback-only one.
func (r *Runtime) netArgs(spec sandbox.Spec) (prefix []string, bwrapNet []string) {
	if len(spec.Services) > 0 {
		return []string{r.nsenter, "--net=" + r.netnsPath(spec.ID), "--"}, nil
	}
	return nil, []string{"--unshare-net"}
}

// ListenService implements sandbox.ServiceListener: a listener on 127.0.0.1:port inside
// the sandbox's network namespace.
func (r *Runtime) ListenService(ctx context.Context, id string, port int) (net.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := r.get("listen", id)
	if err != nil {
		return nil, err
	}
	if _, ok := sandbox.ServiceByPort(b.rec.Handle.Spec.Services, port); !ok {
		return nil, fmt.Errorf("listen %s: %w: port %d: %w", id, sandbox.ErrInvalid, port, sandbox.ErrNotDeclared)
	}
	return netns.Listen(r.netnsPath(id), "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

var _ sandbox.RefusalWatcher = (*Runtime)(nil)

// WatchRefusals implements sandbox.RefusalWatcher in the sandbox's pinned network namespace.
func (r *Runtime) WatchRefusals(ctx context.Context, id string) (*os.File, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	b, err := r.get("watch refusals", id)
	if err != nil {
		return nil, err
	}
	if len(b.rec.Handle.Spec.Services) == 0 {
		return nil, fmt.Errorf("watch refusals %s: %w: the sandbox declares no services", id, sandbox.ErrInvalid)
	}
	return netns.WatchRefusals(r.netnsPath(id))
}

// lookNsenter finds nsenter; "" when missing (only sandboxes with services need it).
func lookNsenter() string {
	for _, p := range []string{"nsenter", "/usr/bin/nsenter", "/bin/nsenter"} {
		if abs, err := exec.LookPath(p); err == nil {
			if abs, err := filepath.Abs(abs); err == nil {
				return abs
			}
		}
	}
	return ""
}

var _ sandbox.ResolverListener = (*Runtime)(nil)

// ListenResolver implements sandbox.ResolverListener: the name server's UDP and TCP
// sockets at 127.0.0.53:53 inside the sandbox's network namespace.
func (r *Runtime) ListenResolver(ctx context.Context, id string) (net.PacketConn, net.Listener, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	b, err := r.get("listen resolver", id)
	if err != nil {
		return nil, nil, err
	}
	if len(b.rec.Handle.Spec.Services) == 0 {
		return nil, nil, fmt.Errorf("listen resolver %s: %w: the sandbox declares no services", id, sandbox.ErrInvalid)
	}
	addr := net.JoinHostPort(sandbox.ResolverIP, strconv.Itoa(sandbox.ResolverPort))
	pc, err := netns.ListenPacket(r.netnsPath(id), "udp", addr)
	if err != nil {
		return nil, nil, err
	}
	l, err := netns.Listen(r.netnsPath(id), "tcp", addr)
	if err != nil {
		_ = pc.Close()
		return nil, nil, err
	}
	return pc, l, nil
}

var _ sandbox.Dialer = (*Runtime)(nil)

// DialSandbox implements sandbox.Dialer: a connection to 127.0.0.1:port in the network of
// the sandbox's declared services, or else in that of its running ExecStream command
// (bwrap gives every command a network of its own; the command's init holds it).
func (r *Runtime) DialSandbox(ctx context.Context, id string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("dial %s: %w: port %d must be 1-65535", id, sandbox.ErrInvalid, port)
	}
	b, err := r.get("dial", id)
	if err != nil {
		return nil, err
	}
	ns := r.netnsPath(id)
	if len(b.rec.Handle.Spec.Services) == 0 {
		pid := b.streamInit.Load()
		if pid == 0 {
			return nil, fmt.Errorf("dial %s: %w: no network to dial into: the sandbox declares no services and runs no ExecStream command", id, sandbox.ErrInvalid)
		}
		ns = "/proc/" + strconv.FormatInt(pid, 10) + "/ns/net"
	}
	return netns.Dial(ctx, ns, "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
}

var _ sandbox.HostMapper = (*Runtime)(nil)

// HostUpstream implements sandbox.HostMapper with Config.Hosts.
func (r *Runtime) HostUpstream(name string, port int) (string, bool) {
	return r.cfg.Hosts.HostUpstream(name, port)
}

// HostPorts implements sandbox.HostMapper with Config.Hosts.
func (r *Runtime) HostPorts(name string) []int { return r.cfg.Hosts.HostPorts(name) }

// HostTCPPorts implements sandbox.HostMapper with Config.Hosts.
func (r *Runtime) HostTCPPorts(name string) []int { return r.cfg.Hosts.HostTCPPorts(name) }
