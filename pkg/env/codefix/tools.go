package codefix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// The workspace tools run as commands inside the sandbox, so they see only what the
// sandbox sees: its own workspace, nothing of the host or of other sandboxes. Paths are
// checked before that (relative, no "..") and a refused path is recorded as a safety event.

// toolArgs is the union of the tools' arguments.
type toolArgs struct {
	Cmd       string  `json:"cmd"`
	TimeoutMs int64   `json:"timeout_ms"`
	Path      string  `json:"path"`
	Content   *string `json:"content"`
	Old       *string `json:"old"`
	New       *string `json:"new"`
}

// minExecTimeout is the shortest timeout a shell.exec gets, whatever it asks for.
const minExecTimeout = 100 * time.Millisecond

// maxOutput caps what a shell.exec returns of stdout and of stderr; fs.read caps a file.
const maxOutput = 16 << 10

func lookupTool(name string) *toolDef {
	for i := range toolDefs {
		if toolDefs[i].name == name {
			return &toolDefs[i]
		}
	}
	return nil
}

// parseAction validates an action against its tool: known tool, a JSON object with only the
// tool's fields, required fields present. A bad action returns the observation saying why.
func parseAction(a env.Action) (*toolDef, toolArgs, *errObs) {
	t := lookupTool(a.Tool)
	if t == nil {
		return nil, toolArgs{}, &errObs{Error: fmt.Sprintf("unknown tool %.60q", a.Tool),
			Suggestion: "use one of: " + strings.Join(toolNames, ", ")}
	}
	var args toolArgs
	raw := bytes.TrimSpace(a.Args)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, args, &errObs{Error: t.name + ": args must be a JSON object", Suggestion: "schema: " + t.schema}
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	_ = json.Unmarshal([]byte(t.schema), &schema) // the package's own schemas
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, ok := schema.Properties[k]; !ok {
			return nil, args, &errObs{Error: fmt.Sprintf("%s: unknown argument %.40q", t.name, k), Suggestion: "schema: " + t.schema}
		}
	}
	for _, k := range schema.Required {
		if _, ok := fields[k]; !ok {
			return nil, args, &errObs{Error: fmt.Sprintf("%s: missing argument %q", t.name, k), Suggestion: "schema: " + t.schema}
		}
	}
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, args, &errObs{Error: fmt.Sprintf("%s: %v", t.name, err), Suggestion: "schema: " + t.schema}
	}
	if t.name == ToolShellExec && strings.TrimSpace(args.Cmd) == "" {
		return nil, args, &errObs{Error: "shell.exec: cmd is empty"}
	}
	if args.TimeoutMs < 0 {
		return nil, args, &errObs{Error: "shell.exec: timeout_ms must be positive"}
	}
	return t, args, nil
}

// shellObs is what shell.exec returns.
type shellObs struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}

type readObs struct {
	OK        bool   `json:"ok"`
	Path      string `json:"path"`
	Content   string `json:"content"`
	Truncated bool   `json:"truncated,omitempty"`
}

type writeObs struct {
	OK    bool   `json:"ok"`
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

type listObs struct {
	OK      bool     `json:"ok"`
	Path    string   `json:"path"`
	Entries []string `json:"entries"`
}

// runTool runs one workspace tool in the sandbox.
func (e *episode) runTool(ctx context.Context, t *toolDef, a toolArgs, o *outcome) ([]byte, error) {
	if t.name == ToolShellExec {
		timeout := e.p.execTimeout
		if a.TimeoutMs > 0 {
			// At least minExecTimeout: the runtime's sandbox setup counts against it.
			timeout = min(timeout, max(minExecTimeout, time.Duration(a.TimeoutMs)*time.Millisecond))
		}
		r, err := e.exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", a.Cmd}, Timeout: timeout, OutputLimit: maxOutput})
		if err != nil {
			return nil, err
		}
		o.addExec(r)
		o.touched = true
		if r.ExitCode != 0 {
			o.errors++
		}
		return marshal(shellObs{ExitCode: r.ExitCode, Stdout: text(r.Stdout), Stderr: text(r.Stderr),
			TimedOut: r.TimedOut, Truncated: r.Truncated}), nil
	}

	path := a.Path
	if path == "" && t.name == ToolFSList {
		path = "."
	}
	clean, err := sandbox.CleanRelPath(path)
	if err != nil {
		o.errors++
		o.safety = append(o.safety, fmt.Sprintf("%s: %s refused %.80q", EventPathRefused, t.name, path))
		return marshal(errObs{Error: fmt.Sprintf("%s: path refused: %v", t.name, err),
			Suggestion: "paths are relative to the workspace root, without \"..\""}), nil
	}
	switch t.name {
	case ToolFSRead:
		data, failure, err := e.readFile(ctx, clean, o)
		if err != nil || failure != nil {
			return failure, err
		}
		trunc := len(data) > maxOutput
		if trunc {
			data = data[:maxOutput]
		}
		return marshal(readObs{OK: true, Path: clean, Content: text(data), Truncated: trunc}), nil
	case ToolFSWrite:
		return e.writeFile(ctx, t.name, clean, []byte(*a.Content), o)
	case ToolFSList:
		r, err := e.exec(ctx, sandbox.ExecRequest{
			Argv:    []string{"sh", "-c", `cd -- "$1" && find . -mindepth 1 \( -type d -exec sh -c 'echo "$1/"' _ {} \; -o -print \)`, "_", clean},
			Timeout: 30 * time.Second, OutputLimit: maxOutput,
		})
		if err != nil {
			return nil, err
		}
		o.addExec(r)
		if r.ExitCode != 0 {
			o.errors++
			return marshal(errObs{Error: fmt.Sprintf("fs.list %s: %s", clean, firstLine(r.Stderr))}), nil
		}
		var entries []string
		for _, l := range strings.Split(string(r.Stdout), "\n") {
			if l = strings.TrimPrefix(l, "./"); l != "" {
				entries = append(entries, l)
			}
		}
		slices.Sort(entries)
		return marshal(listObs{OK: true, Path: clean, Entries: nonNil(entries)}), nil
	case ToolFSPatch:
		data, failure, err := e.readFile(ctx, clean, o)
		if err != nil || failure != nil {
			return failure, err
		}
		old, repl := *a.Old, *a.New
		switch n := strings.Count(string(data), old); {
		case old == "":
			o.errors++
			return marshal(errObs{Error: "fs.patch: old is empty", Suggestion: "use fs.write to replace a whole file"}), nil
		case n != 1:
			o.errors++
			return marshal(errObs{Error: fmt.Sprintf("fs.patch: old occurs %d times in %s, want exactly once", n, clean),
				Suggestion: "read the file and quote more context"}), nil
		}
		return e.writeFile(ctx, t.name, clean, []byte(strings.Replace(string(data), old, repl, 1)), o)
	}
	return nil, fmt.Errorf("codefix: tool %s has no implementation", t.name)
}

// readFile reads a workspace file; a file the agent cannot read is an observation.
func (e *episode) readFile(ctx context.Context, path string, o *outcome) ([]byte, []byte, error) {
	r, err := e.exec(ctx, sandbox.ExecRequest{
		Argv:    []string{"sh", "-c", `test -f "$1" || { echo "not a regular file" >&2; exit 1; }; cat -- "$1"`, "_", path},
		Timeout: 30 * time.Second, OutputLimit: 4 * maxOutput,
	})
	if err != nil {
		return nil, nil, err
	}
	o.addExec(r)
	if r.ExitCode != 0 {
		o.errors++
		return nil, marshal(errObs{Error: fmt.Sprintf("read %s: %s", path, firstLine(r.Stderr))}), nil
	}
	return r.Stdout, nil, nil
}

// writeFile creates or replaces a workspace file (and its parent directories).
func (e *episode) writeFile(ctx context.Context, tool, path string, data []byte, o *outcome) ([]byte, error) {
	r, err := e.exec(ctx, sandbox.ExecRequest{
		Argv:    []string{"sh", "-c", `mkdir -p -- "$(dirname -- "$1")" && cat > "$1"`, "_", path},
		Stdin:   data,
		Timeout: 30 * time.Second, OutputLimit: maxOutput,
	})
	if err != nil {
		return nil, err
	}
	o.addExec(r)
	o.touched = true
	if protected(path) {
		o.safety = append(o.safety, fmt.Sprintf("%s: %s wrote %s", EventTestsModified, tool, path))
	}
	if r.ExitCode != 0 {
		o.errors++
		return marshal(errObs{Error: fmt.Sprintf("%s %s: %s", tool, path, firstLine(r.Stderr))}), nil
	}
	return marshal(writeObs{OK: true, Path: path, Bytes: len(data)}), nil
}

// text returns b as a string with invalid UTF-8 replaced, so observations stay valid JSON
// text that reads the same after a round trip.
func text(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(text(b)), "\n")
	if len(s) > 200 {
		s = s[:200]
	}
	return s
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}
