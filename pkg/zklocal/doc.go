// Package zklocal runs a standalone ZooKeeper server as a child process of the calling
// program, with all of its state (config, snapshots, logs, pid file) under one directory.
//
// It exists for the same reason as pkg/chlocal: ClickHouse 18.16 keeps the state of
// its replicated tables in ZooKeeper, and development machines, CI and tests run no
// service manager. [Start] writes a minimal zoo.cfg (127.0.0.1 only, no admin web
// server, the ruok and srvr four-letter words allowed), starts Debian's zookeeper
// package (scripts/deps.sh installs it) on the installed JVM with a small heap, and
// returns once the server serves clients (it answers srvr with its version). Production runs a real ZooKeeper
// ensemble and never uses this package.
//
// Ownership: the [Server] owns the JVM process and the files it writes into
// Options.Dir. The data under Dir survives [Server.Stop], [Server.Kill] and
// [Server.Restart]. A pid file in Dir lets the next Start on the same Dir kill a
// server left behind by a crashed run; the kernel kills the child when the process
// that started it dies. The process itself is a [childproc.Daemon]; this package is
// its recipe.
//
// Concurrency: every method of Server is safe for concurrent use.
//
// Errors: Start fails with an error wrapping [ErrNotInstalled] when Java or the
// ZooKeeper jar is missing, and with the tail of the server's log when it exits before
// it is ready. Every error names the operation that failed.
package zklocal
