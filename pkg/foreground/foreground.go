// Package foreground runs one of gauntlet's local server launchers (ctrdlocal,
// registrylocal) as a command in the foreground, the way the scripts start them: it
// prints the server's address once the server answers, writes it to a ready file when
// asked, and stops the server on SIGINT or SIGTERM within a bounded time.
//
// Run blocks until the signal; it is meant for a command's main, one call per process.
package foreground

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// StopTimeout bounds how long stopping a server may take after the signal.
const StopTimeout = 30 * time.Second

// Server is a started server, as a launcher returns it.
type Server struct {
	// Addr is what the command prints and writes to the ready file.
	Addr string
	// Stop stops the server; it is called once, on the signal or when the ready file
	// cannot be written.
	Stop func(ctx context.Context) error
}

// Run starts a server with start (its context ends on SIGINT or SIGTERM), writes its
// address to readyFile when that is not empty, prints it on out, then waits for the signal
// and stops the server within StopTimeout. The ready file appears whole (written aside and
// renamed) and before the printed line, so a caller waiting on either finds it done. It
// returns start's error, the ready file's, or Stop's.
func Run(out io.Writer, readyFile string, start func(ctx context.Context) (Server, error)) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := start(ctx)
	if err != nil {
		return err
	}
	if readyFile != "" {
		if err := writeReady(readyFile, srv.Addr+"\n"); err != nil {
			_ = srv.Stop(context.Background())
			return err
		}
	}
	fmt.Fprintln(out, srv.Addr)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
	defer cancel()
	return srv.Stop(sctx)
}

// writeReady writes content to path through a temporary file in the same directory and a
// rename, so path never exists half written.
func writeReady(path, content string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}
