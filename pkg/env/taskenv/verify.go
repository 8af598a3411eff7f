package taskenv

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

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

// prepScript runs first in the verifier's fork: it reports and removes what the agent
// left on the verifier's paths (the workspace's logs/ when it is not a plain folder,
// logs/verifier, tests/, solution/), and makes logs/verifier empty. rm -rf removes a link
// itself, never what it leads to.
const prepScript = `cd /workspace || exit 1
if [ -L logs ] || { [ -e logs ] && [ ! -d logs ]; }; then echo "planted: /logs is not a folder"; rm -rf logs; fi
if [ -n "$(ls -A logs/verifier 2>/dev/null)" ]; then echo "planted: /logs/verifier held $(ls -A logs/verifier | head -c 200 | tr '\n' ' ')"; fi
if [ -n "$(ls -A tests 2>/dev/null)" ] || [ -L tests ]; then echo "planted: /tests was not empty before the verifier"; fi
rm -rf logs/verifier tests solution && mkdir -p logs/verifier logs/agent tests
`

// readScript prints the reward the verifier left: "txt" or "json" and the file, or "none".
const readScript = `cd /workspace/logs/verifier || { echo none; exit 0; }
if [ -f reward.txt ] && [ ! -L reward.txt ]; then echo txt; head -c 65537 reward.txt
elif [ -f reward.json ] && [ ! -L reward.json ]; then echo json; head -c 65537 reward.json
else echo none; fi
`

// verify judges the agent's final state. The agent's sandbox is snapshotted and a fresh
// sandbox forked from the snapshot, where nothing of the agent runs (the process runtime
// ends every command's processes with it; a fork starts none); there the verifier's paths
// are cleared, tests/ copied in, and tests/test.sh run under the [verifier] timeout.
func (e *episode) verify(ctx context.Context) (*verdict, error) {
	rt := e.cfg.Sandboxes.Runtime()
	snap, fork, err := snapshotFork(rt)
	if err != nil {
		return nil, err
	}
	s, err := snap.Snapshot(ctx, e.sb)
	if err != nil {
		return nil, fmt.Errorf("tasks: verify: snapshot %s: %w", e.sb, err)
	}
	defer func() { _ = snap.DeleteSnapshot(context.WithoutCancel(ctx), s.ID) }()
	h, err := fork.Fork(ctx, s.ID)
	if err != nil {
		return nil, fmt.Errorf("tasks: verify: fork %s: %w", s.ID, err)
	}
	defer func() { _ = e.cfg.Sandboxes.Release(context.WithoutCancel(ctx), h.ID) }()

	run := func(req sandbox.ExecRequest) (sandbox.ExecResult, error) {
		r, err := rt.Exec(ctx, h.ID, req)
		if err != nil {
			return r, fmt.Errorf("tasks: verify in sandbox %s: %w", h.ID, err)
		}
		return r, nil
	}
	v := &verdict{}
	r, err := run(sandbox.ExecRequest{Argv: []string{"sh", "-c", prepScript}, Timeout: opTimeout, OutputLimit: 4 << 10})
	if err != nil {
		return nil, err
	}
	if r.ExitCode != 0 {
		return nil, fmt.Errorf("%w: task %s: clearing the verifier's paths: exit %d: %s", ErrVerifier, e.task.ID, r.ExitCode, r.Stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(r.Stdout)), "\n") {
		if d, ok := strings.CutPrefix(line, "planted: "); ok {
			v.safety = append(v.safety, EventVerifierPlanted+": "+d)
		}
	}
	tests, err := tarFolder(filepath.Join(e.task.Dir, tasks.TestsDir))
	if err != nil {
		return nil, fmt.Errorf("%w: task %s: %v", ErrVerifier, e.task.ID, err)
	}
	r, err = run(sandbox.ExecRequest{Argv: []string{"tar", "-x", "-f", "-", "-C", "/workspace/" + testsDir}, Stdin: tests, Timeout: opTimeout})
	if err != nil {
		return nil, err
	}
	if r.ExitCode != 0 {
		return nil, fmt.Errorf("%w: task %s: copying tests/ in: exit %d: %s", ErrVerifier, e.task.ID, r.ExitCode, r.Stderr)
	}
	r, err = run(sandbox.ExecRequest{
		// --noprofile --norc: no start-up file the agent could have planted is read.
		Argv: []string{"bash", "--noprofile", "--norc", tasks.TestsMount + "/test.sh"},
		Env:  envList(e.task.Config.Verifier.Env), Dir: appDir,
		Timeout: e.task.Config.Verifier.Timeout, OutputLimit: maxOutput,
	})
	if err != nil {
		return nil, err
	}
	out := text(string(r.Stdout) + string(r.Stderr))
	if r.TimedOut {
		return nil, fmt.Errorf("%w: task %s: test.sh timed out after %v%s", ErrVerifier, e.task.ID, e.task.Config.Verifier.Timeout, said(out))
	}
	v.ExitCode, v.Output = r.ExitCode, tail(out)
	rr, err := run(sandbox.ExecRequest{Argv: []string{"sh", "-c", readScript}, Timeout: opTimeout, OutputLimit: 128 << 10})
	if err != nil {
		return nil, err
	}
	kind, data, _ := bytes.Cut(rr.Stdout, []byte("\n"))
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
		return nil, fmt.Errorf("%w: task %s: %w (test.sh exited %d)%s", ErrVerifier, e.task.ID, err, r.ExitCode, said(out))
	}
	v.Pass = v.progress() >= 1
	return v, nil
}

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
