package ctrd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestShimStartScript runs the start script against a stand-in for the real shim that
// prints its arguments: a joining start is answered by the script, everything else is
// the real shim's, and a first start's answer is kept for the runtime.
func TestShimStartScript(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real-shim")
	if err := os.WriteFile(real, []byte("#!/bin/sh\nprintf 'real:%s' \"$*\"\n"), 0o700); err != nil {
		t.Fatal(err)
	}
	sandboxes := filepath.Join(dir, "sandboxes")
	script := filepath.Join(dir, "start")
	if err := os.WriteFile(script, []byte(shimStartScript(real, sandboxes)), 0o700); err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, "bundle")
	for _, d := range []string{bundle, filepath.Join(sandboxes, "sb-join"), filepath.Join(sandboxes, "sb-first")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(sandboxes, "sb-join", shimAddressFile), []byte("unix:///run/containerd/s/abc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(script, args...)
		cmd.Dir = bundle
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		return string(out)
	}
	common := []string{"-namespace", "gauntlet", "-address", "/x/containerd.sock", "-publish-binary", "/usr/bin/containerd"}

	if out := run(append(common, "-id", "sb-join", "start")...); out != "unix:///run/containerd/s/abc" {
		t.Errorf("joining start printed %q, want the group's address alone", out)
	}
	if b, err := os.ReadFile(filepath.Join(bundle, "address")); err != nil || string(b) != "unix:///run/containerd/s/abc" {
		t.Errorf("bundle address file %q, %v", b, err)
	}

	out := run(append(common, "-id", "sb-first", "start")...)
	if !strings.HasPrefix(out, "real:") || !strings.HasSuffix(out, "-id sb-first start") {
		t.Errorf("first start printed %q, want the real shim's answer", out)
	}
	if b, err := os.ReadFile(filepath.Join(sandboxes, "sb-first", shimStartedFile)); err != nil || strings.TrimSpace(string(b)) != out {
		t.Errorf("kept answer %q, %v; want %q", b, err, out)
	}

	for _, args := range [][]string{
		append(common, "-id", "sb-join", "-bundle", bundle, "delete"), // not a start
		append(common, "-id", "unknown", "start"),                     // no state directory
		append(common, "-id", "../sandboxes/sb-join", "start"),        // not an id
		{"-v"},
	} {
		if out := run(args...); out != "real:"+strings.Join(args, " ") {
			t.Errorf("%v printed %q, want the real shim's", args, out)
		}
	}
}
