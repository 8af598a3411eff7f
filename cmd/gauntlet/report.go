package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"

	"github.com/gauntlet-rl/gauntlet/pkg/report"
)

const reportUsage = `usage: gauntlet report [flags] RUN_ID...
       gauntlet report [flags] --curriculum ID

The compatibility report of one or more runs, or of every run of a curriculum (by its
workflow id or run prefix): success with 95 % intervals, reward and step percentiles,
success under each fault kind, safety events and broken causal rules, cost and metering,
stuck and looping episodes, and per stage for a curriculum. Every number is the result of
the SQL shown in docs/querying.md. --format html writes one self-contained file with
charts (no network needed to open it).

Flags:
`

// cmdReport prints the compatibility report of runs or of a curriculum.
func cmdReport(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("report", stderr)
	var o stackFlags
	o.register(fs, partClickHouse)
	curriculum := fs.String("curriculum", "", "report on every run of this curriculum (workflow id or run prefix)")
	format := fs.String("format", report.FormatTable, "output: table, json or html")
	out := fs.String("out", "", "write the report to this file instead of stdout")
	fs.Usage = func() {
		fmt.Fprint(stderr, reportUsage)
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	switch {
	case *curriculum == "" && fs.NArg() == 0:
		fmt.Fprintln(stderr, "gauntlet report: name at least one run id, or --curriculum ID")
		return errUsage
	case *curriculum != "" && fs.NArg() > 0:
		fmt.Fprintln(stderr, "gauntlet report: give run ids or --curriculum, not both")
		return errUsage
	}
	if f := *format; f != report.FormatTable && f != report.FormatJSON && f != report.FormatHTML {
		fmt.Fprintf(stderr, "gauntlet report: --format %q: want table, json or html\n", f)
		return errUsage
	}
	conn, db, err := o.connectClickHouse(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	r, err := report.Build(ctx, conn, report.Options{Database: db, RunIDs: fs.Args(), Curriculum: *curriculum})
	if err != nil {
		return err
	}
	if *out == "" {
		w := bufio.NewWriter(stdout)
		if err := report.Write(w, r, *format); err != nil {
			return fmt.Errorf("write report: %w", err)
		}
		return w.Flush()
	}
	f, err := os.Create(*out)
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := report.Write(f, r, *format); err != nil {
		_ = f.Close()
		return fmt.Errorf("write report to %s: %w", *out, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write report to %s: %w", *out, err)
	}
	fmt.Fprintf(stderr, "report written to %s\n", *out)
	return nil
}
