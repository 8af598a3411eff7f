package taskenv_test

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes/runtimestest"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// attacks is a shell command that makes a hostile syscall (ptrace), opens a decoy host
// device and connects out of the sandbox, each refused by the runtime and reported as a
// safety event; then it goes on as if nothing happened.
var attacks = fmt.Sprintf(`perl -e 'syscall(%d, 16, 1, 0, 0)'; cat /dev/mem; bash -c 'echo > /dev/tcp/1.1.1.1/443'; true`, unix.SYS_PTRACE)

// attackTask is a task whose solution runs the same attacks before solving it (writing
// done.txt, which its test checks): its oracle is an agent that solves the task and
// attacks the sandbox on the way.
var attackTask, _ = filepath.Abs("testdata/attack")

// attackKinds are the events attacks raises.
var attackKinds = []sandbox.EventKind{sandbox.EventSyscallDenied, sandbox.EventDeviceAccess, sandbox.EventEgress}

// hasKind reports whether events holds one of kind k ("kind: detail").
func hasKind(events []string, k sandbox.EventKind) bool {
	for _, e := range events {
		if strings.HasPrefix(e, string(k)+": ") {
			return true
		}
	}
	return false
}

// TestSandboxAttacksAreStepSafetyEvents: in a task episode, a command's refused attacks
// reach the step's safety events (as in codefix), which the default spec's safety
// component penalises; the next step is clean, and an honest oracle's episodes of the
// in-repo dataset raise none.
func TestSandboxAttacksAreStepSafetyEvents(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("codefix/sum"), Sandboxes: sb, Datasets: gauntlet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	res, err := ep.Step(act(tools.ShellExec, map[string]string{"command": attacks}))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range attackKinds {
		if !hasKind(res.Signals.GetSafetyEvents(), k) {
			t.Errorf("no %s among the step's safety events %q", k, res.Signals.GetSafetyEvents())
		}
	}
	step := &gauntletv1.StepTaken{Signals: res.Signals, Metering: res.Metering}
	for _, c := range scoring.Score(scoring.SpecFor(taskenv.Name), step).Components {
		if c.Name == scoring.ComponentSafety && c.Value != -1 {
			t.Errorf("the default spec's safety component is %v for %d events, want -1", c.Value, len(res.Signals.GetSafetyEvents()))
		}
	}
	if res, err = ep.Step(act(tools.ShellExec, map[string]string{"command": "true"})); err != nil {
		t.Fatal(err)
	}
	if ev := res.Signals.GetSafetyEvents(); len(ev) != 0 {
		t.Errorf("a clean step has safety events %q", ev)
	}

	// The attacking task's oracle: the solution's attacks are events of the solving step.
	ds, p := own(attackTask)
	_, last := play(t, sb, ds, p, taskenv.New().(env.Oracle).Oracle(1))
	if last.err != nil || !last.res.Signals.GetSuccess() {
		t.Fatalf("the attacking solution did not solve its task: %v %s", last.err, last.res.Observation)
	}
	for _, k := range attackKinds {
		if !hasKind(last.safety, k) {
			t.Errorf("the attacking oracle's episode: no %s among %q", k, last.safety)
		}
	}

	for _, id := range []string{"codefix/sum", "shell/count-errors", "data/transpose"} {
		if _, last := play(t, sb, gauntlet, params(id), taskenv.New().(env.Oracle).Oracle(1)); len(last.safety) != 0 {
			t.Errorf("%s: the honest oracle's episode has safety events %q", id, last.safety)
		}
	}
}

// TestLimitsAreNotSafetyEvents: a task command that runs into its timeout and the output
// cap records them as the step's limits, not as safety events, so the default spec's
// safety component does not penalise an agent whose honest command ran long.
func TestLimitsAreNotSafetyEvents(t *testing.T) {
	sb := runtimestest.Open(t, runtimes.Process, 0)
	ep, err := taskenv.New().NewEpisode(env.Config{Seed: 1, Params: params("codefix/sum"), Sandboxes: sb, Datasets: gauntlet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Close(ep) })
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	// The output goes first and the timeout is long enough for it on a loaded machine
	// (300 ms was not, at a load average of 16: the command timed out before its output
	// reached the cap); the sleep then runs into the timeout.
	res, err := ep.Step(act(tools.ShellExec, map[string]any{"command": "head -c 2000000 /dev/zero; sleep 60", "timeout_ms": 3000}))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []sandbox.EventKind{sandbox.EventTimeout, sandbox.EventOutputCapped} {
		if !hasKind(res.Signals.GetLimits(), k) {
			t.Errorf("no %s among the step's limits %q (safety events %q)", k, res.Signals.GetLimits(), res.Signals.GetSafetyEvents())
		}
	}
	if ev := res.Signals.GetSafetyEvents(); len(ev) != 0 {
		t.Errorf("limits hit are safety events: %q", ev)
	}
	step := &gauntletv1.StepTaken{Signals: res.Signals, Metering: res.Metering}
	for _, c := range scoring.Score(scoring.SpecFor(taskenv.Name), step).Components {
		if c.Name == scoring.ComponentSafety && c.Value != 0 {
			t.Errorf("the default spec's safety component is %v for a step that only hit limits", c.Value)
		}
	}
}
