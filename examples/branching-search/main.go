// Command branching-search shows tree search over actions with sandbox snapshots: it
// starts a codefix episode in a real sandbox, reads the buggy library, then branches the
// episode once per candidate fix. Each branch (a fresh sandbox forked from a snapshot of
// the trunk's workspace) applies its candidate and runs the tests; the search keeps the
// branch whose tests pass and submits it for the verifier's verdict. The trunk is never
// changed, so any number of candidates can be tried from the same state.
//
//	sudo go run ./examples/branching-search --runtime process --seed 7
//
// The process runtime needs root (namespaces, overlayfs, cgroups); containerd needs its
// daemon (see docs/codefix.md).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/env/codefix"
	"github.com/gauntlet-rl/gauntlet/pkg/runtimes"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

func main() {
	rt := flag.String("runtime", runtimes.Process, "sandbox runtime: process or containerd")
	image := flag.String("image", "", "root filesystem (containerd: an image reference)")
	state := flag.String("state-dir", "", "runtime state directory (default: a temporary one)")
	seed := flag.Uint64("seed", 7, "episode seed: picks the bug")
	flag.Parse()
	if err := run(*rt, *image, *state, *seed); err != nil {
		fmt.Fprintln(os.Stderr, "branching-search:", err)
		os.Exit(1)
	}
}

func run(rtName, image, state string, seed uint64) (err error) {
	ctx := context.Background()
	if state == "" {
		if state, err = os.MkdirTemp("", "branching-search-"); err != nil {
			return err
		}
		defer os.RemoveAll(state)
		// The sandbox user must reach its workspace below the state directory.
		if err := os.Chmod(state, 0o755); err != nil {
			return err
		}
	}
	if rtName == runtimes.None {
		return errors.New("--runtime: name one: process or containerd")
	}
	sb, err := runtimes.Open(ctx, runtimes.Config{Runtime: rtName, Image: image, StateDir: state}, nil)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, sb.Close()) }()

	trunk, err := codefix.New().NewEpisode(env.Config{Seed: seed, Sandboxes: sb})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, env.Close(trunk)) }()
	if _, err := trunk.Reset(); err != nil {
		return err
	}
	if _, err := step(trunk, tools.FSRead, map[string]string{"path": codefix.LibPath}); err != nil {
		return err
	}
	fmt.Printf("seed %d: trunk at step 1 (library read); trying %d candidate fixes, one branch each\n\n", seed, len(codefix.CandidateFixes()))
	fmt.Printf("%-4s %-10s %-9s %-11s %s\n", "cand", "branch ms", "patched", "tests exit", "fix")

	var winner env.Episode
	for i, cand := range codefix.CandidateFixes() {
		t0 := time.Now()
		b, err := trunk.(env.Brancher).Branch(ctx)
		if err != nil {
			return err
		}
		forkMs := float64(time.Since(t0).Microseconds()) / 1000
		patched, exit := false, -1
		obs, err := step(b, tools.FSPatch, cand)
		if err == nil && strings.Contains(string(obs), `"ok":true`) {
			patched = true
			var res struct {
				ExitCode int `json:"exit_code"`
			}
			if obs, err = step(b, tools.ShellExec, map[string]string{"command": codefix.TestCommand}); err == nil {
				_ = json.Unmarshal(obs, &res)
				exit = res.ExitCode
			}
		}
		if err != nil {
			return errors.Join(err, env.Close(b))
		}
		fmt.Printf("%-4d %-10.1f %-9v %-11s %s\n", i, forkMs, patched, exitText(exit), firstLine(cand.Edits[0].New))
		if exit == 0 && winner == nil {
			winner = b // keep it open for the verdict
			continue
		}
		if err := env.Close(b); err != nil {
			return err
		}
	}
	if winner == nil {
		fmt.Println("\nno candidate made the tests pass")
		return nil
	}
	defer func() { err = errors.Join(err, env.Close(winner)) }()
	obs, err := step(winner, codefix.ToolSubmit, map[string]string{})
	if err != nil {
		return err
	}
	fmt.Printf("\nsubmitted the passing branch; verifier: %s\n", obs)
	return nil
}

func step(ep env.Episode, tool string, args any) (json.RawMessage, error) {
	b, _ := json.Marshal(args)
	res, err := ep.Step(env.Action{Tool: tool, Args: b})
	return res.Observation, err
}

func exitText(code int) string {
	if code < 0 {
		return "-"
	}
	return fmt.Sprint(code)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l + " …"
}
