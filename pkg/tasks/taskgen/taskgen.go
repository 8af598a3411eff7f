// Package taskgen writes synthetic task folders in Harbor's format for load tests: any
// number of small, distinct, valid tasks, each with a workspace, a verifier and an oracle
// solution, drawn from a seed so that the same seed writes the same bytes.
//
// The tasks are cheap on purpose (a shell one-liner solves each, the verifier compares one
// file), so a load test measures gauntlet rather than the tasks. They come in a few kinds
// (sum the numbers of a file, count a word, sort and deduplicate lines), rotated by index,
// each with its own data. Every task is valid for package tasks; its Dockerfile starts
// from Debian bookworm and copies environment/app to /app, as the in-repo dataset's do.
package taskgen

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
)

// MaxTasks bounds one Generate call: a load test needs thousands, not millions, of
// folders, and a typo should not fill a disk.
const MaxTasks = 100_000

// kind is one family of generated task.
type kind struct {
	name string
	// make returns the workspace files, the instruction's body, the expected output of
	// /app/answer.txt and the solution's command.
	make func(r *rand.Rand) (files map[string]string, instruction, want, solve string)
}

var words = []string{"alpha", "bravo", "delta", "echo", "gamma", "kilo", "lima", "oscar", "sierra", "tango"}

var kinds = []kind{
	{"sum", func(r *rand.Rand) (map[string]string, string, string, string) {
		n := 5 + r.IntN(40)
		var b strings.Builder
		sum := 0
		for range n {
			v := r.IntN(2001) - 1000
			sum += v
			fmt.Fprintln(&b, v)
		}
		return map[string]string{"numbers.txt": b.String()},
			"/app/numbers.txt has one integer per line. Write their sum alone to /app/answer.txt.",
			strconv.Itoa(sum) + "\n",
			"awk '{ s += $1 } END { print s + 0 }' /app/numbers.txt > /app/answer.txt"
	}},
	{"count", func(r *rand.Rand) (map[string]string, string, string, string) {
		target := words[r.IntN(len(words))]
		n := 10 + r.IntN(60)
		var b strings.Builder
		count := 0
		for range n {
			w := words[r.IntN(len(words))]
			if w == target {
				count++
			}
			fmt.Fprintln(&b, w)
		}
		return map[string]string{"words.txt": b.String()},
			fmt.Sprintf("/app/words.txt has one word per line. Write how many lines are exactly `%s`, alone, to /app/answer.txt.", target),
			strconv.Itoa(count) + "\n",
			fmt.Sprintf("grep -cx '%s' /app/words.txt > /app/answer.txt || true", target)
	}},
	{"sort-unique", func(r *rand.Rand) (map[string]string, string, string, string) {
		n := 8 + r.IntN(30)
		var lines []string
		var b strings.Builder
		for range n {
			w := words[r.IntN(len(words))] + "-" + strconv.Itoa(r.IntN(20))
			lines = append(lines, w)
			fmt.Fprintln(&b, w)
		}
		slices.Sort(lines)
		lines = slices.Compact(lines)
		return map[string]string{"items.txt": b.String()},
			"/app/items.txt has one item per line. Write the distinct items, sorted in byte order, one per line, to /app/answer.txt.",
			strings.Join(lines, "\n") + "\n",
			"LC_ALL=C sort -u /app/items.txt > /app/answer.txt"
	}},
}

// Kinds are the names of the generated task families, in the order Generate rotates them.
func Kinds() []string {
	out := make([]string, len(kinds))
	for i, k := range kinds {
		out[i] = k.name
	}
	return out
}

// Task returns the files of generated task i of seed (path relative to the task folder:
// content; scripts under tests/ and solution/ end in .sh and are executable).
func Task(seed uint64, i int) (name string, files map[string]string) {
	k := kinds[i%len(kinds)]
	r := rng.New(seed, "taskgen/"+k.name, uint64(i))
	ws, body, want, solve := k.make(r)
	name = fmt.Sprintf("gen-%06d-%s", i, k.name)
	difficulty := []string{"easy", "medium", "hard"}[(i/len(kinds))%3] // not tied to the kind
	files = map[string]string{
		"instruction.md": fmt.Sprintf("# Generated task %d (%s)\n\n%s\n", i, k.name, body),
		"task.toml": fmt.Sprintf(`version = "1.0"

[metadata]
author_name = "gauntlet taskgen"
difficulty = %q
category = "generated"
tags = ["generated", %q]
seed = %d
index = %d

[verifier]
timeout_sec = 30.0

[agent]
timeout_sec = 120.0

[environment]
build_timeout_sec = 300.0
cpus = 1
memory_mb = 256
storage_mb = 64
allow_internet = false
`, difficulty, k.name, seed, i),
		"environment/Dockerfile": "FROM debian:bookworm-slim\nWORKDIR /app\nCOPY app/ /app/\n",
		"tests/expected":         want,
		"tests/test.sh": "#!/bin/bash\nmkdir -p /logs/verifier\nif [ -f /app/answer.txt ] && cmp -s /app/answer.txt /tests/expected; then\n" +
			"\techo 1 > /logs/verifier/reward.txt\nelse\n\techo 0 > /logs/verifier/reward.txt\nfi\n",
		"solution/solve.sh": "#!/bin/bash\nset -e\n" + solve + "\n",
	}
	for p, c := range ws {
		files["environment/app/"+p] = c
	}
	return name, files
}

// Generate writes tasks [0, n) of seed as folders under dir (created if needed), and
// returns their folder names. It refuses to write into a folder that already has a task of
// the same name, so a run never mixes two seeds' tasks.
func Generate(dir string, n int, seed uint64) ([]string, error) {
	if n < 1 || n > MaxTasks {
		return nil, fmt.Errorf("generate tasks: n = %d, want 1 to %d", n, MaxTasks)
	}
	names := make([]string, 0, n)
	for i := range n {
		name, files := Task(seed, i)
		td := filepath.Join(dir, name)
		if _, err := os.Lstat(td); err == nil {
			return names, fmt.Errorf("generate tasks: %s already exists", td)
		}
		for rel, content := range files {
			p := filepath.Join(td, filepath.FromSlash(rel))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return names, fmt.Errorf("generate tasks: %w", err)
			}
			mode := os.FileMode(0o644)
			if strings.HasSuffix(rel, ".sh") {
				mode = 0o755
			}
			if err := os.WriteFile(p, []byte(content), mode); err != nil {
				return names, fmt.Errorf("generate tasks: %w", err)
			}
		}
		names = append(names, name)
	}
	return names, nil
}
