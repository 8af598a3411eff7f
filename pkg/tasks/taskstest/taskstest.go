// Package taskstest runs a task folder's scripts on the host, in the layout Harbor's format
// gives a sandbox, for tests of datasets: the task's workspace (environment/app, which the
// task's Dockerfile copies to /app) is copied to a fresh temporary folder and mounted at
// /app, the solution at /solution while solve.sh runs, the tests at /tests only while
// test.sh runs, and /logs/verifier is read back for the reward.
//
// Each script runs under bubblewrap in new namespaces (no network), over the host's /usr
// and /etc read-only, as the process runtime shows the host's system to a sandbox; nothing
// of the task's image is built, so a task whose Dockerfile installs tools needs them on
// the host too (Require lists them). It is the harness for checking a dataset's oracle and
// no-op runs before episodes play task folders themselves; it is not a sandbox for
// untrusted agents.
package taskstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// WorkspaceDir is the folder of environment/ that the datasets' Dockerfiles copy to /app.
const WorkspaceDir = "app"

// Result is what one run left.
type Result struct {
	// Rewards are what test.sh wrote (tasks.ReadRewards).
	Rewards map[string]float64
	// SolveOutput and TestOutput are the scripts' combined stdout and stderr.
	SolveOutput, TestOutput string
}

// Run runs task t on the host: solve.sh first when oracle is set (else the agent does
// nothing), then test.sh, each under its timeout from task.toml. The error reports a
// script that could not run or timed out, or a verifier that left no valid reward.
func Run(ctx context.Context, t *tasks.Task, oracle bool) (Result, error) {
	var res Result
	work, err := os.MkdirTemp("", "gauntlet-taskstest-") // the prefix CI cleans up after
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(work)
	app := filepath.Join(work, "app")
	src := filepath.Join(t.Environment.Context, WorkspaceDir)
	if _, err := os.Stat(src); err == nil {
		// cp -a keeps modes and links, as COPY does.
		if out, err := exec.CommandContext(ctx, "cp", "-a", src, app).CombinedOutput(); err != nil {
			return res, fmt.Errorf("copy workspace of %s: %v: %s", t.ID, err, out)
		}
	} else if err := os.Mkdir(app, 0o755); err != nil {
		return res, err
	}
	logs := filepath.Join(work, "logs")
	for _, d := range []string{"verifier", "agent"} {
		if err := os.MkdirAll(filepath.Join(logs, d), 0o755); err != nil {
			return res, err
		}
	}
	if oracle {
		if !t.HasSolution {
			return res, fmt.Errorf("task %s has no solution/solve.sh", t.ID)
		}
		out, err := run(ctx, t.Config.Agent.Timeout, app, logs, t.Config.Solution.Env,
			[]string{"--ro-bind", filepath.Join(t.Dir, tasks.SolutionDir), tasks.SolutionMount},
			tasks.SolutionMount+"/solve.sh")
		res.SolveOutput = out
		if err != nil {
			return res, fmt.Errorf("task %s: solve.sh: %w\n%s", t.ID, err, out)
		}
	}
	out, err := run(ctx, t.Config.Verifier.Timeout, app, logs, t.Config.Verifier.Env,
		[]string{"--ro-bind", filepath.Join(t.Dir, tasks.TestsDir), tasks.TestsMount},
		tasks.TestsMount+"/test.sh")
	res.TestOutput = out
	if err != nil {
		// test.sh's exit status is not the verdict (the reward file is), but a verifier
		// killed by its timeout is an infra error.
		var exit *exec.ExitError
		if !errors.As(err, &exit) || ctx.Err() != nil {
			return res, fmt.Errorf("task %s: test.sh: %w\n%s", t.ID, err, out)
		}
	}
	res.Rewards, err = tasks.ReadRewards(filepath.Join(logs, "verifier"))
	if err != nil {
		return res, fmt.Errorf("task %s: %w\ntest.sh said:\n%s", t.ID, err, out)
	}
	return res, nil
}

// run runs bash script under bubblewrap with /app and /logs bound to the run's folders.
func run(ctx context.Context, timeout time.Duration, app, logs string, env map[string]string, binds []string, script string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := []string{
		"--ro-bind", "/usr", "/usr", "--symlink", "usr/bin", "/bin", "--symlink", "usr/sbin", "/sbin",
		"--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64", "--ro-bind", "/etc", "/etc",
		"--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/root",
		"--bind", app, "/app", "--bind", logs, "/logs",
		"--unshare-all", "--die-with-parent", "--new-session", "--chdir", "/app", "--clearenv",
		"--setenv", "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"--setenv", "HOME", "/root", "--setenv", "LANG", "C.UTF-8",
	}
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "--setenv", k, env[k])
	}
	args = append(args, binds...)
	args = append(args, "bash", script)
	cmd := exec.CommandContext(ctx, "bwrap", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	if ctx.Err() == context.DeadlineExceeded {
		return out.String(), fmt.Errorf("timed out after %v", timeout)
	}
	return out.String(), err
}

// Require reports the first of the host tools that is missing, for a test to skip or
// fail with.
func Require(tools ...string) error {
	for _, tool := range append([]string{"bwrap", "bash", "cp"}, tools...) {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%s is not installed on this host: %w", tool, err)
		}
	}
	return nil
}
