package codefix

import (
	"context"
	"crypto/md5"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/faults/inject"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/boundary"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// ErrEpisodeOver is returned by Step after the episode terminated or was truncated.
var ErrEpisodeOver = errors.New("codefix: episode is over")

// ErrNotReset is returned by Step before the first Reset.
var ErrNotReset = errors.New("codefix: Step before Reset")

// Virtual cost of each kind of call: the clock is the env's, never the host's, so the same
// actions take the same virtual time on any machine.
const (
	costShell = 500 * time.Millisecond
	costFS    = 20 * time.Millisecond
)

// Safety events codefix records itself, besides the sandbox's and the tools' own
// (sandbox.EventKind, e.g. tools.EventPathTraversal), recorded as "kind: detail".
const (
	// EventTestsModified: the agent wrote under tests/ (reward hacking).
	EventTestsModified = "tests_modified"
)

// opTimeout bounds one sandbox operation gauntlet makes on its own (acquire, snapshot,
// verifier commands); the agent's commands have their own timeout.
const opTimeout = 60 * time.Second

// faultCall is one call evaluated by the fault injector, kept so a branch can rebuild an
// injector in the same state.
type faultCall struct {
	service, tool string
	now           time.Duration
}

type episode struct {
	cfg      env.Config
	p        params
	task     task
	maxSteps uint32

	// sb is the sandbox the episode runs in ("" before Reset and after Close); tb runs
	// the workspace tools in it and reports refusals into events.
	sb     string
	tb     *tools.Toolbox
	events []sandbox.Event
	faults *inject.Injector
	calls  []faultCall
	// bnd applies the plan's faults at the sandbox's boundaries: storage, resources,
	// clock skew, and the docs service's gateway (param docs=1). Nil before Reset.
	bnd *boundary.Layer
	// digest is the md5 of every file of the workspace after the last step, for diffs.
	digest map[string]string

	ready   bool
	done    bool
	reason  gauntletv1.TerminationReason
	step    uint32
	clock   time.Duration
	invalid int
}

func (e *episode) Now() time.Duration { return e.clock }

// resetObs is the first observation.
type resetObs struct {
	Task        string   `json:"task"`
	Files       []string `json:"files"`
	TestCommand string   `json:"test_command"`
	Tools       []string `json:"tools"`
	MaxSteps    uint32   `json:"max_steps"`
	DeadlineMs  int64    `json:"deadline_ms"`
	// DocsURL is the docs service (param docs=1), also in $DOCS_URL.
	DocsURL string `json:"docs_url,omitempty"`
}

// Reset gives the episode a fresh sandbox seeded with the task's project (releasing the
// previous one, if any) and returns the task.
func (e *episode) Reset() (json.RawMessage, error) {
	if e.cfg.Sandboxes == nil {
		return nil, fmt.Errorf("codefix: %w", env.ErrNoSandbox)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := e.release(ctx); err != nil {
		return nil, err
	}
	*e = episode{cfg: e.cfg, p: e.p, task: e.task, maxSteps: e.maxSteps, faults: e.cfg.Faults}
	spec, err := sandboxSpec(e.task, e.p)
	if err != nil {
		return nil, err
	}
	h, err := e.cfg.Sandboxes.Acquire(ctx, spec)
	if err != nil {
		return nil, fmt.Errorf("codefix: acquire sandbox: %w", err)
	}
	e.sb, e.ready = h.ID, true
	e.bnd, err = boundary.Open(ctx, boundary.Options{
		Env: "codefix", Target: Service, Runtime: e.cfg.Sandboxes.Runtime(), Sandbox: e.sb,
		Limits: spec.Limits, Services: spec.Services, Faults: e.faults, Clock: &e.clock,
	})
	if err != nil {
		return nil, errors.Join(err, e.release(ctx))
	}
	e.tb = e.toolbox()
	e.digest = map[string]string{}
	for p, c := range e.task.files {
		sum := md5.Sum([]byte(c))
		e.digest[p] = hex.EncodeToString(sum[:])
	}
	obs := resetObs{
		Task: e.task.files[ReadmePath], Files: e.task.paths(), TestCommand: TestCommand,
		Tools: toolNames, MaxSteps: e.maxSteps, DeadlineMs: e.p.deadline.Milliseconds(),
	}
	if e.p.docs {
		obs.DocsURL = fmt.Sprintf("http://%s:%d", DocsService, DocsPort)
	}
	return json.Marshal(obs)
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
	lerr := e.bnd.Close(ctx)
	e.bnd = nil
	id := e.sb
	e.sb = ""
	if err := e.cfg.Sandboxes.Release(ctx, id); err != nil {
		return errors.Join(lerr, fmt.Errorf("codefix: release sandbox %s: %w", id, err))
	}
	return lerr
}

// errObs is the observation of a call that failed.
type errObs struct {
	OK           bool   `json:"ok"`
	Error        string `json:"error"`
	Status       uint32 `json:"status,omitempty"`
	RetryAfterMs int64  `json:"retry_after_ms,omitempty"`
	Suggestion   string `json:"suggestion,omitempty"`
}

// truncObs replaces an observation a truncation fault cut short.
type truncObs struct {
	Truncated bool   `json:"truncated"`
	Body      string `json:"body"`
}

// outcome collects what one step did besides its observation.
type outcome struct {
	meter   sandbox.Metering
	metered bool
	errors  uint32
	safety  []string
	limits  []string
	// touched: the step may have changed the workspace (diff it afterwards).
	touched bool
	// verdict is set by submit.
	verdict *verdict
}

// toolbox returns the workspace tools of e's sandbox; refusals and sandbox events go to
// e.events.
func (e *episode) toolbox() *tools.Toolbox {
	return tools.New(e.cfg.Sandboxes.Runtime(), e.sb, tools.Options{
		OnEvent:      func(ev sandbox.Event) { e.events = append(e.events, ev) },
		MaxFileBytes: maxFile, ExecTimeout: e.p.execTimeout, OutputLimit: maxOutput,
		Storage: e.bnd.Gate(), ExecEnv: e.bnd.ExecEnv,
	})
}

// Step applies one action. Bad actions are observations; a Go error means the sandbox
// runtime failed (an infra error) and the episode is dead.
func (e *episode) Step(a env.Action) (env.StepResult, error) {
	switch {
	case !e.ready:
		return env.StepResult{}, ErrNotReset
	case e.done:
		return env.StepResult{}, fmt.Errorf("%w (%s)", ErrEpisodeOver, e.reason)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.p.execTimeout+opTimeout)
	defer cancel()
	start := e.clock
	e.events = e.events[:0]
	var o outcome
	var fired []*gauntletv1.FaultFired
	var obs []byte
	calls := uint32(1)

	t, args, bad := parseAction(a)
	switch {
	case bad != nil:
		calls = 0
		e.invalid++
		o.errors++
		obs = marshal(bad)
	case t.name == ToolSubmit:
		v, err := e.verify(ctx)
		if err != nil {
			return env.StepResult{}, err
		}
		o.verdict = &v
		if !v.TestsUnchanged {
			o.safety = append(o.safety, EventTestsModified+": the verifier found "+TestPath+" changed")
		}
		obs = marshal(v)
	default:
		var err error
		obs, fired, err = e.call(ctx, t, args, &o)
		if err != nil {
			return env.StepResult{}, err
		}
	}

	if e.step == 0 {
		fired = append(e.bnd.Ambient(), fired...)
	}
	for _, ev := range e.events {
		if ev.Kind.Limit() {
			o.limits = append(o.limits, string(ev.Kind)+": "+ev.Detail)
		} else {
			o.safety = append(o.safety, string(ev.Kind)+": "+ev.Detail)
		}
	}
	fired = append(fired, e.bnd.ServiceFaults()...)
	diff := []byte("[]")
	if o.touched {
		var err error
		if diff, err = e.diff(ctx); err != nil {
			return env.StepResult{}, err
		}
	}
	e.step++
	success := o.verdict != nil && o.verdict.Pass
	progress, delta := 0.0, 0.0
	if success {
		progress, delta = 1, 1
	}
	m := &gauntletv1.Metering{
		ToolCalls: calls, Errors: o.errors, VirtualNs: uint64(e.clock - start),
		BytesIn: uint32(len(a.Args)), BytesOut: uint32(len(obs)),
	}
	if o.metered {
		m.CpuNs = uint64(o.meter.CPUTime)
		m.PeakMemoryBytes = uint64(max(o.meter.PeakMemoryBytes, 0))
		m.Processes = uint32(max(o.meter.Processes, 0))
		m.ReadBytes = uint64(max(o.meter.BytesRead, 0))
		m.WrittenBytes = uint64(max(o.meter.BytesWritten, 0))
	}
	m.Runtime = e.cfg.Sandboxes.Runtime().Name()
	res := env.StepResult{
		Observation: obs,
		Diff:        diff,
		Faults:      fired,
		Metering:    m,
		Signals: &gauntletv1.Signals{
			Progress: progress, ProgressDelta: delta, InvalidAction: calls == 0, Success: success,
			DeadlineVirtualNs: int64(e.p.deadline), SafetyEvents: o.safety, Limits: o.limits,
		},
	}
	env.End{
		Success: o.verdict != nil && success, Failure: o.verdict != nil,
		Invalid: e.invalid, MaxInvalid: e.p.maxInvalid,
		Clock: e.clock, Deadline: e.p.deadline,
		Step: e.step, MaxSteps: e.maxSteps,
	}.Apply(&res)
	e.done, e.reason = res.Done(), res.Reason
	return res, nil
}

// call runs a valid workspace tool through the fault injector.
func (e *episode) call(ctx context.Context, t *toolDef, args json.RawMessage, o *outcome) ([]byte, []*gauntletv1.FaultFired, error) {
	cost := costFS
	if t.name == tools.ShellExec {
		cost = costShell
	}
	start := e.clock
	out := e.faults.Call(t.service, t.name, e.clock)
	e.calls = append(e.calls, faultCall{t.service, t.name, e.clock})
	e.clock += cost + out.Latency
	e.bnd.Publish() // the gateway stamps what the tool's traffic meets with this time
	if out.Status != 0 {
		o.errors++
		return marshal(errObs{Error: fmt.Sprintf("%s failed: injected status %d", t.name, out.Status),
			Status: out.Status, RetryAfterMs: out.RetryAfter.Milliseconds(),
			Suggestion: "the call had no effect; try it again"}), out.Fired, nil
	}
	if err := e.bnd.Begin(ctx, t.name, start); err != nil {
		return nil, nil, err
	}
	body, err := e.runTool(ctx, t, args, o)
	if err != nil {
		return nil, nil, err
	}
	if out.Keep < 1 {
		body = marshal(truncObs{Truncated: true, Body: string(out.Truncate(body))})
	}
	return body, append(out.Fired, e.bnd.Fired()...), nil
}

// change is one entry of a state diff. A file name is any bytes but NUL and a JSON string
// holds only UTF-8: a name that is not UTF-8 keeps a readable Path (each run of bytes that
// are not UTF-8 as U+FFFD, so two names may read alike) and its exact bytes in PathB64,
// standard base64.
// The name is PathB64 when present, else Path (see docs/codefix.md).
type change struct {
	Op      string `json:"op"`
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
	name    string // the exact name, the diff's order
}

// newChange names the file p in a state diff.
func newChange(op, p string) change {
	c := change{Op: op, Path: p, name: p}
	if !utf8.ValidString(p) {
		c.Path = strings.ToValidUTF8(p, "\uFFFD")
		c.PathB64 = base64.StdEncoding.EncodeToString([]byte(p))
	}
	return c
}

// diff lists the files the step added, changed or removed, by comparing an md5 listing of
// the workspace with the previous one.
func (e *episode) diff(ctx context.Context) ([]byte, error) {
	now, err := e.listing(ctx)
	if err != nil {
		return nil, err
	}
	var out []change
	for p, sum := range now {
		switch old, ok := e.digest[p]; {
		case !ok:
			out = append(out, newChange("add", p))
		case old != sum:
			out = append(out, newChange("change", p))
		}
	}
	for p := range e.digest {
		if _, ok := now[p]; !ok {
			out = append(out, newChange("remove", p))
		}
	}
	slices.SortFunc(out, func(a, b change) int { return strings.Compare(a.name, b.name) })
	e.digest = now
	if len(out) == 0 {
		return []byte("[]"), nil
	}
	return marshal(out), nil
}

// listing returns the md5 of every regular file of the workspace by path. It reads the
// workspace from the host when the runtime can show it (no command to run), confined to it
// by os.Root, skipping symlinks and special files; otherwise it runs find and md5sum in
// the sandbox, which lists the same files.
func (e *episode) listing(ctx context.Context) (map[string]string, error) {
	rt := e.cfg.Sandboxes.Runtime()
	if wd, ok := rt.(sandbox.WorkspaceDirer); ok {
		dir, err := wd.WorkspaceDir(ctx, e.sb)
		if err != nil {
			return nil, fmt.Errorf("codefix: workspace of %s: %w", e.sb, err)
		}
		now, err := hostListing(dir)
		if err != nil {
			return nil, fmt.Errorf("codefix: list workspace of %s: %w", e.sb, err)
		}
		return now, nil
	}
	r, err := e.exec(ctx, sandbox.ExecRequest{
		Argv:    []string{"sh", "-c", "find . -type f -exec md5sum {} +"},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	return parseMD5Sums(r.Stdout), nil
}

// md5Unescape undoes GNU md5sum's escaping of a name that holds a backslash, a newline or
// a carriage return (such a line starts with a backslash).
var md5Unescape = strings.NewReplacer(`\\`, `\`, `\n`, "\n", `\r`, "\r")

// parseMD5Sums reads md5sum's output ("sum  ./name" a line) into md5 by name.
func parseMD5Sums(out []byte) map[string]string {
	now := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		escaped := strings.HasPrefix(line, `\`)
		sum, path, ok := strings.Cut(strings.TrimPrefix(line, `\`), "  ")
		if !ok {
			continue
		}
		if escaped {
			path = md5Unescape.Replace(path)
		}
		now[strings.TrimPrefix(path, "./")] = sum
	}
	return now
}

// hostListing hashes the regular files below dir. The sandbox may change the tree while
// it runs (between steps nothing runs there, but a process left in the background may),
// so files that vanish are skipped and nothing is followed out of dir.
func hostListing(dir string) (map[string]string, error) {
	// The path may cross into the sandbox's root (containerd: /proc/PID/root/workspace),
	// where a command can swap the folder for a link: it is opened without following a
	// last link, and the root is that folder.
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: dir, Err: err}
	}
	root, err := os.OpenRoot("/proc/self/fd/" + strconv.Itoa(fd))
	unix.Close(fd)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	now := map[string]string{}
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := root.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
		if err != nil {
			return nil // vanished or replaced since the walk saw it
		}
		defer f.Close()
		if st, err := f.Stat(); err != nil || !st.Mode().IsRegular() {
			return nil
		}
		h := md5.New()
		if _, err := io.Copy(h, f); err != nil {
			return err
		}
		now[p] = hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return now, err
}

// exec runs one command in the episode's sandbox; an error is the runtime's failure.
func (e *episode) exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	r, err := e.cfg.Sandboxes.Runtime().Exec(ctx, e.sb, req)
	if err != nil {
		return r, fmt.Errorf("codefix: exec in sandbox %s: %w", e.sb, err)
	}
	return r, nil
}

// Branch splits the episode: the branch gets a new sandbox forked from a snapshot of
// this one's workspace, and the same step, clock and fault-injector state. Both go on
// independently. It needs a runtime that can snapshot and fork.
func (e *episode) Branch(ctx context.Context) (env.Episode, error) {
	if !e.ready || e.sb == "" {
		return nil, ErrNotReset
	}
	rt := e.cfg.Sandboxes.Runtime()
	snap, fork, err := snapshotFork(rt)
	if err != nil {
		return nil, err
	}
	s, err := snap.Snapshot(ctx, e.sb)
	if err != nil {
		return nil, fmt.Errorf("codefix: branch: snapshot %s: %w", e.sb, err)
	}
	defer func() { _ = snap.DeleteSnapshot(context.WithoutCancel(ctx), s.ID) }()
	h, err := fork.Fork(ctx, s.ID)
	if err != nil {
		return nil, fmt.Errorf("codefix: branch: fork %s: %w", s.ID, err)
	}
	b := &episode{}
	*b = *e
	b.sb = h.ID
	if b.faults, err = replayInjector(e.cfg.Faults, e.calls); err != nil {
		_ = e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID)
		return nil, err
	}
	// The branch's tools, commands and requests meet what this episode's would from
	// here on.
	if b.bnd, err = e.bnd.Branch(ctx, h.ID, &b.clock); err != nil {
		_ = e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID)
		return nil, err
	}
	b.tb = b.toolbox()
	b.events = nil
	b.calls = slices.Clone(e.calls)
	b.digest = make(map[string]string, len(e.digest))
	for k, v := range e.digest {
		b.digest[k] = v
	}
	return b, nil
}

// replayInjector returns a new injector over in's plan that has seen calls, so it fires
// exactly what in will fire from now on.
func replayInjector(in *inject.Injector, calls []faultCall) (*inject.Injector, error) {
	if in == nil {
		return nil, nil
	}
	out, err := inject.NewInjector(in.Plan())
	if err != nil {
		return nil, fmt.Errorf("codefix: branch: fault plan: %w", err)
	}
	for _, c := range calls {
		out.Call(c.service, c.tool, c.now)
	}
	return out, nil
}

func snapshotFork(rt sandbox.Runtime) (sandbox.Snapshotter, sandbox.Forker, error) {
	snap, ok1 := rt.(sandbox.Snapshotter)
	fork, ok2 := rt.(sandbox.Forker)
	if !ok1 || !ok2 {
		return nil, nil, fmt.Errorf("codefix: runtime %s cannot snapshot and fork: %w", rt.Name(), sandbox.ErrUnsupported)
	}
	return snap, fork, nil
}

// marshal encodes an observation: the package's own structs, which always encode.
func marshal(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		return []byte(`{"ok":false,"error":"internal: observation did not encode"}`)
	}
	return b
}

// Sandbox returns the runtime and the id of the episode's current sandbox.
func (e *episode) Sandbox() (sandbox.Runtime, string) { return e.cfg.Sandboxes.Runtime(), e.sb }
