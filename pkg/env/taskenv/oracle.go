package taskenv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// oracle runs the task's solution, as Harbor's oracle agent does: one shell.exec copies
// solution/ to /solution, runs solve.sh in the task's working directory (/app, or the
// image's WORKDIR) with the [solution] env, and removes /solution again; then it
// submits. It learns its task from the reset observation's digest (a task this process's
// env read), so it needs nothing but what it sees.
type oracle struct{ solved bool }

// Act chooses the next action: the solution, then submit.
func (o *oracle) Act(t env.Turn) (env.Action, error) {
	if o.solved {
		return env.Action{Tool: ToolSubmit, Args: json.RawMessage(`{}`)}, nil
	}
	o.solved = true
	var first resetObs
	if err := json.Unmarshal(t.Observation, &first); err != nil || first.Digest == "" {
		return env.Action{}, fmt.Errorf("tasks oracle: the first observation names no task digest")
	}
	task, ok := lookup(first.Digest)
	if !ok {
		return env.Action{}, fmt.Errorf("tasks oracle: task %s (digest %s) was not read by this process", first.Task, first.Digest)
	}
	if !task.HasSolution {
		return env.Action{}, fmt.Errorf("tasks oracle: task %s has no %s", task.ID, tasks.SolutionScript)
	}
	sol, err := tarFolder(filepath.Join(task.Dir, tasks.SolutionDir))
	if err != nil {
		return env.Action{}, fmt.Errorf("tasks oracle: task %s: %w", task.ID, err)
	}
	cmd := "set -e; mkdir -p /workspace/" + solutionDir + "; base64 -d | tar -x -f - -C /solution; set +e\n"
	for _, kv := range envList(task.Config.Solution.Env) {
		cmd += "export " + shQuote(kv) + "\n"
	}
	cmd += "bash /solution/solve.sh; rc=$?; rm -rf /solution/* /solution/.[!.]* 2>/dev/null; exit $rc\n"
	dir := first.WorkDir // the image's WORKDIR, where solve.sh runs as Harbor runs it
	if dir == "" {
		dir = WorkDir
	}
	args, err := json.Marshal(tools.ExecArgs{Command: cmd, Dir: dir, Stdin: base64.StdEncoding.EncodeToString(sol)})
	if err != nil {
		return env.Action{}, err
	}
	return env.Action{Tool: tools.ShellExec, Args: args}, nil
}

// Follow takes over a recorded episode: once its first action was played the solution
// has run.
func (o *oracle) Follow(t env.Turn, played env.Action) { o.solved = true }

func shQuote(s string) string {
	out := "'"
	for _, c := range s {
		if c == '\'' {
			out += `'\''`
		} else {
			out += string(c)
		}
	}
	return out + "'"
}
