// Package registrylocal runs Debian's docker-registry (the CNCF distribution registry,
// 2.8) as a child process of the calling program: a real OCI registry on a loopback
// port, with its config, storage and log under one directory.
//
// It exists because nothing here can reach a container registry on the internet: task
// images (package images) are pushed to and pulled from this one, and the tests serve
// their Debian base image (scripts/base-image.sh) and every image they build from it.
// [Start] writes a config (filesystem storage under Dir/data, deletes enabled, no auth
// unless Options.Htpasswd names a password file, plain HTTP on 127.0.0.1 only), picks a
// free port unless Options.Port names one, starts /usr/bin/docker-registry
// (scripts/deps.sh installs it) and returns once GET /v2/ answers. The registry speaks plain HTTP: containerd's resolver and buildah reach
// it as a loopback registry (containerd uses HTTP for localhost and 127.0.0.1 by itself;
// buildah is told --tls-verify=false).
//
// Ownership: the [Server] owns the registry process and everything under Options.Dir;
// [Server.Stop] ends the process and leaves the directory (the caller removes it, or
// starts again over the same storage). A pid file in Dir lets the next Start on the same
// Dir kill a registry left behind by a crashed program; the process also dies with the
// program that started it (Linux parent-death signal). The process itself is a
// [childproc.Daemon]; this package is its recipe.
//
// Concurrency: every method of Server is safe for concurrent use.
//
// Errors: Start fails with an error wrapping [ErrNotInstalled] when docker-registry is
// missing, and with the tail of the registry's log when it exits or does not answer in
// time. Every error names the operation that failed.
package registrylocal
