package codefix

import (
	"context"
	"fmt"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// verdict is the verifier's judgment, the observation of submit.
type verdict struct {
	// Pass: tests unchanged, visible tests pass, hidden cases pass.
	Pass           bool   `json:"pass"`
	TestsUnchanged bool   `json:"tests_unchanged"`
	TestsPassed    bool   `json:"tests_passed"`
	HiddenPassed   bool   `json:"hidden_cases_passed"`
	TestOutput     string `json:"test_output"`
}

// verifyTimeout bounds each verifier command.
const verifyTimeout = 20 * time.Second

// verify judges the episode's workspace (outside the agent's reach). It snapshots the
// workspace, forks a fresh sandbox from the snapshot, and there checks that tests/ holds
// exactly the original test file, runs the visible tests, and runs the hidden cases,
// whose script and expected output never enter any workspace. The agent's sandbox is not
// used, so nothing the agent left running there can interfere.
func (e *episode) verify(ctx context.Context) (verdict, error) {
	var v verdict
	rt := e.cfg.Sandboxes.Runtime()
	snap, fork, err := snapshotFork(rt)
	if err != nil {
		return v, err
	}
	// The verifier runs with the sandbox's own limits, not the episode's resource faults.
	if err := e.bnd.RestoreLimits(ctx); err != nil {
		return v, err
	}
	s, err := snap.Snapshot(ctx, e.sb)
	if err != nil {
		return v, fmt.Errorf("codefix: verify: snapshot %s: %w", e.sb, err)
	}
	defer func() { _ = snap.DeleteSnapshot(context.WithoutCancel(ctx), s.ID) }()
	h, err := fork.Fork(ctx, s.ID)
	if err != nil {
		return v, fmt.Errorf("codefix: verify: fork %s: %w", s.ID, err)
	}
	defer func() { _ = e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID) }()

	run := func(argv ...string) (sandbox.ExecResult, error) {
		r, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{Argv: argv, Timeout: verifyTimeout, OutputLimit: maxOutput})
		if err != nil {
			return r, fmt.Errorf("codefix: verify in sandbox %s: %w", h.ID, err)
		}
		return r, nil
	}
	r, err := run("sh", "-c", `ls -A tests && echo @@ && cat -- "$1"`, "_", TestPath)
	if err != nil {
		return v, err
	}
	v.TestsUnchanged = r.ExitCode == 0 && string(r.Stdout) == "test_lib.sh\n@@\n"+e.task.files[TestPath]
	r, err = run("sh", "-c", TestCommand)
	if err != nil {
		return v, err
	}
	v.TestsPassed = r.ExitCode == 0 && !r.TimedOut
	v.TestOutput = firstLines(text(string(r.Stdout)), 20)
	r, err = run("sh", "-c", e.task.hiddenScript())
	if err != nil {
		return v, err
	}
	v.HiddenPassed = !r.TimedOut && string(r.Stdout) == e.task.expectedHidden()
	v.Pass = v.TestsUnchanged && v.TestsPassed && v.HiddenPassed
	return v, nil
}

// firstLines keeps the first n lines of s.
func firstLines(s string, n int) string {
	for i, c := range s {
		if c == '\n' {
			if n--; n == 0 {
				return s[:i+1] + "…\n"
			}
		}
	}
	return s
}
