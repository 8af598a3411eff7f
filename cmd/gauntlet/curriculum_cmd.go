package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/runs"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/workflows"
)

const curriculumUsage = `Usage:
  gauntlet curriculum start -f FILE [--id ID] [--wait]   start a curriculum; prints its workflow id
  gauntlet curriculum status ID [--json]                 stage, episodes, success rate, drift in force
  gauntlet curriculum pause ID | resume ID               hold or continue (between batches)
  gauntlet curriculum skip ID                            end the current stage as skipped
  gauntlet curriculum abort ID                           end the curriculum after the batch in flight
  gauntlet curriculum validate -f FILE                   check a spec without starting anything

Every subcommand takes --temporal HOST:PORT and --namespace (default: from the stack.json
that 'gauntlet up' writes in --data-dir).
`

func cmdCurriculum(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, curriculumUsage)
		return errUsage
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "start", "validate":
		return curriculumStart(ctx, sub, rest, stdout, stderr)
	case "status":
		return curriculumStatus(ctx, rest, stdout, stderr)
	case "pause", "resume", "skip", "abort":
		return curriculumSignal(ctx, sub, rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, curriculumUsage)
		return nil
	}
	fmt.Fprintf(stderr, "gauntlet curriculum: unknown subcommand %q\n\n%s", sub, curriculumUsage)
	return errUsage
}

// loadSpecFile reads and validates a curriculum spec, naming the file in errors.
func loadSpecFile(path string) (workflows.CurriculumSpec, error) {
	if path == "" {
		return workflows.CurriculumSpec{}, errors.New("-f: the curriculum spec file is required")
	}
	f, err := os.Open(path)
	if err != nil {
		return workflows.CurriculumSpec{}, fmt.Errorf("-f: %w", err)
	}
	defer f.Close()
	spec, err := workflows.LoadSpec(f)
	if err != nil {
		return spec, fmt.Errorf("invalid curriculum %s:\n  %s", path, strings.ReplaceAll(err.Error(), "\n", "\n  "))
	}
	return spec, nil
}

// pinStageTasks pins the tasks of every stage that names a task set and pins none, as
// `run --tasks` does, when the stack's stack.json names the dataset's folder: the
// curriculum's runs then record the tasks they cover. A filter selecting nothing is
// refused here, naming the stage. Where the stack's datasets are unknown the stages
// select on the stack, by their filters.
func pinStageTasks(spec *workflows.CurriculumSpec, datasets func() (map[string]string, error), stderr io.Writer) error {
	for i := range spec.Stages {
		ts := spec.Stages[i].Tasks
		if ts == nil || len(ts.Tasks) > 0 {
			continue
		}
		known, err := datasets()
		dir, ok := known[ts.Dataset]
		if err != nil || !ok {
			fmt.Fprintf(stderr, "gauntlet: stages[%d].tasks: dataset %s is not in the stack's stack.json: its tasks are selected on the stack and not pinned\n", i, ts.Dataset)
			continue
		}
		ds, err := tasks.LoadDataset(dir)
		if err != nil {
			return fmt.Errorf("stages[%d].tasks.dataset: %w", i, err)
		}
		sel, err := taskenv.Select(ts.Dataset, ds, tasks.Filter{Tags: ts.Tags, Difficulties: ts.Difficulty, Globs: ts.Glob})
		if err != nil {
			return fmt.Errorf("stages[%d].tasks: %w", i, err)
		}
		for _, p := range sel.Tasks {
			ts.Tasks = append(ts.Tasks, workflows.TaskPin{ID: p.ID, Digest: p.Digest})
		}
		fmt.Fprintf(stderr, "gauntlet: stage %s: %d of the %d tasks of dataset %s\n", spec.Stages[i].Name, len(ds.Select(sel.Filter)), len(ds.Tasks), ts.Dataset)
	}
	return nil
}

func curriculumStart(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("curriculum "+sub, stderr)
	var tf stackFlags
	tf.register(fs, partTemporal)
	file := fs.String("f", "", "curriculum spec, YAML or JSON")
	id := fs.String("id", "", "workflow id (default: curriculum-<name>-<random>)")
	wait := fs.Bool("wait", false, "follow the curriculum to its end and print its report")
	if err := parse(fs, args); err != nil {
		return err
	}
	// Validation comes first: a bad spec is refused before anything is contacted, by the
	// one check validate makes too (size included), so what validates starts.
	spec, err := loadSpecFile(*file)
	if err != nil {
		return err
	}
	if sub == "validate" {
		fmt.Fprintf(stdout, "%s: valid, %d stages\n", *file, len(spec.Stages))
		return nil
	}
	if err := pinStageTasks(&spec, tf.datasets, stderr); err != nil {
		return err
	}
	raw, err := workflows.EncodeSpec(spec)
	if err != nil {
		return err
	}
	if *id == "" {
		name := spec.Name
		if name == "" {
			name = "unnamed"
		}
		*id = "curriculum-" + name + "-" + randomSuffix()
	}
	c, err := tf.dialTemporal(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	// The curriculum shows its state and stage as search attributes where the namespace
	// has them (or lets them be registered); its memo shows them anyway.
	searchAttrs := true
	if err := workflows.EnsureSearchAttributes(ctx, c, tf.namespace); err != nil {
		searchAttrs = false
		fmt.Fprintf(stderr, "gauntlet: the curriculum will not set search attributes (its memo still shows state and stage): %v\n", err)
	}
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: *id, TaskQueue: workflows.TaskQueue,
		WorkflowIDReusePolicy: enums.WORKFLOW_ID_REUSE_POLICY_REJECT_DUPLICATE,
		Memo:                  map[string]any{workflows.MemoSubmittedBy: runs.Submitter(), workflows.MemoSearchAttributes: searchAttrs},
	}, workflows.WorkflowCurriculum, json.RawMessage(raw))
	if err != nil {
		return fmt.Errorf("start curriculum %s: %w", *id, err)
	}
	fmt.Fprintln(stdout, run.GetID())
	if !*wait {
		return nil
	}
	var p workflows.Progress
	if err := run.Get(ctx, &p); err != nil {
		aborted, ok := workflows.ProgressOf(err)
		if !ok {
			return fmt.Errorf("curriculum %s: %w", run.GetID(), err)
		}
		p = aborted
	}
	printProgress(stdout, run.GetID(), p)
	return nil
}

func randomSuffix() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// oneID parses "ID [flags]" or "[flags] ID".
func oneID(fs *flag.FlagSet, args []string, stderr io.Writer) (string, error) {
	var id string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		id, args = args[0], args[1:]
	}
	if err := parse(fs, args); err != nil {
		return "", err
	}
	if id == "" && fs.NArg() > 0 {
		id = fs.Arg(0)
	}
	if id == "" {
		fmt.Fprintf(stderr, "%s: the workflow id is required\n", fs.Name())
		return "", errUsage
	}
	return id, nil
}

func curriculumStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("curriculum status", stderr)
	var tf stackFlags
	tf.register(fs, partTemporal)
	asJSON := fs.Bool("json", false, "print the progress as JSON")
	id, err := oneID(fs, args, stderr)
	if err != nil {
		return err
	}
	c, err := tf.dialTemporal(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	p, closed, err := curriculumProgress(ctx, c, id)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(p)
	}
	printProgress(stdout, id, p)
	if closed != "" && p.Status == "" {
		fmt.Fprintf(stdout, "workflow %s\n", closed)
	}
	return nil
}

// curriculumProgress asks a running curriculum for its progress, or reads a finished
// one's result. closed is the workflow's closed status, "" while it runs.
func curriculumProgress(ctx context.Context, c client.Client, id string) (workflows.Progress, string, error) {
	var p workflows.Progress
	desc, err := c.DescribeWorkflow(ctx, id, "")
	if err != nil {
		return p, "", fmt.Errorf("curriculum %s: %w", id, err)
	}
	status := desc.RawResponse.GetWorkflowExecutionInfo().GetStatus()
	if status == enums.WORKFLOW_EXECUTION_STATUS_RUNNING {
		waiting := runningWaiting(desc.RawResponse, time.Now())
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		v, err := c.QueryWorkflow(qctx, id, "", workflows.QueryProgress)
		if err != nil {
			if ctx.Err() != nil || waiting == "" {
				return p, "", fmt.Errorf("query curriculum %s: %w", id, err)
			}
			// No worker answers (after a restart, before one polls again): what
			// Temporal knows is still worth saying.
			p.Status = workflows.StatusRunning
			p.Waiting = waiting + fmt.Sprintf("; no worker answered the progress query (%v)", err)
			return p, "", nil
		}
		if err := v.Get(&p); err != nil {
			return p, "", fmt.Errorf("query curriculum %s: %w", id, err)
		}
		p.Waiting = waiting
		return p, "", nil
	}
	closed := strings.ToLower(strings.TrimPrefix(status.String(), "WORKFLOW_EXECUTION_STATUS_"))
	if status == enums.WORKFLOW_EXECUTION_STATUS_COMPLETED {
		if err := c.GetWorkflow(ctx, id, "").Get(ctx, &p); err != nil {
			return p, closed, fmt.Errorf("curriculum %s result: %w", id, err)
		}
		return p, closed, nil
	}
	err = c.GetWorkflow(ctx, id, "").Get(ctx, &p)
	if aborted, ok := workflows.ProgressOf(err); ok {
		// Aborted: closed as canceled, with its progress.
		return aborted, closed, nil
	}
	return p, closed, fmt.Errorf("curriculum %s %s: %w", id, closed, err)
}

// runningWaiting says what a running curriculum waits for, from Temporal's record of
// its pending batch and workflow task; "" while it makes progress.
func runningWaiting(d *workflowservice.DescribeWorkflowExecutionResponse, now time.Time) string {
	var out []string
	for _, pa := range d.GetPendingActivities() {
		if s := workflows.BatchWaiting(pa, now); s != "" {
			out = append(out, s)
		}
	}
	if s := workflows.WorkflowTaskWaiting(d.GetPendingWorkflowTask(), now); s != "" {
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}

func printProgress(w io.Writer, id string, p workflows.Progress) {
	status := p.Status
	if p.PauseRequested {
		status += " (pausing after the batch in flight)"
	}
	fmt.Fprintf(w, "curriculum %s (%s): %s\n", id, p.Name, status)
	if p.PauseReason != "" {
		fmt.Fprintf(w, "paused by itself: %s\n", p.PauseReason)
	}
	if p.Stage < p.Stages {
		fmt.Fprintf(w, "stage %d/%d %s: %d episodes, success rate %.3f; last %d: success rate %.3f, reward mean %.3f\n",
			p.Stage+1, p.Stages, p.StageName, p.StageEpisodes, p.StageSuccessRate, p.WindowEpisodes, p.WindowSuccessRate, p.WindowRewardMean)
		if p.StageInfraErrors > 0 {
			fmt.Fprintf(w, "  %d of the stage's episodes ended as infra errors (%s), left out of its rates, window and budget\n",
				p.StageInfraErrors, workflows.FormatInfraKinds(p.StageInfraByKind))
		}
	}
	if p.Waiting != "" {
		fmt.Fprintf(w, "%s\n", p.Waiting)
	}
	for _, d := range p.Drift {
		fmt.Fprintf(w, "drift %s = %g\n", d.Selector, d.Value)
	}
	if p.RunPrefix == "" {
		return // no worker answered: only what Temporal knows (Waiting)
	}
	fmt.Fprintf(w, "%d episodes in all; runs %s-s<stage>-b<batch>\n", p.TotalEpisodes, p.RunPrefix)
	if len(p.Reports) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STAGE\tNAME\tOUTCOME\tEPISODES\tSUCCESS\tREWARD MEAN\tWINDOW\tBATCHES\tINFRA ERRORS")
	for _, r := range p.Reports {
		// Rates over the scored episodes: infra errors carry no reward.
		b := workflows.BatchResult{Episodes: r.Episodes, InfraErrors: r.InfraErrors, Succeeded: r.Succeeded, RewardSum: r.RewardSum}
		infra := fmt.Sprint(r.InfraErrors)
		if len(r.InfraByKind) > 0 {
			infra += " (" + workflows.FormatInfraKinds(r.InfraByKind) + ")"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%.3f\t%.3f\t%.3f\t%d\t%s\n", r.Index+1, r.Name, r.Outcome, r.Episodes, b.SuccessRate(), b.RewardMean(), r.WindowValue, r.Batches, infra)
	}
	_ = tw.Flush()
}

func curriculumSignal(ctx context.Context, signal string, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("curriculum "+signal, stderr)
	var tf stackFlags
	tf.register(fs, partTemporal)
	id, err := oneID(fs, args, stderr)
	if err != nil {
		return err
	}
	c, err := tf.dialTemporal(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.SignalWorkflow(ctx, id, "", signal, nil); err != nil {
		return fmt.Errorf("%s curriculum %s: %w", signal, id, err)
	}
	fmt.Fprintf(stdout, "%s sent to %s (takes effect after the batch in flight)\n", signal, id)
	return nil
}

// cmdBatch is `gauntlet batch start`: a Batch workflow of one run spec.
func cmdBatch(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "start" {
		fmt.Fprint(stderr, "Usage: gauntlet batch start [--env shop --policies oracle=1 --episodes N ...] [--id ID] [--wait]\n")
		return errUsage
	}
	fs := newFlagSet("batch start", stderr)
	var tf stackFlags
	tf.register(fs, partTemporal)
	var o runOpts
	o.register(fs, 1000)
	o.registerEndpoint(fs)
	id := fs.String("id", "", "workflow id (default: batch-<random>)")
	wait := fs.Bool("wait", true, "wait for the batch and print its statistics")
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	o.tasks.datasets = tf.datasets
	req, err := o.request()
	if err != nil {
		return err
	}
	var params map[string]any
	if err := json.Unmarshal([]byte(req.ParamsJson), &params); err != nil {
		return fmt.Errorf("--params: want a JSON object: %w", err)
	}
	spec := workflows.BatchSpec{
		Env: o.env, Params: params, Policies: o.policies, Profiles: o.profiles, Episodes: o.episodes,
		Seed: o.seed, MaxInFlight: uint32(o.maxInFlight), MaxSteps: uint32(o.maxSteps), Label: o.label, Drift: o.drift,
	}
	if ep := req.GetPolicyEndpoint(); ep != nil {
		spec.PolicyEndpoint = &workflows.EndpointSpec{URL: ep.GetUrl(), Model: ep.GetModel(), Credential: ep.GetCredential(),
			Logprobs: policy.LogprobsOf(ep.GetLogprobs())}
	}
	if o.spec != nil {
		spec.RewardSpec = o.spec.Source // the workflow puts it in the stack's bucket
	}
	if *id == "" {
		*id = "batch-" + randomSuffix()
	}
	c, err := tf.dialTemporal(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	run, err := c.ExecuteWorkflow(ctx, client.StartWorkflowOptions{
		ID: *id, TaskQueue: workflows.TaskQueue, Memo: map[string]any{workflows.MemoSubmittedBy: runs.Submitter()},
	}, workflows.WorkflowBatch, spec)
	if err != nil {
		return fmt.Errorf("start batch %s: %w", *id, err)
	}
	fmt.Fprintln(stdout, run.GetID())
	if !*wait {
		return nil
	}
	var res workflows.BatchResult
	if err := run.Get(ctx, &res); err != nil {
		return fmt.Errorf("batch %s: %w", run.GetID(), err)
	}
	fmt.Fprintf(stdout, "run %s: %d episodes, success rate %.3f, reward mean %.3f, %d steps, %d faults fired, %d infra errors\n",
		res.RunID, res.Episodes, res.SuccessRate(), res.RewardMean(), res.Steps, res.FaultsFired, res.InfraErrors)
	if res.InfraErrors > 0 {
		fmt.Fprintf(stdout, "infra errors (%s) are left out of the success rate and reward mean\n", workflows.FormatInfraKinds(res.InfraByKind))
	}
	return nil
}

// uiHint renders the Web UI address for `gauntlet up`'s banner.
func uiHint(url string) string {
	if url == "" {
		return ""
	}
	return ", web ui " + url
}

// sdkLogger adapts slog for the SDK client of short-lived commands.
type sdkLogger struct {
	l interface{ Error(string, ...any) }
}

func (s sdkLogger) Debug(string, ...any)        {}
func (s sdkLogger) Info(string, ...any)         {}
func (s sdkLogger) Warn(string, ...any)         {}
func (s sdkLogger) Error(msg string, kv ...any) { s.l.Error(msg, kv...) }
