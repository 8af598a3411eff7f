package mcpenv_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gauntlet-rl/gauntlet/pkg/env/mcpenv"
)

// FuzzLoad: whatever a declaration file holds, loading it never panics, and a refusal
// names the file and wraps ErrInvalid (or is the file's own read error).
func FuzzLoad(f *testing.F) {
	example, err := os.ReadFile("../../../examples/mcp-notes-server/notes.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(example))
	f.Add("env: mcp\nname: x\nserver: {url: 'http://h/mcp'}\ntools: [{name: t}]\ntask: t\nverifier: {success: 'calls.size() > 2 && seed > 1u'}\n")
	f.Add("env: mcp\nname: x\nserver: {command: [a], env: ['A=1', 'b']}\ntools: [{name: t}]\ntask: t\nverifier: {command: [x], timeout_ms: 5}\noracle: [{tool: t, args: {a: [1, {b: '{seed}'}]}}]\n")
	f.Add("a: &a [*a, *a]\n")
	f.Add("- 1\n- 2\n")
	f.Add("env: mcp\nverifier: {success: 'calls.exists(c, c.args.x.y == 1'}\n")
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data string) {
		p := filepath.Join(dir, "x.yaml")
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		d, err := mcpenv.Load(p)
		switch {
		case err == nil && d == nil:
			t.Fatal("no declaration and no error")
		case err != nil && (!errors.Is(err, mcpenv.ErrInvalid) || !strings.Contains(err.Error(), p)):
			t.Fatalf("error without ErrInvalid or the file: %v", err)
		case err == nil:
			_ = mcpenv.New(d).Spec()
		}
	})
}
