package mcpenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
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
	ended  chan execEnd  // the server's exec, once it returns
	exited chan struct{} // closed when the server's exec returns
	cancel context.CancelFunc
	result *execEnd // set once stop has waited for it
	stdin  *os.File // an HTTP command server's stdin, closed to stop it
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
	s := &server{sbs: sbs, sb: h.ID, ended: make(chan execEnd, 1), exited: make(chan struct{})}
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
	var stdout io.Writer = outW
	if d.Server.HTTP != nil {
		// An HTTP server ignores its stdin: a shell beside it stops it when stdin closes,
		// so the command ends as a stdio server does, measured; and ends when the server
		// does (the sandbox's init gone, nothing of the command survives).
		req.Argv = append([]string{"sh", "-c", `exec 3<&0; "$@" & p=$!; (cat <&3 >/dev/null; kill $p 2>/dev/null) & wait $p`, "sh"}, d.Server.Command...)
		stdout = io.Discard
		outR.Close()
		outW.Close()
	}
	go func() {
		res, err := st.ExecStream(life, h.ID, req, inR, stdout)
		// The command is gone: the client's reads end, its writes fail.
		inR.Close()
		if d.Server.HTTP == nil {
			outW.Close()
		}
		close(s.exited)
		s.ended <- execEnd{res, err}
	}()
	var (
		sess *mcp.ClientSession
		err2 error
	)
	if d.Server.HTTP == nil {
		sess, err2 = client().Connect(ctx, &mcp.IOTransport{Reader: outR, Writer: inW}, nil)
	} else {
		s.stdin = inW
		sess, err2 = dialInSandbox(ctx, d, sbs.Runtime(), h.ID, s.exited)
	}
	if err := err2; err != nil {
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

// dialInSandbox waits for an HTTP command server to listen on its port in the sandbox's
// network (until ctx ends, or the server exits) and opens a session over connections
// dialled into it.
func dialInSandbox(ctx context.Context, d *Decl, rt sandbox.Runtime, id string, exited <-chan struct{}) (*mcp.ClientSession, error) {
	dl, ok := rt.(sandbox.Dialer)
	if !ok {
		return nil, fmt.Errorf("runtime %s cannot reach a port in a sandbox: %w", rt.Name(), sandbox.ErrUnsupported)
	}
	port := d.Server.HTTP.Port
	for {
		c, err := dl.DialSandbox(ctx, id, port)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("the server never listened on port %d: %w", port, err)
		case <-exited:
			return nil, fmt.Errorf("the server exited before it listened on port %d", port)
		case <-time.After(20 * time.Millisecond):
		}
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext:         func(ctx context.Context, _, _ string) (net.Conn, error) { return dl.DialSandbox(ctx, id, port) },
		MaxIdleConnsPerHost: 2,
	}}
	endpoint := "http://127.0.0.1:" + strconv.Itoa(port) + d.Server.HTTP.Path
	return client().Connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: hc, MaxRetries: -1, DisableStandaloneSSE: true}, nil)
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
	if s.stdin != nil {
		_ = s.stdin.Close()
		s.stdin = nil
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
