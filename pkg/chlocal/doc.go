// Package chlocal runs a ClickHouse server as a child process of the calling program,
// with all of its state (config, data, logs, pid file) under one directory.
//
// It exists for development machines, CI and tests, where no service manager runs
// ClickHouse: [Start] writes a minimal config for a small box (127.0.0.1 only, small
// caches, UTC), starts the binary that Debian's clickhouse-server package installs
// (scripts/deps.sh installs it), and returns once the server answers `SELECT 1` over
// the native protocol. Production talks to a real ClickHouse and never uses this
// package.
//
// Ownership: the [Server] owns the process and the files it writes into Options.Dir.
// The data under Dir survives [Server.Stop], [Server.Kill] and [Server.Restart], so a
// test can take ClickHouse away and bring it back on the same data and port. A pid
// file in Dir lets the next Start on the same Dir kill a server left behind by a
// crashed run, so Start is idempotent per directory. The child is also killed by the
// kernel when the process that started it dies (Linux parent-death signal). The
// process itself is a [childproc.Daemon]; this package is its recipe.
//
// Concurrency: every method of Server is safe for concurrent use.
//
// Errors: Start fails with an error wrapping [ErrNotInstalled] when no binary is
// found, and with the tail of the server's error log when it exits before it is
// ready. Every error names the operation that failed.
package chlocal
