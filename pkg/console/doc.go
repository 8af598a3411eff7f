// Package console is gauntlet's web console: an HTTP handler, mounted under /console/ on
// the process's http server, that shows runs, a run's report and fault heatmap, an
// episode's replay with its fork lineage, and curricula, from the ClickHouse tables the
// store writes and from Temporal (docs/console.md). It reads, except for one action:
// signalling a curriculum (pause, resume, skip, abort), which it sends to Temporal only
// for a holder of an env API token (Config.Authorize).
//
// It owns two things: the JSON endpoints under /console/api/ (the data layer, reader.go
// and readcurricula.go: every query is parameterised, bounded by a LIMIT and by a
// timeout; curricula.go for Temporal), and the front end
// (static/, vanilla JavaScript modules and the one charting library, uPlot, vendored by
// scripts/vendor-console.sh and embedded in the binary), so the console works offline.
//
// A large run the scheduler planned has its report and fault heatmap folded in memory
// past a watermark over its episode indices (fold.go), so each answer reads a few
// granules by key instead of the run; nothing is written for it.
//
// Runs are summarised by grouping the episodes table by run_id: the per-run summary is
// one query (runSummarySQL), so a table of runs written at submission can replace the
// grouping without changing the endpoints or the pages.
//
// A Console is safe for concurrent use. It opens its ClickHouse connection (and its
// Temporal client) on the first request that needs it and again after a failed attempt,
// so a console started before ClickHouse or Temporal answers serves its pages and
// reports the server's absence as an error (503) until it answers.
package console
