package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// dataDir is the soak's size-capped data directory.
type dataDir struct {
	Path string `json:"path"`
	// Kind says how the cap is enforced: "loop-ext4" (a sparse image loop-mounted, so the
	// filesystem is exactly that size) or "dir" (a plain directory on the host's disk,
	// uncapped: the fallback when loop devices or root are missing).
	Kind  string `json:"kind"`
	Bytes int64  `json:"bytes"`
	image string
}

// prepareDataDir makes a data dir capped at size bytes under work: a loop-mounted ext4
// image when kind is "loop" or "auto" and this machine allows it, else (for "auto" or
// "dir") a plain directory, said so in the log and the results.
func prepareDataDir(ctx context.Context, work, kind string, size int64, log *slog.Logger) (*dataDir, error) {
	mnt := filepath.Join(work, "data")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		return nil, fmt.Errorf("make data dir: %w", err)
	}
	if kind == "loop" || kind == "auto" {
		d, err := loopMount(ctx, work, mnt, size)
		if err == nil {
			return d, nil
		}
		if kind == "loop" {
			return nil, err
		}
		log.Warn("soak: no loop-mounted data dir; using a plain directory, not capped", "err", err)
	}
	return &dataDir{Path: mnt, Kind: "dir", Bytes: size}, nil
}

func loopMount(ctx context.Context, work, mnt string, size int64) (*dataDir, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("loop mount: needs root")
	}
	img := filepath.Join(work, "data.ext4")
	f, err := os.Create(img)
	if err != nil {
		return nil, fmt.Errorf("loop mount: %w", err)
	}
	err = f.Truncate(size) // sparse: costs the host only what is written
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("loop mount: size image: %w", err)
	}
	for _, args := range [][]string{{"mkfs.ext4", "-q", "-F", "-m", "0", img}, {"mount", "-o", "loop", img, mnt}} {
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			os.Remove(img)
			return nil, fmt.Errorf("loop mount: %s: %w: %s", args[0], err, bytes.TrimSpace(out))
		}
	}
	return &dataDir{Path: mnt, Kind: "loop-ext4", Bytes: size, image: img}, nil
}

// release unmounts and removes the image (a plain directory is removed).
func (d *dataDir) release() error {
	if d.image != "" {
		if out, err := exec.Command("umount", d.Path).CombinedOutput(); err != nil {
			return fmt.Errorf("umount %s: %w: %s", d.Path, err, bytes.TrimSpace(out))
		}
		if err := os.Remove(d.image); err != nil {
			return fmt.Errorf("remove data image: %w", err)
		}
	}
	return os.RemoveAll(d.Path)
}

// used returns the bytes used on the data dir's filesystem.
func (d *dataDir) used() uint64 {
	var st syscall.Statfs_t
	if syscall.Statfs(d.Path, &st) != nil {
		return 0
	}
	return (st.Blocks - st.Bfree) * uint64(st.Bsize)
}

// ports are the loopback ports of one soak's stack, the same for every restart.
type ports struct {
	NATS, ClickHouse, HTTP, EnvAPI, Temporal int
}

func freePorts() (ports, error) {
	var p ports
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for _, dst := range []*int{&p.NATS, &p.ClickHouse, &p.HTTP, &p.EnvAPI, &p.Temporal} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return p, fmt.Errorf("free port: %w", err)
		}
		ls = append(ls, l)
		*dst = l.Addr().(*net.TCPAddr).Port
	}
	return p, nil
}

// stack runs `gauntlet up` on the data dir, and kills and restarts it.
type stack struct {
	bin   string
	dir   string
	ports ports
	extra []string
	log   *slog.Logger

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

func (s *stack) args() []string {
	a := []string{"up", "--data-dir", s.dir,
		"--nats.port", strconv.Itoa(s.ports.NATS),
		"--clickhouse.port", strconv.Itoa(s.ports.ClickHouse),
		"--http", fmt.Sprintf("127.0.0.1:%d", s.ports.HTTP),
		"--envapi.addr", fmt.Sprintf("127.0.0.1:%d", s.ports.EnvAPI),
		"--temporal.port", strconv.Itoa(s.ports.Temporal), "--temporal.ui-port", "-1",
		"--log.level", "warn"}
	return append(a, s.extra...)
}

// start starts gauntlet (its log appended to <work>/up.log) and waits until /ready.
func (s *stack) start(ctx context.Context, logPath string) error {
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open gauntlet log: %w", err)
	}
	s.mu.Lock()
	s.starts++
	fmt.Fprintf(lf, "=== soak: start %d at %s\n", s.starts, time.Now().UTC().Format(time.RFC3339))
	cmd := exec.Command(s.bin, s.args()...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		lf.Close()
		return fmt.Errorf("start gauntlet: %w", err)
	}
	done := make(chan struct{})
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	go func() {
		cmd.Wait()
		lf.Close()
		close(done)
	}()
	return s.waitReady(ctx, 3*time.Minute, done)
}

// waitReady polls /ready until it answers 200, the process exits or the bound passes.
func (s *stack) waitReady(ctx context.Context, bound time.Duration, done <-chan struct{}) error {
	deadline := time.Now().Add(bound)
	url := fmt.Sprintf("http://127.0.0.1:%d/ready", s.ports.HTTP)
	var last string
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = strings.TrimSpace(string(b))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-done:
			return errors.New("gauntlet exited before it was ready (see up.log)")
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("gauntlet not ready after %s: %s", bound, last)
}

// pid returns gauntlet's pid, 0 when not running.
func (s *stack) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	select {
	case <-s.done:
		return 0
	default:
	}
	return s.cmd.Process.Pid
}

// kill sends SIGKILL to gauntlet and waits for it to be gone. Its local servers die with
// it (they run with a parent-death signal).
func (s *stack) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop sends SIGTERM and waits up to bound, then kills.
func (s *stack) stop(bound time.Duration) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(bound):
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
}

// childPID returns the pid of gauntlet's child whose command name starts with name, 0
// when there is none. A child is listed under the thread that forked it, so every
// thread's list is read.
func childPID(parent int, name string) int {
	if parent == 0 {
		return 0
	}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", parent))
	for _, t := range tasks {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", parent, t.Name()))
		for _, f := range strings.Fields(string(b)) {
			pid, _ := strconv.Atoi(f)
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			if strings.HasPrefix(strings.TrimSpace(string(comm)), name) {
				return pid
			}
		}
	}
	return 0
}

// rssOf returns a process's VmRSS in bytes, 0 when it is gone.
func rssOf(pid int) uint64 {
	if pid == 0 {
		return 0
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
