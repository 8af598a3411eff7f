package taskenv

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/tasks"
)

// ErrVerifier is wrapped by every verifier failure: test.sh timed out, could not run, or
// left no valid reward. It is an infra error of the episode, never a reward of 0.
var ErrVerifier = errors.New("tasks: verifier failed")

// verdict is the verifier's judgment, the observation of the last step.
type verdict struct {
	// Pass: the task's reward says success (see progress).
	Pass bool `json:"pass"`
	// Rewards are what test.sh wrote: reward.txt as {"reward": v}, or reward.json.
	Rewards map[string]float64 `json:"rewards"`
	// ExitCode is test.sh's exit status (informative: the reward file is the verdict).
	ExitCode int `json:"exit_code"`
	// Output is the end of test.sh's output.
	Output string `json:"output"`
	safety []string
}

// progress is the verdict's primary reward in [0, 1]: "reward" when the verifier named
// one (reward.txt always does), else the least of the named rewards.
func (v *verdict) progress() float64 {
	r, ok := v.Rewards[tasks.RewardName]
	if !ok {
		r = 1
		for _, x := range v.Rewards {
			r = min(r, x)
		}
	}
	return min(max(r, 0), 1)
}

// named returns the verifier's rewards as the step's signals carry them: parallel and
// sorted by name, so a recorded step and its score do not depend on map order.
func (v *verdict) named() ([]string, []float64) {
	names := slices.Sorted(maps.Keys(v.Rewards))
	values := make([]float64, len(names))
	for i, n := range names {
		values[i] = v.Rewards[n]
	}
	return names, values
}

// verifyScript is the verifier's one command in its fork: one exec, since each costs a
// process start or an agent round trip and the verifier's overhead over test.sh itself
// is mostly those. It reports and removes what the agent left on the verifier's paths
// (the workspace's logs/ when it is not a plain folder, logs/verifier, tests/,
// solution/: rm -rf removes a link itself, never what it leads to) and makes
// logs/verifier empty; unpacks tests/ from its stdin; runs test.sh with no
// start-up file read, its output on stderr, under the [verifier] timeout ($1 seconds);
// and prints, on stdout, "planted: ..." lines, "timedout" when test.sh ran out of time,
// then "rc N" with test.sh's exit status, then the reward left: "txt" or "json" and the
// file, or "none". Exit 124 means the paths could not be cleared, 125 that tests/ could
// not be unpacked. test.sh runs in the task's working directory ($2, its workspace path),
// as Harbor runs it in the image's WORKDIR.
const verifyScript = `cd /workspace || exit 124
if [ -L logs ] || { [ -e logs ] && [ ! -d logs ]; }; then echo "planted: /logs is not a folder"; rm -rf logs; fi
if [ -n "$(ls -A logs/verifier 2>/dev/null)" ]; then echo "planted: /logs/verifier held $(ls -A logs/verifier | head -c 200 | tr '\n' ' ')"; fi
if [ -n "$(ls -A tests 2>/dev/null)" ] || [ -L tests ]; then echo "planted: /tests was not empty before the verifier"; fi
rm -rf logs/verifier tests solution && mkdir -p logs/verifier logs/agent tests || exit 124
tar -x -f - -C /workspace/tests || exit 125
cd "$2" 2>/dev/null || cd /workspace
timeout -k 1 "$1" bash --noprofile --norc /tests/test.sh </dev/null 1>&2
rc=$?
[ $rc -eq 124 ] && echo timedout
echo "rc $rc"
cd /workspace/logs/verifier || { echo none; exit 0; }
if [ -f reward.txt ] && [ ! -L reward.txt ]; then echo txt; head -c 65537 reward.txt
elif [ -f reward.json ] && [ ! -L reward.json ]; then echo json; head -c 65537 reward.json
else echo none; fi
`

// verify judges the agent's final state. The agent's sandbox is snapshotted and a fresh
// sandbox forked from the snapshot, where nothing of the agent runs (the process runtime
// ends every command's processes with it; a fork starts none); there verifyScript clears
// the verifier's paths, copies tests/ in and runs tests/test.sh, under the [verifier]
// timeout.
func (e *episode) verify(ctx context.Context) (*verdict, error) {
	rt := e.cfg.Sandboxes.Runtime()
	snap, fork, err := snapshotFork(rt)
	if err != nil {
		return nil, err
	}
	tests, err := tarFolder(filepath.Join(e.task.Dir, tasks.TestsDir))
	if err != nil {
		return nil, fmt.Errorf("%w: task %s: %v", ErrVerifier, e.task.ID, err)
	}
	// The verifier runs with the sandbox's own limits, not the episode's resource faults
	// (a containerd fork keeps its source's), and in a fork no storage fault reaches.
	if err := e.bnd.RestoreLimits(ctx); err != nil {
		return nil, err
	}
	s, err := snap.Snapshot(ctx, e.sb)
	if err != nil {
		return nil, fmt.Errorf("tasks: verify: snapshot %s: %w", e.sb, err)
	}
	defer func() { _ = snap.DeleteSnapshot(context.WithoutCancel(ctx), s.ID) }()
	var h sandbox.Handle
	if e.verifier.set {
		h, err = fork.(sandbox.UserForker).ForkAs(ctx, s.ID, e.verifier.user) // Reset checked the ability
	} else {
		h, err = fork.Fork(ctx, s.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("tasks: verify: fork %s: %w", s.ID, err)
	}
	defer func() { _ = e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID) }()
	if e.net != nil {
		// test.sh reaches the allowed hosts as the agent did, through a gateway of its
		// own whose requests meet no faults (a verdict is no draw) and are recorded with
		// the step's.
		vn, err := attachNetwork(ctx, rt, h.ID, e.net.services, nil, e.net.rec, e.clock)
		if err != nil {
			return nil, fmt.Errorf("tasks: verify: %w", err)
		}
		defer func() {
			vn.settle(ctx) // what test.sh did on the network is in the step's diff
			vn.close()
		}()
	}

	timeout := e.task.Config.Verifier.Timeout
	// The working directory through the workspace, as the agent left the workspace: a
	// link at the root it may have replaced is not followed.
	wd, _ := inWorkspace(e.workdir, e.workdir, e.links)
	r, err := rt.Exec(ctx, h.ID, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", verifyScript, "sh", strconv.FormatFloat(timeout.Seconds(), 'f', -1, 64), wd}, Stdin: tests,
		Env: envList(e.task.Config.Verifier.Env),
		// The clearing, unpacking and reading around test.sh take milliseconds.
		Timeout: timeout + verifyMargin, OutputLimit: 128 << 10,
	})
	if err != nil {
		return nil, fmt.Errorf("tasks: verify in sandbox %s: %w", h.ID, err)
	}
	out := text(string(r.Stderr))
	switch {
	case r.TimedOut:
		return nil, fmt.Errorf("%w: task %s: test.sh timed out after %v%s", ErrVerifier, e.task.ID, timeout, said(out))
	case r.ExitCode == 124:
		return nil, fmt.Errorf("%w: task %s: clearing the verifier's paths: %s", ErrVerifier, e.task.ID, out)
	case r.ExitCode == 125:
		return nil, fmt.Errorf("%w: task %s: copying tests/ in: %s", ErrVerifier, e.task.ID, out)
	}
	v := &verdict{ExitCode: -1}
	timedOut := false
	rest := r.Stdout
	for len(rest) > 0 {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		if d, ok := bytes.CutPrefix(line, []byte("planted: ")); ok {
			v.safety = append(v.safety, EventVerifierPlanted+": "+string(d))
			continue
		}
		if string(line) == "timedout" {
			timedOut = true
			continue
		}
		if rc, ok := bytes.CutPrefix(line, []byte("rc ")); ok {
			v.ExitCode, _ = strconv.Atoi(string(rc))
			break
		}
	}
	if timedOut {
		return nil, fmt.Errorf("%w: task %s: test.sh timed out after %v%s", ErrVerifier, e.task.ID, timeout, said(out))
	}
	if v.ExitCode < 0 {
		return nil, fmt.Errorf("%w: task %s: test.sh did not run (exit %d)%s", ErrVerifier, e.task.ID, r.ExitCode, said(out))
	}
	v.Output = tail(out)
	kind, data, _ := bytes.Cut(rest, []byte("\n"))
	switch string(kind) {
	case "txt":
		var x float64
		if x, err = tasks.ParseRewardText(data); err == nil {
			v.Rewards = map[string]float64{tasks.RewardName: x}
		}
	case "json":
		v.Rewards, err = tasks.ParseRewardJSON(data)
	default:
		err = tasks.ErrNoReward
	}
	if err == nil && len(data) > 64<<10 {
		err = errors.New("the reward file is larger than 64 KiB")
	}
	if err != nil {
		return nil, fmt.Errorf("%w: task %s: %w (test.sh exited %d)%s", ErrVerifier, e.task.ID, err, v.ExitCode, said(out))
	}
	v.Pass = v.progress() >= 1
	return v, nil
}

// verifyMargin is what the verifier's command may take beyond test.sh's own timeout.
const verifyMargin = 5 * time.Second

// tarFolder packs the regular files and folders below dir, keeping their permission bits.
// A link or special file is refused, as Load refuses them among the task's own files.
func tarFolder(dir string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if !fi.IsDir() && !fi.Mode().IsRegular() {
			return fmt.Errorf("%s/%s: %w", filepath.Base(dir), filepath.ToSlash(rel), tasks.ErrNotRegular)
		}
		hdr := &tar.Header{Name: filepath.ToSlash(rel), Mode: int64(fi.Mode().Perm()), Typeflag: tar.TypeReg, Size: fi.Size()}
		if fi.IsDir() {
			hdr.Typeflag, hdr.Size, hdr.Name = tar.TypeDir, 0, hdr.Name+"/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if fi.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("pack %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("pack %s: %w", dir, err)
	}
	return buf.Bytes(), nil
}

// envList turns a task's env table into KEY=VALUE entries, sorted.
func envList(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	slices.Sort(out)
	return out
}

// said is test.sh's output for an error message: ", it said:" and its end, or nothing.
func said(out string) string {
	if strings.TrimSpace(out) == "" {
		return ""
	}
	return "; it said:\n" + tail(out)
}

// tail keeps the last 4 KiB of s.
func tail(s string) string {
	const n = 4 << 10
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8("…"+s[len(s)-n:], "")
}
