// Package temporallocal runs the Temporal dev server (`temporal server start-dev`, from the
// Temporal CLI that scripts/deps.sh installs) as a child process of the calling program,
// with its SQLite database under one directory.
//
// It exists for `gauntlet up`, development machines, CI and tests: [Start] launches the
// server on 127.0.0.1 with the flags that make it fast on a small machine (poll rates of
// the history queues raised to 10,000/s, one task-queue partition, SQLite in WAL mode with
// synchronous=normal; docs/benchmarks.md, Costs the code cites, Local servers, has what
// they save per activity), the Web UI on unless turned off, and returns once the frontend answers a
// health check. Production talks to a real Temporal cluster and never uses this package.
//
// Ownership: the [Server] owns the process and the files under Options.Dir. The database
// file survives [Server.Stop] and [Server.Kill], so workflows started before a restart are
// still there after it. A pid file lets the next Start on the same Dir kill a server left
// behind by a crashed program; the child also dies with its parent (Linux parent-death
// signal). The process itself is a [childproc.Daemon]; this package is its recipe.
//
// Concurrency: every method of Server is safe for concurrent use.
//
// Errors: Start fails with an error wrapping [ErrNotInstalled] when the temporal binary is
// missing, and with the tail of the server's log when it exits before it is ready.
package temporallocal
