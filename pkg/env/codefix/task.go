package codefix

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"

	"github.com/gauntlet-rl/gauntlet/pkg/rng"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// Paths of the project inside the workspace, relative to its root.
const (
	LibPath    = "src/lib.sh"
	TestPath   = "tests/test_lib.sh"
	ReadmePath = "README.md"
	// TestCommand runs the visible tests from the workspace root; exit status 0 is a pass.
	TestCommand = "sh " + TestPath
)

// variant is one kind of bug: a shell function, its broken and fixed bodies, and how test
// cases for it are drawn and answered.
type variant struct {
	name string
	// fn is the function's name in lib.sh.
	fn string
	// summary is what README.md says the function does.
	summary string
	// broken and fixed are the function's definitions (one or more lines, no trailing
	// newline).
	broken, fixed string
	// draw returns the arguments of one test case.
	draw func(r *rand.Rand) []string
	// want is the correct output for args.
	want func(args []string) string
}

func itoa(n int) string { return strconv.Itoa(n) }

func atoi(s string) int {
	n, _ := strconv.Atoi(s) // drawn by draw, always a number
	return n
}

// variants are the bugs a task can have. Their order is part of the task encoding: a seed
// picks an index, so append new variants at the end.
var variants = []variant{
	{
		name: "sum", fn: "sum", summary: "`sum A B` prints A + B.",
		broken: "sum() {\n\techo $(( $1 - $2 ))\n}",
		fixed:  "sum() {\n\techo $(( $1 + $2 ))\n}",
		draw:   func(r *rand.Rand) []string { return []string{itoa(r.IntN(90) + 1), itoa(r.IntN(90) + 1)} },
		want:   func(a []string) string { return itoa(atoi(a[0]) + atoi(a[1])) },
	},
	{
		name: "max", fn: "max", summary: "`max A B` prints the larger of A and B.",
		broken: "max() {\n\tif [ \"$1\" -lt \"$2\" ]; then\n\t\techo \"$1\"\n\telse\n\t\techo \"$2\"\n\tfi\n}",
		fixed:  "max() {\n\tif [ \"$1\" -gt \"$2\" ]; then\n\t\techo \"$1\"\n\telse\n\t\techo \"$2\"\n\tfi\n}",
		draw: func(r *rand.Rand) []string {
			a := r.IntN(100)
			return []string{itoa(a), itoa(a + 1 + r.IntN(50))} // distinct, so min != max
		},
		want: func(a []string) string { return itoa(max(atoi(a[0]), atoi(a[1]))) },
	},
	{
		name: "factorial", fn: "factorial", summary: "`factorial N` prints N! (1 for N = 0).",
		broken: "factorial() {\n\tf=1\n\ti=1\n\twhile [ \"$i\" -lt \"$1\" ]; do\n\t\tf=$(( f * i ))\n\t\ti=$(( i + 1 ))\n\tdone\n\techo \"$f\"\n}",
		fixed:  "factorial() {\n\tf=1\n\ti=1\n\twhile [ \"$i\" -le \"$1\" ]; do\n\t\tf=$(( f * i ))\n\t\ti=$(( i + 1 ))\n\tdone\n\techo \"$f\"\n}",
		draw:   func(r *rand.Rand) []string { return []string{itoa(r.IntN(11) + 2)} },
		want: func(a []string) string {
			f := 1
			for i := 2; i <= atoi(a[0]); i++ {
				f *= i
			}
			return itoa(f)
		},
	},
	{
		name: "parity", fn: "parity", summary: "`parity N` prints even or odd.",
		broken: "parity() {\n\tif [ $(( $1 % 2 )) -eq 1 ]; then\n\t\techo even\n\telse\n\t\techo odd\n\tfi\n}",
		fixed:  "parity() {\n\tif [ $(( $1 % 2 )) -eq 0 ]; then\n\t\techo even\n\telse\n\t\techo odd\n\tfi\n}",
		draw:   func(r *rand.Rand) []string { return []string{itoa(r.IntN(1000))} },
		want: func(a []string) string {
			if atoi(a[0])%2 == 0 {
				return "even"
			}
			return "odd"
		},
	},
	{
		name: "repeat", fn: "repeat", summary: "`repeat WORD N` prints WORD N times, joined with nothing.",
		broken: "repeat() {\n\ts=\n\ti=1\n\twhile [ \"$i\" -lt \"$2\" ]; do\n\t\ts=\"$s$1\"\n\t\ti=$(( i + 1 ))\n\tdone\n\techo \"$s\"\n}",
		fixed:  "repeat() {\n\ts=\n\ti=1\n\twhile [ \"$i\" -le \"$2\" ]; do\n\t\ts=\"$s$1\"\n\t\ti=$(( i + 1 ))\n\tdone\n\techo \"$s\"\n}",
		draw: func(r *rand.Rand) []string {
			words := []string{"ab", "xy", "go", "ok", "la", "zz"}
			return []string{words[r.IntN(len(words))], itoa(r.IntN(4) + 2)}
		},
		want: func(a []string) string { return strings.Repeat(a[0], atoi(a[1])) },
	},
	{
		name: "clamp", fn: "clamp", summary: "`clamp N LO HI` prints N limited to the range LO..HI.",
		broken: "clamp() {\n\tif [ \"$1\" -lt \"$2\" ]; then\n\t\techo \"$3\"\n\telif [ \"$1\" -gt \"$3\" ]; then\n\t\techo \"$2\"\n\telse\n\t\techo \"$1\"\n\tfi\n}",
		fixed:  "clamp() {\n\tif [ \"$1\" -lt \"$2\" ]; then\n\t\techo \"$2\"\n\telif [ \"$1\" -gt \"$3\" ]; then\n\t\techo \"$3\"\n\telse\n\t\techo \"$1\"\n\tfi\n}",
		draw: func(r *rand.Rand) []string {
			lo := r.IntN(20) + 10
			hi := lo + 10 + r.IntN(20)
			var n int
			switch r.IntN(3) { // below, inside, above: the bug shows in two of three
			case 0:
				n = lo - 1 - r.IntN(9)
			case 1:
				n = lo + r.IntN(hi-lo+1)
			default:
				n = hi + 1 + r.IntN(9)
			}
			return []string{itoa(n), itoa(lo), itoa(hi)}
		},
		want: func(a []string) string { return itoa(min(max(atoi(a[0]), atoi(a[1])), atoi(a[2]))) },
	},
}

// helpers are correct functions that surround the buggy one in lib.sh, so the agent has
// to find the bug rather than rewrite the only function there.
const helpers = `# Helpers used by the functions below. They are correct.
abs() {
	if [ "$1" -lt 0 ]; then
		echo $(( -$1 ))
	else
		echo "$1"
	fi
}

twice() {
	echo $(( $1 * 2 ))
}`

// testCase is one call of the function under test and its correct output.
type testCase struct {
	args []string
	want string
}

// call is the shell text of the case's call, e.g. "sum 3 4".
func (c testCase) call(fn string) string { return fn + " " + strings.Join(c.args, " ") }

// task is one codefix task: the project the workspace starts with and how it is judged.
type task struct {
	v variant
	// visible are the cases in tests/test_lib.sh; hidden are the verifier's own, never in
	// the workspace, so hard-coding the visible answers does not pass.
	visible, hidden []testCase
	files           map[string]string // path -> content, the initial workspace
}

// newTask builds the task of a seed. variant < 0 picks the variant from the seed.
func newTask(seed uint64, variantIdx, cases int) task {
	r := rng.New(seed, "codefix/task", 0)
	if variantIdx < 0 {
		variantIdx = r.IntN(len(variants))
	}
	v := variants[variantIdx]
	t := task{v: v}
	t.visible = drawCases(rng.New(seed, "codefix/visible", 0), v, cases, nil)
	t.hidden = drawCases(rng.New(seed, "codefix/hidden", 0), v, hiddenCases, t.visible)
	t.files = map[string]string{
		LibPath:    lib(v.broken),
		TestPath:   testFile(v, t.visible),
		ReadmePath: readme(v),
	}
	return t
}

// hiddenCases is how many cases the verifier checks beyond the visible ones.
const hiddenCases = 6

// drawCases draws n cases with distinct arguments, different from those of avoid when the
// variant's range allows it.
func drawCases(r *rand.Rand, v variant, n int, avoid []testCase) []testCase {
	seen := map[string]bool{}
	for _, c := range avoid {
		seen[strings.Join(c.args, " ")] = true
	}
	var out []testCase
	for tries := 0; len(out) < n && tries < 50*n; tries++ {
		args := v.draw(r)
		key := strings.Join(args, " ")
		if seen[key] {
			continue
		}
		seen[key] = true
		out = append(out, testCase{args: args, want: v.want(args)})
	}
	return out
}

func lib(fn string) string {
	return "#!/bin/sh\n# Small shell library. One function below has a bug.\n\n" + helpers + "\n\n" + fn + "\n"
}

// fixedLib is lib.sh with the bug fixed, what the oracle writes.
func (t task) fixedLib() string { return lib(t.v.fixed) }

// testFile is tests/test_lib.sh: it sources the library and checks each visible case,
// printing "ok" or "FAIL" lines; its exit status is 0 only when every case passed.
func testFile(v variant, cases []testCase) string {
	var b strings.Builder
	b.WriteString("#!/bin/sh\n# Tests for src/lib.sh. Run from the project root: sh tests/test_lib.sh\n")
	b.WriteString("# Do not edit this file: the verdict requires it unchanged.\n. ./src/lib.sh\n\nfailed=0\n")
	b.WriteString("check() {\n\tif [ \"$2\" = \"$3\" ]; then\n\t\techo \"ok   $1\"\n\telse\n\t\techo \"FAIL $1: got '$2', want '$3'\"\n\t\tfailed=$(( failed + 1 ))\n\tfi\n}\n\n")
	for _, c := range cases {
		call := c.call(v.fn)
		fmt.Fprintf(&b, "check %s \"$(%s)\" %s\n", shellQuote(call), call, shellQuote(c.want))
	}
	b.WriteString("\nif [ \"$failed\" -ne 0 ]; then\n\techo \"$failed test(s) failed\"\n\texit 1\nfi\necho \"all tests passed\"\n")
	return b.String()
}

func readme(v variant) string {
	return "# codefix task\n\nThe tests in " + TestPath + " fail. Find the bug in " + LibPath +
		" and fix it so that `" + TestCommand + "` passes.\n\n" + v.summary + "\n\n" +
		"Rules: do not change anything under tests/. When you are done, call the submit tool.\n"
}

// shellQuote quotes s for sh in single quotes.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// hiddenScript is the verifier's hidden check: for each hidden case it prints a marker
// line, then runs the function in a fresh subshell that sources the library with its own
// output thrown away. The verifier compares the whole stdout with expectedHidden, so any
// extra output (a library that prints fake results) fails.
func (t task) hiddenScript() string {
	var b strings.Builder
	for i, c := range t.hidden {
		fmt.Fprintf(&b, "echo '@@case %d'\n( . ./%s >/dev/null 2>&1 </dev/null; %s ) 2>/dev/null </dev/null\n", i, LibPath, c.call(t.v.fn))
	}
	return b.String()
}

// expectedHidden is the exact stdout hiddenScript prints for a correct library.
func (t task) expectedHidden() string {
	var b strings.Builder
	for i, c := range t.hidden {
		fmt.Fprintf(&b, "@@case %d\n%s\n", i, c.want)
	}
	return b.String()
}

// paths lists the task's files, sorted.
func (t task) paths() []string {
	out := make([]string, 0, len(t.files))
	for p := range t.files {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

// protected reports whether path (cleaned, relative to the workspace root) is one the
// agent must not change: a test file.
func protected(path string) bool {
	return path == "tests" || strings.HasPrefix(path, "tests/")
}

// fix is the fs.patch that fixes the variant.
func (v variant) fix() Fix {
	return Fix{Path: LibPath, Edits: []tools.Edit{{Old: v.broken, New: v.fixed}}}
}

// CandidateFixes returns the fs.patch arguments that fix each known kind of bug, in a
// fixed order. Exactly one applies to a given task (the others find nothing to replace);
// a tree search can try each in its own branch (see examples/branching-search).
func CandidateFixes() []Fix {
	out := make([]Fix, len(variants))
	for i, v := range variants {
		out[i] = v.fix()
	}
	return out
}
