//go:build linux

package process_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// TestAbuse runs the attacks an agent might try against the process runtime. Each is
// contained — the host and a neighbour sandbox are unharmed, the attacked sandbox still
// works — and reported: the runtime's events, or the tools' safety events, name it. Hostile
// syscalls, egress and decoy devices are refused and recorded by package safety (the
// refusal the command sees and the event are both asserted); for the rest the kernel's
// refusal is asserted and the report says no event is recorded.
func TestAbuse(t *testing.T) {
	rt := open(t, t.TempDir())
	ctx := context.Background()
	limits := sandbox.Limits{MemoryBytes: 64 << 20, Pids: 64, CPUMillis: 500, DiskBytes: 8 << 20}
	victim, err := rt.Create(ctx, sandbox.Spec{Limits: limits, Workspace: []sandbox.File{{Path: "secret", Data: []byte("victim-secret")}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Destroy(ctx, victim.ID) })
	victimWS, _ := rt.WorkspaceDir(ctx, victim.ID)

	type attack struct {
		name    string
		script  string
		timeout time.Duration
		// check asserts containment from the result; it returns the report line.
		check func(t *testing.T, res sandbox.ExecResult) string
	}
	hasEvent := func(t *testing.T, res sandbox.ExecResult, k sandbox.EventKind) string {
		t.Helper()
		i := slices.IndexFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == k })
		if i < 0 {
			t.Fatalf("no %s event; exit %d events %v stderr %q", k, res.ExitCode, res.Events, res.Stderr)
		}
		return fmt.Sprintf("event %s: %s", k, res.Events[i].Detail)
	}
	refused := func(want string) func(t *testing.T, res sandbox.ExecResult) string {
		return func(t *testing.T, res sandbox.ExecResult) string {
			t.Helper()
			if res.ExitCode == 0 || !strings.Contains(string(res.Stdout)+string(res.Stderr), want) {
				t.Fatalf("exit %d stdout %q stderr %q: want a failure saying %q", res.ExitCode, res.Stdout, res.Stderr, want)
			}
			return fmt.Sprintf("refused by the kernel (%q); no runtime event", want)
		}
	}
	// refusedAndRecorded asserts the refusal the command saw and a named event of kind
	// whose detail says what.
	refusedAndRecorded := func(want string, kind sandbox.EventKind, what ...string) func(t *testing.T, res sandbox.ExecResult) string {
		return func(t *testing.T, res sandbox.ExecResult) string {
			t.Helper()
			if res.ExitCode == 0 || !strings.Contains(string(res.Stdout)+string(res.Stderr), want) {
				t.Fatalf("exit %d stdout %q stderr %q: want a failure saying %q", res.ExitCode, res.Stdout, res.Stderr, want)
			}
			var lines []string
			for _, w := range what {
				i := slices.IndexFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == kind && strings.Contains(e.Detail, w) })
				if i < 0 {
					t.Fatalf("no %s event about %q; events %v", kind, w, res.Events)
				}
				lines = append(lines, res.Events[i].Detail)
			}
			return fmt.Sprintf("refused (%q); event %s: %s", want, kind, strings.Join(lines, "; "))
		}
	}
	attacks := []attack{
		{"fork bomb", `bomb() { bomb | bomb & }; bomb; sleep 2`, 10 * time.Second,
			func(t *testing.T, res sandbox.ExecResult) string { return hasEvent(t, res, sandbox.EventPidsLimit) }},
		{"memory bomb", `dd if=/dev/zero of=/dev/null bs=512M count=1`, 20 * time.Second,
			func(t *testing.T, res sandbox.ExecResult) string {
				if res.Metering.PeakMemoryBytes > 80<<20 {
					t.Fatalf("peak memory %d beyond the 64 MiB limit", res.Metering.PeakMemoryBytes)
				}
				return hasEvent(t, res, sandbox.EventOOMKill)
			}},
		{"infinite loop", `while :; do :; done`, 700 * time.Millisecond,
			func(t *testing.T, res sandbox.ExecResult) string {
				if !res.TimedOut {
					t.Fatal("not timed out")
				}
				// Half a core: the loop cannot have used the whole wall time on CPU. (Whether
				// the quota throttled it depends on how busy the host is, so the throttle
				// event is reported, not required.)
				if res.Metering.CPUTime > res.Metering.WallTime*3/4 {
					t.Errorf("cpu %v of wall %v under a 500-millicore quota", res.Metering.CPUTime, res.Metering.WallTime)
				}
				line := hasEvent(t, res, sandbox.EventTimeout)
				if slices.ContainsFunc(res.Events, func(e sandbox.Event) bool { return e.Kind == sandbox.EventCPUThrottled }) {
					line += "; " + hasEvent(t, res, sandbox.EventCPUThrottled)
				}
				return line + fmt.Sprintf("; cpu %v in %v", res.Metering.CPUTime.Round(time.Millisecond), res.Metering.WallTime.Round(time.Millisecond))
			}},
		{"disk fill", `head -c 100000000 /dev/zero > fill; ls -l fill`, 20 * time.Second,
			func(t *testing.T, res sandbox.ExecResult) string {
				if res.ExitCode == 0 && !strings.Contains(string(res.Stderr), "No space") {
					t.Fatalf("100 MB written into an 8 MiB workspace: %q %q", res.Stdout, res.Stderr)
				}
				return hasEvent(t, res, sandbox.EventDiskFull)
			}},
		{"read /dev/mem", `echo bytes=$(cat /dev/mem /dev/kmem /dev/port | wc -c); exit 1`, 10 * time.Second,
			refusedAndRecorded("bytes=0", sandbox.EventDeviceAccess, "/dev/mem", "/dev/kmem", "/dev/port")},
		{"raw disk, kernel memory", `for d in /dev/sda /dev/vda /dev/nvme0n1 /dev/kmsg /proc/kcore; do cat $d > /dev/null && exit 0; done; exit 1`, 10 * time.Second,
			refused("No such file")},
		{"ptrace", fmt.Sprintf(`perl -e '$r = syscall(%d, 0, 0, 0, 0); print "ptrace=$r $!\n"; exit($r < 0 ? 1 : 0)'`, unix.SYS_PTRACE),
			10 * time.Second, refusedAndRecorded("Operation not permitted", sandbox.EventSyscallDenied, "ptrace refused")},
		{"see host processes", `n=$(ls /proc | grep -c '^[0-9]'); echo "pids=$n"; [ "$n" -le 10 ] && exit 1; exit 0`,
			10 * time.Second, refused("pids=")},
		// TCP to two addresses, a UDP datagram (DNS) by sendto, and loopback, which is
		// not egress: it reaches the kernel (nothing listens) and is not recorded.
		{"network egress", `bash -c 'echo x > /dev/tcp/1.1.1.1/80' 2>&1; bash -c 'echo x > /dev/tcp/10.0.0.1/53' 2>&1
			perl -e 'use Socket; socket(S, PF_INET, SOCK_DGRAM, 0); send(S, "x", 0, sockaddr_in(53, inet_aton("8.8.8.8"))) or print "udp: $!\n"'
			bash -c 'echo x > /dev/tcp/127.0.0.1/1' 2>&1; exit 1`,
			10 * time.Second, func(t *testing.T, res sandbox.ExecResult) string {
				line := refusedAndRecorded("Network is unreachable", sandbox.EventEgress, "connect to 1.1.1.1:80", "connect to 10.0.0.1:53", "sendto to 8.8.8.8:53")(t, res)
				if !strings.Contains(string(res.Stdout), "Connection refused") {
					t.Fatalf("loopback connect: %q, want it to reach the kernel (Connection refused)", res.Stdout)
				}
				n := 0
				for _, e := range res.Events {
					if e.Kind == sandbox.EventEgress {
						n++
					}
				}
				if n != 3 {
					t.Fatalf("events %v, want exactly the three egress attempts", res.Events)
				}
				want := []sandbox.EgressAttempt{{Addr: "1.1.1.1", Port: 80, Protocol: "TCP"}, {Addr: "10.0.0.1", Port: 53, Protocol: "TCP"}, {Addr: "8.8.8.8", Port: 53, Protocol: "UDP"}}
				if !slices.Equal(res.Egress, want) || res.EgressDropped != 0 {
					t.Fatalf("egress attempts %+v (%d dropped), want %+v", res.Egress, res.EgressDropped, want)
				}
				return line
			}},
		{"escape by ..", `cat ../../../../../../etc/shadow`, 10 * time.Second, refused("No such file")},
		{"escape by symlink", `ln -s /etc/shadow s && cat s`, 10 * time.Second, refused("No such file")},
		{"read another sandbox's workspace", fmt.Sprintf(`ls %s 2>&1; cat %s/secret 2>&1; ls /run 2>&1; exit 1`, victimWS, victimWS),
			10 * time.Second, refused("No such file")},
		{"mount", fmt.Sprintf(`perl -e 'my ($s, $d, $t) = ("none", "/tmp", "tmpfs"); $r = syscall(%d, $s, $d, $t, 0, 0); print "mount=$r $!\n"; exit 1'`, unix.SYS_MOUNT),
			10 * time.Second, refusedAndRecorded("Operation not permitted", sandbox.EventSyscallDenied, "mount refused")},
		{"become root", `id -u; su -c id 2>&1; exit 1`, 10 * time.Second, refused("1000")},
	}
	var report []string
	for _, a := range attacks {
		t.Run(strings.ReplaceAll(a.name, " ", "_"), func(t *testing.T) {
			h, err := rt.Create(ctx, sandbox.Spec{Limits: limits})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Destroy(ctx, h.ID)
			res, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", a.script}, Timeout: a.timeout})
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			line := a.check(t, res)
			// Contained: the attacked sandbox is clean and usable, the victim untouched.
			st, err := rt.Stats(ctx, h.ID)
			if err != nil || st.Pids != 0 {
				t.Fatalf("after the attack: stats %+v %v, want no process left", st, err)
			}
			for _, id := range []string{h.ID, victim.ID} {
				r, err := rt.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo ok"}})
				// The neighbour records nothing of the attack (a CPU throttle of its own
				// may show on a loaded host; the attacked sandbox may still report its
				// full disk).
				if err != nil || string(r.Stdout) != "ok\n" || (id == victim.ID && hasSafety(r)) {
					t.Fatalf("sandbox %s after the attack: %q %v events %v", id, r.Stdout, err, r.Events)
				}
			}
			if b, err := os.ReadFile(victimWS + "/secret"); err != nil || string(b) != "victim-secret" {
				t.Fatalf("victim workspace: %q %v", b, err)
			}
			report = append(report, fmt.Sprintf("%-34s contained; %s", a.name, line))
		})
	}

	// Path traversal and symlink escapes through the file tools are refused host-side
	// and recorded as safety events.
	t.Run("tools_escapes", func(t *testing.T) {
		h, err := rt.Create(ctx, sandbox.Spec{Limits: limits})
		if err != nil {
			t.Fatal(err)
		}
		defer rt.Destroy(ctx, h.ID)
		if _, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: []string{"sh", "-c", "ln -s / root; ln -s " + victimWS + " victim; mkfifo pipe"}}); err != nil {
			t.Fatal(err)
		}
		var events []sandbox.Event
		tb := tools.New(rt, h.ID, tools.Options{OnEvent: func(e sandbox.Event) { events = append(events, e) }})
		for p, want := range map[string]error{
			"../../etc/shadow":   tools.ErrOutside,
			"/etc/shadow":        tools.ErrOutside,
			"root/etc/shadow":    tools.ErrSymlink,
			"victim/secret":      tools.ErrSymlink,
			"pipe":               tools.ErrSpecialFile,
			victimWS + "/secret": tools.ErrOutside,
		} {
			if _, err := tb.Read(ctx, p); !errors.Is(err, want) {
				t.Errorf("fs.read %q: %v, want %v", p, err, want)
			}
		}
		kinds := map[sandbox.EventKind]int{}
		for _, e := range events {
			kinds[e.Kind]++
		}
		if kinds[tools.EventPathTraversal] != 3 || kinds[tools.EventSymlink] != 2 || kinds[tools.EventSpecialFile] != 1 {
			t.Fatalf("safety events %v", kinds)
		}
		report = append(report, fmt.Sprintf("%-34s contained; events %v", "tools: traversal, symlink, device", kinds))
	})
	t.Logf("abuse report:\n%s", strings.Join(report, "\n"))
}

// hasSafety says whether res has an event of the kinds package safety records (refused
// hostile calls, egress, decoy devices): they belong to the sandbox whose command made them.
func hasSafety(res sandbox.ExecResult) bool {
	return slices.ContainsFunc(res.Events, func(e sandbox.Event) bool {
		return e.Kind == sandbox.EventSyscallDenied || e.Kind == sandbox.EventEgress || e.Kind == sandbox.EventDeviceAccess
	})
}
