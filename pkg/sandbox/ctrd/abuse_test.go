package ctrd_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd"
)

func sh(script string, timeout time.Duration) sandbox.ExecRequest {
	return sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: timeout}
}

func run(t *testing.T, rt *ctrd.Runtime, id string, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	res, err := rt.Exec(context.Background(), id, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Argv, err)
	}
	return res
}

func kinds(res sandbox.ExecResult) []sandbox.EventKind {
	var out []sandbox.EventKind
	for _, e := range res.Events {
		out = append(out, e.Kind)
	}
	return out
}

// alive fails t unless the sandbox still runs commands normally.
// hasEvent says whether res has an event of kind whose detail contains what.
func hasEvent(res sandbox.ExecResult, kind sandbox.EventKind, what string) bool {
	return slices.ContainsFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == kind && strings.Contains(e.Detail, what) })
}

func alive(t *testing.T, rt *ctrd.Runtime, id string) {
	t.Helper()
	res := run(t, rt, id, sh("echo alive", 10*time.Second))
	if res.ExitCode != 0 || string(res.Stdout) != "alive\n" {
		t.Fatalf("sandbox %s after the abuse: exit %d stdout %q stderr %q", id, res.ExitCode, res.Stdout, res.Stderr)
	}
}

// TestAbuseContained runs each hostile behaviour the issue lists that applies to a
// container in its own sandbox, next to a bystander sandbox, and checks that it is
// contained, reported as a safety event where the runtime can see it, and harms
// neither the sandbox's later commands nor the bystander.
func TestAbuseContained(t *testing.T) {
	_, rt := start(t)
	bystander := mustCreate(t, rt, sandbox.Spec{})
	run(t, rt, bystander.ID, sh("echo secret-of-bystander > secret", 10*time.Second))
	ctx := context.Background()

	t.Run("ForkBomb", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{Pids: 32}})
		res := run(t, rt, h.ID, sh("b() { b | b & }; b; sleep 2", 20*time.Second))
		if !slices.Contains(kinds(res), sandbox.EventPidsLimit) {
			t.Fatalf("fork bomb under pids=32: events %v, want %s", res.Events, sandbox.EventPidsLimit)
		}
		st, err := rt.Stats(ctx, h.ID)
		if err != nil || st.Pids != 0 {
			t.Fatalf("after the fork bomb: %d processes left (%v), want 0", st.Pids, err)
		}
		alive(t, rt, h.ID)
	})

	t.Run("MemoryBomb", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 48 << 20}})
		res := run(t, rt, h.ID, sh("x=a; while :; do x=$x$x; done", 30*time.Second))
		if res.ExitCode == 0 || !slices.Contains(kinds(res), sandbox.EventOOMKill) {
			t.Fatalf("memory bomb: exit %d events %v, want a kill and %s", res.ExitCode, res.Events, sandbox.EventOOMKill)
		}
		if res.Metering.PeakMemoryBytes > 48<<20 {
			t.Fatalf("peak memory %d above the 48 MiB limit", res.Metering.PeakMemoryBytes)
		}
		alive(t, rt, h.ID)
	})

	t.Run("InfiniteLoop", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{CPUMillis: 100}})
		// 2 s, not 0.7: the exec's start (shim, runc) came near 0.7 s in a CI run and left
		// the loop no whole quota period to be throttled in.
		res := run(t, rt, h.ID, sh("while :; do :; done", 2*time.Second))
		got := kinds(res)
		if !res.TimedOut || !slices.Contains(got, sandbox.EventTimeout) || !slices.Contains(got, sandbox.EventCPUThrottled) {
			t.Fatalf("busy loop under 0.1 CPU: timed out %v events %v, want %s and %s", res.TimedOut, res.Events, sandbox.EventTimeout, sandbox.EventCPUThrottled)
		}
		// 0.1 CPU for 2 s is 200 ms of CPU; allow scheduling slack, not a whole core.
		if res.Metering.CPUTime > time.Second {
			t.Fatalf("busy loop used %v of CPU under a 0.1 CPU quota", res.Metering.CPUTime)
		}
		alive(t, rt, h.ID)
	})

	t.Run("DiskFill", func(t *testing.T) {
		// The test daemon's root is a tmpfs: what the sandbox writes is memory charged
		// to its cgroup, so the fill ends at the memory limit, far below the host's disk.
		h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 64 << 20}})
		res := run(t, rt, h.ID, sh("dd if=/dev/zero of=fill bs=1M count=1024", 60*time.Second))
		if res.ExitCode == 0 {
			t.Fatalf("writing 1 GiB under a 64 MiB limit succeeded")
		}
		if !slices.Contains(kinds(res), sandbox.EventOOMKill) && !strings.Contains(string(res.Stderr), "space") && !strings.Contains(string(res.Stderr), "memory") {
			t.Fatalf("disk fill: exit %d events %v stderr %q: want an OOM kill or a write error", res.ExitCode, res.Events, res.Stderr)
		}
		res = run(t, rt, h.ID, sh("wc -c < fill; rm fill", 10*time.Second))
		var n int64
		fmt.Sscan(string(res.Stdout), &n)
		if n > 64<<20 {
			t.Fatalf("the sandbox wrote %d bytes under a 64 MiB limit", n)
		}
		alive(t, rt, h.ID)
	})

	t.Run("DevMemAndMknod", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{})
		// /dev/mem, /dev/kmem and /dev/port are empty decoys: not a byte, and every
		// open is a device_access event.
		for _, dev := range []string{"mem", "kmem", "port"} {
			res := run(t, rt, h.ID, sh(fmt.Sprintf("test $(head -c 1 /dev/%s | wc -c) -gt 0", dev), 10*time.Second))
			if res.ExitCode == 0 {
				t.Errorf("read a byte of /dev/%s", dev)
			}
			if !hasEvent(res, sandbox.EventDeviceAccess, "/dev/"+dev) {
				t.Errorf("reading /dev/%s: events %v, want %s", dev, res.Events, sandbox.EventDeviceAccess)
			}
		}
		for _, script := range []string{"mknod /tmp/mem c 1 1 && head -c 1 /tmp/mem", "test $(head -c 1 /proc/kcore | wc -c) -gt 0"} {
			res := run(t, rt, h.ID, sh(script, 10*time.Second))
			if res.ExitCode == 0 {
				t.Errorf("%q succeeded: stdout %q", script, res.Stdout)
			}
		}
		alive(t, rt, h.ID)
	})

	t.Run("Mount", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{})
		res := run(t, rt, h.ID, sh("mount -t tmpfs none /tmp", 10*time.Second))
		if res.ExitCode == 0 || !hasEvent(res, sandbox.EventSyscallDenied, "mount refused") {
			t.Errorf("mount: exit %d stderr %q events %v, want refused and a %s event", res.ExitCode, res.Stderr, res.Events, sandbox.EventSyscallDenied)
		}
		alive(t, rt, h.ID)
	})

	t.Run("Ptrace", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{})
		copyInto(t, rt, h.ID, abuseBinary, "abuse")
		// Its own child, the agent (PID 1) and the agent's memory are all refused.
		for _, script := range []string{"sleep 5 & ./abuse ptrace $!", "./abuse ptrace 1", "./abuse procmem 1"} {
			res := run(t, rt, h.ID, sh(script, 10*time.Second))
			if res.ExitCode == 0 || !strings.Contains(string(res.Stdout), "refused") {
				t.Errorf("%q: exit %d stdout %q stderr %q, want refused", script, res.ExitCode, res.Stdout, res.Stderr)
			}
			// ptrace is a recorded hostile call; /proc/1/mem is refused by the kernel
			// (the agent is not dumpable) and not recorded.
			if strings.Contains(script, "ptrace") && !hasEvent(res, sandbox.EventSyscallDenied, "ptrace refused") {
				t.Errorf("%q: events %v, want a %s event", script, res.Events, sandbox.EventSyscallDenied)
			}
		}
		alive(t, rt, h.ID)
	})

	t.Run("NetworkEgress", func(t *testing.T) {
		// A server on the host's loopback: the sandbox's loopback is its own, so it must
		// not reach it, and it has no route to anywhere else.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		h := mustCreate(t, rt, sandbox.Spec{})
		res := run(t, rt, h.ID, sh(fmt.Sprintf("echo hi | nc -w 1 127.0.0.1 %d", port), 10*time.Second))
		if res.ExitCode == 0 {
			t.Fatalf("the sandbox reached the host's loopback: stdout %q", res.Stdout)
		}
		if hasEvent(res, sandbox.EventEgress, "") {
			t.Errorf("loopback connect recorded %v: loopback is not egress", res.Events)
		}
		// Anywhere else: TCP to two addresses, a UDP datagram by sendto. Each is refused with
		// ENETUNREACH and recorded with its destination.
		copyInto(t, rt, h.ID, abuseBinary, "abuse")
		res = run(t, rt, h.ID, sh("nc -w 1 1.1.1.1 80 </dev/null; nc -w 1 10.0.0.1 53 </dev/null; ./abuse sendto 8.8.8.8:53", 10*time.Second))
		if res.ExitCode == 0 || !strings.Contains(string(res.Stdout)+string(res.Stderr), "unreachable") {
			t.Errorf("egress: exit %d stdout %q stderr %q, want unreachable", res.ExitCode, res.Stdout, res.Stderr)
		}
		for _, want := range []string{"connect to 1.1.1.1:80", "connect to 10.0.0.1:53", "sendto to 8.8.8.8:53"} {
			if !hasEvent(res, sandbox.EventEgress, want) {
				t.Errorf("egress: events %v, want %s %q", res.Events, sandbox.EventEgress, want)
			}
		}
		// And one by one, with each socket's protocol, from the agent's supervisor.
		wantEgress := []sandbox.EgressAttempt{{Addr: "1.1.1.1", Port: 80, Protocol: "TCP"}, {Addr: "10.0.0.1", Port: 53, Protocol: "TCP"}, {Addr: "8.8.8.8", Port: 53, Protocol: "UDP"}}
		if !slices.Equal(res.Egress, wantEgress) || res.EgressDropped != 0 {
			t.Errorf("egress: attempts %+v (%d dropped), want %+v", res.Egress, res.EgressDropped, wantEgress)
		}
		res = run(t, rt, h.ID, sh("cat /proc/net/route; ip route 2>/dev/null", 10*time.Second))
		for _, line := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")[1:] {
			if strings.TrimSpace(line) != "" {
				t.Fatalf("the sandbox has a route: %q", res.Stdout)
			}
		}
		alive(t, rt, h.ID)
	})

	t.Run("OtherSandboxWorkspace", func(t *testing.T) {
		h := mustCreate(t, rt, sandbox.Spec{})
		dir, err := rt.WorkspaceDir(ctx, bystander.ID)
		if err != nil {
			t.Fatal(err)
		}
		// Everything reachable but the kernel views, /dev (busybox grep -r reads
		// /dev/zero forever) and the image's read-only binaries is searched for the
		// bystander's secret and id.
		search := fmt.Sprintf(`for d in /* /.[!.]*; do
		  case $d in /proc|/sys|/dev|/bin|/sbin|/usr) continue;; esac
		  [ -e "$d" ] || continue
		  grep -rl secret-of-bystander "$d" 2>/dev/null | head -5
		  find "$d" -name '*%s*' 2>/dev/null | head -5
		done; true`, bystander.ID)
		res := run(t, rt, h.ID, sh(search, 60*time.Second))
		if res.TimedOut || strings.TrimSpace(string(res.Stdout)) != "" {
			t.Errorf("search for the bystander: timed out %v, found %q", res.TimedOut, res.Stdout)
		}
		// The bystander's workspace as the host sees it, tried from inside.
		for _, script := range []string{
			"cat " + filepath.Join(dir, "secret"),
			"cat /proc/*/root/workspace/secret",
			"ls /run/gauntlet/../../ 2>/dev/null | grep -c " + bystander.ID,
		} {
			res := run(t, rt, h.ID, sh(script, 10*time.Second))
			if strings.Contains(string(res.Stdout), "secret-of-bystander") || (res.ExitCode == 0 && strings.TrimSpace(string(res.Stdout)) != "0") {
				t.Errorf("%q: exit %d stdout %q: reached the other sandbox", script, res.ExitCode, res.Stdout)
			}
		}
	})

	// The bystander saw none of it, and records none of the attacks.
	res := run(t, rt, bystander.ID, sh("cat secret", 10*time.Second))
	if string(res.Stdout) != "secret-of-bystander\n" || hasEvent(res, sandbox.EventSyscallDenied, "") || hasEvent(res, sandbox.EventEgress, "") || hasEvent(res, sandbox.EventDeviceAccess, "") {
		t.Fatalf("bystander's workspace after the abuse: %q events %v", res.Stdout, res.Events)
	}
}

// copyInto copies a host file into the sandbox's workspace as an executable.
func copyInto(t *testing.T, rt *ctrd.Runtime, id, src, name string) {
	t.Helper()
	dir, err := rt.WorkspaceDir(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestUpdateLimitsWhileRunning raises a running sandbox's memory limit.
func TestUpdateLimitsWhileRunning(t *testing.T) {
	_, rt := start(t)
	ctx := context.Background()
	h := mustCreate(t, rt, sandbox.Spec{Limits: sandbox.Limits{MemoryBytes: 32 << 20}})
	big := sh("dd if=/dev/zero of=/dev/null bs=64M count=1", 20*time.Second)
	if res := run(t, rt, h.ID, big); res.ExitCode == 0 {
		t.Fatalf("64 MiB buffer under 32 MiB succeeded")
	}
	if err := rt.UpdateLimits(ctx, h.ID, sandbox.Limits{MemoryBytes: 256 << 20}); err != nil {
		t.Fatalf("update limits: %v", err)
	}
	if res := run(t, rt, h.ID, big); res.ExitCode != 0 {
		t.Fatalf("64 MiB buffer after raising the limit to 256 MiB: exit %d stderr %q events %v", res.ExitCode, res.Stderr, res.Events)
	}
	hs, err := rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(hs, func(x sandbox.Handle) bool { return x.ID == h.ID }); i < 0 || hs[i].Spec.Limits.MemoryBytes != 256<<20 {
		t.Fatalf("the saved handle does not carry the new limit: %+v", hs)
	}
	for _, bad := range []sandbox.Limits{{MemoryBytes: -1}, {OpenFiles: 99}} {
		if err := rt.UpdateLimits(ctx, h.ID, bad); err == nil {
			t.Errorf("update limits %+v: no error", bad)
		}
	}
	if err := rt.UpdateLimits(ctx, "nope", sandbox.Limits{Pids: 64}); err == nil {
		t.Errorf("update limits of an unknown sandbox: no error")
	}
}
