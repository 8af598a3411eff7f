package codefix_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
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

// A command that hits a limit (its timeout, the output cap) is recorded with the step's
// limits, not its safety events: an honest agent whose tests run long is not an attacker,
// and the default spec's safety component stays 0.
func TestLimitsAreNotSafetyEvents(t *testing.T) {
	sb := testSandboxes(t)
	ep := newEpisode(t, sb, 5, `{}`)
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	res := step(t, ep, tools.ShellExec, map[string]any{"command": "head -c 100000 /dev/zero; sleep 5", "timeout_ms": 300})
	for _, k := range []sandbox.EventKind{sandbox.EventTimeout, sandbox.EventOutputCapped} {
		if !slices.ContainsFunc(res.Signals.GetLimits(), func(e string) bool { return strings.HasPrefix(e, string(k)+": ") }) {
			t.Errorf("no %s among the step's limits %q (safety events %q)", k, res.Signals.GetLimits(), res.Signals.GetSafetyEvents())
		}
	}
	if ev := res.Signals.GetSafetyEvents(); len(ev) != 0 {
		t.Errorf("limits hit are safety events: %q", ev)
	}
	st := &gauntletv1.StepTaken{Signals: res.Signals, Metering: res.Metering}
	for _, c := range scoring.Score(scoring.SpecFor(codefix.Name), st).Components {
		if c.Name == scoring.ComponentSafety && c.Value != 0 {
			t.Errorf("the default spec's safety component is %v for a step that only hit limits", c.Value)
		}
	}
}
