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
	"syscall"

	"github.com/gauntlet-rl/gauntlet/pkg/sandbox/ctrd/agent"
)

func main() {
	if len(os.Args) != 1 {
		fmt.Fprintf(os.Stderr, "usage: %s (serves on %s/%s)\n", os.Args[0], agent.SocketDir, agent.SocketName)
		os.Exit(2)
	}
	// Every thread counts against the sandbox's pids limit. The runtime also sets
	// GOMAXPROCS=1 in the agent's environment, which makes this call free (no
	// stop-the-world to change it).
	runtime.GOMAXPROCS(1)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	srv := agent.NewServer()
	srv.PrewarmThreads = 7 // one more than before the seccomp supervisor, which holds one in poll
	if err := srv.Serve(ctx, filepath.Join(agent.SocketDir, agent.SocketName)); err != nil {
		fmt.Fprintln(os.Stderr, "gauntlet-agent:", err)
		os.Exit(1)
	}
}
