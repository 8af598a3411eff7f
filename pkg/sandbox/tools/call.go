package tools

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// Tool names, as envs list them in their action space.
const (
	ShellExec = "shell.exec"
	FSRead    = "fs.read"
	FSWrite   = "fs.write"
	FSList    = "fs.list"
	FSPatch   = "fs.patch"
)

// Service is the service the tools belong to in an env's action space: the target of the
// faults a plan aims at them.
const Service = "sandbox"

// Spec describes one tool as an env lists it in its Spec. The package stays a sandbox
// library that knows nothing of envs: an env copies these fields into its own tool rows.
type Spec struct {
	// Name is what an action names, e.g. "fs.read".
	Name        string
	Description string
	// Schema is the JSON Schema of the tool's arguments.
	Schema json.RawMessage
}

// Specs describes the tools, all of service Service, for an env's Spec.
func Specs() []Spec {
	t := func(name, desc, schema string) Spec {
		return Spec{Name: name, Description: desc, Schema: json.RawMessage(schema)}
	}
	return []Spec{
		t(ShellExec, "Run a shell command (sh -c) in the workspace; returns exit code, stdout, stderr.",
			`{"type":"object","required":["command"],"additionalProperties":false,"properties":{"command":{"type":"string"},"dir":{"type":"string"},"timeout_ms":{"type":"integer","minimum":1},"stdin":{"type":"string"}}}`),
		t(FSRead, "Read a file of the workspace.",
			`{"type":"object","required":["path"],"additionalProperties":false,"properties":{"path":{"type":"string"}}}`),
		t(FSWrite, "Create or replace a file of the workspace (parent directories are created).",
			`{"type":"object","required":["path","content"],"additionalProperties":false,"properties":{"path":{"type":"string"},"content":{"type":"string"},"mode":{"type":"integer"}}}`),
		t(FSList, "List a directory of the workspace.",
			`{"type":"object","required":["path"],"additionalProperties":false,"properties":{"path":{"type":"string"}}}`),
		t(FSPatch, "Apply search/replace edits to a file: each old text must occur exactly once.",
			`{"type":"object","required":["path","edits"],"additionalProperties":false,"properties":{"path":{"type":"string"},"edits":{"type":"array","minItems":1,"items":{"type":"object","required":["old","new"],"additionalProperties":false,"properties":{"old":{"type":"string"},"new":{"type":"string"}}}}}}`),
	}
}

// AgentError reports whether err is the agent's fault (a bad path, a refused file, a
// patch that does not apply, an injected storage fault, a workspace that is full): the env
// shows it to the agent as an observation. Other errors are infra errors.
func AgentError(err error) bool {
	if InjectedFault(err) || diskFull(err) {
		return true
	}
	for _, e := range []error{ErrOutside, ErrSymlink, ErrSpecialFile, ErrNotExist, ErrIsDir, ErrNotDir, ErrTooLarge, ErrPatch, ErrBadArgs} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// Call runs the named tool with JSON arguments and returns its JSON result:
// shell.exec → ExecResult; fs.read → {"content"}; fs.write, fs.patch → {"ok":true};
// fs.list → {"entries":[Entry…]}. Unknown tools and malformed arguments are ErrBadArgs.
func (t *Toolbox) Call(ctx context.Context, tool string, args json.RawMessage) (json.RawMessage, error) {
	dec := func(v any) error {
		d := json.NewDecoder(bytes.NewReader(args))
		d.DisallowUnknownFields()
		if err := d.Decode(v); err != nil {
			return fmt.Errorf("%s: %w: %v", tool, ErrBadArgs, err)
		}
		return nil
	}
	var out any
	switch tool {
	case ShellExec:
		var a ExecArgs
		if err := dec(&a); err != nil {
			return nil, err
		}
		res, err := t.Exec(ctx, a)
		if err != nil {
			return nil, err
		}
		out = res
	case FSRead:
		var a struct {
			Path string `json:"path"`
		}
		if err := dec(&a); err != nil {
			return nil, err
		}
		b, err := t.Read(ctx, a.Path)
		if err != nil {
			return nil, err
		}
		out = map[string]string{"content": string(b)}
	case FSWrite:
		var a struct {
			Path    string `json:"path"`
			Content string `json:"content"`
			Mode    uint32 `json:"mode"`
		}
		if err := dec(&a); err != nil {
			return nil, err
		}
		if err := t.Write(ctx, a.Path, []byte(a.Content), a.Mode); err != nil {
			return nil, err
		}
		out = map[string]bool{"ok": true}
	case FSList:
		var a struct {
			Path string `json:"path"`
		}
		if err := dec(&a); err != nil {
			return nil, err
		}
		es, err := t.List(ctx, a.Path)
		if err != nil {
			return nil, err
		}
		out = map[string][]Entry{"entries": es}
	case FSPatch:
		var a struct {
			Path  string `json:"path"`
			Edits []Edit `json:"edits"`
		}
		if err := dec(&a); err != nil {
			return nil, err
		}
		if err := t.Patch(ctx, a.Path, a.Edits); err != nil {
			return nil, err
		}
		out = map[string]bool{"ok": true}
	default:
		return nil, fmt.Errorf("%w: unknown tool %q", ErrBadArgs, tool)
	}
	return json.Marshal(out)
}
