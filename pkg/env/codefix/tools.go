package codefix

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/tools"
)

// The workspace tools are the shared ones of package tools (confined to the workspace;
// refusals reported as safety events); codefix adds the virtual clock, the fault
// injector, observations that are the same on every runtime, and the test-file guard.

// minExecTimeout is the shortest timeout a shell.exec gets, whatever it asks for: the
// runtime's sandbox setup counts against it.
const minExecTimeout = 100 * time.Millisecond

// maxOutput caps what a shell.exec returns of stdout and of stderr.
const maxOutput = 16 << 10

// maxFile caps fs.read results and fs.write content.
const maxFile = 256 << 10

func lookupTool(name string) *toolDef {
	for i := range toolDefs {
		if toolDefs[i].name == name {
			return &toolDefs[i]
		}
	}
	return nil
}

// parseAction checks an action against its tool's schema: known tool, a JSON object with
// only the schema's properties, required ones present. A bad action returns the
// observation saying why. Types are checked when the tool decodes its arguments.
func parseAction(a env.Action) (*toolDef, json.RawMessage, *errObs) {
	t := lookupTool(a.Tool)
	if t == nil {
		return nil, nil, &errObs{Error: fmt.Sprintf("unknown tool %.60q", a.Tool),
			Suggestion: "use one of: " + strings.Join(toolNames, ", ")}
	}
	raw := bytes.TrimSpace(a.Args)
	if len(raw) == 0 {
		raw = []byte("{}")
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, nil, &errObs{Error: t.name + ": args must be a JSON object", Suggestion: "schema: " + string(t.schema)}
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
		Required   []string                   `json:"required"`
	}
	_ = json.Unmarshal(t.schema, &schema) // the tools' own schemas
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if _, ok := schema.Properties[k]; !ok {
			return nil, nil, &errObs{Error: fmt.Sprintf("%s: unknown argument %.40q", t.name, k), Suggestion: "schema: " + string(t.schema)}
		}
	}
	for _, k := range schema.Required {
		if _, ok := fields[k]; !ok {
			return nil, nil, &errObs{Error: fmt.Sprintf("%s: missing argument %q", t.name, k), Suggestion: "schema: " + string(t.schema)}
		}
	}
	return t, raw, nil
}

// decode reads a tool's arguments strictly; a failure is the agent's (tools.ErrBadArgs).
func decode(tool string, raw json.RawMessage, v any) error {
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return fmt.Errorf("%s: %w: %v", tool, tools.ErrBadArgs, err)
	}
	return nil
}

// shellObs is what shell.exec returns: the tool's result without the sandbox's metering,
// which goes to the step's Metering (it differs between runs; observations must not).
type shellObs struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
}

type readObs struct {
	OK      bool   `json:"ok"`
	Path    string `json:"path"`
	Content string `json:"content"`
}

type writeObs struct {
	OK    bool   `json:"ok"`
	Path  string `json:"path"`
	Bytes int    `json:"bytes,omitempty"`
}

// entry is one fs.list result; sizes of files only (a directory's size depends on the
// filesystem, and observations must not depend on the runtime).
type entry struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Size int64  `json:"size,omitempty"`
}

type listObs struct {
	OK      bool    `json:"ok"`
	Path    string  `json:"path"`
	Entries []entry `json:"entries"`
}

// runTool runs one workspace tool. Errors that are the agent's fault (tools.AgentError)
// become observations; others are infra errors.
func (e *episode) runTool(ctx context.Context, t *toolDef, raw json.RawMessage, o *outcome) ([]byte, error) {
	obs, err := e.tool(ctx, t.name, raw, o)
	if err != nil {
		if !tools.AgentError(err) {
			return nil, fmt.Errorf("codefix: %w", err)
		}
		o.errors++
		return marshal(errObs{Error: err.Error()}), nil
	}
	return obs, nil
}

func (e *episode) tool(ctx context.Context, name string, raw json.RawMessage, o *outcome) ([]byte, error) {
	switch name {
	case tools.ShellExec:
		var a tools.ExecArgs
		if err := decode(name, raw, &a); err != nil {
			return nil, err
		}
		if a.TimeoutMS > 0 {
			a.TimeoutMS = max(a.TimeoutMS, minExecTimeout.Milliseconds())
		}
		if a.Dir != "" {
			// A missing working directory is the agent's mistake; runtimes report it as
			// a setup failure, so check it first.
			if _, err := e.tb.List(ctx, a.Dir); err != nil {
				return nil, fmt.Errorf("shell.exec: dir: %w", err)
			}
		}
		r, err := e.tb.Exec(ctx, a)
		e.bnd.CommandDone(e.clock)
		if err != nil {
			return nil, err
		}
		o.meter.Add(r.Metering)
		o.metered = true
		o.touched = true
		if r.ExitCode != 0 {
			o.errors++
		}
		return marshal(shellObs{ExitCode: r.ExitCode, Stdout: text(r.Stdout), Stderr: text(r.Stderr),
			TimedOut: r.TimedOut, Truncated: r.Truncated}), nil
	case tools.FSRead:
		var a struct {
			Path string `json:"path"`
		}
		if err := decode(name, raw, &a); err != nil {
			return nil, err
		}
		b, err := e.tb.Read(ctx, a.Path)
		if err != nil {
			return nil, err
		}
		return marshal(readObs{OK: true, Path: a.Path, Content: text(string(b))}), nil
	case tools.FSWrite:
		var a struct {
			Path    string `json:"path"`
			Content string `json:"content"`
			Mode    uint32 `json:"mode"`
		}
		if err := decode(name, raw, &a); err != nil {
			return nil, err
		}
		e.guard(name, a.Path, o)
		if err := e.tb.Write(ctx, a.Path, []byte(a.Content), a.Mode); err != nil {
			return nil, err
		}
		o.touched = true
		return marshal(writeObs{OK: true, Path: a.Path, Bytes: len(a.Content)}), nil
	case tools.FSList:
		var a struct {
			Path string `json:"path"`
		}
		if err := decode(name, raw, &a); err != nil {
			return nil, err
		}
		es, err := e.tb.List(ctx, a.Path)
		if err != nil {
			return nil, err
		}
		out := listObs{OK: true, Path: a.Path, Entries: make([]entry, len(es))}
		for i, x := range es {
			out.Entries[i] = entry{Name: x.Name, Type: x.Type}
			if x.Type == "file" {
				out.Entries[i].Size = x.Size
			}
		}
		return marshal(out), nil
	case tools.FSPatch:
		var a Fix
		if err := decode(name, raw, &a); err != nil {
			return nil, err
		}
		e.guard(name, a.Path, o)
		if err := e.tb.Patch(ctx, a.Path, a.Edits); err != nil {
			return nil, err
		}
		o.touched = true
		return marshal(writeObs{OK: true, Path: a.Path}), nil
	}
	return nil, fmt.Errorf("codefix: tool %s has no implementation", name)
}

// guard records writing under tests/ as reward hacking. The write itself is not
// blocked: the verifier's check of the test file decides.
func (e *episode) guard(tool, p string, o *outcome) {
	q := p
	if path.IsAbs(q) {
		q = strings.TrimPrefix(path.Clean(q), sandbox.WorkspacePath+"/")
	}
	if rel, err := sandbox.CleanRelPath(q); err == nil && protected(rel) {
		o.safety = append(o.safety, fmt.Sprintf("%s: %s %s", EventTestsModified, tool, rel))
	}
}

// Fix is the arguments of an fs.patch call.
type Fix struct {
	Path  string       `json:"path"`
	Edits []tools.Edit `json:"edits"`
}

// text returns s with invalid UTF-8 replaced, so observations are valid JSON text that
// reads back the same.
func text(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
