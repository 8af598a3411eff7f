// Command gauntlet-agent is PID 1 of every containerd sandbox: it serves the
// runtime's exec requests on the unix socket the runtime bind-mounts at
// /run/gauntlet (package github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd/agent).
//
// It must be built statically (CGO_ENABLED=0): the sandbox image has no C library.
// Package ctrd builds it and packs it into the sandbox base image.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd/agent"
)

func main() {
	if len(os.Args) != 1 {
		fmt.Fprintf(os.Stderr, "usage: %s (serves on %s/%s)\n", os.Args[0], agent.SocketDir, agent.SocketName)
		os.Exit(2)
	}
	// Every thread counts against the sandbox's pids limit.
	runtime.GOMAXPROCS(1)
	prewarmThreads(7) // one more than before: the seccomp supervisor holds one in poll

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := agent.NewServer().Serve(ctx, filepath.Join(agent.SocketDir, agent.SocketName)); err != nil {
		fmt.Fprintln(os.Stderr, "gauntlet-agent:", err)
		os.Exit(1)
	}
}

// prewarmThreads makes the Go runtime start n OS threads now and keep them idle for later.
// A command that fills the sandbox's pids limit (a fork bomb) leaves no room for a new
// thread, and a Go program that cannot create one when a goroutine blocks in a system call
// dies: the agent would die with the sandbox it is meant to clean up. Threads made at start,
// while the limit has room, are parked by the runtime and reused instead.
func prewarmThreads(n int) {
	var started, done sync.WaitGroup
	release := make(chan struct{})
	for range n {
		started.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			runtime.LockOSThread() // this goroutine now owns a thread of its own
			started.Done()
			<-release
			runtime.UnlockOSThread() // the thread goes back to the runtime's idle list
		}()
	}
	started.Wait()
	time.Sleep(time.Millisecond)
	close(release)
	done.Wait()
}
