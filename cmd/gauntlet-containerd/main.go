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

	"github.com/gauntlet-rl/gauntlet/pkg/ctrdlocal"
	"github.com/gauntlet-rl/gauntlet/pkg/foreground"
)

func main() {
	dir := flag.String("dir", ".gauntlet/containerd", "directory for the daemon's config, root, state, socket and log")
	tmpfs := flag.Int64("root-tmpfs-bytes", 0, "when positive, mount a tmpfs of this size on DIR/root so sandboxes never write to the host's disk")
	ready := flag.String("ready-file", "", "when set, write the socket address to this file once the daemon answers")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := foreground.Run(os.Stdout, *ready, func(ctx context.Context) (foreground.Server, error) {
		srv, err := ctrdlocal.Start(ctx, ctrdlocal.Options{Dir: *dir, RootTmpfsBytes: *tmpfs, Logger: log})
		if err != nil {
			return foreground.Server{}, err
		}
		return foreground.Server{Addr: srv.Address(), Stop: func(ctx context.Context) error {
			purgeErr := srv.Purge(ctx)
			if err := srv.Stop(ctx); err != nil {
				return err
			}
			return purgeErr
		}}, nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gauntlet-containerd:", err)
		os.Exit(1)
	}
}
