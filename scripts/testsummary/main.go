// Command testsummary reads `go test -json` on its input and writes what `go test`
// writes without -json (each package's result line, a failed test's output, build
// errors), then the slowest tests of the run: scripts/gotest.sh pipes the suite through
// it, so that a CI log says which tests its time went to.
//
//	go test -json ./... | go run ./scripts/testsummary [-slowest N]
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

func main() {
	slowest := flag.Int("slowest", 20, "how many of the slowest tests to list at the end (0: none)")
	flag.Parse()
	if err := summarize(os.Stdin, os.Stdout, *slowest); err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
}

// event is a `go test -json` event (go doc test2json), or a build event
// (go help buildjson: ImportPath, Action build-output or build-fail, Output).
type event struct {
	Action     string
	Package    string
	Test       string
	Elapsed    float64
	Output     string
	ImportPath string
}

// timing is one top-level test's run time.
type timing struct {
	pkg, test string
	secs      float64
}

// summarize copies the run in r to w as go test prints it without -json, then lists
// the n slowest top-level tests. A line that is not an event is copied as it is.
func summarize(r io.Reader, w io.Writer, n int) error {
	out := bufio.NewWriter(w)
	defer out.Flush()
	held := map[[2]string][]string{} // a running test's output, printed if it fails
	var times []timing
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		line := sc.Bytes()
		var e event
		if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
			fmt.Fprintf(out, "%s\n", line)
			continue
		}
		key := [2]string{e.Package, e.Test}
		switch {
		case e.Action == "build-output":
			out.WriteString(e.Output)
		case e.Action == "output" && e.Test == "":
			if e.Output != "PASS\n" && !runLine(e.Output) {
				out.WriteString(e.Output)
			}
		case e.Action == "output":
			if !runLine(e.Output) {
				held[key] = append(held[key], e.Output)
			}
		case e.Test != "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			if e.Action == "fail" {
				out.WriteString(strings.Join(held[key], ""))
			}
			delete(held, key)
			if e.Action != "skip" && !strings.Contains(e.Test, "/") {
				times = append(times, timing{e.Package, e.Test, e.Elapsed})
			}
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			// A package ended: what it printed is out now, not when the run ends (a run
			// cut short by CI's timeout still shows the packages that finished).
			if e.Action == "fail" {
				flushHeld(out, held, e.Package)
			} else {
				dropHeld(held, e.Package)
			}
			if err := out.Flush(); err != nil {
				return err
			}
		case e.Action == "build-fail":
			if err := out.Flush(); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return writeSlowest(out, times, n)
}

// flushHeld writes what the unfinished tests of a failed package printed (a timeout's
// panic among it: part of why it failed), in the tests' order, and forgets it.
func flushHeld(out *bufio.Writer, held map[[2]string][]string, pkg string) {
	for _, k := range slices.SortedFunc(maps.Keys(held), compareKeys) {
		if k[0] == pkg {
			out.WriteString(strings.Join(held[k], ""))
			delete(held, k)
		}
	}
}

// dropHeld forgets what the tests of a package that passed printed.
func dropHeld(held map[[2]string][]string, pkg string) {
	for k := range held {
		if k[0] == pkg {
			delete(held, k)
		}
	}
}

// writeSlowest lists the n slowest of the run's top-level tests.
func writeSlowest(out *bufio.Writer, times []timing, n int) error {
	if n > 0 && len(times) > 0 {
		slices.SortStableFunc(times, func(a, b timing) int {
			switch {
			case a.secs > b.secs:
				return -1
			case a.secs < b.secs:
				return 1
			}
			return 0
		})
		fmt.Fprintf(out, "\nslowest tests:\n")
		for _, t := range times[:min(n, len(times))] {
			fmt.Fprintf(out, "%9.1fs  %s  %s\n", t.secs, t.pkg, t.test)
		}
	}
	return out.Flush()
}

// runLine reports whether s is one of the lines go test writes only with -v: a test's
// run, pause, continuation or name.
func runLine(s string) bool {
	for _, p := range []string{"=== RUN ", "=== PAUSE ", "=== CONT ", "=== NAME "} {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func compareKeys(a, b [2]string) int {
	if c := strings.Compare(a[0], b[0]); c != 0 {
		return c
	}
	return strings.Compare(a[1], b[1])
}
