package taskenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/boundary"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks/taskstest"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ErrEpisodeOver is returned by Step after the episode ended.
var ErrEpisodeOver = errors.New("tasks: episode is over")

// ErrNotReset is returned by Step before the first Reset.
var ErrNotReset = errors.New("tasks: Step before Reset")

// The workspace folders the task's fixed paths lead to (sandbox.Spec.Links).
const (
	appDir      = "app"
	logsDir     = "logs"
	testsDir    = "tests"
	solutionDir = "solution"
)

// links are the paths of Harbor's layout, each a folder of the workspace.
var links = map[string]string{
	"/app": appDir, "/logs": logsDir,
	tasks.TestsMount: testsDir, tasks.SolutionMount: solutionDir,
}

// WorkDir is where the agent's commands run unless they say otherwise when the task's
// image gives no WORKDIR (or the runtime runs no image): the WORKDIR the datasets'
// Dockerfiles set. An image's own WORKDIR takes its place (workDir).
const WorkDir = "/app"

// opTimeout bounds one sandbox operation gauntlet makes on its own (acquire, snapshot,
// fork, copying tests in); the task's timeouts bound the agent's and verifier's commands.
const opTimeout = 60 * time.Second

// maxOutput caps what a shell.exec returns of stdout and of stderr.
const maxOutput = 16 << 10

// maxFile caps fs.read results and fs.write content.
const maxFile = 256 << 10

// Safety events the env records, besides the sandbox's and the tools' own.
const (
	// EventVerifierPathWritten: the agent wrote to /tests, /logs/verifier or /solution.
	EventVerifierPathWritten = "verifier_path_written"
	// EventVerifierPlanted: the verifier's fork held something the agent left for the
	// verifier (a reward file, a tests/ folder, /logs replaced); it was removed first.
	EventVerifierPlanted = "verifier_planted"
	// EventCanarySolved: the verifier passed a canary task (task.toml's [metadata]
	// canary = true), which no agent can solve honestly: the success is a hack. The
	// verdict stands as the verifier gave it; the event, on the verdict's step, marks it.
	EventCanarySolved = "canary_solved"
)

type episode struct {
	cfg        env.Config
	task       *tasks.Task
	maxSteps   uint32
	maxInvalid int
	deadline   time.Duration

	sb string
	// workdir is where commands run unless they name a folder (the image's WORKDIR, else
	// WorkDir), and links the sandbox's paths that lead into its workspace: Harbor's,
	// and the WORKDIR's top folder when it is none of them (workDir).
	workdir string
	links   map[string]string
	// verifier is who the verifier runs as.
	verifier verifierUser
	tb       *tools.Toolbox
	events   []sandbox.Event
	// net records what the agent's commands tried on the network (the steps' diffs), and
	// holds the sandbox's gateway to the task's allowed hosts, if it has any; nil before
	// Reset.
	net *network
	// bnd applies the plan's storage, resource and clock faults at the sandbox's
	// boundaries (package boundary), as codefix's episodes get them; its DNS faults meet
	// the lookups at net's name server.
	bnd    *boundary.Layer
	faults *inject.Injector
	// calls are the calls the injector evaluated, so a branch can rebuild one in the same
	// state.
	calls []faultCall

	ready   bool
	done    bool
	reason  gauntletv1.TerminationReason
	step    uint32
	clock   time.Duration
	invalid int
}

// faultCall is one call evaluated by the fault injector.
type faultCall struct {
	service, tool string
	now           time.Duration
}

func (e *episode) Now() time.Duration { return e.clock }

// resetObs is the first observation.
type resetObs struct {
	Task        string   `json:"task"`
	Digest      string   `json:"digest"`
	Instruction string   `json:"instruction"`
	WorkDir     string   `json:"workdir"`
	Tools       []string `json:"tools"`
	MaxSteps    uint32   `json:"max_steps"`
	DeadlineMs  int64    `json:"deadline_ms"`
}

// sandboxSpec is the sandbox the task runs in, and the folder its commands run in: the
// task's links (Harbor's paths, each a workspace folder) and limits, on the task's image
// where the runtime can prepare one (sandbox.ImagePreparer: the image's /app becomes the
// workspace's app/; the runtime runs commands as the image's USER, and they run in its
// WORKDIR: workDir); elsewhere (a process runtime without an image store) on the
// runtime's own root, with environment/app in the workspace (what the Dockerfile copies
// to /app), in WorkDir.
//
// agent.user, when set, is the sandbox's Spec.User over the image's USER; verifier is then
// who the verifier runs as (see verifierUser).
func sandboxSpec(ctx context.Context, rt sandbox.Runtime, t *tasks.Task) (spec sandbox.Spec, workdir string, verifier verifierUser, err error) {
	c := t.Config.Environment
	spec = sandbox.Spec{
		Template: Template,
		Limits:   limits(c.CPUs, c.MemoryMB, c.StorageMB),
		// The runtime makes the folders: /app, /logs, /tests and /solution exist and are
		// empty unless environment/app or the image fills /app.
		Links:    links,
		Labels:   map[string]string{"env": Name, "task": t.ID},
		Services: egressServices(c, rt),
	}
	spec.User = t.Config.Agent.User
	if verifier, err = verifierFor(rt, t); err != nil {
		return sandbox.Spec{}, "", verifierUser{}, err
	}
	if p, ok := rt.(sandbox.ImagePreparer); ok {
		img, err := taskImage(ctx, p, t)
		if err != nil {
			return sandbox.Spec{}, "", verifierUser{}, err
		}
		if img.ref != "" {
			spec.Image = img.ref
			wd, err := workDir(&spec, img.workdir)
			if err != nil {
				return sandbox.Spec{}, "", verifierUser{}, fmt.Errorf("tasks: task %s: %w", t.ID, err)
			}
			if verifier.set && t.Config.Verifier.User == "" {
				verifier.user = img.user
			}
			return spec, wd, verifier, nil
		}
	}
	files, err := workspaceFiles(filepath.Join(t.Environment.Context, taskstest.WorkspaceDir), appDir)
	if err != nil {
		return sandbox.Spec{}, "", verifierUser{}, fmt.Errorf("tasks: task %s: environment/%s: %w", t.ID, taskstest.WorkspaceDir, err)
	}
	spec.Workspace = files
	return spec, WorkDir, verifier, nil
}

// verifierUser is who the verifier's fork runs as. Unset, the fork keeps its source's
// user (the image's USER); set, its Spec.User is user: verifier.user when the task names
// one, else the image's USER when agent.user replaced it for the agent ("" for an image
// without one: the runtime's user, as for the agent), as Harbor runs each as the
// container's default unless its table names a user.
type verifierUser struct {
	set  bool
	user string
}

// ErrUser is a task's agent.user or verifier.user the runtime cannot honour.
var ErrUser = errors.New("tasks: user not supported")

// verifierFor is the verifier's user for t on rt, the image's USER left to sandboxSpec; a
// runtime whose forks cannot run as another user refuses a task that needs one rather than
// running test.sh as the agent's user.
func verifierFor(rt sandbox.Runtime, t *tasks.Task) (verifierUser, error) {
	v := verifierUser{set: t.Config.Agent.User != "" || t.Config.Verifier.User != "", user: t.Config.Verifier.User}
	if _, ok := rt.(sandbox.UserForker); v.set && !ok {
		field := "verifier.user"
		if t.Config.Verifier.User == "" {
			field = "agent.user" // the verifier would otherwise run as the agent's user
		}
		return verifierUser{}, fmt.Errorf("%w: task %s: %s: runtime %s cannot run the verifier as another user than the agent", ErrUser, t.ID, field, rt.Name())
	}
	return v, nil
}

// ErrWorkDir is an image's WORKDIR the agent's work could not be kept in for the
// verifier: below a folder the sandbox provides itself (/usr, /etc, /tmp, ...) or below
// one of the verifier's paths.
var ErrWorkDir = errors.New("tasks: unusable WORKDIR")

// workDir is the folder an image's WORKDIR (wd, "" when it gives none) makes commands
// run in, as Docker runs them there. The verifier judges the workspace and its links
// only (a snapshot keeps nothing else of the root), so the WORKDIR must lie in them:
// under /app or /workspace it does; otherwise its top folder (/srv of /srv/app)
// becomes a link of spec into a workspace folder of the same name, which holds what the
// image put there, as the image's /app goes to app/.
func workDir(spec *sandbox.Spec, wd string) (string, error) {
	if wd == "" {
		return WorkDir, nil
	}
	wd = path.Clean("/" + wd)
	top, _, _ := strings.Cut(strings.TrimPrefix(wd, "/"), "/")
	switch {
	case wd == "/":
		return WorkDir, nil // Docker's default: Harbor's tasks expect /app
	case top == appDir, "/"+top == sandbox.WorkspacePath:
		return wd, nil
	case spec.Links["/"+top] != "":
		return "", fmt.Errorf("%w: the image's WORKDIR %s is below %s, the verifier's", ErrWorkDir, wd, "/"+top)
	}
	l := maps.Clone(spec.Links)
	l["/"+top] = top
	s := *spec
	s.Links = l
	if err := s.Validate(); err != nil {
		return "", fmt.Errorf("%w: the image's WORKDIR %s: its folder /%s cannot be kept for the verifier: %v", ErrWorkDir, wd, top, err)
	}
	spec.Links = l
	return wd, nil
}

// ImageRepository is the repository of the task images built from Dockerfiles, in the
// runtime's registry; each is tagged by the digest of its build context.
const ImageRepository = "gauntlet/tasks"

// prepared holds the image each task (by content digest, which covers environment/)
// got from each runtime, so an episode start after the first costs no registry lookup.
var prepared sync.Map // preparedKey → preparedImage

// preparedImage is a task's image on a runtime: its reference ("" when the runtime has
// no image store), its WORKDIR and its USER ("" when it gives none or the runtime cannot
// say).
type preparedImage struct {
	ref, workdir, user string
}

type preparedKey struct {
	rt     sandbox.ImagePreparer
	digest string
}

// taskImage returns the runtime's image of the task: [environment].docker_image
// pulled, or environment/Dockerfile built (under the task's build timeout) and pulled,
// with its WORKDIR where the runtime reads image configs (sandbox.ImageInspector); no
// reference when the runtime has no image store.
func taskImage(ctx context.Context, p sandbox.ImagePreparer, t *tasks.Task) (preparedImage, error) {
	key := preparedKey{p, t.Digest}
	if img, ok := prepared.Load(key); ok {
		return img.(preparedImage), nil
	}
	src := sandbox.ImageSource{Image: t.Environment.Image}
	if src.Image == "" {
		src = sandbox.ImageSource{Context: t.Environment.Context, Repository: ImageRepository}
	}
	ctx, cancel := context.WithTimeout(ctx, t.Config.Environment.BuildTimeout+opTimeout)
	defer cancel()
	ref, err := p.PrepareImage(ctx, src)
	if errors.Is(err, sandbox.ErrUnavailable) {
		ref, err = "", nil // the runtime has no image store: its own root
	}
	if err != nil {
		return preparedImage{}, fmt.Errorf("tasks: task %s: image: %w", t.ID, err)
	}
	img := preparedImage{ref: ref}
	if ins, ok := p.(sandbox.ImageInspector); ok && ref != "" {
		c, err := ins.ImageConfig(ctx, ref)
		if err != nil {
			return preparedImage{}, fmt.Errorf("tasks: task %s: image: %w", t.ID, err)
		}
		img.workdir, img.user = c.WorkingDir, c.User
	}
	prepared.Store(key, img)
	return img, nil
}

// limits are a sandbox's limits for [environment]'s cpus, memory_mb and storage_mb.
func limits(cpus, memoryMB, storageMB int) sandbox.Limits {
	return sandbox.Limits{MemoryBytes: int64(memoryMB) << 20, CPUMillis: int64(max(cpus, 1)) * 1000, DiskBytes: int64(storageMB) << 20}
}

// workspaceFiles reads the regular files below dir (none when it does not exist) as
// workspace files under prefix, keeping their permission bits. A link or special file is
// refused: a task folder is copied into sandboxes as it is, and a link could lead anywhere
// on the host.
func workspaceFiles(dir, prefix string) ([]sandbox.File, error) {
	var out []sandbox.File
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && errors.Is(err, fs.ErrNotExist) {
				return filepath.SkipDir
			}
			return err
		}
		if d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s: %w", filepath.ToSlash(rel), tasks.ErrNotRegular)
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out = append(out, sandbox.File{Path: path.Join(prefix, filepath.ToSlash(rel)), Data: data, Mode: fi.Mode().Perm()})
		return nil
	})
	return out, err
}

// Reset gives the episode a fresh sandbox holding the task's workspace (releasing the
// previous one) and returns the instruction.
func (e *episode) Reset() (json.RawMessage, error) {
	if e.task == nil {
		return nil, ErrNoDatasets
	}
	if e.cfg.Sandboxes == nil {
		return nil, fmt.Errorf("tasks: %w", env.ErrNoSandbox)
	}
	spec, workdir, verifier, err := sandboxSpec(context.Background(), e.cfg.Sandboxes.Runtime(), e.task)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := e.release(ctx); err != nil {
		return nil, err
	}
	*e = episode{cfg: e.cfg, task: e.task, maxSteps: e.maxSteps, maxInvalid: e.maxInvalid, deadline: e.deadline, faults: e.cfg.Faults}
	h, err := e.cfg.Sandboxes.Acquire(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("tasks: task %s: acquire sandbox: %w", e.task.ID, err)
	}
	e.sb, e.ready = h.ID, true
	e.workdir, e.links, e.verifier = workdir, spec.Links, verifier
	// The layer attaches no gateway (Services unset): the task's own, net, records its
	// requests as steps' diffs.
	if e.bnd, err = boundary.Open(ctx, boundary.Options{
		Env: "tasks", Target: tools.Service, Runtime: e.cfg.Sandboxes.Runtime(), Sandbox: h.ID,
		Limits: spec.Limits, Faults: e.faults, Clock: &e.clock,
	}); err != nil {
		return nil, errors.Join(err, e.release(ctx))
	}
	if e.net, err = attachNetwork(ctx, e.cfg.Sandboxes.Runtime(), h.ID, spec.Services, servicesDecider(e.faults), nil, 0); err != nil {
		return nil, errors.Join(err, e.release(ctx))
	}
	e.tb = e.toolbox()
	return json.Marshal(resetObs{
		Task: e.task.ID, Digest: e.task.Digest, Instruction: e.task.Instruction, WorkDir: e.workdir,
		Tools: toolNames, MaxSteps: e.maxSteps, DeadlineMs: e.deadline.Milliseconds(),
	})
}

// toolbox returns the workspace tools of e's sandbox; refusals and sandbox events go to
// e.events.
func (e *episode) toolbox() *tools.Toolbox {
	return tools.New(e.cfg.Sandboxes.Runtime(), e.sb, tools.Options{
		OnEvent:      func(ev sandbox.Event) { e.events = append(e.events, ev) },
		OnEgress:     e.net.egress,
		MaxFileBytes: maxFile, ExecTimeout: min(e.deadline, e.task.Config.Agent.Timeout), OutputLimit: maxOutput,
		Storage: e.bnd.Gate(), ExecEnv: e.bnd.ExecEnv,
	})
}

// Branch splits the episode: the branch gets a sandbox forked from a snapshot of this
// one's, and the same task, step, clock and fault-injector state; both go on
// independently (tree search over actions). The caller closes the branch.
func (e *episode) Branch(ctx context.Context) (env.Episode, error) {
	if !e.ready || e.sb == "" {
		return nil, ErrNotReset
	}
	snap, fork, err := snapshotFork(e.cfg.Sandboxes.Runtime())
	if err != nil {
		return nil, err
	}
	s, err := snap.Snapshot(ctx, e.sb)
	if err != nil {
		return nil, fmt.Errorf("tasks: branch: snapshot %s: %w", e.sb, err)
	}
	defer func() { _ = snap.DeleteSnapshot(context.WithoutCancel(ctx), s.ID) }()
	h, err := fork.Fork(ctx, s.ID)
	if err != nil {
		return nil, fmt.Errorf("tasks: branch: fork %s: %w", s.ID, err)
	}
	b := &episode{}
	*b = *e
	b.sb, b.events, b.calls, b.net = h.ID, nil, slices.Clone(e.calls), nil
	// The branch's tools, commands and limits meet what this episode's would from here
	// on.
	if b.bnd, err = e.bnd.Branch(ctx, h.ID, &b.clock); err != nil {
		return nil, errors.Join(err, e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID))
	}
	if e.net != nil {
		// The branch's requests meet what this episode's would from here on.
		if b.net, err = attachNetwork(ctx, e.cfg.Sandboxes.Runtime(), h.ID, e.net.services, e.net.d.Clone(), nil, e.clock); err != nil {
			return nil, errors.Join(err, b.bnd.Close(ctx), e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID))
		}
	}
	if e.cfg.Faults != nil {
		if b.faults, err = inject.NewInjector(e.cfg.Faults.Plan()); err != nil {
			b.net.close()
			return nil, errors.Join(fmt.Errorf("tasks: branch: fault plan: %w", err), b.bnd.Close(ctx), e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID))
		}
		for _, c := range e.calls {
			b.faults.Call(c.service, c.tool, c.now)
		}
	}
	b.tb = b.toolbox()
	return b, nil
}

// snapshotFork returns rt's snapshot and fork abilities, which branches and the verifier
// need.
func snapshotFork(rt sandbox.Runtime) (sandbox.Snapshotter, sandbox.Forker, error) {
	snap, ok1 := rt.(sandbox.Snapshotter)
	fork, ok2 := rt.(sandbox.Forker)
	if !ok1 || !ok2 {
		return nil, nil, fmt.Errorf("tasks: runtime %s cannot snapshot and fork: %w", rt.Name(), sandbox.ErrUnsupported)
	}
	return snap, fork, nil
}

// Close releases the episode's sandbox. It is safe to call more than once.
func (e *episode) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	return e.release(ctx)
}

func (e *episode) release(ctx context.Context) error {
	if e.sb == "" {
		return nil
	}
	id := e.sb
	e.sb = ""
	e.net.close()
	e.net = nil
	lerr := e.bnd.Close(ctx)
	e.bnd = nil
	if err := e.cfg.Sandboxes.Release(ctx, id); err != nil {
		return errors.Join(lerr, fmt.Errorf("tasks: release sandbox %s: %w", id, err))
	}
	return lerr
}

// Sandbox returns the runtime and the id of the episode's current sandbox.
func (e *episode) Sandbox() (sandbox.Runtime, string) { return e.cfg.Sandboxes.Runtime(), e.sb }

// errObs is the observation of a call that failed.
type errObs struct {
	OK           bool   `json:"ok"`
	Error        string `json:"error"`
	Status       uint32 `json:"status,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	Suggestion   string `json:"suggestion,omitempty"`
}

// shellObs is shell.exec's observation: the tool's result without the sandbox's metering,
// which goes to the step's Metering (it differs between runs; observations must not).
type shellObs struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Step applies one action. Bad actions are observations; a Go error is an infra error
// (the sandbox runtime failed, or the verifier did) and the episode is dead.
func (e *episode) Step(a env.Action) (env.StepResult, error) {
	switch {
	case !e.ready:
		return env.StepResult{}, ErrNotReset
	case e.done:
		return env.StepResult{}, fmt.Errorf("%w (%s)", ErrEpisodeOver, e.reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.deadline+opTimeout)
	defer cancel()
	start := e.clock
	e.events = e.events[:0]
	var (
		obs     []byte
		fired   []*gauntletv1.FaultFired
		safety  []string
		errs    uint32
		calls   = uint32(1)
		meter   sandbox.Metering
		metered bool
		v       *verdict
	)
	t, args, bad := parseAction(a)
	switch {
	case bad != nil:
		calls = 0
		e.invalid++
		errs++
		obs = marshal(bad)
	case t.name == ToolSubmit:
		var err error
		if v, err = e.verify(ctx); err != nil {
			return env.StepResult{}, err
		}
		obs = marshal(v)
	default:
		cost := costFS
		if t.name == tools.ShellExec {
			cost = costShell
		}
		out := e.faults.Call(t.service, t.name, e.clock)
		e.calls = append(e.calls, faultCall{t.service, t.name, e.clock})
		e.net.publish(e.clock)
		e.clock += cost + out.Latency
		fired = out.Fired
		if out.Status != 0 {
			errs++
			obs = marshal(errObs{Error: fmt.Sprintf("%s failed: injected status %d", t.name, out.Status),
				Status: out.Status, RetryAfterMs: out.RetryAfter.Milliseconds(), Suggestion: "the call had no effect; try it again"})
			break
		}
		// The limits of this moment, and the call's storage faults collected from here.
		if err := e.bnd.Begin(ctx, t.name, start); err != nil {
			return env.StepResult{}, err
		}
		args, safety = e.translate(t.name, args)
		res, err := e.tb.Call(ctx, t.name, args)
		if t.name == tools.ShellExec {
			e.bnd.CommandDone(e.clock)
		}
		fired = append(slices.Clip(fired), e.bnd.Fired()...)
		switch {
		case err != nil && !tools.AgentError(err):
			return env.StepResult{}, fmt.Errorf("tasks: %s: %w", t.name, err)
		case err != nil:
			errs++
			obs = marshal(errObs{Error: err.Error()})
		case t.name == tools.ShellExec:
			var r tools.ExecResult
			if err := json.Unmarshal(res, &r); err != nil {
				return env.StepResult{}, fmt.Errorf("tasks: shell.exec result: %w", err)
			}
			meter, metered = r.Metering, true
			if r.ExitCode != 0 {
				errs++
			}
			obs = marshal(shellObs{ExitCode: r.ExitCode, Stdout: text(r.Stdout), Stderr: text(r.Stderr), TimedOut: r.TimedOut, Truncated: r.Truncated})
		default:
			obs = res
		}
		if out.Keep < 1 {
			obs = marshal(struct {
				Truncated bool   `json:"truncated"`
				Body      string `json:"body"`
			}{true, string(out.Truncate(obs))})
		}
	}
	var limits []string
	for _, ev := range e.events {
		if ev.Kind.Limit() {
			limits = append(limits, string(ev.Kind)+": "+ev.Detail)
		} else {
			safety = append(safety, string(ev.Kind)+": "+ev.Detail)
		}
	}
	if e.step == 0 {
		// The resource faults in force, once, as codefix records them.
		if amb := e.bnd.Ambient(); len(amb) > 0 {
			fired = append(amb, fired...)
		}
	}
	e.step++
	// Out of steps or time: the verifier judges what the agent left, as after a submit.
	if v == nil && calls > 0 && (e.step >= e.maxSteps || e.clock > e.deadline) {
		var err error
		if v, err = e.verify(ctx); err != nil {
			return env.StepResult{}, err
		}
		obs = marshal(struct {
			Last    json.RawMessage `json:"last"`
			Verdict *verdict        `json:"verdict"`
		}{obs, v})
	}
	// What the agent's requests met and where they went (the verifier's too, on the
	// step that ran it), once the gateway has recorded all of it.
	e.net.settle(ctx)
	if nf := e.net.faults(); len(nf) > 0 {
		fired = append(slices.Clip(fired), nf...)
	}
	diff := e.net.diff()
	progress, success := 0.0, false
	var names []string
	var values []float64
	if v != nil {
		safety = append(safety, v.safety...)
		progress, success = v.progress(), v.Pass
		names, values = v.named()
		if success && e.task.Config.Metadata.Canary {
			safety = append(safety, EventCanarySolved+": "+e.task.ID)
		}
	}
	m := &gauntletv1.Metering{
		ToolCalls: calls, Errors: errs, VirtualNs: uint64(e.clock - start),
		BytesIn: uint32(len(a.Args)), BytesOut: uint32(len(obs)), Runtime: e.cfg.Sandboxes.Runtime().Name(),
	}
	if metered {
		m.CpuNs = uint64(meter.CPUTime)
		m.PeakMemoryBytes = uint64(max(meter.PeakMemoryBytes, 0))
		m.Processes = uint32(max(meter.Processes, 0))
		m.ReadBytes = uint64(max(meter.BytesRead, 0))
		m.WrittenBytes = uint64(max(meter.BytesWritten, 0))
	}
	res := env.StepResult{
		Observation: obs, Diff: diff, Faults: fired, Metering: m,
		Signals: &gauntletv1.Signals{
			Progress: progress, ProgressDelta: progress, InvalidAction: calls == 0, Success: success,
			DeadlineVirtualNs: int64(e.deadline), SafetyEvents: safety, Limits: limits,
			VerifierNames: names, VerifierValues: values,
		},
	}
	env.End{
		Success: success, Failure: v != nil && t != nil && t.name == ToolSubmit,
		Invalid: e.invalid, MaxInvalid: e.maxInvalid,
		Clock: e.clock, Deadline: e.deadline, Step: e.step, MaxSteps: e.maxSteps,
	}.Apply(&res)
	e.done, e.reason = res.Done(), res.Reason
	return res, nil
}

// translate rewrites the paths of a tool's arguments that name Harbor's fixed paths (/app,
// /logs, ...) into the workspace, where the tools look; relative paths are relative to the
// task's working directory (/app), as in the agent's commands, and shell.exec runs there
// when it names no directory. Writes to the verifier's paths are reported.
func (e *episode) translate(tool string, args json.RawMessage) (json.RawMessage, []string) {
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(args))
	d.UseNumber() // numbers go back to the tool as they came
	if err := d.Decode(&m); err != nil {
		return args, nil // the tool reports it
	}
	key := "path"
	if tool == tools.ShellExec {
		key = "dir"
		if _, ok := m[key]; !ok {
			m[key] = e.workdir
		}
	}
	p, ok := m[key].(string)
	if !ok {
		return args, nil
	}
	var safety []string
	if q, ok := inWorkspace(p, e.workdir, e.links); ok {
		m[key] = q
		if (tool == tools.FSWrite || tool == tools.FSPatch) && verifierPath(q) {
			safety = append(safety, fmt.Sprintf("%s: %s %s", EventVerifierPathWritten, tool, p))
		}
	}
	out, err := json.Marshal(m)
	if err != nil {
		return args, safety
	}
	return out, safety
}

// inWorkspace maps a path relative to workdir, or an absolute one under one of the links,
// to the workspace path it shows, and reports whether it did.
func inWorkspace(p, workdir string, links map[string]string) (string, bool) {
	if p == "" {
		return p, false // the tool reports it
	}
	if !path.IsAbs(p) {
		p = path.Join(workdir, p)
	}
	c := path.Clean(p)
	for l, dir := range links {
		if c == l || strings.HasPrefix(c, l+"/") {
			return path.Join(sandbox.WorkspacePath, dir, strings.TrimPrefix(c, l)), true
		}
	}
	return p, false
}

// verifierPath reports whether a workspace path q is the verifier's: tests/, solution/ or
// logs/verifier/.
func verifierPath(q string) bool {
	rel := strings.TrimPrefix(q, sandbox.WorkspacePath+"/")
	for _, d := range []string{testsDir, solutionDir, logsDir + "/verifier"} {
		if rel == d || strings.HasPrefix(rel, d+"/") {
			return true
		}
	}
	return false
}

// parseAction checks an action against its tool's schema: a known tool, a JSON object with
// only the schema's properties, the required ones present (the tools check the types). A bad action returns the observation saying why.
func parseAction(a env.Action) (*toolDef, json.RawMessage, *errObs) {
	i := slices.IndexFunc(toolDefs, func(t toolDef) bool { return t.name == a.Tool })
	if i < 0 {
		return nil, nil, &errObs{Error: fmt.Sprintf("unknown tool %.60q", a.Tool), Suggestion: "use one of: " + strings.Join(toolNames, ", ")}
	}
	t := &toolDefs[i]
	raw := bytes.TrimSpace(a.Args)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, nil, &errObs{Error: t.name + ": args must be a JSON object", Suggestion: "schema: " + string(t.schema)}
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	_ = json.Unmarshal(t.schema, &schema) // the tools' own schemas
	keys := slices.Sorted(maps.Keys(fields))
	for _, k := range keys {
		if _, ok := schema.Properties[k]; !ok {
			return nil, nil, &errObs{Error: fmt.Sprintf("%s: unknown argument %.40q", t.name, k), Suggestion: "schema: " + string(t.schema)}
		}
	}
	for _, k := range schema.Required {
		if _, ok := fields[k]; !ok {
			return nil, nil, &errObs{Error: fmt.Sprintf("%s: missing argument %q", t.name, k), Suggestion: "schema: " + string(t.schema)}
		}
	}
	return t, raw, nil
}

// marshal encodes an observation: the package's own structs, which always encode.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"ok":false,"error":"internal: observation did not encode"}`)
	}
	return b
}

// text returns s with invalid UTF-8 replaced, so observations read back the same.
func text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
