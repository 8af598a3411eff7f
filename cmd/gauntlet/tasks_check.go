package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// tasksCheck is `gauntlet tasks check`: every selected task plays two episodes of the
// tasks env through the episode runner, in real sandboxes: the oracle (solution/solve.sh)
// must succeed and a no-op agent (submit at once) must fail. A canary task (unsolvable
// honestly) is checked the other way round: its oracle, an honest best attempt, must fail
// as well, for a canary an honest agent can pass would flag honest agents as cheats. A
// task that cannot be played, whose verifier fails, whose oracle does not end as it must
// or whose no-op passes is reported; any such task makes the command fail.
func tasksCheck(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("tasks check", stderr)
	f := tasks.Filter{Canaries: true}
	fs.Var((*listFlag)(&f.Tags), "tag", "only tasks with this tag (repeat: all of them)")
	fs.Var((*listFlag)(&f.Difficulties), "difficulty", "only tasks of this difficulty (repeat or comma-separate: any of them)")
	fs.Var((*listFlag)(&f.Globs), "glob", "only tasks whose id matches this pattern, as path.Match (repeat: any of them)")
	var sc runtimes.Config
	sc.RegisterFlags(fs)
	var dataDir string
	registerDataDir(fs, &dataDir, "data directory; the sandboxes' state goes to <data-dir>/sandbox-check unless --sandbox.state-dir says")
	if err := fs.Set("sandbox.runtime", runtimes.Process); err != nil {
		return err
	}
	paths, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(paths) != 1 {
		fmt.Fprint(stderr, "gauntlet tasks check: give one dataset folder, task folder or manifest\n")
		return errUsage
	}
	if err := f.Check(); err != nil {
		return fmt.Errorf("tasks check: %w", err)
	}
	if sc.Runtime == runtimes.None {
		return errors.New("tasks check: --sandbox.runtime: name the runtime the tasks run in (process)")
	}
	if sc.StateDir == "" {
		sc.StateDir = filepath.Join(dataDir, "sandbox-check")
	}
	root, err := filepath.Abs(paths[0])
	if err != nil {
		return err
	}
	ds, err := tasks.LoadDataset(root)
	if err != nil {
		// Checking part of a dataset would pass tasks nobody could train on.
		return fmt.Errorf("tasks check: the dataset is not valid (see gauntlet tasks validate %s):\n%w", paths[0], err)
	}
	sel := ds.Select(f)
	if len(sel) == 0 {
		return fmt.Errorf("tasks check: no task of %s passes the filter", paths[0])
	}
	sb, err := runtimes.Open(ctx, sc, nil)
	if err != nil {
		return fmt.Errorf("tasks check: %w", err)
	}
	defer sb.Close()
	// The dataset is the one the episodes' params name, and the only one they may.
	deps := play.Deps{Sandboxes: sb, Datasets: map[string]string{checkDataset: root}}
	oracle, err := policy.Lookup(policy.Oracle)
	if err != nil {
		return err
	}
	bad := 0
	for _, t := range sel {
		params, _ := json.Marshal(map[string]string{"dataset": checkDataset, "task": t.ID, "digest": t.Digest})
		o := checkEpisode(ctx, deps, params, t.ID+"-oracle", func(e env.Env) (env.Agent, error) { return oracle.NewAgent(e, 1) })
		n := checkEpisode(ctx, deps, params, t.ID+"-noop", func(env.Env) (env.Agent, error) { return noopAgent{}, nil })
		var problems []string
		switch {
		case o.err != nil:
			problems = append(problems, "oracle: "+o.err.Error())
		case t.Config.Metadata.Canary && o.success:
			problems = append(problems, fmt.Sprintf("the oracle passes a canary (rewards %s): an honest agent can solve it, so its successes prove no hack", o.rewards))
		case !t.Config.Metadata.Canary && !o.success:
			problems = append(problems, fmt.Sprintf("oracle did not succeed (%s, rewards %s)", o.reason, o.rewards))
		}
		switch {
		case n.err != nil:
			problems = append(problems, "no-op: "+n.err.Error())
		case n.success:
			problems = append(problems, fmt.Sprintf("a no-op agent succeeds (rewards %s): the tests do not test the task", n.rewards))
		}
		if len(problems) == 0 {
			canary := ""
			if t.Config.Metadata.Canary {
				canary = "  (canary: the oracle must fail)"
			}
			fmt.Fprintf(stdout, "ok   %s  oracle %s  no-op %s%s\n", t.ID, o.rewards, n.rewards, canary)
			continue
		}
		bad++
		fmt.Fprintf(stdout, "FAIL %s\n", t.ID)
		for _, p := range problems {
			fmt.Fprintf(stdout, "  %s\n", strings.ReplaceAll(strings.TrimSpace(p), "\n", "\n    "))
		}
	}
	fmt.Fprintf(stdout, "%d of %d tasks pass (oracle succeeds, no-op fails) on the %s runtime\n", len(sel)-bad, len(sel), sc.Runtime)
	if bad > 0 {
		return fmt.Errorf("tasks check: %d of %d tasks fail", bad, len(sel))
	}
	return nil
}

// checkDataset is the name the checked dataset has in the episodes' params.
const checkDataset = "checked"

// noopAgent does nothing: it submits at once.
type noopAgent struct{}

func (noopAgent) Act(env.Turn) (env.Action, error) {
	return env.Action{Tool: taskenv.ToolSubmit, Args: json.RawMessage(`{}`)}, nil
}

// checkResult is how one checked episode ended.
type checkResult struct {
	success bool
	reason  string
	rewards string // the verdict's rewards, as JSON
	err     error  // the episode could not be played, or ended in an infra error
}

// checkEpisode plays one episode of the tasks env with the agent newAgent makes, through
// the episode runner, scored in process and recorded nowhere.
func checkEpisode(ctx context.Context, deps play.Deps, params []byte, id string, newAgent func(env.Env) (env.Agent, error)) checkResult {
	req := &gauntletv1.EpisodeRequested{EpisodeId: id, RunId: "tasks-check", Env: taskenv.Name, ParamsJson: string(params), Seed: 1, Policy: "check"}
	out := &checkOut{}
	sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: &gauntletv1.FaultPlan{}}, "cli", play.LocalScorer{Spec: scoring.SpecFor(taskenv.Name)}, out)
	defer sess.Close()
	e, err := sess.Prepare(ctx, deps)
	if err != nil {
		return checkResult{err: err}
	}
	agent, err := newAgent(e)
	if err != nil {
		return checkResult{err: err}
	}
	obs, err := sess.Reset(ctx, 1)
	if err != nil {
		return checkResult{err: err}
	}
	if err := sess.Run(ctx, agent, env.Turn{Observation: obs}); err != nil {
		return checkResult{err: err}
	}
	if out.last == nil {
		return checkResult{err: errors.New("the episode played no step")}
	}
	var v struct {
		Rewards json.RawMessage `json:"rewards"`
		Verdict *struct {
			Rewards json.RawMessage `json:"rewards"`
		} `json:"verdict"`
	}
	_ = json.Unmarshal([]byte(out.last.ObservationJson), &v)
	if v.Verdict != nil {
		v.Rewards = v.Verdict.Rewards
	}
	return checkResult{success: out.last.Signals.GetSuccess(), reason: out.last.Reason.String(), rewards: string(v.Rewards)}
}

// checkOut keeps the last step of an episode (play.Output).
type checkOut struct{ last *gauntletv1.StepTaken }

func (o *checkOut) Start(context.Context, *gauntletv1.EpisodeStarted) error { return nil }
func (o *checkOut) Flush() error                                            { return nil }
func (o *checkOut) End(context.Context, *gauntletv1.EpisodeEnded) error     { return nil }
func (o *checkOut) Step(_ context.Context, st *gauntletv1.StepTaken) error {
	o.last = st
	return nil
}
