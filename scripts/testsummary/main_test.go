package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestSummaryIsGoTestsOutput runs go test on a module of passing, failing, skipped,
// logging and panicking tests and one that does not build, with and without -json, and
// checks that the summary of the -json run has the plain run's results and failures'
// output, without what only -v shows, followed by the slowest tests.
func TestSummaryIsGoTestsOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go test")
	}
	dir := t.TempDir()
	files := map[string]string{
		"go.mod": "module example.test/m\n\ngo 1.24\n",
		"a/a_test.go": `package a

import "testing"

func TestPass(t *testing.T) { t.Log("quiet when it passes") }

func TestFail(t *testing.T) {
	t.Log("said before failing")
	t.Error("boom")
}

func TestSub(t *testing.T) {
	t.Run("good", func(t *testing.T) {})
	t.Run("bad", func(t *testing.T) { t.Fatal("sub boom") })
}

func TestSkip(t *testing.T) { t.Skip("not here") }
`,
		"b/b_test.go": "package b\n\nimport \"testing\"\n\nfunc TestOK(t *testing.T) {}\n",
		"c/c_test.go": "package c\n\nimport \"testing\"\n\nfunc TestPanics(t *testing.T) { panic(\"oops\") }\n",
		"d/d_test.go": "package d\n\nimport \"testing\"\n\nfunc TestBroken(t *testing.T) { undefined() }\n",
	}
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run := func(args ...string) []byte {
		cmd := exec.Command("go", append([]string{"test", "-count=1"}, args...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
		out, _ := cmd.Output() // the packages fail on purpose; stderr (build errors' "FAIL" line) apart
		return out
	}
	plain := run("./...")
	var got bytes.Buffer
	if err := summarize(bytes.NewReader(run("-json", "./...")), &got, 3); err != nil {
		t.Fatal(err)
	}
	summary, slowest, found := strings.Cut(got.String(), "\nslowest tests:\n")
	if !found {
		t.Fatalf("no slowest tests listed:\n%s", got.String())
	}
	// The same results: each package's line, each failed test's (go test -json writes a
	// test's log before its "--- FAIL" line, and a subtest's before its parent's, where
	// go test writes them after; its build errors where go test writes them on stderr).
	times := regexp.MustCompile(`\d+\.\d+s`)
	results := func(s string) []string {
		var lines []string
		for l := range strings.Lines(times.ReplaceAllString(s, "T")) {
			l = strings.TrimSpace(l)
			if strings.HasPrefix(l, "ok  ") || strings.HasPrefix(l, "FAIL\t") || strings.HasPrefix(l, "--- FAIL") {
				lines = append(lines, l)
			}
		}
		slices.Sort(lines)
		return lines
	}
	if g, w := results(summary), results(string(plain)); !slices.Equal(g, w) {
		t.Errorf("summary's results %q, want go test's own %q\n%s", g, w, summary)
	}
	for _, want := range []string{"--- FAIL: TestFail", "said before failing", "boom", "--- FAIL: TestSub/bad", "sub boom", "panic: oops", "FAIL\texample.test/m/c", "ok  \texample.test/m/b", "example.test/m/d [build failed]"} {
		if !strings.Contains(got.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, got.String())
		}
	}
	if strings.Contains(summary, "quiet when it passes") || strings.Contains(summary, "=== RUN") {
		t.Errorf("summary shows what go test shows only with -v:\n%s", summary)
	}
	if n := strings.Count(slowest, "\n"); n != 3 {
		t.Errorf("slowest tests: %d lines, want 3:\n%s", n, slowest)
	}
}

// TestSummaryStreams: a package's result is written when the package ends, not when the
// run does (a CI run cut short still shows what finished).
func TestSummaryStreams(t *testing.T) {
	pr, pw := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- summarize(pr, outW, 5); _ = outW.Close() }()
	events := []string{
		`{"Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.5}`,
		`{"Action":"output","Package":"p","Output":"PASS\n"}`,
		`{"Action":"output","Package":"p","Output":"ok  \tp\t0.6s\n"}`,
		`{"Action":"pass","Package":"p","Elapsed":0.6}`,
	}
	go func() {
		for _, e := range events {
			_, _ = io.WriteString(pw, e+"\n")
		}
		// The run goes on: the input stays open until the test has read the result.
	}()
	read := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(outR).ReadString('\n')
		read <- line
	}()
	select {
	case line := <-read:
		if line != "ok  \tp\t0.6s\n" {
			t.Fatalf("before the run ended: read %q, want the package's result", line)
		}
	case <-time.After(30 * time.Second): // a hang guard: the line comes at once or never
		t.Fatal("nothing written 30 s after the package ended, the run still going")
	}
	_ = pw.Close()
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
