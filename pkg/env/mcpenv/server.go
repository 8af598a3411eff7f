package mcpenv

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/gauntlet-rl/gauntlet/pkg/env"
	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// Template is the sandbox template a command server's episodes ask for.
const Template = "mcp"

// serverLife bounds a command server's wall time in its sandbox: an episode's life, with
// room; the env API's and workers' own timeouts end episodes well before.
const serverLife = 6 * time.Hour

// opTimeout bounds one sandbox operation the env makes on its own (acquire, release, the
// server's start and stop).
const opTimeout = 60 * time.Second

// ErrServer is wrapped by the errors of a server that could not be reached, listed its
// tools wrongly, or broke the connection: infra errors, which end the episode.
var ErrServer = errors.New("MCP server")

// server is one episode's MCP session, with the sandboxed process behind it for a command.
type server struct {
	sess *mcp.ClientSession

	sbs    env.Sandboxes
	sb     string
	ended  chan execEnd // the server's exec, once it returns
	cancel context.CancelFunc
	result *execEnd // set once stop has waited for it
}

type execEnd struct {
	res sandbox.ExecResult
	err error
}

// client is the MCP client every episode connects with.
func client() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "gauntlet", Version: "1"}, nil)
}

// startCommand acquires the episode's sandbox, starts the server in it with its stdin
// and stdout as the MCP connection, and initializes the session.
func startCommand(d *Decl, sbs env.Sandboxes, seed uint64) (*server, error) {
	st, ok := sbs.Runtime().(sandbox.Streamer)
	if !ok {
		return nil, fmt.Errorf("mcp %s: runtime %s cannot run a stdio server: %w", d.Name, sbs.Runtime().Name(), sandbox.ErrUnsupported)
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	files, err := workspaceFiles(d.Server.Workspace)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: server.workspace: %w", d.Name, err)
	}
	h, err := sbs.Acquire(ctx, sandbox.Spec{Template: Template, Workspace: files, Labels: map[string]string{"env": d.Name}})
	if err != nil {
		return nil, fmt.Errorf("mcp %s: acquire sandbox: %w", d.Name, err)
	}
	s := &server{sbs: sbs, sb: h.ID, ended: make(chan execEnd, 1)}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("mcp %s: %w", d.Name, err), s.release(ctx))
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, errors.Join(fmt.Errorf("mcp %s: %w", d.Name, err), s.release(ctx))
	}
	life, stop := context.WithCancel(context.Background())
	s.cancel = stop
	req := sandbox.ExecRequest{
		Argv: d.Server.Command, Env: append([]string{"GAUNTLET_SEED=" + strconv.FormatUint(seed, 10)}, d.Server.Env...),
		Timeout: serverLife, OutputLimit: 64 << 10,
	}
	go func() {
		res, err := st.ExecStream(life, h.ID, req, inR, outW)
		// The command is gone: the client's reads end, its writes fail.
		inR.Close()
		outW.Close()
		s.ended <- execEnd{res, err}
	}()
	sess, err := client().Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, errors.Join(fmt.Errorf("mcp %s: %w: initialize: %w%s", d.Name, ErrServer, err, s.stderr(ctx)), s.release(ctx))
	}
	s.sess = sess
	return s, nil
}

// stderr waits briefly for the server's exec to end and returns what it said, for an
// error that explains a server that did not start.
func (s *server) stderr(ctx context.Context) string {
	s.cancel()
	if r := s.wait(ctx); r.err != nil {
		return fmt.Sprintf(" (the server: %v)", r.err)
	} else if len(r.res.Stderr) > 0 {
		return fmt.Sprintf(" (the server exited %d: %.500s)", r.res.ExitCode, r.res.Stderr)
	}
	return ""
}

// seedHeader carries the episode's seed to a URL server, as GAUNTLET_SEED does to a
// command.
const seedHeader = "Gauntlet-Seed"

type seedTransport struct {
	seed string
	base http.RoundTripper
}

func (t seedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(seedHeader, t.seed)
	return t.base.RoundTrip(r)
}

// dialURL opens a session with a streamable HTTP server.
func dialURL(d *Decl, seed uint64) (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(d.Server.TimeoutMs)*time.Millisecond)
	defer cancel()
	hc := &http.Client{Transport: seedTransport{strconv.FormatUint(seed, 10), http.DefaultTransport}}
	sess, err := client().Connect(ctx, &mcp.StreamableClientTransport{Endpoint: d.Server.URL, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
	if err != nil {
		return nil, fmt.Errorf("mcp %s: %w: %s: initialize: %w", d.Name, ErrServer, d.Server.URL, err)
	}
	return &server{sess: sess}, nil
}

// wait waits for the command server's exec to end (at most until ctx does).
func (s *server) wait(ctx context.Context) execEnd {
	if s.result != nil {
		return *s.result
	}
	if s.ended == nil {
		return execEnd{}
	}
	select {
	case r := <-s.ended:
		s.result = &r
		return r
	case <-ctx.Done():
		s.cancel()
		r := <-s.ended
		s.result = &r
		return r
	}
}

// stop closes the session; a command server, its stdin closed, exits, and what its exec
// measured is returned. The sandbox stays, for the verifier.
func (s *server) stop() execEnd {
	if s.sess != nil {
		_ = s.sess.Close()
		s.sess = nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.wait(ctx)
}

// release stops the server and gives the sandbox back.
func (s *server) release(ctx context.Context) error {
	s.stop()
	if s.sb == "" {
		return nil
	}
	id := s.sb
	s.sb = ""
	if err := s.sbs.Release(ctx, id); err != nil {
		return fmt.Errorf("release sandbox %s: %w", id, err)
	}
	return nil
}

// workspaceFiles reads the regular files below dir as workspace files ("" : none). A
// link or special file is refused: it could lead anywhere on the host.
func workspaceFiles(dir string) ([]sandbox.File, error) {
	if dir == "" {
		return nil, nil
	}
	var (
		out   []sandbox.File
		total int64
	)
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if !e.Type().IsRegular() {
			return fmt.Errorf("%s: not a regular file", filepath.ToSlash(rel))
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		if total += fi.Size(); total > maxWorkspace {
			return fmt.Errorf("over %d bytes", maxWorkspace)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out = append(out, sandbox.File{Path: path.Clean(filepath.ToSlash(rel)), Data: data, Mode: fi.Mode().Perm()})
		return nil
	})
	return out, err
}
