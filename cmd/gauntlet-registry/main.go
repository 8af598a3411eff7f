// Command gauntlet-registry runs a private OCI registry (Debian's docker-registry) in
// the foreground through the same launcher the tests use (package registrylocal):
// config, storage and log under -dir, listening on 127.0.0.1. It prints the registry's
// host:port once it answers and stops it on SIGINT or SIGTERM, keeping the storage.
// scripts/registry.sh runs it in the background.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/gauntlet-rl/gauntlet/pkg/foreground"
	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal"
)

func main() {
	dir := flag.String("dir", ".gauntlet/registry", "directory for the registry's config, storage and log")
	port := flag.Int("port", 5000, "loopback port to listen on; 0 picks a free one")
	ready := flag.String("ready-file", "", "when set, write host:port to this file once the registry answers")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	err := foreground.Run(os.Stdout, *ready, func(ctx context.Context) (foreground.Server, error) {
		srv, err := registrylocal.Start(ctx, registrylocal.Options{Dir: *dir, Port: *port, Logger: log})
		if err != nil {
			return foreground.Server{}, err
		}
		return foreground.Server{Addr: srv.Addr(), Stop: srv.Stop}, nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "gauntlet-registry:", err)
		os.Exit(1)
	}
}
