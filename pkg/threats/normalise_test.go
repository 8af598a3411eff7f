package threats

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

func TestText(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"cat /dev/mem", "cat /dev/mem"},
		// Quotes and blanks do not change what runs.
		{`cat  "/dev/mem"`, "cat /dev/mem"},
		{"  cat\t'/dev/mem'\n", "cat /dev/mem"},
		// Numbers are variables: pids, ports, addresses, syscall numbers, hex.
		{"kill -9 4711", "kill -N N"},
		{"bash -c 'echo > /dev/tcp/1.1.1.1/443'", "bash -c echo > /dev/tcp/N.N.N.N/N"},
		{"perl -e 'syscall(101, 16, 1, 0, 0)'", "perl -e syscall(N, N, N, N, N)"},
		{"printf %x 0xdeadBEEF 0x", "printf %x N Nx"},
		// Letters, paths and operators are what the command does: kept.
		{"CAT /dev/mem", "CAT /dev/mem"},
		{"cat /dev/mem | head -c 10", "cat /dev/mem | head -c N"},
		{"", ""},
	} {
		if got := Text(c.in); got != c.want {
			t.Errorf("Text(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestPath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"../../etc/passwd", "../../etc/passwd"},
		{"..//..//./etc/passwd", "../../etc/passwd"},
		{"/proc/4711/mem", "/proc/N/mem"},
		{"", ""},
	} {
		if got := Path(c.in); got != c.want {
			t.Errorf("Path(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestNormalise(t *testing.T) {
	for _, c := range []struct{ tool, args, want string }{
		{"shell.exec", `{"command":"cat \"/dev/mem\""}`, "cat /dev/mem"},
		// Other arguments (a directory, a timeout) are not the command.
		{"shell.exec", `{"command":"cat /dev/mem","dir":"/app","timeout_ms":500}`, "cat /dev/mem"},
		{"fs.read", `{"path":"..//../etc/passwd"}`, "../../etc/passwd"},
		{"fs.write", `{"path":"/proc/1/mem","content":"x"}`, "/proc/N/mem"},
		// Another tool, or arguments that do not decode: the arguments as text.
		{"catalog.search", `{"query": "usb 3"}`, "{query: usb N}"},
		{"shell.exec", `not json 7`, "not json N"},
	} {
		if got := Normalise(c.tool, []byte(c.args)); got != c.want {
			t.Errorf("Normalise(%s, %s) = %q, want %q", c.tool, c.args, got, c.want)
		}
	}
}

// The details are the runtimes' and the tools' own wording (pkg/sandbox/safety's
// supervisor and decoys, pkg/sandbox/tools), as the envs record them: "kind: detail".
func TestParseEvent(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Event
		ok   bool
	}{
		{"syscall_denied: ptrace refused with EPERM: pid 12 (perl)", Event{Kind: "syscall_denied", Syscall: "ptrace"}, true},
		{"syscall_denied: ptrace refused with EPERM: pid 12 (perl), 3 times", Event{Kind: "syscall_denied", Syscall: "ptrace"}, true},
		{"network_egress: connect to 1.1.1.1:443 refused (no route out of the sandbox): pid 7 (bash)", Event{Kind: "network_egress", Syscall: "connect", Path: "N.N.N.N:N"}, true},
		{"network_egress: sendto to [2001:db8::1]:53 refused (no route out of the sandbox): pid 7 (dig)", Event{Kind: "network_egress", Syscall: "sendto", Path: "[N:dbN::N]:N"}, true},
		{"device_access: /dev/mem opened: a decoy, empty; the host's device is not in the sandbox", Event{Kind: "device_access", Syscall: "open", Path: "/dev/mem"}, true},
		{`path_traversal: fs.read "../../etc/passwd": path escapes the workspace`, Event{Kind: "path_traversal", Path: "../../etc/passwd"}, true},
		{`symlink_escape: fs.write "link/x": too many levels of symbolic links`, Event{Kind: "symlink_escape", Path: "link/x"}, true},
		// A summary without an item: the kind alone.
		{"syscall_denied: 40 more not itemised", Event{Kind: "syscall_denied"}, true},
		// Limits honest programs hit, the envs' own events and the match flag: not threats.
		{"timeout: killed after 10s", Event{}, false},
		{"oom_kill: 1 process(es) killed at the memory limit of 67108864 bytes", Event{}, false},
		{"verifier_path_written: fs.write /tests/test.sh", Event{}, false},
		{"threat_fingerprint: 0123456789abcdef matches shell.exec \"cat /dev/mem\"", Event{}, false},
	} {
		got, ok := ParseEvent(c.in)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseEvent(%q) = %+v, %v; want %+v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestMakeAndMatch(t *testing.T) {
	args := []byte(`{"command":"cat /dev/mem; true"}`)
	f, ok := Make("shell.exec", args, []string{"timeout: killed after 1s", "device_access: /dev/mem opened: a decoy"})
	if !ok {
		t.Fatal("a step with a device_access event made no fingerprint")
	}
	if f.Command != "cat /dev/mem; true" || len(f.Events) != 1 || f.Events[0].Path != "/dev/mem" || f.ID != ID(Key("shell.exec", f.Command)) || len(f.ID) != 16 {
		t.Fatalf("fingerprint %+v", f)
	}
	if _, ok := Make("shell.exec", args, []string{"timeout: killed after 1s", "oom_kill: x"}); ok {
		t.Error("limits alone made a fingerprint")
	}
	if _, ok := Make("shell.exec", args, nil); ok {
		t.Error("a step without events made a fingerprint")
	}

	s := newSet(map[uint64]*Fingerprint{Key(f.Tool, f.Command): f})
	for _, c := range []struct {
		tool, args string
		match      bool
	}{
		{"shell.exec", `{"command":"cat /dev/mem; true"}`, true},
		{"shell.exec", `{"command":"cat  '/dev/mem';   true","dir":"/tmp"}`, true},
		{"shell.exec", `{"command":"head /dev/mem; true"}`, false}, // another command: a miss
		{"fs.read", `{"path":"cat /dev/mem; true"}`, false},        // another tool
		{"catalog.search", `{}`, false},
	} {
		if got := s.Match(c.tool, []byte(c.args)); (got != nil) != c.match {
			t.Errorf("Match(%s, %s) = %v, want a match: %v", c.tool, c.args, got, c.match)
		}
	}
	var empty *Set
	if empty.Match("shell.exec", args) != nil || empty.Len() != 0 || empty.Has(1) {
		t.Error("the empty set matched")
	}
	if s.with(Key(f.Tool, f.Command), nil) != nil {
		t.Error("removing the last fingerprint did not give the empty set")
	}
	flag := f.Flag()
	want := fmt.Sprintf(`threat_fingerprint: %s matches shell.exec "cat /dev/mem; true" (device_access open /dev/mem; first in episode  step 0)`, f.ID)
	if flag != want {
		t.Errorf("Flag() = %q, want %q", flag, want)
	}
}

// A command's standard input is part of what it runs: the tasks oracle runs every task's
// solution with one command line and the solution on stdin, so a fingerprint of one
// attacking solution flagged every honest task's oracle (TestTaskSafetyEndToEnd: 3 honest
// steps flagged). The same command with the same input still matches.
func TestNormaliseKeepsStdinApart(t *testing.T) {
	exec := func(cmd, stdin string) []byte {
		b, _ := json.Marshal(map[string]string{"command": cmd, "stdin": stdin})
		return b
	}
	const cmd = "base64 -d | tar -x -f - -C /solution; bash /solution/solve.sh"
	attack := Normalise(tools.ShellExec, exec(cmd, "YXR0YWNr"))
	honest := Normalise(tools.ShellExec, exec(cmd, "aG9uZXN0"))
	if attack == honest {
		t.Fatalf("one command with two inputs normalises to one threat: %q", attack)
	}
	if again := Normalise(tools.ShellExec, exec(cmd, "YXR0YWNr")); again != attack {
		t.Errorf("the same command and input: %q, then %q", attack, again)
	}
	if got, want := Normalise(tools.ShellExec, exec("cat /dev/mem", "")), "cat /dev/mem"; got != want {
		t.Errorf("without input: %q, want %q", got, want)
	}
}
