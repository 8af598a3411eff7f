// Command gauntlet-containerd runs a private containerd for gauntlet's containerd
// sandbox runtime in the foreground, through the same launcher the tests use
// (package ctrdlocal): config, root, state, socket and log under -dir. It prints the
// socket address once the daemon answers and, on SIGINT or SIGTERM, kills every
// container the daemon knows, stops it and unmounts the root tmpfs.
// scripts/containerd.sh runs it in the background.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
)

func main() {
	dir := flag.String("dir", ".gauntlet/containerd", "directory for the daemon's config, root, state, socket and log")
	tmpfs := flag.Int64("root-tmpfs-bytes", 0, "when positive, mount a tmpfs of this size on DIR/root so sandboxes never write to the host's disk")
	ready := flag.String("ready-file", "", "when set, write the socket address to this file once the daemon answers")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*dir, *tmpfs, *ready, log); err != nil {
		fmt.Fprintln(os.Stderr, "gauntlet-containerd:", err)
		os.Exit(1)
	}
}

func run(dir string, tmpfs int64, ready string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: dir, RootTmpfsBytes: tmpfs, Logger: log})
	if err != nil {
		return err
	}
	fmt.Println(srv.Address())
	if ready != "" {
		if err := os.WriteFile(ready, []byte(srv.Address()+"\n"), 0o644); err != nil {
			_ = srv.Stop(context.Background())
			return err
		}
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	purgeErr := srv.Purge(sctx)
	if err := srv.Stop(sctx); err != nil {
		return err
	}
	return purgeErr
}
