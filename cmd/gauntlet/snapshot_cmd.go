package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
	"github.com/gauntlet-rl/gauntlet/pkg/env/taskenv"
	"github.com/gauntlet-rl/gauntlet/pkg/env/world"
	"github.com/gauntlet-rl/gauntlet/pkg/play"
	"github.com/gauntlet-rl/gauntlet/pkg/policy"
	"github.com/gauntlet-rl/gauntlet/pkg/policy/httppolicy"
	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/scoring"
	"github.com/gauntlet-rl/gauntlet/pkg/threats"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	gauntletv1 "github.com/gauntlet-rl/gauntlet/proto/gauntlet/v1"
)

// `gauntlet episode snapshot` and `gauntlet episode fork` rebuild a recorded
// episode at a step by replaying its recorded actions on a fresh episode of the same env,
// seed, params and fault plan, in a sandbox of a local runtime for envs whose episodes run
// in sandboxes (none for pure envs such as shop). Envs are deterministic given those and
// the actions, so the rebuilt state is the recorded one; the replay checks every
// observation against the recording and says so. A fork's branches are copies of the
// rebuilt episode where the env can branch (env.Brancher: a sandbox forked), otherwise
// the episode rebuilt again, which for a pure env is cheap.

const snapshotUsage = `usage: gauntlet episode snapshot [flags] EPISODE_ID --step N [--out DIR]
       gauntlet episode fork [flags] EPISODE_ID --step N [--policy oracle] [--branches K]

Step N means the state after the first N steps (0: the initial state), which is what the
agent saw before choosing action N. snapshot writes that workspace to --out; fork goes on
from it with a policy, in K independent branches.
`

// cmdEpisode routes `gauntlet episode show|snapshot|fork|export`.
func cmdEpisode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "show":
			return cmdEpisodeShow(ctx, args[1:], stdout, stderr)
		case "snapshot":
			return cmdEpisodeSnapshot(ctx, args[1:], stdout, stderr)
		case "fork":
			return cmdEpisodeFork(ctx, args[1:], stdout, stderr)
		case "export":
			return cmdEpisodeExport(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintln(stderr, "usage: gauntlet episode show|snapshot|fork|export [flags] EPISODE_ID ...")
	return errUsage
}

// replayOpts are the flags shared by snapshot and fork.
type replayOpts struct {
	stack    stackFlags
	step     int
	maxSteps uint
	sandbox  runtimes.Config
	// tasks names the datasets episodes of the tasks env were played from, by the names
	// their params use.
	tasks taskenv.Config
	// worlds are user worlds the recorded episode may be of.
	worlds world.Config
	// mcp are user MCP envs the recorded episode may be of.
	mcp mcpenv.Config
	// cassette replays an MCP env's episode from its recorded answers, without its server
	// (set by commands that replay only what was recorded: not fork, whose new steps need
	// the server).
	cassette bool
	// threats, when set, is the stack's threat fingerprints: a fork's new steps are matched
	// against them, as a worker's are (replayed steps keep the flags they were recorded with).
	threats *threats.Watcher
}

func (o *replayOpts) register(fs *flag.FlagSet, parts stackParts) {
	o.stack.register(fs, partClickHouse|parts)
	fs.IntVar(&o.step, "step", -1, "rebuild the state after this many steps (required)")
	fs.UintVar(&o.maxSteps, "max-steps", 0, "step limit of the rebuilt episode (0: the env's default, at least --step+1)")
	o.registerSandbox(fs)
}

// registerSandbox declares the flags of the local runtime a sandboxed env is rebuilt in.
func (o *replayOpts) registerSandbox(fs *flag.FlagSet) {
	fs.StringVar(&o.sandbox.Runtime, "sandbox.runtime", runtimes.Process, "sandbox runtime to rebuild in: process or containerd")
	fs.StringVar(&o.sandbox.Image, "sandbox.image", "", "root filesystem of the sandbox (containerd: an image reference)")
	fs.StringVar(&o.sandbox.StateDir, "sandbox.state-dir", "", "state directory of the runtime (default: <data-dir>/sandbox-cli)")
	fs.StringVar(&o.sandbox.Containerd, "sandbox.containerd", "", "socket of a running containerd (default: start a private one)")
	fs.StringVar(&o.sandbox.AgentBinary, "sandbox.agent", "", "static in-sandbox agent for containerd (default: build it with the Go toolchain)")
	o.sandbox.Images.RegisterFlags(fs)
	o.sandbox.RegisterHostsFlag(fs)
	o.tasks.RegisterFlags(fs)
	o.worlds.RegisterFlags(fs)
	o.mcp.RegisterFlags(fs)
}

// parseInterspersed parses flags that may come before or after the one positional
// argument, as in `episode snapshot ID --step 3`.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parse(fs, args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// recording is a recorded episode, loaded from ClickHouse to be rebuilt at a step.
type recording struct {
	id    string
	row   trajectory.EpisodeRow
	steps []trajectory.StepRow
	plan  *gauntletv1.FaultPlan
	env   env.Env
	// spec is the reward spec the steps were scored under, which replayed steps are too.
	spec scoring.Spec
	// sandboxes and closeRT are the local runtime's, nil when the env runs no sandbox.
	sandboxes env.Sandboxes
	closeRT   func() error
}

func (rec *recording) close() error {
	if rec.closeRT == nil {
		return nil
	}
	return rec.closeRT()
}

// rebuilt is a recorded episode replayed up to a step.
type rebuilt struct {
	sess *play.Session
	out  *cliOut
	// played are the replayed steps: the turn before each (what its agent saw) and its
	// action, for a policy that takes over to follow (env.Follower).
	played []play.Recorded
	seen   []env.Turn
	// turn is what an agent sees after the replayed steps; differ is the first replayed
	// step whose observation is not the recorded one (-1: none).
	turn   env.Turn
	differ int
}

func cmdEpisodeSnapshot(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("episode snapshot", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, snapshotUsage); fs.PrintDefaults() }
	var o replayOpts
	o.register(fs, 0)
	out := fs.String("out", "", "directory to write the workspace to (default: ./EPISODE_ID-stepN; must not exist)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	id, err := o.check(pos, stderr)
	if err != nil {
		return err
	}
	if *out == "" {
		*out = fmt.Sprintf("%s-step%d", id, o.step)
	}
	if _, err := os.Lstat(*out); err == nil {
		return fmt.Errorf("--out %s: already exists; name a new directory", *out)
	}
	rec, r, err := o.replay(ctx, id, stdout)
	if err != nil {
		return err
	}
	defer func() { _ = errors.Join(r.sess.Close(), rec.close()) }()
	ws, ok := r.sess.Episode().(env.Workspacer)
	if !ok {
		return fmt.Errorf("episode %s: env %s keeps no workspace to snapshot (its state is replayed in memory; use fork)", id, rec.row.Env)
	}
	rt, sb := ws.Sandbox()
	n, err := exportWorkspace(ctx, rt, sb, *out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "workspace after step %d of %s: %d files written to %s\n", o.step, id, n, *out)
	return nil
}

func cmdEpisodeFork(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("episode fork", stderr)
	fs.Usage = func() { fmt.Fprint(stderr, snapshotUsage); fs.PrintDefaults() }
	var o replayOpts
	o.register(fs, partNATS)
	pol := fs.String("policy", policy.Oracle, "policy that goes on from the step: "+strings.Join(policy.Names(), ", "))
	branches := fs.Int("branches", 1, "independent branches to run from the step (each with its own policy seed)")
	var httpCfg httppolicy.Config
	httpCfg.RegisterFlags(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	id, err := o.check(pos, stderr)
	if err != nil {
		return err
	}
	if *branches < 1 || *branches > 64 {
		return fmt.Errorf("--branches: %d must be between 1 and 64", *branches)
	}
	httpPolicy, err := httppolicy.New(httpCfg)
	if err != nil {
		return err
	}
	p, err := policy.NewSet(httpPolicy).Lookup(*pol)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	stop := o.watchThreats(ctx, stderr)
	defer stop()
	rec, r, err := o.replay(ctx, id, stdout)
	if err != nil {
		return err
	}
	defer func() { _ = errors.Join(r.sess.Close(), rec.close()) }()
	_, canBranch := r.sess.Episode().(env.Brancher)
	for b := 0; b < *branches; b++ {
		if err := o.forkBranch(ctx, rec, r, b, *branches, canBranch, p, stdout); err != nil {
			return err
		}
	}
	return nil
}

// watchThreats watches the stack's threat fingerprints for the fork's new steps, which are
// flagged where they match one and fingerprinted where their sandbox records an attack,
// as the workers' steps are. A stack whose NATS cannot be reached leaves the fork without
// them, saying so: a fork is a tool for looking, and the recording is in ClickHouse.
func (o *replayOpts) watchThreats(ctx context.Context, stderr io.Writer) (stop func()) {
	b, err := o.stack.connectBus("gauntlet-episode-fork", stderr)
	if err == nil {
		log, _ := newLogger("warn", stderr)
		w := threats.NewWatcher(b.JS, noop.NewMeterProvider().Meter("gauntlet/fork"), "gauntlet_fork", log)
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = w.Start(sctx)
		cancel()
		if err == nil {
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); w.Run(wctx) }()
			o.threats = w
			return func() { cancel(); <-done; w.Stop(); _ = b.Close() }
		}
		_ = b.Close()
	}
	fmt.Fprintf(stderr, "WARNING: the fork's new steps are not matched against threat fingerprints: %v\n", err)
	return func() {}
}

// forkBranch plays branch b of a fork with policy p from the rebuilt episode r: the last
// branch plays r itself; the others a copy (env.Brancher) or, where the env cannot
// branch, the episode rebuilt again. The policy's agent is told the replayed steps first
// (env.Follower), so it takes over knowing how the episode began.
func (o *replayOpts) forkBranch(ctx context.Context, rec *recording, r *rebuilt, b, branches int, canBranch bool, p policy.Policy, stdout io.Writer) (err error) {
	sess, out, turn, played, seen := r.sess, r.out, r.turn, r.played, r.seen
	switch {
	case b == branches-1:
	case canBranch:
		out = &cliOut{}
		if sess, err = r.sess.Branch(ctx, out); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, sess.Close()) }()
	default:
		var again *rebuilt
		if again, err = o.rebuild(ctx, rec); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, again.sess.Close()) }()
		if again.differ >= 0 {
			fmt.Fprintf(stdout, "WARNING: rebuilt for branch %d, step %d observed something else than recorded\n", b, again.differ)
		}
		sess, out, turn, played, seen = again.sess, again.out, again.turn, again.played, again.seen
	}
	sess.Req.Policy = p.Name() // for its errors: the fork's policy plays from here
	out.w, out.total = stdout, 0
	agent, err := p.NewAgent(sess.Env, rng.DeriveN(rec.row.Seed, "fork/"+p.Name(), uint64(b)))
	if err != nil {
		return fmt.Errorf("--policy %s: %w", p.Name(), err)
	}
	if f, ok := agent.(env.Follower); ok {
		for i, st := range played {
			f.Follow(seen[i], st.Action)
		}
	}
	fmt.Fprintf(stdout, "\nbranch %d: policy %s from step %d\n", b, p.Name(), o.step)
	return sess.Run(ctx, agent, turn)
}

// check validates the positional id and --step.
func (o *replayOpts) check(pos []string, stderr io.Writer) (string, error) {
	if len(pos) != 1 || o.step < 0 {
		fmt.Fprint(stderr, snapshotUsage)
		return "", errUsage
	}
	if !episodeIDRe.MatchString(pos[0]) {
		return "", fmt.Errorf("episode id %q: only letters, digits, '-' and '_' are allowed", pos[0])
	}
	return pos[0], nil
}

// replay loads episode id from ClickHouse and replays its first o.step steps on a fresh
// episode, in a sandbox of the local runtime if the env runs in sandboxes. The caller
// closes the session, then the recording.
func (o *replayOpts) replay(ctx context.Context, id string, stdout io.Writer) (*recording, *rebuilt, error) {
	rec, err := o.load(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	r, err := o.rebuild(ctx, rec)
	if err != nil {
		return nil, nil, errors.Join(err, rec.close())
	}
	row := rec.row
	fmt.Fprintf(stdout, "episode %s (env %s, seed %d, policy %s): replayed %d of %d steps", id, row.Env, row.Seed, row.Policy, o.step, len(rec.steps))
	if r.differ >= 0 {
		fmt.Fprintf(stdout, "; WARNING: step %d observed something else than recorded (a command whose output is not deterministic?)\n", r.differ)
	} else {
		fmt.Fprintln(stdout, "; every observation identical to the recording")
	}
	return rec, r, nil
}

// load reads episode id's steps, row and fault plan from ClickHouse and opens the local
// sandbox runtime if its env runs in sandboxes (env.SandboxTemplater).
func (o *replayOpts) load(ctx context.Context, id string) (*recording, error) {
	conn, db, err := o.stack.connectClickHouse(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	steps, err := trajectory.EpisodeSteps(ctx, conn, db, id)
	if err != nil {
		return nil, err
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("episode %s: no recorded steps in %s", id, db)
	}
	eps, err := trajectory.RunEpisodes(ctx, conn, db, steps[0].RunID)
	if err != nil {
		return nil, err
	}
	var row *trajectory.EpisodeRow
	for i := range eps {
		if eps[i].EpisodeID == id {
			row = &eps[i]
		}
	}
	if row == nil {
		return nil, fmt.Errorf("episode %s: has not ended yet (no row in %s.episodes)", id, db)
	}
	if o.step > len(steps) {
		return nil, fmt.Errorf("--step %d: episode %s has only %d steps", o.step, id, len(steps))
	}
	if err := o.worlds.Register(); err != nil {
		return nil, fmt.Errorf("--%w", err)
	}
	if err := o.mcp.Register(); err != nil {
		return nil, fmt.Errorf("--%w", err)
	}
	e, err := env.Lookup(row.Env)
	if err != nil {
		return nil, fmt.Errorf("episode %s: %w", id, err)
	}
	plan, err := trajectory.EpisodePlan(ctx, conn, db, *row, e.Spec().Services)
	if err != nil {
		return nil, err
	}
	spec, err := trajectory.EpisodeRewardSpec(ctx, conn, db, steps)
	if err != nil {
		return nil, err
	}
	rec := &recording{id: id, row: *row, steps: steps, plan: plan, env: e, spec: spec}
	if o.cassette && mcpenv.Is(e) {
		// The server's recorded answers replay instead of the server: no sandbox.
		diffs := make([][]byte, len(steps))
		for i, st := range steps {
			diffs[i] = []byte(st.StateDiff)
		}
		p, err := mcpenv.ReplayParams([]byte(row.Params), diffs)
		if err != nil {
			return nil, fmt.Errorf("episode %s: %w", id, err)
		}
		rec.row.Params = string(p)
		return rec, nil
	}
	if _, sandboxed := e.(env.SandboxTemplater); !sandboxed {
		return rec, nil // a pure env: its episodes are rebuilt in memory
	}
	sc := o.sandbox
	if sc.StateDir == "" {
		sc.StateDir = filepath.Join(o.stack.dataDir, "sandbox-cli")
	}
	if sc.Runtime == runtimes.None {
		return nil, fmt.Errorf("--sandbox.runtime: name the runtime to rebuild %s in (process or containerd)", id)
	}
	sb, err := runtimes.Open(ctx, sc, nil)
	if err != nil {
		return nil, err
	}
	rec.sandboxes, rec.closeRT = sb, sb.Close
	return rec, nil
}

// rebuild replays rec's first o.step steps on a fresh episode, scored under the spec they
// were recorded with. The caller closes its session.
func (o *replayOpts) rebuild(ctx context.Context, rec *recording) (*rebuilt, error) {
	return o.rebuildScored(ctx, rec, play.LocalScorer{Spec: rec.spec})
}

// rebuildScored is rebuild with the steps scored by scorer.
func (o *replayOpts) rebuildScored(ctx context.Context, rec *recording, scorer play.StepScorer) (*rebuilt, error) {
	id := rec.id
	maxSteps := uint32(o.maxSteps)
	if maxSteps == 0 {
		maxSteps = max(rec.env.Spec().DefaultMaxSteps, uint32(o.step)+1)
	}
	req := &gauntletv1.EpisodeRequested{EpisodeId: id, RunId: rec.row.RunID, Env: rec.row.Env, ParamsJson: rec.row.Params,
		Seed: rec.row.Seed, Policy: "fork", MaxSteps: maxSteps}
	if rec.spec.Digest != scoring.DefaultDigest() {
		req.RewardSpec = rec.spec.Digest // the session then carries the spec's state
	}
	// Replayed steps print nothing; fork turns the printing on.
	out := &cliOut{}
	sess := play.NewSession(&gauntletv1.EpisodeAssigned{Episode: req, Plan: rec.plan}, "cli", scorer, out)
	if _, err := sess.Prepare(ctx, play.Deps{Sandboxes: rec.sandboxes, Datasets: o.tasks.Datasets, Threats: o.threats}); err != nil {
		return nil, errors.Join(fmt.Errorf("episode %s: %w", id, err), sess.Close())
	}
	obs, err := sess.Reset(ctx, 1)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("episode %s: %w", id, err), sess.Close())
	}
	out.seen = append(make([]env.Turn, 0, o.step+1), env.Turn{Observation: obs})
	played := make([]play.Recorded, o.step)
	for i := range played {
		st := rec.steps[i]
		// The diffs hold an MCP server's answers: a fork of its episode is refused where a
		// fresh server answers otherwise (play.ErrDiverged).
		played[i] = play.Recorded{Action: env.Action{Tool: st.Tool, Args: json.RawMessage(st.Args)}, Observation: []byte(st.Observation), Diff: []byte(st.StateDiff),
			Flags: play.ThreatFlags(st.SafetyEvents), LimitsAsSafety: play.RecordedLimitsAsSafety(st.SafetyEvents)}
	}
	_, differ, err := sess.Replay(ctx, played)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("episode %s: %w (before --step %d)", id, err, o.step), sess.Close())
	}
	// out.seen holds the turn before each replayed step and, last, the one after them:
	// at step 0 too, the reset's observation.
	return &rebuilt{sess: sess, out: out, played: played, seen: out.seen, turn: out.seen[o.step], differ: differ}, nil
}

// cliOut is the output of a rebuilt episode (play.Output): while its recorded steps are
// replayed it prints nothing and keeps what an agent would have seen after each (seen);
// once w is set, it prints each step the fork plays, scored in process.
type cliOut struct {
	w     io.Writer
	total float64 // reward since w was set
	seen  []env.Turn
}

func (o *cliOut) Start(context.Context, *gauntletv1.EpisodeStarted) error { return nil }
func (o *cliOut) Flush() error                                            { return nil }
func (o *cliOut) End(context.Context, *gauntletv1.EpisodeEnded) error     { return nil }

func (o *cliOut) Step(_ context.Context, st *gauntletv1.StepTaken) error {
	if o.w == nil {
		o.seen = append(o.seen, env.Turn{Step: st.Step + 1, Observation: json.RawMessage(st.ObservationJson), Reward: st.Score.GetTotal()})
		return nil
	}
	r := st.Score.GetTotal()
	o.total += r
	fmt.Fprintf(o.w, "  step %d  %s %s\n    reward %.3f  obs %s\n", st.Step, st.Action.GetTool(), cut(st.Action.GetArgsJson(), 100), r, cut(st.ObservationJson, 160))
	for _, f := range play.ThreatFlags(st.Signals.GetSafetyEvents()) {
		fmt.Fprintf(o.w, "    flagged: %s\n", f)
	}
	if st.Terminated || st.Truncated {
		fmt.Fprintf(o.w, "  ended at step %d: %s, success=%v, reward from the fork %.3f\n", st.Step, st.Reason.Name(), st.Signals.GetSuccess(), o.total)
	}
	return nil
}

func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// exportWorkspace copies a sandbox's workspace to the host directory dir (created),
// through a tar stream made inside the sandbox. Only regular files and directories are
// written, and only below dir: the workspace is the agent's and may hold anything.
func exportWorkspace(ctx context.Context, rt sandbox.Runtime, id, dir string) (int, error) {
	res, err := rt.Exec(ctx, id, sandbox.ExecRequest{Argv: []string{"tar", "-cf", "-", "."}, OutputLimit: 256 << 20})
	if err != nil {
		return 0, fmt.Errorf("export workspace of sandbox %s: %w", id, err)
	}
	if res.ExitCode != 0 || res.Truncated {
		return 0, fmt.Errorf("export workspace of sandbox %s: tar exited %d (truncated %v): %s", id, res.ExitCode, res.Truncated, cut(string(res.Stderr), 200))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, fmt.Errorf("--out: %w", err)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, fmt.Errorf("--out: %w", err)
	}
	defer root.Close()
	tr := tar.NewReader(bytes.NewReader(res.Stdout))
	files := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, nil
		}
		if err != nil {
			return files, fmt.Errorf("export workspace of sandbox %s: read tar: %w", id, err)
		}
		name, err := sandbox.CleanRelPath(strings.TrimPrefix(h.Name, "./"))
		if err != nil || name == "." {
			continue
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return files, fmt.Errorf("--out %s: %w", dir, err)
			}
		case tar.TypeReg:
			if err := root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
				return files, fmt.Errorf("--out %s: %w", dir, err)
			}
			f, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&0o755|0o600)
			if err != nil {
				return files, fmt.Errorf("--out %s: %w", dir, err)
			}
			_, err = io.Copy(f, tr)
			if err = errors.Join(err, f.Close()); err != nil {
				return files, fmt.Errorf("--out %s: %w", dir, err)
			}
			files++
		}
	}
}
