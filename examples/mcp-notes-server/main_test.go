package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// connect runs the server on one end of the SDK's in-memory transports and returns a
// client session on the other.
func connect(t *testing.T) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := newServer(&notebook{}).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string { return res.Content[0].(*mcp.TextContent).Text }

func TestNotesServer(t *testing.T) {
	cs := connect(t)
	ctx := context.Background()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range tools.Tools {
		schema, _ := json.Marshal(tool.InputSchema)
		if !strings.Contains(string(schema), `"type":"object"`) {
			t.Errorf("%s: input schema %s is not an object schema", tool.Name, schema)
		}
		names = append(names, tool.Name)
	}
	if strings.Join(names, " ") != "notes.delete notes.get notes.list notes.put" {
		t.Fatalf("tools: %v", names)
	}

	if res := call(t, cs, "notes.put", map[string]any{"name": "plan", "text": "ship it"}); res.IsError || !strings.Contains(text(res), `"created":true`) {
		t.Errorf("put: %v %s", res.IsError, text(res))
	}
	if res := call(t, cs, "notes.get", map[string]any{"name": "plan"}); res.IsError || !strings.Contains(text(res), `"text":"ship it"`) {
		t.Errorf("get: %v %s", res.IsError, text(res))
	}
	// A missing note is a tool error that says what to do, not a protocol error.
	if res := call(t, cs, "notes.delete", map[string]any{"name": "nope"}); !res.IsError || !strings.Contains(text(res), "notes.list") {
		t.Errorf("delete a missing note: %v %s", res.IsError, text(res))
	}
	// Arguments that break the schema are refused by the SDK before the handler runs.
	if res := call(t, cs, "notes.put", map[string]any{"name": "x"}); !res.IsError {
		t.Errorf("put without text: %s, want isError", text(res))
	}
	for i := range maxNotes - 1 {
		call(t, cs, "notes.put", map[string]any{"name": string(rune('a' + i)), "text": "."})
	}
	if res := call(t, cs, "notes.put", map[string]any{"name": "one-too-many", "text": "."}); !res.IsError || !strings.Contains(text(res), "its limit") {
		t.Errorf("put into a full notebook: %v %s", res.IsError, text(res))
	}
	if res := call(t, cs, "notes.list", nil); res.IsError || !strings.Contains(text(res), `"plan"`) {
		t.Errorf("list: %s", text(res))
	}
}

// TestNotesServerReplays: the same calls give the same answers, session after session.
func TestNotesServerReplays(t *testing.T) {
	script := []struct {
		tool string
		args map[string]any
	}{
		{"notes.put", map[string]any{"name": "b", "text": "2"}},
		{"notes.put", map[string]any{"name": "a", "text": "1"}},
		{"notes.get", map[string]any{"name": "c"}},
		{"notes.list", nil},
		{"notes.delete", map[string]any{"name": "b"}},
		{"notes.list", nil},
	}
	var runs [2][]string
	for i := range runs {
		cs := connect(t)
		for _, c := range script {
			runs[i] = append(runs[i], text(call(t, cs, c.tool, c.args)))
		}
	}
	if strings.Join(runs[0], "\n") != strings.Join(runs[1], "\n") {
		t.Errorf("two sessions of the same calls differ:\n%v\n%v", runs[0], runs[1])
	}
}
