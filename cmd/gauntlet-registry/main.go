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
	"os/signal"
	"syscall"
	"time"

	"github.com/gauntlet-rl/gauntlet/pkg/registrylocal"
)

func main() {
	dir := flag.String("dir", ".gauntlet/registry", "directory for the registry's config, storage and log")
	port := flag.Int("port", 5000, "loopback port to listen on; 0 picks a free one")
	ready := flag.String("ready-file", "", "when set, write host:port to this file once the registry answers")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*dir, *port, *ready, log); err != nil {
		fmt.Fprintln(os.Stderr, "gauntlet-registry:", err)
		os.Exit(1)
	}
}

func run(dir string, port int, ready string, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := registrylocal.Start(ctx, registrylocal.Options{Dir: dir, Port: port, Logger: log})
	if err != nil {
		return err
	}
	fmt.Println(srv.Addr())
	if ready != "" {
		if err := os.WriteFile(ready, []byte(srv.Addr()+"\n"), 0o644); err != nil {
			_ = srv.Stop(context.Background())
			return err
		}
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Stop(sctx)
}
