package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox"
)

// SocketName is the agent's socket file in the bind-mounted directory.
const SocketName = "agent.sock"

// SocketDir is where the runtime mounts the socket directory inside the sandbox.
const SocketDir = "/run/gauntlet"

// Ops a Request may name.
const (
	OpPing = "ping"
	OpExec = "exec"
	// OpStream is OpExec whose command reads its stdin from and writes its stdout to
	// the two descriptors sent with the request (SCM_RIGHTS: CallStream), instead of
	// Stdin and the captured Stdout: a stdio server speaks through them directly, with
	// no copy in the agent, for as long as it runs.
	OpStream = "stream"
	// OpCgroup moves the agent's spawner thread (SpawnerThreadName), which starts every
	// command, into the cgroup whose tasks files come with the request (SCM_RIGHTS:
	// JoinCgroup), opened for writing by the runtime. The thread writes "0" (itself) to
	// each: a thread moving itself takes no lock across the host's cgroups, where the
	// runtime writing its tid waits for an RCU grace period (5-17 ms measured).
	OpCgroup = "cgroup"
)

// Request is one command for the agent.
type Request struct {
	// Op is OpPing or OpExec.
	Op string `json:"op"`
	// Argv is the program and its arguments; Argv[0] without a slash is looked up in
	// PATH from Env.
	Argv []string `json:"argv,omitempty"`
	// Env is the command's whole environment.
	Env []string `json:"env,omitempty"`
	// Dir is the absolute working directory.
	Dir string `json:"dir,omitempty"`
	// Stdin is written to the command's standard input, which is then closed (OpExec).
	Stdin []byte `json:"stdin,omitempty"`
	// TimeoutNS bounds the command's wall time in nanoseconds; 0 means no bound.
	TimeoutNS int64 `json:"timeout_ns,omitempty"`
	// OutputLimit caps the bytes kept of stdout and of stderr, each; 0 means no cap.
	OutputLimit int64 `json:"output_limit,omitempty"`
}

// Response is what a command produced and what the agent measured.
type Response struct {
	// Error is set when the agent could not run the request at all.
	Error     string `json:"error,omitempty"`
	ExitCode  int    `json:"exit_code"`
	Stdout    []byte `json:"stdout,omitempty"`
	Stderr    []byte `json:"stderr,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	TimedOut  bool   `json:"timed_out,omitempty"`
	// WallNS is the command's wall time, start to exit.
	WallNS int64 `json:"wall_ns"`
	// CPUNS is the user+system CPU time of the processes reaped during the command.
	CPUNS int64 `json:"cpu_ns"`
	// Processes counts processes and threads created during the command.
	Processes int64 `json:"processes"`
	// BytesRead and BytesWritten count read/write system call bytes of the reaped
	// processes (rchar and wchar).
	BytesRead    int64 `json:"bytes_read"`
	BytesWritten int64 `json:"bytes_written"`
	// Events are the hostile system calls and egress attempts the agent's seccomp
	// supervisor refused during the command (package safety).
	Events []sandbox.Event `json:"events,omitempty"`
	// Egress are the attempts at addresses outside the sandbox the supervisor refused,
	// one by one (sandbox.ExecResult.Egress), and EgressDropped those past
	// sandbox.MaxEgress.
	Egress        []sandbox.EgressAttempt `json:"egress,omitempty"`
	EgressDropped int64                   `json:"egress_dropped,omitempty"`
	// Supervised is set (on every response) when the agent holds the seccomp
	// notification listener every command runs under; the runtime refuses an agent
	// without it.
	Supervised bool `json:"supervised,omitempty"`
}

// Call sends req to the agent listening at socketPath and waits for its response or
// for ctx to end. Closing the connection (ctx cancelled) does not stop the command:
// the caller does that separately if it wants to.
func Call(ctx context.Context, socketPath string, req Request) (Response, error) {
	return call(ctx, socketPath, req)
}

// CallStream sends an OpStream request with stdin and stdout, which the command gets as
// its own standard input and output (the caller keeps its descriptors and closes them
// when it likes: the command sees end of input once every writer of stdin has closed
// it), and waits for the command's end, as Call does.
func CallStream(ctx context.Context, socketPath string, req Request, stdin, stdout *os.File) (Response, error) {
	if stdin == nil || stdout == nil {
		return Response{}, errors.New("call stream: stdin and stdout are required")
	}
	req.Op = OpStream
	return call(ctx, socketPath, req, stdin, stdout)
}

// JoinCgroup has the agent at socketPath move its spawner thread into the cgroup (one
// per v1 hierarchy) whose tasks files are given, open for writing (OpCgroup).
func JoinCgroup(ctx context.Context, socketPath string, tasks ...*os.File) error {
	if len(tasks) == 0 || len(tasks) > maxFiles {
		return fmt.Errorf("join cgroup: %d tasks files; want 1 to %d", len(tasks), maxFiles)
	}
	_, err := call(ctx, socketPath, Request{Op: OpCgroup}, tasks...)
	if err != nil {
		return fmt.Errorf("join cgroup: %w", err)
	}
	return nil
}

func call(ctx context.Context, socketPath string, req Request, files ...*os.File) (Response, error) {
	conn, err := dialUnix(ctx, socketPath)
	if err != nil {
		return Response{}, fmt.Errorf("dial agent: %w", err)
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	msg, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("encode request: %w", err)
	}
	msg = append(msg, '\n')
	if len(files) == 0 {
		_, err = conn.Write(msg)
	} else {
		err = sendWithFiles(conn, msg, files...)
	}
	if err != nil {
		return Response{}, callErr(ctx, "send request", err)
	}
	var resp Response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		return Response{}, callErr(ctx, "read response", err)
	}
	if resp.Error != "" {
		return resp, fmt.Errorf("agent: %s", resp.Error)
	}
	return resp, nil
}

// sendWithFiles writes msg with the descriptors of files attached to its first byte
// (the agent receives them with its first read of the connection). The descriptors are
// read through SyscallConn, which leaves the files as they were (Fd would make them
// blocking).
func sendWithFiles(conn net.Conn, msg []byte, files ...*os.File) error {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return fmt.Errorf("send descriptors over %T: not a unix socket", conn)
	}
	fds := make([]int, 0, len(files))
	var raws []syscall.RawConn
	for _, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return fmt.Errorf("descriptor of %s: %w", f.Name(), err)
		}
		raws = append(raws, rc)
	}
	// Each file's descriptor stays valid while its Control callback runs: the message is
	// sent from inside the innermost one.
	var send func(i int) error
	send = func(i int) error {
		if i == len(raws) {
			n, oobn, err := uc.WriteMsgUnix(msg, unix.UnixRights(fds...), nil)
			if err != nil {
				return err
			}
			if oobn == 0 {
				return errors.New("the descriptors were not sent")
			}
			if n < len(msg) {
				_, err = conn.Write(msg[n:])
			}
			return err
		}
		var err error
		if cerr := raws[i].Control(func(fd uintptr) {
			fds = append(fds, int(fd))
			err = send(i + 1)
		}); cerr != nil {
			return cerr
		}
		return err
	}
	return send(0)
}

func callErr(ctx context.Context, op string, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
	return fmt.Errorf("%s: %w", op, err)
}

// maxSocketPath is the longest path a unix socket address holds (sun_path less its NUL).
const maxSocketPath = 107

// dialUnix connects to the unix socket at path. A path past the address's limit (a
// runtime whose state directory is deep) is reached through a descriptor of its
// directory, /proc/self/fd/N/name, which the kernel resolves as it would the path.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSocketPath {
		return d.DialContext(ctx, "unix", path)
	}
	fd, err := unix.Open(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open the directory of %s: %w", path, err)
	}
	defer unix.Close(fd)
	conn, err := d.DialContext(ctx, "unix", fmt.Sprintf("/proc/self/fd/%d/%s", fd, filepath.Base(path)))
	if err != nil {
		return nil, fmt.Errorf("dial unix %s: %w", path, err)
	}
	return conn, nil
}
