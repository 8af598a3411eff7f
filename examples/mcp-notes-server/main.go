// Command mcp-notes-server is a small, real MCP server written with the official MCP Go
// SDK: a notebook of named notes behind four tools (notes.put, notes.get, notes.list,
// notes.delete). It is the kind of server a team brings to gauntlet's MCP harness
// (`env: mcp`, docs/mcp.md; its declaration is notes.yaml beside this file), where its
// tools become an env's action space and every call passes the fault injector; on its
// own it serves any MCP client.
//
//	go run ./examples/mcp-notes-server                  # over stdio, as a host launches it
//	go run ./examples/mcp-notes-server --http :8931     # streamable HTTP at /mcp
//
// Its answers depend only on the calls it received, so the same calls replay the same
// session: what a recorded, replayable episode needs of a server.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	addr := flag.String("http", "", "serve streamable HTTP at this address (path /mcp) instead of stdio")
	flag.Parse()
	if err := run(context.Background(), *addr); err != nil {
		fmt.Fprintln(os.Stderr, "mcp-notes-server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr string) error {
	if addr == "" {
		// One client, one notebook.
		return newServer(&notebook{}).Run(ctx, &mcp.StdioTransport{})
	}
	// Over HTTP each session gets its own notebook, as each episode needs its own world.
	handler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return newServer(&notebook{}) }, nil)
	mux := http.NewServeMux()
	mux.Handle("/mcp", handler)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	log.Printf("mcp-notes-server: serving MCP at http://%s/mcp", addr)
	return srv.ListenAndServe()
}

// Limits of a notebook: a full notebook or an oversized note is refused, as a tool error
// the agent can act on.
const (
	maxNotes     = 16
	maxNoteBytes = 2048
)

// notebook is one session's notes.
type notebook struct {
	mu    sync.Mutex
	notes map[string]string
}

type putArgs struct {
	Name string `json:"name" jsonschema:"the note's name, 1 to 64 characters"`
	Text string `json:"text" jsonschema:"the note's text, at most 2048 bytes"`
}

type nameArgs struct {
	Name string `json:"name" jsonschema:"the note's name"`
}

type noArgs struct{}

type note struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

type putResult struct {
	Name    string `json:"name"`
	Created bool   `json:"created"`
	Count   int    `json:"count"`
}

type listResult struct {
	Names []string `json:"names"`
}

type deleteResult struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// newServer is the notebook's MCP server. Tool errors (a missing note, a full notebook)
// come back as results with isError, the message naming what to do, so an agent can
// recover; they are not protocol errors.
func newServer(nb *notebook) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcp-notes-server", Version: "1"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "notes.put", Description: "Create or replace a note."},
		func(_ context.Context, _ *mcp.CallToolRequest, a putArgs) (*mcp.CallToolResult, putResult, error) {
			r, err := nb.put(a.Name, a.Text)
			return nil, r, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "notes.get", Description: "Read one note."},
		func(_ context.Context, _ *mcp.CallToolRequest, a nameArgs) (*mcp.CallToolResult, note, error) {
			r, err := nb.get(a.Name)
			return nil, r, err
		})
	mcp.AddTool(s, &mcp.Tool{Name: "notes.list", Description: "List the notes' names, sorted."},
		func(_ context.Context, _ *mcp.CallToolRequest, _ noArgs) (*mcp.CallToolResult, listResult, error) {
			return nil, nb.list(), nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "notes.delete", Description: "Delete one note."},
		func(_ context.Context, _ *mcp.CallToolRequest, a nameArgs) (*mcp.CallToolResult, deleteResult, error) {
			r, err := nb.delete(a.Name)
			return nil, r, err
		})
	return s
}

func (nb *notebook) put(name, text string) (putResult, error) {
	if name == "" || len(name) > 64 {
		return putResult{}, fmt.Errorf("name: %d characters; give 1 to 64", len(name))
	}
	if len(text) > maxNoteBytes {
		return putResult{}, fmt.Errorf("text: %d bytes is over the limit of %d; shorten it", len(text), maxNoteBytes)
	}
	nb.mu.Lock()
	defer nb.mu.Unlock()
	if nb.notes == nil {
		nb.notes = map[string]string{}
	}
	_, exists := nb.notes[name]
	if !exists && len(nb.notes) >= maxNotes {
		return putResult{}, fmt.Errorf("the notebook holds %d notes, its limit; delete one first (notes.list names them)", maxNotes)
	}
	nb.notes[name] = text
	return putResult{Name: name, Created: !exists, Count: len(nb.notes)}, nil
}

func (nb *notebook) get(name string) (note, error) {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	text, ok := nb.notes[name]
	if !ok {
		return note{}, errNoNote(name)
	}
	return note{Name: name, Text: text}, nil
}

func (nb *notebook) list() listResult {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	names := make([]string, 0, len(nb.notes))
	for n := range nb.notes {
		names = append(names, n)
	}
	slices.Sort(names)
	return listResult{Names: names}
}

func (nb *notebook) delete(name string) (deleteResult, error) {
	nb.mu.Lock()
	defer nb.mu.Unlock()
	if _, ok := nb.notes[name]; !ok {
		return deleteResult{}, errNoNote(name)
	}
	delete(nb.notes, name)
	return deleteResult{Name: name, Count: len(nb.notes)}, nil
}

func errNoNote(name string) error {
	return fmt.Errorf("no note named %q; notes.list names the notes", name)
}
