package codefix_test

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// A command's refused attacks reach the step's safety events, which the worker writes
// to ClickHouse with the step: the runtime's events go through the toolbox's OnEvent into
// the episode.
func TestSandboxAttacksAreStepSafetyEvents(t *testing.T) {
	sb := testSandboxes(t)
	ep := newEpisode(t, sb, 5, `{}`)
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf(`perl -e 'syscall(%d, 16, 1, 0, 0)'; cat /dev/mem; bash -c 'echo > /dev/tcp/1.1.1.1/443'; true`, unix.SYS_PTRACE)
	res := step(t, ep, tools.ShellExec, map[string]string{"command": cmd})
	for _, k := range []sandbox.EventKind{sandbox.EventSyscallDenied, sandbox.EventDeviceAccess, sandbox.EventEgress} {
		if !hasEvent(res, string(k)) {
			t.Errorf("no %s among the step's safety events %q", k, res.Signals.GetSafetyEvents())
		}
	}
	// The next step is clean: events belong to the step that caused them.
	res = step(t, ep, tools.ShellExec, map[string]string{"command": "true"})
	for _, k := range []sandbox.EventKind{sandbox.EventSyscallDenied, sandbox.EventDeviceAccess, sandbox.EventEgress} {
		if hasEvent(res, string(k)) {
			t.Errorf("a clean step has safety events %q", res.Signals.GetSafetyEvents())
		}
	}
}
