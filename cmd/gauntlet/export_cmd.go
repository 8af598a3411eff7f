package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gauntlet-rl/gauntlet/pkg/trajectory"
	"github.com/gauntlet-rl/gauntlet/pkg/trajectory/export"
)

// cmdEpisodeExport is `gauntlet episode export ID --format atif|jsonl [-o FILE]`: the
// recorded episode (as `episode show` reads it from ClickHouse) written as an ATIF
// trajectory or as gauntlet's own JSONL.
func cmdEpisodeExport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("episode export", stderr)
	var o stackFlags
	o.register(fs, partClickHouse)
	format := fs.String("format", "atif", "atif (Harbor's Agent Trajectory Interchange Format, one JSON document) or jsonl (gauntlet's rows, one JSON object per line)")
	out := fs.String("o", "", "write to this file (default: stdout); written whole or not at all")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		fmt.Fprintln(stderr, "usage: gauntlet episode export [--format atif|jsonl] [-o FILE] EPISODE_ID")
		return errUsage
	}
	if *format != "atif" && *format != "jsonl" {
		return fmt.Errorf("--format %q: want atif or jsonl", *format)
	}
	id := pos[0]
	if !episodeIDRe.MatchString(id) {
		return fmt.Errorf("episode id %q: only letters, digits, '-' and '_' are allowed", id)
	}
	conn, db, err := o.connectClickHouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	ep, err := trajectory.Episode(ctx, conn, db, id)
	if err != nil {
		return err
	}
	steps, err := trajectory.EpisodeSteps(ctx, conn, db, id)
	if err != nil {
		return err
	}
	write := func(w io.Writer) error {
		if *format == "jsonl" {
			return export.WriteJSONL(w, ep, steps)
		}
		t, err := export.ToATIF(ep, steps, version)
		if err != nil {
			return err
		}
		return export.WriteATIF(w, t)
	}
	if *out == "" {
		return write(stdout)
	}
	// A temporary file renamed into place: a failed export leaves no partial file.
	f, err := os.CreateTemp(filepath.Dir(*out), ".export-*")
	if err != nil {
		return fmt.Errorf("export episode %s: %w", id, err)
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("export episode %s: %w", id, err)
	}
	if err := os.Rename(f.Name(), *out); err != nil {
		return fmt.Errorf("export episode %s: %w", id, err)
	}
	fmt.Fprintf(stderr, "episode %s: %d steps written to %s (%s)\n", id, len(steps), *out, *format)
	return nil
}
