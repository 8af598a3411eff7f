package codefix_test

import (
	"encoding/base64"
	"encoding/json"
	"slices"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// TestStateDiffNamesRoundTrip creates files whose names hold spaces, quotes, backslashes,
// newlines, control characters, unicode, the replacement character itself and bytes that
// are not UTF-8, then removes them: the state diff gives back every name exactly, and no
// two names read alike.
func TestStateDiffNamesRoundTrip(t *testing.T) {
	sb := testSandboxes(t)
	ep := newEpisode(t, sb, 7, `{}`)
	if _, err := ep.Reset(); err != nil {
		t.Fatal(err)
	}
	names := []string{
		"a b", `q"uote`, `it's`, `back\slash`, `\n`, "new\nline", "tab\there", "ctl\x01",
		"ünïcødé ✓", "\xef\xbf\xbd", "\xff\xfe", "bad\x80\x81name", "\\\xff",
	}
	// printf's %b would read the backslashes: write each name's bytes in octal.
	cmd := ""
	for _, n := range names {
		oct := ""
		for _, c := range []byte(n) {
			oct += `\` + string('0'+c>>6) + string('0'+(c>>3)&7) + string('0'+c&7)
		}
		cmd += `: > "$(printf '` + oct + `x')"; `
	}
	// The x keeps $(...) from eating a trailing newline; the files are then renamed without it.
	cmd += `for f in *x; do case "$f" in src|tests) ;; *) mv -- "$f" "${f%x}";; esac; done`
	res := step(t, ep, tools.ShellExec, map[string]string{"command": cmd})
	want := slices.Clone(names)
	slices.Sort(want)
	if got := diffNames(t, res.Diff, "add"); !slices.Equal(got, want) {
		t.Fatalf("added names %q\nwant %q\ndiff %s\nobservation %s", got, want, res.Diff, res.Observation)
	}
	res = step(t, ep, tools.ShellExec, map[string]string{"command": `find . -maxdepth 1 -type f ! -name README.md -delete`})
	if got := diffNames(t, res.Diff, "remove"); !slices.Equal(got, want) {
		t.Fatalf("removed names %q\nwant %q\ndiff %s", got, want, res.Diff)
	}
}

// diffNames decodes a state diff's exact names (documented in docs/codefix.md), checking
// every change has the op given.
func diffNames(t *testing.T, diff []byte, op string) []string {
	t.Helper()
	var changes []struct {
		Op      string  `json:"op"`
		Path    *string `json:"path"`
		PathB64 *string `json:"path_b64"`
	}
	if err := json.Unmarshal(diff, &changes); err != nil {
		t.Fatalf("diff %s: %v", diff, err)
	}
	var out []string
	for _, c := range changes {
		if c.Op != op {
			t.Errorf("change %+v, want op %s", c, op)
		}
		switch {
		case c.PathB64 != nil:
			b, err := base64.StdEncoding.DecodeString(*c.PathB64)
			if err != nil {
				t.Fatalf("path_b64 %q: %v", *c.PathB64, err)
			}
			out = append(out, string(b))
		case c.Path != nil:
			out = append(out, *c.Path)
		default:
			t.Fatalf("change without a name: %s", diff)
		}
	}
	return out
}
